"""The memory tier's work on the training thread, side by side in one process, ms per call for
FSDP2 models of a few and of many parameters (one rank, gloo on 127.0.0.1), Adam with state:
- Checkpointer.state_of against torch's get_state_dict, each answer first checked to be torch's
  (state_of.differs);
- a kept step of save_to_memory(step, model=, optimizer=): the full path (state_of, then
  memory_staging.stage's walk and copy) against memory_refill's refill of the same buffers, its
  copy first checked to hold the full path's bytes and plain values.

    python bench/state_of.py [--layers 1 170] [--calls 200]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from constructs_lib.runtime.memory_refill import Refill  # noqa: E402
from constructs_lib.runtime.memory_staging import _pair, stage  # noqa: E402
from constructs_lib.runtime.state_of import StateOf, differs  # noqa: E402


def model_of(layers: int, width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, width), *[nn.Linear(width, width) for _ in range(layers)], nn.Linear(width, 1))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def per_call(fn, calls: int) -> float:
    """ms per call: the median of 5 blocks of `calls` calls."""
    for _ in range(5):
        fn()
    blocks = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(blocks)


def _kept_step(model, opt, calls: int) -> tuple[float, float, int]:
    """ms per kept step by the full path and by the refill (checked equal first), and the tensors."""
    state_of = StateOf(check_every=10**9)  # the checks' own cost (1 call in 100) left out of both
    refill = Refill(check_every=10**9)
    staged, _ = refill.copy(model, opt, state_of, None, stage)  # the first call: the full path, learned from
    full: dict = {}

    def full_path() -> None:
        full["staged"] = stage(state_of(model, opt), full.get("staged"))[0]

    full_path()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the refill must copy the state as it is now
    full_path()
    if not refill.fill(model, opt) or refill.plan is None:
        raise SystemExit("the refill did not take the plan it learned")
    pa, la, pb, lb = [], [], [], []
    _pair(staged, full["staged"], pa, la)  # raises where keys, shapes or dtypes differ
    _pair(full["staged"], staged, pb, lb)
    if any(not torch.equal(x, y) for x, y in pa) or [v for *_, v in la] != [v for *_, v in lb]:
        raise SystemExit("the refill did not give the full path's copy")
    return per_call(full_path, calls), per_call(lambda: refill.fill(model, opt), calls), len(refill.plan.pairs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 170])
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        for layers in a.layers:
            model, opt = model_of(layers, a.width)
            ours = StateOf(check_every=10**9)  # the checks' own cost is torch's call, 1 in 100: left out here
            ours(model, opt)  # learns the names from torch's call
            mine = ours(model, opt)
            why = differs(mine, dict(zip(("model", "optim"), get_state_dict(model, opt))))
            if why or ours.off:
                print(f"state_of is not torch's answer: {why or ours.off}", file=sys.stderr)
                return 1
            calls = max(5, a.calls // max(1, layers // 10))
            t_torch = per_call(lambda: get_state_dict(model, opt), calls)
            t_ours = per_call(lambda: ours(model, opt), calls)
            n = sum(1 for _ in model.parameters())
            print(f"{n} parameters: get_state_dict {t_torch:.3f} ms, state_of {t_ours:.3f} ms per call: "
                  f"{t_torch / t_ours:.1f}x faster")
            t_full, t_refill, tensors = _kept_step(model, opt, calls)
            print(f"{n} parameters ({tensors} tensors), a kept step: state_of + stage {t_full:.3f} ms, "
                  f"refill {t_refill:.3f} ms: {t_full / t_refill:.1f}x faster")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
