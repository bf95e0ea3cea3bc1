"""A one-process job for tests/runtime/test_survivor.py: trains a model with a BatchNorm layer,
keeps its state on failure, and ends as argv[1] says after step 4's should_checkpoint:
  peer         the next step's forward runs, then a gloo-like error (as a dead peer's all-reduce gives)
  mid-update   the next step's optimizer step runs, then the error (the state is step 5's, not 4's)
  bug          the next step's forward runs, then the job's own ValueError
  sigterm      the next step's forward runs, then SIGTERM (the supervisor stopping the run)
  sigterm-mid-update  SIGTERM right after step 5's optimizer step, then step 5's should_checkpoint
The exact state the test expects kept (step 4's; step 5's for sigterm-mid-update) is written to
<dir>/expected.pt."""
import os
import signal
import sys

import torch
from torch import nn

from constructs_lib.runtime import Checkpointer

how, directory = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)


def state() -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict()}


ckpt = Checkpointer(directory)
ckpt.keep_on_failure(lambda d: torch.save(state(), os.path.join(d, "model.pt")), model=model)


def step(s: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(s))
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


for s in range(5):
    step(s)
    ckpt.should_checkpoint(s, every=0)
torch.save(state(), os.path.join(directory, "expected.pt"))
if how == "sigterm-mid-update":
    step(5)
    os.kill(os.getpid(), signal.SIGTERM)  # held: an optimizer step has begun since step 4
    torch.save(state(), os.path.join(directory, "expected.pt"))
    ckpt.should_checkpoint(5, every=0)  # step 5 complete: the stop happens here
    raise SystemExit("the SIGTERM was never acted on")
x = torch.randn(16, 4, generator=torch.Generator().manual_seed(5))
model(x)  # step 5's forward: BatchNorm's running statistics move
if how == "mid-update":
    model(x).pow(2).mean().backward()
    opt.step()
if how == "bug":
    raise ValueError("the job's own bug")
if how == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:36739: "
                   "Connection reset by peer")
