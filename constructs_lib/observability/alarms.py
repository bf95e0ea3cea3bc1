"""Alarms on a training job: starved GPUs (with the remedy) and broken nodes.

A CloudWatch alarm cannot watch a SEARCH expression: it returns many series and a metric-math
alarm watches one
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/using-search-expressions.html).
The node instance ids are not known at synth, so each alarm's metric math reads the job-wide
series, which carry the Job dimension alone: the CloudWatch agent publishes them through its
`aggregation_dimensions` `[["Job"], ...]` (every node's values land in the one series:
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch-Agent-Configuration-File-Details.html)
and the node monitor sends each datum with {Job} as well as {Job, InstanceId}.
Alarms on a Metrics Insights query (SELECT AVG(...) FROM SCHEMA(...) WHERE Job = '...') are
documented too and would need no aggregates, but their number per Region is capped (75 in the user
guide's "Metrics Insights limits" when this was written); metric math on the aggregates is not.

Comparison and logical operators turn series into 0/1 series (the user guide's "Comparison and
logical operators", https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/using-metric-math.html),
so each alarm watches a 0/1 condition against the threshold 1. Where one side of AND/OR has no
value CloudWatch counts it as 0, and a missing data point is not breaching: a stopped or silent
cluster never alarms.
"""
from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cw
import aws_cdk.aws_cloudwatch_actions as actions
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
from constructs import Construct

from ..runtime import contract

STARVED_REMEDY = (
    "The job's GPUs averaged under {gpu:g}% while every node was training and the CPUs ran over {cpu:g}% "
    "or waited on the disk over {iowait:g}% of the time, for {minutes:g} minutes: the data pipeline holds the "
    "GPUs back. Storage-bound (iowait high): stage the data set on the NVMe RAID at /scratch (or cache it in "
    "memory) instead of reading it from S3, EFS or EBS during training. CPU-bound (CPU active high): more "
    "data-loader workers (num_workers), decode on the GPU (DALI), or a size with more vCPUs per GPU "
    "(python -m dl_selector recommend lists them). The dashboard's third row shows which.")


def job_metric(namespace: str, metric: str, job: str, statistic: str, period: cdk.Duration) -> cw.Metric:
    """The job-wide series of `metric` (the Job dimension alone)."""
    return cw.Metric(namespace=namespace, metric_name=metric, dimensions_map={contract.DIM_JOB: job},
                     statistic=statistic, period=period)


def _alarm(scope: Construct, condition: cw.MathExpression, *, periods: int, description: str,
           topic: Optional[sns.ITopic]) -> cw.Alarm:
    alarm = condition.create_alarm(
        scope, "Alarm", threshold=1, evaluation_periods=periods, datapoints_to_alarm=periods,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)
    if topic is not None:
        # SnsAction is an IAlarmAction whose jsii stub names bind's parameters differently (aws/jsii#4541).
        alarm.add_alarm_action(actions.SnsAction(topic))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
    return alarm


class StarvedGpuAlarm(Construct):
    """ALARM when the job's GPUs are starved by their input pipeline: mean GPU utilisation under
    `gpu_below_pct` while every node runs the training command AND (CPU active over `cpu_above_pct`
    OR CPU iowait over `iowait_above_pct`), for `periods` consecutive periods. The training gate
    keeps restores and the time between generations (GPUs idle, disks busy) out of it.

    Keyword-only props (defaults in brackets):
      job: the cluster id (the Job dimension).
      gpu_below_pct [50], cpu_above_pct [90], iowait_above_pct [20]: percent.
      period [5 minutes], periods [3]: 15 minutes in all.
      topic [None]: told on ALARM.
    Attributes: alarm (cloudwatch.Alarm), condition (the MathExpression it watches).
    """

    def __init__(self, scope: Construct, construct_id: str, *, job: str, gpu_below_pct: float = 50.0,
                 cpu_above_pct: float = 90.0, iowait_above_pct: float = 20.0,
                 period: cdk.Duration = cdk.Duration.minutes(5), periods: int = 3,
                 topic: Optional[sns.ITopic] = None) -> None:
        super().__init__(scope, construct_id)
        for name, pct in (("gpu_below_pct", gpu_below_pct), ("cpu_above_pct", cpu_above_pct),
                          ("iowait_above_pct", iowait_above_pct)):
            if not 0 < pct < 100:
                raise ValueError(f"{name} {pct:g}: a percentage between 0 and 100")
        if periods < 1:
            raise ValueError(f"periods {periods}: at least 1")
        node = contract.NS_NODE
        self.condition = cw.MathExpression(
            expression=(f"training >= 1 AND gpu < {gpu_below_pct:g} AND "
                        f"(cpu > {cpu_above_pct:g} OR iowait > {iowait_above_pct:g})"),
            using_metrics={
                "gpu": job_metric(node, contract.M_GPU_UTIL, job, "Average", period),
                "cpu": job_metric(node, contract.M_CPU_ACTIVE, job, "Average", period),
                "iowait": job_metric(node, contract.M_CPU_IOWAIT, job, "Average", period),
                # Minimum over the nodes' 1/0: 1 only when every node reporting trains.
                "training": job_metric(contract.NS_JOB, contract.M_TRAINING, job, "Minimum", period),
            },
            label="GPUs starved by the input pipeline (1) or not (0)", period=period)
        minutes = period.to_seconds() / 60 * periods
        self.alarm = _alarm(self, self.condition, periods=periods, topic=topic, description=(
            f"dl-launcher {job}: " + STARVED_REMEDY.format(gpu=gpu_below_pct, cpu=cpu_above_pct,
                                                           iowait=iowait_above_pct, minutes=minutes)))


