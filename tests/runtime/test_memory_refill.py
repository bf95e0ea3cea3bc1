"""The memory tier's refill (memory_refill.py) against torch's own answer, step by step, while real
models train: the staged copy it refills must hold what staging torch's get_state_dict holds (the
same keys in the same order, the same bytes, the same plain values), and every change to the model
or the optimizer that would make it differ must send the call down the full path."""
from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint.state_dict as dsd
from torch import nn

from constructs_lib.runtime import memory_refill
from constructs_lib.runtime.memory_staging import stage
from constructs_lib.runtime.state_of import StateOf
from tests.runtime.test_state_of import Tied, _ddp, _fsdp, _step, _tied, group  # noqa: F401 - group: a fixture

pytestmark = pytest.mark.usefixtures("group")  # a gloo group of one on 127.0.0.1


class Tier:
    """MemoryTier.snapshot's staging of a (model, optimizer), without the rest of the tier."""

    def __init__(self, **kw) -> None:
        self.said: list[str] = []
        self.refill = memory_refill.Refill(log=self.said.append, **kw)
        self._state_of = StateOf()
        self.staged = None
        self.refilled = 0  # snapshots that made no state dict
        self.full = 0

    def state_of(self, model, opt) -> dict:
        self.full += 1
        return self._state_of(model, opt)

    def snapshot(self, model, opt) -> dict:
        full = self.full
        self.staged, _ = self.refill.copy(model, opt, self.state_of, self.staged, stage)
        self.refilled += self.full == full
        return self.staged


def _same(ours, torchs, at=""):
    """Our staged copy and a copy of torch's state made now: keys, order, bytes, plain values."""
    assert type(ours) is type(torchs), at
    if isinstance(ours, dict):
        assert list(ours) == list(torchs), at
        for k in ours:
            _same(ours[k], torchs[k], f"{at}/{k}")
    elif isinstance(ours, list):
        assert len(ours) == len(torchs), at
        for i, (x, y) in enumerate(zip(ours, torchs)):
            _same(x, y, f"{at}[{i}]")
    elif isinstance(ours, torch.Tensor):
        a, b = getattr(ours, "_local_tensor", ours), getattr(torchs, "_local_tensor", torchs)
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), at
        assert not a.requires_grad and a.grad_fn is None, f"{at}: the copy holds an autograd graph (of live parameters)"
    else:
        assert type(ours) is type(torchs) and ours == torchs, at


def _torchs(model, opt) -> dict:
    msd, osd = dsd.get_state_dict(model, opt)
    return stage({"model": msd, "optim": osd}, None)[0]


@pytest.mark.parametrize("make", [_fsdp, _ddp, _tied])
def test_every_refilled_copy_is_torchs_state_while_the_model_trains(make):
    model, opt = make()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # plain values that change
    tier = Tier()
    for step in range(12):
        _step(model, opt, step)
        sched.step()
        nn.CrossEntropyLoss(weight=torch.ones(3))  # a module made outside the model: not a change to it
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    # the first call learns; with SGD's momentum the state appears at the first step, so learned again
    assert tier.refilled >= 10 and not tier.said, (tier.refilled, tier.said)


def _load_state(model, opt):
    opt.load_state_dict(opt.state_dict())  # new per-parameter states, new param groups


def _new_storage(model, opt):
    model.body.weight.data = torch.full((8, 8), 0.5)


def _new_buffer(model, opt):
    model.register_buffer("extra", torch.ones(2))


def _replaced_module(model, opt):
    torch.manual_seed(1)
    model.head = nn.Linear(8, 10, bias=False)  # its weight was the embedding's: now one of its own


def _untied(model, opt):
    model.head.weight = nn.Parameter(model.embed.weight.detach() * 2)


def _new_group(model, opt):
    model.scale = nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": [model.scale], "lr": 0.01})


def _new_state_key(model, opt):
    opt.state[model.body.weight]["seen"] = torch.zeros(1)


def _params_reordered(model, opt):
    params = opt.param_groups[1]["params"]  # the same list, its parameters swapped in place
    params[0], params[1] = params[1], params[0]


def _new_shard(model, opt):  # FSDP2 setting a sharded parameter's local shard again (reset_sharded_param)
    p = model[0].weight
    p._local_tensor = p._local_tensor.clone().add_(1.0)


@pytest.mark.parametrize("make,change", [(_tied, c) for c in (_load_state, _new_storage, _new_buffer, _replaced_module,
                                                              _untied, _new_group, _new_state_key, _params_reordered)]
                         + [(_fsdp, _new_shard)])
def test_a_change_to_the_model_or_the_optimizer_takes_the_full_path_and_the_copy_stays_torchs(make, change):
    model, opt = make()
    tier = Tier()
    for step in range(3):
        _step(model, opt, step)
        tier.snapshot(model, opt)
    assert tier.refilled == 2  # the first call learned, the next two refilled
    change(model, opt)
    assert not tier.refill.fill(model, opt), "the refill did not see the change"
    tier.refilled = 0
    for step in range(3, 6):
        _step(model, opt, step)
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 2 and not tier.said  # learned again from the full call after the change


