"""The platform team's portfolio: `-c portfolio=NAME [-c profiles_file=...]` through app.main
(cdk-nag runs on every synth), cfn-lint on the portfolio and every product template, and the
team's limits checked against the catalog's own prices by evaluating the templates' rules the way
CloudFormation documents them (Fn::And/Or/Not/Equals/Contains over parameter values)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Match, Template

import app
from constructs_lib.runtime import contract
from dl_selector.catalog import load_catalog
from dl_selector.profiles import builtin_profiles
from dl_selector.recommend import recommend
from tests.cdk_checks import cdk_cli as cli, cfn_lint, listify, role_statements

REGION = "us-east-1"
TEAM_FILE = """
[profiles.team-notebook]
extends = "dev-prototyping"
description = "A team's notebook GPU"

[portfolio]
provider = "ML platform team"
profiles = ["team-notebook", "multi-node-training"]
share_with_accounts = ["111122223333", "444455556666"]
share_with_organization_units = ["ou-ab12-34cd56ef"]
principals = ["arn:aws:iam::123456789012:role/ml-engineers"]
budget_emails = ["platform@example.com"]
[portfolio.tag_options]
team = ["ml-research", "ml-platform"]
project = ["llm"]
cost-centre = ["cc-1001"]

[products.multi-node-training]
instance_types = ["p5.48xlarge", "p4d.24xlarge", "p5en.48xlarge"]
max_nodes = 4
max_cluster_usd_per_hour = 120
monthly_budget_usd = 20000
budget_action = "stop"

