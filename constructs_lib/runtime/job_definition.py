"""What a job revision is, as the constructs write it at synth and a plan records it: two CDK
assets and a pointer.
- the definition: a small JSON file (command, setup, env, secret ARNs, image, the code's digest),
  made by `definition_bytes` at synth; its S3 key is its content hash;
- the code: the deployer's directory as a zip (constructs_lib.code), checked on the node
  against the digest the definition records (codetree.py);
- the pointer: the SSM parameter contract.job_parameter(cluster), which CloudFormation rewrites
  on every deploy and nothing on a node can write.
Also how a node reads those pieces from AWS (`read_retrying`): throttling is ridden out, a
missing object or a denied read is not. Who may change what a node runs: jobdef.py.

Standard library only (dl_core.aws reads botocore's errors without importing it): this module
ships to the node with the runtime.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, TypeVar

from dl_core.aws import Backoff, error_code, retry

from .framework_checkpoints import checkpoint_dir_problem, normalized

Log = Callable[[str], None]
T = TypeVar("T")
DEFINITION_FORMAT = 1
_SHA = re.compile(r"^[0-9a-f]{64}\Z")
_S3_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+)\Z")


class JobError(Exception):
    """The job cannot run on this node as deployed; `final` when retrying cannot help (a setup
    that failed, an image that does not exist) and the job should stop, not loop."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


# ---- what the constructs write at synth ---------------------------------------------------------
def definition_bytes(*, command: Optional[str], setup: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                     secrets: Optional[Mapping[str, str]] = None, image: Optional[str] = None,
                     code: Optional[Mapping[str, object]] = None, data: Sequence[str] = (),
                     checkpoint_dir: Optional[str] = None) -> bytes:
    """The definition file, canonical (sorted keys, no spaces): equal jobs give equal bytes, so
    an unchanged job keeps its asset hash and its revision (a job without data has no data key,
    as before there was one)."""
    body: dict[str, object] = {"format": DEFINITION_FORMAT, "command": command, "setup": setup, "env": dict(env or {}),
                               "secrets": dict(secrets or {}), "image": image, "code": dict(code) if code else None}
    if data:
        body["data"] = list(data)
    if checkpoint_dir:
        body["checkpoint_dir"] = checkpoint_dir
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Revision:
    """What a plan records: the definition's object and sha256, and the code's object."""

    definition: str
    sha256: str
    code: Optional[str] = None

    def to_json(self) -> dict:
        return {"definition": self.definition, "sha256": self.sha256, "code": self.code}

    @classmethod
    def from_json(cls, d: object) -> "Revision":
        if not isinstance(d, dict):
            raise ValueError(f"a job revision is a JSON object, got {type(d).__name__}")
        url, sha, code = d.get("definition"), d.get("sha256"), d.get("code")
        if not isinstance(url, str) or not _S3_URL.match(url):
            raise ValueError(f"job revision: definition {url!r} is not an s3:// URL")
        if not isinstance(sha, str) or not _SHA.match(sha):
            raise ValueError(f"job revision: sha256 {sha!r} is not a SHA-256 in hex")
        if code is not None and (not isinstance(code, str) or not _S3_URL.match(code)):
            raise ValueError(f"job revision: code {code!r} is not an s3:// URL")
        return cls(url, sha, code or None)


def revision_from_env(env: Mapping[str, str] = os.environ) -> Optional[Revision]:
    """The revision this node was launched with (node.env), or None for a node without one."""
    if not env.get("DL_JOB_DEFINITION_URL"):
        return None
    return Revision.from_json({"definition": env["DL_JOB_DEFINITION_URL"], "sha256": env.get("DL_JOB_DEFINITION_SHA256"),
                               "code": env.get("DL_JOB_CODE_URL") or None})


@dataclass(frozen=True)
class Definition:
    sha256: str
    command: Optional[str]
    setup: Optional[str]
    env: dict[str, str]
    secrets: dict[str, str]
    image: Optional[str]
    code: Optional[dict]
    data: tuple[str, ...] = ()  # s3://bucket/prefix/ URIs staged onto scratch before the first generation
    checkpoint_dir: Optional[str] = None  # the framework's own checkpoints, relative to the working directory

    @classmethod
    def parse(cls, data: bytes, sha256: str) -> "Definition":
        try:
            d = json.loads(data)
        except ValueError as e:
            raise JobError(f"the job definition is not JSON: {e}") from None
        if not isinstance(d, dict) or d.get("format") != DEFINITION_FORMAT:
            raise JobError(f"the job definition has format {d.get('format') if isinstance(d, dict) else None!r}; "
                           f"this runtime reads format {DEFINITION_FORMAT}", final=True)

        def text(key: str) -> Optional[str]:
            v = d.get(key)
            if v is not None and not isinstance(v, str):
                raise JobError(f"the job definition's {key} is not text", final=True)
            return v

        def mapping(key: str) -> dict[str, str]:
            v = d.get(key) or {}
            if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
                raise JobError(f"the job definition's {key} is not a map of names to text", final=True)
            return dict(v)

        code = d.get("code")
        if code is not None and not (isinstance(code, dict) and isinstance(code.get("sha256"), str)
                                     and _SHA.match(code["sha256"])):
            raise JobError("the job definition's code has no sha256", final=True)
        data = d.get("data") or []
        if not isinstance(data, list) or not all(isinstance(u, str) and u.startswith("s3://") for u in data):
            raise JobError("the job definition's data is not a list of s3:// URIs", final=True)
        ckpt = d.get("checkpoint_dir")
        if ckpt is not None and checkpoint_dir_problem(ckpt):
            raise JobError(f"the job definition's {checkpoint_dir_problem(ckpt)}", final=True)
        return cls(sha256, text("command"), text("setup"), mapping("env"), mapping("secrets"), text("image"), code,
                   tuple(data), normalized(ckpt) if ckpt else None)


# ---- S3 -----------------------------------------------------------------------------------------
def split_s3(url: str) -> tuple[str, str]:
    m = _S3_URL.match(url)
    if not m:
        raise JobError(f"{url!r} is not an s3:// URL", final=True)
    return m[1], m[2]


# What no retry fixes: a read the role may not make, or of a thing that does not exist.
FINAL_CODES = frozenset({"AccessDenied", "AccessDeniedException", "NoSuchKey", "404", "403", "NoSuchBucket",
                         "ParameterNotFound", "ResourceNotFoundException"})


def read_retrying(what: str, fn: Callable[[], T], *, log: Log, attempts: int = 5, base: float = 1.0,
                  cap: float = 30.0, sleep: Callable[[float], None] = time.sleep) -> T:
    """fn() with full-jitter backoff (at most `attempts` tries, waits capped at `cap`): S3 and SSM
    throttle (SlowDown, ThrottlingException) under a whole cluster's boot; access and missing
    objects are not retried. Every failure ends as a JobError naming `what` and the code."""
    def said(e: BaseException, delay: float) -> None:
        log(f"{what}: {error_code(e) or type(e).__name__}; retrying in {delay:.1f} s")

    try:  # botocore's ClientError and connection errors alike are retried
        return retry(fn, attempts=attempts, backoff=Backoff(base, cap), retryable=lambda e: error_code(e) not in FINAL_CODES,
                     on_retry=said, sleep=sleep)
    except Exception as e:  # noqa: BLE001 - the last try's error, or one no retry fixes
        raise JobError(f"{what}: {error_code(e) or type(e).__name__}: {e}") from None
