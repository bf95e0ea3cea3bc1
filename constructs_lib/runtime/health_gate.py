"""The boot health gate: before a node joins its first generation, its GPUs, EFA and scratch RAID
are checked (health_checks.py), in a thread of their own while the supervisor prepares the job
(code, image, data staging, setup), so the gate costs a cold start only what it takes beyond
those.

A node that fails never joins a generation: it writes health `gate` failed with the reason (what
`status` shows), says each check in the job log, tags itself contract.TAG_HEALTH = "replace:
<why>" (what the monitor does for a GPU it loses, and what the capacity controller acts on), and
waits for its replacement to take it. A degraded finding (a tool missing, a counter not read) is
said and does not keep the node out: a node is replaced for what is known to be broken, never
for what could not be looked at.

The verdict holds for the boot (health.d is in DL_RUN_DIR): a restarted supervisor does not run
the gate again.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

from . import contract
from .health_checks import DISK_CHECKS, EFA_CHECKS, GPU_CHECKS, LEVELS, Check, Expect, Finding, Tools

Log = Callable[[str], None]
COMPONENT = "gate"  # its file in health.d


def checks_for(expect: Expect, sdk: str) -> tuple[Check, ...]:
    """The checks for what node.env says this node has: GPU checks where the catalog gives it
    NVIDIA GPUs (Neuron and CPU nodes have none of those tools), EFA checks where the launch
    template attaches EFA, the RAID's size where it builds one."""
    return ((GPU_CHECKS if sdk == "cuda" and expect.gpus else ()) + (EFA_CHECKS if expect.efa else ())
            + (DISK_CHECKS if expect.scratch_gb else ()))


def passed_this_boot() -> bool:
    try:
        with open(os.path.join(contract.path("health_dir"), COMPONENT)) as f:
            return f.read().startswith("ok ")
    except OSError:
        return False


class HealthGate:
    def __init__(self, expect: Expect, *, checks: Sequence[Check], tools: Tools = Tools(), log: Log = print,
                 health: Callable[[str, str, str], None]) -> None:
        self.expect, self.checks, self.tools = expect, tuple(checks), tools
        self.log, self.health = log, health
        self.findings: list[Finding] = []
        self.took: Optional[float] = None
        self._thread: Optional[threading.Thread] = None
        self.summary = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, log: Log, health: Callable[[str, str, str], None]) -> "HealthGate":
        expect = Expect.from_env(env)
        return cls(expect, checks=checks_for(expect, env.get("DL_SDK", "cuda")), tools=Tools.from_env(env), log=log,
                   health=health)

    def start(self) -> "HealthGate":
        """Run the checks in the background (a gate already passed this boot is not run again)."""
        if not self.checks:
            self.took = 0.0
            return self
        if passed_this_boot():
            self.log("health gate: passed earlier this boot")
            self.took = 0.0
            return self
        self.health(COMPONENT, "ok", f"checking this node ({self.expect.level})")
        self._thread = threading.Thread(target=self.run, name="health-gate", daemon=True)
        self._thread.start()
        return self

    def run(self) -> list[Finding]:
        started = time.monotonic()
        self.log(f"health gate: {len(self.checks)} checks, DCGM level {self.expect.level}")
        for check in self.checks:
            try:
                f = check(self.expect, self.tools)
            except Exception as e:  # noqa: BLE001 - a check's own bug is not the node's fault
                f = Finding(check.__name__, "degraded", f"{type(e).__name__}: {e}")
            self.findings.append(f)
            self.log(f"health gate: {f.line()}")
        self.took = time.monotonic() - started
        return self.findings

    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "failed"]

    def reason(self) -> str:
        return "; ".join(f"{f.check}: {f.message}" for f in self.failed())

    def wait(self) -> bool:
        """True when the node may join (after the checks end); the verdict is written either way."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        elif self.took is None:
            self.run()
        if self.took == 0.0 and not self.findings:
            return True  # passed earlier this boot
        failed = self.failed()
        if failed:
            why = self.reason()
            self.health(COMPONENT, "failed", f"{why}: this node is to be replaced")
            self.log(f"health gate: FAILED in {self.took:.0f} s: {why}; this node never joins a generation")
            return False
        worst = max((LEVELS.index(f.level) for f in self.findings), default=0)
        said = f"passed in {self.took:.0f} s ({len(self.findings)} checks"
        degraded = [f.check for f in self.findings if f.level == "degraded"]
        said += f"; not looked at: {', '.join(degraded)})" if degraded else ")"
        self.health(COMPONENT, LEVELS[worst], said)
        self.log(f"health gate: {said}")
        self.summary = said
        return True


def mark_for_replacement(ec2, instance_id: str, why: str, log: Log) -> bool:
    """Tag this node TAG_HEALTH = "replace: <why>" (the capacity controller replaces it); False
    when EC2 refused (the caller tries again)."""
    try:
        ec2.create_tags(Resources=[instance_id],
                        Tags=[{"Key": contract.TAG_HEALTH, "Value": f"{contract.HEALTH_REPLACE}: {why}"[:255]}])
    except Exception as e:  # noqa: BLE001 - said, and tried again by the caller
        log(f"health gate: tagging this node for replacement failed: {e}")
        return False
    log(f"health gate: tagged {contract.TAG_HEALTH} for replacement")
    return True


def conclude(gate: HealthGate, ec2, instance_id: str, log: Log) -> Optional[int]:
    """After the gate: None when the node may join (its verdict, when checks ran this boot, is
    its TAG_HEALTH "ok: ...", which `dl-launcher status` lists; best effort: a node that passed is
    never held for a tag); else the node waits to be replaced (hold)."""
    if not gate.wait():
        return hold(ec2, instance_id, gate.reason(), log)
    if gate.summary:
        try:  # never over a monitor's "replace: ..." (it runs from boot too): that node is replaced
            tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]},
                                              {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
            if any(t["Value"].startswith(contract.HEALTH_REPLACE) for t in tags):
                return None
            ec2.create_tags(Resources=[instance_id],
                            Tags=[{"Key": contract.TAG_HEALTH, "Value": f"ok: gate {gate.summary}"[:255]}])
        except Exception as e:  # noqa: BLE001 - the verdict is in health.d and the job log as well
            log(f"health gate: the verdict was not tagged: {e}")
    return None


def hold(ec2, instance_id: str, why: str, log: Log, *, sleep: Callable[[float], None] = time.sleep,
         rounds: Optional[int] = None) -> int:
    """A failed node waits to be taken, tagging itself until EC2 accepts the tag (rounds: for tests)."""
    tagged, n = False, 0
    while rounds is None or n < rounds:
        tagged = tagged or mark_for_replacement(ec2, instance_id, why, log)
        sleep(60)
        n += 1
    return contract.EXIT_FAILED
