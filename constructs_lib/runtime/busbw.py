"""The pre-generation all-reduce's arithmetic, as pure functions (collective_check.py acts on them).

Bus bandwidth is NCCL-tests' (nccl-tests doc/PERFORMANCE.md): for an all-reduce of S bytes on n
ranks taking t seconds, algBW = S / t and busBW = algBW x 2(n-1)/n, the figure that does not
depend on n and is what all_reduce_perf prints as busbw, so it compares with the published
baselines (dl_selector/data/allreduce_baselines.toml).

The threshold: a generation is slow when its busBW is below THRESHOLD (half) of the type's
baseline for that node count. Half, because the check is a short probe (a few all-reduces of a
few hundred MiB, where all_reduce_perf's published figures come from its largest messages) and
must not exclude a healthy node; and because what it is for is far below half: clusters that
"work" at 20 GB/s where 78 GB/s was expected (one EFA interface of four: skypilot#8391), or a
node that fell back to TCP.

Which node is slow: pairwise. The members are paired in rounds (each round's pairs disjoint, so
they run at once): a ring (0,1),(1,2)...(n-1,0) in 2 rounds for an even n, 3 for an odd one. A
node's score is the best busBW of the pairs it is in: a slow node slows every pair it is in, a
healthy one has at least one healthy pair unless both its neighbours are slow. The slowest is the
node with the lowest score. With 2 members there is one pair, the whole cluster: the slow one
cannot be told apart, and the check reports without excluding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

THRESHOLD = 0.5


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """busBW in GB/s (10^9 bytes, as all_reduce_perf prints) of one all-reduce."""
    if ranks < 2 or seconds <= 0:
        return 0.0
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def parse_baseline(text: str) -> dict[int, float]:
    """{nodes: GB/s} from node.env's "2:77.9,4:70" (contract.ENV_ALLREDUCE_BASELINE); bad parts are left out."""
    out: dict[int, float] = {}
    for part in (text or "").split(","):
        nodes, _, gbps = part.strip().partition(":")
        try:
            if int(nodes) >= 2 and float(gbps) > 0:
                out[int(nodes)] = float(gbps)
        except ValueError:
            continue
    return out


def format_baseline(rows: Mapping[int, float]) -> str:
    return ",".join(f"{n}:{g:g}" for n, g in sorted(rows.items()))


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """The ring's pairs (i, i+1 mod n) in rounds of disjoint pairs; [] below 3 members."""
    if n < 3:
        return []
    ring = [(i, (i + 1) % n) for i in range(n)]
    rounds = [ring[0::2], ring[1::2]]
    if n % 2:  # the last pair (n-1, 0) shares node 0 with the first: a round of its own
        rounds = [ring[0:n - 1:2], ring[1:n - 1:2], [ring[-1]]]
    return [r for r in rounds if r]


def slowest(n: int, pairs: Mapping[tuple[int, int], float]) -> Optional[int]:
    """The rank whose best pair is the slowest (ties: the lower rank), or None without pairs."""
    if not pairs:
        return None
    best = {r: max((bw for p, bw in pairs.items() if r in p), default=0.0) for r in range(n)}
    return min(range(n), key=lambda r: (best[r], r))


@dataclass(frozen=True)
class Verdict:
    busbw: float                  # GB/s, the whole generation
    baseline: Optional[float]     # GB/s for this type and node count, None when there is none
    exclude: Optional[int]        # the rank to exclude, when below the threshold and one can be told apart
    pairs: Mapping[tuple[int, int], float]

    @property
    def below(self) -> bool:
        return self.baseline is not None and self.busbw < THRESHOLD * self.baseline

    def line(self, size_mib: int, nodes: int, instance_type: str) -> str:
        said = f"all-reduce of {size_mib} MiB across {nodes} nodes: busbw {self.busbw:.3g} GB/s"
        if self.baseline is None:
            return said + f"; no baseline for {instance_type or 'this type'} at {nodes} nodes: recorded, not enforced"
        said += f" (baseline {self.baseline:g} GB/s for {instance_type}, threshold {THRESHOLD:.0%})"
        if not self.below:
            return said + ": ok"
        if self.exclude is None:
            return said + ": BELOW; with 2 members the slow node cannot be told apart: reported, not excluded"
        return said + f": BELOW; slowest by pairs: rank {self.exclude}"


def judge(busbw: float, baselines: Mapping[int, float], nodes: int, pairs: Mapping[tuple[int, int], float]) -> Verdict:
    base = baselines.get(nodes)
    v = Verdict(busbw, base, None, dict(pairs))
    if v.below and pairs:
        return Verdict(busbw, base, slowest(nodes, pairs), dict(pairs))
    return v


def needs_pairs(busbw: float, baselines: Mapping[int, float], nodes: int) -> bool:
    """Whether the pairwise rounds run: only when the whole generation is below the threshold."""
    base = baselines.get(nodes)
    return base is not None and nodes >= 3 and busbw < THRESHOLD * base


def ranks_of(node_ranks: Sequence[int], local: int) -> list[int]:
    """The global ranks of these nodes' processes (local processes per node)."""
    return [r * local + i for r in node_ranks for i in range(local)]
