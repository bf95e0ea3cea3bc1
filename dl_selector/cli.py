"""python -m dl_selector: profiles | recommend | show | bench plan|collect|report | catalog refresh (a contract:
keep the names).

Bad input exits 2 with one line on stderr: what was wrong, what is allowed, the closest valid
value. Names are matched exactly, case included: regions, instance types and families are AWS's
lower-case names and profile names are whatever their file says, so `--region US-EAST-1`,
`show P4D.24XLARGE`, `--families P5` and `--profile Multi-Node-Training` are refused with the
exact spelling as the closest match rather than guessed at. Everything printed passes through
validate.clean, so control characters from user files reach the terminal escaped."""
from __future__ import annotations

import argparse
import sys
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional

from dl_core.argv import OneLineParser
from .errors import UserError
from .validate import clean, family_list, finite_number

# recommend --live: cached live prices younger than this many minutes are used without calling AWS.
DEFAULT_MAX_AGE = 60
MAX_AGE_LIMIT = 7 * 24 * 60


class _Parser(OneLineParser):
    error_class = UserError


def _add_profiles(sub) -> None:
    s = sub.add_parser("profiles", help="list workload profiles")
    s.add_argument("--json", action="store_true")
    s.add_argument("--profiles", metavar="FILE", help="extra or overriding profiles (TOML or YAML)")


def _add_recommend(sub) -> None:
    s = sub.add_parser("recommend", help="rank instance types for a profile")
    from .recommend_args import GPU_ONLY_PROFILE
    s.add_argument("--profile", help=f"the workload profile (default with --gpu: {GPU_ONLY_PROFILE})")
    s.add_argument("--region", default="us-east-1")
    s.add_argument("--spot", action="store_true", help="rank with spot prices")
    s.add_argument("--capacity-block", action="store_true",
                   help="rank on Capacity Block for ML rates (types AWS sells only that way are excluded otherwise)")
    s.add_argument("--top", metavar="N", help="show the best N (1 to the catalog's size)")
    s.add_argument("--families", metavar="a,b", help="only these families (names retired ones too)")
    s.add_argument("--throughput", metavar="FILE", help="measured samples/s (CSV or JSON) that replace the model")
    s.add_argument("--catalog", metavar="FILE", help="a catalog written by 'catalog refresh --out'")
    s.add_argument("--prices", metavar="FILE", help="your own price CSV (private pricing, discounts)")
    s.add_argument("--profiles", metavar="FILE", help="extra or overriding profiles (TOML or YAML)")
    s.add_argument("--live", action="store_true",
                   help="current spot (per AZ) and on-demand prices from AWS (needs credentials; cached)")
    s.add_argument("--max-age", metavar="MINUTES",
                   help=f"with --live: use cached prices younger than this (default {DEFAULT_MAX_AGE}; 0 refetches)")
    s.add_argument("--az", metavar="a,b", help="with --live: only these Availability Zones count for spot")
    s.add_argument("--trust-single-az-spot", action="store_true",
                   help="with --spot: rank on spot quotes set aside as implausibly low (below 25%% of on-demand on a "
                        "snapshot, or below half their previous figure; docs/selector.md)")
    s.add_argument("--gpu", metavar="MODEL[:COUNT]",
                   help="only this accelerator model, and count per node (SkyPilot's syntax: H100:8, A10G, trainium2:16)")
    s.add_argument("--min-gpu-memory", metavar="GB",
                   help="at least this much memory per accelerator, in the vendor's GB (24 includes the A10G and L4)")
    s.add_argument("--max-price", metavar="USD", help="at most this price per node-hour in the ranked market")
    s.add_argument("--model-size", metavar="N", help="the model's parameters (7B, 70B, 1.5B, 500M): keep the nodes "
                   "whose accelerators hold it together (with --task; docs/selector.md, Sizing by model)")
    s.add_argument("--task", metavar="T", help="with --model-size: finetune (full), pretrain or inference")
    s.add_argument("--precision", metavar="P", help="with --model-size: bf16 (default), fp16, fp32; "
                   "for inference also fp8, int8, int4, fp4")
    s.add_argument("--objective", metavar="O", help="rank by this instead of the profile's objective: "
                   "max_throughput, max_samples_per_dollar, min_price, max_accelerator_memory, min_latency "
                   "(with --model-size N --task inference)")
    s.add_argument("--json", action="store_true")


def _add_show(sub) -> None:
    s = sub.add_parser("show", help="one instance type's full catalog entry")
    s.add_argument("instance_type")
    s.add_argument("--catalog", metavar="FILE")
    s.add_argument("--json", action="store_true")


def _add_bench(sub) -> None:
    from .bench.cli import add_parser as add_bench
    add_bench(sub, _Parser)


