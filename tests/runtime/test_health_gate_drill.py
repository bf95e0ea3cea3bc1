"""The boot health gate on the multi-node drill (2 nodes x 2 ranks, real torchrun, the node bundle,
moto_server): a node whose stand-in DCGM replays a recorded failing diagnostic, and a node with one
of its 4 EFA devices missing from its /sys/class/infiniband (node.env points the check at a
directory of 3), both start beside a healthy node and never train a step; each tags itself for
replacement, the capacity controller's part (terminate them, launch another) is played by the test,
and the job runs from its first step to its last on a healthy set (the replacement passes the
gate on the recorded passing diagnostic). One drill for both: the suite's
time goal. The other checks' failures take the same path (tests/runtime/test_health_gate.py drills
each on recordings)."""
from __future__ import annotations

from pathlib import Path

import pytest

from constructs_lib.runtime import contract
from tests.runtime.drill import Drill

pytestmark = pytest.mark.drill

DATA = Path(__file__).parent / "data" / "health"
STEPS, EVERY = 30, 10


def _gpu_node_tools(dcgm: str = "dcgm_diag_fail.json", rc: int = 226) -> dict[str, str]:
    """nvidia-smi listing 8 healthy GPUs, and dcgmi replaying DCGM's `diag -j` (failing: its exit 226)."""
    listing = "\n".join(f"GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-{i:08d})" for i in range(8))
    smi = (f'case "$1" in\n  -L) printf "%s\\n" "{listing}" ;;\n'
           f"  --query-remapped-rows=*) cat {DATA / 'remapped_rows_ok.csv'} ;;\n"
           '  --query-gpu=*) for i in $(seq 0 7); do echo "00000000:5$i:00.0, 0"; done ;;\n'
           "  *) exit 9 ;;\nesac")
    return {"nvidia-smi": smi, "dcgmi": f"cat {DATA / dcgm}\nexit {rc}"}


def _health_tag(d: Drill, node) -> str:
    tags = d.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [node.id]},
                                        {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
    return tags[0]["Value"] if tags else ""


def _efa_node_env(tmp_path: Path, run: Path, addr: str) -> dict[str, str]:
    """4 EFA interfaces attached, 3 devices present (named as the EFA driver names them); the
    EFA installer's tools are stand-ins that pass, so only the missing device fails the node."""
    ib = tmp_path / "infiniband-3-of-4"
    for i in range(3):
        (ib / f"rdmap{16 + i}s27").mkdir(parents=True)
    return {contract.ENV_EXPECTED_EFA: "4", contract.ENV_INFINIBAND_DIR: str(ib),
            contract.ENV_EFA_BIN: str(run / f"node-{addr}" / "bin")}


def test_nodes_whose_dcgm_fails_or_whose_efa_device_is_missing_never_train_and_the_job_runs_on_a_healthy_set(
        tmp_path, moto_process):
    run = tmp_path / "run"
    run.mkdir()
    d = Drill(run, moto_process, steps=STEPS, every=EVERY, sleep=0.05)
    try:
        a = d.add_node("127.0.0.2")
        bad = d.add_node("127.0.0.3", node_env={"DL_EXPECTED_GPUS": "8", contract.ENV_HEALTH_CHECK: "quick"},
                         tools=_gpu_node_tools())
        no_efa = d.add_node("127.0.0.5", node_env=_efa_node_env(tmp_path, run, "127.0.0.5"),
                            tools={"fi_info": "exit 0", "fi_pingpong": "exit 0"})
        for node in (bad, no_efa):
            d.wait(f"the failed node {node.addr} to tag itself for replacement",
                   lambda: _health_tag(d, node).startswith(f"{contract.HEALTH_REPLACE}:"), timeout=120)
        assert d.current_gen() is None, "no generation forms with a node the gate failed"
        bad.kill()  # what the capacity controller does with a node tagged replace: and a new one
        no_efa.kill()
        c = d.add_node("127.0.0.4", node_env={"DL_EXPECTED_GPUS": "8"},  # its DCGM replays a passing diagnostic
                       tools=_gpu_node_tools("dcgm_diag_pass.json", 0))
        d.wait("the job to finish on every node", d.finished, timeout=240)
    finally:
        d.stop()
    tag = _health_tag(d, bad)
    assert "dcgm-diag-r1" in tag and "Row Remap" in tag, tag
    events = d.read_events()
    assert {e["node"] for e in events if e["event"] == "start"} == {a.id, c.id}, "the failed nodes never ran a rank"
    assert {e["step"] for e in events if e["event"] == "step"} == set(range(STEPS))
    said = bad.log_text()
    assert "dcgm-diag-r1 failed" in said and "this node never joins a generation" in said, said[-2000:]
    tag, said = _health_tag(d, no_efa), no_efa.log_text()
    assert tag.startswith("replace: efa-devices: 3 of 4 EFA devices in ") and "rdmap18s27" in tag, tag
    assert "efa-loopback ok" in said and "this node never joins a generation" in said, said[-2000:]
    assert "gpu-count" not in said, "a node whose catalog gives it no GPU runs the EFA checks only"
    assert _health_tag(d, c).startswith("ok: gate passed in "), "the replacement passed its gate, as status lists"
    assert "dcgm-diag-r1 ok" in c.log_text()
