"""`bench report`: collected results ranked by measured samples per dollar, as a table, a PNG chart
and a Markdown report, with the places where the model was wrong.

Where measurement and model disagree: a benchmark's samples are its own (images, sequences,
your batches), while the model counts in the profile's reference units, so comparing absolute
figures would flag everything or nothing. With two or more measured candidates the report takes
the median measured/model ratio as the benchmark's scale and flags a candidate whose own ratio
is more than DISAGREE off that scale: the model had its *relative* speed wrong, which is what
decides a ranking. With one measured candidate only the absolute ratio exists, and it is shown
without a flag.

Pure functions: the CLI (bench/cli.py) parses arguments and writes the files. The chart is
chart.py (matplotlib, imported only to draw), the results file's checks results.py; the table
and the Markdown need nothing beyond the stdlib.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..validate import clean
from .contract import MARKETS, Plan
from .results import load_results as load_results  # `bench report` reads its file with it

# Just outside the model's usual bands (±15% measured rows to ±30% derived ones,
# dl_selector/data/accelerators.md): a miss beyond it is the model being wrong, not noise.
DISAGREE = 0.25


@dataclass(frozen=True)
class Row:
    instance_type: str
    accelerators: str
    model_sps: float
    uncertainty: float
    on_demand: float | None
    spot: float | None
    measured_sps: float | None = None  # the median window
    measured_min: float | None = None
    measured_max: float | None = None
    spread: float = 0.0  # (max - min) / median
    windows: int = 0
    reason: str = ""  # why it failed
    ratio: float | None = None  # measured/model as written (the benchmark's units over the model's)
    relative: float | None = None  # ratio over the benchmark's scale (1.0 = as modelled)

    def price(self, market: str) -> float | None:
        return self.spot if market == "spot" else self.on_demand

    def per_dollar(self, market: str) -> float | None:
        p = self.price(market)
        return self.measured_sps * 3600 / p if self.measured_sps and p else None

    @property
    def disagrees(self) -> bool:
        return self.relative is not None and abs(self.relative - 1) > DISAGREE


@dataclass(frozen=True)
class Report:
    plan: Plan
    collected: str
    source: str
    ranked: tuple[Row, ...]  # measured, best samples per dollar in the plan's rank market first
    failed: tuple[Row, ...]  # in plan order, each with its reason
    scale: float | None  # the median measured/model ratio

    @property
    def market(self) -> str:
        return self.plan.rank_market

    @property
    def other_market(self) -> str:
        return next(m for m in MARKETS if m != self.market)

    @property
    def winner(self) -> Row | None:
        return self.ranked[0] if self.ranked else None

    def ranked_in(self, market: str) -> tuple[Row, ...]:
        return _rank(self.ranked, market)


# --- Reading and checking the file ----------------------------------------------------------------





# --- The report -----------------------------------------------------------------------------------


def build_report(data: dict[str, Any]) -> Report:
    """The Report of a file load_results has checked."""
    plan = Plan.from_dict(data["plan"])
    measured = {m["instance_type"]: m for m in data["measurements"]}
    failed = {f["instance_type"]: f["reason"] for f in data["failed"]}
    ratios = {c.instance_type: measured[c.instance_type]["samples_per_second"] / c.modelled_samples_per_second
              for c in plan.candidates if c.instance_type in measured and c.modelled_samples_per_second > 0}
    scale = statistics.median(ratios.values()) if ratios else None
    rows = []
    for c in plan.candidates:
        base = {"instance_type": c.instance_type, "accelerators": c.accelerators,
                "model_sps": float(c.modelled_samples_per_second), "uncertainty": float(c.uncertainty),
                "on_demand": c.on_demand_per_hour, "spot": c.spot_per_hour}
        m = measured.get(c.instance_type)
        if m is None:
            rows.append(Row(**base, reason=failed[c.instance_type].strip() or "no reason given"))
            continue
        ratio = ratios.get(c.instance_type)
        # One measured candidate is its own median: relative would always read 1.00x.
        rel = ratio / scale if ratio is not None and scale and len(ratios) >= 2 else None
        sps, lo, hi = (float(m[k]) for k in ("samples_per_second", "min", "max"))
        rows.append(Row(**base, measured_sps=sps, measured_min=lo, measured_max=hi, spread=(hi - lo) / sps,
                        windows=int(m.get("windows", 0)), ratio=ratio, relative=rel))
    ranked = _rank([r for r in rows if r.measured_sps], plan.rank_market)
    return Report(plan, str(data.get("collected", "")), str(data.get("source", "")), ranked,
                  tuple(r for r in rows if not r.measured_sps), scale)


def _rank(rows: Any, market: str) -> tuple[Row, ...]:
    # No price in the market ranks after every priced one, never as free; then faster, then by name.
    return tuple(sorted(rows, key=lambda r: (r.per_dollar(market) is None, -(r.per_dollar(market) or 0),
                                             -(r.measured_sps or 0), r.instance_type)))


# --- Text -----------------------------------------------------------------------------------------


def _money(v: float | None) -> str:
    return f"{v:,.3f}" if v is not None else "-"


def _count(v: float | None) -> str:
    return f"{v:,.0f}" if v is not None else "-"


def _measured_cell(r: Row) -> str:
    # ± half the windows' range: the figure moved that much either side while it was timed.
    return f"{r.measured_sps:,.1f} ±{r.spread / 2:.1%}"


def _note(r: Row) -> str:
    if r.disagrees:
        return f"model {'over' if r.relative < 1 else 'under'}rates it by {abs(r.relative - 1):.0%}"
    return ""


def _table_rows(report: Report) -> list[tuple[str, ...]]:
    m = report.market
    rows = [("rank", "type", "accelerators", "measured samples/s", "model samples/s", "vs model", f"$/h {m}",
             f"samples/$ {m}", "note")]
    for i, r in enumerate(report.ranked, 1):
        rows.append((str(i), clean(r.instance_type), clean(r.accelerators), _measured_cell(r),
                     f"{r.model_sps:,.0f} ±{r.uncertainty:.0%}", f"{r.relative:.2f}x" if r.relative else "-",
                     _money(r.price(m)), _count(r.per_dollar(m)), _note(r)))
    for r in report.failed:
        rows.append(("-", clean(r.instance_type), clean(r.accelerators), "FAILED",
                     f"{r.model_sps:,.0f} ±{r.uncertainty:.0%}", "-", _money(r.price(m)), "-",
                     _short(r.reason, 90)))
    return rows


def _short(text: str, n: int) -> str:
    text = clean(text)
    return text if len(text) <= n else text[:n - 3] + "..."


def is_measurement(report: Report) -> bool:
    """Results collected from a bench run's S3 prefix (`bench collect` writes it as the source);
    anything else (the docs' sample, a hand-made file) is not a measurement on record, and every
    title drawn from it says so."""
    return report.source.startswith("s3://")


def table_text(report: Report) -> str:
    """The ranking as a plain-text table (as the selector's other tables), a winner line and a footer."""
    rows = _table_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    numeric = {3, 4, 5, 6, 7}
    lines = []
    for k, r in enumerate(rows):
        cells = [v.rjust(w) if i in numeric else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))]
        lines.append("  ".join([*cells, r[-1]]).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(_winner_line(report))
    lines.extend(_footer(report))
    return "\n".join(lines)


def _footer(report: Report) -> list[str]:
    p = report.plan
    lines = [(f"plan {clean(p.name)}: profile {clean(p.profile)}, {clean(p.region)}, up to {p.minutes} min per "
              f"instance on {p.market}, planned {clean(p.created)}, collected {clean(report.collected)}; "
              "measured samples/s: median window ± half the windows' range")]
    if report.scale is not None and report.ranked and report.ranked[0].relative is not None:
        lines.append(f"vs model: measured/model over the median ratio ({report.scale:.3g} benchmark samples per "
                     f"modelled sample), so the units cancel; beyond ±{DISAGREE:.0%} the model had the type wrong")
    return lines


def _winner_line(report: Report) -> str:
    w = report.winner
    if w is None:
        return "no candidate was measured: see the reasons above"
    m = report.market
    if w.per_dollar(m) is None:
        return f"no measured candidate has a {m} price on record: no winner on {m} samples per dollar"
    text = f"winner: {clean(w.instance_type)}, {_count(w.per_dollar(m))} samples per dollar at {m} prices"
    second = report.ranked[1] if len(report.ranked) > 1 else None
    b = second.per_dollar(m) if second else None
    if b:
        lead = w.per_dollar(m) / b - 1
        text += f" ({lead:.1%} more than {clean(second.instance_type)}"
        # Closer than the windows moved: the measurement cannot order them either.
        if lead <= max(w.spread, second.spread):
            text += ": within the windows' spread, a tie; decide on what else matters, such as memory or capacity"
        text += ")"
    return text


def report_json(report: Report) -> dict[str, Any]:
    """Everything the table shows, as numbers (None where there is none: a failure is never a zero)."""
    m = report.market

    def per_dollar(r: Row, market: str) -> float | None:
        v = r.per_dollar(market)
        return None if v is None else round(v, 1)

    def row(r: Row, rank: int | None) -> dict[str, Any]:
        return {"rank": rank, "instance_type": r.instance_type, "accelerators": r.accelerators,
                "measured_samples_per_second": r.measured_sps, "measured_min": r.measured_min,
                "measured_max": r.measured_max, "spread": None if r.measured_sps is None else round(r.spread, 4),
                "windows": r.windows, "model_samples_per_second": r.model_sps, "model_uncertainty": r.uncertainty,
                "measured_over_model": None if r.ratio is None else round(r.ratio, 4),
                "vs_model": None if r.relative is None else round(r.relative, 4), "disagrees": r.disagrees,
                "on_demand_per_hour": r.on_demand, "spot_per_hour": r.spot,
                "samples_per_dollar": per_dollar(r, m), "on_demand_samples_per_dollar": per_dollar(r, "on-demand"),
                "spot_samples_per_dollar": per_dollar(r, "spot"), "reason": r.reason or None}

    return {"plan": report.plan.name, "profile": report.plan.profile, "region": report.plan.region, "market": m,
            "measured_on": report.plan.market, "collected": report.collected, "source": report.source,
            "scale": report.scale, "winner": report.winner.instance_type if report.winner else None,
            "ranked": [row(r, i) for i, r in enumerate(report.ranked, 1)],
            "failed": [row(r, None) for r in report.failed], "disagree_threshold": DISAGREE}


def markdown(report: Report, chart_path: str | None = None) -> str:
    """A report to paste into a design review: what was measured, the ranking, the decision and
    why, where the model was wrong, what could not be measured, and the chart if one was drawn."""
    p = report.plan
    title = "Measured selection" if is_measurement(report) else "Illustration (not measured)"
    out = [f"# {title}: {p.profile} in {p.region}", "", "## What was measured", "",
           (f"- plan `{p.name}`: {len(p.candidates)} candidates, each on one {p.market} instance for at most "
            f"{p.minutes} min (catalog {p.catalog_as_of}, planned {p.created}, collected {report.collected})"),
           f"- command: `{p.command}`", f"- results: {report.source}",
           f"- ranked by measured samples per dollar at {p.rank_market} prices on record", ""]
    if chart_path:
        out += [f"![samples/s against $/hour]({chart_path})", ""]
    out += ["## Ranking", "", *_markdown_table(_table_rows(report)), ""]
    out += ["## Decision", "", *_decision(report)]
    out += ["", "## Where the model was wrong", "", *_disagreements(report)]
    if report.failed:
        out += ["", "## Not measured", ""]
        out += [f"- **{r.instance_type}**: {clean(r.reason)}"
                for r in report.failed]
    return "\n".join(out) + "\n"


def _markdown_table(rows: list[tuple[str, ...]]) -> list[str]:
    def cells(r: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in r) + " |"
    return [cells(rows[0]), "|" + "---|" * len(rows[0]), *(cells(r) for r in rows[1:])]


def _decision(report: Report) -> list[str]:
    out = [_winner_line(report) + "."]
    other = report.other_market
    ranked_other = report.ranked_in(other)
    w = report.winner
    if w and ranked_other and ranked_other[0].per_dollar(other) is not None:
        o = ranked_other[0]
        if o is w:
            out.append(f"It also wins at {other} prices ({_count(w.per_dollar(other))} samples per dollar).")
        else:
            out.append(f"At {other} prices {o.instance_type} would win instead ({_count(o.per_dollar(other))} "
                       f"samples per dollar against {_count(w.per_dollar(other))}).")
    return out


def _disagreements(report: Report) -> list[str]:
    if sum(1 for r in report.ranked if r.relative is not None) < 2:
        return ["Fewer than two candidates were measured: no relative comparison with the model."]
    off = [r for r in report.ranked if r.disagrees]
    if not off:
        return [f"Every measured candidate is within {DISAGREE:.0%} of the model's relative speed."]
    return [f"- **{r.instance_type}**: measured {r.measured_sps:,.1f} samples/s, {r.relative:.2f}x what the "
            f"model's relative speed predicts (model ±{r.uncertainty:.0%}). Trust the measurement for this "
            "workload; the model would rank it " + ("too high." if r.relative < 1 else "too low.")
            for r in off]



































