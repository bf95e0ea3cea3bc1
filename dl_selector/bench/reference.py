"""python -m dl_selector.bench.reference: the reference benchmark each candidate runs.

Synthetic training steps (forward, backward, SGD step) of ResNet-50 or GPT-2 small at a chosen
precision, after warm-up, in several timed windows, each printed on stdout as one dl-bench line
(dl_selector/bench/contract.py). Human progress goes to stderr.

- A sample is one image (resnet50) or one sequence of --seq-len tokens (gpt2; the line also
  carries tokens_per_second).
- Precision: fp32 (TF32 off), tf32 (TF32 matmuls and convolutions), bf16 (autocast), fp16
  (autocast with loss scaling). On a CPU fp16 is refused: CPU autocast computes in bf16, so the
  figure would be mislabelled.
- --loader synthetic feeds one tensor already on the device (the GPU's own ceiling);
  --loader jpeg decodes and resizes real JPEG files from --data (e.g. on the NVMe RAID) with
  --workers processes inside the timed loop: the storage- and CPU-bound case. --make-data DIR
  writes such files.
- Windows are timed with the device synchronised at each edge, so queued GPU work is counted in
  the window it belongs to.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Optional

from dl_core.benchline import format_line

MODELS = ("resnet50", "gpt2")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
LOADERS = ("synthetic", "jpeg")
DEFAULT_BATCH = {"resnet50": 64, "gpt2": 8}


class BenchError(Exception):
    """A mistake in the arguments or the data: one line, exit 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dl_selector.bench.reference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", help="resnet50 or gpt2 (default resnet50)")
    p.add_argument("--precision", default="bf16", help="fp32, tf32, bf16 or fp16 (default bf16)")
    p.add_argument("--batch", type=int, help="per step (default 64 images or 8 sequences)")
    p.add_argument("--warmup-steps", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--steps-per-window", type=int, default=20, help="steps in one timed window (default 20)")
    p.add_argument("--windows", type=int, default=5, help="timed windows (default 5)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cuda or cpu")
    p.add_argument("--loader", default="synthetic", help="synthetic or jpeg (needs --data)")
    p.add_argument("--data", help="a folder of .jpg files for --loader jpeg")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers for --loader jpeg (default 4)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--width-div", type=int, default=1, help="divide every width by N (tiny runs on a CPU)")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own)")
    p.add_argument("--make-data", metavar="DIR", help="write --images random JPEGs into DIR and exit")
    p.add_argument("--images", type=int, default=512)
    return p


def _check(a: argparse.Namespace) -> None:
    for key, allowed in (("model", MODELS), ("precision", PRECISIONS), ("loader", LOADERS),
                         ("device", ("auto", "cuda", "cpu"))):
        if getattr(a, key) not in allowed:
            raise BenchError(f"--{key} {getattr(a, key)!r} is not one of {', '.join(allowed)}")
    for key in ("warmup_steps", "steps_per_window", "windows", "workers", "image_size", "seq_len", "width_div",
                "images", "batch", "threads"):
        value, low = getattr(a, key), 0 if key in ("warmup_steps", "workers") else 1
        if value is not None and value < low:
            raise BenchError(f"--{key.replace('_', '-')} {value}: must be at least {low}")
    if a.image_size < 32:
        raise BenchError(f"--image-size {a.image_size}: must be at least 32 (ResNet downsamples 32x)")
    if a.loader == "jpeg" and not a.data:
        raise BenchError("--loader jpeg reads JPEG files: pass --data DIR (make some with --make-data DIR)")
    if a.loader == "jpeg" and a.model != "resnet50":
        raise BenchError("--loader jpeg feeds images: use it with --model resnet50")
    if a.model == "resnet50" and a.width_div not in (1, 2, 4, 8, 16, 32, 64):
        raise BenchError(f"--width-div {a.width_div}: a power of two up to 64 for resnet50")


