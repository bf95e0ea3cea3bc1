"""`dl-launcher launch -c KEY=VALUE ...`: the plan first (types, nodes, market, what it is expected
to cost per hour and what it can cost at worst), a question, then `cdk deploy` with the pinned CDK
CLI, the same context and the approval the plan showed (dl_stacks/approval.py). `--yes` skips the
question (and CDK's own about IAM changes); a "no" runs nothing."""
from __future__ import annotations

import contextlib
import io
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .errors import CliError


def parse_context(pairs: Sequence[str]) -> dict[str, str]:
    """-c KEY=VALUE, as the CDK CLI takes them (the value may hold '=')."""
    ctx: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise CliError(f"-c {pair!r}: expected KEY=VALUE, e.g. -c profile=multi-node-training")
        ctx[key.strip()] = value
    return ctx


def app_dir(start: Path) -> Path:
    """The CDK app's directory (cdk.json): where `cdk deploy` must run."""
    for d in (start, *start.parents):
        if (d / "cdk.json").is_file():
            return d
    raise CliError(f"no cdk.json in {start} or above: run dl-launcher launch in the dl-launcher checkout "
                   "(where cdk deploy runs)")


def cdk_cli(root: Path) -> str:
    """The pinned CDK CLI (package.json) before any other on PATH."""
    pinned = root / "node_modules" / ".bin" / "cdk"
    if pinned.exists():
        return str(pinned)
    found = shutil.which("cdk")
    if found is None:
        raise CliError(f"no CDK CLI: {pinned} is missing (bash scripts/bootstrap.sh, or npm ci) and none is on PATH")
    return found


def _region(ctx: dict[str, str]) -> str:
    """As the CDK CLI resolves it: -c region, the environment, then the AWS profile's own region."""
    from dl_stacks.settings import REGION_ENV, resolve_region

    region, source = resolve_region(ctx)
    if source not in ("context region", *REGION_ENV):
        try:
            import boto3
            region = boto3.session.Session().region_name or region
        except Exception:  # a broken profile: the CDK CLI would say so; the default stands here
            pass
    return region


def plan(ctx: dict[str, Any], root: Path):
    """The stack built in-process (no synth, no AWS call) and its plan; a bad key is one line."""
    import os
    # As app.py does: jsii's 12-line end-of-life banner for Node 20 (the project's baseline) would
    # come before the plan or the one error line. Node 22/24 print nothing either way.
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    import aws_cdk as cdk

    from dl_selector.errors import UserError
    from dl_stacks.approval import check
    from dl_stacks.settings import from_context
    from dl_stacks.training_stack import TrainingStack

    if "portfolio" in ctx or "bench" in ctx:
        raise CliError("launch deploys a training stack (-c profile=NAME); a portfolio or a benchmark stack "
                       "deploys with cdk deploy")
    try:
        settings = from_context({**_project_context(root), **ctx})
        with contextlib.redirect_stdout(io.StringIO()):  # jsii's banners; the plan is what we print
            stack = TrainingStack.for_settings(cdk.App(), settings, quiet=True)
        if settings.approval.approve_hourly is not None:
            check(stack.plan, settings.approval.approve_hourly)  # one given below the worst case
    except UserError as e:
        raise CliError(str(e)) from None
    return stack.plan


def _project_context(root: Path) -> dict[str, Any]:
    """cdk.json's own context (a team may keep a profile or a threshold there), as the CDK CLI reads it."""
    try:
        return dict(json.loads((root / "cdk.json").read_text()).get("context", {}))
    except (OSError, ValueError):
        return {}


def deploy_command(cdk: str, ctx: dict[str, str], approval: Optional[str], yes: bool) -> list[str]:
    args = [cdk, "deploy"]
    for key, value in ctx.items():
        args += ["-c", f"{key}={value}"]
    if approval is not None:
        args += ["-c", f"approve_hourly={approval}"]
    if yes:
        args += ["--require-approval", "never"]
    return args


def launch(pairs: Sequence[str], *, yes: bool, region: Optional[str] = None, cwd: Optional[Path] = None,
           ask: Optional[Callable[[str], str]] = None, run: Optional[Callable[..., int]] = None) -> int:
    root = app_dir((cwd or Path.cwd()).resolve())
    ctx = parse_context(pairs)
    if region and "region" not in ctx:
        ctx["region"] = region
    ctx.setdefault("region", _region(ctx))  # the plan and the deploy price the same region
    if not yes and not sys.stdin.isatty():
        raise CliError("launch asks before it deploys: pass --yes when not at a terminal")
    p = plan(ctx, root)
    for line in p.lines():
        print(line)
    approval = p.approval if p.needs_approval and "approve_hourly" not in ctx else None
    command = deploy_command(cdk_cli(root), ctx, approval, yes)
    if not yes:
        answer = (ask or input)(f"deploy {p.head()} at up to ${p.worst:,.2f}/h? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("not deployed: nothing was created")
            return 1
    print("$ " + shlex.join(["cdk", *command[1:]]), flush=True)
    return (run or subprocess.call)(command, cwd=root)
