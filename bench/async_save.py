"""How long a training step is blocked by a sharded checkpoint: Checkpointer.save_sharded with
asynchronous=True (dcp.async_save: copy to CPU memory, the writes go on in a thread) versus a
synchronous save of the same FSDP2 (fully_shard) model and Adam state.

One torchrun (gloo on CPU by default; --device cuda uses NCCL and GPU tensors), saves alternated
sync/async, each to a new step; between saves a few training steps run, so the async writes
overlap real work as they would in a job. Blocked time is the slowest rank's time from the call
to its return (for async, plus any wait for the previous save at the next call). Medians; the
ratio async/sync is the result (absolute seconds depend on the disk and the machine).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r'''
import os, statistics, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from constructs_lib.runtime import Checkpointer

mb, saves, device, gap = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
dist.init_process_group("nccl" if device == "cuda" else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}") if device == "cuda" else torch.device("cpu")
if device == "cuda":
    torch.cuda.set_device(dev)
# Parameters of about `mb` MiB per rank (Adam keeps two more copies): square layers of width w.
w = 1024
layers = max(1, (mb * 2**20 * world) // (4 * w * w))
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(w, w) for _ in range(layers)]).to(dev)
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)

def train(n):
    for _ in range(n):
        x = torch.randn(32, w, device=dev)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    if device == "cuda":
        torch.cuda.synchronize()

ck = Checkpointer()
train(2)
# Every rank must run the same number of steps between saves (they are collective): time three,
# take the slowest rank's, and train that many steps for `gap` seconds.
t = time.perf_counter()
train(3)
per_step = torch.tensor([(time.perf_counter() - t) / 3])
dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
between = max(1, int(gap / float(per_step)))
blocked = {"sync": [], "async": [], "wait": []}
for i in range(2 * saves + 2):
    kind = "async" if i % 2 else "sync"
    msd, osd = get_state_dict(model, opt)
    dist.barrier()
    t = time.perf_counter()
    ck.save_sharded(i, {"model": msd, "optim": osd}, asynchronous=(kind == "async"))
    took = time.perf_counter() - t
    train(between)  # training goes on as it would until the next save is due
    t = time.perf_counter()
    ck.wait()  # what the next save waits for: 0 once the writes finished during training
    if i >= 2:  # the first of each: process groups and plans are made once
        blocked[kind].append(took)
        if kind == "async":
            blocked["wait"].append(time.perf_counter() - t)
slowest = [None] * world
dist.all_gather_object(slowest, blocked)
if rank == 0:
    worst = {k: [max(r[k][j] for r in slowest) for j in range(len(blocked[k]))] for k in blocked}
    s, a = statistics.median(worst["sync"]), statistics.median(worst["async"])
    state_mb = sum(p.numel() for p in model.parameters()) * 4 * 3 / 2**20
    print(f"world {world} ({device}), {state_mb:.0f} MiB of model+Adam state in all, {saves} saves of each kind")
    wt = statistics.median(worst["wait"])
    print(f"training blocked per save, slowest rank, median: sync {s:.3f} s, async {a:.3f} s: async/sync {a / s:.3f}; "
          f"async writes still running {between} steps ({gap:.0f} s) later (the next save waits): {wt:.3f} s")
    for k in ("sync", "async", "wait"):
        print(f"  {k}: " + ", ".join(f"{x:.3f}" for x in worst[k]))
ck.wait()
dist.destroy_process_group()
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc-per-node) [2]")
    p.add_argument("--mb", type=int, default=64, help="MiB of parameters per rank (Adam state adds twice that) [64]")
    p.add_argument("--saves", type=int, default=5, help="saves of each kind, after one warm-up each [5]")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--gap", type=float, default=5.0, help="seconds of training between saves [5]")
    p.add_argument("--dir", help="checkpoint directory [a temporary one]")
    a = p.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="dl-async-save-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DL_CHECKPOINT_DIR": str(work / "ck"),
           "DL_RUN_DIR": str(work / "run"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun) if torchrun.exists() else "torchrun", "--standalone", f"--nproc-per-node={a.nproc}",
           "-m", "dl_async_save_worker"]
    (work / "dl_async_save_worker.py").write_text(WORKER)
    env["PYTHONPATH"] += os.pathsep + str(work)
    r = subprocess.run(cmd + [str(a.mb), str(a.saves), a.device, str(a.gap)], env=env, cwd=work, text=True, capture_output=True)
    print(r.stdout, end="")
    if r.returncode:
        sys.exit(r.stderr[-3000:])


if __name__ == "__main__":
    main()
