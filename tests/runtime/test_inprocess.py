"""restart=in-process without a cluster: the launcher's environment and how it ends
(ranks.py), the assignment file as input a rank checks, and the rank's side
(Checkpointer.run_generations) in real processes: it keeps the step and parks on a failed
collective, takes its next generation in the same process, and every wait ends."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from constructs_lib.runtime import inprocess
from constructs_lib.runtime.inprocess import AssignmentError, assignment_text, parse_assignment, rank_env
from tests.runtime.free_port import free_port

ROOT = Path(__file__).resolve().parents[2]
GOOD = dict(generation=2, node_rank=1, nnodes=2, nproc_per_node=2, master_addr="10.0.0.7", master_port=29500,
            resume_from="/scratch/checkpoints/step-000000000015", resume_step=15)


def test_each_rank_gets_torchruns_names():
    env = rank_env(local_rank=1, nproc_per_node=2, node_rank=1, nnodes=3, master_addr="10.0.0.7", master_port=29500,
                   generation=4)
    assert env == {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "GROUP_RANK": "1", "ROLE_RANK": "3",
                   "NODE_RANK": "1", "WORLD_SIZE": "6", "ROLE_WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "3", "NNODES": "3",
                   "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0",
                   "TORCHELASTIC_MAX_RESTARTS": "0", "DL_GENERATION": "4"}
    # Started before its plan: only what it is on this node.
    assert rank_env(local_rank=0, nproc_per_node=8) == {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}


def test_an_assignment_round_trips():
    assert parse_assignment(assignment_text(**GOOD), 2) == GOOD
    fresh = {**GOOD, "resume_from": None, "resume_step": None}
    assert parse_assignment(assignment_text(**fresh), 2) == fresh


@pytest.mark.parametrize("change, field", [
    ({"generation": 0}, "generation"), ({"generation": "2"}, "generation"), ({"generation": True}, "generation"),
    ({"node_rank": 2}, "node_rank"), ({"node_rank": -1}, "node_rank"), ({"nproc_per_node": 4}, "nproc_per_node"),
    ({"master_port": 70000}, "master_port"), ({"master_addr": "10.0.0.7; rm -rf /"}, "master_addr"),
    ({"master_addr": ""}, "master_addr"), ({"master_addr": None}, "master_addr"),
    ({"resume_from": "relative/step-1"}, "resume_from"), ({"resume_step": None}, "resume_from and resume_step"),
    ({"resume_step": -3}, "resume_step"), ({"resume_from": 5}, "resume_from"),
])
def test_a_hostile_assignment_names_its_field(change, field):
    d = {**GOOD, **change}
    with pytest.raises(AssignmentError, match=f"assignment {field}"):
        parse_assignment(json.dumps(d), 2)


@pytest.mark.parametrize("text", ["", "[1, 2]", "{", "null"])
def test_an_assignment_that_is_not_an_object_is_refused(text):
    with pytest.raises(AssignmentError, match="assignment is not"):
        parse_assignment(text, 2)


def test_waiting_for_an_assignment_is_bounded(tmp_path):
    (tmp_path / inprocess.ASSIGNMENT).write_text(assignment_text(**{**GOOD, "generation": 1}))
    with pytest.raises(TimeoutError, match="after 1 within 0 s"):  # only generation 1 there: an old one
        inprocess.wait_assignment(str(tmp_path), 1, 2, timeout=0.2)
    assert inprocess.wait_assignment(str(tmp_path), None, 2, timeout=0.2)["generation"] == 1
    with pytest.raises(RuntimeError, match="launcher is gone"):  # this process's parent is not that one
        inprocess.wait_assignment(str(tmp_path), 1, 2, timeout=30, launcher=os.getppid() + 1_000_000)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DL_", "RANK", "MASTER_", "WORLD_", "LOCAL_"))}
    env.update({"PYTHONPATH": str(ROOT), "DL_RUN_DIR": str(tmp_path / "run"), "DL_SCRATCH": str(tmp_path / "scratch"),
                "DL_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}, **extra)
    return env


RANK_PROGRAM = """
import json, os, sys, time
out = sys.argv[1]
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "DL_GENERATION")
json.dump({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}, open(f"{out}/{os.environ['LOCAL_RANK']}.json", "w"))
if os.environ["LOCAL_RANK"] == "1" and sys.argv[2] == "fail":
    while not os.path.exists(f"{out}/0.json"):  # the other rank is up: the launcher has one to stop
        time.sleep(0.05)
    sys.exit(3)
