"""Workload profiles: declarative hard requirements plus an objective.

Built-ins live in data/profiles.toml; platform teams add or override them with their own TOML
or YAML file of the same shape (`[profiles.NAME]` tables; `extends = "NAME"` copies a built-in).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
import os
from typing import Any, Optional

from .errors import UserError, closest, unknown

from .paths import data_file
OBJECTIVES = ("max_throughput", "max_samples_per_dollar", "min_price", "max_accelerator_memory")
INTERCONNECTS = ("any", "nvlink")
SDKS = ("cuda", "neuron", "synapseai", "rocm", "qaic")
ROLES = ("training", "inference")
ARCHITECTURES = ("x86_64", "arm64")
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "fp8", "fp4")
MODEL_PRECISIONS = ("mixed", "fp32", "fp64")


@dataclass(frozen=True)
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
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{where}: {key} must be a whole number >= 0, got {value!r}")
        return value
    if "float" in kind:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"{where}: {key} must be a number >= 0, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise UserError(f"{where}: {key} must be a string, got {value!r}")
    return value


def profile_from_mapping(name: str, data: dict[str, Any], base: Optional[Profile], source: str) -> Profile:
    where = f"{source}: profile {name!r}"
    if not isinstance(data, dict):
        raise UserError(f"{where}: must be a table of settings")
    values: dict[str, Any] = {}
    for key, value in data.items():
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
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read profile file {path}: {e.strerror}") from None
    if os.path.splitext(path)[1] in (".yaml", ".yml"):
        try:
            import yaml  # optional: only platform teams that prefer YAML need it
        except ImportError:
            raise UserError(f"{path}: YAML profiles need PyYAML (pip install 'dl-launcher[yaml]'), or write TOML") from None
        try:
            data = yaml.safe_load(raw) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    else:
        try:
            data = tomllib.loads(raw.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not valid TOML ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), dict):
        raise UserError(f"{path}: expected a 'profiles' table, e.g. [profiles.my-training] with description = \"...\"")
    return data["profiles"]


_builtin: Optional[dict[str, Profile]] = None


def builtin_profiles() -> dict[str, Profile]:
    global _builtin
    if _builtin is None:
        with open(data_file("profiles.toml"), "rb") as f:
            raw = tomllib.load(f)["profiles"]
        _builtin = {n: profile_from_mapping(n, d, None, "built-in") for n, d in raw.items()}
    return _builtin


def load_profiles(extra: Optional[str] = None) -> dict[str, Profile]:
    """Built-in profiles, plus or overridden by those in `extra` (TOML or YAML)."""
    profiles = dict(builtin_profiles())
    if extra is None:
        return profiles
    path = str(extra)
    for name, data in _read_file(path).items():
        base_name = data.get("extends") if isinstance(data, dict) else None
        if base_name is not None and base_name not in profiles:
            raise unknown(f"profile to extend in {path}:", str(base_name), profiles)
        base = profiles.get(base_name) if base_name else profiles.get(name)
        profiles[name] = profile_from_mapping(name, data, base, str(path))
    return profiles


def get_profile(name: str, profiles: Optional[dict[str, Profile]] = None) -> Profile:
    profiles = profiles if profiles is not None else builtin_profiles()
    try:
        return profiles[name]
    except KeyError:
        raise unknown("profile", name, profiles) from None
