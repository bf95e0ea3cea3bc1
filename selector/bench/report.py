"""`bench report`: collected results ranked by measured samples per dollar, as a table, a PNG chart
and a Markdown report, with the places where the model was wrong.

Where measurement and model disagree: a benchmark's samples are its own (images, sequences,
your batches), while the model counts in the profile's reference units, so comparing absolute
figures would flag everything or nothing. With two or more measured candidates the report takes
the median measured/model ratio as the benchmark's scale and flags a candidate whose own ratio
is more than DISAGREE off that scale: the model had its *relative* speed wrong, which is what
decides a ranking. With one measured candidate only the absolute ratio exists, and it is shown
without a flag.

Pure functions: the CLI (bench/cli.py) parses arguments and writes the files. matplotlib is
imported only to draw the chart, so the table and the Markdown need nothing beyond the stdlib.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..validate import clean, finite_number, parse_json, read_text
from .contract import COLLECTED_VERSION, MARKETS, Plan, PlannedCandidate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Just outside the model's usual bands (±15% measured rows to ±30% derived ones,
# selector/data/accelerators.md): a miss beyond it is the model being wrong, not noise.
DISAGREE = 0.25
# The chart's size: fixed, so that the same results give the same bytes (and the test knows the pixels).
FIGSIZE = (10.0, 6.5)
DPI = 110
# median rounded to 3 decimals by collect can sit a hair outside [min, max] when every window is equal.
_ROUNDING = 1e-3


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

def load_results(path: str) -> dict[str, Any]:
    """The file `bench collect` wrote, checked; a one-line UserError naming the file and key otherwise."""
    shown = clean(str(path))
    data = parse_json(read_text(path, "bench results"), path, "bench results")
    _Checker(f"bench results file {shown}").check(data)
    return data


class _Checker:
    """Each refusal names the file and the key (measurements[2].min), so a hand-edited or truncated
    file is fixed in one look."""

    def __init__(self, where: str) -> None:
        self.where = where

    def bad(self, what: str) -> UserError:
        return UserError(f"{self.where}: {what} (write it with 'python -m selector bench collect')")

    def number(self, value: Any, key: str, lo: float = 0, *, above: bool = False, hi: float | None = None,
               integer: bool = False) -> float:
        # finite_number takes "812.3" as CSV would; in JSON a quoted number is a mistake upstream.
        if isinstance(value, str):
            raise self.bad(f"{key} must be a number, got the string {clean(repr(value))[:40]}")
        return finite_number(value, f"{self.where}: {key}", lo, hi, above=above, integer=integer)

    def text(self, value: Any, key: str) -> None:
        if not isinstance(value, str):
            raise self.bad(f"{key} must be a string, got {clean(repr(value))[:40]}")

    def check(self, data: Any) -> None:
        if not isinstance(data, dict):
            raise self.bad("expected a JSON object")
        if data.get("version") != COLLECTED_VERSION:
            raise self.bad(f"version must be {COLLECTED_VERSION}, got {clean(repr(data.get('version')))[:20]}")
        for key in ("collected", "source"):
            if key in data:
                self.text(data[key], key)
        try:
            plan = Plan.from_dict(data.get("plan"))
        except ValueError as e:
            raise self.bad(f"plan: {clean(str(e))}") from None
        for i, c in enumerate(plan.candidates, 1):
            self.candidate(c, f"plan.candidates[{i}]")
        names = {c.instance_type for c in plan.candidates}
        seen: set[str] = set()
        for key in ("measurements", "failed"):
            rows = data.get(key)
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise self.bad(f"{key} must be a list of objects")
            for i, r in enumerate(rows, 1):
                name = r.get("instance_type")
                if not isinstance(name, str) or name not in names:
                    raise self.bad(f"{key}[{i}].instance_type {clean(repr(name))[:60]} is not in the plan")
                if name in seen:
                    raise self.bad(f"{key}[{i}].instance_type {name} is listed twice")
                seen.add(name)
                (self.measurement if key == "measurements" else self.failure)(r, f"{key}[{i}]")
        missing = [c.instance_type for c in plan.candidates if c.instance_type not in seen]
        if missing:
            raise self.bad(f"{missing[0]} is in the plan but neither in measurements nor in failed")

    def candidate(self, c: PlannedCandidate, key: str) -> None:
        self.text(c.accelerators, f"{key}.accelerators")
        self.number(c.modelled_samples_per_second, f"{key}.modelled_samples_per_second")
        self.number(c.uncertainty, f"{key}.uncertainty", hi=10)
        for name in ("on_demand_per_hour", "spot_per_hour"):
            if getattr(c, name) is not None:  # no price in that market: allowed, shown as "-"
                self.number(getattr(c, name), f"{key}.{name}", above=True)

    def measurement(self, r: dict[str, Any], key: str) -> None:
        sps, lo, hi = (self.number(r.get(k), f"{key}.{k}", above=True) for k in ("samples_per_second", "min", "max"))
        if not lo - _ROUNDING <= sps <= hi + _ROUNDING:
            raise self.bad(f"{key}.samples_per_second {sps:g} is outside min {lo:g} .. max {hi:g}")
        if "windows" in r:
            self.number(r["windows"], f"{key}.windows", 1, integer=True)
        if "spread" in r:
            self.number(r["spread"], f"{key}.spread")

    def failure(self, r: dict[str, Any], key: str) -> None:
        self.text(r.get("reason"), f"{key}.reason")


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


def _si(k: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if k >= div:
            return f"{k / div:.3g}{suffix}"
    return f"{k:.3g}"


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


# --- The chart ------------------------------------------------------------------------------------

_ON_DEMAND, _SPOT = "o", "^"


def chart_figure(report: Report) -> Figure:
    """The chart as a matplotlib Figure: x $/hour, y samples/s, both log; measured filled, modelled
    hollow (scaled into the benchmark's units), on-demand circles and spot triangles, lines of equal
    samples per dollar, the winner labelled. Each point's gid names what it is (model:<type>,
    measured-<market>:<type>) so that a test can count them."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("bench report --out needs matplotlib: pip install 'dl-launcher[bench]'") from None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)  # draws without pyplot or a display, whatever the user's backend
    # Fixed margins, not tight_layout: the line labels' angles are worked out from the final layout.
    fig.subplots_adjust(left=0.09, right=0.97, top=0.9, bottom=0.18)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    colours = matplotlib.colormaps["tab10"]
    palette = [colours(i % 10) for i in range(len(report.ranked) + len(report.failed))]
    points, segments = _plot_points(ax, report, palette)
    steps = []
    if points:
        _set_limits(ax, points)
        steps = _iso_lines(ax, points)
    _axes_text(ax, report)
    _legend(fig, report.market)
    renderer = fig.canvas.get_renderer()
    taken = _place_labels(ax, report, points, segments, palette, renderer)
    _iso_labels(ax, steps, taken, renderer)
    return fig


