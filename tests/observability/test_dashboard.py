"""TrainingDashboard, synthesized in a small stack and read back from the template, judged against
what is documented elsewhere:

- the dashboard body's structure (CloudWatch API reference, "Dashboard Body Structure and
  Syntax"): widgets with type, x, y, width, height and properties on a 24-column grid;
- SEARCH semantics (CloudWatch user guide, "CloudWatch search expression syntax" and its
  examples): a metric schema matches the series with exactly its dimensions, `Name="value"` is an
  exact match on that property, a double-quoted term an exact match on a metric name, dimension
  name or dimension value. Every SEARCH is run against the series that nodes really send: the
  CloudWatch agent's configuration (constructs_lib.runtime.cwagent_config) with the agent's own
  dimensions per plugin, and the node monitor's datums;
- metric math (user guide, "Using metric math"): RUNNING_SUM is a running sum, SUM of an array
  adds the series, arithmetic on an array applies to each series;
- cdk-nag's AwsSolutions rules and cfn-lint.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import numpy as np
import pytest
from aws_cdk.assertions import Template

from constructs_lib.observability.alarms import NodeHealthAlarm, StarvedGpuAlarm
from constructs_lib.observability.dashboard import TrainingDashboard
from constructs_lib.observability.notifications import NotificationTopic
from constructs_lib.runtime import contract
from constructs_lib.runtime.cwagent_config import agent_config
from constructs_lib.runtime.monitor import Monitor
from tests.cdk_checks import cfn_lint, synth_with_nag

GRID = 24        # columns of the dashboard grid (API reference)
JOB = "dl-multi-node-training"
NODES, GPUS, PRICE = 2, 8, 21.0139
# The agent's own dimensions per plugin (user guide: "Collect NVIDIA GPU metrics" lists index and
# name, plus the host, which omit_hostname drops; diskio its device as `name`; cpu `cpu`).
AGENT_OWN = {"nvidia_gpu": {contract.DIM_GPU: "{gpu}", "name": "NVIDIA B200"}, "cpu": {"cpu": "cpu-total"},
             "diskio": {"name": "md0"}, "mem": {}}
PREFIX = {"nvidia_gpu": "nvidia_smi", "cpu": "cpu", "mem": "mem", "diskio": "diskio"}


def resolve_body(dashboard_resource: dict[str, Any]) -> dict[str, Any]:
    """The DashboardBody as JSON: an Fn::Join of literals and tokens (region, alarm ARNs) becomes
    one string with placeholder text for the tokens."""
    raw = dashboard_resource["Properties"]["DashboardBody"]
    if isinstance(raw, dict):
        raw = "".join(p if isinstance(p, str) else "TOKEN" for p in raw["Fn::Join"][1])
    return json.loads(raw)


def synth_dashboard(tmp: Path, name: str = "Dash", **props: Any) -> tuple[Template, dict[str, Any], TrainingDashboard]:
    """A small stack holding the dashboard (and, like the training stack, its alarms and their
    topic), synthesized with cdk-nag and checked by cfn-lint."""
    app = cdk.App(outdir=str(tmp))
    stack = cdk.Stack(app, name, env=cdk.Environment(region="us-east-1"))
    topic = NotificationTopic(stack, "Topic").topic
    alarms = [StarvedGpuAlarm(stack, "Starved", job=JOB, topic=topic).alarm,
              NodeHealthAlarm(stack, "Health", job=JOB, expected_gpus=GPUS, topic=topic).alarm]
    kw: dict[str, Any] = dict(job=JOB, nodes=NODES, gpus_per_node=GPUS, price_per_node_hour=PRICE,
                              instance_type="p6-b200.48xlarge", alarms=alarms)
    kw.update(props)
    dash = TrainingDashboard(stack, "Dashboard", **kw)
    assembly = synth_with_nag(app)  # any unacknowledged AwsSolutions finding fails here
    cfn_lint([tmp / f"{name}.template.json"])
    t = Template.from_json(assembly.get_stack_by_name(name).template)
    (resource,) = t.find_resources("AWS::CloudWatch::Dashboard").values()
    return t, resolve_body(resource), dash


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    return synth_dashboard(tmp_path_factory.mktemp("cdk.out"))


def by_title(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["properties"].get("title", ""): w for w in body["widgets"]}


# ---- the series the nodes send, and SEARCH as documented ------------------------------------------
def series_sent(nodes: int = NODES, gpus: int = GPUS, extra_gpu_dims: dict[str, str] | None = None) -> list[tuple]:
    """(namespace, metric name, dimensions) of every series a cluster of `nodes` sends: the agent's
    per-plugin series with its dimensions, one per `aggregation_dimensions` entry, and the
    monitor's datums."""
    config = agent_config(job=JOB)["metrics"]
    out = set()
    for n in range(nodes):
        instance = f"i-{n:017x}"
        for section, block in config["metrics_collected"].items():
            own = [dict(AGENT_OWN[section])]
            if section == "nvidia_gpu":
                own = [{**{k: v.format(gpu=g) for k, v in AGENT_OWN[section].items()}, **(extra_gpu_dims or {})}
                       for g in range(gpus)]
            for measurement in block["measurement"]:
                metric = f"{PREFIX[section]}_{measurement}"
                for dims in own:
                    raw = {**dims, contract.DIM_INSTANCE: instance, **block.get("append_dimensions", {})}
                    assert set(config["append_dimensions"]) == {contract.DIM_INSTANCE}
                    out.add((config["namespace"], metric, tuple(sorted(raw.items()))))
                    for keys in config["aggregation_dimensions"]:
                        out.add((config["namespace"], metric, tuple(sorted((k, raw[k]) for k in keys))))
        monitor = Monitor.__new__(Monitor)  # only its datum layout is needed
        monitor.job, monitor.instance_id = JOB, instance
        for metric in (contract.M_SAMPLES, contract.M_TRAINING, contract.M_RESTORING, contract.M_GPUS, contract.M_XID):
            for d in monitor.datum(metric, 1.0, 0.0):
                out.add((contract.NS_JOB, metric, tuple(sorted((x["Name"], x["Value"]) for x in d["Dimensions"]))))
    return sorted(out)


