"""The training stack: the selector's pick for a profile, composed into deployable infrastructure."""
from __future__ import annotations

import sys

import aws_cdk as cdk
import aws_cdk.aws_sns as sns
from constructs import Construct

from constructs_lib import CheckpointBucket, ClusterCapacity, InstanceOption, InterruptionAlerts, NodeOptions
from constructs_lib.fsx import LustreData
from constructs_lib.job import JobDefinition, JobLogs
from constructs_lib.observability.cluster import ClusterObservability
from constructs_lib.runtime import contract
from constructs_lib.runtime.contract import TAG_CLUSTER, capacity_state_key

from dl_selector.errors import UserError

from . import memory_tier_settings as memory_tier
from .network import existing_subnets, training_vpc
from .selection import Selection, money, select
from .settings import Settings

SHOW_REJECTED = 3  # the summary names the first few candidates not taken; the count says the rest


class TrainingStack(cdk.Stack):
    """N nodes of the profile's pick (or `instance_type`), one type at a time, launched and moved
    whole across its alternates by the capacity controller; a checkpoint bucket, interruption
    alerts, rendezvous and the job, in a VPC of one AZ."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, selection: Selection,
                 **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.selection = selection
        pick = selection.pick
        subnets = None
        if settings.subnet_ids:
            self.vpc, subnets = existing_subnets(self, vpc_id=settings.vpc_id, subnet_ids=settings.subnet_ids,
                                                 availability_zone=settings.availability_zone)
        else:
            self.vpc = training_vpc(self, vpc_id=settings.vpc_id, restrict_default_security_group=not settings.local)
        self.checkpoints = CheckpointBucket(self, "Checkpoints")
        self.prefix = f"jobs/{settings.job}"
        self.alerts = InterruptionAlerts(self, "Alerts")
        cluster_id = construct_id
        self.cluster = ClusterCapacity(
            self, "Cluster", vpc=self.vpc, subnets=subnets, cluster=cluster_id, nodes=settings.nodes,
            options=[InstanceOption(c.facts, selection.prices[c.instance_type].in_market) for c in selection.options],
            market=selection.market, max_price=selection.ceiling, capacity_reservation=settings.capacity_reservation,
            interchange=selection.interchange, state_bucket=self.checkpoints.bucket,
            state_key=capacity_state_key(cluster_id), log_group=self.alerts.log_group,
            teardown=not settings.local, node_options=NodeOptions(root_volume_gib=settings.profile.root_volume_gib))
        self.cluster.enable_checkpoints(self.checkpoints, self.prefix)
        job = settings.job_settings
        obs = settings.observability
        self.job_definition = self.job_logs = None
        if settings.command or job.any:
            # The command, code, setup, env, secrets and image as assets named by one SSM parameter
            # (a redeploy reaches running nodes at their next generation), the output to a log group.
            self.job_definition = JobDefinition(
                self, "Job", cluster=cluster_id, command=settings.command or None, code=job.code, setup=job.setup,
                env=dict(job.env), secrets=dict(job.secrets), secrets_kms=job.secrets_kms, image=job.image,
                data=job.data if job.data_mode == "stage" else (), checkpoint_dir=job.checkpoint_dir, restart=job.restart,
                data_owner=job.data_owner)
        from constructs_lib.job_rules import one_job_problem
        self.one_job_warning = one_job_problem(settings.command, settings.nodes, job.code) if job.restart == "torchrun" else None
        if self.one_job_warning:
            cdk.Annotations.of(self).add_warning_v2("dl-launcher:not-one-job", self.one_job_warning)
        self.data_file_system = None
        if job.data and job.data_mode == "fsx":
            sel = self.cluster.subnets  # the nodes' one AZ
            subnet = self.vpc.select_subnets(subnets=sel.subnets, subnet_type=sel.subnet_type,
                                             availability_zones=sel.availability_zones).subnets[0]
            self.data_file_system = LustreData(self, "Data", vpc=self.vpc, subnet=subnet, data=job.data,
                                               storage_gib=job.fsx_gib, throughput=job.fsx_throughput)
            self.cluster.enable_data_file_system(self.data_file_system)
            cdk.CfnOutput(self, "DataFileSystem", value=self.data_file_system.file_system.file_system_id,
                          description=f"FSx for Lustre ({job.fsx_gib} GiB, {job.fsx_throughput} MB/s/TiB) linked to "
                                      f"{', '.join(job.data)}, mounted on every node at {contract.DIR_DEFAULTS['DL_SCRATCH']}/data")
        if self.job_definition is not None or (obs.enabled and obs.interactive):
            # An interactive cluster has no command, but the guard's warnings go where users read.
            self.job_logs = JobLogs(self, "JobLogs", cluster=cluster_id)
        self.cluster.configure_job(definition=self.job_definition, logs=self.job_logs, on_end=settings.on_end)
        self.cluster.enable_health_gate(settings.health_check, settings.collective_check,
                                        hang=settings.hang_timeout, first_step=settings.first_step_timeout)
        self.observability = None
        if obs.enabled:
            topic = (sns.Topic.from_topic_arn(self, "AlarmTopic", obs.alarm_topic) if obs.alarm_topic else None)
            self.observability = ClusterObservability(
                self, "Observability", capacity=self.cluster, log_group=self.alerts.log_group, topic=topic,
                checkpoints=self.checkpoints.bucket, checkpoint_prefix=self.prefix, idle_guard=obs.idle_guard,
                idle_minutes=obs.idle_minutes, idle_threshold=obs.idle_threshold, idle_action=obs.idle_action,
                alarm_status=not settings.local, interactive=obs.interactive, idle_warning=obs.idle_warning)

        cdk.CfnOutput(self, "InstanceType", value=pick.instance_type,
                      description=f"profile {settings.profile.name}: {selection.recommendation.why}"[:1000])
        cdk.CfnOutput(self, "Alternates", value=",".join(c.instance_type for c in selection.alternates) or "none",
                      description=alternates_description(selection)[:1000])  # CloudFormation's limit is 1024
        cdk.CfnOutput(self, "ClusterCostPerHour", value=cluster_cost(settings, selection),
                      description=(f"worst case over the pick and its alternates at the prices on record "
                                   f"(catalog as of {selection.recommendation.catalog_as_of}); "
                                   f"ceiling: {selection.describe_ceiling()}")[:1000])
        cdk.CfnOutput(self, "CheckpointBucket", value=self.checkpoints.bucket.bucket_name,
                      description=f"checkpoints under s3://<bucket>/{self.prefix}/; kept after cdk destroy")
        # The node lookup names the stack's id (contract.TAG_STACK) beside the cluster: another
        # stack's cluster of the same name (a product launched as this job) is never entered.
        cdk.CfnOutput(self, "SsmSessionCommand", value=cdk.Fn.join("", [
            f"aws ssm start-session --region {self.region} --target $(aws ec2 describe-instances --region {self.region} "
            f"--filters Name=tag:{TAG_CLUSTER},Values={cluster_id} Name=tag:{contract.TAG_STACK},Values=", self.stack_id,
            " Name=instance-state-name,Values=running --query 'Reservations[0].Instances[0].InstanceId' --output text)"]))
        if self.job_logs is not None:
            group = self.job_logs.log_group_name
            cdk.CfnOutput(self, "JobLogGroup", value=group, description=(
                "the command's output (every rank), setup's and the supervisor's lines: one stream per node"))
            cdk.CfnOutput(self, "LogsCommand", value=f"dl-launcher logs {settings.job} --follow --region {self.region}",
                          description=f"every node's lines, as aws logs tail {group} --follow shows them")
            cdk.CfnOutput(self, "RestartJobCommand", value=(
                f"aws ssm send-command --region {self.region} --document-name AWS-RunShellScript --targets "
                f"Key=tag:{TAG_CLUSTER},Values={cluster_id} --parameters commands='systemctl restart dl-job'"),
                description="start a new generation now on every node (a redeploy's code and command, at once)")
        cdk.CfnOutput(self, "AlertsLogGroup", value=self.alerts.log_group.log_group_name,
                      description="spot warnings and every decision of the capacity controller, with its reason")
        if self.observability is not None:
            guard = self.observability.guard
            cdk.CfnOutput(self, "NotificationTopic", value=self.observability.topic.topic_arn, description=(
                "the idle guard and the alarms tell this topic; subscribe: aws sns subscribe --protocol email "
                "--notification-endpoint you@example.com --topic-arn <this>"))
            cdk.CfnOutput(self, "Dashboard", value=cdk.Fn.join("", [
                f"https://{self.region}.console.aws.amazon.com/cloudwatch/home?region={self.region}#dashboards/dashboard/",
                self.observability.dashboard.dashboard.dashboard_name]),
                description="GPU utilisation, the loader-bound pattern, samples/s and per dollar, cost so far, GPU health")
            cdk.CfnOutput(self, "IdleGuard", value=guard_line(obs) if guard else "off",
                          description="a stopped cluster starts again with ResumeCommand; dl-launcher status shows "
                                      "the guard's last judgement and when it would act")
        cdk.CfnOutput(self, "ResumeCommand", value=cdk.Fn.join("", [
            f"aws lambda invoke --region {self.region} --function-name ",
            self.cluster.controller.function.function_name,
            " --cli-binary-format raw-in-base64-out --payload '{\"dl-launcher\": \"resume\"}' /dev/stdout"]),
            description="start the cluster again after the idle guard or a teardown stopped it (newest checkpoint)")
        cdk.CfnOutput(self, contract.OUTPUT_JOB, value=settings.job, description=(
            "the job this stack runs: dl-launcher status, logs, shell and destroy act only on a stack that says so"))
        # The cluster id is the construct id, which `stack_name=` can set apart from the stack's name.
        cdk.CfnOutput(self, contract.OUTPUT_CLUSTER, value=cluster_id,
                      description=f"the cluster id (tag {TAG_CLUSTER}) on every node")
        cdk.CfnOutput(self, contract.OUTPUT_STATE_KEY, value=capacity_state_key(cluster_id),
                      description="the capacity controller's state, in CheckpointBucket")
        cdk.CfnOutput(self, "DestroyCommand", value=f"dl-launcher destroy {settings.job} --region {self.region}",
                      description="delete this stack (the cluster first); the checkpoint buckets stay unless "
                                  "--delete-checkpoints")
        cdk.CfnOutput(self, "CapacityStatusCommand", value=(
            f"python -m constructs_lib.fleet status --bucket {self.checkpoints.bucket.bucket_name} "
            f"--key {capacity_state_key(cluster_id)} --region {self.region}"),
            description=f"or: dl-launcher status {settings.job} --region {self.region}: which type the cluster runs "
                        "on, its nodes, why it waits, and the controller's last transitions")

        # Not on the agent's SSM parameter (moto's CloudFormation reads that type's tags as a list),
        # nor locally on KMS keys (moto passes their tags in the wrong shape): as the products do.
        skip = ["AWS::SSM::Parameter", *(["AWS::KMS::Key"] if settings.local else [])]
        cdk.Tags.of(self).add(contract.TAG_JOB, settings.job, exclude_resource_types=skip)
        self.budget = self._budget(settings.budget) if settings.budget else None
        from .stack_cost import stack_cost
        self.cost = stack_cost(self)
        cdk.CfnOutput(self, "CostPerHour", value=self.cost.output()[:1000], description=(
            "every billed resource of this stack while its nodes run (instances as quoted in their market); "
            "dl-launcher status gives the cost so far")[:1000])
        cdk.CfnOutput(self, "CostModel", value=self.cost.model(),
                      description="what dl-launcher status prices a running cluster with (USD per hour)")
        from .approval import plan_for
        self.plan = plan_for(self)  # what app.py holds against -c approve_hourly before any synth

    def _budget(self, usd: int):
        """An AWS Budgets budget on the job's tag, told at 80%/100% actual and 100% forecast."""
        from constructs_lib.observability.budget import cost_budget
        from constructs_lib.observability.notifications import NotificationTopic

        notifications = self.observability.notifications if self.observability is not None else None
        if self.observability is not None and notifications is None:  # the user's own alarm_topic
            topic_arn = self.observability.topic.topic_arn
            cdk.Annotations.of(self).add_warning_v2("dl-launcher:budget-topic", (
                f"the budget tells {self.settings.observability.alarm_topic}, which this stack does not own. Fix: let "
                "budgets.amazonaws.com publish to it (its topic policy, and its key policy if encrypted), or leave "
                "alarm_topic out for a topic this stack makes"))
        else:
            if notifications is None:
                notifications = NotificationTopic(self, "BudgetAlerts", display_name="dl-launcher budget")
                cdk.CfnOutput(self, "NotificationTopic", value=notifications.topic.topic_arn,
                              description="the budget tells this topic; subscribe: aws sns subscribe --protocol email "
                                          "--notification-endpoint you@example.com --topic-arn <this>")
            notifications.allow_budgets()
            topic_arn = notifications.topic.topic_arn
        budget = cost_budget(self, "JobBudget", name=f"dl-launcher-job-{self.settings.job}-{self.region}", usd_per_month=usd,
                             tag_key=contract.TAG_JOB, tag_value=self.settings.job, topic_arn=topic_arn)
        cdk.CfnOutput(self, "Budget", value=f"${usd:,}/month on tag {contract.TAG_JOB}={self.settings.job}", description=(
            f"AWS Budgets tells the topic at 80% and 100% of actual spend and at 100% forecast; activate the cost "
            f"allocation tag {contract.TAG_JOB} once per account (Billing, Cost allocation tags), or it sees $0"))
        return budget

    def summary(self) -> str:
        """The synth summary: the pick, why, every option's price, the whole cost, the approval, the job."""
        text = summary(self.settings, self.selection, self.job_definition, notes=self.notes(),
                       cost=[*self.cost.describe(), f"  {self.plan.approval_line(self.settings.approval.approve_hourly)}"])
        return text + (f"\n  warning: {self.one_job_warning}" if self.one_job_warning else "")

    def notes(self) -> list[str]:
        """Facts of the chosen types the summary says once (not warnings: nothing to fix)."""
        return _notes(self.cluster.templates)

    @classmethod
    def for_settings(cls, app: cdk.App, settings: Settings, *, synthesizer: cdk.IStackSynthesizer | None = None,
                     quiet: bool = False) -> "TrainingStack":
        selection = select(settings)
        if settings.memory_tier_gb is not None:  # before any construct: a refused tier creates nothing
            why = memory_tier.problem(settings.memory_tier_gb, settings.nodes, _rams(selection))
            if why:
                raise UserError(why)
        import os
        # A VPC lookup needs an account; named subnets or a new VPC do not.
        account = os.environ.get("CDK_DEFAULT_ACCOUNT") if settings.vpc_id and not settings.subnet_ids else None
        stack = cls(app, f"dl-{settings.job}", settings=settings, selection=selection, synthesizer=synthesizer,
                    env=cdk.Environment(account=account, region=settings.region),
                    description=f"dl-launcher {settings.profile.name}: {settings.nodes} x {selection.pick.instance_type}")
        if not quiet:
            print(stack.summary(), file=sys.stderr)
        return stack


