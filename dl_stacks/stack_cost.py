"""The whole cost of a training stack: every billed resource it creates, per hour and per day,
each with its price, source and date (dl_selector/data/service_prices.json for everything but the
instances, whose prices come from the selector's catalog).

Counted from the synthesized construct tree (NAT gateways, public addresses, KMS keys, alarms and
their metrics, dashboards), from the node contract (the root volume, the custom metric series of
the agent and the monitor, what the idle guard reads per run), and from the selection (the
instances in their market). What depends on use (data through the NAT gateway, log lines,
checkpoint bytes kept in S3) is given as a rate, never guessed into the total.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Optional

import aws_cdk as cdk

if TYPE_CHECKING:
    from .training_stack import TrainingStack

GUARD_RUNS_PER_HOUR = 12  # the idle guard's schedule: every 5 minutes (observability/guard.py)


@lru_cache(maxsize=1)
def price_book() -> dict[str, Any]:
    return json.loads(resources.files("dl_selector").joinpath("data/service_prices.json").read_text())


@dataclass(frozen=True)
class Prices:
    region: str  # the stack's
    priced_as: str  # the region whose row is used (the stack's, or us-east-1 where it has none)
    as_of: str
    row: dict[str, float]
    month: float  # hours
    borrowed: tuple[str, ...] = ()  # figures the region's row lacks (the Price List gave none), us-east-1's here

    def __getitem__(self, item: str) -> float:
        return self.row[item]

    def source(self, item: str) -> str:
        """The pricing page, short: 'aws.amazon.com/vpc/pricing'."""
        return price_book()["sources"][item].split(" ")[0].removeprefix("https://").rstrip("/")

    @property
    def note(self) -> str:
        head = f"AWS list prices of {self.as_of}"
        if self.priced_as != self.region:
            return f"{head}, {self.priced_as}'s (none on record for {self.region})"
        if self.borrowed:
            return f"{head}; us-east-1's for {', '.join(self.borrowed)} (none on record for {self.region})"
        return head


def prices_for(region: str) -> Prices:
    """The region's own figures where the book has them; us-east-1's for the rest, named in the note."""
    book = price_book()
    base = book["regions"]["us-east-1"]
    own = book["regions"].get(region)
    if own is None:
        return Prices(region, "us-east-1", book["as_of"], base, book["hours_per_month"])
    borrowed = tuple(k for k in base if k not in own and not k.startswith("fsx_"))
    as_of = book.get("region_as_of", {}).get(region, book["as_of"])
    return Prices(region, region, as_of, {**{k: base[k] for k in borrowed}, **own}, book["hours_per_month"], borrowed)


@dataclass(frozen=True)
class Line:
    what: str
    per_hour: float
    basis: str  # quantity x price, in words
    per_node: bool = False  # scales with the running nodes (the rest is there while the stack is)


@dataclass(frozen=True)
class StackCost:
    region: str
    note: str  # the prices' source and date
    instances: Line  # the pick on every node, in its market, as quoted
    worst_instances: Optional[float]  # the worst case over the pick and its alternates
    lines: tuple[Line, ...]  # everything else
    usage: tuple[str, ...]  # rates that depend on use
    nodes: int
    instance_prices: dict[str, Optional[float]]  # per node-hour, the job's market, per option

    @property
    def other_per_hour(self) -> float:
        return sum(line.per_hour for line in self.lines)

    @property
    def per_hour(self) -> float:
        return self.instances.per_hour + self.other_per_hour

    def describe(self) -> list[str]:
        """The synth summary's lines."""
        worst = (f"; worst case {money(self.worst_instances + self.other_per_hour)}"
                 if self.worst_instances is not None else "")
        out = [f"  cost: {money(self.per_hour)} = {money(self.per_hour * 24, '/day')} while {self.nodes} node(s) run"
               f"{worst} ({self.note}; instances at the selector's catalog prices)"]
        out += [f"    {line.what}: {money(line.per_hour)} ({line.basis})" for line in (self.instances, *self.lines)]
        out += [f"    by use, not in the total: {u}" for u in self.usage]
        return out

    def output(self) -> str:
        """The CostPerHour output."""
        return (f"{money(self.per_hour)} ({money(self.per_hour * 24, '/day')}) with {self.nodes} node(s): instances "
                f"{money(self.instances.per_hour)}, the rest {money(self.other_per_hour)}; {self.note}")

    def model(self) -> str:
        """The CostModel output (JSON): what `dl-launcher status` needs to price a running cluster."""
        per_node = sum(line.per_hour for line in self.lines if line.per_node) / max(1, self.nodes)
        fixed = sum(line.per_hour for line in self.lines if not line.per_node)
        return json.dumps({"as_of": self.note, "fixed_per_hour": round(fixed, 6), "per_node_hour": round(per_node, 6),
                           "instance_per_node_hour": self.instance_prices}, separators=(",", ":"), sort_keys=True)


