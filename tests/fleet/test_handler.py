"""The Lambda entry point: CloudFormation's answer always arrives (at a local HTTP server here),
and EventBridge events about other clusters cost one DescribeInstances and nothing else."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from constructs_lib.fleet import Controller, handler
from constructs_lib.runtime.contract import TAG_CLUSTER
from tests.fleet.conftest import CLUSTER, live_instances, recorded, state_change


@pytest.fixture
def cfn():
    """A stand-in for CloudFormation's pre-signed response URL on 127.0.0.1; stopped after the test."""
    answers: list[dict] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_PUT(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answers.append({"path": self.path, "content_type": self.headers.get("Content-Type"), "body": json.loads(body)})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/stack-response?X-Amz-Signature=abc", answers
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Context:
    log_stream_name = "2026/01/01/[$LATEST]0123abcd"

    def __init__(self, seconds: float = 300.0) -> None:
        self.deadline = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


def cfn_event(url: str, kind: str, physical: str | None = None) -> dict:
    event = {"RequestType": kind, "ResponseURL": url, "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/dl-x/1",
             "RequestId": "req-1", "LogicalResourceId": "Capacity", "ResourceType": "Custom::DlFleet",
             "ResourceProperties": {}}
    if physical:
        event["PhysicalResourceId"] = physical
    return event


@pytest.fixture
def spec(cloud, monkeypatch):
    spec = cloud.spec()
    monkeypatch.setenv(handler.SPEC_ENV, spec.to_json())
    return spec


def test_create_reconciles_and_answers_success(cloud, spec, cfn):
    url, answers = cfn
    result = handler.handle(cfn_event(url, "Create"), Context())
    assert result["status"] == "SUCCESS" and cloud.types() == {"p5.48xlarge": 4}
    (answer,) = answers
    body = answer["body"]
    assert answer["path"] == "/stack-response?X-Amz-Signature=abc" and answer["content_type"] == ""
    assert body["Status"] == "SUCCESS" and body["PhysicalResourceId"] == CLUSTER and body["Data"] == {"Cluster": CLUSTER}
    assert {body[k] for k in ("StackId", "RequestId", "LogicalResourceId")} == {
        "arn:aws:cloudformation:us-east-1:123456789012:stack/dl-x/1", "req-1", "Capacity"}
    assert "launched p5.48xlarge" in body["Reason"] and Context.log_stream_name in body["Reason"]


def test_delete_tears_down_and_answers_success(cloud, spec, cfn):
    url, answers = cfn
    handler.handle(cfn_event(url, "Create"), Context())
    handler.handle(cfn_event(url, "Delete", CLUSTER), Context())
    assert [a["body"]["Status"] for a in answers] == ["SUCCESS", "SUCCESS"]
    assert answers[1]["body"]["PhysicalResourceId"] == CLUSTER and "torn-down" in answers[1]["body"]["Reason"]
    assert cloud.types() == {} and cloud.store(spec).load().stopped
    # The terminations' events arrive next and launch nothing.
    assert handler.handle({"detail-type": "Scheduled Event", "detail": {}}, None)["transitions"][0]["kind"] == "waiting"
    assert cloud.types() == {}
    # The stack's ResumeCommand output invokes the function with this payload.
    done = handler.handle({handler.COMMAND_KEY: "resume"}, None)["transitions"]
    assert [t["kind"] for t in done] == ["resumed", "launched"] and sum(cloud.types().values()) == spec.nodes


def test_an_exception_answers_failed_with_the_reason(cloud, spec, cfn):
    url, answers = cfn
    cloud.s3.delete_bucket(Bucket=spec.state_bucket)
    assert handler.handle(cfn_event(url, "Create"), Context())["status"] == "FAILED"
    (answer,) = answers
    assert answer["body"]["Status"] == "FAILED" and "NoSuchBucket" in answer["body"]["Reason"]
    assert answer["body"]["PhysicalResourceId"] == CLUSTER, "the Delete that follows must tear this cluster down"


def test_an_unreadable_spec_fails_create_but_never_blocks_delete(cloud, cfn, monkeypatch):
    url, answers = cfn
    monkeypatch.setenv(handler.SPEC_ENV, '{"cluster": "x"}')
    handler.handle(cfn_event(url, "Create"), Context())
    handler.handle(cfn_event(url, "Delete", Context.log_stream_name), Context())
    assert [a["body"]["Status"] for a in answers] == ["FAILED", "SUCCESS"]
    assert "ClusterSpec: missing" in answers[0]["body"]["Reason"]
    assert answers[0]["body"]["PhysicalResourceId"] == Context.log_stream_name
    monkeypatch.delenv(handler.SPEC_ENV)
    handler.handle(cfn_event(url, "Update", "x"), Context())
    assert answers[2]["body"]["Status"] == "FAILED" and "DL_CLUSTER_SPEC is not set" in answers[2]["body"]["Reason"]


def test_cloudformation_hears_failed_before_the_function_times_out(cloud, spec, cfn, monkeypatch):
    url, answers = cfn
    monkeypatch.setattr(Controller, "reconcile", lambda self, **kw: time.sleep(1.0) or [])
    handler.handle(cfn_event(url, "Create"), Context(seconds=handler.WATCHDOG_SECONDS + 0.2))
    (answer,) = answers  # the late SUCCESS is not sent: CloudFormation takes one answer
    assert answer["body"]["Status"] == "FAILED" and "did not finish before the function's timeout" in answer["body"]["Reason"]


def test_delete_of_a_renamed_cluster_terminates_the_former_one_only(cloud, spec, cfn):
    url, answers = cfn
    handler.handle(cfn_event(url, "Create"), Context())
    tags = [{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "old-name"}]}]
    old = cloud.raw.run_instances(ImageId="ami-12c6146b", InstanceType="p4d.24xlarge", MinCount=2, MaxCount=2,
                                  SubnetId=cloud.subnets[0], TagSpecifications=tags)["Instances"]
    handler.handle(cfn_event(url, "Delete", "old-name"), Context())
    assert answers[-1]["body"]["Status"] == "SUCCESS" and answers[-1]["body"]["PhysicalResourceId"] == "old-name"
    assert live_instances(cloud.raw, "old-name") == [] and len(old) == 2
    assert cloud.types() == {"p5.48xlarge": 4} and not cloud.store(spec).load().stopped


