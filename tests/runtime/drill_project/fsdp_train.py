"""A tiny FSDP2 job for the sharded drill, written the way docs/data-and-checkpoints.md tells users
to write one: every rank holds a shard of the model and optimizer (fully_shard), and every rank
writes its shard with torch.distributed.checkpoint, asynchronously.

Deterministic: the data of (step, rank) depends on nothing else, so a run interrupted any number
of times must end with exactly the parameters of a run that never was.

Every rank appends one JSON line per event to --events: start, step, save, stop, end.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import fully_shard

from constructs_lib.runtime import Checkpointer

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--every", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--events", required=True)
p.add_argument("--final", required=True)
p.add_argument("--width", type=int, default=64, help="hidden width: a wider model makes each save take longer")
p.add_argument("--sync", action="store_true", help="save synchronously")
p.add_argument("--memory", action="store_true", help="keep every step in memory and on a buddy node (save_to_memory)")
p.add_argument("--slow-save-flag", default="",
               help="drill: while this file ({node}: this node's id) exists, this node's writes wait 2 s first")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
node = os.environ.get("DL_DRILL_NODE", "reference")


def event(kind: str, **kw) -> None:
    line = json.dumps({"event": kind, "rank": rank, "node": node, "gen": os.environ.get("DL_GENERATION"),
                       "t": time.time(), **kw})
    with open(a.events, "a") as f:
        f.write(line + "\n")


if a.slow_save_flag:  # the drill's window to kill a node in the middle of an async save
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    real_write = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        memory = os.environ.get("DL_MEMORY_DIR") and str(self.path).startswith(os.environ["DL_MEMORY_DIR"])
        if os.path.exists(a.slow_save_flag.replace("{node}", node)) and not memory:
            time.sleep(2)
        return real_write(self, plan, planner)
    FileSystemWriter.write_data = write_data

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, a.width), nn.Tanh(), nn.Linear(a.width, a.width), nn.Tanh(), nn.Linear(a.width, 1))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

ckpt = Checkpointer()
start = 0
if ckpt.resume_path:
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt.resume_path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    start = ckpt.resume_step + 1
event("start", step=start, resume_from=ckpt.resume_step)

for step in range(start, a.steps):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    event("step", step=step)
    time.sleep(a.sleep)
    if ckpt.should_checkpoint(step, every=a.every) or step == a.steps - 1:
        reason = ckpt.reason or "last step"
        ckpt.save_sharded(step, ckpt.state_of(model, opt), asynchronous=not a.sync)
        event("save", step=step, reason=reason)
    if a.memory and not ckpt.interrupted:
        ckpt.save_to_memory(step, model=model, optimizer=opt)
    if ckpt.interrupted:
        event("stop", step=step)
        break
else:
    ckpt.wait()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, a.final)
    event("end", step=a.steps - 1)
ckpt.wait()  # the last save is written before the process group goes
dist.destroy_process_group()
