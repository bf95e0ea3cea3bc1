"""Capacity controller: decision time per event, in-process (what one Lambda invocation spends
deciding, without network latency).

Three events on an 8-node spot cluster of two options:
  steady     nothing to do (the 1-minute schedule, most invocations);
  node loss  one node reclaimed: one replacement of the same type;
  gang+ICE   nothing running, the pick has no capacity: one failed fleet, then the alternate.
Each is timed two ways, medians in milliseconds:
  moto  real boto3 clients against moto in-process: the controller + botocore + moto's backend;
  stub  canned EC2 and S3 answers from plain Python objects: the controller alone.
stub / moto is the controller's share; the rest is botocore and moto. The API calls per decision
are counted too: against AWS each costs a round trip (tens of ms), which is the real bill.

    python bench/controller_decisions.py [--runs N]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REGION, AZ, NODES = "us-east-1", "us-east-1a", 8
PICK, ALTERNATE = "p5.48xlarge", "p5en.48xlarge"


def ice(request: dict[str, Any]) -> dict[str, Any]:
    itype = request["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"]
    return {"FleetId": f"fleet-{uuid.uuid4()}", "Instances": [], "Errors": [{
        "Lifecycle": "spot", "ErrorCode": "InsufficientInstanceCapacity",
        "ErrorMessage": f"We currently do not have sufficient {itype} capacity in the Availability Zone you requested ({AZ})."}]}


class Counted:
    """A client whose calls are counted; create_fleet answers ICE for types in `unavailable`."""

    def __init__(self, client: Any, calls: Counter, unavailable: set[str]) -> None:
        self._client, self._calls, self._unavailable = client, calls, unavailable

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def call(**kw: Any) -> Any:
            self._calls[name] += 1
            if name == "create_fleet" and kw["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"] in self._unavailable:
                return ice(kw)
            return method(**kw)
        return call


# ---- canned answers: plain Python, no botocore, no moto ------------------------------------------
class _Missing(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}}


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self) -> bytes:
        return self._data


class StubS3:
    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise _Missing("NoSuchKey")
        data, etag = self.objects[Key]
        return {"Body": _Body(data), "ETag": etag}

    def put_object(self, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str = "", IfMatch: str = "",
                   **_: Any) -> dict[str, Any]:
        held = self.objects.get(Key)
        if (IfNoneMatch and held) or (IfMatch and (not held or held[1] != IfMatch)):
            raise _Missing("PreconditionFailed")
        etag = f'"{uuid.uuid4().hex}"'
        self.objects[Key] = (Body, etag)
        return {"ETag": etag}

    def delete_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self.objects.pop(Key, None)
        return {}


class StubEc2:
    def __init__(self) -> None:
        self.instances: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _value(instance: dict[str, Any], name: str) -> Any:
        if name == "instance-id":
            return instance["InstanceId"]
        if name == "instance-state-name":
            return instance["State"]["Name"]
        return next((t["Value"] for t in instance["Tags"] if f"tag:{t['Key']}" == name), None)

    def describe_instances(self, Filters: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        found = [i for i in self.instances.values() if all(self._value(i, f["Name"]) in f["Values"] for f in Filters)]
        return {"Reservations": [{"Instances": found}]}

    def create_fleet(self, **request: Any) -> dict[str, Any]:
        override = request["LaunchTemplateConfigs"][0]["Overrides"][0]
        tags = request["TagSpecifications"][0]["Tags"]
        ids = []
        for _ in range(request["TargetCapacitySpecification"]["TotalTargetCapacity"]):
            i = f"i-{uuid.uuid4().hex[:17]}"
            self.instances[i] = {"InstanceId": i, "InstanceType": override["InstanceType"], "SubnetId": override["SubnetId"],
                                 "LaunchTime": dt.datetime.now(dt.timezone.utc), "State": {"Name": "pending"}, "Tags": tags}
            ids.append(i)
        return {"FleetId": "fleet-1", "Instances": [{"InstanceIds": ids, "InstanceType": override["InstanceType"],
                                                     "LaunchTemplateAndOverrides": {"Overrides": override}}]}

    def terminate_instances(self, InstanceIds: list[str]) -> dict[str, Any]:
        for i in InstanceIds:
            self.instances[i]["State"] = {"Name": "shutting-down"}
        return {}


# ---- one world per measurement --------------------------------------------------------------------
class World:
    """A spec, the clients (moto's or the stubs), and a controller over them."""

    def __init__(self, kind: str, unavailable: set[str]) -> None:
        from constructs_lib.fleet import CapacityOption, ClusterSpec, Controller, StateStore

        self.calls: Counter = Counter()
        if kind == "moto":
            import boto3

            ec2, s3 = boto3.client("ec2", region_name=REGION), boto3.client("s3", region_name=REGION)
            s3.create_bucket(Bucket="dl-fleet-bench")
            vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
            subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone=AZ)["Subnet"]["SubnetId"]
            templates = {t: ec2.create_launch_template(LaunchTemplateName=t.replace(".", "-"), LaunchTemplateData={
                "ImageId": "ami-12c6146b", "InstanceType": t, "Placement": {"GroupName": "bench-pg"}})[
                "LaunchTemplate"]["LaunchTemplateId"] for t in (PICK, ALTERNATE)}
        else:
            ec2, s3 = StubEc2(), StubS3()
            subnet = "subnet-0123456789abcdef0"
            templates = {PICK: "lt-0123456789abcdef0", ALTERNATE: "lt-0123456789abcdef1"}
        self.raw_ec2 = ec2
        self.ec2 = Counted(ec2, self.calls, unavailable)
        self.s3 = Counted(s3, self.calls, set())
        self.spec = ClusterSpec(cluster="bench", nodes=NODES, market="spot", max_price=50.0,
                                options=(CapacityOption(PICK, templates[PICK], price=40.0),
                                         CapacityOption(ALTERNATE, templates[ALTERNATE], price=45.0)),
                                subnet_ids=(subnet,), state_bucket="dl-fleet-bench", state_key="bench/state.json")
        self.controller = Controller(self.ec2, self.spec, StateStore(self.s3, self.spec.state_bucket, self.spec.state_key),
                                     log=lambda line: None)

    def timed(self) -> tuple[float, list[str], Counter]:
        self.calls.clear()
        t = time.perf_counter()
        done = self.controller.reconcile()
        return time.perf_counter() - t, [d.kind for d in done], Counter(self.calls)

    def kill_one(self) -> None:
        from constructs_lib.fleet.instances import list_cluster

        self.raw_ec2.terminate_instances(InstanceIds=[list_cluster(self.raw_ec2, self.spec.cluster)[0].id])