def _plot_points(ax: Axes, report: Report, colours: list) -> tuple[list[tuple[float, float]], list]:
    """Every point drawn, as (price, samples/s), and every line joining two, as a pair of points
    (labels keep off both)."""
    scale = report.scale or 1.0  # the model in the benchmark's units, so it sits next to its measurement
    model_marker = _SPOT if report.market == "spot" else _ON_DEMAND
    points, segments = [], []
    for r, colour in zip((*report.ranked, *report.failed), colours):
        price = _chart_price(r, report.market)
        model_y = r.model_sps * scale
        if price and model_y > 0:
            ax.scatter([price], [model_y], s=70, facecolors="none", edgecolors=[colour], linewidths=1.5,
                       marker=model_marker, zorder=3, gid=f"model:{r.instance_type}")
            points.append((price, model_y))
        if not r.measured_sps:
            continue
        prices = []
        for market, marker in (("on-demand", _ON_DEMAND), ("spot", _SPOT)):
            p = r.price(market)
            if p:
                ax.scatter([p], [r.measured_sps], s=70, color=colour, marker=marker, zorder=4,
                           gid=f"measured-{market}:{r.instance_type}")
                points.append((p, r.measured_sps))
                prices.append(p)
        if len(prices) == 2:  # the same throughput at two prices
            ax.plot(prices, [r.measured_sps] * 2, color=colour, linewidth=0.9, linestyle=":", alpha=0.7, zorder=2)
            segments.append(((prices[0], r.measured_sps), (prices[1], r.measured_sps)))
        if price and model_y > 0:
            ax.plot([price, price], [model_y, r.measured_sps], color=colour, linewidth=0.9, alpha=0.7, zorder=2)
            segments.append(((price, model_y), (price, r.measured_sps)))
    return points, segments


