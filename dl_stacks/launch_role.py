"""The portfolio's launch role: what Service Catalog's CloudFormation uses to create a product,
so end users need no rights beyond servicecatalog:ProvisionProduct.

Least privilege by construction: the actions come from the resource types the product templates
actually declare (PERMISSIONS, one row per type; a type without a row stops the synth), and every
statement but CloudFormation's own holds only for calls CloudFormation makes on the role's
behalf (aws:CalledVia), in the portfolio's region. Service Catalog names the stacks it launches
SC-<account>-pp-<id>, so CloudFormation and IAM resources are held to names starting SC-.
"""
from __future__ import annotations

from typing import Iterable

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
from constructs import Construct

from constructs_lib.nag import env_names

# resource type -> (actions, resource pattern ('{p}' partition, '{r}' region, '{a}' account)).
# Reads are included: CloudFormation describes what it creates, and deletes on termination.
PERMISSIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "AWS::EC2::LaunchTemplate": (("ec2:CreateLaunchTemplate", "ec2:CreateLaunchTemplateVersion",
                                  "ec2:DeleteLaunchTemplate", "ec2:ModifyLaunchTemplate",
                                  "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions",
                                  "ec2:GetLaunchTemplateData", "ec2:CreateTags", "ec2:DeleteTags",
                                  "ssm:GetParameters"), "*"),
    "AWS::EC2::VPC": (("ec2:CreateVpc", "ec2:DeleteVpc", "ec2:DescribeVpcs", "ec2:ModifyVpcAttribute",
                       "ec2:DescribeVpcAttribute", "ec2:CreateTags", "ec2:DeleteTags"), "*"),
    "AWS::EC2::Subnet": (("ec2:CreateSubnet", "ec2:DeleteSubnet", "ec2:DescribeSubnets", "ec2:ModifySubnetAttribute",
                          "ec2:DescribeAvailabilityZones", "ec2:CreateTags"), "*"),
    "AWS::EC2::RouteTable": (("ec2:CreateRouteTable", "ec2:DeleteRouteTable", "ec2:DescribeRouteTables",
                              "ec2:CreateTags"), "*"),
    "AWS::EC2::SubnetRouteTableAssociation": (("ec2:AssociateRouteTable", "ec2:DisassociateRouteTable",
                                               "ec2:DescribeRouteTables"), "*"),
    "AWS::EC2::Route": (("ec2:CreateRoute", "ec2:DeleteRoute", "ec2:ReplaceRoute", "ec2:DescribeRouteTables"), "*"),
    "AWS::EC2::EIP": (("ec2:AllocateAddress", "ec2:ReleaseAddress", "ec2:DescribeAddresses", "ec2:CreateTags"), "*"),
    "AWS::EC2::NatGateway": (("ec2:CreateNatGateway", "ec2:DeleteNatGateway", "ec2:DescribeNatGateways",
                              "ec2:CreateTags"), "*"),
    "AWS::EC2::InternetGateway": (("ec2:CreateInternetGateway", "ec2:DeleteInternetGateway",
                                   "ec2:DescribeInternetGateways", "ec2:CreateTags"), "*"),
    "AWS::EC2::VPCGatewayAttachment": (("ec2:AttachInternetGateway", "ec2:DetachInternetGateway",
                                        "ec2:DescribeInternetGateways"), "*"),
    "AWS::EC2::VPCEndpoint": (("ec2:CreateVpcEndpoint", "ec2:DeleteVpcEndpoints", "ec2:ModifyVpcEndpoint",
                               "ec2:DescribeVpcEndpoints", "ec2:DescribePrefixLists"), "*"),
    "AWS::EC2::FlowLog": (("ec2:CreateFlowLogs", "ec2:DeleteFlowLogs", "ec2:DescribeFlowLogs",
                           "logs:CreateLogDelivery", "logs:DeleteLogDelivery"), "*"),
    "AWS::EC2::SecurityGroup": (("ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup",
                                 "ec2:DescribeSecurityGroups", "ec2:RevokeSecurityGroupEgress",
                                 "ec2:AuthorizeSecurityGroupEgress", "ec2:CreateTags"), "*"),
    "AWS::EC2::SecurityGroupIngress": (("ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress",
                                        "ec2:DescribeSecurityGroupRules"), "*"),
    "AWS::EC2::SecurityGroupEgress": (("ec2:AuthorizeSecurityGroupEgress", "ec2:RevokeSecurityGroupEgress",
                                       "ec2:DescribeSecurityGroupRules"), "*"),
    "AWS::EC2::PlacementGroup": (("ec2:CreatePlacementGroup", "ec2:DeletePlacementGroup",
                                  "ec2:DescribePlacementGroups", "ec2:CreateTags"), "*"),
    "AWS::IAM::Role": (("iam:CreateRole", "iam:DeleteRole", "iam:GetRole", "iam:TagRole", "iam:UntagRole",
                        "iam:UpdateRoleDescription", "iam:AttachRolePolicy", "iam:DetachRolePolicy",
                        "iam:PassRole", "iam:ListRolePolicies", "iam:ListAttachedRolePolicies"),
                       "arn:{p}:iam::{a}:role/SC-*"),
    "AWS::IAM::Policy": (("iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:GetRolePolicy"),
                         "arn:{p}:iam::{a}:role/SC-*"),
    "AWS::IAM::InstanceProfile": (("iam:CreateInstanceProfile", "iam:DeleteInstanceProfile", "iam:GetInstanceProfile",
                                   "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
                                   "iam:TagInstanceProfile"), "arn:{p}:iam::{a}:instance-profile/SC-*"),
    "AWS::Events::Rule": (("events:PutRule", "events:DeleteRule", "events:DescribeRule", "events:PutTargets",
                           "events:RemoveTargets", "events:TagResource"), "arn:{p}:events:{r}:{a}:rule/SC-*"),
    "AWS::Logs::LogGroup": (("logs:CreateLogGroup", "logs:DeleteLogGroup", "logs:PutRetentionPolicy",
                             "logs:DeleteRetentionPolicy", "logs:TagResource", "logs:TagLogGroup",
                             "logs:DescribeLogGroups", "logs:ListTagsForResource"), "arn:{p}:logs:{r}:{a}:log-group:*"),
    "AWS::Logs::MetricFilter": (("logs:PutMetricFilter", "logs:DeleteMetricFilter", "logs:DescribeMetricFilters"),
                                "arn:{p}:logs:{r}:{a}:log-group:*"),
    "AWS::Logs::ResourcePolicy": (("logs:PutResourcePolicy", "logs:DeleteResourcePolicy",
                                   "logs:DescribeResourcePolicies"), "*"),
    "AWS::S3::Bucket": (("s3:CreateBucket", "s3:DeleteBucket", "s3:PutEncryptionConfiguration",
                         "s3:PutBucketVersioning", "s3:PutBucketPublicAccessBlock", "s3:PutLifecycleConfiguration",
                         "s3:PutBucketLogging", "s3:PutBucketOwnershipControls", "s3:PutBucketTagging",
                         "s3:GetBucketLocation", "s3:ListBucket"), "arn:{p}:s3:::sc-*"),
    "AWS::S3::BucketPolicy": (("s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:GetBucketPolicy"),
                              "arn:{p}:s3:::sc-*"),
    "AWS::Lambda::Function": (("lambda:CreateFunction", "lambda:DeleteFunction", "lambda:GetFunction",
                               "lambda:UpdateFunctionCode", "lambda:UpdateFunctionConfiguration",
                               "lambda:TagResource", "lambda:PutFunctionConcurrency",
                               "lambda:DeleteFunctionConcurrency", "lambda:InvokeFunction"),
                              "arn:{p}:lambda:{r}:{a}:function:SC-*"),
    "AWS::Lambda::Permission": (("lambda:AddPermission", "lambda:RemovePermission"),
                                "arn:{p}:lambda:{r}:{a}:function:SC-*"),
    "AWS::CloudWatch::Alarm": (("cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:DescribeAlarms",
                                "cloudwatch:TagResource"), "arn:{p}:cloudwatch:{r}:{a}:alarm:SC-*"),
    "AWS::CloudWatch::Dashboard": (("cloudwatch:PutDashboard", "cloudwatch:DeleteDashboards",
                                    "cloudwatch:GetDashboard"), "arn:{p}:cloudwatch::{a}:dashboard/*"),
    # A training stack's -c budget (the resource schema's handlers: ModifyBudget, ViewBudget).
    "AWS::Budgets::Budget": (("budgets:ModifyBudget", "budgets:ViewBudget"),
                             "arn:{p}:budgets::{a}:budget/dl-launcher-job-*"),
    "AWS::SSM::Parameter": (("ssm:PutParameter", "ssm:DeleteParameter", "ssm:GetParameters", "ssm:AddTagsToResource",
                             "ssm:RemoveTagsFromResource"), "arn:{p}:ssm:{r}:{a}:parameter/dl-launcher/*"),
    "AWS::SNS::Topic": (("sns:CreateTopic", "sns:DeleteTopic", "sns:GetTopicAttributes", "sns:SetTopicAttributes",
                         "sns:TagResource", "sns:ListTagsForResource"), "arn:{p}:sns:{r}:{a}:SC-*"),
    "AWS::SNS::TopicPolicy": (("sns:SetTopicAttributes", "sns:GetTopicAttributes"), "arn:{p}:sns:{r}:{a}:SC-*"),
    # A key's id is made by KMS: CreateKey cannot be scoped by resource (still CloudFormation-only).
    "AWS::KMS::Key": (("kms:CreateKey", "kms:PutKeyPolicy", "kms:EnableKeyRotation", "kms:DescribeKey",
                       "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:ScheduleKeyDeletion", "kms:TagResource",
                       "kms:ListResourceTags", "kms:UpdateKeyDescription"), "*"),
    # -c data_mode=fsx. FSx makes its own network interfaces and service-linked roles (fsx and
    # s3.data-source.lustre.fsx); linking a bucket reads it and sets its event notifications for
    # the auto-import (the FSx for Lustre guide's prerequisites for data repository associations).
    "AWS::FSx::FileSystem": (("fsx:CreateFileSystem", "fsx:DeleteFileSystem", "fsx:DescribeFileSystems",
                              "fsx:UpdateFileSystem", "fsx:TagResource", "fsx:UntagResource",
                              "fsx:ListTagsForResource", "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface",
                              "ec2:DescribeNetworkInterfaces", "ec2:CreateNetworkInterfacePermission",
                              "ec2:DescribeSubnets", "ec2:DescribeVpcs", "ec2:DescribeSecurityGroups",
                              "iam:CreateServiceLinkedRole"), "*"),
    "AWS::FSx::DataRepositoryAssociation": (("fsx:CreateDataRepositoryAssociation",
                                             "fsx:DeleteDataRepositoryAssociation",
                                             "fsx:DescribeDataRepositoryAssociations",
                                             "fsx:UpdateDataRepositoryAssociation", "fsx:TagResource",
                                             "iam:CreateServiceLinkedRole", "iam:AttachRolePolicy",
                                             "iam:PutRolePolicy", "s3:ListBucket", "s3:GetBucketLocation",
                                             "s3:GetBucketNotification", "s3:PutBucketNotification"), "*"),
    # Custom resources are Lambda invocations (above): CloudFormation invokes the function.
    "Custom::VpcRestrictDefaultSG": ((), ""),
    "Custom::DlLauncherClusterTeardown": ((), ""),
    "Custom::DlLauncherLaunchCheck": ((), ""),
}


