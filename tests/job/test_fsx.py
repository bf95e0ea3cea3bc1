"""Issue 23, `-c data_mode=fsx`: FSx for Lustre linked to the data prefixes, in the nodes' subnet,
reachable from the nodes only, mounted by every node at DL_DATA_DIR before setup; the template
passes cfn-lint, cdk-nag (app.main synthesizes with it) and checkov."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import app
from constructs_lib.runtime import staging
from tests.cdk_checks import cfn_lint, checkov

CTX = {"profile": "multi-node-training", "job": "llm", "command": "dl-torchrun train.py",
       "data": "s3://team-datasets/imagenet/train, s3://team-datasets/imagenet/val", "data_mode": "fsx",
       "fsx_gib": "4800", "fsx_throughput": "250", "approve_hourly": "1000"}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsx")
    assert app.main(CTX, outdir=str(out)) == 0  # cdk-nag runs in app.main: a finding would be exit 2
    return out, json.loads((out / "dl-llm.template.json").read_text())


def _of(t: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in t["Resources"].items() if r["Type"] == kind}


def test_one_persistent_file_system_linked_to_each_prefix_in_the_nodes_subnet(synthesized):
    _, t = synthesized
    (fs_id, fs), = _of(t, "AWS::FSx::FileSystem").items()
    p = fs["Properties"]
    assert p["StorageCapacity"] == 4800 and p["FileSystemTypeVersion"] == "2.15"
    assert p["LustreConfiguration"]["DeploymentType"] == "PERSISTENT_2"
    assert p["LustreConfiguration"]["PerUnitStorageThroughput"] == 250
    links = {r["Properties"]["DataRepositoryPath"]: r["Properties"] for r in _of(t, "AWS::FSx::DataRepositoryAssociation").values()}
    assert sorted(links) == ["s3://team-datasets/imagenet/train/", "s3://team-datasets/imagenet/val/"]
    for path, link in links.items():
        assert link["FileSystemId"] == {"Ref": fs_id}
        assert link["FileSystemPath"] == "/" + path[len("s3://"):].rstrip("/")  # DL_DATA_DIR/bucket/prefix, as staged
        assert link["BatchImportMetaDataOnCreate"] is True
        assert sorted(link["S3"]["AutoImportPolicy"]["Events"]) == ["CHANGED", "DELETED", "NEW"]
        # Import only: nothing on the file system is exported into the user's dataset bucket.
        assert set(link["S3"]) == {"AutoImportPolicy"}, link["S3"]
    # The same one subnet (one AZ) the capacity controller launches the nodes into.
    (subnet,) = p["SubnetIds"]
    controllers = [r for k, r in _of(t, "AWS::Lambda::Function").items() if k.startswith("ClusterController")]
    assert controllers and json.dumps(subnet) in json.dumps(controllers[0]["Properties"]["Environment"]), subnet


def test_only_the_nodes_reach_lustre_and_only_on_its_ports(synthesized):
    _, t = synthesized
    (fs,) = _of(t, "AWS::FSx::FileSystem").values()
    (sg_ref,) = fs["Properties"]["SecurityGroupIds"]
    sg_id = sg_ref["Fn::GetAtt"][0]
    sg = t["Resources"][sg_id]["Properties"]
    assert "SecurityGroupIngress" not in sg and sg.get("SecurityGroupEgress", [{}])[0].get("CidrIp") != "0.0.0.0/0"
    rules = [r["Properties"] for r in t["Resources"].values()
             if r["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
             and (r["Properties"].get("GroupId") == {"Fn::GetAtt": [sg_id, "GroupId"]}
                  or r["Properties"].get("SourceSecurityGroupId") == {"Fn::GetAtt": [sg_id, "GroupId"]}
                  or r["Properties"].get("DestinationSecurityGroupId") == {"Fn::GetAtt": [sg_id, "GroupId"]})]
    assert rules
    for r in rules:
        assert "CidrIp" not in r and "CidrIpv6" not in r, r  # group to group only
        assert (r["FromPort"], r["ToPort"]) in ((988, 988), (1018, 1023), (988, 1023)), r
    node_sgs = {r["Properties"]["GroupId"]["Fn::GetAtt"][0] for r in _of(t, "AWS::EC2::SecurityGroupIngress").values()
                if r["Properties"].get("SourceSecurityGroupId") == {"Fn::GetAtt": [sg_id, "GroupId"]}}
    assert node_sgs - {sg_id} and all(n.startswith("ClusterNode") for n in node_sgs - {sg_id}), node_sgs


def test_every_node_mounts_it_and_the_node_role_reads_no_data_itself(synthesized):
    out, t = synthesized
    (fs_id,) = _of(t, "AWS::FSx::FileSystem")
    user_data = json.dumps([r["Properties"]["LaunchTemplateData"].get("UserData") for r in _of(t, "AWS::EC2::LaunchTemplate").values()])
    assert f'DL_FSX_DNS=\\"", {{"Ref": "{fs_id}"}}, ".fsx.us-east-1."' in user_data, user_data[:2000]
    assert "DL_FSX_MOUNT_NAME=" in user_data and f'"{fs_id}", "LustreMountName"' in user_data
    policies = json.dumps([r["Properties"]["PolicyDocument"] for r in _of(t, "AWS::IAM::Policy").values()])
    assert "team-datasets" not in policies  # FSx reads the bucket with its own service-linked role
    assert "Outputs" in t and any("FSx for Lustre (4800 GiB, 250 MB/s/TiB)" in o.get("Description", "")
                                  for o in t["Outputs"].values())


def test_cfn_lint_and_checkov_pass_with_reasons(synthesized):
    out, _ = synthesized
    cfn_lint([out / "dl-llm.template.json"])
    checkov([out / "dl-llm.template.json"])


def test_the_summary_prices_the_file_system(tmp_path, capsys):
    assert app.main({**CTX, "fsx_gib": "1200", "fsx_throughput": "125", "region": "us-east-1"}, outdir=str(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "FSx for Lustre, 1,200 GiB at 125 MB/s/TiB (150 MB/s): $0.24/h (1,200 GB x $0.145/GB-month = $174/month" in err
    assert ("    data: s3://team-datasets/imagenet/train, s3://team-datasets/imagenet/val: on FSx for Lustre "
            "(1,200 GiB, 125 MB/s/TiB), mounted on each node, at /scratch/data/<bucket>/<prefix>") in err
    assert app.main({**CTX, "region": "us-east-1"}, outdir=str(tmp_path / "b")) == 0
    assert "no price on record for 250 MB/s/TiB in us-east-1: counted as $0" in capsys.readouterr().err


SHIM = """#!/bin/sh
echo "$@" >> "$SIM_CALLS"
[ -e "$SIM_FAIL" ] && n=$(cat "$SIM_FAIL") && [ "$n" -gt 0 ] && echo $((n - 1)) > "$SIM_FAIL" && \
  echo "mount.lustre: mount team@tcp:/abc at /x failed: No such file or directory" >&2 && exit 2