def _chart_price(r: Row, market: str) -> float | None:
    return r.price(market) or r.on_demand or r.spot


def _set_limits(ax: Axes, points: list[tuple[float, float]]) -> None:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.set_xlim(*_widen(min(xs) / 1.5, max(xs) * 2.2))  # room on the right for the last point's label
    ax.set_ylim(*_widen(min(ys) / 1.6, max(ys) * 1.8))


def _widen(lo: float, hi: float, span: float = 6.0) -> tuple[float, float]:
    """At least `span` times from end to end: a 1-2-5 tick sequence then labels two ticks or more."""
    if hi / lo >= span:
        return lo, hi
    grow = math.sqrt(span / (hi / lo))
    return lo / grow, hi * grow


def _iso_lines(ax: Axes, points: list[tuple[float, float]]) -> list[float]:
    """Dashed lines of constant samples per dollar (y = k x / 3600: slope 1 on log axes) at 1-2-5
    steps around the points; the values drawn, for _iso_labels once the points are labelled."""
    lo_x, hi_x = ax.get_xlim()
    per_dollar = sorted(y * 3600 / x for x, y in points)
    steps = [m * 10 ** e for e in range(math.floor(math.log10(per_dollar[0])) - 1,
                                        math.ceil(math.log10(per_dollar[-1])) + 1) for m in (1, 2, 5)]
    # The band the points span, one step wider either side: more lines are clutter.
    inside = [k for k in steps if per_dollar[0] / 2.5 <= k <= per_dollar[-1] * 2.5]
    inside = inside[::2] if len(inside) > 6 else inside
    if not inside:
        inside = [min(steps, key=lambda k: abs(math.log(k / statistics.median(per_dollar))))]
    for k in inside:
        ax.plot([lo_x, hi_x], [k * lo_x / 3600, k * hi_x / 3600], linestyle="--", color="#bbbbbb", linewidth=0.8,
                zorder=1, gid=f"iso:{k:g}")
    return inside


def _iso_labels(ax: Axes, steps: list[float], taken: list, renderer: Any) -> None:
    """Each line's value written along it, at the first place (from the top right down) that
    covers no point or point label."""
    lo_x, hi_x = (math.log(v) for v in ax.get_xlim())
    lo_y, hi_y = (math.log(v) for v in ax.get_ylim())
    for k in steps:
        # The visible stretch of the line, in log space: from where it enters to where it leaves.
        start = max(lo_x, lo_y + math.log(3600 / k))
        end = min(hi_x, hi_y + math.log(3600 / k))
        if end <= start:
            continue
        a = ax.transData.transform([(math.exp(start), k * math.exp(start) / 3600),
                                    (math.exp(end), k * math.exp(end) / 3600)])
        angle = math.degrees(math.atan2(a[1][1] - a[0][1], a[1][0] - a[0][0]))
        label = ax.text(0, 0, f"{_si(k)} samples/$", fontsize=7.5, color="#777777", ha="right", va="bottom",
                        rotation=angle, rotation_mode="anchor", zorder=1)
        for f in (0.95, 0.8, 0.65, 0.5, 0.35, 0.2):
            x = math.exp(start + f * (end - start))
            label.set_position((x, k * x / 3600))
            box = label.get_window_extent(renderer)
            if _fits(box, ax.get_window_extent(renderer), taken):
                break
        else:
            label.remove()  # the line still shows; an unreadable label does not help
            continue
        taken.append(box)


def _fits(box: Any, frame: Any, taken: list) -> bool:
    inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    return inside and not any(box.overlaps(t) for t in taken)


def _axes_text(ax: Axes, report: Report) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"${v:g}" if _two_or_five(v) else ""))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _tick(v)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: _tick(v) if _two_or_five(v) else ""))
    ax.tick_params(which="minor", labelsize=7.5)
    ax.set_xlabel("$ per hour (on-demand / spot)")
    ax.set_ylabel("samples per second (measured / modelled)")
    p = report.plan
    what = "measured" if is_measurement(report) else "ILLUSTRATION, not measured:"
    ax.set_title(f"{clean(p.profile)} in {clean(p.region)}: {what} samples per dollar at {report.market} prices",
                 fontsize=11, pad=16)
    # The provenance on a line of its own, smaller: a long plan name must not push the title off the page.
    ax.figure.text(0.53, 0.915, clean(f"plan {p.name}: {p.command}; collected {report.collected}")[:150], ha="center",
                   fontsize=7.5, color="dimgrey")
    ax.grid(True, which="major", alpha=0.25)


