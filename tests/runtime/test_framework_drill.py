"""Unmodified framework scripts on the multi-node drill (2 nodes x 2 ranks, real torchrun, the
node bundle, moto_server): a Hugging Face Trainer script and a Lightning script, shipped with
only `-c checkpoint_dir=` and `-c command=` set. Neither imports dl-launcher (but for the one-line
notice callback, behind --callback), both resume with their framework's own lookup
(get_last_checkpoint, ckpt_path="last").

Each is driven through a hard kill of the node that runs global rank 0 (its local disk and every
unsent save are gone) and then a spot notice on the other node:
- after the kill, every rank resumes the last step every rank completed, kept by the callback
  from memory on the surviving node (at most the step in flight is done again);
- after the notice, with the callback, every rank stops at one step, that save is in S3 before the
  deadline, and the next generation starts exactly there: 0 steps lost;
- the job ends with the framework's final step and its loss in the job log.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.runtime.drill import Drill, generations

pytestmark = pytest.mark.drill

PROJECT = Path(__file__).with_name("framework_project")
STEPS, EVERY = 40, 8


def _new_generation(d: Drill, after: str, timeout: float = 240.0) -> str:
    d.wait(f"a generation after {after}", lambda: (d.current_gen() or after) != after
           and len(generations(d.read_events())[d.current_gen()]["starts"]) == d.nodes * d.nproc, timeout=timeout)
    return d.current_gen()


def _rank0(d: Drill, g: str):
    """The node running global rank 0: the plan's first member (the script itself names no node)."""
    first = d.plan(g)["members"][0]["node"]
    return next(n for n in d.all_nodes if n.id == first)


def _starts(d: Drill, g: str) -> set[int]:
    return set(generations(d.read_events())[g]["starts"].values())


def _drive(d: Drill) -> dict:
    """Kill rank 0's node, then a notice on the other one; returns what was seen."""
    seen = {}
    d.add_node("127.0.0.2")
    d.add_node("127.0.0.3")
    d.wait("generation 1 training past its first save", lambda: d.running("1", EVERY + 2) and d.newest_in_s3() >= EVERY,
           timeout=240)
    victim = _rank0(d, "1")
    sent_before_kill = d.newest_in_s3()
    victim.kill()
    done = max(e["step"] for e in d.read_events() if e["gen"] == "1" and e["event"] == "step")
    d.add_node("127.0.0.4")
    g2 = _new_generation(d, "1")
    seen["kill"] = {"sent": sent_before_kill, "resume": d.plan(g2)["resume_step"], "starts": _starts(d, g2),
                    "done": done}

    start = min(_starts(d, g2))
    d.wait("generation 2 training", lambda: d.running(g2, start + 3), timeout=120)
    warned = next(n for n in d.live() if n is not _rank0(d, g2))
    deadline = warned.imds.interrupt(seconds=60)
    d.wait(f"{warned.addr} to leave", lambda: "left the cluster" in warned.log_text(), timeout=60)
    last = {}
    for e in d.read_events():
        if e["gen"] == g2 and e["event"] == "step":
            last[e["rank"]] = max(last.get(e["rank"], -1), e["step"])
    stop = max(last.values())
    manifest = f"{d.prefix}/step-{stop:012d}/MANIFEST.json"
    in_s3 = d.s3.list_objects_v2(Bucket=d.bucket, Prefix=manifest)["KeyCount"] == 1
    seen["notice"] = {"last_steps": last, "in_s3": in_s3,
                      "before_deadline": time.time() < deadline.timestamp()}
    warned.kill()
    d.add_node("127.0.0.5")
    g3 = _new_generation(d, g2)
    seen["notice"]["starts"] = _starts(d, g3)
    seen["notice"]["stop"] = stop
    d.wait("the job to finish on every node", d.finished, timeout=240)
    seen["final_logs"] = [n.log_text() for n in d.live()]
    seen["units"] = {n.addr: n.units["dl-job.service"].exits for n in d.live()}
    return seen


def _check(seen: dict) -> None:
    kill = seen["kill"]
    assert kill["starts"] == {kill["resume"]}, f"every rank resumes the plan's step: {kill}"
    assert kill["resume"] is not None and kill["resume"] >= kill["sent"], f"the newest step sent before the kill: {kill}"
    # The callback keeps the last step every rank completed, from memory: at most the one in flight
    # is done again (the newest save is 2 or more steps older when the kill comes).
    assert kill["done"] - kill["resume"] <= 1, f"a hard kill costs at most the step in flight: {kill}"
    note = seen["notice"]
    assert set(note["last_steps"].values()) == {note["stop"]}, f"every rank stops at one step: {note}"
    assert note["in_s3"] and note["before_deadline"], f"the stop step's save is in S3 before the deadline: {note}"
    assert note["starts"] == {note["stop"]}, f"0 steps lost after the notice: {note}"
    assert any(f"final step {STEPS} " in text for text in seen["final_logs"]), "the framework's last line in the job log"
    assert all(exits == [0] or exits == [] for exits in seen["units"].values()), seen["units"]


def _unchanged_script(root, endpoint: str, job: str, checkpoint_dir: str, script: str) -> None:
    """`script` (its own flag naming checkpoint_dir included) through _drive, then _check."""
    root.mkdir()
    d = Drill(root, endpoint, steps=STEPS, code=PROJECT, job=job, context={"checkpoint_dir": checkpoint_dir},
              job_command=f"dl-torchrun {script} --max-steps {STEPS} --save-steps {EVERY} --sleep 0.25 "
                          f"--events {root / 'events.jsonl'} --callback")
    try:
        seen = _drive(d)
    finally:
        d.stop()
    _check(seen)


def test_hugging_face_trainer_script_unchanged(tmp_path, moto_process):
    _unchanged_script(tmp_path / "run", moto_process, "hf", "outputs", "hf_train.py --output-dir outputs")


def test_lightning_script_unchanged(tmp_path, moto_process):
    _unchanged_script(tmp_path / "run", moto_process, "lit", "checkpoints", "lightning_train.py --ckpt-dir checkpoints")
