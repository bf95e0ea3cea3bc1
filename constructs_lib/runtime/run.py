"""One generation's run of the training command: start it, watch it and the cluster, stop it.

A run stops at once when the cluster changes under it (a member gone, a node joining or leaving
the next generation): waiting out a collective's timeout on a dead rank 0 costs minutes. A
non-zero exit waits a little for the cluster's word before it counts as the job's failure: a
peer's death fails the collectives here before S3 or EC2 show it (decisions.settle_seconds).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable, Optional

from dl_core.aws import Said, brief, jittered, transient
from . import contract, framework_checkpoints, memory_store, notice
from .cluster import Plan
from .decisions import Outcome, exit_outcome, settle_seconds, settled_outcome, stop_reason
from .joblog import JobLog
from .membership import Membership
from .rundir import outcomes as _outcomes
from .stall import StallWatch
from .survivor import COLLECTIVE_FAILED

Log = Callable[[str], None]


class Run:
    def __init__(self, proc: subprocess.Popen, plan: Plan, me: str, membership: Membership, *, poll: float,
                 liveness_poll: float, stop_timeout: float, log: Log, pump=None,
                 collector: Optional[framework_checkpoints.Collector] = None,
                 stop_container: Callable[[], None] = lambda: None, stall: Optional[StallWatch] = None) -> None:
        self.proc, self.plan, self.me, self.membership, self.stall = proc, plan, me, membership, stall
        self.poll, self.liveness_poll, self.stop_timeout = poll, liveness_poll, stop_timeout
        self.log, self.pump, self.collector, self.stop_container = log, pump, collector, stop_container
        self.said = Said(log)
        self.others = [n for n in plan.nodes() if n != me] if plan else []  # None: ranks.WarmRanks.prewarm
        # restart=in-process (ranks.WarmRanks): whether the ranks parked after a peer's failure, and how to tell
        self.parks: Optional[Callable[[int], bool]] = None
        self.parked = False

    def next_generation(self, plan: Plan, stall: Optional[StallWatch]) -> None:
        """Watch the same, parked ranks in `plan`'s generation (ranks.WarmRanks.resume)."""
        self.plan, self.stall, self.parked = plan, stall, False
        self.others = [n for n in plan.nodes() if n != self.me]

    @classmethod
    def start(cls, argv: list[str], *, cwd: str, env: dict[str, str], joblog: Optional[JobLog],
              **kw) -> "Run":
        """The command in a session of its own (a stop signals its whole process group), its output
        through the job log where there is one."""
        out = subprocess.PIPE if joblog else None
        proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT if out else None)
        pump = joblog.pump(proc.stdout) if joblog and proc.stdout else None
        return cls(proc, pump=pump, **kw)

    @property
    def pid(self) -> int:
        return self.proc.pid

    # ---- watching ------------------------------------------------------------------------------------
    def watch(self) -> Outcome:
        """Until the command exits or the cluster changes under it; then how the run ended."""
        g = self.plan.generation
        stamp = notice.mtime()
        while True:
            try:
                self.proc.wait(timeout=self.poll)
                break
            except subprocess.TimeoutExpired:
                pass
            stamp = self._pass_notice(stamp)
            self.collect()
            memory_store.warm(contract.memory_dir(), str(g))  # a recovery's promote needs torch: import it now
            stalled = self.stall.look() if self.stall is not None else None
            if stalled:  # a hang, or a straggler that persists (stall.py): what follows is the supervisor's
                self.log(f"generation {g}: {stalled[1]}; stopping the run")
                self.stop()
                return stalled
            if COLLECTIVE_FAILED in _outcomes(g):
                # A rank's collective failed (survivor.Keeper's record): a peer is probably dead. The peers
                # are asked about first, so the others learn it from the record while this run stops
                # (torchrun can take minutes to give up on a dead node's store by itself).
                self.log(f"generation {g}: a collective failed on this node")
                self._ask_now(g)
                return self._lost_peer()
            try:
                reason = stop_reason(g + 1, self.membership.next_active(g + 1), self.membership.gone(self.others))
            except Exception as e:  # noqa: BLE001 - AWS's trouble is no evidence of a lost member
                if not transient(e):
                    raise
                self.said("watch", f"generation {g}: cannot watch the cluster ({brief(e)}); the run goes on")
                reason = ""
            if reason:
                self.log(f"stopping generation {g}: {reason}")
                if self.parks is not None and not reason.startswith("a node joined"):  # a member is gone
                    return self._lost_peer(reason)
                self.stop()
                return "peer-lost", reason
        if self.pump is not None:
            self.pump.join(timeout=10)  # the last lines, before the outcome is logged after them
        rc = self.proc.returncode
        outcomes = _outcomes(g)
        if rc == 0 or "interrupted" in outcomes:
            self.collect(exited=True)  # its last save, before the supervisor pushes the newest
        return exit_outcome(rc, outcomes) or self.settle(rc)

    def _lost_peer(self, reason: str = "") -> Outcome:
        """A peer is probably dead: stop the run (in-process restart: unless every rank parked) and settle."""
        self.parked = self.parks is not None and self.parks(self.plan.generation)
        if not self.parked:
            self.stop()
        outcome = self.settle(self.proc.returncode or 1)
        if self.parked and outcome[0] != "peer-lost":  # no peer is gone after all: the job's own failure
            self.parked = False
            self.stop()
        return ("peer-lost", reason) if reason and outcome[0] == "peer-lost" else outcome

    def _ask_now(self, g: int) -> None:
        try:
            self.membership.gone(self.others, urgent=self.others, among=self.plan.nodes())
        except Exception as e:  # noqa: BLE001 - settle asks again; AWS's trouble never ends a run by itself
            if not transient(e):
                raise
            self.said("watch", f"generation {g}: cannot ask about the peers ({brief(e)}); settling")

    def settle(self, rc: int) -> Outcome:
        """A non-zero exit: peer-lost if the cluster shows a loss within the settling time, else failed."""
        g, liveness = self.plan.generation, self.membership.liveness
        stale = liveness.stale if liveness.cluster is not None else 0.0
        until = time.monotonic() + settle_seconds(self.poll, self.liveness_poll, stale)
        exited_at = None  # S3's clock when the run ended: a peer that beats after it was alive then
        while time.monotonic() < until:
            try:
                beats = None
                active = self.membership.next_active(g + 1)
                # Every peer not seen alive since the exit is asked about at once, by the first two
                # live members (the dead one may be first in id order): a kill is known in a look.
                gone = set() if active else self.membership.gone(self.others, urgent=self.others,
                                                                 among=self.plan.nodes(), since=exited_at)
                if stale and not active and not gone:
                    beats, s3_now = self.membership.cluster.beats()
                    exited_at = s3_now if exited_at is None else exited_at
                settled = settled_outcome(rc, g + 1, active, gone, self.others, beats, exited_at)
                if settled:
                    return settled
            except Exception as e:  # noqa: BLE001
                if not transient(e):
                    raise
                until += self.poll  # the look that failed does not count toward the settling time
            time.sleep(jittered(self.poll))
        return "failed", f"exit {rc}"

    def _pass_notice(self, stamp: float) -> float:
        """A new notice (termination or rebalance) reaches the command's processes as a signal."""
        now = notice.mtime()
        if now != stamp and now:
            sent = notice.deliver(self.proc.pid)
            self.log(f"notice passed to the command: {contract.NOTICE_SIGNAL} to "
                     + (f"{len(sent)} process(es) that handle it" if sent else "no process (none handles it; "
                        "DL_NOTICE_FILE has it)"))
        return now

    def collect(self, *, exited: bool = False) -> None:
        if self.collector is None:
            return
        try:
            self.collector.poll(exited=exited)
        except OSError as e:  # a full disk or a vanished directory: the next look tries again
            self.said("collect", f"checkpoint_dir: cannot collect ({type(e).__name__}: {e})")

    # ---- stopping --------------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after stop_timeout. Done when every process of the
        group has exited, not only the command: torchrun may go first while a rank still writes
        the step it kept (survivor.py), and the next generation must find that save whole."""
        started = time.monotonic()
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 10.0)):
            if sig == signal.SIGKILL:
                self.stop_container()  # docker passes SIGTERM on to the container, not SIGKILL
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            if self._group_exited(time.monotonic() + wait):
                break
        self.log(f"generation {self.plan.generation}: the run stopped in {time.monotonic() - started:.1f} s")

    def _group_exited(self, until: float) -> bool:
        """Whether every process of the group exited by `until`. Once the command's children are all
        gone, the command itself is ended: torchrun takes seconds after its workers exit to give up
        on a dead master's store, and has nothing left to save."""
        had_children = bool(_group(self.proc.pid) - {self.proc.pid})
        while time.monotonic() < until:
            members = _group(self.proc.pid)
            if self.proc.poll() is None and had_children and members <= {self.proc.pid}:
                os.kill(self.proc.pid, signal.SIGKILL)
            if self.proc.poll() is not None and not members - {self.proc.pid}:
                return True
            time.sleep(0.05)
        return False


def _group(pgid: int) -> set[int]:
    """The live processes of process group `pgid` (Linux's /proc; zombies count as gone)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.add(int(entry))
    return found
