"""The latency objective (min_latency): a per-request figure at batch 1 where a basis exists.

Basis: decoding one token at batch 1 reads every weight once, and at batch 1 that read, not the
arithmetic, bounds the step (memory-bandwidth-bound decoding: Pope et al. 2022, "Efficiently Scaling
Transformer Inference", section 2; Hugging Face's "Optimizing LLMs for Speed and Memory"). So

    ms per token >= weight bytes / (accelerators x memory bandwidth each)

with the weights sharded over every accelerator of the node (tensor parallelism). It is a lower bound,
the same for every type, so it orders types by what bounds them; real servers add kernel and
communication overheads that differ by stack. A type whose accelerator has no sourced bandwidth figure
(accelerators.md, memory_bandwidth_gbps) gets none and ranks after those that do, said in its reasons;
a model that needs more than one node gets none either (the network hop is not modelled).
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional
    from .accelerators import AcceleratorSpec
    from .facts import InstanceFacts
    from .model_memory import ModelMemory

from .accelerators import spec_for

BASIS = ("memory-bandwidth-bound decoding at batch 1: weights / (accelerators x memory bandwidth), "
         "a lower bound (Pope et al. 2022)")


def per_token(facts: InstanceFacts, model: ModelMemory, accelerators: dict[str, AcceleratorSpec],
              nodes: int) -> tuple[Optional[float], str]:
    """(ms per token or None, the sentence for the type's reasons)."""
    spec = spec_for(facts, accelerators) if facts.accelerator in accelerators else None
    bandwidth = spec.memory_bandwidth_gbps if spec is not None else None
    if not bandwidth:
        return None, (f"unranked for latency: no memory-bandwidth figure for {facts.accelerator} in the "
                      "accelerator table (accelerators.md)")
    if nodes != 1:
        return None, f"unranked for latency: the model spans {nodes} nodes and the network hop is not modelled"
    total = facts.accelerator_count * facts.accelerator_fraction * bandwidth
    ms = model.weights_gb / total * 1000
    return ms, (f"latency: {ms:.3g} ms per token at batch 1 (at least): {model.weights_gb:,.4g} GB of {model.precision} "
                f"weights / ({facts.accelerator_count:g} x {bandwidth:,g} GB/s {spec.name}); {BASIS}")


def latency_why(top, second) -> str:
    """`why` under min_latency: the two leading figures and the basis."""
    a, b = top.ms_per_token, second.ms_per_token
    if a is None:
        return (f"no candidate has a latency figure (no memory-bandwidth figure for its accelerator): ranked by "
                f"price, {top.instance_type} first")
    return (f"{top.instance_type} has the lowest modelled decode time per token at batch 1: {a:.3g} ms vs "
            + (f"{b:.3g} ms" if b is not None else "none (unranked for latency)")
            + f" for {second.instance_type} ({BASIS})")
