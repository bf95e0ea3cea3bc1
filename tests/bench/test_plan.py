"""bench plan: candidates from the selector's own ranking, cost from the catalog's prices, a hard
budget. Costs are recomputed here from the price table itself (dl_selector/data/prices.csv), not from
the plan's arithmetic."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dl_selector.bench.contract import Plan
from dl_selector.cli import main

PRICES = Path(__file__).resolve().parents[2] / "dl_selector" / "data" / "prices.csv"


def _price_table() -> dict[tuple[str, str], dict[str, str]]:
    with open(PRICES, newline="") as f:
        return {(r["instance_type"], r["region"]): r for r in csv.DictReader(f)}


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _plan(tmp_path: Path, capsys, *args: str) -> Plan:
    out = tmp_path / "plan.json"
    code, text, err = _run(capsys, "bench", "plan", "--out", str(out), *args)
    assert code == 0, err
    return Plan.from_dict(json.loads(out.read_text()))


def test_plan_measures_the_selectors_top_candidates_in_order(tmp_path, capsys):
    plan = _plan(tmp_path, capsys, "--profile", "cost-efficient-training", "--top", "4")
    code, out, _ = _run(capsys, "recommend", "--profile", "cost-efficient-training", "--json")
    ranked = [c["instance_type"] for c in json.loads(out)["candidates"]]
    assert [c.instance_type for c in plan.candidates] == ranked[:4]
    assert plan.market == "spot" and plan.rank_market == "on-demand"
    assert plan.command == "python3 -m dl_selector.bench.reference --model resnet50 --precision fp16"


@pytest.mark.parametrize("launch", ["spot", "on-demand"])
def test_cost_is_price_times_minutes_from_the_price_table(tmp_path, capsys, launch):
    extra = ["--on-demand"] if launch == "on-demand" else []
    plan = _plan(tmp_path, capsys, "--profile", "cost-efficient-training", "--top", "3", "--minutes", "30",
                 "--region", "us-west-2", *extra)
    table = _price_table()
    total = worst = 0.0
    for c in plan.candidates:
        row = table[(c.instance_type, "us-west-2")]
        od = float(row["on_demand_usd_per_hour"])
        price = float(row["spot_usd_per_hour"]) if launch == "spot" else od
        assert c.price_per_hour == pytest.approx(price)
        assert c.cost_usd == pytest.approx(price * 30 / 60, abs=0.006)
        # On spot the request's cap is the on-demand price: the most a candidate can cost.
        assert c.worst_cost_usd == pytest.approx(od * 30 / 60, abs=0.006)
        total += price * 0.5
        worst += od * 0.5
    assert plan.total_cost_usd == pytest.approx(total, abs=0.02)
    assert plan.worst_total_cost_usd == pytest.approx(worst, abs=0.02)


def test_max_cost_refuses_the_worst_case_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "plan.json"
    plan = _plan(tmp_path, capsys, "--profile", "multi-node-training", "--top", "2")
    budget = (plan.total_cost_usd + plan.worst_total_cost_usd) / 2  # above the expected, below the worst
    out.unlink()
    code, text, err = _run(capsys, "bench", "plan", "--profile", "multi-node-training", "--top", "2",
                           "--max-cost", f"{budget:.2f}", "--out", str(out))
    assert code == 2 and text == ""
    assert len(err.strip().splitlines()) == 1 and "above --max-cost" in err
    assert not out.exists()
    code, _, err = _run(capsys, "bench", "plan", "--profile", "multi-node-training", "--top", "2",
                        "--max-cost", f"{plan.worst_total_cost_usd + 0.01:.2f}", "--out", str(out))
    assert code == 0, err
    assert json.loads(out.read_text())["max_cost_usd"] == pytest.approx(plan.worst_total_cost_usd + 0.01)


def test_neuron_candidates_need_their_own_command(tmp_path, capsys):
    code, _, err = _run(capsys, "bench", "plan", "--profile", "neuron-training", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "neuron SDK" in err and "--command" in err
    plan = _plan(tmp_path, capsys, "--profile", "neuron-training", "--top", "2",
                 "--command", "python3 bench_neuron.py --steps 50")
    assert all(c.instance_type.startswith("trn") for c in plan.candidates)


def test_a_type_without_spot_is_skipped_on_spot_and_said(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, text, err = _run(capsys, "bench", "plan", "--profile", "multi-node-training", "--top", "3", "--out", str(out))
    assert code == 0, err
    table = _price_table()
    plan = Plan.from_dict(json.loads(out.read_text()))
    for c in plan.candidates:
        assert table[(c.instance_type, "us-east-1")]["spot_usd_per_hour"], c.instance_type
    skipped = [line for line in text.splitlines() if line.startswith("skipped ")]
    for line in skipped:
        name = line.split()[1].rstrip(":")
        assert not table.get((name, "us-east-1"), {}).get("spot_usd_per_hour"), line


@pytest.mark.parametrize("args, words", [
    (["--profile", "cost-efficient-trainin"], "closest: cost-efficient-training"),
    (["--profile", "training", "--minutes", "2"], "--minutes"),
    (["--profile", "training", "--top", "0"], "--top"),
    (["--profile", "training", "--max-cost", "-1"], "--max-cost"),
    (["--profile", "training", "--model", "resnet"], "closest: resnet50"),
    (["--profile", "training", "--precision", "int8"], "allowed: bf16, fp16, fp32, tf32"),
    (["--profile", "training", "--region", "us-east-9"], "us-east-9"),
    (["--profile", "training", "--name", "Bad_Name"], "--name"),
    (["--profile", "training", "--command", "x", "--precision", "bf16"], "--precision"),
    (["--profile", "fp64-hpc"], "--command"),
])
def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path, capsys, args, words):
    out = tmp_path / "plan.json"
    code, text, err = _run(capsys, "bench", "plan", "--out", str(out), *args)
    assert code == 2 and text == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert "Traceback" not in err
    assert not out.exists()


def test_plan_file_round_trips_and_refuses_a_broken_one(tmp_path, capsys):
    plan = _plan(tmp_path, capsys, "--profile", "cost-efficient-training", "--top", "2")
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    data = json.loads(plan.to_json())
    data["market"] = "cheap"
    with pytest.raises(ValueError, match="market"):
        Plan.from_dict(data)
    del data["candidates"]
    with pytest.raises(ValueError, match="the plan: missing key 'candidates'"):
        Plan.from_dict(data)
    data = json.loads(plan.to_json())
    data["minuets"] = 5
    with pytest.raises(ValueError, match="unknown key 'minuets'.*minutes"):
        Plan.from_dict(data)
    data = json.loads(plan.to_json())
    del data["candidates"][1]["instance_type"]
    with pytest.raises(ValueError, match=r"candidates\[1\]: missing key 'instance_type'"):
        Plan.from_dict(data)
