"""Samples per second: measured where the user has numbers, modelled otherwise.

The model: per-accelerator relative throughput (V100 = 1.0, from the cited accelerator table)
x whole accelerators x a scaling efficiency x the profile's reference samples/s per V100.
Each modelled figure carries the table row's basis and uncertainty (accelerators.md, "Basis and
uncertainty"); a figure the user measured (--throughput) carries none. The uncertainty is that of
the per-accelerator figure only: the scaling efficiencies below are assumptions on top of it.

Scaling efficiency (documented assumptions, not measurements; replace with --throughput):
- independent runs (parallel experiments): 1.0 per accelerator, nothing is shared;
- scaling_class "fabric" (NVLink/NVSwitch, NeuronLink, Gaudi's on-chip RoCE) data-parallel: 0.95
  (all-reduce over a dedicated accelerator fabric);
- scaling_class "pcie" data-parallel: 0.80 (gradients cross the host's PCIe switches; the guides warn that
  G4/G5 multi-GPU sizes are meant for inference or parallel experiments).
"""
from __future__ import annotations

import os
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Callable, Optional, Union

from .accelerators import DEFAULT_UNCERTAINTY, AcceleratorSpec, spec_for
from .errors import UserError, unknown
from .facts import InstanceFacts
from .profiles import Profile
from .record import record
from .validate import clean, csv_rows, finite_number, parse_json, read_text

V100 = "V100"
FAST_FABRIC_EFFICIENCY = 0.95
PCIE_EFFICIENCY = 0.80


@record(frozen=True)
class Measurement:
    samples_per_second: float
    price_per_hour: Optional[float] = None
    spot_price_per_hour: Optional[float] = None
    source: str = ""


# Not frozen: model() makes one per candidate on every ranking, and a frozen __init__ sets each field
# through object.__setattr__. Nothing changes an Estimate after it is made.
@record
class Estimate:
    samples_per_second: float
    source: str  # "measured", "model" or "calibrated"
    # The sentence, or a function that writes it: ranking the catalog models every type, and a
    # --top 5 table reads five sentences (see `explanation`).
    _explain: Union[str, Callable[[], str]]
    # The fraction the figure may be off either way (0.15 = ±15%): the accelerator table's for a
    # modelled figure, 0.0 for one the user measured (the defaults, so Estimate(sps, "measured", why)
    # still says so).
    uncertainty: float = 0.0
    # What the figure rests on: the table row's basis (accelerators.BASES) for a modelled figure.
    basis: str = "user-measured"

    @property
    def explanation(self) -> str:
        return self._explain() if callable(self._explain) else self._explain


def per_accelerator_basis(spec: AcceleratorSpec, precision: str) -> tuple[str, float, str]:
    """(basis, uncertainty, evidence) behind relative_per_accelerator's figure. Mixed precision uses
    the table's training figure; fp32/fp64 use a datasheet TFLOPS ratio to the V100."""
    if precision == "mixed":
        return spec.basis, spec.uncertainty, spec.evidence
    return "derived-tflops", DEFAULT_UNCERTAINTY["derived-tflops"], f"datasheet {precision} TFLOPS vs V100"


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
    # The memory variant where the table has one (p4de's 80 GB A100), else the row EC2's name picks.
    spec = spec_for(facts, accelerators)
    rel = relative_per_accelerator(spec, profile.precision, accelerators)
    eff, how = scaling(facts, spec, profile)
    basis, uncertainty, evidence = per_accelerator_basis(spec, profile.precision)
    sps = profile.reference_samples_per_second * rel * facts.effective_accelerators * eff

    def explain() -> str:
        count = f"{facts.accelerator_count}" if facts.accelerator_fraction == 1 else f"{facts.accelerator_fraction:g} of 1"
        label = "V100" if profile.precision == "mixed" else f"V100 {profile.precision}"
        if basis == "baseline":
            margin = "the model's reference accelerator (V100 = 1.0)"
        elif basis == "not-for-training":
            margin = f"{spec.name} is not a training device (not-for-training)"
        else:
            margin = f"model ±{uncertainty:.0%} ({basis}" + (f": {evidence})" if evidence else ")")
        if basis == "vendor-upper-bound" and spec.upper_bound is not None and profile.precision == "mixed":
            margin += f"; the vendor's best case, {spec.upper_bound:g}x V100, is the top of the band"
        return f"modelled: {count} x {spec.name} at {rel:.2f}x {label} x {eff:.2f} ({how} scaling); {margin}"

    return Estimate(round(sps, 1), "model", explain, uncertainty=uncertainty, basis=basis)


