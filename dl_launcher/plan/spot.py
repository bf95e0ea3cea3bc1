"""Spot lines: EC2 Spot placement scores for N instances of one type in one AZ (the cluster's
placement group is in one AZ), with the catalog's spot price.

GetSpotPlacementScores scores a request, not a type: given several types it scores a fleet that may
mix them, so each type is asked alone (a cluster is one type). One call covers every region asked;
scores name AZs by id (use1-az4), which DescribeAvailabilityZones maps to this account's names.
"""
from __future__ import annotations

from typing import Any, Callable

from dl_core.aws import brief
from dl_core.markets import SPOT

from .lines import NOW, NOW_GROUP, UNKNOWN, Line
from .request import Request, catalog_line

# AWS's scale: 10 is "highly likely, not guaranteed" to succeed, 1 "not at all likely"
# (EC2 User Guide, "Spot placement score"). A cluster needs all N at once, so only the top band
# counts as a start now; below it the start is not known.
LIKELY_SCORE = 7


def lines(req: Request, ranked: dict[str, list], ec2: Callable[[str], Any]) -> tuple[list[Line], list[dict]]:
    """(lines, degraded columns) for the spot candidates `ranked` names per region."""
    from botocore.exceptions import BotoCoreError, ClientError

    out: list[Line] = []
    degraded: list[dict] = []
    regions_of: dict[str, list[str]] = {}
    by_key = {}
    for region, cands in ranked.items():
        for c in cands:
            regions_of.setdefault(c.instance_type, []).append(region)
            by_key[(c.instance_type, region)] = c
    first = req.regions[0]
    names: dict[str, dict[str, str]] = {}
    for itype, regions in regions_of.items():
        try:
            scores = _scores(ec2(first), itype, req.nodes, regions)
        except (BotoCoreError, ClientError) as e:
            why = f"placement score not read ({brief(e)})"
            degraded += [{"market": SPOT, "region": r, "instance_type": itype, "reason": why} for r in regions]
            out += [catalog_line(req, SPOT, r, by_key[(itype, r)], why) for r in regions]
            continue
        for region in regions:
            here = [s for s in scores if s.get("Region") == region]
            line = catalog_line(req, SPOT, region, by_key[(itype, region)], "")
            line.source = "account"
            if not here:
                line.start_note = f"EC2 gave no placement score for {req.nodes} x {itype} here"
                out.append(line)
                continue
            if region not in names:
                names[region] = _zone_names(ec2(region))
            best = max(here, key=lambda s: s.get("Score", 0))
            zone_id = best.get("AvailabilityZoneId", "")
            line.availability_zone = names[region].get(zone_id, zone_id) or None
            line.placement_score = int(best.get("Score", 0))
            where = f"{line.availability_zone} ({zone_id})" if zone_id and line.availability_zone != zone_id else zone_id
            others = sorted((s.get("Score", 0) for s in here if s is not best), reverse=True)
            detail = f"placement score {line.placement_score}/10 for {req.nodes} in {where or region}" + (
                f"; other AZs {', '.join(map(str, others))}" if others else "")
            if line.placement_score >= LIKELY_SCORE:
                line.earliest_start, line.group, line.start_note = NOW, NOW_GROUP, f"likely: {detail}"
            else:
                line.group, line.start_note = UNKNOWN, f"unlikely now: {detail}"
            line.notes.append("spot: EC2 may take nodes back with 2 minutes' notice; the controller replaces them "
                              "and the job resumes from its newest checkpoint")
            out.append(line)
    return out, degraded


def _scores(client: Any, itype: str, nodes: int, regions: list[str]) -> list[dict]:
    pages = client.get_paginator("get_spot_placement_scores").paginate(
        InstanceTypes=[itype], TargetCapacity=nodes, TargetCapacityUnitType="units", SingleAvailabilityZone=True,
        RegionNames=regions)
    return [s for page in pages for s in page.get("SpotPlacementScores", [])]


def _zone_names(client: Any) -> dict[str, str]:
    """{zone id: zone name} in the client's region; {} when it cannot be read (the id is shown)."""
    from botocore.exceptions import BotoCoreError, ClientError
    try:
        zones = client.describe_availability_zones()["AvailabilityZones"]
    except (BotoCoreError, ClientError):
        return {}
    return {z["ZoneId"]: z["ZoneName"] for z in zones if "ZoneId" in z and "ZoneName" in z}
