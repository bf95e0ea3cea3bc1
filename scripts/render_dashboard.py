"""Draw the training stack's CloudWatch dashboard as the console lays it out, from the synthesized
dashboard body: python scripts/render_dashboard.py [--profile P] [--out docs/dashboard.png]

The layout (each widget at its x, y, width and height on the 24-column grid, with its title) is
the real one, read from the AWS::CloudWatch::Dashboard resource of the synthesized training stack.
The curves inside the graphs are made up, and say so: a loader-starved job whose GPUs wait on
the disk until its data set is staged on the NVMe RAID. They are chosen by the metric each graph
asks for, so a graph the dashboard gains is drawn without data until it gets a curve here.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import textwrap
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from constructs_lib.runtime import contract  # noqa: E402

GRID_COLUMNS = 24           # the dashboard body's documented grid width
WIDTH_PX = 1400
ROW_PX = 38                 # one grid unit of height, in pixels
HEADER_PX = 46
ILLUSTRATION = "illustration, not data"
STAGED_AT = 3.0             # hours: when the illustrated job's data lands on /scratch


# ---- the dashboard body ---------------------------------------------------------------------------
def body_from_template(template: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The dashboard body of the template's one AWS::CloudWatch::Dashboard (None if it has none).
    Tokens in it (the region, alarm ARNs) become placeholder text."""
    found = [r for r in template.get("Resources", {}).values() if r.get("Type") == "AWS::CloudWatch::Dashboard"]
    if not found:
        return None
    raw = found[0]["Properties"]["DashboardBody"]
    if isinstance(raw, dict):  # {"Fn::Join": ["", [literal, token, literal, ...]]}
        raw = "".join(p if isinstance(p, str) else "<token>" for p in raw["Fn::Join"][1])
    return json.loads(raw)


def dashboard_body(profile: str) -> tuple[dict[str, Any], str]:
    """The body of the training stack synthesized for `profile`, and where it came from. A stack
    without a dashboard (observability off, or not wired yet) falls back to a TrainingDashboard in
    a scratch stack, sized and priced by the same selection."""
    import aws_cdk as cdk

    from dl_stacks.selection import select
    from dl_stacks.settings import from_context
    from dl_stacks.training_stack import TrainingStack

    settings = from_context({"profile": profile})
    app = cdk.App()
    stack = TrainingStack.for_settings(app, settings, quiet=True)
    body = body_from_template(app.synth().get_stack_by_name(stack.stack_name).template)
    if body is not None:
        return body, f"the synthesized stack {stack.stack_name}"

    from constructs_lib.observability.dashboard import TrainingDashboard

    selection = select(settings)
    pick = selection.pick
    scratch = cdk.App()
    s = cdk.Stack(scratch, "DashboardPreview", env=cdk.Environment(region=settings.region))
    TrainingDashboard(s, "Dashboard", job=f"dl-{settings.job}", nodes=settings.nodes, instance_type=pick.instance_type,
                      gpus_per_node=pick.facts.accelerator_count,
                      price_per_node_hour=selection.prices[pick.instance_type].in_market or 0.0)
    body = body_from_template(scratch.synth().get_stack_by_name(s.stack_name).template)
    assert body is not None
    return body, f"a TrainingDashboard for {stack.stack_name}'s selection (the stack has no dashboard)"


# ---- illustrative curves --------------------------------------------------------------------------
def _metrics_asked(widget: dict[str, Any]) -> list[tuple[str, bool]]:
    """(metric name, per GPU?) for each line definition of a metric widget."""
    out = []
    for line in widget["properties"].get("metrics", []):
        text = json.dumps(line)
        for name in re.findall(r'MetricName=\\"([^"\\]+)\\"', text) or [x for x in line if isinstance(x, str)][1:2]:
            out.append((name, f'\\"{contract.DIM_GPU}\\"' in text))
    return out


