"""The idle guard's Lambda (`handle`), every few minutes: gather what `idle_guard.decide` needs
from CloudWatch, EC2 and S3, decide, and act through `idle_action.stop_idle`.

- GPUs: the CloudWatch agent's per-GPU utilisation (contract.NS_NODE), one series per node and
  GPU, found with ListMetrics by the job's dimension (instance ids are not known at synth); for a
  node of one of `neuron_types` (Trainium/Inferentia) the node monitor's M_NEURON_UTIL instead,
  one series per node (its busiest NeuronCore), judged like one GPU;
- boot: each node's LaunchTime (EC2); restores and the training process: the node monitor's
  M_RESTORING and M_TRAINING (contract.NS_JOB);
- progress: when the newest complete checkpoint's manifest was written (S3).

Every run logs one JSON line with the decision and keeps it in the guard's record
(idle_notice.py). `action` "notify" only tells the topic; "stop" (the default) pushes the
checkpoints, tears the cluster down (resumable) and tells the topic. A run after a stop finds no
node and decides nothing.

An interactive cluster (`interactive`) is judged by `decide_interactive` (sessions, GPU
processes, busy GPUs). With `warning_minutes` the first idle verdict only warns (the job's log
group and the topic) and the stop waits until the warning is that old (`idle_guard.escalate`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional, Sequence

from ..runtime import contract
from ..runtime.layout import MANIFEST, step_of
from . import idle_notice
from .idle_action import report_json, stop_idle
from .idle_guard import Decision, GuardConfig, JobProgress, NodeMetrics, decide, decide_interactive, escalate
from .instances import Node, list_cluster

GUARD_ENV = "DL_IDLE_GUARD"
ACTIONS = ("stop", "notify")
_PER_CALL = 500  # GetMetricData's most queries per request


@dataclass(frozen=True)
class GuardSettings:
    """What the construct writes into GUARD_ENV (JSON)."""
    job: str  # the value of contract.DIM_JOB (the cluster id)
    topic_arn: str
    expected_gpus: dict[str, int]  # per instance type of the cluster's options (the catalog's counts)
    checkpoint_bucket: str = ""
    checkpoint_prefix: str = ""
    action: str = "stop"
    config: dict[str, float] = field(default_factory=dict)  # GuardConfig's fields
    stack: str = ""  # the stack's id (contract.TAG_STACK): only its own nodes are watched and stopped
    interactive: bool = False  # a development cluster: sessions and GPU processes count as work
    warning_minutes: float = 0.0  # warn this long before acting (0: act on the first idle verdict)
    state_bucket: str = ""  # where the guard's record lives (contract.guard_state_key(job))
    job_log_group: str = ""  # where notices go beside the nodes' output ("" : the topic only)
    # Types whose nodes report Neuron utilisation (the monitor's); every other type: the agent's NVIDIA
    # metric. Per type, as expected_gpus is: a product may let its launcher choose either kind.
    neuron_types: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.neuron_types, list) or not all(isinstance(t, str) for t in self.neuron_types):
            raise ValueError(f"idle guard neuron_types {self.neuron_types!r}: a list of instance types")
        if self.action not in ACTIONS:
            raise ValueError(f"idle guard action {self.action!r}: allowed {', '.join(ACTIONS)}")
        if not 0 <= self.warning_minutes <= 24 * 60:
            raise ValueError(f"idle guard warning_minutes {self.warning_minutes!r}: allowed 0 to 1440")
        GuardConfig(**self.config)  # unknown keys fail here, at synth

    def guard_config(self) -> GuardConfig:
        return GuardConfig(**self.config)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls) -> "GuardSettings":
        text = os.environ.get(GUARD_ENV)
        if not text:
            raise ValueError(f"{GUARD_ENV} is not set: the function needs the guard's settings as JSON")
        return cls(**json.loads(text))


# ---- CloudWatch ------------------------------------------------------------------------------------
def _metrics(cw: Any, namespace: str, name: str, job: str) -> list[dict[str, str]]:
    """Every series of `name` for the job, as {dimension: value}."""
    found, kw = [], {"Namespace": namespace, "MetricName": name,
                     "Dimensions": [{"Name": contract.DIM_JOB, "Value": job}]}
    while True:
        page = cw.list_metrics(**kw)
        for m in page.get("Metrics", []):
            dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
            if dims not in found:  # one entry per series (moto lists one per datum)
                found.append(dims)
        if not page.get("NextToken"):
            return found
        kw["NextToken"] = page["NextToken"]


def _fetch(cw: Any, wanted: Sequence[tuple[str, str, dict[str, str], str]], start: float, end: float,
           ) -> dict[str, list[tuple[float, float]]]:
    """(id, namespace, {dims}, metric name) -> that series' (epoch, value) per period, Maximum."""
    out: dict[str, list[tuple[float, float]]] = {q[0]: [] for q in wanted}
    for i in range(0, len(wanted), _PER_CALL):
        queries = [{"Id": qid, "ReturnData": True, "MetricStat": {
            "Metric": {"Namespace": ns, "MetricName": name,
                       "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()]},  # as listed
            "Period": contract.METRIC_PERIOD, "Stat": "Maximum"}}
            for qid, ns, dims, name in wanted[i:i + _PER_CALL]]
        kw: dict[str, Any] = {"MetricDataQueries": queries, "ScanBy": "TimestampAscending",
                              "StartTime": datetime.fromtimestamp(start, timezone.utc),
                              "EndTime": datetime.fromtimestamp(end, timezone.utc)}
        while True:
            page = cw.get_metric_data(**kw)
            for r in page.get("MetricDataResults", []):
                out[r["Id"]] += [(t.timestamp(), v) for t, v in zip(r.get("Timestamps", []), r.get("Values", []))]
            if not page.get("NextToken"):
                break
            kw["NextToken"] = page["NextToken"]
    return out


def queried_per_node(gpus: int, interactive: bool) -> int:
    """Metrics one run requests per node with GetMetricData (what CloudWatch bills per 1,000):
    each GPU, the raw and the per-node CPU series, restoring, training (+ sessions, GPU processes)."""
    return gpus + 2 + 2 + (2 if interactive else 0)


def gather(cw: Any, nodes: Sequence[Node], settings: GuardSettings, now: float, cfg: GuardConfig,
           ) -> tuple[list[NodeMetrics], Optional[bool]]:
    """Each node's metrics over the window (plus the grace, to see a restore end), and whether the
    training process runs anywhere (None: no node says)."""
    job = settings.job
    ids = {n.id for n in nodes}
    start = now - (cfg.idle_minutes + cfg.grace_minutes) * 60
    wanted: list[tuple[str, str, dict[str, str], str]] = []
    keys: dict[str, tuple[str, str, Optional[int]]] = {}  # query id -> (instance, what, gpu)

    def want(ns: str, name: str, dims: dict[str, str], what: str, gpu: Optional[int] = None) -> None:
        qid = f"q{len(wanted)}"
        wanted.append((qid, ns, dims, name))
        keys[qid] = (dims[contract.DIM_INSTANCE], what, gpu)

    neuron = {n.id for n in nodes if n.instance_type in settings.neuron_types}
    series = [(contract.NS_NODE, contract.M_GPU_UTIL, "gpu"), (contract.NS_NODE, contract.M_CPU_ACTIVE, "cpu"),
              (contract.NS_JOB, contract.M_RESTORING, "restoring"), (contract.NS_JOB, contract.M_TRAINING, "training")]
    if neuron:
        series.append((contract.NS_JOB, contract.M_NEURON_UTIL, "gpu"))
    if settings.interactive:
        series += [(contract.NS_JOB, contract.M_SESSIONS, "sessions"),
                   (contract.NS_JOB, contract.M_GPU_PROCESSES, "gpu_processes")]
    for ns, name, what in series:
        for dims in _metrics(cw, ns, name, job):
            if dims.get(contract.DIM_INSTANCE) not in ids:
                continue
            if what == "gpu" and (dims[contract.DIM_INSTANCE] in neuron) != (name == contract.M_NEURON_UTIL):
                continue  # each node's own kind of utilisation only
            gpu = dims.get(contract.DIM_GPU, "0" if name == contract.M_NEURON_UTIL else None)
            if what == "gpu" and (gpu is None or not gpu.isdigit()):
                continue
            want(ns, name, dims, what, int(gpu) if what == "gpu" else None)
    data = _fetch(cw, wanted, start, now)
    per: dict[str, dict[str, Any]] = {n.id: {"gpu": {}, "cpu": [], "restoring": [], "training": [], "sessions": [],
                                             "gpu_processes": []} for n in nodes}
    for qid, (instance, what, gpu) in keys.items():
        if what == "gpu":
            per[instance]["gpu"].setdefault(gpu, []).extend(data[qid])
        else:
            per[instance][what].extend(data[qid])
    out, alive = [], []
    for n in nodes:
        p = per[n.id]
        restoring = sorted(p["restoring"])
        last_restore = max((t for t, v in restoring if v >= 1), default=None)
        out.append(NodeMetrics(
            node=n.id, booted_at=n.launched, gpu_util=p["gpu"], expected_gpus=settings.expected_gpus.get(n.instance_type, 0),
            restoring=bool(restoring) and restoring[-1][1] >= 1,
            restored_at=None if last_restore is None else last_restore + contract.METRIC_PERIOD,
            cpu_pct=p["cpu"], sessions=p["sessions"], gpu_processes=p["gpu_processes"]))
        recent = [v for t, v in sorted(p["training"]) if t >= now - 5 * contract.METRIC_PERIOD]
        if recent:
            alive.append(recent[-1] >= 1)
    process_alive = True if any(alive) else (False if alive and len(alive) == len(nodes) else None)
    return out, process_alive


# ---- S3 ---------------------------------------------------------------------------------------------
def newest_checkpoint_time(s3: Any, bucket: str, prefix: str) -> Optional[float]:
    """When the newest step's manifest was written (the step is complete from then on), or None."""
    if not bucket:
        return None
    names, kw = [], {"Bucket": bucket, "Prefix": f"{prefix.rstrip('/')}/", "Delimiter": "/"}
    while True:
        page = s3.list_objects_v2(**kw)
        names += [p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for p in page.get("CommonPrefixes", [])]
        if not page.get("NextContinuationToken"):
            break
        kw["ContinuationToken"] = page["NextContinuationToken"]
    for name in sorted((n for n in names if step_of(n) is not None), key=step_of, reverse=True):
        try:
            head = s3.head_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}/{MANIFEST}")
        except Exception:  # no manifest: that step never completed; the next older one may have
            continue
        return head["LastModified"].timestamp()
    return None