def _notes(templates) -> list[str]:
    from constructs_lib.validation import NOTE
    seen: dict[str, None] = {}
    for t in templates:
        for f in t.findings:
            if f.level == NOTE:
                seen[f"{f.message} ({f.remediation})"] = None
    return list(seen)


def guard_line(obs) -> str:
    """What the idle guard will do, in one line (the IdleGuard output and the synth summary)."""
    warn = f", {obs.idle_warning} min after a warning to the topic and the job log" if obs.idle_warning else ""
    if obs.interactive:
        return (f"interactive: {obs.idle_action} after {obs.idle_minutes} min with no Session Manager session, no process "
                f"on a GPU and every GPU under {obs.idle_threshold:g}%{warn}")
    return f"{obs.idle_action} after {obs.idle_minutes} min under {obs.idle_threshold:g}% GPU utilisation with no progress{warn}"


def cluster_cost(settings: Settings, selection: Selection) -> str:
    """The ClusterCostPerHour output: the whole cluster's worst case, in its market first."""
    n, w = settings.nodes, selection.worst_case(settings.nodes)
    return (f"{n} x {selection.pick.instance_type} or an alternate: at most {money(w.market)} {selection.market} "
            f"(ceiling {money(selection.ceiling)} per node); worst case all on-demand {money(w.on_demand)}, "
            f"all spot {money(w.spot)}")


