"""The all-reduce bus-bandwidth baselines kept with the catalog (data/allreduce_baselines.toml):
what a type's nodes should reach together, by node count, with each figure's source and date."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Optional

from .paths import data_file


@dataclass(frozen=True)
class Baseline:
    instance_type: str
    nodes: int
    busbw_gbps: float
    message: str
    source: str
    date: str


def load(path: Optional[str] = None) -> list[Baseline]:
    with open(path or data_file("allreduce_baselines.toml"), "rb") as f:
        rows = tomllib.load(f).get("baseline", [])
    out = [Baseline(str(r["instance_type"]), int(r["nodes"]), float(r["busbw_gbps"]), str(r.get("message", "")),
                    str(r["source"]), str(r["date"])) for r in rows]
    for b in out:
        if b.nodes < 2 or b.busbw_gbps <= 0 or not b.source or not b.date:
            raise ValueError(f"allreduce baseline {b}: needs 2+ nodes, a positive busbw, a source and a date")
    return out


def for_type(instance_type: str, path: Optional[str] = None) -> dict[int, float]:
    """{nodes: busbw GB/s} for one type ({} when it has no baseline)."""
    return {b.nodes: b.busbw_gbps for b in load(path) if b.instance_type == instance_type}
