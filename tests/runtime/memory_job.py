"""One rank of a tiny FSDP2 job with the memory tier on (tests/runtime/test_memory_tier.py runs
2 nodes x 2 ranks of it). Rank 0 records the whole model after every step, as the reference a
snapshot must equal. With --die-at K, the second node's ranks wait for their snapshot of K-1 and
then kill themselves mid-step K: a node that dies without a word. With --die-in-vote K, they die
in the tier's vote of step K instead, after writing, sending and receiving it: the other node holds
K whole but never marks it settled. With --die-before-send K, they die as their snapshot of K
begins: the other node writes its own part of K, but its copy of theirs never comes. With --uneven N, rank 3 alone
finds its state changed at step N (as if its items had changed size): the other ranks have
written and finished their raw parts by then, node 0's part complete, and every rank must drop
them for a full save. With --no-listen-on R, rank R cannot open the tier's port: every rank must
turn the tier off and train on."""
import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
from torch.distributed.fsdp import fully_shard

from constructs_lib.runtime import Checkpointer

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--die-at", type=int, default=-1)
p.add_argument("--die-in-vote", type=int, default=-1)
p.add_argument("--die-before-send", type=int, default=-1)
p.add_argument("--uneven", type=int, default=-1)
p.add_argument("--no-listen-on", type=int, default=-1, help="this rank cannot open the tier's port")
p.add_argument("--reference", required=True)
a = p.parse_args()
if int(os.environ["RANK"]) == a.no_listen_on:
    from constructs_lib.runtime import memory_link

    def _refused(*args, **kw):
        raise OSError(98, "Address already in use")

    memory_link.socket.create_server = _refused
now = [0]
if max(a.die_in_vote, a.die_before_send) >= 0 and os.environ["GROUP_RANK"] == "1":
    from constructs_lib.runtime import memory_tier

    _settle = memory_tier.MemoryTier._write_send_settle

    def _dies_in_snapshot(self, step, staged, fresh):
        if step == a.die_before_send:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == a.die_in_vote:
            self._everyone = lambda mine: os.kill(os.getpid(), signal.SIGKILL)
        return _settle(self, step, staged, fresh)

    memory_tier.MemoryTier._write_send_settle = _dies_in_snapshot
if a.uneven >= 0 and os.environ["RANK"] == "3":
    from constructs_lib.runtime import memory_tier

    _stage = memory_tier._stage

    def _changed_alone(state_dict, staged):
        out, fresh = _stage(state_dict, staged)
        return out, fresh or now[0] == a.uneven

    memory_tier._stage = _changed_alone

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
ckpt = Checkpointer()
for step in range(a.steps):
    now[0] = step
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    loss = ((model(x) - torch.sin(x.sum(dim=1, keepdim=True))) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == a.die_at and int(os.environ["GROUP_RANK"]) == 1:
        ckpt.wait()
        os.kill(os.getpid(), signal.SIGKILL)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, os.path.join(a.reference, f"step-{step}.pt"))
    ckpt.should_checkpoint(step, every=1000)
    msd, osd = get_state_dict(model, opt)
    # "note" grows at steps 3 and 6: its pickled size changes, so those snapshots are full DCP
    # saves (a new layout) and the others raw in the layout of the last full one.
    ckpt.save_to_memory(step, {"model": msd, "optim": osd, "meta": {"note": str(step % 10) + "x" * (step // 3)}})
    if step in (a.die_in_vote, a.die_before_send) and int(os.environ["GROUP_RANK"]) == 1:
        ckpt.wait()  # the tier's thread kills this process
    tier = ckpt._memory
    if step == 2 and rank == 0 and tier.link is not None:  # the tier's own threads' priorities (a test reads them)
        ckpt.wait()
        names = {"worker": tier.thread.native_id, "link": tier.link.reader.native_id}
        names = {k: os.getpriority(os.PRIO_PROCESS, tid) for k, tid in names.items()}
        print(f"tier threads: {sorted(names.items())}", file=sys.stderr, flush=True)
ckpt.wait()
dist.destroy_process_group()
