"""One process of tests/runtime/test_inprocess_fsdp.py: 2 ranks of an FSDP2 job whose ranks swap
at an in-process restart, as a survivor's do when it becomes node 0 (the dead node had rank 0).
Generation 1 saves the model with torch.distributed.checkpoint; the runtime tears the group down
as run_generations does (inprocess._teardown); generation 2, in the same process with the other
rank, builds the model again and loads the save. Prints one JSON line: the new rank, its mesh
coordinate, whether its shard equals its rows of the saved weight, and whether the whole weight
gathered equals the saved one."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.fsdp import fully_shard

from constructs_lib.runtime import Checkpointer, inprocess

p = argparse.ArgumentParser()
p.add_argument("who", type=int, choices=(0, 1))
p.add_argument("--ports", nargs=2, type=int, required=True)
p.add_argument("--root", required=True)
p.add_argument("--keep-memo", action="store_true", help="leave torch's sharding memo as it is (the bug)")
a = p.parse_args()
if a.keep_memo:
    inprocess.forget_meshes = lambda: None
ckpt = Checkpointer()


def model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Linear(8, 8, bias=False)
    fully_shard(m)
    return m


saved = torch.arange(64, dtype=torch.float32).reshape(8, 8)
for gen, rank in ((1, a.who), (2, 1 - a.who)):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.ports[gen - 1]), DL_GENERATION=str(gen),
                      DL_RUN_DIR=os.path.join(a.root, f"run-{a.who}"))
    dist.init_process_group("gloo")
    m = model()
    if gen == 1:
        with torch.no_grad():
            m.weight.to_local().copy_(saved.chunk(2)[rank])
        dcp.save(m.state_dict(), checkpoint_id=os.path.join(a.root, "gen-1"))
        del m
        inprocess._teardown(ckpt, dist)
        continue
    state = m.state_dict()
    dcp.load(state, checkpoint_id=os.path.join(a.root, "gen-1"))
    m.load_state_dict(state)
    w = m.weight
    print(json.dumps({"rank": dist.get_rank(), "coordinate": list(w.device_mesh.get_coordinate()),
                      "shard_is_its_rows": bool(torch.equal(w.to_local(), saved.chunk(2)[rank])),
                      "whole_is_saved": bool(torch.equal(w.full_tensor(), saved))}), flush=True)
    dist.destroy_process_group()
