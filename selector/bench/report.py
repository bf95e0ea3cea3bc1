"""`bench report`: collected results ranked by measured samples per dollar, as a table, a PNG chart
and a Markdown report, with the places where the model was wrong.

Where measurement and model disagree: a benchmark's samples are its own (images, sequences,
your batches), while the model counts in the profile's reference units, so comparing absolute
figures would flag everything or nothing. With two or more measured candidates the report takes
the median measured/model ratio as the benchmark's scale and flags a candidate whose own ratio
is more than DISAGREE off that scale: the model had its *relative* speed wrong, which is what
decides a ranking. With one measured candidate only the absolute ratio exists, and it is shown
without a flag.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UserError
from ..validate import clean, parse_json, read_text
from .contract import COLLECTED_VERSION, Plan

# Just outside the model's usual bands (±15% measured rows to ±30% derived ones,
# selector/data/accelerators.md): a miss beyond it is the model being wrong, not noise.
DISAGREE = 0.25


@dataclass(frozen=True)
class Row:
    instance_type: str
    accelerators: str
    model_sps: float
    uncertainty: float
    on_demand: Optional[float]
    spot: Optional[float]
    measured_sps: Optional[float] = None
    spread: float = 0.0
    windows: int = 0
    reason: str = ""  # why it failed
    relative: Optional[float] = None  # measured/model over the benchmark's scale (1.0 = as modelled)

    def price(self, market: str) -> Optional[float]:
        return self.spot if market == "spot" else self.on_demand

    def per_dollar(self, market: str) -> Optional[float]:
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
    ranked: tuple[Row, ...]  # measured, best samples per dollar first
    failed: tuple[Row, ...]
    scale: Optional[float]  # the median measured/model ratio

    @property
    def market(self) -> str:
        return self.plan.rank_market

    @property
    def winner(self) -> Optional[Row]:
        return self.ranked[0] if self.ranked else None


def load_results(path: str) -> dict[str, Any]:
    """The file `bench collect` wrote, checked; UserError naming the file and key otherwise."""
    shown = clean(str(path))
    data = parse_json(read_text(path, "bench results"), path, "bench results")

    def bad(what: str) -> UserError:
        return UserError(f"bench results file {shown}: {what} (write it with 'python -m selector bench collect')")

    if not isinstance(data, dict):
        raise bad("expected a JSON object")
    if data.get("version") != COLLECTED_VERSION:
        raise bad(f"version must be {COLLECTED_VERSION}, got {clean(repr(data.get('version')))[:20]}")
    try:
        plan = Plan.from_dict(data.get("plan"))
    except ValueError as e:
        raise bad(f"plan: {clean(str(e))}") from None
    names = {c.instance_type for c in plan.candidates}
    seen: set[str] = set()
    for key in ("measurements", "failed"):
        rows = data.get(key)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise bad(f"{key} must be a list of objects")
        for i, r in enumerate(rows, 1):
            name = r.get("instance_type")
            if name not in names:
                raise bad(f"{key}[{i}].instance_type {clean(repr(name))[:60]} is not in the plan")
            if name in seen:
                raise bad(f"{name} is listed twice")
            seen.add(name)
            if key == "measurements":
                for num in ("samples_per_second", "min", "max"):
                    v = r.get(num)
                    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                        raise bad(f"measurements[{i}].{num} must be a number above 0, got {clean(repr(v))[:30]}")
    missing = sorted(names - seen)
    if missing:
        raise bad(f"{missing[0]} is in the plan but neither measured nor failed")
    return data


def build_report(data: dict[str, Any]) -> Report:
    plan = Plan.from_dict(data["plan"])
    measured = {m["instance_type"]: m for m in data["measurements"]}
    failed = {f["instance_type"]: str(f.get("reason", "")) for f in data["failed"]}
    ratios = [measured[c.instance_type]["samples_per_second"] / c.modelled_samples_per_second
              for c in plan.candidates if c.instance_type in measured and c.modelled_samples_per_second > 0]
    scale = statistics.median(ratios) if ratios else None
    rows = []
    for c in plan.candidates:
        base = dict(instance_type=c.instance_type, accelerators=c.accelerators, model_sps=c.modelled_samples_per_second,
                    uncertainty=c.uncertainty, on_demand=c.on_demand_per_hour, spot=c.spot_per_hour)
        m = measured.get(c.instance_type)
        if m is None:
            rows.append(Row(**base, reason=failed.get(c.instance_type, "")))
            continue
        rel = None
        if len(ratios) >= 2 and c.modelled_samples_per_second > 0:
            rel = m["samples_per_second"] / c.modelled_samples_per_second / scale
        rows.append(Row(**base, measured_sps=m["samples_per_second"], spread=float(m.get("spread", 0.0)),
                        windows=int(m.get("windows", 0)), relative=rel))
    market = plan.rank_market
    ok = [r for r in rows if r.measured_sps]
    # No price in the ranked market ranks after every priced one, never as free.
    ok.sort(key=lambda r: (r.per_dollar(market) is None, -(r.per_dollar(market) or 0), -r.measured_sps))
    return Report(plan, str(data.get("collected", "")), str(data.get("source", "")), tuple(ok),
                  tuple(r for r in rows if not r.measured_sps), scale)


def _money(v: Optional[float]) -> str:
    return f"{v:,.3f}" if v is not None else "-"


def _per_dollar_text(v: Optional[float]) -> str:
    return f"{v:,.0f}" if v is not None else "-"


def _table_rows(report: Report) -> list[tuple[str, ...]]:
    m = report.market
    rows = [("rank", "type", "accelerators", "measured samples/s", "model", "vs model", f"$/h {m}", f"samples/$ {m}",
             "note")]
    for i, r in enumerate(report.ranked, 1):
        note = (f"model {'over' if r.relative < 1 else 'under'}rates it by {abs(r.relative - 1):.0%}"
                if r.disagrees else "")
        rows.append((str(i), r.instance_type, r.accelerators, f"{r.measured_sps:,.1f} ±{r.spread / 2:.1%}",
                     f"{r.model_sps:,.0f} ±{r.uncertainty:.0%}", f"{r.relative:.2f}x" if r.relative else "-",
                     _money(r.price(m)), _per_dollar_text(r.per_dollar(m)), note))
    for r in report.failed:
        rows.append(("-", r.instance_type, r.accelerators, "FAILED", f"{r.model_sps:,.0f} ±{r.uncertainty:.0%}", "-",
                     _money(r.price(m)), "-", r.reason[:90]))
    return rows


def table_text(report: Report) -> str:
    rows = _table_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    numeric = {3, 4, 5, 6, 7}
    lines = []
    for k, r in enumerate(rows):
        cells = [v.rjust(w) if i in numeric else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells + [r[-1]]).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    p = report.plan
    lines.append(_winner_line(report))
    lines.append(f"plan {p.name}: profile {p.profile}, {p.region}, measured on {p.market}, collected {report.collected}; "
                 f"'vs model': measured/model over the benchmark's scale "
                 f"({report.scale:.3g} of its samples per modelled sample)" if report.scale else
                 f"plan {p.name}: profile {p.profile}, {p.region}, collected {report.collected}")
    return "\n".join(lines)


def _winner_line(report: Report) -> str:
    w = report.winner
    if w is None:
        return "no candidate was measured: see the reasons above"
    m = report.market
    text = f"winner: {w.instance_type}, {_per_dollar_text(w.per_dollar(m))} samples per dollar on {m}"
    if len(report.ranked) > 1:
        second = report.ranked[1]
        a, b = w.per_dollar(m), second.per_dollar(m)
        if a and b:
            text += f" ({a / b - 1:.1%} more than {second.instance_type}"
            # Closer than the windows moved: the measurement cannot order them either.
            if a / b - 1 <= max(w.spread, second.spread):
                text += ": within the windows' spread, a tie; decide on what else matters (memory, capacity)"
            text += ")"
    return text


def report_json(report: Report) -> dict[str, Any]:
    m = report.market

    def row(r: Row) -> dict[str, Any]:
        return {"instance_type": r.instance_type, "accelerators": r.accelerators,
                "measured_samples_per_second": r.measured_sps, "spread": r.spread, "windows": r.windows,
                "model_samples_per_second": r.model_sps, "model_uncertainty": r.uncertainty,
                "vs_model": None if r.relative is None else round(r.relative, 4), "disagrees": r.disagrees,
                "on_demand_per_hour": r.on_demand, "spot_per_hour": r.spot,
                "samples_per_dollar": None if r.per_dollar(m) is None else round(r.per_dollar(m), 1),
                "reason": r.reason or None}
    return {"plan": report.plan.name, "profile": report.plan.profile, "region": report.plan.region, "market": m,
            "collected": report.collected, "source": report.source, "scale": report.scale,
            "winner": report.winner.instance_type if report.winner else None,
            "ranked": [row(r) for r in report.ranked], "failed": [row(r) for r in report.failed],
            "disagree_threshold": DISAGREE}


def markdown(report: Report, chart_path: Optional[str] = None) -> str:
    p = report.plan
    out = [f"# Measured selection: {p.profile} in {p.region}", "",
           f"- plan `{p.name}`, {len(p.candidates)} candidates, each on one {p.market} instance for at most "
           f"{p.minutes} min (catalog {p.catalog_as_of}, planned {p.created}, collected {report.collected})",
           f"- command: `{p.command}`", f"- results: {report.source}",
           f"- ranked by measured samples per dollar at {p.rank_market} prices on record", ""]
    if chart_path:
        out += [f"![samples/s against $/hour]({chart_path})", ""]
    rows = _table_rows(report)
    out.append("| " + " | ".join(rows[0]) + " |")
    out.append("|" + "---|" * len(rows[0]))
    for r in rows[1:]:
        out.append("| " + " | ".join(v.replace("|", "\\|") for v in r) + " |")
    out += ["", "## Decision", "", _winner_line(report) + "."]
    off = [r for r in report.ranked if r.disagrees]
    out += ["", "## Where the model was wrong", ""]
    if report.scale is None or sum(1 for r in report.ranked if r.relative is not None) < 2:
        out.append("Fewer than two candidates were measured: no relative comparison with the model.")
    elif not off:
        out.append(f"Every measured candidate is within {DISAGREE:.0%} of the model's relative speed.")
    for r in off:
        out.append(f"- **{r.instance_type}**: measured {r.measured_sps:,.1f} samples/s, {r.relative:.2f}x what the "
                   f"model's relative speed predicts (model ±{r.uncertainty:.0%}). Trust the measurement for this "
                   "workload; the model would rank it " + ("too high." if r.relative < 1 else "too low."))
    if report.failed:
        out += ["", "## Not measured", ""]
        out += [f"- **{r.instance_type}**: {r.reason}" for r in report.failed]
    return "\n".join(out) + "\n"


def chart_figure(report: Report):
    """The chart as a matplotlib Figure: x $/hour, y samples/s, both log; measured filled, modelled
    hollow (scaled into the benchmark's units), on-demand circles and spot triangles, lines of equal
    samples per dollar, the winner labelled."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError:
        raise UserError("bench report --out needs matplotlib: pip install 'dl-launcher[bench]'") from None
    fig = Figure(figsize=(9, 6), dpi=100)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    colours = matplotlib.colormaps["tab10"]
    scale = report.scale or 1.0
    xs, ys = [], []
    rows = list(report.ranked) + list(report.failed)
    for i, r in enumerate(rows):
        colour = colours(i % 10)
        model_y = r.model_sps * scale
        price = r.price(report.market) or r.on_demand or r.spot
        if price:
            ax.scatter([price], [model_y], s=70, facecolors="none", edgecolors=[colour], linewidths=1.5,
                       marker="o" if report.market == "on-demand" else "^", zorder=3, gid=f"model:{r.instance_type}")
            xs.append(price)
            ys.append(model_y)
        if r.measured_sps:
            for market, marker in (("on-demand", "o"), ("spot", "^")):
                p = r.price(market)
                if p:
                    ax.scatter([p], [r.measured_sps], s=70, color=colour, marker=marker, zorder=4,
                               gid=f"measured-{market}:{r.instance_type}")
                    xs.append(p)
                    ys.append(r.measured_sps)
            if price:
                ax.plot([price, price], [model_y, r.measured_sps], color=colour, linewidth=0.8, alpha=0.6)
            ax.annotate(r.instance_type, (r.price(report.market) or price, r.measured_sps), textcoords="offset points",
                        xytext=(6, 4), fontsize=8, color=colour)
        elif price:
            ax.annotate(f"{r.instance_type} (failed)", (price, model_y), textcoords="offset points", xytext=(6, -10),
                        fontsize=8, color=colour)
    if xs:
        _iso_lines(ax, xs, ys)
    w = report.winner
    if w and w.price(report.market):
        ax.annotate(f"winner: {w.instance_type}", (w.price(report.market), w.measured_sps), textcoords="offset points",
                    xytext=(-20, 18), fontsize=10, fontweight="bold", arrowprops={"arrowstyle": "->"})
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"${v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if f"{v:g}"[0] in "25" else ""))
    ax.tick_params(which="minor", labelsize=7)
    ax.set_xlabel("$ per hour (on-demand / spot)")
    ax.set_ylabel("samples per second (measured / modelled)")
    ax.set_title(f"plan {report.plan.name}: {report.plan.profile} in {report.plan.region}, ranked on {report.market} "
                 "samples per dollar", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    legend = [Line2D([], [], marker="o", linestyle="", color="grey", label="measured, on-demand price"),
              Line2D([], [], marker="^", linestyle="", color="grey", label="measured, spot price"),
              Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="grey",
                     label="modelled (scaled to the benchmark's units)"),
              Line2D([], [], linestyle="--", color="lightgrey", label="equal samples per dollar")]
    ax.legend(handles=legend, loc="upper left", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig


def _iso_lines(ax, xs: list[float], ys: list[float]) -> None:
    """Dashed lines of constant samples per dollar (y = k x / 3600: slope 1 on log axes), at 1-2-5
    steps spanning the points, each labelled where it leaves the plot."""
    lo_x, hi_x = min(xs) / 1.6, max(xs) * 1.6
    lo_y, hi_y = min(ys) / 1.6, max(ys) * 1.6
    ax.set_xlim(lo_x, hi_x)
    ax.set_ylim(lo_y, hi_y)
    per_dollar = [y * 3600 / x for x, y in zip(xs, ys)]
    lo_k, hi_k = lo_y * 3600 / hi_x, hi_y * 3600 / lo_x  # the lines that cross the plot at all
    steps = [m * 10 ** e for e in range(math.floor(math.log10(lo_k)), math.ceil(math.log10(hi_k)) + 1)
             for m in (1, 2, 5) if lo_k < m * 10 ** e < hi_k]
    if len(steps) > 8:  # keep it readable: the ones nearest the data
        mid = statistics.median(per_dollar)
        steps = sorted(sorted(steps, key=lambda k: abs(math.log(k / mid)))[:8])
    for k in steps:
        ax.plot([lo_x, hi_x], [k * lo_x / 3600, k * hi_x / 3600], linestyle="--", color="lightgrey", linewidth=0.8,
                zorder=1)
        x_end = min(hi_x, hi_y * 3600 / k)  # where it leaves through the right edge or the top
        ax.text(x_end / 1.05, k * x_end / 1.05 / 3600, f"{_si(k)}/$", fontsize=7, color="grey", ha="right",
                va="bottom", rotation=0)


def _si(k: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if k >= div:
            return f"{k / div:g}{suffix}"
    return f"{k:g}"


def write_chart(report: Report, path: str) -> None:
    fig = chart_figure(report)
    try:
        fig.savefig(path, format="png", metadata={"Software": None})  # no version stamp: same input, same bytes
    except OSError as e:
        raise UserError(f"cannot write {clean(path)}: {e.strerror or e}") from None
