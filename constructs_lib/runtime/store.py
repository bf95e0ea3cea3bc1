"""Checkpoints in S3: multipart, parallel uploads; the manifest (files, sizes, SHA-256) last.

push:   delete any old manifest of that step, upload every file, then write MANIFEST.json.
        A crash at any point leaves no manifest, so the step never counts as complete.
        Every part is sent with a SHA-256 checksum that S3 verifies on receipt (botocore
        computes it while reading the file, in place of its default CRC32, so checksumming costs
        no extra pass); the manifest records the checksum S3 stored for each file.
latest: the newest step whose manifest exists.
pull:   download the newest complete step and verify every size and checksum; a step that
        does not verify is skipped for the next older one, never restored half.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dl_core.aws import error_code, retries

from . import contract, records
from .errors import RuntimeUserError
from .layout import FORMAT, MANIFEST, name_for, prefix_problem, step_of
from .manifest import MiB, local_checksum, manifest_problem, whole_number
from .shards import RESTORED, is_sharded, needed_files

__all__ = ["CheckpointStore", "RemoteCheckpoint", "check_prefix", "manifest_problem", "s3_client"]


@dataclass(frozen=True)
class RemoteCheckpoint:
    step: int
    name: str
    manifest: dict[str, Any]

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.manifest["files"])



def check_prefix(prefix: str) -> str:
    problem = prefix_problem(prefix)
    if problem:
        raise RuntimeUserError(problem)
    return prefix.strip("/")


def s3_client(region: Optional[str] = None, max_pool: int = 32):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import InvalidRegionError

        # Standard retries back off on throttling (SlowDown, 503) and 5xx; adaptive mode would
    # also rate-limit the client, which a two-minute deadline cannot afford.

    try:
        return boto3.client("s3", region_name=region, config=Config(
            retries=retries("standard", 10), max_pool_connections=max_pool))
    except InvalidRegionError:
        raise RuntimeUserError(f"bad region {region!r}: use a region name like us-east-1") from None


class CheckpointStore:
    """One job's checkpoints under s3://bucket/prefix/."""

    def __init__(self, bucket: str, prefix: str, *, client=None, region: Optional[str] = None,
                 concurrency: Optional[int] = None, part_size: int = 8 * MiB,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        if not contract.S3_BUCKET.match(bucket or ""):
            raise RuntimeUserError(f"bad bucket name {bucket!r}: 3-63 lower-case letters, digits, dots and dashes")
        self.bucket = bucket
        self.prefix = check_prefix(prefix)
        # Two transfers per vCPU, 4 to 16: hashing and TLS cost CPU too, and a training node
        # with 96+ vCPUs saturates its S3 throughput well before 16 streams per checkpoint.
        self.concurrency = concurrency or max(4, min(16, 2 * (os.cpu_count() or 2)))
        self.client = client or s3_client(region, max_pool=self.concurrency * 2)
        self.part_size = part_size
        self.log = log  # where a record set aside is said (records.read); the node's units pass their own
        self.set_aside: dict[str, str] = {}  # key -> why, the records set aside so far (runtime status)

    # ---- keys ------------------------------------------------------------------------------
    def _key(self, name: str, rel: str = "") -> str:
        return f"{self.prefix}/{name}/{rel}" if rel else f"{self.prefix}/{name}/"

    def _user_error(self, e: Exception) -> Optional[RuntimeUserError]:
        """The one-line error a user can act on, for S3 errors that are the user's to fix."""
        code = error_code(e)
        if code == "NoSuchBucket":
            return RuntimeUserError(f"checkpoint bucket {self.bucket!r} does not exist (check the name and region)")
        if code in ("AccessDenied", "403", "AllAccessDisabled"):
            return RuntimeUserError(f"access denied to s3://{self.bucket}/{self.prefix}/: the node's role needs "
                                    "read/write on that prefix (CheckpointBucket.grant_read_write)")
        return None

    def _call(self, fn: Callable, **kw):
        try:
            return fn(**kw)
        except Exception as e:
            err = self._user_error(e)
            if err:
                raise err from None
            raise

    # ---- push ------------------------------------------------------------------------------
    def push(self, local_dir: str, step: int, *, on_event: Optional[Callable[[str, str], None]] = None) -> RemoteCheckpoint:
        """Upload local_dir as checkpoint `step`. Returns when the manifest is in S3."""
        if not os.path.isdir(local_dir):
            raise RuntimeUserError(f"checkpoint directory {local_dir!r} does not exist"
                                   + (" as a directory" if os.path.lexists(local_dir) else ""))
        if is_sharded(local_dir) or os.path.exists(os.path.join(local_dir, RESTORED)):
            raise RuntimeUserError(f"{local_dir!r} is one node's part of a sharded save: each node's agent sends its "
                                   "own part and the step is complete when every node's is in S3")
        files = self._local_files(local_dir)
        if not files:
            raise RuntimeUserError(f"checkpoint directory {local_dir!r} is empty: nothing to push")
        name = name_for(step)
        emit = on_event or (lambda kind, key: None)
        # An older manifest of the same step must go first: until the new one is written, the
        # step is incomplete, whatever happens to the upload.
        self._call(self.client.delete_object, Bucket=self.bucket, Key=self._key(name, MANIFEST))
        entries = self.upload_files(files, lambda rel: self._key(name, rel), emit)
        manifest = {"format": FORMAT, "step": step, "name": name, "files": entries,
                    "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        self.put_manifest(manifest)
        emit("manifest", self._key(name, MANIFEST))
        return RemoteCheckpoint(step, name, manifest)

    def put_manifest(self, manifest: dict) -> None:
        """The step becomes complete: its MANIFEST.json, written after every file it lists."""
        self._call(self.client.put_object, Bucket=self.bucket, Key=self._key(manifest["name"], MANIFEST),
                   Body=json.dumps(manifest, indent=1).encode(), ContentType="application/json")

    def upload_files(self, files: list[tuple[str, str]], key_of: Callable[[str], str],
                     emit: Callable[[str, str], None] = lambda kind, key: None) -> list[dict]:
        """Upload (relative path, full path) pairs in parallel; returns their manifest entries, with
        the SHA-256 S3 verified and kept for each."""
        from boto3.s3.transfer import TransferConfig, create_transfer_manager
        from s3transfer.utils import ChunksizeAdjuster

        config = TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                                max_concurrency=self.concurrency, use_threads=True)
        extra = {"ChecksumAlgorithm": "SHA256"}
        entries = []
        with create_transfer_manager(self.client, config) as manager:
            uploads = [(rel, full, manager.upload(full, self.bucket, key_of(rel), extra_args=extra))
                       for rel, full in files]
            for rel, full, future in uploads:
                self._call(future.result)
                key = key_of(rel)
                head = self._call(self.client.head_object, Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
                size = os.path.getsize(full)
                checksum = head.get("ChecksumSHA256", "")
                if not checksum:
                    raise RuntimeUserError(f"S3 kept no SHA-256 checksum for {key}: the endpoint does not support "
                                           "S3 checksums, so the checkpoint cannot be verified on restore")
                multipart = size >= self.part_size
                entries.append({
                    "path": rel, "size": size, "sha256": checksum.split("-")[0],
                    "checksum_type": "COMPOSITE" if multipart else "FULL_OBJECT",
                    "part_size": ChunksizeAdjuster().adjust_chunksize(self.part_size, size) if multipart else size})
                emit("file", key)
        return entries

    @staticmethod
    def _local_files(local_dir: str) -> list[tuple[str, str]]:
        """(relative path, full path) of every file to upload. A symlink is refused unless it
        names a regular file inside the checkpoint: a save must never carry /etc/passwd to S3."""
        real_root = os.path.realpath(local_dir)
        files = []
        for root, dirs, names in os.walk(local_dir):
            for n in sorted(dirs + names):
                full = os.path.join(root, n)
                rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
                if os.path.islink(full):
                    target = os.path.realpath(full)
                    if os.path.commonpath([real_root, target]) != real_root or not os.path.isfile(target):
                        raise RuntimeUserError(f"refusing to push {local_dir!r}: {rel} is a symlink to {target!r}, "
                                               "not to a file inside the checkpoint")
                if n in names:
                    if not os.path.isfile(full):
                        raise RuntimeUserError(f"refusing to push {local_dir!r}: {rel} is not a regular file")
                    if rel == MANIFEST:
                        raise RuntimeUserError(f"refusing to push {local_dir!r}: {MANIFEST} at its top is the "
                                               "name the protocol keeps for itself")
                    files.append((rel, full))
        return files

    # ---- list / latest ------------------------------------------------------------------------
    def _step_names(self) -> list[str]:
        names = []
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/", Delimiter="/")
        for page in self._call(lambda: list(pages)):
            for cp in page.get("CommonPrefixes", []):
                n = cp["Prefix"][len(self.prefix) + 1:].rstrip("/")
                if step_of(n) is not None:
                    names.append(n)
        return sorted(names)

    def _manifest(self, name: str) -> Optional[dict]:
        """The step's manifest, or None when it has none or it is set aside (records.read)."""
        return records.read(self, self._key(name, MANIFEST), limit=records.MAX_MANIFEST,
                            problem=lambda m: manifest_problem(m, name)).value

    def list(self) -> list[tuple[str, Optional[RemoteCheckpoint]]]:
        """Every step under the prefix, oldest first, with its checkpoint if complete."""
        out = []
        for n in self._step_names():
            m = self._manifest(n)
            out.append((n, RemoteCheckpoint(step_of(n), n, m) if m else None))
        return out

    def has_step(self, step: int) -> bool:
        """Whether `step` is complete in S3 (its manifest exists)."""
        return self._manifest(name_for(step)) is not None

    def latest(self) -> Optional[RemoteCheckpoint]:
        for n in reversed(self._step_names()):
            m = self._manifest(n)
            if m:
                return RemoteCheckpoint(step_of(n), n, m)
        return None

    # ---- pull ------------------------------------------------------------------------------
    def pull(self, dest_root: str, step: Optional[int] = None, *, ranks: Optional[range] = None,
             world_size: Optional[int] = None) -> Optional[tuple[int, str]]:
        """Restore the newest complete checkpoint (or `step`) as dest_root/step-...; None if none.
        A sharded step brings only what these global ranks read back (all of it without ranks,
        or when world_size is not the one that saved)."""
        if step is not None and (not whole_number(step) or not 0 <= step < 10**12):
            raise RuntimeUserError(f"bad step {step!r}: a whole number 0 <= step < 10**12")
        try:
            os.makedirs(dest_root, exist_ok=True)
        except OSError as e:
            raise RuntimeUserError(f"cannot use checkpoint directory {dest_root!r}: {e.strerror or e}") from None
        names = [name_for(step)] if step is not None else list(reversed(self._step_names()))
        for n in names:
            m = self._manifest(n)
            if not m:
                continue
            final = os.path.join(dest_root, n)
            files = needed_files(m, ranks, world_size)
            # This node's own files of the step (its shards, when it saved or kept the step itself)
            # are taken as they are once they verify: only the rest comes from S3. Hashed once.
            verified = _verified(final, m, files, every=False) if os.path.isdir(final) else None
            if verified is not None and verified == {f["path"] for f in files}:
                return step_of(n), final
            have = verified or set()
            try:
                tmp = tempfile.mkdtemp(prefix=f".tmp-{n}-", dir=dest_root)
            except OSError as e:
                raise RuntimeUserError(f"cannot write in checkpoint directory {dest_root!r}: {e.strerror or e}") from None
            try:
                _link_into(final, tmp, have)
                missing = [f for f in files if f["path"] not in have]
                if self._download(n, m, tmp, missing) and self._verify_local(tmp, m, missing):
                    if m.get("shards"):  # this node's share of a sharded step: never a whole step to push
                        with open(os.path.join(tmp, RESTORED), "w") as f:
                            f.write(m["shards"]["attempt"] + "\n")
                    if os.path.isdir(final):
                        shutil.rmtree(final)
                    os.rename(tmp, final)
                    return step_of(n), final
            finally:
                # Every way out but the rename above (a failed check, an S3 error, an interrupt)
                # leaves no half-restored .tmp-step-* behind.
                if os.path.lexists(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
        return None

    def _download(self, name: str, manifest: dict, dest: str, files: list[dict]) -> bool:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager
        from botocore.exceptions import ClientError

        config = TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                                max_concurrency=self.concurrency)
        with create_transfer_manager(self.client, config) as manager:
            futures = []
            for f in files:
                target = os.path.join(dest, *f["path"].split("/"))
                if not os.path.abspath(target).startswith(os.path.abspath(dest) + os.sep):
                    return False  # a manifest must not write outside its checkpoint
                try:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                except OSError:
                    return False  # a path in the way (validated manifests never do this)
                rel = f"{manifest['dir']}/{f['path']}" if manifest.get("dir") else f["path"]
                futures.append(manager.download(self.bucket, self._key(name, rel), target))
            try:
                for fut in futures:
                    fut.result()
            except ClientError:
                return False
            except Exception as e:
                if "Not Found" in str(e) or "404" in str(e):
                    return False
                raise
        return True

    @staticmethod
    def _verify_local(path: str, manifest: dict, files: Optional[list[dict]] = None) -> bool:
        return _verified(path, manifest, files) is not None


def _verified(path: str, manifest: dict, files: Optional[list[dict]] = None, *,
              every: bool = True) -> Optional[set[str]]:
    """The paths of `files` (default: every file of the manifest) under `path` whose size and
    SHA-256 match the manifest; None when the manifest is not a valid one, or (every=True) when
    any of them does not match."""
    step = manifest.get("step") if isinstance(manifest, dict) else None
    if not whole_number(step) or not 0 <= step < 10**12 or manifest_problem(manifest, name_for(step)):
        return None
    good = set()
    for f in manifest["files"] if files is None else files:
        p = os.path.join(path, *f["path"].split("/"))
        try:
            ok = (not os.path.islink(p) and os.path.isfile(p) and os.path.getsize(p) == f["size"]
                  and local_checksum(p, f.get("checksum_type", "FULL_OBJECT"),
                                     f.get("part_size") or f["size"] or 1) == f["sha256"])
        except OSError:
            ok = False
        if ok:
            good.add(f["path"])
        elif every:
            return None
    return good


def _link_into(final: str, tmp: str, paths: set[str]) -> None:
    """Hard-link (or copy) these files of `final`, already verified, into tmp."""
    for rel in sorted(paths):
        src, dst = os.path.join(final, *rel.split("/")), os.path.join(tmp, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
