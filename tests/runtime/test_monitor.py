"""The node monitor for real: fake journal, kernel log and nvidia-smi as shell programs on this
machine, the supervisor's phase file, and moto's CloudWatch and EC2 read back. A hardware XID
or a missing GPU tags the node once (a restarted monitor does not tag again); an application
XID does not; a failing PutMetricData never stops the loop and its data goes out later; the
CLI entry runs as systemd would start it, against moto_server and a fake IMDS."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest

from constructs_lib.runtime import contract
from constructs_lib.runtime.monitor import Minute, Monitor, follow, on_kernel_line, run
from tests.runtime.fake_imds import FakeImds

JOB = "dl-llm"
ROOT = Path(__file__).resolve().parents[2]
XID_79 = "NVRM: Xid (PCI:0000:a8:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:10:1c): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0)"


def program(tmp_path: Path, name: str, text: str) -> str:
    """A shell program that prints `text` and then waits (as `journalctl --follow` does)."""
    path = tmp_path / name
    path.write_text(f"#!/bin/bash\ncat <<'EOF'\n{text}\nEOF\nexec sleep 30\n")
    path.chmod(0o755)
    return str(path)


def nvidia_smi(tmp_path: Path, gpus: int, also: str = "", rc: int = 0) -> str:
    """`nvidia-smi -L` listing `gpus` GPUs, then `also`, exiting with rc."""
    path = tmp_path / "nvidia-smi"
    lines = "\n".join([f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})" for i in range(gpus)] + ([also] if also else []))
    path.write_text(f"#!/bin/bash\n[ \"$1\" = -L ] || exit 9\ncat <<'EOF'\n{lines}\nEOF\nexit {rc}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def node(aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                 InstanceType="p5.48xlarge")["Instances"][0]["InstanceId"]
    return ec2, boto3.client("cloudwatch", region_name="us-east-1"), instance


def set_phase(phase: str, pid=None):
    os.makedirs(os.path.dirname(contract.path("phase")), exist_ok=True)
    Path(contract.path("phase")).write_text(json.dumps({"phase": phase, "pid": pid, "since": 0}))


def values(cw, name: str, instance: str | None):
    dims = [{"Name": contract.DIM_JOB, "Value": JOB}]
    if instance:
        dims.append({"Name": contract.DIM_INSTANCE, "Value": instance})
    now = datetime.now(timezone.utc)
    r = cw.get_metric_data(MetricDataQueries=[{"Id": "q", "MetricStat": {
        "Metric": {"Namespace": contract.NS_JOB, "MetricName": name, "Dimensions": dims},
        "Period": 60, "Stat": "Maximum"}}], StartTime=now - timedelta(minutes=10), EndTime=now + timedelta(minutes=1))
    return r["MetricDataResults"][0]["Values"]


def total(cw, name: str, instance: str) -> float:
    """The Sum of a metric over the last half hour, in one bucket."""
    now = datetime.now(timezone.utc)
    dims = [{"Name": contract.DIM_JOB, "Value": JOB}, {"Name": contract.DIM_INSTANCE, "Value": instance}]
    points = cw.get_metric_statistics(Namespace=contract.NS_JOB, MetricName=name, Dimensions=dims,
                                      StartTime=now - timedelta(minutes=30), EndTime=now + timedelta(minutes=30),
                                      Period=3600, Statistics=["Sum"])["Datapoints"]
    return sum(p["Sum"] for p in points)


def health_tags(ec2, instance):
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]}])["Tags"]
    return [t["Value"] for t in tags if t["Key"] == contract.TAG_HEALTH]


def monitor_for(node, tmp_path, gpus=8, **kw):
    ec2, cw, instance = node
    return Monitor(cloudwatch=kw.pop("cloudwatch", cw), ec2=ec2, instance_id=instance, job=JOB, expected_gpus=8, gpu=True,
                   nvidia_smi=kw.pop("smi", None) or nvidia_smi(tmp_path, gpus), log=kw.pop("log", print))


def gpu_health() -> str:
    return Path(contract.path("health_dir"), "gpu").read_text()


def run_for(monitor, monkeypatch, tmp_path, job_log="", kernel_log="", ticks=1):
    monkeypatch.setenv("DL_MONITOR_JOB_LOG", program(tmp_path, "job-log", job_log))
    monkeypatch.setenv("DL_MONITOR_KERNEL_LOG", program(tmp_path, "kernel-log", kernel_log))
    stop = threading.Event()
    # The first period leaves the followers time to start and print.
    assert run(period=1.5, stop=stop, ticks=ticks, monitor=monitor) == 0


def test_throughput_progress_and_gpus_reach_cloudwatch(node, tmp_path, monkeypatch):
    ec2, cw, instance = node
    set_phase("training", os.getpid())
    log = "\n".join(["epoch 3 loss 1.93",
                     "dl-bench samples_per_second=100.0 window=1 samples=800 seconds=8.0",
                     "dl-bench samples_per_second=300.0 window=2",
                     "dl-bench samples_per_second=oops"])
    run_for(monitor_for(node, tmp_path), monkeypatch, tmp_path, job_log=log)
    for dims in (instance, None):  # per node, and job-wide for the alarms
        assert values(cw, contract.M_SAMPLES, dims) == [200.0]
        assert values(cw, contract.M_TRAINING, dims) == [1.0]
        assert values(cw, contract.M_RESTORING, dims) == [0.0]
        assert values(cw, contract.M_GPUS, dims) == [8.0]
        assert values(cw, contract.M_XID, dims) == [0.0]
    assert health_tags(ec2, instance) == []


def test_phases_restoring_and_a_dead_training_pid(node, tmp_path):
    _, cw, instance = node
    m = monitor_for(node, tmp_path)
    set_phase("restoring")
    assert m.tick()["restoring"] is True
    set_phase("staging")  # the job's data onto scratch: work too, which the idle guard must not stop
    assert m.tick()["restoring"] is True
    dead = subprocess.Popen(["true"])
    dead.wait()
    set_phase("training", dead.pid)
    seen = m.tick()
    assert seen["training"] is False and seen["restoring"] is False and "samples_per_second" not in seen


def test_a_hardware_xid_tags_the_node_once_and_counts_once_across_a_restart(node, tmp_path, monkeypatch):
    ec2, cw, instance = node
    set_phase("training", os.getpid())
    run_for(monitor_for(node, tmp_path), monkeypatch, tmp_path, kernel_log=XID_79)
    (tag,) = health_tags(ec2, instance)
    assert tag.startswith("replace: XID 79 (the GPU has fallen off the bus) on GPU 0000:a8:00")
    assert values(cw, contract.M_XID, instance) == [1.0]
    assert gpu_health().startswith("failed XID 79")
    # systemd restarts the monitor: the kernel log of this boot is read again from its start.
    calls = []
    again = monitor_for(node, tmp_path)
    assert again.marked, "the restarted monitor reads the tag it set before"
    again.ec2 = type("Recording", (), {"create_tags": lambda self, **kw: calls.append(kw)})()
    run_for(again, monkeypatch, tmp_path, kernel_log=XID_79)
    assert calls == [], "tagged once"
    assert gpu_health().startswith("failed XID 79"), "still broken: the XID happened this boot"
    assert total(cw, contract.M_XID, instance) == 1.0, "the replayed line is not counted again"


def test_an_xid_logged_while_the_monitor_was_down_still_marks_the_node(node, tmp_path, monkeypatch):
    ec2, cw, instance = node
    # Earlier in this boot: an application error, then the hardware one; the monitor starts after both.
    run_for(monitor_for(node, tmp_path), monkeypatch, tmp_path, kernel_log=f"{XID_13}\n{XID_79}")
    assert health_tags(ec2, instance) == ["replace: XID 79 (the GPU has fallen off the bus) on GPU 0000:a8:00"]
    assert total(cw, contract.M_XID, instance) == 1.0


def test_the_kernel_log_follower_restarting_replays_without_counting_twice(tmp_path):
    """journalctl exiting (and replaying the boot when run again) within one monitor's life."""
    runs = tmp_path / "runs"
    cmd = tmp_path / "kernel-log"
    cmd.write_text(f"#!/bin/bash\necho run >> {runs}\ncat <<'EOF'\n{XID_79}\nEOF\n")
    cmd.chmod(0o755)
    minute, stop = Minute(), threading.Event()
    follow(str(cmd), on_kernel_line(minute), stop, print, restart_after=0.1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not runs.exists() or len(runs.read_text().split()) < 3):
        time.sleep(0.05)
    stop.set()
    time.sleep(0.2)
    _, xids, published = minute.take()
    assert len(xids) >= 3 and published == 1
    assert [new for _, _, new in xids][:3] == [True, False, False]


