"""CDK constructs for accelerated EC2 nodes. Instance facts come from the selector's catalog.

Names load lazily, so that `python -m constructs_lib.runtime` on a node (standard library and
boto3 only) never imports aws_cdk.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "ClusterObservability": ".observability.cluster",
    "IdleGuard": ".observability.guard",
    "NotificationTopic": ".observability.notifications",
    "TrainingDashboard": ".observability.dashboard",
    "cost_budget": ".observability.budget",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers and IDEs (nothing is imported at run time)
    from .alerts import InterruptionAlerts
    from .ami import DeepLearningAmi, dlami_parameter
    from .bootstrap import NodeBootstrap
    from .capacity import ClusterCapacity, InstanceOption
    from .checkpoints import CheckpointBucket
    from .code import CodeAsset
    from .controller import CapacityController
    from .efa import EfaNetworking, efa_interfaces
    from .identity import NodeIdentity
    from .job import JobDefinition, JobLogs
    from .launch_template import GpuLaunchTemplate
    from .node_options import NodeOptions
    from .observability.budget import cost_budget
    from .observability.cluster import ClusterObservability
    from .observability.dashboard import TrainingDashboard
    from .observability.guard import IdleGuard
    from .observability.notifications import NotificationTopic
    from .raid import NvmeRaid0
    from .validation import ConfigurationError


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'constructs_lib' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
