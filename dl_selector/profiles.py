"""Workload profiles: declarative hard requirements plus an objective.

Built-ins live in data/profiles.toml; platform teams add or override them with their own TOML
or YAML file of the same shape (`[profiles.NAME]` tables; `extends = "NAME"` copies a built-in).
"""
from __future__ import annotations

import json
import os
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Optional

from .errors import UserError, closest, unknown
from .paths import data_file
from .record import fields, record, replace
from .validate import clean, finite_number, range_text, read_text

OBJECTIVES = ("max_throughput", "max_samples_per_dollar", "min_price", "max_accelerator_memory", "min_latency")
# min_latency ranks on the modelled per-token decode time of a --model-size model (latency.py).
INTERCONNECTS = ("any", "nvlink")
SDKS = ("cuda", "neuron", "synapseai", "rocm", "qaic")
ROLES = ("training", "inference")
ARCHITECTURES = ("x86_64", "arm64")
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8", "fp4")
MODEL_PRECISIONS = ("mixed", "fp32", "fp64")


@record(frozen=True)
class Profile:
    """One workload. Every field but name/description has a default that requires nothing."""

    name: str
    description: str
    objective: str = "max_samples_per_dollar"
    min_accelerators: int = 1
    max_accelerators: Optional[int] = None
    whole_accelerators: bool = False
    min_accelerator_memory_gib: float = 0.0
    # Per-accelerator speed floor, V100 = 1.0 (the accelerator table's relative throughput).
    min_relative_throughput: float = 0.0
    interconnect: str = "any"
    multi_node: bool = False
    nodes: int = 1
    sdks: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    any_precision: tuple[str, ...] = ()
    tensor_cores: bool = False
    architectures: tuple[str, ...] = ()
    independent_runs: bool = False
    precision: str = "mixed"
    workload: str = "training"
    # Samples per second one V100 sustains on the profile's reference workload. It scales the
    # modelled samples/s and samples/$ but never changes the ranking; measure to replace it.
    reference_samples_per_second: float = 1000.0
    # Root EBS volume for nodes launched for this profile (the DLAMI alone takes ~100 GiB).
    root_volume_gib: int = 300
    guide_pick: Optional[str] = None
    guide_note: str = ""
    source: str = "built-in"


_FIELDS = {f.name: f for f in fields(Profile)}
_TUPLE_FIELDS = {"sdks", "roles", "precisions", "any_precision", "architectures"}
_CHOICES = {
    "objective": OBJECTIVES, "interconnect": INTERCONNECTS, "precision": MODEL_PRECISIONS,
    "workload": ("training", "inference", "development"), "sdks": SDKS, "roles": ROLES, "precisions": PRECISIONS,
    "any_precision": PRECISIONS, "architectures": ARCHITECTURES,
}


# Sanity bounds, not physics: they refuse NaN, infinities and typos (1e9 GiB) that would
# otherwise filter out everything silently or put non-finite numbers into --json.
_MAX_COUNT = 1_000_000
_MAX_AMOUNT = 1e9
_BOUNDS: dict[str, tuple[float, float]] = {
    "min_accelerators": (0, 1024), "max_accelerators": (1, 1024), "nodes": (1, 10_000),
    "root_volume_gib": (8, 65_536),  # EBS: a root volume of at least the AMI's size, at most 64 TiB
    "min_accelerator_memory_gib": (0, 1_000_000), "min_relative_throughput": (0, 1_000_000),
    "reference_samples_per_second": (0, 1e12),
}
# A zero here would make every modelled samples/s zero and the ranking meaningless.
_ABOVE_ZERO = {"reference_samples_per_second"}


