"""The runtime's own step counter: each local rank says its last step and its recent step time in
a small file of the node's run directory, and the supervisor's watch loop reads them (stall.py).

    DL_RUN_DIR/steps/rank-<LOCAL_RANK>.json   {"generation", "step", "at", "median", "steps"}

Checkpointer.should_checkpoint (and through it the Hugging Face and Lightning callbacks) reports
each step; a script that never calls it reports nothing, and gets no hang detection rather than
a false alarm. Making the Checkpointer announces the rank (a report of step NO_STEP): from then
on the command is known to report steps, and a first step that never comes is a hang too. A report is a local file write (tmpfs), at most one a second per rank
(WRITE_EVERY), never an S3 call: the step a file names lags the rank by a second at most.

The step time a rank reports is its *busy* time: from the moment it left the previous step's
agreement (the all-reduce should_checkpoint makes) to the moment it reports the next step. The
agreement is where fast ranks wait for slow ones, so that wait is left out; what a slow node
spends inside the step's own collectives is not (see docs/node-health.md: stragglers).

Standard library only: this module runs inside the training processes.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

from . import contract
from .layout import write_atomic

WRITE_EVERY = 1.0  # seconds between two reports of one rank (the newest step is always kept in memory)
WINDOW = 32        # the step times the median is taken over: about a minute of steps at 2 s a step
NO_STEP = -1       # the step of an announcement: the rank will report steps, and has done none yet


def steps_dir() -> str:
    return os.path.join(contract.run_dir(), contract.STEPS_DIR)


class StepClock:
    """One rank's reports. arrived(step) when the rank reaches its step's agreement, left() when
    the agreement returns. A step due within a second of the last write waits in memory for a
    thread of the clock's own, which writes it a second later at most: a rank that stops right
    after it is still seen at the step it last completed."""

    def __init__(self, local_rank: int, generation: Optional[str], *, every: float = WRITE_EVERY) -> None:
        self.path = os.path.join(steps_dir(), f"rank-{local_rank}.json")
        self.generation, self.every = generation, every
        self.times: deque[float] = deque(maxlen=WINDOW)
        self._left: Optional[float] = None
        self._written = float("-inf")
        self._pending: Optional[str] = None
        self._lock = threading.Lock()
        self._flusher: Optional[threading.Thread] = None
        self.count = 0
        self._write(NO_STEP)  # announced: the watch now gives this run's first step its allowance, and no more

    def _write(self, step: int) -> None:
        try:
            write_atomic(self.path, json.dumps({"generation": self.generation, "step": step, "at": time.time(),
                                                "median": None, "steps": self.count}))
        except OSError:  # a full or missing run directory costs the report, never the step
            pass

    def arrived(self, step: int) -> None:
        now = time.monotonic()
        if self._left is not None:
            self.times.append(now - self._left)
        self.count += 1
        median = statistics.median(self.times) if self.times else None
        record = json.dumps({"generation": self.generation, "step": step, "at": time.time(), "median": median,
                             "steps": self.count})
        with self._lock:
            self._pending = record
        if now - self._written >= self.every:
            self.flush()
        elif self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name="dl-steps", daemon=True)
            self._flusher.start()

    def left(self) -> None:
        self._left = time.monotonic()

    def flush(self) -> None:
        """Write the newest report not yet written (if any)."""
        with self._lock:
            record, self._pending = self._pending, None
            if record is None:
                return
            self._written = time.monotonic()
            try:
                write_atomic(self.path, record)
            except OSError:  # a full or missing run directory costs the report, never the step
                pass

    def _flush_loop(self) -> None:
        while True:
            time.sleep(self.every)
            self.flush()


def busy() -> None:
    """This rank is working, not stepping (an evaluation, a final export): its report's time moves
    on and the supervisor sees no hang. Cheap (one utime of a local file): call it every few
    seconds of a long phase between steps (before the first step too, once the rank made its
    Checkpointer: the first-step allowance then counts from it). Off a node, nothing."""
    try:
        os.utime(os.path.join(steps_dir(), f"rank-{os.environ.get('LOCAL_RANK', '0')}.json"))
    except (OSError, ValueError):
        pass


@dataclass(frozen=True)
class Report:
    rank: str
    step: int
    at: float                 # wall clock of the rank's last report, or of its last busy()
    median: Optional[float]   # seconds: the rank's recent median busy step time


def read(generation: str) -> list[Report]:
    """This generation's reports on this node (a file of another generation, or of any other
    shape, is skipped: the ranks are the user's processes)."""
    out = []
    for f in glob.glob(os.path.join(steps_dir(), "rank-*.json")):
        try:
            with open(f) as fh:
                d = json.load(fh)
            if str(d.get("generation")) != str(generation):
                continue
            median = d.get("median")
            out.append(Report(os.path.basename(f)[5:-5], int(d["step"]), max(float(d["at"]), os.stat(f).st_mtime),
                              float(median) if isinstance(median, (int, float)) else None))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def clear() -> None:
    """Before a run: the last run's reports say nothing about this one."""
    for f in glob.glob(os.path.join(steps_dir(), "rank-*.json")):
        try:
            os.unlink(f)
        except OSError:
            pass
