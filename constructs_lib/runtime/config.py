"""Where the node's checkpoints go and who this node is: arguments, then environment (node.env
is loaded into it by the units), then the instance's tags and metadata through IMDS."""
from __future__ import annotations

import http.client
import os
from dataclasses import dataclass
from typing import Optional

from . import contract
from .errors import ImdsUnavailable, RuntimeUserError


@dataclass(frozen=True)
class RuntimeConfig:
    bucket: str
    prefix: str
    local_dir: str
    region: Optional[str]


def _imds(*, on_node: bool = False):
    from .imds import Imds
    return Imds.on_node() if on_node else Imds(timeout=1.0)


def resolve_config(bucket: Optional[str] = None, prefix: Optional[str] = None, local_dir: Optional[str] = None,
                   region: Optional[str] = None, use_imds: bool = True, on_node: bool = False) -> RuntimeConfig:
    """Arguments win, then DL_CHECKPOINT_* environment, then the instance's tags (IMDS).
    on_node: a node's own unit asks, which waits out a slow IMDS (ImdsUnavailable: restart) where
    a person at a shell is told at once that this is no node."""
    bucket = bucket or os.environ.get("DL_CHECKPOINT_BUCKET")
    prefix = prefix or os.environ.get("DL_CHECKPOINT_PREFIX")
    off_ec2: Optional[str] = None  # why IMDS could not be asked, when it could not
    if (not bucket or not prefix) and use_imds:
        imds = _imds(on_node=on_node)
        try:
            bucket = bucket or imds.tag(contract.TAG_CHECKPOINT_BUCKET)
            prefix = prefix or imds.tag(contract.TAG_CHECKPOINT_PREFIX)
        except ImdsUnavailable:
            raise
        except (OSError, http.client.HTTPException) as e:  # not on EC2, or IMDS off
            off_ec2 = f"no instance metadata (IMDSv2) at {imds.endpoint}: {_reason(e)}"
    if not bucket or not prefix:
        what = "bucket" if not bucket else "prefix"
        how = ("pass --bucket and --prefix or set DL_CHECKPOINT_BUCKET and DL_CHECKPOINT_PREFIX"
               if not bucket else "pass --prefix or set DL_CHECKPOINT_PREFIX (e.g. jobs/my-job)")
        if off_ec2:
            where = f"this is not a dl-launcher node ({off_ec2})"
        elif use_imds:
            tag = contract.TAG_CHECKPOINT_BUCKET if not bucket else contract.TAG_CHECKPOINT_PREFIX
            where = f"this instance has no tag {tag}, so it is not a dl-launcher node with checkpoints"
        else:
            where = "none given"
        raise RuntimeUserError(f"no checkpoint {what}: {where}; {how}")
    return RuntimeConfig(bucket=bucket, prefix=prefix, local_dir=local_dir or contract.checkpoint_dir(),
                         region=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or e
    return " ".join(str(reason).split()) or type(e).__name__


@dataclass(frozen=True)
class NodeIdentity:
    cluster: str
    nodes: int
    nproc_per_node: int
    node: str
    addr: str
    region: Optional[str]
    # The memory tier's buddies are kept apart by it (memory_ring.ring): the zone, and the
    # partition of a partition placement group where there is one.
    failure_domain: str = ""


def node_identity() -> NodeIdentity:
    """This node's cluster, size and place: DL_CLUSTER / DL_NODES / DL_PROCS_PER_NODE from node.env,
    else the instance tags; the instance id and private address from IMDS. Raises ImdsUnavailable
    (restartable) when IMDS is there but does not answer in time, RuntimeUserError when it is absent."""
    env = os.environ
    imds = _imds(on_node=True)  # only the node's job unit asks: a slow IMDS is waited for, not a bad setting
    try:
        cluster = env.get("DL_CLUSTER") or imds.tag(contract.TAG_CLUSTER)
        nodes_text = env.get("DL_NODES") or imds.tag(contract.TAG_NODES) or ""
        node = imds.instance_id()
        addr = imds.get("meta-data/local-ipv4")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or imds.get("meta-data/placement/region")
        zone = imds.get("meta-data/placement/availability-zone-id") or ""
        partition = imds.get("meta-data/placement/partition-number")
    except ImdsUnavailable:
        raise
    except (OSError, http.client.HTTPException) as e:
        raise RuntimeUserError(f"this is not a dl-launcher node: no instance metadata (IMDSv2) at {imds.endpoint} "
                               f"({_reason(e)}); the job supervisor runs only on a node, which IMDS tells its "
                               "instance id and address") from None
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
    return NodeIdentity(cluster, nodes, procs, node, addr, region,
                        zone + (f"/partition-{partition}" if partition else ""))
