"""When may one instance type replace another for the SAME job? One rule, used by the app's
selection (dl_stacks/selection.py) and meant for the constructs too.

A job that falls back to an alternate moves whole: a multi-node cluster runs every node on one
type (AWS recommends one instance type per cluster placement group; a job runs at its slowest
node, memory and EFA layouts differ, and a cluster is never mixed), and a single node is the
whole job. So the question is never "can these two types work side by side" but "does the job
stay the same job on the other type":

- always: the same CPU architecture and SDK, so the AMI (x86_64/arm64, CUDA/Neuron DLAMI) and the
  job's software stay valid; and the same processes per node (GPUs or NeuronCores), so the job's
  world size stays what it was. A resumed checkpoint with another world size would run with
  another global batch (per-rank batch x world size), another data sharding and a learning-rate
  schedule tuned for neither: the runtime could start it (dl-torchrun reads NPROC_PER_NODE per
  node from the catalog), but it would silently be a different job. Hence a single node keeps its
  count too, although nothing else is shared between nodes.
- multi-node, rule "same-accelerator" (the default): also the same accelerator model, memory per
  accelerator and count, because a multi-node job is sized and tuned to the accelerator (memory
  per rank, speed per step): p5 (H100 80 GB) and p5en (H200 141 GB) are not interchangeable, nor
  p4d (A100 40 GB) and p4de (A100 80 GB).
- multi-node, rule "same-count": any accelerator model with the same count; the user widens
  explicitly (interchange=same-count) and accepts that the whole cluster may move to another model.
- single node: any model that meets the profile (the recommendation already checked memory,
  precision and the rest against the profile's hard requirements).
"""
from __future__ import annotations

from typing import Optional

from .facts import InstanceFacts

# The rules a job may choose (CDK context key `interchange`); the first is the default.
RULES: tuple[str, ...] = ("same-accelerator", "same-count")
DEFAULT_RULE = RULES[0]


def accelerators_of(f: InstanceFacts) -> str:
    """'8 x A100 40 GiB': what a node holds, as the reasons name it."""
    frac = "" if f.accelerator_fraction == 1 else f" ({f.accelerator_fraction:g} of one)"
    return f"{f.accelerator_count} x {f.accelerator} {f.accelerator_memory_gib:g} GiB{frac}"


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def interchangeable(pick: InstanceFacts, other: InstanceFacts, *, multi_node: bool,
                    rule: str = DEFAULT_RULE) -> Optional[str]:
    """None when `other` can replace `pick` for the same job; otherwise the one-line reason."""
    if rule not in RULES:
        raise ValueError(f"unknown interchange rule {rule!r}; allowed: {', '.join(RULES)}")
    if other.architecture != pick.architecture:
        return f"{other.architecture} host, the pick's is {pick.architecture}: the AMI would not run"
    if other.sdk != pick.sdk:
        return f"needs the {other.sdk} stack, the pick's is {pick.sdk}: the job's software would not run"
    if (other.accelerator_count, other.processes_per_node) != (pick.accelerator_count, pick.processes_per_node):
        return (f"{_processes(other.processes_per_node)} per node ({accelerators_of(other)}), the pick's "
                f"{pick.processes_per_node}: the job's world size would change")
    if multi_node and rule == "same-accelerator":
        same_model = (other.accelerator, other.accelerator_memory_gib, other.accelerator_fraction) == \
            (pick.accelerator, pick.accelerator_memory_gib, pick.accelerator_fraction)
        if not same_model:
            return (f"{accelerators_of(other)}, the pick's {accelerators_of(pick)}: a multi-node job keeps its "
                    "accelerator (interchange=same-count widens to any model)")
    return None