exit 0
"""


def test_the_node_mounts_once_and_asks_again_while_the_file_system_comes_up(tmp_path, monkeypatch):
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "mount").write_text(SHIM)
    (shims / "mount").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    monkeypatch.setenv("SIM_CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("SIM_FAIL", str(tmp_path / "fail"))
    (tmp_path / "fail").write_text("2")
    target = str(tmp_path / "scratch" / "data")
    lines: list[str] = []
    staging.mount_lustre("fs-0123.fsx.us-east-1.amazonaws.com", "abcdefgh", target, emit=lines.append, base=0.01,
                         mounts=str(tmp_path / "mounts"))
    calls = Path(tmp_path / "calls").read_text().splitlines()
    assert calls == [f"-t lustre -o ro,relatime,flock fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh {target}"] * 3
    assert lines == [f"FSx for Lustre fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh mounted at {target}"]
    # Mounted already (a job-unit restart): nothing is run.
    Path(tmp_path / "mounts").write_text(f"fs-0123@tcp:/abcdefgh {target} lustre rw 0 0\n")
    staging.mount_lustre("fs-0123.fsx.us-east-1.amazonaws.com", "abcdefgh", target, emit=lines.append, base=0.01,
                         mounts=str(tmp_path / "mounts"))
    assert len(Path(tmp_path / "calls").read_text().splitlines()) == 3
    # A file system that never comes up: the error names the client and the ports.
    (tmp_path / "fail").write_text("9")
    with pytest.raises(staging.StagingError, match=r"failed 2 times: mount.lustre: .*TCP 988 and 1018-1023"):
        staging.mount_lustre("fs-0123.fsx.us-east-1.amazonaws.com", "abcdefgh", str(tmp_path / "other"),
                             emit=lines.append, attempts=2, base=0.01, mounts=str(tmp_path / "mounts"))
