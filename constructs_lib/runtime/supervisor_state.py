"""The supervisor's settings (from the job unit's environment) and the state it keeps across its
own restarts within one boot (in the run directory)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Optional

from . import contract
from .layout import write_atomic


@dataclass
class SupervisorConfig:
    cluster: str
    nodes: int
    nproc_per_node: int
    node: str                     # this instance's id
    addr: str                     # this instance's private address
    poll: float = 2.0             # seconds between looks at S3 while waiting or running
    liveness_poll: float = 10.0   # seconds between DescribeInstances calls
    member_grace: float = 600.0   # how long a new plan waits for a previous member that is neither back nor gone
    max_failures: int = 3         # failed runs in a row, without a newer checkpoint, before the job is failed
    stop_timeout: float = 20.0    # SIGTERM, then SIGKILL, for a run that must stop
    flush_timeout: float = 600.0  # how long to wait for the last save's upload before moving on
    retry_base: float = 1.0       # first backoff of S3 retries
    settle: float = 10.0          # a checkpoint_dir file without a framework marker is whole once unchanged this long

    @classmethod
    def from_env(cls, **kw) -> "SupervisorConfig":
        env = os.environ
        num = {"poll": "DL_POLL_SECONDS", "liveness_poll": "DL_LIVENESS_POLL_SECONDS",
               "member_grace": "DL_MEMBER_GRACE_SECONDS", "stop_timeout": "DL_STOP_TIMEOUT_SECONDS",
               "flush_timeout": "DL_FLUSH_TIMEOUT_SECONDS", "retry_base": "DL_RETRY_BASE_SECONDS",
               "settle": "DL_CHECKPOINT_SETTLE_SECONDS"}
        for name, var in num.items():
            if var in env and name not in kw:
                kw[name] = float(env[var])
        if "DL_MAX_FAILURES" in env and "max_failures" not in kw:
            kw["max_failures"] = int(env["DL_MAX_FAILURES"])
        return cls(**kw)


@dataclass
class State:
    """Survives a restart of the supervisor within one boot (it lives in the run directory)."""
    last_ran: int = 0
    failures: int = 0
    last_resume: Optional[int] = None
    history: list = field(default_factory=list)
    last_signature: Optional[str] = None  # the last failure's error (decisions.error_signature)

    @classmethod
    def load(cls) -> "State":
        try:
            with open(contract.path("supervisor_state")) as f:
                return cls(**json.load(f))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return cls()

    def save(self) -> None:
        write_atomic(contract.path("supervisor_state"), json.dumps(asdict(self)))
