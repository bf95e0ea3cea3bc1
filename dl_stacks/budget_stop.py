"""The portfolio's budget stopper (constructs_lib.fleet.budget_stop): one function, woken by the
stop topic of each product whose team opted in (budget_action = "stop"), that stops that
product's clusters through their controllers and tells the budget topic what it did."""
from __future__ import annotations

from typing import Mapping

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_sns_subscriptions as subs
from constructs import Construct

from constructs_lib.bundle import staged
from constructs_lib.controller import build_controller_code
from constructs_lib.nag import nag_arn
from constructs_lib.fleet.budget_stop import ALERTS_ENV, TOPICS_ENV
from constructs_lib.runtime.contract import FUNCTION_CONTROLLER, TAG_FUNCTION, TAG_PRODUCT


class BudgetStopper(Construct):
    """Keyword-only props: topics ({product tag value: its stop topic}), alerts (the topic told).
    Attributes: function, role."""

    def __init__(self, scope: Construct, construct_id: str, *, topics: Mapping[str, sns.ITopic],
                 alerts: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                             description="dl-launcher budget stopper: the opted-in products' controllers only")
        log_group = logs.LogGroup(self, "Log", retention=logs.RetentionDays.ONE_YEAR,
                                  removal_policy=cdk.RemovalPolicy.DESTROY)
        self.function = lambda_.Function(
            self, "Function", runtime=lambda_.Runtime.PYTHON_3_14, handler="constructs_lib.fleet.budget_stop.handle",
            code=lambda_.Code.from_asset(staged(build_controller_code)), role=self.role, log_group=log_group,
            timeout=cdk.Duration.minutes(1), memory_size=128,
            description="dl-launcher: stops a product's clusters when its monthly budget is spent",
            environment={TOPICS_ENV: stack.to_json_string({t.topic_arn: p for p, t in topics.items()}),
                         ALERTS_ENV: alerts.topic_arn})
        self.function.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        for topic in topics.values():
            topic.add_subscription(subs.LambdaSubscription(self.function))
        here = {"StringEquals": {"aws:RequestedRegion": stack.region}}
        self.role.add_to_principal_policy(iam.PolicyStatement(actions=["tag:GetResources"], resources=["*"],
                                                              conditions=here))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["lambda:InvokeFunction"],
            resources=[f"arn:{stack.partition}:lambda:{stack.region}:{stack.account}:function:*"],
            conditions={"StringEquals": {f"aws:ResourceTag/{TAG_FUNCTION}": FUNCTION_CONTROLLER,
                                         f"aws:ResourceTag/{TAG_PRODUCT}": sorted(topics)}}))
        alerts.grant_publish(self.role)
        log_group.grant_write(self.role)
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
            reason="publishing to an encrypted topic needs a data key of the topic's one key (aws-cdk-lib's grant)"))
        for resource, why in (("*", "tag:GetResources supports no resource-level permissions"),
                              (nag_arn(self, "lambda", "function:*"),
                               "controller functions are named at each launch: invocation is held to functions "
                               f"tagged {TAG_FUNCTION}={FUNCTION_CONTROLLER} and {TAG_PRODUCT} of an opted-in product")):
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{resource}]", reason=why))
