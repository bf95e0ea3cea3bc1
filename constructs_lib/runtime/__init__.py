"""What runs on the node: the job supervisor, the node agent (spot notices, checkpoint uploads),
checkpoint push/pull, and the Checkpointer that training code uses.

Standard library plus boto3 (which the Deep Learning AMI ships); no CDK, and torch only inside
a training process. Training code uses `Checkpointer`; systemd runs `python -m constructs_lib.runtime`.
"""
from .checkpointer import Checkpointer

__all__ = ["Checkpointer"]
