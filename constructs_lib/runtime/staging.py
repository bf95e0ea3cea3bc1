"""The job's datasets onto the node's scratch RAID before its first generation (-c data=...).

The bytes move with a kept transfer tool, not a downloader of ours: `aws s3 sync`, which on the
Deep Learning AMI is the AWS CLI v2 with its CRT transfer client (the one that fills a 100-400
Gbit/s instance's network; `preferred_transfer_client = crt` below, ignored by a CLI without it).
The sync is a mirror (--delete), so a restart after a kill, a job-unit restart or a reboot
downloads only what is missing or changed, and removes what a killed transfer leaves behind (a
partial object lives as NAME.XXXXXXXX until it is complete, then is renamed). Before it, one
listing sizes the dataset against the scratch volume: a dataset that cannot fit fails the node's
health with both sizes and the remedy before a byte is fetched. Progress lines go to the job log;
the supervisor's phase is `staging` meanwhile, which the idle guard counts as work.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from dl_core.aws import Backoff, error_code

from . import contract
from .layout import write_atomic
from .stream import stream  # the transfer tool's lines stream as setup's do

Log = Callable[[str], None]
GiB = 1024 ** 3
# The CLI's own default is 10 requests at a time; the CRT client sizes itself to the network.
AWS_CONFIG = "[default]\ns3 =\n    preferred_transfer_client = crt\n    max_concurrent_requests = 64\n"


def size(n: float) -> str:
    """Bytes as a person reads them: GiB from one GiB up, MiB below."""
    return f"{n / GiB:,.1f} GiB" if n >= GiB else f"{n / 2**20:,.1f} MiB"


class StagingError(Exception):
    """The data cannot be staged. `final`: it never will be on this node as deployed (it does
    not fit, or the node may not read it); otherwise S3 or the network, and a retry may work."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


@dataclass
class Dataset:
    uri: str
    bucket: str
    prefix: str
    dest: str
    sizes: dict[str, int] = field(default_factory=dict)  # key under the prefix -> bytes

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def missing(self) -> dict[str, int]:
        """The objects not on the disk yet at their size (a partial file never has the final name)."""
        out = {}
        for rel, size in self.sizes.items():
            try:
                if os.path.getsize(os.path.join(self.dest, rel)) == size:
                    continue
            except OSError:
                pass
            out[rel] = size
        return out


