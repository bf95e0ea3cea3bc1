"""`bench report`'s chart: samples per dollar against price per hour, one point per candidate in
the report's market (hollow: the other market), lines of equal samples per dollar behind them,
the winner and every label placed where it overlaps nothing. Fixed size and no date stamp, so
the same results give the same PNG bytes. matplotlib is imported only here, and only to draw.
"""
from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..validate import clean
from .report import Report, Row, is_measurement

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The chart's size: fixed, so that the same results give the same bytes (and the test knows the pixels).
FIGSIZE = (10.0, 6.5)
DPI = 110
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


def _si(k: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if k >= div:
            return f"{k / div:.3g}{suffix}"
    return f"{k:.3g}"
