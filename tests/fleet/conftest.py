"""moto's EC2 and S3 in-process, with capacity failures injected the way AWS reports them."""
from __future__ import annotations

import copy
import threading
import time
import uuid
from typing import Any, Callable, Optional

import boto3
import pytest
from botocore.exceptions import ClientError

from constructs_lib.fleet import CapacityOption, ClusterSpec, Controller, StateStore
from constructs_lib.runtime.contract import TAG_CLUSTER, capacity_state_key

REGION, AZ = "us-east-1", "us-east-1a"
CLUSTER = "llm-7b"
BUCKET = "dl-fleet-state"
# Per-node USD/h, made up for the tests; the catalog supplies real ones.
PRICES = {"p5.48xlarge": 40.0, "p5en.48xlarge": 45.0, "p4d.24xlarge": 20.0, "p5e.48xlarge": None}


# EC2's own wording of a vCPU quota shortfall (the EC2 API reference's error codes, and what
# CreateFleet's Errors[] carries for it).
VCPU_LIMIT = ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 0 allows "
              "for the instance bucket that the specified instance type belongs to. Please visit "
              "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")


def ice_error(request: dict[str, Any], instance_type: str, code: Optional[tuple[str, str]] = None) -> dict[str, Any]:
    """What an instant fleet answers for a pool with no capacity (one entry per failed override);
    `code`: another (ErrorCode, ErrorMessage), e.g. VCPU_LIMIT."""
    config = request["LaunchTemplateConfigs"][0]
    market = request["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
    error, message = code or (
        "InsufficientInstanceCapacity",
        f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
        f"requested ({AZ}). Our system will be working on provisioning additional capacity.")
    return {
        "LaunchTemplateAndOverrides": {"LaunchTemplateSpecification": config["LaunchTemplateSpecification"],
                                       "Overrides": config["Overrides"][0]},
        "Lifecycle": "spot" if market == "spot" else "on-demand",
        "ErrorCode": error,
        "ErrorMessage": message,
    }


class FlakyEc2:
    """The boto3 EC2 client, except where a test says capacity is short:

    unavailable: types whose create_fleet launches nothing and answers InsufficientInstanceCapacity;
    partial: type -> how many the fleet gets before running out (the rest are errors), as a
             Capacity Block or a fleet without MinTargetCapacity can answer;
    hidden: instance ids DescribeInstances does not list yet (its eventual consistency);
    refuse: type -> an error code create_fleet raises, as botocore does for AWS's error answers;
    answer: type -> (ErrorCode, ErrorMessage) an unavailable type answers instead of capacity's.
    Every create_fleet request is recorded, and after every launch the cluster is checked for
    mixed types: `mixed` lists any moment it held two.
    """

    def __init__(self, client: Any, cluster: str = CLUSTER) -> None:
        self._client = client
        self.cluster = cluster
        self.unavailable: set[str] = set()
        self.partial: dict[str, int] = {}
        self.hidden: set[str] = set()
        self.refuse: dict[str, str] = {}
        self.answer: dict[str, tuple[str, str]] = {}
        self.requests: list[dict[str, Any]] = []
        self.mixed: list[dict[str, int]] = []
        self.delay = 0.0                       # seconds each create_fleet takes (real ones take seconds)
        self.after_fleet: Callable[[], Any] = lambda: None

    def create_fleet(self, **request: Any) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(request))
        instance_type = request["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"]
        if instance_type in self.refuse:
            code = self.refuse[instance_type]
            raise ClientError({"Error": {"Code": code, "Message": f"{code} (injected)"}}, "CreateFleet")
        want = request["TargetCapacitySpecification"]["TotalTargetCapacity"]
        got = 0 if instance_type in self.unavailable else min(want, self.partial.get(instance_type, want))
        time.sleep(self.delay)
        answer: dict[str, Any] = {"FleetId": f"fleet-{uuid.uuid4()}", "Instances": [], "Errors": []}
        if got:
            launched = copy.deepcopy(request)
            launched["TargetCapacitySpecification"]["TotalTargetCapacity"] = got
            answer = self._client.create_fleet(**launched)
            answer.setdefault("Errors", [])
        if got < want:
            answer["Errors"].append(ice_error(request, instance_type, self.answer.get(instance_type)))
        counts = cluster_types(self._client, self.cluster)
        if len(counts) > 1:
            self.mixed.append(counts)
        self.after_fleet()
        return answer

    def describe_instances(self, **kw: Any) -> dict[str, Any]:
        page = self._client.describe_instances(**kw)
        for r in page["Reservations"]:
            r["Instances"] = [i for i in r["Instances"] if i["InstanceId"] not in self.hidden]
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class AtomicS3:
    """S3 applies a conditional PutObject atomically; moto in-process checks, then writes, and two
    threads can both pass the check. One lock around put_object gives back S3's guarantee."""

    _lock = threading.Lock()

    def __init__(self, client: Any) -> None:
        self._client = client

    def put_object(self, **kw: Any) -> Any:
        with self._lock:
            return self._client.put_object(**kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def cluster_types(ec2: Any, cluster: str = CLUSTER) -> dict[str, int]:
    """Pending/running instances of the cluster per type, straight from moto."""
    counts: dict[str, int] = {}
    page = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
                                          {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for r in page["Reservations"]:
        for i in r["Instances"]:
            counts[i["InstanceType"]] = counts.get(i["InstanceType"], 0) + 1
    return counts


def live_instances(ec2: Any, cluster: str = CLUSTER) -> list[dict[str, Any]]:
    page = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
                                          {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for r in page["Reservations"] for i in r["Instances"]]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Cloud:
    """One VPC in one AZ, two subnets, a launch template per type (each in the cluster's placement
    group), the state bucket; `reconcile` checks after every run that the cluster holds one type."""

    def __init__(self) -> None:
        raw = boto3.client("ec2", region_name=REGION)
        self.raw = raw
        self.ec2 = FlakyEc2(raw)
        self.s3 = AtomicS3(boto3.client("s3", region_name=REGION))
        self.s3.create_bucket(Bucket=BUCKET)
        vpc = raw.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnets = [raw.create_subnet(VpcId=vpc, CidrBlock=c, AvailabilityZone=AZ)["Subnet"]["SubnetId"]
                        for c in ("10.0.0.0/20", "10.0.16.0/20")]
        self.templates = {t: raw.create_launch_template(LaunchTemplateName=f"node-{t.replace('.', '-')}", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": t, "Placement": {"GroupName": f"{CLUSTER}-pg"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "dl-launcher:nodes", "Value": "4"}]}],
        })["LaunchTemplate"]["LaunchTemplateId"] for t in PRICES}
        self.logs: list[str] = []

    def option(self, instance_type: str, price: Any = "catalog") -> CapacityOption:
        return CapacityOption(instance_type, self.templates[instance_type],
                              price=PRICES[instance_type] if price == "catalog" else price)

    def spec(self, types: tuple[str, ...] = ("p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"), *, nodes: int = 4,
             market: str = "spot", max_price: float = 50.0, prices: Optional[dict[str, Any]] = None,
             **kw: Any) -> ClusterSpec:
        prices = prices or {}
        return ClusterSpec(cluster=CLUSTER, nodes=nodes, market=market, max_price=max_price,
                           options=tuple(self.option(t, prices.get(t, "catalog")) for t in types),
                           subnet_ids=tuple(self.subnets), state_bucket=BUCKET, state_key=capacity_state_key(CLUSTER),
                           **kw)

    def store(self, spec: ClusterSpec) -> StateStore:
        return StateStore(self.s3, spec.state_bucket, spec.state_key)

    def controller(self, spec: ClusterSpec, clock: Any = time.time, ec2: Any = None) -> Controller:
        return Controller(ec2 or self.ec2, spec, self.store(spec), clock=clock, log=self.logs.append)

    def reconcile(self, controller: Controller, **kw: Any):
        done = controller.reconcile(**kw)
        self.check()
        return done

    def check(self) -> None:
        assert not self.ec2.mixed, f"the cluster held two types at once: {self.ec2.mixed}"
        counts = cluster_types(self.raw)
        assert len(counts) <= 1, f"the cluster holds two types: {counts}"

    def types(self) -> dict[str, int]:
        return cluster_types(self.raw)

    def kill(self, n: int = 1) -> list[str]:
        """AWS takes n instances of the cluster (a reclamation)."""
        ids = [i["InstanceId"] for i in live_instances(self.raw)][:n]
        self.raw.terminate_instances(InstanceIds=ids)
        return ids


@pytest.fixture
def cloud(aws) -> Cloud:
    return Cloud()


@pytest.fixture
def topic(aws):
    """The team's SNS topic, read back through an SQS subscription: (sns, arn, sqs, queue url)."""
    sns, sqs = boto3.client("sns", region_name=REGION), boto3.client("sqs", region_name=REGION)
    arn = sns.create_topic(Name="dl-alerts")["TopicArn"]
    url = sqs.create_queue(QueueName="inbox")["QueueUrl"]
    qarn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=qarn)
    return sns, arn, sqs, url


