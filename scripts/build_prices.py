"""Rebuild dl_selector/data/prices.csv, prices_sources.toml and prices.md from the two price sources.

    python scripts/build_prices.py --on-demand all_gpu_instances.js --spot vms.csv \\
        --on-demand-ref "github:tsaol/aws-gpu@<commit> data/all_gpu_instances.js" \\
        --spot-ref "github:skypilot-org/skypilot-catalog@<commit> catalogs/v8/aws/vms.csv" \\
        --spot-as-of <commit date> [--spot-previous older/vms.csv --spot-previous-ref REF]
        [--comparison-from dl_selector/data/prices_sources.toml]  # keep a comparison whose older file is gone

    python scripts/build_prices.py --md-only   # prices.md again from the committed csv + toml

The instance types are the catalog's (dl_selector/data/catalog.json); the regions are
dl_selector.price_sources.REGIONS, and a source that prices a catalog type in a region missing from it
(a Local Zone or Wavelength Zone key is not a region) is refused rather than dropped. The output
is sorted and byte-identical on a rerun. Every file is written only after all inputs were read and
checked.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dl_selector.errors import UserError
from dl_selector.price_sources import (
    build_rows,
    compare_snapshots,
    parse_on_demand_js,
    read_csv_rows,
    read_spot_quotes,
    render_csv,
    spot_stats,
    unlisted_regions,
)
from dl_selector.prices_page import Sources, load_sources_toml, render_markdown, render_sources_toml

DATA = ROOT / "dl_selector" / "data"


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None


def catalog_types(path: str) -> tuple[list[str], list[str]]:
    """(instance types, retired families) of a catalog.json."""
    doc = json.loads(_read(path, "catalog"))
    types = sorted(t["instance_type"] for t in doc["types"])
    retired = sorted({t["instance_type"].split(".")[0] for t in doc["types"] if t.get("retired")})
    return types, retired


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--on-demand", help="tsaol/aws-gpu data/all_gpu_instances.js")
    ap.add_argument("--spot", help="skypilot-catalog catalogs/v8/aws/vms.csv")
    ap.add_argument("--on-demand-ref", help="citation for the on-demand file, written to the source column")
    ap.add_argument("--spot-ref", help="citation for the spot file, written to the spot_source column")
    ap.add_argument("--on-demand-as-of", help="date of the on-demand figures (default: the file's 'Last updated' header)")
    ap.add_argument("--on-demand-note", default="", help="one sentence on how the on-demand file was obtained")
    ap.add_argument("--spot-as-of", default="unknown", help="date of the spot snapshot (its commit date)")
    ap.add_argument("--spot-date-note", default="", help="one sentence on how spot_as_of was established")
    ap.add_argument("--spot-previous", help="an older vms.csv to compare the spot medians with")
    ap.add_argument("--spot-previous-ref", default="", help="citation for --spot-previous")
    ap.add_argument("--spot-previous-families", default="",
                    help="comma-separated families to compare (when --spot-previous holds only some)")
    ap.add_argument("--comparison-from",
                    help="an earlier prices_sources.toml whose [comparison] is kept as written (when the older "
                         "snapshot it was computed from is not at hand); --spot-previous-ref, if given, "
                         "replaces its 'older snapshot' line")
    ap.add_argument("--catalog", default=str(DATA / "catalog.json"), help="catalog whose types are priced")
    ap.add_argument("--out", default=str(DATA / "prices.csv"))
    ap.add_argument("--sources", default=str(DATA / "prices_sources.toml"))
    ap.add_argument("--md", default=str(DATA / "prices.md"))
    ap.add_argument("--md-only", action="store_true", help="only render --md from --out and --sources")
    a = ap.parse_args(argv)
    try:
        if a.md_only:
            md = render_markdown(read_csv_rows(_read(a.out, "prices.csv")), load_sources_toml(_read(a.sources, "sources")))
            Path(a.md).write_text(md, encoding="utf-8")
            print(f"{a.md} rendered")
            return 0
        if not a.on_demand or not a.spot:
            raise UserError("--on-demand and --spot are required (or --md-only)")
        types, retired = catalog_types(a.catalog)
        od = parse_on_demand_js(_read(a.on_demand, "on-demand file"), a.on_demand)
        as_of = a.on_demand_as_of or od.last_updated
        if not as_of:
            raise UserError(f"{a.on_demand} has no '// Last updated:' header; pass --on-demand-as-of")
        quotes = read_spot_quotes(_read(a.spot, "spot file"), a.spot)
        missing = unlisted_regions(od, quotes, types)
        if missing:
            raise UserError(f"the sources price catalog types in {', '.join(missing)}, which "
                            "dl_selector.price_sources.REGIONS lacks; add them there (or they would be dropped)")
        spot = spot_stats(quotes, types, on_demand=od.prices)
        comparison: tuple[tuple[str, str], ...] = ()
        if a.spot_previous and a.comparison_from:
            raise UserError("--spot-previous computes a comparison, --comparison-from keeps an earlier one: pass one")
        if a.comparison_from:
            comparison = load_sources_toml(_read(a.comparison_from, "sources")).comparison
            if not comparison:
                raise UserError(f"{a.comparison_from} has no [comparison] to keep")
            if a.spot_previous_ref:
                comparison = tuple((k, a.spot_previous_ref if k == "older snapshot" else v) for k, v in comparison)
        if a.spot_previous:
            old = spot_stats(read_spot_quotes(_read(a.spot_previous, "spot file"), a.spot_previous), types,
                             on_demand=od.prices)
            comparison = (("older snapshot", a.spot_previous_ref or a.spot_previous),) + compare_snapshots(
                spot, old, [f.strip() for f in a.spot_previous_families.split(",") if f.strip()] or None)
        od_ref, spot_ref = a.on_demand_ref or a.on_demand, a.spot_ref or a.spot
        rows, orphans = build_rows(od, spot, types, retired, od_ref, spot_ref, as_of, a.spot_as_of)
        sources = Sources(
            on_demand_ref=od_ref, on_demand_as_of=as_of, spot_ref=spot_ref, spot_as_of=a.spot_as_of,
            spot_date_note=a.spot_date_note, on_demand_note=a.on_demand_note, types=tuple(types), retired=tuple(retired),
            on_demand_entries=od.entries, spot_rows=spot.rows, spot_no_quote=spot.no_quote,
            spot_at_on_demand=sum(st.at_on_demand for k, st in spot.stats.items() if k in od.prices),
            zones_excluded=tuple(sorted(spot.zones_excluded.items())), rejected=tuple(spot.rejected),
            spot_without_on_demand=tuple(orphans), comparison=comparison,
        )
        csv_text, toml_text = render_csv(rows), render_sources_toml(sources)
        md = render_markdown(read_csv_rows(csv_text), load_sources_toml(toml_text))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path, text in ((a.out, csv_text), (a.sources, toml_text), (a.md, md)):
        Path(path).write_text(text, encoding="utf-8")
    print(f"{len(rows)} rows, {sum(1 for r in rows if r['spot_usd_per_hour'])} with spot, "
          f"{len(spot.rejected)} quotes rejected -> {a.out}, {a.sources}, {a.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
