"""Two alarms on the job-wide series (CloudWatch alarms cannot SEARCH: the CloudWatch agent's
aggregation and the node monitor publish each metric with the job alone as well):

- starved GPUs: busy enough to be training, not enough to be fed, while the CPUs are saturated or
  waiting on the disk: the remedy is in the description;
- node health: a hardware XID, or fewer GPUs listed than the catalog's count (the node has
  already tagged itself and the capacity controller replaces it; this tells a human).
Missing data is never an alarm: a stopped cluster is not a starved one.
"""
from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cw
import aws_cdk.aws_cloudwatch_actions as actions
import aws_cdk.aws_sns as sns
from constructs import Construct

from ..runtime import contract

STARVED_REMEDY = ("GPUs under {gpu:g}% while the CPUs run over {cpu:g}% or wait on the disk over {iowait:g}% of the "
                  "time, for {minutes:g} minutes: the data pipeline holds the job back. Storage-bound (iowait): stage "
                  "the data set on the NVMe RAID at /scratch, or cache it in memory. CPU-bound: more data-loader "
                  "workers (num_workers), decode on the GPU (DALI), or a size with more vCPUs per GPU "
                  "(python -m selector recommend shows them).")


def _job_metric(namespace: str, name: str, job: str, stat: str, period: cdk.Duration) -> cw.Metric:
    return cw.Metric(namespace=namespace, metric_name=name, dimensions_map={contract.DIM_JOB: job},
                     statistic=stat, period=period)


class StarvedGpuAlarm(Construct):
    """Keyword-only props (defaults in brackets): job (the Job dimension); gpu_below_pct [50];
    cpu_above_pct [90]; iowait_above_pct [20]; period [5 min]; periods [3]; topic [None]: tell it.
    Attributes: alarm."""

    def __init__(self, scope: Construct, construct_id: str, *, job: str, gpu_below_pct: float = 50.0,
                 cpu_above_pct: float = 90.0, iowait_above_pct: float = 20.0,
                 period: cdk.Duration = cdk.Duration.minutes(5), periods: int = 3,
                 topic: Optional[sns.ITopic] = None) -> None:
        super().__init__(scope, construct_id)
        expression = cw.MathExpression(
            expression=f"IF(gpu < {gpu_below_pct:g} AND (cpu > {cpu_above_pct:g} OR iowait > {iowait_above_pct:g}), 1, 0)",
            using_metrics={"gpu": _job_metric(contract.NS_NODE, contract.M_GPU_UTIL, job, "Average", period),
                           "cpu": _job_metric(contract.NS_NODE, contract.M_CPU_ACTIVE, job, "Average", period),
                           "iowait": _job_metric(contract.NS_NODE, contract.M_CPU_IOWAIT, job, "Average", period)},
            label="starved (1) or fed (0)", period=period)
        self.alarm = expression.create_alarm(
            self, "Alarm", threshold=1, evaluation_periods=periods, datapoints_to_alarm=periods,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            alarm_description=f"dl-launcher {job}: " + STARVED_REMEDY.format(
                gpu=gpu_below_pct, cpu=cpu_above_pct, iowait=iowait_above_pct,
                minutes=period.to_minutes() * periods))
        if topic is not None:
            self.alarm.add_alarm_action(actions.SnsAction(topic))


class NodeHealthAlarm(Construct):
    """Keyword-only props: job; expected_gpus (the catalog's count per node); topic [None].
    Attributes: alarm."""

    def __init__(self, scope: Construct, construct_id: str, *, job: str, expected_gpus: int,
                 topic: Optional[sns.ITopic] = None) -> None:
        super().__init__(scope, construct_id)
        period = cdk.Duration.minutes(5)
        expression = cw.MathExpression(
            expression=f"IF(xid > 0 OR gpus < {expected_gpus}, 1, 0)",
            using_metrics={"xid": _job_metric(contract.NS_JOB, contract.M_XID, job, "Sum", period),
                           "gpus": _job_metric(contract.NS_JOB, contract.M_GPUS, job, "Minimum", period)},
            label="a node's GPUs are broken (1)", period=period)
        self.alarm = expression.create_alarm(
            self, "Alarm", threshold=1, evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            alarm_description=(f"dl-launcher {job}: a node logged a hardware XID error or lists fewer than "
                               f"{expected_gpus} GPUs. It has tagged itself {contract.TAG_HEALTH}=replace and the "
                               "capacity controller replaces it; the job resumes from its newest checkpoint. "
                               "Repeated on new nodes: open a case with AWS (the GPU type in this AZ)."))
        if topic is not None:
            self.alarm.add_alarm_action(actions.SnsAction(topic))
