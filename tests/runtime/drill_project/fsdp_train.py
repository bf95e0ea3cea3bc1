"""A tiny FSDP2 job for the sharded drill, written the way docs/data-and-checkpoints.md tells users
to write one: every rank holds a shard of the model and optimizer (fully_shard), and every rank
writes its shard with torch.distributed.checkpoint, asynchronously.

Deterministic: the data of (step, rank) depends on nothing else, so a run interrupted any number
of times must end with exactly the parameters of a run that never was.

Written as a train() per generation (Checkpointer.run_generations), so that the same job runs
under torchrun (one generation a process) and under -c restart=in-process (the survivors' ranks
call it again in the same process after a peer's death).

Every rank appends one JSON line per event to --events: imported (before its first generation,
rank null), start, step, save, stop, end.
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

node = os.environ.get("DL_DRILL_NODE", "reference")
ckpt = Checkpointer()  # before any process group: -c restart=in-process starts ranks before their plan


def event(kind: str, **kw) -> None:
    rank = dist.get_rank() if dist.is_initialized() else None  # None: before the first generation
    line = json.dumps({"event": kind, "rank": rank, "node": node, "pid": os.getpid(), "gen": os.environ.get("DL_GENERATION"),
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


def train() -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, a.width), nn.Tanh(), nn.Linear(a.width, a.width), nn.Tanh(), nn.Linear(a.width, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

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


event("imported")  # torch and this script are loaded: what a rank started before its plan has done by then
ckpt.run_generations(train, backend="gloo")
dist.destroy_process_group()
