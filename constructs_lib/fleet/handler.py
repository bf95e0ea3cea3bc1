"""The controller's Lambda: `handle(event, context)`.

EventBridge (instance state changes, spot interruption warnings, the 1-minute schedule): one
reconcile. An event that names an instance the controller's state does not list as a member is
dropped after one S3 GET and no EC2 call (every EC2 state change in the region wakes every
cluster's controller); without a state yet, after one DescribeInstances. A member's event costs
no EC2 call of its own either: the event carries the state, and a member coming up (pending,
running) changes nothing the state does not already count, so it is dropped after the S3 GET;
a member going (stopping, shutting-down, terminated) or warned reconciles at once.

A member going, in a job with a command (JOB_END_ENV names its checkpoint prefix), is first told
to the nodes: one PUT of <prefix>/_cluster/gone/<node>.json, the record a node's liveness check
writes, plus "by": "controller" (gone.py). Every node lists that directory once per liveness
period, so it learns of the death at its next look instead of after a 30 s stale heartbeat. The
id must be an instance id and in the controller's state; a PUT that fails is logged and the
reconcile runs anyway. Per member event that goes: S3 GET (state), S3 PUT (gone record), then
the reconcile.

{"dl-launcher": "resume"} (aws lambda invoke): reconcile with resume, starting a cluster the idle
guard or a teardown stopped; it comes back from its newest checkpoint.

The job's end (JOB_END_ENV, see job_end.py): every reconcile of a job with a command looks for
its nodes' finished/failed record and, once there is one, stops the cluster or keeps it.

CloudFormation custom resource Custom::DlLauncherLaunchCheck: Create/Update dry-run every
option's launch from this function's role (launch_check.py), failing the deploy with AWS's reason
when IAM would refuse it; Delete does nothing.

CloudFormation custom resource Custom::DlLauncherClusterTeardown: Create/Update reconcile (clearing a teardown), Delete tears the
cluster down; the answer goes to the ResponseURL whatever happens, FAILED with the reason on an
exception and, just before the Lambda would time out, FAILED for the timeout: CloudFormation is
never left waiting an hour for an answer that will not come.
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from typing import Any, Optional

from dl_core.aws import error_code

from ..runtime.contract import TAG_CLUSTER
from .controller import Controller
from .gone import record_gone
from .instances import GONE_STATES, LIVE_STATES, list_cluster, terminate
from .job_end import JOB_END_ENV, JobEndWatch
from .launch_check import RESOURCE_TYPE as LAUNCH_CHECK, check_launch
from .spec import ClusterSpec
from .state import StateStore

SPEC_ENV = "DL_CLUSTER_SPEC"
# {"dl-launcher": "resume"}: the payload that starts a cluster the idle guard or a teardown stopped.
COMMAND_KEY = "dl-launcher"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
STATE_CHANGE = "EC2 Instance State-change Notification"
# Answer CloudFormation this long before the Lambda's own timeout.
WATCHDOG_SECONDS = 5.0


def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if "RequestType" in event and "ResponseURL" in event:
        return _custom_resource(event, context)
    if event.get(COMMAND_KEY) == "resume":  # `aws lambda invoke`: start a stopped cluster again
        spec = load_spec()
        ec2, s3 = _clients()
        return {"transitions": [t.to_dict() for t in _controller(spec, ec2, s3).reconcile(resume=True)]}
    if event.get(COMMAND_KEY) == "stop":  # the budget stopper: release the nodes until resumed
        spec = load_spec()
        ec2, s3 = _clients()
        why = " ".join(str(event.get("reason") or "a stop was requested").split())[:300]
        return {"transitions": [t.to_dict() for t in _controller(spec, ec2, s3).teardown(why=why)]}
    return _eventbridge(event)


def load_spec() -> ClusterSpec:
    text = os.environ.get(SPEC_ENV)
    if not text:
        raise ValueError(f"{SPEC_ENV} is not set: the function needs the cluster spec as JSON")
    return ClusterSpec.from_json(text)


def _clients() -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 5})
    return boto3.client("ec2", config=config), boto3.client("s3", config=config)


def _controller(spec: ClusterSpec, ec2: Any, s3: Any) -> Controller:
    tags = None
    if spec.stack:
        import boto3

        from .instances import stack_tags
        tags = lambda: stack_tags(boto3.client("cloudformation"), spec.stack)  # noqa: E731
    return Controller(ec2, spec, StateStore(s3, spec.state_bucket, spec.state_key), cost_tags=tags,
                      job_end=load_job_end())


def load_job_end() -> Optional[JobEndWatch]:
    """Where the job records its end (JOB_END_ENV, set by the construct for a job with a command);
    None: the job never ends by itself."""
    text = os.environ.get(JOB_END_ENV)
    return JobEndWatch.from_json(text) if text else None


# ---- EventBridge ---------------------------------------------------------------------------------
def _eventbridge(event: dict[str, Any]) -> dict[str, Any]:
    spec = load_spec()
    ec2, s3 = _clients()
    detail = event.get("detail") or {}
    instance = detail.get("instance-id")
    noticed: tuple[str, ...] = ()
    if instance:
        known = _members(spec, s3)
        if known is not None and instance not in known:
            # Not a member at the last reconcile: another cluster's, or a launch of this one that
            # the 1-minute schedule will see anyway. No EC2 call for it.
            return {"ignored": f"{instance} is not a member of cluster {spec.cluster}"}
        if known is None:  # no state to go by: EC2 says whose the instance is
            owner = _cluster_of(ec2, instance)
            if owner is not None and owner != spec.cluster:
                return {"ignored": f"{instance} is not in cluster {spec.cluster}"}
        elif event.get("detail-type") == STATE_CHANGE and detail.get("state") in LIVE_STATES:
            # A member the controller launched, coming up: the state already counts it (members
            # and recent launches), so nothing is decided on it and EC2 is not asked. A launch of
            # 512 nodes sends 1,024 of these within a minute (issue 36).
            return {"ignored": f"{instance} is {detail['state']}: a member of cluster {spec.cluster} "
                               "the controller already counts"}
        if event.get("detail-type") == SPOT_WARNING:
            noticed = (instance,)
        elif known is not None and event.get("detail-type") == STATE_CHANGE and detail.get("state") in GONE_STATES:
            _tell_the_nodes(s3, instance, detail["state"])
    done = _controller(spec, ec2, s3).reconcile(noticed=noticed)
    return {"transitions": [t.to_dict() for t in done]}


def _tell_the_nodes(s3: Any, instance: Any, state: str) -> None:
    """A member goes: its gone record where every node of the job looks (gone.py), before the
    reconcile; a job without a command has no generations to tell. Never raises."""
    try:
        watch = load_job_end()
    except ValueError as e:  # the reconcile reports a malformed JOB_END_ENV itself
        print(f"dl-launcher: no gone record: {e}")
        return
    if watch is not None:
        record_gone(s3, watch, instance, state)


def _members(spec: ClusterSpec, s3: Any) -> Optional[set[str]]:
    """The instances the controller's state names (members and recent launches), or None when
    there is no readable state yet (then EC2 decides, as before)."""
    try:
        state = StateStore(s3, spec.state_bucket, spec.state_key).load()
    except Exception:  # noqa: BLE001 - unreadable: fall back to asking EC2
        return None
    if state is None:
        return None
    return set(state.members) | set(state.recent)


def _cluster_of(ec2: Any, instance: str) -> Optional[str]:
    """The instance's cluster tag ('' for none), or None when EC2 does not know the instance."""
    try:
        reservations = ec2.describe_instances(InstanceIds=[instance])["Reservations"]
    except Exception as e:
        if error_code(e) == "InvalidInstanceID.NotFound":
            return None
        raise
    for r in reservations:
        for i in r["Instances"]:
            return next((t["Value"] for t in i.get("Tags", []) if t["Key"] == TAG_CLUSTER), "")
    return None


