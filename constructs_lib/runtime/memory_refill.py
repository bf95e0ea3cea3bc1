"""The memory tier's shortcut for `save_to_memory(step, model=, optimizer=)`: the staged copy of the
state refilled straight from the model's and the optimizer's own tensors, without making the state
dict (state_of) and walking it (memory_staging.stage) on every step it keeps.

Those two are the tier's cost on the training thread, the one part on the step's path when the
tier's threads have idle cores (a GPU node): 0.12-0.14 ms a kept step for the drill's 6-parameter
FSDP2 model and 8.0-10.9 ms for 344 parameters (1,376 tensors with Adam); refilled, 0.02 and
1.3 ms, about half of it the copy itself (bench/state_of.py).

Learned from one full call: each staged buffer's source is found among the live tensors (the
modules' own parameters and buffers, a DTensor's local shard, the optimizer's state) by its storage,
offset, shape, stride and dtype; each plain value is a param group's hyperparameter or list (such
as `param_names`), a value in the optimizer's state of the same parameter, or a param group's
parameter names. A state with anything else (a tensor a state-dict hook made, a module's extra
state, a tensor learning rate) gets no refill: every call is full, and the first says why.

Used only while what it was learned from holds, checked on every call with C-level loops: the same
model and optimizer; every object over the copied bytes (two parameters may share them) the same
object at every place that holds it, over the same memory, shape and stride, a DTensor over the
same local shard; every submodule at its place; each module's submodules, parameters, buffers,
non-persistent buffers and state-dict hooks as many, and its empty slots empty (no hook sees a
ModuleList.insert or a write into a module's dicts); the optimizer's state, each parameter's state,
the param groups and their parameter lists the same objects and sizes. The copy is made under
no_grad (its sources are live parameters). Every CHECK_EVERY-th call is full, and what it learns
must be what is in use; else the refill is off for the run, said once. A check or copy that raises
turns it off too: never the step's error.
"""
from __future__ import annotations

import operator
import sys
import weakref
from typing import Any, Callable, Optional

from . import memory_raw
from .memory_staging import _copy, _pair

CHECK_EVERY = 100


def _init() -> None:
    global _PTR, _STRIDE
    import torch

    _PTR, _STRIDE = torch.Tensor.data_ptr, torch.Tensor.stride


class _Plan:
    """Where each staged buffer and plain value of one learned state comes from."""

    def __init__(self) -> None:
        self.model: Any = None  # weak references
        self.optimizer: Any = None
        # Every place a source is held, and what must be there: (dict, key, object) and (list, index, object)
        self.in_dicts: tuple[list, list, list] = ([], [], [])
        self.in_lists: tuple[list, list, list] = ([], [], [])
        self.dtensors: tuple[list, list] = ([], [])  # DTensor sources and their local shards
        self.watched: list[Any] = []  # every local tensor over the copied bytes (two objects may share them)
        self.views: tuple[list, list, list] = ([], [], [])  # their data_ptr, shape and stride
        self.pairs: list[tuple[Any, Any]] = []  # (staged buffer, source)
        self.on_cpu: tuple[list, list] = ([], [])  # the staged buffers and sources of the pairs on CPU
        self.on_device: list[tuple[Any, Any]] = []  # and the others
        self.leaves: list[tuple[Any, Any, Any]] = []  # (staged container, key, live container)
        self.sizes: tuple[list, list] = ([], [])  # live containers and their sizes
        self.state: Any = None  # the optimizer's state and param groups, the objects
        self.groups: Any = None

    def holds(self, model: Any, optimizer: Any) -> bool:
        """Whether what the plan was learned from is still there (C-level loops: this is the cost
        of a refill beside the copy itself)."""
        if self.model() is not model or self.optimizer() is not optimizer:
            return False
        if optimizer.state is not self.state or optimizer.param_groups is not self.groups:
            return False
        if list(map(len, self.sizes[0])) != self.sizes[1]:
            return False
        cs, ks, objs = self.in_dicts
        if not all(map(operator.is_, map(dict.get, cs, ks), objs)):
            return False
        cs, ks, objs = self.in_lists
        if not all(map(operator.is_, map(list.__getitem__, cs, ks), objs)):
            return False
        ds, locals_ = self.dtensors
        if not all(map(operator.is_, map(_LOCAL, ds), locals_)):
            return False
        s, (ptrs, shapes, strides) = self.watched, self.views
        return list(map(_PTR, s)) == ptrs and list(map(_STRIDE, s)) == strides and list(map(_SHAPE, s)) == shapes

    def keep(self, container: Any, key: Any, obj: Any) -> None:
        """`obj` must stay at container[key] for the plan to hold."""
        if not isinstance(container, (dict, list)):  # what holds() cannot look into: no plan
            raise TypeError(f"a {type(container).__name__} holds part of the state")
        into = self.in_lists if isinstance(container, list) else self.in_dicts
        into[0].append(container)
        into[1].append(key)
        into[2].append(obj)

    def refill(self) -> None:
        import torch

        for dst, key, src in self.leaves:
            dst[key] = src[key]
        with torch.no_grad():  # from live parameters: autograd must not record the copy into the buffers
            if self.on_cpu[0]:
                torch._foreach_copy_(*self.on_cpu)
            if self.on_device:
                _copy(self.on_device, True)

    def same_as(self, other: "_Plan") -> Optional[str]:
        """Where two plans of one state differ (None: the same buffers from the same sources)."""
        if len(self.pairs) != len(other.pairs) or any(a[0] is not b[0] or a[1] is not b[1] for a, b in zip(self.pairs, other.pairs)):
            return "a staged buffer comes from another tensor"
        if [(id(d), k, id(s)) for d, k, s in self.leaves] != [(id(d), k, id(s)) for d, k, s in other.leaves]:
            return "a plain value comes from elsewhere"
        return None


