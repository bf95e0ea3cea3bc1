"""Repeated spot interruptions of a training loop: every restart resumes from the last complete
checkpoint in S3, and the final state equals an uninterrupted run."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOY = Path(__file__).parent / "toy_train.py"
STEPS, EVERY = 60, 7


def expected_final() -> int:
    state = 0
    for step in range(STEPS):
        state = (state * 31 + step * step + 7) % 1_000_000_007
    return state


def start(env, progress: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TOY), str(STEPS), str(EVERY), str(progress)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_repeated_interruptions_resume_from_the_last_complete_checkpoint(bucket, s3env, tmp_path):
    progress = tmp_path / "progress"
    env = {**s3env, "PYTHONPATH": str(ROOT), "DL_CHECKPOINT_BUCKET": bucket, "DL_CHECKPOINT_PREFIX": "jobs/toy",
           "DL_RESUME_ENV": str(tmp_path / "resume.env"), "DL_RESUME_FILE": str(tmp_path / "resume-from"),
           "DL_INTERRUPTION_MARKER": str(tmp_path / "marker")}
    restarts = []
    for kill_after in (5, 19, 33, 47):  # steps seen before AWS takes the node
        node_disk = tmp_path / f"node-{kill_after}"  # a replacement node: empty instance store
        env["DL_CHECKPOINT_DIR"] = str(node_disk)
        before = len(progress.read_text().split()) if progress.exists() else 0
        proc = start(env, progress)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = len(progress.read_text().split()) - before if progress.exists() else 0
            if seen >= kill_after - (restarts[-1] if restarts else 0) or proc.poll() is not None:
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)  # the node is gone: no goodbye, no flush
        proc.wait()
        restarts.append(kill_after)
        shutil.rmtree(node_disk, ignore_errors=True)
    env["DL_CHECKPOINT_DIR"] = str(tmp_path / "node-final")
    proc = start(env, progress)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["final"] == expected_final()
    steps = [int(s) for s in progress.read_text().split()]
    # Each restart re-ran only the steps after the last complete checkpoint, never skipped one.
    assert set(steps) == set(range(STEPS))
    assert len(steps) > STEPS, "interruptions really happened and some steps were redone"
    runs, current = [], []
    for s in steps:
        if current and s <= current[-1]:
            runs.append(current)
            current = []
        current.append(s)
    runs.append(current)
    assert len(runs) == 5, "four interruptions, five runs"
    for run in runs:
        assert run[0] % EVERY == 0, f"a run started at step {run[0]}, not right after a complete checkpoint"
