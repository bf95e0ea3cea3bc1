"""The idle guard on Trainium/Inferentia (issue 34): it reads each node's busiest NeuronCore (the
node monitor's M_NEURON_UTIL, from neuron-monitor) where an NVIDIA cluster has the agent's
per-GPU utilisation, with the same rules: two signals that agree, never on missing data.
moto's CloudWatch, EC2 and S3; the fleet tests' cloud."""
from __future__ import annotations

import json

from constructs_lib.runtime import contract

from .conftest import CLUSTER, live_instances
from .test_idle_watch import Metrics, _run, _setup

# The fleet tests' cloud launches p5s; here they stand for Trainium nodes (the guard goes by type).
NEURON = {"neuron_types": ["p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge"],
          "expected_gpus": {"p5.48xlarge": 1, "p5en.48xlarge": 1, "p4d.24xlarge": 1}}


def _neuron_node(m: Metrics, instance: str, now: float, util=lambda t: 0.0, training=0.0, minutes=40) -> None:
    times = [now - 60 * k for k in range(minutes, -1, -1)]
    base = {contract.DIM_JOB: CLUSTER, contract.DIM_INSTANCE: instance}
    m.put(contract.NS_JOB, contract.M_NEURON_UTIL, base, [(t, util(t)) for t in times])
    m.put(contract.NS_JOB, contract.M_NEURON_UTIL, {contract.DIM_JOB: CLUSTER}, [(t, util(t)) for t in times])
    m.put(contract.NS_NODE, contract.M_CPU_ACTIVE, {**base, "cpu": "cpu-total"}, [(t, 3.0) for t in times])
    m.put(contract.NS_JOB, contract.M_TRAINING, base, [(t, training) for t in times])
    m.put(contract.NS_JOB, contract.M_RESTORING, base, [(t, 0.0) for t in times])


def test_idle_neuroncores_and_no_training_stop_the_cluster(cloud, topic):
    ctl, ids, now, kw = _setup(cloud, NEURON)
    m = Metrics()
    for i in ids:
        _neuron_node(m, i, now)
    result = _run(cloud, ctl, topic, kw, now)
    assert result["stop"] and result["state"] == "idle", json.dumps(result)
    assert live_instances(cloud.raw) == []


def test_one_busy_neuroncore_minute_keeps_the_cluster(cloud, topic):
    ctl, ids, now, kw = _setup(cloud, NEURON)
    m = Metrics()
    _neuron_node(m, ids[0], now)
    _neuron_node(m, ids[1], now, util=lambda t: 42.02 if now - 300 < t <= now - 240 else 0.0)
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "busy", json.dumps(result)
    assert len(live_instances(cloud.raw)) == 2


def test_a_node_without_neuron_monitor_data_is_never_idle(cloud, topic):
    """neuron-monitor missing on one node: no series there, a health problem, not idleness."""
    ctl, ids, now, kw = _setup(cloud, NEURON)
    m = Metrics()
    _neuron_node(m, ids[0], now)
    result = _run(cloud, ctl, topic, kw, now)
    assert not result["stop"] and result["state"] == "no-data", json.dumps(result)
    assert len(live_instances(cloud.raw)) == 2


def test_nvidia_metrics_are_not_read_for_a_neuron_cluster(cloud, topic):
    ctl, ids, now, kw = _setup(cloud, NEURON)
    m = Metrics()
    for i in ids:
        m.node(i, now, gpu=lambda g, t: 0.0)  # the NVIDIA series (which a Neuron node never has) say idle
    assert _run(cloud, ctl, topic, kw, now)["state"] == "no-data"


def test_a_type_not_listed_as_neuron_is_judged_by_its_nvidia_gpus_only(cloud, topic):
    """A product whose launcher may choose a Trainium or an NVIDIA type lists the Neuron ones: a
    node of any other type is read from the agent's GPUs, never from a Neuron series."""
    ctl, ids, now, kw = _setup(cloud, {"neuron_types": ["trn1.32xlarge"]})
    m = Metrics()
    for i in ids:
        _neuron_node(m, i, now)  # only Neuron series, which an NVIDIA node never has
    assert _run(cloud, ctl, topic, kw, now)["state"] == "no-data"
