"""A plain Hugging Face Trainer script, as users write them: nothing from dl-launcher.

A tiny GPT-2 built from a config (nothing from the hub) learns a synthetic token pattern. It saves
every --save-steps into --output-dir (`checkpoint-N/`, the Trainer's own format and rotation) and
resumes from the newest one there with transformers' own get_last_checkpoint. With --callback it
adds dl-launcher's one-line notice callback, if the runtime is importable.
"""
import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--output-dir", default="outputs")
p.add_argument("--max-steps", type=int, default=60)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--save-total-limit", type=int, default=2)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, so a test can act mid-run")
p.add_argument("--events", default=None, help="a JSON line per step, per process")
p.add_argument("--callback", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
SEQ = 16


class Pattern(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        ids = torch.tensor([(i + k) % 50 for k in range(SEQ)])
        return {"input_ids": ids, "labels": ids}


class Events(TrainerCallback):
    """The user's own progress log (a test reads it): which step each process started from and did."""

    def _emit(self, **kw):
        if args.events:
            with open(args.events, "a") as f:
                f.write(json.dumps({"rank": int(os.environ.get("RANK", 0)), "t": time.time(),
                                    "gen": os.environ.get("DL_GENERATION", "0"), **kw}) + "\n")

    def on_train_begin(self, a, state, control, **kw):
        self._emit(event="start", step=state.global_step)

    def on_step_end(self, a, state, control, **kw):
        time.sleep(args.sleep)
        self._emit(event="step", step=state.global_step)

    def on_save(self, a, state, control, **kw):
        self._emit(event="save", step=state.global_step)


model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))
targs = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                          learning_rate=1e-3, save_strategy="steps", save_steps=args.save_steps,
                          save_total_limit=args.save_total_limit, logging_steps=10, report_to=[],
                          use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
callbacks = [Events()]
if args.callback:
    try:
        from constructs_lib.runtime.callbacks import HFNoticeCallback
        callbacks.append(HFNoticeCallback())
    except ImportError:
        pass
trainer = Trainer(model=model, args=targs, train_dataset=Pattern(), callbacks=callbacks)
last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
result = trainer.train(resume_from_checkpoint=last)
if trainer.is_world_process_zero():
    print(f"final step {trainer.state.global_step} train_loss {result.training_loss:.4f}", flush=True)
