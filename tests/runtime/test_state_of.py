"""Checkpointer.state_of (state_of.py) against torch's own get_state_dict, call by call, while
real models train: FSDP2, DDP (whose keys torch renames), tied weights with two parameter groups
and a learning-rate schedule. Reused names are used only while they give torch's answer; a
difference turns the reuse off for good."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dsd
from torch import nn

from constructs_lib.runtime import Checkpointer, state_of
from tests.runtime.free_port import free_port


@pytest.fixture
def group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def torch_calls(monkeypatch):
    """How many times torch's get_state_dict ran."""
    calls = []
    real = dsd.get_state_dict

    def counted(model, optimizers, **kw):
        calls.append(1)
        return real(model, optimizers, **kw)

    monkeypatch.setattr(dsd, "get_state_dict", counted)
    return calls


def _equal(a, b, at=""):
    """Torch's answer and ours: the same keys in the same order; optimizer state the very same
    tensors; model tensors the same values in the same memory; plain values equal."""
    assert type(a) is type(b), at
    if isinstance(a, dict):
        assert list(a) == list(b), at
        for k in a:
            _equal(a[k], b[k], f"{at}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), at
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{at}[{i}]")
    elif isinstance(a, torch.Tensor):
        la = a.to_local() if hasattr(a, "to_local") else a
        lb = b.to_local() if hasattr(b, "to_local") else b
        assert torch.equal(la, lb) and la.data_ptr() == lb.data_ptr() and la.shape == lb.shape, at
    else:
        assert a == b, at


def _mlp(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))


def _fsdp():
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _ddp():
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_mlp())
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen += 1
        return self.head(torch.tanh(self.body(self.embed(x)))).sum(dim=1)


def _tied():
    model = Tied()
    opt = torch.optim.SGD([{"params": [model.embed.weight]},
                           {"params": list(model.body.parameters()), "lr": 0.05}], lr=0.1, momentum=0.9)
    return model, opt


def _step(model, opt, step: int) -> None:
    if isinstance(model, Tied):
        x = torch.randint(0, 10, (4, 3), generator=torch.Generator().manual_seed(step))
    else:
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
    loss = (model(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("make", [_fsdp, _ddp, _tied])
def test_every_call_is_torchs_answer_while_the_model_trains(group, torch_calls, make):
    model, opt = make()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ckpt = Checkpointer()
    for step in range(12):
        _step(model, opt, step)
        sched.step()
        ours = ckpt.state_of(model, opt)
        msd, osd = dsd.get_state_dict(model, opt)
        _equal(ours, {"model": msd, "optim": osd})
    # Torch's own call inside state_of: the first (where it learns the names), then none.
    assert len(torch_calls) == 12 + 1, len(torch_calls)
    assert ckpt._state_of.off is None
    if make is _ddp:  # torch's canonical names, not DDP's
        assert all(not k.startswith("module.") for k in ours["model"]) and ours["optim"]["state"]


def _torch(model, opt) -> dict:
    return dict(zip(("model", "optim"), dsd.get_state_dict(model, opt)))


def test_torch_answers_again_every_check_and_whenever_the_model_or_optimizer_changes(group, torch_calls):
    model, opt = _tied()
    s = state_of.StateOf(check_every=4)
    got = s(model, opt)  # no optimizer state yet: torch's call makes it, and the names are learned
    assert len(torch_calls) == 1 and got["optim"]["state"] and s._for is not None
    for _ in range(7):   # calls 2..8: reused, but torch's again at the checks (4 and 8)
        s(model, opt)
    assert len(torch_calls) == 3
    extra = nn.Parameter(torch.ones(3))
    model.extra = extra
    opt.add_param_group({"params": [extra], "lr": 0.01})
    _step(model, opt, 0)
    _equal(s(model, opt), _torch(model, opt))  # new keys and parameters: torch's, learned again
    assert len(torch_calls) == 5 and "extra" in s._names and s.off is None
    _equal(s(model, opt), _torch(model, opt))
    assert len(torch_calls) == 6  # and reused


def test_a_stateless_optimizer_is_torchs_call_every_time(group, torch_calls):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: no state, ever
    s = state_of.StateOf()
    for step in range(3):
        _step(model, opt, step)
        _equal(s(model, opt), _torch(model, opt))
    assert len(torch_calls) == 6 and s.off is None and s._for is None


class WrongNames(state_of.StateOf):
    """What a torch that named parameters otherwise would leave: the names of another parameter."""

    def _learn_names(self, model, optimizer) -> None:
        super()._learn_names(model, optimizer)
        self._names = list(reversed(self._names))


def test_names_that_do_not_give_torchs_answer_are_never_used(group, torch_calls):
    model, opt = _fsdp()
    _step(model, opt, 0)
    said = []
    s = WrongNames(log=said.append)
    for _ in range(3):
        _equal(s(model, opt), _torch(model, opt))
    assert len(torch_calls) == 6 and s.off and len(said) == 1, said
    assert said[0].startswith("state_of: torch's get_state_dict on every call from now on: /optim/state: keys"), said


def test_a_difference_found_at_a_check_turns_the_reuse_off_for_good(group, torch_calls):
    model, opt = _fsdp()
    _step(model, opt, 0)
    said = []
    s = state_of.StateOf(log=said.append, check_every=3)
    s(model, opt)
    s(model, opt)
    assert len(torch_calls) == 1 and s._for is not None and not said
    s._names = list(reversed(s._names))  # names gone wrong while in use
    _equal(s(model, opt), _torch(model, opt))  # the check: torch's answer, and the difference seen
    assert s.off and len(said) == 1, said
    for _ in range(3):
        _equal(s(model, opt), _torch(model, opt))
    assert len(torch_calls) == 1 + 2 + 3 * 2  # every call torch's, beside the test's own


def test_a_model_built_again_is_learned_again_and_the_old_one_is_freed(group, torch_calls):
    import gc
    import weakref

    s = state_of.StateOf()
    model, opt = _fsdp()
    _step(model, opt, 0)
    s(model, opt)
    old = weakref.ref(model)
    model, opt = _fsdp()  # what an in-process restart does: the old model must not stay in memory
    gc.collect()
    assert old() is None
    _step(model, opt, 0)
    _equal(s(model, opt), _torch(model, opt))
    assert len(torch_calls) == 3 and s.off is None


def test_save_to_memory_makes_the_state_only_on_the_steps_it_keeps(group, torch_calls):
    model, opt = _fsdp()
    ckpt = Checkpointer()
    with pytest.raises(TypeError):
        ckpt.save_to_memory(0)
    with pytest.raises(TypeError):
        ckpt.save_to_memory(0, {"model": {}}, model=model, optimizer=opt)
    assert ckpt.save_to_memory(0, model=model, optimizer=opt, every=2) is False  # not a kept step
    assert ckpt._state_of is None and not torch_calls
