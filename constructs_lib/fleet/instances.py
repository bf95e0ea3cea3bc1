"""What the controller asks EC2: the cluster's instances, an all-or-nothing launch, terminations.

A launch is an EC2 Fleet of type `instant` for exactly one instance type in one AZ, with
MinTargetCapacity: AWS's primitive for a multi-node launch that either gets every node or none.
The caller still checks the count it got: Capacity Blocks fill what they can, and a fleet may
answer with instances and errors at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Any, Mapping, Sequence

from dl_core.aws import error_code

from ..runtime.contract import TAG_CLUSTER, TAG_HEALTH, TAG_STACK
from .spec import CapacityOption, ClusterSpec

LIVE_STATES = ("pending", "running")
GONE_STATES = ("stopping", "stopped", "shutting-down", "terminated")  # never a member again (runtime's Liveness too)


@dataclass(frozen=True)
class Node:
    id: str
    instance_type: str
    subnet: str
    launched: float  # epoch seconds
    health: str = ""  # the node's own TAG_HEALTH ("replace: <why>" when its GPUs are broken)


def list_cluster(ec2: Any, cluster: str, stack: Optional[str] = None) -> list[Node]:
    """Pending and running instances tagged with the cluster, and with `stack` where given (EC2's
    view, which may lag a launch): another stack's cluster of the same name is never listed."""
    filters = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
               {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    if stack:
        filters.append({"Name": f"tag:{TAG_STACK}", "Values": [stack]})
    kw: dict[str, Any] = {"Filters": filters}
    nodes = []
    while True:
        page = ec2.describe_instances(**kw)
        for reservation in page.get("Reservations", []):
            for i in reservation.get("Instances", []):
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                nodes.append(Node(i["InstanceId"], i["InstanceType"], i.get("SubnetId", ""), i["LaunchTime"].timestamp(),
                                  tags.get(TAG_HEALTH, "")))
        if not page.get("NextToken"):
            return nodes
        kw["NextToken"] = page["NextToken"]


# EC2 refuses a filter of more than 200 values (the EC2 API reference, Filter): id lists are cut
# to this, and so are the other id lists sent at once (terminate, tag), whatever their own limits.
CHUNK = 200


def chunks(ids: Sequence[str], size: int = CHUNK) -> list[list[str]]:
    ids = list(ids)
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def _described(ec2: Any, ids: Sequence[str]) -> list[dict[str, Any]]:
    """Every instance EC2 lists among `ids`, by filter (an unknown id fails nothing), paginated."""
    out = []
    for part in chunks(ids):
        kw: dict[str, Any] = {"Filters": [{"Name": "instance-id", "Values": part}]}
        while True:
            page = ec2.describe_instances(**kw)
            out += [i for r in page.get("Reservations", []) for i in r.get("Instances", [])]
            if not page.get("NextToken"):
                break
            kw["NextToken"] = page["NextToken"]
    return out


def states(ec2: Any, ids: Sequence[str]) -> dict[str, str]:
    """The state of each id EC2 lists; an id it does not know yet is left out (a filter, unlike
    InstanceIds, does not fail the whole call for one unknown id)."""
    return {i["InstanceId"]: i["State"]["Name"] for i in _described(ec2, ids)}


def usd(value: float) -> str:
    """A price as EC2 takes it: a decimal string, never exponent notation."""
    return f"{value:.5f}".rstrip("0").rstrip(".")


def fleet_request(spec: ClusterSpec, option: CapacityOption, count: int, subnets: Sequence[str],
                  minimum: int, tags: Mapping[str, str] = {}) -> dict[str, Any]:
    """CreateFleet keywords: `count` nodes of exactly option's type, at least `minimum` or none;
    `tags` (the stack's cost tags) on every instance beside the cluster tag."""
    extra = [{"Key": k, "Value": v} for k, v in sorted(tags.items()) if k not in (TAG_CLUSTER, TAG_STACK)]
    if spec.stack:
        extra.append({"Key": TAG_STACK, "Value": spec.stack})
    spot = spec.market == "spot"
    overrides = [{"InstanceType": option.instance_type, "SubnetId": s, **({"MaxPrice": usd(spec.max_price)} if spot else {})}
                 for s in subnets]
    options: dict[str, Any] = {"SingleInstanceType": True, "SingleAvailabilityZone": True,
                               "MinTargetCapacity": minimum, "MaxTotalPrice": usd(spec.max_price * count)}
    request: dict[str, Any] = {
        "Type": "instant",
        "LaunchTemplateConfigs": [{"LaunchTemplateSpecification": {
            "LaunchTemplateId": option.launch_template_id, "Version": option.launch_template_version},
            "Overrides": overrides}],
        "TargetCapacitySpecification": {"TotalTargetCapacity": count, "DefaultTargetCapacityType": spec.market},
        # The launch template's own tags apply too; this one is how the controller finds its nodes.
        "TagSpecifications": [{"ResourceType": "instance",
                               "Tags": [{"Key": TAG_CLUSTER, "Value": spec.cluster}, *extra]}],
    }
    if spot:
        # One type in one AZ leaves little to allocate; capacity-optimized picks the pool least
        # likely to be reclaimed, which matters more to a training cluster than the last cent.
        request["SpotOptions"] = {"AllocationStrategy": "capacity-optimized", **options}
    else:
        if spec.market == "on-demand" and spec.capacity_reservation:
            # The launch template targets the reservation; this lets the fleet use it. Capacity
            # Blocks reject CapacityReservationOptions: their template alone targets the block.
            options["CapacityReservationOptions"] = {"UsageStrategy": "use-capacity-reservations-first"}
        request["OnDemandOptions"] = {"AllocationStrategy": "prioritized", **options}
    return request


@dataclass(frozen=True)
class Launched:
    instances: tuple[tuple[str, str], ...]  # (instance id, subnet id)
    errors: tuple[str, ...]                 # "ErrorCode: message", each once

    @property
    def ids(self) -> list[str]:
        return [i for i, _ in self.instances]


def launch(ec2: Any, request: dict[str, Any]) -> Launched:
    r = ec2.create_fleet(**request)
    got = []
    for group in r.get("Instances", []):
        subnet = group.get("LaunchTemplateAndOverrides", {}).get("Overrides", {}).get("SubnetId", "")
        got.extend((i, subnet) for i in group.get("InstanceIds", []))
    errors = [f"{e.get('ErrorCode', '?')}: {e.get('ErrorMessage', '')}".rstrip(": ") for e in r.get("Errors", [])]
    return Launched(tuple(got), tuple(dict.fromkeys(errors)))


def terminate(ec2: Any, ids: Sequence[str]) -> None:
    """Terminate ids; an id EC2 does not know (not yet visible, or long gone) is skipped."""
    if not ids:
        return
    if len(ids) > CHUNK:
        for part in chunks(ids):
            terminate(ec2, part)
        return
    try:
        ec2.terminate_instances(InstanceIds=list(ids))
    except Exception as e:
        if error_code(e) != "InvalidInstanceID.NotFound":
            raise
        if len(ids) > 1:  # one unknown id fails the whole call: the others still must go
            for i in ids:
                terminate(ec2, [i])


def stack_tags(cfn: Any, stack: str) -> dict[str, str]:
    """The stack's own tags a user or Service Catalog set (team, project, cost-centre, ...); the
    aws: ones are AWS's and EC2 refuses them."""
    (found,) = cfn.describe_stacks(StackName=stack)["Stacks"]
    return {t["Key"]: t["Value"] for t in found.get("Tags", []) if not t["Key"].startswith("aws:")}


def tag_volumes(ec2: Any, ids: Sequence[str], tags: Mapping[str, str]) -> list[str]:
    """Put `tags` on the EBS volumes attached to `ids` (an instant fleet tags instances only;
    the launch template's volume tags are fixed at deploy). Returns the volume ids tagged."""
    if not ids or not tags:
        return []
    volumes = [b["Ebs"]["VolumeId"] for i in _described(ec2, ids) for b in i.get("BlockDeviceMappings", []) if "Ebs" in b]
    for part in chunks(volumes):
        ec2.create_tags(Resources=part, Tags=[{"Key": k, "Value": v} for k, v in sorted(tags.items())])
    return volumes
