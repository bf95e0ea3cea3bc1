"""The price before the spend: a training stack whose worst case per hour is above a threshold
synthesizes only with an approval that names at least that figure.

- `approve_hourly`: USD per hour the deployer accepts for the whole stack; it must be at or above
  the stack's worst case (every node on the dearest option it may launch, in its market, plus the
  rest of the stack). Given below it, or left out above the threshold: one line naming the exact
  `-c approve_hourly=` to add, exit 2, nothing synthesized.
- `approval_threshold`: USD per hour of worst case above which an approval is needed. Default
  $10/h: about $240 a day, what one forgotten weekend costs at most ($640) stays below the price
  of a single hour of the dearest multi-node stacks; the cheapest stacks that prove every part of
  the path (one dev-prototyping node, or two on spot with EFA) stay under it and ask nothing,
  while every P-family multi-node stack (p3dn and up, $62/h and more in the worst case) asks.

Not asked: `-c local=true` deploys into moto on this machine (AWS_ENDPOINT_URL on 127.0.0.0/8 or
localhost): nothing there is billed, and the demo and the tests deploy the README's
multi-node-training stack that way. `-c local=true` towards a real endpoint is asked like any
deploy. The Service Catalog portfolio (`-c portfolio=`) is not a training stack: publishing it
launches nothing, and each product's launch is held by the portfolio's own constraints.

The app cannot tell `cdk synth` from `cdk deploy` (the CDK CLI does not say), so a plain synth of
such a stack needs the approval too; `dl-launcher launch` shows the plan, asks, and deploys with
the approval it showed.
"""
from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional
from urllib.parse import urlparse

from dl_selector.errors import UserError

from .context_values import number, show

if TYPE_CHECKING:
    from .training_stack import TrainingStack

KEYS = ("approve_hourly", "approval_threshold")
NUMBER_KEYS = KEYS
EXAMPLES = {"approve_hourly": "290", "approval_threshold": "10"}
THRESHOLD = 10.0  # USD per hour of worst case (see above)
LIMIT = 1_000_000.0  # above 64 nodes x any price on record: a larger figure is a typo


@dataclass(frozen=True)
class ApprovalSettings:
    approve_hourly: Optional[float] = None
    threshold: float = THRESHOLD


def approval_from_context(ctx: Mapping[str, Any]) -> ApprovalSettings:
    """Keys already passed the shared type and text checks (settings.py)."""
    return ApprovalSettings(approve_hourly=_usd("approve_hourly", ctx["approve_hourly"]) if "approve_hourly" in ctx else None,
                            threshold=_usd("approval_threshold", ctx.get("approval_threshold", THRESHOLD), zero=True))


def _usd(key: str, value: Any, zero: bool = False) -> float:
    x = number(value)
    allowed = f"USD per hour, {'0' if zero else 'above 0'} to {LIMIT:,.0f}"
    if x is None or not math.isfinite(x):
        near = str(value).strip().lstrip("$").replace(",", "")
        hint = f"; closest: {near}" if number(near) is not None and math.isfinite(number(near)) else f"; e.g. {key}={EXAMPLES[key]}"
        raise UserError(f"context {key}={show(value)}: expected {allowed} (a plain decimal number){hint}")
    if x < 0 or (x == 0 and not zero) or x > LIMIT:
        raise UserError(f"context {key}={show(value)}: allowed {allowed}; closest: {min(max(x, 0.01), LIMIT):g}")
    return x


def money(v: Optional[float], unit: str = "/h") -> str:
    return "unknown" if v is None else f"${v:,.2f}{unit}"


def round_up(v: float) -> float:
    """To the cent above, so that the figure shown is never below the worst case."""
    return math.ceil(round(v * 100, 6)) / 100


