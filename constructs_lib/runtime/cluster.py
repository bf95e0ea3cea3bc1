"""The cluster's agreed membership, generation by generation, kept in S3 beside the checkpoints.

Why S3 and not each node's own DescribeInstances: nodes see EC2 differently for seconds to
minutes (a dying node still shows "running", a replacement appears at different times), and
ranks derived independently split the cluster. Here a generation's plan is written once, with a
conditional write (If-None-Match: *), and every node runs that one plan.

    <prefix>/_cluster/gen-000007/join/<node>_<addr>_<ms>.json
                                                     a node asks to be in generation 7 (the key
                                                     says who, where and when: one LIST reads
                                                     every join, with no GET per joiner)
    <prefix>/_cluster/gen-000007/leave/<node>.json   a node will not be: termination notice,
                                                     written after its last upload
    <prefix>/_cluster/gen-000007/failed/<node>.json  the command failed on that node in generation
                                                     7 (before it joins 8): every node counts the
                                                     generation failed, whatever it saw itself
    <prefix>/_cluster/gen-000007/plan.json           members in rank order, port, resume step
    <prefix>/_cluster/gen-000007/pace/<node>_<ms>     that node's recent median step time (stall.py):
                                                     in the key, so one LIST reads every node's
    <prefix>/_cluster/gen-000007/kept/step-N.json    the survivor that sends step N, kept from memory
                                                     after 7 lost a peer (first claim wins)
    <prefix>/_cluster/finished.json, failed.json      how the job ended
    <prefix>/_cluster/beat/<node>                     rewritten by each node every liveness period
    <prefix>/_cluster/gone/<node>.json                EC2 confirmed the node terminated or unknown
                                                     (the capacity controller writes it too, from
                                                     EC2's state-change event: "by": "controller")

Every node may write every one of these (any process on a node may): each is read with a byte
limit and checked for the shape this module writes (records.py, plan_problem and the like below),
and one that fails is set aside with a log line, never a crash or a loop. A generation whose plan
is set aside is skipped (a plan is written once, If-None-Match, so it cannot be replaced).

Rank order is stable: members of the previous generation keep their order (rank 0, the master
and the checkpoint writer, stays where it was while it lives), newcomers follow in the order
they joined. Addresses never decide ranks, so a replacement with a lower address changes nothing.
EC2 is asked only whether a node is gone, by one node of the cluster about nodes whose heartbeat
has stopped, or by two right after a run failed or while a previous member has not rejoined
(Liveness): whatever the cluster's size, every node's requests per poll are a constant number of
S3 requests, and the cluster's EC2 calls at most two per look.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from dl_core.aws import error_code

from . import contract, records
from .cluster_records import (
    GEN_NAME, failed_problem, failure_problem, finished_problem, gone_record, join_problem, nodes_in, object_problem,
    plan_problem,
)
from .liveness import Liveness as Liveness  # its callers import it from here
from .layout import name_for
from .records import addr_problem, node_problem
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


@dataclass(frozen=True)
class GenerationView:
    joins: dict[str, dict]
    leaves: set[str]
    failures: set[str]
    planned: bool   # plan.json is there (plan() reads it; bad_plan() says whether it was set aside)


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
        # What every record this node writes passes through: the supervisor sets the job's secret
        # values' redaction (redact.Redactor.scrub), so that no value reaches S3 in a failure's text.
        self.redact: Callable[[Any], Any] = lambda body: body
        self._plans: dict[int, Plan] = {}

    # ---- S3 primitives ----------------------------------------------------------------------------
    def _put(self, key: str, body: dict, *, if_absent: bool = False) -> bool:
        from botocore.exceptions import ClientError
        kw = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            self.store._call(self.client.put_object, Bucket=self.bucket, Key=f"{self.base}/{key}",
                             Body=json.dumps(self.redact(body)).encode(), ContentType="application/json", **kw)
            return True
        except ClientError as e:
            if if_absent and error_code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise

    def _get(self, key: str, problem: Callable[[Any], Optional[str]] = object_problem) -> Optional[Any]:
        """The record at `key`, checked by `problem`; None when absent or set aside (records.read)."""
        return records.read(self.store, f"{self.base}/{key}", limit=records.MAX_CLUSTER_RECORD,
                            problem=problem).value

    def _delete(self, key: str) -> None:
        self.store._call(self.client.delete_object, Bucket=self.bucket, Key=f"{self.base}/{key}")

    def _names(self, sub: str) -> list[str]:
        prefix = f"{self.base}/{sub}"
        return [o["Key"][len(prefix):] for page in self._pages(prefix, Delimiter="/") for o in page.get("Contents", [])]

    # ---- generations ---------------------------------------------------------------------------
    def newest_generation(self) -> int:
        return self.top()[0]

    def top(self) -> tuple[int, bool]:
        """(the newest generation, whether finished.json or failed.json is there) from one LIST of
        the cluster's top level: what a waiting node checks every few looks, reading the end
        records themselves only once one exists."""
        prefix = f"{self.base}/"
        gens, ended = [0], False
        for page in self._pages(prefix, Delimiter="/"):
            gens += [int(n[len(_GEN):]) for n in (p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
                     if GEN_NAME.match(n)]
            ended = ended or any(o["Key"][len(prefix):] in ("finished.json", "failed.json") for o in page.get("Contents", []))
        return max(gens), ended

    def plan(self, g: int) -> Optional[Plan]:
        """Generation g's plan; None while there is none, or when it was set aside (bad_plan says why)."""
        if g < 1:
            return None
        if g in self._plans:  # written once (If-None-Match): what was read stays true
            return self._plans[g]
        d = self._get(f"{gen_name(g)}/plan.json", lambda d: plan_problem(d, g))
        plan = Plan.from_json(d) if d else None
        if plan is not None:
            self._plans[g] = plan
        return plan

    def bad_plan(self, g: int) -> Optional[str]:
        """Why generation g's plan was set aside when last read, or None. Such a generation is
        never run: the plan cannot be replaced (it was written If-None-Match), so the cluster
        forms the next one."""
        return self.store.set_aside.get(f"{self.base}/{gen_name(g)}/plan.json") if g >= 1 else None

    def propose(self, plan: Plan) -> Plan:
        """Write `plan` unless generation already has one; returns the plan that stands."""
        if self._put(f"{gen_name(plan.generation)}/plan.json", plan.to_json(), if_absent=True):
            return plan
        return self.plan(plan.generation) or plan

    def join(self, g: int, member: Member, **extra) -> None:
        at = time.time()
        self._put(f"{gen_name(g)}/join/{member.node}_{member.addr}_{int(at * 1000)}.json",
                  {"node": member.node, "addr": member.addr, "at": at, **extra})

    def unjoin(self, g: int, member: Member) -> None:
        for name, _ in self._listed(f"{gen_name(g)}/join/{member.node}_"):
            self._delete(f"{gen_name(g)}/join/{member.node}_{name}")

    def joins(self, g: int) -> dict[str, dict]:
        """{node: {"node", "addr", "at"}} from one LIST: the key says who, where and when (the
        joiner's clock, in ms: S3's LastModified has whole seconds, too coarse for join order)."""
        return _joins(name for name, _ in self._listed(f"{gen_name(g)}/join/"))

    def view(self, g: int) -> "GenerationView":
        """Generation g as one LIST of its prefix shows it: its joins (as joins()), leaves and
        failures, and whether its plan is written: what a node waiting for g's plan polls."""
        names = [name for name, _ in self._listed(f"{gen_name(g)}/")]

        def below(sub: str) -> list[str]:
            return [n[len(sub):] for n in names if n.startswith(sub)]
        return GenerationView(_joins(below("join/")), nodes_in(below("leave/")), nodes_in(below("failed/")),
                              "plan.json" in names)

    def join_details(self, g: int) -> dict[str, dict]:
        """The joins' bodies (health and the like), one GET each: for people, never in a poll."""
        return {n: {**(self._get(f"{gen_name(g)}/join/{j['key']}", join_problem) or {}), **j}
                for n, j in self.joins(g).items()}

    def _listed(self, sub: str) -> list[tuple[str, float]]:
        """(name, when S3 stored it) below `sub`, from the listing alone."""
        prefix = f"{self.base}/{sub}"
        return [(o["Key"][len(prefix):], o["LastModified"].timestamp())
                for page in self._pages(prefix) for o in page.get("Contents", [])]

    def _pages(self, prefix: str, **kw):
        return self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, **kw)

    # ---- liveness ------------------------------------------------------------------------------
    def beat(self, node: str) -> None:
        self.store._call(self.client.put_object, Bucket=self.bucket, Key=f"{self.base}/beat/{node}", Body=b"")

    def beats(self) -> tuple[dict[str, float], float]:
        """({node: when S3 stored its last beat}, S3's clock now): one LIST per 1,000 nodes."""
        prefix = f"{self.base}/beat/"
        beats: dict[str, float] = {}
        now = None
        for page in self._pages(prefix):
            now = now or _server_time(page)
            beats.update({o["Key"][len(prefix):]: o["LastModified"].timestamp() for o in page.get("Contents", [])
                          if not node_problem(o["Key"][len(prefix):])})
        return beats, now or time.time()

    def pace(self, g: int, node: str, ms: int, previous: Optional[str]) -> str:
        """This node's recent median step time in generation g, in the key itself (pace/<node>_<ms>),
        so every peer reads every node's with one LIST per 1,000 nodes and no GET; the previous
        key is deleted. Returns the key's name for the next call."""
        name = f"{node}_{max(0, int(ms))}"
        self._put(f"{gen_name(g)}/pace/{name}", {})
        if previous and previous != name:
            self.store._call(self.client.delete_object, Bucket=self.bucket,
                             Key=f"{self.base}/{gen_name(g)}/pace/{previous}")
        return name

    def paces(self, g: int) -> dict[str, float]:
        """{node: its median step time, seconds} in generation g: one LIST (the newest key of a node wins)."""
        out: dict[str, tuple[float, float]] = {}
        for name, at in self._listed(f"{gen_name(g)}/pace/"):
            node, _, ms = name.rpartition("_")
            if ms.isdigit() and len(ms) < 10 and not node_problem(node) and at >= out.get(node, (0.0, -1.0))[1]:
                out[node] = (int(ms) / 1000, at)
        return {n: v for n, (v, _) in out.items()}

    def record_gone(self, node: str, state: str) -> None:
        self._put(*gone_record(node, state))

    def gone_nodes(self) -> set[str]:
        return nodes_in(n for n, _ in self._listed(f"{contract.GONE_DIR}/"))

    def leave(self, g: int, node: str, reason: str, pushed: Optional[int]) -> None:
        self._put(f"{gen_name(g)}/leave/{node}.json", {"node": node, "reason": reason, "pushed": pushed,
                                                       "at": time.time()})

    def leaves(self, g: int) -> set[str]:
        return nodes_in(self._names(f"{gen_name(g)}/leave/"))

    def claim_kept(self, g: int, step: int, node: str) -> bool:
        """Whether this node sends step `step`, kept from memory after generation g lost a peer
        (survivor.promote): the first claim wins (If-None-Match), so one survivor uploads it."""
        return self._put(f"{gen_name(g)}/kept/{name_for(step)}.json", {"node": node, "step": step, "at": time.time()},
                         if_absent=True)

    def record_failure(self, g: int, node: str, detail: str, *, signature: str = "",
                       last_lines: Iterable[str] = ()) -> None:
        """How the command failed on `node` in generation g: its exit, its error's signature
        (decisions.error_signature) and its last lines, for the nodes whose runs it stopped."""
        self._put(f"{gen_name(g)}/failed/{node}.json", {"node": node, "detail": detail[:500], "signature": signature,
                                                        "last_lines": [line[:500] for line in last_lines][-20:],
                                                        "at": time.time()})

    def record_collective(self, g: int, body: dict) -> None:
        """Generation g's pre-generation all-reduce (collective_check.py): its figure, for people."""
        self._put(f"{gen_name(g)}/collective.json", body)

    def collective(self, g: int) -> Optional[dict]:
        return self._get(f"{gen_name(g)}/collective.json")

    def failures(self, g: int) -> list[str]:
        """The nodes on which the command failed in generation g (one LIST)."""
        return sorted(nodes_in(self._names(f"{gen_name(g)}/failed/")))

    def failure_records(self, g: int) -> dict[str, dict]:
        """{node: its failure record} for generation g: one LIST and a GET per failed node (read after a
        run stops, never in a poll). A record set aside still names its node, with nothing else."""
        return {n: self._get(f"{gen_name(g)}/failed/{n}.json", failure_problem) or {} for n in self.failures(g)}

    def activity(self, g: int) -> bool:
        """Whether any node has joined or left generation g (a run of g-1 is then over)."""
        r = self.store._call(self.client.list_objects_v2, Bucket=self.bucket, Prefix=f"{self.base}/{gen_name(g)}/",
                             MaxKeys=1)
        return r.get("KeyCount", 0) > 0

    # ---- the end -----------------------------------------------------------------------------------
    def finished(self) -> Optional[dict]:
        return self._get("finished.json", finished_problem)

    def failed(self) -> Optional[dict]:
        return self._get("failed.json", failed_problem)

    def mark_finished(self, **info) -> None:
        self._put("finished.json", {"at": time.time(), **info}, if_absent=True)

    def mark_failed(self, **info) -> None:
        self._put("failed.json", {"at": time.time(), **info}, if_absent=True)


def _joins(names: Iterable[str]) -> dict[str, dict]:
    """{node: join} from the names below a generation's join/ (node_addr_ms.json); a node that
    joined twice counts from its first join; names this runtime does not write are left out."""
    out: dict[str, dict] = {}
    for name in names:
        parts = name.removesuffix(".json").rsplit("_", 2)
        if len(parts) != 3 or not name.endswith(".json") or not parts[2].isdigit():
            continue
        node, addr, ms = parts
        if node_problem(node) or addr_problem(addr) or len(ms) > 15:
            continue  # not a join this runtime wrote: never a member, never a crash
        if node not in out or int(ms) / 1000 < out[node]["at"]:
            out[node] = {"node": node, "addr": addr, "at": int(ms) / 1000, "key": name}
    return out


def _server_time(page: dict) -> Optional[float]:
    from email.utils import parsedate_to_datetime
    date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp() if date else None
    except (TypeError, ValueError):
        return None
