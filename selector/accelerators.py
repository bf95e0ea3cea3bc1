"""Facts the EC2 API does not carry, one row per accelerator, each row citing its source.

The file is `data/accelerators.csv`; `data/accelerators.md` explains each column and rule.
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from typing import Optional

from .errors import UserError
from .paths import data_file

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8", "fp4")
# How a node's accelerators reach each other (accelerators.md, "fabric and scaling_class").
FABRICS = ("nvswitch", "nvlink", "neuronlink", "roce", "pcie", "none")
NVLINK_FABRICS = ("nvswitch", "nvlink")
# The data-parallel scaling assumption a row gets in throughput.py: over a dedicated
# accelerator fabric, or through the host's PCIe.
SCALING_CLASSES = ("fabric", "pcie")


@dataclass(frozen=True)
class AcceleratorSpec:
    name: str
    vendor: str
    architecture: str
    sdk: str
    interconnect: str
    interconnect_gbps: Optional[float]
    fabric: str
    scaling_class: str
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
        """NVLink between the GPUs, point to point (V100) or through NVSwitch: the explicit column,
        never the description, which says "no NVLink" for some PCIe parts."""
        return self.fabric in NVLINK_FABRICS


def _num(s: str) -> Optional[float]:
    s = (s or "").strip()
    return float(s) if s else None


def _choice(path: str, row: dict[str, str], column: str, allowed: tuple[str, ...]) -> str:
    # A blank or misspelt value would silently change a ranking: refuse the table instead.
    value = (row.get(column) or "").strip()
    if value not in allowed:
        raise UserError(f"{path}: row {row['name']!r} has {column}={value!r}; allowed: {', '.join(allowed)}")
    return value


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
                fabric=_choice(path, row, "fabric", FABRICS),
                scaling_class=_choice(path, row, "scaling_class", SCALING_CLASSES),
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
