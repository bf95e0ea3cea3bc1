"""The training cluster's CloudWatch dashboard: are the GPUs busy, what holds them back, what the
job achieves per dollar, and which node is broken.

Graphs find the nodes with SEARCH, since their instance ids are not known at synth
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/search-expression-syntax.html):

- per node and job-wide series use a metric schema, `{"<namespace>",InstanceId,Job}`: a schema
  matches the series with exactly those dimensions (the user guide's examples: `{AWS/EC2}` is the
  one Region-wide series, `{AWS/EC2,InstanceType}` one line per type), and those dimension sets
  are the ones the CloudWatch agent's `aggregation_dimensions` and the node monitor publish;
- per GPU series have the agent's own dimensions beside ours (`index`, `name`, and more in some
  agent versions), so that search names no schema: the namespace and metric by designator, the
  job by value, and `"index"` as an exact term, which a dimension name matches: every per-GPU
  series whatever else rides along, and none of the aggregates (which have no `index`).

The cost figure counts the nodes whose monitor reports each minute (see `TrainingDashboard`).
"""
from __future__ import annotations

import re
from typing import Optional, Sequence, Union

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cw
from constructs import Construct

from ..runtime import contract

PERIOD = cdk.Duration.seconds(contract.METRIC_PERIOD)
PER_NODE = (contract.DIM_INSTANCE, contract.DIM_JOB)  # the dimension set of the per-node series
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # nothing a SEARCH string would have to escape


def search(namespace: str, metric: str, job: str, stat: str, *, dims: Optional[Sequence[str]] = None,
           with_dimension: Optional[str] = None, period: int = contract.METRIC_PERIOD) -> str:
    """A SEARCH for the job's series of `metric`: those with exactly `dims` (a metric schema), or,
    with `with_dimension`, every series that carries that dimension name, whatever others it has."""
    if (dims is None) == (with_dimension is None):
        raise ValueError("search: give exactly one of dims and with_dimension")
    if dims is not None:
        # Names with characters other than letters and digits are quoted in a schema ('/', '-').
        scope = "{" + ",".join(f'"{n}"' if not n.isalnum() else n for n in (namespace, *dims)) + "}"
        terms = f'MetricName="{metric}" {contract.DIM_JOB}="{job}"'
    else:
        scope = f'Namespace="{namespace}"'
        terms = f'MetricName="{metric}" {contract.DIM_JOB}="{job}" "{with_dimension}"'
    return f"SEARCH('{scope} {terms}', '{stat}', {period})"


def _expression(expression: str, label: str, using: Optional[dict[str, cw.IMetric]] = None) -> cw.MathExpression:
    return cw.MathExpression(expression=expression, label=label, period=PERIOD, using_metrics=using or {})


def _graph(title: str, metrics: Sequence[cw.IMetric], *, width: int, height: int = 6, percent: bool = False,
           unit_label: Optional[str] = None, annotations: Sequence[cw.HorizontalAnnotation] = ()) -> cw.GraphWidget:
    axis = (cw.YAxisProps(min=0, max=100, label="%", show_units=False) if percent
            else cw.YAxisProps(min=0, label=unit_label, show_units=False) if unit_label else cw.YAxisProps(min=0))
    return cw.GraphWidget(title=title, left=list(metrics), width=width, height=height, left_y_axis=axis,
                          left_annotations=list(annotations) or None, period=PERIOD)


