"""A cluster that cannot launch says so (issue 24): the controller sorts EC2's fleet errors into
quota, capacity and price, logs one `short` line per run while short (and none once launched),
and the CapacityShort alarm's metric filter, as CDK renders it, matches exactly those lines:
the filter is checked against the controller's own output, not a hand-written line."""
from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
import pytest
from aws_cdk.assertions import Template

from constructs_lib.fleet import shortfall
from constructs_lib.observability.alarms import CapacityShortAlarm
from constructs_lib.observability.notifications import NotificationTopic
from constructs_lib.runtime import contract
from tests.cdk_checks import cfn_lint, synth_with_nag
from tests.fleet.conftest import CLUSTER, VCPU_LIMIT


@pytest.mark.parametrize("errors,kind", [
    ([f"{VCPU_LIMIT[0]}: {VCPU_LIMIT[1]}"], "quota"),
    (["MaxSpotInstanceCountExceeded: Max spot instance count exceeded"], "quota"),
    (["InsufficientInstanceCapacity: We currently do not have sufficient p5.48xlarge capacity"], "capacity"),
    (["UnfulfillableCapacity: Unable to fulfill capacity due to your request configuration"], "capacity"),
    (["SpotMaxPriceTooLow: Your Spot request price of 8.0 is lower than the minimum required Spot request "
      "fulfillment price of 9.1"], "price"),
    (["InsufficientInstanceCapacity: ...", "VcpuLimitExceeded: ..."], "quota"),  # waiting cannot clear a quota
    (["InvalidParameterValue: bad subnet"], "other"),
])
def test_fleet_errors_are_sorted_by_what_clears_them(errors, kind):
    assert shortfall.classify(errors) == kind


def _short_lines(cloud) -> list[dict]:
    return [d for d in map(json.loads, cloud.logs) if d.get("kind") == "short"]


def test_one_short_line_per_run_while_short_and_none_once_launched(cloud):
    spec = cloud.spec()
    for t in ("p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"):
        cloud.ec2.unavailable.add(t)
    for _ in range(3):
        cloud.reconcile(cloud.controller(spec))
    lines = _short_lines(cloud)
    assert len(lines) == 3 and all(d["cluster"] == CLUSTER for d in lines)
    assert lines[0]["reason"].startswith("short: 4 x p4d.24xlarge (spot): capacity: InsufficientInstanceCapacity")
    cloud.ec2.unavailable.clear()
    cloud.logs.clear()
    cloud.reconcile(cloud.controller(spec))
    assert _short_lines(cloud) == [] and cloud.types() == {"p5.48xlarge": 4}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stack = cdk.Stack(app, "Short", env=cdk.Environment(region="us-east-1"))
    group = logs.LogGroup(stack, "Controller", retention=logs.RetentionDays.ONE_MONTH)
    CapacityShortAlarm(stack, "Short", cluster=CLUSTER, log_group=group, topic=NotificationTopic(stack, "Topic").topic)
    assembly = synth_with_nag(app)
    cfn_lint([Path(out) / "Short.template.json"])
    return Template.from_json(assembly.get_stack_by_name("Short").template)


def test_the_metric_filter_matches_the_controllers_own_short_lines(template, cloud):
    (f,) = template.find_resources("AWS::Logs::MetricFilter").values()
    props = f["Properties"]
    assert props["FilterPattern"] == f'{{ ($.kind = "short") && ($.cluster = "{CLUSTER}") }}'
    (m,) = props["MetricTransformations"]
    assert (m["MetricNamespace"], m["MetricName"], m["MetricValue"]) == (contract.NS_JOB, contract.M_CAPACITY_SHORT, "1")
    assert m["Dimensions"] == [{"Key": contract.DIM_JOB, "Value": "$.cluster"}]
    # the fields the pattern selects, read from a line the controller really wrote
    cloud.ec2.unavailable.update({"p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"})
    cloud.reconcile(cloud.controller(cloud.spec()))
    (line,) = _short_lines(cloud)
    assert line["kind"] == "short" and line["cluster"] == CLUSTER


def test_the_alarm_tells_the_topic_after_three_short_runs_in_five_minutes(template):
    (a,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    p = a["Properties"]
    assert (p["Namespace"], p["MetricName"], p["Statistic"], p["Period"]) == (
        contract.NS_JOB, contract.M_CAPACITY_SHORT, "Sum", 300)
    assert p["Dimensions"] == [{"Name": contract.DIM_JOB, "Value": CLUSTER}]
    assert (p["Threshold"], p["EvaluationPeriods"], p["TreatMissingData"]) == (3, 1, "notBreaching")
    assert p["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and len(p["AlarmActions"]) == 1
    assert "CapacityStatusCommand" in p["AlarmDescription"] and "preflight" in p["AlarmDescription"]


def test_a_launch_that_fails_without_a_reason_is_other_not_price(cloud):
    """A fleet error without a code is "other": only "no option within the ceiling" is a price shortfall
    by the controller's own finding (it is passed as such, not recognised from its text)."""
    from constructs_lib.fleet.state import StateStore

    spec = cloud.spec(types=("p5.48xlarge",))
    cloud.ec2.unavailable.add("p5.48xlarge")
    cloud.ec2.answer["p5.48xlarge"] = ("", "")
    cloud.reconcile(cloud.controller(spec))
    short = StateStore(cloud.s3, spec.state_bucket, spec.state_key).load().short
    assert short["kind"] == "other" and short["what"] == "4 x p5.48xlarge (spot)"
