"""Spot interruption warnings and rebalance recommendations, visible to operators."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import aws_cdk as cdk
import aws_cdk.aws_events as events
import aws_cdk.aws_logs as logs
import jsii
from constructs import Construct

if TYPE_CHECKING:
    import aws_cdk.aws_sns as sns
    from aws_cdk.interfaces.aws_events import IRuleRef

SPOT_EVENTS = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]


class InterruptionAlerts(Construct):
    """Every spot interruption warning and rebalance recommendation to a log group (and an SNS
    topic if given). The capacity controller writes its transitions (launches, replacements,
    moves, with their reasons and instance ids) to the same log group: pass `log_group` to it.

    EventBridge cannot filter spot warnings by tag, so the log group receives those for the whole
    account and region; each carries its instance id, and the controller's lines say which ids
    are this cluster's.
    """

    def __init__(self, scope: Construct, construct_id: str, *, topic: Optional["sns.ITopic"] = None,
                 retention: logs.RetentionDays = logs.RetentionDays.THREE_MONTHS) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Log", retention=retention, removal_policy=cdk.RemovalPolicy.DESTROY)
        self.spot_rule = events.Rule(self, "Spot", description="EC2 spot interruption warnings and rebalance recommendations",
                                     event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=SPOT_EVENTS))
        # The L2 log-group target installs its resource policy with a Lambda-backed custom
        # resource; a plain resource policy does the same with nothing to run. Only EventBridge,
        # only for this account, and log events only from this rule (EventBridge creates the
        # stream without a source ARN, so that statement is held to the account alone). The
        # policy names the rule, the rule names the log group: no cycle.
        stack = cdk.Stack.of(self)
        events_principal = {"Service": "events.amazonaws.com"}
        this_account = {"aws:SourceAccount": stack.account}
        logs.CfnResourcePolicy(self, "EventsMayWrite", policy_name=f"{cdk.Names.unique_id(self)[-200:]}-events",
                               policy_document=stack.to_json_string({
                                   "Version": "2012-10-17",
                                   "Statement": [{
                                       "Sid": "EventBridgeCreatesStreams",
                                       "Effect": "Allow", "Principal": events_principal,
                                       "Action": "logs:CreateLogStream",
                                       "Resource": self.log_group.log_group_arn,
                                       "Condition": {"StringEquals": this_account}}, {
                                       "Sid": "SpotRulePutsEvents",
                                       "Effect": "Allow", "Principal": events_principal,
                                       "Action": "logs:PutLogEvents",
                                       "Resource": self.log_group.log_group_arn,
                                       "Condition": {"StringEquals": this_account,
                                                     "ArnEquals": {"aws:SourceArn": self.spot_rule.rule_arn}}}]}))
        self.spot_rule.add_target(_LogGroupTarget(self.log_group))
        if topic is not None:
            import aws_cdk.aws_events_targets as targets
            # SnsTopic is an IRuleTarget whose jsii stub names bind's parameters differently (aws/jsii#4541).
            self.spot_rule.add_target(targets.SnsTopic(topic))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541


@jsii.implements(events.IRuleTarget)
class _LogGroupTarget:
    def __init__(self, log_group: logs.ILogGroup) -> None:
        self.log_group = log_group

    def bind(self, rule: "IRuleRef", id: Optional[str] = None) -> events.RuleTargetConfig:
        return events.RuleTargetConfig(arn=self.log_group.log_group_arn)
