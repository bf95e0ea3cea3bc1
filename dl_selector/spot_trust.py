"""When a spot figure is set aside: one rule for every instance type and region (docs/selector.md,
"Spot quotes set aside"). A figure set aside is still shown, with the reason; under --spot its
type ranks as unpriced (ranking.ranked_price), after every type with a trusted spot price.

1. Against on-demand: a spot median below SUSPECT_SPOT_FRACTION of the type's on-demand price in
   the region, unless it is a current quote (SPOT_QUOTE_FRESH_DAYS). GPU spot in a market with
   capacity sits at 30-70% of on-demand; a median below a quarter is at least half the AZs quoting
   below it, which on a dated snapshot means a market that has since moved (issue 39: the
   snapshot's p5en is 14-36% below dated quotes of 2026-07/08 in three US regions) or a floor
   price AWS posts where nothing is sold. AZ count does not exempt a figure: one AZ or six.
2. Against its own history: a new figure below SPOT_HISTORY_FRACTION of the previous dated figure
   for the same type and region (the embedded one, when `catalog refresh --prices` or `--live`
   fetches a new one). Checked when the figures are merged (price_merge) and recorded in
   Price.spot_flag, since the previous figure is gone once replaced; it holds even for a current
   quote, because a halving overnight is more often a placeholder than a market.

Only the stdlib and freshness are imported: recommend calls this for every candidate.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional

from . import freshness

if TYPE_CHECKING:
    from .facts import Price

SUSPECT_SPOT_FRACTION = 0.25
SPOT_HISTORY_FRACTION = 0.5
SPOT_QUOTE_FRESH_DAYS = 2


def current(as_of: str) -> bool:
    """A quote from today's market (a live fetch), not a snapshot's."""
    days = freshness.age_days(as_of)
    return days is not None and days <= SPOT_QUOTE_FRESH_DAYS


def _where(price: "Price") -> str:
    if price.spot_azs == 1:
        return "one AZ's quote"
    if price.spot_azs > 1:
        return f"median of {price.spot_azs} AZs"
    return "AZ count not recorded"


def set_aside(price: Optional["Price"], on_demand: Optional[float]) -> str:
    """Why this region's spot figure must not decide a ranking, or "" when it may.
    `on_demand` is the on-demand price the ranking holds for the type (a measured one wins)."""
    if price is None or price.spot is None:
        return ""
    if price.spot_flag:
        return price.spot_flag
    if not on_demand or current(price.spot_as_of):
        return ""
    share = price.spot / on_demand
    if share >= SUSPECT_SPOT_FRACTION:
        return ""
    return (f"spot ${price.spot:.2f}/h ({_where(price)}, {price.spot_as_of or 'undated'}) is {share:.0%} of "
            f"on-demand ${on_demand:.2f}/h, below the {SUSPECT_SPOT_FRACTION:.0%} this ranking trusts without a "
            "current quote")


def against_history(new: float, previous: Optional["Price"]) -> str:
    """Why a new spot median is suspect against the previous dated figure, or ""."""
    if previous is None or previous.spot is None or not previous.spot_date or previous.spot_date == "unknown":
        return ""
    if new >= SPOT_HISTORY_FRACTION * previous.spot:
        return ""
    return (f"spot ${new:.2f}/h is {new / previous.spot:.0%} of its previous figure ${previous.spot:.2f}/h "
            f"({previous.spot_date}), below the {SPOT_HISTORY_FRACTION:.0%} a market moves between snapshots")
