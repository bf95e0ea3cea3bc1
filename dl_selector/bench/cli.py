"""python -m dl_selector bench plan | collect | report (a contract: keep the names).

plan:    the candidates to measure and what it can cost; --max-cost refuses a plan above it.
collect: the nodes' results in S3 -> the throughput file `recommend --throughput` reads.
report:  a table, a PNG chart and a Markdown report ranked by measured samples per dollar.
"""
from __future__ import annotations

import argparse
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Callable

from ..errors import UserError
from ..validate import family_list, finite_number
from . import DEFAULT_PLAN_FILE, DEFAULT_RESULTS_FILE


def add_parser(sub, parser_class) -> None:
    b = sub.add_parser("bench", help="measured selection: plan, collect and report a benchmark of the candidates")
    bsub = b.add_subparsers(dest="bench_command", required=True, parser_class=parser_class)

    p = bsub.add_parser("plan", help="the candidates to measure and what it will cost")
    p.add_argument("--profile", required=True)
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--top", metavar="N", default="5", help="measure the best N candidates (default 5)")
    p.add_argument("--spot", action="store_true", help="rank on spot samples per dollar (as recommend --spot)")
    p.add_argument("--on-demand", action="store_true",
                   help="run the benchmark instances on-demand (default: spot, capped at the on-demand price)")
    p.add_argument("--minutes", metavar="M", default="20",
                   help="hard limit per instance, boot included (default 20; 5 to 240)")
    p.add_argument("--max-cost", metavar="USD", help="refuse a plan that could cost more than this in all")
    p.add_argument("--command", dest="bench_run", help="what each instance runs (one line; prints dl-bench lines); "
                                     "default: the reference benchmark")
    p.add_argument("--model", help="reference benchmark model: resnet50 (default) or gpt2")
    p.add_argument("--precision", help="reference benchmark precision: fp32, tf32, bf16 or fp16 "
                                       "(default: fp16 for mixed-precision profiles, fp32 for fp32 ones)")
    p.add_argument("--families", metavar="a,b", help="only these families")
    p.add_argument("--profiles", metavar="FILE", help="extra or overriding profiles (TOML or YAML)")
    p.add_argument("--name", help="names the stack (dl-bench-NAME) and the S3 prefix; default: the profile")
    p.add_argument("--out", metavar="FILE", default=DEFAULT_PLAN_FILE, help=f"default {DEFAULT_PLAN_FILE}")
    p.add_argument("--json", action="store_true")

    c = bsub.add_parser("collect", help="the results in S3 -> a throughput file (needs AWS credentials)")
    c.add_argument("--bucket", required=True, help="the stack's ResultsBucket output")
    c.add_argument("--prefix", help="default: bench/<plan name>")
    c.add_argument("--plan", metavar="FILE", default=DEFAULT_PLAN_FILE,
                   help=f"the plan that was deployed (default {DEFAULT_PLAN_FILE}): names every candidate, so one "
                        "that never reported is listed as failed")
    c.add_argument("--out", metavar="FILE", default=DEFAULT_RESULTS_FILE, help=f"default {DEFAULT_RESULTS_FILE}")

    r = bsub.add_parser("report", help="table, PNG chart and Markdown report of collected results")
    r.add_argument("--results", metavar="FILE", default=DEFAULT_RESULTS_FILE, help=f"default {DEFAULT_RESULTS_FILE}")
    r.add_argument("--out", metavar="PNG", help="write the chart here")
    r.add_argument("--markdown", metavar="FILE", help="write a Markdown report here (links the chart if --out)")
    r.add_argument("--json", action="store_true")


def run(a: argparse.Namespace, aws: Callable) -> str:
    return {"plan": _plan, "collect": _collect, "report": _report}[a.bench_command](a, aws)


def _plan(a: argparse.Namespace, aws: Callable) -> str:
    from ..catalog import load_catalog
    from ..profiles import get_profile, load_profiles
    from ..refresh import check_writable, write_text
    from ..render import dumps
    from .plan import MINUTES, MODELS, PRECISIONS, make_plan, plan_text

    catalog = load_catalog()
    catalog.check_region(a.region)
    top = int(finite_number(a.top, "--top", 1, 50, integer=True))
    minutes = int(finite_number(a.minutes, "--minutes", MINUTES[0], MINUTES[1], integer=True))
    max_cost = None if a.max_cost is None else finite_number(a.max_cost, "--max-cost", 0, 1e6, above=True)
    if a.bench_run is not None and a.model is not None:
        raise UserError("--model picks the reference benchmark's model; with --command your command is the "
                        "benchmark: pass one of the two")
    if a.model is not None and a.model not in MODELS:
        from ..errors import unknown
        raise unknown("--model", a.model, MODELS)
    if a.precision is not None and a.precision not in PRECISIONS:
        from ..errors import unknown
        raise unknown("--precision", a.precision, PRECISIONS)
    if a.bench_run is not None and a.precision is not None:
        raise UserError("--precision sets the reference benchmark's precision; with --command put it in your command")
    profile = get_profile(a.profile, load_profiles(a.profiles))
    check_writable(a.out)
    result = make_plan(profile, catalog=catalog, region=a.region, rank_market="spot" if a.spot else "on-demand",
                       launch_market="on-demand" if a.on_demand else "spot", top=top, minutes=minutes,
                       command=a.bench_run, model=a.model or "resnet50", precision=a.precision, families=family_list(a.families),
                       name=a.name, max_cost=max_cost)
    write_text(a.out, result.plan.to_json())
    if a.json:
        import json
        return dumps({"plan": json.loads(result.plan.to_json()), "file": a.out,
                      "skipped": [{"instance_type": s.instance_type, "reason": s.reason} for s in result.skipped],
                      "tied_beyond_top": list(result.tied_beyond)})
    return plan_text(result, a.out)


def _collect(a: argparse.Namespace, aws: Callable) -> str:
    import json

    from ..refresh import check_writable, write_text
    from .collect import collect, load_plan, outcome_text, s3_fetch

    plan = load_plan(a.plan)
    check_writable(a.out)
    prefix = (a.prefix or plan.prefix).strip("/")
    if not prefix:
        raise UserError("--prefix is empty; leave it out for bench/<plan name>")

    def run_collect():
        import boto3
        client = boto3.session.Session().client("s3", region_name=plan.region)
        return collect(plan, s3_fetch(client, a.bucket), source=f"s3://{a.bucket}/", prefix=prefix)

    doc, outcomes = aws("bench collect", run_collect)
    write_text(a.out, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return outcome_text(doc, outcomes, a.out)


def _report(a: argparse.Namespace, aws: Callable) -> str:
    from ..render import dumps
    from . import report as rep

    results = rep.load_results(a.results)
    report = rep.build_report(results)
    if a.out:
        from ..refresh import check_writable
        from .chart import write_chart
        check_writable(a.out)
        write_chart(report, a.out)
    if a.markdown:
        from ..refresh import write_text
        write_text(a.markdown, rep.markdown(report, chart_path=a.out))
    if a.json:
        return dumps(rep.report_json(report))
    written = [f"chart: {a.out}"] if a.out else []
    if a.markdown:
        written.append(f"report: {a.markdown}")
    return rep.table_text(report) + ("\n" + "; ".join(written) if written else "")
