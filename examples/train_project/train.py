"""A small, real training job for dl-launcher: fits y = 3x + 1 with a two-layer network, under
`dl-torchrun` on one or many nodes (DDP over gloo on CPU, NCCL on GPUs) or as plain `python`.

It resumes where the cluster agreed (dl-launcher's Checkpointer), saves every SAVE_EVERY steps,
stops with the others on a spot notice, and reads its settings from the environment the way a
deployment passes them: STEPS, LR (`-c env=`), WANDB_API_KEY or HF_TOKEN (`-c secrets=`).
"""
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # on a dl-launcher node the runtime is on PYTHONPATH; elsewhere the job runs without it
    from constructs_lib.runtime import Checkpointer
except ImportError:
    Checkpointer = None

STEPS = int(os.environ.get("STEPS", "200"))
LR = float(os.environ.get("LR", "0.05"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "50"))

distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank = dist.get_rank() if distributed else 0
device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu")

for name in ("WANDB_API_KEY", "HF_TOKEN"):
    if rank == 0 and os.environ.get(name):
        print(f"{name} is set ({len(os.environ[name])} characters)", flush=True)  # never the value

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=LR)
ckpt = Checkpointer() if Checkpointer else None
start = 0
if ckpt and ckpt.resume_path:
    state = torch.load(os.path.join(ckpt.resume_path, "model.pt"), map_location=device)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = ckpt.resume_step + 1
    print(f"resumed from step {ckpt.resume_step}", flush=True)
ddp = DDP(model) if distributed else model

g = torch.Generator().manual_seed(rank)
for step in range(start, STEPS):
    x = torch.rand(64, 1, generator=g).to(device)
    loss = nn.functional.mse_loss(ddp(x), 3 * x + 1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and (step % 20 == 0 or step == STEPS - 1):
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    if ckpt and ckpt.should_checkpoint(step, every=SAVE_EVERY):
        with ckpt.save(step) as d:
            if d:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(d, "model.pt"))
    if ckpt and ckpt.interrupted:
        print(f"stopping at step {step} for a termination notice; the cluster resumes from here", flush=True)
        break
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))

if rank == 0:
    print(f"done: w={model[0].weight.mean().item():+.3f} loss {loss.item():.4f}", flush=True)
if distributed:
    dist.destroy_process_group()
