"""One rank of a two-node DDP job (one rank a node, gloo on the CPU, each node its own torchrun)
for tests/runtime/test_framework_keep_ddp.py: a Hugging Face Trainer (hf) or Lightning (lightning)
script with nothing of dl-launcher but its one-line notice callback. Global rank 1 records the
model after every step (the reference the kept step must equal); global rank 0 kills itself
(SIGKILL) as step --die-at + 1 begins, so rank 1's next all-reduce fails: a node that dies
without a word, and the survivor is not rank 0 (where the frameworks' own saves write).

    framework_keep_job.py hf|lightning|lightning-term REFERENCE_DIR DIE_AT

lightning-term: the kill lands mid-update instead. Global rank 1, in step DIE_AT + 1's
on_before_optimizer_step (its all-reduce done, its update about to begin), SIGKILLs rank 0 and
then gets the SIGTERM that torchrun or the supervisor sends a run being stopped. Lightning's own
SIGTERM handler broadcasts from rank 0 inside the handler, which fails on the dead rank mid-update.
"""
import os
import signal
import sys
import time

import torch

kind, reference, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ["RANK"])


def record(step: int, state: dict) -> None:
    if rank == 1:
        torch.save({k: v.detach().clone() for k, v in state.items()}, os.path.join(reference, f"step-{step}.pt"))


def die(step: int) -> None:
    if rank == 0 and step == die_at:
        os.kill(os.getpid(), signal.SIGKILL)


if kind == "hf":
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from constructs_lib.runtime.callbacks import HFNoticeCallback
    from tests.runtime.hf_pattern import Pattern

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            record(state.global_step, model.state_dict())

        def on_step_begin(self, args, state, control, **kw):
            die(state.global_step)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir="outputs", max_steps=die_at + 3, per_device_train_batch_size=4,
                             learning_rate=1e-2, save_strategy="no", report_to=[], use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True, seed=0, logging_steps=1000)
    Trainer(model=model, args=args, train_dataset=Pattern(), callbacks=[Record(), HFNoticeCallback()]).train()
else:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch import nn

    from constructs_lib.runtime.callbacks import LightningNoticeCallback

    class Fit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

        def on_before_optimizer_step(self, optimizer):
            if kind == "lightning-term" and rank == 1 and self.trainer.global_step == die_at:
                with open(os.path.join(reference, "rank-0.pid")) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
                time.sleep(1)  # its sockets closed: the next receive from it fails at once
                os.kill(os.getpid(), signal.SIGTERM)  # the run being stopped, mid-update

    class Record(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            record(trainer.global_step, module.state_dict())

        def on_train_batch_start(self, trainer, module, batch, i):
            if kind == "lightning":
                die(trainer.global_step)
            elif rank == 0 and trainer.global_step == 0:
                with open(os.path.join(reference, "rank-0.pid"), "w") as f:
                    f.write(str(os.getpid()))

    if kind == "lightning-term" and rank == 1:  # the script's own handler: Lightning's calls it, so must ours
        signal.signal(signal.SIGTERM, lambda *_: open(os.path.join(reference, "user-sigterm"), "w").close())
    L.seed_everything(0)
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    trainer = L.Trainer(max_steps=die_at + 3, accelerator="cpu", devices=1, num_nodes=2, strategy="ddp",
                        callbacks=[Record(), LightningNoticeCallback(),
                                   ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=1000)],
                        logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Fit(), loader)
