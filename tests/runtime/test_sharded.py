"""Sharded (DCP) checkpoints: a node's part is complete when its last local rank finishes, a step
is complete in S3 only when every node's part is there, and a node restores only what its ranks
read back. The node side is driven through shards.finish_rank, as each rank's Checkpointer does;
the S3 side against moto_server; a real async DCP save is killed mid-write in a subprocess."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from constructs_lib.runtime import sharded_store, shards
from constructs_lib.runtime.agent import NodeAgent, parts_sent, pushed_step
from constructs_lib.runtime.checkpointer import Checkpointer
from constructs_lib.runtime.imds import Imds
from constructs_lib.runtime.resume import restore
from tests.runtime.s3_faults import s3_error

ROOT = Path(__file__).resolve().parents[2]
WORLD, LOCAL = 4, 2
EXPECT = [".metadata"] + [f"__{r}_0.distcp" for r in range(WORLD)]  # sorted: "." before "_"


def _reads(rank: int) -> list[str]:
    # What DCP's planner gives with replicated state on rank 0 (see Checkpointer.save_sharded).
    return sorted({".metadata", "__0_0.distcp", f"__{rank}_0.distcp"})


def node_save(root: Path, step: int, attempt: str, node: int, *, finish: tuple[int, ...] = (0, 1)) -> Path:
    """Node `node`'s part of a save, as its ranks write it; `finish`: the local ranks that get to the end."""
    tmp = Path(shards.tmp_dir(str(root), step, attempt))
    tmp.mkdir(parents=True, exist_ok=True)
    for lr in range(LOCAL):
        rank = node * LOCAL + lr
        (tmp / f"__{rank}_0.distcp").write_bytes(os.urandom(1000 + rank) + bytes([step % 256]))
        if rank == 0:
            (tmp / ".metadata").write_bytes(os.urandom(300))
    for lr in finish:
        rank = node * LOCAL + lr
        shards.finish_rank(str(root), step, attempt, rank=rank, node_rank=node, local_world_size=LOCAL,
                           world_size=WORLD, reads=_reads(rank), expect=EXPECT if rank == 0 else None)
    return root / f"step-{step:012d}"


def test_a_node_part_is_complete_only_when_its_last_local_rank_finishes(tmp_path):
    done = node_save(tmp_path, 7, "g1-0000abcd", node=1, finish=(1,))
    assert not done.exists() and shards.stale_tmp(str(tmp_path)), "one of two local ranks: not complete"
    assert Checkpointer(str(tmp_path)).resume_path is None
    shards.finish_rank(str(tmp_path), 7, "g1-0000abcd", rank=2, node_rank=1, local_world_size=LOCAL,
                       world_size=WORLD, reads=_reads(2))
    assert done.is_dir() and not shards.stale_tmp(str(tmp_path))
    part = shards.node_part(str(done))
    assert part == {"attempt": "g1-0000abcd", "node_rank": 1, "world_size": WORLD,
                    "reads": {"2": _reads(2), "3": _reads(3)}}
    assert Checkpointer(str(tmp_path)).resume_path == str(done)


def test_the_same_step_saved_again_replaces_the_old_one_and_a_killed_attempt_is_never_resumed(tmp_path):
    first = node_save(tmp_path, 7, "g1-0000abcd", node=0)
    before = (first / "__0_0.distcp").read_bytes()
    node_save(tmp_path, 9, "g1-0000abce", node=0, finish=(0,))  # killed: one rank never finished
    again = node_save(tmp_path, 7, "g2-0000abcf", node=0)
    assert again == first and (again / "__0_0.distcp").read_bytes() != before
    assert shards.node_part(str(again))["attempt"] == "g2-0000abcf"
    assert Checkpointer(str(tmp_path)).resume_path == str(again), "step 9 never completed"
    assert [Path(p).name for p in shards.stale_tmp(str(tmp_path))] == [".tmp-step-000000000009-g1-0000abce"]


def test_restore_clears_saves_a_kill_cut_short(store, tmp_path):
    node_save(tmp_path / "ck", 9, "g1-0000abce", node=0, finish=(0,))
    restore(store, str(tmp_path / "ck"), None, log=lambda m: None)
    assert not shards.stale_tmp(str(tmp_path / "ck"))


def _push(store, root: Path, step: int, attempt: str, node: int):
    path = node_save(root, step, attempt, node)
    sharded_store.push_part(store, str(path), step, shards.node_part(str(path)))
    return sharded_store.commit(store, step, attempt)


