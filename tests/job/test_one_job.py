"""Issue 34 item 6: a multi-node command that cannot form one job (plain python, no launcher) is
warned with the fix; every real launcher, and a script that starts its ranks itself, is not."""
from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Annotations, Match

from constructs_lib.job_rules import one_job_problem

WARNED = ["python train.py", "python3 -u train.py --lr 3e-4", "FOO=1 exec python train.py",
          "cd /scratch/work && python train.py", "uv run python train.py", "python -m mypkg.train",
          "python3.11 train.py 2>&1 | tee out.log", "pip install -r requirements.txt\npython train.py\n"]
ONE_JOB = ["dl-torchrun train.py", "torchrun --nnodes $NNODES --nproc-per-node 8 train.py",
           "python -m torch.distributed.run --nproc-per-node 8 train.py", "accelerate launch train.py",
           "deepspeed --hostfile h train.py", "pip install -r requirements.txt && dl-torchrun train.py",
           "uv run torchrun train.py", "/usr/bin/env torchrun train.py", "mpirun -np 16 python train.py",
           "set -e\nexport NCCL_DEBUG=INFO\ndl-torchrun train.py --epochs 3\n",
           "/opt/launch.sh", "bash run.sh",  # not in the code (the image's, say): not judged
           "python -c 'print(1)' 'unclosed"]


@pytest.mark.parametrize("command", WARNED)
def test_plain_python_on_several_nodes_is_warned_with_the_fix(command):
    problem = one_job_problem(command, 2)
    assert problem and "2 unrelated copies" in problem and '-c command="dl-torchrun train.py"' in problem
    assert one_job_problem(command, 1) is None, "one node: python is the whole job"


@pytest.mark.parametrize("command", ONE_JOB)
def test_launchers_form_one_job(command):
    assert one_job_problem(command, 4) is None


def test_what_a_script_in_the_code_runs_decides(tmp_path: Path):
    (tmp_path / "plain.sh").write_text("#!/bin/bash\nset -e\npython train.py \"$@\"\n")
    (tmp_path / "good.sh").write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 train.py\n")
    (tmp_path / "fit.py").write_text("import torch\nfrom lightning.pytorch import Trainer\nTrainer(num_nodes=2).fit()\n")
    (tmp_path / "train.py").write_text("import torch\n")
    assert "unrelated copies" in one_job_problem("bash plain.sh", 2, str(tmp_path))
    assert one_job_problem("bash good.sh", 2, str(tmp_path)) is None
    assert one_job_problem("./good.sh", 2, str(tmp_path)) is None
    # Lightning starts each node's ranks itself from NODE_RANK and MASTER_ADDR: one job
    assert one_job_problem("python fit.py", 2, str(tmp_path)) is None
    assert "unrelated copies" in one_job_problem("python train.py", 2, str(tmp_path))


def test_the_warning_is_in_the_summary_and_the_cdk_annotations(capsys):
    from dl_stacks.settings import from_context
    from dl_stacks.training_stack import TrainingStack

    ctx = {"profile": "dev-prototyping", "nodes": "2", "spot": "true", "job": "copies", "command": "python train.py"}
    stack = TrainingStack.for_settings(cdk.App(), from_context(ctx), quiet=True)
    assert "\n  warning: command 'python train.py' on 2 nodes runs a plain python process per node" in stack.summary()
    Annotations.from_stack(stack).has_warning("/dl-copies", Match.string_like_regexp(
        r"^command 'python train.py' on 2 nodes .* Fix: start it with a launcher"))