# ---- CloudFormation --------------------------------------------------------------------------------
class _Responder:
    """Sends the custom resource's one answer (the first send wins; later ones are dropped)."""

    def __init__(self, event: dict[str, Any], context: Any) -> None:
        self.event = event
        self.stream = getattr(context, "log_stream_name", "") or ""
        # Until the spec is read: CloudFormation's own id, or the log stream as cfn-response does.
        self.physical_id = event.get("PhysicalResourceId") or self.stream or event["RequestId"]
        self._lock = threading.Lock()
        self._sent = False

    def send(self, status: str, reason: str = "", data: Optional[dict[str, str]] = None) -> None:
        with self._lock:
            if self._sent:
                return
            self._sent = True
        if self.stream:
            reason = f"{reason} (log stream {self.stream})".strip()
        body = json.dumps({
            "Status": status, "Reason": reason[:1000], "PhysicalResourceId": self.physical_id,
            "StackId": self.event["StackId"], "RequestId": self.event["RequestId"],
            "LogicalResourceId": self.event["LogicalResourceId"], "NoEcho": False, "Data": data or {},
        }).encode()
        # The pre-signed URL was signed without a content type: sending one would break the signature.
        request = urllib.request.Request(self.event["ResponseURL"], data=body, method="PUT",
                                         headers={"Content-Type": "", "Content-Length": str(len(body))})
        for attempt in range(3):
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    r.read()
                print(json.dumps({"cloudformation": status, "reason": reason}))
                return
            except OSError as e:
                print(json.dumps({"cloudformation": status, "error": f"sending the response failed: {e}"}))
                time.sleep(1 + attempt)