SEARCH = re.compile(r"SEARCH\('(?P<query>[^']*)', '(?P<stat>\w+)', (?P<period>\d+)\)")
TERM = re.compile(r'\s*(?:(?P<key>[A-Za-z]+)="(?P<value>[^"]*)"|"(?P<exact>[^"]*)")')


def run_search(query: str, series: list[tuple]) -> list[tuple]:
    """The series a SEARCH query matches, for the subset of the syntax this project uses (anything
    else fails): an optional schema {namespace, dimension names...}, then designators Name="value"
    and double-quoted exact terms, implicitly ANDed."""
    schema = None
    m = re.match(r"\s*\{([^}]*)\}", query)
    if m:
        schema = [x.strip().strip('"') for x in m.group(1).split(",")]
        query = query[m.end():]
    terms = []
    while query.strip():
        t = TERM.match(query)
        assert t, f"SEARCH syntax this test does not model: {query!r}"
        terms.append(t)
        query = query[t.end():]

    def matches(s: tuple) -> bool:
        namespace, metric, dims = s[0], s[1], dict(s[2])
        if schema and (namespace != schema[0] or set(dims) != set(schema[1:])):
            return False
        for t in terms:
            if t["key"] == "MetricName" and metric != t["value"]:
                return False
            if t["key"] == "Namespace" and namespace != t["value"]:
                return False
            if t["key"] not in (None, "MetricName", "Namespace") and dims.get(t["key"]) != t["value"]:
                return False
            if t["exact"] is not None and t["exact"] not in {metric, namespace, *dims, *dims.values()}:
                return False
        return True
    return [s for s in series if matches(s)]


def searches(widget: dict[str, Any]) -> list[re.Match]:
    return [m for line in widget["properties"].get("metrics", []) for item in line if isinstance(item, dict)
            for m in SEARCH.finditer(item.get("expression", ""))]


# ---- structure ------------------------------------------------------------------------------------
def test_one_dashboard_of_documented_widgets_on_the_grid_none_overlapping(synthesized):
    t, body, dash = synthesized
    t.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    widgets = body["widgets"]
    assert 0 < len(widgets) <= 100
    assert len(widgets) == sum(len(row) for row in dash.widgets)
    taken: dict[tuple[int, int], str] = {}
    for w in widgets:
        assert {"type", "x", "y", "width", "height", "properties"} <= set(w)
        assert w["type"] in ("metric", "text", "alarm")
        assert 0 <= w["x"] <= 23 and 1 <= w["width"] <= GRID and w["x"] + w["width"] <= GRID
        assert w["y"] >= 0 and 1 <= w["height"] <= 1000
        name = w["properties"].get("title", w["type"])
        for cell in ((w["x"] + i, w["y"] + j) for i in range(w["width"]) for j in range(w["height"])):
            assert cell not in taken, f"{name} overlaps {taken[cell]}"
            taken[cell] = name
        if w["type"] == "text":
            assert w["properties"]["markdown"]
        if w["type"] == "metric":
            p = w["properties"]
            assert p["metrics"] and p["region"] and p["period"] == contract.METRIC_PERIOD
            ids = [i["id"] for line in p["metrics"] for i in line if isinstance(i, dict) and "id" in i]
            assert len(ids) == len(set(ids)) and all(i[0].islower() for i in ids)
    rows = sorted({w["y"] for w in widgets})
    assert all(sum(w["width"] for w in widgets if w["y"] == y) == GRID for y in rows), "a row leaves a gap"


