"""`dl-launcher preflight`: what would stop a deploy from ever training, checked before money is
spent. A CloudFormation deploy completes whether or not the account may run the type; the
controller then waits. New accounts have 0 vCPUs of P instances, and increases take days.

Each check is a small function (ParallelCluster's validators are the model): it returns one
Result with a level (ok, warn, fail), what it found, and the fix. Checks after a failed
credentials check are skipped: they would all fail for the same reason.
"""
from __future__ import annotations

import shutil
from typing import Any, Callable, NamedTuple, Optional

from dl_core.aws import brief, error_code
from dl_selector.facts import InstanceFacts

BOOTSTRAP_PARAMETER = "/cdk-bootstrap/hnb659fds/version"  # the CDK's default qualifier
QUOTA_CONSOLE = "https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{code}"

# Service Quotas codes of EC2's vCPU quotas, per instance family class and market (the EC2 user
# guide's "On-Demand Instance quotas" and "Spot Instance quotas" tables).
QUOTAS = {
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("Trn", "on-demand"): ("L-2C3B7624", "Running On-Demand Trn instances"),
    ("Trn", "spot"): ("L-6B0D517C", "All Trn Spot Instance Requests"),
    ("Inf", "on-demand"): ("L-1945791B", "Running On-Demand Inf instances"),
    ("Inf", "spot"): ("L-B5D1601B", "All Inf Spot Instance Requests"),
    ("DL", "on-demand"): ("L-6E869C2A", "Running On-Demand DL instances"),
    ("DL", "spot"): ("L-85EED4F7", "All DL Spot Instance Requests"),
    ("F", "on-demand"): ("L-74FC7D96", "Running On-Demand F instances"),
    ("F", "spot"): ("L-88CF9481", "All F Spot Instance Requests"),
    ("Standard", "on-demand"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("Standard", "spot"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}


class Result(NamedTuple):
    level: str  # "ok" | "warn" | "fail"
    check: str
    found: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.level:<4} {self.check}: {self.found}" + (f"; fix: {self.fix}" if self.fix else "")


class Plan(NamedTuple):
    """What is checked: the pick (or the pinned type), how many, where, in which market."""
    facts: InstanceFacts
    nodes: int
    market: str
    region: str
    region_source: str
    availability_zone: Optional[str] = None


def family_class(instance_type: str) -> str:
    family = instance_type.split(".")[0]
    for prefix, cls in (("trn", "Trn"), ("inf", "Inf"), ("dl", "DL"), ("vt", "G"), ("p", "P"), ("g", "G"), ("f", "F")):
        if family.startswith(prefix):
            return cls
    return "Standard"


def quota_for(instance_type: str, market: str) -> tuple[str, str]:
    """(quota code, quota name) that bounds `instance_type`'s vCPUs in `market`."""
    return QUOTAS[(family_class(instance_type), "spot" if market == "spot" else "on-demand")]


def _code(e: BaseException) -> str:
    return error_code(e) or type(e).__name__


def credentials(sts: Any, plan: Plan) -> tuple[Result, Optional[str]]:
    """The check, and the account (None when there are no usable credentials)."""
    try:
        me = sts.get_caller_identity()
    except Exception as e:
        return Result("fail", "credentials", f"none usable ({brief(e)})",
                      "aws configure sso (or set AWS_PROFILE), then run preflight again"), None
    return Result("ok", "credentials", f"account {me['Account']} as {me['Arn']}"), me["Account"]


def region(plan: Plan) -> Result:
    priced = plan.facts.price(plan.region)
    found = f"{plan.region} (from {plan.region_source})"
    if priced is None or (priced.on_demand is None and priced.spot is None):
        return Result("warn", "region", f"{found}: no price on record for {plan.facts.instance_type} there",
                      "pass -c max_price=USD/h to deploy, or -c region=NAME for a priced region")
    return Result("ok", "region", found)


def bootstrap(ssm: Any, plan: Plan, account: str) -> Result:
    try:
        version = ssm.get_parameter(Name=BOOTSTRAP_PARAMETER)["Parameter"]["Value"]
    except Exception as e:
        if _code(e) != "ParameterNotFound":
            return Result("warn", "cdk bootstrap", f"could not read {BOOTSTRAP_PARAMETER} ({_code(e)})",
                          "the deployer needs ssm:GetParameter on it to deploy")
        return Result("fail", "cdk bootstrap", f"{plan.region} is not bootstrapped for the CDK (no {BOOTSTRAP_PARAMETER})",
                      f"cdk bootstrap aws://{account}/{plan.region}")
    return Result("ok", "cdk bootstrap", f"bootstrap version {version}")


def ami(ssm: Any, plan: Plan) -> Result:
    from constructs_lib.ami import dlami_parameter
    try:
        name = dlami_parameter(sdk=plan.facts.sdk, architecture=plan.facts.architecture)
    except Exception as e:  # noqa: BLE001 - ConfigurationError: no public DLAMI for this SDK
        return Result("warn", "Deep Learning AMI", str(e), "pass your own AMI to the construct (ami_id)")
    try:
        image = ssm.get_parameter(Name=name)["Parameter"]["Value"]
    except Exception as e:
        return Result("fail", "Deep Learning AMI", f"{name} does not resolve in {plan.region} ({_code(e)})",
                      "choose a region where AWS publishes the Deep Learning AMI (-c region=NAME)")
    return Result("ok", "Deep Learning AMI", f"{image} ({name})")


def offered(ec2: Any, plan: Plan) -> Result:
    t = plan.facts.instance_type
    zones: list[str] = []
    for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [t]}]):
        zones += [o["Location"] for o in page["InstanceTypeOfferings"]]
    zones.sort()
    if not zones:
        return Result("fail", "offered", f"{t} is not sold in any AZ of {plan.region}",
                      f"-c region=NAME where it is (the catalog lists: {', '.join(plan.facts.regions) or 'none'}), "
                      "or another -c instance_type")
    if plan.availability_zone and plan.availability_zone not in zones:
        return Result("fail", "offered", f"{t} is not sold in {plan.availability_zone}; it is in {', '.join(zones)}",
                      f"-c availability_zone={zones[0]}")
    return Result("ok", "offered", f"{t} in {', '.join(zones)}")


