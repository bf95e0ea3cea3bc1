"""The Deep Learning AMI, resolved at deploy time from AWS's public SSM parameters."""
from __future__ import annotations

from typing import Optional

import aws_cdk.aws_ec2 as ec2
import jsii
from constructs import Construct

from .facts import InstanceLike, resolve
from .validation import ConfigurationError

FLAVOURS = ("base", "pytorch")
OPERATING_SYSTEMS = ("ubuntu-22.04", "ubuntu-24.04", "amazon-linux-2023")
# Newest PyTorch DLAMI line in AWS's release notes as of 2026-10 (2.9 and 2.10 also exist).
DEFAULT_PYTORCH = "2.11"
_ARCH = {"x86_64": "x86_64", "arm64": "arm64"}


def dlami_parameter(*, sdk: str, architecture: str, flavour: str = "pytorch", os: str = "ubuntu-24.04",
                    pytorch_version: str = DEFAULT_PYTORCH) -> str:
    """The public SSM parameter that names the latest matching Deep Learning AMI.

    GPU:    /aws/service/deeplearning/ami/<arch>/<ami-type>/latest/ami-id
    Neuron: /aws/service/neuron/dlami/<multi-framework|base>/<os>/latest/image_id
    """
    if flavour not in FLAVOURS:
        raise ConfigurationError(f"unknown DLAMI flavour {flavour!r}; allowed: {', '.join(FLAVOURS)}")
    if os not in OPERATING_SYSTEMS:
        raise ConfigurationError(f"unknown DLAMI os {os!r}; allowed: {', '.join(OPERATING_SYSTEMS)}")
    if sdk == "neuron":
        if os == "ubuntu-22.04":
            raise ConfigurationError("Neuron DLAMIs for Ubuntu 22.04 are out of support; use ubuntu-24.04 or amazon-linux-2023")
        kind = "multi-framework" if flavour == "pytorch" else "base"
        return f"/aws/service/neuron/dlami/{kind}/{os}/latest/image_id"
    if sdk != "cuda":
        raise ConfigurationError(f"no public Deep Learning AMI parameter for the {sdk} stack; pass ami_id or parameter_name")
    arch = _ARCH[architecture]
    ami_type = (f"base-oss-nvidia-driver-gpu-{os}" if flavour == "base"
                else f"oss-nvidia-driver-gpu-pytorch-{pytorch_version}-{os}")
    return f"/aws/service/deeplearning/ami/{arch}/{ami_type}/latest/ami-id"


@jsii.implements(ec2.IMachineImage)
class DeepLearningAmi:
    """An IMachineImage for the Deep Learning AMI that fits an instance type.

    Keyword-only props (defaults in brackets):
      instance: type name or InstanceFacts; picks x86_64/arm64 and CUDA vs Neuron.
      flavour ["pytorch"]: "pytorch" (PyTorch preinstalled) or "base" (drivers, CUDA, NCCL, EFA only).
      os ["ubuntu-24.04"]: "ubuntu-22.04", "ubuntu-24.04" or "amazon-linux-2023".
      pytorch_version ["2.11"]: the PyTorch DLAMI line.
      ami_id: an explicit AMI id (skips SSM).
      parameter_name: another SSM parameter (e.g. your golden image's).
      pin [False]: resolve once at synth and store the id in cdk.context.json, so that a
        redeploy never changes the AMI unasked (needs the stack's account/region and credentials
        on first synth; `cdk context --reset` re-resolves). Unpinned, CloudFormation resolves
        the parameter on every deploy: all nodes of one deployment share an AMI.
    """

    def __init__(self, *, instance: InstanceLike, flavour: str = "pytorch", os: str = "ubuntu-24.04",
                 pytorch_version: str = DEFAULT_PYTORCH, ami_id: Optional[str] = None,
                 parameter_name: Optional[str] = None, pin: bool = False) -> None:
        self.facts = resolve(instance)
        self.architecture = self.facts.architecture
        self.os = os
        self.ami_id = ami_id
        self.pin = pin
        if ami_id is None and parameter_name is None:
            parameter_name = dlami_parameter(sdk=self.facts.sdk, architecture=self.architecture, flavour=flavour,
                                             os=os, pytorch_version=pytorch_version)
        self.parameter_name = parameter_name

    @property
    def root_device_name(self) -> str:
        return "/dev/xvda" if self.os == "amazon-linux-2023" else "/dev/sda1"

    def get_image(self, scope: Construct) -> ec2.MachineImageConfig:
        if self.ami_id:
            return ec2.MachineImageConfig(image_id=self.ami_id, os_type=ec2.OperatingSystemType.LINUX,
                                          user_data=ec2.UserData.for_linux())
        if self.parameter_name is None:  # ami_id="" was given, which names no image
            raise ConfigurationError("DeepLearningAmi: ami_id is empty; pass an AMI id, or a parameter_name")
        image = ec2.MachineImage.from_ssm_parameter(self.parameter_name, os=ec2.OperatingSystemType.LINUX,
                                                    cached_in_context=self.pin or None)
        return image.get_image(scope)
