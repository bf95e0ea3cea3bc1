"""The platform team's portfolio, read from the profiles file the selector already reads.

    [portfolio]
    provider = "ML platform team"                 # shown to end users [dl-launcher]
    description = "GPU capacity, approved setups"
    profiles = ["dev-prototyping", "multi-node-training"]   # which profiles become products [all]
    share_with_accounts = ["111122223333"]        # accounts that may import the portfolio
    share_with_organization_units = ["ou-ab12-34cd56ef"]  # OUs or the organization (o-...): CloudFormation
                                                  # cannot share with them; the stack outputs the command
    principals = ["arn:aws:iam::123456789012:role/ml-engineers"]  # who may launch (roles, groups, users)
    budget_emails = ["platform@example.com"]      # told at 80% actual, 100% actual and forecast
    [portfolio.tag_options]                        # mandatory cost tags: the user picks one value each
    team = ["ml-research", "ml-platform"]
    project = ["llm", "vision"]
    cost-centre = ["cc-1001", "cc-1002"]

    [products.multi-node-training]               # limits of one profile's product
    instance_types = ["p5.48xlarge", "p4d.24xlarge"]   # narrow the selector's candidates [its top 8]
    max_nodes = 4                                 # [the profile's nodes]
    max_cluster_usd_per_hour = 250                # every node of the chosen type, in its market [no cap]
    spot_only = true                              # [false]
    monthly_budget_usd = 20000                    # [100 hours of the dearest allowed cluster]
    idle_guard = true                             # stop a launch whose GPUs all idle [true]
    idle_minutes = 30                             # for this long [30]
    idle_action = "stop"                          # stop (checkpoints pushed, resumable) or notify [stop]
    budget_action = "stop"                        # notify: tell the budget topic and budget_emails;
                                                  # stop: also, at 100% actual, stop the product's
                                                  # clusters (resumable; checkpoints kept) [notify]

Every bad value is one UserError line naming the file, the key and what is allowed.
"""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Optional

from dl_selector.errors import UserError, closest
from dl_selector.profiles import Profile, load_profiles
from dl_selector.validate import clean, read_text

from .observability_settings import ACTIONS as IDLE_ACTIONS
from .observability_settings import IDLE_MINUTES

TAG_KEYS = ("team", "project", "cost-centre")  # mandatory: the cost allocation tags
DEFAULT_TAG_VALUE = "unassigned"  # the built-in portfolio's only value; set yours in the file
MAX_TYPES = 8  # launch templates per product: each type is one, and the template must stay small
MAX_NODES = 64  # as the training stack's nodes
BUDGET_ACTIONS = ("notify", "stop")
DEFAULT_BUDGET_HOURS = 100
_ACCOUNT = re.compile(r"\d{12}", re.ASCII)
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_TAG_VALUE = re.compile(r"[\w .:/=+@-]{1,256}")  # Service Catalog TagOption values
_PORTFOLIO_KEYS = ("provider", "description", "profiles", "share_with_accounts", "share_with_organization_units",
                   "principals", "budget_emails", "tag_options")
_ORG_NODE = re.compile(r"ou-[0-9a-z]{4,32}-[a-z0-9]{8,32}|o-[a-z0-9]{10,32}")
_PRINCIPAL = re.compile(r"arn:aws(?:-cn|-us-gov)?:iam::\d{12}:(?:role|group|user)/[\w+=,.@/-]{1,512}", re.ASCII)
_PRODUCT_KEYS = ("instance_types", "max_nodes", "max_cluster_usd_per_hour", "spot_only", "monthly_budget_usd",
                 "budget_action", "idle_guard", "idle_minutes", "idle_action")
_TOP_KEYS = ("profiles", "portfolio", "products")


@dataclass(frozen=True)
class ProductLimits:
    """Governance of one profile's product. None: the default (see the module docstring)."""

    instance_types: Optional[tuple[str, ...]] = None
    max_nodes: Optional[int] = None
    max_cluster_usd_per_hour: Optional[float] = None
    spot_only: bool = False
    monthly_budget_usd: Optional[float] = None
    budget_action: str = "notify"
    idle_guard: bool = True
    idle_minutes: int = 30
    idle_action: str = "stop"


@dataclass(frozen=True)
class PortfolioSettings:
    name: str
    region: str
    profiles: tuple[Profile, ...]
    limits: dict[str, ProductLimits]
    provider: str = "dl-launcher"
    description: str = ""
    share_with_accounts: tuple[str, ...] = ()
    share_with_organization_units: tuple[str, ...] = ()
    principals: tuple[str, ...] = ()
    budget_emails: tuple[str, ...] = ()
    tag_options: tuple[tuple[str, tuple[str, ...]], ...] = tuple((k, (DEFAULT_TAG_VALUE,)) for k in TAG_KEYS)
    source: str = "built-in"
    snapshots: str = "product-stack-snapshots"  # ProductStackHistory's directory (committed)
    local: bool = False
    vpc_id: Optional[str] = None
    subnet_ids: tuple[str, ...] = ()
    availability_zone: Optional[str] = None

    def limits_for(self, profile: str) -> ProductLimits:
        return self.limits.get(profile, ProductLimits())


