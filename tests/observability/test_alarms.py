"""StarvedGpuAlarm and NodeHealthAlarm, synthesized in a small stack (cdk-nag and cfn-lint clean)
and read back from the template. Their conditions are evaluated per data point with the
operators' documented meaning (user guide, "Using metric math": comparisons give 1 or 0, AND and
OR combine them), on the situations they must and must not catch; every series they watch is one
the nodes send with the Job dimension alone (the agent's aggregation_dimensions, the monitor's
datums), since a metric-math alarm cannot SEARCH."""
from __future__ import annotations

import re
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from constructs_lib.observability.alarms import NodeHealthAlarm, StarvedGpuAlarm
from constructs_lib.observability.notifications import NotificationTopic
from constructs_lib.runtime import contract
from constructs_lib.runtime.cwagent_config import agent_config
from constructs_lib.runtime.monitor import Monitor
from tests.cdk_checks import cfn_lint, synth_with_nag

JOB = "dl-multi-node-training"
PREFIX = {"nvidia_gpu": "nvidia_smi", "cpu": "cpu", "mem": "mem", "diskio": "diskio"}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stack = cdk.Stack(app, "Alarms", env=cdk.Environment(region="us-east-1"))
    topic = NotificationTopic(stack, "Topic").topic
    StarvedGpuAlarm(stack, "Starved", job=JOB, topic=topic)
    NodeHealthAlarm(stack, "Health", job=JOB, expected_gpus=8, topic=topic)
    StarvedGpuAlarm(stack, "Quick", job=JOB, period=cdk.Duration.minutes(1), periods=10, gpu_below_pct=30)
    assembly = synth_with_nag(app)  # any unacknowledged AwsSolutions finding fails here
    cfn_lint([Path(out) / "Alarms.template.json"])
    t = Template.from_json(assembly.get_stack_by_name("Alarms").template)
    return {k: v["Properties"] for k, v in t.find_resources("AWS::CloudWatch::Alarm").items()}, t


def _alarm(synthesized, construct: str) -> dict:
    (props,) = [p for k, p in synthesized[0].items() if k.startswith(construct)]
    return props


def _watched(props: dict) -> tuple[str, dict[str, dict]]:
    """The expression the alarm watches and its metrics by id."""
    (expr,) = [q for q in props["Metrics"] if q.get("ReturnData", True) and "Expression" in q]
    metrics = {q["Id"]: q["MetricStat"] for q in props["Metrics"] if "MetricStat" in q}
    assert all(q.get("ReturnData") is False for q in props["Metrics"] if "MetricStat" in q)
    return expr["Expression"], metrics


def breaching(expression: str, **point: float) -> bool:
    """One data point of a 0/1 condition: comparisons and AND/OR as documented, per data point."""
    python = expression.replace(" AND ", " and ").replace(" OR ", " or ")
    assert re.fullmatch(r"[a-z0-9 .<>=()]+", python), python
    return bool(eval(python, {"__builtins__": {}}, point))  # noqa: S307 - our own synthesized expression


def _job_wide_series() -> set[tuple[str, str]]:
    """(namespace, metric) of every series the nodes send with the Job dimension alone."""
    config = agent_config(job=JOB)["metrics"]
    out = set()
    if [contract.DIM_JOB] in config["aggregation_dimensions"]:
        for section, block in config["metrics_collected"].items():
            out |= {(config["namespace"], f"{PREFIX[section]}_{m}") for m in block["measurement"]}
    m = Monitor.__new__(Monitor)
    m.job, m.instance_id = JOB, "i-0"
    for name in (contract.M_SAMPLES, contract.M_TRAINING, contract.M_RESTORING, contract.M_GPUS, contract.M_XID):
        if any([d["Name"] for d in x["Dimensions"]] == [contract.DIM_JOB] for x in m.datum(name, 1.0, 0.0)):
            out.add((contract.NS_JOB, name))
    return out


@pytest.mark.parametrize("construct", ["Starved", "Health", "Quick"])
def test_alarms_watch_one_condition_of_job_wide_series_the_nodes_send(synthesized, construct):
    props = _alarm(synthesized, construct)
    _, metrics = _watched(props)
    assert 1 <= len(metrics) <= 10  # a metric-math alarm takes up to 10 metrics, all of one period
    assert len({m["Period"] for m in metrics.values()}) == 1
    sent = _job_wide_series()
    for m in metrics.values():
        assert m["Metric"]["Dimensions"] == [{"Name": contract.DIM_JOB, "Value": JOB}]
        assert (m["Metric"]["Namespace"], m["Metric"]["MetricName"]) in sent
    assert props["Threshold"] == 1 and props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert props["TreatMissingData"] == "notBreaching"
    assert len(props["AlarmDescription"]) <= 1024 and JOB in props["AlarmDescription"]


