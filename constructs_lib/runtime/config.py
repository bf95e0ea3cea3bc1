"""Where the node's checkpoints go, from arguments, environment, or the instance's tags."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from .errors import RuntimeUserError

TAG_BUCKET = "dl-launcher:checkpoint-bucket"
TAG_PREFIX = "dl-launcher:checkpoint-prefix"
DEFAULT_LOCAL = "/scratch/checkpoints"


@dataclass(frozen=True)
class RuntimeConfig:
    bucket: str
    prefix: str
    local_dir: str
    region: Optional[str]


def resolve_config(bucket: Optional[str] = None, prefix: Optional[str] = None, local_dir: Optional[str] = None,
                   region: Optional[str] = None, use_imds: bool = True) -> RuntimeConfig:
    """Arguments win, then DL_CHECKPOINT_* environment, then the instance's tags (IMDS)."""
    bucket = bucket or os.environ.get("DL_CHECKPOINT_BUCKET")
    prefix = prefix or os.environ.get("DL_CHECKPOINT_PREFIX")
    if (not bucket or not prefix) and use_imds:
        from .imds import Imds
        try:
            imds = Imds(timeout=1.0)
            bucket = bucket or imds.tag(TAG_BUCKET)
            prefix = prefix or imds.tag(TAG_PREFIX)
        except OSError:
            pass  # not on EC2 (or IMDS off): fall through to the error below
    if not bucket:
        raise RuntimeUserError("no checkpoint bucket: pass --bucket, set DL_CHECKPOINT_BUCKET, or run on a "
                               f"dl-launcher node (instance tag {TAG_BUCKET})")
    if not prefix:
        raise RuntimeUserError("no checkpoint prefix: pass --prefix or set DL_CHECKPOINT_PREFIX (e.g. jobs/my-job)")
    local = local_dir or os.environ.get("DL_CHECKPOINT_DIR") or DEFAULT_LOCAL
    return RuntimeConfig(bucket=bucket, prefix=prefix, local_dir=local,
                         region=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))