def test_eventbridge_events_of_other_clusters_are_ignored_cheaply(cloud, spec):
    other = cloud.raw.run_instances(ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                    SubnetId=cloud.subnets[0])["Instances"][0]["InstanceId"]
    event = {"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification",
             "detail": {"instance-id": other, "state": "running"}}
    assert "ignored" in handler.handle(event, None)
    assert cloud.types() == {} and cloud.store(spec).load() is None, "no reconcile, no state"


def test_eventbridge_schedule_and_spot_warnings_reconcile(cloud, spec):
    done = handler.handle({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}, None)
    assert [t["kind"] for t in done["transitions"]] == ["launched"]
    doomed = live_instances(cloud.raw)[0]["InstanceId"]
    warning = {"source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning",
               "detail": {"instance-id": doomed, "instance-action": "terminate"}}
    assert [t["kind"] for t in handler.handle(warning, None)["transitions"]] == ["replaced"]
    assert cloud.types() == {"p5.48xlarge": 5}
    # A rebalance recommendation is advice, not a notice: nothing is replaced for it.
    rebalance = {"source": "aws.ec2", "detail-type": "EC2 Instance Rebalance Recommendation",
                 "detail": {"instance-id": live_instances(cloud.raw)[1]["InstanceId"]}}
    assert handler.handle(rebalance, None)["transitions"] == []
    unknown = {"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification",
               "detail": {"instance-id": "i-0000000000000abcd", "state": "pending"}}
    assert "ignored" in handler.handle(unknown, None), "not a member: the 1-minute schedule sees a launch anyway"