def money(v: Optional[float], unit: str = "/h") -> str:
    if v is None:
        return "unknown"
    return f"${v:,.2f}{unit}" if v >= 0.1 or v == 0 else f"${v:,.4f}{unit}"


def _resources(stack: cdk.Stack) -> list[cdk.CfnResource]:
    return [c for c in stack.node.find_all() if isinstance(c, cdk.CfnResource) and cdk.Stack.of(c) is stack]


def _alarm_metrics(alarm: cdk.CfnResource) -> int:
    """A metric-math alarm is billed per metric it reads; a plain alarm reads one."""
    metrics = getattr(alarm, "metrics", None)
    if isinstance(metrics, list):
        return sum(1 for m in metrics if (m.metric_stat if hasattr(m, "metric_stat") else m.get("metricStat")))
    return 1


def stack_cost(stack: "TrainingStack") -> StackCost:
    from constructs_lib.fleet.idle_watch import queried_per_node
    from constructs_lib.runtime.cwagent_config import series_per_node
    from constructs_lib.runtime.monitor import PUBLISHED, PUBLISHED_GPU

    settings, selection = stack.settings, stack.selection
    p = prices_for(settings.region)
    n, month = settings.nodes, p.month
    found = _resources(stack)

    def count(kind: str) -> int:
        return sum(1 for r in found if r.cfn_resource_type == kind)

    lines: list[Line] = []
    nat, eips = count("AWS::EC2::NatGateway"), count("AWS::EC2::EIP")
    if nat:
        lines.append(Line("NAT gateway", nat * p["nat_gateway_hour"], f"{nat} x ${p['nat_gateway_hour']:g}/h" + "; " + p.source("nat_gateway_hour")))
    if eips:
        lines.append(Line("public IPv4 address", eips * p["public_ipv4_hour"], f"{eips} x ${p['public_ipv4_hour']:g}/h" + "; " + p.source("public_ipv4_hour")))
    gib = settings.profile.root_volume_gib
    lines.append(Line("root volumes (gp3)", n * gib * p["ebs_gp3_gb_month"] / month,
                      f"{n} x {gib} GiB x ${p['ebs_gp3_gb_month']:g}/GB-month" + "; " + p.source("ebs_gp3_gb_month"), per_node=True))
    obs = stack.observability
    gpus = selection.pick.facts.accelerator_count
    if obs is not None:
        cuda = all(c.facts.sdk == "cuda" for c in selection.options)
        per_node, per_cluster = series_per_node(gpus, gpu=cuda)
        per_node += len(PUBLISHED) + (len(PUBLISHED_GPU) if cuda else 0)
        per_cluster += len(PUBLISHED) + (len(PUBLISHED_GPU) if cuda else 0)
        rate = p["cw_metric_month"]
        lines.append(Line("custom metrics, per node", n * per_node * rate / month,
                          f"{n} x {per_node} series x ${rate:g}/metric-month" + "; " + p.source("cw_metric_month"), per_node=True))
        lines.append(Line("custom metrics, cluster-wide", per_cluster * rate / month,
                          f"{per_cluster} series x ${rate:g}/metric-month" + "; " + p.source("cw_metric_month")))
        if obs.guard is not None:
            interactive = settings.observability.interactive
            q = queried_per_node(gpus, interactive)
            lines.append(Line("idle guard's metric reads", n * q * GUARD_RUNS_PER_HOUR * p["cw_metrics_requested_1000"] / 1000,
                              f"{GUARD_RUNS_PER_HOUR} runs/h x {n} x {q} metrics x ${p['cw_metrics_requested_1000']:g}"
                              "/1,000; " + p.source("cw_metrics_requested_1000"), per_node=True))
    alarms = sum(_alarm_metrics(r) for r in found if r.cfn_resource_type == "AWS::CloudWatch::Alarm")
    if alarms:
        lines.append(Line("alarms", alarms * p["cw_alarm_metric_month"] / month,
                          f"{alarms} alarm metrics x ${p['cw_alarm_metric_month']:g}/month" + "; " + p.source("cw_alarm_metric_month")))
    dashboards = count("AWS::CloudWatch::Dashboard")
    if dashboards:
        lines.append(Line("dashboard", dashboards * p["cw_dashboard_month"] / month,
                          f"{dashboards} x ${p['cw_dashboard_month']:g}/month (an account's first 3 are free)" + "; " + p.source("cw_dashboard_month")))
    fs = getattr(stack, "data_file_system", None)
    if fs is not None:
        key = f"fsx_lustre_p2_{fs.throughput}_gb_month"
        rate = p.row.get(key)
        what = f"FSx for Lustre, {fs.storage_gib:,} GiB at {fs.throughput} MB/s/TiB ({fs.throughput_mbs:,} MB/s)"
        if rate is not None:
            lines.append(Line(what, fs.storage_gib * rate / month, f"{fs.storage_gib:,} GB x ${rate:g}/GB-month = "
                              f"${fs.storage_gib * rate:,.0f}/month; " + p.source(key)))
        else:
            lines.append(Line(what, 0.0, f"no price on record for {fs.throughput} MB/s/TiB in {p.priced_as}: counted "
                              "as $0 (aws.amazon.com/fsx/lustre/pricing has it)"))
    keys = count("AWS::KMS::Key")
    if keys:
        lines.append(Line("KMS keys", keys * p["kms_key_month"] / month, f"{keys} x ${p['kms_key_month']:g}/month" + "; " + p.source("kms_key_month")))
    usage = [f"S3 checkpoints ${p['s3_standard_gb_month']:g}/GB-month kept (S3 Standard) and ${p['s3_put_1000']:g} per "
             "1,000 uploads; the bucket stays after the stack",
             f"logs ${p['logs_ingested_gb']:g}/GB written and ${p['logs_stored_gb_month']:g}/GB-month kept "
             "(the job's output, the controller's and the guard's lines, the VPC's rejected flows)"]
    if nat:
        usage.insert(0, f"${p['nat_gateway_gb']:g}/GB through the NAT gateway (package and image downloads; "
                        "checkpoints go by the free S3 endpoint)")
    usage.append("Lambda, EventBridge, SNS and SSM: under $0.01/day at these schedules")
    od = selection.pick_cost(n)
    instances = Line(f"instances, {selection.market}", od or 0.0,
                     f"{n} x {selection.pick.instance_type} at {money(selection.prices[selection.pick.instance_type].in_market)}"
                     + ("" if od is not None else ": no price on record, counted as $0")
                     + f"; the selector's catalog as of {selection.recommendation.catalog_as_of}", per_node=True)
    return StackCost(region=settings.region, note=p.note, instances=instances,
                     worst_instances=selection.worst_case(n).market, lines=tuple(lines), usage=tuple(usage), nodes=n,
                     instance_prices={t: o.in_market for t, o in selection.prices.items()})