[products.team-notebook]
spot_only = true
"""


def _synth(tmp_path: Path, monkeypatch, **context) -> tuple[int, Path]:
    monkeypatch.chdir(tmp_path)  # ProductStackHistory writes its snapshots under the working directory
    out = tmp_path / "cdk.out"
    rc = app.main({k: str(v) for k, v in context.items()}, outdir=str(out))
    return rc, out


def _products(out: Path) -> dict[str, dict]:
    """profile name -> product template (ProductStack templates are named <stack><profile>template<hash>)."""
    found = {}
    for f in out.glob("*.product.template.json"):
        t = json.loads(f.read_text())
        found[t["Description"].split(": ", 1)[1].split(" ")[0]] = t
    return found


@pytest.fixture(scope="module")
def default_portfolio(tmp_path_factory):
    """The built-in portfolio through the pinned CDK CLI (app.main behind it, cdk-nag on every
    synth), synthesized once: the in-process synth it replaced proved nothing the CLI's does not
    and cost another 80 s of CI."""
    tmp = tmp_path_factory.mktemp("portfolio")
    r = cli("synth", "-c", "portfolio=platform", "-c", f"snapshots={tmp / 'snap'}", "--quiet",
            "-o", str(tmp / "out"), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (tmp / "cdk.stderr").write_text(r.stderr)
    return tmp / "out"


@pytest.fixture(scope="module")
def team_portfolio(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("team")
    (tmp / "team.toml").write_text(TEAM_FILE)
    try:
        rc, out = _synth(tmp, mp, portfolio="team", profiles_file=tmp / "team.toml")
    finally:
        mp.undo()
    assert rc == 0
    return out


def test_every_profile_is_a_product_offering_the_selectors_candidates(default_portfolio):
    products = _products(default_portfolio)
    assert sorted(products) == sorted(builtin_profiles())
    portfolio = Template.from_json(json.loads((default_portfolio / "dl-portfolio-platform.template.json").read_text()))
    for kind in ("AWS::ServiceCatalog::CloudFormationProduct", "AWS::ServiceCatalog::PortfolioProductAssociation",
                 "AWS::ServiceCatalog::LaunchRoleConstraint", "AWS::Budgets::Budget"):
        portfolio.resource_count_is(kind, len(products))
    portfolio.has_resource_properties("AWS::ServiceCatalog::TagOption", {"Key": "cost-centre", "Value": "unassigned"})
    portfolio.resource_count_is("AWS::ServiceCatalog::ResourceUpdateConstraint", len(products))
    portfolio.has_resource_properties("AWS::ServiceCatalog::ResourceUpdateConstraint",
                                      {"TagUpdateOnProvisionedProduct": "NOT_ALLOWED"})
    portfolio.has_resource_properties("AWS::ServiceCatalog::CloudFormationProduct", {
        "Name": "platform: multi-node-training", "ProvisioningArtifactParameters": Match.array_with([
            Match.object_like({"Name": Match.string_like_regexp(r"^v[0-9.]+-[0-9a-f]{8}$")})])})
    for name, t in products.items():
        profile = builtin_profiles()[name]
        market = "spot" if profile.workload == "training" else "on-demand"
        ranked = [c.instance_type for c in recommend(profile, region=REGION, market=market).candidates
                  if not c.facts.capacity_block_only]
        allowed = t["Parameters"]["InstanceType"]["AllowedValues"]
        # the selector's candidates, best first, the first eight (one launch template each)
        assert allowed == ranked[:8], name
        assert t["Parameters"]["InstanceType"]["Default"] == ranked[0]


def _covering(templates: list[Path]) -> list[Path]:
    """The fewest templates (greedy) holding every resource type, parameter, condition and rule that
    any of them holds. The products are one stack class with each profile's facts; test_app lints
    every profile's own stack, and these lint every piece a product adds at least once: half the
    cfn-lint time (about a minute in CI) for the same findings."""
    def pieces(path: Path) -> set:
        t = json.loads(path.read_text())
        return ({("Type", r["Type"]) for r in t.get("Resources", {}).values()}
                | {(section, k) for section in ("Parameters", "Conditions", "Rules", "Mappings") for k in t.get(section, {})})
    left = {p: pieces(p) for p in templates}
    every, covered, chosen = set().union(*left.values()), set(), []
    while covered != every:
        best = max(sorted(left), key=lambda p: len(left[p] - covered))
        chosen.append(best)
        covered |= left.pop(best)
    return chosen


def test_portfolio_and_every_product_template_pass_cfn_lint(default_portfolio):
    products = sorted(default_portfolio.glob("*.product.template.json"))
    portfolio = sorted(set(default_portfolio.glob("*.template.json")) - set(products))
    assert len(products) == len(builtin_profiles()) and portfolio
    chosen = _covering(products)
    assert len(chosen) < len(products)
    cfn_lint(portfolio + chosen)


def test_real_cli_synth_of_the_portfolio(default_portfolio):
    assert (default_portfolio / "dl-portfolio-platform.template.json").exists()
    assert len(list((default_portfolio.parent / "snap").glob("*.product.template.json"))) == len(builtin_profiles())
    # issue 28: warnings only where the user can act, each naming what to do (the CLI prints
    # "WARNING <text> (Construct Annotations)" per warning)
    warnings = [line for line in (default_portfolio.parent / "cdk.stderr").read_text().splitlines() if line.startswith("WARNING ")]
    assert warnings, "the platform portfolio synthesizes without an account: the asset bucket name warns"
    assert all("Fix: " in w for w in warnings), [w for w in warnings if "Fix: " not in w]
    assert not any("RaidNeedsInstanceStore" in w for w in warnings), "how a type is, not a mistake"


def _catalog_price(instance_type: str, market: str) -> float:
    """The most one node may cost: on spot, EC2's default maximum price, the on-demand price (issue
    24: a spot quote as the maximum could keep a cluster from ever launching)."""
    p = load_catalog().get(instance_type).price(REGION)
    return p.on_demand


def _evaluate(expr, params: dict[str, str]):
    """CloudFormation's rule functions, as documented, over plain parameter values."""
    if isinstance(expr, str):
        return expr
    if isinstance(expr, list):
        return [_evaluate(e, params) for e in expr]
    (fn, arg), = expr.items()
    if fn == "Ref":
        return params[arg]
    if fn == "Fn::Equals":
        a, b = (_evaluate(x, params) for x in arg)
        return a == b
    if fn == "Fn::And":
        return all(_evaluate(x, params) for x in arg)
    if fn == "Fn::Or":
        return any(_evaluate(x, params) for x in arg)
    if fn == "Fn::Not":
        return not _evaluate(arg[0], params)
    if fn == "Fn::Contains":
        values, value = arg
        return _evaluate(value, params) in _evaluate(values, params)
    raise AssertionError(f"unexpected rule function {fn}")


