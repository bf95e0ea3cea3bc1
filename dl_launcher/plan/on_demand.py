"""On-demand lines: the catalog's price and the account's vCPU quota headroom for N nodes.

The quota is the one preflight checks (preflight.quota_for: "Running On-Demand P instances" and its
kin count vCPUs of running instances of a family class); what is left of it is the quota less the
vCPUs of this account's pending and running on-demand instances of that class in the region.
Headroom is not capacity: EC2 may still have too few of a scarce type (InsufficientInstanceCapacity),
which no API says in advance."""
from __future__ import annotations

from typing import Any, Callable

from dl_core.aws import brief
from dl_core.markets import ON_DEMAND

from ..preflight import QUOTA_CONSOLE, family_class, quota_for
from .lines import NOW, NOW_GROUP, UNKNOWN, Line
from .request import Request, catalog_line


def lines(req: Request, ranked: dict[str, list], clients: Callable[[str, str], Any]) -> tuple[list[Line], list[dict]]:
    from botocore.exceptions import BotoCoreError, ClientError

    out: list[Line] = []
    degraded: list[dict] = []
    for region, cands in ranked.items():
        if not cands:
            continue
        try:
            used = _used_vcpus(clients("ec2", region))
        except (BotoCoreError, ClientError) as e:
            used = None
            usage_error = f"running instances not read ({brief(e)})"
        quotas: dict[str, Any] = {}
        for c in cands:
            code, name = quota_for(c.instance_type, ON_DEMAND)
            if code not in quotas:
                try:
                    quotas[code] = clients("service-quotas", region).get_service_quota(
                        ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
                except (BotoCoreError, ClientError) as e:
                    quotas[code] = e
            value = quotas[code]
            if isinstance(value, Exception) or used is None:
                why = usage_error if used is None else f"quota '{name}' ({code}) not read ({brief(value)})"
                degraded.append({"market": ON_DEMAND, "region": region, "instance_type": c.instance_type,
                                 "reason": why})
                out.append(catalog_line(req, ON_DEMAND, region, c, why))
                continue
            out.append(_line(req, region, c, code, name, float(value), used.get(family_class(c.instance_type), 0)))
    return out, degraded


def _line(req: Request, region: str, c, code: str, name: str, value: float, used: int) -> Line:
    need = req.nodes * c.facts.vcpus
    headroom = value - used
    line = catalog_line(req, ON_DEMAND, region, c, "")
    line.source = "account"
    line.quota = {"code": code, "name": name, "value": value, "used": used, "headroom": headroom, "needed": need}
    said = f"'{name}' ({code}): {value:g} vCPUs, {used} in use, {headroom:g} free; {req.nodes} x {c.instance_type} need {need}"
    if headroom >= need:
        line.earliest_start, line.group, line.start_note = NOW, NOW_GROUP, f"quota allows it: {said}"
        line.notes.append("quota is not capacity: EC2 may still lack this many of a scarce type at this moment")
    else:
        line.group, line.start_note = UNKNOWN, f"after a quota increase: {said}"
        line.before = (f"aws service-quotas request-service-quota-increase --region {region} --service-code ec2 "
                       f"--quota-code {code} --desired-value {need + used}")
        line.notes.append(f"increases take hours to days: {QUOTA_CONSOLE.format(code=code)}")
    return line


def _used_vcpus(ec2: Any) -> dict[str, int]:
    """{family class: vCPUs} of the region's pending and running on-demand instances: each one's
    CpuOptions where EC2 gives them, else its type's vCPUs in the catalog."""
    from dl_selector.catalog import load_catalog

    types = load_catalog().types
    used: dict[str, int] = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for reservation in page.get("Reservations", []):
            for i in reservation.get("Instances", []):
                if i.get("InstanceLifecycle") == "spot":  # spot has quotas of its own
                    continue
                cpu, itype = i.get("CpuOptions") or {}, i.get("InstanceType", "")
                vcpus = int(cpu.get("CoreCount", 0)) * int(cpu.get("ThreadsPerCore", 1))
                if not vcpus and itype in types:
                    vcpus = types[itype].vcpus
                cls = family_class(itype)
                used[cls] = used.get(cls, 0) + vcpus
    return used
