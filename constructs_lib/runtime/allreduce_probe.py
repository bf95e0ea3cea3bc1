"""The pre-generation all-reduce, as a short process of its own (collective_check.py starts it on
every member of a new generation, before the user's command): one rank per GPU with NCCL on GPU
nodes, one gloo rank per node elsewhere (tests). It prints one JSON line, the same on every node
(rank 0 measures, decides and broadcasts): the generation's busBW and, when it is below the
threshold, each pair's (busbw.py says how the slowest is found).

Bounded: torch.distributed's own timeout covers the rendezvous and every collective, and the
supervisor kills the process at its bound (a member that never joins fails the check, never hangs it).

    python -m constructs_lib.runtime.allreduce_probe --master ADDR --port P --nodes N --node-rank R \
        --local L --size-mib S --baseline 2:77.9 [--iters K] [--timeout T]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

from . import busbw, contract


def _timed(dist, torch, tensor, iters: int, group, cuda: bool) -> float:
    """Seconds per all-reduce: one warm-up, then `iters` timed, each after the test hook's delay."""
    delay = float(os.environ.get(contract.ENV_ALLREDUCE_TEST_DELAY) or 0)

    def one() -> None:
        if delay:
            time.sleep(delay)
        dist.all_reduce(tensor, group=group)
    one()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(iters):
        one()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def worker(local_rank: int, a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    cuda = a.backend == "nccl"
    if cuda:
        torch.cuda.set_device(local_rank)
    world, rank = a.nodes * a.local, a.node_rank * a.local + local_rank
    dist.init_process_group(a.backend, init_method=f"tcp://{a.master}:{a.port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=a.timeout))
    try:
        elems = a.size_mib * 1024 * 1024 // 4
        tensor = torch.ones(elems, dtype=torch.float32, device="cuda" if cuda else "cpu")
        size = elems * 4
        # The slowest rank's time is the generation's (every rank measures the same collective).
        t = torch.tensor([_timed(dist, torch, tensor, a.iters, None, cuda)], dtype=torch.float64,
                         device=tensor.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        whole = busbw.bus_bandwidth(size, float(t.item()), world)
        baselines = busbw.parse_baseline(a.baseline)
        decided = [busbw.needs_pairs(whole, baselines, a.nodes)]
        dist.broadcast_object_list(decided, src=0)  # rank 0's baseline decides for every node
        pairs: dict[tuple[int, int], float] = {}
        if decided[0]:
            rounds = busbw.pair_rounds(a.nodes)
            groups = {p: dist.new_group(busbw.ranks_of(p, a.local)) for r in rounds for p in r}
            order = [p for r in rounds for p in r]
            times = torch.zeros(len(order), dtype=torch.float64, device=tensor.device)
            for r in rounds:
                for p in r:
                    if a.node_rank in p:
                        times[order.index(p)] = _timed(dist, torch, tensor, a.iters, groups[p], cuda)
                dist.barrier()
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            pairs = {p: busbw.bus_bandwidth(size, float(times[i].item()), 2 * a.local) for i, p in enumerate(order)}
        verdict = [busbw.judge(whole, baselines, a.nodes, pairs) if rank == 0 else None]
        dist.broadcast_object_list(verdict, src=0)
        v = verdict[0]
        if local_rank == 0:
            print(json.dumps({"busbw": v.busbw, "baseline": v.baseline, "below": v.below, "exclude": v.exclude,
                              "pairs": [[p[0], p[1], bw] for p, bw in v.pairs.items()], "size_bytes": size,
                              "ranks": world, "backend": a.backend}), flush=True)
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="allreduce_probe")
    p.add_argument("--master", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--local", type=int, default=1)
    p.add_argument("--size-mib", type=int, required=True)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--baseline", default="")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:  # the supervisor's Python need not be the job's (a container, a venv of its own)
        print(json.dumps({"skipped": f"no torch in {sys.executable}"}), flush=True)
        return 0
    if a.backend == "auto":
        a.backend = "nccl" if torch.cuda.is_available() else "gloo"
    if a.backend == "gloo":
        a.local = 1  # one CPU rank per node: the network between nodes is what is measured
    if a.local == 1:
        worker(0, a)
    else:
        import torch.multiprocessing as mp
        mp.spawn(worker, args=(a,), nprocs=a.local, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