_LOCAL = operator.attrgetter("_local_tensor")
_SHAPE = operator.attrgetter("shape")
_PTR: Any = None  # torch.Tensor.data_ptr and .stride, once torch is imported (_init)
_STRIDE: Any = None


def _key(t: Any) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device)


def learn(model: Any, optimizer: Any, state: dict, staged: dict) -> tuple[Optional[_Plan], Optional[str]]:
    """The plan for refilling `staged` (stage's copy of `state`, state_of's answer for this model
    and optimizer), or None and why there is none."""
    live, holders, per_param = _live(model, optimizer)
    plan = _Plan()
    pairs: list = []
    leaves: list = []
    _pair(state, staged, pairs, leaves)
    containers = _containers(staged)
    owner_of: dict[int, dict] = {}  # id(a staged per-parameter state) -> the optimizer's own
    used: dict[int, Any] = {}
    for dst, src in pairs:
        found = live.get(_key(src))
        if found is None:
            return None, "a tensor of the state is none of the model's or the optimizer's own"
        plan.pairs.append((dst, found[0][1]))
        for obj, local in found:  # every object over these bytes must stay as it is
            if id(obj) not in used:
                used[id(obj)] = obj
                plan.watched.append(local)
                if obj is not local:
                    plan.dtensors[0].append(obj)
                    plan.dtensors[1].append(local)
            if id(obj) in per_param:
                owner_of[id(containers[id(dst)])] = per_param[id(obj)]
    for key, obj in used.items():
        for c, k in holders[key]:
            plan.keep(c, k, obj)
    plan.views = (list(map(_PTR, plan.watched)), list(map(_SHAPE, plan.watched)), list(map(_STRIDE, plan.watched)))
    for d, src in plan.pairs:
        if src.device.type == "cpu":
            plan.on_cpu[0].append(d)
            plan.on_cpu[1].append(src)
        else:
            plan.on_device.append((d, src))
    sized: list = []
    why = _plain_values(plan, leaves, staged, optimizer, owner_of, sized)
    if why is not None:
        return None, why
    _the_models(plan, model, sized)
    _the_optimizers(plan, optimizer, sized)
    plan.sizes = (sized, list(map(len, sized)))
    plan.model, plan.optimizer = weakref.ref(model), weakref.ref(optimizer)
    return plan, None


