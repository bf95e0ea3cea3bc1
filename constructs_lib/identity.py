"""Who a cluster's nodes are: one role (SSM Session Manager instead of SSH), its instance
profile and one security group, shared by every launch template of the cluster."""
from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import jsii
from constructs import Construct

from .nag import nag_arn
from .runtime import contract

# What the SSM Agent calls for Session Manager (ssmmessages, ssm) and for its message polling
# (ec2messages), each named: no wildcard actions.
SESSION_MANAGER_ACTIONS = [
    "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel",
    "ssm:UpdateInstanceInformation",
    "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage", "ec2messages:FailMessage",
    "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply",
]
HTTPS_OUT = "AWS APIs (SSM, S3, EC2), container and package mirrors"
EFA_WITHIN = "EFA and NCCL between nodes"


@jsii.implements(iam.IGrantable, ec2.IConnectable)
class NodeIdentity(Construct):
    """The nodes' role, instance profile and security group; pass it as `identity=` to every
    GpuLaunchTemplate of a cluster, so that alternates share one of each.

    Keyword-only props (defaults in brackets):
      vpc: the VPC of the security group made here.
      efa [False]: the group made here allows all traffic to and from itself (EFA's OS-bypass
        traffic and NCCL need every protocol) besides HTTPS out; otherwise HTTPS out only.
      label [None]: what the role's and group's descriptions call the nodes (their type).
      role [a new role with SSM Session Manager].
      instance_profile [a new one for `role`].
      security_group [a new group, as `efa` says].

    Attributes: role, instance_profile, security_group, efa (whether the group made here carries
    EFA; None for a given group), grant_principal (the role), connections.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, efa: bool = False,
                 label: Optional[str] = None, role: Optional[iam.IRole] = None,
                 instance_profile: Optional[iam.IInstanceProfile] = None,
                 security_group: Optional[ec2.ISecurityGroup] = None) -> None:
        super().__init__(scope, construct_id)
        self.role = role or self._ssm_role(label)
        # One instance profile per role: the L2 launch template would make one per template.
        self.instance_profile = instance_profile or iam.InstanceProfile(self, "Profile", role=self.role)
        self.efa: Optional[bool] = None if security_group else efa
        self.security_group = security_group or self._security_group(vpc, efa, label)

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self.role.grant_principal

    @property
    def connections(self) -> ec2.Connections:
        return ec2.Connections(security_groups=[self.security_group])

    def grant_find_peers(self) -> iam.Grant:
        """ec2:DescribeInstances, with which a node finds its peers by the cluster tag."""
        grant = iam.Grant.add_to_principal(grantee=self.role, actions=["ec2:DescribeInstances"], resource_arns=["*"])
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="ec2:DescribeInstances supports no resource-level permissions; nodes use it read-only to "
                   "find their peers by tag"))
        return grant

    def grant_monitoring(self, cluster: str) -> None:
        """What the CloudWatch agent and the node monitor need: PutMetricData to dl-launcher's two
        namespaces only, and the health tag on this cluster's instances only (a node marks itself
        for replacement; DescribeTags reads whether it already did)."""
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": [contract.NS_NODE, contract.NS_JOB]}}))
        self.role.add_to_principal_policy(iam.PolicyStatement(actions=["ec2:DescribeTags"], resources=["*"]))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["ec2:CreateTags"], resources=[cdk.Stack.of(self).format_arn(
                service="ec2", resource="instance", resource_name="*")],
            conditions={"StringEquals": {f"ec2:ResourceTag/{contract.TAG_CLUSTER}": cluster,
                                         f"ec2:ResourceTag/{contract.TAG_STACK}": cdk.Stack.of(self).stack_id},
                        "ForAllValues:StringEquals": {"aws:TagKeys": [contract.TAG_HEALTH]}}))
        cdk.Validations.of(self.role).acknowledge(cdk.Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::{nag_arn(self, 'ec2', 'instance/*')}]",
            reason=f"a node tags itself for replacement: only {contract.TAG_HEALTH}, only on instances tagged "
                   f"{contract.TAG_CLUSTER}={cluster} (instance ids are assigned at launch)"))

    def _ssm_role(self, label: Optional[str]) -> iam.IRole:
        # Exactly what the SSM Agent needs for Session Manager (AWS's own AWSCloud9SSMInstanceProfile:
        # ssmmessages channels and ssm:UpdateInstanceInformation) and for its ec2messages polling.
        # Not AmazonSSMManagedInstanceCore: that also grants ssm:GetParameter* on every parameter
        # of the account (and documents, associations, inventory), which no node needs.
        # ServicePrincipal is an IPrincipal and Role an IRole, to jsii; their stubs name some parameters
        # differently from the interfaces', so pyright sees neither (aws/jsii#4541).
        role = iam.Role(
            self, "Role", description=f"dl-launcher node{f' ({label})' if label else ''}: SSM Session Manager",
            inline_policies={"SessionManager": iam.PolicyDocument(statements=[iam.PolicyStatement(
                actions=SESSION_MANAGER_ACTIONS, resources=["*"])])},
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))  # pyright: ignore[reportArgumentType]  # jsii stub: aws/jsii#4541
        cdk.Validations.of(role).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="the SSM Agent's ssmmessages and ec2messages actions support no resource-level permissions, and "
                   "AWS documents Resource * for ssm:UpdateInstanceInformation from an instance profile; "
                   "ec2:DescribeInstances (grant_find_peers), ec2:DescribeTags and cloudwatch:PutMetricData "
                   "(grant_monitoring: held to dl-launcher's namespaces) likewise have none"))
        return role  # pyright: ignore[reportReturnType]  # jsii stub: aws/jsii#4541

    def _security_group(self, vpc: ec2.IVpc, efa: bool, label: Optional[str]) -> ec2.SecurityGroup:
        if not efa:
            sg = ec2.SecurityGroup(self, "Sg", vpc=vpc, allow_all_outbound=False,
                                   description=f"{label or 'dl-launcher'} node: HTTPS out only")
        else:
            # Under "Efa", where EfaNetworking made it before: GpuLaunchTemplate adds its identity
            # as its "Default" child, so the logical id stays and an update does not replace
            # the group that running nodes talk EFA through.
            sg = ec2.SecurityGroup(Construct(self, "Efa"), "Sg", vpc=vpc, allow_all_outbound=False,
                                   description=f"EFA nodes{f' ({label})' if label else ''}: all traffic within the group")
            sg.add_ingress_rule(sg, ec2.Port.all_traffic(), EFA_WITHIN)
            sg.add_egress_rule(sg, ec2.Port.all_traffic(), EFA_WITHIN)
        sg.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), HTTPS_OUT)
        return sg
