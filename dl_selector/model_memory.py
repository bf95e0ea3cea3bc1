"""The accelerator memory a model needs across a node: recommend --model-size 7B --task finetune|pretrain|inference
[--precision P]. The rules and their sources (docs/selector.md, "Sizing by model"):

- Training (pretrain, or a full fine-tune) with Adam: 16 bytes per parameter for the model states. Mixed
  precision keeps fp16/bf16 weights (2) and gradients (2) and fp32 master weights, momentum and variance
  (4 + 4 + 4): "2Ψ + 2Ψ + 12Ψ = 16Ψ bytes", so a 1.5B GPT-2 needs at least 24 GB (ZeRO, Rajbhandari et
  al. 2020, section 3.1). FP32 training holds 4 + 4 + 8 = 16 as well. Plus an activation allowance of
  20% of that: an assumption, not a measurement (activations grow with sequence length and micro-batch,
  Korthikanti et al. 2022; with activation checkpointing they are a fraction of the model states).
- Inference: the weights at the precision's bytes per parameter, plus 20% for the KV cache and the
  runtime (EleutherAI, "Transformer Math 101", 2023: total inference memory is about 1.2 x the weights).

The sum is in the vendor's GB (10^9 bytes), the unit of the table's GB column, and the filter compares it
with the node's total: accelerators x GB each (ZeRO-3/FSDP and tensor parallelism shard the states
across the node's accelerators). A LoRA/QLoRA fine-tune needs far less: size it with --min-gpu-memory.
"""
from __future__ import annotations

import math
import re
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Optional

from .errors import UserError, closest
from .record import record
from .validate import clean

TASKS = ("finetune", "pretrain", "inference")
TRAINING_BYTES_PER_PARAMETER = 16.0  # ZeRO section 3.1: mixed-precision (or fp32) Adam model states
ACTIVATION_ALLOWANCE = 0.20          # of the model states: an assumption (module docstring)
INFERENCE_ALLOWANCE = 0.20           # of the weights: KV cache and runtime (Transformer Math 101)
# Bytes per parameter of the weights served (inference) or trained in.
INFERENCE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}
TRAINING_PRECISIONS = ("bf16", "fp16", "fp32")
DEFAULT_PRECISION = "bf16"
_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*([kmbt])$", re.IGNORECASE)
MIN_PARAMETERS, MAX_PARAMETERS = 1e6, 1e14
EXAMPLES = "7B, 70B, 1.5B, 405B, 500M"


@record(frozen=True)
class ModelMemory:
    """One model's need: `parameters`, `task` (TASKS), `precision`, and the figures derived from them."""
    parameters: float
    task: str
    precision: str
    size_text: str  # as the user wrote it, normalised (7B, 1.5B, 500M)

    @property
    def training(self) -> bool:
        return self.task != "inference"

    @property
    def bytes_per_parameter(self) -> float:
        return TRAINING_BYTES_PER_PARAMETER if self.training else INFERENCE_BYTES[self.precision]

    @property
    def allowance(self) -> float:
        return ACTIVATION_ALLOWANCE if self.training else INFERENCE_ALLOWANCE

    @property
    def base_gb(self) -> float:
        """Model states (training) or weights (inference), in GB: the figure the sources publish."""
        return self.parameters * self.bytes_per_parameter / 1e9

    @property
    def weights_gb(self) -> float:
        """The weights alone at the precision: what each decoded token reads once (min_latency)."""
        return self.parameters * INFERENCE_BYTES[self.precision] / 1e9

    @property
    def needed_gb(self) -> float:
        return self.base_gb * (1 + self.allowance)

    def nodes(self, node_gb: float) -> int:
        """Nodes of `node_gb` each that hold it (0 for a node with no accelerator memory)."""
        return math.ceil(self.needed_gb / node_gb - 1e-9) if node_gb > 0 else 0

    def describe(self) -> str:
        return f"a {self.size_text} {self.task} in {self.precision}"

    def formula(self) -> str:
        """The sentence `why` and the reasons carry: figure, rule and source."""
        if self.training:
            return (f"{self.describe()} needs {self.needed_gb:,.0f} GB of accelerator memory across the node(s): "
                    f"{self.size_text} x {self.bytes_per_parameter:g} bytes per parameter for weights, gradients "
                    f"and Adam states = {self.base_gb:,.0f} GB (ZeRO, Rajbhandari et al. 2020, section 3.1) "
                    f"+ {self.allowance:.0%} for activations (an assumption)")
        return (f"{self.describe()} needs {self.needed_gb:,.0f} GB of accelerator memory across the node(s): "
                f"{self.size_text} x {self.bytes_per_parameter:g} bytes per parameter ({self.precision}) = "
                f"{self.base_gb:,.0f} GB of weights + {self.allowance:.0%} for KV cache and runtime "
                "(EleutherAI, Transformer Math 101)")

    def to_dict(self) -> dict:
        return {"parameters": self.parameters, "task": self.task, "precision": self.precision,
                "bytes_per_parameter": self.bytes_per_parameter, "base_gb": round(self.base_gb, 1),
                "allowance": self.allowance, "needed_gb": round(self.needed_gb, 1), "formula": self.formula()}


