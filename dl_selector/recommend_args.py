"""What recommend's flags ask for beyond the catalog: the profile (--profile, or the one --gpu or
--model-size implies), its objective (--objective) and the ad-hoc filters (--gpu, --min-gpu-memory,
--max-price, --model-size). Bad input: one line (UserError)."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    import argparse
    from typing import Optional
    from .profiles import Profile

from .errors import UserError
from .requirements import Filters, memory_variants, parse_gpu
from .validate import finite_number

# `recommend --gpu H100:8` alone: the profile that asks nothing of a type but that it can train.
GPU_ONLY_PROFILE = "training"


def profile_and_filters(a: argparse.Namespace, catalog, profiles: dict[str, Profile]
                        ) -> tuple[Optional[Filters], Profile]:
    filters = _filters(a, catalog)
    name = _profile_name(a, catalog, filters)
    if filters is not None and filters.model is not None and a.profile is None:
        from .model_fit import implied_profile
        profile = implied_profile(name, profiles)
    else:
        from .profiles import get_profile
        profile = get_profile(name, profiles)
    if a.objective is not None:
        from .profiles import with_objective
        profile = with_objective(profile, a.objective)
    return filters, profile


def _profile_name(a: argparse.Namespace, catalog, filters: Optional[Filters] = None) -> str:
    """--profile, or with --gpu or --model-size alone the profile they imply; one line naming what to
    pass otherwise."""
    if a.profile is not None:
        return a.profile
    if filters is not None and filters.model is not None:
        from .model_fit import implied_profile_name
        return implied_profile_name(filters.model, catalog, a.region)
    if a.gpu is None:
        raise UserError("recommend needs --profile (see `profiles`) or --gpu MODEL[:COUNT] (e.g. --gpu H100:8), "
                        "or --model-size N --task T (e.g. --model-size 7B --task finetune)")
    from .accelerators import load_accelerators
    model = parse_gpu(a.gpu, {f.accelerator for f in catalog}, memory_variants(catalog))[0]
    spec = load_accelerators().get(model)
    if spec is not None and "training" not in spec.roles:
        raise UserError(f"--gpu {model} without --profile ranks for training ({GPU_ONLY_PROFILE}), and {model} is not "
                        "built for training: pass --profile inference or --profile neuron-inference")
    return GPU_ONLY_PROFILE


def _filters(a: argparse.Namespace, catalog) -> Optional[Filters]:
    """The ad-hoc filters (--gpu, --min-gpu-memory, --max-price), or None when none is given."""
    model = None
    if a.model_size is not None or a.task is not None or a.precision is not None:  # loaded only when asked for
        from .model_memory import model_memory
        model = model_memory(a.model_size, a.task, a.precision)
    if a.gpu is None and a.min_gpu_memory is None and a.max_price is None and model is None:
        return None
    name, count, suffix_gb = (parse_gpu(a.gpu, {f.accelerator for f in catalog}, memory_variants(catalog))
                               if a.gpu is not None else (None, None, 0.0))
    memory = 0.0 if a.min_gpu_memory is None else finite_number(a.min_gpu_memory, "--min-gpu-memory", 0, 1e6, above=True)
    price = None if a.max_price is None else finite_number(a.max_price, "--max-price", 0, 1e6, above=True)
    return Filters(accelerator=name, count=count, min_memory_gb=max(memory, suffix_gb), max_price=price, model=model)