def _custom_resource(event: dict[str, Any], context: Any) -> dict[str, Any]:
    responder = _Responder(event, context)
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    watchdog = None
    if remaining:
        watchdog = threading.Timer(max(0.0, remaining() / 1000 - WATCHDOG_SECONDS), responder.send,
                                   args=("FAILED", f"{event['RequestType']} did not finish before the function's timeout"))
        watchdog.daemon = True
        watchdog.start()
    try:
        kind = event["RequestType"]
        try:
            spec = load_spec()
        except ValueError as e:
            if kind != "Delete":
                raise
            # Nothing can have been launched with a spec that never loaded: let the stack go.
            responder.send("SUCCESS", f"nothing to delete: {e}")
            return {"status": "SUCCESS"}
        ec2, s3 = _clients()
        if event.get("ResourceType") == LAUNCH_CHECK:
            return _launch_check(responder, kind, spec, ec2)
        previous = event.get("PhysicalResourceId")
        responder.physical_id = spec.cluster if kind != "Delete" else previous or spec.cluster
        if kind == "Delete" and previous and previous != spec.cluster:
            # The cluster was renamed (CloudFormation deletes the old resource after the update):
            # its instances go; this cluster's state is not the old one's to touch.
            gone = [n.id for n in list_cluster(ec2, previous, spec.stack)]
            terminate(ec2, gone)
            responder.send("SUCCESS", f"terminated {len(gone)} instances of the former cluster {previous}")
            return {"status": "SUCCESS"}
        controller = _controller(spec, ec2, s3)
        done = controller.teardown() if kind == "Delete" else controller.reconcile(resume=True)
        responder.send("SUCCESS", "; ".join(f"{t.kind} {t.instance_type}".strip() for t in done)[:500],
                       {"Cluster": spec.cluster})
        return {"status": "SUCCESS", "transitions": [t.to_dict() for t in done]}
    except Exception as e:
        responder.send("FAILED", f"{type(e).__name__}: {e}")
        return {"status": "FAILED", "reason": str(e)}
    finally:
        if watchdog:
            watchdog.cancel()


def _launch_check(responder: _Responder, kind: str, spec: ClusterSpec, ec2: Any) -> dict[str, Any]:
    responder.physical_id = f"{spec.cluster}-launch-check"
    if kind == "Delete":
        responder.send("SUCCESS", "a dry run leaves nothing to delete")
        return {"status": "SUCCESS"}
    import boto3

    # The role may decode in its own region only (aws:RequestedRegion): STS's regional endpoint.
    os.environ.setdefault("AWS_STS_REGIONAL_ENDPOINTS", "regional")
    summary = check_launch(ec2, spec, sts=boto3.client("sts"))
    responder.send("SUCCESS", summary, {"Cluster": spec.cluster})
    return {"status": "SUCCESS", "checked": summary}