def alternates_description(selection: Selection) -> str:
    head = (f"the whole job may move to one of these (rule {selection.interchange}), each at most "
            f"{money(selection.ceiling)} per node, {selection.market}")
    if not selection.rejected:
        return head
    first = "; ".join(f"{t}: {r}" for t, r in selection.rejected[:2])
    return f"{head}; {len(selection.rejected)} other candidates not taken, e.g. {first}"


def summary(settings: Settings, selection: Selection, job_definition: "JobDefinition | None" = None,
            notes: "list[str] | None" = None, cost: "list[str] | None" = None) -> str:
    pick, n = selection.pick, settings.nodes
    w, alone = selection.worst_case(n), selection.pick_cost(n)
    into = f" into {settings.capacity_reservation}" if settings.capacity_reservation else ""
    hint = "" if settings.max_price is not None else "; -c max_price=USD/h sets it"
    lines = [
        f"dl-launcher: profile {settings.profile.name} in {settings.region} ({_region_from(settings)}): "
        f"{n} x {pick.instance_type} ({pick.facts.accelerator_count} x {pick.facts.accelerator})",
        f"  why: {selection.recommendation.why}",
        f"  market: {selection.market}{into}; ceiling {selection.describe_ceiling()}{hint}",
        *([f"  expected on spot: {selection.expected_spot()}"] if selection.market == "spot" else []),
        f"  options (the pick, then the alternates under rule {selection.interchange}):",
        *(f"    {d}" for d in selection.describe_options()),
        f"  worst case, whole cluster: {money(w.market)} {selection.market} "
        f"(<= {n} x ceiling = {money(n * selection.ceiling)}; the pick alone, as quoted, {money(alone)}); "
        f"all on-demand {money(w.on_demand)}, all spot {money(w.spot)}",
    ]
    if selection.rejected:
        lines.append(f"  not taken ({len(selection.rejected)}):")
        lines += [f"    {t}: {r}" for t, r in selection.rejected[:SHOW_REJECTED]]
        if len(selection.rejected) > SHOW_REJECTED:
            lines.append(f"    ... and {len(selection.rejected) - SHOW_REJECTED} more")
    lines += cost or []
    if settings.budget:
        lines.append(f"  budget: ${settings.budget:,}/month on tag {contract.TAG_JOB}={settings.job} (AWS Budgets, "
                     f"to the topic at 80%, 100% and 100% forecast; activate the tag in Billing once)")
    lines += [f"  note: {n}" for n in notes or ()]
    obs = settings.observability
    if obs.enabled and obs.idle_guard and all(c.facts.sdk == "cuda" for c in selection.options):
        lines.append(f"  idle guard: {guard_line(obs)}")
    lines.append(f"  checkpoints: s3://<CheckpointBucket>/jobs/{settings.job}/")
    if settings.memory_tier_gb is not None:
        lines.append(memory_tier.line(settings.memory_tier_gb, n, _rams(selection)))
    lines += job_summary(settings, job_definition)
    return "\n".join(lines)