def _add_catalog(sub) -> None:
    s = sub.add_parser("catalog", help="catalog maintenance")
    csub = s.add_subparsers(dest="catalog_command", required=True, parser_class=_Parser)
    r = csub.add_parser("refresh", help="rebuild the catalog from the EC2 APIs (needs AWS credentials)")
    r.add_argument("--region", action="append", metavar="R",
                   help="regions to check offerings in, or with --prices to price (repeatable; default: all)")
    r.add_argument("--out", metavar="FILE", help="where to write (default: print a summary and write nothing)")
    r.add_argument("--no-live-prices", action="store_true", help="keep the cited price table, skip price APIs")
    r.add_argument("--prices", action="store_true",
                   help="prices only: keep the embedded specs, fetch live spot and on-demand prices "
                        "(default regions: the four the embedded prices cover)")


# Each command's parser, built only when that command runs (or for --help and mistakes, all of
# them): argparse's parsers for every command cost a cold `recommend` ~5 ms (issue 39 item 7).
_COMMANDS = {"profiles": _add_profiles, "recommend": _add_recommend, "show": _add_show, "bench": _add_bench,
             "catalog": _add_catalog}


def _parser(prog: str = "python -m dl_selector", only: Optional[str] = None) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, add in _COMMANDS.items():
        if only in (None, name):
            add(sub)
    return p


def _recommend(a: argparse.Namespace) -> str:
    from . import render
    from .catalog import load_catalog
    from .profiles import load_profiles
    from .recommend import recommend
    from .recommend_args import profile_and_filters
    from .throughput import load_measurements

    catalog = load_catalog(a.catalog)
    # More rows than the catalog has types is a typo, not a wish; say so rather than clamp.
    top = None if a.top is None else int(finite_number(a.top, "--top", 1, max(len(catalog), 1), integer=True))
    if not a.live and (a.max_age is not None or a.az is not None):
        raise UserError(f"{'--max-age' if a.max_age is not None else '--az'} only applies with --live")
    user_prices = None
    if a.prices:
        from .prices import load_prices
        user_prices = load_prices(a.prices)
        catalog.with_prices(user_prices)  # refuse an unknown type or region now, before any AWS call
    filters, profile = profile_and_filters(a, catalog, load_profiles(a.profiles))
    measured = load_measurements(a.throughput, catalog.types) if a.throughput else None
    if a.throughput:
        from .throughput import failed_in
        for name, reason in failed_in(a.throughput):
            _warn(f"measurement failed for {name}: {reason}; it ranks on the model")
    families = family_list(a.families)
    if a.spot and a.capacity_block:
        raise UserError("--spot and --capacity-block name two markets; pick one (neither: on-demand)")
    market = "capacity-block" if a.capacity_block else "spot" if a.spot else "on-demand"
    if a.live:  # after the local checks: a typo must not cost a round of AWS calls
        catalog = _live_catalog(a, catalog)
        if market == "capacity-block":
            catalog = _live_capacity_blocks(a, catalog)
    if user_prices is not None:  # the user's own prices (private pricing, discounts) win over list prices
        catalog = catalog.with_prices(user_prices)
    rec = recommend(profile, region=a.region, market=market, top=top, families=families,
                    measured=measured, catalog=catalog, filters=filters,
                    trust_single_az_spot=a.trust_single_az_spot)
    if rec.calibration is not None:  # said on stderr too: it changes every modelled figure shown
        _warn(f"modelled figures scaled by {rec.calibration.scale:.3g} into your measurements' units "
              f"({rec.calibration.describe()} in {a.throughput}), so unmeasured types rank like for like")
    return render.dumps(rec.to_dict()) if a.json else render.recommendation_text(rec)




def _warn(message: str) -> None:
    print(clean(message), file=sys.stderr)


def _aws(what: str, call):
    """Run call() (which talks to AWS); any botocore error becomes one line and exit 2."""
    try:
        import botocore.exceptions as bx
    except ImportError:
        raise UserError(f"{what} needs boto3: pip install 'dl-launcher[refresh]'") from None
    try:
        return call()
    except (bx.NoCredentialsError, bx.PartialCredentialsError):
        raise UserError(f"{what} needs AWS credentials (AWS_PROFILE or AWS_ACCESS_KEY_ID); none found") from None
    except (bx.ClientError, bx.BotoCoreError) as e:
        raise UserError(f"{what} failed talking to AWS: {' '.join(str(e).split())}") from None


def _live_catalog(a: argparse.Namespace, catalog):
    """The catalog with live prices for --region (recommend --live)."""
    from . import live_prices

    max_age = DEFAULT_MAX_AGE if a.max_age is None else finite_number(a.max_age, "--max-age", 0, MAX_AGE_LIMIT)
    catalog.check_region(a.region)
    azs = None
    if a.az is not None:
        names = [z.strip() for z in a.az.split(",")]
        if not all(names):
            raise UserError(f"--az {clean(repr(a.az))} has an empty name; pass AZ names such as {a.region}a,{a.region}b")
        azs = live_prices.check_azs(names, [a.region])
    table, summaries = _aws("recommend --live", lambda: live_prices.for_catalog(
        catalog, [a.region], azs=azs, max_age_minutes=max_age, log=_warn))
    for s in summaries:
        _warn("live prices: " + s.line())
    return catalog.with_prices(table)


