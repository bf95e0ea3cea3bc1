"""The IMDSv2 stand-in lives with the local simulation (scripts/fake_imds.py), which the demo uses too."""
from scripts.fake_imds import FakeImds

__all__ = ["FakeImds"]
