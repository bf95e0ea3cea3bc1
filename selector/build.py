"""Turns EC2 DescribeInstanceTypes records into catalog entries.

Pure functions over plain dicts, shared by `catalog refresh` (live or moto) and the tests.
Specs come only from the API record; what the API lacks (precisions, interconnect, SDK)
comes from the per-accelerator table; prices come from the price table or live price APIs.
"""
from __future__ import annotations

import tomllib
from typing import Any, Iterable, Optional

from .accelerators import AcceleratorSpec
from .facts import CapacityBlockPrice, InstanceFacts, NvmeDisks, Price

from .paths import data_file
MIB_PER_GIB = 1024


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
) -> InstanceFacts:
    acc = accelerator_of(record)
    if acc is None:
        raise ValueError(f"{record['InstanceType']} has no deep-learning accelerator")
    spec = accelerators[acc["name"]]
    net = record["NetworkInfo"]
    cards = net.get("NetworkCards") or []
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
        network_gbps=round(sum(c.get("PeakBandwidthInGbps", 0.0) for c in cards), 2),
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
) -> list[InstanceFacts]:
    """Entries for retired types that the API no longer lists (p2, p3, g3, g3s, dl1, g4ad)."""
    out = []
    defaults = legacy["defaults"]
    for name, t in legacy["types"].items():
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
            max_efa_interfaces=efa_interfaces, network_gbps=float(t["network_gbps"]),
            nvme=NvmeDisks(**nvme) if nvme else None, regions=tuple(t.get("regions", defaults["regions"])),
            prices=prices.get(name, {}), retired=True, successors=tuple(life["successors"]),
            specs_source=t.get("specs_source", defaults["specs_source"]),
        ))
    return out
