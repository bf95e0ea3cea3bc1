"""The boot health gate on the multi-node drill (2 nodes x 2 ranks, real torchrun, the node bundle,
moto_server): a node whose stand-in DCGM replays a recorded failing diagnostic never trains a step;
it tags itself for replacement, the capacity controller's part (terminate it, launch another) is
played by the test, and the job runs from its first step to its last on a healthy set. The other
checks' failures take the same path (tests/runtime/test_health_gate.py drills each on recordings)."""
from __future__ import annotations

from pathlib import Path

import pytest

from constructs_lib.runtime import contract
from tests.runtime.drill import Drill

pytestmark = pytest.mark.drill

DATA = Path(__file__).parent / "data" / "health"
STEPS, EVERY = 30, 10


def _gpu_node_tools() -> dict[str, str]:
    """nvidia-smi listing 8 healthy GPUs, and dcgmi replaying DCGM's failing `diag -j` (its exit 226)."""
    listing = "\n".join(f"GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-{i:08d})" for i in range(8))
    smi = (f'case "$1" in\n  -L) printf "%s\\n" "{listing}" ;;\n'
           f"  --query-remapped-rows=*) cat {DATA / 'remapped_rows_ok.csv'} ;;\n"
           '  --query-gpu=*) for i in $(seq 0 7); do echo "00000000:5$i:00.0, 0"; done ;;\n'
           "  *) exit 9 ;;\nesac")
    return {"nvidia-smi": smi, "dcgmi": f"cat {DATA / 'dcgm_diag_fail.json'}\nexit 226"}


def _health_tag(d: Drill, node) -> str:
    tags = d.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [node.id]},
                                        {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
    return tags[0]["Value"] if tags else ""


def test_a_node_whose_dcgm_fails_never_trains_and_the_job_runs_on_a_healthy_set(tmp_path, moto_process):
    (tmp_path / "run").mkdir()
    d = Drill(tmp_path / "run", moto_process, steps=STEPS, every=EVERY, sleep=0.05)
    try:
        a = d.add_node("127.0.0.2")
        bad = d.add_node("127.0.0.3", node_env={"DL_EXPECTED_GPUS": "8", contract.ENV_HEALTH_CHECK: "quick"},
                         tools=_gpu_node_tools())
        d.wait("the failed node to tag itself for replacement",
               lambda: _health_tag(d, bad).startswith(f"{contract.HEALTH_REPLACE}:"), timeout=120)
        assert d.current_gen() is None, "no generation forms with a node the gate failed"
        bad.kill()  # what the capacity controller does with a node tagged replace: and a new one
        c = d.add_node("127.0.0.4")
        d.wait("the job to finish on every node", d.finished, timeout=240)
    finally:
        d.stop()
    tag = _health_tag(d, bad)
    assert "dcgm-diag-r1" in tag and "Row Remap" in tag, tag
    events = d.read_events()
    assert {e["node"] for e in events if e["event"] == "start"} == {a.id, c.id}, "the failed node never ran a rank"
    assert {e["step"] for e in events if e["event"] == "step"} == set(range(STEPS))
    said = bad.log_text()
    assert "dcgm-diag-r1 failed" in said and "this node never joins a generation" in said, said[-2000:]