time.sleep(float(sys.argv[3]))
"""


def _launch(tmp_path: Path, how: str, sleep: float, **kw) -> subprocess.Popen:
    (tmp_path / "out").mkdir(exist_ok=True)
    env = _env(tmp_path, NODE_RANK="1", NNODES="2", MASTER_ADDR="127.0.0.9", MASTER_PORT="29400", DL_GENERATION="3")
    return subprocess.Popen([sys.executable, "-m", "constructs_lib.runtime.ranks", "--nproc", "2", "--", sys.executable,
                             "-c", RANK_PROGRAM, str(tmp_path / "out"), how, str(sleep)], env=env, cwd=ROOT, **kw)


def _ranks(tmp_path: Path, n: int = 2, timeout: float = 60) -> list[dict]:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        files = [tmp_path / "out" / f"{r}.json" for r in range(n)]
        try:
            return [json.loads(f.read_text()) for f in files]
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError("the ranks never started")


def test_the_launcher_starts_each_rank_as_torchrun_would_and_ends_with_every_rank(tmp_path):
    p = _launch(tmp_path, "ok", 0)
    assert p.wait(timeout=60) == 0
    got = sorted(_ranks(tmp_path), key=lambda r: r["LOCAL_RANK"])
    assert [(r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"], r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]) for r in got] == [
        ("2", "0", "1", "4", "2"), ("3", "1", "1", "4", "2")]
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"], r["DL_GENERATION"]) for r in got} == {("127.0.0.9", "29400", "3")}


def test_a_failed_rank_ends_the_launcher_with_its_code_and_stops_the_others(tmp_path):
    p = _launch(tmp_path, "fail", 600)
    assert p.wait(timeout=60) == 3
    survivor = _ranks(tmp_path)[0]["pid"]
    assert not _alive(survivor), "the other rank was stopped"


def test_a_launcher_whose_supervisor_is_gone_stops_its_ranks(tmp_path):
    # The supervisor stand-in: a process that starts the launcher and exits at once.
    code = ("import os, subprocess, sys, time; p = subprocess.Popen(sys.argv[1:5] + [str(os.getpid())] + sys.argv[5:], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "while not all(os.path.exists(f'{sys.argv[-3]}/{r}.json') for r in (0, 1)): time.sleep(0.05)\n"
            "print(p.pid, flush=True)")  # then it exits, as a supervisor that is gone
    (tmp_path / "out").mkdir()
    env = _env(tmp_path)
    middle = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "constructs_lib.runtime.ranks",
                             "--parent", "--nproc", "2", "--", sys.executable, "-c", RANK_PROGRAM, str(tmp_path / "out"), "ok", "600"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    launcher = int(middle.stdout.split()[0])
    ranks = [r["pid"] for r in _ranks(tmp_path)]
    until = time.monotonic() + 60
    while time.monotonic() < until and any(_alive(x) for x in [launcher, *ranks]):
        time.sleep(0.1)
    assert not any(_alive(x) for x in [launcher, *ranks]), "no orphan: the launcher and its ranks ended"


TRAIN = """
import os, sys, json
import torch
import torch.distributed as dist
from constructs_lib.runtime import Checkpointer
how = sys.argv[1]
ckpt = Checkpointer()
calls = []
def train():
    calls.append({"pid": os.getpid(), "gen": ckpt.generation, "rank": dist.get_rank(), "world": dist.get_world_size(),
                  "resume": ckpt.resume_step})
    if len(calls) > 1:
        return "done"
    model = torch.nn.Linear(2, 1)
    ckpt.keep_on_failure(lambda d: torch.save(model.state_dict(), os.path.join(d, "model.pt")))
    ckpt.should_checkpoint(4, every=0)   # step 4 complete
    if how == "bug":
        raise ValueError("the job's own bug")
    raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer")
