"""bench collect against moto S3: every planned candidate is measured or failed with its reason,
never a zero and never dropped; the file it writes is what `recommend --throughput` reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dl_selector.bench.contract import Plan, PlannedCandidate, result_key, started_key
from dl_selector.cli import main

BUCKET = "dl-bench-results"
TYPES = ("g6e.xlarge", "g5.xlarge", "g6.xlarge", "g4dn.xlarge", "g6.2xlarge", "g5.2xlarge", "g6e.2xlarge",
         "g4dn.2xlarge", "g5.4xlarge")

# Written by hand the way docs/measured-selection.md documents the line, not by the code's own formatter.
GOOD_OUTPUT = """booting
warm-up 1/2 done
dl-bench samples_per_second=810.0 window=1 samples=8100 seconds=10.0 model=resnet50 precision=fp16
dl-bench samples_per_second=790.5 window=2 samples=7905 seconds=10.0 model=resnet50 precision=fp16
dl-bench samples_per_second=800.0 window=3 samples=8000 seconds=10.0 model=resnet50 precision=fp16
dl-bench samples_per_second=820.0 window=4 samples=8200 seconds=10.0 model=resnet50 precision=fp16
dl-bench samples_per_second=100.0 window=5 samples=1000 seconds=10.0 model=resnet50 precision=fp16
done
"""


def _plan(tmp_path: Path) -> Path:
    cands = tuple(PlannedCandidate(instance_type=t, price_per_hour=1.0, price_source="test", cost_usd=0.34,
                                   modelled_samples_per_second=1000.0, uncertainty=0.2, basis="measured",
                                   accelerators="1 x GPU", on_demand_per_hour=2.0, spot_per_hour=1.0,
                                   max_price_per_hour=2.0, worst_cost_usd=0.67) for t in TYPES)
    plan = Plan(name="ce", profile="cost-efficient-training", region="us-east-1", market="spot", minutes=20,
                command="python3 -m dl_selector.bench.reference", candidates=cands, total_cost_usd=3.0,
                max_cost_usd=None, catalog_as_of="2026-11-22", created="2026-11-23T00:00Z")
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


def _result(instance_type: str, **over) -> str:
    base = {"version": 1, "instance_type": instance_type, "exit_code": 0, "timed_out": False,
            "started": "2026-11-23T10:00:00Z", "ended": "2026-11-23T10:09:00Z", "output_tail": GOOD_OUTPUT,
            "instance_id": "i-0123456789abcdef0", "availability_zone": "us-east-1a", "market": "spot", "reason": ""}
    return json.dumps({**base, **over})


@pytest.fixture
def s3(aws):
    import boto3
    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client


def _put(s3, key: str, body: str) -> None:
    s3.put_object(Bucket=BUCKET, Key=key, Body=body.encode())


def test_every_candidate_is_measured_or_failed_with_its_reason(tmp_path, s3, capsys):
    prefix = "bench/ce"
    _put(s3, result_key(prefix, "g6e.xlarge"), _result("g6e.xlarge"))
    _put(s3, result_key(prefix, "g5.xlarge"), _result("g5.xlarge", exit_code=1, output_tail="Traceback\nCUDA out of memory\n"))
    _put(s3, result_key(prefix, "g6.xlarge"), _result("g6.xlarge", exit_code=-9, timed_out=True,
                                                       output_tail=GOOD_OUTPUT.split("dl-bench")[0]))
    # g4dn.xlarge: never reported in (no capacity).
    _put(s3, started_key(prefix, "g6.2xlarge"), json.dumps({"started": "2026-11-23T10:00:00Z"}))  # then hung
    _put(s3, result_key(prefix, "g5.2xlarge"), "{not json")
    _put(s3, result_key(prefix, "g6e.2xlarge"), _result("g6e.2xlarge", output_tail="all good, no lines\n"))
    _put(s3, result_key(prefix, "g4dn.2xlarge"), _result(
        "g4dn.2xlarge", output_tail="dl-bench samples_per_second=500 window=1\ndl-bench samples_per_second=nan window=2\n"))
    _put(s3, result_key(prefix, "g5.4xlarge"), _result("g6e.xlarge"))  # a copy under the wrong name
    out = tmp_path / "results.json"

    code = main(["bench", "collect", "--bucket", BUCKET, "--plan", str(_plan(tmp_path)), "--out", str(out)])
    text, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out.read_text())
    measured = {m["instance_type"]: m for m in doc["measurements"]}
    failed = {f["instance_type"]: f["reason"] for f in doc["failed"]}
    assert sorted([*measured, *failed]) == sorted(TYPES)  # each once
    assert set(measured).isdisjoint(failed)

    m = measured["g6e.xlarge"]  # the median of 810, 790.5, 800, 820, 100: the slow window moves no figure
    assert m["samples_per_second"] == 800.0 and m["min"] == 100.0 and m["max"] == 820.0 and m["windows"] == 5
    assert m["spread"] == pytest.approx((820 - 100) / 800, abs=1e-4)
    assert m["labels"] == {"model": "resnet50", "precision": "fp16"}
    assert m["result"] == f"s3://{BUCKET}/bench/ce/results/g6e.xlarge.json"

    assert "exited 1" in failed["g5.xlarge"] and "CUDA out of memory" in failed["g5.xlarge"]
    assert "20-minute limit" in failed["g6.xlarge"] and "killed" in failed["g6.xlarge"]
    assert "never reported in" in failed["g4dn.xlarge"]
    assert "wrote no result" in failed["g6.2xlarge"] and "2026-11-23T10:00:00Z" in failed["g6.2xlarge"]
    assert "not a result" in failed["g5.2xlarge"]
    assert "no dl-bench line" in failed["g6e.2xlarge"]
    assert "does not follow the format" in failed["g4dn.2xlarge"] and "line 2" in failed["g4dn.2xlarge"]
    assert "names g6e.xlarge" in failed["g5.4xlarge"]
    assert "FAILED" in text and "g6e.xlarge" in text


def test_recommend_reads_the_collected_file_calibrates_and_names_the_failures(tmp_path, s3, capsys):
    prefix = "bench/ce"
    fast = "".join(f"dl-bench samples_per_second={v} window={i}\n" for i, v in enumerate((9010, 8990, 9000), 1))
    _put(s3, result_key(prefix, "g6e.xlarge"), _result("g6e.xlarge", output_tail=fast))
    out = tmp_path / "results.json"
    assert main(["bench", "collect", "--bucket", BUCKET, "--plan", str(_plan(tmp_path)), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["recommend", "--profile", "cost-efficient-training", "--json"]) == 0
    plain = {c["instance_type"]: c for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert main(["recommend", "--profile", "cost-efficient-training", "--throughput", str(out), "--json"]) == 0
    text, err = capsys.readouterr()
    got = {c["instance_type"]: c for c in json.loads(text)["candidates"]}
    assert got["g6e.xlarge"]["samples_per_second"] == 9000.0
    assert got["g6e.xlarge"]["throughput_source"].startswith("measured")
    # The benchmark counts its own samples: every unmeasured type is put into those units, by the
    # measured/model ratio of the profile's own model (issue 25: one rule for every throughput file).
    scale = 9000.0 / plain["g6e.xlarge"]["samples_per_second"]
    assert f"modelled figures scaled by {scale:.3g} into your measurements' units" in err
    assert got["g4dn.xlarge"]["samples_per_second"] == pytest.approx(plain["g4dn.xlarge"]["samples_per_second"] * scale,
                                                                     rel=1e-3)
    assert got["g4dn.xlarge"]["throughput_source"] == "calibrated"
    assert "measurement failed for g4dn.xlarge: never reported in" in err
    assert err.count("measurement failed for") == len(TYPES) - 1
    # Another profile's model has other units: its own ratio scales it.
    assert main(["recommend", "--profile", "training", "--throughput", str(out), "--json"]) == 0
    text, err = capsys.readouterr()
    assert json.loads(text)["calibration"]["measured_types"] == 1 and "scaled by" in err


def test_all_failed_is_said_by_recommend(tmp_path, s3, capsys):
    out = tmp_path / "results.json"
    assert main(["bench", "collect", "--bucket", BUCKET, "--plan", str(_plan(tmp_path)), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["recommend", "--profile", "cost-efficient-training", "--throughput", str(out)]) == 2
    err = capsys.readouterr().err
    assert "every candidate failed" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("bucket, words", [("no-such-bucket", "NoSuchBucket"), ("Bad Bucket!", "bench collect")])
def test_s3_errors_are_one_line_and_write_nothing(tmp_path, s3, capsys, bucket, words):
    out = tmp_path / "results.json"
    code = main(["bench", "collect", "--bucket", bucket, "--plan", str(_plan(tmp_path)), "--out", str(out)])
    text, err = capsys.readouterr()
    assert code == 2 and text == "" and len(err.strip().splitlines()) == 1 and words in err, err
    assert not out.exists()


def test_no_credentials_never_reach_aws(tmp_path, capsys, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    code = main(["bench", "collect", "--bucket", BUCKET, "--plan", str(_plan(tmp_path)),
                 "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and "credentials" in err


@pytest.mark.parametrize("content, words", [
    (None, "No such file"),
    ("[]", "expected a JSON object"),
    ('{"version": 2}', "version must be 1"),
    ('{"version": 1, "name": "x"}', "missing key"),
])
def test_a_bad_plan_file_is_one_line(tmp_path, capsys, content, words):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    code = main(["bench", "collect", "--bucket", BUCKET, "--plan", str(path), "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_run_inside_its_limit_is_still_running_not_hung():
    """A benchmark that started minutes ago has no result yet: collect says how long it has left,
    and calls it stopped only once its limit has passed."""
    from datetime import datetime, timezone

    from dl_selector.bench.collect import judge

    marker = json.dumps({"started": "2026-11-27T10:00:00Z"})
    early = judge("g6.xlarge", 20, None, marker, "s3://b/k", now=datetime(2026, 11, 27, 10, 5, tzinfo=timezone.utc))
    assert early.running and early.reason.startswith("still running: started at 2026-11-27T10:00:00Z, 15 of its "
                                                     "20-minute limit left"), early.reason
    late = judge("g6.xlarge", 20, None, marker, "s3://b/k", now=datetime(2026, 11, 27, 10, 25, tzinfo=timezone.utc))
    assert not late.running and "wrote no result within its 20-minute limit" in late.reason, late.reason
