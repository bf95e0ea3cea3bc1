"""The idle guard against an interactive cluster, in moto: the node monitor runs for real on
each simulated minute and counts a real `ssm-session-worker` process (the one the SSM agent
starts per session) and the processes a fake nvidia-smi lists on the GPUs; the CloudWatch
agent's GPU series go into moto CloudWatch; the guard reads them back, warns in the job's log
group and the topic, and only then stops.

The session worker is a copy of sleep(1) named as the agent names it; the monitor scans a /proc
made of links to this test's own processes only, so parallel tests cannot open sessions here."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import boto3
import pytest

from constructs_lib.fleet import idle_notice
from constructs_lib.fleet.idle_watch import GuardSettings, run_once
from constructs_lib.runtime import contract
from constructs_lib.runtime.monitor import Monitor

from .conftest import BUCKET, CLUSTER, REGION, live_instances
from .test_idle_watch import GPUS, Metrics

LOG_GROUP = contract.job_log_group(CLUSTER)
MIN = 60


class Node:
    """A simulated node's monitor, with a /proc of its own and an nvidia-smi that lists the pids
    in `gpu_pids` as compute apps."""

    def __init__(self, tmp: Path, instance: str, ec2, cw) -> None:
        self.dir = tmp / instance
        (self.dir / "proc").mkdir(parents=True)
        self.pids_file = self.dir / "gpu-pids"
        self.pids_file.write_text("")
        smi = self.dir / "nvidia-smi"
        gpus = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})" for i in range(GPUS))
        smi.write_text(f"#!/bin/bash\ncase \"$1\" in\n -L) cat <<'EOF'\n{gpus}\nEOF\n;;\n"
                       f" --query-compute-apps=pid) cat {self.pids_file};;\n *) exit 9;;\nesac\n")
        smi.chmod(0o755)
        self.instance = instance
        self.monitor = Monitor(cloudwatch=cw, ec2=ec2, instance_id=instance, job=CLUSTER, expected_gpus=GPUS,
                               gpu=True, nvidia_smi=str(smi), log=lambda line: None)
        self.sessions: list[subprocess.Popen] = []

    def open_session(self) -> None:
        worker = self.dir / "ssm-session-worker"
        shutil.copy("/bin/sleep", worker)
        p = subprocess.Popen([str(worker), "600"])
        (self.dir / "proc" / str(p.pid)).symlink_to(f"/proc/{p.pid}")
        self.sessions.append(p)

    def close_sessions(self) -> None:
        for p in self.sessions:
            p.terminate()
            p.wait(timeout=10)
        self.sessions = []

    def tick(self, at: float, monkeypatch) -> dict:
        monkeypatch.setenv("DL_MONITOR_PROC", str(self.dir / "proc"))
        return self.monitor.tick(now=at)


@pytest.fixture
def cluster(cloud, topic, tmp_path, monkeypatch):
    ctl = cloud.controller(cloud.spec(nodes=2))
    cloud.reconcile(ctl)
    launched = min(i["LaunchTime"].timestamp() for i in live_instances(cloud.raw))
    cw = boto3.client("cloudwatch", region_name=REGION)
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName=LOG_GROUP)
    nodes = [Node(tmp_path, i["InstanceId"], cloud.raw, cw) for i in live_instances(cloud.raw)]
    sns, arn, _, _ = topic
    settings = GuardSettings(job=CLUSTER, topic_arn=arn, expected_gpus={"p5.48xlarge": GPUS, "p5en.48xlarge": GPUS,
                                                                        "p4d.24xlarge": 8},
                             interactive=True, warning_minutes=15, state_bucket=BUCKET, job_log_group=LOG_GROUP,
                             config={"threshold_pct": 5.0, "idle_minutes": 30.0, "grace_minutes": 20.0})
    agent = Metrics()
    done = {"until": 0}

    def minutes(upto: int) -> None:
        """Every node's monitor and agent, each minute since the last call, up to launch + `upto` min."""
        for m in range(done["until"] + 1, upto + 1):
            for n in nodes:
                n.tick(launched + m * MIN, monkeypatch)
        for n in nodes:  # the agent's idle GPUs over the same minutes
            for g in range(GPUS):
                agent.put(contract.NS_NODE, contract.M_GPU_UTIL,
                          {contract.DIM_JOB: CLUSTER, contract.DIM_INSTANCE: n.instance, contract.DIM_GPU: str(g)},
                          [(launched + m * MIN, 0.5) for m in range(done["until"] + 1, upto + 1)])
        done["until"] = upto

    def guard(at_minute: int) -> dict:
        return run_once(cw=cw, ec2=cloud.raw, s3=cloud.s3, ssm=boto3.client("ssm", region_name=REGION), sns=sns,
                        logs=logs, settings=settings, controller=ctl, now=launched + at_minute * MIN,
                        push_timeout=5, poll=0)

    yield nodes, minutes, guard, logs, launched
    for n in nodes:
        n.close_sessions()


