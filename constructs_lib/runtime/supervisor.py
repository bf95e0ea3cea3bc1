"""The job supervisor (dl-job.service): runs the training command once per cluster generation.

Each round: agree on a plan with the other nodes (cluster.py), restore the plan's step, run the
deployer's command with the plan's rendezvous in its environment, watch the cluster while it
runs, and decide from how it ended what comes next. The exit-code contract:

    how the run ended                       what the supervisor does
    finished (exit 0, no notice)            push the last save, mark the job finished, exit 0
    interrupted, notice on THIS node        push the last save before the deadline, leave the
                                            cluster, wait for AWS to take the node
    interrupted, notice on another node     push, join the next generation (resume with the
                                            replacement, from the step everyone saved)
    peer lost (a member gone, or a node     stop the run at once (never wait out a collective
      joined/left the next generation)      timeout on a dead rank 0), join the next generation
    failed (non-zero, every member alive)   retry in the next generation; after max_failures
                                            failures without a newer checkpoint, mark the job
                                            failed on every node and exit 3 (no restart)

"Interrupted" is what Checkpointer records when the ranks stop together for a termination
notice; the command itself exits 0 then. torchrun runs with --max-restarts=0: every restart
goes through a new generation, so no agent keeps a dead master.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, TypeVar, Union

from . import contract, framework_checkpoints, notice, rendezvous, sharded_store
from .agent import NodeAgent, delivered, pushed_step, write_health
from .cluster import ClusterState, Liveness, Member, Plan, choose_members, unaccounted
from .errors import RuntimeUserError
from .jobdef import JobError, NodeJob, Prepared, Revision
from .joblog import JobLog
from .layout import newest_local, write_atomic
from .resume import restore
from .rundir import health as _health, outcomes as _outcomes
from .store import CheckpointStore
from dl_core.aws import Backoff, Said, jittered, transient

Log = Callable[[str], None]
T = TypeVar("T")


@dataclass
class SupervisorConfig:
    cluster: str
    nodes: int
    nproc_per_node: int
    node: str                     # this instance's id
    addr: str                     # this instance's private address
    poll: float = 2.0             # seconds between looks at S3 while waiting or running
    liveness_poll: float = 10.0   # seconds between DescribeInstances calls
    member_grace: float = 600.0   # how long a new plan waits for a previous member that is neither back nor gone
    max_failures: int = 3         # failed runs in a row, without a newer checkpoint, before the job is failed
    stop_timeout: float = 20.0    # SIGTERM, then SIGKILL, for a run that must stop
    flush_timeout: float = 600.0  # how long to wait for the last save's upload before moving on
    retry_base: float = 1.0       # first backoff of S3 retries
    settle: float = 10.0          # a checkpoint_dir file without a framework marker is whole once unchanged this long

    @classmethod
    def from_env(cls, **kw) -> "SupervisorConfig":
        env = os.environ
        num = {"poll": "DL_POLL_SECONDS", "liveness_poll": "DL_LIVENESS_POLL_SECONDS",
               "member_grace": "DL_MEMBER_GRACE_SECONDS", "stop_timeout": "DL_STOP_TIMEOUT_SECONDS",
               "flush_timeout": "DL_FLUSH_TIMEOUT_SECONDS", "retry_base": "DL_RETRY_BASE_SECONDS",
               "settle": "DL_CHECKPOINT_SETTLE_SECONDS"}
        for name, var in num.items():
            if var in env and name not in kw:
                kw[name] = float(env[var])
        if "DL_MAX_FAILURES" in env and "max_failures" not in kw:
            kw["max_failures"] = int(env["DL_MAX_FAILURES"])
        return cls(**kw)


@dataclass
class _State:
    """Survives a restart of the supervisor within one boot (it lives in the run directory)."""
    last_ran: int = 0
    failures: int = 0
    last_resume: Optional[int] = None
    history: list = field(default_factory=list)

    @classmethod
    def load(cls) -> "_State":
        try:
            with open(contract.path("supervisor_state")) as f:
                return cls(**json.load(f))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return cls()

    def save(self) -> None:
        write_atomic(contract.path("supervisor_state"), json.dumps(asdict(self)))


class Supervisor:
    def __init__(self, cfg: SupervisorConfig, store: CheckpointStore, cluster: ClusterState, liveness: Liveness,
                 *, local_dir: Optional[str] = None, command_file: Optional[str] = None, log: Log = print,
                 job: Optional[NodeJob] = None, joblog: Optional[JobLog] = None) -> None:
        self.cfg = cfg
        self.store = store
        self.cluster = cluster
        self.liveness = liveness
        self.local_dir = local_dir or contract.checkpoint_dir()
        self.command_file = command_file or contract.path("job_command")
        self.log = log
        # The deployer's job definition (code, setup, env, secrets, image); None: the command is
        # the job file written at boot (constructs that pass `command` to enable_job).
        self.job = job
        self.joblog = joblog
        self.me = Member(cfg.node, cfg.addr)
        if job is not None:  # no secret value the job read goes into a record in S3
            cluster.redact = job.redactor.scrub
        self.state = _State.load()
        self._gone_cache: tuple[float, frozenset, set] = (0.0, frozenset(), set())
        self.said = Said(log)
        self.backoff = Backoff(base=cfg.retry_base)
        self._beating: Optional[threading.Event] = None

    # ---- riding out AWS ------------------------------------------------------------------------------
    def _ride(self, fn: Callable[[], T], what: str) -> T:
        """fn(), again and again while AWS throttles or fails transiently: a running command is
        never stopped for it (issue 27); other errors propagate."""
        while True:
            try:
                got = fn()
                self.backoff.reset()
                return got
            except Exception as e:  # noqa: BLE001 - only the transient ones are ridden out
                if not transient(e):
                    raise
                delay = self.backoff.next()
                self.said(what, f"{what}: AWS answered {_brief(e)}; trying again in {delay:.0f} s")
                time.sleep(delay)

    def _start_beats(self) -> None:
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
                    self.said("beat", f"heartbeat not written: {_brief(e)}")
                stop.wait(jittered(self.cfg.liveness_poll))

        threading.Thread(target=beat, name="dl-heartbeat", daemon=True).start()

    def stop_beats(self) -> None:
        if self._beating is not None:
            self._beating.set()

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        boot = self.job.boot_revision() if self.job else None
        if boot is None and (not os.path.exists(self.command_file) or not open(self.command_file).read().strip()):
            self.log("no command configured (cdk deploy -c command=...): the node stays up for SSM sessions")
            return contract.EXIT_FINISHED
        if boot is not None:
            end = self._end()
            if end is not None:
                return end
            # Code, image and setup before the first generation, with the revision this node
            # booted with; a plan that names another one is prepared again before it runs.
            try:
                prepared = self._prepare(boot)
            except JobError as e:
                return self._job_error(e, 0)
            if prepared.definition.command is None:
                self.log(f"no command configured: the code is in {contract.work_dir()}; the node stays up for SSM sessions")
                write_health("job", "ok", f"ready in {contract.work_dir()}; no command")
                return contract.EXIT_FINISHED
        started = False
        while True:
            # At start an AWS error ends the supervisor (systemd starts it again, and the journal
            # says why); between generations it is ridden out, as everything after.
            end = self._ride(self._end, "reading how the job ended") if started else self._end()
            started = True
            if end is not None:
                return end
            plan = self.rendezvous()
            if isinstance(plan, int):
                return plan
            outcome, detail = self.execute(plan)
            if outcome == "job-error":
                return self._job_error(JobError(detail, final=True), plan.generation)
            outcome, detail = self._agreed_outcome(plan.generation, outcome, detail)
            self.state.last_ran = plan.generation
            self.state.history.append({"generation": plan.generation, "outcome": outcome, "detail": detail,
                                       "resume_step": plan.resume_step, "at": time.time()})
            self.state.history = self.state.history[-20:]
            self.log(f"generation {plan.generation} ended: {outcome}" + (f" ({detail})" if detail else ""))
            if outcome == "failed":
                progressed = (plan.resume_step or -1) > (self.state.last_resume if self.state.last_resume is not None else -1)
                self.state.failures = 1 if progressed else self.state.failures + 1
            else:
                self.state.failures = 0
            self.state.last_resume = plan.resume_step
            self.state.save()
            self.flush()
            if outcome == "finished":
                latest = sharded_store.newest_complete(self.store)  # the job's final step, whichever node pushed it
                self.cluster.mark_finished(generation=plan.generation, node=self.me.node,
                                           step=latest.step if latest else None)
                write_health("job", "ok", "the job finished")
                return contract.EXIT_FINISHED
            if outcome == "failed" and self.state.failures >= self.cfg.max_failures:
                reason = f"the command failed {self.state.failures} times in a row without a newer checkpoint ({detail})"
                self.cluster.mark_failed(generation=plan.generation, node=self.me.node, reason=reason,
                                         attempts=self.state.failures, last_lines=self._last_lines())
                # A leave in the next generation stops the others' runs now (what they watch anyway),
                # instead of at their collectives' timeout; they then find the job failed.
                self.cluster.leave(plan.generation + 1, self.me.node, reason=f"the job failed: {reason}",
                                   pushed=pushed_step())
                write_health("job", "failed", reason)
                self.log(f"giving up: {reason}")
                return contract.EXIT_FAILED
            if notice.read().terminating:
                return self.leave(plan.generation + 1)

    def _prepare(self, rev: Revision) -> Prepared:
        assert self.job is not None
        if self.job.prepared is None or self.job.prepared.revision != rev:
            self.log(f"job revision {rev.sha256[:12]}: preparing (definition, code, image, setup)")
            write_health("job", "ok", f"preparing job revision {rev.sha256[:12]}")
        emit = self.joblog.line if self.joblog else self.log
        prepared = self.job.prepare(rev, emit)
        write_health("setup", "ok", f"job revision {rev.sha256[:12]} ready in {prepared.workdir}")
        return prepared

    def _job_error(self, e: JobError, generation: int) -> int:
        """The job cannot run here as deployed. Final (a failed setup, an image that cannot be
        pulled): the job is marked failed for every node with the reason, and this unit is not
        restarted. Otherwise (S3 or SSM unreachable): exit 1 and let systemd try again."""
        reason = f"{self.me.node}: {e}"
        self.log(f"job cannot run: {reason}")
        write_health("setup", "failed" if e.final else "degraded", str(e))
        if not e.final:
            return 1
        self.cluster.mark_failed(generation=generation, node=self.me.node, reason=reason, last_lines=self._last_lines())
        write_health("job", "failed", reason)
        return contract.EXIT_FAILED

    def _last_lines(self) -> list[str]:
        """What the command (or setup) printed last, for the failure record (dl-launcher status)."""
        return self.joblog.last_lines() if self.joblog else []

    def _revision_for_plan(self) -> Optional[dict]:
        rev = self.job.current_revision() if self.job else None
        return rev.to_json() if rev else None

    def _redeployed(self, plan: Plan) -> bool:
        """Whether the job was deployed again since `plan` was made (asked when this supervisor
        starts into a generation it is a member of: a restart of the job unit after a redeploy
        is how a running cluster takes the new revision at once)."""
        if self.job is None or not plan.job:
            return False
        deployed = self.job.deployed_revision()
        if deployed is None or deployed.to_json() == plan.job:
            return False
        self.log(f"the job was deployed again (revision {deployed.sha256[:12]}, generation {plan.generation} runs "
                 f"{str(plan.job.get('sha256'))[:12]}): starting generation {plan.generation + 1} with it")
        return True

    def _plan_revision(self, plan: Plan) -> Optional[Revision]:
        if self.job is None:
            return None
        if plan.job:
            return Revision.from_json(plan.job)
        return self.job.boot_revision()

    def _agreed_outcome(self, g: int, outcome: str, detail: str) -> tuple[str, str]:
        """The same count of failures on every node: a node whose command failed records it before
        it joins the next generation (which is what stops the others' runs); a node that saw only
        "peer lost" then finds that record and counts the generation failed too."""
        if outcome == "failed":
            try:
                self.cluster.record_failure(g, self.me.node, detail)
            except Exception as e:  # the others then count it as lost, as before; never a crash
                self.log(f"could not record the failure of generation {g}: {e}")
            return outcome, detail
        if outcome == "peer-lost":
            elsewhere = [n for n in self.cluster.failures(g) if n != self.me.node]
            if elsewhere:
                return "failed", f"the command failed on {', '.join(elsewhere)} ({detail})"
        return outcome, detail

    def _end(self) -> Optional[int]:
        if self.cluster.finished():
            self.log("the job has finished (on the cluster): nothing to run")
            return contract.EXIT_FINISHED
        failed = self.cluster.failed()
        if failed:
            self.log(f"the job has failed on the cluster: {failed.get('reason')}")
            write_health("job", "failed", str(failed.get("reason")))
            return contract.EXIT_FAILED
        return None

    # ---- rendezvous ----------------------------------------------------------------------------------------
    def _gone(self, nodes, urgent: bool = False) -> set[str]:
        """Liveness with a cache: asked at most every liveness_poll seconds per set of nodes.
        `urgent` (this node's run just failed): a heartbeat counts as stopped after half the usual time."""
        nodes = frozenset(nodes)
        at, asked, gone = self._gone_cache
        if asked != nodes or time.monotonic() - at >= self.cfg.liveness_poll:
            gone = self.liveness.gone(nodes, self.liveness.stale / 2 if urgent else None)
            self._gone_cache = (time.monotonic(), nodes, gone)
        return gone

    def rendezvous(self) -> Union[Plan, int]:
        self._start_beats()
        state = {"waiting_logged": None}
        while True:
            got = self._ride(lambda: self._rendezvous_once(state), "rendezvous")
            if got is not None:
                return got

    def _rendezvous_once(self, state: dict) -> Optional[Union[Plan, int]]:
        """One look: the plan to run, an exit code, or None to look again."""
        end = self._end()
        if end is not None:
            return end
        if notice.read().terminating:
            return self.leave(max(self.cluster.newest_generation(), self.state.last_ran) + 1)
        newest = self.cluster.newest_generation()
        current = self.cluster.plan(newest)
        if current and self.me.node in current.nodes() and newest > self.state.last_ran:
            if not self._redeployed(current):
                self.log(f"generation {newest} already includes this node: running it")
                return current
            return self._join(newest + 1)  # the others stop on this join and re-form with the new revision
        if current is None:  # a plan set aside is never run: its generation is spent, the next one forms
            spent = newest if self.cluster.bad_plan(newest) else self.state.last_ran
            target = newest if newest > spent else spent + 1
        else:
            target = newest + 1
            spare = self.me.node not in current.nodes() and self.state.last_ran < newest
            if spare and not (self._gone(current.nodes()) or self.cluster.activity(target)):
                if state["waiting_logged"] != newest:
                    self.log(f"generation {newest} is full and healthy: this node waits as a spare")
                    state["waiting_logged"] = newest
                time.sleep(jittered(self.cfg.poll))
                return None
        return self._join(target)

    def _join(self, g: int) -> Optional[Union[Plan, int]]:
        """Join generation g and wait for its plan; None: look again (outvoted or overtaken)."""
        self.cluster.join(g, self.me, health=_health())
        self.log(f"joined generation {g} as {self.me.node} ({self.me.addr})")
        started = time.monotonic()
        previous = self.cluster.plan(g - 1)
        last_note = 0.0
        while True:
            plan = self.cluster.plan(g)
            if plan is not None:
                if self.me.node in plan.nodes():
                    self.log(f"generation {g}: rank {plan.rank_of(self.me.node)} of {len(plan.members)}, master "
                             f"{plan.master_addr}:{plan.port}, resume step {plan.resume_step}")
                    return plan
                self.log(f"generation {g} was formed without this node (spare)")
                self.cluster.unjoin(g, self.me)
                return None
            if self.cluster.bad_plan(g):
                return None  # look again: the next generation forms
            end = self._end()
            if end is not None:
                return end
            if notice.read().terminating:
                self.cluster.unjoin(g, self.me)
                return self.leave(g)
            if self.cluster.newest_generation() > g:
                return None
            joins = self.cluster.joins(g)
            leaves = self.cluster.leaves(g)
            for n in leaves:
                joins.pop(n, None)
            gone = self._gone(set(joins) | set(previous.nodes() if previous else []))
            waiting = unaccounted(previous, joins, leaves, gone)
            members = choose_members(self.cfg.nodes, joins, previous, gone)
            if members and (not waiting or time.monotonic() - started >= self.cfg.member_grace):
                latest = sharded_store.newest_complete(self.store)
                self.cluster.propose(Plan(g, tuple(members), latest.step if latest else None,
                                          job=self._revision_for_plan()))
                continue
            if time.monotonic() - last_note > 60:
                alive = len([n for n in joins if n not in gone])
                self.log(f"generation {g}: {alive} of {self.cfg.nodes} nodes here"
                         + (f"; waiting for {', '.join(waiting)} (previous members)" if waiting else ""))
                last_note = time.monotonic()
            time.sleep(jittered(self.cfg.poll))

    def leave(self, g: int) -> int:
        """This node got a termination notice: its last save goes to S3, then it leaves for good."""
        n = notice.read()
        at = notice.deadline(n)
        self.flush(until=None if at is None else at - 5)  # leave the last seconds to AWS
        self.cluster.leave(g, self.me.node, reason=f"termination notice {json.dumps(n.termination)}",
                           pushed=pushed_step())
        self.log(f"left the cluster before generation {g} (termination notice); pushed step {pushed_step()}")
        write_health("job", "ok", "leaving: termination notice")
        while True:  # AWS takes the node at the deadline; exiting would only look like the job ended
            time.sleep(60)

    # ---- one run -------------------------------------------------------------------------------------------
    def execute(self, plan: Plan) -> tuple[str, str]:
        try:
            return self._execute(plan)
        finally:
            set_phase("between")

    def _execute(self, plan: Plan) -> tuple[str, str]:
        set_phase("restoring")
        try:
            rank, n = plan.rank_of(self.me.node) or 0, self.cfg.nproc_per_node
            restored = restore(self.store, self.local_dir, plan.resume_step, log=self.log,
                               retry_base=self.cfg.retry_base, ranks=range(rank * n, (rank + 1) * n),
                               world_size=len(plan.members) * n)
        except Exception as e:  # the cluster cannot run this plan here: a failed run, counted
            return "failed", f"restore: {type(e).__name__}: {e}"
        try:
            rev = self._plan_revision(plan)
        except ValueError as e:
            return "failed", f"the plan's job revision: {e}"
        extra: dict[str, str] = {}
        prepared, collector = None, None
        if rev is not None:
            assert self.job is not None
            try:
                prepared = self._prepare(rev)
                if prepared.definition.command is None:
                    return "job-error", f"job revision {rev.sha256[:12]} has no command"
                extra = self.job.environment(prepared.definition, self.job.secrets(prepared.definition),
                                             prepared.workdir)
            except JobError as e:
                return ("job-error" if e.final else "failed"), str(e)
            if prepared.definition.checkpoint_dir:
                try:
                    collector = framework_checkpoints.before_run(
                        prepared.workdir, prepared.definition.checkpoint_dir, restored, self.local_dir,
                        collects=rank == 0, local_ranks=range(n), floor=plan.resume_step, settle=self.cfg.settle,
                        log=self.log)
                except OSError as e:
                    return "failed", f"checkpoint_dir: {type(e).__name__}: {e}"
                extra["DL_FRAMEWORK_CHECKPOINT_DIR"] = os.path.join(prepared.workdir, prepared.definition.checkpoint_dir)
        env_vars = rendezvous.write(plan, self.me.node, self.cfg.nproc_per_node, self.cfg.cluster)
        for f in glob.glob(os.path.join(contract.path("outcome_dir"), f"gen-{plan.generation}-rank-*")):
            os.unlink(f)
        env = {k: v for k, v in os.environ.items() if k not in ("DL_RESUME_FROM", "DL_RESUME_STEP")}
        env.update(extra)  # the deployer's env and secrets: never a name the runtime sets below
        env.update(env_vars)
        env.update(contract.read_env("resume_env"))
        pypath = os.path.join(contract.lib_dir(), "python")
        env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["DL_CHECKPOINT_DIR"] = self.local_dir
        env["DL_NOTICE_FILE"], env["DL_NOTICE_SIGNAL"] = contract.path("notice"), contract.NOTICE_SIGNAL
        if prepared is not None:
            assert self.job is not None
            workdir = prepared.workdir
            self.job.stop_container()  # before argv, which writes the container's secrets file
            argv = self.job.argv(prepared.definition, workdir, pass_env=container_env(env, extra))
            what = f"job revision {prepared.revision.sha256[:12]} in {workdir}"
        else:
            workdir = contract.scratch_dir() if os.path.isdir(contract.scratch_dir()) else "/"
            argv = ["/bin/bash", self.command_file]
            what = self.command_file
        self.log(f"generation {plan.generation}: running {what}")
        write_health("job", "ok", f"running generation {plan.generation}")
        out = subprocess.PIPE if self.joblog else None
        proc = subprocess.Popen(argv, cwd=workdir, env=env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT if out else None)
        pump = self.joblog.pump(proc.stdout) if self.joblog and proc.stdout else None
        set_phase("training", proc.pid)
        others = [n for n in plan.nodes() if n != self.me.node]
        reason = ""
        stamp = notice.mtime()
        while True:
            try:
                proc.wait(timeout=self.cfg.poll)
                break
            except subprocess.TimeoutExpired:
                pass
            stamp = self._pass_notice(proc.pid, stamp)
            self._collect(collector)
            try:
                if self.cluster.activity(plan.generation + 1):
                    reason = f"a node joined or left generation {plan.generation + 1}"
                else:
                    gone = self._gone(others)
                    if gone:
                        reason = f"{', '.join(sorted(gone))} gone"
            except Exception as e:  # noqa: BLE001 - AWS's trouble is no evidence of a lost member
                if not transient(e):
                    raise
                self.said("watch", f"generation {plan.generation}: cannot watch the cluster ({_brief(e)}); "
                                   "the run goes on")
            if reason:
                self.log(f"stopping generation {plan.generation}: {reason}")
                self._stop(proc)
                return "peer-lost", reason
        if pump is not None:
            pump.join(timeout=10)  # the last lines, before the outcome is logged after them
        rc = proc.returncode
        outcomes = _outcomes(plan.generation)
        if rc == 0 or "interrupted" in outcomes:
            self._collect(collector, exited=True)  # its last save, before flush() pushes the newest
        if "interrupted" in outcomes:
            return "interrupted", f"termination notice; saved step {outcomes['interrupted']}"
        if rc == 0:
            return "finished", ""
        # A peer's death usually fails the collectives here before EC2 or S3 show it: look for a
        # few polls before counting a failure against the job.
        # A lost peer shows as its heartbeat going stale and one node's EC2 check: wait that long.
        stale = self.liveness.stale if self.liveness.cluster is not None else 0.0
        settle = time.monotonic() + max(3 * self.cfg.poll, stale / 2 + 2 * self.cfg.liveness_poll)
        exited_at = None  # S3's clock when the run ended: a peer that beats after it was alive then
        while time.monotonic() < settle:
            try:
                if self.cluster.activity(plan.generation + 1):
                    return "peer-lost", f"exit {rc}; a node joined or left generation {plan.generation + 1}"
                gone = self._gone(others, urgent=True)
                if gone:
                    return "peer-lost", f"exit {rc}; {', '.join(sorted(gone))} gone"
                if stale:
                    beats, s3_now = self.cluster.beats()
                    exited_at = s3_now if exited_at is None else exited_at
                    # LastModified has whole seconds: a beat a full second after the exit is after it.
                    if others and all(beats.get(o, 0.0) >= exited_at + 1 for o in others):
                        break  # every peer lived past this failure: it is the job's, not a lost member's
            except Exception as e:  # noqa: BLE001
                if not transient(e):
                    raise
                settle += self.cfg.poll  # the look that failed does not count toward the settling time
            time.sleep(jittered(self.cfg.poll))
        return "failed", f"exit {rc}"

    def _pass_notice(self, pid: int, stamp: float) -> float:
        """A new notice (termination or rebalance) reaches the command's processes as a signal."""
        now = notice.mtime()
        if now != stamp and now:
            sent = notice.deliver(pid)
            self.log(f"notice passed to the command: {contract.NOTICE_SIGNAL} to "
                     + (f"{len(sent)} process(es) that handle it" if sent else "no process (none handles it; "
                        "DL_NOTICE_FILE has it)"))
        return now

    def _collect(self, collector: Optional[framework_checkpoints.Collector], *, exited: bool = False) -> None:
        if collector is None:
            return
        try:
            collector.poll(exited=exited)
        except OSError as e:  # a full disk or a vanished directory: the next look tries again
            self.said("collect", f"checkpoint_dir: cannot collect ({type(e).__name__}: {e})")

    def _stop(self, proc: subprocess.Popen) -> None:
        for sig, wait in ((signal.SIGTERM, self.cfg.stop_timeout), (signal.SIGKILL, 10.0)):
            if sig == signal.SIGKILL and self.job is not None:
                self.job.stop_container()  # docker passes SIGTERM on to the container, not SIGKILL
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def flush(self, until: Optional[float] = None) -> Optional[int]:
        """Push the newest local save now (the agent would too; whoever holds the lock first does it)."""
        end = until if until is not None else time.time() + self.cfg.flush_timeout
        agent = NodeAgent(self.store, self.local_dir, log=self.log)
        delay = self.cfg.retry_base
        while True:
            try:
                agent.upload_once()
                newest = newest_local(self.local_dir)
                if not newest or (delivered(*newest) and not agent.committing):
                    return pushed_step()
            except RuntimeUserError as e:
                self.log(f"cannot push the last save: {e}")
                return pushed_step()
            except Exception as e:
                self.log(f"pushing the last save failed ({type(e).__name__}: {e}); retrying")
            if time.time() + delay > end:
                self.log("gave up waiting for the last save's upload")
                return pushed_step()
            time.sleep(delay)
            delay = min(30.0, delay * 2)


def container_env(env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """What a job's container gets of the run's environment: the deployer's env and secrets, the
    runtime's DL_ names and rendezvous, the region (credentials come from IMDS, as on the host)."""
    rendezvous_names = {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE"}
    keep = ("DL_", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "NCCL_", "FI_")
    return {k: v for k, v in env.items() if k in extra or k in rendezvous_names or k.startswith(keep)}


def _brief(e: BaseException) -> str:
    code = getattr(e, "response", {}).get("Error", {}).get("Code") if hasattr(e, "response") else None
    return f"{code or type(e).__name__}: {' '.join(str(e).split())[:160]}"


def set_phase(phase: str, pid: Optional[int] = None) -> None:
    """What the node monitor reports as Restoring / TrainingRunning (never fails the job)."""
    assert phase in contract.PHASES
    try:
        write_atomic(contract.path("phase"), json.dumps({"phase": phase, "pid": pid, "since": time.time()}))
    except OSError:
        pass
