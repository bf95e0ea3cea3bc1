"""Turns EC2 DescribeInstanceTypes records into catalog entries.

Pure functions over plain dicts, shared by `catalog refresh` (live or moto) and the tests.
Specs come only from the API record; what the API lacks (precisions, interconnect, SDK)
comes from the per-accelerator table, and EFA/ENA bandwidth from data/network.toml; prices come
from the price table or live price APIs.
"""
from __future__ import annotations

import functools
import math
import re
import tomllib
from typing import Any, Iterable, Optional

from .accelerators import AcceleratorSpec
from .errors import UserError
from .facts import MAX_NETWORK_GBPS, CapacityBlockPrice, InstanceFacts, NvmeDisks, Price

from .paths import data_file
MIB_PER_GIB = 1024

# AWS's ratings for older types, which come with no Gbps figure at all.
QUALITATIVE_NETWORK = frozenset({"very low", "low", "low to moderate", "moderate", "high"})
_GBPS = r"(\d+(?:\.\d+)?)\s*(?:gigabit|gbps)"
_NETWORK_FORMS = (
    # "3200 Gigabit", "Up to 25 Gigabit", "4x 100 Gigabit" (DescribeInstanceTypes NetworkPerformance)
    re.compile(rf"(?P<upto>up\s+to\s+)?(?:(?P<cards>\d+)\s*x\s+)?{_GBPS}"),
    # "5.0 / 25.0": the baseline / burst column of AWS's instance-type specification pages
    re.compile(r"(?P<baseline>\d+(?:\.\d+)?)\s*/\s*(?P<burst>\d+(?:\.\d+)?)"),
)


