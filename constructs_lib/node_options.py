"""How a node is set up whatever its type: one value that a cluster hands to the launch template
of each of its types."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .validation import ConfigurationError

if TYPE_CHECKING:
    import aws_cdk.aws_ec2 as ec2

# gp3's documented range; EC2 would refuse anything else only at deploy.
ROOT_VOLUME_GIB = (1, 16384)


@dataclass(frozen=True)
class NodeOptions:
    """Settings of a node that do not depend on its type; GpuLaunchTemplate(options=...) and
    ClusterCapacity(node_options=...) take them.

    Fields (defaults in brackets):
      root_volume_gib [200]: the encrypted gp3 root volume, 1 to 16384 GiB.
      raid [True]: instance-store NVMe as one RAID 0 at scratch_mount ["/scratch"].
      dlami_mount ["replace"]: what becomes of the DLAMI's own NVMe volume (see NvmeRaid0).
      interface_layout ["efa-only"]: see constructs_lib.efa.efa_interfaces.
      key_name [None]: no SSH key; use `aws ssm start-session`.
      associate_public_ip [False]: only valid with one interface.
      machine_image [DeepLearningAmi for the type]: any IMachineImage; set ami_architecture when it
        is not a DeepLearningAmi so the architecture check can run.
      extra_user_data [()]: bash lines run after dl-launcher's bootstrap (not if the bootstrap
        fails: the node then shuts down). Tokens are fine.
    """

    root_volume_gib: int = 200
    raid: bool = True
    scratch_mount: str = "/scratch"
    dlami_mount: str = "replace"
    interface_layout: str = "efa-only"
    key_name: Optional[str] = None
    associate_public_ip: bool = False
    machine_image: Optional[ec2.IMachineImage] = None
    ami_architecture: Optional[str] = None
    extra_user_data: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        low, high = ROOT_VOLUME_GIB
        if not low <= self.root_volume_gib <= high:
            raise ConfigurationError(f"root_volume_gib must be {low} to {high} (gp3), got {self.root_volume_gib}")
        if isinstance(self.extra_user_data, str):
            raise ConfigurationError("extra_user_data is a sequence of bash lines, not one string")
        # Frozen and hashable whatever sequence was given.
        object.__setattr__(self, "extra_user_data", tuple(self.extra_user_data))
