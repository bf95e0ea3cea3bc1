"""The multi-node drill with -c restart=in-process (ranks.py, inprocess.py): 2 nodes x 2 ranks, the
rank-0 node SIGKILLed mid-training. The survivor's ranks keep their processes (the same process
ids train the next generation, now as ranks 0-1), at most the step in flight is lost, the job
finishes, and the final model equals an uninterrupted torchrun run.

The job is the FSDP2 one with the memory tier every step: the survivor must shard its model for
its new rank (torch's sharding memo: inprocess.forget_meshes) and resume from the step the tier
kept. The DDP job through run_generations is the same supervisor path; its rank's side (keep,
park, the next generation in the same process) is tests/runtime/test_inprocess.py's, and its
kept step's promotion the torchrun drill's (test_drill.py): a drill of its own re-proved those
and cost the suite's time (bench/goodput.py --inprocess measures it)."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.drill import PROJECT, Drill, generations, reference_run

pytestmark = pytest.mark.drill

STEPS, EVERY = 60, 10
SCRIPT, ARGS = "fsdp_train.py", "--width 64 --memory"


def test_survivors_keep_their_processes_across_a_hard_kill(tmp_path, moto_process):
    root = tmp_path / "run"
    root.mkdir()
    command = (f"python {SCRIPT} --steps {STEPS} --every {EVERY} --sleep 0.1 {ARGS} "
               f"--events {root / 'events.jsonl'} --final {root / 'final.pt'}")
    d = Drill(root, moto_process, steps=STEPS, every=EVERY, job_command=command, context={"restart": "in-process"})
    try:
        a = d.add_node("127.0.0.10")
        d.wait("the first node to join", lambda: "joined generation 1" in a.log_text())
        b = d.add_node("127.0.0.9")
        d.wait("generation 1 training past step 15", lambda: d.running("1", 15), timeout=180)
        assert d.node_with_rank0("1") is a
        a.kill()
        d.add_node("127.0.0.5")
        d.wait("a second generation training", lambda: (d.current_gen() or "1") != "1"
               and d.running(d.current_gen(), 0), timeout=180)
        g2 = d.current_gen()
        d.wait("the job to finish on every node", d.finished, timeout=180)
    finally:
        d.stop()
    events = d.read_events()
    gens = generations(events)
    assert sorted(gens) == ["1", g2], sorted(gens)

    def pids(g: str, node) -> set[int]:
        return {e["pid"] for e in events if e["event"] == "start" and e["gen"] == g and e["node"] == node.id}
    assert len(pids("1", b)) == 2 and pids(g2, b) == pids("1", b), "the survivor's ranks kept their processes"
    assert "assigned to the parked ranks" in b.log_text() and "starting the ranks cold" not in b.log_text()
    start = min(gens[g2]["starts"].values())
    assert set(gens[g2]["starts"].values()) == {start}, gens[g2]["starts"]
    assert max(d.steps_seen("1")) + 1 - start <= 1, "at most the step in flight is done again"
    assert set(gens["1"]["steps"]) | set(gens[g2]["steps"]) == set(range(STEPS))
    assert all(n.units["dl-job.service"].exits == [0] for n in d.live()), d.dump()

    assert "kept in memory" in b.log_text(), "the step came from the memory tier: " + b.log_text()[-3000:]
    ref = reference_run(tmp_path / "ref", steps=STEPS, every=EVERY, rebuild_at=[], world=4,
                        script=PROJECT / SCRIPT, args=ARGS.split())
    got, want = torch.load(d.final), torch.load(ref)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs from the uninterrupted run"
