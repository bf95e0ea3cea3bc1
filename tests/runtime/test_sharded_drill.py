"""The sharded drill: an FSDP2 job (fully_shard, gloo on CPU) under real torchrun on two nodes x two
processes, every rank writing its shard with torch.distributed.checkpoint, asynchronously, and
keeping every step in memory and on its buddy node (save_to_memory), through the project's own
node bundle against moto_server. A node is killed in the middle of an async save (the step comes
back from its buddy's copy: at most one step lost), another gets a termination notice (none
lost), then both nodes die at once (the newest step in S3), and the job must end with exactly
the parameters of an uninterrupted run.
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
ARGS = "--width 256 --memory"


def _manifest(d: Drill, step: int) -> dict:
    key = f"{d.prefix}/step-{step:012d}/MANIFEST.json"
    return json.loads(d.s3.get_object(Bucket=d.bucket, Key=key)["Body"].read())


def _steps_by_rank(d: Drill, g: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in d.read_events():
        if e["event"] == "step" and e["gen"] == g:
            out.setdefault(e["rank"], []).append(e["step"])
    return out


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
        done = min(max(steps) for steps in _steps_by_rank(d, "1").values())
        assert resumed is not None and done - resumed <= 1, f"every rank completed {done}; resumed from {resumed}"
        attempt = _manifest(d, resumed)["shards"]["attempt"]
        assert int(attempt.split("-")[1], 16) >= 2**31 and resumed > resumable, \
            f"step {resumed} came from the memory snapshots (attempt {attempt}), not the periodic saves"
        facts["lost at the kill"] = done - resumed
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

        # 4. Both buddies die at once: no memory copy survives, the job goes on from S3's newest step.
        start3 = min(generations(d.read_events())[g3]["starts"].values())
        d.wait("progress", lambda: d.running(g3, start3 + 4))
        for node in d.live():
            node.kill()
        newest = d.newest_in_s3()  # the nodes are gone: nothing reaches S3 any more
        d.add_node("127.0.0.24")
        d.add_node("127.0.0.25")
        g4 = _wait_new_generation(d, g3)
        assert d.plan(g4)["resume_step"] == newest, "S3's newest, nothing else"

        d.wait("the job to finish on every node", d.finished, timeout=150)
    finally:
        d.stop()
    gens = _check_every_generation(d, STEPS)
    assert len(gens) == 4, sorted(gens)
    ref = reference_run(tmp_path / "ref", steps=STEPS, every=EVERY, rebuild_at=[], world=4,
                        script=PROJECT / SCRIPT, args=ARGS.split())
    got, want = torch.load(d.final), torch.load(ref)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs from the uninterrupted run"
    _check_units(d)
