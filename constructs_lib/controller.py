"""The capacity controller's deployment: a Lambda function running constructs_lib.fleet (plain
Python, the decisions tested against moto), woken by EC2 state changes, spot warnings, a
one-minute schedule, and, on stack delete, a custom resource that terminates the cluster."""
from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
from constructs import Construct, IConstruct

from .bundle import PACKAGE, _copy, copy_core, staged
from .nag import env_names, nag_arn, resource_of
from .runtime import contract
from .validation import ConfigurationError

HANDLER = "constructs_lib.fleet.handler.handle"
# Why the role's CreateFleet allow-list holds fleets, instances, volumes, placement groups and images by type.
ASSIGNED = ("CreateFleet is allowed on this stack's launch templates and subnets only; the fleet, its instances "
            "and volumes get ids from EC2 at launch, and the image and placement group are the templates' own")
# EC2 states after which a node no longer counts, and the launch that may fill a gap.
STATE_EVENTS = ["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


def build_controller_code(dest_dir: str) -> None:
    """The Lambda package: constructs_lib/__init__.py, runtime/ (the contract), fleet/ and dl_core/."""
    for sub in ("runtime", "fleet"):
        src = os.path.join(PACKAGE, sub)
        for name in sorted(os.listdir(src)):
            if name.endswith(".py"):
                _copy(os.path.join(src, name), os.path.join(dest_dir, "constructs_lib", sub, name))
    _copy(os.path.join(PACKAGE, "__init__.py"), os.path.join(dest_dir, "constructs_lib", "__init__.py"))
    copy_core(dest_dir)  # AWS calls and fleet/cli.py's one-line errors


class CapacityController(Construct):
    """Keyword-only props:
      spec: the cluster spec (constructs_lib.fleet.spec.ClusterSpec's JSON fields; tokens allowed),
        or that JSON already rendered (a string token, e.g. one spec per CloudFormation condition).
      cluster: the cluster id (tag dl-launcher:cluster) it may launch and terminate.
      node_role: the nodes' role, which the fleet passes to the instances.
      state_bucket, state_key: where the controller keeps its state (one JSON object).
      log_group: where every transition is logged (the stack's alerts log group).
      teardown [True]: terminate the cluster when the stack is deleted (a custom resource that
        runs this function; off for emulators that cannot run Lambda).
      protect [()]: constructs the instances use (launch templates, security and placement
        groups): deleted only after the teardown.
    Attributes: function, role, schedule, state_rule, teardown (the custom resource, or None).
    """

    def __init__(self, scope: Construct, construct_id: str, *, spec: dict[str, Any] | str, cluster: str,
                 node_role: iam.IRole, state_bucket: s3.IBucket, state_key: str, log_group: logs.ILogGroup,
                 teardown: bool = True, protect: Sequence[IConstruct] = ()) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        # jsii's stubs keep each TypeScript parameter name, and ServicePrincipal, Role, Function and
        # LambdaFunction name some differently from the interfaces they implement: pyright then finds
        # no IPrincipal, IRole, IFunction or IRuleTarget in them (aws/jsii#4541), where jsii does.
        self.role = iam.Role(
            self, "Role", description=f"dl-launcher capacity controller for {cluster}: fleets of its nodes only",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        self._grant(cluster, node_role, state_bucket, state_key, log_group)
        self.function = lambda_.Function(
            self, "Function", runtime=lambda_.Runtime.PYTHON_3_14, handler=HANDLER,
            code=lambda_.Code.from_asset(staged(build_controller_code)), log_group=log_group,
            role=self.role,  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
            timeout=cdk.Duration.minutes(5), memory_size=256,
            description=f"dl-launcher: gang launch, replacement and whole-cluster fallback for {cluster}",
            environment={"DL_CLUSTER_SPEC": spec if isinstance(spec, str) else stack.to_json_string(spec)})
        cdk.Tags.of(self.function).add(contract.TAG_FUNCTION, contract.FUNCTION_CONTROLLER)
        # aws-cdk-lib's Function declares a DependsOn on its role that its GetAtt already implies;
        # cfn-lint warns (W3005) about CDK's code, not ours.
        resource_of(self.function).add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        target = targets.LambdaFunction(self.function)  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        self.schedule = events.Rule(self, "Every minute", schedule=events.Schedule.rate(cdk.Duration.minutes(1)),
                                    description=f"reconcile {cluster}: launch, replace or move the cluster")
        self.state_rule = events.Rule(
            self, "Instances", description="EC2 state changes and spot warnings (the function keeps its cluster's)",
            event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=[
                "EC2 Instance State-change Notification", "EC2 Spot Instance Interruption Warning"]))
        for rule in (self.schedule, self.state_rule):
            rule.add_target(target)  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        self.teardown: cdk.CustomResource | None = None
        if teardown:
            cr = self.teardown = cdk.CustomResource(self, "Teardown", service_token=self.function.function_arn,
                                    resource_type="Custom::DlLauncherClusterTeardown",
                                    properties={"Cluster": cluster})
            # Created after the role's policy, so the first call may launch; deleted first, so the
            # instances go before what they run on.
            for c in (self.role, *protect):
                cr.node.add_dependency(c)

    def end_with_job(self, *, bucket: s3.IBucket, prefix: str, on_end: str = "stop") -> None:
        """Act on the job's end: once the nodes record that the job finished or failed for good
        (s3://bucket/prefix/_cluster/finished.json or failed.json), terminate the cluster
        (on_end "stop", checkpoints stay) or keep its nodes ("keep"), and launch nothing more.
        Only for a job with a command: one without never ends.

        The nodes of such a job also hear from the controller when a member goes: on EC2's
        state-change event it writes s3://bucket/prefix/_cluster/gone/<node>.json, the record
        their liveness check reads (fleet/gone.py). For that the role may PutObject there, and
        nowhere else in the prefix (with kms:GenerateDataKey on the bucket's key, if it has one)."""
        from .fleet.job_end import JOB_END_ENV, ON_END, RECORDS, JobEndWatch

        if on_end not in ON_END:
            raise ConfigurationError(f"on_end {on_end!r}: allowed {', '.join(ON_END)}")
        stack = cdk.Stack.of(self)
        watch = {"bucket": bucket.bucket_name, "prefix": prefix, "on_end": on_end}
        if not cdk.Token.is_unresolved(prefix):
            try:
                JobEndWatch(**{**watch, "bucket": "stand-in-bucket"})
            except ValueError as e:
                raise ConfigurationError(f"end_with_job: {e}") from None
        self.function.add_environment(JOB_END_ENV, stack.to_json_string(watch))
        keys = [f"{prefix.rstrip('/')}/{contract.CLUSTER_DIR}/{name}" for _kind, name in RECORDS]
        # The two records only (never a checkpoint); ListBucket on exactly those keys makes S3
        # answer a record not written yet with 404 instead of 403.
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[bucket.arn_for_objects(k) for k in keys]))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[bucket.bucket_arn], conditions={"StringEquals": {"s3:prefix": keys}}))
        self._grant_gone(bucket, f"{prefix.rstrip('/')}/{contract.CLUSTER_DIR}/{contract.GONE_DIR}")

    def _grant_gone(self, bucket: s3.IBucket, directory: str) -> None:
        """Write, never read or list, the job's gone records: one object per node, named by its id."""
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:PutObject"], resources=[bucket.arn_for_objects(f"{directory}/*")]))
        if bucket.encryption_key is not None:  # SSE-KMS: a PutObject has S3 ask the key for a data key
            bucket.encryption_key.grant(self.role, "kms:GenerateDataKey")
        try:
            named = f"<{cdk.Stack.of(self).get_logical_id(resource_of(bucket))}.Arn>"
        except TypeError:  # an imported bucket: cdk-nag names it as its ARN is written
            return
        if not cdk.Token.is_unresolved(directory):
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{named}/{directory}/*]",
                reason="a gone record is named by the node's instance id, known only at run time; "
                       "PutObject only, confined to the job's gone directory"))

    def confine_launches(self, *, launch_templates: Sequence[ec2.LaunchTemplate], subnet_ids: Sequence[str],
                         security_groups: Sequence[ec2.ISecurityGroup] = ()) -> None:
        """Let the role launch, and only from `launch_templates`, into `subnet_ids` and (for the
        security groups this stack owns, which it tags with its id) with `security_groups` only;
        without it the role launches nothing. Then (with teardown) prove it at deploy time: a
        CreateFleet DryRun of every option from the role (Custom::DlLauncherLaunchCheck).

        Two authorizations, two shapes, each with what AWS's service authorization reference
        lists for it (tests/iam_reference.py checks every key against it):
        - CreateFleet acts on fleet, instance, image, launch-template, placement-group, subnet and
          volume, and none of them carries ec2:LaunchTemplate or ec2:Subnet (a Deny negating an
          absent key would deny every launch). So an allow-list: this stack's templates (a fleet
          always names one) and subnets (the controller's overrides name them) only; the rest,
          whose ids EC2 assigns, in this region.
        - An instant fleet launches its instances as RunInstances of the caller; there the
          reference lists ec2:LaunchTemplate (instance), ec2:Subnet (network interface) and the
          group's tags (security group): Denies on those keep out another team's template, a
          subnet outside the VPC and a group this stack does not own, launched by either call."""
        stack = cdk.Stack.of(self)
        arn = functools.partial(stack.format_arn, service="ec2", arn_format=cdk.ArnFormat.SLASH_RESOURCE_NAME)
        templates = [arn(resource="launch-template", resource_name=t.launch_template_id) for t in launch_templates]
        subnets = [arn(resource="subnet", resource_name=s) for s in subnet_ids]
        assigned = [arn(resource=kind, resource_name="*") for kind in ("fleet", "instance", "volume", "placement-group")]
        image = arn(resource="image", resource_name="*", account="")
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["ec2:CreateFleet"], resources=[*templates, *subnets, *assigned, image]))
        run = ["ec2:RunInstances"]
        instance = f"arn:{stack.partition}:ec2:*:*:instance/*"
        self.role.add_to_principal_policy(iam.PolicyStatement(
            effect=iam.Effect.DENY, actions=run, resources=[instance],
            conditions={"ArnNotEquals": {"ec2:LaunchTemplate": templates}}))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            effect=iam.Effect.DENY, actions=run, resources=[f"arn:{stack.partition}:ec2:*:*:network-interface/*"],
            conditions={"ArnNotEquals": {"ec2:Subnet": subnets}}))
        owned = [g for g in security_groups if isinstance(g, ec2.SecurityGroup)]
        if owned and len(owned) == len(security_groups):  # an imported group cannot carry the tag
            for g in owned:
                cdk.Tags.of(g).add(contract.TAG_STACK, stack.stack_id)
            self.role.add_to_principal_policy(iam.PolicyStatement(
                effect=iam.Effect.DENY, actions=run, resources=[f"arn:{stack.partition}:ec2:*:*:security-group/*"],
                conditions={"StringNotEquals": {f"aws:ResourceTag/{contract.TAG_STACK}": stack.stack_id}}))
        region, _account = env_names(cdk.Stack.of(self))
        for shown in [*(nag_arn(self, "ec2", f"{k}/*") for k in ("fleet", "instance", "volume", "placement-group")),
                      f"arn:<AWS::Partition>:ec2:{region}::image/*"]:
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{shown}]", reason=ASSIGNED))
        if self.teardown is not None:
            self._prove_launches(self.teardown, launch_templates, subnet_ids)

    def _prove_launches(self, teardown: cdk.CustomResource, launch_templates: Sequence[ec2.LaunchTemplate],
                        subnet_ids: Sequence[str]) -> None:
        """The deploy fails with AWS's reason when the role may not launch (fleet/launch_check.py).
        Its properties name what a launch depends on, so a new template version or subnet runs it again."""
        from .fleet.launch_check import RESOURCE_TYPE

        check = cdk.CustomResource(self, "LaunchCheck", service_token=self.function.function_arn,
                                   resource_type=RESOURCE_TYPE, properties={
                                       "Templates": [t.launch_template_id for t in launch_templates],
                                       "Versions": [t.latest_version_number for t in launch_templates],
                                       "Subnets": list(subnet_ids)})
        check.node.add_dependency(self.role)  # its policy too; the templates are referenced above
        # The teardown resource's create launches the cluster: only after the proof.
        teardown.node.add_dependency(check)

    def _grant(self, cluster: str, node_role: iam.IRole, bucket: s3.IBucket, key: str, log_group: logs.ILogGroup) -> None:
        stack = cdk.Stack.of(self)
        tag = contract.TAG_CLUSTER
        here = {"StringEquals": {"aws:RequestedRegion": stack.region}}
        statements = [
            # An instant fleet's instances are authorized as RunInstances, on resources whose ids
            # only EC2 knows (instances, interfaces, volumes) beside the templates, subnets, groups
            # and images: this region only (CreateFleet itself: confine_launches)...
            iam.PolicyStatement(actions=["ec2:RunInstances"], resources=["*"], conditions=here),
            # ...and never an instance that is not tagged as this cluster's, of this stack (two
            # statements: the keys of one condition would both have to differ to deny).
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=["ec2:CreateFleet", "ec2:RunInstances"],
                                resources=[f"arn:{stack.partition}:ec2:*:*:instance/*"],
                                conditions={"StringNotEquals": {f"aws:RequestTag/{tag}": cluster}}),
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=["ec2:CreateFleet", "ec2:RunInstances"],
                                resources=[f"arn:{stack.partition}:ec2:*:*:instance/*"],
                                conditions={"StringNotEquals": {f"aws:RequestTag/{contract.TAG_STACK}": stack.stack_id}}),
            iam.PolicyStatement(actions=["ec2:CreateTags"], resources=["*"],
                                conditions={"StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"],
                                                             "aws:RequestedRegion": stack.region}}),
            # The stack's cost tags onto the volumes of its nodes (which carry the cluster tag from
            # the launch template); the tags themselves come from the stack, read here.
            iam.PolicyStatement(actions=["ec2:CreateTags"],
                                resources=[f"arn:{stack.partition}:ec2:{stack.region}:{stack.account}:volume/*"],
                                conditions={"StringEquals": {f"ec2:ResourceTag/{tag}": cluster,
                                                             f"ec2:ResourceTag/{contract.TAG_STACK}": stack.stack_id}}),
            iam.PolicyStatement(actions=["cloudformation:DescribeStacks"], resources=[stack.stack_id]),
            iam.PolicyStatement(actions=["ec2:TerminateInstances"], resources=["*"],
                                conditions={"StringEquals": {f"ec2:ResourceTag/{tag}": cluster,
                                                             f"ec2:ResourceTag/{contract.TAG_STACK}": stack.stack_id}}),
            # Describe calls support no resource-level permissions.
            iam.PolicyStatement(actions=["ec2:DescribeInstances", "ec2:DescribeFleets",
                                         "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeCapacityReservations"],
                                resources=["*"], conditions=here),
            # The launch check's reason for a denial (which statement, which resource) in the deploy's error.
            iam.PolicyStatement(actions=["sts:DecodeAuthorizationMessage"], resources=["*"], conditions=here),
            iam.PolicyStatement(actions=["iam:PassRole"], resources=[node_role.role_arn],
                                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
            # EC2 Fleet and spot launch through their service-linked roles, made on first use.
            iam.PolicyStatement(actions=["iam:CreateServiceLinkedRole"], resources=["*"],
                                conditions={"StringEquals": {"iam:AWSServiceName": ["ec2fleet.amazonaws.com",
                                                                                     "spot.amazonaws.com"]}}),
            iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject"], resources=[bucket.arn_for_objects(key)]),
            # Without it S3 answers a read of the not-yet-written state with 403, not 404.
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
                                conditions={"StringEquals": {"s3:prefix": key}}),
            # A log group's Arn attribute already ends in ":*", which covers its streams.
            iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                resources=[log_group.log_group_arn]),
        ]
        for st in statements:
            self.role.add_to_principal_policy(st)
        # As cdk-nag names the resource: pseudo parameters where the stack's environment is open.
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::{nag_arn(self, 'ec2', 'volume/*')}]",
            reason=f"EC2 names the volumes at launch: tags only, and only on volumes tagged {tag}={cluster}"))
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]", reason=(
                "EC2 assigns the ids of the instances, interfaces, volumes and fleets a launch creates, describe "
                "calls support no resource-level permissions, and service-linked roles have fixed names: every "
                f"'*' is bound by a condition: this region, instances tagged {tag}={cluster} only (an explicit "
                "deny otherwise), tags only while launching, the two EC2 launch services")))
