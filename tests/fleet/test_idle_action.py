"""The idle guard's action against moto: the final checkpoint push is sent to every node over SSM,
the cluster's capacity is released (nothing relaunches it), and the team is told over SNS (read
back through an SQS subscription). A push that cannot be sent still stops the cluster, and says so."""
from __future__ import annotations

import json

import boto3
import pytest

from constructs_lib.fleet.idle_action import PUSH_COMMAND, push_checkpoints, stop_idle
from constructs_lib.fleet.idle_guard import Decision

from .conftest import REGION, live_instances

IDLE = Decision(True, "idle", "all 16 GPUs under 5% for 30 min and the training process is gone")


def _running(cloud):
    ctl = cloud.controller(cloud.spec(nodes=2))
    cloud.reconcile(ctl)
    ids = [i["InstanceId"] for i in live_instances(cloud.raw)]
    assert len(ids) == 2
    return ctl, ids


def test_idle_cluster_is_pushed_released_and_reported(cloud, topic):
    sns, arn, sqs, url = topic
    ctl, ids = _running(cloud)
    ssm = boto3.client("ssm", region_name=REGION)
    report = stop_idle(IDLE, controller=ctl, ssm=ssm, sns=sns, topic_arn=arn, instance_ids=ids, push_timeout=5,
                       poll=0)
    assert live_instances(cloud.raw) == []
    assert sorted(report.terminated) == sorted(ids)
    assert set(report.pushed) == set(ids)
    sent = ssm.list_commands()["Commands"]
    assert len(sent) == 1 and sent[0]["Parameters"]["commands"] == [PUSH_COMMAND]
    assert sorted(sent[0]["InstanceIds"]) == sorted(ids)
    body = json.loads(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"][0]["Body"])
    assert body["Subject"] == "dl-launcher: idle cluster llm-7b stopped"
    assert "training process is gone" in body["Message"] and all(i in body["Message"] for i in ids)
    # Stopped is stored: the terminations' own events do not bring the cluster back.
    cloud.reconcile(ctl)
    assert live_instances(cloud.raw) == []
    assert ctl.reconcile(resume=True) and len(live_instances(cloud.raw)) == 2


class BrokenSsm:
    def send_command(self, **kw):
        raise RuntimeError("An error occurred (AccessDeniedException) when calling the SendCommand operation")


def test_a_push_that_cannot_be_sent_is_reported_and_the_cluster_still_stops(cloud, topic):
    sns, arn, sqs, url = topic
    ctl, ids = _running(cloud)
    report = stop_idle(IDLE, controller=ctl, ssm=BrokenSsm(), sns=sns, topic_arn=arn, instance_ids=ids)
    assert live_instances(cloud.raw) == []
    assert all(v.startswith("not sent: An error occurred (AccessDeniedException)") for v in report.pushed.values())
    body = json.loads(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"][0]["Body"])
    assert "AccessDeniedException" in body["Message"]


def test_a_push_still_running_at_the_deadline_is_reported():
    class SlowSsm:
        def send_command(self, **kw):
            return {"Command": {"CommandId": "c-1"}}

        def get_command_invocation(self, **kw):
            return {"Status": "InProgress"} if kw["InstanceId"] == "i-slow" else {"Status": "Success"}

    t = [0.0]
    out = push_checkpoints(SlowSsm(), ["i-slow", "i-fast"], timeout=60, poll=10, clock=lambda: t[0],
                           sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert out == {"i-fast": "Success", "i-slow": "still running after 60 s"}


def test_a_busy_decision_is_refused(cloud, topic):
    sns, arn, _, _ = topic
    ctl, ids = _running(cloud)
    with pytest.raises(ValueError, match="decided not to stop"):
        stop_idle(Decision(False, "busy", "GPU 3 at 60%"), controller=ctl, ssm=BrokenSsm(), sns=sns, topic_arn=arn,
                  instance_ids=ids)
    assert len(live_instances(cloud.raw)) == 2