def test_starved_gpus_catch_a_starved_job_and_nothing_else(synthesized):
    props = _alarm(synthesized, "Starved")
    expression, metrics = _watched(props)
    by_name = {m["Metric"]["MetricName"]: (i, m["Stat"]) for i, m in metrics.items()}
    gpu, cpu, iowait, training = (by_name[n][0] for n in (contract.M_GPU_UTIL, contract.M_CPU_ACTIVE,
                                                           contract.M_CPU_IOWAIT, contract.M_TRAINING))
    assert by_name[contract.M_GPU_UTIL][1] == "Average" and by_name[contract.M_TRAINING][1] == "Minimum"

    def starved(g: float, c: float, io: float, train: float = 1.0) -> bool:
        return breaching(expression, **{gpu: g, cpu: c, iowait: io, training: train})

    assert starved(35, 97, 3)           # CPU-bound loader
    assert starved(20, 40, 45)          # waiting on the disk
    assert not starved(93, 97, 3)       # busy GPUs, busy CPUs: fine
    assert not starved(35, 60, 10)      # low GPU, nothing saturated: not a loader problem
    assert not starved(50, 97, 3)       # at the threshold, not under it
    assert not starved(0, 5, 0, 0)      # idle cluster: the idle guard's business
    assert not starved(0, 30, 60, 0)    # restoring a checkpoint: disks busy, GPUs idle, not training
    for m in metrics.values():
        assert m["Period"] == 300
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 3  # 15 minutes running
    d = props["AlarmDescription"]
    assert "NVMe RAID at /scratch" in d and "num_workers" in d and "vCPUs per GPU" in d and "15 minutes" in d
    assert len(props["AlarmActions"]) == 1


def test_starved_gpus_window_and_thresholds_are_configurable(synthesized):
    props = _alarm(synthesized, "Quick")
    expression, metrics = _watched(props)
    assert {m["Period"] for m in metrics.values()} == {60}
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 10 and "10 minutes" in props["AlarmDescription"]
    ids = {m["Metric"]["MetricName"]: i for i, m in metrics.items()}
    point = {ids[contract.M_CPU_ACTIVE]: 97, ids[contract.M_CPU_IOWAIT]: 0, ids[contract.M_TRAINING]: 1}
    assert breaching(expression, **point, **{ids[contract.M_GPU_UTIL]: 25})
    assert not breaching(expression, **point, **{ids[contract.M_GPU_UTIL]: 35})
    assert "AlarmActions" not in props  # no topic given


def test_node_health_on_any_xid_or_a_missing_gpu(synthesized):
    props = _alarm(synthesized, "Health")
    expression, metrics = _watched(props)
    ids = {m["Metric"]["MetricName"]: i for i, m in metrics.items()}
    assert metrics[ids[contract.M_XID]]["Stat"] == "Sum" and metrics[ids[contract.M_GPUS]]["Stat"] == "Minimum"

    def broken(xid: float, gpus: float) -> bool:
        return breaching(expression, **{ids[contract.M_XID]: xid, ids[contract.M_GPUS]: gpus})

    assert not broken(0, 8) and broken(1, 8) and broken(0, 7) and broken(3, 0)
    assert props["EvaluationPeriods"] == 1 and len(props["AlarmActions"]) == 1
    assert f"{contract.TAG_HEALTH}={contract.HEALTH_REPLACE}" in props["AlarmDescription"]


@pytest.mark.parametrize("kw", [dict(gpu_below_pct=0), dict(cpu_above_pct=100), dict(iowait_above_pct=-1),
                                dict(periods=0)])
def test_starved_gpu_settings_out_of_range_are_refused(kw):
    with pytest.raises(ValueError):
        StarvedGpuAlarm(cdk.Stack(cdk.App(), "S"), "A", job=JOB, **kw)


def test_node_health_needs_gpus():
    with pytest.raises(ValueError, match="expected_gpus"):
        NodeHealthAlarm(cdk.Stack(cdk.App(), "S"), "A", job=JOB, expected_gpus=0)