def _curves(widget: dict[str, Any], t: list[float], nodes: int = 2) -> list[tuple[str, list[float]]]:
    """Made-up series for one graph: GPUs at ~38% while the disk is the bottleneck (reads high,
    iowait high), ~92% once the data is staged on /scratch."""
    staged = [x >= STAGED_AT for x in t]
    wave = [math.sin(2.3 * x) for x in t]

    def level(before: float, after: float, amp: float, shift: float = 0.0) -> list[float]:
        return [(after if s else before) + amp * w + shift for s, w in zip(staged, wave)]

    cluster_hour = _cluster_price_per_hour(widget, nodes) or nodes * 30.0  # no price on record: a stand-in
    asked = _metrics_asked(widget)
    names = [n for n, _ in asked]
    out: list[tuple[str, list[float]]] = []
    for name, per_gpu in asked:
        if name == contract.M_GPU_UTIL and per_gpu:
            out += [(f"node {n} GPU {g}", [min(99.0, v) for v in level(38, 90, 5, 1.2 * g - 4 * n)])
                    for n in range(nodes) for g in (0, 3, 7)]
        elif name == contract.M_GPU_MEMORY:
            out += [(f"node {n} GPU {g}", [61_000 + 450 * g + 300 * n for _ in t]) for n in range(nodes) for g in (0, 3, 7)]
        elif name == contract.M_GPU_UTIL:
            out += [(f"node {n}", level(37, 91, 4, -3 * n)) for n in range(nodes)]
        elif name == contract.M_DISK_READ:
            out += [(f"node {n}", level(410, 140, 25, -15 * n)) for n in range(nodes)]
        elif name == contract.M_CPU_ACTIVE:
            out += [(f"active, node {n}", level(34, 47, 3, n)) for n in range(nodes)]
        elif name == contract.M_CPU_IOWAIT:
            out += [(f"iowait, node {n}", level(41, 2, 2, -n)) for n in range(nodes)]
        elif name == contract.M_SAMPLES and "per dollar" in widget["properties"].get("title", ""):
            out.append(("samples/$", [s * 3600 / cluster_hour for s in level(2100, 5200, 150)]))
        elif name == contract.M_SAMPLES:
            out.append(("samples/s", level(2100, 5200, 150)))
        elif name == contract.M_TRAINING and "cost" in widget["properties"].get("title", "").lower():
            out.append(("USD", [cluster_hour * x for x in t]))
        elif name == contract.M_TRAINING:
            out.append(("training", [float(nodes) if x > 0.3 else 0.0 for x in t]))
        elif name == contract.M_RESTORING:
            out.append(("restoring", [float(nodes) if 0.15 < x <= 0.3 else 0.0 for x in t]))
        elif name == contract.M_GPUS:  # as many as the expected count the graph marks
            marks = [a["value"] for a in widget["properties"].get("annotations", {}).get("horizontal", [])]
            out += [(f"node {n}", [float(marks[0] if marks else 8) for _ in t]) for n in range(nodes)]
        elif name == contract.M_XID:
            out += [(f"node {n}", [0.0 for _ in t]) for n in range(nodes)]
    if contract.M_TRAINING in names and "cost" in widget["properties"].get("title", "").lower():
        out = [c for c in out if c[0] == "USD"]
    return out


def _cluster_price_per_hour(widget: dict[str, Any], nodes: int) -> Optional[float]:
    """The cluster's price per hour as the graph's own label states it: samples per dollar names
    the cluster-hour, the cost so far the node-hour."""
    text = json.dumps(widget["properties"])
    m = re.search(r"\$([0-9,.]+) per cluster-hour", text)
    if m:
        return float(m.group(1).replace(",", ""))
    m = re.search(r"\$([0-9,.]+)/node-hour", text)
    return nodes * float(m.group(1).replace(",", "")) if m else None


def _nodes(body: dict[str, Any], default: int = 2) -> int:
    """The cluster's size as the dashboard's heading states it ("## JOB: N x TYPE ...")."""
    for w in body["widgets"]:
        m = re.search(r"^## [^:]+: (\d+) x ", w["properties"].get("markdown", ""), re.M)
        if m:
            return int(m.group(1))
    return default


def _plain(markdown: str) -> list[str]:
    """Markdown of a text widget as lines of plain text (headings first)."""
    text = re.sub(r"[*`#]", "", markdown)
    return [p.strip() for p in text.split("\n\n") if p.strip()]


