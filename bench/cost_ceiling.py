"""The cost ceiling, profile by profile: the whole cluster's worst case per hour (every node on the
dearest option the job may launch on, in its market) against the pick's own cluster price.

Goal: ratio <= 1.0 with the default ceiling (the pick's own price). Side by side, the alternates
the app took before this change (same processes per node, architecture and SDK; the first four in
rank order, whatever their price), with their worst case where every one of them is priced.

Rows: every built-in profile with its default nodes and market; then the issue's example, the
multi-node profiles with instance_type=p4d.24xlarge pinned, on spot and on-demand, under both
interchange rules.
Pure Python over the embedded catalog: no AWS, no CDK.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dl_selector.profiles import builtin_profiles  # noqa: E402
from dl_selector.recommend import Candidate  # noqa: E402
from dl_stacks.selection import Selection, select  # noqa: E402
from dl_stacks.settings import from_context  # noqa: E402

MULTI_NODE = ("multi-node-training", "cost-efficient-multi-node")


def _in_market(c: Candidate, market: str) -> Optional[float]:
    return c.spot_price_per_hour if market == "spot" else c.price_per_hour


def before(sel: Selection, nodes: int) -> tuple[int, str]:
    """The rule the app used before: any candidate with the pick's processes per node,
    architecture and SDK, the first four, priced or not."""
    def key(f):
        return f.processes_per_node, f.architecture, f.sdk

    old = [c for c in sel.recommendation.candidates
           if c.instance_type != sel.pick.instance_type and key(c.facts) == key(sel.pick.facts)][:4]
    pick = _in_market(sel.pick, sel.market)
    if pick is None:
        return len(old), f"unknown (the pick has no {sel.market} price)"
    prices = [_in_market(c, sel.market) for c in old]
    known = [v for v in prices if v is not None]
    ratio = f"{max([pick, *known]) / pick:.2f}"
    unpriced = len(prices) - len(known)
    return len(old), f">= {ratio} ({unpriced} unpriced)" if unpriced else ratio


def row(label: str, ctx: dict) -> list[str]:
    s = from_context(ctx)
    sel = select(s)
    n = s.nodes
    w, alone = sel.worst_case(n), sel.pick_cost(n)
    old_count, old_ratio = before(sel, n)
    return [label, f"{n} x {sel.pick.instance_type}", s.market, f"${alone:,.2f}", f"${w.market:,.2f}",
            f"{w.market / alone:.2f}", f"{len(sel.alternates)} ({len(sel.rejected)} not taken)",
            f"{old_count}: {old_ratio}"]


def main() -> None:
    rows = [row(name, {"profile": name}) for name in sorted(builtin_profiles())]
    for name in MULTI_NODE:
        for market in ("spot", "on-demand"):
            for rule in ("same-accelerator", "same-count"):
                ctx = {"profile": name, "instance_type": "p4d.24xlarge", "market": market, "interchange": rule}
                rows.append(row(f"{name}, p4d.24xlarge pinned, {market}, {rule}", ctx))
    head = ["profile", "cluster", "market", "pick $/h", "worst case $/h", "ratio", "alternates",
            "before: alternates, ratio"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    worst = max(float(r[5]) for r in rows)
    print(f"\nmax ratio {worst:.2f} over {len(rows)} rows  [goal <= 1.0]")


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
