"""The node agent (dl-node-agent.service): watches IMDS for spot notices and uploads checkpoints.

It runs beside the job for the whole life of the node, so an upload never dies with the training
process that made the save, and a notice is seen even between two runs of the job.
- Notices: a termination notice and each new rebalance recommendation go to the notice file
  (see notice.py); the training processes read it and decide together what to do.
- Uploads: every new complete local save is pushed (the newest first: an older unpushed one is
  skipped once a newer exists), then older local saves are pruned. Uploads and prunes hold the
  upload lock, so the supervisor never moves a save that is being uploaded.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from typing import Callable, Optional

from dl_core.aws import Backoff, brief

from . import contract, notice, sharded_store, shards
from .errors import RuntimeUserError
from .imds import Imds
from .layout import local_checkpoints, newest_local, upload_lock, write_atomic
from .store import CheckpointStore

Log = Callable[[str], None]


def pushed_step() -> Optional[int]:
    """The newest step known to be complete in S3 from this node's point of view."""
    step = _pushed().get("step")
    return step if isinstance(step, int) else None


def _pushed() -> dict:
    try:
        with open(contract.path("pushed")) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def parts_sent() -> dict[str, str]:
    """Step -> attempt of the sharded parts this node has put in S3 (the newest few)."""
    p = _pushed().get("parts")
    return {k: v for k, v in p.items() if isinstance(v, str)} if isinstance(p, dict) else {}


def record_part(step: int, attempt: str) -> None:
    d = _pushed()
    parts = {**parts_sent(), str(step): attempt}
    d["parts"] = dict(sorted(parts.items(), key=lambda kv: int(kv[0]))[-16:])
    write_atomic(contract.path("pushed"), json.dumps(d))


def delivered(step: int, path: str) -> bool:
    """Whether this node has done its share for the local save `path`: the step is complete in S3,
    or (sharded) this node's part of THIS attempt is there. An attempt, not a step: after a restore
    the same step is saved again under a new attempt, and that one must be sent too."""
    done = pushed_step()
    if done is not None and step <= done:
        return True
    if shards.is_sharded(path):
        part = shards.node_part(path)
        return part is not None and parts_sent().get(str(step)) == part["attempt"]
    return False


def record_pushed(step: int) -> None:
    d = _pushed()
    if not isinstance(d.get("step"), int) or step > d["step"]:
        d.update({"step": step, "at": time.time()})
        write_atomic(contract.path("pushed"), json.dumps(d))


def write_health(component: str, level: str, message: str) -> None:
    assert level in contract.HEALTH_LEVELS
    write_atomic(os.path.join(contract.path("health_dir"), component), f"{level} {message}\n")


