"""The node monitor (dl-monitor.service): once a minute, this node's throughput, progress and GPU
health to CloudWatch (contract.NS_JOB), each metric twice: with the job and the node, and with
the job alone (what the alarms watch: alarms cannot search).

- M_SAMPLES: the mean samples_per_second of the dl-bench lines the job printed on this node in
  that minute (the line format of dl_selector/bench/contract.py; the job's output is followed in
  the journal); nothing when it printed none.
- M_TRAINING / M_RESTORING: 1/0 from the supervisor's phase file (the training command's pid
  alive; a checkpoint restore under way). The idle guard reads both.
- M_GPUS: GPUs `nvidia-smi -L` lists; M_XID: hardware XID errors the kernel logged.
- M_NEURON_UTIL (Trainium/Inferentia): the busiest NeuronCore that minute, from `neuron-monitor`'s
  reports (runtime/neuron.py); nothing when it reported nothing. The idle guard reads it there.
- M_SESSIONS: Session Manager sessions open on the node (the SSM agent runs one
  `ssm-session-worker` process per session, shell or port forward); M_GPU_PROCESSES: processes
  holding a CUDA context (`nvidia-smi --query-compute-apps`). An interactive cluster's idle guard
  counts either as someone at work.

A node whose GPUs are broken (fewer listed than the catalog's count, or an XID that needs the
node replaced) writes health `failed` and tags itself contract.TAG_HEALTH = "replace: <why>"
once; the capacity controller replaces it. A failed PutMetricData is logged and its data sent
with the next minute's; nothing here ever stops the job.

The kernel log is read from the start of this boot every time it is (re)started, so a hardware
XID logged while the monitor was down (or before it first started) still marks the node; the
number of hardware XID lines already published this boot is kept in the contract's
monitor_state file (DL_RUN_DIR, gone at reboot like the boot's kernel log), so M_XID counts
each line once. nvidia-smi failing outright (the driver down on every GPU) is health
`degraded` and no M_GPUS datum, not a replacement: a node whose GPUs cannot be counted is not
known to be short of any.

Hooks (tests): DL_MONITOR_PROC (the /proc to scan), DL_MONITOR_JOB_LOG, DL_MONITOR_KERNEL_LOG (commands whose output is followed),
DL_MONITOR_NVIDIA_SMI, DL_MONITOR_NEURON, DL_EXPECTED_GPUS, DL_SDK, DL_CLUSTER, DL_MONITOR_PERIOD.
What each probe reads on the node (nvidia-smi, /proc, the phase file, the XID catalog): node_probes.py.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import contract
from .agent import write_health
from .node_probes import HARDWARE_XIDS, XID_LINE, broken, gpu_processes, gpus_listed, phase, sessions_open

# journalctl(1) (https://manpages.ubuntu.com/manpages/jammy/man1/journalctl.1.html): --dmesg is
# the kernel log of the current boot; --no-tail shows all of it even with --follow (which
# otherwise starts at the last 10 lines); --lines 0 only what comes next.
JOB_LOG = "journalctl --unit dl-job.service --follow --output cat --lines 0"
KERNEL_LOG = "journalctl --dmesg --follow --no-tail --output cat"
Log = Callable[[str], None]
Handler = Callable[[str], None]


@dataclass
class Minute:
    """What one period saw (the followers fill it from their threads). xids: (xid, GPU bus id,
    new: not published before this boot); published: hardware XID lines of this boot counted in
    M_XID so far (the kernel follower's replays are not counted again)."""
    samples: list[float] = field(default_factory=list)
    xids: list[tuple[int, str, bool]] = field(default_factory=list)
    published: int = 0
    neuron: list[float] = field(default_factory=list)  # each neuron-monitor report's busiest NeuronCore
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_neuron(self, value: float) -> None:
        with self.lock:
            self.neuron.append(value)

    def take_neuron(self) -> list[float]:
        with self.lock:
            out, self.neuron = self.neuron, []
            return out

    def take(self) -> tuple[list[float], list[tuple[int, str, bool]], int]:
        """This period's samples and XIDs, and `published` as of them (together, under the lock)."""
        with self.lock:
            out = (self.samples, self.xids, self.published)
            self.samples, self.xids = [], []
            return out


def follow(command: str, handler: Callable[[], Handler], stop: threading.Event, log: Log,
           restart_after: float = 5.0) -> threading.Thread:
    """Run `command` and hand each output line to a handler until stop; restarted (with a new
    handler from `handler()`, as its output starts over) if it exits."""
    running: list[subprocess.Popen] = []

    def stopper() -> None:  # one for the follower's life: nothing piles up if the command keeps exiting
        stop.wait()
        for proc in running:
            proc.terminate()

    def run() -> None:
        while not stop.is_set():
            try:
                proc = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, errors="replace")
            except OSError as e:
                log(f"monitor: cannot run {command!r}: {e}")
                stop.wait(60)
                continue
            running[:] = [proc]
            if stop.is_set():  # stop came between the loop's test and the start
                proc.terminate()
            on_line = handler()
            for line in proc.stdout:
                on_line(line)
            proc.wait()
            stop.wait(restart_after)
    threading.Thread(target=stopper, daemon=True).start()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def on_job_line(minute: Minute) -> Callable[[], Handler]:
    from dl_core.benchline import LineError, parse_line

    def handle(line: str) -> None:
        try:
            w = parse_line(line)
        except LineError:
            return
        if w is not None:
            with minute.lock:
                minute.samples.append(w.samples_per_second)
    return lambda: handle


