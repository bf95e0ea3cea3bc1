"""The memory tier's threads yield their cores to training (issue 37).

The tier's work runs while the next step computes; on a node whose cores are short, every moment
a tier thread holds a core is a moment some rank's training thread (or its collectives' threads)
waits for one, and every rank then waits for that rank at the next collective.
"""
from __future__ import annotations

import os


def yield_cores(tids: "set[int | None]") -> None:
    """Every thread of the tier (its worker, its link's reader, its gloo group's own threads) at
    the lowest priority: where cores are short, a training thread waking in its collectives goes
    first (bench/goodput.py --overhead): the worker alone at nice 19 gave 1.05x a 1 s step,
    against 1.07x. Every thread of the tier at nice 19 showed no gain a 2-core machine can
    measure (1.020x a 0.1 s step against 1.029x side by side, 1.5 standard errors apart; 1.029x
    from a fresh clone); on a GPU node it keeps these threads behind NCCL's and gloo's own.
    Linux: a thread is a task, so PRIO_PROCESS with its id sets that thread only."""
    for tid in tids:
        try:
            if tid is not None:
                os.setpriority(os.PRIO_PROCESS, tid, 19)
        except OSError:  # not Linux, or not allowed: the same threads at the same priority as training
            pass


def threads() -> set[int]:
    """This process's threads (Linux), by their kernel ids."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:  # not Linux
        return set()
