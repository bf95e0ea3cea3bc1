"""Measured samples/s on the model's scale: the median measured/model ratio over the measured
types puts every modelled figure in the user's own units (see Calibration)."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Iterable, Optional

from .accelerators import AcceleratorSpec
from .facts import InstanceFacts
from .profiles import Profile
from .record import record
from .throughput import Measurement, model


@record(frozen=True)
class Calibration:
    """Measured samples/s count the user's own samples (images, tokens, sequences); the model counts
    the profile's reference units. `scale` (the median measured/model ratio over the measured types)
    puts every modelled figure in the user's units, so measured and modelled candidates rank on one
    scale. `outliers`: measured types whose ratio lies off the median by more than their model band
    (the measurement or the model row is wrong; either way the ranking should not be trusted blindly)."""
    scale: float
    count: int
    outliers: tuple[tuple[str, float, float], ...] = ()  # (type, its ratio / the median, its band)

    def describe(self) -> str:
        return f"the median measured/model ratio of {self.count} measured type{'s' if self.count != 1 else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"scale": round(self.scale, 6), "measured_types": self.count,
                "outliers": [{"instance_type": n, "relative_to_median": round(r, 3), "band": b}
                             for n, r, b in self.outliers]}


def calibrate(catalog: Iterable[InstanceFacts], profile: Profile, accelerators: dict[str, AcceleratorSpec],
              measured: dict[str, Measurement]) -> Optional[Calibration]:
    """The Calibration for these measurements, or None when none of them is of a catalog type the
    model can figure (a not-for-training accelerator models as zero)."""
    import statistics

    ratios: list[tuple[str, float, float]] = []
    for facts in catalog:
        m = measured.get(facts.instance_type)
        if m is None:
            continue
        est = model(facts, profile, accelerators)
        if est.samples_per_second > 0:
            ratios.append((facts.instance_type, m.samples_per_second / est.samples_per_second, est.uncertainty))
    if not ratios:
        return None
    median = statistics.median(r for _n, r, _u in ratios)
    outliers = tuple((n, r / median, u) for n, r, u in ratios if abs(r / median - 1) > u + 1e-9)
    return Calibration(median, len(ratios), outliers)
