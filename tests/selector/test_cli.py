"""The CLI is a contract: names, JSON keys, exit codes and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.selector.cli_run import run

ROOT = Path(__file__).resolve().parents[2]
CANDIDATE_KEYS = {"instance_type", "rank", "accelerator", "accelerator_count", "accelerator_memory_gib", "efa",
                  "nvme_disks", "vcpus", "memory_gib", "price_per_hour", "spot_price_per_hour", "samples_per_second",
                  "samples_per_dollar", "spot_samples_per_dollar", "throughput_source", "reasons"}



def test_recommend_json_contract(capsys):
    code, out, err = run(capsys, "recommend", "--profile", "multi-node-training", "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert {"profile", "region", "catalog_as_of", "candidates", "excluded"} <= set(doc)
    assert doc["profile"] == "multi-node-training" and doc["region"] == "us-east-1"
    for c in doc["candidates"]:
        assert CANDIDATE_KEYS <= set(c)
        assert c["throughput_source"] in ("measured", "model") and c["reasons"]
    for e in doc["excluded"]:
        assert set(e) == {"instance_type", "reasons"} and e["reasons"]


def test_profiles_json_and_table(capsys):
    code, out, _ = run(capsys, "profiles", "--json")
    doc = json.loads(out)
    assert code == 0 and all({"name", "description"} <= set(p) for p in doc)
    names = {p["name"] for p in doc}
    assert {"multi-node-training", "multi-gpu-training", "single-gpu-training", "cost-efficient-training",
            "cost-efficient-multi-gpu", "parallel-experiments", "dev-prototyping", "inference", "int8-inference",
            "large-model", "fp64-hpc", "arm", "training"} <= names
    code, out, _ = run(capsys, "profiles")
    assert "multi-node-training" in out and "guides' pick" in out


def test_show_json_has_candidate_keys(capsys):
    code, out, _ = run(capsys, "show", "p4d.24xlarge", "--json")
    doc = json.loads(out)
    assert code == 0
    assert (CANDIDATE_KEYS - {"rank", "price_per_hour", "spot_price_per_hour", "samples_per_second",
                              "samples_per_dollar", "spot_samples_per_dollar", "throughput_source", "reasons"}) <= set(doc)
    assert doc["prices"]["us-east-1"]["as_of"]


def test_show_retired_says_what_replaces_it(capsys):
    code, out, _ = run(capsys, "show", "p3.2xlarge")
    assert code == 0 and "RETIRED" in out and "use instead: p5.4xlarge" in out


def test_text_table_says_why_the_top_pick_won(capsys):
    code, out, _ = run(capsys, "recommend", "--profile", "dev-prototyping", "--top", "3")
    assert code == 0
    assert "why: g4dn.xlarge is the cheapest" in out
    assert "samples/$" in out and "excluded (" in out


def test_spot_and_families_and_throughput_file(capsys, tmp_path):
    f = tmp_path / "measured.csv"
    f.write_text("instance_type,samples_per_second,price_per_hour\ng5.xlarge,410,0.9\ng4dn.xlarge,120\n")
    code, out, _ = run(capsys, "recommend", "--profile", "cost-efficient-training", "--families", "g4dn,g5",
                       "--throughput", str(f), "--spot", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["spot"] is True
    g5 = next(c for c in doc["candidates"] if c["instance_type"] == "g5.xlarge")
    assert g5["throughput_source"] == "measured" and g5["price_per_hour"] == 0.9
    assert g5["samples_per_dollar"] == pytest.approx(410 * 3600 / 0.9, rel=1e-3)
    assert {c["instance_type"].split(".")[0] for c in doc["candidates"]} <= {"g4dn", "g5"}


def test_throughput_file_json_form(capsys, tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps([{"instance_type": "p5.48xlarge", "samples_per_second": 99999, "spot_price_per_hour": 12}]))
    code, out, _ = run(capsys, "recommend", "--profile", "multi-node-training", "--throughput", str(f), "--json")
    doc = json.loads(out)
    (p5,) = [c for c in doc["candidates"] if c["instance_type"] == "p5.48xlarge"]
    assert p5["spot_price_per_hour"] == 12 and p5["throughput_source"] == "measured"
    # one measured type: the model is scaled into its units (issue 25), so it ranks where the model puts it
    assert doc["calibration"]["measured_types"] == 1 and doc["calibration"]["scale"] > 1


def test_user_price_file(capsys, tmp_path):
    f = tmp_path / "prices.csv"
    f.write_text("instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour\ng6.xlarge,us-east-1,0.01,\n")
    code, out, _ = run(capsys, "recommend", "--profile", "dev-prototyping", "--prices", str(f), "--json")
    assert json.loads(out)["candidates"][0]["instance_type"] == "g6.xlarge"


@pytest.mark.parametrize("argv,expected", [
    (["recommend", "--profile", "multinode-training"], "unknown profile 'multinode-training'; closest: multi-node-training"),
    (["recommend", "--profile", "training", "--region", "eu-west-9"], "unknown region 'eu-west-9'; closest: eu-west-3, eu-west-2, eu-west-1; allowed: af-south-1"),
    (["show", "p5.48xl"], "unknown instance type 'p5.48xl'; closest: p5.48xlarge"),
    (["recommend", "--profile", "training", "--families", "p5,h100"], "unknown family 'h100'"),
    (["recommend", "--profile", "training", "--top", "0"], "--top must be at least 1"),
    (["recommend"], "recommend needs --profile (see `profiles`) or --gpu MODEL[:COUNT]"),
    (["recommend", "--profile", "training", "--throughput", "/nonexistent.csv"], "cannot read throughput file"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and expected in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("content,expected", [
    ("instance_type,samples_per_second\np4d.24xlarg,100\n", "line 2: unknown instance type 'p4d.24xlarg'; closest: p4d.24xlarge"),
    ("instance_type,samples_per_second\np4d.24xlarge,fast\n", "line 2: samples_per_second = 'fast' is not a number"),
    ("instance_type,sps\np4d.24xlarge,1\n", "needs CSV columns instance_type,samples_per_second"),
    ("[{\"instance_type\": \"p4d.24xlarge\"", "not valid JSON"),
    ("instance_type,samples_per_second\np4d.24xlarge,-5\n", "must be above zero"),
])
def test_malformed_throughput_file(capsys, tmp_path, content, expected):
    f = tmp_path / ("t.json" if content.startswith("[") else "t.csv")
    f.write_text(content)
    code, out, err = run(capsys, "recommend", "--profile", "training", "--throughput", str(f))
    assert code == 2 and expected in err and err.count("\n") == 1, err


def test_module_entry_point_and_no_heavy_imports():
    code = ("import sys, runpy; sys.argv=['dl_selector','recommend','--profile','multi-node-training','--json'];"
            "import dl_selector.cli as c; rc=c.main(sys.argv[1:]);"
            "heavy=[m for m in ('boto3','botocore','aws_cdk','jsii','constructs','tomllib','typing','datetime') if m in sys.modules];"
            "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stderr
    p = subprocess.run([sys.executable, "-m", "dl_selector", "show", "nope.xlarge"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: unknown instance type") and "Traceback" not in p.stderr


@pytest.mark.parametrize("gpu,model,count", [("H100:8", "H100", 8), ("h100:8", "H100", 8), ("A10G", "A10G", None),
                                             ("l40s:4", "L40S", 4), ("rtx-pro-4500", "RTX PRO 4500", None)])
def test_gpu_filter_keeps_only_that_model_and_count(capsys, gpu, model, count):
    code, out, _ = run(capsys, "recommend", "--profile", "training", "--gpu", gpu, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["candidates"], doc["why"]
    for c in doc["candidates"]:
        assert c["accelerator"] == model and (count is None or c["accelerator_count"] == count), c["instance_type"]
    # every type of that model and count that the profile would rank otherwise is still here
    code, out, _ = run(capsys, "recommend", "--profile", "training", "--json")
    expected = {c["instance_type"] for c in json.loads(out)["candidates"]
                if c["accelerator"] == model and (count is None or c["accelerator_count"] == count)}
    assert {c["instance_type"] for c in doc["candidates"]} == expected
    assert any(f"not {model}" in r for e in doc["excluded"] for r in e["reasons"])


def test_memory_and_price_filters_combine_with_a_profile(capsys):
    code, out, _ = run(capsys, "recommend", "--profile", "cost-efficient-training", "--min-gpu-memory", "40",
                       "--max-price", "2", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["candidates"]
    for c in doc["candidates"]:
        assert c["accelerator_memory_gib"] >= 40 and c["price_per_hour"] <= 2, c["instance_type"]
    code, out, _ = run(capsys, "recommend", "--profile", "cost-efficient-training", "--spot", "--max-price", "0.5",
                       "--json")
    assert all(c["spot_price_per_hour"] <= 0.5 for c in json.loads(out)["candidates"])
