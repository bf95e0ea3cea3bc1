"""Instance-store NVMe as one RAID 0 scratch file system, rebuilt on every boot."""
from __future__ import annotations

from constructs import Construct

from .bundle import NVME_ENV, RAID_UNIT
from .facts import InstanceLike, resolve
from .runtime import contract
from .userdata import SettingsFile
from .validation import ConfigurationError

DLAMI_MODES = ("replace", "reuse")


class NvmeRaid0(Construct):
    """The settings of the boot-time unit that assembles the instance-store NVMe disks into one
    file system on every boot (the unit and its script ship in the node bundle).

    The script (constructs_lib/scripts/nvme_raid0.sh) finds disks by id
    (/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*), never EBS, never /dev/nvmeXn1:
    none -> a directory on the root volume; one -> formatted and mounted; two or more -> mdadm
    RAID 0 with a stripe-aligned XFS. A systemd unit runs it on every boot, since stop/start
    wipes instance store.

    Keyword-only props (defaults in brackets):
      instance: type name or InstanceFacts.
      mount_point ["/scratch"]: sticky, world-writable.
      dlami_mount ["replace"]: when the Deep Learning AMI's dlami-nvme.service has already put
        the disks under /opt/dlami/nvme (an LVM volume), "replace" releases them and builds the
        striped array (and bind-mounts the array back at /opt/dlami/nvme); "reuse" bind-mounts
        the DLAMI's volume at mount_point instead.
      chunk_kib [512]: RAID 0 chunk size.

    Attributes: UNIT (the unit's name), settings (the SettingsFile the node's user data writes).
    """

    UNIT = RAID_UNIT

    def __init__(self, scope: Construct, construct_id: str, *, instance: InstanceLike, mount_point: str = "/scratch",
                 dlami_mount: str = "replace", chunk_kib: int = 512) -> None:
        super().__init__(scope, construct_id)
        if dlami_mount not in DLAMI_MODES:
            raise ConfigurationError(f"dlami_mount must be one of {', '.join(DLAMI_MODES)}, got {dlami_mount!r}")
        self.facts = resolve(instance)
        self.mount_point = mount_point
        self.dlami_mount = dlami_mount
        self.chunk_kib = chunk_kib
        self.settings = SettingsFile("RAID settings", f"$DL_ETC_DIR/{NVME_ENV}", contract.env_text({
            "MOUNT_POINT": mount_point, "DLAMI_MOUNT": dlami_mount, "CHUNK_KIB": str(chunk_kib)}))
