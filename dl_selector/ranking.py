"""The order of a ranking: which price each market ranks on, each objective's sort key and
tie-breaks, and the uncertainty bands ties are read from. recommend.py builds the candidates and
explains the order; candidate.py shows them.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Callable, Optional, Union

from dl_core.markets import CAPACITY_BLOCK, ON_DEMAND, SPOT

from .record import record
# When a spot figure is set aside (ranked as unpriced on spot): spot_trust.py holds the one rule.
from .spot_trust import SPOT_QUOTE_FRESH_DAYS, SUSPECT_SPOT_FRACTION  # noqa: F401  (names kept for importers)

if TYPE_CHECKING:
    from .candidate import Candidate

if TYPE_CHECKING:
    Market = Union[bool, str]  # True/False (spot or on-demand, the older API) or one of MARKETS


# The Candidate field holding each market's price.
PRICE_FIELD = {ON_DEMAND: "price_per_hour", SPOT: "spot_price_per_hour", CAPACITY_BLOCK: "capacity_block_price_per_hour"}


def market_name(market: Market) -> str:
    if isinstance(market, bool):
        return "spot" if market else "on-demand"
    return market


def per_dollar(sps: float, price: Optional[float]) -> Optional[float]:
    # samples per dollar = samples per second x 3600 / price per hour
    return sps * 3600 / price if price else None


MISSING = float("inf")



def ranked_price(market: Market) -> Callable[[Candidate], Optional[float]]:
    """candidate -> the price a ranking in `market` uses: hourly(), less a spot quote it does not
    trust. A function of the market, made once per ranking: the sort calls it for every candidate."""
    m = market_name(market)
    if m == "spot":
        return lambda c: None if c.spot_untrusted else c.spot_price_per_hour
    attr = PRICE_FIELD.get(m, "price_per_hour")
    return lambda c: getattr(c, attr)


def sort_key(objective: str, market: str):
    """The ranking's sort key: the objective's own figure first, then the tie-breaks.

    Exact ties are real: types of one family that are two of the same box (g4dn.metal and
    g4dn.12xlarge, g6e.48xlarge and g6e.24xlarge) cost exactly twice as much for twice the
    throughput, so their samples per dollar are the same float. Under max_samples_per_dollar an
    equal figure goes to the faster type: the same work costs the same on either, and the faster
    one finishes it sooner (fewer hours exposed to a spot interruption, results earlier). Then
    the name, so equal figures always rank the same way. max_throughput breaks its ties on the
    lower price, min_price on the higher throughput, max_accelerator_memory on throughput and
    then price; an unknown price or figure sorts last (MISSING).

    Before all of that, whatever the objective: a type with no price in `market` (no spot figure,
    a spot quote set aside, no Capacity Block rate) ranks after every priced type (unpriced_in).
    """
    ranked = ranked_price(market)

    def price(c: Candidate) -> float:
        p = ranked(c)
        return p if p is not None else MISSING

    def unpriced(c: Candidate) -> bool:
        # First in every key: a type with no price in the market ranked on goes after every priced
        # one, whatever the objective (under max_throughput the fastest type may have no spot price
        # or Capacity Block rate at all: ranking it first would recommend what cannot be bought so).
        return ranked(c) is None

    ranked_per_dollar = ranked_per_dollar_of(market)

    def per_dollar(c: Candidate) -> float:
        v = ranked_per_dollar(c)
        return -v if v is not None else MISSING

    keys = {
        "max_throughput": lambda c: (unpriced(c), -c.samples_per_second, price(c), c.instance_type),
        "max_samples_per_dollar": lambda c: (unpriced(c), per_dollar(c), -c.samples_per_second, c.instance_type),
        "min_price": lambda c: (unpriced(c), price(c), -c.samples_per_second, c.instance_type),
        "max_accelerator_memory": lambda c: (unpriced(c), -c.facts.accelerator_memory_total_gib, -c.samples_per_second,
                                             price(c), c.instance_type),
        # No bandwidth figure, no latency: after every type that has one (latency.py), cheapest first.
        "min_latency": lambda c: (unpriced(c), c.ms_per_token is None,
                                  c.ms_per_token if c.ms_per_token is not None else MISSING, price(c), c.instance_type),
    }
    return keys[objective]


def unpriced_in(market: Market, candidates: list[Candidate]) -> list[Candidate]:
    """The candidates with no price in `market` that a ranking can use: they rank after every
    priced one, and the ranking says so (recommend's `why` and notes, the table's source column)."""
    price = ranked_price(market)
    return [c for c in candidates if price(c) is None]


def ranked_per_dollar_of(market: Market) -> Callable[[Candidate], Optional[float]]:
    price = ranked_price(market)
    return lambda c: per_dollar(c.samples_per_second, price(c))


# Objectives whose ranking rests on the throughput figure, and so on its uncertainty:
# objective -> market -> (candidate -> the figure ranked on), made once per ranking.
MODEL_METRICS = {
    "max_throughput": lambda market: (lambda c: c.samples_per_second),
    "max_samples_per_dollar": ranked_per_dollar_of,
}


@record(frozen=True)
class Bands:
    """One ranking's figures with their uncertainty intervals, v x (1 +- u), in rank order (the
    metric descending). Two candidates tie when their intervals overlap. A measured figure (u = 0)
    is a point: it ties with a modelled one whose band holds it, with another measured one only if
    equal. An unknown or zero figure (no price, not a training device) ties with none."""
    names: tuple[str, ...]
    values: tuple[Optional[float], ...]
    lows: tuple[Optional[float], ...]
    highs: tuple[Optional[float], ...]
    widest: float

    def partners(self, i: int) -> tuple[str, ...]:
        low, high, values, lows, highs = self.lows[i], self.highs[i], self.values, self.lows, self.highs
        if low is None or high is None:  # a figure has both ends of its band or neither
            return ()
        out = []
        for j in range(i - 1, -1, -1):  # above: larger figures
            v, lo, hi = values[j], lows[j], highs[j]
            if v is not None and v * (1 - self.widest) > high:
                break  # every figure further up is larger still: its band starts above this one's
            if lo is not None and hi is not None and hi >= low and high >= lo:
                out.append(j)
        for j in range(i + 1, len(values)):  # below: smaller figures
            v, lo, hi = values[j], lows[j], highs[j]
            if v is None or v * (1 + self.widest) < low:
                break
            if lo is not None and hi is not None and hi >= low and high >= lo:
                out.append(j)
        return tuple(self.names[j] for j in sorted(out))


def tie_groups(ranked: list[Candidate], objective: str, market: str) -> list[Candidate]:
    """Give the ranking its uncertainty bands, from which each candidate's ties are read. A tie is a
    flag ("measure these to decide"), never a reordering: the ranking stays by the objective's own
    expected value (a cheaper type does not jump a faster one under max_throughput, nor one with
    fewer samples per dollar a better one)."""
    metric_for = MODEL_METRICS.get(objective)
    if metric_for is None:
        return ranked
    metric = metric_for(market)
    # Priced and unpriced types are two runs, each in the metric's order (sort_key puts every
    # unpriced one last): each run gets bands of its own, and a priced type never ties with one
    # that cannot be bought in this market.
    split = len(ranked) - len(unpriced_in(market, ranked))
    for run in (ranked[:split], ranked[split:]):
        values = tuple(metric(c) for c in run)
        bands = Bands(names=tuple(c.instance_type for c in run), values=values,
                      lows=tuple(v * (1 - c.uncertainty) if v else None for c, v in zip(run, values)),
                      highs=tuple(v * (1 + c.uncertainty) if v else None for c, v in zip(run, values)),
                      widest=max((c.uncertainty for c in run), default=0.0))
        for i, c in enumerate(run):  # made by this call: set once, before anyone else sees them
            object.__setattr__(c, "_bands", bands)
            object.__setattr__(c, "_index", i)
    return ranked
