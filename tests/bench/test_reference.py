"""The reference benchmark, run for real on this CPU at tiny widths, its output read by the
collector's parser; the full-size models checked against their published parameter counts."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dl_core.benchline import parse_output

TINY = ["--device", "cpu", "--warmup-steps", "1", "--steps-per-window", "2", "--windows", "3", "--threads", "1"]
RESNET = ["--model", "resnet50", "--width-div", "16", "--image-size", "64", "--batch", "4"]
GPT2 = ["--model", "gpt2", "--width-div", "12", "--seq-len", "32", "--batch", "2"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dl_selector.bench.reference", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("model, precision", [(RESNET, "fp32"), (RESNET, "bf16"), (GPT2, "tf32"), (GPT2, "bf16")])
def test_tiny_run_prints_windows_the_collector_reads(model, precision):
    r = _run(*TINY, *model, "--precision", precision)
    assert r.returncode == 0, r.stderr
    windows, problems = parse_output(r.stdout)
    assert not problems and [w.window for w in windows] == [1, 2, 3]
    assert all(line.startswith("dl-bench ") for line in r.stdout.splitlines())  # human text is on stderr
    batch = int(model[model.index("--batch") + 1])
    for w in windows:
        assert w.samples == batch * 2
        assert w.samples_per_second == pytest.approx(w.samples / w.seconds, rel=1e-3)
        assert w.labels["model"] == model[1] and w.labels["precision"] == precision and w.labels["device"] == "cpu"
    if model is GPT2:
        w = windows[0]
        assert float(w.labels["tokens_per_second"]) == pytest.approx(w.samples_per_second * 32, rel=1e-3)


def test_jpeg_loader_decodes_real_files(tmp_path):
    data = tmp_path / "jpegs"
    r = _run("--make-data", str(data), "--images", "16", "--image-size", "64")
    assert r.returncode == 0, r.stderr
    files = sorted(data.iterdir())
    assert len(files) == 16 and all(f.read_bytes()[:3] == b"\xff\xd8\xff" for f in files)  # JPEG magic
    r = _run(*TINY, *RESNET, "--precision", "fp32", "--loader", "jpeg", "--data", str(data), "--workers", "1")
    assert r.returncode == 0, r.stderr
    windows, problems = parse_output(r.stdout)
    assert not problems and len(windows) == 3 and windows[0].labels["loader"] == "jpeg"


@pytest.mark.parametrize("args, words", [
    (["--model", "vgg"], "--model 'vgg' is not one of resnet50, gpt2"),
    (["--precision", "int8"], "--precision"),
    (["--loader", "jpeg"], "pass --data DIR"),
    (["--windows", "0"], "--windows 0: must be at least 1"),
    (["--batch", "-4"], "--batch -4"),
    (["--precision", "fp16", "--device", "cpu"], "fp16 needs a GPU"),
    (["--device", "cuda"], "no CUDA device"),
    (["--image-size", "16"], "--image-size 16"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    r = _run(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_jpeg_folder_problems(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    r = _run(*TINY, *RESNET, "--loader", "jpeg", "--data", str(tmp_path))
    assert r.returncode == 2 and "no .jpg files" in r.stderr
    r = _run(*TINY, *RESNET, "--loader", "jpeg", "--data", str(tmp_path / "missing"))
    assert r.returncode == 2 and "not a folder" in r.stderr


def test_full_size_models_have_the_published_parameter_counts():
    from dl_selector.bench.models import build
    # torchvision's resnet50 (1,000 classes) and GPT-2 small with tied embeddings (OpenAI's 124M).
    assert sum(p.numel() for p in build("resnet50").parameters()) == 25_557_032
    assert sum(p.numel() for p in build("gpt2").parameters()) == 124_439_808