def _live_capacity_blocks(a: argparse.Namespace, catalog):
    """Today's Capacity Block quotes in --region for the types AWS reserves as blocks (not cached:
    a quote is for a start date and moves with every purchase)."""
    from .capacity_block_quotes import quote_rates

    def quote():
        import boto3
        ec2 = boto3.session.Session().client("ec2", region_name=a.region)
        names = [f.instance_type for f in catalog if f.capacity_block_source and a.region in f.regions]
        return quote_rates(ec2, names, log=_warn)

    rates = _aws("recommend --live --capacity-block", quote)
    _warn(f"live Capacity Block quotes: {len(rates)} type(s) in {a.region}")
    return catalog.with_capacity_block_prices(a.region, rates)


def _show(a: argparse.Namespace) -> str:
    from . import render
    from .catalog import load_catalog

    catalog = load_catalog(a.catalog)
    facts = catalog.get(a.instance_type)
    return render.dumps(render.show_dict(facts)) if a.json else render.show_text(facts, catalog)


def _profiles(a: argparse.Namespace) -> str:
    from . import render
    from .profiles import load_profiles

    profiles = load_profiles(a.profiles)
    return render.dumps(render.profiles_json(profiles)) if a.json else render.profiles_text(profiles)


def _refresh_prices(a: argparse.Namespace) -> str:
    """catalog refresh --prices: the embedded catalog with live prices; no DescribeInstanceTypes."""
    from .record import replace

    from . import live_prices
    from .catalog import load_catalog
    from .refresh import check_writable, write_catalog

    if a.no_live_prices:
        raise UserError("--prices fetches live prices; --no-live-prices skips them: pass one of the two")
    catalog = load_catalog()
    regions = list(dict.fromkeys(a.region)) if a.region else list(live_prices.PRICED_REGIONS)
    for r in regions:
        catalog.check_region(r)
    if a.out:
        check_writable(a.out)  # before the AWS calls, not after
    now = live_prices.utcnow()
    table, summaries = _aws("catalog refresh", lambda: live_prices.for_catalog(
        catalog, regions, max_age_minutes=0, now=now, log=_warn))
    fresh = catalog.with_prices(table)
    fresh = replace(fresh, notes=fresh.notes + (
        f"live prices for {', '.join(regions)} fetched {live_prices.iso_minute(now)} "
        "(DescribeSpotPriceHistory, Price List API); specs as embedded",))
    if a.out:
        write_catalog(fresh, a.out)  # all or nothing
    lines = [s.line() for s in summaries]
    lines.append(f"cached in {live_prices.cache_dir()}; "
                 + (f"written to {a.out}" if a.out else "pass --out FILE to write a catalog with them"))
    return "\n".join(lines)


def _bench(a: argparse.Namespace) -> str:
    from .bench.cli import run
    return run(a, _aws)


def _refresh(a: argparse.Namespace) -> str:
    if a.prices:
        return _refresh_prices(a)
    try:
        from .refresh import check_writable, refresh, write_catalog
        import botocore.exceptions as bx
    except ImportError:
        raise UserError("catalog refresh needs boto3: pip install 'dl-launcher[refresh]'") from None
    if a.out:
        check_writable(a.out)  # before minutes of AWS calls, not after
    try:
        catalog = refresh(regions=a.region, live_prices=not a.no_live_prices)
    except bx.NoCredentialsError:
        raise UserError("catalog refresh needs AWS credentials (AWS_PROFILE or AWS_ACCESS_KEY_ID); none found") from None
    except (bx.ClientError, bx.BotoCoreError) as e:
        raise UserError(f"catalog refresh failed talking to AWS: {e}") from None
    if a.out:
        write_catalog(catalog, a.out)  # all or nothing: no partial file on error
    return (f"{len(catalog)} types, {len(catalog.regions)} regions, as of {catalog.as_of}"
            + (f"; written to {a.out}" if a.out else "; pass --out FILE to write it"))


def main(argv: Optional[list[str]] = None, *, prog: str = "python -m dl_selector") -> int:
    try:
        args = sys.argv[1:] if argv is None else argv
        a = _parser(prog, only=args[0] if args and args[0] in _COMMANDS else None).parse_args(args)
        handler = {"profiles": _profiles, "recommend": _recommend, "show": _show, "bench": _bench}.get(a.command, _refresh)
        out = handler(a)
        # Line by line so that the table's own newlines stay; JSON output is already escaped.
        print("\n".join(clean(line) for line in out.split("\n")))
        return 0
    except UserError as e:
        # clean: a path or name with a newline or ESC in it must not split or colour the line.
        print(f"error: {clean(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
