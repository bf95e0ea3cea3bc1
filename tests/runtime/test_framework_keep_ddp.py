"""A two-node DDP job of the real Hugging Face Trainer or Lightning (one torchrun per node, gloo)
loses the node of global rank 0 to SIGKILL mid-training: the survivor's notice callback keeps the last completed step
from memory, in the framework's own format, under the node's checkpoint directory as a survivor
save (what the supervisor promotes and sends); the framework's own resume reads it back at that
step with the weights the job had there."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from constructs_lib.runtime import survivor
from tests.runtime.free_port import free_port

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("framework_keep_job.py")
DIE_AT = 3


def _run(kind: str, root: Path) -> list[subprocess.CompletedProcess]:
    port = free_port()
    (root / "ref").mkdir(parents=True)
    procs = []
    for node in range(2):
        d = root / f"node-{node}"
        (d / "work").mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DL_", "TORCHELASTIC"))}
        env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DL_GENERATION="3", DL_RUN_DIR=str(d / "run"),
                   DL_CHECKPOINT_DIR=str(d / "ckpt"), DL_NOTICE_FILE=str(d / "run" / "notice.json"))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
               str(JOB), kind, str(root / "ref"), str(DIE_AT)]
        procs.append(subprocess.Popen(cmd, cwd=d / "work", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    out = []
    try:
        for p in procs:
            stdout, _ = p.communicate(timeout=240)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    finally:
        for p in procs:
            p.kill()
    return out


def _kept(root: Path, step: int = DIE_AT) -> Path:
    saves = survivor.survivor_saves(str(root / "node-1" / "ckpt"))
    assert [s for s, _p in saves] == [step], saves
    assert not survivor.survivor_saves(str(root / "node-0" / "ckpt")), "the dead node wrote nothing"
    return Path(saves[0][1])


def test_a_hugging_face_ddp_job_keeps_its_last_step_when_a_node_is_killed(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    runs = _run("hf", tmp_path)
    assert runs[1].returncode != 0 and f"kept step {DIE_AT} from memory" in runs[1].stdout, runs[1].stdout[-3000:]
    kept = _kept(tmp_path)
    assert sorted(p.name for p in kept.iterdir()) == [f"checkpoint-{DIE_AT}"]
    ckpt = kept / f"checkpoint-{DIE_AT}"
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state_1.pth"} <= {
        p.name for p in ckpt.iterdir()}

    # The Trainer's own resume, one process: it starts at the kept step with the job's weights there.
    torch.manual_seed(1)  # other initial weights: what is compared below came from the checkpoint
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=str(tmp_path / "resume"), max_steps=DIE_AT, per_device_train_batch_size=4,
                             save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": torch.zeros(16, dtype=torch.long)}])
    trainer.train(resume_from_checkpoint=str(ckpt))
    assert trainer.state.global_step == DIE_AT
    want = torch.load(tmp_path / "ref" / f"step-{DIE_AT}.pt")
    got = trainer.model.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize("kind", ["lightning", "lightning-term"])
def test_a_lightning_ddp_job_keeps_its_last_step_when_a_node_is_killed(tmp_path, kind):
    """lightning: killed as a step begins; lightning-term: killed mid-update, and the survivor is
    stopped (SIGTERM) there: it finishes that update and keeps the step it completes."""
    import lightning as L
    from torch import nn

    step = DIE_AT if kind == "lightning" else DIE_AT + 1
    runs = _run(kind, tmp_path)
    assert runs[1].returncode != 0 and f"kept step {step} from memory" in runs[1].stdout, runs[1].stdout[-3000:]
    kept = _kept(tmp_path, step)
    assert sorted(p.name for p in kept.iterdir()) == [f"epoch=0-step={step}.ckpt"]
    if kind == "lightning-term":
        assert (tmp_path / "ref" / "user-sigterm").exists(), "the script's own SIGTERM handler ran too"

    class Fit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch, i):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    torch.manual_seed(1)
    module = Fit()
    trainer = L.Trainer(max_steps=step, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64, 4)), batch_size=16)
    trainer.fit(module, loader, ckpt_path=str(kept / f"epoch=0-step={step}.ckpt"))
    assert trainer.global_step == step
    want = torch.load(tmp_path / "ref" / f"step-{step}.pt")
    got = module.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
