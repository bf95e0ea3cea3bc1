"""The boot health gate against stand-ins that replay recorded real tool outputs
(tests/runtime/data/health/README.md says where each was recorded), and moto for the tag that
has a failed node replaced."""
from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest

from constructs_lib.runtime import contract
from constructs_lib.runtime.agent import write_health
from constructs_lib.runtime.health_checks import Expect, Tools, dcgm_verdict
from constructs_lib.runtime.health_gate import HealthGate, checks_for, hold

DATA = Path(__file__).parent / "data" / "health"


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def node_tools(tmp_path: Path, *, gpus: int = 8, remap: str = "remapped_rows_ok.csv", dcgm: str = "dcgm_diag_pass.json",
               dcgm_rc: int = 0, efa: int = 4, fi_info_rc: int = 0, pingpong_rc: int = 0, kernel: str = "") -> Tools:
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})" for i in range(gpus))
    smi = script(tmp_path, "nvidia-smi", f"""case "$1" in
  -L) cat <<'EOF'
{listing}
EOF
  ;;
  --query-remapped-rows=*) cat {DATA / remap} ;;
  --query-gpu=*) for i in $(seq 0 {gpus - 1}); do echo "00000000:5$i:00.0, 0"; done ;;
  *) exit 9 ;;
esac""")
    ib = tmp_path / "infiniband"
    ib.mkdir(exist_ok=True)
    for i in range(efa):
        (ib / f"rdmap{i}s0").mkdir(exist_ok=True)
    kernel_file = tmp_path / "kernel.log"
    kernel_file.write_text((DATA / kernel).read_text() if kernel else "")
    return Tools(nvidia_smi=smi, dcgmi=script(tmp_path, "dcgmi", f"cat {DATA / dcgm}\nexit {dcgm_rc}"),
                 fi_info=script(tmp_path, "fi_info", f"exit {fi_info_rc}"),
                 fi_pingpong=script(tmp_path, "fi_pingpong", f"exit {pingpong_rc}"),
                 kernel_log=f"cat {kernel_file}", infiniband=str(ib))


def p5(scratch_gb: int = 0, level: str = "quick") -> Expect:
    return Expect(gpus=8, efa=4, scratch_gb=scratch_gb, level=level, scratch=contract.scratch_dir())


def gate(expect: Expect, tools: Tools, lines: list[str]) -> HealthGate:
    os.makedirs(contract.scratch_dir(), exist_ok=True)
    return HealthGate(expect, checks=checks_for(expect, "cuda"), tools=tools, log=lines.append, health=write_health)


def health() -> str:
    return (Path(contract.path("health_dir")) / "gate").read_text()


def test_a_healthy_node_passes_and_says_every_check_in_the_job_log(tmp_path):
    lines: list[str] = []
    assert gate(p5(), node_tools(tmp_path), lines).start().wait()
    assert health().startswith("ok passed")
    for check in ("gpu-count ok", "gpu-ecc ok", "gpu-row-remap ok", "gpu-xid ok", "dcgm-diag-r1 ok: 17 results passed",
                  "efa-devices ok", "efa-loopback ok"):
        assert any(check in line for line in lines), (check, lines)


@pytest.mark.parametrize("tools, check, said", [
    (dict(dcgm="dcgm_diag_fail.json", dcgm_rc=226), "dcgm-diag-r1", "Page Retirement/Row Remap on GPU 0,1,2,3,4,5,6,7"),
    (dict(remap="remapped_rows_pending.csv"), "gpu-row-remap", "row remap pending on GPU-455e672a"),
    (dict(kernel="kernel_xid48.log"), "gpu-xid", "XID 48 (double-bit ECC error) on GPU 0000:55:00"),
    (dict(gpus=7), "gpu-count", "7 of 8 GPUs listed"),
    (dict(efa=3), "efa-devices", "3 of 4 EFA devices"),
    (dict(fi_info_rc=1), "efa-devices", "libfabric lists no EFA RDM endpoint"),
    (dict(pingpong_rc=1), "efa-loopback", "fi_pingpong over EFA to this node failed"),
])
def test_a_broken_node_fails_with_the_reason(tmp_path, tools, check, said):
    lines: list[str] = []
    g = gate(p5(), node_tools(tmp_path, **tools), lines).start()
    assert not g.wait()
    assert [f.check for f in g.failed()] == [check]
    assert said in g.reason()
    assert health().startswith("failed ") and said in health()
    assert any("never joins a generation" in line for line in lines)


def test_a_raid_smaller_than_the_types_nvme_fails(tmp_path):
    st = os.statvfs(tmp_path)
    have_gb = st.f_blocks * st.f_frsize / 1e9
    g = gate(p5(scratch_gb=int(have_gb * 2) + 1), node_tools(tmp_path), [])
    assert not g.start().wait()
    assert "scratch-raid" in g.reason()
    assert gate(p5(scratch_gb=max(1, int(have_gb))), node_tools(tmp_path), []).start().wait()


