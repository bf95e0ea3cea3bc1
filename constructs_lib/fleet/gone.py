"""The controller's word that a member is gone, where every node of the job looks.

EC2 tells the controller within seconds that an instance is stopping, shutting down or
terminated; the nodes would learn it only once its heartbeat is 30 s stale and one of them has
asked EC2. So for an instance its own state lists (a member or a recent launch), the controller
writes the same record a node's liveness check writes (runtime/cluster_records.gone_record, with
"by": "controller") into the job's cluster directory, which every node lists once per liveness
period. One PUT, no read: the role may write exactly <prefix>/_cluster/gone/* and nothing else
there (CapacityController.end_with_job). A record it cannot write is logged, never raised: the
reconcile that follows must run whatever S3 answers.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from dl_core.aws import error_code

from ..runtime.cluster_records import gone_record
from ..runtime.records import node_problem, printable
from .instances import GONE_STATES
from .job_end import JobEndWatch


def record_gone(s3: Any, watch: JobEndWatch, node: Any, state: Any, log: Callable[[str], Any] = print) -> bool:
    """Write s3://bucket/prefix/_cluster/gone/<node>.json; True if it was written. Nothing is
    written for an id that is not an instance id (it would name the key) or a state that is not
    a going one."""
    if node_problem(node):
        log(f"dl-launcher: no gone record: {printable(node, 40)!r} is not an instance id")
        return False
    if state not in GONE_STATES:
        return False
    name, body = gone_record(node, state, by="controller")
    key = watch.key(name)
    try:
        s3.put_object(Bucket=watch.bucket, Key=key, Body=json.dumps(body).encode(), ContentType="application/json")
    except Exception as e:  # noqa: BLE001 - any failure: the nodes' heartbeats still find the node
        log(f"dl-launcher: could not record {node} gone at s3://{watch.bucket}/{key} "
            f"({error_code(e) or type(e).__name__}); the nodes' heartbeats will find it")
        return False
    return True
