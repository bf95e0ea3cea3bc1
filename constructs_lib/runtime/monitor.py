"""The node monitor (dl-monitor.service): once a minute, this node's throughput, progress and GPU
health to CloudWatch (contract.NS_JOB), each metric twice: with the job and the node, and with
the job alone (what the alarms watch: alarms cannot search).

- M_SAMPLES: the mean samples_per_second of the dl-bench lines the job printed on this node in
  that minute (the line format of selector/bench/contract.py; the job's output is followed in
  the journal); nothing when it printed none.
- M_TRAINING / M_RESTORING: 1/0 from the supervisor's phase file (the training command's pid
  alive; a checkpoint restore under way). The idle guard reads both.
- M_GPUS: GPUs `nvidia-smi -L` lists; M_XID: hardware XID errors the kernel logged.

A node whose GPUs are broken (fewer listed than the catalog's count, or an XID that needs the
node replaced) writes health `failed` and tags itself contract.TAG_HEALTH = "replace: <why>"
once; the capacity controller replaces it. A failed PutMetricData is logged and its data sent
with the next minute's; nothing here ever stops the job.

Hooks (tests): DL_MONITOR_JOB_LOG, DL_MONITOR_KERNEL_LOG (commands whose output is followed),
DL_MONITOR_NVIDIA_SMI, DL_EXPECTED_GPUS, DL_SDK, DL_CLUSTER, DL_MONITOR_PERIOD.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import contract
from .agent import write_health

# NVIDIA's XID catalog (https://docs.nvidia.com/deploy/xid-errors/index.html): the errors that
# mean the GPU or its links are broken, not the program. 13, 31, 43, 45 and the like are what
# user code causes (an illegal address, a killed context): those never replace a node.
HARDWARE_XIDS = {
    48: "double-bit ECC error", 64: "ECC page retirement or row remapping failed", 74: "NVLink error",
    79: "the GPU has fallen off the bus", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[^)]*)\): (?P<xid>\d+)")
JOB_LOG = "journalctl --unit dl-job.service --follow --output cat --lines 0"
KERNEL_LOG = "journalctl --dmesg --follow --output cat --lines 0"
Log = Callable[[str], None]


@dataclass
class Minute:
    """What one period saw (the followers fill it from their threads)."""
    samples: list[float] = field(default_factory=list)
    xids: list[tuple[int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> tuple[list[float], list[tuple[int, str]]]:
        with self.lock:
            out = (self.samples, self.xids)
            self.samples, self.xids = [], []
            return out


def follow(command: str, on_line: Callable[[str], None], stop: threading.Event, log: Log) -> threading.Thread:
    """Run `command` and hand each output line to on_line until stop; restarted if it exits."""
    def run() -> None:
        while not stop.is_set():
            try:
                proc = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, errors="replace")
            except OSError as e:
                log(f"monitor: cannot run {command!r}: {e}")
                stop.wait(60)
                continue
            watcher = threading.Thread(target=lambda: (stop.wait(), proc.terminate()), daemon=True)
            watcher.start()
            for line in proc.stdout:
                on_line(line)
            proc.wait()
            stop.wait(5)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def on_job_line(minute: Minute) -> Callable[[str], None]:
    from selector.bench.contract import LineError, parse_line

    def handle(line: str) -> None:
        try:
            w = parse_line(line)
        except LineError:
            return
        if w is not None:
            with minute.lock:
                minute.samples.append(w.samples_per_second)
    return handle


def on_kernel_line(minute: Minute) -> Callable[[str], None]:
    def handle(line: str) -> None:
        m = XID_LINE.search(line)
        if m:
            with minute.lock:
                minute.xids.append((int(m.group("xid")), m.group("bus").strip()))
    return handle


def gpus_listed(command: str) -> Optional[int]:
    """GPUs `nvidia-smi -L` lists, or None when it cannot run (itself a sign of a broken driver)."""
    try:
        out = subprocess.run(shlex.split(command) + ["-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def phase() -> tuple[bool, bool]:
    """(training running, restoring) from the supervisor's phase file."""
    try:
        with open(contract.path("phase")) as f:
            p = json.load(f)
    except (OSError, ValueError):
        return False, False
    pid = p.get("pid")
    alive = False
    if p.get("phase") == "training" and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
    return alive, p.get("phase") == "restoring"


def broken(expected: int, listed: Optional[int], xids: list[tuple[int, str]]) -> Optional[str]:
    """Why this node must be replaced, or None."""
    hard = [(x, bus) for x, bus in xids if x in HARDWARE_XIDS]
    if hard:
        x, bus = hard[0]
        return f"XID {x} ({HARDWARE_XIDS[x]}) on GPU {bus or '?'}"
    if expected and listed is not None and listed < expected:
        return f"{listed} of {expected} GPUs listed by nvidia-smi"
    return None


