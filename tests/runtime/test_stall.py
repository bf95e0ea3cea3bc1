"""Hangs and stragglers (stall.py, steps.py): the rank's step reports, the rules, the pace records
in moto's S3 (one LIST, no GET per peer) and what a stopped run comes to on a node (quick checks,
rejoin or retire, the health tag `dl-launcher status` lists). The drills on simulated nodes are in
test_stall_drill.py."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from constructs_lib.runtime import contract, steps
from constructs_lib.runtime.cluster import ClusterState
from constructs_lib.runtime.stall import StallSettings, StallWatch, after_run, hang_detail, slower_by, strikes_after
from constructs_lib.runtime.steps import Report, StepClock


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _report_file(rank: str) -> dict:
    return json.loads(Path(steps.steps_dir(), f"rank-{rank}.json").read_text())


# ---- the rank's side ------------------------------------------------------------------------------------
def test_a_rank_reports_its_step_and_its_busy_time_without_the_agreements_wait(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(steps.time, "monotonic", clock)
    c = StepClock(3, "7", every=0.0)
    for step in range(4):
        c.arrived(step)
        clock.t += 5.0      # waiting in should_checkpoint's all-reduce for a slower node: not this node's time
        c.left()
        clock.t += 1.0      # this rank's own step
    d = _report_file("3")
    assert d["generation"] == "7" and d["step"] == 3 and d["median"] == 1.0 and d["steps"] == 4


def test_reports_are_rate_limited_and_a_plain_script_has_none(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(steps.time, "monotonic", clock)
    c = StepClock(0, "1")  # one write a second at most
    c.arrived(0)
    clock.t += 0.1
    c.arrived(1)
    assert _report_file("0")["step"] == 0, "the second report within a second waits in memory"
    c.flush()  # what the clock's own thread does within the second: a rank that stops now is seen at step 1
    assert _report_file("0")["step"] == 1
    clock.t += 1.0
    c.arrived(2)
    assert _report_file("0")["step"] == 2
    assert [r.step for r in steps.read("1")] == [2] and steps.read("2") == [], "another generation's reports are not this run's"
    Path(steps.steps_dir(), "rank-9.json").write_text("not json")
    assert len(steps.read("1")) == 1, "a file of any other shape is skipped"
    steps.clear()
    assert steps.read("1") == []


def test_the_checkpointer_reports_each_step_under_the_supervisor(monkeypatch, tmp_path):
    monkeypatch.setenv("DL_GENERATION", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    from constructs_lib.runtime.checkpointer import Checkpointer
    ckpt = Checkpointer(str(tmp_path / "ck"))
    ckpt.should_checkpoint(41, every=100)
    assert [(r.rank, r.step) for r in steps.read("4")] == [("1", 41)]


# ---- the rules -------------------------------------------------------------------------------------------
S = StallSettings(hang=60, first_step=600)


def test_a_hang_is_no_step_for_the_stated_time_and_the_first_step_gets_its_own_allowance():
    fresh = [Report("0", 40, 1000.0, 1.0), Report("1", 41, 1001.0, 1.2)]
    assert hang_detail(fresh, 0.0, 1060.0, S, True) == ""
    assert hang_detail(fresh, 0.0, 1061.0, S, True) == "hung: no step for 60 s at step 41"
    assert hang_detail([], 0.0, 599.0, S, True) == ""
    assert hang_detail([], 0.0, 600.0, S, True) == "hung: no first step for 600 s"
    assert hang_detail([], 0.0, 10**6, S, False) == "", "a command never seen reporting steps: no alarm"
    announced = [Report("0", steps.NO_STEP, 100.0, None)]  # the rank made its Checkpointer (or said busy()) at 100
    assert hang_detail(announced, 0.0, 699.0, S, False) == "", "announced: the first step's allowance, from its sign"
    assert hang_detail(announced, 0.0, 700.0, S, False) == "hung: no first step for 700 s"
    assert hang_detail(announced + [Report("1", 3, 1000.0, 1.0)], 0.0, 1060.0, S, False) \
        == "hung: no step for 60 s at step 3", "a rank that stepped: hang_timeout, at the step it reached"


def test_a_first_step_that_never_comes_is_a_hang_in_a_boots_first_run_once_a_rank_made_its_checkpointer(
        monkeypatch, tmp_path):
    """The first run of a boot: no step seen yet on this node. Through the real StallWatch, StepClock
    and Checkpointer: a plain script is never called hung; a command whose rank made its
    Checkpointer (what every script that reports steps does first) is, after first_step_timeout."""
    import time

    from constructs_lib.runtime import stall
    from constructs_lib.runtime.checkpointer import Checkpointer
    clock = Clock()
    clock.t = time.time()  # a report's time is also its file's mtime: the clock starts at the real one
    monkeypatch.setattr(stall.time, "time", clock)
    monkeypatch.setenv("DL_GENERATION", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    settings = StallSettings(hang=60, first_step=600)
    plain = StallWatch(settings, 1, "i-0000000000000000a", None, log=print)
    assert not plain.reports_steps, "the first run of a boot"
    clock.t += 10**5
    assert plain.look() is None, "a script that never makes a Checkpointer is never called hung"

    watch = StallWatch(settings, 1, "i-0000000000000000a", None, log=print)
    ckpt = Checkpointer(str(tmp_path / "ck"))  # the rank announces itself: no step yet
    assert [(r.rank, r.step) for r in steps.read("1")] == [("0", steps.NO_STEP)]
    clock.t += 599
    assert watch.look() is None, "compile, restore and loading get first_step_timeout"
    clock.t += 1
    assert watch.look() == ("hung", "hung: no first step for 600 s"), "the hang path, as for a later run"

    again = StallWatch(settings, 1, "i-0000000000000000a", None, log=print)
    assert again.reports_steps, "remembered for the boot's next runs"
    Checkpointer(str(tmp_path / "ck")).should_checkpoint(0, every=0)
    clock.t += 599
    assert again.look() == ("hung", "hung: no step for 599 s at step 0"), "after the first step: hang_timeout"
    del ckpt


def test_a_straggler_is_slower_than_the_others_median_for_checks_in_a_row():
    assert slower_by(3.0, {"a": 1.0, "b": 1.0, "c": 9.0}) == 3.0, "the others' median, not their mean"
    assert slower_by(3.0, {}) is None
    strikes = 0
    for factor in (1.5, 1.5, None, 1.5, 1.1, 1.3):
        strikes = strikes_after(strikes, factor, 1.2)
    assert strikes == 1, "a check below the ratio, or none to compare with, starts the count again"


def test_settings_come_from_node_env_and_a_bad_value_is_said_and_the_default_kept():
    said: list[str] = []
    s = StallSettings.from_env({contract.ENV_HANG_SECONDS: "90", contract.ENV_FIRST_STEP_SECONDS: "soon",
                                "DL_STRAGGLER_REPORT_CHECKS": "0", "DL_STRAGGLER_RATIO": "1.5"}, said.append)
    assert (s.hang, s.first_step, s.report_after, s.ratio) == (90.0, contract.FIRST_STEP_SECONDS_DEFAULT, 3, 1.5)
    assert any("DL_FIRST_STEP_SECONDS='soon'" in line for line in said) and len(said) == 2


# ---- the pace records --------------------------------------------------------------------------------------
def test_every_nodes_pace_is_read_with_one_list_and_no_get(store):
    cluster = ClusterState(store)
    keys = {n: None for n in ("i-0000000000000000a", "i-0000000000000000b")}
    for ms in (900, 1000):
        for n in keys:
            keys[n] = cluster.pace(3, n, ms + (2000 if n.endswith("b") else 0), keys[n])
    calls: list[str] = []
    store.client.meta.events.register("before-call.s3.*", lambda model, **kw: calls.append(model.name))
    assert cluster.paces(3) == {"i-0000000000000000a": 1.0, "i-0000000000000000b": 3.0}
    assert calls == ["ListObjectsV2"], calls
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=f"{store.prefix}/_cluster/gen-000003/pace/")
    assert len(listed["Contents"]) == 2, "each node's previous key is deleted"


def _write_report(rank: str, g: int, step: int, median: float) -> None:
    import time
    os.makedirs(steps.steps_dir(), exist_ok=True)
    Path(steps.steps_dir(), f"rank-{rank}.json").write_text(json.dumps(
        {"generation": str(g), "step": step, "at": time.time(), "median": median, "steps": step}))


def test_a_straggler_is_reported_then_stopped_when_it_persists(store):
    cluster, said = ClusterState(store), []
    me, peer = "i-0000000000000000a", "i-0000000000000000b"
    cluster.pace(2, peer, 1000, None)
    watch = StallWatch(StallSettings(pace_every=1e-9, report_after=2, replace_after=4), 2, me, cluster, log=said.append)
    results = []
    for step in range(4):
        _write_report("0", 2, step, 2.5)
        results.append(watch.look())
    assert results[:3] == [None, None, None] and results[3][0] == "straggler"
    assert "straggler: median step 2.50 s, 2.5x the other nodes' 1.00 s, 4 checks in a row" == results[3][1]
    assert any("2 checks in a row (replaced after 4)" in line for line in said), said
    assert Path(contract.path("health_dir"), "pace").read_text().startswith("degraded straggler")


def test_a_node_as_fast_as_the_others_is_never_a_straggler(store):
    cluster = ClusterState(store)
    cluster.pace(2, "i-0000000000000000b", 1000, None)
    watch = StallWatch(StallSettings(pace_every=1e-9, report_after=1, replace_after=2), 2, "i-0000000000000000a",
                       cluster, log=print)
    for step in range(5):
        _write_report("0", 2, step, 1.1)
        assert watch.look() is None


# ---- after a stopped run -----------------------------------------------------------------------------------
@pytest.fixture
def node(store):
    ec2 = boto3.client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    iid = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    said: list[str] = []
    return SimpleNamespace(cluster=ClusterState(store), liveness=SimpleNamespace(ec2=ec2), me=SimpleNamespace(node=iid),
                           log=said.append, said=said, ride=lambda fn, what: fn(), flush=lambda: None)


def _health_tag(sup) -> str:
    tags = sup.liveness.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [sup.me.node]}])["Tags"]
    return next((t["Value"] for t in tags if t["Key"] == contract.TAG_HEALTH), "")


def test_a_hung_node_that_passes_its_quick_checks_rejoins_and_its_generation_counts_failed_saying_so(node):
    got = after_run(node, 5, "hung", "hung: no step for 60 s at step 41", hold_fn=lambda *a: pytest.fail("held"))
    assert got == ("failed", "hung: no step for 60 s at step 41")
    assert _health_tag(node).startswith("ok: hung: no step for 60 s at step 41; quick checks passed")


def test_a_hung_node_that_fails_its_quick_checks_leaves_and_is_tagged_for_replacement(node, monkeypatch):
    monkeypatch.setenv(contract.ENV_EXPECTED_SCRATCH_GB, "100000")  # the RAID is far smaller: scratch-raid fails
    held = []
    got = after_run(node, 5, "hung", "hung: no step for 60 s at step 41",
                    hold_fn=lambda ec2, iid, why, log: held.append(why) or contract.EXIT_FAILED)
    assert got == contract.EXIT_FAILED
    assert held and held[0].startswith("hung: no step for 60 s at step 41; the quick health checks failed: scratch-raid")
    assert node.cluster.leaves(6) == {node.me.node}, "a leave in the next generation stops the others' runs"
    assert any(line.startswith("quick checks: scratch-raid failed") for line in node.said), node.said


def test_a_node_whose_run_a_peers_hang_stopped_runs_the_quick_checks_too(node):
    node.cluster.record_failure(5, "i-0000000000000000b", "hung: no step for 60 s at step 41")
    assert after_run(node, 5, "peer-lost", "a node joined or left generation 6") == (
        "peer-lost", "a node joined or left generation 6"), "the count is decided by the agreed outcome, as before"
    assert any("i-0000000000000000b hung; quick checks passed" in line for line in node.said), node.said
    node.said.clear()
    assert after_run(node, 6, "peer-lost", "x gone") == ("peer-lost", "x gone") and not node.said


def test_busy_moves_a_ranks_report_on_so_a_long_evaluation_is_no_hang(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    steps.busy()
    assert steps.read("1") == [], "before the rank's first step there is nothing to move on"
    StepClock(2, "1").arrived(7)
    path = Path(steps.steps_dir(), "rank-2.json")
    old = _report_file("2")["at"] - 3600
    path.write_text(json.dumps({**_report_file("2"), "at": old}))
    os.utime(path, (old, old))
    [before] = steps.read("1")
    assert hang_detail([before], 0.0, old + 61, S, True).startswith("hung: no step for 61 s at step 7")
    steps.busy()
    [after] = steps.read("1")
    assert after.step == 7 and after.at > old + 61 and hang_detail([after], 0.0, old + 61, S, True) == ""


def test_a_reported_straggler_that_catches_up_says_so(store):
    cluster, said = ClusterState(store), []
    cluster.pace(2, "i-0000000000000000b", 1000, None)
    watch = StallWatch(StallSettings(pace_every=1e-9, report_after=1, replace_after=5), 2, "i-0000000000000000a",
                       cluster, log=said.append)
    for step, median in enumerate((3.0, 3.0, 1.0)):
        _write_report("0", 2, step, median)
        assert watch.look() is None
    assert Path(contract.path("health_dir"), "pace").read_text().startswith("ok median step 1.00 s")
    assert said[-1] == "generation 2: no longer a straggler (median step 1.00 s)", said