def _rams(selection: Selection) -> list[tuple[str, float]]:
    """(type, RAM GiB) of every type the cluster may launch: the pick and its alternates."""
    return [(c.instance_type, c.facts.memory_gib) for c in selection.options]


def _region_from(settings: Settings) -> str:
    source = settings.region_source
    return "-c region" if source == "context region" else source if source.isupper() else "the default"


def job_summary(settings: Settings, job: "JobDefinition | None") -> list[str]:
    """What the nodes will run, and with what: the code's size and file count, the rest by name
    (secret values are never known here; env values are shown, they are in the template too)."""
    if job is None:
        return [f"  job: no command; nodes wait for you (dl-launcher shell {settings.job})"]
    js = settings.job_settings
    lines = [f"  job: revision {job.sha256[:12]}; output to log group {contract.job_log_group(job.cluster)}"]
    if job.code is not None:
        lines.append(f"    code: {job.code.describe()} (staged in {job.code.stage_seconds:.1f} s); runs in "
                     f"{contract.DIR_DEFAULTS['DL_SCRATCH']}/work")
    if js.image:
        pinned = "@sha256:" in js.image
        lines.append(f"    image: {js.image}" + ("" if pinned else " (a tag can move: a node that pulls later, a "
                                                   "replacement, may run another image; pin it as IMAGE@sha256:DIGEST)"))
    if js.setup:
        first, more = js.setup.strip().splitlines()[0], len(js.setup.strip().splitlines()) > 1
        lines.append(f"    setup: {first[:80]}{' ...' if len(first) > 80 or more else ''}")
    if js.env:
        lines.append(f"    env: {', '.join(n for n, _ in js.env)}")
    if js.secrets:
        named = ", ".join(f"{n} ({a.split(':')[2]})" for n, a in js.secrets)
        lines.append(f"    secrets: {named}")
    if js.data:
        where = f"{contract.DIR_DEFAULTS['DL_SCRATCH']}/data/<bucket>/<prefix>"
        how = ("staged onto each node's scratch before the first generation" if js.data_mode == "stage" else
               f"on FSx for Lustre ({js.fsx_gib:,} GiB, {js.fsx_throughput} MB/s/TiB), mounted on each node")
        lines.append(f"    data: {', '.join(js.data)}: {how}, at {where}")
    if js.checkpoint_dir:
        lines.append(f"    checkpoints: what your framework completes in {contract.DIR_DEFAULTS['DL_SCRATCH']}/work/"
                     f"{js.checkpoint_dir} is uploaded and restored there before each generation")
    lines.append(f"    command: {settings.command.strip().splitlines()[0][:80] if settings.command else '(none: nodes wait)'}")
    return lines
