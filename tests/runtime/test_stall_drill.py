"""Drills on two simulated nodes (tests/runtime/drill.py: each node its own processes, directories,
moto instance and fake IMDS, running the node bundle's units): a rank that stops stepping is
detected, the generation stops on both nodes and re-forms, and the job goes on to finish; a node
whose steps take several times the other's is reported as a straggler. The training command is a
plain Python loop that calls Checkpointer.should_checkpoint each step (no torch: one rank a node),
and the thresholds are seconds, through the node's settings, so each drill takes seconds."""
from __future__ import annotations

import re
from pathlib import Path

from constructs_lib.runtime import contract
from tests.runtime.test_supervisor import _cluster_file, drill  # noqa: F401 - the fixture

LOOP = '''
import os, sys, time
os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")  # one process a node: no collective to agree in
from constructs_lib.runtime.checkpointer import Checkpointer
ckpt = Checkpointer()
first, node = os.environ["DL_GENERATION"] == "1", os.environ["NODE_RANK"]
mode, seconds = sys.argv[1], float(sys.argv[2])
until = time.time() + (3600 if first and mode == "hang" else seconds)  # generation 1 runs until stopped
step = 0
while time.time() < until:
    if mode == "hang" and first and node == "1" and step == 20:
        print("rank stops stepping at step 20", flush=True)
        time.sleep(3600)
    time.sleep(0.2 if mode == "slow" and node == "1" else 0.04)
    ckpt.should_checkpoint(step, every=0)
    step += 1
print(f"generation {os.environ['DL_GENERATION']} done at step {step}", flush=True)
'''
SETTINGS = {contract.ENV_HANG_SECONDS: "3", contract.ENV_FIRST_STEP_SECONDS: "60", "DL_PACE_SECONDS": "1",
            "DL_STRAGGLER_REPORT_CHECKS": "2", "DL_STRAGGLER_REPLACE_CHECKS": "1000"}


def _start(drill, tmp_path: Path, mode: str, seconds: float):  # noqa: F811 - the fixture
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    d = drill(f'"$DL_PYTHON" {script} {mode} {seconds}')
    d.base_env.update(SETTINGS)
    return d, [d.add_node("127.0.0.2"), d.add_node("127.0.0.3")]


def test_a_rank_that_stops_stepping_is_detected_and_the_job_re_forms_and_finishes(drill, tmp_path):  # noqa: F811
    d, nodes = _start(drill, tmp_path, "hang", 2)
    d.wait("the job to finish after the hang", d.finished, timeout=120)
    assert _cluster_file(d, "finished.json")["generation"] == 2, "generation 2 formed after the hang, and finished"
    plan = d.plan("1")
    hung = next(n for n in nodes if n.id == plan["members"][1]["node"])
    other = next(n for n in nodes if n is not hung)
    hung_log, other_log = hung.log_text(), other.log_text()
    assert "rank stops stepping at step 20" in hung_log
    # The step it last completed (19), not an older one: a report held back by the once-a-second
    # limit is written by the rank's clock thread while the rank hangs.
    assert re.search(r"generation 1: hung: no step for \d+ s at step 19; stopping the run", hung_log), hung_log
    assert "quick checks passed (0 checks" in hung_log, "a simulated node has no GPU, EFA or RAID to check"
    assert "generation 1 ended: failed (hung: no step for" in hung_log
    # The other node's run was stopped by the hung node's join of generation 2, as for a member
    # leaving; it checked itself too, and counts the generation as the hang it was.
    assert f"generation 1: {hung.id} hung; quick checks passed" in other_log
    assert f"generation 1 ended: failed (the command failed on {hung.id} (hung: no step for" in other_log
    assert "generation 2 done" in hung_log and "generation 2 done" in other_log
    tags = d.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [hung.id]},
                                        {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
    assert tags and tags[0]["Value"].startswith("ok: hung: no step for"), "what dl-launcher status lists"


def test_a_node_whose_steps_take_five_times_the_others_is_reported_as_a_straggler(drill, tmp_path):  # noqa: F811
    d, nodes = _start(drill, tmp_path, "slow", 12)
    d.wait("the job to finish", d.finished, timeout=120)
    plan = d.plan("1")
    slow = next(n for n in nodes if n.id == plan["members"][1]["node"])
    fast = next(n for n in nodes if n is not slow)
    assert "straggler: median step 0.2" in slow.log_text() and "2 checks in a row (replaced after 1000)" in slow.log_text()
    assert "straggler" not in fast.log_text()
    assert (Path(slow.dirs["DL_RUN_DIR"]) / "health.d" / "pace").read_text().startswith("degraded straggler")
    tags = d.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [slow.id]},
                                        {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
    assert tags and tags[0]["Value"].startswith("ok: straggler: median step")
