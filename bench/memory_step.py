"""One rank of the step-time harness of `bench/goodput.py --overhead`: the sharded drill's FSDP2
model (gloo on CPU), 4 ranks standing for 2 nodes x 2 (run by torchrun --nproc-per-node 4; with
--per-node 1, 2 ranks for 2 x 1), an async sharded save every --every steps (the S3-only
baseline: the node agent's upload is not part of a step), and with --memory the memory tier
every step. Each step is --sleep seconds of idle CPU (the accelerator's work) after its CPU work,
then the saves. Rank 0 prints one JSON line: the median step time, the process's CPU per step
(every thread) and, with --memory, the tier thread's median CPU and wall time per snapshot. With
--alternate, also each block kind's median time in the step's parts: "compute" (forward, backward,
the optimizer), "sleep", "saves" (the state dict and both saves): the tier's thread runs while the
next step computes, so its cost shows there; and the training thread's time in "compute" on a
core, waiting for a core ("core_wait"), and blocked.

--alternate B (with --memory): the tier is on in every other block of B steps, off in the rest,
in the same processes; "step" is then the off blocks' median and "step_on" the on blocks'. Two
separate runs differ by up to 10-20% on a shared 2-core machine (where the 4 ranks land), which
hides a few percent; one run's blocks share their placement. The first two steps of each block
(the last snapshot of an on block settling in the next one) and the first two blocks (the tier's
first, full save) are not counted."""
import argparse
import json
import os
import statistics
import time

rank = int(os.environ["RANK"])
p = argparse.ArgumentParser()
p.add_argument("--per-node", type=int, default=2, help="ranks per node (the job's world is 2 nodes of these)")
p.add_argument("--memory", action="store_true")
p.add_argument("--sleep", type=float, default=0.04)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--every", type=int, default=10)
p.add_argument("--width", type=int, default=256)
p.add_argument("--alternate", type=int, default=0, metavar="B")
p.add_argument("--memory-every", type=int, default=1, metavar="K", help="save_to_memory(..., every=K)")
p.add_argument("--stub", choices=("exchange", "thread", "snapshot", "vote"),
               help="where the cost goes (measurement only: the tier then keeps nothing whole): exchange = no "
                    "buddy exchange; thread = the tier's thread does nothing; snapshot = save_to_memory does "
                    "nothing (the state dict alone); vote = a raw snapshot takes no collective (each rank's own yes)")
p.add_argument("--torch-state", action="store_true",
               help="the state from torch's get_state_dict, passed to save_to_memory (the default: "
                    "save_to_memory(step, model=, optimizer=), where the code has state_of)")
p.add_argument("--root", required=True)
a = p.parse_args()
node = rank // a.per_node
os.environ.update(DL_GENERATION="1", LOCAL_WORLD_SIZE=str(a.per_node), GROUP_RANK=str(node), DL_RUN_DIR=f"{a.root}/run-{node}",
                  DL_CHECKPOINT_DIR=f"{a.root}/ckpt-{node}", DL_MEMORY_DIR=f"/dev/shm/{os.path.basename(a.root)}-{node}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from constructs_lib.runtime import Checkpointer  # noqa: E402
from constructs_lib.runtime import memory_tier  # noqa: E402

snapshots: list[tuple[float, float]] = []
_inner = memory_tier.MemoryTier._write_send_settle


def _timed(self, *args):
    t, c = time.perf_counter(), time.thread_time()
    _inner(self, *args)
    snapshots.append((time.thread_time() - c, time.perf_counter() - t))


memory_tier.MemoryTier._write_send_settle = _timed
if a.stub == "exchange":  # the link is made (a collective) and then left unused: no frame is sent
    _init = memory_tier.MemoryTier.__init__

    def _unlinked(self, **kw):
        _init(self, **kw)
        self.link = None

    memory_tier.MemoryTier.__init__ = _unlinked
elif a.stub == "thread":
    memory_tier.MemoryTier._write_send_settle = lambda self, *args: snapshots.append((0.0, 0.0))
elif a.stub == "vote":  # the first full save fixes the layout; after it, no all-reduce a snapshot
    _everyone = memory_tier.MemoryTier._everyone
    memory_tier.MemoryTier._everyone = lambda self, mine: mine if self.fast is not None else _everyone(self, mine)
elif a.stub == "snapshot":
    def _state_alone(self, step, state_dict=None, live=None):
        if live is not None:
            live[2](live[0], live[1])
        snapshots.append((0.0, 0.0))
        return True

    memory_tier.MemoryTier.snapshot = _state_alone
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, a.width), nn.Tanh(), nn.Linear(a.width, a.width), nn.Tanh(), nn.Linear(a.width, 1))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
ckpt = Checkpointer()
times = []
phases = []
cpu = []  # the process's CPU per step, every thread (gloo's own included)
kinds = []  # whether the tier was on in each step
calls: list[tuple[float, float]] = []  # on the training thread: the state dict (0 where the tier makes it), save_to_memory