def _live(model: Any, optimizer: Any) -> tuple[dict, dict, dict]:
    """The model's and optimizer's own tensors: by storage key, every (object, its local tensor)
    over those bytes; by id(object), every (dict, key) that holds it; by id(object), the
    optimizer's per-parameter state holding it."""
    import torch

    live: dict[tuple, list] = {}
    holders: dict[int, list[tuple[dict, Any]]] = {}
    per_param: dict[int, dict] = {}
    states = {id(s) for s in optimizer.state.values()}
    for d in [*(d for mod in model.modules() for d in (mod._parameters, mod._buffers)), *optimizer.state.values()]:
        for key, t in d.items():
            if isinstance(t, torch.Tensor):
                local = getattr(t, "_local_tensor", t)
                objs = live.setdefault(_key(local), [])
                if all(o is not t for o, _ in objs):
                    objs.append((t, local))
                holders.setdefault(id(t), []).append((d, key))
                if id(d) in states:
                    per_param[id(t)] = d
    return live, holders, per_param


def _plain_values(plan: _Plan, leaves: list, staged: dict, optimizer: Any, owner_of: dict, sized: list) -> Optional[str]:
    """Each plain value's source: a param group's (its parameter names stay as staged, and a list
    of its, such as `param_names`, while it holds the same items), or the optimizer's state of the
    parameter whose tensors sit beside it; why not, where none is."""
    optim = staged.get("optim")
    groups = optim.get("param_groups") if isinstance(optim, dict) else None
    groups = groups if isinstance(groups, list) and len(groups) == len(optimizer.param_groups) else []
    names = {id(g.get("params")) for g in groups if isinstance(g, dict)}
    lists = {id(v): (i, k) for i, g in enumerate(groups) if isinstance(g, dict)
             for k, v in g.items() if k != "params" and isinstance(v, list)}
    for dst, key, value in leaves:
        if id(dst) in names:
            continue  # a param group's parameter names: fixed while its parameters are
        if id(dst) in lists:  # an item of a group's own list: fixed while the list holds the same items
            i, k = lists[id(dst)]
            live = optimizer.param_groups[i].get(k)
            if not isinstance(live, list) or len(live) != len(dst) or not _same(live[key], value):
                return f"the param groups' {k!r} is not the optimizer's own"
            if key == 0:  # the list itself, once: the same object, as long
                plan.keep(optimizer.param_groups[i], k, live)
                sized.append(live)
            plan.keep(live, key, live[key])
            continue
        i = next((i for i, g in enumerate(groups) if g is dst), None)
        src = optimizer.param_groups[i] if i is not None else owner_of.get(id(dst))
        if src is None or key not in src or not _same(src[key], value):
            where = f"in a param group's {key!r}" if i is not None else f"{key!r} of a {type(dst).__name__}"
            return f"a plain value ({where}) is not the optimizer's own"
        plan.leaves.append((dst, key, src))
    return None


def _the_models(plan: _Plan, model: Any, sized: list) -> None:
    """What must stay: every submodule at its place, every empty parameter or buffer slot empty,
    and each module's submodules, parameters, buffers, non-persistent buffers and state-dict hooks
    as many (no hook sees a ModuleList.insert or a write into a module's dicts)."""
    for mod in model.modules():
        for a in _DICTS:  # the same dicts (Sequential's __delitem__ makes a new one), then their contents
            if a in mod.__dict__:
                plan.keep(mod.__dict__, a, mod.__dict__[a])
        for name, child in mod._modules.items():
            plan.keep(mod._modules, name, child)
        for d in (mod._parameters, mod._buffers):
            for name, t in d.items():
                if t is None:
                    plan.keep(d, name, None)
        sized += [mod.__dict__[a] for a in _DICTS if hasattr(mod.__dict__.get(a), "__len__")]


_DICTS = ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set", "_state_dict_hooks", "_state_dict_pre_hooks")


def _the_optimizers(plan: _Plan, optimizer: Any, sized: list) -> None:
    """What must stay: the optimizer's state and param groups the same objects and sizes, each
    parameter's state the same (a state with no tensors yet too), each group's parameter list and
    its parameters the same, its state-dict hooks as many."""
    plan.state, plan.groups = optimizer.state, optimizer.param_groups
    for p, s in optimizer.state.items():
        plan.keep(optimizer.state, p, s)
    for i, g in enumerate(optimizer.param_groups):
        plan.keep(optimizer.param_groups, i, g)
        plan.keep(g, "params", g["params"])
        for j, p in enumerate(g["params"]):
            plan.keep(g["params"], j, p)
    sized += [optimizer.state, optimizer.param_groups, *optimizer.state.values(), *optimizer.param_groups,
              *(g["params"] for g in optimizer.param_groups)]
    for a in ("_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks"):
        if hasattr(optimizer.__dict__.get(a), "__len__"):
            plan.keep(optimizer.__dict__, a, optimizer.__dict__[a])
            sized.append(optimizer.__dict__[a])


