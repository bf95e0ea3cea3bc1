"""drill_train.py's job written for -c restart=in-process: the training is a function that the
runtime calls once per generation (Checkpointer.run_generations), in the same process when this
node survived a peer's death. The same model, data and steps as drill_train.py, so the final
model must equal an uninterrupted torchrun run of this script rebuilt at the same steps.

Every rank appends one JSON line per event to --events (with its process id): imported (before
its first generation, rank null), start, step, save, end.
"""
import argparse
import gc
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
p.add_argument("--rebuild-at", default="", help="reference run: rebuild DDP at these steps")
a = p.parse_args()
node = os.environ.get("DL_DRILL_NODE", "reference")
rebuild_at = {int(s) for s in a.rebuild_at.split(",") if s}
ckpt = Checkpointer()


def event(kind: str, **kw) -> None:
    rank = dist.get_rank() if dist.is_initialized() else None  # None: before the first generation
    line = json.dumps({"event": kind, "rank": rank, "node": node, "pid": os.getpid(),
                       "gen": os.environ.get("DL_GENERATION"), "t": time.time(), **kw})
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


def train() -> None:
    rank, start, state = dist.get_rank(), 0, None
    if ckpt.resume_path:  # a generation after a peer's death: the step kept on this node, a local read
        state = torch.load(os.path.join(ckpt.resume_path, "model.pt"))
        start = ckpt.resume_step + 1
    model, ddp, opt = build(state)

    def write_state(d: str) -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(d, "model.pt"))

    ckpt.keep_on_failure(write_state)
    event("start", step=start, resume_from=ckpt.resume_step)
    for step in range(start, a.steps):
        if step in rebuild_at and step != start:
            model, ddp, opt = build({"model": model.state_dict(), "opt": opt.state_dict()})
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
            with ckpt.save(step) as d:
                if d:
                    write_state(d)
                    event("save", step=step, reason=ckpt.reason or "last step")
    if rank == 0:
        torch.save(model.state_dict(), a.final)
    event("end", step=a.steps - 1)


event("imported")  # torch and this script are loaded: what a rank started before its plan has done by then
ckpt.run_generations(train, backend="gloo")
gc.collect()  # DDP's hold on the group goes before the group (see drill_train.py)
dist.destroy_process_group()
