"""Facts the EC2 API does not carry, one row per accelerator, each row citing its source.

The file is `data/accelerators.csv`; `data/accelerators.md` explains each column and rule.
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from typing import Optional

from .paths import data_file
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8", "fp4")


@dataclass(frozen=True)
class AcceleratorSpec:
    name: str
    vendor: str
    architecture: str
    sdk: str
    interconnect: str
    interconnect_gbps: Optional[float]
    tensor_cores: bool
    precisions: tuple[str, ...]
    dense_fp16_tflops: Optional[float]
    dense_fp32_tflops: Optional[float]
    fp64_tflops: Optional[float]
    relative_training_throughput: float
    memory_gib_override: Optional[float]
    roles: tuple[str, ...]
    source: str

    @property
    def nvlink(self) -> bool:
        # "PCIe Gen5 (no NVLink)" mentions NVLink too: only a leading NVLink/NVSwitch counts.
        lower = self.interconnect.lower()
        return lower.startswith(("nvlink", "nvswitch"))


def _num(s: str) -> Optional[float]:
    s = (s or "").strip()
    return float(s) if s else None


@functools.lru_cache(maxsize=4)
def load_accelerators(path: str = data_file("accelerators.csv")) -> dict[str, AcceleratorSpec]:
    """Cached: callers must not mutate the returned mapping."""
    out: dict[str, AcceleratorSpec] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out[row["name"]] = AcceleratorSpec(
                name=row["name"],
                vendor=row["vendor"],
                architecture=row["architecture"],
                sdk=row["sdk"],
                interconnect=row["interconnect"],
                interconnect_gbps=_num(row["interconnect_gbps"]),
                tensor_cores=row["tensor_cores"].strip().lower() == "yes",
                precisions=tuple(p for p in PRECISIONS if row[p].strip().lower() == "yes"),
                dense_fp16_tflops=_num(row["dense_fp16_tflops"]),
                dense_fp32_tflops=_num(row["dense_fp32_tflops"]),
                fp64_tflops=_num(row["fp64_tflops"]),
                relative_training_throughput=float(row["relative_training_throughput"]),
                memory_gib_override=_num(row.get("memory_gib_override", "")),
                roles=tuple(r for r in row["roles"].split(";") if r),
                source=row["source"],
            )
    return out