def test_dcgmi_missing_is_said_but_never_keeps_a_node_out(tmp_path):
    tools = node_tools(tmp_path)
    tools = Tools(**{**tools.__dict__, "dcgmi": str(tmp_path / "no-dcgmi")})
    lines: list[str] = []
    assert gate(p5(), tools, lines).start().wait()
    assert health().startswith("degraded passed") and "dcgm-diag-r1" in health()


def test_the_level_picks_dcgms_suite(tmp_path):
    argv = tmp_path / "argv"
    tools = Tools(**{**node_tools(tmp_path).__dict__,
                     "dcgmi": script(tmp_path, "dcgmi", f'echo "$@" > {argv}\ncat {DATA / "dcgm_diag_pass.json"}')})
    assert gate(p5(level="thorough"), tools, []).start().wait()
    assert argv.read_text().split() == ["diag", "-r", "3", "-j"]


def test_a_passed_gate_is_not_run_again_this_boot(tmp_path):
    assert gate(p5(), node_tools(tmp_path), []).start().wait()
    lines: list[str] = []
    assert gate(p5(), node_tools(tmp_path, gpus=0), lines).start().wait()  # would fail if it ran
    assert lines == ["health gate: passed earlier this boot"]


def test_the_efa_checks_look_where_node_env_says_and_at_the_efa_installers_paths_by_default(tmp_path):
    assert (Tools.from_env({}).infiniband, Tools.from_env({}).fi_info, Tools.from_env({}).fi_pingpong) == \
        ("/sys/class/infiniband", "/opt/amazon/efa/bin/fi_info", "/opt/amazon/efa/bin/fi_pingpong")
    sim = node_tools(tmp_path, efa=3)  # a simulated node: 3 devices, stand-in tools in tmp_path
    tools = Tools.from_env({contract.ENV_INFINIBAND_DIR: sim.infiniband, contract.ENV_EFA_BIN: str(tmp_path)})
    gate = HealthGate.from_env({contract.ENV_EXPECTED_EFA: "4", contract.ENV_INFINIBAND_DIR: sim.infiniband,
                                contract.ENV_EFA_BIN: str(tmp_path)}, log=print, health=lambda *a: None)
    assert gate.tools == tools and [f.line() for f in gate.run()][0].startswith("efa-devices failed: 3 of 4")


def test_a_node_without_gpus_efa_or_raid_runs_no_check(tmp_path):
    g = HealthGate.from_env({"DL_SDK": "cuda"}, log=[].append, health=write_health).start()
    assert g.checks == () and g.wait()


def test_dcgm_4_documents_and_runtime_errors_are_read():
    assert dcgm_verdict('{"DCGM Diagnostic": {"runtime_error": "no GPUs"}}')[0] == "failed"
    assert dcgm_verdict("Error: no document")[0] == "degraded"


def test_a_failed_node_tags_itself_for_replacement_and_waits(aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                 InstanceType="p5.48xlarge")["Instances"][0]["InstanceId"]
    slept: list[float] = []
    lines: list[str] = []
    assert hold(ec2, instance, "efa-devices: 3 of 4 EFA devices", lines.append, sleep=slept.append, rounds=2) \
        == contract.EXIT_FAILED
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]},
                                      {"Name": "key", "Values": [contract.TAG_HEALTH]}])["Tags"]
    assert [t["Value"] for t in tags] == ["replace: efa-devices: 3 of 4 EFA devices"]
    assert slept == [60, 60] and sum("tagged" in line for line in lines) == 1


def test_a_passed_node_tags_its_verdict_and_joins_a_failed_one_holds(aws, tmp_path, monkeypatch):
    from constructs_lib.runtime.health_gate import conclude

    ec2 = boto3.client("ec2", region_name="us-east-1")
    ok, bad = (i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=2, MaxCount=2,
                                                           InstanceType="p5.48xlarge")["Instances"])
    assert conclude(gate(p5(), node_tools(tmp_path), []).start(), ec2, ok, print) is None

    def tag(instance):
        return [t["Value"] for t in ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]}])["Tags"]
                if t["Key"] == contract.TAG_HEALTH]
    assert tag(ok)[0].startswith("ok: gate passed in ")
    held: list = []
    monkeypatch.setattr("constructs_lib.runtime.health_gate.hold",
                        lambda ec2_, instance, why, log: held.append((instance, why)) or contract.EXIT_FAILED)
    (tmp_path / "b").mkdir()
    Path(contract.path("health_dir"), "gate").unlink()  # the other node's boot
    end = conclude(gate(p5(), node_tools(tmp_path / "b", efa=3), []).start(), ec2, bad, print)
    assert end == contract.EXIT_FAILED and held == [(bad, "efa-devices: 3 of 4 EFA devices in " + str(tmp_path / "b" / "infiniband")
                                                     + " (rdmap0s0, rdmap1s0, rdmap2s0)")]
    assert tag(bad) == []  # hold tags it (test_a_failed_node_tags_itself_for_replacement_and_waits)
