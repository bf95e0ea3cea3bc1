"""The CloudWatch agent's configuration against the agent's documented keys (a schema subset in
data/, written from the agent's documentation with its sources), and the names CloudWatch will
show: the agent names a metric <plugin prefix>_<measurement> (nvidia_smi_, cpu_, mem_, diskio_),
which must be what the dashboard, the alarms and the idle guard read (the node contract)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from constructs_lib.runtime.cwagent_config import agent_config, agent_config_json
from constructs_lib.runtime import contract

SCHEMA = json.loads((Path(__file__).parent / "data" / "cloudwatch_agent_schema.json").read_text())
# The agent's documented metric name prefixes per section (CloudWatch-Agent-Configuration-File-Details).
PREFIX = {"nvidia_gpu": "nvidia_smi", "cpu": "cpu", "mem": "mem", "diskio": "diskio"}


def names(config: dict) -> set[str]:
    return {f"{PREFIX[section]}_{m}" for section, body in config["metrics"]["metrics_collected"].items()
            for m in body["measurement"]}


def test_the_config_follows_the_agents_documented_schema():
    jsonschema.validate(agent_config(job="dl-llm"), SCHEMA)
    jsonschema.validate(json.loads(agent_config_json(job="dl-llm", gpu=False)), SCHEMA)


def test_the_schema_refuses_what_the_agent_would_not_take():
    bad = agent_config(job="dl-llm")
    bad["metrics"]["metrics_collected"]["nvidia_gpu"]["measurement"].append("utilisation_gpu")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
    bad = agent_config(job="dl-llm")
    bad["metrics"]["append_dimensions"]["Job"] = "dl-llm"  # only the four EC2 keys go here
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_every_metric_the_product_reads_is_collected_under_its_contract_name():
    got = names(agent_config(job="dl-llm"))
    for name in (contract.M_GPU_UTIL, contract.M_GPU_MEMORY, contract.M_GPU_POWER, contract.M_GPU_TEMPERATURE,
                 contract.M_CPU_ACTIVE, contract.M_CPU_IOWAIT, contract.M_MEMORY, contract.M_DISK_READ):
        assert name in got, name
    assert not any(n.startswith("nvidia_smi_") for n in names(agent_config(job="x", gpu=False)))


def test_job_and_node_on_every_metric_and_the_job_wide_aggregate():
    c = agent_config(job="dl-llm", scratch_device="md0")
    m = c["metrics"]
    assert m["namespace"] == contract.NS_NODE
    assert m["append_dimensions"] == {contract.DIM_INSTANCE: "${aws:InstanceId}"}
    assert all(body["append_dimensions"] == {contract.DIM_JOB: "dl-llm"} for body in m["metrics_collected"].values())
    assert [contract.DIM_JOB] in m["aggregation_dimensions"]
    assert m["metrics_collected"]["diskio"]["resources"] == ["md0"]
    assert c["agent"]["omit_hostname"] is True
    assert {b["metrics_collection_interval"] for b in m["metrics_collected"].values()} == {contract.METRIC_PERIOD}


@pytest.mark.parametrize("job", ["", 'a"b', "$x"])
def test_a_job_that_cannot_be_a_dimension_is_refused(job):
    with pytest.raises(ValueError):
        agent_config(job=job)