class Extra(Tied):
    """A module whose state has a value of its own (get_extra_state): nothing the refill can source."""

    def get_extra_state(self):
        return {"seen": int(self.seen)}

    def set_extra_state(self, state):
        pass


def test_a_state_with_anything_else_gets_the_full_path_every_call():
    model = Extra()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    tier = Tier()
    for step in range(4):
        _step(model, opt, step)
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 0 and tier.refill.plan is None
    assert tier.said == ["the memory tier makes the state dict on every kept step: a plain value ('seen' of a dict) is "
                         "not the optimizer's own"], tier.said


def test_a_plan_the_check_finds_different_turns_the_refill_off_once_said():
    model, opt = _tied()
    tier = Tier(check_every=4)
    for step in range(3):  # calls 1-3: learned, then refilled
        _step(model, opt, step)
        tier.snapshot(model, opt)
    dst, src = tier.refill.plan.pairs[0]  # a plan gone wrong while in use, which no check per call sees
    tier.refill.plan.pairs[0] = (dst, src.clone())
    tier.snapshot(model, opt)  # call 4, the check: the full path, whose plan is not the one in use
    assert tier.refill.off and len(tier.said) == 1 and "refill is off" in tier.said[0], tier.said
    for _ in range(3):
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 2 and len(tier.said) == 1


def test_a_check_that_raises_is_never_the_steps_error_the_full_path_stands():
    model, opt = _tied()
    tier = Tier()
    for step in range(2):
        _step(model, opt, step)
        tier.snapshot(model, opt)
    assert tier.refilled == 1

    def broken(model, opt):
        raise RuntimeError("a container of a kind not foreseen")

    tier.refill.plan.holds = broken
    for step in range(2, 4):
        _step(model, opt, step)
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 1 and tier.refill.off and len(tier.said) == 1 and "its check or copy failed" in tier.said[0]


def _net(frozen_first: bool = False, named: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Tanh(), nn.Linear(8, 1))
    if frozen_first:
        model[0].weight.requires_grad_(False)
    opt = torch.optim.AdamW(model.named_parameters() if named else model.parameters(), lr=1e-2)
    return model, opt


def _net_step(model, opt, step: int) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def _unfrozen_after_a_monitor_read_its_state(model, opt):
    _ = [opt.state[p].get("exp_avg_sq") for p in model.parameters()]  # the defaultdict makes {} for the frozen one
    model[0].weight.requires_grad_(True)


def _empty_slot_filled(model, opt):
    model[0].bias = nn.Parameter(torch.zeros(8))  # Linear(bias=False) keeps a None slot for it


def _inserted(model, opt):
    model.insert(1, nn.Linear(8, 8).requires_grad_(False))  # writes the Sequential's dict: no hook sees it


def _deleted(model, opt):
    del model[1]  # the Tanh: the last layer's keys are 1.* now (a new dict of submodules)


def _groups_split_again(model, opt):
    w, b_w, b_b = model[0].weight, model[2].weight, model[2].bias
    opt.param_groups[0]["params"] = [w, b_b, b_w]


def _tied_through_data_then_untied(model, opt):
    model[1].weight.data = model[1].weight.data.clone()


@pytest.mark.parametrize("change,frozen_first", [(_unfrozen_after_a_monitor_read_its_state, True),
                                                 (_empty_slot_filled, False), (_inserted, False), (_deleted, False),
                                                 (_groups_split_again, False)])
def test_what_no_registration_hook_sees_takes_the_full_path_too(change, frozen_first):
    model, opt = _net(frozen_first)
    tier = Tier()
    for step in range(3):
        _net_step(model, opt, step)
        if change is _unfrozen_after_a_monitor_read_its_state:
            _ = [opt.state[p].get("exp_avg_sq") for p in model.parameters()]
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 2
    change(model, opt)
    _net_step(model, opt, 3)  # an unfrozen parameter's state fills at its first step
    assert not tier.refill.fill(model, opt), "the refill did not see the change"
    for step in range(4, 6):
        _net_step(model, opt, step)
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert not tier.said, tier.said


def test_two_parameters_over_the_same_bytes_are_both_watched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[1].weight.data = model[0].weight.data  # tied the old way: two objects, one storage
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tier = Tier()
    for step in range(3):
        _net_step(model, opt, step)
        tier.snapshot(model, opt)
    assert tier.refilled == 2
    _tied_through_data_then_untied(model, opt)
    assert not tier.refill.fill(model, opt)
    _net_step(model, opt, 3)
    _same(tier.snapshot(model, opt), _torchs(model, opt))


def test_an_optimizer_of_named_parameters_is_refilled_and_a_tensor_learning_rate_is_not():
    model, opt = _net(named=True)  # param_names in every group: a list the refill keeps as it is
    tier = Tier()
    for step in range(3):
        _net_step(model, opt, step)
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 2 and not tier.said
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2))
    tier = Tier()
    for step in range(2):
        _net_step(model, opt, step)
        _same(tier.snapshot(model, opt), _torchs(model, opt))
    assert tier.refilled == 0 and "none of the model's or the optimizer's own" in tier.said[0]
