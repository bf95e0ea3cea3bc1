"""The idle guard's decision on metric series shaped like the CloudWatch agent's (one sample a
minute per GPU): idle, busy, loader-starved, just booted, restoring, one GPU idle of eight, and
the data gaps that must never read as idle."""
from __future__ import annotations

import pytest

from constructs_lib.fleet.idle_guard import GuardConfig, JobProgress, NodeMetrics, decide

NOW = 1_800_000_000.0
HOUR = 3600.0


def minutes(values, end=NOW):
    """One sample a minute ending at `end`: values[-1] is the latest."""
    return [(end - 60 * (len(values) - 1 - i), float(v)) for i, v in enumerate(values)]


def node(name="node-0", gpus=8, util=0.0, booted=NOW - 3 * HOUR, length=40, **kw):
    series = {g: minutes([util] * length) for g in range(gpus)}
    return NodeMetrics(node=name, booted_at=booted, gpu_util=series, expected_gpus=gpus, **kw)


GONE = JobProgress(process_alive=False)
STALLED = JobProgress(process_alive=True, checkpoint_times=(NOW - 2 * HOUR,))


def test_idle_cluster_with_the_process_gone_is_stopped():
    d = decide([node("a"), node("b")], GONE, NOW)
    assert d.stop and d.state == "idle" and "all 16 GPUs under 5%" in d.reason and "process is gone" in d.reason


def test_idle_gpus_with_checkpoints_stalled_are_stopped():
    d = decide([node(util=1.0)], STALLED, NOW)
    assert d.stop and "last checkpoint 120 min ago" in d.reason


def test_idle_gpus_but_checkpoints_advancing_is_not_stopped():
    d = decide([node(util=0.0)], JobProgress(process_alive=True, checkpoint_times=(NOW - 10 * 60,)), NOW)
    assert not d.stop and d.state == "busy" and "still progresses" in d.reason


def test_busy_cluster_is_not_stopped():
    d = decide([node(util=97.0), node("b", util=95.0)], GONE, NOW)
    assert not d.stop and d.state == "busy"


def test_one_busy_sample_in_the_window_keeps_it_alive():
    n = node(util=0.0)
    spiky = dict(n.gpu_util)
    spiky[3] = minutes([0.0] * 20 + [60.0] + [0.0] * 19)
    d = decide([NodeMetrics(n.node, n.booted_at, spiky, 8)], GONE, NOW)
    assert not d.stop and "GPU 3 at 60%" in d.reason


def test_one_gpu_idle_of_eight_is_busy_with_an_imbalance_hint():
    n = node(util=90.0)
    series = dict(n.gpu_util)
    series[5] = minutes([0.0] * 40)
    d = decide([NodeMetrics(n.node, n.booted_at, series, 8)], STALLED, NOW)
    assert not d.stop and d.state == "busy"
    assert any("GPU(s) 5 idle while the others work" in h for h in d.hints)


def test_loader_starved_gpus_are_busy_and_get_the_remedy():
    # A starved GPU works in bursts between batches: mean 25%, peaks well above the threshold.
    util = [50.0, 0.0] * 20
    n = node()
    gpus = {g: minutes(util) for g in range(8)}
    disk = NodeMetrics(n.node, n.booted_at, gpus, 8, disk_read_pct=minutes([97.0] * 40))
    d = decide([disk], STALLED, NOW)
    assert not d.stop and any("starved by storage" in h and "/scratch" in h for h in d.hints)
    cpu = NodeMetrics(n.node, n.booted_at, gpus, 8, cpu_pct=minutes([99.0] * 40), disk_read_pct=minutes([20.0] * 40))
    assert any("starved by the data loader" in h for h in decide([cpu], STALLED, NOW).hints)
    busy = NodeMetrics(n.node, n.booted_at, {g: minutes([95.0] * 40) for g in range(8)}, 8,
                       cpu_pct=minutes([99.0] * 40))
    assert not decide([busy], STALLED, NOW).hints  # saturated CPUs with busy GPUs are just a busy node


@pytest.mark.parametrize("booted_min_ago, stop", [(5, False), (19, False), (21, True)])
def test_never_during_the_grace_period_after_boot(booted_min_ago, stop):
    d = decide([node(booted=NOW - booted_min_ago * 60)], GONE, NOW, GuardConfig(grace_minutes=20))
    assert d.stop is stop
    if not stop:
        assert d.state == "grace" and "after boot" in d.reason


def test_never_while_restoring_or_just_after():
    assert decide([node(restoring=True)], GONE, NOW).state == "grace"
    d = decide([node(restored_at=NOW - 5 * 60)], GONE, NOW)
    assert not d.stop and "after a restore" in d.reason
    assert decide([node(restored_at=NOW - 40 * 60)], GONE, NOW).stop


@pytest.mark.parametrize("shape, words", [
    ("missing-gpu", "reports 7 of 8 GPUs"),
    ("short-series", "has gaps"),
    ("gap", "has gaps"),
    ("no-nodes", "no node reports"),
])
def test_missing_data_never_reads_as_idle(shape, words):
    n = node()
    series = dict(n.gpu_util)
    nodes = [n]
    if shape == "missing-gpu":
        del series[7]
        nodes = [NodeMetrics(n.node, n.booted_at, series, 8)]
    elif shape == "short-series":  # the agent started 10 minutes ago
        series[0] = minutes([0.0] * 10)
        nodes = [NodeMetrics(n.node, n.booted_at, series, 8)]
    elif shape == "gap":  # 12 silent minutes in the middle of the window
        pts = minutes([0.0] * 40)
        series[2] = pts[:14] + pts[26:]
        nodes = [NodeMetrics(n.node, n.booted_at, series, 8)]
    elif shape == "no-nodes":
        nodes = []
    d = decide(nodes, GONE, NOW)
    assert not d.stop and d.state == "no-data" and words in d.reason


def test_threshold_and_window_are_configurable():
    n = node(util=8.0)
    assert not decide([n], GONE, NOW).stop  # 8% is work at the default 5%
    assert decide([n], GONE, NOW, GuardConfig(threshold_pct=10.0)).stop
    short = node(util=0.0, length=12)
    assert decide([short], GONE, NOW, GuardConfig(idle_minutes=10, grace_minutes=5)).stop


def test_a_gpu_exactly_at_the_threshold_is_busy():
    """The rule is "under threshold_pct is idle" (docs/observability.md): a GPU that sits exactly at
    the threshold is working, and a cluster of them is never stopped."""
    d = decide([node(util=5.0)], GONE, NOW)
    assert not d.stop and d.state == "busy" and "reached 5% or more" in d.reason
    assert decide([node(util=4.99)], GONE, NOW).stop