# ---- drawing --------------------------------------------------------------------------------------
def render(body: dict[str, Any], out: str, *, source: str = "") -> list[str]:
    """Draw `body` into the PNG `out`; returns the title drawn in each widget, in body order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    widgets = body["widgets"]
    rows = max(w["y"] + w["height"] for w in widgets)
    height_px = HEADER_PX + rows * ROW_PX + 8
    fig = plt.figure(figsize=(WIDTH_PX / 100, height_px / 100), dpi=100)
    fig.patch.set_facecolor("#f2f3f3")
    fig.text(0.006, 1 - 18 / height_px, "CloudWatch dashboard: the layout of the synthesized dashboard body",
             fontsize=12, weight="bold", color="#16191f", va="center")
    fig.text(0.994, 1 - 18 / height_px, f"curves: {ILLUSTRATION}" + (f"   |   from {source}" if source else ""),
             fontsize=8.5, color="#d13212", va="center", ha="right")
    t = [i / 30 for i in range(0, 6 * 30 + 1)]  # six hours, every two minutes

    def box(w: dict[str, Any]) -> tuple[float, float, float, float]:
        """The widget's rectangle in figure fractions (left, bottom, width, height)."""
        x0, w0 = w["x"] / GRID_COLUMNS, w["width"] / GRID_COLUMNS
        top_px = HEADER_PX + w["y"] * ROW_PX
        h_px = w["height"] * ROW_PX
        return x0, 1 - (top_px + h_px) / height_px, w0, h_px / height_px

    drawn: list[str] = []
    nodes = _nodes(body)
    pad_x, pad_y = 4 / WIDTH_PX, 4 / height_px
    for w in widgets:
        x0, y0, wd, ht = box(w)
        panel = fig.add_axes((x0 + pad_x, y0 + pad_y, wd - 2 * pad_x, ht - 2 * pad_y))
        panel.set_xticks([])
        panel.set_yticks([])
        panel.set_facecolor("white")
        for spine in panel.spines.values():
            spine.set_color("#d5dbdb")
        props = w["properties"]
        if w["type"] == "text":
            lines = _plain(props.get("markdown", ""))
            title = lines[0] if lines else ""
            panel.text(0.008, 1 - 16 / (ht * height_px), title, fontsize=10.5, weight="bold", color="#16191f",
                       transform=panel.transAxes, va="top")
            chars = max(40, int(wd * WIDTH_PX / 7.4))
            rest = "\n".join(textwrap.fill(p, chars) for p in lines[1:])
            panel.text(0.008, 1 - 40 / (ht * height_px), rest, fontsize=9, color="#16191f", transform=panel.transAxes,
                       va="top", linespacing=1.35)
            drawn.append(title)
            continue
        title = props.get("title") or ("Alarms" if w["type"] == "alarm" else w["type"])
        panel.text(0.012, 1 - 13 / (ht * height_px), title, fontsize=9, weight="bold", color="#16191f",
                   transform=panel.transAxes, va="top")
        drawn.append(title)
        if w["type"] == "metric":
            panel.text(0.99, 1 - 13 / (ht * height_px), ILLUSTRATION, fontsize=7, color="#d13212", ha="right",
                       va="top", transform=panel.transAxes)
        if w["type"] == "alarm":
            for i, name in enumerate(("starved GPUs", "node health")[:len(props.get("alarms", []))]):
                panel.add_patch(Rectangle((0.012 + i * 0.16, 0.15), 0.15, 0.4, transform=panel.transAxes,
                                          facecolor="#e9f7e6", edgecolor="#1d8102"))
                panel.text(0.02 + i * 0.16, 0.35, f"OK  {name}", fontsize=8, color="#1d8102",
                           transform=panel.transAxes, va="center")
            continue
        # The graph inside the panel: room for the title above and the legend below.
        left_px, bottom_px, top_px = 46, 30, 34
        ax = fig.add_axes((x0 + pad_x + left_px / WIDTH_PX, y0 + pad_y + bottom_px / height_px,
                           wd - 2 * pad_x - (left_px + 10) / WIDTH_PX, ht - 2 * pad_y - (bottom_px + top_px) / height_px))
        curves = _curves(w, t, nodes)
        for label, ys in curves:
            ax.plot(t, ys, linewidth=1.0, label=label)
        y_axis = props.get("yAxis", {}).get("left", {})
        if "max" in y_axis or "min" in y_axis:
            ax.set_ylim(y_axis.get("min", None), y_axis.get("max", None))
        for a in props.get("annotations", {}).get("horizontal", []):
            ax.axhline(a["value"], color="#d13212", linestyle="--", linewidth=0.9)
            ax.text(t[len(t) // 2], a["value"], a.get("label", ""), fontsize=6.5, color="#d13212", va="bottom",
                    ha="center")
        if curves and all(max(ys) == min(ys) for _, ys in curves):  # flat lines: a little room around them
            lo = min(min(ys) for _, ys in curves)
            ax.set_ylim(max(lo - 1, y_axis.get("min", lo - 1)), max(max(ys) for _, ys in curves) + 1.5)
        ax.tick_params(labelsize=6.5, length=2)
        ax.set_xticks(range(0, 7))
        ax.set_xticklabels([f"{h}h" for h in range(-6, 1)])
        ax.grid(color="#eaeded", linewidth=0.6)
        if curves:
            ax.legend(fontsize=5.8, loc="upper left", bbox_to_anchor=(0, -0.1), ncol=6, frameon=False,
                      handlelength=1.2, columnspacing=0.8)
    fig.savefig(out, facecolor=fig.get_facecolor())
    plt.close(fig)
    return drawn


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--profile", default="multi-node-training")
    p.add_argument("--out", default="docs/dashboard.png")
    a = p.parse_args(argv)
    body, source = dashboard_body(a.profile)
    titles = render(body, a.out, source=source)
    print(f"{a.out}: {len(titles)} widgets from {source}: " + "; ".join(titles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
