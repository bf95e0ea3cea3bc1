"""What --model-size asks of instance types (model_memory.py says what the model needs): whether a node
holds it, how many nodes do, the profile the flags imply without --profile, and what `why` adds."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional
    from .accelerators import AcceleratorSpec
    from .catalog import Catalog
    from .facts import InstanceFacts
    from .model_memory import ModelMemory
    from .profiles import Profile

# The profiles the flags imply without --profile: a model some node in the region holds trains with
# `training` (anything that trains); one no node holds with `multi-node-training`; inference with
# MODEL_INFERENCE (inference_profile: not a built-in, so no portfolio product or launchable name).
TRAINING = "training"
MULTI_NODE = "multi-node-training"
MODEL_INFERENCE = "model-inference"


def node_memory_gb(f: InstanceFacts) -> float:
    """The accelerator memory of one node, in the vendor's GB: accelerators x GB each."""
    return f.accelerator_count * f.accelerator_memory_gb


def model_fits(f: InstanceFacts, p: Profile, model: ModelMemory) -> Optional[str]:
    """A node that cannot hold the model fails, unless the profile runs several nodes (multi_node): then it
    passes and its reasons say how many nodes hold the model (candidate_fields)."""
    node = node_memory_gb(f)
    if node >= model.needed_gb or (p.multi_node and node > 0):
        return None
    if node <= 0:
        return f"no accelerator memory to hold {model.describe()} ({model.needed_gb:,.0f} GB)"
    return (f"{node:,.4g} GB across the node < {model.needed_gb:,.0f} GB for {model.describe()}: "
            f"needs {model.nodes(node)} nodes of it (a multi-node profile: --profile multi-node-training, or one of "
            "your own with multi_node = true)")


def candidate_fields(facts: InstanceFacts, model: ModelMemory, accelerators: dict[str, AcceleratorSpec]
                     ) -> tuple[int, str, Optional[float], str]:
    """(nodes that hold the model, the sentence saying so, ms per token or None, the latency sentence)."""
    node = node_memory_gb(facts)
    nodes = model.nodes(node)
    note = (f"holds {model.describe()} ({model.needed_gb:,.0f} GB) on {nodes} node(s) of {node:,.4g} GB"
            + (" each" if nodes > 1 else ""))
    if model.training:
        return nodes, note, None, ""
    from .latency import per_token
    ms, latency = per_token(facts, model, accelerators, nodes)
    return nodes, note, ms, latency


def _largest(catalog: Catalog, region: str) -> Optional[InstanceFacts]:
    offered = [f for f in catalog if region in f.regions and not f.retired]
    return max(offered, key=lambda f: (node_memory_gb(f), f.instance_type)) if offered else None


def implied_profile_name(model: ModelMemory, catalog: Catalog, region: str) -> str:
    if not model.training:
        return MODEL_INFERENCE
    largest = _largest(catalog, region)
    return TRAINING if largest is not None and node_memory_gb(largest) >= model.needed_gb else MULTI_NODE


def implied_profile(name: str, profiles: dict[str, Profile]) -> Profile:
    """The Profile implied_profile_name names: a built-in, or inference_profile()."""
    from .profiles import get_profile
    return inference_profile() if name == MODEL_INFERENCE else get_profile(name, profiles)


def inference_profile() -> Profile:
    """The profile `--model-size N --task inference` ranks with when no --profile is given: one node of
    anything built for inference on CUDA or Neuron (the stacks the common LLM servers run on: vLLM and
    TGI; Neuron's NxD Inference), cheapest per hour. Not a built-in: nothing launches it by name (the
    portfolio makes a product of every built-in); the --model-size filter is what it asks of a node."""
    from .profiles import Profile
    return Profile(name=MODEL_INFERENCE, description="One node that holds the --model-size model for inference "
                   "(GPU, Inferentia or Trainium), cheapest per hour", objective="min_price", whole_accelerators=True,
                   sdks=("cuda", "neuron"), roles=("inference",), workload="inference",
                   source="implied by --model-size ... --task inference")


def model_why(model: ModelMemory, profile: Profile, catalog: Catalog, region: str) -> str:
    """What `why` adds for --model-size: more than one node when no single node here holds it."""
    largest = _largest(catalog, region)
    if largest is None or node_memory_gb(largest) >= model.needed_gb:
        return ""
    big = node_memory_gb(largest)
    nodes = model.nodes(big)
    if profile.multi_node:
        return (f"; no single node in {region} holds it (largest: {largest.instance_type}, {big:,.4g} GB): "
                f"each row says how many nodes of it do ({nodes} of {largest.instance_type})")
    return (f"; it needs more than one node: the largest node in {region}, {largest.instance_type}, holds "
            f"{big:,.4g} GB, so {nodes} of them: rank with a multi-node profile (--profile multi-node-training, "
            "or one of your own with multi_node = true)")