def test_top_to_bottom_heading_gpus_loader_pattern_value_health_alarms(synthesized):
    _, body, _ = synthesized
    w = by_title(body)
    (text,) = [x for x in body["widgets"] if x["type"] == "text"]
    assert (text["x"], text["y"], text["width"]) == (0, 0, GRID)
    md = text["properties"]["markdown"]
    assert JOB in md and f"{NODES} x p6-b200.48xlarge" in md and f"${NODES * PRICE:,.2f}/h" in md
    assert "/scratch" in md and "num_workers" in md
    gpu, loader = w["GPU utilisation, every GPU (%)"], w["GPU utilisation, mean per node (%)"]
    disk, cpu = w["Scratch array reads per node (MB/s)"], w["CPU active and iowait per node (%)"]
    # The loader-bound pattern at a glance: GPU, then disk reads, then CPU, side by side on one row.
    assert loader["y"] == disk["y"] == cpu["y"] and loader["x"] < disk["x"] < cpu["x"]
    assert text["y"] < gpu["y"] == w["GPU memory used, every GPU (MiB)"]["y"] < loader["y"]
    assert loader["y"] < w["Samples per second, whole job"]["y"] == w["Samples per dollar, live"]["y"] \
        == w["Estimated cost so far (USD)"]["y"] < w["GPUs listed per node"]["y"] == w["Hardware XID errors per node"]["y"]
    (alarms,) = [x for x in body["widgets"] if x["type"] == "alarm"]
    assert alarms["y"] == max(x["y"] for x in body["widgets"]) and len(alarms["properties"]["alarms"]) == 2


def test_every_search_finds_the_series_its_graph_means_among_those_the_nodes_send(synthesized):
    _, body, _ = synthesized
    sent = series_sent()
    found = 0
    for w in body["widgets"]:
        for m in searches(w):
            hits = run_search(m["query"], sent)
            assert m["period"] == str(contract.METRIC_PERIOD)
            assert hits, f"{w['properties']['title']}: {m['query']} matches nothing the nodes send"
            assert {dict(h[2])[contract.DIM_JOB] for h in hits} == {JOB}
            assert len({h[1] for h in hits}) == 1  # one metric per SEARCH
            per_gpu = "every GPU" in w["properties"]["title"]
            # one line per GPU (nodes x GPUs) where the title says every GPU, else one per node
            assert len(hits) == (NODES * GPUS if per_gpu else NODES), (w["properties"]["title"], hits)
            if per_gpu:
                assert all(contract.DIM_GPU in dict(h[2]) for h in hits)
            else:
                assert all(set(dict(h[2])) == {contract.DIM_JOB, contract.DIM_INSTANCE} for h in hits)
            found += 1
    assert found >= 12


def test_the_contracts_names_are_what_the_graphs_ask_for(synthesized):
    _, body, _ = synthesized
    asked = {(run_search(m["query"], series_sent())[0][0], m["stat"], run_search(m["query"], series_sent())[0][1])
             for w in body["widgets"] for m in searches(w)}
    names = {(ns, name) for ns, _, name in asked}
    assert {(contract.NS_NODE, n) for n in (contract.M_GPU_UTIL, contract.M_GPU_MEMORY, contract.M_DISK_READ,
                                            contract.M_CPU_ACTIVE, contract.M_CPU_IOWAIT)} <= names
    assert {(contract.NS_JOB, n) for n in (contract.M_SAMPLES, contract.M_GPUS, contract.M_XID, contract.M_TRAINING,
                                           contract.M_RESTORING)} <= names


