#!/usr/bin/env python3
"""The CDK app: context -> validated settings -> stacks. `cdk deploy -c profile=NAME`, or
`-c bench=PLAN_FILE` for the benchmark stack of a `bench plan`."""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

# The project's baseline is Node 20 (what CI and a fresh machine have); jsii prints a 12-line
# end-of-life banner on every synth for it. Node 22/24 print nothing either way.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from dl_selector.errors import UserError
from dl_stacks.settings import from_context

_MESSAGE_LIMIT = 2000


def main(context: Optional[Mapping[str, Any]] = None, outdir: Optional[str] = None) -> int:
    """Synthesize, or print what was wrong as one line on stderr and return 2 before any stack
    exists (so nothing is written to the cloud assembly). `context` is added to what the CDK CLI
    passed (cdk.json, -c), as -c would; tests call main(context, outdir) in-process."""
    import aws_cdk as cdk
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App(outdir=outdir) if outdir else cdk.App()
    try:
        ctx = {**_context(app), **(context or {})}
        from dl_stacks.bench_settings import bench_from_context
        bench = bench_from_context(ctx)
        if "portfolio" in ctx:  # -c portfolio=NAME: the platform team's Service Catalog portfolio
            from dl_stacks.portfolio_app import build
            build(app, ctx, synthesizer=_synthesizer_for(ctx))
        elif bench is not None:  # -c bench=PLAN_FILE: the benchmark stack instead of a training one
            from dl_stacks.bench_stack import bench_stack
            bench_stack(app, bench, synthesizer=_synthesizer(bench))
        else:
            settings = from_context(ctx)
            from dl_stacks.training_stack import TrainingStack
            stack = TrainingStack.for_settings(app, settings, synthesizer=_synthesizer(settings), quiet=True)
            from dl_stacks.approval import check
            check(stack.plan, settings.approval.approve_hourly)  # the price before the spend: before any synth
            print(stack.summary(), file=sys.stderr)
            _preflight(settings, stack.selection.facts)
    except UserError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    # Every synth is checked: cdk-nag's AwsSolutions pack, through CDK's policy validation.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    try:
        app.synth()
    except Exception as e:  # a construct's own check, e.g. user data over EC2's 16 KB, raised through jsii
        first = _validation_error(str(e))
        if first is None:
            raise
        print(f"error: {one_line(first)}", file=sys.stderr)
        return 2
    return 0


def _preflight(settings, facts) -> None:
    """dl-launcher preflight's checks, printed after the summary when the CDK CLI found an account
    (it sets CDK_DEFAULT_ACCOUNT from the credentials it resolved); never with -c local=true or
    -c preflight=false. A failed check is printed, not fatal: the deploy is the user's call."""
    if not settings.preflight or settings.local:
        return
    account = os.environ.get("CDK_DEFAULT_ACCOUNT")
    if not account:
        print("preflight: skipped (no AWS account from the CDK CLI: offline or no credentials); "
              f"`dl-launcher preflight --profile {settings.profile.name}` runs the checks", file=sys.stderr)
        return
    import boto3
    from botocore.config import Config

    from dl_launcher import preflight

    quick = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=10)
    plan = preflight.Plan(facts, settings.nodes, settings.market or "spot", settings.region, settings.region_source,
                          settings.availability_zone)
    results = preflight.run(plan, lambda name: boto3.client(name, region_name=settings.region, config=quick))
    failed = [r for r in results if r.level == "fail"]
    print(f"preflight ({len(results)} checks; -c preflight=false skips them):", file=sys.stderr)
    for r in results:
        if r.level != "ok":
            print(f"  {r.line()}", file=sys.stderr)
    if failed:
        print(f"  {len(failed)} failed: the cluster may never launch until they are fixed", file=sys.stderr)


def _validation_error(message: str) -> Optional[str]:
    """The first of CDK's "Validation failed with the following errors:" as one line (they are
    found before any template is written), or None for anything else."""
    if "ValidationFailedWithErrors" not in message:
        return None
    errors = [x.strip() for x in message.splitlines() if x.strip().startswith("[")]
    if not errors:
        return None
    path, _, text = errors[0][1:].partition("] ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{text} ({path}){more}"


def one_line(message: str) -> str:
    """Whatever a message holds, it prints as one line: control characters escaped, cut short."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT] + f"... ({len(text)} characters)"


def _synthesizer(settings):
    """`-c local=true`: a synthesizer that needs no bootstrap stack (the local moto deploy);
    otherwise CDK's default, which uses the account's bootstrap resources."""
    if not settings.local:
        return None
    import aws_cdk as cdk
    return cdk.LegacyStackSynthesizer()


def _synthesizer_for(ctx: Mapping[str, Any]):
    """-c local=true for a portfolio or product: no bootstrap roles needed. One product deploys into
    moto with the legacy synthesizer; a whole portfolio cannot use it (its products' templates would
    reference the portfolio's asset parameters across stacks, which CDK refuses), so its assets keep
    concrete names and the CLI's own credentials deploy them."""
    from dl_stacks.context_values import boolean
    local = boolean("local", ctx.get("local", False))
    if local and "product" not in ctx:
        import aws_cdk as cdk
        return cdk.CliCredentialsStackSynthesizer()
    return _synthesizer(type("Local", (), {"local": local})())


def _context(app) -> dict:
    # Everything, typos included, so that settings can name the closest valid key.
    return dict(app.node.get_all_context() or {})


if __name__ == "__main__":
    sys.exit(main())
