"""-c hang_timeout= and -c first_step_timeout=: what a node takes for a hang while training
(runtime/stall.py). A bad value is one line and exit 2 with nothing synthesized; a good one
reaches node.env, where the node's watch reads it; left out, node.env carries nothing and the
runtime's stated defaults hold."""
from __future__ import annotations

import pytest

import app
from constructs_lib.runtime import contract
from constructs_lib.runtime.stall import StallSettings
from dl_stacks.settings import from_context
from tests.constructs.test_health_gate_env import _node
from tests.test_bad_context import _one_line_and_no_template


@pytest.mark.parametrize("ctx, expected", [
    ({"hang_timeout": "5"}, "context hang_timeout=5: allowed 30 to 86400; closest: 30"),
    ({"hang_timeout": "ten"}, "context hang_timeout='ten': expected a whole number from 30 to 86400"),
    ({"first_step_timeout": "90.5"}, "context first_step_timeout='90.5'"),
    ({"hang_timout": "600"}, "unknown context key 'hang_timout'; closest: hang_timeout"),
])
def test_a_bad_value_is_one_line_and_exit_2(ctx, expected, tmp_path, capsys):
    out = tmp_path / "cdk.out"
    code = app.main({"profile": "multi-node-training", **ctx}, outdir=str(out))
    _one_line_and_no_template(code, capsys.readouterr().err, out, expected)


def test_the_values_reach_node_env_and_the_nodes_watch():
    s = from_context({"hang_timeout": "600", "first_step_timeout": "3600"})
    node = _node("p5.48xlarge", multi_node=True)
    node.enable_health_gate(s.health_check, hang=s.hang_timeout, first_step=s.first_step_timeout)
    watch = StallSettings.from_env(contract.parse_env(node.node_env()), log=pytest.fail)
    assert (watch.hang, watch.first_step) == (600.0, 3600.0)


def test_left_out_node_env_carries_nothing_and_the_defaults_hold():
    s = from_context({})
    assert (s.hang_timeout, s.first_step_timeout) == (None, None)
    node = _node("p5.48xlarge", multi_node=True)
    node.enable_health_gate(s.health_check, hang=s.hang_timeout, first_step=s.first_step_timeout)
    env = contract.parse_env(node.node_env())
    assert contract.ENV_HANG_SECONDS not in env and contract.ENV_FIRST_STEP_SECONDS not in env
    watch = StallSettings.from_env(env)
    assert (watch.hang, watch.first_step) == (contract.HANG_SECONDS_DEFAULT, contract.FIRST_STEP_SECONDS_DEFAULT)