# ---- one run -----------------------------------------------------------------------------------------
def run_once(*, cw: Any, ec2: Any, s3: Any, ssm: Any, sns: Any, settings: GuardSettings, controller: Any,
             now: Optional[float] = None, logs: Any = None, **push_kw: Any) -> dict[str, Any]:
    now = time.time() if now is None else now
    cfg = settings.guard_config()
    key = contract.guard_state_key(settings.job)
    before = idle_notice.load(s3, settings.state_bucket, key)
    nodes = list_cluster(ec2, settings.job, settings.stack or None)
    metrics, alive = gather(cw, nodes, settings, now, cfg)
    if settings.interactive:
        decision = decide_interactive(metrics, now, cfg)
    else:
        last = newest_checkpoint_time(s3, settings.checkpoint_bucket, settings.checkpoint_prefix)
        decision = decide(metrics, JobProgress(process_alive=alive, checkpoint_times=() if last is None else (last,)),
                          now, cfg)
    step = escalate(decision, before.warned_at, now, settings.warning_minutes)
    result: dict[str, Any] = {"job": settings.job, "nodes": len(nodes), "stop": step.act == "stop", "state": decision.state,
                              "reason": decision.reason, "hints": list(decision.hints), "action": settings.action,
                              "mode": "interactive" if settings.interactive else "job", "step": step.act}
    record = idle_notice.GuardRecord(checked_at=now, mode=result["mode"], state=decision.state, reason=decision.reason,
                                     act=step.act, warned_at=step.warned_at, stop_at=step.stop_at,
                                     action=settings.action, hints=list(decision.hints))
    say = dict(sns=sns, logs=logs, topic_arn=settings.topic_arn, log_group=settings.job_log_group, cluster=settings.job,
               now=now)
    if step.act == "warn":
        how = ("open a session (dl-launcher shell), or run something on a GPU" if settings.interactive
               else "make progress (a checkpoint), or deploy with -c idle_guard=false")
        subject, message = idle_notice.warning_text(settings.job, record, how)
        failed = idle_notice.tell(**say, subject=subject, message=message)
        if len(failed) == 2:  # told nobody: no warning stands, so no stop follows from it
            record = dataclasses.replace(record, act="none", warned_at=None, stop_at=None)
        result["notice_failed"] = failed
    elif step.act == "cancel":
        subject, message = idle_notice.cancel_text(settings.job, record)
        result["notice_failed"] = idle_notice.tell(**say, subject=subject, message=message)
    elif step.act == "stop" and settings.action == "stop":
        report = stop_idle(decision, controller=controller, ssm=ssm, sns=sns, topic_arn=settings.topic_arn,
                           instance_ids=[n.id for n in nodes], **push_kw)
        result["stopped"] = json.loads(report_json(report))
        record = dataclasses.replace(record, warned_at=None)
    elif step.act == "stop":
        _notify(sns, settings, decision)
        record = dataclasses.replace(record, warned_at=None)
    result["stop_at"] = record.stop_at
    idle_notice.save(s3, settings.state_bucket, key, record)
    return result


def _notify(sns: Any, settings: GuardSettings, decision: Decision) -> None:
    sns.publish(TopicArn=settings.topic_arn, Subject=f"dl-launcher: cluster {settings.job} is idle"[:100],
                Message=f"dl-launcher idle guard: cluster {settings.job} is idle and still running (action notify): "
                        f"{decision.reason}\n" + "\n".join(decision.hints),
                MessageAttributes={"cluster": {"DataType": "String", "StringValue": settings.job}})


def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    from .handler import load_spec
    from .controller import Controller
    from .state import StateStore

    config = Config(retries={"mode": "standard", "max_attempts": 5})
    clients = {name: boto3.client(name, config=config) for name in ("cloudwatch", "ec2", "s3", "ssm", "sns", "logs")}
    spec = load_spec()
    controller = Controller(clients["ec2"], spec, StateStore(clients["s3"], spec.state_bucket, spec.state_key))
    result = run_once(cw=clients["cloudwatch"], ec2=clients["ec2"], s3=clients["s3"], ssm=clients["ssm"],
                      sns=clients["sns"], logs=clients["logs"], settings=GuardSettings.from_env(), controller=controller)
    print(json.dumps({"idle_guard": result}))
    return result
