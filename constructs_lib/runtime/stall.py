"""Hangs and stragglers while a generation trains (issue 38, item 3), from the runtime's own step
counter (steps.py: each local rank's last step and recent step time, in the run directory).

A hang: no rank of this node reported a step for `hang` seconds while the command runs (a run's
first step gets `first_step`: compile, restore, data loading). The run is stopped like any run
that must stop (Run.stop), the quick health checks run (health_gate's checks at the quick level),
and then:
- they fail: the node tags itself for replacement, leaves the next generation (what stops the
  others' runs and makes them re-form without it, as for a termination notice) and waits to be
  taken; its generation's end is no failure of the command (a peer lost, for the others);
- they pass: the generation counts as failed, with "hung: no step for N s at step S" as its
  detail (every node's log, the failure record, `dl-launcher status`), and the node rejoins. A
  hang is never taken for "the same error twice": it counts toward max_failures only.
A node whose run was stopped because a peer hung runs the quick checks too: in a job whose ranks
step together every node stops stepping at once, and the broken one is found by its checks.

A straggler: every `pace_every` seconds each node publishes its median step time (the slowest
of its ranks') in a key of its own (ClusterState.pace) and reads the others' with one LIST. A
node whose median stays above `ratio` times the median of the others' for `report_after` checks
in a row says so (log, health, its TAG_HEALTH for `dl-launcher status`); after `replace_after`
it leaves and asks for its replacement, as a node failing its checks does.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Union

from dl_core.aws import brief, transient
from . import contract, steps
from .agent import pushed_step, write_health
from .health_checks import Expect, Tools
from .health_gate import HealthGate, checks_for, hold

Log = Callable[[str], None]
HUNG, STRAGGLER = "hung", "straggler"  # the outcomes a watch stops a run with
HUNG_PREFIX = contract.HUNG_PREFIX      # how a hang's detail starts, on every node and in its failure record
REPORTS_FLAG = "steps.reported"         # in the run directory: this boot's command has reported steps


@dataclass(frozen=True)
class StallSettings:
    hang: float = float(contract.HANG_SECONDS_DEFAULT)
    first_step: float = float(contract.FIRST_STEP_SECONDS_DEFAULT)
    pace_every: float = 60.0   # seconds between straggler checks (a PUT, a DELETE and a LIST each)
    ratio: float = 1.2         # slower than the others' median by this factor counts against a node
    report_after: int = 3      # checks in a row: reported
    replace_after: int = 10    # checks in a row: replaced

    @classmethod
    def from_env(cls, env: Mapping[str, str], log: Log = print) -> "StallSettings":
        """node.env's values (the constructs checked them at synth); one that is no positive number
        here is said and the default kept: a typo never stops a running job."""
        names = {"hang": contract.ENV_HANG_SECONDS, "first_step": contract.ENV_FIRST_STEP_SECONDS,
                 "pace_every": "DL_PACE_SECONDS", "ratio": "DL_STRAGGLER_RATIO",
                 "report_after": "DL_STRAGGLER_REPORT_CHECKS", "replace_after": "DL_STRAGGLER_REPLACE_CHECKS"}
        kw: dict[str, Any] = {}
        for field, var in names.items():
            if var not in env:
                continue
            kind = int if field.endswith("_after") else float
            try:
                value = kind(env[var])
                if value <= 0:
                    raise ValueError
                kw[field] = value
            except ValueError:
                log(f"{var}={env[var]!r} is not a positive number: keeping {getattr(cls, field)}")
        return cls(**kw)


# ---- the rules (pure) --------------------------------------------------------------------------------
def hang_detail(reports: list[steps.Report], started: float, now: float, s: StallSettings, reports_steps: bool) -> str:
    """"hung: ..." when this node's run is hung, else "". No step yet: the first-step allowance from
    the run's start or a rank's later sign (its announcement: it made a Checkpointer; a busy()),
    and only for a command known to report steps: one seen doing so this boot, or whose ranks
    announced themselves in this run. A plain script never reports one: no alarm."""
    stepped = [r for r in reports if r.step != steps.NO_STEP]
    if not stepped:
        since = max([started] + [r.at for r in reports])
        if (reports or reports_steps) and now - since >= s.first_step:
            return f"{HUNG_PREFIX}no first step for {now - started:.0f} s"
        return ""
    newest = max(r.at for r in reports)
    if now - newest >= s.hang:
        return f"{HUNG_PREFIX}no step for {now - newest:.0f} s at step {max(r.step for r in stepped)}"
    return ""


def node_pace(reports: list[steps.Report]) -> Optional[float]:
    """The node's median step time: its slowest rank's (the one the others wait for)."""
    medians = [r.median for r in reports if r.median is not None]
    return max(medians) if medians else None


def slower_by(mine: float, others: Mapping[str, float]) -> Optional[float]:
    """How many times the others' median this node's step time is (None without others to compare)."""
    values = [v for v in others.values() if v > 0]
    return mine / statistics.median(values) if values else None


def strikes_after(strikes: int, factor: Optional[float], ratio: float) -> int:
    """Checks in a row above the ratio; one check below it starts again from 0 (a blip is no straggler)."""
    return strikes + 1 if factor is not None and factor > ratio else 0


# ---- the watch (Run.watch asks it at every poll) -----------------------------------------------------------
class StallWatch:
    def __init__(self, settings: StallSettings, generation: int, node: str, cluster: Any, *, log: Log,
                 ec2: Any = None) -> None:
        self.s, self.g, self.node, self.cluster, self.log, self.ec2 = settings, generation, node, cluster, log, ec2
        steps.clear()
        self.started = time.time()
        self.next_pace = time.monotonic() + settings.pace_every
        self.strikes, self.key, self.reported = 0, None, False
        self.flag = os.path.join(contract.run_dir(), REPORTS_FLAG)
        self.reports_steps = os.path.exists(self.flag)

    @classmethod
    def for_run(cls, sup: Any, generation: int) -> "StallWatch":
        """The watch of one run of the supervisor `sup` (its settings from node.env)."""
        return cls(StallSettings.from_env(os.environ, sup.log), generation, sup.me.node, sup.cluster, log=sup.log,
                   ec2=sup.liveness.ec2)

    def look(self) -> Optional[tuple[str, str]]:
        """(outcome, detail) when the run must stop for a hang or a straggler that persists, else None."""
        reports = steps.read(str(self.g))
        if reports and not self.reports_steps:
            self.reports_steps = True
            try:  # remembered for the next runs of this boot: their first step then has its allowance
                with open(self.flag, "w"):
                    pass
            except OSError:
                pass
        detail = hang_detail(reports, self.started, time.time(), self.s, self.reports_steps)
        if detail:
            return HUNG, detail
        if time.monotonic() >= self.next_pace:
            self.next_pace = time.monotonic() + self.s.pace_every
            return self._pace(node_pace(reports))
        return None

    def _pace(self, mine: Optional[float]) -> Optional[tuple[str, str]]:
        if mine is None:
            return None
        try:
            self.key = self.cluster.pace(self.g, self.node, round(mine * 1000), self.key)
            others = {n: v for n, v in self.cluster.paces(self.g).items() if n != self.node}
        except Exception as e:  # noqa: BLE001 - a missed check says nothing about this node
            if not transient(e):
                raise
            self.log(f"straggler check skipped: {brief(e)}")
            return None
        factor = slower_by(mine, others)
        self.strikes = strikes_after(self.strikes, factor, self.s.ratio)
        if not self.strikes or factor is None:
            if self.reported:  # the streak is over: the health line says so, the log has the figure
                self.reported = False
                write_health("pace", "ok", f"median step {mine:.2f} s, {factor or 1:.1f}x the other nodes'")
                self.log(f"generation {self.g}: no longer a straggler (median step {mine:.2f} s)")
            return None
        why = (f"{STRAGGLER}: median step {mine:.2f} s, {factor:.1f}x the other nodes' "
               f"{mine / factor:.2f} s, {self.strikes} checks in a row")
        if self.strikes >= self.s.replace_after:
            return STRAGGLER, why
        if self.strikes == self.s.report_after:  # said once per streak; the log has each check's figure
            self.reported = True
            write_health("pace", "degraded", why)
            if self.ec2 is not None:
                tag(self.ec2, self.node, f"ok: {why}", self.log)
        if self.strikes >= self.s.report_after:
            self.log(f"generation {self.g}: {why} (replaced after {self.s.replace_after})")
        return None


# ---- after a run stopped ---------------------------------------------------------------------------------
def after_run(sup: Any, g: int, outcome: str, detail: str, *,
              hold_fn: Callable[..., int] = hold) -> Union[int, tuple[str, str]]:
    """What a stopped run comes to: a hang checks this node (and so does a peer's hang), a
    persistent straggler retires. An exit code when this node leaves the cluster for good
    (hold_fn: health_gate.hold, which waits for AWS to take the node)."""
    if outcome == STRAGGLER:
        return retire(sup, g, detail, hold_fn)
    if outcome == "peer-lost":
        records = sup.ride(lambda: sup.cluster.failure_records(g), "reading the generation's failures")
        hung = sorted(n for n, r in records.items() if str(r.get("detail", "")).startswith(HUNG_PREFIX))
        if not hung:
            return outcome, detail
        why = f"{', '.join(hung)} hung"
    elif outcome == HUNG:
        why = detail
    else:
        return outcome, detail
    failed, said = quick_checks(sup.log)
    if failed:
        return retire(sup, g, f"{why}; the quick health checks failed: {failed}", hold_fn)
    sup.log(f"generation {g}: {why}; {said}: this node rejoins")
    if outcome == HUNG:
        tag(sup.liveness.ec2, sup.me.node, f"ok: {detail}; {said}", sup.log)
        return "failed", detail
    return outcome, detail


def quick_checks(log: Log, env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(why the node failed, "" when it passed; what was checked): health_gate's checks at the quick level."""
    expect = replace(Expect.from_env(env), level="quick")
    gate = HealthGate(expect, checks=checks_for(expect, env.get("DL_SDK", "cuda")), tools=Tools.from_env(env),
                      log=lambda line: log(line.replace("health gate:", "quick checks:", 1)), health=write_health)
    gate.run()
    return gate.reason(), f"quick checks passed ({len(gate.findings)} checks in {gate.took or 0:.0f} s)"


def retire(sup: Any, g: int, why: str, hold_fn: Callable[..., int] = hold) -> int:
    """This node is to be replaced: its newest save pushed, a leave in the next generation (the
    others stop and re-form without it), tagged for replacement, then it waits to be taken."""
    sup.log(f"generation {g}: {why}: this node leaves the cluster to be replaced")
    write_health("job", "failed", f"{why}: to be replaced")
    sup.flush()
    sup.ride(lambda: sup.cluster.leave(g + 1, sup.me.node, reason=why, pushed=pushed_step()), "leaving the cluster")
    return hold_fn(sup.liveness.ec2, sup.me.node, why, sup.log)


def tag(ec2: Any, node: str, value: str, log: Log) -> None:
    """This node's TAG_HEALTH for `dl-launcher status`, never over a "replace: ..." (best effort)."""
    try:
        tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [node]},
                                          {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
        if not any(t["Value"].startswith(contract.HEALTH_REPLACE) for t in tags):
            ec2.create_tags(Resources=[node], Tags=[{"Key": contract.TAG_HEALTH, "Value": value[:255]}])
    except Exception as e:  # noqa: BLE001 - the verdict is in the job log and health.d as well
        log(f"the health tag was not set: {brief(e)}")
