"""ServiceCatalogPortfolio: dl-launcher's Service Catalog portfolio as a construct, for a platform
team's own CDK app. The same portfolio `cdk deploy -c portfolio=NAME` deploys (one product per
profile, the team's limits, the launch role, cost TagOptions, budgets, shares), built in any stack."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_budgets as budgets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_servicecatalog as sc
import aws_cdk.aws_sns as sns
from constructs import Construct

from constructs_lib.observability.notifications import NotificationTopic
from dl_selector.errors import UserError

from .portfolio_app import prepare
from .portfolio_settings import PortfolioSettings
from .portfolio_stack import LaunchRoleStack, populate
from .product_plan import ProductPlan


class ServiceCatalogPortfolio(Construct):
    """Every profile of a profiles file as a governed Service Catalog product, in your own stack.

    ```python
    stack = cdk.Stack(app, "Platform", env=cdk.Environment(region="us-east-1"))
    portfolio = ServiceCatalogPortfolio(stack, "Gpu", name="ml-platform", profiles_file="team.toml")
    portfolio.portfolio.give_access_to_role(engineers)
    ```

    The props are the context keys of `cdk deploy -c portfolio=NAME` (docs/self-service.md), and
    a bad one raises dl_selector.errors.UserError with the same one line, before anything is built.

    Args:
        scope: the stack (or a construct in it) that holds the portfolio.
        id: the construct's id.
        name: the portfolio's name, 1-40 lower-case letters, digits and dashes; it names the
            products ("NAME: PROFILE"), the asset bucket and the launch role.
        profiles_file: a TOML file of profiles, `[portfolio]` and `[products.PROFILE]` limits.
            Default: the built-in profiles, each a product, with no limits beyond the selector's.
        region: the region the products are priced and deployed in. Default: the stack's region,
            which must then be concrete (`env=cdk.Environment(region=...)`).
        snapshots: the directory where ProductStackHistory keeps each product version's template
            (commit it). Default: `product-stack-snapshots`, relative to the working directory.
        vpc_id: launch every product into this VPC. Default: each launch makes its own VPC.
        subnet_ids: with vpc_id and availability_zone: the subnets (in that one AZ) nodes use.
        availability_zone: the AZ of subnet_ids.
        local: the products' templates for a local moto deploy. Default: False.

    Attributes:
        portfolio: the servicecatalog.Portfolio.
        products: {profile: servicecatalog.CloudFormationProduct}.
        product_stacks: {profile: servicecatalog.ProductStack}, each the TrainingProduct template.
        launch_role: the role Service Catalog launches products with.
        tag_options: the mandatory cost TagOptions (team, project, cost-centre).
        budgets: {profile: a monthly CfnBudget}.
        topic: the budget alerts' NotificationTopic.
        assets: the bucket that holds the products' assets.
        settings: the PortfolioSettings read from the props.
        plans: one ProductPlan per product (types, markets, limits, prices).
    """

    settings: PortfolioSettings
    plans: list[ProductPlan]
    portfolio: sc.Portfolio
    products: dict[str, sc.CloudFormationProduct]
    product_stacks: dict[str, sc.ProductStack]
    launch_role: iam.IRole
    tag_options: sc.TagOptions
    budgets: dict[str, budgets.CfnBudget]
    topic: NotificationTopic
    assets: s3.Bucket
    asset_bucket_name: str
    resource_types: set[str]
    shared: bool
    stop_topics: dict[str, sns.ITopic]

    def __init__(self, scope: Construct, id: str, *, name: str, profiles_file: Optional[str] = None,
                 region: Optional[str] = None, snapshots: str = "product-stack-snapshots",
                 vpc_id: Optional[str] = None, subnet_ids: Sequence[str] = (),
                 availability_zone: Optional[str] = None, local: bool = False) -> None:
        ctx: dict[str, Any] = {"portfolio": name, "region": _region(scope, region), "snapshots": snapshots,
                               "local": local}
        for key, value in (("profiles_file", profiles_file), ("vpc_id", vpc_id),
                           ("subnet_ids", ",".join(subnet_ids)), ("availability_zone", availability_zone)):
            if value:
                ctx[key] = value
        try:
            settings, plans = prepare(ctx)
        except UserError as e:  # the context's wording, for props of the same names
            raise UserError(f"ServiceCatalogPortfolio {id}: {str(e).removeprefix('context ')}") from None
        super().__init__(scope, id)
        self.plans = plans
        populate(self, settings, plans)


def _region(scope: Construct, region: Optional[str]) -> str:
    stack_region = cdk.Stack.of(scope).region
    concrete = not cdk.Token.is_unresolved(stack_region)
    if region is None and not concrete:
        raise UserError("ServiceCatalogPortfolio needs a region: give its stack env=cdk.Environment(region=...), "
                        "or pass region=")
    if region is not None and concrete and region != stack_region:
        raise UserError(f"ServiceCatalogPortfolio region={region!r} is not its stack's region {stack_region!r}: "
                        "the products are priced where they deploy; leave region out")
    return region if region is not None else stack_region


class PortfolioLaunchRoleStack(LaunchRoleStack):
    """The launch role of a shared ServiceCatalogPortfolio, as a stack of its own, for each account
    the portfolio is shared with (deploy it there, or as a StackSet): Service Catalog looks a
    shared product's launch role up by name in the launching account.

    ```python
    hub = cdk.Stack(app, "Platform", env=cdk.Environment(account="111111111111", region="us-east-1"))
    portfolio = ServiceCatalogPortfolio(hub, "Gpu", name="ml", profiles_file="team.toml")  # shares in [portfolio]
    PortfolioLaunchRoleStack(app, "GpuLaunchRole", portfolio=portfolio,
                             env=cdk.Environment(account="222222222222", region="us-east-1"))
    ```

    The same role as the hub's (permissions from the products' resource types, the products'
    permissions boundary beside it), named `dl-launcher-NAME-launch`, reading the hub's asset bucket.
    A portfolio shared with no account (`share_with_accounts` in profiles_file's [portfolio])
    uses the hub's own role and needs none: that, or a region other than the portfolio's, raises
    dl_selector.errors.UserError with one line, before anything is built.

    Args:
        scope: the app (or a stage).
        id: the stack's construct id.
        portfolio: the ServiceCatalogPortfolio whose products this role launches.
        env: the shared account and the portfolio's region. Default: the portfolio's region,
            the account of the CDK CLI's credentials.
        description: the stack's description. Default: names the portfolio.
        stack_name: as cdk.Stack's.
        synthesizer: as cdk.Stack's.

    Attributes:
        role: the iam.Role Service Catalog assumes in this account.
        boundary: the ManagedPolicy every role a product creates must carry.
    """

    role: iam.IRole
    boundary: iam.IManagedPolicy

    def __init__(self, scope: Construct, id: str, *, portfolio: ServiceCatalogPortfolio,
                 env: Optional[cdk.Environment] = None, description: Optional[str] = None,
                 stack_name: Optional[str] = None, synthesizer: Optional[cdk.IStackSynthesizer] = None) -> None:
        settings = portfolio.settings
        if not portfolio.shared:
            raise UserError(f"PortfolioLaunchRoleStack {id}: portfolio {settings.name} is shared with no account "
                            "(share_with_accounts in profiles_file's [portfolio]): its products use the hub's own "
                            "launch role (portfolio.launch_role); leave this stack out")
        region = env.region if env is not None and env.region is not None else None
        if region is not None and not cdk.Token.is_unresolved(region) and region != settings.region:
            raise UserError(f"PortfolioLaunchRoleStack {id}: env region {region!r} is not portfolio "
                            f"{settings.name}'s region {settings.region!r}: the role launches its products there")
        account = env.account if env is not None else None
        hub = cdk.Stack.of(portfolio).account
        if account is not None and not cdk.Token.is_unresolved(account) and account == hub:
            raise UserError(f"PortfolioLaunchRoleStack {id}: account {account} holds the portfolio, whose own "
                            f"launch role has this name already; deploy this stack in the accounts it is shared with")
        env = cdk.Environment(account=account, region=settings.region)
        super().__init__(scope, id, portfolio=portfolio, env=env, stack_name=stack_name, synthesizer=synthesizer,
                         description=description or f"dl-launcher portfolio {settings.name}: its launch role, "
                                                    "for a shared account")
