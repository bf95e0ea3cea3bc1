"""One profile's training cluster as a product: what the training stack builds, with the choices
a user makes at launch as CloudFormation parameters (job name, instance type, market, nodes,
command), each held to what the platform team allows by AllowedValues/AllowedPattern and by
rules that refuse a bad combination before anything is created.

The same construct goes into a servicecatalog.ProductStack (the portfolio) or a plain stack
(`-c portfolio=NAME -c product=PROFILE`, e.g. for the local deploy into moto)."""
from __future__ import annotations

import re
from typing import Optional

import aws_cdk as cdk
from constructs import Construct

from constructs_lib import CheckpointBucket, InstanceOption, InterruptionAlerts, NodeOptions
from constructs_lib.choice_capacity import CapacityChoice, ChoiceCapacity
from constructs_lib.observability.cluster import ClusterObservability
from constructs_lib.runtime import contract
from constructs_lib.runtime.contract import JOB_NAME, TAG_CLUSTER, TAG_PRODUCT, capacity_state_key

from .network import existing_subnets, training_vpc
from .observability_settings import GUARD_DEFAULTS
from .product_plan import Choice, ProductPlan
from .selection import money
from constructs_lib.userdata import TOKEN_BYTES
from constructs_lib.validation import ConfigurationError

from .settings import COMMAND_LIMIT, HEREDOC, USER_DATA_LIMIT

JOB_PATTERN = f"^{JOB_NAME}$"
PARAMETER_VALUE_LIMIT = 4096  # CloudFormation's limit on a parameter value, in bytes
# One line of printable ASCII (so that characters are bytes in the user data's budget), without the
# job file's heredoc marker.
COMMAND_PATTERN = rf"^(?!.*{HEREDOC})[\x20-\x7E\t]*$"


def condition_id(choice: Choice) -> str:
    return "Use" + re.sub(r"[^A-Za-z0-9]", "", choice.instance_type.title()) + choice.market.title().replace("-", "")