def test_the_per_gpu_graphs_do_not_depend_on_the_agents_full_dimension_set(synthesized):
    """Agent versions add GPU dimensions (arch, uuid, ...): the per-GPU lines stay, one per GPU."""
    _, body, _ = synthesized
    more = series_sent(extra_gpu_dims={"arch": "blackwell", "uuid": "GPU-1234", "pstate": "P0"})
    for title in ("GPU utilisation, every GPU (%)", "GPU memory used, every GPU (MiB)"):
        (m,) = searches(by_title(body)[title])
        assert len(run_search(m["query"], more)) == NODES * GPUS
    (m,) = searches(by_title(body)["GPU utilisation, mean per node (%)"])
    assert len(run_search(m["query"], more)) == NODES


# ---- metric math, evaluated as documented -------------------------------------------------------
def evaluate(expression: str, per_search: np.ndarray, **metrics: np.ndarray) -> np.ndarray:
    """Evaluate a graph's expression: each SEARCH stands for `per_search` (series x time), SUM adds
    an array of series, RUNNING_SUM is the cumulative sum, arithmetic is per data point."""
    python = SEARCH.sub("S", expression)
    assert re.fullmatch(r"[A-Za-z_0-9().*/+\- ]+", python), python
    env = {"S": per_search, "SUM": lambda a: a.sum(axis=0), "RUNNING_SUM": np.cumsum, **metrics}
    return eval(python, {"__builtins__": {}}, env)  # noqa: S307 - our own synthesized expression


def expressions_of(widget: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for line in widget["properties"]["metrics"] for i in line if isinstance(i, dict) and "expression" in i]


def test_samples_per_second_and_per_dollar_add_the_nodes_and_use_the_cluster_price(synthesized):
    _, body, _ = synthesized
    w = by_title(body)
    per_node = np.full((NODES, 10), 1500.0)  # samples/s on each node, ten minutes
    (sps,) = expressions_of(w["Samples per second, whole job"])
    assert evaluate(sps["expression"], per_node)[-1] == pytest.approx(NODES * 1500)
    (spd,) = expressions_of(w["Samples per dollar, live"])
    # one cluster-hour at NODES x PRICE dollars buys 3600 s of NODES x 1500 samples/s
    assert evaluate(spd["expression"], per_node)[-1] == pytest.approx(NODES * 1500 * 3600 / (NODES * PRICE), rel=1e-4)


def test_cost_so_far_counts_node_minutes_reported_at_the_price_on_record(synthesized):
    _, body, _ = synthesized
    w = by_title(body)["Estimated cost so far (USD)"]
    (cost,) = expressions_of(w)
    (counted,) = [line for line in w["properties"]["metrics"] if isinstance(line[0], str)]
    # [namespace, metric, dim name, dim value, {id, stat, period, visible}]: the job-wide series
    ns, metric, dim, value, opts = counted
    assert (ns, metric, dim, value) == (contract.NS_JOB, contract.M_TRAINING, contract.DIM_JOB, JOB)
    assert opts["stat"] == "SampleCount" and opts["period"] == contract.METRIC_PERIOD and opts["visible"] is False
    # ...a series every node's monitor sends once a minute, whatever the job does:
    m = Monitor.__new__(Monitor)
    m.job, m.instance_id = JOB, "i-0"
    assert [{contract.DIM_JOB: JOB}] == [{d["Name"]: d["Value"] for d in x["Dimensions"]}
                                         for x in m.datum(contract.M_TRAINING, 0.0, 0.0) if len(x["Dimensions"]) == 1]
    # two nodes reporting for an hour (SampleCount 2 a minute) cost two node-hours
    hour = evaluate(cost["expression"], np.zeros(1), **{opts["id"]: np.full(60, float(NODES))})
    assert hour[-1] == pytest.approx(NODES * PRICE, rel=1e-4) and np.all(np.diff(hour) >= 0)
    assert "per node per minute" in cost["label"] and f"${PRICE:,.2f}/node-hour" in cost["label"]


def test_scratch_reads_are_megabytes_per_second(synthesized):
    """The agent sends the bytes read per collection interval (contract: METRIC_PERIOD seconds)."""
    _, body, _ = synthesized
    (reads,) = expressions_of(by_title(body)["Scratch array reads per node (MB/s)"])
    per_interval = np.full((NODES, 5), 150e6 * contract.METRIC_PERIOD)  # 150 MB/s on each node
    assert evaluate(reads["expression"], per_interval) == pytest.approx(np.full((NODES, 5), 150.0))


