"""Names shared by the local and the S3 side of the checkpoint protocol.

A checkpoint is a directory of files named `step-<12 digits>`. It is complete when:
- locally: the directory exists under its final name (written as `.tmp-step-...`, renamed last);
- in S3: `<prefix>/step-.../MANIFEST.json` exists (written after every file it lists).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import re
import shutil
from typing import Iterator, Optional

MANIFEST = "MANIFEST.json"
FORMAT = 1
_NAME = re.compile(r"^step-(\d{12})\Z", re.ASCII)
# No IAM wildcards (* ?) and no quote: the prefix goes verbatim into the grant's resource ARN
# and s3:prefix condition, where a '*' would widen the grant to other jobs' checkpoints.
_PREFIX = re.compile(r"^[A-Za-z0-9!_.()-]+(/[A-Za-z0-9!_.()-]+)*\Z", re.ASCII)


def prefix_problem(prefix: str) -> Optional[str]:
    """Why `prefix` cannot name a job's checkpoints, or None. One rule for the bucket grant
    (constructs_lib.checkpoints) and for the runtime that writes under it."""
    p = prefix.strip("/") if isinstance(prefix, str) else ""
    if not p or len(p) > 512 or not _PREFIX.match(p) or any(seg in (".", "..") for seg in p.split("/")):
        return (f"bad checkpoint prefix {prefix!r}: use a path like 'jobs/llama-7b' "
                "(letters, digits, - _ . ! ( ), segments separated by '/'; no wildcards * ?, no '.' or '..' segments)")
    return None


@contextlib.contextmanager
def flocked(path: str) -> Iterator[None]:
    """An exclusive lock between processes (flock on `path`, made if missing)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def upload_lock() -> contextlib.AbstractContextManager[None]:
    """Held by every upload and prune (the agent), every restore (the supervisor) and a save
    replacing a step already here (the training ranks): none moves a save another is reading."""
    from . import contract

    return flocked(contract.path("upload_lock"))


def make_final(tmp: str, final: str, *, guard_uploads: bool, sync: bool = True) -> None:
    """Make the written directory `tmp` the complete save `final`: its files synced, then one
    rename. A save already at `final` (the same step again, after a restore) is replaced, under
    the upload lock when a node agent may be reading it (guard_uploads). sync=False: in host
    memory (tmpfs), where there is no disk to sync to."""
    for d, _dirs, files in os.walk(tmp) if sync else ():
        for n in files:
            with open(os.path.join(d, n), "rb+") as f:
                os.fsync(f.fileno())
    if not os.path.isdir(final):
        os.rename(tmp, final)  # the moment the save becomes complete locally
        return
    old = f"{tmp}-old"
    with upload_lock() if guard_uploads else contextlib.nullcontext():
        os.rename(final, old)
        os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def write_atomic(path: str, text: "str | bytes", mode: Optional[int] = None) -> None:
    """Readers see the old file or the new one, never half of one; with `mode` (0o600 for a
    secret), the file has it from its first byte."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # Per thread, not only per process: the supervisor's threads (the health gate, the step clock,
    # the memory tier) write beside it, and two writers of one tmp name lose one rename.
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    how = "wb" if isinstance(text, bytes) else "w"
    if mode is None:
        f = open(tmp, how)
    else:
        f = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), how)
    with f:
        f.write(text)
    os.replace(tmp, path)


def name_for(step: int) -> str:
    if step < 0 or step >= 10**12:
        raise ValueError(f"step must be 0 <= step < 10**12, got {step}")
    return f"step-{step:012d}"


def step_of(name: str) -> Optional[int]:
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def local_checkpoints(root: str, prefix: str = "") -> list[tuple[int, str]]:
    """Complete local checkpoints under root, oldest first: (step, path). prefix: saves named
    `<prefix>step-N` instead (survivor.py's `.survivor-step-N`)."""
    if not os.path.isdir(root):
        return []
    found = []
    for entry in os.listdir(root):
        step = step_of(entry[len(prefix):]) if entry.startswith(prefix) else None
        path = os.path.join(root, entry)
        if step is not None and os.path.isdir(path):
            found.append((step, path))
    return sorted(found)


def newest_local(root: str) -> Optional[tuple[int, str]]:
    found = local_checkpoints(root)
    return found[-1] if found else None


def set_aside_newer(root: str, step: Optional[int]) -> list[str]:
    """Rename complete local saves newer than `step` (the cluster's agreed resume point) out of
    the way: they belong to a run the cluster did not continue, so they must never be resumed
    from or uploaded. Kept (as .stale-step-N-...) for a person to inspect; returns their new paths."""
    moved = []
    for s, path in local_checkpoints(root):
        if step is None or s > step:
            dest = os.path.join(root, f".stale-{os.path.basename(path)}-{os.getpid()}")
            os.rename(path, dest)
            moved.append(dest)
    return moved


def env_int(name: str, default: int) -> int:
    """os.environ[name] as a whole number; `default` when unset or not one."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
