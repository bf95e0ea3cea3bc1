"""Draw the training stack's CloudWatch dashboard as the console lays it out, from the synthesized
dashboard body (python scripts/render_dashboard.py [--profile P] [--out docs/dashboard.png]).

Each widget is drawn at its grid position with its title; graphs hold made-up curves of a
loader-starved job, labelled as such: the layout is real, the data is an illustration."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GRID_W, ROW_PX, COL_PX = 24, 38, 58


def dashboard_body(profile: str) -> dict[str, Any]:
    import aws_cdk as cdk

    from stacks.settings import from_context
    from stacks.training_stack import TrainingStack

    app = cdk.App()
    stack = TrainingStack.for_settings(app, from_context({"profile": profile}), quiet=True)
    template = app.synth().get_stack_by_name(stack.stack_name).template
    (dash,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    raw = dash["Properties"]["DashboardBody"]
    text = "".join(p if isinstance(p, str) else "<token>" for p in raw["Fn::Join"][1]) if isinstance(raw, dict) else raw
    return json.loads(text)


def _curves(title: str, t: list[float]) -> list[tuple[str, list[float]]]:
    """Illustrative series per widget: a job whose GPUs wait on the disk for the first hours,
    then are fed once the data is staged on the NVMe RAID (at t = 3.5 h)."""
    staged = [x >= 3.5 for x in t]
    wave = [math.sin(3 * x) for x in t]
    if "every GPU" in title and "memory" not in title:
        return [(f"GPU {g}", [(92 if s else 38) + 5 * w + g for s, w in zip(staged, wave)]) for g in range(0, 8, 2)]
    if "memory" in title:
        return [(f"GPU {g}", [61000 + 300 * g for _ in t]) for g in range(0, 8, 2)]
    if "mean per node" in title:
        return [(f"node {n}", [(90 if s else 36) + 4 * w - 3 * n for s, w in zip(staged, wave)]) for n in range(2)]
    if "disk" in title:
        return [(f"node {n}", [(120 if s else 410) + 20 * w for s, w in zip(staged, wave)]) for n in range(2)]
    if "CPU" in title:
        return [("active", [(45 if s else 35) + 3 * w for s, w in zip(staged, wave)]),
                ("iowait", [(2 if s else 41) + 2 * w for s, w in zip(staged, wave)])]
    if "Samples per second" in title:
        return [("samples/s", [(5200 if s else 2100) + 150 * w for s, w in zip(staged, wave)])]
    if "per dollar" in title:
        return [("samples/$", [(445000 if s else 180000) + 9000 * w for s, w in zip(staged, wave)])]
    if "cost" in title:
        return [("USD", [42.03 * x for x in t])]
    if "GPUs listed" in title:
        return [(f"node {n}", [8.0 for _ in t]) for n in range(2)]
    if "XID" in title:
        return [(f"node {n}", [0.0 for _ in t]) for n in range(2)]
    return []


def render(body: dict[str, Any], out: str) -> list[str]:
    """Draw `body` into `out` (PNG); returns the titles drawn, in order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widgets = body["widgets"]
    rows = max(w["y"] + w["height"] for w in widgets)
    fig = plt.figure(figsize=(GRID_W * COL_PX / 100, rows * ROW_PX / 100 + 0.5), dpi=100)
    fig.patch.set_facecolor("#f2f3f3")
    fig.suptitle("CloudWatch dashboard layout from the synthesized template (curves: illustration, not data)",
                 fontsize=10, color="#545b64", y=0.995)
    top = 1 - 0.45 / (rows * ROW_PX / 100 + 0.5)
    drawn = []
    t = [i / 20 for i in range(0, 121)]
    for w in widgets:
        x0, y0 = w["x"] / GRID_W, top - (w["y"] + w["height"]) / rows * top
        width, height = w["width"] / GRID_W, w["height"] / rows * top
        pad = 0.004
        title = w["properties"].get("title") or ("Alarms" if w["type"] == "alarm" else "")
        if w["type"] == "text":
            ax = fig.add_axes((x0 + pad, y0 + pad, width - 2 * pad, height - 2 * pad))
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_facecolor("white")
            lines = w["properties"]["markdown"].replace("## ", "").replace("**", "").replace("`", "").split("\n")
            ax.text(0.01, 0.78, lines[0], fontsize=11, weight="bold", transform=ax.transAxes)
            ax.text(0.01, 0.38, "\n".join(_wrap(" ".join(lines[1:]), 210)), fontsize=7.5, transform=ax.transAxes,
                    va="center", color="#16191f")
            drawn.append(lines[0])
            continue
        left = 0.045 / width * 0.33  # room for the tick labels, the same in every column
        ax = fig.add_axes((x0 + pad + left * width, y0 + pad + 0.14 * height, width * (0.985 - left) - 2 * pad,
                           height * 0.7 - 2 * pad))
        ax.set_facecolor("white")
        ax.set_title(title, fontsize=9, loc="left", weight="bold", color="#16191f")
        drawn.append(title)
        if w["type"] == "alarm":
            ax.set_xticks([])
            ax.set_yticks([])
            count = len(w["properties"].get("alarms", []))
            ax.text(0.01, 0.4, f"{count} alarms (starved GPUs, node health): OK / ALARM each, named at deploy",
                    fontsize=8, transform=ax.transAxes, color="#1d8102")
            continue
        for label, ys in _curves(title, t):
            ax.plot(t, ys, linewidth=1.1, label=label)
        for a in w["properties"].get("annotations", {}).get("horizontal", []):
            ax.axhline(a["value"], color="#d13212", linestyle="--", linewidth=0.9)
            ax.text(t[-1], a["value"], f" {a.get('label', '')}", fontsize=6.5, color="#d13212", va="bottom", ha="right")
        ax.tick_params(labelsize=6.5)
        ax.set_xlabel("hours", fontsize=6.5)
        ax.legend(fontsize=6, loc="upper left", ncol=4, frameon=False)
        y = w["properties"].get("yAxis", {}).get("left", {})
        if "max" in y:
            ax.set_ylim(y.get("min", 0), y["max"])
    fig.savefig(out, facecolor=fig.get_facecolor())
    plt.close(fig)
    return drawn


def _wrap(text: str, width: int) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if len(line) + len(word) + 1 > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return out + [line] if line else out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="multi-node-training")
    p.add_argument("--out", default="docs/dashboard.png")
    a = p.parse_args(argv)
    titles = render(dashboard_body(a.profile), a.out)
    print(f"{a.out}: {len(titles)} widgets: {', '.join(titles)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
