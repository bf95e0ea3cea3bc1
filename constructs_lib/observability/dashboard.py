"""The training cluster's CloudWatch dashboard: are the GPUs busy, what holds them back, what the
job achieves per dollar, and which node is broken. Graphs find the nodes with SEARCH (their ids
are not known at synth); the cost figure counts the nodes that report each minute."""
from __future__ import annotations

from typing import Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cw
from constructs import Construct

from ..runtime import contract

PERIOD = cdk.Duration.seconds(contract.METRIC_PERIOD)


def search(namespace: str, metric: str, job: str, stat: str, dims: Sequence[str], period: int = contract.METRIC_PERIOD) -> str:
    """SEARCH over the job's series of `metric` that carry exactly `dims` (the schema's dimension
    names; the namespace is quoted: it holds a '/')."""
    schema = "{" + ",".join([f'"{namespace}"', *dims]) + "}"
    return f"SEARCH('{schema} MetricName=\"{metric}\" {contract.DIM_JOB}=\"{job}\"', '{stat}', {period})"


def _graph(title: str, expressions: dict[str, str], *, label: str = "", width: int = 12, height: int = 6,
           left: Optional[cw.YAxisProps] = None, annotations: Sequence[cw.HorizontalAnnotation] = (),
           using: Optional[dict[str, cw.IMetric]] = None) -> cw.GraphWidget:
    metrics = [cw.MathExpression(expression=e, label=label if len(expressions) == 1 else name, period=PERIOD,
                                 using_metrics=using or {}) for name, e in expressions.items()]
    return cw.GraphWidget(title=title, left=metrics, width=width, height=height, left_y_axis=left,
                          left_annotations=list(annotations) or None, period=PERIOD)


class TrainingDashboard(Construct):
    """Keyword-only props (defaults in brackets):
      job: the cluster id (the metrics' Job dimension).
      nodes, instance_type, gpus_per_node: the cluster as deployed.
      price_per_node_hour: what one node costs an hour in its market (the selector's price).
      alarms [()]: shown in an alarm status row.
      dashboard_name [None: CloudFormation names it].
    Attributes: dashboard, rows (the widget rows, top to bottom).
    """

    def __init__(self, scope: Construct, construct_id: str, *, job: str, nodes: int, instance_type: str,
                 gpus_per_node: int, price_per_node_hour: float, alarms: Sequence[cw.IAlarm] = (),
                 dashboard_name: Optional[str] = None) -> None:
        super().__init__(scope, construct_id)
        node, jobns = contract.NS_NODE, contract.NS_JOB
        per_node = [contract.DIM_INSTANCE, contract.DIM_JOB]
        cluster_hour = nodes * price_per_node_hour
        percent = cw.YAxisProps(min=0, max=100, label="%", show_units=False)
        intro = cw.TextWidget(width=24, height=3, markdown="\n".join([
            f"## {job}: {nodes} x {instance_type} ({gpus_per_node} GPUs each), about ${cluster_hour:,.2f}/h",
            "GPU utilisation low while **disk reads or CPU iowait are high** (second row): the GPUs wait on "
            "storage; stage the data on the NVMe RAID (/scratch). Low while **CPU active** is high: the data "
            "loader is short of workers or of vCPUs. Flat zero with the job gone: the idle guard stops the "
            "cluster. Samples per dollar is measured live from the job's `dl-bench` lines.",
        ]))
        gpus = [
            _graph("GPU utilisation, every GPU", {"gpu": search(node, contract.M_GPU_UTIL, job, "Maximum",
                                                                [contract.DIM_GPU, *per_node, "arch", "name"])},
                   label="", left=percent),
            _graph("GPU memory used (MiB), every GPU", {"mem": search(node, contract.M_GPU_MEMORY, job, "Maximum",
                                                                      [contract.DIM_GPU, *per_node, "arch", "name"])}),
        ]
        loader = [
            _graph("GPU utilisation, mean per node", {"gpu": search(node, contract.M_GPU_UTIL, job, "Average", per_node)},
                   width=8, left=percent),
            _graph("Scratch disk reads (MB/s) per node",
                   {"read": f"{search(node, contract.M_DISK_READ, job, 'Sum', per_node)} / {contract.METRIC_PERIOD * 1e6:g}"},
                   width=8),
            _graph("CPU active and iowait (%) per node", {
                "active": search(node, contract.M_CPU_ACTIVE, job, "Average", per_node),
                "iowait": search(node, contract.M_CPU_IOWAIT, job, "Average", per_node)}, width=8, left=percent),
        ]
        # One M_TRAINING datum per node per minute on the job-wide series: SampleCount = nodes up.
        up = cw.Metric(namespace=jobns, metric_name=contract.M_TRAINING, dimensions_map={contract.DIM_JOB: job},
                       statistic="SampleCount", period=PERIOD)
        throughput = search(jobns, contract.M_SAMPLES, job, "Average", per_node)
        value = [
            _graph("Samples per second (all nodes)", {"samples": f"SUM({throughput})"}, label="samples/s", width=8),
            _graph("Samples per dollar (live, at the price on record)",
                   {"per_dollar": f"SUM({throughput}) * 3600 / {cluster_hour:.4f}"}, label="samples/$", width=8),
            _graph("Estimated cost so far (USD)", {"cost": f"RUNNING_SUM(up) * {price_per_node_hour:.4f} / 60"},
                   label=f"node-minutes reporting x ${price_per_node_hour:,.2f}/h", width=8, using={"up": up}),
        ]
        health = [
            _graph("GPUs listed per node", {"gpus": search(jobns, contract.M_GPUS, job, "Minimum", per_node)},
                   width=12, annotations=[cw.HorizontalAnnotation(value=gpus_per_node, label="the catalog's count")]),
            _graph("Hardware XID errors per node", {"xid": search(jobns, contract.M_XID, job, "Sum", per_node)}, width=12),
        ]
        self.rows: list[list[cw.IWidget]] = [[intro], gpus, loader, value, health]
        if alarms:
            self.rows.append([cw.AlarmStatusWidget(alarms=list(alarms), title="Alarms", width=24, height=2)])
        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name, widgets=self.rows,
                                      default_interval=cdk.Duration.hours(6))
