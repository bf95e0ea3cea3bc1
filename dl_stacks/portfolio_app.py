"""`-c portfolio=NAME [-c profiles_file=team.toml]`: the portfolio stack; with `-c product=PROFILE`,
that one product's template as a plain stack instead (parameters as a user enters them, e.g. for
`cdk deploy --parameters`; the local deploy into moto uses it)."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import aws_cdk as cdk

from dl_selector.errors import UserError, closest

from .portfolio_settings import PortfolioSettings, portfolio_from_file
from .product_plan import ProductPlan, plan_product
from .context_keys import check_only
from .context_values import boolean, named, show
from .settings import network_from_context

# What a portfolio reads from context; the training stack's other keys mean nothing here.
PORTFOLIO_KEYS = ("portfolio", "product", "profiles_file", "region", "local", "vpc_id", "subnet_ids",
                  "availability_zone", "snapshots")
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


def portfolio_from_context(ctx: Mapping[str, Any]) -> PortfolioSettings:
    check_only(ctx, PORTFOLIO_KEYS, lambda key: (
        f"context {key} is not used with portfolio: a product's users choose it when they launch (or the team "
        f"limits it in [products.NAME] of profiles_file); allowed with portfolio: {', '.join(PORTFOLIO_KEYS)}"))
    name = ctx["portfolio"].strip()
    if not _NAME.fullmatch(name):
        near = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-")[:40]
        raise UserError(f"context portfolio={show(name)}: use 1-40 lower-case letters, digits and dashes (it names "
                        "the stack and the products)" + (f"; closest: {near}" if near else ""))
    from dl_selector.catalog import load_catalog
    catalog = load_catalog()
    region = ctx.get("region", "us-east-1").strip()
    named("region", region, catalog.regions)
    region = catalog.check_region(region)
    vpc_id, subnet_ids, az = network_from_context(ctx, region)
    path = ctx["profiles_file"].strip() if "profiles_file" in ctx else None
    settings = portfolio_from_file(name, region, path, local=boolean("local", ctx.get("local", False)),
                                   vpc_id=vpc_id, subnet_ids=subnet_ids, availability_zone=az)
    if "product" in ctx:
        product = ctx["product"].strip()
        names = [p.name for p in settings.profiles]
        if product not in names:
            near = closest(product, names, n=1)
            raise UserError(f"context product={show(product)} is not a product of portfolio {name}"
                            + (f"; closest: {near[0]}" if near else "") + f"; allowed: {', '.join(names)}")
        settings = dataclasses.replace(settings, profiles=tuple(p for p in settings.profiles if p.name == product))
    return settings


def prepare(ctx: Mapping[str, Any]) -> tuple[PortfolioSettings, list[ProductPlan]]:
    """The portfolio's settings and one plan per product, from context (or a construct's props as
    context): every mistake one UserError before any construct exists."""
    import os

    settings = portfolio_from_context(ctx)
    # Absolute: the CDK's jsii process keeps the directory it started in, whatever this one does.
    snapshots = ctx["snapshots"].strip() if "snapshots" in ctx else settings.snapshots
    _check_snapshots(snapshots)
    settings = dataclasses.replace(settings, snapshots=os.path.abspath(snapshots))
    plans = [plan_product(p, settings.limits_for(p.name), settings.region, source=settings.source)
             for p in settings.profiles]
    return settings, plans


def build(app: cdk.App, ctx: Mapping[str, Any], synthesizer=None) -> cdk.Stack:
    """The portfolio stack (or one product as a plain stack) for the context."""
    import os

    settings, plans = prepare(ctx)
    env = cdk.Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=settings.region)
    if "product" in ctx:
        from .portfolio_stack import product_tag
        from .training_product import TrainingProduct
        (plan,) = plans
        stack = cdk.Stack(app, f"dl-{settings.name}-{plan.profile.name}", env=env, synthesizer=synthesizer,
                          description=f"dl-launcher {settings.name}: {plan.profile.name} (the product's template)")
        TrainingProduct(stack, "Product", plan=plan, product_tag=product_tag(settings, plan), vpc_id=settings.vpc_id,
                        subnet_ids=settings.subnet_ids, availability_zone=settings.availability_zone,
                        local=settings.local)
        return stack
    from .portfolio_stack import LaunchRoleStack, PortfolioStack
    stack = PortfolioStack(app, f"dl-portfolio-{settings.name}", settings=settings, plans=plans, env=env,
                           synthesizer=synthesizer,
                           description=f"dl-launcher portfolio {settings.name}: {len(plans)} products")
    if stack.shared:
        LaunchRoleStack(app, f"dl-portfolio-{settings.name}-launch-role", portfolio=stack,
                        env=cdk.Environment(region=settings.region), synthesizer=synthesizer,
                        description=f"dl-launcher portfolio {settings.name}: its launch role, for a shared account")
    return stack


def _check_snapshots(path: str) -> None:
    """ProductStackHistory writes one template per product version into this directory: a file,
    or a place that cannot become a directory, is one line before anything is synthesized."""
    import os

    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"context snapshots={show(path, 300)} is a file: expected the directory where each product "
                        "version's template is kept (default product-stack-snapshots)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(path) and not os.path.isdir(parent):
        raise UserError(f"context snapshots={show(path, 300)}: its parent {show(parent, 300)} is not a directory; "
                        "create it, or name a directory that exists")
