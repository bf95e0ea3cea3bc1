"""What the node monitor looks at on its node each minute, each a probe that never raises: the
GPUs `nvidia-smi` lists and the processes holding them, Session Manager sessions open, the
supervisor's phase, and the XIDs that mean a GPU is broken (why a node must be replaced).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from typing import Optional

from . import contract

# NVIDIA's XID catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html; 48
# and 64 also https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html): the errors
# that mean the GPU, its memory or its links are broken, not the program. 13, 31, 43, 45 and the
# like are what user code causes (an illegal address, a killed context; the catalog's
# RESTART_APP): those never replace a node.
HARDWARE_XIDS = {
    48: "double-bit ECC error", 64: "ECC page retirement or row remapping failed", 74: "NVLink error",
    79: "the GPU has fallen off the bus", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[^)]*)\): (?P<xid>\d+)")
GPU_LINE = re.compile(r"^GPU \d+: ")  # `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"
SESSION_WORKER = "ssm-session-worker"


def gpus_listed(command: str) -> Optional[int]:
    """GPUs `nvidia-smi -L` lists, or None when it cannot run or lists none and fails (the driver
    down altogether). A GPU the driver has lost makes it fail too, while it still lists the rest:
    those are counted."""
    try:
        out = subprocess.run(shlex.split(command) + ["-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    listed = sum(1 for line in out.stdout.splitlines() if GPU_LINE.match(line))
    if out.returncode != 0 and listed == 0:
        return None
    return listed



def sessions_open(proc: str = "/proc") -> int:
    """Session Manager sessions open here: the agent's `ssm-session-worker` processes, one per
    session (argv[0]; /proc's comm holds only its first 15 characters)."""
    n = 0
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if os.path.basename(argv0) == SESSION_WORKER:
            n += 1
    return n


def gpu_processes(command: str) -> Optional[int]:
    """Processes holding a CUDA context on this node's GPUs, or None when nvidia-smi cannot say."""
    try:
        out = subprocess.run(shlex.split(command) + ["--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return len({line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()})


def phase() -> tuple[bool, bool]:
    """(training running, loading) from the supervisor's phase file; loading is restoring a
    checkpoint or staging data, both work the idle guard must not stop."""
    try:
        with open(contract.path("phase")) as f:
            p = json.load(f)
    except (OSError, ValueError):
        return False, False
    pid = p.get("pid")
    alive = False
    if p.get("phase") == "training" and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
    return alive, p.get("phase") in ("restoring", "staging")


def broken(expected: int, listed: Optional[int], xids: list[tuple[int, str, bool]]) -> Optional[str]:
    """Why this node must be replaced, or None (every hardware XID of this boot counts, new or not)."""
    hard = [(x, bus) for x, bus, _ in xids if x in HARDWARE_XIDS]
    if hard:
        x, bus = hard[0]
        return f"XID {x} ({HARDWARE_XIDS[x]}) on GPU {bus or '?'}"
    if expected and listed is not None and listed < expected:
        return f"{listed} of {expected} GPUs listed by nvidia-smi"
    return None

