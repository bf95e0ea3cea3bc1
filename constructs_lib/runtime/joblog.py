"""The job's log file (contract job_log): the command's output, setup's and the supervisor's
lines, in the order they happened. The CloudWatch agent ships it to the job's log group, one
stream per node (cwagent_config.py); on the node it is also the file to read first."""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import IO, Callable, Optional

from . import contract

SUPERVISOR = "[dl-launcher]"
# The last lines of the command's (and setup's) output kept in memory: a failed job's record
# carries them (ClusterState.mark_failed), so that `dl-launcher status` can say what went wrong.
TAIL_LINES = 20
TAIL_WIDTH = 300


class JobLog:
    """Appends whole lines, from any thread; a line is also echoed to `echo` (the unit's journal).
    A log file that cannot be written never stops the job: lines then go to the journal only."""

    def __init__(self, path: Optional[str] = None, echo: Optional[IO[str]] = None) -> None:
        self.path = path or contract.path("job_log")
        self.echo = echo if echo is not None else sys.stdout
        self._lock = threading.Lock()
        self._file: Optional[IO[bytes]] = None
        self._broken = False
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)

    def _open(self) -> Optional[IO[bytes]]:
        if self._file is None and not self._broken:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._file = open(self.path, "ab", buffering=0)
            except OSError as e:
                self._broken = True
                print(f"{SUPERVISOR} cannot write {self.path}: {e}; job lines go to the journal only",
                      file=self.echo, flush=True)
        return self._file

    def line(self, text: str) -> None:
        data = (text.rstrip("\n") + "\n")
        with self._lock:
            if not text.startswith(SUPERVISOR):
                self._tail.append(text.rstrip("\n")[:TAIL_WIDTH])
            f = self._open()
            if f is not None:
                try:
                    f.write(data.encode(errors="replace"))
                except OSError:
                    pass
            try:
                self.echo.write(data)
                self.echo.flush()
            except (OSError, ValueError):
                pass

    def new_run(self) -> None:
        """A run starts: the last lines are its own from here (a failure's lines and its error's
        signature say what this run printed, not the tail of the ones before)."""
        with self._lock:
            self._tail.clear()

    def last_lines(self) -> list[str]:
        """The newest lines of the job's own output (not the supervisor's), oldest first."""
        with self._lock:
            return list(self._tail)

    def supervisor(self) -> Callable[[str], None]:
        """The supervisor's log function: its decisions, marked as its own."""
        return lambda msg: self.line(f"{SUPERVISOR} {msg}")

    def pump(self, stream: IO[bytes]) -> threading.Thread:
        """Copy a child's output into the log line by line until it closes (in a thread)."""
        def run() -> None:
            for raw in iter(stream.readline, b""):
                self.line(raw.decode(errors="replace"))
            stream.close()
        t = threading.Thread(target=run, daemon=True, name="job-log")
        t.start()
        return t