def quota(quotas: Any, plan: Plan) -> Result:
    t, vcpus = plan.facts.instance_type, plan.facts.vcpus
    code, name = quota_for(t, plan.market)
    need = plan.nodes * vcpus
    try:
        value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except Exception as e:
        return Result("warn", "vCPU quota", f"could not read '{name}' ({code}): {_code(e)}",
                      f"check it in the console: {QUOTA_CONSOLE.format(code=code)}")
    if value < need:
        return Result("fail", "vCPU quota",
                      f"'{name}' ({code}) is {value:g} vCPUs; {plan.nodes} x {t} need {plan.nodes} x {vcpus} = {need}",
                      f"request {need} at {QUOTA_CONSOLE.format(code=code)} (increases take hours to days)")
    return Result("ok", "vCPU quota", f"'{name}' ({code}) is {value:g} vCPUs; {plan.nodes} x {t} need {need}")


def session_manager(which: Callable[[str], Optional[str]] = shutil.which) -> Result:
    if which("session-manager-plugin") is None:
        return Result("warn", "Session Manager plugin", "session-manager-plugin is not on PATH (`dl-launcher shell` "
                      "needs it; nodes have no SSH)", "install it: https://docs.aws.amazon.com/systems-manager/"
                      "latest/userguide/session-manager-working-with-install-plugin.html")
    return Result("ok", "Session Manager plugin", "installed")


def run(plan: Plan, clients: Callable[[str], Any], which: Callable[[str], Optional[str]] = shutil.which) -> list[Result]:
    """Every check, in the order a new user meets the problems."""
    checked, account = credentials(clients("sts"), plan)
    results = [checked, region(plan)]
    if account is None:
        return results + [session_manager(which)]
    ssm = clients("ssm")
    results += [bootstrap(ssm, plan, account), ami(ssm, plan), offered(clients("ec2"), plan),
                quota(clients("service-quotas"), plan), session_manager(which)]
    return results
