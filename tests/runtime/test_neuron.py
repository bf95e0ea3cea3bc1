"""Trainium/Inferentia utilisation for the idle guard: neuron-monitor's report, as its user guide
documents it (tests/data/neuron_monitor), read into the node's busiest NeuronCore, and published
by the node monitor once a minute (moto's CloudWatch), following a stand-in neuron-monitor that
prints the recorded report as the real one streams it: one JSON report per line."""
from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import boto3
import pytest

from constructs_lib.runtime import contract
from constructs_lib.runtime.monitor import Monitor, run
from constructs_lib.runtime.neuron import busiest_core
from tests.runtime.test_monitor import JOB, program, values

REPORT = json.loads((Path(__file__).resolve().parents[1] / "data" / "neuron_monitor" / "report.json").read_text())


def test_the_documented_report_reads_as_its_busiest_neuroncore():
    assert busiest_core(REPORT) == 42.02  # cores 0 and 1 at 42.01 and 42.02 (their v3d halves are not cores)


def test_no_application_is_zero_and_a_report_of_another_shape_is_nothing():
    idle = {**REPORT, "neuron_runtime_data": []}
    assert busiest_core(idle) == 0.0, "nothing runs on the NeuronCores: idle"
    errored = copy.deepcopy(REPORT)
    errored["neuron_runtime_data"][0]["report"] = {"neuroncore_counters": {"error": "runtime gone"}}
    assert busiest_core(errored) is None, "every application's counters missing: unknown, not idle"
    for other in ([], "x", {"neuron_runtime_data": "no"}, {"system_data": {}}, None):
        assert busiest_core(other) is None
    odd = copy.deepcopy(REPORT)
    cores = odd["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"]
    cores["0"]["neuroncore_utilization"], cores["1"]["neuroncore_utilization"] = float("nan"), 250
    cores["2"] = {"neuroncore_utilization": True}
    assert busiest_core(odd) == 100.0, "NaN and booleans skipped, percentages held to 0-100"


@pytest.fixture
def node(aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                 InstanceType="trn1.32xlarge")["Instances"][0]["InstanceId"]
    return ec2, boto3.client("cloudwatch", region_name="us-east-1"), instance


def test_the_monitor_publishes_the_minutes_busiest_neuroncore(node, tmp_path, monkeypatch):
    ec2, cw, instance = node
    quiet = {**REPORT, "neuron_runtime_data": []}
    lines = "\n".join([json.dumps(quiet), "not json", json.dumps(REPORT), json.dumps(quiet)])
    monkeypatch.setenv("DL_MONITOR_JOB_LOG", program(tmp_path, "job-log", ""))
    monkeypatch.setenv("DL_MONITOR_NEURON", program(tmp_path, "neuron-monitor", lines))
    monitor = Monitor(cloudwatch=cw, ec2=ec2, instance_id=instance, job=JOB, expected_gpus=16, gpu=False, neuron=True)
    assert run(period=1.5, stop=threading.Event(), ticks=1, monitor=monitor) == 0
    for dims in (instance, None):
        assert values(cw, contract.M_NEURON_UTIL, dims) == [42.02]
    assert values(cw, contract.M_GPUS, instance) == [], "no NVIDIA metric from a Neuron node"


def test_a_minute_without_a_report_publishes_no_datum(node, tmp_path, monkeypatch):
    ec2, cw, instance = node
    monkeypatch.setenv("DL_MONITOR_JOB_LOG", program(tmp_path, "job-log", ""))
    monkeypatch.setenv("DL_MONITOR_NEURON", str(tmp_path / "no-such-neuron-monitor"))
    monitor = Monitor(cloudwatch=cw, ec2=ec2, instance_id=instance, job=JOB, expected_gpus=16, gpu=False, neuron=True,
                      log=lambda line: None)
    assert run(period=1.0, stop=threading.Event(), ticks=1, monitor=monitor) == 0
    assert values(cw, contract.M_NEURON_UTIL, instance) == [], "a gap, which the guard never takes for idle"
