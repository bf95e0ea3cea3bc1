"""One simulated node of the drill (drill.py): an EC2 instance in moto, a fake IMDS on its own
loopback address (127.0.0.x), its own directories, and the project's rendered systemd units run
by a small init that follows their ExecStart, Restart= and RestartPreventExitStatus=. kill() is
AWS taking the node: EC2 first, then every process of its tree at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from constructs_lib.runtime import contract
from tests.runtime.fake_imds import FakeImds

if TYPE_CHECKING:
    from tests.runtime.drill import Drill

VENV_BIN = Path(sys.executable).parent


def parse_unit(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass
class UnitRun:
    name: str
    exits: list[int] = field(default_factory=list)
    starts: int = 0
    proc: Optional[subprocess.Popen] = None
    done: bool = False


class Node:
    def __init__(self, drill: "Drill", addr: str, node_env: Optional[dict[str, str]] = None,
                 tools: Optional[dict[str, str]] = None) -> None:
        """node_env: lines added to this node's node.env; tools: {name: bash body} stand-ins put first
        on its PATH (a tool that replays a recorded output)."""
        self.drill = drill
        self.addr = addr
        ec2 = drill.ec2
        r = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge",
                              SubnetId=drill.subnet, TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                  {"Key": contract.TAG_CLUSTER, "Value": drill.cluster}]}])
        self.id = r["Instances"][0]["InstanceId"]
        self.imds = FakeImds({contract.TAG_CLUSTER: drill.cluster, contract.TAG_NODES: str(drill.nodes),
                              contract.TAG_CHECKPOINT_BUCKET: drill.bucket,
                              contract.TAG_CHECKPOINT_PREFIX: drill.prefix},
                             instance_id=self.id, local_ipv4=addr).start()
        self.root = drill.root / f"node-{addr}"
        self.dirs = {"DL_ETC_DIR": self.root / "etc", "DL_RUN_DIR": self.root / "run",
                     "DL_LIB_DIR": drill.lib, "DL_SCRATCH": self.root / "scratch", "DL_LOG_DIR": self.root / "log",
                     "DL_MEMORY_DIR": self.root / "mem"}
        for var, d in self.dirs.items():
            d.mkdir(parents=True, exist_ok=True)
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        (bin_dir / "dl-torchrun").symlink_to(drill.lib / "dl_torchrun.sh")
        for name, body in (tools or {}).items():
            (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
            (bin_dir / name).chmod(0o755)
        (self.dirs["DL_ETC_DIR"] / "node.env").write_text(contract.env_text({
            "DL_PROCS_PER_NODE": str(drill.nproc), "DL_SDK": "cuda", **drill.job_env, **(node_env or {})}))
        if drill.command:
            (self.dirs["DL_ETC_DIR"] / "job.sh").write_text(drill.command + "\n")
        self.env = {
            **drill.base_env, **{k: str(v) for k, v in self.dirs.items()},
            "PATH": f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}",
            "DL_IMDS_ENDPOINT": self.imds.endpoint, "DL_DRILL_NODE": self.id,
        }
        self.units: dict[str, UnitRun] = {}
        self.alive = True
        self.killed_at: Optional[float] = None

    @property
    def checkpoints(self) -> Path:
        return self.dirs["DL_SCRATCH"] / "checkpoints"

    def _command(self, exec_start: str) -> list[str]:
        # The unit's own ExecStart, with this node's directories in place of the contract's.
        for var, default in contract.DIR_DEFAULTS.items():
            exec_start = exec_start.replace(default, str(self.dirs[var]))
        return exec_start.split()

    def start_unit(self, name: str) -> None:
        spec = parse_unit(self.drill.units[name])
        run = self.units[name] = UnitRun(name)
        prevent = {int(x) for x in spec.get("RestartPreventExitStatus", "").split()}
        policy = spec.get("Restart", "no")
        delay = min(1.0, float(spec.get("RestartSec", "0")))
        log = open(self.root / f"{name}.log", "ab")

        def loop() -> None:
            while self.alive:
                run.starts += 1
                run.proc = subprocess.Popen(self._command(spec["ExecStart"]), env=self.env, cwd=self.root,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                rc = run.proc.wait()
                if not self.alive:
                    return
                run.exits.append(rc)
                restart = (policy == "always") or (policy == "on-failure" and rc != 0 and rc not in prevent)
                if not restart:
                    run.done = True
                    return
                time.sleep(delay)

        threading.Thread(target=loop, daemon=True, name=f"{self.addr}:{name}").start()

    def processes(self) -> list[int]:
        pids = []
        marker = f"DL_DRILL_NODE={self.id}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def kill(self) -> None:
        """AWS takes the node: EC2 first (as the API shows it), then every process at once."""
        self.drill.ec2.terminate_instances(InstanceIds=[self.id])
        self.alive = False
        self.killed_at = time.time()
        for _ in range(3):
            for pid in self.processes():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        self.imds.stop()

    def log_text(self, unit: str = "dl-job.service") -> str:
        p = self.root / f"{unit}.log"
        return p.read_text(errors="replace") if p.exists() else ""
