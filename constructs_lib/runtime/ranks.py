"""In-process restart, the node's side (restart=in-process; issue 37): the supervisor starts the
node's ranks itself, and the ranks of a node that survives a peer's death keep their processes.

Why not torchrun: its static-rendezvous agents exchange their workers' addresses through the
node-rank-0 agent's store at every start, so a fresh agent on a newcomer can never join the
workers a survivor's old agent still runs. Here the node's launcher (`python -m
constructs_lib.runtime.ranks --nproc N -- COMMAND...`, the run's one process, in a session of its
own as torchrun is) starts N ranks of the per-rank command with torchrun's environment
(inprocess.rank_env) and ends as torchrun would: with the first non-zero exit (the others
stopped), or 0 once every rank exited 0. It stays as long as its ranks do, across generations.

The supervisor (WarmRanks): when a rank's collective fails (survivor.COLLECTIVE_FAILED), it waits
up to PARK_WAIT seconds for every local rank to park (inprocess.run_generations); parked, the run
is left running and the next plan is an assignment file (inprocess.ASSIGNMENT) instead of a fresh
start; not parked in time, the run is stopped and the next one starts cold, as on torchrun's path.
A redeployed revision, a notice, the job's own failure, a hang: the run stops as before.
Bounds: a launcher whose supervisor is gone stops its ranks; a parked rank whose launcher is gone,
or whose assignment does not come within DL_INPROCESS_WAIT_SECONDS, exits.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import contract
from .inprocess import ASSIGNMENT, ENV_DIR, assignment_text, parked_name, rank_env
from .layout import write_atomic

if TYPE_CHECKING:
    from .cluster import Plan
    from .run import Run

PARK_WAIT = 10.0  # seconds every local rank gets to park after a collective failed (parking measured well under 1 s)
STOP_WAIT = 10.0  # seconds the launcher gives its other ranks after one failed, as torchrun does, before SIGKILL


def enabled(env: Optional[dict] = None) -> bool:
    return (env if env is not None else os.environ).get(contract.ENV_RESTART) == contract.RESTART_IN_PROCESS


class WarmRanks:
    """The supervisor's side: the run whose ranks may be parked, and the next plan's assignment."""

    def __init__(self, nproc: int, log: Callable[[str], None], *, park_wait: float = PARK_WAIT) -> None:
        self.enabled = enabled()
        self.nproc, self.log, self.park_wait = nproc, log, park_wait
        self.directory = os.path.join(contract.run_dir(), "inprocess")
        self.run: Optional["Run"] = None
        self.revision: Any = None  # the plan's job revision (JSON) the run was started with

    def launcher(self, argv: list[str], env: dict[str, str], plan: "Plan", resume_from: Optional[str]) -> list[str]:
        """A cold start: the argv that runs `argv` once per local rank (unchanged off this mode)."""
        if not self.enabled:
            return argv
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
        os.makedirs(self.directory)
        env[ENV_DIR] = self.directory
        self._assign(plan, env["NODE_RANK"], resume_from)
        return [*_launcher(self.nproc), *argv]

    def prewarm(self, sup: Any) -> None:
        """Start the ranks of the job revision the node booted with before any plan exists: they
        import torch and the script, then wait in run_generations for their first assignment
        (a newcomer's restart is then a process group's init, not an interpreter's start)."""
        rev = sup.job.boot_revision() if self.enabled and sup.job is not None else None
        prepared = sup.job.prepared if rev is not None else None
        if prepared is None or prepared.revision != rev or prepared.definition.command is None:
            return
        from .decisions import RENDEZVOUS_NAMES, run_environment
        from .run import Run

        try:
            extra = sup.job.environment(prepared.definition, sup.job.secrets(prepared.definition), prepared.workdir)
        except Exception as e:  # noqa: BLE001 - the first generation starts them cold, and says why there
            self.log(f"not starting the ranks before the plan: {type(e).__name__}: {e}")
            return
        base = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_NAMES and k != "DL_GENERATION"}
        env = run_environment(base, extra, {}, {}, lib_python=os.path.join(contract.lib_dir(), "python"),
                              checkpoint_dir=sup.local_dir, notice_file=contract.path("notice"),
                              notice_signal=contract.NOTICE_SIGNAL)
        shutil.rmtree(self.directory, ignore_errors=True)
        os.makedirs(self.directory)
        env[ENV_DIR] = self.directory
        argv = [*_launcher(self.nproc), *sup.job.argv(prepared.definition, prepared.workdir, pass_env={})]
        if sup.joblog:
            sup.joblog.new_run()
        run = Run.start(argv, cwd=prepared.workdir, env=env, joblog=sup.joblog, plan=None, me=sup.me.node,
                        membership=sup.membership, poll=sup.cfg.poll, liveness_poll=sup.cfg.liveness_poll,
                        stop_timeout=sup.cfg.stop_timeout, log=self.log)
        self.started(run, rev.to_json())
        run.parked = True  # waiting for its first assignment, as a parked run waits for its next
        self.log(f"job revision {rev.sha256[:12]}: {self.nproc} rank(s) started before the plan (launcher {run.pid})")

    def started(self, run: "Run", revision: Any) -> "Run":
        """`run` (a cold start), remembered with its job revision (the plan's) in this mode."""
        if self.enabled:
            run.parks = self.parked
            self.run, self.revision = run, revision
        return run

    def parked(self, generation: int) -> bool:
        """Whether every local rank of `generation` parked within park_wait (the run still going)."""
        assert self.run is not None
        until = time.monotonic() + self.park_wait
        names = [os.path.join(self.directory, parked_name(generation, r)) for r in range(self.nproc)]
        while time.monotonic() < until and self.run.proc.poll() is None:
            if all(os.path.exists(n) for n in names):
                self.log(f"generation {generation}: every rank parked; their processes wait for the next generation")
                return True
            time.sleep(0.05)
        missing = [r for r, n in enumerate(names) if not os.path.exists(n)]
        self.log(f"generation {generation}: local rank(s) {missing} did not park within {self.park_wait:.0f} s: "
                 "stopping the run, the next generation starts cold")
        return False

    def resume(self, plan: "Plan", node: str, resume_from: Optional[str], revision: Any,
               stall_for: Callable[[], Any]) -> Optional["Run"]:
        """The parked run, told its next generation; None when the next run must start cold.
        stall_for makes the run's StallWatch, only here: it clears the step reports, so before the
        assignment, which the ranks answer with their first report."""
        run, self.run = self.run, None
        if run is None or not run.parked:
            return None
        if run.proc.poll() is not None or revision != self.revision:
            why = "the ranks exited" if run.proc.poll() is not None else "the job was deployed again"
            self.log(f"generation {plan.generation}: {why}: starting the ranks cold")
            run.stop()
            return None
        from . import rendezvous

        env = rendezvous.write(plan, node, self.nproc)
        for f in glob.glob(os.path.join(contract.path("outcome_dir"), f"gen-{plan.generation}-rank-*")):
            os.unlink(f)
        stall = stall_for()
        self._assign(plan, env["NODE_RANK"], resume_from)
        self.log(f"generation {plan.generation}: assigned to the parked ranks (launcher {run.pid}); no restart")
        run.next_generation(plan, stall)
        self.run = run
        return run

    def _assign(self, plan: "Plan", node_rank: str, resume_from: Optional[str]) -> None:
        write_atomic(os.path.join(self.directory, ASSIGNMENT), assignment_text(
            generation=plan.generation, node_rank=int(node_rank), nnodes=len(plan.members), nproc_per_node=self.nproc,
            master_addr=plan.master_addr, master_port=plan.port, resume_from=resume_from,
            resume_step=plan.resume_step))

    def stop(self) -> None:
        run, self.run = self.run, None
        if run is not None and run.proc.poll() is None:
            run.stop()


