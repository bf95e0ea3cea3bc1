"""The platform team's Service Catalog portfolio: one product per profile of the profiles file,
each a TrainingProduct in a ProductStack, versioned by ProductStackHistory (snapshots committed
under product-stack-snapshots/), with the team's limits as parameter constraints and template
rules, a launch role, mandatory cost TagOptions, a monthly budget per product, and shares."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import metadata
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_budgets as budgets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_servicecatalog as sc
import aws_cdk.aws_sns as sns
from constructs import Construct

from constructs_lib.nag import env_names
from constructs_lib.observability.budget import cost_budget
from constructs_lib.observability.notifications import NotificationTopic
from constructs_lib.runtime.contract import TAG_PRODUCT
from dl_selector import record

from .launch_role import LaunchRole, ProductRoleBoundary, boundary_name
from .portfolio_settings import PortfolioSettings
from .product_plan import ProductPlan
from .selection import money
from .training_product import TrainingProduct, product_rules


def version_name(plan: ProductPlan) -> str:
    """'v0.1.0-3f9a1c2e': the package version and a digest of everything the team and the
    selector decided for the product, so a changed limit or price is a new version."""
    try:
        package = metadata.version("dl-launcher")
    except metadata.PackageNotFoundError:
        package = "0"
    decided = {"profile": record.asdict(plan.profile) | {"source": ""}, "region": plan.region,
               "limits": dataclasses.asdict(plan.limits), "types": plan.instance_types, "markets": plan.markets,
               "max_nodes": plan.max_nodes, "catalog": plan.catalog_as_of,
               "choices": [(c.instance_type, c.market, c.ceiling, c.max_nodes,
                            [o.instance_type for o in c.selection.options] if c.selection else None)
                           for c in plan.choices]}
    digest = hashlib.sha256(json.dumps(decided, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"v{package}-{digest}"


def launch_role_name(settings: PortfolioSettings) -> str:
    return f"dl-launcher-{settings.name}-launch"[:64]


class LaunchRoleStack(cdk.Stack):
    """The launch role alone, by its shared name, for each account the portfolio is shared with
    (`cdk deploy dl-portfolio-NAME-launch-role` there, or a StackSet): the same permissions, the
    hub's asset bucket (which the portfolio's shares let those accounts read). `portfolio`: the
    app's PortfolioStack or a ServiceCatalogPortfolio (anything populate() built)."""

    def __init__(self, scope: Construct, construct_id: str, *, portfolio: Construct, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        settings: PortfolioSettings = portfolio.settings
        assets = s3.Bucket.from_bucket_name(self, "HubAssets", portfolio.asset_bucket_name)
        self.boundary = ProductRoleBoundary(self, "ProductRoleBoundary", portfolio=settings.name,
                                            assets=portfolio.asset_bucket_name).policy
        self.role = LaunchRole(self, "LaunchRole", resource_types=portfolio.resource_types, assets=assets,
                               boundary=self.boundary, role_name=launch_role_name(settings)).role


def product_tag(settings: PortfolioSettings, plan: ProductPlan) -> str:
    return f"{settings.name}/{plan.profile.name}"


class PortfolioStack(cdk.Stack):
    """The app's portfolio stack (`-c portfolio=NAME`): the portfolio's resources at the stack's top
    level; attributes as populate() sets them. In another app: dl_stacks.ServiceCatalogPortfolio."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: PortfolioSettings,
                 plans: list[ProductPlan], **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        populate(self, settings, plans)


def populate(owner: Construct, settings: PortfolioSettings, plans: list[ProductPlan]) -> None:
    """Builds the portfolio's resources as children of `owner` (the app's stack, or the construct in
    another app's stack) and sets on it: settings, portfolio, products ({profile:
    CloudFormationProduct}), product_stacks ({profile: ProductStack}), launch_role, tag_options,
    budgets ({profile: CfnBudget}), topic, assets, asset_bucket_name, resource_types, shared,
    boundary, stop_topics, stopper."""
    owner.settings = settings
    owner.assets = _asset_bucket(owner, settings)
    owner.portfolio = sc.Portfolio(
        owner, "Portfolio", display_name=f"dl-launcher {settings.name}", provider_name=settings.provider,
        description=(settings.description or "GPU, Trainium and Inferentia clusters for training, picked by the "
                     "dl-launcher selector, kept alive on spot, within the platform team's limits")[:2000])
    owner.tag_options = sc.TagOptions(owner, "CostTags", allowed_values_for_tags={
        key: list(values) for key, values in settings.tag_options})
    owner.portfolio.associate_tag_options(owner.tag_options)
    owner.topic = _budget_topic(owner)
    owner.product_stacks: dict[str, sc.ProductStack] = {}
    owner.products: dict[str, sc.CloudFormationProduct] = {}
    owner.budgets: dict[str, budgets.CfnBudget] = {}
    owner.stop_topics: dict[str, sns.ITopic] = {}
    histories = {}
    versions = {plan.profile.name: version_name(plan) for plan in plans}
    for plan in plans:
        name = plan.profile.name
        ps = sc.ProductStack(owner, f"{name}-template", asset_bucket=owner.assets,
                             description=f"dl-launcher {settings.name}: {name}")
        TrainingProduct(ps, "Product", plan=plan, product_tag=product_tag(settings, plan),
                        vpc_id=settings.vpc_id, subnet_ids=settings.subnet_ids,
                        availability_zone=settings.availability_zone, local=settings.local)
        # By name: the launching account's own copy (the hub's, or a shared account's).
        iam.PermissionsBoundary.of(ps).apply(iam.ManagedPolicy.from_managed_policy_name(
            ps, "RoleBoundary", boundary_name(settings.name)))
        owner.product_stacks[name] = ps
        histories[name] = sc.ProductStackHistory(
            owner, f"{name}-history", product_stack=ps, current_version_name=versions[name],
            current_version_locked=False, directory=settings.snapshots,
            description=f"limits and candidates as of catalog {plan.catalog_as_of}")
    owner.resource_types = {r.cfn_resource_type for ps in owner.product_stacks.values() for r in ps.node.find_all()
                           if isinstance(r, cdk.CfnResource)}
    # Shared: Service Catalog looks the launch role up by name in each account that launches.
    owner.shared = bool(settings.share_with_accounts or settings.share_with_organization_units)
    owner.boundary = ProductRoleBoundary(owner, "ProductRoleBoundary", portfolio=settings.name,
                                        assets=owner.asset_bucket_name).policy
    owner.launch_role = LaunchRole(owner, "LaunchRole", resource_types=owner.resource_types, assets=owner.assets,
                                  boundary=owner.boundary,
                                  role_name=launch_role_name(settings) if owner.shared else None).role
    for plan in plans:
        name = plan.profile.name
        history = histories[name]
        older = [v for v in _snapshot_versions(settings.snapshots, history, owner.product_stacks[name])
                 if v != versions[name]]
        product = sc.CloudFormationProduct(
            owner, name, product_name=f"{settings.name}: {name}"[:127], owner=settings.provider,
            distributor="dl-launcher", description=_describe(plan)[:8191],
            support_description="Ask your platform team; the stack's outputs name the checkpoint bucket, "
                                "the SSM session command and the controller's log",
            product_versions=[history.current_version(), *(history.version_from_snapshot(v) for v in older)])
        owner.portfolio.add_product(product)
        # The cost tags a user picked at launch stay: updating a launch cannot change them.
        owner.portfolio.constrain_tag_updates(product, allow=False)
        if owner.shared:
            owner.portfolio.set_local_launch_role(product, owner.launch_role)
        else:
            owner.portfolio.set_launch_role(product, owner.launch_role)
        for rule_name, condition, assertion, text in product_rules(plan):
            owner.portfolio.constrain_cloud_formation_parameters(product, rule=sc.TemplateRule(
                rule_name=rule_name, condition=condition,
                assertions=[sc.TemplateRuleAssertion(assert_=assertion, description=text)]))
        owner.products[name] = product
        stop = None
        if plan.limits.budget_action == "stop":
            stop = _budget_topic(owner, f"{name}-budget-stop").topic
            owner.stop_topics[product_tag(settings, plan)] = stop
        owner.budgets[name] = _budget(owner, settings, plan, owner.topic, stop)
    owner.stopper = None
    if owner.stop_topics:
        from .budget_stop import BudgetStopper
        owner.stopper = BudgetStopper(owner, "BudgetStopper", topics=owner.stop_topics, alerts=owner.topic.topic)
    for account in settings.share_with_accounts:
        owner.portfolio.share_with_account(account, share_tag_options=True)
    for i, arn in enumerate(settings.principals):
        kind = arn.split(":")[5].split("/")[0]
        if kind == "role":
            owner.portfolio.give_access_to_role(iam.Role.from_role_arn(owner, f"Principal{i}", arn, mutable=False))
        elif kind == "group":
            owner.portfolio.give_access_to_group(iam.Group.from_group_arn(owner, f"Principal{i}", arn))
        else:
            owner.portfolio.give_access_to_user(iam.User.from_user_arn(owner, f"Principal{i}", arn))
    if settings.share_with_organization_units:
        # AWS::ServiceCatalog::PortfolioShare takes accounts only; an organization share is an API
        # call from the management or a delegated administrator account.
        cdk.CfnOutput(owner, "OrganizationShareCommands", value=" && ".join(
            cdk.Fn.join("", [f"aws servicecatalog create-portfolio-share --region {settings.region} --portfolio-id ",
                             owner.portfolio.portfolio_id, f" --organization-node Type="
                             f"{'ORGANIZATIONAL_UNIT' if node.startswith('ou-') else 'ORGANIZATION'},Value={node}"
                             " --share-tag-options"])
            for node in settings.share_with_organization_units),
            description="run from the organization's management or delegated administrator account "
                        "(aws servicecatalog enable-aws-organizations-access first)")
    _acknowledge_asset_deployment(cdk.Stack.of(owner), owner.assets)
    cdk.CfnOutput(owner, "PortfolioId", value=owner.portfolio.portfolio_id,
                  description="give users access: aws servicecatalog associate-principal-with-portfolio")
    cdk.CfnOutput(owner, "BudgetTopic", value=owner.topic.topic.topic_arn,
                  description="budget alerts of every product; subscribe more people here")


def _describe(plan: ProductPlan) -> str:
    p = plan.profile
    cap = plan.limits.max_cluster_usd_per_hour
    return (f"{p.description} Types: {', '.join(plan.instance_types)}; {'/'.join(plan.markets)}; up to "
            f"{plan.max_nodes} node{'s' if plan.max_nodes > 1 else ''}"
            + (f"; cluster cap {money(cap)}" if cap else "") + f". Prices as of {plan.catalog_as_of}.")


def _asset_bucket(stack: Construct, settings: PortfolioSettings) -> s3.Bucket:
    """Where the products' assets (Lambda code, the node bundle) live: private, TLS-only, logged.
    ProductStack needs its name at synth: the portfolio, account and region make it unique.
    `stack`: the portfolio's scope (the stack, or the construct), before any child is added."""
    account = cdk.Stack.of(stack).account
    account = account if not cdk.Token.is_unresolved(account) else None
    if account is None:
        cdk.Annotations.of(stack).add_warning_v2("dl-launcher:asset-bucket-name", (
            "no account at synth (CDK_DEFAULT_ACCOUNT): the product asset bucket's name lacks it. Fix: synth and "
            "deploy with credentials, so that the name is unique"))
    bucket_name = "-".join(x for x in ("dl-launcher", settings.name, "assets", account, settings.region) if x)[:63]
    common = dict(encryption=s3.BucketEncryption.S3_MANAGED, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                  enforce_ssl=True, object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                  removal_policy=cdk.RemovalPolicy.RETAIN)
    stack.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
    logs = s3.Bucket(stack, "AssetAccessLogs", **common,
                     lifecycle_rules=[s3.LifecycleRule(expiration=cdk.Duration.days(365))])
    cdk.Validations.of(logs).acknowledge(cdk.Acknowledgment(
        id="AwsSolutions-S1", reason="this is the access-log bucket; logging it into itself would loop"))
    logs.node.default_child.add_metadata("checkov", {"skip": [{
        "id": "CKV_AWS_21", "comment": "access logs: S3 log delivery writes each record once under a new key"}]})
    # Versioned: a provisioned product keeps reading the asset of its own version.
    stack.asset_bucket_name = bucket_name  # literal: the shared accounts' launch role stacks name it
    return s3.Bucket(stack, "ProductAssets", **common, versioned=True, bucket_name=bucket_name,
                     server_access_logs_bucket=logs,
                     server_access_logs_prefix="assets/")


