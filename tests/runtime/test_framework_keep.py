"""framework_keep: the step a Hugging Face Trainer or Lightning kept from memory, at the moment a
collective failed in the next step (after its forward and backward, before its optimizer step), is
what the framework's own checkpoint of that step holds, and the framework's own resume reads it
and goes on exactly as from its own checkpoint (the real transformers and lightning, one process
on the CPU; test_framework_keep_ddp.py kills a real gloo peer)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from constructs_lib.runtime.framework_keep import HFKeep, LightningKeep

FAILED = "gloo: Connection closed by peer"  # what a survivor's failed all-reduce says
KEPT, LAST = 3, 5


# ---- Hugging Face Trainer ----------------------------------------------------------------------
def _hf_trainer(out: Path, *, save: bool, callbacks: list):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from tests.runtime.hf_pattern import Pattern

    torch.manual_seed(0)
    # dropout on: the failed step's forward draws from the RNG the kept step must not include
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=str(out), max_steps=LAST, per_device_train_batch_size=4, learning_rate=1e-2,
                             lr_scheduler_type="linear", save_strategy="steps" if save else "no", save_steps=KEPT,
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0,
                             logging_steps=1000)
    return Trainer(model=model, args=args, train_dataset=Pattern(), callbacks=callbacks)


def _hf_final(trainer, resume: str) -> tuple[int, dict]:
    from transformers import TrainerCallback

    started: list[int] = []

    class Start(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            started.append(state.global_step)

    trainer.add_callback(Start())
    trainer.train(resume_from_checkpoint=resume)
    return started[0], {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_a_hugging_face_step_kept_from_memory_is_the_trainers_own_checkpoint_and_resumes(tmp_path):
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    ref = _hf_trainer(tmp_path / "ref", save=True, callbacks=[])
    ref.train()
    own = tmp_path / "ref" / f"checkpoint-{KEPT}"

    keep = HFKeep()

    class PeerDies(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            keep.step_end(args, state, kw)  # as HFNoticeCallback does

        def on_pre_optimizer_step(self, args, state, control, **kw):
            if state.global_step == KEPT:  # step KEPT + 1's backward is done, its update not begun
                raise RuntimeError(FAILED)

    with pytest.raises(RuntimeError, match="gloo"):
        _hf_trainer(tmp_path / "run", save=False, callbacks=[PeerDies()]).train()
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    keep.write(str(kept_dir))
    kept = kept_dir / f"checkpoint-{KEPT}"

    assert json.loads((kept / "trainer_state.json").read_text())["global_step"] == KEPT
    want, got = load_file(own / "model.safetensors"), load_file(kept / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    o_want, o_got = (torch.load(d / "optimizer.pt", weights_only=False) for d in (own, kept))
    assert o_want["state"].keys() == o_got["state"].keys()
    for i in o_want["state"]:
        for k, v in o_want["state"][i].items():
            assert torch.equal(v, o_got["state"][i][k]), f"optimizer state {i}.{k}"
    assert torch.load(own / "scheduler.pt") == torch.load(kept / "scheduler.pt")
    r_want, r_got = (torch.load(d / "rng_state.pth", weights_only=False) for d in (own, kept))
    assert torch.equal(r_want["cpu"], r_got["cpu"]), "the RNG of step KEPT's end, not of the failed step"

    # The Trainer's own resume, from its own checkpoint and from the kept one: the same run.
    start_own, final_own = _hf_final(_hf_trainer(tmp_path / "a", save=False, callbacks=[]), str(own))
    start_kept, final_kept = _hf_final(_hf_trainer(tmp_path / "b", save=False, callbacks=[]), str(kept))
    assert start_own == start_kept == KEPT
    assert all(torch.equal(final_own[k], final_kept[k]) for k in final_own)
    assert not all(torch.equal(final_kept[k], want[k]) for k in want if k in final_kept), "it trained on"


# ---- Lightning ---------------------------------------------------------------------------------
def _lightning(tmp: Path, *, callbacks: list, save: bool):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn

    class Fit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.2), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=1e-2)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)]

    L.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16,
                                         shuffle=True, generator=torch.Generator().manual_seed(1))
    if save:
        callbacks = callbacks + [ModelCheckpoint(dirpath=str(tmp), every_n_train_steps=KEPT, save_top_k=-1)]
    trainer = L.Trainer(max_steps=LAST, accelerator="cpu", devices=1, callbacks=callbacks, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=save,
                        default_root_dir=str(tmp))
    return trainer, Fit(), loader


def test_a_lightning_step_kept_from_memory_is_its_own_checkpoint_and_resumes(tmp_path):
    from lightning.pytorch.callbacks import Callback

    trainer, module, loader = _lightning(tmp_path / "ref", callbacks=[], save=True)
    trainer.fit(module, loader)
    own = tmp_path / "ref" / f"epoch=0-step={KEPT}.ckpt"

    keep = LightningKeep()

    class PeerDies(Callback):
        def __init__(self):
            self.step = -1

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            if trainer.global_step != self.step:  # as LightningNoticeCallback does
                self.step = trainer.global_step
                keep.step_end(trainer)

        def on_before_optimizer_step(self, trainer, module, optimizer):
            if trainer.global_step == KEPT:
                raise RuntimeError(FAILED)

    trainer, module, loader = _lightning(tmp_path / "run", callbacks=[PeerDies()], save=False)
    with pytest.raises(RuntimeError, match="gloo"):
        trainer.fit(module, loader)
    keep.write(str(tmp_path))  # after Lightning's own teardown, as in the failing process
    kept = tmp_path / f"epoch=0-step={KEPT}.ckpt"

    want, got = (torch.load(p, weights_only=False) for p in (own, kept))
    assert got["global_step"] == want["global_step"] == KEPT and got["epoch"] == want["epoch"]
    assert all(torch.equal(want["state_dict"][k], got["state_dict"][k]) for k in want["state_dict"])
    assert got["loops"]["fit_loop"] == want["loops"]["fit_loop"], "the counters of step KEPT's end"
    assert got["lr_schedulers"] == want["lr_schedulers"]
    for i, s in want["optimizer_states"][0]["state"].items():
        assert all(torch.equal(v, got["optimizer_states"][0]["state"][i][k]) for k, v in s.items())

    finals = []
    for name, path in (("a", own), ("b", kept)):
        trainer, module, loader = _lightning(tmp_path / name, callbacks=[], save=False)
        trainer.fit(module, loader, ckpt_path=str(path))
        assert trainer.global_step == LAST
        finals.append({k: v.clone() for k, v in module.state_dict().items()})
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0]), "Lightning's resume: the same run"


# ---- only where each rank holds the whole state --------------------------------------------------
def test_sharded_strategies_keep_nothing_ddp_does(tmp_path):
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
    from transformers import TrainingArguments

    def hf(**kw) -> HFKeep:
        keep = HFKeep()
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kw)
        keep.step_end(args, SimpleNamespace(global_step=1), {})
        return keep

    assert hf().whole() is None
    assert "shards" in hf(fsdp=True).whole()

    def lightning(strategy) -> LightningKeep:
        keep = LightningKeep()
        keep.trainer = SimpleNamespace(strategy=strategy)
        return keep

    assert lightning(DDPStrategy()).whole() is None
    assert "FSDPStrategy is not DDP" in lightning(FSDPStrategy()).whole()