class Monitor:
    def __init__(self, *, cloudwatch: Any, ec2: Any, instance_id: str, job: str, expected_gpus: int, gpu: bool,
                 nvidia_smi: str = "nvidia-smi", log: Log = print) -> None:
        self.cw, self.ec2 = cloudwatch, ec2
        self.instance_id, self.job = instance_id, job
        self.expected, self.gpu = expected_gpus, gpu
        self.nvidia_smi = nvidia_smi
        self.log = log
        self.minute = Minute()
        self.pending: list[dict[str, Any]] = []
        self.marked = self._already_marked()

    def _already_marked(self) -> bool:
        """A restarted monitor must not tag (and count) the same node twice."""
        try:
            tags = self.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [self.instance_id]},
                                                   {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
        except Exception as e:  # noqa: BLE001 - a read that fails only risks one extra tag
            self.log(f"monitor: cannot read this node's tags: {e}")
            return False
        return any(t["Value"].startswith(contract.HEALTH_REPLACE) for t in tags)

    def datum(self, name: str, value: float, at: float, unit: str = "None") -> list[dict[str, Any]]:
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        job = {"Name": contract.DIM_JOB, "Value": self.job}
        node = {"Name": contract.DIM_INSTANCE, "Value": self.instance_id}
        return [{"MetricName": name, "Timestamp": ts, "Value": value, "Unit": unit, "Dimensions": [job, node]},
                {"MetricName": name, "Timestamp": ts, "Value": value, "Unit": unit, "Dimensions": [job]}]

    def tick(self, now: Optional[float] = None) -> dict[str, Any]:
        """One period: measure, mark the node if broken, publish. Returns what it measured."""
        now = time.time() if now is None else now
        samples, xids = self.minute.take()
        training, restoring = phase()
        data = []
        seen: dict[str, Any] = {"training": training, "restoring": restoring, "xids": [x for x, _ in xids]}
        if samples:
            seen["samples_per_second"] = sum(samples) / len(samples)
            data += self.datum(contract.M_SAMPLES, seen["samples_per_second"], now, "Count/Second")
        data += self.datum(contract.M_TRAINING, 1.0 if training else 0.0, now)
        data += self.datum(contract.M_RESTORING, 1.0 if restoring else 0.0, now)
        listed = None
        if self.gpu:
            listed = gpus_listed(self.nvidia_smi)
            seen["gpus"] = listed
            data += self.datum(contract.M_GPUS, float(listed or 0), now, "Count")
            data += self.datum(contract.M_XID, float(sum(1 for x, _ in xids if x in HARDWARE_XIDS)), now, "Count")
        why = broken(self.expected, listed, xids) if self.gpu else None
        if why:
            seen["broken"] = why
            self.mark(why)
        self.publish(data)
        return seen

    def mark(self, why: str) -> None:
        write_health("gpu", "failed", f"{why}: this node is to be replaced")
        if self.marked:
            return
        try:
            self.ec2.create_tags(Resources=[self.instance_id],
                                 Tags=[{"Key": contract.TAG_HEALTH, "Value": f"{contract.HEALTH_REPLACE}: {why}"[:255]}])
            self.marked = True
            self.log(f"monitor: {why}: tagged {contract.TAG_HEALTH} for replacement")
        except Exception as e:  # noqa: BLE001 - tried again next minute
            self.log(f"monitor: {why}, but tagging this node failed: {e}")

    def publish(self, data: list[dict[str, Any]]) -> None:
        batch = self.pending + data
        self.pending = []
        for i in range(0, len(batch), 500):  # PutMetricData's most per request is 1000
            part = batch[i:i + 500]
            try:
                self.cw.put_metric_data(Namespace=contract.NS_JOB, MetricData=part)
            except Exception as e:  # noqa: BLE001 - kept for the next minute, at most an hour of it
                self.log(f"monitor: PutMetricData failed ({e}); kept for the next try")
                self.pending = (self.pending + part)[-120 * 8:]


def run(*, period: float = contract.METRIC_PERIOD, stop: Optional[threading.Event] = None, ticks: Optional[int] = None,
        monitor: Optional[Monitor] = None, log: Log = print) -> int:
    """The service's loop (ticks: stop after that many, for tests)."""
    stop = stop or threading.Event()
    if monitor is None:
        monitor = _from_node(log)
    follow(os.environ.get("DL_MONITOR_JOB_LOG", JOB_LOG), on_job_line(monitor.minute), stop, log)
    if monitor.gpu:
        follow(os.environ.get("DL_MONITOR_KERNEL_LOG", KERNEL_LOG), on_kernel_line(monitor.minute), stop, log)
    done = 0
    try:
        while not stop.wait(period):
            try:
                monitor.tick()
            except Exception as e:  # noqa: BLE001 - a bad minute must not end monitoring
                log(f"monitor: {type(e).__name__}: {e}")
            done += 1
            if ticks is not None and done >= ticks:
                break
    finally:
        stop.set()
    return 0


def _from_node(log: Log) -> Monitor:
    import boto3

    from .imds import Imds

    instance_id = Imds().instance_id()
    if not instance_id:
        raise RuntimeError("monitor: no instance id from IMDS (not on EC2?)")
    region = os.environ.get("DL_REGION") or None
    sdk = os.environ.get("DL_SDK", "cuda")
    return Monitor(cloudwatch=boto3.client("cloudwatch", region_name=region), ec2=boto3.client("ec2", region_name=region),
                   instance_id=instance_id, job=os.environ["DL_CLUSTER"], expected_gpus=int(os.environ.get("DL_EXPECTED_GPUS", "0")),
                   gpu=sdk == "cuda", nvidia_smi=os.environ.get("DL_MONITOR_NVIDIA_SMI", "nvidia-smi"), log=log)