def parse_model_size(text: str) -> tuple[float, str]:
    """'7B' / '70b' / '1.5B' / '405B' / '500M' -> (parameters, normalised text); one-line UserError otherwise."""
    raw = str(text).strip()
    m = _SIZE.match(raw.replace(",", ""))
    if m is None:
        digits = re.match(r"^\s*(\d+(?:\.\d+)?)", raw)
        hint = ""
        if digits and re.search(r"gi?b", raw, re.IGNORECASE):
            hint = f"; that is a memory size: give the parameter count; closest: {digits.group(1)}B"
        elif digits:
            hint = f"; closest: {digits.group(1)}B"
        raise UserError(f"--model-size {clean(repr(raw))[:40]}: not a parameter count; allowed: a number with "
                        f"K, M, B or T (parameters), e.g. {EXAMPLES}{hint}")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not MIN_PARAMETERS <= value <= MAX_PARAMETERS:
        raise UserError(f"--model-size {clean(raw)[:40]}: {value:.3g} parameters is outside 1M to 100T; e.g. {EXAMPLES}")
    return value, f"{float(m.group(1)):g}{m.group(2).upper()}"


def model_memory(size: Optional[str], task: Optional[str], precision: Optional[str]) -> Optional[ModelMemory]:
    """The CLI's three flags as one ModelMemory, None when none is given; one-line UserError on bad input."""
    if size is None:
        if task is not None or precision is not None:
            flag = "--task" if task is not None else "--precision"
            raise UserError(f"{flag} sizes a model: pass it with --model-size (e.g. --model-size 7B --task finetune)")
        return None
    parameters, shown = parse_model_size(size)
    if task is None:
        raise UserError(f"--model-size needs --task: one of {', '.join(TASKS)} (the memory rule differs)")
    if task not in TASKS:
        near = closest(task, TASKS, n=1)
        raise UserError(f"--task {clean(repr(task))[:40]}: allowed: {', '.join(TASKS)}"
                        + (f"; closest: {near[0]}" if near else ""))
    precision = DEFAULT_PRECISION if precision is None else precision
    allowed = TRAINING_PRECISIONS if task != "inference" else tuple(INFERENCE_BYTES)
    if precision not in allowed:
        near = closest(precision.lower(), allowed, n=1)
        why = (" (the training rule is mixed-precision or fp32 Adam: fp8/int8 training still keeps fp32 "
               "master weights and Adam states)" if task != "inference" and precision in INFERENCE_BYTES else "")
        raise UserError(f"--precision {clean(repr(precision))[:40]} for {task}: allowed: {', '.join(allowed)}{why}"
                        + (f"; closest: {near[0]}" if near else ""))
    return ModelMemory(parameters, task, precision, shown)
