"""ServiceCatalogPortfolio from a platform team's side (issue 40 item 5): their own App and Stack,
the portfolio as one construct among their resources, checked with assertions.Template; the same
resources as the app's `-c portfolio=NAME` stack; a bad prop is one UserError line and builds
nothing."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_sns as sns
import pytest
from aws_cdk.assertions import Match, Template

from dl_selector.errors import UserError
from dl_stacks import ServiceCatalogPortfolio

TEAM = ('[portfolio]\nprofiles = ["dev-prototyping", "inference"]\nprovider = "ML platform"\n'
        'budget_emails = ["platform@example.com"]\n[portfolio.tag_options]\nteam = ["vision", "llm"]\n'
        '[products.dev-prototyping]\nmax_nodes = 2\nspot_only = true\n')


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """The team's app: their stack, their own topic, and the portfolio beside it."""
    tmp = tmp_path_factory.mktemp("team")
    (tmp / "team.toml").write_text(TEAM)
    app = cdk.App(outdir=str(tmp / "out"))
    stack = cdk.Stack(app, "PlatformTeam", env=cdk.Environment(region="us-east-1"))
    sns.Topic(stack, "TheirOwnTopic")
    portfolio = ServiceCatalogPortfolio(stack, "Gpu", name="ml-platform", profiles_file=str(tmp / "team.toml"),
                                        snapshots=str(tmp / "snapshots"))
    return tmp, stack, portfolio, Template.from_stack(stack)


def test_the_portfolio_is_built_inside_the_team_s_own_stack(team):
    tmp, stack, portfolio, template = team
    template.resource_count_is("AWS::SNS::Topic", 2)  # theirs and the budget alerts'
    template.has_resource_properties("AWS::ServiceCatalog::Portfolio", {
        "DisplayName": "dl-launcher ml-platform", "ProviderName": "ML platform"})
    template.resource_count_is("AWS::ServiceCatalog::CloudFormationProduct", 2)
    template.has_resource_properties("AWS::ServiceCatalog::CloudFormationProduct", {
        "Name": "ml-platform: dev-prototyping", "Owner": "ML platform"})
    template.resource_count_is("AWS::ServiceCatalog::LaunchRoleConstraint", 2)
    template.resource_count_is("AWS::ServiceCatalog::ResourceUpdateConstraint", 2)  # cost tags stay
    template.has_resource_properties("AWS::ServiceCatalog::TagOption", {"Key": "team", "Value": "vision"})
    template.has_resource_properties("AWS::Budgets::Budget", {"Budget": Match.object_like({
        "BudgetName": "dl-launcher ml-platform/dev-prototyping"})})
    assert set(portfolio.products) == set(portfolio.product_stacks) == {"dev-prototyping", "inference"}
    assert [p.profile.name for p in portfolio.plans] == ["dev-prototyping", "inference"]
    # each product's template is kept as a version under the given snapshots directory
    assert len(list((tmp / "snapshots").glob("*.product.template.json"))) == 2


def test_the_product_template_is_the_training_product(team):
    """As synthesized into the team's cloud assembly (a ProductStack is a template asset, not a stack)."""
    tmp, _, _, _ = team
    (path,) = (tmp / "out").glob("*devprototyping*.product.template.json")
    product = Template.from_json(json.loads(path.read_text()))
    params = product.to_json()["Parameters"]
    assert {"JobName", "InstanceType", "Market", "Nodes", "Command"} <= set(params), sorted(params)
    assert params["Nodes"]["AllowedValues"] == ["1", "2"], "the team's max_nodes = 2"
    assert params["Market"]["AllowedValues"] == ["spot"], "the team's spot_only"
    assert product.find_resources("AWS::EC2::LaunchTemplate") and product.find_resources("AWS::Lambda::Function")


def test_the_same_resources_as_the_app_s_portfolio_stack(team, tmp_path, monkeypatch):
    """One build for both (dl_stacks.portfolio_stack.populate): the app's stack holds the same
    resources, by type and count, as the construct does."""
    team_tmp, _, _, template = team
    from dl_stacks.portfolio_app import build

    monkeypatch.chdir(tmp_path)
    app = cdk.App(outdir=str(tmp_path / "out"))
    stack = build(app, {"portfolio": "ml-platform", "profiles_file": str(team_tmp / "team.toml"),
                        "snapshots": str(tmp_path / "snapshots")})
    ours = Counter(r["Type"] for r in Template.from_stack(stack).to_json()["Resources"].values())
    theirs = Counter(r["Type"] for r in template.to_json()["Resources"].values())
    theirs["AWS::SNS::Topic"] -= 1  # the team's own
    assert +theirs == ours


@pytest.mark.parametrize("props,env,expected", [
    ({"name": "ML Platform"}, "us-east-1",
     "ServiceCatalogPortfolio Gpu: portfolio='ML Platform': use 1-40 lower-case letters, digits and dashes (it names "
     "the stack and the products); closest: ml-platform"),
    ({"name": "ml", "profiles_file": "/nonexistent/team.toml"}, "us-east-1", "ServiceCatalogPortfolio Gpu: "),
    ({"name": "ml", "subnet_ids": ["subnet-0123456789abcdef0"]}, "us-east-1",
     "ServiceCatalogPortfolio Gpu: subnet_ids needs vpc_id (the VPC they belong to)"),
    ({"name": "ml"}, None, "ServiceCatalogPortfolio needs a region: give its stack env=cdk.Environment(region=...)"),
    ({"name": "ml", "region": "eu-west-1"}, "us-east-1",
     "ServiceCatalogPortfolio region='eu-west-1' is not its stack's region 'us-east-1'"),
    ({"name": "ml", "region": "us-eest-1"}, None, "ServiceCatalogPortfolio Gpu: unknown region 'us-eest-1'; closest: "),
])
def test_a_bad_prop_is_one_line_and_builds_nothing(tmp_path, monkeypatch, props, env, expected):
    monkeypatch.chdir(tmp_path)
    app = cdk.App(outdir=str(tmp_path / "out"))
    stack = cdk.Stack(app, "PlatformTeam", env=cdk.Environment(region=env) if env else None)
    with pytest.raises(UserError) as e:
        ServiceCatalogPortfolio(stack, "Gpu", **props)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)
    assert stack.node.children == [], "nothing half-created"
    assert not Path("product-stack-snapshots").exists()


def test_dl_stacks_loads_the_construct_only_when_asked():
    """The CLI's verbs import dl_stacks.settings on every start: no aws_cdk (and its Node process) for that."""
    import subprocess
    import sys

    code = "import sys, dl_stacks, dl_stacks.settings; print('aws_cdk' in sys.modules, dl_stacks.__all__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False ['PortfolioLaunchRoleStack', 'ServiceCatalogPortfolio']", out.stderr
