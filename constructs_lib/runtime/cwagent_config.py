"""The CloudWatch agent's configuration for a training node, as the agent documents it. Written on
the node at the monitor's start (`python -m constructs_lib.runtime cwagent-config`) from node.env
(the cluster, the SDK), so the user data carries none of it
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch-Agent-Configuration-File-Details.html,
"Collect NVIDIA GPU metrics": .../CloudWatch-Agent-NVIDIA-GPU.html).

What it sends, once a minute, to contract.NS_NODE:
- per GPU (the agent's nvidia_gpu section, which runs nvidia-smi): utilisation, memory used,
  power draw, temperature; the agent's own dimensions index, name and arch ride along;
- CPU active and iowait (all cores together), memory used, and the read bytes of the scratch
  array (md0, the instance-store RAID 0: the loader-bound signal).
Every metric carries the job (contract.DIM_JOB) and the node (contract.DIM_INSTANCE); the host
name is omitted (one series per node, not per boot name). `aggregation_dimensions` also
publishes each metric with the job alone (averaged over the node's GPUs or cores): CloudWatch
alarms cannot use SEARCH, and these job-wide series are what the alarms watch.

With a log group, the agent's logs section also ships the job's log file (the command's output,
setup's and the supervisor's lines: runtime/joblog.py) to that group, one stream per node named
by the agent's {instance_id}; a node without monitoring runs the agent for that alone.
"""
from __future__ import annotations

import json
from typing import Any

from . import contract

# What a Neuron node does not get: the agent reads NVIDIA GPUs through nvidia-smi only. Trainium
# and Inferentia have neuron-monitor, which this release does not wire to CloudWatch.
NOT_ON_NEURON = ("Trainium/Inferentia nodes send CPU, memory and disk metrics only: the agent's GPU section reads "
                 "nvidia-smi, and neuron-monitor is not wired to CloudWatch yet; the idle guard is off there")

GPU_MEASUREMENTS = ("utilization_gpu", "memory_used", "power_draw", "temperature_gpu")


def agent_config(*, job: str, scratch_device: str = "md0", gpu: bool = True,
                 interval: int = contract.METRIC_PERIOD, log_group: str | None = None,
                 log_file: str | None = None, metrics: bool = True) -> dict[str, Any]:
    """The agent's JSON configuration (as a dict) for a node of `job`: metrics, the job's log
    file to `log_group`, or both."""
    if not metrics and not log_group:
        raise ValueError("neither metrics nor a log group: the agent would have nothing to do")
    if not job or any(c in job for c in '"\\$'):
        raise ValueError(f"job {job!r}: a plain name (it becomes a metric dimension)")
    if not 1 <= interval <= 172800:
        raise ValueError(f"interval {interval}: seconds, 1 to 172800")
    job_dim = {contract.DIM_JOB: job}
    collected: dict[str, Any] = {
        "cpu": {"measurement": ["usage_active", "usage_iowait"], "totalcpu": True,
                "metrics_collection_interval": interval, "append_dimensions": job_dim},
        "mem": {"measurement": ["used_percent"], "metrics_collection_interval": interval,
                "append_dimensions": job_dim},
        "diskio": {"measurement": ["read_bytes"], "resources": [scratch_device],
                   "metrics_collection_interval": interval, "append_dimensions": job_dim},
    }
    if gpu:
        collected["nvidia_gpu"] = {"measurement": list(GPU_MEASUREMENTS), "metrics_collection_interval": interval,
                                   "append_dimensions": job_dim}
    config: dict[str, Any] = {
        "agent": {"metrics_collection_interval": interval, "omit_hostname": True,
                  "logfile": "/opt/aws/amazon-cloudwatch-agent/logs/amazon-cloudwatch-agent.log"},
    }
    if log_group:
        # By default the contract's default path: the SSM parameter's configuration is written at
        # synth, for every node.
        job_log = log_file or "/".join([contract.DIR_DEFAULTS[contract.FILES["job_log"][0]], contract.FILES["job_log"][1]])
        config["logs"] = {"force_flush_interval": 5, "logs_collected": {"files": {"collect_list": [{
            "file_path": job_log, "log_group_name": log_group, "log_stream_name": contract.LOG_STREAM,
            "timezone": "UTC"}]}}}
    if not metrics:
        return config
    config["metrics"] = {
        "namespace": contract.NS_NODE,
        "append_dimensions": {contract.DIM_INSTANCE: "${aws:InstanceId}"},
        # [Job]: one job-wide series per metric, for the alarms; [Job, InstanceId]: one per node
        # (GPUs or cores together), for the dashboard's per-node lines.
        "aggregation_dimensions": [[contract.DIM_JOB], [contract.DIM_JOB, contract.DIM_INSTANCE]],
        "metrics_collected": collected,
    }
    return config


def agent_config_json(**kw: Any) -> str:
    return json.dumps(agent_config(**kw), indent=1, sort_keys=True)


def write_for_node(path: str) -> str:
    """The node's configuration from its environment (node.env), written atomically to `path`."""
    import os

    from .layout import write_atomic

    job = os.environ.get("DL_CLUSTER", "")
    if not job:
        raise ValueError("DL_CLUSTER is not set: the agent's Job dimension comes from node.env")
    # Metrics where this node runs the monitor (its ExecStartPre runs the agent), the job's log
    # wherever node.env names a log group.
    units = os.environ.get("DL_UNITS")
    text = agent_config_json(job=job, gpu=os.environ.get("DL_SDK", "cuda") == "cuda",
                             scratch_device=os.environ.get("DL_SCRATCH_DEVICE", "md0"),
                             log_group=os.environ.get("DL_LOG_GROUP") or None, log_file=contract.path("job_log"),
                             metrics=units is None or "dl-monitor.service" in units.split())
    write_atomic(path, text)
    return text


def series_per_node(gpus: int, gpu: bool = True) -> tuple[int, int]:
    """Custom metric series the agent creates (per node, per cluster), as CloudWatch bills them
    (each name and dimension set is one metric): per GPU one series per measurement; per node the
    [Job, InstanceId] aggregate of each measurement (mem's raw series has exactly those dimensions,
    so it is the same one), plus the raw cpu-total and md0 series; per cluster the [Job] aggregate
    of each measurement."""
    gpu_series = len(GPU_MEASUREMENTS) * (gpus + 1) if gpu else 0
    cpu, mem, disk = 2 * 2, 1, 1 * 2
    return gpu_series + cpu + mem + disk, (len(GPU_MEASUREMENTS) if gpu else 0) + 2 + 1 + 1
