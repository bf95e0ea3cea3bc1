"""The sharded drill: an FSDP2 job (fully_shard, gloo on CPU) under real torchrun on two nodes x two
processes, every rank writing its shard with torch.distributed.checkpoint, asynchronously, through
the project's own node bundle against moto_server. A node is killed in the middle of an async
save, another gets a termination notice, and the job must end with exactly the parameters of an
uninterrupted run.
"""
from __future__ import annotations

import json
import time

import pytest
import torch

from tests.runtime.drill import PROJECT, Drill, generations, reference_run
from tests.runtime.test_drill import _check_every_generation, _check_units, _wait_new_generation

pytestmark = pytest.mark.drill

STEPS, EVERY = 90, 10
SCRIPT = "fsdp_train.py"
ARGS = "--width 256"


def _manifest(d: Drill, step: int) -> dict:
    key = f"{d.prefix}/step-{step:012d}/MANIFEST.json"
    return json.loads(d.s3.get_object(Bucket=d.bucket, Key=key)["Body"].read())


def test_fsdp2_job_with_async_sharded_saves_through_a_kill_mid_save_and_a_notice(tmp_path, moto_process):
    (tmp_path / "run").mkdir()
    run = tmp_path / "run"
    # The job file, not a deployed job definition (the DDP drills cover that path): no CDK synth.
    command = (f"dl-torchrun {PROJECT / SCRIPT} --steps {STEPS} --every {EVERY} --sleep 0.04 {ARGS} "
               f"--slow-save-flag {run}/slow-save-{{node}} --events {run / 'events.jsonl'} --final {run / 'final.pt'}")
    d = Drill(run, moto_process, steps=STEPS, every=EVERY, command=command, job="sharded")
    facts: dict = {}
    try:
        d.add_node("127.0.0.20")
        d.add_node("127.0.0.21")
        d.wait("generation 1 training, step 19 complete in S3", lambda: d.running("1", 22) and d.newest_in_s3() >= 19)

        # 1. A sharded step in S3 is every rank's shard, the metadata, and what each rank reads back.
        m = _manifest(d, d.newest_in_s3())
        paths = {f["path"] for f in m["files"]}
        assert paths == {".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}, paths
        assert m["shards"]["world_size"] == 4
        for r in range(4):
            assert {".metadata", f"__{r}_0.distcp"} <= set(m["shards"]["reads"][str(r)])

        # 2. The node without rank 0 dies while its ranks' async save is being written (its writes
        # now wait 2 s first: a window to kill it in, however loaded the machine).
        victim = next(n for n in d.live() if n is not d.node_with_rank0("1"))
        (tmp_path / "run" / f"slow-save-{victim.id}").touch()
        resumable = d.newest_in_s3()
        inflight: dict = {}

        def saving() -> bool:
            tmp = [p.name for p in victim.checkpoints.glob(".tmp-step-*") if int(p.name[10:22]) > resumable]
            if tmp:
                inflight["step"] = int(tmp[0][10:22])
            return bool(tmp)
        d.wait("an async save in flight on the node without rank 0", saving, timeout=60, poll=0.01)
        time.sleep(0.5)  # inside the 2 s the writes wait
        victim.kill()
        assert not (victim.checkpoints / f"step-{inflight['step']:012d}").exists(), "the killed save never completed"
        replacement = d.add_node("127.0.0.22")
        g2 = _wait_new_generation(d, "1")
        resumed = d.plan(g2)["resume_step"]
        assert resumed is not None and resumed < inflight["step"], "a step cut short on one node is never resumed"
        # The replacement restored only what its ranks read back: the metadata, its ranks' shards
        # and rank 0's (which holds the replicated optimizer state).
        rank = d.plan(g2)["members"].index(next(mb for mb in d.plan(g2)["members"] if mb["node"] == replacement.id))
        restored = {p.name for p in (replacement.checkpoints / f"step-{resumed:012d}").iterdir()} - {".dl-restored-subset"}
        want = {".metadata", "__0_0.distcp", f"__{2 * rank}_0.distcp", f"__{2 * rank + 1}_0.distcp"}
        assert restored == want, f"node rank {rank} restored {sorted(restored)}"
        facts["restored"] = sorted(restored)

        # 3. A termination notice: every rank saves the same step, synchronously, and no step is lost.
        start2 = min(generations(d.read_events())[g2]["starts"].values())
        d.wait("progress", lambda: d.running(g2, start2 + 5))
        warned = d.node_with_rank0(g2)
        warned.imds.interrupt(seconds=20)
        d.wait(f"{warned.addr} to leave the cluster", lambda: "left the cluster" in warned.log_text(), timeout=30)
        info = generations(d.read_events())[g2]
        stops = {step for _rank, step in info["stops"]}
        assert len(info["stops"]) == 4 and len(stops) == 1, f"every rank stops at one step: {info['stops']}"
        (stop,) = stops
        assert _manifest(d, stop)["shards"]["world_size"] == 4, "the stop step is complete in S3"
        warned.kill()
        d.add_node("127.0.0.23")
        g3 = _wait_new_generation(d, g2)
        assert d.plan(g3)["resume_step"] == stop, "no step lost after the notice"

        d.wait("the job to finish on every node", d.finished, timeout=150)
    finally:
        d.stop()
    gens = _check_every_generation(d, STEPS)
    assert len(gens) == 3, sorted(gens)
    ref = reference_run(tmp_path / "ref", steps=STEPS, every=EVERY, rebuild_at=[], world=4,
                        script=PROJECT / SCRIPT, args=ARGS.split())
    got, want = torch.load(d.final), torch.load(ref)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs from the uninterrupted run"
    _check_units(d)
