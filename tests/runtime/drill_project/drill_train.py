"""A tiny DDP job for the multi-node drill, written the way docs/data-and-checkpoints.md tells users to write one.

Deterministic: the data of (step, rank) depends on nothing else, so a run interrupted any number
of times must end with exactly the parameters of a run that never was, provided DDP is rebuilt
at the same steps in both (its first iteration after construction reduces gradients in a
different bucket order, which is not bitwise equal). `--rebuild-at` makes the reference run
rebuild model, optimizer and DDP from a saved state at those steps, exactly as a resume does.

Every rank appends one JSON line per event to --events: start, step, save, stop, end.
"""
import argparse
import gc
import io
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from constructs_lib.runtime import Checkpointer

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--every", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--events", required=True)
p.add_argument("--final", required=True)
p.add_argument("--pad-mb", type=int, default=0, help="extra bytes per checkpoint, so uploads take a while")
p.add_argument("--rebuild-at", default="", help="reference run: rebuild DDP at these steps")
p.add_argument("--no-keep", action="store_true", help="no keep_on_failure: a kill costs the steps since the last save")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
node = os.environ.get("DL_DRILL_NODE", "reference")


def event(kind: str, **kw) -> None:
    line = json.dumps({"event": kind, "rank": rank, "node": node, "gen": os.environ.get("DL_GENERATION"),
                       "t": time.time(), **kw})
    with open(a.events, "a") as f:
        f.write(line + "\n")


def build(state):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    if state:
        model.load_state_dict(state["model"])
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    if state:
        opt.load_state_dict(state["opt"])
    return model, ddp, opt


def snapshot(model, opt) -> dict:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf)


ckpt = Checkpointer()
start, state = 0, None
if ckpt.resume_path:
    state = torch.load(os.path.join(ckpt.resume_path, "model.pt"))
    start = ckpt.resume_step + 1
model, ddp, opt = build(state)
rebuild_at = {int(s) for s in a.rebuild_at.split(",") if s}


def write_state(d: str) -> None:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(d, "model.pt"))


# A peer's death mid-step costs at most that step: the survivors write the last one they completed.
if not a.no_keep:
    ckpt.keep_on_failure(write_state)
event("start", step=start, resume_from=ckpt.resume_step)

for step in range(start, a.steps):
    if step in rebuild_at and step != start:
        model, ddp, opt = build(snapshot(model, opt))
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    loss = ((ddp(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    event("step", step=step)
    time.sleep(a.sleep)
    if ckpt.should_checkpoint(step, every=a.every) or step == a.steps - 1:
        reason = ckpt.reason or "last step"
        with ckpt.save(step) as d:
            if d:
                write_state(d)
                if a.pad_mb:
                    with open(os.path.join(d, "pad.bin"), "wb") as f:
                        f.write(bytes(a.pad_mb * 1024 * 1024))
                event("save", step=step, reason=reason)
    if ckpt.interrupted:
        event("stop", step=step)
        break
else:
    if rank == 0:
        torch.save(model.state_dict(), a.final)
    event("end", step=a.steps - 1)
# DDP holds the process group: a group still referenced after destroy_process_group aborts the
# interpreter at exit now and then ("terminate called without an active exception"), which
# the supervisor would count as a failed run. Let go of it first.
model = ddp = opt = None
gc.collect()
dist.destroy_process_group()
