"""What the node agent saw in IMDS, for the training processes and the supervisor to read.

Two different signals, kept apart on purpose:
- termination: the two-minute spot interruption notice (`spot/instance-action`). Final: the
  job stops at one agreed step, saves, and this node leaves the cluster.
- rebalance: advice that interruption risk is elevated. Each new recommendation bumps a
  counter; the job takes one early checkpoint and carries on. It never stops training.

The file is replaced atomically, so a reader sees an old or a new state, never half of one.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from . import contract
from .layout import write_atomic


@dataclass
class Notices:
    termination: Optional[dict] = None      # {"action": "terminate", "time": "...Z"}
    rebalances: int = 0                     # how many distinct rebalance recommendations so far
    last_rebalance: Optional[dict] = None   # {"noticeTime": "...Z"}
    updated: float = field(default_factory=time.time)

    @property
    def terminating(self) -> bool:
        return self.termination is not None


def read(path: Optional[str] = None) -> Notices:
    try:
        with open(path or contract.path("notice")) as f:
            data = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return Notices()
    return Notices(termination=data.get("termination"), rebalances=int(data.get("rebalances", 0)),
                   last_rebalance=data.get("last_rebalance"), updated=float(data.get("updated", 0)))


def write(n: Notices, path: Optional[str] = None) -> None:
    n.updated = time.time()
    write_atomic(path or contract.path("notice"), json.dumps(n.__dict__))


def mtime(path: Optional[str] = None) -> float:
    """Cheap change detection for a training loop: one stat per call."""
    try:
        return os.stat(path or contract.path("notice")).st_mtime_ns
    except FileNotFoundError:
        return 0


def deadline(n: Notices) -> Optional[float]:
    """When AWS takes the node (epoch seconds), from the notice's time; None without a valid one."""
    import datetime as dt
    try:
        t = dt.datetime.strptime(n.termination["time"], "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, KeyError, ValueError):
        return None
    return t.replace(tzinfo=dt.timezone.utc).timestamp()


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc's parent links (whatever sessions they made)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def deliver(root_pid: int) -> list[int]:
    """Send the notice signal (contract.NOTICE_SIGNAL) to every process under `root_pid` (the
    command, torchrun, its workers, in whatever sessions they made) that catches it; returns
    their pids. A process that does not catch it is left alone: its default action is to exit."""
    import signal

    signum = getattr(signal, contract.NOTICE_SIGNAL)
    sent = []
    for pid in [root_pid, *descendants(root_pid)]:
        if catches(pid, signum):
            try:
                os.kill(pid, signum)
                sent.append(pid)
            except OSError:
                continue
    return sorted(sent)