def _where(path: str, key: str) -> str:
    return f"{clean(path)}: {key}"


def _unknown_key(path: str, table: str, key: Any, allowed: tuple[str, ...]) -> UserError:
    near = closest(str(key), allowed, n=1)
    return UserError(f"{clean(path)}: unknown key {clean(str(key))!r} in [{table}]"
                     + (f"; closest: {near[0]}" if near else "") + f"; allowed: {', '.join(allowed)}")


def _strings(path: str, key: str, value: Any, pattern: Optional[re.Pattern] = None, what: str = "") -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{_where(path, key)} must be a list of strings, got {clean(repr(value))[:80]}")
    for v in value:
        if pattern is not None and not pattern.fullmatch(v):
            raise UserError(f"{_where(path, key)} has {clean(repr(v))[:80]}: expected {what}")
    if len(set(value)) != len(value):
        dup = next(v for v in value if value.count(v) > 1)
        raise UserError(f"{_where(path, key)} names {clean(repr(dup))} twice")
    return tuple(value)


def _number(path: str, key: str, value: Any, lo: float, hi: float, *, integer: bool) -> float:
    kind = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{_where(path, key)} must be {kind} from {lo:g} to {hi:g}, got {clean(repr(value))[:80]}")
    if integer and value != int(value):
        raise UserError(f"{_where(path, key)} must be {kind} from {lo:g} to {hi:g}, got {value}; "
                        f"closest: {min(max(round(value), int(lo)), int(hi))}")
    if not lo <= value <= hi:
        raise UserError(f"{_where(path, key)} = {value:g}: allowed {lo:g} to {hi:g}; closest: {min(max(value, lo), hi):g}")
    return int(value) if integer else float(value)


def _table(path: str, data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"{clean(path)}: [{key}] must be a table, got {clean(repr(value))[:80]}")
    return value


