"""Before each run of the job: make the cluster's agreed checkpoint local and say where it is.

Every node restores the same step (the plan's), never its own newest: local saves newer than
that step are set aside, since the cluster did not continue from them. Transient S3 errors are
retried with full-jitter backoff; the job does not start until the step is here and verified.
"""
from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Optional, TypeVar

from dl_core.aws import Backoff, retry

from . import contract
from .agent import record_pushed, upload_lock, write_health
from .errors import RuntimeUserError
from .layout import set_aside_newer, write_atomic
from .shards import stale_tmp
from .store import CheckpointStore

T = TypeVar("T")


def with_retries(fn: Callable[[], T], what: str, *, attempts: int = 8, base: float = 1.0, cap: float = 60.0,
                 log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> T:
    """fn(), retried with full-jitter backoff (waits up to `base` doubling, at most `cap`) on
    anything but a user error (which no retry fixes): every node restores at once after a loss."""
    tried = [0]

    def said(e: BaseException, wait: float) -> None:
        tried[0] += 1
        log(f"{what} failed ({type(e).__name__}: {e}); retry {tried[0]}/{attempts - 1} in {wait:.1f} s")

    return retry(fn, attempts=attempts, backoff=Backoff(base, cap), on_retry=said, sleep=sleep,
                 retryable=lambda e: not isinstance(e, RuntimeUserError))


def restore(store: CheckpointStore, local_dir: str, step: Optional[int], *,
            log: Callable[[str], None] = print, retry_base: float = 1.0, ranks: Optional[range] = None,
            world_size: Optional[int] = None) -> Optional[str]:
    """Make `step` (None: start from scratch) the only resumable save here; write resume.env.
    ranks, world_size: this node's global ranks in the plan, so a sharded step brings only their shards."""
    with upload_lock():
        for path in set_aside_newer(local_dir, step):
            log(f"set aside {path}: newer than the cluster's resume step {step}")
        for path in stale_tmp(local_dir):  # saves a kill cut short: never finished, never resumed
            shutil.rmtree(path, ignore_errors=True)
    path = None
    if step is not None:
        got = with_retries(lambda: store.pull(local_dir, step, ranks=ranks, world_size=world_size),
                           f"restoring step {step}", log=log, base=retry_base)
        if not got:
            write_health("restore", "failed", f"step {step} is not complete or does not verify in S3")
            raise RuntimeUserError(f"checkpoint step {step} could not be restored from "
                                   f"s3://{store.bucket}/{store.prefix}/ (missing or corrupt)")
        path = got[1]
        record_pushed(step)  # it came from S3: the agent must not upload it again
        write_health("restore", "ok", f"restored step {step}")
    env = {"DL_RESUME_FROM": path, "DL_RESUME_STEP": str(step)} if path else {}
    os.makedirs(contract.run_dir(), exist_ok=True)
    write_atomic(contract.path("resume_env"), contract.env_text(env))
    return path
