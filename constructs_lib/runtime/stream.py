"""A command's output, line by line, to a callback while it runs, bounded in time: how setup,
image pulls and the data transfer tool report on a node (their lines go to the job log).

Standard library only: this module ships to the node with the runtime.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from typing import Callable, Mapping, Optional

SETUP_TAIL = 20          # lines of a failed command's output kept for health and the log


def stream(argv: list[str], *, emit: Callable[[str], None], timeout: float, cwd: Optional[str] = None,
           env: Optional[Mapping[str, str]] = None) -> tuple[Optional[int], list[str]]:
    """Run argv with its output, line by line, to `emit`; (exit code or None on timeout, last lines)."""
    tail: deque[str] = deque(maxlen=SETUP_TAIL)
    proc = subprocess.Popen(argv, cwd=cwd, env=dict(env) if env is not None else None, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            emit(line)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        t.join(timeout=5)
        return None, list(tail)
    t.join(timeout=5)
    return proc.returncode, list(tail)
