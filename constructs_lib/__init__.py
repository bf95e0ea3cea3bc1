"""CDK constructs for accelerated EC2 nodes. Instance facts come from the selector's catalog."""
from .ami import DeepLearningAmi, dlami_parameter
from .efa import EfaNetworking, efa_interfaces
from .launch_template import GpuLaunchTemplate
from .raid import NvmeRaid0
from .validation import ConfigurationError

__all__ = ["DeepLearningAmi", "dlami_parameter", "EfaNetworking", "efa_interfaces", "GpuLaunchTemplate",
           "NvmeRaid0", "ConfigurationError"]