def parse_network_performance(text: str) -> tuple[Optional[float], bool]:
    """AWS's published network figure as (Gbps, burst).

    "3200 Gigabit" -> (3200, False); "Up to 25 Gigabit" -> (25, True); "4x 100 Gigabit" -> (400, False);
    "5.0 / 25.0" (baseline / burst, as the specification pages print it) -> (25, True);
    "High" and AWS's other ratings -> (None, False). Anything else raises ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"expected a string, got {text!r}")
    t = " ".join(text.split()).lower()
    if t in QUALITATIVE_NETWORK:
        return None, False
    m = _NETWORK_FORMS[0].fullmatch(t)
    if m:
        gbps = float(m.group(3)) * (int(m.group("cards")) if m.group("cards") else 1)
        burst = bool(m.group("upto"))
    elif (m := _NETWORK_FORMS[1].fullmatch(t)):
        baseline, gbps = float(m.group("baseline")), float(m.group("burst"))
        if baseline > gbps:
            raise ValueError(f"baseline {baseline:g} above burst {gbps:g} in {text!r}")
        burst = baseline < gbps
    else:
        raise ValueError(f"unrecognised network performance {text!r}")
    if not (math.isfinite(gbps) and gbps > 0):
        raise ValueError(f"network performance {text!r} is not a positive figure")
    return round(gbps, 3), burst


NETWORK_KEYS = {"network_gbps", "network_burst", "efa_gbps", "ena_gbps", "note", "source"}


def load_network(path: str = data_file("network.toml")) -> dict[str, dict[str, Any]]:
    """{instance type: entry} from data/network.toml: AWS's EFA/ENA figures where it states them
    separately, and the instance figure where DescribeInstanceTypes lacks it or has it wrong."""
    with open(path, "rb") as f:
        types = tomllib.load(f).get("types", {})
    for name, entry in types.items():
        where = f"{path}: {name}"
        unknown_keys = set(entry) - NETWORK_KEYS
        if unknown_keys:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown_keys))}; allowed: {', '.join(sorted(NETWORK_KEYS))}")
        if not str(entry.get("source", "")).strip():
            raise ValueError(f"{where} needs a source")  # every fact in the catalog is cited
        for key in ("network_gbps", "efa_gbps", "ena_gbps"):
            v = entry.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or not 0 < v <= MAX_NETWORK_GBPS):
                raise ValueError(f"{where}: {key} must be a number above 0 and at most {MAX_NETWORK_GBPS:g}, got {v!r}")
        if "network_burst" in entry and not isinstance(entry["network_burst"], bool):
            raise ValueError(f"{where}: network_burst must be true or false")
        if "network_burst" in entry and "network_gbps" not in entry:
            raise ValueError(f"{where}: network_burst only goes with network_gbps")
        if not any(k in entry for k in ("network_gbps", "efa_gbps", "ena_gbps")):
            raise ValueError(f"{where} gives no figure (network_gbps, efa_gbps or ena_gbps)")
    return types


@functools.lru_cache(maxsize=1)
def _default_network() -> dict[str, dict[str, Any]]:
    return load_network()


def network_facts(instance_type: str, published: Any, published_source: str,
                  entry: Optional[dict[str, Any]]) -> dict[str, Any]:
    """network_gbps, network_burst, efa_gbps, ena_gbps and network_source for one type.

    `published` is AWS's wording of the instance figure ("Up to 25 Gigabit"); an entry of
    data/network.toml replaces it where it gives network_gbps and adds the EFA/ENA split.
    A figure that cannot be read fails the build, naming the type and the text."""
    entry = entry or {}
    if "network_gbps" in entry:
        gbps, burst = float(entry["network_gbps"]), bool(entry.get("network_burst", False))
        source = f"dl_selector/data/network.toml: {entry['source']}"
        if published is not None:
            source += f" ({published_source} says {published!r})"
    else:
        if published is None:
            raise UserError(f"{instance_type}: no network performance figure ({published_source} has none); "
                            "add network_gbps and its source to dl_selector/data/network.toml")
        try:
            gbps, burst = parse_network_performance(published)
        except ValueError:
            raise UserError(f"{instance_type}: cannot read the network performance {str(published)!r} from {published_source}; "
                            "expected 'N Gigabit', 'Up to N Gigabit', 'Kx N Gigabit' or an AWS rating such as 'High'. "
                            "Teach dl_selector/build.py parse_network_performance the form, or give network_gbps "
                            "with a source in dl_selector/data/network.toml") from None
        source = f"{published_source}: {published!r}"
        if gbps is None:
            source += " (a rating; AWS publishes no Gbps figure)"
    efa, ena = entry.get("efa_gbps"), entry.get("ena_gbps")
    if (efa is not None or ena is not None) and "network_gbps" not in entry:
        source += f"; EFA/ENA: dl_selector/data/network.toml: {entry['source']}"
    if entry.get("note"):
        source += f" ({entry['note']})"
    return {"network_gbps": gbps, "network_burst": burst, "efa_gbps": None if efa is None else float(efa),
            "ena_gbps": None if ena is None else float(ena), "network_source": source}


def family_of(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def accelerator_of(record: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The accelerator block of a record, or None for types with no DL accelerator."""
    if "NeuronInfo" in record:
        dev = record["NeuronInfo"]["NeuronDevices"][0]
        return {
            "kind": "neuron", "vendor": "AWS", "name": dev["Name"], "count": dev["Count"],
            "fraction": 1.0, "memory_mib": dev["MemoryInfo"]["SizeInMiB"],
            "neuron_cores": dev["Count"] * dev.get("CoreInfo", {}).get("Count", 0),
        }
    if "GpuInfo" in record:
        gpu = record["GpuInfo"]["Gpus"][0]
        fraction = float(gpu.get("GpuPartitionSize", 1.0) or 1.0)
        count = gpu.get("LogicalGpuCount") or gpu["Count"]
        return {
            "kind": "gpu", "vendor": gpu["Manufacturer"], "name": gpu["Name"], "count": count,
            "fraction": fraction, "memory_mib": gpu["MemoryInfo"]["SizeInMiB"], "neuron_cores": 0,
        }
    if "InferenceAcceleratorInfo" in record:
        acc = record["InferenceAcceleratorInfo"]["Accelerators"][0]
        return {
            "kind": "inference", "vendor": acc["Manufacturer"], "name": acc["Name"],
            "count": acc["Count"], "fraction": 1.0, "memory_mib": acc["MemoryInfo"]["SizeInMiB"],
            "neuron_cores": 0,
        }
    return None  # media accelerators (vt1) and CPU-only types


def interconnect_for(spec: AcceleratorSpec, count: int) -> str:
    return "none (single accelerator)" if count <= 1 else spec.interconnect


