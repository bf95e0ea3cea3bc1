"""The idle guard's deployment: a Lambda running constructs_lib.fleet.idle_watch on a schedule,
with exactly the rights its run needs (read the job's metrics, push checkpoints over SSM on the
cluster's nodes only, tear the cluster down through the capacity controller's state, publish to
one topic)."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
from constructs import Construct

from ..bundle import staged
from ..controller import build_controller_code
from ..fleet.handler import SPEC_ENV
from ..fleet.idle_watch import GUARD_ENV, GuardSettings
from ..nag import nag_arn, resource_of
from ..runtime import contract
from ..runtime.layout import MANIFEST
from ..validation import ConfigurationError

HANDLER = "constructs_lib.fleet.idle_watch.handle"
# The checkpoint push may take its 5 minutes; the teardown and the message fit in the rest.
TIMEOUT = cdk.Duration.minutes(8)


class IdleGuard(Construct):
    """Stops paying for idle GPUs. Every `every`, the guard judges the cluster (see
    constructs_lib/fleet/idle_guard.py): every GPU under `threshold_pct` for `idle_minutes` AND
    the training process gone or no checkpoint completed in that time, never within
    `grace_minutes` of a boot or a restore, never on missing data. Then, with action "stop", it
    pushes the newest checkpoint from every node, tears the cluster down through the capacity
    controller (resumable: `python -m constructs_lib.fleet reconcile --resume`) and tells `topic`;
    with "notify" it only tells.

    Keyword-only props (defaults in brackets):
      cluster: the cluster id (tag dl-launcher:cluster and the metrics' Job dimension).
      spec: the capacity controller's spec (the same dict ClusterCapacity gives its controller).
      state_bucket, state_key: the controller's state (the guard stores `stopped` there).
      expected_gpus: GPUs per node for each of the cluster's instance types (the catalog's).
      topic: where the decision goes.
      log_group: where each run's decision is logged (the stack's alerts log group).
      checkpoints [None], checkpoint_prefix [""]: where complete checkpoints land (progress).
      threshold_pct [5], idle_minutes [30], grace_minutes [20], action ["stop"], every [5 min].
      interactive [False]: a development cluster: an open Session Manager session, a process on a
        GPU or a busy GPU is work (a training cluster's progress test does not apply).
      warning_minutes [0]: warn (topic, and `job_log_group`) this long before acting; 0 acts at once.
      job_log_group [None]: the job's log group (JobLogs.log_group), where warnings go too.
      neuron_types [()]: types whose nodes are judged by the node monitor's busiest NeuronCore
        (contract.M_NEURON_UTIL, one series per node) instead of the agent's per-GPU NVIDIA utilisation.
    The guard keeps its last judgement at contract.guard_state_key(cluster) in `state_bucket`
    (`dl-launcher status` shows it).
    Attributes: function, role, schedule.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: str, spec: "Mapping[str, Any] | str",
                 state_bucket: s3.IBucket, state_key: str, expected_gpus: Mapping[str, int], topic: sns.ITopic,
                 log_group: logs.ILogGroup, checkpoints: Optional[s3.IBucket] = None, checkpoint_prefix: str = "",
                 threshold_pct: float = 5.0, idle_minutes: float = 30.0, grace_minutes: float = 20.0,
                 action: str = "stop", every: cdk.Duration = cdk.Duration.minutes(5), interactive: bool = False,
                 warning_minutes: float = 0.0, job_log_group: Optional[logs.ILogGroup] = None,
                 neuron_types: Sequence[str] = ()) -> None:
        super().__init__(scope, construct_id)
        if checkpoints is not None and not checkpoint_prefix:
            raise ConfigurationError("IdleGuard: checkpoints needs checkpoint_prefix (where the job's steps land)")
        if every.to_minutes() * 2 > idle_minutes:
            raise ConfigurationError(f"IdleGuard: every ({every.to_minutes():g} min) must be at most half of "
                                     f"idle_minutes ({idle_minutes:g}): otherwise idleness is seen late")
        stack = cdk.Stack.of(self)
        try:
            settings = GuardSettings(
                job=cluster, topic_arn=topic.topic_arn, expected_gpus=dict(expected_gpus),
                checkpoint_bucket=checkpoints.bucket_name if checkpoints is not None else "",
                checkpoint_prefix=checkpoint_prefix, action=action, stack=cdk.Stack.of(self).stack_id,
                interactive=interactive, warning_minutes=warning_minutes, state_bucket=state_bucket.bucket_name,
                job_log_group=job_log_group.log_group_name if job_log_group is not None else "", neuron_types=list(neuron_types),
                config={"threshold_pct": threshold_pct, "idle_minutes": idle_minutes, "grace_minutes": grace_minutes})
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"IdleGuard: {e}") from None
        # As in the controller: pyright finds no IPrincipal, IRole, IFunction or IRuleTarget in these,
        # whose jsii stubs name some parameters differently from the interfaces' (aws/jsii#4541).
        self.role = iam.Role(
            self, "Role", description=f"dl-launcher idle guard for {cluster}: its metrics, its nodes, its topic",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        self.function = lambda_.Function(
            self, "Function", runtime=lambda_.Runtime.PYTHON_3_14, handler=HANDLER,
            code=lambda_.Code.from_asset(staged(build_controller_code)), log_group=log_group,
            role=self.role,  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
            timeout=TIMEOUT, memory_size=256,
            # A run may outlast the schedule (a slow final push): one at a time, never two stops at once.
            reserved_concurrent_executions=1,
            description=f"dl-launcher: stops {cluster} when every GPU idles and the job makes no progress",
            environment={SPEC_ENV: spec if isinstance(spec, str) else stack.to_json_string(dict(spec)),
                         GUARD_ENV: stack.to_json_string(_settings_dict(settings))})
        # As for the controller: aws-cdk-lib's own DependsOn on the role, which cfn-lint flags.
        resource_of(self.function).add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        self.schedule = events.Rule(self, "Schedule", schedule=events.Schedule.rate(every),
                                    description=f"judge whether {cluster} is idle")
        target = targets.LambdaFunction(self.function)  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        self.schedule.add_target(target)  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        self._grant(cluster, state_bucket, state_key, checkpoints, checkpoint_prefix, topic, log_group, job_log_group)

    def _grant(self, cluster: str, state_bucket: s3.IBucket, state_key: str, checkpoints: Optional[s3.IBucket],
               prefix: str, topic: sns.ITopic, log_group: logs.ILogGroup, job_log_group: Optional[logs.ILogGroup]) -> None:
        stack = cdk.Stack.of(self)
        tag = contract.TAG_CLUSTER
        here = {"StringEquals": {"aws:RequestedRegion": stack.region}}
        statements = [
            # Metric reads support no resource-level permissions.
            iam.PolicyStatement(actions=["cloudwatch:GetMetricData", "cloudwatch:ListMetrics"], resources=["*"],
                                conditions=here),
            iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"], conditions=here),
            iam.PolicyStatement(actions=["ec2:TerminateInstances"], resources=["*"],
                                conditions={"StringEquals": {f"ec2:ResourceTag/{tag}": cluster,
                                                             f"ec2:ResourceTag/{contract.TAG_STACK}": stack.stack_id}}),
            # The final push: AWS-RunShellScript only, on this cluster's nodes only.
            iam.PolicyStatement(actions=["ssm:SendCommand"], resources=[
                stack.format_arn(service="ssm", account="", resource="document", resource_name="AWS-RunShellScript")]),
            iam.PolicyStatement(actions=["ssm:SendCommand"],
                                resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
                                conditions={"StringEquals": {f"ssm:resourceTag/{tag}": cluster,
                                                             f"ssm:resourceTag/{contract.TAG_STACK}": stack.stack_id}}),
            iam.PolicyStatement(actions=["ssm:GetCommandInvocation"], resources=["*"], conditions=here),
            # The controller's state: the guard stores `stopped` under the controller's lease.
            iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject"], resources=[
                state_bucket.arn_for_objects(state_key), state_bucket.arn_for_objects(contract.guard_state_key(cluster))]),
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[state_bucket.bucket_arn],
                                conditions={"StringEquals": {"s3:prefix": state_key}}),
            iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[
                log_group.log_group_arn, *([job_log_group.log_group_arn] if job_log_group is not None else [])]),
        ]
        if checkpoints is not None:
            statements += [
                iam.PolicyStatement(actions=["s3:ListBucket"], resources=[checkpoints.bucket_arn],
                                    conditions={"StringEquals": {"s3:prefix": f"{prefix.rstrip('/')}/"}}),
                # Only the manifests: when the newest step completed, never the weights.
                iam.PolicyStatement(actions=["s3:GetObject"],
                                    resources=[checkpoints.arn_for_objects(f"{prefix.rstrip('/')}/*/{MANIFEST}")]),
            ]
        for st in statements:
            self.role.add_to_principal_policy(st)
        topic.grant_publish(self.role)
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]", reason=(
                "CloudWatch metric reads, DescribeInstances and GetCommandInvocation support no resource-level "
                "permissions (held to this region); TerminateInstances "
                f"is held to instances tagged {tag}={cluster}")))
        findings = {
            f"AwsSolutions-IAM5[Resource::{nag_arn(self, 'ec2', 'instance/*')}]": (
                f"instance ids are assigned at launch: SendCommand is held to instances tagged {tag}={cluster}"),
            "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]": (
                "publishing to an encrypted topic needs a data key of the topic's one key (aws-cdk-lib's grant)"),
        }
        # A bucket of this app's own, as cdk-nag names it; an imported one has no resource here to
        # name (its wildcard is the deployer's to acknowledge, as cdk-nag then names it by its ARN).
        bucket = checkpoints.node.default_child if checkpoints is not None else None
        if isinstance(bucket, cdk.CfnResource):
            bucket_id = stack.get_logical_id(bucket)
            findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{prefix.rstrip('/')}/*/{MANIFEST}]"] = (
                "one manifest per checkpoint step, whose names the job makes: only the manifests, never the weights")
        for finding, reason in findings.items():
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))


def _settings_dict(settings: GuardSettings) -> dict[str, Any]:
    import dataclasses
    return dataclasses.asdict(settings)

