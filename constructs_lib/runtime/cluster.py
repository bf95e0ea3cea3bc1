"""The cluster's agreed membership, generation by generation, kept in S3 beside the checkpoints.

Why S3 and not each node's own DescribeInstances: nodes see EC2 differently for seconds to
minutes (a dying node still shows "running", a replacement appears at different times), and
ranks derived independently split the cluster. Here a generation's plan is written once, with a
conditional write (If-None-Match: *), and every node runs that one plan.

    <prefix>/_cluster/gen-000007/join/<node>.json    a node asks to be in generation 7
    <prefix>/_cluster/gen-000007/leave/<node>.json   a node will not be: termination notice,
                                                     written after its last upload
    <prefix>/_cluster/gen-000007/failed/<node>.json  the command failed on that node in generation
                                                     7 (before it joins 8): every node counts the
                                                     generation failed, whatever it saw itself
    <prefix>/_cluster/gen-000007/plan.json           members in rank order, port, resume step
    <prefix>/_cluster/finished.json, failed.json      how the job ended

Rank order is stable: members of the previous generation keep their order (rank 0, the master
and the checkpoint writer, stays where it was while it lives), newcomers follow in the order
they joined. Addresses never decide ranks, so a replacement with a lower address changes nothing.
EC2 is asked only whether a node is gone.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from . import contract
from .store import CheckpointStore

_GEN = "gen-"


@dataclass(frozen=True)
class Member:
    node: str   # EC2 instance id
    addr: str   # private IPv4 address


@dataclass(frozen=True)
class Plan:
    generation: int
    members: tuple[Member, ...]
    resume_step: Optional[int]
    job: Optional[dict] = None  # the job revision every member runs (jobdef.Revision), when the job has one

    @property
    def port(self) -> int:
        return contract.rendezvous_port_base() + self.generation % contract.RENDEZVOUS_PORT_SPAN

    @property
    def master_addr(self) -> str:
        return self.members[0].addr

    def nodes(self) -> list[str]:
        return [m.node for m in self.members]

    def rank_of(self, node: str) -> Optional[int]:
        return self.nodes().index(node) if node in self.nodes() else None

    def to_json(self) -> dict:
        return {"generation": self.generation, "members": [m.__dict__ for m in self.members],
                "master_addr": self.master_addr, "master_port": self.port, "resume_step": self.resume_step,
                "created": time.time(), **({"job": self.job} if self.job else {})}

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        return cls(int(d["generation"]), tuple(Member(m["node"], m["addr"]) for m in d["members"]),
                   d.get("resume_step"), d.get("job") if isinstance(d.get("job"), dict) else None)


def gen_name(g: int) -> str:
    return f"{_GEN}{g:06d}"


def choose_members(nodes: int, joins: dict[str, dict], previous: Optional[Plan],
                   gone: Iterable[str] = ()) -> Optional[list[Member]]:
    """The members of a new generation, or None while fewer than `nodes` live nodes have joined."""
    gone = set(gone)
    alive = {n: j for n, j in joins.items() if n not in gone}
    if len(alive) < nodes:
        return None
    kept = [n for n in (previous.nodes() if previous else []) if n in alive]
    newcomers = sorted((n for n in alive if n not in kept), key=lambda n: (alive[n].get("at", 0), n))
    return [Member(n, alive[n]["addr"]) for n in (kept + newcomers)[:nodes]]


def unaccounted(previous: Optional[Plan], joins: Iterable[str], leaves: Iterable[str], gone: Iterable[str]) -> list[str]:
    """Members of the previous generation that have neither joined, left, nor gone: a plan waits
    for them (for a while), so that a leaving node's last upload and a slow survivor are not lost."""
    seen = set(joins) | set(leaves) | set(gone)
    return [n for n in (previous.nodes() if previous else []) if n not in seen]