def test_a_step_is_complete_in_s3_only_with_every_node_part(store, tmp_path):
    assert _push(store, tmp_path / "n0", 5, "g1-00000001", 0) is None
    assert store.latest() is None and not store.has_step(5), "one node's part is not a checkpoint"
    cp = _push(store, tmp_path / "n1", 5, "g1-00000001", 1)
    assert cp is not None and store.latest().step == 5
    m = cp.manifest
    assert sorted(f["path"] for f in m["files"]) == EXPECT
    assert m["dir"] == "data-g1-00000001" and m["shards"]["reads"]["3"] == _reads(3)


def test_parts_of_different_attempts_never_make_a_step(store, tmp_path):
    assert _push(store, tmp_path / "n0", 5, "g1-00000001", 0) is None
    assert _push(store, tmp_path / "n1", 5, "g2-00000002", 1) is None
    assert not store.has_step(5)


def test_two_parts_claiming_one_file_with_different_bytes_are_refused():
    f = {"path": "__0_0.distcp", "size": 1, "sha256": "a", "checksum_type": "FULL_OBJECT", "part_size": 1}
    base = {"step": 1, "attempt": "g1-00000001", "world_size": 1, "reads": {"0": [".metadata"]}, "expect": [".metadata"],
            "node_rank": 0, "_key_node": 0}
    meta = {**f, "path": ".metadata"}
    ok = sharded_store.merge([{**base, "files": [f, meta]}], 1, "g1-00000001")
    assert ok is not None
    assert sharded_store.merge([{**base, "files": [f, meta]}, {**base, "files": [{**f, "sha256": "b"}], "reads": {},
                                                                 "node_rank": 1, "_key_node": 1}],
                               1, "g1-00000001") is None


def test_a_node_restores_only_what_its_ranks_read_back_and_all_of_it_for_another_world(store, tmp_path):
    _push(store, tmp_path / "n0", 5, "g1-00000001", 0)
    _push(store, tmp_path / "n1", 5, "g1-00000001", 1)
    step, path = store.pull(str(tmp_path / "r1"), 5, ranks=range(2, 4), world_size=WORLD)
    assert sorted(os.listdir(path)) == [".dl-restored-subset", ".metadata", "__0_0.distcp", "__2_0.distcp",
                                        "__3_0.distcp"]
    assert (Path(path) / "__2_0.distcp").read_bytes() == (tmp_path / "n1/step-000000000005/__2_0.distcp").read_bytes()
    _s, whole = store.pull(str(tmp_path / "r2"), 5, ranks=range(0, 3), world_size=3)
    assert sorted(os.listdir(whole)) == [".dl-restored-subset", *EXPECT], "another world size: every file"


def test_a_node_that_holds_its_own_shards_of_the_step_downloads_only_the_rest(store, tmp_path):
    _push(store, tmp_path / "n0", 5, "g1-00000001", 0)
    _push(store, tmp_path / "n1", 5, "g1-00000001", 1)
    mine = tmp_path / "n1" / "step-000000000005"
    saved = {n: (mine / n).read_bytes() for n in ("__2_0.distcp", "__3_0.distcp")}
    (mine / "__3_0.distcp").write_bytes(b"not what was saved")  # a file that does not verify comes again
    data = f"{store.prefix}/step-000000000005/data-g1-00000001"
    store.client.delete_object(Bucket=store.bucket, Key=f"{data}/__2_0.distcp")  # S3 can no longer give it
    step, path = store.pull(str(tmp_path / "n1"), 5, ranks=range(2, 4), world_size=WORLD)
    assert sorted(os.listdir(path)) == [".dl-restored-subset", ".metadata", "__0_0.distcp", "__2_0.distcp",
                                        "__3_0.distcp"]
    got = {n: (Path(path) / n).read_bytes() for n in ("__2_0.distcp", "__3_0.distcp")}
    assert got == saved, "its own verified shard kept, the altered one fetched again"
    # Without its own copy the same pull fails: the shard deleted from S3 really was taken from here.
    assert store.pull(str(tmp_path / "elsewhere"), 5, ranks=range(2, 4), world_size=WORLD) is None


def test_a_manifest_whose_reads_name_a_missing_file_is_not_a_checkpoint(store, tmp_path):
    cp = _push(store, tmp_path / "n0", 5, "g1-00000001", 0) or _push(store, tmp_path / "n1", 5, "g1-00000001", 1)
    bad = json.loads(json.dumps(cp.manifest))
    bad["shards"]["reads"]["1"].append("__9_0.distcp")
    store.client.put_object(Bucket=store.bucket, Key="jobs/test/step-000000000005/MANIFEST.json",
                            Body=json.dumps(bad).encode())
    assert store.latest() is None