def facts_from_record(
    record: dict[str, Any],
    accelerators: dict[str, AcceleratorSpec],
    regions: Iterable[str],
    prices: dict[str, Price],
    retired: dict[str, dict[str, Any]],
    specs_source: str,
    capacity_blocks: Optional[dict[str, dict[str, Any]]] = None,
    network: Optional[dict[str, dict[str, Any]]] = None,
) -> InstanceFacts:
    acc = accelerator_of(record)
    if acc is None:
        raise ValueError(f"{record['InstanceType']} has no deep-learning accelerator")
    spec = accelerators[acc["name"]]
    net = record["NetworkInfo"]
    network = _default_network() if network is None else network
    storage = record.get("InstanceStorageInfo")
    nvme = None
    if storage and storage.get("NvmeSupport") in ("required", "supported"):
        disk = storage["Disks"][0]
        nvme = NvmeDisks(count=disk["Count"], size_gb=disk["SizeInGB"])
    family = family_of(record["InstanceType"])
    memory_gib = spec.memory_gib_override or round(acc["memory_mib"] / MIB_PER_GIB, 2)
    life = retired.get(family, {})
    block = (capacity_blocks or {}).get(record["InstanceType"]) or {}
    return InstanceFacts(
        instance_type=record["InstanceType"],
        family=family,
        vcpus=record["VCpuInfo"]["DefaultVCpus"],
        memory_gib=round(record["MemoryInfo"]["SizeInMiB"] / MIB_PER_GIB, 2),
        architectures=tuple(record["ProcessorInfo"]["SupportedArchitectures"]),
        accelerator_vendor=acc["vendor"],
        accelerator=acc["name"],
        accelerator_kind=acc["kind"],
        accelerator_count=int(acc["count"]),
        accelerator_fraction=acc["fraction"],
        accelerator_memory_gib=memory_gib,
        sdk=spec.sdk,
        interconnect=interconnect_for(spec, int(acc["count"])),
        precisions=spec.precisions,
        tensor_cores=spec.tensor_cores,
        efa=bool(net.get("EfaSupported")),
        network_cards=int(net.get("MaximumNetworkCards", 1)),
        max_efa_interfaces=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)),
        nvme=nvme,
        regions=tuple(sorted(regions)),
        prices=prices,
        neuron_cores=acc["neuron_cores"],
        cluster_placement="cluster" in (record.get("PlacementGroupInfo") or {}).get("SupportedStrategies", []),
        spot_supported="spot" in record.get("SupportedUsageClasses", []),
        retired=bool(life),
        successors=tuple(life.get("successors", ())),
        specs_source=specs_source,
        capacity_block_only=bool(block.get("only")),
        capacity_block_source=block.get("source", ""),
        capacity_block_prices=dict(block.get("rates", {})),
        # NetworkPerformance is AWS's instance figure; the cards' PeakBandwidthInGbps do not add up to
        # it (a g6e.48xlarge has four 400 Gbps cards and 400 Gbps in all).
        **network_facts(record["InstanceType"], net.get("NetworkPerformance"),
                        "EC2 DescribeInstanceTypes NetworkInfo.NetworkPerformance", network.get(record["InstanceType"])),
    )


def load_legacy(path: str = data_file("legacy.toml")) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def load_capacity_blocks(path: str = data_file("capacity_blocks.toml")) -> dict[str, dict[str, Any]]:
    """{instance type: {"only": bool, "source": str, "rates": {region: CapacityBlockPrice}}} for the
    types AWS sells as Capacity Blocks for ML (`only`: sold no other way)."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for name, entry in data["types"].items():
        if not str(entry.get("source", "")).strip():
            raise ValueError(f"{path}: {name} needs a source")  # every fact in the catalog is cited
        rates = {}
        for region, usd in entry.get("rates", {}).items():
            if not isinstance(usd, (int, float)) or not 1 <= usd <= 10_000:
                raise ValueError(f"{path}: {name} rate in {region} must be USD per instance-hour, got {usd!r}")
            rates[region] = CapacityBlockPrice(float(usd), entry.get("rates_as_of", data["rates_as_of"]),
                                               entry.get("rates_source", data["rates_source"]))
        out[name] = {"only": bool(entry.get("only", False)), "source": entry["source"], "rates": rates}
    return out


def legacy_facts(
    legacy: dict[str, Any],
    accelerators: dict[str, AcceleratorSpec],
    prices: dict[str, dict[str, Price]],
    network: Optional[dict[str, dict[str, Any]]] = None,
) -> list[InstanceFacts]:
    """Entries for retired types that the API no longer lists (p2, p3, g3, g3s, dl1, g4ad)."""
    out = []
    defaults = legacy["defaults"]
    network = _default_network() if network is None else network
    sources = legacy.get("network_sources", {})
    for name, t in legacy["types"].items():
        key = t.get("network_source", "")
        if key not in sources:
            raise ValueError(f"legacy.toml: {name}: network_source {key!r} is not one of [network_sources]: "
                             f"{', '.join(sorted(sources))}")
        spec = accelerators[t["accelerator"]]
        family = family_of(name)
        life = legacy["retired"][family]
        nvme = t.get("nvme")
        efa_interfaces = t.get("max_efa_interfaces", 0)
        out.append(InstanceFacts(
            instance_type=name, family=family, vcpus=t["vcpus"], memory_gib=float(t["memory_gib"]),
            architectures=("x86_64",), accelerator_vendor=spec.vendor, accelerator=spec.name,
            accelerator_kind="gpu", accelerator_count=t["accelerator_count"], accelerator_fraction=1.0,
            accelerator_memory_gib=float(t["accelerator_memory_gib"]), sdk=spec.sdk,
            interconnect=interconnect_for(spec, t["accelerator_count"]), precisions=spec.precisions,
            tensor_cores=spec.tensor_cores, efa=efa_interfaces > 0, network_cards=t.get("network_cards", 1),
            max_efa_interfaces=efa_interfaces,
            nvme=NvmeDisks(**nvme) if nvme else None, regions=tuple(t.get("regions", defaults["regions"])),
            prices=prices.get(name, {}), retired=True, successors=tuple(life["successors"]),
            specs_source=t.get("specs_source", defaults["specs_source"]),
            **network_facts(name, t.get("network_performance"), sources[key], network.get(name)),
        ))
    return out
