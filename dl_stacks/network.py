"""The VPC of a training stack: new by default, or an existing one by id."""
from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
from constructs import Construct


def existing_subnets(scope: Construct, *, vpc_id: str, subnet_ids: tuple[str, ...],
                     availability_zone: str) -> tuple[ec2.IVpc, ec2.SubnetSelection]:
    """An existing VPC and its private subnets in one AZ, named in context: no lookup, so the
    app synthesizes without credentials."""
    vpc = ec2.Vpc.from_vpc_attributes(scope, "Vpc", vpc_id=vpc_id, availability_zones=[availability_zone])
    subnets = []
    for i, sid in enumerate(subnet_ids):
        subnet = ec2.Subnet.from_subnet_attributes(scope, f"Subnet{i}", subnet_id=sid, availability_zone=availability_zone)
        # Nothing here adds routes: the subnet's route table is the platform team's business.
        cdk.Annotations.of(subnet).acknowledge_warning(
            "@aws-cdk/aws-ec2:noSubnetRouteTableId", "the stack adds no routes to an existing subnet")
        subnets.append(subnet)
    return vpc, ec2.SubnetSelection(subnets=subnets)


def training_vpc(scope: Construct, *, vpc_id: str | None, restrict_default_security_group: bool = True) -> ec2.IVpc:
    """New: one AZ (a cluster placement group cannot span AZs), private subnets for the nodes
    (EFA nodes cannot take public IPs), one NAT gateway for package mirrors and SSM, a free S3
    gateway endpoint so checkpoint traffic skips the NAT, and flow logs. The VPC's default
    security group is stripped of its rules (a Lambda-backed custom resource; off only for the
    local moto deploy, which cannot run Lambda)."""
    if vpc_id:  # a lookup: needs credentials on the first synth, then cdk.context.json has it
        return ec2.Vpc.from_lookup(scope, "Vpc", vpc_id=vpc_id)
    vpc = ec2.Vpc(
        scope, "Vpc", max_azs=1, nat_gateways=1, ip_addresses=ec2.IpAddresses.cidr("10.42.0.0/16"),
        subnet_configuration=[
            ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
            ec2.SubnetConfiguration(name="nodes", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
        ],
        gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        restrict_default_security_group=restrict_default_security_group,
    )
    vpc.add_flow_log("FlowLog", traffic_type=ec2.FlowLogTrafficType.REJECT)
    cdk.Tags.of(vpc).add("dl-launcher:vpc", "training")
    if restrict_default_security_group:
        _quiet_cdk_provider_lint(cdk.Stack.of(scope))
    return vpc


def _quiet_cdk_provider_lint(stack: cdk.Stack) -> None:
    """CDK's own provider for emptying the default security group declares a DependsOn that its
    GetAtt already implies; cfn-lint warns (W3005) about CDK's code, not ours."""
    provider = stack.node.try_find_child("Custom::VpcRestrictDefaultSGCustomResourceProvider")
    handler = provider.node.try_find_child("Handler") if provider else None
    if isinstance(handler, cdk.CfnResource):
        handler.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
