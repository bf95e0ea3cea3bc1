"""A Hugging Face Trainer's or Lightning's completed step, kept from memory when a peer dies (issue 37).

With DDP every rank holds the whole model and optimizer state, and survivor.Keeper already knows
when that state is exactly the last completed step (no optimizer step began since). The notice
callbacks (callbacks.py) give it a write function that writes the step in the framework's OWN
checkpoint format, so that the framework's own resume reads it:

    Hugging Face   checkpoint-N/ as Trainer._save_checkpoint writes it: the model's
                   save_pretrained (or model.safetensors), training_args.bin, optimizer.pt,
                   scheduler.pt, scaler.pt (mixed precision), rng_state_R.pth, and
                   trainer_state.json last (the Trainer's own marker of a whole checkpoint);
                   read back by train(resume_from_checkpoint=...) / get_last_checkpoint.
    Lightning      epoch=E-step=N.ckpt, Lightning's checkpoint dict (dump_checkpoint) with the
                   loops' state of step N's end, as ModelCheckpoint saves it there; read back by
                   fit(ckpt_path=...) (the supervisor adds last.ckpt when it places the step).

The write runs in the failing process after the collective failed: the framework's own save
cannot be called there (both save methods wait on the dead peer in a barrier or a flops
gather, and only global rank 0 writes), so the same files are written from the same objects
without a collective. What the failed step changed before the collective (the RNG streams, the
loops' counters) is captured at each step's end; the weights and the optimizer are the step's
own until an optimizer step begins, which the Keeper watches. The Keeper then names the save
.survivor-step-N in the node's checkpoint directory; the supervisor promotes and sends it, and
before the next generation places its entry in the framework's directory (framework_checkpoints).
DDP only: a strategy that shards the state (FSDP, DeepSpeed) leaves a part on each rank, and the
callbacks then keep nothing (and say so once).
"""
from __future__ import annotations

import copy
import os
import random
from typing import Any, Optional


def _rng() -> dict:
    """The RNG streams as the Trainer's _save_rng_state records them (CPU, CUDA where present)."""
    import numpy as np
    import torch

    out = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.random.get_rng_state_all()
    return out


def has_running_stats(model: Any) -> bool:
    """Whether forward changes the model's buffers (BatchNorm and the like): the Keeper then puts
    them back to the completed step's, at the cost of a copy of them every step."""
    from torch.nn.modules.batchnorm import _NormBase

    return model is not None and any(isinstance(m, _NormBase) and m.track_running_stats for m in model.modules())


