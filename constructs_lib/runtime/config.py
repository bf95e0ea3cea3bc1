"""Where the node's checkpoints go and who this node is: arguments, then environment (node.env
is loaded into it by the units), then the instance's tags and metadata through IMDS."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from . import contract
from .errors import RuntimeUserError


@dataclass(frozen=True)
class RuntimeConfig:
    bucket: str
    prefix: str
    local_dir: str
    region: Optional[str]


def _imds():
    from .imds import Imds
    return Imds(timeout=1.0)


def resolve_config(bucket: Optional[str] = None, prefix: Optional[str] = None, local_dir: Optional[str] = None,
                   region: Optional[str] = None, use_imds: bool = True) -> RuntimeConfig:
    """Arguments win, then DL_CHECKPOINT_* environment, then the instance's tags (IMDS)."""
    bucket = bucket or os.environ.get("DL_CHECKPOINT_BUCKET")
    prefix = prefix or os.environ.get("DL_CHECKPOINT_PREFIX")
    if (not bucket or not prefix) and use_imds:
        try:
            imds = _imds()
            bucket = bucket or imds.tag(contract.TAG_CHECKPOINT_BUCKET)
            prefix = prefix or imds.tag(contract.TAG_CHECKPOINT_PREFIX)
        except OSError:
            pass  # not on EC2 (or IMDS off): fall through to the error below
    if not bucket:
        raise RuntimeUserError("no checkpoint bucket: pass --bucket, set DL_CHECKPOINT_BUCKET, or run on a "
                               f"dl-launcher node (instance tag {contract.TAG_CHECKPOINT_BUCKET})")
    if not prefix:
        raise RuntimeUserError("no checkpoint prefix: pass --prefix or set DL_CHECKPOINT_PREFIX (e.g. jobs/my-job)")
    return RuntimeConfig(bucket=bucket, prefix=prefix, local_dir=local_dir or contract.checkpoint_dir(),
                         region=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))


@dataclass(frozen=True)
class NodeIdentity:
    cluster: str
    nodes: int
    nproc_per_node: int
    node: str
    addr: str
    region: Optional[str]


def node_identity() -> NodeIdentity:
    """This node's cluster, size and place: DL_CLUSTER / DL_NODES / DL_PROCS_PER_NODE from node.env,
    else the instance tags; the instance id and private address from IMDS."""
    env = os.environ
    imds = _imds()
    try:
        cluster = env.get("DL_CLUSTER") or imds.tag(contract.TAG_CLUSTER)
        nodes_text = env.get("DL_NODES") or imds.tag(contract.TAG_NODES) or ""
        node = imds.instance_id()
        addr = imds.get("meta-data/local-ipv4")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or imds.get("meta-data/placement/region")
    except OSError as e:
        raise RuntimeUserError(f"cannot reach instance metadata (IMDSv2) to find this node's identity: {e}") from None
    if not cluster:
        raise RuntimeUserError(f"no cluster id: set DL_CLUSTER or tag the instance {contract.TAG_CLUSTER}")
    try:
        nodes = int(nodes_text)
        procs = int(env.get("DL_PROCS_PER_NODE", "1"))
    except ValueError:
        raise RuntimeUserError(f"node count {nodes_text!r} / DL_PROCS_PER_NODE {env.get('DL_PROCS_PER_NODE')!r}: "
                               "expected whole numbers") from None
    if nodes < 1 or procs < 1:
        raise RuntimeUserError(f"nodes ({nodes}) and processes per node ({procs}) must be at least 1")
    if not node or not addr:
        raise RuntimeUserError("instance metadata has no instance id or local-ipv4")
    return NodeIdentity(cluster, nodes, procs, node, addr, region)
