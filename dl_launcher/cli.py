"""dl-launcher: pick, check, watch and tear down GPU and Trainium clusters on AWS.

Examples:
  dl-launcher recommend --profile multi-node-training       rank every accelerated type
  dl-launcher preflight --profile multi-node-training       quotas, bootstrap, AMI, offerings
  dl-launcher plan --nodes 16 --gpu H100:8 --regions us-east-1,us-west-2
                                                            when can I have 16 nodes, and for how much?
  dl-launcher launch -c profile=multi-node-training -c command="dl-torchrun train.py"
                                                            the plan and its price, a question, cdk deploy
  dl-launcher status multi-node-training                    the cluster, and why it waits
  dl-launcher logs multi-node-training --follow             every node's output
  dl-launcher shell multi-node-training --rank 0            a Session Manager shell on a node
  dl-launcher destroy multi-node-training                   delete the stack, keep checkpoints

A job is named by -c job=NAME at deploy (default: the profile); its stack is dl-NAME. status, logs,
shell and destroy act only on a stack dl-launcher deployed (its DlLauncherJob output), never on
another stack of that name. The region is --region, else CDK_DEFAULT_REGION, AWS_REGION or
AWS_DEFAULT_REGION, else us-east-1. Mistakes exit 2 with one line.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from dl_core.argv import OneLineParser
from dl_core.markets import OPEN_MARKETS

from .errors import CliError

PROG = "dl-launcher"
# The selector's verbs, handed to its CLI as they are (`python -m dl_selector` stays as it is).
SELECTOR_VERBS = {"recommend": "rank instance types for a profile (dl-launcher recommend --help)",
                  "profiles": "list workload profiles", "catalog": "rebuild the catalog (needs AWS credentials)",
                  "bench": "measure throughput on real nodes and feed it to recommend"}


class _Parser(OneLineParser):
    error_class = CliError


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser, metavar="VERB")
    for verb, text in SELECTOR_VERBS.items():
        sub.add_parser(verb, help=text, add_help=False)
    pf = sub.add_parser("preflight", help="what would stop a deploy: credentials, bootstrap, AMI, offerings, quotas",
                        description="Example: dl-launcher preflight --profile multi-node-training --nodes 4\n\n"
                                    "Each check prints one line (ok, warn or fail) with the fix. Exit 1 when one fails.",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pf.add_argument("--profile", required=True, help="a workload profile (dl-launcher profiles)")
    pf.add_argument("--nodes", type=int, help="nodes in the cluster [the profile's default for -c nodes]")
    pf.add_argument("--instance-type", help="check this type instead of the profile's pick")
    pf.add_argument("--market", choices=OPEN_MARKETS, help="[the profile's default]")
    pf.add_argument("--availability-zone", help="the AZ the cluster will use, if you pin one")
    pf.add_argument("--region")
    pf.add_argument("--json", action="store_true")
    pl = sub.add_parser("plan", help="N nodes across spot, on-demand, Capacity Blocks and your reservations: "
                        "$/h, earliest start, the -c keys", formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Example: dl-launcher plan --nodes 16 --gpu H100:8 --regions us-east-1,us-west-2"
                                    "\n\nOne ranked list: capacity you hold, then what starts now, then dated "
                                    "Capacity Blocks, then the rest; each line with the $/h of the N nodes and the "
                                    "command that takes it. Read-only. Offline (--offline, or no credentials): the "
                                    "catalog's prices, and which columns need an account.")
    pl.add_argument("--nodes", type=int, required=True, help="nodes in the cluster (1-64)")
    pl.add_argument("--gpu", metavar="MODEL:COUNT", help="e.g. H100:8, A100-80GB:8, trainium2:16")
    pl.add_argument("--profile", help="a workload profile instead of --gpu (dl-launcher profiles)")
    pl.add_argument("--regions", help="comma-separated [the region, as every verb resolves it]")
    pl.add_argument("--top", type=int, default=3, help="types per market and region [3]")
    pl.add_argument("--block-hours", type=int, default=24, help="Capacity Block length: 24-336 by 24, "
                    "then to 4368 by 168 [24]")
    pl.add_argument("--offline", action="store_true", help="ask no AWS API: catalog prices only")
    pl.add_argument("--json", action="store_true")
    la = sub.add_parser("launch", help="the plan and what it costs per hour, a question, then cdk deploy",
                        description="Example: dl-launcher launch -c profile=multi-node-training -c code=. "
                                    "-c command=\"dl-torchrun train.py\"\n\n"
                                    "Shows the types, nodes, market and $/h expected and at worst, asks, then runs "
                                    "the pinned cdk deploy with the same -c keys and, where the worst case is above "
                                    "the approval threshold, -c approve_hourly=<the worst case shown>. No: nothing "
                                    "runs (exit 1).", formatter_class=argparse.RawDescriptionHelpFormatter)
    la.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                    help="a context key, as cdk deploy -c takes it (docs/deploy.md lists them)")
    la.add_argument("--yes", action="store_true", help="do not ask (nor let cdk ask about IAM changes)")
    la.add_argument("--region", help="same as -c region=NAME")
    for verb, text in (("status", "the cluster's type, nodes, and why it waits"),
                       ("logs", "the job's output from every node"),
                       ("shell", "a Session Manager shell on one node of the job"),
                       ("destroy", "delete the job's stack; say what stays (checkpoints) and what it costs")):
        v = sub.add_parser(verb, help=text, description=f"Example: dl-launcher {verb} multi-node-training",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        v.add_argument("job", help="the job name (-c job=NAME at deploy; default the profile)")
        v.add_argument("--region")
        if verb == "status":
            v.add_argument("--json", action="store_true")
        if verb == "logs":
            v.add_argument("--since", type=_since, default=3600.0, help="how far back, e.g. 30m, 6h, 2d [1h]")
            v.add_argument("--follow", action="store_true")
        if verb == "shell":
            v.add_argument("--rank", type=_rank, default=0, help="which node, in launch order [0]")
        if verb == "destroy":
            v.add_argument("--delete-checkpoints", action="store_true",
                           help="also empty and delete the retained checkpoint and access-log buckets "
                                "(also after the stack is gone)")
            v.add_argument("--yes", action="store_true", help="do not ask before deleting checkpoints")
    return p


def _since(text: str) -> float:
    from constructs_lib.fleet.cli import duration  # the fleet's own rule; imported only when given
    return duration(text)


def _rank(text: str) -> int:
    if not text.strip().isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r}: a node's rank is a whole number from 0, in launch order")
    return int(text)


def _region(a: argparse.Namespace) -> tuple[str, str]:
    """The region, checked before any AWS call: a stack deploys only where the catalog knows."""
    from dl_selector.catalog import load_catalog
    from dl_selector.errors import UserError
    from dl_stacks.settings import resolve_region

    region, source = resolve_region({"region": a.region} if a.region is not None else {})
    try:
        load_catalog().check_region(region)
    except UserError as e:
        raise CliError(str(e) + ("" if a.region is not None else f" (from {source}; --region NAME sets it)")) from None
    return region, source


def _client(name: str, region: str) -> Any:
    import boto3
    return boto3.client(name, region_name=region)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # jsii (launch, preflight build the stack in-process) prints its Node end-of-life notice as 11
    # lines of Python byte strings; app.py silences it the same way for cdk synth.
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    if argv and argv[0] in SELECTOR_VERBS:
        from dl_selector.cli import main as selector_main
        return selector_main(_with_region(argv), prog=PROG)
    try:
        a = parser().parse_args(argv)
        return _run(a)
    except CliError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # botocore's own, for problems of setup rather than code
        name = type(e).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            print("error: no AWS credentials: set AWS_PROFILE (aws configure sso), or run where a role provides "
                  "them", file=sys.stderr)
            return 2
        if type(e).__module__.startswith("botocore."):  # AWS's answer, or a setup problem botocore names
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        raise


def _with_region(argv: list[str]) -> list[str]:
    """recommend follows the same region as every other verb when --region is not given."""
    if argv[0] != "recommend" or any(x == "--region" or x.startswith("--region=") for x in argv):
        return argv
    from dl_stacks.settings import resolve_region
    return [*argv, "--region", resolve_region({})[0]]


def _run(a: argparse.Namespace) -> int:
    if a.verb == "launch":
        from .launch import launch
        return launch(a.context, yes=a.yes, region=a.region)
    if a.verb == "plan":
        return _plan(a)
    region, source = _region(a)
    if a.verb == "preflight":
        return _preflight(a, region, source)
    if a.verb == "status":
        return _status(a, region)
    if a.verb == "logs":
        from constructs_lib.fleet.cli import main as fleet_main
        from .jobstack import cluster_of, describe
        stack = describe(_client("cloudformation", region), a.job, region)  # one line if it is not a job's
        return fleet_main(["logs", "--cluster", cluster_of(stack), "--since", f"{a.since:.0f}s", "--region", region,
                           *(["--follow"] if a.follow else [])])
    if a.verb == "shell":
        return _shell(a, region)
    return _destroy(a, region)


def _preflight(a: argparse.Namespace, region: str, source: str) -> int:
    import json

    from dl_selector.errors import UserError
    from dl_stacks.selection import select
    from dl_stacks.settings import from_context

    from . import preflight

    ctx: dict[str, Any] = {"profile": a.profile, "region": region}
    for key, value in (("nodes", a.nodes), ("instance_type", a.instance_type), ("market", a.market),
                       ("availability_zone", a.availability_zone)):
        if value is not None:
            ctx[key] = str(value)
    try:
        settings = from_context(ctx)
        facts = select(settings).facts if not settings.instance_type else None
    except UserError as e:
        raise CliError(str(e)) from None
    if facts is None:
        from dl_selector.catalog import load_catalog
        facts = load_catalog().types[settings.instance_type]
    plan = preflight.Plan(facts, settings.nodes, settings.market or "spot", region, source, settings.availability_zone)
    results = preflight.run(plan, lambda name: _client(name, region))
    if a.json:
        print(json.dumps([r._asdict() for r in results], indent=1))
    else:
        print(f"preflight: {plan.nodes} x {facts.instance_type} ({plan.market}) in {region} for profile {a.profile}")
        for r in results:
            print(f"  {r.line()}")
    return 1 if any(r.level == "fail" for r in results) else 0


def _plan(a: argparse.Namespace) -> int:
    import functools
    import json

    from . import plan
    from .plan import render

    if a.regions is None:
        from dl_stacks.settings import resolve_region
        regions = [resolve_region({})[0]]
    else:
        regions = a.regions.split(",")
    req = plan.parse(a.nodes, a.gpu, a.profile, regions, a.top, a.block_hours)
    offline = "--offline" if a.offline else _no_credentials()
    result = plan.build(req, None if offline else functools.lru_cache(maxsize=None)(_client), offline)
    print(json.dumps(result.to_dict(), indent=1) if a.json else render.text(result))
    return 0


def _no_credentials() -> Optional[str]:
    """Why no account can be asked, or None: credentials are found without any call to AWS."""
    import boto3
    try:
        found = boto3.session.Session().get_credentials()
    except Exception as e:  # a broken profile (botocore's ProfileNotFound, ...): said, and offline
        return f"no usable AWS credentials: {type(e).__name__}"
    return None if found is not None else "no AWS credentials"


def _status(a: argparse.Namespace, region: str) -> int:
    import contextlib
    import io
    import json

    from constructs_lib.fleet.cli import main as fleet_main
    from constructs_lib.fleet.instances import list_cluster
    from .cost import running_cost
    from .jobstack import cluster_of, describe, output, state_key_of

    stack = describe(_client("cloudformation", region), a.job, region)
    bucket = output(stack, "CheckpointBucket")
    if not bucket:
        raise CliError(f"stack {stack['StackName']} has no CheckpointBucket output: is it a dl-launcher training "
                       f"stack (it is {stack['StackStatus']})?")
    # Nodes are those tagged with this stack's id as well as its cluster name (contract.TAG_STACK).
    args = ["status", "--bucket", bucket, "--key", state_key_of(stack), "--stack", stack["StackId"],
            "--region", region]
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        rc = fleet_main([*args, *(["--json"] if a.json else [])])
    cost = None
    if rc == 0:
        nodes = list_cluster(_client("ec2", region), cluster_of(stack), stack["StackId"])
        cost = running_cost(output(stack, "CostModel"), stack["CreationTime"].timestamp(), nodes)
    if a.json and rc == 0:
        body = json.loads(captured.getvalue())
        body["cost"] = None if cost is None else {"per_hour": round(cost.per_hour, 4), "so_far": round(cost.so_far, 2),
                                                  "unpriced": list(cost.unpriced), "prices": cost.as_of}
        print(json.dumps(body, indent=1))
        return rc
    print(captured.getvalue(), end="")
    if cost is not None:
        print(cost.line())
    return rc


def _shell(a: argparse.Namespace, region: str) -> int:
    import shutil

    from constructs_lib.fleet.instances import list_cluster

    from .jobstack import cluster_of, describe

    stack = describe(_client("cloudformation", region), a.job, region)
    nodes = sorted(list_cluster(_client("ec2", region), cluster_of(stack), stack["StackId"]),
                   key=lambda n: (n.launched, n.id))
    if not nodes:
        raise CliError(f"job {a.job} has no running node in {region}: `dl-launcher status {a.job}` says why")
    if not 0 <= a.rank < len(nodes):
        raise CliError(f"--rank {a.rank}: the cluster has {len(nodes)} running node(s): 0-{len(nodes) - 1}")
    aws = shutil.which("aws")
    if aws is None or shutil.which("session-manager-plugin") is None:
        raise CliError("the AWS CLI and its Session Manager plugin are needed (`dl-launcher preflight` links them)")
    os.execv(aws, [aws, "ssm", "start-session", "--region", region, "--target", nodes[a.rank].id])
    return 0  # not reached


def _destroy(a: argparse.Namespace, region: str) -> int:
    from .destroy import destroy

    if a.delete_checkpoints and not a.yes and not sys.stdin.isatty():  # said before any AWS call
        raise CliError("--delete-checkpoints deletes every checkpoint for good: pass --yes when not at a terminal")

    def confirm(stack: str) -> bool:
        if a.yes:
            return True
        return input(f"delete every checkpoint of {a.job} for good? type {a.job} to confirm: ").strip() == a.job

    return destroy(_client("cloudformation", region), _client("s3", region), a.job, region,
                   delete_checkpoints=a.delete_checkpoints, confirm=confirm, catalog=_client("servicecatalog", region))


def console() -> None:
    """The console script's entry point."""
    sys.exit(main())


if __name__ == "__main__":
    console()
