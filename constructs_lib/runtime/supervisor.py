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
    hung (no step for the stated time), or  stop the run, run the quick health checks: failed, leave and
      a straggler that persists (stall.py)  wait to be replaced; passed, a failure ("hung: ..."), rejoin

"Interrupted" is what Checkpointer records when the ranks stop together for a termination
notice; the command itself exits 0 then. torchrun runs with --max-restarts=0: every restart
goes through a new generation, so no agent keeps a dead master.

The rooms: decisions.py decides (pure functions), membership.py talks to the cluster (heartbeat,
rendezvous, gone, join), run.py starts, watches and stops one run; this module wires them to the
job (its revision, setup, environment), the checkpoints (restore, the last push) and the end.
"""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Callable, Optional, Union

from dl_core.aws import brief
from . import contract, framework_checkpoints, kept, memory_store, notice, rendezvous, sharded_store, stall, survivor
from .ranks import WarmRanks
from .agent import push_newest, pushed_step, write_health
from .cluster import ClusterState, Liveness, Member, Plan
from .collective_check import CollectiveCheck
from .health_gate import HealthGate, conclude
from .decisions import (
    agreed_outcome, container_env, error_signature, failures_after, gives_up, repeated_error, run_environment,
)
from .jobdef import JobError, NodeJob, Prepared, Revision
from .joblog import JobLog
from .membership import Hooks, Membership
from .resume import restore
from .run import Run
from .rundir import set_phase
from .store import CheckpointStore
from .supervisor_state import State, SupervisorConfig

Log = Callable[[str], None]


class Supervisor:
    def __init__(self, cfg: SupervisorConfig, store: CheckpointStore, cluster: ClusterState, liveness: Liveness,
                 *, local_dir: Optional[str] = None, command_file: Optional[str] = None, log: Log = print,
                 job: Optional[NodeJob] = None, joblog: Optional[JobLog] = None) -> None:
        self.cfg, self.store, self.cluster, self.liveness = cfg, store, cluster, liveness
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
        self.state = State.load()
        hooks = Hooks(ended=self._end, last_ran=lambda: self.state.last_ran, resume_step=self._newest_step,
                      revision=self._revision_for_plan, redeployed=self._redeployed, leave=self.leave)
        self.membership = Membership(cluster, liveness, self.me, hooks, nodes=cfg.nodes, poll=cfg.poll,
                                     liveness_poll=cfg.liveness_poll, member_grace=cfg.member_grace,
                                     retry_base=cfg.retry_base, log=log)
        self.ride = self.membership.ride
        self.ranks = WarmRanks(cfg.nproc_per_node, log)  # -c restart=in-process: survivors keep their ranks
        # The pre-generation all-reduce (-c collective_check=): a node it finds slow never trains.
        self.collective = CollectiveCheck.from_env(os.environ, me=self.me, cluster=cluster, ec2=liveness.ec2,
                                                   nproc=cfg.nproc_per_node, log=log, health=write_health)

    def rendezvous(self) -> Union[Plan, int]:
        return self.membership.rendezvous()

    def stop_beats(self) -> None:
        self.membership.stop_beats()

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        # The boot health gate runs while the job is prepared (staging included); a node it fails never joins.
        gate = HealthGate.from_env(os.environ, log=self.log, health=write_health).start()
        started = self._before_first_generation()
        if started is not None:
            return started
        self.ranks.prewarm(self)  # -c restart=in-process: the ranks import while the node waits for its plan
        end = conclude(gate, self.liveness.ec2, self.cfg.node, self.log)
        if end is not None:
            return end
        first = True
        while True:
            # At start an AWS error ends the supervisor (systemd starts it again, and the journal
            # says why); between generations it is ridden out, as everything after.
            end = self.membership.ended() if first else self.ride(self.membership.ended, "reading how the job ended")
            first = False
            if end is not None:
                return end
            plan = self.rendezvous()
            if isinstance(plan, int):
                return plan
            checked = self.collective.check(plan)  # None: train; an exit code: this node was excluded
            if isinstance(checked, int):
                return checked
            outcome, detail = checked or self.execute(plan)
            if outcome == "job-error":
                return self._job_error(JobError(detail, final=True), plan.generation)
            checked = stall.after_run(self, plan.generation, outcome, detail)  # a hang, a straggler (stall.py)
            if isinstance(checked, int):
                return checked
            end = self._after(plan, *checked)
            if end is not None:
                return end

    def _before_first_generation(self) -> Optional[int]:
        """An exit code when there is nothing to run; else None (code, image and setup prepared
        with the revision this node booted with; a plan naming another one is prepared again)."""
        boot = self.job.boot_revision() if self.job else None
        if boot is None:
            if not os.path.exists(self.command_file) or not open(self.command_file).read().strip():
                self.log("no command configured (cdk deploy -c command=...): the node stays up for SSM sessions")
                return contract.EXIT_FINISHED
            return None
        end = self._end()
        if end is not None:
            return end
        try:
            prepared = self._prepare(boot)
        except JobError as e:
            return self._job_error(e, 0)
        if prepared.definition.command is None:
            self.log(f"no command configured: the code is in {contract.work_dir()}; the node stays up for SSM sessions")
            write_health("job", "ok", f"ready in {contract.work_dir()}; no command")
            return contract.EXIT_FINISHED
        return None

    def _after(self, plan: Plan, outcome: str, detail: str) -> Optional[int]:
        """Count, record and act on how generation `plan.generation` ended; an exit code, or None for the next."""
        g = plan.generation
        outcome, detail, signature, lines = self._agreed_outcome(g, outcome, detail)
        self.state.last_ran = g
        self.state.history = (self.state.history + [{"generation": g, "outcome": outcome, "detail": detail,
                                                     "resume_step": plan.resume_step, "at": time.time()}])[-20:]
        self.log(f"generation {g} ended: {outcome}" + (f" ({detail})" if detail else ""))
        self.state.failures = failures_after(outcome, self.state.failures, plan.resume_step, self.state.last_resume)
        repeated = outcome == "failed" and repeated_error(signature, self.state.last_signature)
        self.state.last_signature = signature if outcome == "failed" else None
        self.state.last_resume = plan.resume_step
        self.state.save()
        kept.promote(plan=plan, node=self.me.node, local_dir=self.local_dir, store=self.store, cluster=self.cluster,
                     membership=self.membership, newest=self._newest_step, ride=self.ride, log=self.log, outcome=outcome)
        self.flush()
        if outcome == "finished":
            step = self.ride(self._newest_step, "reading the final step")  # whichever node pushed it
            self.ride(lambda: self.cluster.mark_finished(generation=g, node=self.me.node, step=step),
                      "marking the job finished")
            write_health("job", "ok", "the job finished")
            return contract.EXIT_FINISHED
        if gives_up(outcome, self.state.failures, self.cfg.max_failures, repeated):
            return self._give_up(g, detail, lines, repeated and self.state.failures < self.cfg.max_failures)
        return self.leave(g + 1) if notice.read().terminating else None

    def _give_up(self, g: int, detail: str, lines: list[str], repeated: bool) -> int:
        if repeated:
            reason = f"the command failed twice in a row with the same error, from the same step ({detail})"
        else:
            reason = f"the command failed {self.state.failures} times in a row without a newer checkpoint ({detail})"
        self.ride(lambda: self.cluster.mark_failed(generation=g, node=self.me.node, reason=reason,
                                                   attempts=self.state.failures, last_lines=lines or self._last_lines()),
                  "marking the job failed")
        # A leave in the next generation stops the others' runs now (what they watch anyway),
        # instead of at their collectives' timeout; they then find the job failed.
        self.ride(lambda: self.cluster.leave(g + 1, self.me.node, reason=f"the job failed: {reason}",
                                             pushed=pushed_step()), "leaving the cluster")
        write_health("job", "failed", reason)
        self.log(f"giving up: {reason}")
        return contract.EXIT_FAILED

    def _agreed_outcome(self, g: int, outcome: str, detail: str) -> tuple[str, str, str, list[str]]:
        """The same count of failures on every node: a node whose command failed records it (its
        exit, its error's signature and last lines) before it joins the next generation, which is
        what stops the others' runs; a node that saw only "peer lost" then finds that record and
        counts the generation failed too, with the failing node's error. Returns (outcome, detail,
        the error's signature, its last lines)."""
        if outcome == "failed":
            lines = self._last_lines()
            signature = "" if detail.startswith(stall.HUNG_PREFIX) else error_signature(lines)  # never "the same error"
            try:
                self.ride(lambda: self.cluster.record_failure(g, self.me.node, detail, signature=signature,
                                                              last_lines=lines), "recording the failure")
            except Exception as e:  # noqa: BLE001 - the others then count it as lost, as before; never a crash
                self.log(f"could not record the failure of generation {g}: {brief(e)}")
            return outcome, detail, signature, lines
        if outcome == "peer-lost":
            records = self.ride(lambda: self.cluster.failure_records(g), "reading the generation's failures")
            outcome, detail = agreed_outcome(outcome, detail, self.me.node,
                                             {n: str(r.get("detail", "")) for n, r in records.items()})
            first = next((records[n] for n in sorted(records) if n != self.me.node), {})
            return outcome, detail, str(first.get("signature", "")), list(first.get("last_lines", []))
        return outcome, detail, "", []

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

    def _newest_step(self) -> Optional[int]:
        return getattr(sharded_store.newest_complete(self.store), "step", None)  # None: no complete step

    # ---- the job ---------------------------------------------------------------------------------------
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
        self.ride(lambda: self.cluster.mark_failed(generation=generation, node=self.me.node, reason=reason,
                                                   last_lines=self._last_lines()), "marking the job failed")
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

    def leave(self, g: int) -> int:
        """This node got a termination notice: its last save goes to S3, then it leaves for good."""
        n = notice.read()
        at = notice.deadline(n)
        self.flush(until=None if at is None else at - 5)  # leave the last seconds to AWS
        self.ride(lambda: self.cluster.leave(g, self.me.node, reason=f"termination notice {json.dumps(n.termination)}",
                                             pushed=pushed_step()), "leaving the cluster")
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
        survivor.clear(self.local_dir)
        memory_store.clear(contract.memory_dir())
        rank, n = plan.rank_of(self.me.node) or 0, self.cfg.nproc_per_node
        try:
            restored = restore(self.store, self.local_dir, plan.resume_step, log=self.log,
                               retry_base=self.cfg.retry_base, ranks=range(rank * n, (rank + 1) * n),
                               world_size=len(plan.members) * n)
        except Exception as e:  # noqa: BLE001 - the cluster cannot run this plan here: a failed run, counted
            return "failed", f"restore: {type(e).__name__}: {e}"
        watch = lambda: stall.StallWatch.for_run(self, plan.generation)  # noqa: E731 - made only if used
        warm = self.ranks.resume(plan, self.me.node, restored, plan.job, watch)
        job = self._job_for_run(plan, rank, restored) if warm is None else (None, {}, None)
        if isinstance(job[0], str):
            return job  # type: ignore[return-value]
        run = warm or self._start(plan, *job)
        set_phase("training", run.pid)
        return run.watch()

    def _job_for_run(self, plan: Plan, rank: int, restored: Optional[str]):
        """(prepared, extra env, collector) for the plan's job revision, or an outcome when it cannot run."""
        try:
            rev = self._plan_revision(plan)
        except ValueError as e:
            return "failed", f"the plan's job revision: {e}"
        if rev is None:
            return None, {}, None
        assert self.job is not None
        try:
            prepared = self._prepare(rev)
            if prepared.definition.command is None:
                return "job-error", f"job revision {rev.sha256[:12]} has no command"
            extra = self.job.environment(prepared.definition, self.job.secrets(prepared.definition), prepared.workdir)
        except JobError as e:
            return ("job-error" if e.final else "failed"), str(e)
        collector = None
        if prepared.definition.checkpoint_dir:
            try:
                collector = framework_checkpoints.before_run(
                    prepared.workdir, prepared.definition.checkpoint_dir, restored, self.local_dir,
                    collects=rank == 0, local_ranks=range(self.cfg.nproc_per_node), floor=plan.resume_step,
                    settle=self.cfg.settle, log=self.log)
            except OSError as e:
                return "failed", f"checkpoint_dir: {type(e).__name__}: {e}"
            extra["DL_FRAMEWORK_CHECKPOINT_DIR"] = os.path.join(prepared.workdir, prepared.definition.checkpoint_dir)
        return prepared, extra, collector

    def _start(self, plan: Plan, prepared: Optional[Prepared], extra: dict[str, str],
               collector: Optional[framework_checkpoints.Collector]) -> Run:
        env_vars = rendezvous.write(plan, self.me.node, self.cfg.nproc_per_node, self.cfg.cluster)
        for f in glob.glob(os.path.join(contract.path("outcome_dir"), f"gen-{plan.generation}-rank-*")):
            os.unlink(f)
        env = run_environment(os.environ, extra, env_vars, contract.read_env("resume_env"),
                              lib_python=os.path.join(contract.lib_dir(), "python"), checkpoint_dir=self.local_dir,
                              notice_file=contract.path("notice"), notice_signal=contract.NOTICE_SIGNAL)
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
        argv = self.ranks.launcher(argv, env, plan, env.get("DL_RESUME_FROM"))  # unchanged on torchrun's path
        self.log(f"generation {plan.generation}: running {what}")
        write_health("job", "ok", f"running generation {plan.generation}")
        if self.joblog:
            self.joblog.new_run()
        return self.ranks.started(Run.start(argv, cwd=workdir, env=env, joblog=self.joblog, plan=plan, me=self.me.node,
                         membership=self.membership, poll=self.cfg.poll, liveness_poll=self.cfg.liveness_poll,
                         stop_timeout=self.cfg.stop_timeout, log=self.log, collector=collector,
                         stop_container=self.job.stop_container if self.job else (lambda: None),
                         stall=stall.StallWatch.for_run(self, plan.generation)), plan.job)

    def flush(self, until: Optional[float] = None) -> Optional[int]:
        """Push the newest local save now (the agent would too; whoever holds the lock first does it)."""
        return push_newest(self.store, self.local_dir, until=until if until is not None else
                           time.time() + self.cfg.flush_timeout, retry_base=self.cfg.retry_base, log=self.log)