def on_kernel_line(minute: Minute) -> Callable[[], Handler]:
    """A handler per run of the kernel log command: each run replays the boot from its start, so
    its n-th hardware XID line is new only past the minute.published already counted."""
    def start() -> Handler:
        hardware = 0

        def handle(line: str) -> None:
            nonlocal hardware
            m = XID_LINE.search(line)
            if not m:
                return
            xid = int(m.group("xid"))
            with minute.lock:
                new = True
                if xid in HARDWARE_XIDS:
                    hardware += 1
                    new = hardware > minute.published
                    minute.published = max(minute.published, hardware)
                minute.xids.append((xid, m.group("bus").strip(), new))
        return handle
    return start


# What tick() publishes, each with [Job, InstanceId] and [Job] (the cost model counts these).
PUBLISHED = (contract.M_SAMPLES, contract.M_TRAINING, contract.M_RESTORING, contract.M_SESSIONS)
PUBLISHED_GPU = (contract.M_GPUS, contract.M_XID, contract.M_GPU_PROCESSES)


class Monitor:
    def __init__(self, *, cloudwatch: Any, ec2: Any, instance_id: str, job: str, expected_gpus: int, gpu: bool,
                 nvidia_smi: str = "nvidia-smi", log: Log = print, neuron: bool = False) -> None:
        self.cw, self.ec2 = cloudwatch, ec2
        self.neuron = neuron
        self.instance_id, self.job = instance_id, job
        self.expected, self.gpu = expected_gpus, gpu
        self.nvidia_smi = nvidia_smi
        self.log = log
        self.saved = self._load_published()  # hardware XID lines of this boot already counted, as saved
        self.minute = Minute(published=self.saved)
        self.pending: list[dict[str, Any]] = []
        self.why: Optional[str] = None  # once broken, broken until replaced
        self.marked = self._already_marked()

    @staticmethod
    def _load_published() -> int:
        try:
            with open(contract.path("monitor_state")) as f:
                return int(json.load(f).get("xid_lines_published", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            return 0

    def _save_published(self, n: int) -> None:
        from .layout import write_atomic

        try:
            write_atomic(contract.path("monitor_state"), json.dumps({"xid_lines_published": n}))
            self.saved = n
        except OSError as e:  # a restart may count these lines again: only the metric is off
            self.log(f"monitor: cannot save {contract.path('monitor_state')}: {e}")

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
        samples, xids, published = self.minute.take()
        training, restoring = phase()
        data = []
        seen: dict[str, Any] = {"training": training, "restoring": restoring, "xids": [x for x, _, _ in xids]}
        if samples:
            seen["samples_per_second"] = sum(samples) / len(samples)
            data += self.datum(contract.M_SAMPLES, seen["samples_per_second"], now, "Count/Second")
        data += self.datum(contract.M_TRAINING, 1.0 if training else 0.0, now)
        data += self.datum(contract.M_RESTORING, 1.0 if restoring else 0.0, now)
        seen["sessions"] = sessions_open(os.environ.get("DL_MONITOR_PROC", "/proc"))
        data += self.datum(contract.M_SESSIONS, float(seen["sessions"]), now, "Count")
        busiest = self.minute.take_neuron()
        if self.neuron and busiest:  # no report this minute: no datum (a gap the guard never takes for idle)
            seen["neuron_util"] = max(busiest)
            data += self.datum(contract.M_NEURON_UTIL, seen["neuron_util"], now, "Percent")
        listed = None
        if self.gpu:
            procs = gpu_processes(self.nvidia_smi)
            if procs is not None:  # unknown is not zero
                seen["gpu_processes"] = procs
                data += self.datum(contract.M_GPU_PROCESSES, float(procs), now, "Count")
            listed = gpus_listed(self.nvidia_smi)
            seen["gpus"] = listed
            if listed is not None:  # unknown is not zero
                data += self.datum(contract.M_GPUS, float(listed), now, "Count")
            new_hardware = sum(1 for x, _, new in xids if new and x in HARDWARE_XIDS)
            data += self.datum(contract.M_XID, float(new_hardware), now, "Count")
            self.why = self.why or broken(self.expected, listed, xids)
            if self.why:
                seen["broken"] = self.why
                self.mark(self.why)
            elif listed is None:
                write_health("gpu", "degraded", f"`{self.nvidia_smi} -L` failed: GPUs not counted this minute")
            else:
                write_health("gpu", "ok", f"{listed} GPUs listed" + (f" of {self.expected}" if self.expected else ""))
        self.publish(data)
        # After the publish attempt: a failed one keeps its data in self.pending, not lost.
        if published != self.saved:
            self._save_published(published)
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
    if monitor.neuron:
        from .neuron import NEURON_MONITOR, on_report_line
        follow(os.environ.get("DL_MONITOR_NEURON", NEURON_MONITOR), on_report_line(monitor.minute.add_neuron), stop, log)
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

    import http.client

    from .errors import ImdsUnavailable, RuntimeUserError
    from .imds import Imds

    imds = Imds.on_node()
    try:
        instance_id = imds.instance_id()
    except ImdsUnavailable:
        raise
    except (OSError, http.client.HTTPException) as e:
        reason = " ".join(str(getattr(e, "reason", None) or e).split()) or type(e).__name__
        raise RuntimeUserError(f"this is not a dl-launcher node: no instance metadata (IMDSv2) at {imds.endpoint} "
                               f"({reason}); the monitor runs on a node, as dl-monitor.service") from None
    if not instance_id:
        raise RuntimeUserError("monitor: no instance id from IMDS: the monitor runs on a node, as dl-monitor.service")
    job = os.environ.get("DL_CLUSTER", "")
    if not job:
        raise RuntimeUserError("monitor: DL_CLUSTER is not set in node.env: the metrics' Job dimension comes from it")
    try:
        expected = int(os.environ.get("DL_EXPECTED_GPUS") or "0")
    except ValueError:
        log(f"monitor: DL_EXPECTED_GPUS={os.environ['DL_EXPECTED_GPUS']!r} is not a count: GPUs not compared")
        expected = 0
    region = os.environ.get("DL_REGION") or None
    sdk = os.environ.get("DL_SDK", "cuda")
    return Monitor(cloudwatch=boto3.client("cloudwatch", region_name=region), ec2=boto3.client("ec2", region_name=region),
                   instance_id=instance_id, job=job, expected_gpus=expected,
                   gpu=sdk == "cuda", nvidia_smi=os.environ.get("DL_MONITOR_NVIDIA_SMI", "nvidia-smi"), log=log,
                   neuron=sdk == "neuron")
