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