def test_each_agent_sends_its_node_part_and_the_last_one_commits(store, imds, tmp_path, monkeypatch):
    agents = {}
    for node in (0, 1):
        monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / f"run{node}"))
        node_save(tmp_path / f"ck{node}", 5, "g3-00000003", node)
        agents[node] = NodeAgent(store, str(tmp_path / f"ck{node}"), imds=Imds(imds.endpoint), log=lambda m: None)
    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "run1"))
    assert agents[1].upload_once() == 5
    assert parts_sent() == {"5": "g3-00000003"} and pushed_step() is None, "its part is sent; the step is not complete"
    assert agents[1].upload_once() is None, "a part is sent once"
    monkeypatch.setenv("DL_RUN_DIR", str(tmp_path / "run0"))
    assert agents[0].upload_once() == 5
    assert pushed_step() == 5 and store.has_step(5)


KILLED_SAVE = """
import sys, time, torch
from torch.distributed.checkpoint import FileSystemWriter
from constructs_lib.runtime import Checkpointer
real = FileSystemWriter.finish
def slow_finish(self, *a, **kw):  # every shard is written; the metadata would come next
    print("shards written", flush=True)
    time.sleep(60)
    return real(self, *a, **kw)
FileSystemWriter.finish = slow_finish
ck = Checkpointer(sys.argv[1])
ck.save_sharded(3, {"w": torch.arange(1 << 20, dtype=torch.float32)}, asynchronous=True)
print("training goes on", flush=True)
ck.wait()
"""


def test_a_kill_during_an_async_save_leaves_no_step_that_restore_takes(tmp_path):
    pytest.importorskip("torch")
    ck = tmp_path / "ck"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(ck)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        assert sorted(lines) == ["shards written", "training goes on"], lines
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert not list(ck.glob("step-*")) and shards.stale_tmp(str(ck))
    assert Checkpointer(str(ck)).resume_path is None
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE.replace("FileSystemWriter.finish = slow_finish", ""),
                           str(ck)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Checkpointer(str(ck)).resume_path == str(ck / "step-000000000003")


def test_one_node_part_cannot_be_pushed_as_a_whole_step(store, tmp_path):
    from constructs_lib.runtime.errors import RuntimeUserError

    path = node_save(tmp_path, 5, "g1-00000001", 0)
    with pytest.raises(RuntimeUserError, match="one node's part of a sharded save"):
        store.push(str(path), 5)
    assert not store.has_step(5)


def _agent(store, root: Path, imds) -> NodeAgent:
    return NodeAgent(store, str(root), imds=Imds(imds.endpoint), log=lambda m: None)


def test_a_step_saved_again_after_a_restore_is_sent_again(store, imds, tmp_path):
    # This node sent its part of step 5; another node died mid-upload, so step 5 never completed
    # and the cluster went back. Step 5, saved again under a new attempt, must be sent again.
    node_save(tmp_path / "ck", 5, "g1-00000001", 1)
    agent = _agent(store, tmp_path / "ck", imds)
    assert agent.upload_once() == 5 and not store.has_step(5)
    restore(store, str(tmp_path / "ck"), None, log=lambda m: None)  # the cluster starts from scratch
    node_save(tmp_path / "ck", 5, "g2-00000002", 1)
    assert agent.upload_once() == 5, "a new attempt of a step this node sent before"
    assert parts_sent()["5"] == "g2-00000002"
    assert _push(store, tmp_path / "n0", 5, "g2-00000002", 0) is not None, "node 0's part completes it"


def test_a_node_sends_first_the_step_another_node_has_begun(store, imds, tmp_path):
    # Uploads lag behind saves: node 1 has steps 5 and 7 waiting; node 0 is sending 5. Taking 7,
    # node 1 would leave 5 without its part, and node 0 might take 9 next: no step ever complete.
    node_save(tmp_path / "ck1", 5, "g1-00000005", 1)
    node_save(tmp_path / "ck1", 7, "g1-00000007", 1)
    path = node_save(tmp_path / "ck0", 5, "g1-00000005", 0)
    sharded_store.push_part(store, str(path), 5, shards.node_part(str(path)))
    agent = _agent(store, tmp_path / "ck1", imds)
    assert agent.upload_once() == 5 and store.has_step(5)
    assert agent.upload_once() == 7, "then its newest"