class NodeHealthAlarm(Construct):
    """ALARM when a node of the job logged a hardware XID error or lists fewer GPUs than expected,
    in any one period. The node has already tagged itself for replacement (the capacity
    controller replaces it); this tells a person.

    Keyword-only props (defaults in brackets):
      job: the cluster id (the Job dimension).
      expected_gpus: the GPUs every node should list (the catalog's count); a string token where the
        type is chosen at deploy (ChoiceCapacity.per_choice).
      period [5 minutes].
      topic [None]: told on ALARM.
    Attributes: alarm (cloudwatch.Alarm), condition (the MathExpression it watches).
    """

    def __init__(self, scope: Construct, construct_id: str, *, job: str, expected_gpus: "int | str",
                 period: cdk.Duration = cdk.Duration.minutes(5), topic: Optional[sns.ITopic] = None) -> None:
        super().__init__(scope, construct_id)
        if not cdk.Token.is_unresolved(expected_gpus):
            if isinstance(expected_gpus, str):
                raise ValueError(f"expected_gpus {expected_gpus!r}: a count, or a string token chosen at deploy")
            if expected_gpus < 1:
                raise ValueError(f"expected_gpus {expected_gpus}: at least 1 (the alarm is for GPU nodes)")
        ns = contract.NS_JOB
        self.condition = cw.MathExpression(
            expression=f"xid > 0 OR gpus < {expected_gpus}",
            using_metrics={"xid": job_metric(ns, contract.M_XID, job, "Sum", period),
                           # Minimum over the nodes: the node that lists the fewest.
                           "gpus": job_metric(ns, contract.M_GPUS, job, "Minimum", period)},
            label="a node's GPUs are broken (1) or not (0)", period=period)
        self.alarm = _alarm(self, self.condition, periods=1, topic=topic, description=(
            f"dl-launcher {job}: a node logged a hardware XID error or listed fewer than {expected_gpus} GPUs. "
            f"It has tagged itself {contract.TAG_HEALTH}={contract.HEALTH_REPLACE} and the capacity controller "
            "replaces it; the job resumes from its newest checkpoint. The dashboard's health row names the node. "
            "If it recurs on new nodes, open a case with AWS naming the instance type and AZ."))


class CapacityShortAlarm(Construct):
    """ALARM when the capacity controller found the cluster short (a vCPU quota, no capacity in
    the AZs, a spot price above the max price) in `runs` of its runs within `period`; OK once it
    launches. The controller runs every minute and on EC2's events, so a blip of one run does not
    alarm; an alarm acts on its change of state, so the topic hears once per shortfall, not every
    minute. The controller's state (`status`) holds the one line: which type, which error, since
    when, what it tries next.

    Keyword-only props (defaults in brackets):
      cluster: the cluster id (the controller's lines carry it; the metric's Job dimension).
      log_group: the controller's log group (ClusterCapacity.controller_log_group).
      runs [3], period [5 minutes], topic [None]: told on ALARM.
    Attributes: metric_filter (logs.MetricFilter), alarm (cloudwatch.Alarm).
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: str, log_group: logs.ILogGroup,
                 runs: int = 3, period: cdk.Duration = cdk.Duration.minutes(5),
                 topic: Optional[sns.ITopic] = None) -> None:
        super().__init__(scope, construct_id)
        if runs < 1:
            raise ValueError(f"runs {runs}: at least 1")
        self.metric_filter = logs.MetricFilter(
            self, "Runs", log_group=log_group, metric_namespace=contract.NS_JOB,
            metric_name=contract.M_CAPACITY_SHORT, metric_value="1", dimensions={contract.DIM_JOB: "$.cluster"},
            filter_pattern=logs.FilterPattern.all(logs.FilterPattern.string_value("$.kind", "=", "short"),
                                                  logs.FilterPattern.string_value("$.cluster", "=", cluster)))
        metric = job_metric(contract.NS_JOB, contract.M_CAPACITY_SHORT, cluster, "Sum", period)
        self.alarm = metric.create_alarm(
            self, "Alarm", threshold=runs, evaluation_periods=1, datapoints_to_alarm=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=(
                f"dl-launcher {cluster}: the capacity controller cannot launch the cluster ({runs} runs in "
                f"{period.to_minutes():g} minutes). The stack's CapacityStatusCommand prints one line: which type, "
                "which error (quota, capacity or price), since when, what it tries next and what you can do. "
                "A quota: `dl-launcher preflight` names the one and the number to ask for."))
        if topic is not None:
            self.alarm.add_alarm_action(actions.SnsAction(topic))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
