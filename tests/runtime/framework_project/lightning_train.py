"""A plain PyTorch Lightning script, as users write them: nothing from dl-launcher.

A small regression model on synthetic data; ModelCheckpoint saves every --save-steps into
--ckpt-dir (`epoch=E-step=S.ckpt` plus `last.ckpt`, Lightning's own rotation) and `fit` resumes
with ckpt_path="last". With --callback it adds dl-launcher's one-line notice callback, if the
runtime is importable.
"""
import argparse
import json
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--ckpt-dir", default="checkpoints")
p.add_argument("--max-steps", type=int, default=60)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, so a test can act mid-run")
p.add_argument("--events", default=None, help="a JSON line per step, per process")
p.add_argument("--callback", action="store_true")
args = p.parse_args()


class Fit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Events(Callback):
    """The user's own progress log (a test reads it)."""

    def _emit(self, trainer, **kw):
        if args.events:
            with open(args.events, "a") as f:
                f.write(json.dumps({"rank": trainer.global_rank, "t": time.time(),
                                    "gen": os.environ.get("DL_GENERATION", "0"), **kw}) + "\n")

    def on_train_start(self, trainer, module):
        self._emit(trainer, event="start", step=trainer.global_step)

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        time.sleep(args.sleep)
        self._emit(trainer, event="step", step=trainer.global_step)


g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 4, generator=g)
y = x.sum(dim=1, keepdim=True) * 0.5 + 1.0
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True,
                                     generator=torch.Generator().manual_seed(1))
callbacks = [Events(), ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.save_steps,
                                       save_top_k=-1 if False else 1, save_last=True)]
if args.callback:
    try:
        from constructs_lib.runtime.callbacks import LightningNoticeCallback
        callbacks.append(LightningNoticeCallback())
    except ImportError:
        pass
L.seed_everything(0)
trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                    num_nodes=int(os.environ.get("NNODES", os.environ.get("GROUP_WORLD_SIZE", 1)) or 1),
                    strategy="ddp" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else "auto",
                    callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Fit(), loader, ckpt_path="last")
if trainer.is_global_zero:
    print(f"final step {trainer.global_step} train_loss {float(trainer.callback_metrics['train_loss']):.4f}", flush=True)
