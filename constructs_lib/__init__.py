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
    "LustreData": ".fsx",
    "ConfigurationError": ".validation",
    "ClusterObservability": ".observability.cluster",
    "IdleGuard": ".observability.guard",
    "NotificationTopic": ".observability.notifications",
    "TrainingDashboard": ".observability.dashboard",
    "cost_budget": ".observability.budget",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers and IDEs (nothing is imported at run time)
    from .alerts import InterruptionAlerts as InterruptionAlerts
    from .ami import DeepLearningAmi as DeepLearningAmi, dlami_parameter as dlami_parameter
    from .bootstrap import NodeBootstrap as NodeBootstrap
    from .capacity import ClusterCapacity as ClusterCapacity, InstanceOption as InstanceOption
    from .checkpoints import CheckpointBucket as CheckpointBucket
    from .code import CodeAsset as CodeAsset
    from .controller import CapacityController as CapacityController
    from .efa import EfaNetworking as EfaNetworking, efa_interfaces as efa_interfaces
    from .fsx import LustreData as LustreData
    from .identity import NodeIdentity as NodeIdentity
    from .job import JobDefinition as JobDefinition, JobLogs as JobLogs
    from .launch_template import GpuLaunchTemplate as GpuLaunchTemplate
    from .node_options import NodeOptions as NodeOptions
    from .observability.budget import cost_budget as cost_budget
    from .observability.cluster import ClusterObservability as ClusterObservability
    from .observability.dashboard import TrainingDashboard as TrainingDashboard
    from .observability.guard import IdleGuard as IdleGuard
    from .observability.notifications import NotificationTopic as NotificationTopic
    from .raid import NvmeRaid0 as NvmeRaid0
    from .validation import ConfigurationError as ConfigurationError


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'constructs_lib' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
