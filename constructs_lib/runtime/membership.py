"""A node's membership of the cluster: heartbeat, rendezvous, join, gone, leave.

It talks to the cluster's state in S3 (cluster.py) and to Liveness, nothing else: what it needs
from the rest of the node (how the job ended, the step a new plan resumes from, the job revision,
the leave on a notice) comes in as `Hooks`. Every call after the node's first generation rides
out AWS's throttling and 5xx (`ride`): throttling is account-wide, so a supervisor that exited on
it would stop every node of the cluster together. What to do at each look is decided by
decisions.rendezvous_target and decisions.ready_to_propose.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, TypeVar, Union

from dl_core.aws import Backoff, Said, brief, jittered, retry
from . import notice
from .cluster import ClusterState, Liveness, Member, Plan, choose_members, unaccounted
from .decisions import ready_to_propose, rendezvous_target, waiting_poll
from .rundir import health as _health

T = TypeVar("T")
Log = Callable[[str], None]


@dataclass
class Hooks:
    """What membership asks of the rest of the node.
      ended():        an exit code when the job has finished or failed on the cluster, else None
      last_ran():     the last generation this node ran
      resume_step():  the newest complete checkpoint's step, for a new plan (None: from scratch)
      revision():     the job revision a new plan runs (jobdef.Revision's JSON), or None
      redeployed(p):  whether the job was deployed again since plan p was made
      leave(g):       this node got a termination notice: push, leave before generation g, wait for AWS
    """
    ended: Callable[[], Optional[int]]
    last_ran: Callable[[], int]
    resume_step: Callable[[], Optional[int]]
    revision: Callable[[], Optional[dict]] = lambda: None
    redeployed: Callable[[Plan], bool] = lambda plan: False
    leave: Callable[[int], int] = lambda g: 0


class Membership:
    # A node waiting for a plan reads the job's end records and the newest generation once in this
    # many polls, not at every look: at 1,000 nodes each read is 500 requests a second (issue 36).
    LOOK_POLLS = 3

    def __init__(self, cluster: ClusterState, liveness: Liveness, me: Member, hooks: Hooks, *, nodes: int,
                 poll: float = 2.0, liveness_poll: float = 10.0, member_grace: float = 600.0,
                 retry_base: float = 1.0, log: Log = print) -> None:
        self.cluster, self.liveness, self.me, self.hooks = cluster, liveness, me, hooks
        self.nodes, self.poll, self.liveness_poll, self.member_grace = nodes, poll, liveness_poll, member_grace
        self.log = log
        self.said = Said(log)
        self.backoff = Backoff(base=retry_base)
        self._gone_cache: tuple[float, frozenset, set, bool] = (float("-inf"), frozenset(), set(), False)
        self._beating: Optional[threading.Event] = None
        self._ended_at = float("-inf")  # when hooks.ended() was last asked (time.monotonic())

    # ---- riding out AWS ------------------------------------------------------------------------
    def ride(self, fn: Callable[[], T], what: str) -> T:
        """fn(), again and again while AWS throttles or fails transiently (a running command is never
        stopped for it, and a supervisor never exits on it); other errors propagate."""
        def note(e: BaseException, delay: float) -> None:
            self.said(what, f"{what}: AWS answered {brief(e)}; trying again in {delay:.0f} s")
        got = retry(fn, backoff=self.backoff, on_retry=note)
        self.backoff.reset()
        return got

    # ---- heartbeat -----------------------------------------------------------------------------
    def start_beats(self) -> None:
        """This node's heartbeat (ClusterState.beat) every liveness period, whatever the supervisor
        is doing (a long restore included): the others ask EC2 about a node only when it stops."""
        if self._beating is not None:
            return
        stop = self._beating = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                try:
                    self.cluster.beat(self.me.node)
                except Exception as e:  # noqa: BLE001 - a missed beat makes this node a suspect, never gone
                    self.said("beat", f"heartbeat not written: {brief(e)}")
                stop.wait(jittered(self.liveness_poll))

        threading.Thread(target=beat, name="dl-heartbeat", daemon=True).start()

    def stop_beats(self) -> None:
        if self._beating is not None:
            self._beating.set()

    # ---- who is gone -----------------------------------------------------------------------------
    def gone(self, nodes: Iterable[str], *, urgent: Iterable[str] = (), among: Optional[Iterable[str]] = None,
             since: Optional[float] = None) -> set[str]:
        """Liveness, asked at most once per liveness period whatever the nodes asked about: while a
        fleet boots the set grows at every arrival, and a cache keyed on the set would ask at each
        one. A node not in the last answer counts as alive until the next period's look.
        `urgent` (Liveness.gone): asked at once when the last answer was not urgent or about other
        nodes, then at most every half period (the askers' EC2 calls with it)."""
        nodes, urgent = frozenset(nodes), frozenset(urgent)
        at, asked, gone, was_urgent = self._gone_cache
        age = time.monotonic() - at
        if age >= self.liveness_poll or (urgent and (not was_urgent or not nodes <= asked
                                                      or age >= self.liveness_poll / 2)):
            gone = self.liveness.gone(nodes, urgent=urgent, among=among, since=since)
            self._gone_cache = (time.monotonic(), nodes, gone, bool(urgent))
        return gone & nodes

    # ---- the job's end -----------------------------------------------------------------------------
    def ended(self, lately: bool = False) -> Optional[int]:
        """hooks.ended(); `lately`: None without asking when it was asked within LOOK_POLLS polls."""
        if lately and time.monotonic() - self._ended_at < self.LOOK_POLLS * self.poll:
            return None
        self._ended_at = time.monotonic()
        return self.hooks.ended()

    # ---- rendezvous ------------------------------------------------------------------------------
    def rendezvous(self) -> Union[Plan, int]:
        """The plan this node runs next, or an exit code (the job ended; a notice, which never returns)."""
        self.start_beats()
        # After a loss every survivor starts this within a poll of the others (they see the next
        # generation's first join at their next poll), and at a fleet's start many nodes at once:
        # spread over a poll, their first looks do not all land in one second of S3's budget.
        time.sleep(random.uniform(0.0, self.poll))
        state: dict = {"waiting_logged": None}
        while True:
            got = self.ride(lambda: self._look(state), "rendezvous")
            if got is not None:
                return got

    def _look(self, state: dict) -> Optional[Union[Plan, int]]:
        """One look: the plan to run, an exit code, or None to look again."""
        end = self.ended(lately=True)
        if end is not None:
            return end
        if notice.read().terminating:
            return self.hooks.leave(max(self.cluster.newest_generation(), self.hooks.last_ran()) + 1)
        newest = self.cluster.newest_generation()
        current = self.cluster.plan(newest)
        redeployed = bool(current and self.me.node in current.nodes() and newest > self.hooks.last_ran()
                          and self.hooks.redeployed(current))
        target = rendezvous_target(newest, current.nodes() if current else None, self.me.node, self.hooks.last_ran(),
                                   bool(current is None and self.cluster.bad_plan(newest)), redeployed)
        if target.action == "run":
            self.log(f"generation {newest} already includes this node: running it")
            return current
        if target.action == "spare-check" and current is not None:
            if not (self.gone(current.nodes()) or self.cluster.activity(target.generation)):
                if state["waiting_logged"] != newest:
                    self.log(f"generation {newest} is full and healthy: this node waits as a spare")
                    state["waiting_logged"] = newest
                time.sleep(jittered(self.poll))
                return None
        return self.join(target.generation)

    def join(self, g: int) -> Optional[Union[Plan, int]]:
        """Join generation g and wait for its plan; None: look again (outvoted or overtaken)."""
        self.cluster.join(g, self.me, health=_health())
        self.log(f"joined generation {g} as {self.me.node} ({self.me.addr})")
        started = time.monotonic()
        previous = self.cluster.plan(g - 1)
        last_note = float("-inf")  # the monotonic clock counts from boot: a node up under a minute notes too
        looks = 0  # the end records and the newest generation were read just before: again every LOOK_POLLS looks
        while True:
            looks += 1
            view = self.cluster.view(g)  # joins, leaves and whether a plan is there: one LIST
            plan = self.cluster.plan(g) if view.planned else None
            if plan is not None:
                return self._joined(g, plan)
            if view.planned and self.cluster.bad_plan(g):
                return None  # look again: the next generation forms
            if notice.read().terminating:
                self.cluster.unjoin(g, self.me)
                return self.hooks.leave(g)
            if looks % self.LOOK_POLLS == 0:
                newest, end_records = self.cluster.top()
                end = self.ended() if end_records else None
                if end is not None:
                    return end
                if newest > g:
                    return None
            joins, leaves = view.joins, view.leaves
            for n in leaves:
                joins.pop(n, None)
            # Who is gone matters only once enough nodes have joined to write a plan: until then no
            # plan can be written whoever is gone, and a fleet that boots for a minute would ask anyway
            # (the last answer still keeps a known-dead member out of the "waiting for" note). Then a
            # previous member that has not rejoined is an urgent suspect: the first joined nodes ask
            # EC2 about it at once rather than after its heartbeat goes stale.
            asked = set(joins) | set(previous.nodes() if previous else [])
            known = self._gone_cache[2] & asked
            if len(joins) >= self.nodes:
                missing = unaccounted(previous, joins, leaves, known)
                gone = self.gone(asked, urgent=missing, among=joins) if missing else self.gone(asked)
            else:
                gone = known
            waiting = unaccounted(previous, joins, leaves, gone)
            members = choose_members(self.nodes, joins, previous, gone)
            if ready_to_propose(bool(members), waiting, time.monotonic() - started, self.member_grace):
                # A plan is never written for a member recorded gone since the last look (by a peer's
                # EC2 check or the controller's event): one more LIST, once per plan.
                late = self.cluster.gone_nodes() & {m.node for m in members or ()}
                if late:
                    self._gone_cache = (float("-inf"), frozenset(), set(), False)
                    continue
                self.cluster.propose(Plan(g, tuple(members or ()), self.hooks.resume_step(), job=self.hooks.revision()))
                continue
            if time.monotonic() - last_note > 60:
                alive = len([n for n in joins if n not in gone])
                self.log(f"generation {g}: {alive} of {self.nodes} nodes here"
                         + (f"; waiting for {', '.join(waiting)} (previous members)" if waiting else ""))
                last_note = time.monotonic()
            time.sleep(jittered(waiting_poll(self.poll, self.liveness_poll, complete=bool(members))))

    def _joined(self, g: int, plan: Plan) -> Optional[Plan]:
        if self.me.node in plan.nodes():
            self.log(f"generation {g}: rank {plan.rank_of(self.me.node)} of {len(plan.members)}, master "
                     f"{plan.master_addr}:{plan.port}, resume step {plan.resume_step}")
            return plan
        self.log(f"generation {g} was formed without this node (spare)")
        self.cluster.unjoin(g, self.me)
        return None

    # ---- what a running generation watches ---------------------------------------------------------
    def next_active(self, g: int) -> bool:
        """Whether a node has joined or left generation g (the run of g - 1 is then over)."""
        return self.cluster.activity(g)
