"""One node of a deployed stack, simulated on this machine: the launch template's real user data
run by bash on a fake root, every AWS call against moto, the instance's tags and identity from
a fake IMDSv2, and the units it installs started as systemd would (their ExecStart lines).

What is not real, and why: systemd (a small runner follows each unit's ExecStart instead), the
node's paths (the contract's directory variables move them under the node's root; node.env's
/scratch values are moved the same way after boot), and the CloudWatch agent, which cannot run
here: `ship_logs` does what its documented logs section does with the configuration the node
was given (the stack's SSM parameter or the file the node wrote): each new line of each
collect_list file_path to log_group_name, stream log_stream_name with {instance_id} filled in.

Used by the local demo (scripts/local_deploy.py) and the tests (tests/job).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional

from constructs_lib.runtime import contract
from constructs_lib.runtime.notice import descendants

VENV_BIN = Path(sys.executable).parent
SHIM = """#!/bin/sh
# {name}, recorded: the simulated node has no systemd and never powers off.
echo "{name} $*" >> "$SIM_CALLS"
"""


class SimNode:
    def __init__(self, root: Path, *, user_data: str, endpoint: str, instance_id: str, addr: str,
                 tags: Mapping[str, str], region: str = "us-east-1", extra_env: Optional[Mapping[str, str]] = None,
                 path_prefix: Optional[list[str]] = None, procs_per_node: Optional[int] = None) -> None:
        try:
            from scripts.fake_imds import FakeImds
        except ImportError:  # run as a script from scripts/ (the local demo)
            from fake_imds import FakeImds

        self.root, self.endpoint, self.instance_id, self.region = root, endpoint, instance_id, region
        self.dirs = {var: root / default.lstrip("/") for var, default in contract.DIR_DEFAULTS.items()}
        self.shims = root / "shims"
        self.shims.mkdir(parents=True, exist_ok=True)
        for name in ("systemctl", "shutdown"):
            (self.shims / name).write_text(SHIM.format(name=name))
            (self.shims / name).chmod(0o755)
        self.user_data = root / "user-data"
        self.user_data.write_text(user_data)
        self.imds = FakeImds(dict(tags), instance_id=instance_id, local_ipv4=addr, region=region).start()
        # No AWS CLI on PATH: the bootstrap then downloads with python3 and boto3, as on an AMI without one.
        # The node's /usr/local/bin (install.sh links dl-torchrun there) as on an AMI's PATH.
        path = [*(path_prefix or []), str(self.shims), str(root / "usr/local/bin"), str(VENV_BIN), "/usr/bin", "/bin"]
        self.env = {
            "PATH": ":".join(path), "HOME": str(root), "LANG": "C.UTF-8",
            **{k: str(v) for k, v in self.dirs.items()},
            "DL_UNIT_DIR": str(root / "etc/systemd/system"), "DL_BIN_DIR": str(root / "usr/local/bin"),
            "DL_PROFILE_DIR": str(root / "etc/profile.d"), "DL_BOOTSTRAP_LOG": str(root / "var/log/bootstrap.log"),
            "DL_IMDS_ENDPOINT": self.imds.endpoint, "DL_PYTHON": sys.executable, "SIM_CALLS": str(root / "calls.log"),
            "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "sim", "AWS_SECRET_ACCESS_KEY": "sim",
            "AWS_DEFAULT_REGION": region, "AWS_REGION": region, "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "PYTHONUNBUFFERED": "1", "DL_SIM_NODE": instance_id,
            **(extra_env or {}),
        }
        # A CPU core stands in for a node's GPUs: one training process instead of eight, where asked.
        self.procs_per_node = procs_per_node
        self.procs: dict[str, subprocess.Popen] = {}
        self._offsets: dict[str, int] = {}
        self._tokens: dict[tuple[str, str], Optional[str]] = {}

    # ---- boot -----------------------------------------------------------------------------------
    def boot(self, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the user data as cloud-init would (root, bash), then move node.env's default paths."""
        r = subprocess.run(["bash", str(self.user_data)], env=self.env, capture_output=True, text=True, timeout=timeout)
        node_env = self.dirs["DL_ETC_DIR"] / "node.env"
        if node_env.exists():
            text = node_env.read_text()
            for var, default in contract.DIR_DEFAULTS.items():
                text = text.replace(f'="{default}', f'="{self.dirs[var]}')
            import re
            if self.procs_per_node is not None:
                text = re.sub(r'^DL_PROCS_PER_NODE=".*"$', f'DL_PROCS_PER_NODE="{self.procs_per_node}"', text, flags=re.M)
            # This machine has none of the GPUs, EFA devices or NVMe RAID the type has: the boot health
            # gate checks what the simulated node has, nothing (tests/runtime/test_health_gate.py drills
            # every check on recorded tool outputs).
            for var in ("DL_EXPECTED_GPUS", contract.ENV_EXPECTED_EFA, contract.ENV_EXPECTED_SCRATCH_GB):
                text = re.sub(rf'^{var}=".*"$', f'{var}="0"', text, flags=re.M)
            node_env.write_text(text)
        return r

    def calls(self) -> list[str]:
        p = self.root / "calls.log"
        return p.read_text().splitlines() if p.exists() else []

    def node_env(self) -> dict[str, str]:
        return contract.parse_env((self.dirs["DL_ETC_DIR"] / "node.env").read_text())

    # ---- units ----------------------------------------------------------------------------------
    def unit_command(self, unit: str, key: str = "ExecStart") -> list[str]:
        text = (self.root / "etc/systemd/system" / unit).read_text()
        line = next(x for x in text.splitlines() if x.startswith(f"{key}="))
        command = line.split("=", 1)[1].lstrip("-")
        for var, default in contract.DIR_DEFAULTS.items():
            command = command.replace(default, str(self.dirs[var]))
        return command.split()

    def start(self, unit: str) -> subprocess.Popen:
        log = open(self.root / f"{unit}.log", "ab")
        proc = subprocess.Popen(self.unit_command(unit), env=self.env, cwd=self.root, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[unit] = proc
        return proc

    def kill(self, unit: str) -> None:
        """What systemd does to a unit it restarts (KillMode=control-group, then SIGKILL): the
        whole process group, at once."""
        proc = self.procs.pop(unit, None)
        if proc is None:
            return
        # A cgroup holds children that started sessions of their own (the transfer tool, setup),
        # which a process-group kill would miss: collect the whole tree first.
        tree = descendants(proc.pid)
        for pid in [proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def wait(self, unit: str, timeout: float = 120, *, ship_logs: bool = True) -> int:
        proc = self.procs[unit]
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ship_logs:
                self.ship_logs()
            if proc.poll() is not None:
                if ship_logs:
                    self.ship_logs()
                return proc.returncode
            time.sleep(0.2)
        raise TimeoutError(f"{unit} still running after {timeout:.0f} s:\n{self.unit_log(unit)[-3000:]}")

    @staticmethod
    def wait_all(nodes: list["SimNode"], unit: str, timeout: float = 300) -> list[int]:
        """Every node's `unit` to its end, shipping every node's log as it goes (as each node's
        agent would, side by side)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for n in nodes:
                n.ship_logs()
            codes = [n.procs[unit].poll() for n in nodes]
            if all(c is not None for c in codes):
                for n in nodes:
                    n.ship_logs()
                return codes  # type: ignore[return-value]
            time.sleep(0.3)
        raise TimeoutError(f"{unit} still running after {timeout:.0f} s on "
                           + ", ".join(n.instance_id for n in nodes if n.procs[unit].poll() is None))

    def unit_log(self, unit: str) -> str:
        p = self.root / f"{unit}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        for unit in list(self.procs):
            self.kill(unit)
        self.imds.stop()

    # ---- the CloudWatch agent's logs section, done by a stand-in --------------------------------
    def agent_config(self) -> dict:
        import boto3

        env = self.node_env()
        if env.get("DL_CWAGENT_PARAMETER"):
            ssm = boto3.client("ssm", endpoint_url=self.endpoint, region_name=self.region)
            return json.loads(ssm.get_parameter(Name=env["DL_CWAGENT_PARAMETER"])["Parameter"]["Value"])
        path = self.dirs["DL_RUN_DIR"] / contract.FILES["cwagent_config"][1]
        if not path.exists():
            r = subprocess.run(["bash", str(self.dirs["DL_LIB_DIR"] / "dl_runtime.sh"), "cwagent-config", "--out",
                                str(path)], env={**self.env, **env}, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"cwagent-config failed: {r.stderr}")
        return json.loads(path.read_text())

    def ship_logs(self) -> int:
        """Each collect_list file's new whole lines to its group and stream; returns how many."""
        import boto3

        config = self.agent_config().get("logs", {}).get("logs_collected", {}).get("files", {})
        client = boto3.client("logs", endpoint_url=self.endpoint, region_name=self.region)
        sent = 0
        for entry in config.get("collect_list", []):
            path = entry["file_path"]
            for var, default in contract.DIR_DEFAULTS.items():
                if path.startswith(default + "/"):
                    path = str(self.dirs[var]) + path[len(default):]
            if not os.path.exists(path):
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            if not end:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + end
            group = entry["log_group_name"]
            stream = entry.get("log_stream_name", "{instance_id}").replace("{instance_id}", self.instance_id)
            key = (group, stream)
            if key not in self._tokens:
                try:
                    client.create_log_stream(logGroupName=group, logStreamName=stream)
                except client.exceptions.ResourceAlreadyExistsException:
                    pass
                self._tokens[key] = None
            now = int(time.time() * 1000)
            # PutLogEvents refuses an empty message (minimum length 1): a blank line is not an event.
            events = [{"timestamp": now, "message": line.decode(errors="replace")}
                      for line in chunk[:end].splitlines() if line.strip()]
            for i in range(0, len(events), 1000):
                client.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events[i:i + 1000])
            sent += len(events)
        return sent
