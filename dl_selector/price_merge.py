"""A live figure against the embedded one: a live on-demand or spot figure replaces the embedded
figure only if prices.implausible() finds nothing wrong with it; otherwise the embedded figure
stays and the Price's source says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .facts import Price
from .price_fetch import SPOT_PRODUCT, RegionQuotes
from .prices import implausible, spot_spread
from .spot_trust import against_history


@dataclass
class Merged:
    price: Optional[Price]
    on_demand: str  # live / kept / rejected
    spot: str
    rejected: str = ""  # why a live figure was refused, for the log


def merge_price(old: Optional[Price], name: str, q: RegionQuotes, azs: Optional[set[str]] = None) -> Merged:
    """The Price for (name, q.region) and what became of each live figure.

    A live figure replaces the embedded one only if prices.implausible() finds nothing wrong with
    it; otherwise the embedded figure stays and the source says why. None when there is neither."""
    od_live, od_status, od_why = _live_on_demand(name, q)
    ref = od_live if od_live is not None else (old.on_demand if old else None)
    spot_good, spot_status, spot_why, bad = _live_spot(name, q, azs, ref)
    rejected = "; ".join(w for s, w in ((od_status, od_why), (spot_status, spot_why)) if s == "rejected")
    if od_live is None and not spot_good and old is None:
        return Merged(None, od_status, spot_status, rejected)
    on_demand, as_of, source = _on_demand_fields(old, q, od_live, od_why)
    spot = _spot_fields(old, q, spot_good, spot_why, bad)
    # The embedded note describes the embedded figures; it stays while any of them does.
    note = old.note if old is not None and (od_live is None or not spot_good) else ""
    return Merged(Price(on_demand=on_demand, as_of=as_of, source=source, note=note, **spot),
                  od_status, spot_status, rejected)


def _live_on_demand(name: str, q: RegionQuotes) -> tuple[Optional[float], str, str]:
    """(the live on-demand figure or None, live/kept/rejected, why not live)."""
    if q.on_demand is None:
        return None, "kept", "Price List API unavailable"
    if name not in q.on_demand.prices:
        return None, "kept", (q.on_demand.unpriced.get(name)
                              or f"no Linux on-demand product for it in {q.region} in the Price List")
    v = q.on_demand.prices[name]
    why = implausible(v, kind="on-demand")
    if why:
        return None, "rejected", f"live {why}"
    return v, "live", ""


def _live_spot(name: str, q: RegionQuotes, azs: Optional[set[str]],
               ref: Optional[float]) -> tuple[dict[str, tuple[float, str]], str, str, list[str]]:
    """(the plausible quote and its timestamp per AZ, live/kept/rejected, why not live, each AZ's rejection);
    `ref` is the on-demand figure a spot quote is judged against."""
    if q.spot is None:
        return {}, "kept", "spot price history unavailable", []
    quotes = q.spot.get(name, {})
    if azs is not None:
        quotes = {az: v for az, v in quotes.items() if az in azs}
    if not quotes:
        return {}, "kept", "no spot quote" + (f" in {', '.join(sorted(azs))}" if azs is not None else f" in {q.region}"), []
    good: dict[str, tuple[float, str]] = {}
    bad: list[str] = []
    for az, (price, ts) in sorted(quotes.items()):
        why = implausible(price, ref)
        if why:
            bad.append(f"{az}: {why}")
        else:
            good[az] = (price, ts)
    if good:
        return good, "live", "", bad
    why = "live " + bad[0].split(": ", 1)[1] + (f" (and in {len(bad) - 1} more AZs)" if len(bad) > 1 else "")
    return good, "rejected", why, bad


def _on_demand_fields(old: Optional[Price], q: RegionQuotes, od_live: Optional[float],
                      od_why: str) -> tuple[Optional[float], str, str]:
    """(on_demand, as_of, source) of the merged Price: the live figure, else the embedded one."""
    if od_live is not None:
        assert q.on_demand is not None  # a live figure came from it
        pub = f"; offer published {q.on_demand.publication}" if q.on_demand.publication else ""
        return od_live, q.on_demand_as_of, f"AWS Price List API GetProducts ({q.region}, Linux, shared tenancy, on-demand{pub})"
    if old is not None and old.on_demand is not None:
        return old.on_demand, old.as_of, f"embedded figure kept ({od_why}): {old.source}"
    return (None, old.as_of if old else q.spot_as_of,
            f"no on-demand figure ({od_why})" + (f"; {old.source}" if old and old.source else ""))


def _spot_fields(old: Optional[Price], q: RegionQuotes, good: dict[str, tuple[float, str]], why: str,
                 bad: list[str]) -> dict[str, Any]:
    """The merged Price's spot fields: the median of the plausible live quotes, else the embedded ones."""
    if good:
        median, low, high, n = spot_spread(v for v, _ts in good.values())
        # The figure this one replaces is its history: a fall past SPOT_HISTORY_FRACTION is kept, flagged.
        return dict(spot=median, spot_min=low, spot_max=high, spot_azs=n, spot_as_of=q.spot_as_of,
                    spot_flag=against_history(median, old),
                    spot_quotes=tuple((az, v, ts) for az, (v, ts) in sorted(good.items())),
                    spot_source=(f"EC2 DescribeSpotPriceHistory ({SPOT_PRODUCT}): median of the latest quote in "
                                 f"{n} AZ(s) {', '.join(sorted(good))}"
                                 + (f"; rejected {'; '.join(bad)}" if bad else "")))
    if old is not None and old.spot is not None:
        return dict(spot=old.spot, spot_min=old.spot_min, spot_max=old.spot_max, spot_azs=old.spot_azs,
                    spot_as_of=old.spot_date, spot_flag=old.spot_flag,
                    spot_source=f"embedded figure kept ({why}): {old.spot_source or old.source}")
    return dict(spot=None, spot_min=None, spot_max=None, spot_azs=0, spot_as_of="",
                spot_source=f"no spot figure ({why})")
