"""One process of tests/runtime/test_memory_tier.py's in-process restart: 2 nodes x 1 rank, a
generation's world on its own port. "survivor" is rank 1 of generation 1 and, in the same process
(as Checkpointer.run_generations keeps it), rank 1 of generation 2; "gone" is rank 0 of generation
1 only; "new" is the replacement, rank 0 of generation 2 only. Each generation takes two memory
snapshots of a small sharded state, the first a full DCP save; the survivor's DCP plan cache is
warm from generation 1 when generation 2's first one is planned by a coordinator whose is not."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from constructs_lib.runtime import Checkpointer

p = argparse.ArgumentParser()
p.add_argument("role", choices=("survivor", "gone", "new"))
p.add_argument("--ports", nargs=2, type=int, required=True)
p.add_argument("--root", required=True)
a = p.parse_args()
rank = 0 if a.role in ("gone", "new") else 1
for gen in {"survivor": (1, 2), "gone": (1,), "new": (2,)}[a.role]:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.ports[gen - 1]), DL_GENERATION=str(gen),
                      DL_MEMORY_DIR=f"{a.root}/node-{rank}-{a.role}/mem", DL_CHECKPOINT_DIR=f"{a.root}/node-{rank}-{a.role}/ckpt",
                      DL_RUN_DIR=f"{a.root}/node-{rank}-{a.role}/run")
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    w = distribute_tensor(torch.arange(64, dtype=torch.float32).reshape(8, 8) * gen, mesh, [Shard(0)])
    ckpt = Checkpointer()
    for step in (10 * gen, 10 * gen + 1):
        ckpt.save_to_memory(step, {"w": w, "meta": {"gen": gen}})
    ckpt.wait()
    ckpt._release_memory()
    dist.destroy_process_group()
