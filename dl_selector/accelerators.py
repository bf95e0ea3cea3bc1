"""Facts the EC2 API does not carry, one row per accelerator, each row citing its source.

The file is `data/accelerators.csv`; `data/accelerators.md` explains each column and rule.
EC2 gives memory variants one name (p4d's and p4de's GPU are both "A100"): a variant row names
the EC2 accelerator in `ec2_name` and its memory in `memory_gib`, and `spec_for` picks it for an
instance whose accelerator memory matches, the base row otherwise.
"""
from __future__ import annotations

import csv
import functools
import math
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Optional, Union

from .errors import UserError
from .paths import data_file
from .record import record

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8", "fp4")
# How a node's accelerators reach each other (accelerators.md, "fabric and scaling_class").
FABRICS = ("nvswitch", "nvlink", "neuronlink", "roce", "pcie", "none")
NVLINK_FABRICS = ("nvswitch", "nvlink")
# The data-parallel scaling assumption a row gets in throughput.py: over a dedicated
# accelerator fabric, or through the host's PCIe.
SCALING_CLASSES = ("fabric", "pcie")
# What a row's relative_training_throughput rests on, and the uncertainty the rule in
# accelerators.md ("Basis and uncertainty") gives it unless the row states a reason to differ.
BASES = ("baseline", "measured", "proxy-measured", "derived-tflops", "vendor-claim", "vendor-upper-bound",
         "not-for-training")
DEFAULT_UNCERTAINTY = {
    "baseline": 0.0,          # V100 = 1.0 by definition
    "measured": 0.15,         # independent multi-model suite, same harness as the V100 reference
    "proxy-measured": 0.20,   # one model, a sibling SKU, another harness, or a ratio chained through a measured row
    "derived-tflops": 0.30,   # anchor x (TFLOPS ratio)^0.78
    "vendor-claim": 0.30,     # at least: a vendor's own performance or price-performance claim
    "vendor-upper-bound": 0.30,  # a vendor's "up to" claim: a best case, never a central figure
    "not-for-training": 0.0,  # the figure is 0 because the part is not a training device; nothing to be unsure of
}
# Two memory sizes within this fraction are the same variant (EC2 reports MiB; 81920 MiB = 80 GiB).
MEMORY_MATCH = 0.02


@record(frozen=True)
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
    basis: str = "measured"
    uncertainty: float = DEFAULT_UNCERTAINTY["measured"]
    # A few words naming the evidence, shown in the model's explanation.
    evidence: str = ""
    # Memory variants: the EC2 name this row stands for (its own name for a base row) and, on a
    # variant row, the accelerator memory that selects it.
    ec2_name: str = ""
    memory_gib: Optional[float] = None
    # A vendor-upper-bound row's figure as the table writes it (the vendor's best case). The model
    # ranks on relative_training_throughput, the centre of a band whose top is this bound:
    # bound / (1 + uncertainty). None on every other row.
    upper_bound: Optional[float] = None
    # Memory bandwidth per accelerator in GB/s (10^9 bytes/s) from the vendor's datasheet
    # (accelerators.md, "memory_bandwidth_gbps"); None where the table has no sourced figure, and the
    # latency objective then leaves the type unranked rather than guess.
    memory_bandwidth_gbps: Optional[float] = None

    @property
    def nvlink(self) -> bool:
        """NVLink between the GPUs, point to point (V100) or through NVSwitch: the explicit column,
        never the description, which says "no NVLink" for some PCIe parts."""
        return self.fabric in NVLINK_FABRICS


def _num(s: str) -> Optional[float]:
    s = (s or "").strip()
    return float(s) if s else None


def _fraction(path: str, row: dict[str, str], column: str) -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value < 1.0:  # NaN fails too
        raise UserError(f"{path}: row {row['name']!r} has {column}={raw!r}; expected a fraction in [0, 1)")
    return value


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
            basis = _choice(path, row, "basis", BASES)
            uncertainty = _fraction(path, row, "uncertainty")
            figure = float(row["relative_training_throughput"])
            # An upper bound is the top of its band, never below the centre: a best case ranked as a
            # typical figure would beat measured parts it may well trail (accelerators.md, the rule).
            bound = figure if basis == "vendor-upper-bound" else None
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
                relative_training_throughput=figure / (1 + uncertainty) if bound is not None else figure,
                memory_gib_override=_num(row.get("memory_gib_override", "")),
                roles=tuple(r for r in row["roles"].split(";") if r),
                source=row["source"],
                basis=basis,
                uncertainty=uncertainty,
                evidence=(row.get("evidence") or "").strip(),
                ec2_name=(row.get("ec2_name") or "").strip() or row["name"],
                memory_gib=_num(row.get("memory_gib", "")),
                upper_bound=bound,
                memory_bandwidth_gbps=_num(row.get("memory_bandwidth_gbps", "")),
            )
    for name, spec in out.items():
        variant = spec.ec2_name != name
        if variant and (spec.ec2_name not in out or out[spec.ec2_name].ec2_name != spec.ec2_name):
            raise UserError(f"{path}: row {name!r} is a variant of {spec.ec2_name!r}, which has no base row")
        if variant != (spec.memory_gib is not None):
            raise UserError(f"{path}: row {name!r}: a memory variant needs both ec2_name and memory_gib; a base row neither")
    return out


if TYPE_CHECKING:
    Facts = Any  # anything with .accelerator and .accelerator_memory_gib (InstanceFacts)


def spec_for(what: Union[Facts, tuple[str, Optional[float]], str],
             accelerators: dict[str, AcceleratorSpec]) -> AcceleratorSpec:
    """The row the throughput model uses for an instance's accelerator: the memory variant whose
    `memory_gib` matches the accelerator memory (p4de's 80 GiB A100), else the base row named as EC2
    names it (p4d's A100). `what` is an InstanceFacts, a (name, memory GiB) pair or a bare name.
    KeyError when the table has no row for the name."""
    if isinstance(what, str):
        name, memory = what, None
    elif isinstance(what, tuple):
        name, memory = what
    else:
        name, memory = what.accelerator, what.accelerator_memory_gib
    # Every rule and the model ask this for every type on every ranking (about 160 times a call):
    # answered once per table, name and memory. The table is held beside its answers, so its id
    # cannot be reused by another dict while they are kept.
    held = _SPEC_CACHE.get(id(accelerators))
    if held is None or held[0] is not accelerators:
        held = _SPEC_CACHE[id(accelerators)] = (accelerators, {})
    key = (name, memory)
    found = held[1].get(key)
    if found is None:
        found = held[1][key] = _find_spec(name, memory, accelerators)
    return found


_SPEC_CACHE: dict[int, tuple[dict[str, AcceleratorSpec], dict[tuple[str, Optional[float]], AcceleratorSpec]]] = {}


def _find_spec(name: str, memory: Optional[float], accelerators: dict[str, AcceleratorSpec]) -> AcceleratorSpec:
    base = accelerators[name]
    if memory:
        for spec in accelerators.values():
            if (spec.ec2_name == name and spec.memory_gib is not None and spec.name != name
                    and math.isclose(spec.memory_gib, memory, rel_tol=MEMORY_MATCH)):
                return spec
    return base