def _tick(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def _two_or_five(v: float) -> bool:
    """Label the 2s and 5s between decades ($0.5, $2, 5,000): enough to read a log axis by."""
    return f"{v:.0e}"[0] in "25"


def _legend(fig: Figure, market: str) -> None:
    """Below the axes, never over a point."""
    from matplotlib.lines import Line2D

    hollow = _SPOT if market == "spot" else _ON_DEMAND
    handles = [Line2D([], [], marker=_ON_DEMAND, linestyle="", color="dimgrey", label="measured, at the on-demand price"),
               Line2D([], [], marker=_SPOT, linestyle="", color="dimgrey", label="measured, at the spot price"),
               Line2D([], [], marker=hollow, linestyle="", markerfacecolor="none", color="dimgrey",
                      label=f"modelled, at the {market} price (in the benchmark's units)"),
               Line2D([], [], color="dimgrey", linewidth=0.9, label="model to measurement"),
               Line2D([], [], color="dimgrey", linewidth=0.9, linestyle=":", label="one type at both prices"),
               Line2D([], [], color="#bbbbbb", linewidth=0.8, linestyle="--", label="equal samples per dollar")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8.5, frameon=False, bbox_to_anchor=(0.53, 0.005))


# Where a label may go around its point, in points (dx, dy, ha), most preferred first.
_OFFSETS = [(7, 3, "left"), (7, -13, "left"), (-7, 3, "right"), (-7, -13, "right"), (0, 10, "center"),
            (0, -20, "center"), (9, 14, "left"), (9, -24, "left"), (-9, 14, "right"), (-9, -24, "right"),
            (12, 25, "left"), (12, -35, "left"), (-12, 25, "right"), (-12, -35, "right")]


def _place_labels(ax: Axes, report: Report, points: list[tuple[float, float]], segments: list, palette: list,
                  renderer: Any) -> list:
    """One label per type beside its point, in its colour: the first spot around it that covers no
    other label or point and stays inside the axes; the winner's first, in bold. Returns what is
    covered now."""
    frame = ax.get_window_extent(renderer)
    pad = 6 * DPI / 72  # a marker's half width in pixels
    taken = [_box(x - pad, y - pad, x + pad, y + pad) for x, y in ax.transData.transform(points)] if points else []
    for a, b in segments:
        (x0, y0), (x1, y1) = ax.transData.transform([a, b])
        taken.append(_box(min(x0, x1), min(y0, y1) - 1, max(x0, x1), max(y0, y1) + 1))
    w = report.winner
    for r, colour in zip((*report.ranked, *report.failed), palette):
        price = _chart_price(r, report.market)
        y = r.measured_sps or r.model_sps * (report.scale or 1.0)
        if not price or y <= 0:
            continue
        if r is w and r.per_dollar(report.market):
            text = f"winner: {r.instance_type}, {_si(r.per_dollar(report.market))} samples/$"
        else:
            text = r.instance_type + ("" if r.measured_sps else ": failed, modelled only")
        label = ax.annotate(text, (price, y), textcoords="offset points", xytext=_OFFSETS[0][:2],
                            ha=_OFFSETS[0][2], fontsize=9 if r is w else 8, fontweight="bold" if r is w else "normal",
                            color=colour, zorder=5)
        for dx, dy, ha in _OFFSETS:
            label.set_position((dx, dy))
            label.set_horizontalalignment(ha)
            box = label.get_window_extent(renderer)
            if _fits(box, frame, taken):
                break
        else:  # nowhere free: the first choice, overlapping, beats no label
            label.set_position(_OFFSETS[0][:2])
            label.set_horizontalalignment(_OFFSETS[0][2])
            box = label.get_window_extent(renderer)
        taken.append(box)
    return taken


def _box(x0: float, y0: float, x1: float, y1: float):
    from matplotlib.transforms import Bbox

    return Bbox([[x0, y0], [x1, y1]])


def write_chart(report: Report, path: str) -> Figure:
    """The chart as a PNG at `path` (the same results give the same bytes); the Figure, for a test."""
    fig = chart_figure(report)
    try:
        # No Software/date stamp: same input, same bytes.
        fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    except OSError as e:
        raise UserError(f"cannot write {clean(str(path))}: {e.strerror or e}") from None
    return fig
