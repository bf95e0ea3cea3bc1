"""The capacity controller: `nodes` instances of one type, launched all or nothing with EC2 Fleet
(instant), replaced in place, moved whole to the next option when the type cannot be had.

Standard library and boto3 only: it runs in a Lambda function (`handler.handle`) that EventBridge
and a CloudFormation custom resource invoke; `spec` is also what the CDK side imports.
"""
from .controller import KINDS, Controller, Transition
from .spec import MARKETS, CapacityOption, ClusterSpec
from .state import ControllerState, StateStore

__all__ = ["KINDS", "MARKETS", "CapacityOption", "ClusterSpec", "Controller", "ControllerState", "StateStore",
           "Transition"]