class HFKeep:
    """The Trainer's objects and the RNG at the last step's end (on_step_end: after the optimizer
    and scheduler stepped and global_step counted it)."""

    marks_updates = False  # the Trainer calls optimizer.step() after backward: the Keeper's pre-hook marks it
    takes_sigterm = False  # the Trainer installs no SIGTERM handler

    def __init__(self) -> None:
        self.at: Optional[dict] = None

    def step_end(self, args: Any, state: Any, kwargs: dict) -> None:
        self.at = {"args": args, "state": state, "model": kwargs.get("model"), "optimizer": kwargs.get("optimizer"),
                   "scheduler": kwargs.get("lr_scheduler"), "processing_class": kwargs.get("processing_class"),
                   "step": state.global_step, "rng": _rng()}

    def model(self) -> Any:
        return self.at["model"] if self.at else None

    def whole(self) -> Optional[str]:
        """None when each rank holds the whole state (DDP), else why not."""
        args = self.at["args"] if self.at else None
        if args is not None and (getattr(args, "fsdp", None) or getattr(args, "deepspeed", None)
                                 or getattr(args, "parallelism_config", None)):
            return "the Trainer shards its state (FSDP, DeepSpeed or a parallelism config)"
        return None

    def write(self, directory: str) -> None:
        import torch
        from transformers import PreTrainedModel

        at = self.at
        if at is None or at["state"].global_step != at["step"]:
            raise RuntimeError("the Trainer's state is not that of the last completed step")
        out = os.path.join(directory, f"checkpoint-{at['step']}")
        os.makedirs(out)
        model, args = at["model"], at["args"]
        if isinstance(model, PreTrainedModel):
            # save_pretrained writes only on torch.distributed's rank 0; the survivor may be any
            # rank, and under DDP its replica is whole. Its own answer, for this one call.
            model.should_save_on_this_rank = lambda is_main_process: True
            try:
                model.save_pretrained(out)
            finally:
                del model.should_save_on_this_rank
        else:  # as Trainer._save does for a model of its own
            import safetensors.torch

            safetensors.torch.save_file(model.state_dict(), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        if at["processing_class"] is not None:
            at["processing_class"].save_pretrained(out)
        torch.save(args, os.path.join(out, "training_args.bin"))
        torch.save(at["optimizer"].state_dict(), os.path.join(out, "optimizer.pt"))
        if at["scheduler"] is not None:
            torch.save(at["scheduler"].state_dict(), os.path.join(out, "scheduler.pt"))
        scaler = getattr(at["optimizer"], "scaler", None)  # accelerate's AcceleratedOptimizer under fp16
        if scaler is not None:
            torch.save(scaler.state_dict(), os.path.join(out, "scaler.pt"))
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        torch.save(at["rng"], os.path.join(out, f"rng_state_{rank}.pth" if world > 1 else "rng_state.pth"))
        at["state"].save_to_json(os.path.join(out, "trainer_state.json"))  # last, as the Trainer: its marker


class LightningKeep:
    """The trainer and its loops' state at the last optimizer step's end (on_train_batch_end, where
    ModelCheckpoint saves too: the same counters it would write)."""

    # Lightning runs forward and backward inside optimizer.step(closure): the callback marks the
    # update's start at on_before_optimizer_step, after the backward's all-reduce.
    marks_updates = True
    # Lightning's own SIGTERM handler (2.6: SignalConnector._sigterm_notifier_fn) broadcasts from
    # rank 0 inside the handler. A run is stopped with SIGTERM because a peer died, often rank 0's
    # node: the broadcast then fails wherever the signal lands, mid-update included, and nothing
    # could be kept (measured: one of two framework-drill runs). The Keeper's handler replaces it:
    # mid-update it waits for the step's end, then stops with that step in hand.
    takes_sigterm = True

    def __init__(self) -> None:
        self.trainer: Any = None
        self.at: Optional[dict] = None

    def step_end(self, trainer: Any) -> None:
        self.trainer = trainer
        self.at = {"loops": copy.deepcopy(trainer.fit_loop.state_dict()), "epoch": trainer.current_epoch,
                   "step": trainer.global_step}

    def model(self) -> Any:
        return self.trainer.lightning_module if self.trainer is not None else None

    def whole(self) -> Optional[str]:
        """None when each rank holds the whole state (DDP, or one device), else why not."""
        strategy = type(self.trainer.strategy).__name__ if self.trainer is not None else ""
        if strategy not in ("DDPStrategy", "SingleDeviceStrategy"):
            return f"Lightning's {strategy or 'strategy'} is not DDP (its state may be sharded)"
        return None

    def write(self, directory: str) -> None:
        import torch

        at, trainer = self.at, self.trainer
        if at is None or trainer.global_step != at["step"]:
            raise RuntimeError("Lightning's trainer is not at the last completed step")
        # dump_checkpoint collects the state without a collective (trainer.save_checkpoint waits on
        # every rank in a barrier and writes on global rank 0 only).
        ckpt = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        ckpt["loops"]["fit_loop"] = at["loops"]
        ckpt["epoch"], ckpt["global_step"] = at["epoch"], at["step"]
        path = os.path.join(directory, f"epoch={at['epoch']}-step={at['step']}.ckpt")
        torch.save(ckpt, path)
