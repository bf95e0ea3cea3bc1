"""App context -> settings: every mistake is one clear line; nothing is synthesized."""
from __future__ import annotations

import pytest

from selector.errors import UserError
from stacks.selection import select
from stacks.settings import DEFAULT_PROFILE, from_context


def test_defaults_are_cheap_and_safe():
    s = from_context({})
    assert s.profile.name == DEFAULT_PROFILE and s.nodes == 1 and not s.spot
    sel = select(s)
    assert sel.pick.instance_type == "g4dn.xlarge"


def test_training_profiles_default_to_spot_and_their_node_count():
    s = from_context({"profile": "multi-node-training"})
    assert s.spot and s.nodes == 2 and s.multi_node


@pytest.mark.parametrize("ctx,expected", [
    ({"profile": "multinode"}, "unknown profile 'multinode'"),
    ({"profil": "x"}, "unknown context key 'profil'; closest: profile"),
    ({"instance-type": "p4d.24xlarge"}, "closest: instance_type"),
    ({"instance_type": "p4d.24xl"}, "closest: p4d.24xlarge"),
    ({"nodes": "two"}, "context nodes='two': expected a whole number"),
    ({"nodes": "0"}, "context nodes=0: allowed 1 to 64"),
    ({"spot": "maybe"}, "expected true or false"),
    ({"region": "us-east-9"}, "unknown region 'us-east-9'"),
    ({"vpc_id": "my-vpc"}, "expected an id like vpc-"),
    ({"job": "My Job"}, "lower-case letters, digits and dashes"),
    ({"max_price": "cheap"}, "expected USD per hour"),
    ({"max_price": "-1"}, "must be above zero"),
])
def test_bad_context(ctx, expected):
    with pytest.raises(UserError) as e:
        from_context(ctx)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_cdk_feature_flags_are_not_mistaken_for_typos():
    from_context({"@aws-cdk/core:checkSecretUsage": True, "cli-telemetry": False, "aws:cdk:enable-path-metadata": True})


def test_instance_type_must_fit_the_profile():
    with pytest.raises(UserError, match="instance_type g5.xlarge does not fit profile multi-node-training with 2 nodes: .*no EFA"):
        select(from_context({"profile": "multi-node-training", "instance_type": "g5.xlarge"}))


def test_several_nodes_need_efa_even_on_single_node_profiles():
    sel = select(from_context({"profile": "multi-gpu-training", "nodes": "3"}))
    assert sel.facts.efa
    assert all(c.facts.efa for c in sel.alternates)


def test_alternates_are_interchangeable_with_the_pick():
    sel = select(from_context({"profile": "multi-node-training"}))
    for c in sel.alternates:
        assert c.facts.processes_per_node == sel.facts.processes_per_node
        assert c.facts.architecture == sel.facts.architecture
