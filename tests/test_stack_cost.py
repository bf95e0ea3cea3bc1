"""The whole cost of a synthesized stack, checked from outside: resources counted in the template
CloudFormation would deploy, custom metric series counted as CloudWatch stores them (the real node
monitor's PutMetricData into moto, the agent's configuration as its documentation defines series),
priced with the published prices recorded in tests/data (not the product's table)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import aws_cdk as cdk
import boto3
import pytest
from aws_cdk.assertions import Template

from dl_stacks.settings import from_context
from dl_stacks.training_stack import TrainingStack

RECORD = json.loads((Path(__file__).parent / "data" / "published_service_prices.json").read_text())
P = {k: v for k, (v, _) in RECORD["prices"].items()}
MONTH = RECORD["hours_per_month"][0]


def synth(ctx):
    stack = TrainingStack.for_settings(cdk.App(), from_context(ctx), quiet=True)
    return stack, Template.from_stack(stack).to_json()


def of_type(t, kind):
    return [r for r in t["Resources"].values() if r["Type"] == kind]


_SERIES: dict[tuple[int, bool], tuple[int, int]] = {}


def monitor_series(tmp_path, monkeypatch, gpus: int, cuda: bool) -> tuple[int, int]:
    """(per node, per cluster) series the real monitor creates in moto CloudWatch in one minute."""
    if (gpus, cuda) not in _SERIES:
        _SERIES[gpus, cuda] = _monitor_series(tmp_path, monkeypatch, gpus, cuda)
    return _SERIES[gpus, cuda]


def _monitor_series(tmp_path, monkeypatch, gpus: int, cuda: bool) -> tuple[int, int]:
    from moto import mock_aws

    from constructs_lib.runtime.monitor import Monitor
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    smi = tmp_path / "nvidia-smi"
    listing = "\n".join(f"GPU {i}: NVIDIA (UUID: GPU-{i})" for i in range(gpus))
    smi.write_text(f"#!/bin/bash\n[ \"$1\" = -L ] && {{ echo '{listing}'; exit 0; }}\necho 4242\n")
    smi.chmod(0o755)
    with mock_aws():
        cw, ec2 = boto3.client("cloudwatch", region_name="us-east-1"), boto3.client("ec2", region_name="us-east-1")
        node = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        m = Monitor(cloudwatch=cw, ec2=ec2, instance_id=node, job="j", expected_gpus=gpus, gpu=cuda,
                    nvidia_smi=str(smi), log=lambda s: None)
        m.minute.samples.append(100.0)  # a job that prints throughput
        m.tick()
        series = {json.dumps(sorted((d["Name"], d["Value"]) for d in x["Dimensions"])) + x["MetricName"]
                  for x in cw.list_metrics(Namespace="dl-launcher/Job")["Metrics"]}
    per_node = sum(1 for s in series if node in s)
    return per_node, len(series) - per_node


def agent_series(config: dict, gpus: int) -> tuple[int, int]:
    """Series per the agent's documentation: each measurement with its plugin's own dimensions (per
    GPU for nvidia_gpu; cpu-total for totalcpu; the device for diskio; none extra for mem), plus
    each aggregation_dimensions set; identical dimension sets are one series."""
    collected = config["metrics"]["metrics_collected"]
    per_node = per_cluster = 0
    own = {"nvidia_gpu": gpus, "cpu": 1, "diskio": len(collected.get("diskio", {}).get("resources", [])), "mem": 0}
    for plugin, section in collected.items():
        k = len(section["measurement"])
        raw = own[plugin]
        # [Job, InstanceId] is the raw series itself where the plugin adds no dimension of its own.
        per_node += k * raw + k
        per_cluster += k
    return per_node, per_cluster


@pytest.mark.parametrize("ctx", [
    {"profile": "multi-node-training", "command": "python train.py"},
    {"profile": "single-gpu-training"},  # interactive: the guard reads sessions and GPU processes too
    {"profile": "dev-prototyping"},  # no observability: no metrics, alarms, dashboard or guard
    {"profile": "training", "subnet_ids": "subnet-0123456789abcdef0", "vpc_id": "vpc-0123456789abcdef0",
     "availability_zone": "us-east-1a", "nodes": "3"},  # an existing VPC: no NAT gateway of ours
])
def test_every_line_matches_the_template_and_the_published_prices(ctx, tmp_path, monkeypatch):
    stack, t = synth(ctx)
    cost = stack.cost
    got = {line.what: line.per_hour for line in cost.lines}
    n = stack.settings.nodes
    want: dict[str, float] = {}
    nat, eip = len(of_type(t, "AWS::EC2::NatGateway")), len(of_type(t, "AWS::EC2::EIP"))
    if nat:
        want["NAT gateway"] = nat * P["nat_gateway_hour"]
    if eip:
        want["public IPv4 address"] = eip * P["public_ipv4_hour"]
    (lt, *_) = of_type(t, "AWS::EC2::LaunchTemplate")
    (root,) = [b["Ebs"] for b in lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"] if "Ebs" in b]
    assert root["VolumeType"] == "gp3" and "Iops" not in root and "Throughput" not in root, "baseline gp3 only"
    want["root volumes (gp3)"] = n * root["VolumeSize"] * P["ebs_gp3_gb_month"] / MONTH
    params = [r for r in of_type(t, "AWS::SSM::Parameter") if r["Properties"]["Name"].endswith("/cloudwatch-agent")]
    if params:
        gpus = stack.selection.pick.facts.accelerator_count
        config = json.loads(params[0]["Properties"]["Value"])
        a_node, a_cluster = agent_series(config, gpus)
        m_node, m_cluster = monitor_series(tmp_path, monkeypatch, gpus, "nvidia_gpu" in config["metrics"]["metrics_collected"])
        want["custom metrics, per node"] = n * (a_node + m_node) * P["cw_metric_month"] / MONTH
        want["custom metrics, cluster-wide"] = (a_cluster + m_cluster) * P["cw_metric_month"] / MONTH
        guard = [r for r in of_type(t, "AWS::Events::Rule") if r["Properties"].get("ScheduleExpression") == "rate(5 minutes)"
                 and "idle" in r["Properties"].get("Description", "")]
        if guard:
            env = [r for r in of_type(t, "AWS::Lambda::Function")
                   if r["Properties"]["Handler"] == "constructs_lib.fleet.idle_watch.handle"][0]
            interactive = re.search(r'interactive\\*"\s*:\s*true', json.dumps(env)) is not None
            # Per run and node: each GPU, two CPU series, restoring and training (+ sessions, GPU processes).
            per_node = gpus + 4 + (2 if interactive else 0)
            want["idle guard's metric reads"] = 12 * n * per_node * P["cw_metrics_requested_1000"] / 1000
    alarm_metrics = sum(sum(1 for q in a["Properties"]["Metrics"] if "MetricStat" in q) if "Metrics" in a["Properties"]
                        else 1 for a in of_type(t, "AWS::CloudWatch::Alarm"))
    if alarm_metrics:
        want["alarms"] = alarm_metrics * P["cw_alarm_metric_month"] / MONTH
    if of_type(t, "AWS::CloudWatch::Dashboard"):
        want["dashboard"] = len(of_type(t, "AWS::CloudWatch::Dashboard")) * P["cw_dashboard_month"] / MONTH
    if of_type(t, "AWS::KMS::Key"):
        want["KMS keys"] = len(of_type(t, "AWS::KMS::Key")) * P["kms_key_month"] / MONTH
    assert got.keys() == want.keys()
    for what in want:
        assert got[what] == pytest.approx(want[what], rel=1e-9), what
    # The instances: the pick on every node in its market, the catalog's price.
    assert cost.instances.per_hour == pytest.approx(n * stack.selection.prices[stack.selection.pick.instance_type].in_market)
    out = t["Outputs"]
    assert out["CostPerHour"]["Value"].startswith(f"${cost.per_hour:,.2f}/h")
    model = json.loads(out["CostModel"]["Value"])
    assert model["fixed_per_hour"] + n * model["per_node_hour"] == pytest.approx(cost.other_per_hour, abs=1e-5)


def test_the_products_table_agrees_with_the_published_record():
    from dl_stacks.stack_cost import prices_for
    p = prices_for("us-east-1")
    for key, value in P.items():
        assert p[key] == value, key
    assert p.month == MONTH


def test_a_region_without_a_row_says_whose_prices_it_uses():
    stack, t = synth({"profile": "dev-prototyping", "region": "ap-south-2"})
    assert "us-east-1's (none on record for ap-south-2)" in stack.cost.note


def test_budget_creates_a_budget_on_the_jobs_tag_told_to_the_jobs_topic():
    stack, t = synth({"profile": "multi-node-training", "budget": "5000", "job": "llm"})
    (b,) = of_type(t, "AWS::Budgets::Budget")
    data = b["Properties"]["Budget"]
    assert data["BudgetLimit"] == {"Amount": 5000, "Unit": "USD"} and data["TimeUnit"] == "MONTHLY"
    assert data["CostFilters"] == {"TagKeyValue": ["user:dl-launcher:job$llm"]}
    topics = {json.dumps(s["Address"]) for n in b["Properties"]["NotificationsWithSubscribers"] for s in n["Subscribers"]}
    (topic_id,) = [k for k, r in t["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
    assert topics == {json.dumps({"Ref": topic_id})}
    # Budgets may publish to it, and every node and volume carries the tag the budget filters on.
    policy = json.dumps(of_type(t, "AWS::SNS::TopicPolicy"))
    assert "budgets.amazonaws.com" in policy
    for lt in of_type(t, "AWS::EC2::LaunchTemplate"):
        specs = lt["Properties"]["LaunchTemplateData"]["TagSpecifications"]
        assert {s["ResourceType"] for s in specs} >= {"instance", "volume"}
        assert all({"Key": "dl-launcher:job", "Value": "llm"} in s["Tags"] for s in specs)
    no_obs, t2 = synth({"profile": "dev-prototyping", "budget": "100"})
    assert of_type(t2, "AWS::Budgets::Budget") and "budgets.amazonaws.com" in json.dumps(of_type(t2, "AWS::SNS::TopicPolicy"))