print(json.dumps({"result": ckpt.run_generations(train, backend="gloo"), "calls": calls}), flush=True)
dist.destroy_process_group()
"""


def _rank(tmp_path: Path, how: str, program: str = "", **extra: str) -> subprocess.Popen:
    """One rank of a one-rank job under run_generations: `program` [TRAIN] with the argument `how`."""
    d = tmp_path / "inprocess"
    d.mkdir()
    env = _env(tmp_path, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DL_GENERATION="1", DL_INPROCESS_DIR=str(d), **extra)
    return subprocess.Popen([sys.executable, "-c", program or TRAIN, how], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_parked(tmp_path: Path, p: subprocess.Popen) -> None:
    """Until the rank says it parked after generation 1 (or it exited, or 120 s passed)."""
    parked = tmp_path / "inprocess" / inprocess.parked_name(1, 0)
    until = time.monotonic() + 120
    while not parked.exists() and p.poll() is None and time.monotonic() < until:
        time.sleep(0.05)
    assert parked.exists(), p.communicate(timeout=30)[1][-3000:]


def test_a_rank_keeps_the_step_parks_and_trains_the_next_generation_in_the_same_process(tmp_path):
    p = _rank(tmp_path, "peer")
    _wait_parked(tmp_path, p)
    kept = tmp_path / "ckpt" / ".survivor-step-000000000004"
    assert (kept / "model.pt").exists(), "the completed step was kept, as on torchrun's path"
    record = json.loads((tmp_path / "run" / "outcome" / "gen-1-rank-0").read_text())
    assert record == {"outcome": "collective-failed", "step": 4}
    promoted = kept.rename(tmp_path / "ckpt" / "step-000000000004")  # as the supervisor promotes it (survivor.promote)
    (tmp_path / "inprocess" / inprocess.ASSIGNMENT).write_text(assignment_text(
        generation=2, node_rank=0, nnodes=1, nproc_per_node=1, master_addr="127.0.0.1", master_port=free_port(),
        resume_from=str(promoted), resume_step=4))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["result"] == "done"
    first, second = got["calls"]
    assert first["pid"] == second["pid"] == p.pid
    assert (first["gen"], second["gen"], second["resume"]) == ("1", "2", 4)


def test_the_jobs_own_bug_is_never_parked(tmp_path):
    p = _rank(tmp_path, "bug")
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "ValueError: the job's own bug" in err
    assert not list((tmp_path / "inprocess").glob("parked-*"))


def test_a_parked_rank_whose_assignment_never_comes_exits(tmp_path):
    p = _rank(tmp_path, "peer", DL_INPROCESS_WAIT_SECONDS="1")
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "TimeoutError: no assignment of a generation after 1 within 1 s" in err


SAVE_TRAIN = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from constructs_lib.runtime import Checkpointer, inprocess
late = sys.argv[1] == "late"
inprocess.SAVE_WAIT = 0.5
ckpt = Checkpointer()
real = FileSystemWriter.write_data

def peer_gone(self, plan, planner):  # what the save's own collective says once the peer is gone
    time.sleep(2.0 if late else 0.0)  # late: past the leaving rank's wait for it
    raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")

calls = []
def train():
    calls.append(ckpt.generation)
    state = {"w": torch.arange(4.0) * len(calls)}
    if len(calls) == 1:
        FileSystemWriter.write_data = peer_gone
        ckpt.save_sharded(9, state, asynchronous=True)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer")
    FileSystemWriter.write_data = real
    ckpt.save_sharded(19, state, asynchronous=True)  # the next generation's first save
    time.sleep(3.0)  # the failed generation's save has ended by now, however late
    ckpt.wait()
    return sorted(os.listdir(ckpt.directory))
print(json.dumps({"result": ckpt.run_generations(train, backend="gloo"), "calls": calls}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("when", ["before", "late"])
def test_a_failed_generations_async_save_is_not_the_next_generations_error(tmp_path, when):
    """A peer's death fails the async save in flight too (its collectives). That error surfaced at
    the next generation's first save and failed it (seen once in the drill): now the leaving rank
    waits for its save a little and drops it, and a save that ends later still is its own
    generation's, whichever comes first."""
    p = _rank(tmp_path, when, SAVE_TRAIN, GROUP_RANK="0", DL_INPROCESS_WAIT_SECONDS="60")
    try:
        _wait_parked(tmp_path, p)
        (tmp_path / "inprocess" / inprocess.ASSIGNMENT).write_text(assignment_text(
            generation=2, node_rank=0, nnodes=1, nproc_per_node=1, master_addr="127.0.0.1", master_port=free_port(),
            resume_from=None, resume_step=None))
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["calls"] == ["1", "2"] and "step-000000000019" in got["result"], got


STALLED_TRAIN = TRAIN.replace("ckpt = Checkpointer()", """from constructs_lib.runtime import inprocess
inprocess.STACKS_AFTER = 0.5
real_teardown = inprocess._teardown
def stalled_teardown(ckpt, dist):  # a leaving rank held up (in the drill once: where, unknown)
    import time
    time.sleep(1.5)
    real_teardown(ckpt, dist)
inprocess._teardown = stalled_teardown
ckpt = Checkpointer()""")


def test_a_rank_slow_to_leave_its_generation_writes_where_every_thread_is_and_parks_once_free(tmp_path):
    p = _rank(tmp_path, "peer", STALLED_TRAIN)
    try:
        _wait_parked(tmp_path, p)
    finally:
        p.kill()
    err = p.communicate(timeout=30)[1]
    assert "most recent call first" in err and "in stalled_teardown" in err, err[-3000:]
    assert err.count("most recent call first") >= 1 and "parked (process" in err
