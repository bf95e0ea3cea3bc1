"""One interchangeability rule: which type may replace the pick for the same job. The expected
answers come from the hardware (AWS's instance pages: p5 = 8 x H100 80 GB, p5en = 8 x H200 141 GB,
p4d = 8 x A100 40 GB, p4de = 8 x A100 80 GB, p5e and p5en both 8 x H200 141 GB), not from the code."""
from __future__ import annotations

import pytest

from dl_selector.catalog import load_catalog
from dl_selector.interchange import RULES, interchangeable


@pytest.fixture(scope="module")
def t():
    return load_catalog().get


def test_the_rules_are_named_once():
    assert RULES == ("same-accelerator", "same-count")


@pytest.mark.parametrize("pick,other", [
    ("p5.48xlarge", "p5en.48xlarge"),      # H100 80 GB vs H200 141 GB
    ("p5en.48xlarge", "p5.48xlarge"),
    ("p4d.24xlarge", "p4de.24xlarge"),     # same A100, 40 vs 80 GB
    ("p4de.24xlarge", "p4d.24xlarge"),
    ("p6-b200.48xlarge", "p4d.24xlarge"),  # the issue: a B200 cluster must never get an A100 node
    ("p6-b200.48xlarge", "p6-b300.48xlarge"),
])
def test_multi_node_keeps_model_and_memory_by_default(t, pick, other):
    why = interchangeable(t(pick), t(other), multi_node=True)
    assert why and "\n" not in why and "same-count" in why, why


@pytest.mark.parametrize("pick,other", [("p5.48xlarge", "p5en.48xlarge"), ("p4d.24xlarge", "p4de.24xlarge"),
                                        ("p6-b200.48xlarge", "p4d.24xlarge")])
def test_same_count_widens_to_any_model_with_the_same_world_size(t, pick, other):
    assert interchangeable(t(pick), t(other), multi_node=True, rule="same-count") is None


def test_same_accelerator_types_are_interchangeable(t):
    # p5e and p5en: both 8 x H200 141 GB on x86 with CUDA; their EFA layouts differ, but the
    # whole cluster moves, so each type brings its own.
    assert interchangeable(t("p5e.48xlarge"), t("p5en.48xlarge"), multi_node=True) is None
    assert interchangeable(t("trn1.32xlarge"), t("trn1n.32xlarge"), multi_node=True) is None


def test_world_size_holds_even_for_one_node(t):
    # one node is the whole job: another GPU count would resume with another global batch
    why = interchangeable(t("g6e.xlarge"), t("g6e.12xlarge"), multi_node=False)
    assert why and "world size" in why and "4 processes" in why
    why = interchangeable(t("p4d.24xlarge"), t("p5.4xlarge"), multi_node=True, rule="same-count")
    assert why and "1 process per node" in why


def test_one_node_may_change_model(t):
    assert interchangeable(t("g6e.xlarge"), t("g5.xlarge"), multi_node=False) is None
    assert interchangeable(t("p5.4xlarge"), t("g6e.2xlarge"), multi_node=False) is None


def test_architecture_and_sdk_always_hold(t):
    why = interchangeable(t("g5.xlarge"), t("g5g.xlarge"), multi_node=False, rule="same-count")
    assert why and "arm64" in why and "x86_64" in why
    why = interchangeable(t("g5.xlarge"), t("trn1.2xlarge"), multi_node=False, rule="same-count")
    assert why and "neuron" in why and "cuda" in why


def test_unknown_rule_is_refused(t):
    with pytest.raises(ValueError, match="same-accelerator, same-count"):
        interchangeable(t("p5.48xlarge"), t("p5.48xlarge"), multi_node=True, rule="any")