def _containers(staged: Any) -> dict[int, Any]:
    """id(each staged tensor's local shard, as pairs name it) -> the dict or list that holds it."""
    out: dict[int, Any] = {}
    stack = [staged]
    while stack:
        c = stack.pop()
        for v in (c.values() if isinstance(c, dict) else c):
            if isinstance(v, (dict, list)):
                stack.append(v)
            elif hasattr(v, "shape"):
                out[id(getattr(v, "_local_tensor", v))] = c
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(memory_raw.same_value(a, b))
    except Exception:  # noqa: BLE001 - a value that cannot say whether it is equal is not known to be
        return False


class Refill:
    """One per memory tier: `fill` refills the staged copy where the plan holds; where it does not,
    the tier takes the full path and hands its answer to `learned`."""

    def __init__(self, *, check_every: int = CHECK_EVERY, log: Optional[Callable[[str], None]] = None) -> None:
        self.check_every = max(1, check_every)
        self.log = log or (lambda line: print(f"dl-launcher: {line}", file=sys.stderr, flush=True))
        self.plan: Optional[_Plan] = None
        self.off: Optional[str] = None
        self.said = False  # why a state gets no plan: said once
        self.calls = 0
        _init()

    def forget(self) -> None:
        """No plan: the tier's staged copy is no longer the one learned (or the tier stopped)."""
        self.plan = None

    def fill(self, model: Any, optimizer: Any) -> bool:
        """The staged copy refilled from the model and optimizer (True), or False: take the full path."""
        self.calls += 1
        plan = self.plan
        if plan is None or self.calls % self.check_every == 0:
            return False
        try:
            if not plan.holds(model, optimizer):
                return False
            plan.refill()
        except Exception as e:  # noqa: BLE001 - never the step's error: the full path (which fills every buffer) stands
            self._off(f"its check or copy failed ({type(e).__name__}: {e})")
            return False
        return True

    def copy(self, model: Any, optimizer: Any, state_of: Callable[[Any, Any], dict], staged: Optional[dict],
             stage: Callable[[dict, Optional[dict]], tuple[dict, bool]]) -> tuple[dict, bool]:
        """The staged copy of this model's and optimizer's state and whether its buffers are new:
        `staged` refilled where the plan holds, else state_of's answer staged by `stage` (memory_
        staging.stage) and learned from."""
        if self.fill(model, optimizer):
            return staged, False  # type: ignore[return-value] - a plan exists only beside its staged copy
        state = state_of(model, optimizer)
        staged, fresh = stage(state, staged)
        self.learned(model, optimizer, state, staged, fresh)
        return staged, fresh

    def learned(self, model: Any, optimizer: Any, state: dict, staged: dict, fresh: bool) -> None:
        """After a full call: the plan for the next ones. Where the one in use still held (a check),
        the full call's staged copy must have the same buffers (not `fresh`) and the same plan."""
        if self.off is not None:
            return
        old, self.plan = self.plan, None
        try:
            plan, why = learn(model, optimizer, state, staged)
        except Exception as e:  # noqa: BLE001 - a state of a shape not foreseen: the full path stands
            return self._off(f"the plan could not be learned ({type(e).__name__}: {e})")
        try:
            held = old is not None and old.holds(model, optimizer)
        except Exception:  # noqa: BLE001 - fill turned the refill off already where this can raise
            held = False
        if held:  # a check: what the refill gave must be this
            differs = "the state's keys or shapes changed with nothing the refill sees" if fresh or plan is None else old.same_as(plan)
            if differs is not None:
                return self._off(differs)
        if plan is None and not self.said:
            self.said = True
            self.log(f"the memory tier makes the state dict on every kept step: {why}")
        self.plan = plan

    def _off(self, why: str) -> None:
        self.off, self.plan = why, None
        self.log(f"the memory tier's refill is off for this run, every step makes the state dict: {why}")