def _accepted(template: dict, rules: dict, params: dict[str, str]) -> bool:
    for name, p in template["Parameters"].items():
        if name in params and "AllowedValues" in p and params[name] not in p["AllowedValues"]:
            return False
    for rule in rules.values():
        if "RuleCondition" in rule and not _evaluate(rule["RuleCondition"], params):
            continue
        if not all(_evaluate(a["Assert"], params) for a in rule["Assertions"]):
            return False
    return True


def test_rules_hold_every_cluster_under_the_teams_cap_at_catalog_prices(team_portfolio):
    t = _products(team_portfolio)["multi-node-training"]
    assert t["Parameters"]["InstanceType"]["AllowedValues"] == ["p5en.48xlarge", "p5.48xlarge", "p4d.24xlarge"]
    assert t["Parameters"]["Nodes"]["AllowedValues"] == ["1", "2", "3", "4"]
    portfolio = json.loads((team_portfolio / "dl-portfolio-team.template.json").read_text())
    constraints = [r["Properties"] for r in portfolio["Resources"].values()
                   if r["Type"] == "AWS::ServiceCatalog::LaunchTemplateConstraint"]
    checked = 0
    for itype in ["p5en.48xlarge", "p5.48xlarge", "p4d.24xlarge", "p6-b200.48xlarge"]:
        for market in ["spot", "on-demand"]:
            for nodes in range(1, 6):
                params = {"InstanceType": itype, "Market": market, "Nodes": str(nodes), "JobName": "j", "Command": ""}
                price = _catalog_price(itype, market)
                expected = itype != "p6-b200.48xlarge" and nodes <= 4 and nodes * price <= 120
                assert _accepted(t, t["Rules"], params) == expected, (params, price)
                # the same limits as Service Catalog template constraints on the portfolio
                rules = {}
                for c in constraints:
                    rules.update(json.loads(c["Rules"]))
                assert _accepted(t, rules, params) == expected, ("constraint", params)
                checked += 1
    assert checked == 40
    # p5 on-demand ($55.04/h at the catalog's price) can run 2 nodes under $120/h, not 3
    assert _accepted(t, t["Rules"], {"InstanceType": "p5.48xlarge", "Market": "on-demand", "Nodes": "2"})
    assert not _accepted(t, t["Rules"], {"InstanceType": "p5.48xlarge", "Market": "on-demand", "Nodes": "3"})