def scenario(kind: str, event: str) -> tuple[float, list[str], Counter]:
    """One timed decision of `event` in a fresh world (nothing left over from earlier runs)."""
    world = World(kind, {PICK} if event == "gang+ICE" else set())
    if event != "gang+ICE":
        world.controller.reconcile()   # launch the cluster
        world.controller.reconcile()   # EC2 lists it now: the launch memory is dropped
    if event == "node loss":
        world.kill_one()
    return world.timed()


EXPECTED = {"steady": [], "node loss": ["replaced"], "gang+ICE": ["launch-failed", "launched"]}


def measure(kind: str, runs: int) -> dict[str, tuple[float, Counter]]:
    from moto import mock_aws

    fresh = mock_aws if kind == "moto" else contextlib.nullcontext
    out = {}
    for event in EXPECTED:
        times, calls = [], Counter()
        if event == "steady":  # nothing changes between runs: one world serves them all
            with fresh():
                world = World(kind, set())
                world.controller.reconcile()
                world.controller.reconcile()
                for _ in range(runs):
                    seconds, kinds, calls = world.timed()
                    assert kinds == [], kinds
                    times.append(seconds)
        else:
            for _ in range(runs):
                with fresh():
                    seconds, kinds, calls = scenario(kind, event)
                assert kinds == EXPECTED[event], (event, kinds)
                times.append(seconds)
        out[event] = (statistics.median(times) * 1000, calls)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    runs = p.parse_args().runs
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"})
    import moto

    print(f"Python {platform.python_version()}, moto {moto.__version__}, {os.cpu_count()} CPUs; "
          f"{NODES}-node spot cluster, medians of {runs} runs")
    measured = {kind: measure(kind, runs) for kind in ("moto", "stub")}
    print(f"{'event':<11} {'moto ms':>8} {'stub ms':>8} {'controller share':>17}   API calls per decision")
    for event in EXPECTED:
        (moto_ms, calls), (stub_ms, _) = measured["moto"][event], measured["stub"][event]
        detail = ", ".join(f"{name} {n}" for name, n in sorted(calls.items()))
        print(f"{event:<11} {moto_ms:8.2f} {stub_ms:8.3f} {stub_ms / moto_ms:16.1%}   {sum(calls.values())}: {detail}")


if __name__ == "__main__":
    main()
