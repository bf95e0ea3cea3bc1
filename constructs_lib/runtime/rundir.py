"""What this node's run directory says about it: the ranks' outcomes of a generation (written by
Checkpointer when the ranks stop for a notice), each component's health line (write_health) and
the supervisor's phase (set_phase).
Local files, read by the supervisor and `runtime status`; a file that cannot be read is skipped."""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Optional

from . import contract
from .layout import write_atomic


def outcomes(g: int) -> dict[str, int]:
    """{outcome: step} the ranks of generation g recorded."""
    out = {}
    for f in glob.glob(os.path.join(contract.path("outcome_dir"), f"gen-{g}-rank-*")):
        try:
            with open(f) as fh:
                d = json.load(fh)
            out[d["outcome"]] = d.get("step")
        except (OSError, ValueError, KeyError, TypeError):  # written by the job's ranks: any shape
            continue
    return out


def health() -> dict[str, str]:
    """{component: its health line}, as the join records and `runtime status` show them."""
    out = {}
    for f in glob.glob(os.path.join(contract.path("health_dir"), "*")):
        try:
            with open(f) as fh:
                out[os.path.basename(f)] = fh.read().strip()
        except OSError:
            continue
    return out


def set_phase(phase: str, pid: Optional[int] = None) -> None:
    """What the node monitor reports as Restoring / TrainingRunning (never fails the job)."""
    assert phase in contract.PHASES
    try:
        write_atomic(contract.path("phase"), json.dumps({"phase": phase, "pid": pid, "since": time.time()}))
    except OSError:
        pass