class _Refused:
    """An error answer of S3's, as botocore's Stubber hands one back from before-call."""
    status_code = 403
    headers: dict = {}
    content = b""


def recorded(event: dict, refuse: Optional[tuple[str, str]] = None) -> tuple[dict, list[tuple[str, dict]]]:
    """handler.handle(event) with every AWS call it makes recorded: (operation, parameters).
    `refuse`: (error code, part of a key): every S3 PutObject of such a key gets that error instead
    of S3's answer, without retries (botocore short-circuits before the request)."""
    from constructs_lib.fleet import handler

    calls: list[tuple[str, dict]] = []
    session = boto3.Session()
    session.events.register("before-parameter-build", lambda params, model, **kw: calls.append(
        (f"{model.service_model.service_name}:{model.name}", dict(params))))

    def deny(params: dict, model: Any, **kw: Any) -> Any:
        if refuse and refuse[1] in params.get("url_path", ""):
            return _Refused(), {"Error": {"Code": refuse[0], "Message": f"{refuse[0]} (injected)"}, "ResponseMetadata": {}}
        return None
    session.events.register("before-call.s3.PutObject", deny)
    boto3.DEFAULT_SESSION = session
    try:
        return handler.handle(event, None), calls
    finally:
        boto3.DEFAULT_SESSION = None


def state_change(instance: str, state: str) -> dict:
    from constructs_lib.fleet import handler

    return {"source": "aws.ec2", "detail-type": handler.STATE_CHANGE, "detail": {"instance-id": instance, "state": state}}