class ClusterState:
    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.client = store.client
        self.bucket = store.bucket
        self.base = f"{store.prefix}/{contract.CLUSTER_DIR}"

    # ---- S3 primitives ----------------------------------------------------------------------------
    def _put(self, key: str, body: dict, *, if_absent: bool = False) -> bool:
        from botocore.exceptions import ClientError
        kw = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            self.store._call(self.client.put_object, Bucket=self.bucket, Key=f"{self.base}/{key}",
                             Body=json.dumps(body).encode(), ContentType="application/json", **kw)
            return True
        except ClientError as e:
            if if_absent and e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412",
                                                                         "ConditionalRequestConflict"):
                return False
            raise

    def _get(self, key: str) -> Optional[dict]:
        from botocore.exceptions import ClientError
        try:
            body = self.store._call(self.client.get_object, Bucket=self.bucket, Key=f"{self.base}/{key}")["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return None

    def _delete(self, key: str) -> None:
        self.store._call(self.client.delete_object, Bucket=self.bucket, Key=f"{self.base}/{key}")

    def _names(self, sub: str, *, dirs: bool = False) -> list[str]:
        prefix = f"{self.base}/{sub}"
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                         Delimiter="/"):
            if dirs:
                out += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
            else:
                out += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
        return out

    # ---- generations ---------------------------------------------------------------------------
    def newest_generation(self) -> int:
        gens = [int(n[len(_GEN):]) for n in self._names("", dirs=True) if n.startswith(_GEN) and n[len(_GEN):].isdigit()]
        return max(gens, default=0)

    def plan(self, g: int) -> Optional[Plan]:
        if g < 1:
            return None
        d = self._get(f"{gen_name(g)}/plan.json")
        return Plan.from_json(d) if d else None

    def propose(self, plan: Plan) -> Plan:
        """Write `plan` unless generation already has one; returns the plan that stands."""
        if self._put(f"{gen_name(plan.generation)}/plan.json", plan.to_json(), if_absent=True):
            return plan
        return self.plan(plan.generation) or plan

    def join(self, g: int, member: Member, **extra) -> None:
        self._put(f"{gen_name(g)}/join/{member.node}.json", {"node": member.node, "addr": member.addr,
                                                            "at": time.time(), **extra})

    def unjoin(self, g: int, node: str) -> None:
        self._delete(f"{gen_name(g)}/join/{node}.json")

    def joins(self, g: int) -> dict[str, dict]:
        out = {}
        for name in self._names(f"{gen_name(g)}/join/"):
            d = self._get(f"{gen_name(g)}/join/{name}")
            if d and d.get("node") and d.get("addr"):
                out[d["node"]] = d
        return out

    def leave(self, g: int, node: str, reason: str, pushed: Optional[int]) -> None:
        self._put(f"{gen_name(g)}/leave/{node}.json", {"node": node, "reason": reason, "pushed": pushed,
                                                       "at": time.time()})

    def leaves(self, g: int) -> set[str]:
        return {n.removesuffix(".json") for n in self._names(f"{gen_name(g)}/leave/")}

    def record_failure(self, g: int, node: str, detail: str) -> None:
        self._put(f"{gen_name(g)}/failed/{node}.json", {"node": node, "detail": detail[:500], "at": time.time()})

    def failures(self, g: int) -> list[str]:
        """The nodes on which the command failed in generation g (one LIST)."""
        return sorted(n.removesuffix(".json") for n in self._names(f"{gen_name(g)}/failed/"))

    def activity(self, g: int) -> bool:
        """Whether any node has joined or left generation g (a run of g-1 is then over)."""
        r = self.store._call(self.client.list_objects_v2, Bucket=self.bucket, Prefix=f"{self.base}/{gen_name(g)}/",
                             MaxKeys=1)
        return r.get("KeyCount", 0) > 0

    # ---- the end -----------------------------------------------------------------------------------
    def finished(self) -> Optional[dict]:
        return self._get("finished.json")

    def failed(self) -> Optional[dict]:
        return self._get("failed.json")

    def mark_finished(self, **info) -> None:
        self._put("finished.json", {"at": time.time(), **info}, if_absent=True)

    def mark_failed(self, **info) -> None:
        self._put("failed.json", {"at": time.time(), **info}, if_absent=True)


class Liveness:
    """Which nodes EC2 says are gone (shutting down, terminated, stopping, stopped, or unknown)."""

    ALIVE = ("pending", "running")

    def __init__(self, ec2) -> None:
        self.ec2 = ec2

    def gone(self, nodes: Iterable[str]) -> set[str]:
        from botocore.exceptions import ClientError
        nodes = sorted(set(nodes))
        if not nodes:
            return set()
        try:
            states = self._states(nodes)
        except ClientError as e:
            if "NotFound" not in e.response.get("Error", {}).get("Code", ""):
                raise
            states = {}
            for n in nodes:  # one unknown id fails the whole call: ask one by one
                try:
                    states.update(self._states([n]))
                except ClientError:
                    pass
        return {n for n in nodes if states.get(n) not in self.ALIVE}

    def _states(self, nodes: list[str]) -> dict[str, str]:
        out = {}
        for page in self.ec2.get_paginator("describe_instances").paginate(InstanceIds=nodes):
            for r in page["Reservations"]:
                for i in r["Instances"]:
                    out[i["InstanceId"]] = i["State"]["Name"]
        return out
