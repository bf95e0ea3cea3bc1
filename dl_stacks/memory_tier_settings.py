"""-c memory_tier_gb=GB: the job keeps its sharded state in host memory and on a buddy node
(Checkpointer.save_to_memory); checked at synth against every type the cluster may launch.

Each node holds two snapshots of its own share of the state and two of its buddy's, in /dev/shm,
which is half the RAM by default (tmpfs), plus one staging copy in the training processes. The
node checks again at the first snapshot (memory_tier.MemoryTier._room) and turns the tier off,
never the job, when the room is not there.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from dl_selector.errors import UserError

KEY = "memory_tier_gb"
EXAMPLE = "112"
WANTED = "GB of the whole job's model and optimizer state (7B parameters with Adam in mixed precision: 112)"
LIMIT = 1_000_000.0
SNAPSHOTS = 4      # two of the node's own share, two of its buddy's
SHM_SHARE = 0.5    # of the RAM: /dev/shm's default size
GIB = 2**30 / 1e9  # a GiB in GB


def parse(ctx: Mapping[str, Any]) -> Optional[float]:
    if KEY not in ctx:
        return None
    text = str(ctx[KEY]).strip()
    try:
        gb = float(text)
    except ValueError:
        gb = math.nan
    if not math.isfinite(gb) or not 0 < gb <= LIMIT:
        raise UserError(f"context {KEY}={text!r}: expected {WANTED}, above 0 and at most {LIMIT:,.0f}; "
                        f"e.g. {KEY}={EXAMPLE}")
    return gb


def per_node(gb: float, nodes: int) -> float:
    return gb / nodes


def problem(gb: float, nodes: int, options: list[tuple[str, float]]) -> Optional[str]:
    """Why the tier cannot run on this cluster: one node, or a type (name, RAM GiB) whose /dev/shm
    cannot hold the snapshots. None when every type can."""
    if nodes < 2:
        return (f"context {KEY}={gb:g}: the memory tier keeps each node's state on another node, and this "
                "cluster has 1; use -c nodes=2 or more, or leave the key out")
    need = SNAPSHOTS * per_node(gb, nodes)
    for name, ram_gib in options:
        room = SHM_SHARE * ram_gib * GIB
        if need > room:
            fewest = math.ceil(SNAPSHOTS * gb / room)
            return (f"context {KEY}={gb:g}: a {name} node needs {need:,.0f} GB of /dev/shm for the memory tier "
                    f"({SNAPSHOTS} x its {per_node(gb, nodes):,.0f} GB share: two snapshots, its own and its buddy's) "
                    f"and has {room:,.0f} GB (half its {ram_gib:,.0f} GiB of RAM); use -c nodes={fewest} or more, "
                    "or leave the key out")
    return None


def line(gb: float, nodes: int, options: list[tuple[str, float]]) -> str:
    share = per_node(gb, nodes)
    smallest = min(ram for _n, ram in options)
    return (f"  memory tier: {gb:,.0f} GB of state over {nodes} nodes: {SNAPSHOTS * share:,.0f} GB of /dev/shm "
            f"per node ({SNAPSHOTS} x its {share:,.0f} GB share) of {SHM_SHARE * smallest * GIB:,.0f} GB, "
            f"and {share:,.0f} GB staging in the training processes")