class TrainingProduct(Construct):
    """Keyword-only props:
      plan: the product (dl_stacks.product_plan.plan_product).
      product_tag: the value of TAG_PRODUCT on everything it makes.
      vpc_id, subnet_ids, availability_zone [None]: the team's network (else a new VPC per launch).
      local [False]: the moto deploy (no Lambda-backed custom resources).
    Attributes: parameters (name -> CfnParameter), rules (CfnRule list), capacity (ChoiceCapacity),
    checkpoints, alerts.
    """

    def __init__(self, scope: Construct, construct_id: str, *, plan: ProductPlan, product_tag: str,
                 vpc_id: Optional[str] = None, subnet_ids: tuple[str, ...] = (),
                 availability_zone: Optional[str] = None, local: bool = False) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.plan = plan
        p = plan.profile
        self.parameters = self._parameters(stack, plan)
        job, nodes = self.parameters["JobName"], self.parameters["Nodes"]
        itype, market = self.parameters["InstanceType"], self.parameters["Market"]
        # The last choice is the otherwise: AllowedValues and the rules leave no other case (cfn-lint
        # proves it: with a condition of its own, it reports the remaining branch unreachable).
        conditions = {condition_id(plan.launchable[-1]): None}
        for c in plan.launchable[:-1]:
            conditions[condition_id(c)] = cdk.CfnCondition(stack, condition_id(c), expression=cdk.Fn.condition_and(
                cdk.Fn.condition_equals(itype.value_as_string, c.instance_type),
                cdk.Fn.condition_equals(market.value_as_string, c.market)))
        self.rules = self._rules(stack, plan)

        subnets = None
        if subnet_ids:
            vpc, subnets = existing_subnets(self, vpc_id=vpc_id, subnet_ids=subnet_ids,
                                            availability_zone=availability_zone)
        else:
            vpc = training_vpc(self, vpc_id=vpc_id, restrict_default_security_group=not local)
        self.checkpoints = CheckpointBucket(self, "Checkpoints")
        # The bucket is this launch's own, so one fixed prefix per product is enough.
        prefix = f"jobs/{p.name}"
        self.state_key = capacity_state_key(p.name)  # outside the prefix: no node may write it
        self.alerts = InterruptionAlerts(self, "Alerts")
        choices = [CapacityChoice(condition=conditions[condition_id(c)], market=c.market, options=[
            InstanceOption(o.facts, c.selection.prices[o.instance_type].in_market) for o in c.selection.options])
            for c in plan.launchable]
        self.capacity = ChoiceCapacity(
            self, "Cluster", vpc=vpc, subnets=subnets, cluster=job.value_as_string, choices=choices,
            nodes=cdk.Token.as_number(nodes.value_as_string), max_nodes=plan.max_nodes,
            state_bucket=self.checkpoints.bucket, state_key=self.state_key,
            log_group=self.alerts.log_group, teardown=not local,
            node_options=NodeOptions(root_volume_gib=p.root_volume_gib))
        self.capacity.enable_checkpoints(self.checkpoints, prefix)
        self.capacity.configure_job(command=self.parameters["Command"].value_as_string)
        limits = plan.limits
        # The minutes are the administrator's (portfolio limits); what counts as idle is the workload's.
        self.idle_threshold = GUARD_DEFAULTS.get(p.workload, GUARD_DEFAULTS["training"])[1]
        self.observability = ClusterObservability(
            self, "Observability", capacity=self.capacity, log_group=self.alerts.log_group,
            checkpoints=self.checkpoints.bucket, checkpoint_prefix=prefix, idle_guard=limits.idle_guard,
            idle_minutes=limits.idle_minutes, idle_action=limits.idle_action, alarm_status=not local,
            idle_threshold=self.idle_threshold)
        # Not on the agent's SSM parameter: a standard parameter costs nothing, and moto's CloudFormation
        # reads that type's tag map as a list. Nor, locally, on KMS keys, whose tags moto's
        # CloudFormation passes to its KMS in the wrong shape (both would fail the local deploy).
        skip = ["AWS::SSM::Parameter", *(["AWS::KMS::Key"] if local else [])]
        cdk.Tags.of(self).add(TAG_PRODUCT, product_tag, exclude_resource_types=skip)
        self._command_room()
        self._outputs(stack, plan, prefix)
        # What the dl-launcher CLI reads (dl_launcher/jobstack.py): the job, this product's mark
        # beside Service Catalog's AutoTags (docs/security.md), and where its controller keeps state.
        for key, value, why in (
                (contract.OUTPUT_JOB, job.value_as_string, "the job this launch runs: dl-launcher status JOB and "
                 "destroy JOB find it"),
                (contract.OUTPUT_PRODUCT, product_tag, "the dl-launcher product (portfolio/profile) this was "
                 "launched from"),
                (contract.OUTPUT_CLUSTER, job.value_as_string, f"the cluster id (tag {TAG_CLUSTER}) on every node"),
                (contract.OUTPUT_STATE_KEY, self.state_key, "the capacity controller's state, in CheckpointBucket")):
            cdk.CfnOutput(stack, key, value=value, description=why)

    @staticmethod
    def _parameters(stack: cdk.Stack, plan: ProductPlan) -> dict[str, cdk.CfnParameter]:
        p = plan.profile
        first = next(c for c in plan.launchable if c.instance_type == plan.instance_types[0])
        default_nodes = max(1, min(p.nodes, first.max_nodes))
        prices = "; ".join(f"{c.instance_type} {c.market} {money(c.ceiling)}" for c in plan.launchable)
        return {
            "JobName": cdk.CfnParameter(
                stack, "JobName", type="String", allowed_pattern=JOB_PATTERN, min_length=1, max_length=40,
                description="Names the cluster (tag dl-launcher:cluster), its metrics and its nodes; unique in the "
                            "account and region",
                constraint_description="1-40 lower-case letters, digits and dashes, starting with a letter or digit, "
                                       "e.g. llm-finetune-3"),
            "InstanceType": cdk.CfnParameter(
                stack, "InstanceType", type="String", allowed_values=list(plan.instance_types),
                default=plan.instance_types[0],
                description=(f"Profile {p.name}: the selector's candidates in {plan.region}, best first "
                             f"(catalog as of {plan.catalog_as_of})")[:4000],
                constraint_description=f"one of the types this product allows: {', '.join(plan.instance_types)}"),
            "Market": cdk.CfnParameter(
                stack, "Market", type="String", allowed_values=list(plan.markets), default=plan.default_market,
                description="spot: up to ~90% cheaper, may be reclaimed (the job resumes from its last checkpoint); "
                            "on-demand: not reclaimed",
                constraint_description=f"one of {', '.join(plan.markets)}"
                                       + (" (this product is spot-only)" if plan.markets == ("spot",) else "")),
            "Nodes": cdk.CfnParameter(
                stack, "Nodes", type="String", allowed_values=[str(n) for n in range(1, plan.max_nodes + 1)],
                default=str(default_nodes),
                description=(f"How many nodes (at most {plan.max_nodes}); per-node ceilings: {prices}")[:4000],
                constraint_description=f"a whole number from 1 to {plan.max_nodes} (the team's limit)"),
            "Command": cdk.CfnParameter(
                stack, "Command", type="String", default="", allowed_pattern=COMMAND_PATTERN,
                description="What every node runs, e.g. dl-torchrun train.py --epochs 3 (empty: the nodes wait "
                            "for you; connect with SSM)",
                constraint_description="set with the room the user data leaves (_command_room)"),
        }

    def _command_room(self) -> None:
        """The Command parameter's MaxLength: CloudFormation's 4 KB per parameter value, or less where
        EC2's 16 KB user data leaves less on the fullest node type (the synth's own check counts the
        parameter as a token of TOKEN_BYTES). Longer scripts go in the image or S3."""
        fullest = max(t.user_data_bytes() for t in self.capacity.templates)
        room = USER_DATA_LIMIT - fullest + TOKEN_BYTES
        if room < 256:
            raise ConfigurationError(f"the node's bootstrap leaves {room} bytes of user data for the command")
        command = self.parameters["Command"]
        command.max_length = min(COMMAND_LIMIT, PARAMETER_VALUE_LIMIT, room)
        command.constraint_description = (f"one line of printable ASCII, at most {command.max_length} characters, "
                                          f"without the word {HEREDOC}")

    @staticmethod
    def _rules(stack: cdk.Stack, plan: ProductPlan) -> list[cdk.CfnRule]:
        rules = []
        for name, condition, assertion, text in product_rules(plan):
            rules.append(cdk.CfnRule(stack, name, rule_condition=condition, assertions=[
                cdk.CfnRuleAssertion(assert_=assertion, assert_description=text)]))
        return rules

    def _outputs(self, stack: cdk.Stack, plan: ProductPlan, prefix: str) -> None:
        job = self.parameters["JobName"].value_as_string
        obs, limits = self.observability, plan.limits
        cdk.CfnOutput(stack, "NotificationTopic", value=obs.topic.topic_arn, description=(
            "the idle guard and the alarms tell this topic; subscribe: aws sns subscribe --protocol email "
            "--notification-endpoint you@example.com --topic-arn <this>"))
        cdk.CfnOutput(stack, "Dashboard", value=cdk.Fn.join("", [
            f"https://{stack.region}.console.aws.amazon.com/cloudwatch/home?region={stack.region}#dashboards/dashboard/",
            obs.dashboard.dashboard.dashboard_name]),
            description="GPU utilisation, the loader-bound pattern, samples/s and per dollar, cost so far, GPU health")
        cdk.CfnOutput(stack, "IdleGuard", value=(
            f"{limits.idle_action} after {limits.idle_minutes} min under {self.idle_threshold:g}% GPU utilisation with no progress"
            if obs.guard else "off"), description="a stopped cluster starts again with ResumeCommand")
        cap = self.capacity
        cdk.CfnOutput(stack, "NodeCostPerHour", value=cdk.Fn.join("", [
            "USD ", cap.per_choice(lambda o, f: f"{o.price:.4f}"), " per node-hour at most (",
            cap.per_choice(lambda o, f: f.instance_type), " ", self.parameters["Market"].value_as_string,
            f", catalog as of {plan.catalog_as_of}); the cluster: that times ",
            self.parameters["Nodes"].value_as_string]),
            description="the ceiling every node is held to; alternates the controller may move to cost no more")
        cdk.CfnOutput(stack, "CheckpointBucket", value=self.checkpoints.bucket.bucket_name,
                      description=f"checkpoints under s3://<bucket>/{prefix}/; kept after the product is terminated")
        cdk.CfnOutput(stack, "SsmSessionCommand", value=cdk.Fn.join("", [
            f"aws ssm start-session --region {stack.region} --target $(aws ec2 describe-instances --region "
            f"{stack.region} --filters Name=tag:{TAG_CLUSTER},Values=", job,
            " Name=instance-state-name,Values=running --query 'Reservations[0].Instances[0].InstanceId' --output text)"]))
        cdk.CfnOutput(stack, "AlertsLogGroup", value=self.alerts.log_group.log_group_name,
                      description="spot warnings and every decision of the capacity controller, with its reason")
        cdk.CfnOutput(stack, "CapacityStatusCommand", value=(
            f"python -m constructs_lib.fleet status --bucket {self.checkpoints.bucket.bucket_name} "
            f"--key {self.state_key}"),
            description="which type the cluster runs on, its nodes, and the controller's last transitions")
        cdk.CfnOutput(stack, "ResumeCommand", value=cdk.Fn.join("", [
            f"aws lambda invoke --region {stack.region} --function-name ",
            self.capacity.controller.function.function_name,
            " --cli-binary-format raw-in-base64-out --payload '{\"dl-launcher\": \"resume\"}' /dev/stdout"]),
            description="start the cluster again after a teardown stopped it (newest checkpoint)")


def product_rules(plan: ProductPlan):
    """(name, condition, assertion, description) for every (type, market) the team's limits
    restrict: fewer nodes than max_nodes under the $/hour cap, or none at all."""
    itype = cdk.Fn.ref("InstanceType")
    market = cdk.Fn.ref("Market")
    nodes = cdk.Fn.ref("Nodes")
    out = []
    for c in plan.choices:
        if c.selection is not None and c.max_nodes >= plan.max_nodes:
            continue
        condition = cdk.Fn.condition_and(cdk.Fn.condition_equals(itype, c.instance_type),
                                         cdk.Fn.condition_equals(market, c.market))
        name = "Limit" + condition_id(c)[3:]
        if c.selection is None or c.max_nodes == 0:
            why = c.why if c.selection is not None else f"{c.instance_type} cannot launch on {c.market}: {c.why}"
            assertion = cdk.Fn.condition_not(cdk.Fn.condition_equals(market, c.market))
            out.append((name, condition, assertion, why[:1000]))
        else:
            allowed = [str(n) for n in range(1, c.max_nodes + 1)]
            assertion = cdk.Fn.condition_contains(allowed, nodes)
            out.append((name, condition, assertion, c.why[:1000]))
    return out