# ---- the launcher: one process per node and run, in the run's session ---------------------------------
def _launcher(nproc: int) -> list[str]:
    """The launcher's argv, less the command; --parent: this supervisor, whose exit it watches."""
    return [sys.executable, "-m", "constructs_lib.runtime.ranks", "--nproc", str(nproc), "--parent", str(os.getpid()), "--"]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m constructs_lib.runtime.ranks")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--parent", type=int, default=None, help="the supervisor's process id [the parent's]")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if a.nproc < 1 or not command:
        p.error("needs --nproc N (N >= 1) and a command")
    supervisor = a.parent or os.getppid()
    planned = {k: os.environ[k] for k in ("NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    children = []
    for local in range(a.nproc):
        env = dict(os.environ)
        env.update(rank_env(local_rank=local, nproc_per_node=a.nproc,
                            node_rank=int(planned["NODE_RANK"]) if "NODE_RANK" in planned else None,
                            nnodes=int(planned["NNODES"]) if "NNODES" in planned else None,
                            master_addr=planned.get("MASTER_ADDR"),
                            master_port=int(planned["MASTER_PORT"]) if "MASTER_PORT" in planned else None))
        children.append(subprocess.Popen(command, env=env))
    signal.signal(signal.SIGTERM, lambda *_: _stop(children, 0.0) or sys.exit(143))
    while True:
        codes = [c.poll() for c in children]
        failed = next((rc for rc in codes if rc not in (None, 0)), None)
        if failed is not None:
            _stop(children, STOP_WAIT)
            return failed if failed > 0 else 128 - failed
        if all(rc == 0 for rc in codes):
            return 0
        if os.getppid() != supervisor:  # the supervisor is gone: nothing will assign a next generation
            print("dl-launcher: the supervisor is gone: stopping the ranks", file=sys.stderr, flush=True)
            _stop(children, STOP_WAIT)
            return 1
        time.sleep(0.1)


def _stop(children: list[subprocess.Popen], wait: float) -> None:
    for c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    until = time.monotonic() + wait
    while time.monotonic() < until and any(c.poll() is None for c in children):
        time.sleep(0.05)
    for c in children:
        if c.poll() is None:
            c.kill()
            c.wait()


if __name__ == "__main__":
    sys.exit(main())