# Sanity bounds, not physics: they keep samples per dollar (samples/s x 3600 / price) finite in
# --json output and catch unit slips (a price in cents, samples per day).
MAX_SAMPLES_PER_SECOND = 1e12
MIN_PRICE_PER_HOUR = 1e-4
MAX_PRICE_PER_HOUR = 1e5
_COLUMNS = ("instance_type", "samples_per_second")
_OPTIONAL = ("price_per_hour", "spot_price_per_hour")


def load_measurements(path: str, known: dict[str, InstanceFacts]) -> dict[str, Measurement]:
    """Rows of instance_type, samples_per_second [, price_per_hour, spot_price_per_hour] (CSV or JSON).

    Refuses (one line each) unreadable or non-UTF-8 files, the wrong JSON shape, short or long CSV
    rows, unknown types, a type measured twice (which row should win is the user's call, not ours),
    and numbers that are not finite and positive within the sanity bounds above."""
    path = str(path)
    shown = clean(path)
    text = read_text(path, "throughput")
    rows: list[tuple[int, dict]]
    if path.endswith(".json") or text.lstrip().startswith(("[", "{")):
        data = parse_json(text, path, "throughput")
        if isinstance(data, dict):
            failed = data.get("failed")
            if data.get("measurements") == [] and isinstance(failed, list) and failed and isinstance(failed[0], dict):
                raise UserError(f"throughput file {shown}: every candidate failed its benchmark (first: "
                                f"{clean(str(failed[0].get('instance_type')))}: {clean(str(failed[0].get('reason')))[:200]})")
            data = data.get("measurements", data.get("rows"))
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise UserError(f"throughput file {shown}: expected a JSON list of objects with instance_type and samples_per_second")
        rows = list(enumerate(data, start=1))
        label = "row"
    else:
        rows = csv_rows(text, path, "throughput", _COLUMNS, _OPTIONAL)
        label = "line"
    out: dict[str, Measurement] = {}
    first_seen: dict[str, int] = {}
    for i, row in rows:
        where = f"throughput file {shown} {label} {i}"
        raw_name = row.get("instance_type")
        if raw_name is not None and not isinstance(raw_name, str):
            raise UserError(f"{where}: instance_type must be a string, got {clean(repr(raw_name))[:80]}")
        name = (raw_name or "").strip()
        if not name:
            raise UserError(f"{where}: missing instance_type")
        if name not in known:
            raise UserError(f"{where}: {unknown('instance type', name, known)}")
        if name in first_seen:
            raise UserError(f"{where}: {name} is measured twice ({label}s {first_seen[name]} and {i}); keep one row")
        first_seen[name] = i
        out[name] = Measurement(
            samples_per_second=_required_positive(row.get("samples_per_second"), where, "samples_per_second",
                                                  hi=MAX_SAMPLES_PER_SECOND),
            price_per_hour=_positive(row.get("price_per_hour"), where, "price_per_hour", lo=MIN_PRICE_PER_HOUR),
            spot_price_per_hour=_positive(row.get("spot_price_per_hour"), where, "spot_price_per_hour",
                                          lo=MIN_PRICE_PER_HOUR),
            source=f"measured ({os.path.basename(path)})",
        )
    if not out:
        raise UserError(f"throughput file {shown}: no rows")
    return out


def failed_in(path: str) -> list[tuple[str, str]]:
    """(instance type, reason) for each candidate a `bench collect` file lists as failed, so that
    recommend can say why those types rank on the model instead (never silently)."""
    text = read_text(str(path), "throughput")
    if not text.lstrip().startswith("{"):
        return []
    data = parse_json(text, str(path), "throughput")
    failed = data.get("failed") if isinstance(data, dict) else None
    if not isinstance(failed, list):
        return []
    return [(clean(str(f.get("instance_type", "?"))), clean(str(f.get("reason", "no reason given"))))
            for f in failed if isinstance(f, dict)]


def _positive(value: object, where: str, key: str, lo: float = 0.0, hi: float = MAX_PRICE_PER_HOUR) -> Optional[float]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    # lo 0 is exclusive (a throughput must be above zero); a price floor is inclusive.
    return finite_number(value, f"{where}: {key}", lo, hi, above=lo == 0.0)


def _required_positive(value: object, where: str, key: str, hi: float) -> float:
    number = _positive(value, where, key, hi=hi)
    if number is None:
        raise UserError(f"{where}: missing {key}")
    return number
