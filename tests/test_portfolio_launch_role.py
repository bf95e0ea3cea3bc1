"""PortfolioLaunchRoleStack from a platform team's own App (issue 40): a ServiceCatalogPortfolio
shared with another account, and the launch-role stack that account deploys, built beside it and
checked with assertions.Template: the role by the name the hub's launch constraints give, assumable
by Service Catalog for that account only, with the products' permissions boundary, reading the
hub's asset bucket. A portfolio shared with no one, the wrong region or the hub's own account is
one UserError line before anything is built."""
from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from dl_selector.errors import UserError
from dl_stacks import PortfolioLaunchRoleStack, ServiceCatalogPortfolio

HUB, SHARED = "111111111111", "222222222222"
TOML = ('[portfolio]\nprofiles = ["dev-prototyping"]\n{share}budget_emails = ["platform@example.com"]\n'
        '[portfolio.tag_options]\nteam = ["vision"]\n')


def _portfolio(tmp, app: cdk.App, *, shared: bool) -> ServiceCatalogPortfolio:
    (tmp / "team.toml").write_text(TOML.format(share=f'share_with_accounts = ["{SHARED}"]\n' if shared else ""))
    hub = cdk.Stack(app, "Platform", env=cdk.Environment(account=HUB, region="us-east-1"))
    return ServiceCatalogPortfolio(hub, "Gpu", name="ml-platform", profiles_file=str(tmp / "team.toml"),
                                   snapshots=str(tmp / "snapshots"))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    app = cdk.App(outdir=str(tmp / "out"))
    portfolio = _portfolio(tmp, app, shared=True)
    role_stack = PortfolioLaunchRoleStack(app, "GpuLaunchRole", portfolio=portfolio,
                                          env=cdk.Environment(account=SHARED))
    return app, portfolio, role_stack


def test_the_shared_account_s_launch_role_is_the_one_the_hub_s_products_name(shared):
    app, portfolio, role_stack = shared
    assert role_stack.region == "us-east-1" and role_stack.account == SHARED  # the portfolio's region
    hub = Template.from_stack(cdk.Stack.of(portfolio))
    # the hub's products name their launch role by the hub role's name (LocalRoleName: a Ref to it)
    (hub_role,) = [k for k, r in hub.find_resources("AWS::IAM::Role").items()
                   if r["Properties"].get("RoleName") == "dl-launcher-ml-platform-launch"]
    hub.has_resource_properties("AWS::ServiceCatalog::LaunchRoleConstraint", {"LocalRoleName": {"Ref": hub_role}})
    t = Template.from_stack(role_stack)
    t.has_resource_properties("AWS::IAM::Role", {
        "RoleName": "dl-launcher-ml-platform-launch",
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({
            "Principal": {"Service": "servicecatalog.amazonaws.com"},
            "Condition": {"StringEquals": {"aws:SourceAccount": SHARED}}})]}})
    t.has_resource_properties("AWS::IAM::ManagedPolicy",
                              {"ManagedPolicyName": "dl-launcher-ml-platform-product-boundary"})
    policy = str(t.find_resources("AWS::IAM::Policy"))
    assert "ec2:CreateLaunchTemplate" in policy and portfolio.asset_bucket_name in policy, policy[:500]
    assert "iam:PermissionsBoundary" in policy  # a role it creates must carry the boundary
    assert role_stack.role is not None and role_stack.boundary is not None


@pytest.mark.parametrize("env,match", [
    (cdk.Environment(account=SHARED, region="eu-west-1"), r"env region 'eu-west-1' is not portfolio ml-platform's "
                                                          r"region 'us-east-1'"),
    (cdk.Environment(account=HUB), f"account {HUB} holds the portfolio"),
])
def test_a_wrong_region_or_the_hub_s_own_account_is_one_line(shared, env, match):
    app, portfolio, _ = shared
    with pytest.raises(UserError, match=f"^PortfolioLaunchRoleStack Bad: {match}"):
        PortfolioLaunchRoleStack(app, "Bad", portfolio=portfolio, env=env)
    assert app.node.try_find_child("Bad") is None  # nothing half-built


def test_a_portfolio_shared_with_no_one_needs_no_launch_role_stack(tmp_path):
    app = cdk.App(outdir=str(tmp_path / "out"))
    portfolio = _portfolio(tmp_path, app, shared=False)
    with pytest.raises(UserError, match=r"^PortfolioLaunchRoleStack Roles: portfolio ml-platform is shared with no "
                                        r"account .*: its products use the hub's own launch role"):
        PortfolioLaunchRoleStack(app, "Roles", portfolio=portfolio, env=cdk.Environment(account=SHARED))