def test_a_command_that_keeps_exiting_leaves_no_threads_behind(tmp_path):
    stop = threading.Event()
    before = threading.active_count()
    follow("true", lambda: (lambda line: None), stop, print, restart_after=0.02)
    time.sleep(2)  # dozens of runs
    assert threading.active_count() <= before + 2
    stop.set()


def test_an_application_xid_does_not_replace_the_node(node, tmp_path, monkeypatch):
    ec2, cw, instance = node
    run_for(monitor_for(node, tmp_path), monkeypatch, tmp_path, kernel_log=XID_13)
    assert health_tags(ec2, instance) == [] and values(cw, contract.M_XID, instance) == [0.0]


def test_a_missing_gpu_tags_the_node(node, tmp_path):
    ec2, _, instance = node
    seen = monitor_for(node, tmp_path, gpus=7).tick()
    assert seen["broken"] == "7 of 8 GPUs listed by nvidia-smi"
    assert health_tags(ec2, instance) == ["replace: 7 of 8 GPUs listed by nvidia-smi"]


def test_a_lost_gpu_that_makes_nvidia_smi_fail_still_counts_the_others(node, tmp_path):
    ec2, _, instance = node
    smi = nvidia_smi(tmp_path, 7, also="Unable to determine the device handle for GPU0000:A8:00.0: Unknown Error", rc=255)
    seen = monitor_for(node, tmp_path, smi=smi).tick()
    assert seen["gpus"] == 7
    assert health_tags(ec2, instance) == ["replace: 7 of 8 GPUs listed by nvidia-smi"]