def _check_value(where: str, key: str, value: Any) -> Any:
    kind = _FIELDS[key].type
    if key in _TUPLE_FIELDS:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{where}: {key} must be a list of strings")
        for v in value:
            if v not in _CHOICES[key]:
                near = closest(v, _CHOICES[key])
                raise UserError(f"{where}: {key} has {v!r}; allowed: {', '.join(_CHOICES[key])}"
                                + (f"; closest: {near[0]}" if near else ""))
        return tuple(value)
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            near = closest(str(value), _CHOICES[key])
            raise UserError(f"{where}: {key} = {value!r}; allowed: {', '.join(_CHOICES[key])}"
                            + (f"; closest: {near[0]}" if near else ""))
        return value
    if "bool" in kind:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {key} must be true or false, got {value!r}")
        return value
    if "int" in kind and "float" not in kind:
        lo, hi = _BOUNDS.get(key, (0, _MAX_COUNT))
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float):
                # finite_number refuses NaN/inf and rounds a fraction to the closest whole number.
                finite_number(value, f"{where}: {key}", lo, hi, integer=True)
            near = f"; closest: {int(value)}" if isinstance(value, float) else ""
            raise UserError(f"{where}: {key} must be a whole number ({range_text(lo, hi, False, False)}), "
                            f"got {clean(repr(value))[:80]}{near}")
        return int(finite_number(value, f"{where}: {key}", lo, hi, integer=True))
    if "float" in kind:
        lo, hi = _BOUNDS.get(key, (0, _MAX_AMOUNT))
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UserError(f"{where}: {key} must be a number ({range_text(lo, hi, lo == 0 and key in _ABOVE_ZERO, False)}), "
                            f"got {clean(repr(value))[:80]}")
        return finite_number(value, f"{where}: {key}", lo, hi, above=key in _ABOVE_ZERO)
    if not isinstance(value, str):
        raise UserError(f"{where}: {key} must be a string, got {value!r}")
    return value


def profile_from_mapping(name: str, data: dict[str, Any], base: Optional[Profile], source: str) -> Profile:
    where = f"{source}: profile {name!r}"
    if not isinstance(data, dict):
        raise UserError(f"{where}: must be a table of settings")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):  # YAML allows `1: x`; settings are names
            raise UserError(f"{where}: setting names must be strings, got {clean(repr(key))[:40]}")
        if key == "extends":
            continue
        if key not in _FIELDS or key in ("name", "source"):
            allowed = sorted(k for k in _FIELDS if k not in ("name", "source"))
            near = closest(key, allowed)
            raise UserError(f"{where}: unknown setting {key!r}" + (f"; closest: {near[0]}" if near else "")
                            + f"; allowed: {', '.join(allowed)}")
        values[key] = _check_value(where, key, value)
    if base is not None:
        profile = replace(base, name=name, source=source, **values)
    else:
        if "description" not in values:
            raise UserError(f"{where}: needs a description (or 'extends' a built-in profile)")
        profile = Profile(name=name, source=source, **values)
    if profile.max_accelerators is not None and profile.max_accelerators < profile.min_accelerators:
        raise UserError(f"{where}: max_accelerators ({profile.max_accelerators}) is below min_accelerators ({profile.min_accelerators})")
    if profile.nodes < 1:
        raise UserError(f"{where}: nodes must be at least 1")
    if profile.nodes > 1 and not profile.multi_node:
        raise UserError(f"{where}: nodes = {profile.nodes} needs multi_node = true (EFA and a cluster placement group)")
    return profile