def make_data(folder: str, images: int, size: int) -> int:
    """Random-noise JPEGs (noise compresses badly, so each file is as large as a real photo)."""
    try:
        from PIL import Image
    except ImportError:
        raise BenchError("--make-data needs Pillow: pip install pillow") from None
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(images):
        pixels = rng.integers(0, 256, (size + size // 7, size + size // 7, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"img{i:06d}.jpg"), quality=90)
    return images


def _jpeg_files(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        raise BenchError(f"--data {folder}: not a folder")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith((".jpg", ".jpeg")))
    if not files:
        raise BenchError(f"--data {folder}: no .jpg files (make some with --make-data {folder})")
    return files


def _jpeg_loader(files: list[str], batch: int, size: int, workers: int):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Jpegs(Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int):
            from PIL import Image
            import numpy as np
            with Image.open(files[i]) as im:  # decode and resize on the loader's CPU, as a real pipeline
                arr = np.asarray(im.convert("RGB").resize((size, size)), dtype=np.uint8)
            return torch.from_numpy(arr).permute(2, 0, 1), i % 1000

    if len(files) < batch:
        raise BenchError(f"--data has {len(files)} JPEGs, fewer than one batch of {batch}")
    loader = DataLoader(Jpegs(), batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
                        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0)
    while True:
        yield from loader


def _device(choice: str):
    import torch
    if choice == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device visible to torch")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def run(a: argparse.Namespace, out=sys.stdout, log=sys.stderr) -> int:
    import torch
    from .models import build

    device = _device(a.device)
    if device.type == "cpu" and a.precision == "fp16":
        raise BenchError("--precision fp16 needs a GPU: CPU autocast runs bf16; use bf16 or fp32 on a CPU")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    batch = a.batch or DEFAULT_BATCH[a.model]
    model = build(a.model, width_div=a.width_div, seq_len=a.seq_len).to(device)
    if a.model == "resnet50":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=a.precision == "fp16")
    batches = _batches(a, model, batch, device)

    def step() -> float:
        x, y = next(batches)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
            loss = (torch.nn.functional.cross_entropy(logits, y) if a.model == "resnet50" else
                    torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"reference: {a.model} {a.precision} batch {batch} on {name} ({a.loader} data); "
          f"{a.warmup_steps} warm-up steps", file=log, flush=True)
    for _ in range(a.warmup_steps):
        step()
    sync()
    labels = {"model": a.model, "precision": a.precision, "batch": batch, "loader": a.loader,
              "device": name.replace(" ", "_")}
    for w in range(1, a.windows + 1):
        t0 = time.perf_counter()
        for _ in range(a.steps_per_window):
            loss = step()
        sync()
        seconds = time.perf_counter() - t0
        if not math.isfinite(float(loss.detach())):
            print(f"error: the loss is {float(loss.detach())} in window {w}: the {a.precision} run diverged", file=log)
            return 1
        samples = batch * a.steps_per_window
        extra = {"tokens_per_second": samples * a.seq_len / seconds} if a.model == "gpt2" else {}
        print(format_line(samples / seconds, window=w, samples=samples, seconds=seconds, **extra, **labels),
              file=out, flush=True)
    return 0


def _batches(a: argparse.Namespace, model, batch: int, device):
    import torch
    if a.loader == "jpeg":
        mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
        for x, y in _jpeg_loader(_jpeg_files(a.data), batch, a.image_size, a.workers):
            x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)
            yield x.contiguous(memory_format=torch.channels_last), y.to(device, non_blocking=True)
    if a.model == "resnet50":
        x = torch.randn(batch, 3, a.image_size, a.image_size, device=device).contiguous(
            memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=device)
    else:
        vocab = model.tok.num_embeddings
        x = torch.randint(0, vocab, (batch, a.seq_len), device=device)
        y = torch.roll(x, -1, dims=1)
    while True:
        yield x, y


def main(argv: Optional[list[str]] = None) -> int:
    try:
        a = _parser().parse_args(argv)
        _check(a)
        if a.make_data:
            n = make_data(a.make_data, a.images, a.image_size)
            print(f"wrote {n} JPEGs to {a.make_data}", file=sys.stderr)
            return 0
        try:
            import torch  # noqa: F401
        except ImportError:
            raise BenchError("the reference benchmark needs PyTorch: run it on a Deep Learning AMI or pip install torch")
        return run(a)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
