"""Samples per second: measured where the user has numbers, modelled otherwise.

The model: per-accelerator relative throughput (V100 = 1.0, from the cited accelerator table)
x whole accelerators x a scaling efficiency x the profile's reference samples/s per V100.

Scaling efficiency (documented assumptions, not measurements; replace with --throughput):
- independent runs (parallel experiments): 1.0 per accelerator, nothing is shared;
- scaling_class "fabric" (NVLink/NVSwitch, NeuronLink, Gaudi's on-chip RoCE) data-parallel: 0.95
  (all-reduce over a dedicated accelerator fabric);
- scaling_class "pcie" data-parallel: 0.80 (gradients cross the host's PCIe switches; the guides warn that
  G4/G5 multi-GPU sizes are meant for inference or parallel experiments).
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
import os
from typing import Optional

from .accelerators import AcceleratorSpec
from .errors import UserError, unknown
from .facts import InstanceFacts
from .profiles import Profile

V100 = "V100"
FAST_FABRIC_EFFICIENCY = 0.95
PCIE_EFFICIENCY = 0.80


@dataclass(frozen=True)
class Measurement:
    samples_per_second: float
    price_per_hour: Optional[float] = None
    spot_price_per_hour: Optional[float] = None
    source: str = ""


@dataclass(frozen=True)
class Estimate:
    samples_per_second: float
    source: str  # "measured" or "model"
    explanation: str


def relative_per_accelerator(spec: AcceleratorSpec, precision: str, accelerators: dict[str, AcceleratorSpec]) -> float:
    if precision == "mixed":
        return spec.relative_training_throughput
    ref = accelerators[V100]
    attr = "dense_fp32_tflops" if precision == "fp32" else "fp64_tflops"
    mine, base = getattr(spec, attr), getattr(ref, attr)
    return (mine or 0.0) / base if base else 0.0


def scaling(facts: InstanceFacts, spec: AcceleratorSpec, profile: Profile) -> tuple[float, str]:
    n = facts.accelerator_count
    if n <= 1 or profile.independent_runs:
        return 1.0, "independent" if n > 1 else "single"
    # The accelerator table's explicit scaling_class, never a guess from the description.
    if spec.scaling_class == "fabric":
        return FAST_FABRIC_EFFICIENCY, spec.interconnect
    return PCIE_EFFICIENCY, "PCIe"


def model(facts: InstanceFacts, profile: Profile, accelerators: dict[str, AcceleratorSpec]) -> Estimate:
    spec = accelerators[facts.accelerator]
    rel = relative_per_accelerator(spec, profile.precision, accelerators)
    eff, how = scaling(facts, spec, profile)
    sps = profile.reference_samples_per_second * rel * facts.effective_accelerators * eff
    count = f"{facts.accelerator_count}" if facts.accelerator_fraction == 1 else f"{facts.accelerator_fraction:g} of 1"
    label = "V100" if profile.precision == "mixed" else f"V100 {profile.precision}"
    return Estimate(
        samples_per_second=round(sps, 1),
        source="model",
        explanation=f"modelled: {count} x {facts.accelerator} at {rel:.2f}x {label} x {eff:.2f} ({how} scaling)",
    )


def load_measurements(path: str, known: dict[str, InstanceFacts]) -> dict[str, Measurement]:
    """Rows of instance_type, samples_per_second [, price_per_hour, spot_price_per_hour] (CSV or JSON)."""
    path = str(path)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"cannot read throughput file {path}: {e.strerror}") from None
    if path.endswith(".json") or text.lstrip().startswith(("[", "{")):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"throughput file {path}: not valid JSON (line {e.lineno}: {e.msg})") from None
        if isinstance(rows, dict):
            rows = rows.get("measurements", rows.get("rows"))
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise UserError(f"throughput file {path}: expected a JSON list of objects with instance_type and samples_per_second")
        first_line = 1
    else:
        reader = csv.DictReader(text.splitlines())
        rows = list(reader)
        if not reader.fieldnames or "instance_type" not in reader.fieldnames or "samples_per_second" not in reader.fieldnames:
            raise UserError(f"throughput file {path}: needs CSV columns instance_type,samples_per_second "
                            "[,price_per_hour,spot_price_per_hour]")
        first_line = 2
    out: dict[str, Measurement] = {}
    for i, row in enumerate(rows, start=first_line):
        where = f"throughput file {path} {'row' if first_line == 1 else 'line'} {i}"
        name = str(row.get("instance_type") or "").strip()
        if not name:
            raise UserError(f"{where}: missing instance_type")
        if name not in known:
            raise UserError(f"{where}: {unknown('instance type', name, known)}")
        out[name] = Measurement(
            samples_per_second=_positive(row.get("samples_per_second"), where, "samples_per_second", required=True),
            price_per_hour=_positive(row.get("price_per_hour"), where, "price_per_hour"),
            spot_price_per_hour=_positive(row.get("spot_price_per_hour"), where, "spot_price_per_hour"),
            source=f"measured ({os.path.basename(path)})",
        )
    if not out:
        raise UserError(f"throughput file {path}: no rows")
    return out


def _positive(value, where: str, key: str, required: bool = False) -> Optional[float]:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise UserError(f"{where}: missing {key}")
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {key} = {value!r} is not a number") from None
    if not v > 0:
        raise UserError(f"{where}: {key} must be above zero, got {value!r}")
    return v
