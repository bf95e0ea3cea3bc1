"""One line in a Hugging Face or Lightning script makes a spot notice cost no steps.

    from constructs_lib.runtime.callbacks import HFNoticeCallback          # Hugging Face Trainer
    trainer = Trainer(..., callbacks=[HFNoticeCallback()])

    from constructs_lib.runtime.callbacks import LightningNoticeCallback   # PyTorch Lightning
    trainer = L.Trainer(..., callbacks=[LightningNoticeCallback()])

After every optimizer step (HF) or batch (Lightning) every rank looks at the node's notice
(DL_NOTICE_FILE: one stat) and the ranks agree with one all-reduce over a gloo group, as
`Checkpointer.should_checkpoint` does: a termination notice on any node makes every rank save
that same step into the framework's own checkpoint directory and stop; a rebalance
recommendation makes them save once and carry on. The supervisor then uploads that save (with
`-c checkpoint_dir=` naming the directory) before AWS takes the node, and the next generation
resumes from it. Outside a dl-launcher node they do nothing, and say so once.

Under DDP they also keep the last completed step when a peer dies without notice (a hard kill):
each surviving node's first rank writes it from memory in the framework's own format
(framework_keep.py), and the next generation resumes from it with the framework's own resume
(HF `resume_from_checkpoint`, Lightning `ckpt_path`). A hard kill then costs at most the step in
flight instead of everything since the last save. `keep_on_failure=False` turns that off.

Neither framework is imported until one of the two names is used.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from . import steps

_warned: set[str] = set()


class _Notices:
    """The agreed notice flags of every rank (a Checkpointer's), or nothing off a node."""

    def __init__(self, what: str, keep: Any = None) -> None:
        self.what, self.keep = what, keep  # keep: framework_keep's HFKeep / LightningKeep, or None
        self.managed = os.environ.get("DL_GENERATION") is not None
        self._ckpt: Any = None
        self._kept = False  # whether check() has set keeping up (it needs the first step's end)
        if not self.managed and what not in _warned:
            _warned.add(what)
            print(f"dl-launcher: {what} does nothing here: not a dl-launcher node (no DL_GENERATION)",
                  file=sys.stderr, flush=True)

    def keeper(self) -> Any:
        """survivor.Keeper once this process keeps its step on a peer's death, else None."""
        k = self._ckpt._keeper if self._ckpt is not None else None
        return k if k is not None and k.write is not None else None

    def begin(self) -> None:
        """At training's start: the Checkpointer made then announces the rank, so a hang before the
        first step is one (stall.py: first_step_timeout), in a boot's first run too."""
        if self.managed and self._ckpt is None:
            from .checkpointer import Checkpointer

            self._ckpt = Checkpointer()

    def check(self, step: int) -> Optional[str]:
        """Collective: "termination", "rebalance" or None, the same on every rank."""
        if not self.managed:
            return None
        if not self._kept:
            self._kept = True
            self.begin()
            if self.keep is not None:
                from .framework_keep import has_running_stats

                why = self.keep.whole()
                model = self.keep.model()
                if why is None and self._ckpt._keeper is not None:  # the Checkpointer's, as keep_on_failure uses
                    self._ckpt._keeper.enable(self.keep.write, model=model if has_running_stats(model) else None,
                                              marks_updates=self.keep.marks_updates,
                                              take_sigterm=self.keep.takes_sigterm)
                elif self._ckpt.rank == 0:
                    print(f"dl-launcher: {self.what} keeps no step from memory on a peer's death: {why}; "
                          "a hard kill costs the steps since the newest checkpoint", file=sys.stderr, flush=True)
        return self._ckpt.reason if self._ckpt.should_checkpoint(step, every=0) else None


def _hf_callback() -> type:
    from transformers import TrainerCallback

    class HFNoticeCallback(TrainerCallback):
        """Saves at the next step and stops on a termination notice (on any node); saves once on
        a rebalance recommendation. The Trainer writes checkpoint-N into its output_dir."""

        def __init__(self, *, keep_on_failure: bool = True) -> None:
            from .framework_keep import HFKeep

            self._notices = _Notices("HFNoticeCallback", HFKeep() if keep_on_failure else None)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self._notices.begin()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if not self._notices.managed:
                return control
            if self._notices.keep is not None:
                self._notices.keep.step_end(args, state, kwargs)  # before the check: it says the step completed
            reason = self._notices.check(state.global_step)
            if reason:
                control.should_save = True
                if reason == "termination":
                    control.should_training_stop = True
            return control

        def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            steps.busy()  # an evaluation is no hang (stall.py), however long it runs between steps
            return control

    return HFNoticeCallback


def _lightning_callback() -> type:
    try:
        from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    except ImportError:  # the standalone package
        from pytorch_lightning.callbacks import Callback, ModelCheckpoint

    class LightningNoticeCallback(Callback):
        """Saves `epoch=E-step=S.ckpt` into the first ModelCheckpoint's dirpath at the next batch
        and stops on a termination notice (on any node); saves once on a rebalance recommendation."""

        def __init__(self, *, keep_on_failure: bool = True) -> None:
            from .framework_keep import LightningKeep

            self._notices = _Notices("LightningNoticeCallback", LightningKeep() if keep_on_failure else None)
            self._step = -1

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self._notices.begin()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            # Only where an optimizer step ended (gradient accumulation: not every batch); the step
            # advances alike on every rank, so every rank takes part in the same agreements.
            if not self._notices.managed or trainer.global_step == self._step:
                return
            self._step = trainer.global_step
            if self._notices.keep is not None:
                self._notices.keep.step_end(trainer)
            reason = self._notices.check(trainer.global_step)
            if not reason:
                return
            cb = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath), None)
            if cb is None:
                raise RuntimeError("LightningNoticeCallback needs a ModelCheckpoint(dirpath=...): the directory "
                                   "-c checkpoint_dir names")
            # Collective under DDP: every rank calls it, global rank 0 writes.
            trainer.save_checkpoint(os.path.join(cb.dirpath, f"epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt"))
            if reason == "termination":
                trainer.should_stop = True

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            # After the closure's forward and backward (the all-reduce done), before the update:
            # where the state stops being the last completed step's (framework_keep.LightningKeep).
            keeper = self._notices.keeper()
            if keeper is not None:
                keeper.update_begins()

        def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
            steps.busy()  # a validation is no hang (stall.py), however long it runs between steps

    return LightningNoticeCallback


_MAKERS = {"HFNoticeCallback": _hf_callback, "LightningNoticeCallback": _lightning_callback}
_made: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name not in _MAKERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        _made[name] = _MAKERS[name]()
    return _made[name]



