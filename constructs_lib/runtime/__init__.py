"""What runs on the node: checkpoint push/pull, the interruption watcher, resume at boot.

Standard library plus boto3 (which the Deep Learning AMI ships); no torch, no CDK. Training
code uses `Checkpointer` from here; scripts use `python -m constructs_lib.runtime`.
"""
from .helper import Checkpointer, interruption_notice

__all__ = ["Checkpointer", "interruption_notice"]
