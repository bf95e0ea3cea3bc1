"""The dashboard and the alarms as synthesized in the multi-node training stack, read back from
the template: the dashboard body's documented structure (widgets on a 24-column grid, none
overlapping), the loader-bound pattern on one row, and every series they ask for one that the
node actually sends: the CloudWatch agent's configuration (its dimensions, its job-wide
aggregation; the agent's own GPU dimensions index/name/arch, as its deny list drops
compute_mode, pstate and uuid) and the node monitor's datums."""
from __future__ import annotations

import json
import re

import pytest

from constructs_lib.runtime import contract
from constructs_lib.runtime.cwagent_config import agent_config
from constructs_lib.runtime.monitor import Monitor
from tests.observability.test_guard import _stack

GRID = 24  # the dashboard body's documented width in grid units
AGENT_GPU_DIMS = {"index", "name", "arch"}


@pytest.fixture(scope="module")
def synthesized():
    stack, t = _stack({"profile": "multi-node-training"})
    (dash,) = t.find_resources("AWS::CloudWatch::Dashboard").values()
    raw = dash["Properties"]["DashboardBody"]
    body = "".join(p if isinstance(p, str) else "TOKEN" for p in raw["Fn::Join"][1]) if isinstance(raw, dict) else raw
    return stack, t, json.loads(body)


def test_widgets_fit_the_grid_and_never_overlap(synthesized):
    _, _, body = synthesized
    cells = set()
    for w in body["widgets"]:
        assert w["type"] in ("text", "metric", "alarm") and 0 <= w["x"] and w["x"] + w["width"] <= GRID
        mine = {(w["x"] + i, w["y"] + j) for i in range(w["width"]) for j in range(w["height"])}
        assert not mine & cells, f"{w['properties'].get('title')} overlaps another widget"
        cells |= mine


def test_the_loader_bound_pattern_is_one_row(synthesized):
    _, _, body = synthesized
    rows = {w["properties"].get("title", ""): w["y"] for w in body["widgets"]}
    assert rows["GPU utilisation, mean per node"] == rows["Scratch disk reads (MB/s) per node"] == \
        rows["CPU active and iowait (%) per node"]


def _searches(body) -> list[tuple[str, str, set[str]]]:
    out = []
    for w in body["widgets"]:
        for m in w["properties"].get("metrics", []):
            for item in m:
                if isinstance(item, dict) and "SEARCH(" in item.get("expression", ""):
                    found = re.findall(r'\{"([^"]+)",([^}]*)\} MetricName="([^"]+)" Job="([^"]+)"', item["expression"])
                    assert found and all(job == "dl-multi-node-training" for *_, job in found), item["expression"]
                    out += [(ns, name, set(dims.split(","))) for ns, dims, name, _ in found]
    return out


def _agent_series(config) -> dict[str, list[set[str]]]:
    """Every (metric name -> dimension sets) the agent sends with this configuration."""
    prefix = {"nvidia_gpu": "nvidia_smi", "cpu": "cpu", "mem": "mem", "diskio": "diskio"}
    own = {"nvidia_gpu": AGENT_GPU_DIMS, "cpu": {"cpu"}, "mem": set(), "diskio": {"name"}}
    m = config["metrics"]
    out: dict[str, list[set[str]]] = {}
    for section, b in m["metrics_collected"].items():
        raw = own[section] | set(m["append_dimensions"]) | set(b.get("append_dimensions", {}))
        for meas in b["measurement"]:
            out[f"{prefix[section]}_{meas}"] = [raw, *(set(a) for a in m["aggregation_dimensions"])]
    return out


def test_every_series_the_dashboard_searches_is_one_a_node_sends(synthesized, node_monitor_dims):
    _, _, body = synthesized
    agent = _agent_series(agent_config(job="dl-multi-node-training"))
    searches = _searches(body)
    assert len(searches) >= 9
    for ns, name, dims in searches:
        if ns == contract.NS_NODE:
            assert dims in agent[name], (name, dims, agent[name])
        else:
            assert ns == contract.NS_JOB and dims in node_monitor_dims, (name, dims)


@pytest.fixture
def node_monitor_dims():
    m = Monitor.__new__(Monitor)
    m.job, m.instance_id = "dl-multi-node-training", "i-0"
    return [{d["Name"] for d in datum["Dimensions"]} for datum in m.datum(contract.M_GPUS, 8.0, 0.0)]


def test_alarms_watch_job_wide_series_the_nodes_send(synthesized, node_monitor_dims):
    _, t, _ = synthesized
    alarms = t.find_resources("AWS::CloudWatch::Alarm")
    agent = _agent_series(agent_config(job="dl-multi-node-training"))
    assert len(alarms) == 2
    for alarm in alarms.values():
        p = alarm["Properties"]
        assert p["TreatMissingData"] == "notBreaching" and p["AlarmActions"]
        for q in p["Metrics"]:
            if "MetricStat" not in q:
                continue
            metric = q["MetricStat"]["Metric"]
            dims = {d["Name"] for d in metric["Dimensions"]}
            assert dims == {contract.DIM_JOB}
            if metric["Namespace"] == contract.NS_NODE:
                assert dims in agent[metric["MetricName"]]
            else:
                assert dims in node_monitor_dims
    starved = next(a["Properties"] for a in alarms.values() if "AND" in a["Properties"]["Metrics"][0]["Expression"])
    assert starved["EvaluationPeriods"] == starved["DatapointsToAlarm"] == 3
    assert "NVMe RAID at /scratch" in starved["AlarmDescription"] and "num_workers" in starved["AlarmDescription"]


def test_the_cost_so_far_counts_nodes_reporting_at_the_price_on_record(synthesized):
    stack, _, body = synthesized
    (w,) = [w for w in body["widgets"] if w["properties"].get("title") == "Estimated cost so far (USD)"]
    text = json.dumps(w["properties"]["metrics"])
    price = stack.cluster.spec["options"][0]["price"]
    assert f"RUNNING_SUM(up) * {price:.4f} / 60" in text
    assert contract.M_TRAINING in text and "SampleCount" in text


def test_the_rendering_draws_every_widget_of_the_synthesized_body(synthesized, tmp_path):
    """scripts/render_dashboard.py (the README's image): one titled box per widget of the real body."""
    import matplotlib.image as mpimg

    from scripts.render_dashboard import render

    _, _, body = synthesized
    out = tmp_path / "dashboard.png"
    titles = render(body, str(out))
    assert len(titles) == len(body["widgets"]) and all(titles)
    assert titles[1] == "GPU utilisation, every GPU"
    img = mpimg.imread(str(out))
    assert img.shape[1] >= 1200 and img.shape[0] >= 900 and img.std() > 0.05