def messages(topic) -> list[dict]:
    _, _, sqs, url = topic
    out = []
    while True:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0, MaxNumberOfMessages=10).get("Messages", [])
        if not got:
            return out
        for m in got:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def guard_lines(logs) -> list[tuple[int, str]]:
    events = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=contract.GUARD_LOG_STREAM,
                                 startFromHead=True)["events"]
    return [(e["timestamp"], e["message"]) for e in events]


def test_an_open_session_keeps_the_cluster_and_idleness_after_it_closes_warns_then_stops(cluster, cloud, topic):
    nodes, minutes, guard, logs, launched = cluster
    nodes[0].open_session()
    minutes(40)
    held = guard(40)
    assert held["step"] == "none" and held["state"] == "busy", held
    assert "Session Manager session was open on " + nodes[0].instance in held["reason"]
    # The monitor counted the real process as one session, and then none once it closed.
    nodes[0].close_sessions()
    minutes(60)
    assert guard(60)["state"] == "busy", "a session 20 min ago is inside the 30-min window"
    assert messages(topic) == [] and len(live_instances(cloud.raw)) == 2

    minutes(71)
    warned = guard(71)
    assert warned["step"] == "warn" and warned["state"] == "idle" and not warned["stop"], warned
    assert warned["notice_failed"] == []
    assert warned["stop_at"] == pytest.approx(launched + 86 * MIN)
    assert len(live_instances(cloud.raw)) == 2, "a warning stops nothing"
    (warning,) = messages(topic)
    assert "will be stopped at" in warning["Subject"] and "open a session" in warning["Message"]
    ((logged_at, line),) = guard_lines(logs)
    assert line.startswith("[idle-guard]") and "will be stopped at" in line

    minutes(80)
    waiting = guard(80)
    assert waiting["step"] == "wait" and messages(topic) == [], "one warning, not one per run"
    record = idle_notice.load(cloud.s3, BUCKET, contract.guard_state_key(CLUSTER))
    assert record.act == "wait" and "stops at" in record.line(now=launched + 80 * MIN)
    assert "(6 min)" in record.line(now=launched + 80 * MIN)

    minutes(86)
    stopped = guard(86)
    assert stopped["step"] == "stop" and stopped["stopped"]["terminated"], stopped
    assert live_instances(cloud.raw) == []
    (stop,) = messages(topic)
    assert stop["Subject"] == f"dl-launcher: idle cluster {CLUSTER} stopped"
    assert logged_at <= (launched + 71 * MIN) * 1000, "the warning was in the log before the stop"
    after = idle_notice.load(cloud.s3, BUCKET, contract.guard_state_key(CLUSTER))
    assert after.act == "stop" and "stopped at" in after.line()


def test_a_process_on_a_gpu_after_the_warning_withdraws_it(cluster, cloud, topic):
    nodes, minutes, guard, logs, _ = cluster
    minutes(51)
    assert guard(51)["step"] == "warn"
    messages(topic)
    # Someone starts a notebook kernel that loads a model: nvidia-smi lists its pid.
    nodes[1].pids_file.write_text(f"{os.getpid()}\n")
    minutes(55)
    back = guard(55)
    assert back["step"] == "cancel" and back["state"] == "busy" and "held " + nodes[1].instance in back["reason"]
    (cancel,) = messages(topic)
    assert "withdrawn" in cancel["Message"]
    assert [m for _, m in guard_lines(logs)][-1].startswith("[idle-guard] dl-launcher idle guard: the warning")
    nodes[1].pids_file.write_text("")
    minutes(70)
    assert guard(70)["step"] == "none", "a process 15 min ago is still inside the window"
    minutes(86)
    assert guard(86)["step"] == "warn", "a fresh warning, a fresh 15 minutes"
    assert len(live_instances(cloud.raw)) == 2


def test_a_node_whose_monitor_stopped_reporting_sessions_is_never_stopped(cluster, cloud, topic):
    nodes, minutes, guard, _, _ = cluster
    minutes(30)
    nodes[0].monitor.cw = _Dead()  # the monitor's PutMetricData fails from here on
    minutes(60)
    held = guard(60)
    assert held["state"] == "no-data" and "open sessions" in held["reason"], held
    assert messages(topic) == [] and len(live_instances(cloud.raw)) == 2


class _Dead:
    def put_metric_data(self, **_):
        raise ConnectionError("endpoint unreachable")
