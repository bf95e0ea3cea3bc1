"""The interruption watcher: polls IMDSv2 for a spot notice or a rebalance recommendation; on
notice, tells the training processes (a marker file, and SIGUSR1 to every process that
registered for it), waits briefly for a save, and uploads the newest complete local checkpoint
before AWS takes the node (two minutes)."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .imds import Imds
from .layout import marker_path, newest_local, notify_dir as default_notify_dir, write_atomic
from .store import CheckpointStore

Log = Callable[[str], None]


@dataclass
class WatchResult:
    kind: str                 # "spot" or "rebalance"
    notice: dict
    pushed_step: Optional[int]
    seconds_left: Optional[float]


def _deadline(notice: dict) -> Optional[dt.datetime]:
    t = notice.get("time")
    if not t:
        return None
    try:
        return dt.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None


def pids_to_notify(notify_dir: str, pidfile: Optional[str] = None) -> list[int]:
    """Processes that asked for the notice (Checkpointer registers itself), plus an explicit
    pidfile. Registrations of processes that are gone are cleaned up."""
    pids = set()
    if os.path.isdir(notify_dir):
        for name in os.listdir(notify_dir):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                os.kill(pid, 0)
                pids.add(pid)
            except ProcessLookupError:
                try:
                    os.unlink(os.path.join(notify_dir, name))
                except OSError:
                    pass
            except PermissionError:
                pids.add(pid)
    if pidfile and os.path.exists(pidfile):
        try:
            with open(pidfile) as f:
                pids.add(int(f.read().strip()))
        except ValueError:
            pass
    return sorted(pids)


class Watcher:
    """poll_seconds: how often to ask IMDS. save_grace: how long to wait for the job's own save
    after signalling it (then the newest complete save, old or new, is pushed).
    on_rebalance: "notify" (marker + signal, the job saves early) or "ignore"."""

    def __init__(self, store: CheckpointStore, local_dir: str, *, imds: Optional[Imds] = None,
                 poll_seconds: float = 5.0, save_grace: float = 30.0, marker: Optional[str] = None,
                 pidfile: Optional[str] = None, notify_dir: Optional[str] = None,
                 on_rebalance: str = "notify", log: Log = print) -> None:
        self.store = store
        self.local_dir = local_dir
        self.imds = imds or Imds()
        self.poll = poll_seconds
        self.grace = save_grace
        self.marker = marker or marker_path()
        self.pidfile = pidfile
        self.notify_dir = notify_dir or default_notify_dir()
        self.on_rebalance = on_rebalance
        self.log = log

    def check_once(self) -> Optional[tuple[str, dict]]:
        action = self.imds.spot_action()
        if action:
            return "spot", action
        if self.on_rebalance == "notify":
            rebalance = self.imds.rebalance()
            if rebalance:
                return "rebalance", rebalance
        return None

    def notify(self, kind: str, notice: dict) -> None:
        write_atomic(self.marker, json.dumps({"kind": kind, **notice}))
        for pid in pids_to_notify(self.notify_dir, self.pidfile):
            try:
                os.kill(pid, signal.SIGUSR1)
                self.log(f"signalled pid {pid} with SIGUSR1")
            except ProcessLookupError:
                self.log(f"pid {pid} is gone")

    def save_and_push(self, notice: dict, before: Optional[int]) -> tuple[Optional[int], Optional[float]]:
        deadline = _deadline(notice)
        now = lambda: dt.datetime.now(dt.timezone.utc)
        # Leave the upload most of the window: wait for the job's save at most `grace` seconds
        # and never past half of what remains.
        wait = self.grace
        if deadline:
            wait = min(wait, max(0.0, (deadline - now()).total_seconds() / 2))
        end = time.monotonic() + wait
        while time.monotonic() < end:
            newest = newest_local(self.local_dir)
            if newest and (before is None or newest[0] > before):
                break
            time.sleep(0.2)
        newest = newest_local(self.local_dir)
        if not newest:
            self.log("no complete local checkpoint to upload")
            return None, None
        step, path = newest
        latest = self.store.latest()
        if latest and latest.step >= step:
            self.log(f"step {step} is already in S3 (newest there: {latest.step})")
        else:
            self.store.push(path, step)
            self.log(f"uploaded step {step} to s3://{self.store.bucket}/{self.store.prefix}/")
        left = (deadline - now()).total_seconds() if deadline else None
        return step, left

    def run(self, max_polls: Optional[int] = None) -> Optional[WatchResult]:
        """Poll until a notice (returns after handling a spot notice) or max_polls."""
        polls = 0
        handled_rebalance = False
        while max_polls is None or polls < max_polls:
            polls += 1
            try:
                found = self.check_once()
            except OSError as e:
                self.log(f"IMDS not reachable ({e}); retrying")
                found = None
            if found:
                kind, notice = found
                if kind == "rebalance" and handled_rebalance:
                    found = None
                else:
                    before = newest_local(self.local_dir)
                    self.log(f"{kind} notice: {json.dumps(notice)}")
                    self.notify(kind, notice)
                    step, left = self.save_and_push(notice, before[0] if before else None)
                    if kind == "spot":
                        return WatchResult(kind, notice, step, left)
                    handled_rebalance = True
            time.sleep(self.poll)
        return None
