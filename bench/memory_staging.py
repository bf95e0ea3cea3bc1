"""The memory tier's copy to CPU on the training thread, side by side: torch's own
_copy_state_dict (what the tier used) against memory_staging.stage (one walk, one
torch._foreach_copy_), refilling the same buffers with an FSDP2 model's and AdamW's state.

    python bench/memory_staging.py [--layers 32] [--width 16] [--repeat 20]

A block is 6 Linear layers and 2 LayerNorms (a transformer block's parameter count, 16
parameters); 32 blocks are 512 parameters, Llama-3-8B has 291 and Llama-3-70B 723. One process,
a gloo group of one: this is Python per tensor, the bytes are small on purpose."""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed._state_dict_utils import _copy_state_dict
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from constructs_lib.runtime.memory_staging import stage
    from tests.runtime.free_port import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(a.width, a.width) for _ in range(6))
            self.norms = nn.ModuleList(nn.LayerNorm(a.width) for _ in range(2))

        def forward(self, y):
            for layer in self.lin:
                y = torch.tanh(layer(y))
            return self.norms[1](self.norms[0](y))

    model = nn.Sequential(*(Block() for _ in range(a.layers)))
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, a.width)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    staged, _ = stage(state, None)
    n = sum(1 for _ in model.parameters())
    times = {}
    for name, fn in [("torch _copy_state_dict", lambda: _copy_state_dict(state, staged)),
                     ("memory_staging.stage", lambda: stage(state, staged))]:
        fn()
        t = time.perf_counter()
        for _ in range(a.repeat):
            fn()
        times[name] = (time.perf_counter() - t) / a.repeat * 1000
        print(f"{name}: {times[name]:.2f} ms a copy ({n} parameters, {3 * n} tensors with AdamW's state)")
    model[0].lin[0].weight.data.add_(1.0)  # the copy must be the state's bytes now
    out, fresh = stage(state, staged)
    w = out["model"]["0.lin.0.weight"]
    assert not fresh and torch.equal(w._local_tensor, msd["0.lin.0.weight"]._local_tensor)
    print(f"ratio: {times['torch _copy_state_dict'] / times['memory_staging.stage']:.1f}x faster")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