def test_a_profile_added_to_the_file_is_a_product_with_its_governance(team_portfolio):
    products = _products(team_portfolio)
    assert sorted(products) == ["multi-node-training", "team-notebook"]
    notebook = products["team-notebook"]
    assert notebook["Parameters"]["Market"]["AllowedValues"] == ["spot"]  # spot_only
    portfolio = json.loads((team_portfolio / "dl-portfolio-team.template.json").read_text())
    res = portfolio["Resources"].values()
    tags = {(r["Properties"]["Key"], r["Properties"]["Value"]) for r in res if r["Type"] == "AWS::ServiceCatalog::TagOption"}
    assert tags == {("team", "ml-research"), ("team", "ml-platform"), ("project", "llm"), ("cost-centre", "cc-1001")}
    shares = sorted(r["Properties"]["AccountId"] for r in res if r["Type"] == "AWS::ServiceCatalog::PortfolioShare")
    assert shares == ["111122223333", "444455556666"]
    (who,) = [r["Properties"] for r in res if r["Type"] == "AWS::ServiceCatalog::PortfolioPrincipalAssociation"]
    assert who["PrincipalARN"] == "arn:aws:iam::123456789012:role/ml-engineers" and who["PrincipalType"] == "IAM"
    share = json.dumps(portfolio["Outputs"]["OrganizationShareCommands"]["Value"])
    assert "--organization-node Type=ORGANIZATIONAL_UNIT,Value=ou-ab12-34cd56ef --share-tag-options" in share
    budgets = {r["Properties"]["Budget"]["BudgetName"]: r["Properties"] for r in res if r["Type"] == "AWS::Budgets::Budget"}
    mnt = budgets["dl-launcher team/multi-node-training"]
    assert mnt["Budget"]["BudgetLimit"] == {"Amount": 20000, "Unit": "USD"}
    assert mnt["Budget"]["CostFilters"] == {"TagKeyValue": ["user:dl-launcher:product$team/multi-node-training"]}
    emails = {s["Address"] for n in mnt["NotificationsWithSubscribers"] for s in n["Subscribers"]
              if s["SubscriptionType"] == "EMAIL"}
    assert emails == {"platform@example.com"}
    # every node of the product carries the product tag the budget filters on
    for lt in (r for r in notebook["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"):
        specs = lt["Properties"]["LaunchTemplateData"]["TagSpecifications"]
        for kind in ("instance", "volume"):
            (spec,) = [s for s in specs if s["ResourceType"] == kind]
            assert {"Key": "dl-launcher:product", "Value": "team/team-notebook"} in spec["Tags"]


def test_launch_role_covers_every_resource_type_and_only_through_cloudformation(team_portfolio):
    from dl_stacks.launch_role import PERMISSIONS
    types = {r["Type"] for t in _products(team_portfolio).values() for r in t["Resources"].values()}
    assert types <= set(PERMISSIONS)
    portfolio = json.loads((team_portfolio / "dl-portfolio-team.template.json").read_text())
    (role,) = [k for k, r in portfolio["Resources"].items() if r["Type"] == "AWS::IAM::Role"
               and r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"].get("Service")
               == "servicecatalog.amazonaws.com"]
    (policy,) = [r for r in portfolio["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                 and {"Ref": role} in r["Properties"]["Roles"]]
    for st in policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if all(a.startswith("cloudformation:") for a in actions) or actions == ["s3:GetObject"]:
            continue
        assert st["Condition"]["ForAnyValue:StringEquals"]["aws:CalledVia"] == ["cloudformation.amazonaws.com"], st


def test_the_product_as_a_plain_stack_is_the_portfolios_product(default_portfolio, tmp_path, monkeypatch):
    rc, out = _synth(tmp_path, monkeypatch, portfolio="platform", product="dev-prototyping")
    assert rc == 0
    plain = json.loads((out / "dl-platform-dev-prototyping.template.json").read_text())
    product = _products(default_portfolio)["dev-prototyping"]
    rules = {k: v for k, v in plain.get("Rules", {}).items() if k != "CheckBootstrapVersion"}  # the CDK's own
    assert rules == product.get("Rules", {})
    assert plain["Conditions"] == product["Conditions"]
    strip = {"BootstrapVersion"}
    assert ({k: v for k, v in plain["Parameters"].items() if k not in strip and not k.startswith("AssetParameters")}
            == {k: v for k, v in product["Parameters"].items() if k not in strip})
    assert sorted(r["Type"] for r in plain["Resources"].values()) == sorted(r["Type"] for r in product["Resources"].values())


def test_an_opted_in_budget_stops_the_products_clusters_through_a_stop_topic(team_portfolio):
    portfolio = json.loads((team_portfolio / "dl-portfolio-team.template.json").read_text())
    res = portfolio["Resources"]
    budgets = {r["Properties"]["Budget"]["BudgetName"]: r["Properties"] for r in res.values()
               if r["Type"] == "AWS::Budgets::Budget"}

    def sns_of(budget: dict) -> dict:
        return {(n["Notification"]["NotificationType"], n["Notification"]["Threshold"]):
                next(s["Address"] for s in n["Subscribers"] if s["SubscriptionType"] == "SNS")
                for n in budget["NotificationsWithSubscribers"]}

    stop, notify = sns_of(budgets["dl-launcher team/multi-node-training"]), sns_of(budgets["dl-launcher team/team-notebook"])
    assert stop[("ACTUAL", 100)] != stop[("ACTUAL", 80)] == stop[("FORECASTED", 100)]  # only 100% actual stops
    assert len({json.dumps(v) for v in notify.values()}) == 1  # notify-only: every alert to the budget topic
    (fn,) = [r for r in res.values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"].get("Handler") == "constructs_lib.fleet.budget_stop.handle"]
    subs = [r["Properties"] for r in res.values() if r["Type"] == "AWS::SNS::Subscription"
            and r["Properties"]["Protocol"] == "lambda"]
    assert [s["TopicArn"] for s in subs] == [stop[("ACTUAL", 100)]]
    (policy,) = [r["Properties"]["PolicyDocument"] for r in res.values() if r["Type"] == "AWS::IAM::Policy"
                 and any("BudgetStopper" in ref.get("Ref", "") for ref in r["Properties"]["Roles"])]
    (invoke,) = [st for st in policy["Statement"] if st["Action"] == "lambda:InvokeFunction"]
    assert invoke["Condition"]["StringEquals"] == {"aws:ResourceTag/dl-launcher:function": "capacity-controller",
                                                   "aws:ResourceTag/dl-launcher:product": ["team/multi-node-training"]}


def test_every_policy_of_the_portfolio_and_its_products_is_one_aws_documents(default_portfolio, team_portfolio):
    """Issue 35, item 1: the launch role, the products' permissions boundary and every product's
    policies against AWS's service authorization reference (tests/iam_reference.py)."""
    from tests.iam_reference import check_template, policy_count

    problems, policies = [], 0
    for out in (default_portfolio, team_portfolio):
        for f in sorted(out.glob("*.template.json")):
            t = json.loads(f.read_text())
            problems += check_template(t, f.name)
            policies += policy_count(t)
    assert policies > 100
    assert not problems, "\n".join(problems)


def test_checkov_on_the_portfolio_and_its_products(team_portfolio):
    from tests.cdk_checks import checkov
    checkov(sorted(team_portfolio.glob("*.template.json")))


def test_a_product_watches_its_gpus_with_the_spec_cloudformation_chose(team_portfolio):
    t = _products(team_portfolio)["multi-node-training"]
    functions = {r["Properties"].get("Handler"): r["Properties"] for r in t["Resources"].values()
                 if r["Type"] == "AWS::Lambda::Function"}
    controller = functions["constructs_lib.fleet.handler.handle"]["Environment"]["Variables"]["DL_CLUSTER_SPEC"]
    guard = [p for h, p in functions.items() if h and "idle" in h]
    assert len(guard) == 1, sorted(h for h in functions if h)
    # the guard stops the cluster through the same spec the controller runs (Fn::If over the choices)
    assert guard[0]["Environment"]["Variables"]["DL_CLUSTER_SPEC"] == controller
    assert "Fn::If" in controller
    (dashboard,) = [r["Properties"] for r in t["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    body = json.dumps(dashboard["DashboardBody"])
    # nodes and the chosen type's price enter the metric math as the launch's own values
    assert '{"Ref": "Nodes"}' in body and '"Fn::If"' in body and '{"Ref": "JobName"}' in body
    alarms = [r for r in t["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert len(alarms) == 3  # starved GPUs, node health, and the capacity shortfall (issue 24)
    assert sum(a["Properties"].get("MetricName") == contract.M_CAPACITY_SHORT for a in alarms) == 1
    # the health alarm expects the chosen type's GPU count (8 on every p-type here), picked by the same conditions
    health = next(json.dumps(a) for a in alarms if "gpus <" in json.dumps(a))
    assert '"Fn::If"' in health and '"UseP5En48XlargeSpot", "8"' in health
    assert json.dumps(t["Outputs"]["IdleGuard"]["Value"]).startswith('"stop after 30 min')


def test_the_built_in_portfolios_current_versions_are_committed():
    from dl_stacks.portfolio_stack import version_name
    from dl_stacks.portfolio_settings import ProductLimits
    from dl_stacks.product_plan import plan_product
    folder = Path(__file__).resolve().parents[1] / "product-stack-snapshots"
    names = [f.name for f in folder.glob("*.product.template.json")]
    for profile in builtin_profiles().values():
        version = version_name(plan_product(profile, ProductLimits(), REGION))
        stem = "dlportfolioplatform" + profile.name.replace("-", "")
        assert any(n.startswith(stem) and n.endswith(f".{version}.product.template.json") for n in names), (
            f"{profile.name} {version}: run `cdk synth -c portfolio=platform` and commit product-stack-snapshots/")


def _render(value, fill) -> str:
    """A launch template's user data with every reference replaced by fill(reference)."""
    if isinstance(value, str):
        return value
    (fn, arg), = value.items()
    if fn == "Fn::Base64":
        return _render(arg, fill)
    if fn == "Fn::Join":
        sep, parts = arg
        return sep.join(_render(p, fill) for p in parts)
    return fill(value)


def test_the_longest_command_a_user_may_enter_fits_every_nodes_user_data(default_portfolio):
    for name, t in _products(default_portfolio).items():
        longest = t["Parameters"]["Command"]["MaxLength"]
        assert longest >= 4096, name  # room for a real one-line command

        def fill(ref):
            if ref == {"Ref": "Command"}:
                return "x" * longest
            if ref == {"Ref": "JobName"}:
                return "j" * t["Parameters"]["JobName"]["MaxLength"]
            return "r" * 128  # bucket names, keys, region: each well under this

        for lt in (r for r in t["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"):
            data = _render(lt["Properties"]["LaunchTemplateData"]["UserData"], fill)
            assert len(data.encode()) <= 16 * 1024, (name, len(data.encode()))


def test_a_shared_portfolio_names_its_launch_role_and_ships_it_for_the_other_accounts(team_portfolio):
    portfolio = json.loads((team_portfolio / "dl-portfolio-team.template.json").read_text())
    constraints = [r["Properties"] for r in portfolio["Resources"].values()
                   if r["Type"] == "AWS::ServiceCatalog::LaunchRoleConstraint"]
    (named,) = [k for k, r in portfolio["Resources"].items() if r["Type"] == "AWS::IAM::Role"
                and r["Properties"].get("RoleName") == "dl-launcher-team-launch"]
    # Ref of a role is its name: Service Catalog finds the role by that name in the launching account
    assert constraints and all(c.get("LocalRoleName") == {"Ref": named} and "RoleArn" not in c for c in constraints)
    spoke = json.loads((team_portfolio / "dl-portfolio-team-launch-role.template.json").read_text())
    (role,) = [r["Properties"] for r in spoke["Resources"].values() if r["Type"] == "AWS::IAM::Role"]
    assert role["RoleName"] == "dl-launcher-team-launch"

    def actions(template):
        return sorted(a for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                      and "LaunchRole" in json.dumps(r["Properties"]["Roles"])
                      for st in r["Properties"]["PolicyDocument"]["Statement"]
                      for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]]))
    assert actions(spoke) == actions(portfolio)
    assert "Export" not in json.dumps(portfolio.get("Outputs", {})), "no cross-stack reference between accounts"


# AWS managed policies that product roles attach, with their published actions (IAM console,
# "AWSLambdaBasicExecutionRole", version v1): the boundary must hold them too.
AWS_MANAGED = {"AWSLambdaBasicExecutionRole": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"]}


def test_every_role_a_product_creates_carries_the_boundary_and_needs_nothing_beyond_it(team_portfolio):
    """Issue 22: the launch role creates SC- roles only with the portfolio's boundary on them, and
    the boundary holds every action the products' own roles are granted (else a launch would fail)."""
    import fnmatch

    from dl_stacks.launch_role import boundary_name
    portfolio = json.loads((team_portfolio / "dl-portfolio-team.template.json").read_text())
    (boundary_id, boundary), = [(k, r["Properties"]) for k, r in portfolio["Resources"].items()
                                if r["Type"] == "AWS::IAM::ManagedPolicy"
                                and r["Properties"].get("ManagedPolicyName") == boundary_name("team")]
    ceiling = [a for st in boundary["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"
               for a in listify(st["Action"])]
    # of IAM, the boundary allows passing roles to EC2 and the launch services' linked roles, nothing else
    assert sorted(a for a in ceiling if a.startswith("iam:")) == ["iam:CreateServiceLinkedRole", "iam:PassRole"]
    assert not any(fnmatch.fnmatchcase(f"{s}:AnyAction", a) for a in ceiling
                   for s in ("iam", "sts", "organizations", "account"))
    products = _products(team_portfolio)
    assert products
    for name, t in products.items():
        roles = {k: r for k, r in t["Resources"].items() if r["Type"] == "AWS::IAM::Role"}
        assert roles, name
        for k, r in roles.items():
            arn = json.dumps(r["Properties"].get("PermissionsBoundary"))
            assert arn.endswith(f':policy/{boundary_name("team")}"]]}}'), (name, k, arn)
            granted = [a for st in role_statements(t, k) if st["Effect"] == "Allow" for a in listify(st["Action"])]
            granted += [a for p in r["Properties"].get("Policies", []) for st in p["PolicyDocument"]["Statement"]
                        for a in listify(st["Action"])]
            for arn in r["Properties"].get("ManagedPolicyArns", []):
                granted += AWS_MANAGED[json.dumps(arn).rsplit("/", 1)[1].rstrip('"}')]
            beyond = [a for a in granted if not any(fnmatch.fnmatchcase(a, c) for c in ceiling)]
            assert beyond == [], (name, k, beyond)
    (role,) = [k for k, r in portfolio["Resources"].items() if r["Type"] == "AWS::IAM::Role"
               and r["Properties"].get("RoleName") == "dl-launcher-team-launch"]
    trust = portfolio["Resources"][role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [st["Condition"] for st in trust] == [{"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}]
    creating = [st for st in role_statements(portfolio, role) if "iam:CreateRole" in listify(st["Action"])]
    assert creating and all(st["Condition"]["StringEquals"]["iam:PermissionsBoundary"] == {"Ref": boundary_id}
                            for st in creating)
    for st in role_statements(portfolio, role):  # no way to a role without the boundary, or to remove it
        for a in listify(st["Action"]):
            if a in ("iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy"):
                assert "iam:PermissionsBoundary" in st["Condition"]["StringEquals"], st
            assert a not in ("iam:DeleteRolePermissionsBoundary", "iam:PutRolePermissionsBoundary", "iam:*"), st
    # each shared account deploys the same boundary by the same name beside its launch role
    spoke = json.loads((team_portfolio / "dl-portfolio-team-launch-role.template.json").read_text())
    assert [r["Properties"]["ManagedPolicyName"] for r in spoke["Resources"].values()
            if r["Type"] == "AWS::IAM::ManagedPolicy"] == [boundary_name("team")]


def test_a_portfolio_with_local_true_synthesizes_and_leaves_no_stray_files(tmp_path, monkeypatch):
    """docs/deploy.md documents -c local=true with portfolio; it crashed on a cross-stack asset reference."""
    (tmp_path / "team.toml").write_text('[portfolio]\nprofiles = ["dev-prototyping"]\n')
    rc, out = _synth(tmp_path, monkeypatch, portfolio="small", profiles_file=tmp_path / "team.toml", local="true",
                     snapshots=tmp_path / "snaps")
    assert rc == 0
    assert (out / "dl-portfolio-small.template.json").is_file()
    assert not (out / "error.txt").exists()
    assert len(_products(out)) == 1
