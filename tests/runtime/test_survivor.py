"""The survivors' copy of the last completed step (issue 37, DDP): written only when it is exact,
promoted on the one node whose claim wins. The job runs in a real interpreter (the excepthook and
SIGTERM paths are the interpreter's own); the claim is a conditional write in moto."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from constructs_lib.runtime import survivor
from constructs_lib.runtime.cluster import ClusterState
from constructs_lib.runtime.layout import name_for
from constructs_lib.runtime.rundir import outcomes

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("survivor_job.py")


def _run(how: str, directory: Path, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "DL_GENERATION": "3", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1",
         **env}
    return subprocess.run([sys.executable, str(JOB), how, str(directory)], env=e, capture_output=True, text=True,
                          timeout=120)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("how, step", [("peer", 4), ("sigterm", 4), ("sigterm-mid-update", 5)])
def test_a_failed_collective_keeps_the_completed_step_exactly_buffers_included(tmp_path, how, step):
    r = _run(how, tmp_path)
    assert r.returncode != 0 and f"kept step {step} from memory" in r.stderr, r.stderr[-2000:]
    assert [s for s, _ in survivor.survivor_saves(str(tmp_path))] == [step]
    kept = torch.load(tmp_path / survivor.survivor_name(step) / "model.pt")
    want = torch.load(tmp_path / "expected.pt")
    assert _equal(kept, want), "the completed step's state, BatchNorm's running statistics put back"
    assert "RunStopped" in r.stderr or "Connection reset by peer" in r.stderr, "the run still ends with its error"
    assert outcomes(3) == {survivor.COLLECTIVE_FAILED: step}, "recorded for the supervisor, which stops the run"


@pytest.mark.parametrize("how, why", [("mid-update", "an optimizer step had begun"), ("bug", None)])
def test_nothing_is_kept_mid_update_or_for_the_jobs_own_bug(tmp_path, how, why):
    r = _run(how, tmp_path)
    assert r.returncode != 0 and survivor.survivor_saves(str(tmp_path)) == []
    assert outcomes(3) == ({} if how == "bug" else {survivor.COLLECTIVE_FAILED: 4}), "a bug is no peer's failure"
    assert (why in r.stderr) if why else ("kept" not in r.stderr and "ValueError" in r.stderr), r.stderr[-2000:]


def test_only_each_nodes_first_rank_writes_and_only_under_the_supervisor(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert _run("peer", tmp_path / "a", LOCAL_RANK="1").returncode != 0
    assert survivor.survivor_saves(str(tmp_path / "a")) == []
    env = {k: v for k, v in os.environ.items() if k != "DL_GENERATION"}
    r = subprocess.run([sys.executable, str(JOB), "peer", str(tmp_path / "b")], capture_output=True, text=True,
                       env={**env, "PYTHONPATH": str(ROOT), "LOCAL_RANK": "0"}, timeout=120)
    assert r.returncode != 0 and survivor.survivor_saves(str(tmp_path / "b")) == []


def _kept(root: Path, step: int) -> None:
    (root / survivor.survivor_name(step)).mkdir(parents=True)
    (root / survivor.survivor_name(step) / "model.pt").write_bytes(b"x")


def test_one_survivor_sends_the_kept_step_and_the_others_drop_theirs(store, tmp_path):
    """Two survivors hold the same step 57: the first claim in S3 wins; the loser removes its copy."""
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        _kept(root, 56)
        _kept(root, 57)
    cluster, said = ClusterState(store), []
    assert survivor.promote(str(a), newest_remote=50, claim=lambda s: cluster.claim_kept(4, s, "i-0a"),
                            log=said.append) == 57
    assert survivor.promote(str(b), newest_remote=50, claim=lambda s: cluster.claim_kept(4, s, "i-0b"),
                            log=said.append) is None
    assert sorted(os.listdir(a)) == [name_for(57)], "promoted; the older kept step removed"
    assert os.listdir(b) == [], "another survivor sends it"
    assert "another survivor sends it" in said[-1]


def test_a_kept_step_no_newer_than_a_checkpoint_is_dropped(store, tmp_path):
    _kept(tmp_path, 57)
    cluster = ClusterState(store)
    assert survivor.promote(str(tmp_path), newest_remote=57, claim=lambda s: cluster.claim_kept(4, s, "i-0a"),
                            log=print) is None
    assert os.listdir(tmp_path) == [] and cluster.claim_kept(4, 57, "i-0b"), "not claimed either"
