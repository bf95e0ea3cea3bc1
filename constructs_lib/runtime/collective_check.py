"""Before a generation trains, its members run a short all-reduce together (allreduce_probe.py, a
process of its own) and compare its bus bandwidth with the type's baseline for that node count
(dl_selector/data/allreduce_baselines.toml, carried in node.env: contract.ENV_ALLREDUCE_BASELINE).

Every member gets the same verdict (rank 0's, broadcast), so every member acts alike:
  - at or above the threshold, or no baseline for this type and node count: the command starts
    (without a baseline the figure is recorded in the generation's collective.json and the job
    log, and reported, never enforced);
  - below, with the slowest node told apart by pairs (busbw.py): that node writes its health
    "collective" failed, leaves the next generation, tags itself contract.TAG_HEALTH "replace:
    <why>" (the capacity controller replaces it) and never trains; the others end this generation
    without running the command ("excluded") and form the next one without it;
  - below with 2 members (one pair: no telling which): reported, and the command starts.
A probe that fails or passes its bound (a member that never joins) ends the generation as
"peer-lost": the next one forms with whoever is alive; it never hangs the supervisor. A check can
never stop a job by itself: where the supervisor's Python has no torch the probe is skipped, and
after FAILURES_BEFORE_SKIP failed probes in a row on this node the command starts without one
(both reported as degraded): a probe that cannot work on this image must not end every generation.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Callable, Mapping, Optional, Union

from dl_core.aws import brief
from . import busbw, contract
from .cluster import ClusterState, Member, Plan
from .health_gate import hold

Log = Callable[[str], None]
COMPONENT = "collective"  # its file in health.d
TIMEOUT_DEFAULT = 120.0   # seconds: torch's rendezvous and collectives; the process is killed at twice this
FAILURES_BEFORE_SKIP = 2  # failed probes in a row after which the command starts without one


class CollectiveCheck:
    def __init__(self, *, size_mib: int, baselines: Mapping[int, float], instance_type: str, me: Member,
                 cluster: ClusterState, ec2, nproc: int, log: Log, health: Callable[[str, str, str], None],
                 env: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT_DEFAULT, iters: int = 5,
                 hold_rounds: Optional[int] = None, sleep: Optional[Callable[[float], None]] = None) -> None:
        self.size_mib, self.baselines, self.instance_type = size_mib, dict(baselines), instance_type
        self.me, self.cluster, self.ec2, self.nproc = me, cluster, ec2, nproc
        self.log, self.health = log, health
        self.env = dict(env if env is not None else os.environ)
        self.timeout, self.iters = timeout, iters
        self.hold_rounds, self.sleep = hold_rounds, sleep
        self.failed_in_row = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str], **kw) -> "CollectiveCheck":
        """What node.env says: the size (0: off, which is also what a node without the setting gets)."""
        size = str(env.get(contract.ENV_COLLECTIVE_CHECK, "off"))
        mib = contract.COLLECTIVE_CHECKS.get(size, int(size) if size.isdigit() else 0)
        return cls(size_mib=mib, baselines=busbw.parse_baseline(env.get(contract.ENV_ALLREDUCE_BASELINE, "")),
                   instance_type=env.get(contract.ENV_INSTANCE_TYPE, ""), env=env,
                   timeout=float(env.get("DL_COLLECTIVE_CHECK_TIMEOUT_SECONDS") or TIMEOUT_DEFAULT), **kw)

    def port(self, plan: Plan) -> int:
        """Half the range away from the plan's own port: never the one torchrun binds next."""
        return contract.rendezvous_port_base() + (plan.generation + contract.RENDEZVOUS_PORT_SPAN // 2) \
            % contract.RENDEZVOUS_PORT_SPAN

    def check(self, plan: Plan) -> Union[None, int, tuple[str, str]]:
        """None: the command starts. (outcome, detail): this generation does not train. An exit
        code: this node was excluded (after its hold, which on a node lasts until it is replaced)."""
        rank, n = plan.rank_of(self.me.node), len(plan.members)
        if not self.size_mib or n < 2 or rank is None:
            return None
        got = self._probe(plan, rank)
        if isinstance(got, str):
            self.failed_in_row += 1
            self.health(COMPONENT, "degraded", got)
            if self.failed_in_row >= FAILURES_BEFORE_SKIP:
                self.log(f"collective check: {got}; {self.failed_in_row} failed in a row on this node, so "
                         f"generation {plan.generation} starts without it")
                return None
            self.log(f"collective check: {got}")
            return "peer-lost", f"collective check: {got}"
        self.failed_in_row = 0
        if "skipped" in got:
            self.log(f"collective check skipped: {got['skipped']}")
            self.health(COMPONENT, "degraded", f"skipped: {got['skipped']}")
            return None
        v = busbw.Verdict(got["busbw"], got["baseline"], got["exclude"],
                          {(a, b): bw for a, b, bw in got.get("pairs", [])})
        line = v.line(self.size_mib, n, self.instance_type)
        self.log(f"collective check, generation {plan.generation}: {line}")
        if rank == 0:
            self._record(plan, got, line)
        if not v.below or v.exclude is None:
            self.health(COMPONENT, "degraded" if v.below else "ok", f"generation {plan.generation}: {line}")
            return None
        slow = plan.members[v.exclude].node
        why = f"collective check: {line} ({slow})"
        if slow != self.me.node:
            self.health(COMPONENT, "ok", f"generation {plan.generation}: {slow} excluded: {line}")
            return "excluded", f"{slow} excluded by the collective check ({line})"
        self.health(COMPONENT, "failed", f"{why}: this node is to be replaced")
        self.log(f"collective check: this node is the slowest; it leaves generation {plan.generation + 1} "
                 "and never trains")
        try:
            self.cluster.leave(plan.generation + 1, self.me.node, reason=why, pushed=None)
        except Exception as e:  # noqa: BLE001 - the others then wait their grace for it, as for a lost node
            self.log(f"collective check: leaving generation {plan.generation + 1} failed: {brief(e)}")
        kw = {"rounds": self.hold_rounds} if self.hold_rounds is not None else {}
        return hold(self.ec2, self.me.node, why, self.log, **({"sleep": self.sleep} if self.sleep else {}), **kw)

    def _probe(self, plan: Plan, rank: int) -> Union[dict, str]:
        argv = [sys.executable, "-m", "constructs_lib.runtime.allreduce_probe", "--master", plan.master_addr,
                "--port", str(self.port(plan)), "--nodes", str(len(plan.members)), "--node-rank", str(rank),
                "--local", str(self.nproc), "--size-mib", str(self.size_mib), "--iters", str(self.iters),
                "--timeout", str(self.timeout), "--baseline", busbw.format_baseline(self.baselines)]
        env = dict(self.env)
        lib = os.path.join(contract.lib_dir(), "python")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (lib, env.get("PYTHONPATH", "")) if p)
        bound = 2 * self.timeout + 30
        try:  # a session of its own: on GPU nodes the probe's ranks are its children, killed with it
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        except OSError as e:
            return f"could not start the all-reduce: {e}"
        try:
            stdout, stderr = proc.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"the all-reduce did not end within {bound:.0f} s (a member never joined?)"
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (stderr.strip().splitlines() or [""])[-1][:300]
            return f"the all-reduce failed (exit {proc.returncode}): {tail}"
        try:
            return json.loads(lines[-1])
        except ValueError:
            return f"the all-reduce printed no verdict: {lines[-1][:200]}"

    def _record(self, plan: Plan, got: dict, line: str) -> None:
        """gen-N/collective.json: the figure (a first use of a type is recorded here), for people."""
        try:
            self.cluster.record_collective(plan.generation, {**got, "instance_type": self.instance_type, "nodes": len(plan.members),
                                                             "members": plan.nodes(), "size_mib": self.size_mib,
                                                             "said": line})
        except Exception as e:  # noqa: BLE001 - the job log has it too
            self.log(f"collective check: the figure was not recorded: {brief(e)}")
