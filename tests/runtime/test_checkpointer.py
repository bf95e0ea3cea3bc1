"""Checkpointer: the resume point, the save/stop decisions and atomic saves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from constructs_lib.runtime import Checkpointer, contract, notice
from tests.runtime.free_port import free_port

ROOT = Path(__file__).resolve().parents[2]


def _save(ckpt: Checkpointer, step: int, payload: str = "x") -> None:
    with ckpt.save(step) as d:
        if d:
            Path(d, "state").write_text(payload)


def test_alone_it_resumes_from_the_newest_complete_local_save(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ck"))
    assert ckpt.resume_path is None
    _save(ckpt, 4)
    _save(ckpt, 9)
    (tmp_path / "ck" / ".tmp-step-000000000012-99").mkdir()  # a save in progress is never taken
    assert ckpt.resume_step == 9


def test_under_the_supervisor_only_the_agreed_step_counts(tmp_path, monkeypatch):
    local = tmp_path / "ck"
    agreed = local / "step-000000000100"
    agreed.mkdir(parents=True)
    (local / "step-000000000125").mkdir()  # this node saved further, but the cluster did not
    monkeypatch.setenv("DL_GENERATION", "3")
    monkeypatch.setenv("DL_RESUME_FROM", str(agreed))
    assert Checkpointer(str(local)).resume_step == 100
    monkeypatch.delenv("DL_RESUME_FROM")
    assert Checkpointer(str(local)).resume_path is None, "the cluster agreed to start from scratch"
    # exist_ok: making a Checkpointer under the supervisor announces its rank in the run directory
    Path(contract.path("resume_env")).parent.mkdir(parents=True, exist_ok=True)
    Path(contract.path("resume_env")).write_text(contract.env_text({"DL_RESUME_FROM": str(agreed)}))
    assert Checkpointer(str(local)).resume_step == 100, "resume.env, for a process started by hand"


def test_only_rank_0_writes_and_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    ckpt = Checkpointer(str(tmp_path / "ck"))
    with ckpt.save(3) as d:
        assert d is None
    assert os.listdir(tmp_path / "ck") == []
    monkeypatch.setenv("RANK", "0")
    ckpt = Checkpointer(str(tmp_path / "ck"))
    with pytest.raises(RuntimeError):
        with ckpt.save(3):
            raise RuntimeError("disk full")
    assert os.listdir(tmp_path / "ck") == [] and ckpt.resume_path is None


RACE = r"""
import sys
from pathlib import Path
from constructs_lib.runtime import Checkpointer
ckpt = Checkpointer(sys.argv[1])
for i in range(300):
    with ckpt.save(7) as d:
        if d:
            Path(d, "state").write_text(str(i))
"""


def test_local_ranks_saving_the_same_step_never_collide(tmp_path):
    # The review saw "Directory not empty" in 133 of 600 saves of one step by two local ranks.
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "ck")], cwd=ROOT,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-000000000007"]
    assert (tmp_path / "ck" / "step-000000000007" / "state").read_text() == "299"


def test_a_save_of_the_same_step_replaces_the_old_one(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ck"))
    _save(ckpt, 5, "first")
    _save(ckpt, 5, "second")
    assert (tmp_path / "ck" / "step-000000000005" / "state").read_text() == "second"
    assert os.listdir(tmp_path / "ck") == ["step-000000000005"]


def test_termination_stops_and_is_recorded_rebalance_saves_once_and_carries_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DL_GENERATION", "4")
    ckpt = Checkpointer(str(tmp_path / "ck"))
    assert [ckpt.should_checkpoint(s, every=5) for s in range(6)] == [False] * 4 + [True, False]
    assert ckpt.reason is None
    notice.write(notice.Notices(rebalances=1, last_rebalance={"noticeTime": "2026-11-22T05:00:00Z"}))
    assert ckpt.should_checkpoint(6, every=5) and ckpt.reason == "rebalance"
    assert not ckpt.should_checkpoint(7, every=5) and not ckpt.interrupted, "once per recommendation"
    notice.write(notice.Notices(termination={"action": "terminate", "time": "2026-11-22T05:02:00Z"}, rebalances=1))
    assert ckpt.should_checkpoint(8, every=5) and ckpt.reason == "termination" and ckpt.interrupted
    outcome = Path(contract.path("outcome_dir")) / "gen-4-rank-0"
    assert json.loads(outcome.read_text()) == {"outcome": "interrupted", "step": 8}


def test_a_recommendation_from_before_the_run_is_not_acted_on_again(tmp_path):
    notice.write(notice.Notices(rebalances=2))
    ckpt = Checkpointer(str(tmp_path / "ck"))
    assert not ckpt.should_checkpoint(0, every=0)


AGREE = r"""
import os, sys, json
import torch.distributed as dist
from constructs_lib.runtime import Checkpointer
dist.init_process_group("gloo")
ckpt = Checkpointer(sys.argv[1] + "/ck" + os.environ["RANK"])
answers = [(ckpt.should_checkpoint(s, every=0), ckpt.reason, ckpt.interrupted) for s in range(3)]
print(json.dumps(answers))
dist.destroy_process_group()
"""


def test_a_notice_on_one_node_is_every_ranks_decision(tmp_path):
    """Two ranks with separate run directories (two nodes); only rank 1's node has the notice."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        run = tmp_path / f"run{rank}"
        run.mkdir()
        if rank == 1:
            (run / "notice.json").write_text(json.dumps({"termination": {"action": "terminate", "time": "x"}}))
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "DL_RUN_DIR": str(run), "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, "-c", AGREE, str(tmp_path)], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        answers.append(json.loads(out))
    assert answers[0] == answers[1] == [[True, "termination", True]] * 3
