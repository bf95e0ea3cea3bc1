"""Issue 39 item 4: neuron-inference picks inf1 over inf2. Why (the objective is price per hour, and on that
the data says inf1), and where the data says inf2 (a model that inf1's 8 GB chips cannot hold cheaply; latency)."""
from __future__ import annotations

import json

from tests.selector.cli_run import run



# neuron-inference ranks min_price. On price per hour alone inf1.xlarge ($0.228) is cheaper than inf2.xlarge
# ($0.758) in us-east-1 (AWS's on-demand list prices): the data says inf1, and the pick stays. Sized for a
# model, inf1.xlarge's one 8 GB chip cannot hold a 7B model's 14 GB of bf16 weights, and the four-chip
# inf1.6xlarge that can costs more than inf2.xlarge: the data says inf2. On latency, Inferentia2 reads its
# weights at 820 GB/s per chip against Inferentia's 50 (Neuron docs).
def test_neuron_inference_picks_inf1_on_price_and_inf2_for_a_7b_model(capsys):
    _, out, _ = run(capsys, "recommend", "--profile", "neuron-inference", "--json")
    doc = json.loads(out)
    assert doc["candidates"][0]["instance_type"] == "inf1.xlarge"
    _, out, _ = run(capsys, "recommend", "--profile", "neuron-inference", "--model-size", "7B", "--task", "inference",
                    "--json")
    doc = json.loads(out)
    by = {c["instance_type"]: c for c in doc["candidates"]}
    assert doc["candidates"][0]["instance_type"] == "inf2.xlarge"
    assert "inf1.xlarge" not in by and by["inf1.6xlarge"]["price_per_hour"] > by["inf2.xlarge"]["price_per_hour"]
    _, out, _ = run(capsys, "recommend", "--profile", "neuron-inference", "--model-size", "7B", "--task", "inference",
                    "--objective", "min_latency", "--json")
    doc = json.loads(out)
    by = {c["instance_type"]: c for c in doc["candidates"]}
    assert by["inf2.24xlarge"]["ms_per_token"] < by["inf1.24xlarge"]["ms_per_token"]  # 6 x 820 vs 16 x 50 GB/s
