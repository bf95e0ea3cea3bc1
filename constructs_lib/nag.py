"""How cdk-nag names a resource in a finding id, so that an acknowledgment matches whether the
stack's account and region are known at synth (`cdk deploy` with credentials) or not; and the
CloudFormation resource under an L2 construct, which finding ids name and linter skips go on."""
from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct


def env_names(scope: cdk.Stack) -> tuple[str, str]:
    """(region, account) as cdk-nag shows them: the value, or the pseudo parameter for a token."""
    stack = cdk.Stack.of(scope)
    region = "<AWS::Region>" if cdk.Token.is_unresolved(stack.region) else stack.region
    account = "<AWS::AccountId>" if cdk.Token.is_unresolved(stack.account) else stack.account
    return region, account


def nag_arn(scope, service: str, resource: str, *, regional: bool = True) -> str:
    """'arn:<AWS::Partition>:ec2:us-east-1:<AWS::AccountId>:volume/*' and the like."""
    region, account = env_names(scope)
    return f"arn:<AWS::Partition>:{service}:{region if regional else ''}:{account}:{resource}"


def resource_of(construct: IConstruct) -> cdk.CfnResource:
    """The CloudFormation resource an L2 construct wraps (its default child)."""
    child = construct.node.default_child
    # Whatever child is named "Resource" or "Default", else None (an imported bucket or role has
    # none): typed as any construct, so checked before a caller overrides or names it.
    if not isinstance(child, cdk.CfnResource):
        raise TypeError(f"{construct.node.path} wraps no CloudFormation resource of its own")
    return child