def test_a_commit_that_s3_refuses_is_tried_again_without_sending_the_part_again(bucket, imds, tmp_path, monkeypatch):
    from constructs_lib.runtime.store import CheckpointStore

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own retries would wait out the throttling
    store = CheckpointStore(bucket, "jobs/test", concurrency=4)
    path = node_save(tmp_path / "n0", 5, "g1-00000001", 0)
    sharded_store.push_part(store, str(path), 5, shards.node_part(str(path)))
    node_save(tmp_path / "ck1", 5, "g1-00000001", 1)
    throttle = {"on": True}
    puts = []

    def hook(request, **kw):
        if request.method == "PUT":
            puts.append(request.url)
        if throttle["on"] and request.method == "GET" and "list-type=2" in request.url:
            return s3_error(request, 503, "SlowDown")
        return None
    store.client.meta.events.register_first("before-send.s3.*", hook)
    agent = _agent(store, tmp_path / "ck1", imds)
    agent.upload_once()
    assert not store.has_step(5) and agent.committing, "the commit failed: it is still to do"
    sent = len(puts)
    throttle["on"] = False
    agent._commits = {k: 0.0 for k in agent._commits}  # its backoff has passed
    assert agent.upload_once() is None and store.has_step(5) and not agent.committing
    assert len(puts) == sent + 1, "only the manifest went up: the part was not sent again"


def test_the_next_plan_completes_a_step_whose_last_node_died_before_writing_the_manifest(store, tmp_path):
    for node in (0, 1):
        path = node_save(tmp_path / f"n{node}", 5, "g1-00000001", node)
        sharded_store.push_part(store, str(path), 5, shards.node_part(str(path)))  # and died: no commit
    assert store.latest() is None
    cp = sharded_store.newest_complete(store)
    assert cp is not None and cp.step == 5 and store.latest().step == 5


def test_parts_that_disagree_on_who_they_are_make_no_step():
    f = {"size": 1, "sha256": "a", "checksum_type": "FULL_OBJECT", "part_size": 1}
    meta = {**f, "path": ".metadata"}
    base = {"step": 1, "attempt": "g1-00000001", "world_size": 2}
    p0 = {**base, "node_rank": 0, "_key_node": 0, "reads": {"0": [".metadata"]}, "expect": [".metadata"],
          "files": [meta]}
    p1 = {**base, "node_rank": 1, "_key_node": 1, "reads": {"1": [".metadata"]}, "files": []}
    assert sharded_store.merge([p0, p1], 1, "g1-00000001") is not None
    assert sharded_store.merge([p0, {**p1, "_key_node": 2}], 1, "g1-00000001") is None, "a part under another's name"
    assert sharded_store.merge([p0, {**p1, "reads": {"0": [".metadata"], "1": []}}], 1, "g1-00000001") is None, \
        "rank 0 claimed by two nodes"


def test_a_restored_share_of_a_sharded_step_is_never_pushed_as_a_whole_step(store, tmp_path):
    from constructs_lib.runtime.errors import RuntimeUserError

    _push(store, tmp_path / "n0", 5, "g1-00000001", 0)
    _push(store, tmp_path / "n1", 5, "g1-00000001", 1)
    _s, path = store.pull(str(tmp_path / "r"), 5, ranks=range(2, 4), world_size=WORLD)
    with pytest.raises(RuntimeUserError, match="one node's part of a sharded save"):
        store.push(path, 5)
    assert store.latest().manifest.get("shards"), "the sharded manifest is still the step's"


TORCH_211 = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.checkpoint import state_dict_saver
from constructs_lib.runtime import Checkpointer
real = state_dict_saver.save
def save(*a, **kw):  # what torch 2.11 returns (seen on an H200): metadata without its storage map
    md = real(*a, **kw)
    md.storage_data = None
    return md
state_dict_saver.save = save
dist.init_process_group("gloo")
r = dist.get_rank()
ck = Checkpointer(sys.argv[1])
# f"w{r}": a rank's own state (as a shard is); "shared": the same on every rank (saved once, by rank 0)
ck.save_sharded(1, {f"w{r}": torch.full((4,), float(r)), "shared": torch.ones(2)})
ck.save_sharded(2, {f"w{r}": torch.full((4,), float(r)), "shared": torch.ones(2)}, asynchronous=True)
ck.wait()
dist.destroy_process_group()
"""


def test_ranks_get_their_read_sets_when_dcp_returns_no_storage_map(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "save.py"
    script.write_text(TORCH_211)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", str(script), str(tmp_path / "ck")],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    for step in (1, 2):
        part = shards.node_part(str(tmp_path / "ck" / f"step-{step:012d}"))
        assert part["reads"] == {"0": [".metadata", "__0_0.distcp"], "1": [".metadata", "__0_0.distcp", "__1_0.distcp"]}
        assert part["expect"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