# What a role a product creates may ever do (its permissions boundary): exactly the actions that
# dl-launcher's node, controller, guard and job roles are granted (tests check every product role
# against it), and of IAM only passing SC- roles to EC2 and the EC2 launch services' linked roles.
# The launch role may create or change a role only with this boundary on it, so a product version
# (or whoever could edit one) cannot mint a role that manages IAM or does anything else.
# The data reads are held to where a product's data lives (issue 35): S3 to the buckets
# CloudFormation names for a launch (sc-...) and the portfolio's asset objects, SSM parameters to
# dl-launcher's own path; no secret at all (a product takes none).
BOUNDARY_ACTIONS = (
    "cloudformation:DescribeStacks",
    "cloudwatch:GetMetricData", "cloudwatch:ListMetrics", "cloudwatch:PutMetricData",
    "ec2:AuthorizeSecurityGroupEgress", "ec2:AuthorizeSecurityGroupIngress", "ec2:CreateFleet", "ec2:CreateTags",
    "ec2:DescribeCapacityReservations", "ec2:DescribeFleets", "ec2:DescribeInstances",
    "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeTags", "ec2:RevokeSecurityGroupEgress",
    "ec2:RevokeSecurityGroupIngress", "ec2:RunInstances", "ec2:TerminateInstances",
    "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage", "ec2messages:FailMessage",
    "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply",
    "ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetAuthorizationToken",
    "ecr:GetDownloadUrlForLayer",
    "kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*",
    "logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents",
    "sns:Publish",
    "sts:DecodeAuthorizationMessage",
    "ssm:DescribeParameters", "ssm:GetCommandInvocation", "ssm:SendCommand", "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)
# Reads and writes of a launch's own buckets (CloudFormation names them after the SC- stack).
BOUNDARY_S3 = ("s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:ListBucket",
               "s3:ListMultipartUploadParts", "s3:PutObject")
BOUNDARY_SSM_READS = ("ssm:GetParameter", "ssm:GetParameterHistory", "ssm:GetParameters")
# The role actions whose request carries iam:PermissionsBoundary (the role's boundary, or the new one).
BOUNDED_ROLE_ACTIONS = ("iam:CreateRole", "iam:AttachRolePolicy", "iam:DetachRolePolicy", "iam:PutRolePolicy",
                        "iam:DeleteRolePolicy")


def boundary_name(portfolio: str) -> str:
    return f"dl-launcher-{portfolio}-product-boundary"[:128]


class ProductRoleBoundary(Construct):
    """The managed policy every role of a product carries as its permissions boundary, by a fixed
    name (each account a portfolio is shared with deploys its own copy beside the launch role).
    Attributes: policy."""

    def __init__(self, scope: Construct, construct_id: str, *, portfolio: str, assets: str) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        p, a = stack.partition, stack.account
        self.policy = iam.ManagedPolicy(self, "Policy", managed_policy_name=boundary_name(portfolio),
                                        description="dl-launcher products: the most any role of a launch may do",
                                        statements=[
            iam.PolicyStatement(actions=list(BOUNDARY_ACTIONS), resources=["*"]),
            iam.PolicyStatement(actions=list(BOUNDARY_S3), resources=[f"arn:{p}:s3:::sc-*", f"arn:{p}:s3:::sc-*/*"]),
            # The node bundle and Lambda code, in the hub's asset bucket: read only.
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"arn:{p}:s3:::{assets}/*"]),
            iam.PolicyStatement(actions=list(BOUNDARY_SSM_READS),
                                resources=[f"arn:{p}:ssm:{stack.region}:{a}:parameter/dl-launcher/*"]),
            iam.PolicyStatement(actions=["iam:PassRole"], resources=[f"arn:{stack.partition}:iam::{stack.account}:role/SC-*"],
                                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
            iam.PolicyStatement(actions=["iam:CreateServiceLinkedRole"], resources=["*"],
                                conditions={"StringEquals": {"iam:AWSServiceName": ["ec2fleet.amazonaws.com",
                                                                                     "spot.amazonaws.com"]}}),
        ])
        why = ("a permissions boundary is a ceiling, not a grant: each role's own policy names its resources; the "
               "boundary holds launches to these actions, data reads to a launch's sc- buckets, the asset objects "
               "and dl-launcher's parameters, and to no IAM beyond passing SC- roles to EC2")
        region, account = env_names(stack)
        for finding in ["AwsSolutions-IAM5[Resource::*]",
                        f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:iam::{account}:role/SC-*]",
                        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::sc-*]",
                        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::sc-*/*]",
                        f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{assets}/*]",
                        f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ssm:{region}:{account}:parameter/dl-launcher/*]",
                        *(f"AwsSolutions-IAM5[Action::{a}]" for a in BOUNDARY_ACTIONS if a.endswith("*"))]:
            cdk.Validations.of(self.policy).acknowledge(cdk.Acknowledgment(id=finding, reason=why))


# Actions that AWS's service authorization reference lists with no resource type: granted on an
# ARN they would never apply (tests/iam_reference.py), so they go on "*" whatever their row names.
UNSCOPED_ACTIONS = frozenset({"logs:DescribeLogGroups"})


def permissions_for(resource_types: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """resource pattern -> sorted actions, for these types; a type without a row is a ValueError."""
    out: dict[str, set[str]] = {}
    for t in sorted(set(resource_types)):
        if t not in PERMISSIONS:
            raise ValueError(f"the launch role has no permissions for {t}: add its row to dl_stacks/launch_role.py")
        actions, resource = PERMISSIONS[t]
        for a in actions:
            out.setdefault("*" if a in UNSCOPED_ACTIONS else resource, set()).add(a)
    return {r: tuple(sorted(a)) for r, a in out.items()}


class LaunchRole(Construct):
    """iam.Role assumed by Service Catalog, with what the products' resource types need.

    Keyword-only props: resource_types (every type in every product template), assets (the
    bucket holding the products' assets: Lambda code and the node bundle, read at launch),
    role_name [generated]: a shared portfolio's launch role is found by name in each account.
    boundary: the permissions boundary every role it creates or changes must carry.
    Attributes: role.
    """

    def __init__(self, scope: Construct, construct_id: str, *, resource_types: Iterable[str],
                 assets: s3.IBucket, boundary: iam.IManagedPolicy, role_name: "str | None" = None) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        # Only Service Catalog acting for this account (the confused-deputy guard AWS documents).
        service = iam.ServicePrincipal("servicecatalog.amazonaws.com",
                                       conditions={"StringEquals": {"aws:SourceAccount": stack.account}})
        self.role = iam.Role(self, "Role", assumed_by=service,
                             role_name=role_name,
                             description="dl-launcher products: CloudFormation creates the product's resources, "
                                         "nothing else")
        via = {"ForAnyValue:StringEquals": {"aws:CalledVia": ["cloudformation.amazonaws.com"]},
               "StringEquals": {"aws:RequestedRegion": stack.region}}
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["cloudformation:CreateStack", "cloudformation:UpdateStack", "cloudformation:DeleteStack",
                     "cloudformation:DescribeStacks", "cloudformation:DescribeStackEvents",
                     "cloudformation:GetTemplateSummary", "cloudformation:SetStackPolicy",
                     "cloudformation:TagResource"],
            resources=[f"arn:{stack.partition}:cloudformation:{stack.region}:{stack.account}:stack/SC-*"]))
        # ValidateTemplate names no stack: AWS authorizes it on "*" only.
        self.role.add_to_principal_policy(iam.PolicyStatement(actions=["cloudformation:ValidateTemplate"],
                                                              resources=["*"]))
        # Service Catalog keeps each product version's template in its own bucket and tags it.
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:GetObject"], resources=["*"],
            conditions={"StringEquals": {"s3:ExistingObjectTag/servicecatalog:provisioning": "true"}}))
        # Lambda code and the node bundle, as CloudFormation creates the functions.
        self.role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:GetObject"],
                                                              resources=[assets.arn_for_objects("*")]))
        fill = dict(p=stack.partition, r=stack.region, a=stack.account)
        # As cdk-nag names them: pseudo parameters where the stack's environment is open.
        region, account = env_names(stack)
        shown = dict(p="<AWS::Partition>", r=region, a=account)
        owned = getattr(assets.node, "default_child", None)
        objects = f"<{stack.get_logical_id(owned)}.Arn>/*" if owned is not None else (
            f"arn:<AWS::Partition>:s3:::{assets.bucket_name}/*")
        wildcards = ["*", objects, "arn:{p}:cloudformation:{r}:{a}:stack/SC-*".format(**shown)]
        for resource, actions in permissions_for(resource_types).items():
            if resource == "*" and any(a.startswith("iam:") for a in actions):
                raise ValueError("internal: IAM actions must be held to SC- names")
            target = [resource.format(**fill) if resource != "*" else "*"]
            bounded = [a for a in actions if a in BOUNDED_ROLE_ACTIONS]
            if bounded:
                self.role.add_to_principal_policy(iam.PolicyStatement(actions=bounded, resources=target, conditions={
                    **via, "StringEquals": {**via["StringEquals"], "iam:PermissionsBoundary": boundary.managed_policy_arn}}))
            rest = [a for a in actions if a not in BOUNDED_ROLE_ACTIONS]
            if rest:
                self.role.add_to_principal_policy(iam.PolicyStatement(actions=rest, resources=target, conditions=via))
            wildcards.append(resource.format(**shown))
        reason = (
                "CloudFormation creates the product's VPC, subnets, launch templates and groups, whose ids EC2 "
                "assigns: every statement holds only for calls CloudFormation makes (aws:CalledVia) in this region, "
                "IAM, Lambda, Events, S3 and stacks are held to the SC- names Service Catalog gives a launch, "
                "template reads to objects Service Catalog tagged servicecatalog:provisioning, assets to the "
                "portfolio's asset bucket")
        for resource in dict.fromkeys(wildcards):
            cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{resource}]", reason=reason))
