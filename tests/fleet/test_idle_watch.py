"""The idle guard's Lambda run against moto: metric series put into moto CloudWatch as the
CloudWatch agent and the node monitor send them (the contract's namespaces, names and
dimensions), nodes in moto EC2, a checkpoint manifest in moto S3, the team's topic read back
through SQS. Idle -> the cluster is released and the team told; busy, booting, restoring or a
recent checkpoint -> nothing happens."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import boto3
import pytest

from constructs_lib.fleet.idle_watch import GuardSettings, newest_checkpoint_time, run_once
from constructs_lib.runtime import contract

from .conftest import BUCKET, CLUSTER, REGION, live_instances

GPUS = 8
PREFIX = "jobs/llm-7b"
# Evaluated 25 min after the nodes launched: past the 20-min grace, inside a 30-min window.
LATER = 25 * 60


class Metrics:
    def __init__(self) -> None:
        self.cw = boto3.client("cloudwatch", region_name=REGION)

    def put(self, namespace: str, name: str, dims: dict[str, str], values) -> None:
        """values: [(epoch, value)] once a minute."""
        data = [{"MetricName": name, "Timestamp": datetime.fromtimestamp(t, timezone.utc), "Value": v,
                 "Dimensions": [{"Name": k, "Value": val} for k, val in dims.items()]} for t, v in values]
        for i in range(0, len(data), 500):
            self.cw.put_metric_data(Namespace=namespace, MetricData=data[i:i + 500])

    def node(self, instance: str, now: float, gpu=lambda g, t: 1.0, training=0.0, restoring=lambda t: 0.0,
             minutes: int = 40) -> None:
        times = [now - 60 * m for m in range(minutes, -1, -1)]
        base = {contract.DIM_JOB: CLUSTER, contract.DIM_INSTANCE: instance}
        for g in range(GPUS):  # the agent's own extra GPU dimensions ride along
            self.put(contract.NS_NODE, contract.M_GPU_UTIL, {**base, contract.DIM_GPU: str(g), "name": "NVIDIA H100"},
                     [(t, gpu(g, t)) for t in times])
        self.put(contract.NS_NODE, contract.M_CPU_ACTIVE, {**base, "cpu": "cpu-total"}, [(t, 3.0) for t in times])
        self.put(contract.NS_JOB, contract.M_TRAINING, base, [(t, training) for t in times])
        self.put(contract.NS_JOB, contract.M_RESTORING, base, [(t, restoring(t)) for t in times])


def _setup(cloud, settings_kw=None):
    ctl = cloud.controller(cloud.spec(nodes=2))
    cloud.reconcile(ctl)
    ids = [i["InstanceId"] for i in live_instances(cloud.raw)]
    launched = min(i["LaunchTime"].timestamp() for i in live_instances(cloud.raw))
    kw = dict(job=CLUSTER, topic_arn="", expected_gpus={"p5.48xlarge": GPUS, "p5en.48xlarge": GPUS, "p4d.24xlarge": 8},
              checkpoint_bucket=BUCKET, checkpoint_prefix=PREFIX,
              config={"threshold_pct": 5.0, "idle_minutes": 30.0, "grace_minutes": 20.0})
    kw.update(settings_kw or {})
    return ctl, ids, launched + LATER, kw


def _run(cloud, ctl, topic, kw, now, logs=None):
    sns, arn, _, _ = topic
    settings = GuardSettings(**{**kw, "topic_arn": arn})
    return run_once(cw=boto3.client("cloudwatch", region_name=REGION), ec2=cloud.raw, s3=cloud.s3,
                    ssm=boto3.client("ssm", region_name=REGION), sns=sns, settings=settings, controller=ctl,
                    now=now, push_timeout=5, poll=0, logs=logs)


def _messages(topic):
    _, _, sqs, url = topic
    return [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0,
                                                               MaxNumberOfMessages=10).get("Messages", [])]


def test_an_idle_cluster_whose_training_ended_is_released_and_the_team_told(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    m = Metrics()
    for i in ids:
        m.node(i, now, training=0.0)
    result = _run(cloud, ctl, topic, kw, now)
    assert result["stop"] and result["state"] == "idle", json.dumps(result)
    assert f"all {2 * GPUS} GPUs under 5%" in result["reason"] and "training process is gone" in result["reason"]
    assert live_instances(cloud.raw) == []
    assert sorted(result["stopped"]["terminated"]) == sorted(ids)
    (msg,) = _messages(topic)
    assert msg["Subject"] == f"dl-launcher: idle cluster {CLUSTER} stopped"
    # The next run finds nothing to judge, and the stopped state keeps the controller from relaunching.
    assert _run(cloud, ctl, topic, kw, now + 300)["state"] == "no-data"
    cloud.reconcile(ctl)
    assert live_instances(cloud.raw) == []


def test_one_busy_gpu_of_sixteen_keeps_the_cluster(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    m = Metrics()
    for n, i in enumerate(ids):
        m.node(i, now, gpu=lambda g, t, n=n: 97.0 if (n, g) == (1, 5) and t > now - 600 else 0.5)
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "busy" and "GPU 5" in result["reason"]
    assert len(live_instances(cloud.raw)) == 2 and _messages(topic) == []


def test_just_booted_nodes_are_in_their_grace(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    m = Metrics()
    for i in ids:
        m.node(i, now - LATER + 10 * 60, minutes=10)
    result = _run(cloud, ctl, topic, kw, now - LATER + 10 * 60)
    assert not result["stop"] and result["state"] == "grace", result
    assert len(live_instances(cloud.raw)) == 2


def test_a_node_restoring_a_checkpoint_holds_the_guard(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    m = Metrics()
    m.node(ids[0], now, restoring=lambda t: 1.0 if t >= now - 120 else 0.0)
    m.node(ids[1], now)
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "grace" and "restoring" in result["reason"], result


def test_a_restore_that_ended_recently_restarts_the_grace(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    m = Metrics()
    m.node(ids[0], now, restoring=lambda t: 1.0 if now - 600 <= t <= now - 480 else 0.0)
    m.node(ids[1], now)
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "grace" and "after a restore" in result["reason"], result


def test_a_checkpoint_in_the_window_means_progress_even_with_idle_gpus(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    cloud.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/step-000000000100/MANIFEST.json", Body=b"{}")
    m = Metrics()
    for i in ids:
        m.node(i, now, training=1.0)
    written = newest_checkpoint_time(cloud.s3, BUCKET, PREFIX)
    assert written is not None and abs(written - time.time()) < 120
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "busy" and "checkpoint completed" in result["reason"]


def test_a_hung_job_with_no_new_checkpoint_is_stopped(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    # Only an incomplete newer step (no manifest) and an old complete one: no progress in the window.
    cloud.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/step-000000000200/shard-0.pt", Body=b"x")
    m = Metrics()
    for i in ids:
        m.node(i, now, training=1.0)
    result = _run(cloud, ctl, topic, kw, now)
    assert result["stop"] and "makes no progress (no checkpoint yet)" in result["reason"], result


def test_notify_only_tells_and_keeps_the_nodes(cloud, topic):
    ctl, ids, now, kw = _setup(cloud, {"action": "notify"})
    m = Metrics()
    for i in ids:
        m.node(i, now)
    result = _run(cloud, ctl, topic, kw, now)
    assert result["stop"] and "stopped" not in result
    assert len(live_instances(cloud.raw)) == 2
    (msg,) = _messages(topic)
    assert "is idle and still running" in msg["Message"]


def test_a_silent_agent_is_not_idleness(cloud, topic):
    ctl, ids, now, kw = _setup(cloud)
    Metrics().node(ids[0], now)  # the second node sends nothing at all
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "no-data" and "0 of 8 GPUs" in result["reason"]


def test_settings_refuse_an_unknown_action_or_knob():
    with pytest.raises(ValueError, match="action 'delete'"):
        GuardSettings(job="j", topic_arn="t", expected_gpus={}, action="delete")
    with pytest.raises(TypeError, match="idle_minuets"):
        GuardSettings(job="j", topic_arn="t", expected_gpus={}, config={"idle_minuets": 3})