def test_with_a_state_an_event_of_a_non_member_costs_no_ec2_call(cloud, spec):
    """Every EC2 state change in the region wakes every cluster's controller: one launch of 64
    nodes in an account of 10 clusters used to cost 1,280 DescribeInstances (issue 27)."""
    import boto3

    handler.handle({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}, None)
    members = cloud.store(spec).load().members
    assert sorted(members) == sorted(i["InstanceId"] for i in live_instances(cloud.raw))
    other = cloud.raw.run_instances(ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                    SubnetId=cloud.subnets[0])["Instances"][0]["InstanceId"]
    calls: list[str] = []
    session = boto3.Session()
    session.events.register("before-call", lambda model, **kw: calls.append(f"{model.service_model.service_name}:"
                                                                             f"{model.name}"))
    boto3.DEFAULT_SESSION = session
    try:
        got = handler.handle({"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification",
                              "detail": {"instance-id": other, "state": "pending"}}, None)
    finally:
        boto3.DEFAULT_SESSION = None
    assert "ignored" in got and calls == ["s3:GetObject"], calls


def test_a_members_launch_events_cost_no_ec2_call(cloud, spec):
    """A launch of 512 nodes sends 1,024 events (pending, running) within a minute; each used to
    cost a DescribeInstances of an instance the state already listed (issue 36). Now each costs the
    state's GET and nothing else, and changes nothing."""
    handler.handle({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}, None)
    before = cloud.store(spec).load()
    members = sorted(before.members)
    assert len(members) == spec.nodes
    for instance in members:
        for state in ("pending", "running"):
            got, calls = recorded(state_change(instance, state))
            assert "ignored" in got and "already counts" in got["ignored"], got
            assert [op for op, _ in calls] == ["s3:GetObject"], calls
    after = cloud.store(spec).load()
    assert after.history == before.history and sorted(after.members) == members, "no reconcile ran"


def test_a_member_that_goes_reconciles_without_a_lookup_of_its_own(cloud, spec):
    """A member's loss still reconciles at once (its replacement starts now, not at the next
    minute); the only EC2 calls are the reconcile's, never a DescribeInstances of that instance."""
    handler.handle({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}, None)
    doomed = live_instances(cloud.raw)[0]["InstanceId"]
    cloud.raw.terminate_instances(InstanceIds=[doomed])
    got, calls = recorded(state_change(doomed, "shutting-down"))
    assert [t["kind"] for t in got["transitions"]] == ["replaced"], got
    assert not [p for op, p in calls if op == "ec2:DescribeInstances" and p.get("InstanceIds") == [doomed]], calls
    assert cloud.types() == {"p5.48xlarge": spec.nodes}


def test_without_a_state_an_event_is_still_checked_with_ec2(cloud, spec):
    """No state yet (a new stack): EC2 says whose the instance is, as before; another cluster's
    instance is dropped, this cluster's reconciles."""
    other = cloud.raw.run_instances(ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                    SubnetId=cloud.subnets[0])["Instances"][0]["InstanceId"]
    got, calls = recorded(state_change(other, "running"))
    assert "ignored" in got and cloud.store(spec).load() is None
    assert ("ec2:DescribeInstances", {"InstanceIds": [other]}) in calls, calls
    mine = cloud.raw.run_instances(ImageId="ami-12c6146b", InstanceType="p5.48xlarge", MinCount=1, MaxCount=1,
                                   SubnetId=cloud.subnets[0], TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                       {"Key": TAG_CLUSTER, "Value": CLUSTER}]}])["Instances"][0]["InstanceId"]
    got, calls = recorded(state_change(mine, "running"))
    assert "transitions" in got, got
    assert ("ec2:DescribeInstances", {"InstanceIds": [mine]}) in calls, calls