def test_nvidia_smi_failing_outright_is_degraded_not_a_replacement(node, tmp_path):
    ec2, cw, instance = node
    smi = nvidia_smi(tmp_path, 0, rc=9, also="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                            "driver. Make sure that the latest NVIDIA driver is installed and running.")
    seen = monitor_for(node, tmp_path, smi=smi).tick()
    assert seen["gpus"] is None and "broken" not in seen
    assert health_tags(ec2, instance) == []
    assert gpu_health().startswith("degraded")
    assert cw.list_metrics(Namespace=contract.NS_JOB, MetricName=contract.M_GPUS)["Metrics"] == [], "unknown is not 0"
    assert values(cw, contract.M_XID, instance) == [0.0]


def test_a_healthy_node_says_so(node, tmp_path):
    monitor_for(node, tmp_path).tick()
    assert gpu_health() == "ok 8 GPUs listed of 8\n"


def test_cloudwatch_failures_never_stop_the_loop_and_the_data_goes_out_later(node, tmp_path):
    ec2, cw, instance = node

    class Flaky:
        fails = 2

        def put_metric_data(self, **kw):
            if Flaky.fails:
                Flaky.fails -= 1
                raise RuntimeError("An error occurred (Throttling) when calling the PutMetricData operation")
            return cw.put_metric_data(**kw)

    lines = []
    m = monitor_for(node, tmp_path, cloudwatch=Flaky(), log=lines.append)
    set_phase("training", os.getpid())
    now = datetime.now(timezone.utc).timestamp()
    for i in range(3):
        m.tick(now - 120 + 60 * i)
    assert sum("PutMetricData failed" in x for x in lines) == 2
    assert values(cw, contract.M_TRAINING, instance) == [1.0, 1.0, 1.0] and m.pending == []


def test_the_service_command_runs_against_moto_server(tmp_path, s3env, monkeypatch):
    """`python -m constructs_lib.runtime monitor` as the unit starts it: IMDS for the node's id."""
    ec2 = boto3.client("ec2")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    imds = FakeImds(instance_id=instance).start()
    try:
        env = {**s3env, "DL_IMDS_ENDPOINT": imds.endpoint, "DL_CLUSTER": JOB, "DL_EXPECTED_GPUS": "8",
               "DL_SDK": "cuda", "DL_MONITOR_NVIDIA_SMI": nvidia_smi(tmp_path, 6), "DL_MONITOR_PERIOD": "1",
               "DL_MONITOR_JOB_LOG": program(tmp_path, "job-log", "dl-bench samples_per_second=42"),
               "DL_MONITOR_KERNEL_LOG": program(tmp_path, "kernel-log", ""),
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "constructs_lib.runtime", "monitor"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = datetime.now().timestamp() + 30
            while datetime.now().timestamp() < deadline and not health_tags(ec2, instance):
                threading.Event().wait(0.5)
        finally:
            proc.terminate()
            out = proc.communicate(timeout=10)[0]
    finally:
        imds.stop()
    assert health_tags(ec2, instance) == ["replace: 6 of 8 GPUs listed by nvidia-smi"], out
    names = {m["MetricName"] for m in boto3.client("cloudwatch").list_metrics(Namespace=contract.NS_JOB)["Metrics"]}
    assert {contract.M_SAMPLES, contract.M_GPUS, contract.M_TRAINING} <= names, out