class TrainingDashboard(Construct):
    """One CloudWatch dashboard for one training cluster, read top to bottom:

    1. what runs, what it costs and how to read the rest (text);
    2. every GPU's utilisation and memory;
    3. per node, GPU utilisation beside the scratch array's reads and the CPUs' active and iowait
       time: the loader-bound pattern on one row;
    4. samples/s of the whole job, live samples per dollar, the estimated cost so far;
    5. health: GPUs the driver lists per node against the expected count, hardware XIDs, and how
       many nodes train or restore;
    6. the alarms' states, when alarms are given.

    Keyword-only props (defaults in brackets):
      job: the cluster id, the value of the metrics' Job dimension.
      nodes: how many nodes the cluster has.
      gpus_per_node: the GPUs each node should list (the catalog's count).
      price_per_node_hour: USD per node-hour in the cluster's market (the selector's price); 0 or
        less when none is on record: the cost and per-dollar graphs are then left out, said so.
      instance_type: the type deployed, for the heading.
      gpu_metrics [True]: NVIDIA types; False (Trainium, Inferentia) leaves out the GPU graphs,
        which would stay empty, and says so.
      alarms [()]: shown in an alarm status row at the bottom.
      dashboard_name [None: CloudFormation names it].
    Attributes: dashboard (cloudwatch.Dashboard), widgets (the rows, top to bottom: lists of widgets).
    """

    def __init__(self, scope: Construct, construct_id: str, *, job: str, nodes: Union[int, float], gpus_per_node: Union[int, float],
                 price_per_node_hour: float, instance_type: str, gpu_metrics: bool = True,
                 alarms: Sequence[cw.IAlarm] = (), dashboard_name: Optional[str] = None) -> None:
        super().__init__(scope, construct_id)
        # Tokens (a product's parameters, chosen at launch) are held to safe values by the
        # parameters' own patterns; their arithmetic happens in the metric math.
        tokens = any(cdk.Token.is_unresolved(x) for x in (job, nodes, gpus_per_node, price_per_node_hour))
        if not cdk.Token.is_unresolved(job) and not _JOB.match(job):
            raise ValueError(f"job {job!r}: letters, digits, '.', '_' and '-' only (it goes into SEARCH strings)")
        if not tokens and (nodes < 1 or gpus_per_node < 0):
            raise ValueError(f"nodes {nodes}, gpus_per_node {gpus_per_node}: at least one node, no negative count")
        priced = tokens or price_per_node_hour > 0
        num = cdk.Tokenization.stringify_number
        if tokens:
            cluster_hour_math = f"({num(nodes)} * {num(price_per_node_hour)})"
            hour_text, node_hour_text = "the cluster's price per hour", "the price per node-hour"
            price_math = num(price_per_node_hour)
            about = f", about {num(price_per_node_hour)} USD per node-hour"
        else:
            cluster_hour = nodes * price_per_node_hour
            cluster_hour_math = f"{cluster_hour:.4f}"
            hour_text, node_hour_text = f"${cluster_hour:,.2f} per cluster-hour", f"${price_per_node_hour:,.2f}/node-hour"
            price_math = f"{price_per_node_hour:.4f}"
            about = f", about ${cluster_hour:,.2f}/h"
        node_ns, job_ns = contract.NS_NODE, contract.NS_JOB

        def per_node(namespace: str, metric: str, stat: str) -> str:
            return search(namespace, metric, job, stat, dims=PER_NODE)

        how = [
            f"## {job}: {num(nodes)} x {instance_type}"
            + (f" ({num(gpus_per_node)} GPU{'s' if tokens or gpus_per_node != 1 else ''} each)" if gpu_metrics else "")
            + (about if priced else ", no price on record"),
            "**How to read it.** Third row, left to right: GPU utilisation low while **disk reads or CPU iowait** "
            "are high: the GPUs wait on storage; stage the data set on the NVMe RAID at /scratch. Low while "
            "**CPU active** is near 100%: the data loader is short of workers or of vCPUs (more `num_workers`, a "
            "size with more vCPUs per GPU). Low everywhere with no samples/s: the job is not running; the idle "
            "guard stops such a cluster. Samples/s comes from the job's `dl-bench` lines; cost and samples per "
            "dollar use the price on record, not the bill; the cost counts from the start of the time range shown.",
        ]
        if not gpu_metrics:
            how.append("This type has no NVIDIA GPUs: the CloudWatch agent collects no accelerator metrics here, "
                       "so GPU graphs are left out.")
        self.widgets: list[list[cw.IWidget]] = [[cw.TextWidget(markdown="\n\n".join(how), width=24, height=4)]]

        if gpu_metrics:
            every_gpu = contract.DIM_GPU
            self.widgets.append([
                _graph("GPU utilisation, every GPU (%)",
                       [_expression(search(node_ns, contract.M_GPU_UTIL, job, "Maximum", with_dimension=every_gpu), "")],
                       width=12, percent=True),
                _graph("GPU memory used, every GPU (MiB)",
                       [_expression(search(node_ns, contract.M_GPU_MEMORY, job, "Maximum", with_dimension=every_gpu), "")],
                       width=12, unit_label="MiB"),
            ])
        loader: list[cw.IWidget] = []
        if gpu_metrics:
            loader.append(_graph("GPU utilisation, mean per node (%)",
                                 [_expression(per_node(node_ns, contract.M_GPU_UTIL, "Average"), "")],
                                 width=8, percent=True))
        # The agent sends the bytes read in each collection interval (METRIC_PERIOD): their
        # average over any period divided by the interval is bytes per second.
        loader += [
            _graph("Scratch array reads per node (MB/s)", [_expression(
                f"{per_node(node_ns, contract.M_DISK_READ, 'Average')} / {contract.METRIC_PERIOD * 1_000_000}", "")],
                width=8 if gpu_metrics else 12, unit_label="MB/s"),
            _graph("CPU active and iowait per node (%)", [
                _expression(per_node(node_ns, contract.M_CPU_ACTIVE, "Average"), "active"),
                _expression(per_node(node_ns, contract.M_CPU_IOWAIT, "Average"), "iowait")],
                width=8 if gpu_metrics else 12, percent=True),
        ]
        self.widgets.append(loader)

        samples = f"SUM({per_node(job_ns, contract.M_SAMPLES, 'Average')})"
        value: list[cw.IWidget] = [_graph("Samples per second, whole job", [_expression(samples, "samples/s")],
                                          width=8 if priced else 12, unit_label="samples/s")]
        if priced:
            # Every node's monitor sends TrainingRunning once a minute, whatever the job does, also
            # to the job-wide series: its SampleCount in a period is the node-minutes reported in
            # it, at any period the console shows.
            reported = cw.Metric(namespace=job_ns, metric_name=contract.M_TRAINING,
                                 dimensions_map={contract.DIM_JOB: job}, statistic="SampleCount", period=PERIOD)
            value += [
                _graph("Samples per dollar, live", [_expression(
                    f"{samples} * 3600 / {cluster_hour_math}", f"samples/s x 3600 / {hour_text}")],
                    width=8, unit_label="samples/$"),
                _graph("Estimated cost so far (USD)", [_expression(
                    f"RUNNING_SUM(nodeminutes) * {price_math} / 60",
                    f"since the start of the time range shown: node-minutes reported (assumes one "
                    f"{contract.M_TRAINING} datum per node per minute) x {node_hour_text}",
                    {"nodeminutes": reported})],
                    width=8, unit_label="USD"),
            ]
        else:
            value.append(cw.TextWidget(width=12, height=6, markdown=(
                "### No price on record\n\nThis market has no price in the catalog for this type, so the dashboard "
                "shows neither the cost so far nor samples per dollar.")))
        self.widgets.append(value)

        health: list[cw.IWidget] = []
        if gpu_metrics:
            health += [
                _graph("GPUs listed per node", [_expression(per_node(job_ns, contract.M_GPUS, "Minimum"), "")],
                       width=8, unit_label="GPUs",
                       annotations=[cw.HorizontalAnnotation(value=gpus_per_node, label=f"expected: {num(gpus_per_node)}")]),
                _graph("Hardware XID errors per node", [_expression(per_node(job_ns, contract.M_XID, "Sum"), "")],
                       width=8, unit_label="errors"),
            ]
        health.append(_graph("Nodes training and restoring", [
            _expression(f"SUM({per_node(job_ns, contract.M_TRAINING, 'Maximum')})", "training"),
            _expression(f"SUM({per_node(job_ns, contract.M_RESTORING, 'Maximum')})", "restoring")],
            width=8 if gpu_metrics else 24, unit_label="nodes",
            annotations=[cw.HorizontalAnnotation(value=nodes, label=f"cluster: {num(nodes)}")]))
        self.widgets.append(health)
        if alarms:
            self.widgets.append([cw.AlarmStatusWidget(alarms=list(alarms), title="Alarms", width=24, height=2)])
        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name, widgets=self.widgets,
                                      default_interval=cdk.Duration.hours(6))