def data_source(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket/prefix, the prefix ending in "/" ("" for the whole bucket):
    the node stages everything under it, and may read nothing else."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


def destination(bucket: str, prefix: str) -> str:
    """Where s3://bucket/prefix is staged: DL_DATA_DIR/bucket/prefix (documented)."""
    return os.path.join(contract.data_dir(), bucket, prefix.rstrip("/"))


def plan(sources: list[tuple[str, str]], s3: Any) -> list[Dataset]:
    """One listing per dataset (a paginator: 1,000 keys a request)."""
    out = []
    for bucket, prefix in sources:
        ds = Dataset(f"s3://{bucket}/{prefix}", bucket, prefix, destination(bucket, prefix))
        try:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    if not obj["Key"].endswith("/"):  # folder markers from the console
                        ds.sizes[obj["Key"][len(prefix):]] = int(obj["Size"])
        except Exception as e:  # noqa: BLE001 - botocore's errors, told apart by code
            code = error_code(e)
            if code in ("AccessDenied", "NoSuchBucket", "AllAccessDisabled"):
                raise StagingError(f"{ds.uri}: {code} (the node role may read the data prefixes the stack was "
                                   "deployed with, in buckets of the account -c data_owner names, the stack's own "
                                   "by default: redeploy with -c data=... naming it, and -c data_owner=ACCOUNT for "
                                   "a bucket of another account)", final=True) from None
            raise StagingError(f"{ds.uri}: listing failed: {type(e).__name__}: {e}") from None
        if not ds.sizes:
            raise StagingError(f"{ds.uri} holds no objects (check the prefix: s3 ls {ds.uri})", final=True)
        out.append(ds)
    return out


def check_space(datasets: list[Dataset], todo: list[dict[str, int]], scratch: Optional[str] = None) -> tuple[int, int]:
    """(bytes to fetch, bytes free) for `todo`, each dataset's missing objects; raises a final
    StagingError when they cannot fit."""
    scratch = scratch or contract.scratch_dir()
    need = sum(sum(t.values()) for t in todo)
    usage = shutil.disk_usage(scratch)
    if need > usage.free:
        total = sum(ds.total for ds in datasets)
        raise StagingError(
            f"the data is {size(total)} ({size(need)} still to fetch); {scratch} has {size(usage.free)} free of "
            f"{size(usage.total)}. Fix: stage a smaller prefix, pick a "
            "type with more NVMe (python -m dl_selector recommend shows NVMe (GB)), or read the data from S3 in "
            "the job instead of staging it", final=True)
    return need, usage.free


class Progress:
    """Reads `aws s3 sync`'s "download: s3://... to ..." lines; one progress line per `every`
    seconds (and the last), with objects, bytes and rate."""

    def __init__(self, ds: Dataset, todo: dict[str, int], emit: Log, every: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ds, self.todo, self.emit, self.every, self.clock = ds, todo, emit, every, clock
        self.start = self.last = clock()
        self.objects = self.bytes = 0
        self.errors: list[str] = []

    def line(self, text: str) -> None:
        if text.startswith("download: "):
            uri = text[len("download: "):].split(" to ", 1)[0]
            rel = uri[len(f"s3://{self.ds.bucket}/{self.ds.prefix}"):]
            self.objects += 1
            self.bytes += self.todo.get(rel, 0)
            if self.clock() - self.last >= self.every:
                self.say()
        elif text.startswith(("download failed", "fatal error", "error", "warning")):
            self.errors.append(text)
            self.emit(f"staging {self.ds.uri}: {text}")

    def say(self, final: bool = False) -> str:
        self.last = self.clock()
        took = max(self.last - self.start, 1e-6)
        want = sum(self.todo.values())
        text = (f"staging {self.ds.uri}: {self.objects:,} of {len(self.todo):,} objects, "
                f"{self.bytes / GiB:,.2f} of {want / GiB:,.2f} GiB, {self.bytes / took / 2**20:,.0f} MiB/s"
                + (f", done in {took:,.0f} s" if final else ""))
        self.emit(text)
        return text


def stage(sources: list[tuple[str, str]], *, s3: Any, emit: Log, run: Callable[..., tuple[Optional[int], list[str]]],
          region: Optional[str] = None, aws: str = "aws", timeout: float = 24 * 3600.0,
          health: Callable[[str, str], None] = lambda level, message: None) -> list[Dataset]:
    """Stage every dataset; `run(argv, emit=, timeout=, env=)` runs the transfer tool (stream.stream).
    Raises StagingError; the caller decides what a failure means for the job."""
    datasets = plan(sources, s3)
    todos = [ds.missing() for ds in datasets]  # one look at the disk each: a dataset may hold millions
    need, free = check_space(datasets, todos)
    total = sum(ds.total for ds in datasets)
    emit(f"staging {len(datasets)} dataset(s), {size(total)}, {size(need)} to fetch ({size(free)} free on "
         f"scratch) into {contract.data_dir()}")
    config = os.path.join(contract.run_dir(), contract.STAGING_CONFIG)
    os.makedirs(os.path.dirname(config), exist_ok=True)
    with open(config, "w") as f:
        f.write(AWS_CONFIG)
    env = {**os.environ, "AWS_CONFIG_FILE": config}
    if shutil.which(aws, path=env.get("PATH")) is None:
        raise StagingError(f"no {aws!r} on this node's PATH (the Deep Learning AMI has the AWS CLI v2 at "
                           "/usr/local/bin/aws; a custom AMI needs it for -c data)", final=True)
    for i, (ds, todo) in enumerate(zip(datasets, todos), 1):
        health("ok", f"staging {i}/{len(datasets)}: {ds.uri} ({len(todo):,} objects to fetch)")
        os.makedirs(ds.dest, exist_ok=True)
        progress = Progress(ds, todo, emit)
        argv = [aws, "s3", "sync", ds.uri, ds.dest, "--delete", "--no-progress", *(["--region", region] if region else [])]
        code, tail = run(argv, emit=progress.line, timeout=timeout, env=env)
        left = ds.missing()
        if code != 0 or left:
            why = "timed out" if code is None else f"exit {code}"
            raise StagingError(f"{ds.uri}: aws s3 sync {why}, {len(left):,} objects not staged"
                               + (f": {progress.errors[-1] if progress.errors else tail[-1]}" if (progress.errors or tail) else ""))
        progress.say(final=True)
    health("ok", f"staged {len(datasets)} dataset(s), {size(total)} in {contract.data_dir()}")
    return datasets


def mounted(target: str, mounts: str = "/proc/mounts") -> bool:
    """Whether a Lustre file system is mounted at `target`."""
    try:
        with open(mounts) as f:
            return any(len(p) > 2 and p[1] == target and p[2] == "lustre" for p in (line.split() for line in f))
    except OSError:
        return False


def mount_lustre(dns: str, mount_name: str, target: str, *, emit: Log, attempts: int = 5, base: float = 5.0,
                 cap: float = 80.0, run: Callable[..., Any] = subprocess.run, mounts: str = "/proc/mounts") -> None:
    """FSx for Lustre at `target` (-c data_mode=fsx): once per boot, the Lustre client the Deep
    Learning AMI carries; a file system still coming up is asked again after full-jitter waits
    (the nodes of a cluster boot together) growing from `base` to `cap`.
    Read-only: the data repository associations would export a file the job creates or changes
    into the user's dataset bucket (`lfs hsm_archive`); a read-only mount gives the job nothing to
    export (docs/data-and-checkpoints.md says what a root process that remounts could still do)."""
    if mounted(target, mounts):
        return
    os.makedirs(target, exist_ok=True)
    source = f"{dns}@tcp:/{mount_name}"
    last = ""
    backoff = Backoff(base, cap)
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff.next())
        r = run(["mount", "-t", "lustre", "-o", "ro,relatime,flock", source, target], capture_output=True, text=True,
                timeout=300)
        if r.returncode == 0:
            emit(f"FSx for Lustre {source} mounted at {target}")
            return
        lines = (r.stderr or r.stdout or "").strip().splitlines()
        last = lines[-1] if lines else f"exit {r.returncode}"
    raise StagingError(f"mounting FSx for Lustre {source} at {target} failed {attempts} times: {last} (the Lustre "
                       "client comes with the Deep Learning AMI; the nodes' security group must reach TCP 988 and "
                       "1018-1023 of the file system's)")


def prepare_data(data: Sequence[str], *, s3: Callable[[], Any], emit: Log, region: Optional[str] = None,
                 on_phase: Callable[[str], None] = lambda phase: None,
                 health: Callable[[str, str, str], None] = lambda component, level, message: None) -> None:
    """The job's data before setup, on every generation's prepare: the FSx file system mounted
    where node.env names one (-c data_mode=fsx), else each `data` prefix staged, once per boot
    per list (the run directory is gone at reboot, which syncs again): not a listing of every
    prefix by every node at every generation. `s3()` makes the client, only when staging runs.
    Raises StagingError (final: it cannot work as deployed); health says the same."""
    if os.environ.get("DL_FSX_DNS"):
        target = contract.data_dir()
        try:
            mount_lustre(os.environ["DL_FSX_DNS"], os.environ.get("DL_FSX_MOUNT_NAME", ""), target, emit=emit)
        except StagingError as e:
            health("staging", "degraded", str(e))
            raise
        health("staging", "ok", f"FSx for Lustre mounted at {target}")
        return
    if not data:
        return
    done = os.path.join(contract.path("setup_dir"), "staged-" + hashlib.sha256("\n".join(data).encode()).hexdigest()[:16])
    if os.path.exists(done):
        return
    on_phase("staging")
    try:
        stage([data_source(u) for u in data], s3=s3(), emit=emit, run=stream, region=region,
              health=lambda level, message: health("staging", level, message))
        os.makedirs(os.path.dirname(done), exist_ok=True)
        write_atomic(done, "\n".join(data) + "\n")
    except StagingError as e:
        health("staging", "failed" if e.final else "degraded", str(e))
        raise StagingError(f"staging the data: {e}", final=e.final) from None
    finally:
        on_phase("between")
