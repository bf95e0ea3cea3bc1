"""Issue 39 item 4: --model-size N --task finetune|pretrain|inference [--precision] derives the accelerator
memory a node needs and filters on the node's total (accelerators x GB each). The rule's figures are checked
against published ones, not against the code's own arithmetic: the ZeRO paper's model-state sizes and Hugging
Face's weights-in-VRAM figures."""
from __future__ import annotations

import json

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.model_memory import model_memory, parse_model_size
from tests.selector.cli_run import run



# ZeRO (Rajbhandari et al. 2020), section 3.1: mixed-precision Adam holds 16 bytes per parameter of model
# states, "a 1.5B parameter GPT-2 ... requires 24GB"; figure 1's 7.5B model: 120 GB of model states.
@pytest.mark.parametrize("size,published_gb", [("1.5B", 24.0), ("7.5B", 120.0)])
@pytest.mark.parametrize("task", ["finetune", "pretrain"])
def test_training_model_states_match_the_zero_paper(size, published_gb, task):
    m = model_memory(size, task, None)
    assert m.base_gb == pytest.approx(published_gb)
    assert m.needed_gb > published_gb  # activations come on top, never instead
    assert "ZeRO" in m.formula() and f"{published_gb:,.0f} GB" in m.formula()


# Hugging Face, "Optimizing LLMs for Speed and Memory" (transformers docs): loading X billion parameters takes
# about 2 * X GB in bfloat16/float16 and 4 * X GB in float32 (Llama-2-70b: 140 GB; Falcon-40b: 80 GB;
# GPT-3 175B: 350 GB; bigcode/starcoder 15.5B: 31 GB), and 8-bit quantization halves the bf16 figure.
@pytest.mark.parametrize("size,precision,published_gb", [
    ("70B", "bf16", 140.0), ("40B", "fp16", 80.0), ("175B", "bf16", 350.0), ("15.5B", "bf16", 31.0),
    ("70B", "fp32", 280.0), ("70B", "int8", 70.0),
])
def test_inference_weights_match_hugging_face(size, precision, published_gb):
    m = model_memory(size, "inference", precision)
    assert m.base_gb == pytest.approx(published_gb)
    # EleutherAI's Transformer Math 101: total inference memory about 1.2 x the weights
    assert m.needed_gb == pytest.approx(published_gb * 1.2)


@pytest.mark.parametrize("text,parameters", [("7B", 7e9), ("70b", 70e9), ("1.5B", 1.5e9), ("405B", 405e9),
                                             ("500M", 500e6), (" 8 b ", 8e9)])
def test_model_sizes_researchers_write(text, parameters):
    assert parse_model_size(text)[0] == pytest.approx(parameters)


@pytest.mark.parametrize("argv,expected", [
    (["--model-size", "7GB", "--task", "finetune"], "that is a memory size: give the parameter count; closest: 7B"),
    (["--model-size", "7", "--task", "finetune"], "not a parameter count; allowed: a number with K, M, B or T"),
    (["--model-size", "seven", "--task", "finetune"], "e.g. 7B, 70B, 1.5B, 405B, 500M"),
    (["--model-size", "0.5K", "--task", "finetune"], "outside 1M to 100T"),
    (["--model-size", "7B"], "--model-size needs --task: one of finetune, pretrain, inference"),
    (["--model-size", "7B", "--task", "fine-tune"], "allowed: finetune, pretrain, inference; closest: finetune"),
    (["--task", "inference"], "--task sizes a model: pass it with --model-size"),
    (["--model-size", "7B", "--task", "finetune", "--precision", "int8"], "fp8/int8 training still keeps fp32"),
    (["--model-size", "7B", "--task", "inference", "--precision", "bf61"], "closest: bf16"),
])
def test_bad_model_input_is_one_line_exit_2(capsys, argv, expected):
    code, out, err = run(capsys, "recommend", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and expected in err, err


def _node_gb(c):
    return c["accelerator_count"] * c["accelerator_memory_gb"]


def test_70b_inference_keeps_only_nodes_that_hold_140_gb_of_weights_and_more(capsys):
    code, out, _ = run(capsys, "recommend", "--model-size", "70B", "--task", "inference", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["profile"] == "model-inference" and doc["candidates"]
    assert all(_node_gb(c) >= 140 * 1.2 for c in doc["candidates"])
    names = {c["instance_type"] for c in doc["candidates"]}
    assert {"p4d.24xlarge", "p5.48xlarge", "inf2.48xlarge"} <= names  # 320, 640 and 384 GB
    excluded = {e["instance_type"]: " ".join(e["reasons"]) for e in doc["excluded"]}
    # one 80 GB H100 holds half the weights: three of it would hold the 168 GB
    assert "80 GB across the node < 168 GB for a 70B inference in bf16: needs 3 nodes" in excluded["p5.4xlarge"]
    assert doc["model_memory"]["needed_gb"] == 168.0 and "Transformer Math 101" in doc["why"]


def test_the_same_model_in_int8_fits_smaller_nodes(capsys):
    sizes = {}
    for precision in ("bf16", "int8"):
        _, out, _ = run(capsys, "recommend", "--model-size", "70B", "--task", "inference", "--precision", precision,
                        "--json")
        sizes[precision] = {c["instance_type"] for c in json.loads(out)["candidates"]}
    assert sizes["bf16"] < sizes["int8"]  # every bf16 node holds the int8 weights; some hold only those
    assert "g6e.12xlarge" in sizes["bf16"] and "g6e.xlarge" not in sizes["int8"]  # 4 x 48 GB; 1 x 48 GB < 84 GB


def test_a_7b_finetune_filters_on_the_node_total_not_per_gpu(capsys):
    code, out, _ = run(capsys, "recommend", "--model-size", "7B", "--task", "finetune", "--json")
    doc = json.loads(out)
    # ZeRO: 7B x 16 bytes = 112 GB of model states, more than any one GPU here but B200/B300 holds
    names = {c["instance_type"] for c in doc["candidates"]}
    assert code == 0 and doc["profile"] == "training"
    assert "p4d.24xlarge" in names and "p5.4xlarge" not in names  # 8 x 40 GB holds it; one 80 GB H100 does not
    assert all(_node_gb(c) > 112 and c["model_nodes"] == 1 for c in doc["candidates"])


def test_a_model_no_node_holds_ranks_multi_node_and_says_how_many(capsys):
    code, out, _ = run(capsys, "recommend", "--model-size", "405B", "--task", "pretrain", "--json")
    doc = json.loads(out)
    largest = max(_node_gb({"accelerator_count": f.accelerator_count, "accelerator_memory_gb": f.accelerator_memory_gb})
                  for f in load_catalog() if "us-east-1" in f.regions)
    assert 405 * 16 > largest  # the ZeRO model states alone exceed every node
    assert code == 0 and doc["profile"] == "multi-node-training" and doc["candidates"]
    assert all(c["model_nodes"] >= 2 for c in doc["candidates"])
    assert "no single node in us-east-1 holds it" in doc["why"]
    assert any("node(s) of" in r and "each" in r for r in doc["candidates"][0]["reasons"])


def test_a_single_node_profile_says_the_model_needs_more_than_one_node(capsys):
    code, out, _ = run(capsys, "recommend", "--profile", "training", "--model-size", "405B", "--task", "pretrain",
                       "--json")
    doc = json.loads(out)
    assert code == 0 and doc["candidates"] == []
    assert "it needs more than one node" in doc["why"] and "--profile multi-node-training" in doc["why"]