def test_health_shows_the_expected_gpu_count_and_the_cluster_size(synthesized):
    _, body, _ = synthesized
    w = by_title(body)
    assert [a["value"] for a in w["GPUs listed per node"]["properties"]["annotations"]["horizontal"]] == [GPUS]
    assert [a["value"] for a in w["Nodes training and restoring"]["properties"]["annotations"]["horizontal"]] == [NODES]


# ---- variants -------------------------------------------------------------------------------------
def test_no_price_on_record_leaves_out_cost_and_per_dollar_and_says_so(tmp_path):
    _, body, _ = synth_dashboard(tmp_path, price_per_node_hour=0.0, alarms=())
    titles = set(by_title(body))
    assert "Estimated cost so far (USD)" not in titles and "Samples per dollar, live" not in titles
    texts = " ".join(w["properties"]["markdown"] for w in body["widgets"] if w["type"] == "text")
    assert "No price on record" in texts and not [w for w in body["widgets"] if w["type"] == "alarm"]
    assert all(sum(w["width"] for w in body["widgets"] if w["y"] == y) == GRID for y in {w["y"] for w in body["widgets"]})


def test_without_nvidia_gpus_no_graph_asks_for_gpu_metrics(tmp_path):
    _, body, _ = synth_dashboard(tmp_path, gpu_metrics=False, instance_type="trn1.32xlarge", alarms=())
    asked = {run_search(m["query"], series_sent())[0][1] for w in body["widgets"] for m in searches(w)}
    assert not {contract.M_GPU_UTIL, contract.M_GPU_MEMORY, contract.M_GPUS, contract.M_XID} & asked
    assert {contract.M_DISK_READ, contract.M_CPU_ACTIVE, contract.M_SAMPLES} <= asked
    assert "no NVIDIA GPUs" in body["widgets"][0]["properties"]["markdown"]


@pytest.mark.parametrize("bad", ["", "job with space", "it's", 'a"b', "(x)"])
def test_a_job_name_that_a_search_string_would_have_to_escape_is_refused(bad):
    with pytest.raises(ValueError, match="SEARCH"):
        TrainingDashboard(cdk.Stack(cdk.App(), "S"), "D", job=bad, nodes=1, gpus_per_node=1, price_per_node_hour=1.0,
                          instance_type="g5.xlarge")


# ---- the docs' image (docs/observability.md) ------------------------------------------------------
def test_the_rendering_draws_one_titled_box_per_widget_of_the_body(synthesized, tmp_path):
    import matplotlib.image as mpimg

    from scripts.render_dashboard import ILLUSTRATION, body_from_template, render

    t, body, _ = synthesized
    def layout(b):
        return [(w["type"], w["x"], w["y"], w["width"], w["height"], w["properties"].get("title")) for w in b["widgets"]]
    assert layout(body_from_template(t.to_json())) == layout(body)  # the renderer reads the body as these tests do
    out = tmp_path / "dashboard.png"
    titles = render(body, str(out))
    expected = [w["properties"].get("title", "Alarms" if w["type"] == "alarm" else None) for w in body["widgets"]]
    assert titles[1:] == expected[1:] and titles[0].startswith(f"{JOB}: {NODES} x p6-b200.48xlarge")
    img = mpimg.imread(str(out))
    assert 1300 <= img.shape[1] <= 1500 and img.shape[0] >= 900 and img.std() > 0.05
    assert ILLUSTRATION == "illustration, not data"


def test_the_illustrations_cost_and_samples_per_dollar_use_the_price_each_graph_states(synthesized):
    """The made-up curves are priced at the cluster-hour the dashboard's own labels state (the
    picture once showed samples per dollar at a stand-in $30/node-hour beside the real cost)."""
    from scripts.render_dashboard import _curves, _nodes

    _, body, _ = synthesized
    graphs = by_title(body)
    t = [0.0, 1.0, 5.0]  # hours: before and after the illustrated staging
    assert _nodes(body) == NODES
    (_, per_second), = _curves(graphs["Samples per second, whole job"], t, NODES)
    (_, per_dollar), = _curves(graphs["Samples per dollar, live"], t, NODES)
    (_, usd), = _curves(graphs["Estimated cost so far (USD)"], t, NODES)
    cluster_hour = round(NODES * PRICE, 2)  # the labels show cents
    assert per_dollar == pytest.approx([s * 3600 / cluster_hour for s in per_second], rel=1e-3)
    assert usd == pytest.approx([NODES * PRICE * h for h in t], rel=1e-3)
