"""The topic the idle guard and the alarms tell: encrypted with a key of its own, because
CloudWatch alarms cannot publish to a topic under the AWS-managed aws/sns key (its policy cannot
name the cloudwatch.amazonaws.com principal)."""
from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_kms as kms
import aws_cdk.aws_sns as sns
from constructs import Construct


class NotificationTopic(Construct):
    """An SNS topic that takes only TLS, encrypted with a rotating customer-managed key that
    CloudWatch alarms of this account may use. Subscribe people with `add_email` or the console.

    Keyword-only props:
      display_name [""]: what an email subscriber sees as the sender.
    Attributes: topic, key.
    """

    def __init__(self, scope: Construct, construct_id: str, *, display_name: str = "") -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY,
                           description=f"dl-launcher notifications of {stack.stack_name}")
        # ServicePrincipal is an IPrincipal and Key an IKey, to jsii; their stubs name some parameters
        # differently from the interfaces', so pyright sees neither (aws/jsii#4541).
        cloudwatch: iam.IPrincipal = (
            iam.ServicePrincipal("cloudwatch.amazonaws.com"))  # pyright: ignore[reportAssignmentType]  # jsii stub: aws/jsii#4541
        self.key.add_to_resource_policy(iam.PolicyStatement(
            principals=[cloudwatch],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],  # in a key policy, "*" is this key
            conditions={"StringEquals": {"aws:SourceAccount": stack.account}}))
        self.topic = sns.Topic(self, "Topic", enforce_ssl=True, display_name=display_name or None,
                               master_key=self.key)  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541

    def allow_budgets(self) -> None:
        """Let AWS Budgets of this account publish here (the topic's policy and its key's)."""
        account = cdk.Stack.of(self).account
        budgets: iam.IPrincipal = (
            iam.ServicePrincipal("budgets.amazonaws.com"))  # pyright: ignore[reportAssignmentType]  # jsii stub: aws/jsii#4541
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            principals=[budgets], actions=["sns:Publish"], resources=[self.topic.topic_arn],
            conditions={"StringEquals": {"aws:SourceAccount": account}}))
        self.key.add_to_resource_policy(iam.PolicyStatement(
            principals=[budgets], actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": account}}))

    def grant_publish(self, grantee: iam.IGrantable) -> iam.Grant:
        """sns:Publish on the topic (aws-cdk-lib adds the key's Decrypt and GenerateDataKey*)."""
        return self.topic.grant_publish(grantee)