@dataclass(frozen=True)
class Plan:
    """What a deploy would run and cost, per hour, before anything is spent."""

    job: str
    region: str
    nodes: int
    market: str
    types: tuple[str, ...]  # the pick, then the alternates the whole cluster may move to
    expected: Optional[float]  # the pick on every node, at its quote in the market, plus the rest
    worst: float  # every node on the dearest option at the most its market charges, plus the rest
    worst_basis: str
    other: float  # the rest of the stack (NAT, addresses, volumes, metrics, alarms...)
    threshold: float
    local: bool  # into moto: nothing is billed

    @property
    def needs_approval(self) -> bool:
        return not self.local and self.worst > self.threshold

    @property
    def approval(self) -> str:
        """The value of -c approve_hourly that approves this stack."""
        return f"{round_up(self.worst):.2f}"

    def head(self) -> str:
        pick = self.types[0]
        more = f" (or the whole cluster on {', '.join(self.types[1:])})" if len(self.types) > 1 else ""
        return f"{self.nodes} x {pick}{more}, {self.market}, in {self.region}"

    def lines(self) -> list[str]:
        expected = ("unknown (no quote on record)" if self.expected is None else
                    f"{money(self.expected)} ({money(self.expected * 24, '/day')})")
        out = [f"plan for job {self.job}: {self.head()}",
               f"  expected: {expected}",
               f"  worst case: {money(self.worst)} ({money(self.worst * 24, '/day')}): {self.worst_basis}",
               f"  the rest of the stack, in both: {money(self.other)}"]
        out.append(f"  {self.approval_line()}")
        return out


    def approval_line(self, approved: Optional[float] = None) -> str:
        if self.local:
            return "approval: not needed (-c local=true into moto on this machine: nothing is billed)"
        if approved is not None:
            return f"approval: worst case {money(self.worst)} approved up to {money(approved)} by -c approve_hourly"
        if self.needs_approval:
            return (f"approval: needed (worst case above the {money(self.threshold)} threshold): "
                    f"-c approve_hourly={self.approval}")
        return f"approval: not needed (worst case at or under the {money(self.threshold)} threshold)"


def plan_for(stack: "TrainingStack") -> Plan:
    settings, selection, cost = stack.settings, stack.selection, stack.cost
    n = settings.nodes
    worst_instances = cost.worst_instances
    if worst_instances is None:  # an option without a price: the documented bound, nodes x ceiling
        worst_instances = n * selection.ceiling
    dearest = max(selection.prices.values(), key=lambda o: o.in_market or 0.0)
    if selection.market == "spot":
        cap = "max_price" if settings.max_price is not None else "the on-demand price, EC2's default"
        basis = f"every node at the spot max price {money(selection.ceiling)} ({cap}), which spot never exceeds"
    else:
        basis = f"every node on {dearest.instance_type} at {money(dearest.in_market)} {selection.market}, the dearest option"
    quoted = selection.pick_cost(n)
    return Plan(job=settings.job, region=settings.region, nodes=n, market=selection.market,
                types=tuple(c.instance_type for c in selection.options),
                expected=None if quoted is None else quoted + cost.other_per_hour,
                worst=worst_instances + cost.other_per_hour, worst_basis=basis, other=cost.other_per_hour,
                threshold=settings.approval.threshold, local=settings.local and local_endpoint())


def local_endpoint(env: Mapping[str, str] = os.environ) -> bool:
    """AWS_ENDPOINT_URL names this machine (moto_server): nothing deployed there is billed."""
    url = env.get("AWS_ENDPOINT_URL", "").strip()
    host = urlparse(url).hostname if url else None
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check(plan: Plan, approved: Optional[float]) -> None:
    """One line and no synth when the plan needs an approval it does not have."""
    if approved is not None and not plan.local and approved < round_up(plan.worst) - 1e-9:
        raise UserError(f"context approve_hourly={approved:g} is below this stack's worst case {money(plan.worst)} "
                        f"({plan.head()}; {plan.worst_basis}); to deploy it: -c approve_hourly={plan.approval}")
    if approved is None and plan.needs_approval:
        expected = "" if plan.expected is None else f", expected {money(plan.expected)}"
        raise UserError(f"{plan.head()} can cost up to {money(plan.worst)} ({money(plan.worst * 24, '/day')}"
                        f"{expected}), above the {money(plan.threshold)} that needs an approval: add "
                        f"-c approve_hourly={plan.approval} to deploy it, or run dl-launcher launch to see the plan "
                        "and be asked")
