"""`Checkpointer.state_of(model, optimizer)`: torch's `get_state_dict(model, optimizer)` as
{"model": ..., "optim": ...}, without torch naming every parameter again on every call.

get_state_dict walks the module tree, names every parameter (the canonical name, without the
wrappers' parts such as DDP's `module.`) and renames the optimizer's parameter indices to those
names, every call: 0.25 ms for the drill's 6-parameter FSDP2 model and 13 ms for 344 parameters
on this machine, which a job pays every step it keeps a snapshot in memory (save_to_memory).
The names cannot change while the model's state-dict keys and the optimizer's parameters stay
the same, so they are learned once from torch and reused: `model.state_dict()` and
`optimizer.state_dict()`, renamed (`bench/state_of.py`).

Never a different answer. The names are learned from a call of torch's own, and used only once
the reused answer equals that one leaf by leaf (the same tensors' storage, shape, stride, dtype
and placements; the same plain values; the same key order). Every CHECK_EVERY-th call is torch's
again and checked the same way, and a model whose keys changed or an optimizer holding other
parameters learns again from torch. Where the reuse does not hold (FSDP1's wrapper, which
rewrites the optimizer's state; several optimizers), or once any check finds a difference, every
call is torch's, and the difference is said once. An optimizer with no state (SGD without
momentum) gets torch's call too, and is tried again at each call.
"""
from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Optional

from . import memory_raw

CHECK_EVERY = 100  # every this many calls, torch's own answer, compared with the reused one


class StateOf:
    def __init__(self, *, log: Optional[Callable[[str], None]] = None, check_every: int = CHECK_EVERY) -> None:
        self.log = log or (lambda line: print(f"dl-launcher: {line}", file=sys.stderr, flush=True))
        self.check_every = max(1, check_every)
        self.calls = 0
        self.off: Optional[str] = None  # why every call is torch's from now on
        # The model and optimizer the names are for, and the optimizer's parameters in its order:
        # weak, so that a job that builds its model again (an in-process restart) frees the old one.
        self._for: Optional[tuple[Any, Any]] = None
        self._keys: tuple[str, ...] = ()  # model.state_dict()'s own keys
        self._rename: dict[str, str] = {}  # those of them whose canonical name differs
        self._params: tuple[Any, ...] = ()
        self._names: list[str] = []  # their canonical names, by the optimizer's index

    def __call__(self, model: Any, optimizer: Any) -> dict:
        self.calls += 1
        learned = self.off is None and self._for is not None and self._for[0]() is model and self._for[1]() is optimizer
        got = self._reuse(model, optimizer) if learned else None
        if got is not None and self.calls % self.check_every:
            return got
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, optimizer)
        torch_s = {"model": msd, "optim": osd}
        if self.off is None:
            if got is not None:  # a check of the names in use
                self._settle(differs(got, torch_s))
            else:
                self._learn(model, optimizer, torch_s)
        return torch_s

    def _reuse(self, model: Any, optimizer: Any) -> Optional[dict]:
        """The state from the names learned, or None where they no longer fit (learn again)."""
        if not optimizer.state or len(optimizer.param_groups) == 0:
            return None
        params = _params_of(optimizer)
        if len(params) != len(self._params) or any(a is not b() for a, b in zip(params, self._params)):
            return None
        raw = model.state_dict()
        if tuple(raw) != self._keys:
            return None
        for k, fqn in self._rename.items():  # as torch renames: each renamed key moves to the end, in order
            raw[fqn] = raw.pop(k)
        msd = raw
        osd = optimizer.state_dict()
        names = self._names
        try:
            osd["state"] = {names[i]: s for i, s in osd["state"].items()}
            for g in osd["param_groups"]:
                g["params"] = [names[i] for i in g["params"]]
        except (IndexError, TypeError):
            return None
        return {"model": msd, "optim": osd}

    def _learn(self, model: Any, optimizer: Any, torch_s: dict) -> None:
        self._for = None
        why = _unsupported(model, optimizer)
        if why is None and not optimizer.state:
            return  # a stateless optimizer (torch's call makes every other one's state): learn at the next call
        if why is None:
            try:
                self._for = (weakref.ref(model), weakref.ref(optimizer))
                self._learn_names(model, optimizer)
                got = self._reuse(model, optimizer)
            except Exception as e:  # noqa: BLE001 - whatever it is, torch's answer stands
                got, why = None, f"the names could not be learned ({type(e).__name__}: {e})"
            if why is None:
                why = "the learned names do not fit the model" if got is None else differs(got, torch_s)
        self._settle(why)

    def _settle(self, why: Optional[str]) -> None:
        if why is not None:
            self.off, self._for = why, None
            self.log(f"state_of: torch's get_state_dict on every call from now on: {why}")

    def _learn_names(self, model: Any, optimizer: Any) -> None:
        from torch.distributed.checkpoint.state_dict import _get_fqns

        def canonical(key: str) -> str:
            fqns = _get_fqns(model, key)
            if len(fqns) != 1:
                raise ValueError(f"{key} has {len(fqns)} names")
            return next(iter(fqns))

        self._keys = tuple(model.state_dict())
        self._rename = {k: f for k in self._keys if (f := canonical(k)) != k}
        params = _params_of(optimizer)
        self._params = tuple(weakref.ref(p) for p in params)
        index = {id(p): i for i, p in enumerate(params)}
        names: list[Optional[str]] = [None] * len(params)
        for key, p in model.named_parameters():  # as torch names the optimizer's parameters
            if id(p) in index:
                names[index[id(p)]] = canonical(key)
        if any(n is None for n in names):
            raise ValueError("the optimizer holds a parameter the model does not name")
        self._names = names  # type: ignore[assignment]