class NodeAgent:
    """poll_seconds: between IMDS polls. upload_poll_seconds: between looks for a new save.
    keep: complete local saves kept after an upload (never the newest, never an unpushed one)."""

    def __init__(self, store: CheckpointStore, local_dir: str, *, imds: Optional[Imds] = None,
                 poll_seconds: float = 2.0, upload_poll_seconds: float = 0.5, keep: int = 2,
                 log: Log = print) -> None:
        self.store = store
        self.local_dir = local_dir
        self.imds = imds or Imds()
        self.poll = poll_seconds
        self.upload_poll = upload_poll_seconds
        self.keep = max(1, keep)
        self.log = log
        self._stop = threading.Event()
        self._failures = 0
        # Failed uploads are tried again after full-jitter waits, from twice the poll up to a minute.
        self._backoff = Backoff(2 * upload_poll_seconds, 60.0)
        self._commits: dict[tuple[int, str], float] = {}  # (step, attempt) -> not before (monotonic)

    # ---- notices --------------------------------------------------------------------------------
    def watch_once(self) -> notice.Notices:
        action = self.imds.spot_action()
        rebalance = self.imds.rebalance()
        n = notice.read()
        changed = False
        if action and n.termination != action:
            n.termination = action
            changed = True
            self.log(f"termination notice: {json.dumps(action)}: the job stops at its next check, saves, "
                     "and this node leaves the cluster")
        if rebalance and rebalance != n.last_rebalance:
            n.rebalances += 1
            n.last_rebalance = rebalance
            changed = True
            self.log(f"rebalance recommendation: {json.dumps(rebalance)}: the job saves early and carries on")
        if changed:
            notice.write(n)
        return n

    # ---- uploads --------------------------------------------------------------------------------
    def upload_once(self) -> Optional[int]:
        """Push the newest complete local save if S3 does not have it yet; returns its step."""
        with upload_lock():
            self.retry_commits()
            pending = [(s, p) for s, p in reversed(local_checkpoints(self.local_dir)) if not delivered(s, p)]
            if not pending:
                return None
            step, path = self._choose(pending)
            if not self._deliver(step, path):
                return None
            self._prune(step)
            return step

    def push(self, step: int, path: str) -> bool:
        """This local save now, newest or not (between runs: a step kept from memory before a newer
        one, which upload_once takes next); False when S3 has the step already."""
        with upload_lock():
            return self._deliver(step, path)

    def _deliver(self, step: int, path: str) -> bool:
        if self.store.has_step(step):
            record_pushed(step)
            return False
        started = time.monotonic()
        if shards.is_sharded(path):
            self._push_part(path, step, started)
        else:
            cp = self.store.push(path, step)
            record_pushed(step)
            self.log(f"uploaded step {step} ({cp.total_bytes:,} bytes) in {time.monotonic() - started:.1f} s")
        return True

    def _choose(self, pending: list[tuple[int, str]]) -> tuple[int, str]:
        """The newest pending save, except that a sharded step another node has begun to send comes
        first: a step is complete only when every node sends it, so nodes that each took their own
        newest while uploads lag behind saves could send different steps and complete none."""
        if len(pending) == 1 or not shards.is_sharded(pending[0][1]):
            return pending[0]
        for step, path in pending[:4]:
            part = shards.node_part(path)
            if part and sharded_store.started(self.store, step, part["attempt"]):
                return step, path
        return pending[0]

    def _push_part(self, path: str, step: int, started: float) -> None:
        part = shards.node_part(path)
        if part is None:
            raise RuntimeUserError(f"local save {path} is sharded but its markers do not make this node's "
                                   "ranks (a launcher without LOCAL_WORLD_SIZE?)")
        sent = sharded_store.push_part(self.store, path, step, part)
        record_part(step, part["attempt"])  # before the commit: a failed commit never sends the part again
        self.log(f"uploaded node {part['node_rank']}'s part of step {step} ({sent:,} bytes) in "
                 f"{time.monotonic() - started:.1f} s")
        self._commits[(step, part["attempt"])] = 0.0
        self.retry_commits()

    def retry_commits(self) -> None:
        """Try the manifest of each step whose part this node sent: written if every node's part is
        there (then done), left to the others if some part is missing (then done too: the last
        node to send commits), tried again later only if S3 failed (throttling, 5xx)."""
        for (step, attempt), not_before in list(self._commits.items()):
            if time.monotonic() < not_before:
                continue
            try:
                cp = sharded_store.commit(self.store, step, attempt)
            except Exception as e:
                self._commits[(step, attempt)] = time.monotonic() + min(60.0, 2.0 * (1 + self._failures))
                self.log(f"commit of step {step} failed ({type(e).__name__}: {e}); trying again")
                continue
            del self._commits[(step, attempt)]
            if cp:
                record_pushed(step)
                self.log(f"every node's part of step {step} is in S3: step complete")

    @property
    def committing(self) -> bool:
        return bool(self._commits)

    def _prune(self, pushed: int) -> None:
        complete = [s for s in local_checkpoints(self.local_dir) if s[0] <= pushed]
        for _s, path in complete[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def _upload_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.upload_once()
                if self._failures:
                    write_health("upload", "ok", "uploads work again")
                self._failures = 0
                self._backoff.reset()
                wait = self.upload_poll
            except RuntimeUserError as e:
                self._failures += 1
                write_health("upload", "failed", str(e))
                self.log(f"upload failed: {e}")
                wait = self._backoff.next()
            except Exception as e:  # S3 unreachable after botocore's own retries: try again later
                self._failures += 1
                write_health("upload", "degraded", f"upload failing ({type(e).__name__}: {e}); retrying")
                self.log(f"upload failed ({type(e).__name__}: {e}); retrying")
                wait = self._backoff.next()
            self._stop.wait(wait)

    def run(self, duration: Optional[float] = None) -> None:
        """Until stop() (or `duration` seconds): notices in this thread, uploads in another."""
        uploader = threading.Thread(target=self._upload_loop, name="uploader", daemon=True)
        uploader.start()
        end = None if duration is None else time.monotonic() + duration
        while not self._stop.is_set() and (end is None or time.monotonic() < end):
            try:
                self.watch_once()
            except OSError as e:
                self.log(f"IMDS not reachable ({e}); retrying")
            self._stop.wait(self.poll)
        self._stop.set()
        uploader.join(timeout=5)

    def stop(self) -> None:
        self._stop.set()


def push_newest(store: CheckpointStore, local_dir: str, *, until: float, retry_base: float,
                log: Callable[[str], None]) -> Optional[int]:
    """Push the newest local save now, trying again until `until` (the supervisor, between runs and
    before a node leaves: the agent would too; whoever holds the lock first does it). Returns the
    step pushed last."""
    agent = NodeAgent(store, local_dir, log=log)
    backoff = Backoff(base=retry_base, cap=30.0)
    while True:
        try:
            agent.upload_once()
            newest = newest_local(local_dir)
            if not newest or (delivered(*newest) and not agent.committing):
                return pushed_step()
        except RuntimeUserError as e:
            log(f"cannot push the last save: {e}")
            return pushed_step()
        except Exception as e:  # noqa: BLE001 - every other failure of a push is tried again until `until`
            log(f"pushing the last save failed ({brief(e)}); retrying")
        delay = backoff.next()
        if time.time() + delay > until:
            log("gave up waiting for the last save's upload")
            return pushed_step()
        time.sleep(delay)
