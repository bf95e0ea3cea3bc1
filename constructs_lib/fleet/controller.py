"""The capacity controller: keeps `nodes` instances of exactly one type running, all or nothing.

A multi-node job runs at its slowest node and its world size, memory and EFA layout are the
type's, so a cluster never holds two types, not even for a minute. Diversity is whole-cluster
alternatives: when the current type cannot be had, the whole cluster moves to the next option.

Each reconcile, under the lease (see state.py):
  1. list the cluster (tag dl-launcher:cluster) and this controller's launches EC2 may not show yet;
  2. settle the current type: the state's while any of it runs, else the type most nodes run;
  3. terminate strays (any other type), nodes that tagged themselves for replacement
     (TAG_HEALTH "replace: ...": a GPU missing, a hardware XID) and the newest extras beyond `nodes`;
  4. nothing running: gang-launch `nodes` of the first option that can be had, in priority order;
  5. short of `nodes`: launch the missing ones of the same type in the survivors' subnet; if the
     cluster has been short for replace_within_seconds, terminate the survivors and gang-launch
     the next options (after the last, from the top again).
Options with no known price, or above the ceiling, are never launched.
Once the job's nodes record its end (job_end.py; a job without a command never ends), none of
the above runs again: the cluster is terminated (on_end "stop") or left as it is ("keep").
Instances with a spot interruption warning count as lost at once (their replacement starts two
minutes earlier) but are left for AWS to take: the node pushes its last checkpoint meanwhile.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Iterable, Optional, Sequence

from dl_core.aws import error_code

from ..runtime.contract import HEALTH_REPLACE
from . import job_end, shortfall
from .instances import Node, terminate
from .leased import KINDS, LeasedRun, Transition, OutOfLease
from .spec import CapacityOption
from .state import LeaseLost

__all__ = ["KINDS", "Controller", "Transition"]


class Controller(LeasedRun):
    """Decisions for one cluster. Not shared between threads: each invocation builds its own."""

    # ---- entry points ----------------------------------------------------------------------------
    def reconcile(self, *, resume: bool = False, noticed: Iterable[str] = ()) -> list[Transition]:
        """One look at the cluster and the changes that bring it to `nodes` of one type.

        resume: clear a teardown, and wait for the lease rather than skip (CloudFormation Create/Update).
        noticed: instance ids with a spot interruption warning.
        """
        got = self.store.wait_for_lease(self.clock) if resume else self.store.acquire(self.clock())
        if got is None:
            return [self._say("waiting", "", "another reconcile holds the lease: it, the next event or the "
                                             "1-minute schedule covers this one")]
        self._begin(*got)
        try:
            if resume and self._state.stopped:
                self._state.stopped = False
                self._add("resumed", "", "CloudFormation created or updated the stack: keeping the cluster running again")
            if resume and self._state.ended is not None:
                self._state.ended = None  # the nodes' records are read again: a job deleted from them runs
            self._state.job = json.loads(self.job_end.to_json()) if self.job_end else None
            if self._state.stopped:
                return [self._say("waiting", "", "torn down: nothing is launched until the stack is created again")]
            try:
                if not self._job_over():
                    self._decide(set(noticed))
            except OutOfLease as e:
                self._add("waiting", "", f"lease about to end before {e}: the next event goes on from here")
            if self._state.short is not None:  # each run short says so: the CapacityShort alarm counts these
                self._say("short", "", shortfall.describe(self._state.short))
            return self._done
        finally:  # also when EC2 failed halfway: what was launched or terminated is remembered
            try:
                self._save(release=True)
            except LeaseLost as e:
                self._say("waiting", "", f"{e}; the next run starts from EC2 as it is")

    def teardown(self, why: str = "the stack is being deleted") -> list[Transition]:
        """Terminate every instance of the cluster and launch nothing more until resumed; `why`
        goes into the transition (stack deletion, the idle guard)."""
        try:
            self._begin(*self.store.wait_for_lease(self.clock))
        except TimeoutError as e:
            return self._forced_teardown(why, str(e))
        try:
            st = self._state
            # Stopped is stored before anything is terminated: the terminations' own events must
            # not find an empty cluster and launch it again, even if this run dies halfway.
            st.stopped = True
            self._save()
            nodes = self._nodes(self.clock())
            terminate(self.ec2, [n.id for n in nodes])
            types = ",".join(sorted({n.instance_type for n in nodes}))
            self._add("torn-down", types, f"terminated {len(nodes)} instances: {why}"
                      if nodes else f"nothing was running: {why}", [n.id for n in nodes])
            st.instance_type, st.loss_since, st.recent, st.noticed, st.short = None, None, {}, {}, None
            return self._done
        finally:
            self._save(release=True)

    # ---- the decision ----------------------------------------------------------------------------
    def _decide(self, noticed: set[str]) -> None:
        spec, st, now = self.spec, self._state, self.clock()
        nodes = self._nodes(now)
        present = {n.id for n in nodes}
        st.noticed = {i: t for i, t in st.noticed.items() if i in present}
        for i in noticed & present:
            st.noticed.setdefault(i, now)

        current = self._current(nodes)
        strays = [n for n in nodes if n.instance_type != current]
        if strays:
            types = ", ".join(sorted({n.instance_type for n in strays}))
            why = f"not the cluster's type {current}" if current else "no longer among the cluster's options"
            self._terminate(strays, "terminated-stray", f"{len(strays)} x {types}: {why}; one cluster never mixes types")
        # A node that marked itself broken (a GPU missing, a hardware XID) holds the whole job back:
        # it goes, and the gap is filled like any lost node's, beside the survivors.
        sick = [n for n in nodes if n.instance_type == current and n.health.startswith(HEALTH_REPLACE)]
        if sick:
            self._terminate(sick, "terminated-unhealthy", "; ".join(f"{n.id}: {n.health}" for n in sick)[:500])
            nodes = [n for n in nodes if n not in sick]
        mine = [n for n in nodes if n.instance_type == current]
        if not mine:
            st.loss_since = None
            if not self._gang(range(len(spec.options))):
                self._none_running()
            return

        live = [n for n in mine if n.id not in st.noticed]
        if len(live) > spec.nodes:
            extras = sorted(live, key=lambda n: (n.launched, n.id))[spec.nodes:]
            self._terminate(extras, "terminated-extra", f"{len(live)} running, {spec.nodes} wanted: the newest go")
            live = [n for n in live if n not in extras]
        if len(live) == spec.nodes:
            st.loss_since = None
            return

        if st.loss_since is None:
            st.loss_since = now
        assert current is not None
        if self._replace(current, live or mine, spec.nodes - len(live)):
            st.loss_since = None
        elif now - st.loss_since >= spec.replace_within_seconds:
            self._move(current, mine, len(live))

    def _job_over(self) -> bool:
        """Whether the job has ended; if so, its cluster is stopped (on_end "stop") or kept, and
        nothing is launched or replaced. Until the end is seen it is looked for on every run."""
        watch, st = self.job_end, self._state
        if watch is None:
            return False
        if st.ended is None:
            try:
                end, problems = job_end.read(self.store.s3, watch)
            except Exception as e:  # noqa: BLE001 - a record that cannot be read is no end; the next run looks again
                self._say("waiting", "", f"the job's end could not be read ({' '.join(str(e).split())[:300]}): "
                                         "the cluster is kept as it is; the next run looks again")
                return False
            for problem in problems:
                self._say("job-record-set-aside", "", problem)
            if end is None:
                return False
            st.ended = end.to_dict()
            st.loss_since, st.short, st.noticed = None, None, {}
            self._add("job-ended", st.instance_type or "", f"the job {end.line()}: " + (
                f"terminating the cluster (on_end=stop); checkpoints stay in s3://{watch.bucket}/{watch.prefix}/"
                if watch.on_end == "stop" else "keeping the nodes for debugging (on_end=keep); nothing is "
                "replaced; dl-launcher destroy ends the bill"))
            self._save()  # before any termination: the runs its events wake must find the job over
        st.ended["on_end"] = watch.on_end  # a redeploy may change it: the deployed one holds
        if watch.on_end != "stop":
            return True
        nodes = self._nodes(self.clock())
        if not nodes:
            return True
        self._guard("terminating the nodes of a job that ended")
        ids = [n.id for n in nodes]
        try:
            terminate(self.ec2, ids)
        except Exception as e:
            if not error_code(e):
                raise
            # Throttled or refused: the end is stored, so nothing is launched meanwhile; every
            # run (the 1-minute schedule) tries the termination again.
            self._add("waiting", "", f"TerminateInstances answered {error_code(e)} for the ended job's {len(ids)} "
                      "node(s): the next run tries again", ids)
            return True
        self._forget(ids)
        st.instance_type = None
        self._add("terminated-ended", ",".join(sorted({n.instance_type for n in nodes})),
                  f"{len(ids)} node(s): the job {st.ended['kind']}; on_end=stop, checkpoints kept in "
                  f"s3://{watch.bucket}/{watch.prefix}/", ids)
        return True

    def _current(self, nodes: Sequence[Node]) -> Optional[str]:
        """The cluster's type: the state's while any of it runs, else the option most nodes run
        (the state may be older than EC2: a run that launched and died before saving)."""
        st, spec = self._state, self.spec
        running = Counter(n.instance_type for n in nodes)
        if running[st.instance_type or ""] and spec.option_index(st.instance_type) is not None:
            return st.instance_type
        candidates = [o.instance_type for o in spec.options if running[o.instance_type]]
        if not candidates:
            return None
        best = max(candidates, key=lambda t: (running[t], -(spec.option_index(t) or 0)))
        self._add("adopted", best, f"the state says {st.instance_type or 'nothing runs'}, EC2 runs "
                  f"{running[best]} x {best}: that is the cluster now")
        st.instance_type = best
        return best

    def _gang(self, order: Iterable[int]) -> bool:
        """`nodes` of the first option in `order` that can be had, or none at all."""
        spec, st = self.spec, self._state
        for i in order:
            option = spec.options[i]
            if not self._affordable(option):
                continue
            got = self._launch(option, spec.nodes, spec.subnet_ids, minimum=spec.nodes)
            if len(got.ids) >= spec.nodes:
                st.instance_type, st.loss_since, st.short = option.instance_type, None, None
                self._add("launched", option.instance_type, f"{spec.nodes} x {option.instance_type} ({spec.market}) "
                          "launched together", got.ids)
                return True
            if got.ids:  # all or nothing: a part of a cluster trains nothing and costs like the whole
                terminate(self.ec2, got.ids)
                self._forget(got.ids)
            self._add("launch-failed", option.instance_type,
                      f"got {len(got.ids)} of {spec.nodes}" + (" and terminated them (all or nothing)" if got.ids else "")
                      + f": {'; '.join(got.errors) or 'the fleet gave no reason'}", got.ids)
            self._failed = (f"{spec.nodes} x {option.instance_type} ({spec.market})", got.errors)
        return False

    def _replace(self, current: str, survivors: Sequence[Node], missing: int) -> bool:
        """Launch the missing nodes beside the survivors: same type, template (hence placement
        group) and subnet. True when none is missing any more."""
        spec, st = self.spec, self._state
        option = spec.options[spec.option_index(current) or 0]
        if not self._affordable(option):
            return False
        subnet = Counter(n.subnet for n in survivors).most_common(1)[0][0]
        got = self._launch(option, missing, [subnet], minimum=1)
        if got.ids:
            self._add("replaced", current, f"{len(got.ids)} of {missing} missing x {current} launched in {subnet}",
                      got.ids)
        if len(got.ids) >= missing:
            st.short = None
            return True
        self._short(f"{missing - len(got.ids)} more x {current} ({spec.market}) beside the running nodes",
                    shortfall.classify(got.errors), got.errors,
                    f"replacing is tried again every minute; after {spec.replace_within_seconds} s short the whole "
                    "cluster moves to the next option")
        short = self.clock() - (st.loss_since or 0)
        self._add("launch-failed", current, f"replacing {missing - len(got.ids)} x {current} in {subnet}: "
                  f"{'; '.join(got.errors) or 'the fleet gave no reason'}; short for {short:.0f} s, the whole "
                  f"cluster moves after {spec.replace_within_seconds} s")
        return False

    def _move(self, current: str, mine: Sequence[Node], live: int) -> None:
        spec, st = self.spec, self._state
        here = spec.option_index(current) or 0
        after, before = list(range(here + 1, len(spec.options))), list(range(here))
        if not after and not before:
            self._add("waiting", current, f"{current} is the only option: replacing it keeps being tried")
            return
        self._terminate(mine, "moved", f"{live} of {spec.nodes} x {current} for "
                        f"{self.clock() - (st.loss_since or 0):.0f} s (bound {spec.replace_within_seconds} s) and "
                        "replacements keep failing: moving the whole cluster to the next option")
        st.instance_type, st.loss_since = None, None
        if self._gang(after):
            return
        if before:
            self._add("wrapped", "", f"past the last option ({spec.options[-1].instance_type}): from the top again")
            if self._gang(before):
                return
        self._none_running()

    def _none_running(self) -> None:
        self._state.instance_type = None
        if self._failed:
            what, errors = self._failed
            kind = shortfall.classify(errors)
        else:  # every option was skipped for its price, none was tried
            what, errors, kind = f"{self.spec.nodes} nodes of any option", ("no option is within the ceiling",), "price"
        self._short(what, kind, errors, f"every option again ({len(self.spec.options)}, in order) on the next EC2 "
                    "event or the 1-minute schedule")
        self._add("waiting", "", f"no option could launch {self.spec.nodes} nodes; none running; "
                  "trying again on the next event or the 1-minute schedule")

    def _short(self, what: str, kind: str, errors: Sequence[str], next_step: str) -> None:
        """Remember why the cluster is short, keeping the time it first was (status reads it)."""
        old = self._state.short
        self._state.short = {"since": old["since"] if old else self.clock(), "what": what, "kind": kind,
                             "error": "; ".join(errors) or "the fleet gave no reason", "next": next_step}

    def _affordable(self, option: CapacityOption) -> bool:
        spec = self.spec
        if option.price is None:
            why = f"no {spec.market} price is known for {option.instance_type}: never launched at an unknown price"
        elif option.price > spec.max_price:
            why = (f"{option.instance_type} costs {option.price} USD/h per node ({spec.market}), above the "
                   f"ceiling {spec.max_price}")
        else:
            return True
        self._add("skipped-price", option.instance_type, why)
        return False
