"""What one reconcile of the capacity controller does to EC2 and to its own state, under the lease:
launches and terminations (none starts within LEASE_MARGIN of the lease's end), the cluster as
EC2 lists it plus the launches it does not list yet, and the transitions it logs and keeps.

controller.py decides; this is how a decision is carried out and remembered, the part that
changes with EC2's and the state's APIs rather than with the rules.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, Mapping

from dl_core.aws import error_code

from . import job_end
from .instances import (LIVE_STATES, Launched, Node, fleet_request, launch, list_cluster, states, tag_volumes,
                        terminate)
from .spec import CapacityOption, ClusterSpec
from .state import ControllerState, Lease, StateStore


KINDS = ("launched", "launch-failed", "replaced", "moved", "wrapped", "adopted", "terminated-stray",
         "terminated-extra", "terminated-unhealthy", "skipped-price", "waiting", "torn-down", "resumed", "job-ended",
         "terminated-ended")
# How long a launch EC2 does not list yet still counts as running (DescribeInstances lags launches).
RECENT_SECONDS = 60.0
# No EC2 change starts this close to the end of the lease, so that it never outlives the lease.
LEASE_MARGIN = 20.0
NOT_ABOUT_THE_OPTION = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError",
                                  "InternalFailure", "ServiceUnavailable", "Unavailable", "UnauthorizedOperation",
                                  "AuthFailure", "Blocked", "OptInRequired"})


@dataclass(frozen=True)
class Transition:
    at: float
    kind: str
    instance_type: str
    reason: str
    instances: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "instance_type": self.instance_type, "reason": self.reason,
                "instances": list(self.instances)}


class OutOfLease(Exception):
    """Raised before an EC2 change that could outlive the lease: the next event goes on from there."""


class LeasedRun:
    """The EC2 changes and bookkeeping of one reconcile (Controller adds the decisions)."""

    def __init__(self, ec2: Any, spec: ClusterSpec, store: StateStore, *, clock: Callable[[], float] = time.time,
                 log: Callable[[str], Any] = print,
                 cost_tags: Optional[Callable[[], Mapping[str, str]]] = None,
                 job_end: Optional[job_end.JobEndWatch] = None) -> None:
        """cost_tags: what every node and its volumes carry besides the cluster tag (the stack's
        tags, read once per run); failing to read them is logged and never stops a launch.
        job_end: where the job's end is recorded and what to do then; None: the job never ends."""
        self.job_end = job_end
        self.ec2 = ec2
        self._cost_tags = cost_tags
        self._tags: Optional[Mapping[str, str]] = None
        self.spec = spec
        self.store = store
        self.clock = clock
        self.log = log
        self._state = ControllerState()
        self._lease = Lease(0.0, "")
        self._done: list[Transition] = []
        self._failed: Optional[tuple[str, Sequence[str]]] = None  # the last launch that failed: what, errors


    # ---- EC2 changes, each within the lease ------------------------------------------------------
    def _guard(self, what: str) -> None:
        if self.clock() > self._lease.until - LEASE_MARGIN:
            raise OutOfLease(what)

    def _launch(self, option: CapacityOption, count: int, subnets: Sequence[str], *, minimum: int) -> Launched:
        self._guard(f"launching {option.instance_type}")
        try:
            got = launch(self.ec2, fleet_request(self.spec, option, count, subnets, minimum, self._extra_tags()))
        except Exception as e:
            # An error about this option (its template, its type in this AZ) sends the cluster to the
            # next one; throttling, outages, permissions and bugs would fail every option alike and
            # must not move it: they end this run, and the next event tries again.
            if not error_code(e) or error_code(e) in NOT_ABOUT_THE_OPTION:
                raise
            return Launched((), (str(e),))
        now = self.clock()
        for i, subnet in got.instances:
            self._state.recent[i] = {"instance_type": option.instance_type, "subnet": subnet, "at": now}
        if got.ids and self._extra_tags():
            try:
                tag_volumes(self.ec2, got.ids, self._extra_tags())
            except Exception as e:  # cost tags must never cost the cluster
                self.log(f"dl-launcher: could not tag the volumes of {', '.join(got.ids)}: {e}")
        return got

    def _extra_tags(self) -> Mapping[str, str]:
        if self._tags is None:
            self._tags = {}
            if self._cost_tags is not None:
                try:
                    self._tags = dict(self._cost_tags())
                except Exception as e:
                    self.log(f"dl-launcher: could not read the stack's tags, nodes go without them: {e}")
        return self._tags

    def _terminate(self, nodes: Sequence[Node], kind: str, reason: str) -> None:
        self._guard(kind)
        ids = [n.id for n in nodes]
        terminate(self.ec2, ids)
        self._forget(ids)
        self._add(kind, ",".join(sorted({n.instance_type for n in nodes})), reason, ids)

    def _forget(self, ids: Iterable[str]) -> None:
        for i in ids:
            self._state.recent.pop(i, None)
            self._state.noticed.pop(i, None)

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _forced_teardown(self, why: str, held: str) -> list[Transition]:
        """Teardown without the lease: a stack delete, the idle guard or the budget stop must end
        the billing even if the lease never comes free. Every instance of this cluster goes; the
        stopped state is written over whatever is there."""
        self._state, self._done = ControllerState(cluster=self.spec.cluster, stopped=True), []
        nodes = list_cluster(self.ec2, self.spec.cluster, self.spec.stack)
        terminate(self.ec2, [n.id for n in nodes])
        self._add("torn-down", ",".join(sorted({n.instance_type for n in nodes})),
                  f"terminated {len(nodes)} instances without the lease ({held}): {why}", [n.id for n in nodes])
        self._state.updated_at = self.clock()
        try:
            self.store.overwrite(self._state)
        except Exception as e:  # the instances are gone either way; the next reconcile sees none
            self._say("state-unsaved", "", f"the stopped state could not be written: {e}")
        return self._done

    def _begin(self, lease: Lease, state: ControllerState) -> None:
        self._lease, self._state, self._done = lease, state, []
        state.cluster = self.spec.cluster
        if self.store.problem:
            self._add("state-rebuilt", state.instance_type or "", self.store.problem)
            self.store.problem = None

    def _nodes(self, now: float) -> list[Node]:
        listed = list_cluster(self.ec2, self.spec.cluster, self.spec.stack)
        seen = {n.id for n in listed}
        st = self._state
        st.recent = {i: r for i, r in st.recent.items() if i not in seen and now - r["at"] < RECENT_SECONDS}
        if st.recent:  # not listed: not visible yet, or already gone (reclaimed at once)
            known = states(self.ec2, list(st.recent))
            st.recent = {i: r for i, r in st.recent.items() if known.get(i, "pending") in LIVE_STATES}
        nodes = listed + [Node(i, r["instance_type"], r["subnet"], r["at"]) for i, r in st.recent.items()]
        st.members = sorted(n.id for n in nodes)
        return nodes

    def _save(self, *, release: bool = False) -> None:
        self._state.updated_at = self.clock()
        # Launched this run: members from now on, before EC2 lists them.
        self._state.members = sorted(set(self._state.members) | set(self._state.recent))
        self._lease = self.store.save(self._lease, self._state, release=release)

    def _say(self, kind: str, instance_type: str, reason: str, instances: Sequence[str] = ()) -> Transition:
        """A transition logged as one JSON line (the Lambda's log group is the stack's alerts log)."""
        t = Transition(self.clock(), kind, instance_type, reason, tuple(instances))
        self.log(json.dumps({"cluster": self.spec.cluster, **t.to_dict()}))
        return t

    def _add(self, kind: str, instance_type: str, reason: str, instances: Sequence[str] = ()) -> None:
        """A transition logged and kept in the state's history."""
        t = self._say(kind, instance_type, reason, instances)
        self._state.record(t.to_dict())
        self._done.append(t)
