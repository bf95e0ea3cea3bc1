"""A product's spent budget stops its clusters: the stopper finds the product's capacity
controllers by their tags (moto's Resource Groups Tagging API over moto's Lambda) and invokes
`stop` on each, and `stop` on a controller tears its cluster down until `resume` (moto EC2/S3)."""
from __future__ import annotations

import io
import json
import zipfile

import boto3

from constructs_lib.fleet import budget_stop, handler
from constructs_lib.runtime.contract import FUNCTION_CONTROLLER, TAG_FUNCTION, TAG_PRODUCT
from tests.fleet.conftest import REGION

STOP_TOPIC = "arn:aws:sns:us-east-1:123456789012:team-multi-node-training-stop"


class Invokes:
    """moto's Lambda would need Docker to run a function: this records what would have run."""

    def __init__(self, client):
        self.client, self.calls = client, []

    def invoke(self, **kw):
        self.calls.append(kw)
        return {"StatusCode": 202}


def _function(lam, iam_role: str, name: str, tags: dict) -> str:
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("index.py", "def handle(e, c):\n    return e\n")
    return lam.create_function(FunctionName=name, Runtime="python3.12", Role=iam_role, Handler="index.handle",
                               Code={"ZipFile": code.getvalue()}, Tags=tags)["FunctionArn"]


def test_the_stopper_invokes_stop_on_the_products_controllers_only(aws, monkeypatch):
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    lam = boto3.client("lambda", region_name=REGION)
    mine = [_function(lam, role, f"SC-1-pp-{i}-Controller", {TAG_PRODUCT: "team/multi-node-training",
                                                             TAG_FUNCTION: FUNCTION_CONTROLLER}) for i in range(2)]
    _function(lam, role, "SC-1-pp-x-Controller", {TAG_PRODUCT: "team/team-notebook", TAG_FUNCTION: FUNCTION_CONTROLLER})
    _function(lam, role, "SC-1-pp-0-IdleGuard", {TAG_PRODUCT: "team/multi-node-training"})
    sns = boto3.client("sns", region_name=REGION)
    alerts = sns.create_topic(Name="budget-alerts")["TopicArn"]
    sqs = boto3.client("sqs", region_name=REGION)
    queue = sqs.create_queue(QueueName="inbox")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=alerts, Protocol="sqs", Endpoint=queue_arn)
    monkeypatch.setenv(budget_stop.TOPICS_ENV, json.dumps({STOP_TOPIC: "team/multi-node-training"}))
    monkeypatch.setenv(budget_stop.ALERTS_ENV, alerts)
    invokes = Invokes(lam)
    event = {"Records": [{"Sns": {"TopicArn": STOP_TOPIC, "Subject": "AWS Budgets: dl-launcher team/multi-node-training "
                                                                     "has exceeded your alert threshold"}},
                         {"Sns": {"TopicArn": "arn:aws:sns:us-east-1:123456789012:someone-else"}}]}
    done = budget_stop.handle(event, None, tagging=boto3.client("resourcegroupstaggingapi", region_name=REGION),
                              lam=invokes, sns_client=sns)
    assert sorted(done["team/multi-node-training"]) == sorted(mine) and len(done) == 1
    assert sorted(c["FunctionName"] for c in invokes.calls) == sorted(mine)
    for c in invokes.calls:
        payload = json.loads(c["Payload"])
        assert c["InvocationType"] == "Event" and payload["dl-launcher"] == "stop"
        assert "monthly budget of team/multi-node-training is spent" in payload["reason"]
    (msg,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    assert "stopping 2 cluster(s)" in json.loads(msg["Body"])["Message"]


def test_stop_tears_the_cluster_down_until_resume(cloud, monkeypatch):
    spec = cloud.spec()
    monkeypatch.setenv(handler.SPEC_ENV, spec.to_json())
    handler.handle({handler.COMMAND_KEY: "resume"}, None)
    assert sum(cloud.types().values()) == spec.nodes
    done = handler.handle({handler.COMMAND_KEY: "stop", "reason": "the monthly budget of team/x is spent"}, None)
    assert [t["kind"] for t in done["transitions"]] == ["torn-down"]
    assert "budget of team/x is spent" in done["transitions"][0]["reason"]
    assert cloud.types() == {} and cloud.store(spec).load().stopped
    # the schedule's next reconcile launches nothing; the stack's ResumeCommand starts it again
    assert handler.handle({"detail-type": "Scheduled Event", "detail": {}}, None)["transitions"][0]["kind"] == "waiting"
    assert cloud.types() == {}
    handler.handle({handler.COMMAND_KEY: "resume"}, None)
    assert sum(cloud.types().values()) == spec.nodes