def _read(path: str) -> dict:
    if not path.endswith(".toml"):
        raise UserError(f"{clean(path)}: a portfolio is read from a TOML profiles file (.toml)")
    try:
        data = tomllib.loads(read_text(path, "profile"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{clean(path)}: not valid TOML ({clean(str(e))})") from None
    for key in data:
        if key not in _TOP_KEYS:
            raise _unknown_key(path, "the file's top level", key, _TOP_KEYS)
    return data


def _limits(path: str, name: str, raw: Any) -> ProductLimits:
    table = f"products.{name}"
    if not isinstance(raw, dict):
        raise UserError(f"{clean(path)}: [{table}] must be a table of limits")
    for key in raw:
        if key not in _PRODUCT_KEYS:
            raise _unknown_key(path, table, key, _PRODUCT_KEYS)
    kw: dict[str, Any] = {}
    if "instance_types" in raw:
        kw["instance_types"] = _strings(path, f"{table}.instance_types", raw["instance_types"])
        if not kw["instance_types"]:
            raise UserError(f"{_where(path, table + '.instance_types')} is empty: name at least one type, or leave "
                            "the key out for the selector's candidates")
    if "max_nodes" in raw:
        kw["max_nodes"] = _number(path, f"{table}.max_nodes", raw["max_nodes"], 1, MAX_NODES, integer=True)
    if "max_cluster_usd_per_hour" in raw:
        v = _number(path, f"{table}.max_cluster_usd_per_hour", raw["max_cluster_usd_per_hour"], 0.01, 100_000,
                    integer=False)
        kw["max_cluster_usd_per_hour"] = v
    for key in ("spot_only", "idle_guard"):
        if key in raw:
            if not isinstance(raw[key], bool):
                raise UserError(f"{_where(path, table + '.' + key)} must be true or false, got "
                                f"{clean(repr(raw[key]))[:40]}")
            kw[key] = raw[key]
    if "idle_minutes" in raw:
        kw["idle_minutes"] = _number(path, f"{table}.idle_minutes", raw["idle_minutes"], *IDLE_MINUTES, integer=True)
    if "idle_action" in raw:
        if raw["idle_action"] not in IDLE_ACTIONS:
            raise UserError(f"{_where(path, table + '.idle_action')} = {clean(repr(raw['idle_action']))[:40]}: allowed "
                            f"{', '.join(IDLE_ACTIONS)}")
        kw["idle_action"] = raw["idle_action"]
    if "monthly_budget_usd" in raw:
        kw["monthly_budget_usd"] = _number(path, f"{table}.monthly_budget_usd", raw["monthly_budget_usd"], 1,
                                           10_000_000, integer=False)
    if "budget_action" in raw:
        v = raw["budget_action"]
        if v not in BUDGET_ACTIONS:
            near = closest(str(v), BUDGET_ACTIONS, n=1)
            raise UserError(f"{_where(path, table + '.budget_action')} = {clean(repr(v))[:40]}: allowed "
                            f"{', '.join(BUDGET_ACTIONS)}" + (f"; closest: {near[0]}" if near else ""))
        kw["budget_action"] = v
    return ProductLimits(**kw)


def portfolio_from_file(name: str, region: str, path: Optional[str], **network: Any) -> PortfolioSettings:
    """The portfolio `name` of the profiles file at `path` (None: the built-in profiles, every one
    a product with default limits and placeholder tag values)."""
    profiles = load_profiles(path) if path is not None else load_profiles()
    if path is None:
        return PortfolioSettings(name=name, region=region, profiles=tuple(profiles.values()), limits={}, **network)
    data = _read(path)
    portfolio = _table(path, data, "portfolio")
    for key in portfolio:
        if key not in _PORTFOLIO_KEYS:
            raise _unknown_key(path, "portfolio", key, _PORTFOLIO_KEYS)
    chosen = list(profiles)
    if "profiles" in portfolio:
        chosen = list(_strings(path, "portfolio.profiles", portfolio["profiles"]))
        for p in chosen:
            if p not in profiles:
                near = closest(p, profiles, n=1)
                raise UserError(f"{_where(path, 'portfolio.profiles')} names {clean(repr(p))}, which is not a profile"
                                + (f"; closest: {near[0]}" if near else "") + f"; allowed: {', '.join(profiles)}")
        if not chosen:
            raise UserError(f"{_where(path, 'portfolio.profiles')} is empty: a portfolio needs a product")
    products = _table(path, data, "products")
    limits = {}
    for pname, raw in products.items():
        if pname not in chosen:
            near = closest(str(pname), chosen, n=1)
            raise UserError(f"{clean(path)}: [products.{clean(str(pname))}] is not a profile of the portfolio"
                            + (f"; closest: {near[0]}" if near else "") + f"; allowed: {', '.join(chosen)}")
        limits[pname] = _limits(path, pname, raw)
    kw: dict[str, Any] = {}
    for key in ("provider", "description"):
        if key in portfolio:
            v = portfolio[key]
            if not isinstance(v, str) or not v.strip() or len(v) > (50 if key == "provider" else 2000):
                raise UserError(f"{_where(path, 'portfolio.' + key)} must be a non-empty string of at most "
                                f"{50 if key == 'provider' else 2000} characters")
            kw[key] = v.strip()
    if "share_with_accounts" in portfolio:
        kw["share_with_accounts"] = _strings(path, "portfolio.share_with_accounts", portfolio["share_with_accounts"],
                                             _ACCOUNT, "a 12-digit AWS account id")
    if "share_with_organization_units" in portfolio:
        kw["share_with_organization_units"] = _strings(
            path, "portfolio.share_with_organization_units", portfolio["share_with_organization_units"], _ORG_NODE,
            "an organizational unit id (ou-ab12-34cd56ef) or the organization's id (o-a1b2c3d4e5)")
    if "principals" in portfolio:
        kw["principals"] = _strings(path, "portfolio.principals", portfolio["principals"], _PRINCIPAL,
                                    "an IAM role, group or user ARN, e.g. arn:aws:iam::123456789012:role/ml-engineers")
    if "budget_emails" in portfolio:
        kw["budget_emails"] = _strings(path, "portfolio.budget_emails", portfolio["budget_emails"], _EMAIL,
                                       "an e-mail address")
        if len(kw["budget_emails"]) > 10:
            raise UserError(f"{_where(path, 'portfolio.budget_emails')}: at most 10 (AWS Budgets' subscribers per "
                            "notification)")
    tags = dict(_table(path, portfolio, "tag_options"))
    for key in tags:
        if key not in TAG_KEYS:
            raise _unknown_key(path, "portfolio.tag_options", key, TAG_KEYS)
    kw["tag_options"] = tuple(
        (k, _strings(path, f"portfolio.tag_options.{k}", tags[k], _TAG_VALUE,
                     "1-256 letters, digits, spaces and _.:/=+-@") if k in tags else (DEFAULT_TAG_VALUE,))
        for k in TAG_KEYS)
    for k, values in kw["tag_options"]:
        if not values:
            raise UserError(f"{_where(path, 'portfolio.tag_options.' + k)} is empty: give the values users pick from")
    return PortfolioSettings(name=name, region=region, profiles=tuple(profiles[p] for p in chosen), limits=limits,
                             source=path, **kw, **network)
