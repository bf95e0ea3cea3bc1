"""CDK constructs for accelerated EC2 nodes. Instance facts come from the selector's catalog.

Names load lazily, so that `python -m constructs_lib.runtime` on a node (standard library and
boto3 only) never imports aws_cdk.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DeepLearningAmi": ".ami", "dlami_parameter": ".ami",
    "EfaNetworking": ".efa", "efa_interfaces": ".efa",
    "GpuLaunchTemplate": ".launch_template",
    "NodeIdentity": ".identity",
    "NodeBootstrap": ".bootstrap",
    "NodeOptions": ".node_options",
    "NvmeRaid0": ".raid",
    "CheckpointBucket": ".checkpoints",
    "ClusterCapacity": ".capacity",
    "InstanceOption": ".capacity",
    "CapacityController": ".controller",
    "InterruptionAlerts": ".alerts",
    "JobDefinition": ".job",
    "JobLogs": ".job",
    "CodeAsset": ".code",
    "ConfigurationError": ".validation",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'constructs_lib' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
