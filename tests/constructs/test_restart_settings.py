"""-c restart=torchrun|in-process (constructs_lib/runtime/ranks.py): a bad value, or one that
cannot hold with the rest of the job (a container image, a framework's checkpoint_dir, no
command), is one line and exit 2 with nothing synthesized; in-process reaches node.env, where
the supervisor reads it; left out (or torchrun), node.env carries nothing."""
from __future__ import annotations

import pytest

import app
from constructs_lib.runtime import contract
from tests.test_bad_context import _one_line_and_no_template

CMD = {"profile": "multi-node-training", "nodes": "2", "command": "python train.py"}


@pytest.mark.parametrize("ctx, expected", [
    ({**CMD, "restart": "inprocess"}, "context restart='inprocess': allowed torchrun, in-process; closest: in-process"),
    ({**CMD, "restart": "elastic"}, "context restart='elastic': allowed torchrun, in-process; closest: in-process"),
    ({**CMD, "restart": "in-process", "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1"},
     "context restart=in-process runs the ranks in the supervisor's processes, which image= does not allow"),
    ({**CMD, "restart": "in-process", "checkpoint_dir": "outputs"},
     "context restart=in-process runs the ranks in the supervisor's processes, which checkpoint_dir= does not allow"),
    ({"profile": "multi-node-training", "restart": "in-process"}, "context restart=in-process needs the per-rank command"),
    ({**CMD, "restrat": "in-process"}, "unknown context key 'restrat'; closest: restart"),
])
def test_a_bad_value_is_one_line_and_exit_2(ctx, expected, tmp_path, capsys):
    out = tmp_path / "cdk.out"
    code = app.main(ctx, outdir=str(out))
    _one_line_and_no_template(code, capsys.readouterr().err, out, expected)


@pytest.mark.parametrize("restart, expected", [(None, None), ("torchrun", None), ("in-process", "in-process")])
def test_the_mode_reaches_node_env_only_when_it_is_in_process(restart, expected):
    import aws_cdk as cdk

    from constructs_lib.job import JobDefinition
    from dl_stacks.settings import from_context

    s = from_context({**CMD, **({"restart": restart} if restart else {})})
    assert s.job_settings.restart == (restart or "torchrun")
    stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(account="123456789012", region="us-east-1"))
    job = JobDefinition(stack, "Job", cluster="dl-x", command=s.command, restart=s.job_settings.restart)
    assert contract.parse_env(contract.env_text(job.node_env())).get(contract.ENV_RESTART) == expected