live = hasattr(ckpt, "state_of") and not a.torch_state  # save_to_memory(step, model=, optimizer=)


def state() -> dict:
    if hasattr(ckpt, "state_of") and not a.torch_state:
        return ckpt.state_of(model, opt)
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _sched() -> tuple[float, float]:
    """This thread's seconds on a core and waiting for one, so far (Linux's schedstat)."""
    with open("/proc/thread-self/schedstat") as f:
        on_core, waiting, _ = f.read().split()
    return int(on_core) / 1e9, int(waiting) / 1e9


sched = []  # the compute part's seconds on a core, waiting for a core, and neither (blocked: collectives, the GIL)
for step in range(a.steps):
    r0, w0 = _sched()
    t0, c0 = time.perf_counter(), time.process_time()
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 1000 + rank))
    loss = ((model(x) - torch.sin(x.sum(dim=1, keepdim=True))) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    tc = time.perf_counter()
    r1, w1 = _sched()
    sched.append((r1 - r0, w1 - w0, tc - t0 - (r1 - r0) - (w1 - w0)))
    time.sleep(a.sleep)
    ts = time.perf_counter()
    if ckpt.should_checkpoint(step, every=a.every):
        ckpt.save_sharded(step, state(), asynchronous=True)
    on = a.memory and (not a.alternate or (step // a.alternate) % 2 == 1)
    if on and (step + 1) % a.memory_every == 0:  # the state dict only when save_to_memory takes it
        t1 = time.perf_counter()
        if live:  # as the docs' job does: the tier makes the state, or refills its copy without it
            t2 = t1
            ckpt.save_to_memory(step, model=model, optimizer=opt, every=a.memory_every)
        else:
            s = state()
            t2 = time.perf_counter()
            ckpt.save_to_memory(step, s, every=a.memory_every)
        calls.append((t2 - t1, time.perf_counter() - t2))
    times.append(time.perf_counter() - t0)
    phases.append((tc - t0, ts - tc, time.perf_counter() - ts))  # compute, sleep, saves
    cpu.append(time.process_time() - c0)
    kinds.append(on)
ckpt.wait()
if rank == 0:
    if a.alternate:
        counted = [i for i in range(2 * a.alternate, a.steps) if i % a.alternate >= 2]
        off = [i for i in counted if not kinds[i]]
        on_ = [i for i in counted if kinds[i]]
        out = {"step": statistics.median(times[i] for i in off), "cpu": statistics.median(cpu[i] for i in off),
               "step_on": statistics.median(times[i] for i in on_), "cpu_on": statistics.median(cpu[i] for i in on_)}
        for j, nm in enumerate(("on_core", "core_wait", "blocked")):
            out[nm] = statistics.median(sched[i][j] for i in off)
            out[nm + "_on"] = statistics.median(sched[i][j] for i in on_)
        for j, nm in enumerate(("compute", "sleep", "saves")):
            out[nm] = statistics.median(phases[i][j] for i in off)
            out[nm + "_on"] = statistics.median(phases[i][j] for i in on_)
    else:
        out = {"step": statistics.median(times[5:]), "cpu": statistics.median(cpu[5:])}
    if snapshots:
        out["snapshot_cpu"] = statistics.median(s[0] for s in snapshots[5:])
        out["snapshot_wall"] = statistics.median(s[1] for s in snapshots[5:])
        out["state_dict"] = statistics.median(c[0] for c in calls[5:])
        out["save_call"] = statistics.median(c[1] for c in calls[5:])
        out["refill"] = getattr(getattr(ckpt._memory, "refill", None), "plan", None) is not None
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