def _params_of(optimizer: Any) -> list:
    """The optimizer's parameters in its own order, the order its state_dict() indexes them in."""
    return [p for g in optimizer.param_groups for p in g["params"]]


def _unsupported(model: Any, optimizer: Any) -> Optional[str]:
    """Why the names cannot be reused for this pair (None: they can)."""
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        return "one optimizer only (torch.optim.Optimizer)"
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if FSDP.fsdp_modules(model):
        return "FSDP1 (FullyShardedDataParallel) rewrites the optimizer's state"
    return None


def differs(a: Any, b: Any, at: str = "") -> Optional[str]:
    """Where two state dicts differ (None: the same keys in the same order, the same tensors,
    the same plain values); a, the reused one; b, torch's."""
    import torch

    if type(a) is not type(b):
        return f"{at or 'the state'}: {type(a).__name__} against torch's {type(b).__name__}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{at or 'the state'}: keys {_brief(list(a))} against torch's {_brief(list(b))}"
        for k in a:
            d = differs(a[k], b[k], f"{at}/{k}")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{at}: {len(a)} items against torch's {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = differs(x, y, f"{at}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, torch.Tensor):
        return None if _same_tensor(a, b) else f"{at}: another tensor than torch's"
    try:
        same = bool(memory_raw.same_value(a, b))
    except Exception:  # noqa: BLE001 - a value that cannot say whether it is equal is not known to be
        same = False
    return None if same else f"{at}: {a!r:.80} against torch's {b!r:.80}"


def _same_tensor(a: Any, b: Any) -> bool:
    """The same data seen the same way: storage, offset, shape, stride, dtype, device, and for a
    DTensor its placements and mesh too."""
    from torch.distributed.tensor import DTensor

    if isinstance(a, DTensor):
        if a.placements != b.placements or a.device_mesh != b.device_mesh or a.shape != b.shape:
            return False
        a, b = a.to_local(), b.to_local()
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device and a.requires_grad == b.requires_grad)


def _brief(keys: list) -> str:
    return repr(keys[:4])[:-1] + (f", ... {len(keys)} in all]" if len(keys) > 4 else "]")