def _budget_topic(stack: Construct, construct_id: str = "BudgetAlerts") -> NotificationTopic:
    """An encrypted topic AWS Budgets may publish to (its key lets Budgets encrypt)."""
    topic = NotificationTopic(stack, construct_id, display_name="dl-launcher budgets")
    topic.allow_budgets()
    return topic


def _budget(stack: Construct, settings: PortfolioSettings, plan: ProductPlan, topic: NotificationTopic,
            stop: "sns.ITopic | None" = None) -> budgets.CfnBudget:
    """A monthly cost budget over the resources tagged with the product (activate the
    dl-launcher:product cost allocation tag once in Billing), told at 80% and 100% actual and
    100% forecast. With `stop`, the 100% actual notification goes to that topic instead (a
    notification takes one SNS topic), whose stopper tells `topic` what it stopped."""
    return cost_budget(stack, f"{plan.profile.name}-budget", name=f"dl-launcher {product_tag(settings, plan)}",
                       usd_per_month=plan.monthly_budget(), tag_key=TAG_PRODUCT, tag_value=product_tag(settings, plan),
                       topic_arn=topic.topic.topic_arn, emails=settings.budget_emails,
                       stop_topic_arn=stop.topic_arn if stop is not None else None)


def _snapshot_versions(directory: str, history: sc.ProductStackHistory, product_stack: sc.ProductStack) -> list[str]:
    """Versions recorded for this product in the snapshot directory, oldest first (ProductStackHistory
    names each file <history unique id>.<product stack artifact id>.<version>.product.template.json)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    head, tail = f"{cdk.Names.unique_id(history)}.{product_stack.artifact_id}.", ".product.template.json"
    found = sorted((f for f in folder.iterdir() if f.name.startswith(head) and f.name.endswith(tail)),
                   key=lambda f: f.stat().st_mtime)
    return [f.name[len(head):-len(tail)] for f in found]


def _acknowledge_asset_deployment(stack: cdk.Stack, assets: s3.Bucket) -> None:
    """ProductStack copies its assets into the asset bucket with aws-cdk-lib's BucketDeployment:
    its function and role are CDK's code, not ours."""
    for child in stack.node.children:
        if not child.node.id.startswith("Custom::CDKBucketDeployment"):
            continue
        why = "aws-cdk-lib's BucketDeployment (ProductStack's asset copy), run only by CloudFormation at deploy"
        ids = ["AwsSolutions-L1",
               "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
               *(f"AwsSolutions-IAM5[Action::{a}]" for a in ("s3:Abort*", "s3:DeleteObject*", "s3:GetBucket*",
                                                            "s3:GetObject*", "s3:List*"))]
        for c in child.node.find_all():
            if isinstance(c, cdk.CfnResource) and c.cfn_resource_type == "AWS::Lambda::Function":
                c.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})  # CDK's DependsOn
        for finding in ids:
            cdk.Validations.of(child).acknowledge(cdk.Acknowledgment(id=finding, reason=why))
        for resource in _resources_of(child, assets):
            cdk.Validations.of(child).acknowledge(cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{resource}]", reason=why + ": the CDK asset and product asset buckets"))


def _resources_of(construct: Construct, assets: s3.Bucket) -> list[str]:
    """The wildcard resources of the BucketDeployment's role policy, as cdk-nag names them."""
    stack = cdk.Stack.of(construct)
    region, account = env_names(stack)
    out = [f"arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-{account}-{region}/*"]
    for c in construct.node.find_all():
        if isinstance(c, s3.CfnBucket):
            out.append(f"<{stack.get_logical_id(c)}.Arn>/*")
    out.append(f"<{stack.get_logical_id(assets.node.default_child)}.Arn>/*")
    return out
