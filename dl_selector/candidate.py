"""One ranked instance type as the ranking shows it: its prices in each market, its figure and
how sure it is, the reasons (written when read), and the price sentences the table and the
app's summary share.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Optional

from . import freshness
from .facts import InstanceFacts, Price
from .ranking import (PRICE_FIELD, market_name, per_dollar, ranked_per_dollar_of,
                      ranked_price)
from .record import field, record
from .throughput import Measurement

if TYPE_CHECKING:
    from .ranking import Bands, Market

# What to say about a type AWS sells only as Capacity Blocks, where no on-demand or spot price exists.
CAPACITY_BLOCK_ONLY = ("sold only as Capacity Blocks for ML (no on-demand or spot price): rank it with "
                       "--capacity-block; reserve one and pass -c capacity_reservation=cr-... -c market=capacity-block")


# Not frozen, though nothing outside this module changes one: a frozen record's __init__ sets
# each of its 17 fields through object.__setattr__, and a ranking builds one per survivor (20% of
# ranking the catalog). Compared by value, never hashed.
@record
class Candidate:
    facts: InstanceFacts
    rank: int
    price_per_hour: Optional[float]
    spot_price_per_hour: Optional[float]
    samples_per_second: float
    throughput_source: str
    capacity_block_price_per_hour: Optional[float] = None
    # The model's stated uncertainty for this figure (0.15 = +-15%); 0 for measured figures.
    uncertainty: float = 0.0
    throughput_basis: str = ""
    # The spot price is shown but not ranked on (spot_trust.set_aside), and why.
    spot_untrusted: bool = False
    spot_set_aside: str = ""
    # recommend --model-size: the nodes of this type that hold the model (1 unless a multi-node profile
    # lets a smaller node in), and the sentence that says so.
    model_nodes: Optional[int] = None
    model_note: str = ""
    # --model-size ... --task inference: the modelled decode time per token at batch 1 (latency.py),
    # None where the table has no bandwidth figure (unranked for latency), and the sentence behind it.
    ms_per_token: Optional[float] = None
    latency_note: str = ""
    # The ranking's uncertainty bands and this candidate's place in them: tied_with is read from
    # them when asked (a --top 5 table asks five times; the whole catalog may hold 1,000 tied pairs).
    _bands: Optional["Bands"] = field(repr=False, default=None, compare=False)
    _index: int = field(repr=False, default=-1, compare=False)
    # What the reasons are made of; the sentences are written only when someone reads them
    # (a --top 5 table reads five), which keeps ranking the whole catalog cheap.
    _explanation: Any = field(repr=False, default="", compare=False)  # the sentence, or a function that writes it
    _region: str = field(repr=False, default="")
    _measured: Optional[Measurement] = field(repr=False, default=None)

    @property
    def tied_with(self) -> tuple[str, ...]:
        """Candidates whose figure's uncertainty band overlaps this one's: a flag ("measure these to
        decide"), not a reordering. Empty when the candidate stands alone."""
        return self._bands.partners(self._index) if self._bands is not None else ()

    @property
    def reasons(self) -> tuple[str, ...]:
        facts, region, m = self.facts, self._region, self._measured
        price = facts.price(region)
        out = [_meets(facts), self._explanation() if callable(self._explanation) else self._explanation]
        if price:
            out.append(price_line(price, region))
        elif facts.capacity_block_only:
            out.append(CAPACITY_BLOCK_ONLY)
        else:
            out.append(f"no price on record for {region}: ranked after priced types on cost objectives")
        block = facts.capacity_block_prices.get(region)
        if block:
            out.append(f"Capacity Block rate {fmt_price(block.usd_per_hour)} in {region} "
                       f"({freshness.describe(block.as_of)}; {block.source})")
        if m and (m.price_per_hour or m.spot_price_per_hour):
            out.append(f"prices from {m.source}")
        if self.model_note:
            out.append(self.model_note)
        if self.latency_note:
            out.append(self.latency_note)
        if self.spot_untrusted:
            out.append(f"{self.spot_set_aside or 'spot quote set aside'}: ranked as unpriced on spot; confirm it "
                       "with --live, or rank on it with --trust-single-az-spot")
        if self.tied_with:
            out.append(f"ties with {', '.join(self.tied_with)}: their uncertainty bands overlap, so the model cannot "
                       "tell them apart; measure these to decide (ranked by the objective's expected value)")
        return tuple(out)

    @property
    def instance_type(self) -> str:
        return self.facts.instance_type

    @property
    def samples_per_dollar(self) -> Optional[float]:
        return per_dollar(self.samples_per_second, self.price_per_hour)

    @property
    def spot_samples_per_dollar(self) -> Optional[float]:
        return per_dollar(self.samples_per_second, self.spot_price_per_hour)

    @property
    def spot_single_az(self) -> bool:
        """The spot price ranked on is one AZ's quote (not overridden by a measured price)."""
        p = self.facts.price(self._region)
        return (self.spot_price_per_hour is not None and p is not None and p.spot_azs == 1
                and not (self._measured and self._measured.spot_price_per_hour))

    def hourly(self, market: Market) -> Optional[float]:
        """The price the ranking uses in `market` (True/False: spot/on-demand)."""
        return getattr(self, PRICE_FIELD.get(market_name(market), "price_per_hour"))

    def per_dollar(self, market: Market) -> Optional[float]:
        return per_dollar(self.samples_per_second, self.hourly(market))

    def ranked_hourly(self, market: Market) -> Optional[float]:
        """The price the ranking uses: hourly(), less a spot quote it does not trust."""
        return ranked_price(market)(self)

    def ranked_per_dollar(self, market: Market) -> Optional[float]:
        return ranked_per_dollar_of(market)(self)

    def to_dict(self) -> dict[str, Any]:
        f = self.facts
        price = f.price(self._region)
        block = f.capacity_block_prices.get(self._region)
        return {
            "instance_type": f.instance_type,
            "rank": self.rank,
            "accelerator": f.accelerator,
            "accelerator_vendor": f.accelerator_vendor,
            "accelerator_count": f.accelerator_count,
            "accelerator_fraction": f.accelerator_fraction,
            "accelerator_memory_gib": f.accelerator_memory_gib,
            "accelerator_memory_gb": f.accelerator_memory_gb,
            "accelerator_memory_total_gib": f.accelerator_memory_total_gib,
            "interconnect": f.interconnect,
            "efa": f.efa,
            "max_efa_interfaces": f.max_efa_interfaces,
            "network_gbps": f.network_gbps,
            "efa_gbps": f.efa_gbps,
            "ena_gbps": f.ena_gbps,
            "nvme_disks": {"count": f.nvme.count, "size_gb": f.nvme.size_gb} if f.nvme else None,
            "vcpus": f.vcpus,
            "memory_gib": f.memory_gib,
            "architecture": f.architecture,
            "price_per_hour": self.price_per_hour,
            "spot_price_per_hour": self.spot_price_per_hour,
            "capacity_block_price_per_hour": self.capacity_block_price_per_hour,
            "price": price_dict(price, self._measured),
            "capacity_block_price": ({"usd_per_hour": block.usd_per_hour, "as_of": block.as_of,
                                      "age_days": freshness.age_days(block.as_of), "source": block.source}
                                     if block else None),
            "samples_per_second": self.samples_per_second,
            "samples_per_dollar": _round(self.samples_per_dollar),
            "spot_samples_per_dollar": _round(self.spot_samples_per_dollar),
            "capacity_block_samples_per_dollar": _round(self.per_dollar("capacity-block")),
            "throughput_source": self.throughput_source,
            "throughput_basis": self.throughput_basis,
            "throughput_uncertainty": self.uncertainty,
            "tied_with": list(self.tied_with),
            "spot_untrusted": self.spot_untrusted,
            "spot_set_aside": self.spot_set_aside or None,
            "model_nodes": self.model_nodes,
            "ms_per_token": None if self.ms_per_token is None else round(self.ms_per_token, 3),
            "reasons": list(self.reasons),
        }


def price_line(price: Price, region: str) -> str:
    """One sentence: both prices, each with its date, age and source; spot with its spread."""
    od = f"{fmt_price(price.on_demand)} on-demand in {region} ({freshness.describe(price.as_of)}; {price.source})"
    if price.spot is None:
        return od + "; no spot price on record"
    return od + f"; {fmt_price(price.spot)} spot, {spot_spread(price)} ({freshness.describe(price.spot_date)}" \
        + (f"; {price.spot_source}" if price.spot_source else "") + ")"


def spot_spread(price: Price) -> str:
    """'median of 4 AZs, $6.90-$9.10' / 'from 1 AZ only: not a market-wide figure' / 'AZ count not recorded'."""
    if price.spot_azs == 1:
        return "from 1 AZ only: not a market-wide figure"
    if price.spot_azs > 1:
        spread = (f", {fmt_price(price.spot_min)}-{fmt_price(price.spot_max)}"
                  if price.spot_min is not None and price.spot_max is not None else "")
        return f"median of {price.spot_azs} AZs{spread}"
    return "AZ count not recorded"


def price_dict(price: Optional[Price], measured: Optional[Measurement] = None) -> Optional[dict[str, Any]]:
    if price is None:
        return None
    return {
        "on_demand": {"usd_per_hour": price.on_demand, "as_of": price.as_of,
                      "age_days": freshness.age_days(price.as_of), "source": price.source},
        "spot": None if price.spot is None else {
            "usd_per_hour": price.spot, "min": price.spot_min, "max": price.spot_max, "azs": price.spot_azs or None,
            "single_az": price.spot_azs == 1, "as_of": price.spot_date,
            "age_days": freshness.age_days(price.spot_date), "source": price.spot_source or price.source},
        "note": price.note,
        "overridden_by": measured.source if measured and (measured.price_per_hour or measured.spot_price_per_hour) else None,
    }


def _round(x: Optional[float]) -> Optional[float]:
    return round(x, 1) if x is not None else None


def fmt_price(v: Optional[float]) -> str:
    return f"${v:,.2f}/h" if v is not None else "no price"


def _meets(f: InstanceFacts) -> str:
    parts = [f"{f.accelerator_count} x {f.accelerator} {f.accelerator_memory_gb:g} GB ({f.accelerator_memory_gib:g} GiB)"]
    if f.accelerator_count > 1:
        parts.append(f.interconnect)
    if f.efa:
        parts.append(f"EFA x{f.max_efa_interfaces}")
    parts.append(f"{f.vcpus} vCPU, {f.memory_gib:g} GiB RAM")
    if f.nvme:
        parts.append(f"{f.nvme.count} x {f.nvme.size_gb} GB NVMe")
    return "meets every hard requirement: " + ", ".join(parts)
