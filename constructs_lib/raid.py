"""Instance-store NVMe as one RAID 0 scratch file system, rebuilt on every boot."""
from __future__ import annotations

from constructs import Construct

from .facts import InstanceLike, resolve
from .userdata import ETC_DIR, NodeScript, boot_unit, env_file

DLAMI_MODES = ("replace", "reuse")


class NvmeRaid0(Construct):
    """User data that assembles the instance-store NVMe disks into one file system on every boot.

    The script (constructs_lib/scripts/nvme_raid0.sh) finds disks by id
    (/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*), never EBS, never /dev/nvmeXn1:
    none -> nothing; one -> formatted and mounted; two or more -> mdadm RAID 0 with a
    stripe-aligned XFS. A systemd unit runs it on every boot, since stop/start wipes instance store.

    Keyword-only props (defaults in brackets):
      instance: type name or InstanceFacts.
      mount_point ["/scratch"]: sticky, world-writable.
      dlami_mount ["replace"]: when the Deep Learning AMI's dlami-nvme.service has already put
        the disks under /opt/dlami/nvme (an LVM volume), "replace" releases them and builds the
        striped array (and bind-mounts the array back at /opt/dlami/nvme); "reuse" bind-mounts
        the DLAMI's volume at mount_point instead.
      chunk_kib [512]: RAID 0 chunk size.
    """

    UNIT = "dl-nvme-raid0.service"

    def __init__(self, scope: Construct, construct_id: str, *, instance: InstanceLike, mount_point: str = "/scratch",
                 dlami_mount: str = "replace", chunk_kib: int = 512) -> None:
        super().__init__(scope, construct_id)
        if dlami_mount not in DLAMI_MODES:
            from .validation import ConfigurationError
            raise ConfigurationError(f"dlami_mount must be one of {', '.join(DLAMI_MODES)}, got {dlami_mount!r}")
        self.facts = resolve(instance)
        self.mount_point = mount_point
        self.dlami_mount = dlami_mount
        self.chunk_kib = chunk_kib

    def add_to(self, script: NodeScript) -> None:
        path = script.add_script("nvme_raid0.sh")
        script.add_file(f"{ETC_DIR}/nvme.env", env_file({
            "MOUNT_POINT": self.mount_point, "DLAMI_MOUNT": self.dlami_mount, "CHUNK_KIB": str(self.chunk_kib)}))
        script.add_unit(self.UNIT, boot_unit(
            "instance-store NVMe RAID 0 scratch", f"/bin/bash {path}", env_files=(f"{ETC_DIR}/nvme.env",),
            after="local-fs.target dlami-nvme.service"))