def _read_file(path: str) -> dict[str, Any]:
    shown = clean(path)
    raw = read_text(path, "profile")
    if os.path.splitext(path)[1] in (".yaml", ".yml"):
        try:
            import yaml  # optional: only platform teams that prefer YAML need it
        except ImportError:
            raise UserError(f"{shown}: YAML profiles need PyYAML (pip install 'dl-launcher[yaml]'), or write TOML") from None
        try:
            data = yaml.safe_load(raw) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{shown}: not valid YAML ({clean(str(e).splitlines()[0])})") from None
        except RecursionError:
            raise UserError(f"{shown}: YAML nested too deeply to be a profile file") from None
        except ValueError as e:  # e.g. an integer past Python's 4300-digit limit
            raise UserError(f"{shown}: not valid YAML ({clean(str(e))[:120]})") from None
    else:
        import tomllib  # only here: the built-ins are read from their JSON copy (builtin_profiles)
        try:
            data = tomllib.loads(raw)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{shown}: not valid TOML ({clean(str(e))})") from None
        except RecursionError:
            raise UserError(f"{shown}: TOML nested too deeply to be a profile file") from None
        except ValueError as e:
            raise UserError(f"{shown}: not valid TOML ({clean(str(e))[:120]})") from None
    if isinstance(data, dict) and "profiles" not in data and ("portfolio" in data or "products" in data):
        return {}  # a platform team's portfolio over the built-in profiles only
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), dict):
        raise UserError(f"{shown}: expected a 'profiles' table, e.g. [profiles.my-training] with description = \"...\"")
    return data["profiles"]


_builtin: Optional[dict[str, Profile]] = None


def builtin_profiles() -> dict[str, Profile]:
    """data/profiles.toml, read from its JSON copy (scripts/build_profiles.py writes it): parsing
    TOML imported tomllib, string and their regular expressions on every cold start."""
    global _builtin
    if _builtin is None:
        with open(data_file("profiles.json"), "rb") as f:
            raw = json.load(f)["profiles"]
        _builtin = {n: profile_from_mapping(n, d, None, "built-in") for n, d in raw.items()}
    return _builtin


def write_builtin_json() -> str:
    """Writes data/profiles.json from data/profiles.toml; returns its path."""
    import tomllib
    with open(data_file("profiles.toml"), "rb") as f:
        raw = tomllib.load(f)["profiles"]
    path = data_file("profiles.json")
    body = {"generated_from": "dl_selector/data/profiles.toml by scripts/build_profiles.py: edit the TOML",
            "profiles": raw}
    with open(path, "w") as f:
        json.dump(body, f, indent=1, sort_keys=False)
        f.write("\n")
    return path


def load_profiles(extra: Optional[str] = None) -> dict[str, Profile]:
    """Built-in profiles, plus or overridden by those in `extra` (TOML or YAML)."""
    profiles = dict(builtin_profiles())
    if extra is None:
        return profiles
    path = str(extra)
    for name, data in _read_file(path).items():
        if not isinstance(name, str) or not name.strip():  # YAML allows `1:` or `null:` keys
            raise UserError(f"{clean(path)}: profile names must be non-empty strings, got {clean(repr(name))[:40]}")
        base_name = data.get("extends") if isinstance(data, dict) else None
        if base_name is not None and not isinstance(base_name, str):
            raise UserError(f"{clean(path)}: profile {name!r}: extends must be the name of one profile (a string), "
                            f"got {clean(repr(base_name))[:80]}")
        if base_name is not None and base_name not in profiles:
            raise unknown(f"profile to extend in {clean(path)}:", base_name, profiles)
        base = profiles.get(base_name) if base_name else profiles.get(name)
        profiles[name] = profile_from_mapping(name, data, base, str(path))
    return profiles


def with_objective(profile: Profile, objective: str) -> Profile:
    """The profile ranked by `objective` instead of its own (recommend --objective); one line otherwise."""
    if objective not in OBJECTIVES:
        near = closest(objective, OBJECTIVES, n=1)
        raise UserError(f"--objective {clean(repr(objective))[:40]}: allowed: {', '.join(OBJECTIVES)}"
                        + (f"; closest: {near[0]}" if near else ""))
    return replace(profile, objective=objective)


def get_profile(name: str, profiles: Optional[dict[str, Profile]] = None) -> Profile:
    profiles = profiles if profiles is not None else builtin_profiles()
    try:
        return profiles[name]
    except KeyError:
        raise unknown("profile", name, profiles) from None
