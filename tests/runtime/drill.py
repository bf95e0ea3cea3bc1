"""A multi-node cluster on one machine, for the drill: each node is a process tree with its own
directories, loopback address (127.0.0.x), EC2 instance in moto and fake IMDS, running the
project's own node bundle (the same files the CDK asset ships) under a small init that follows
the rendered systemd units' ExecStart, Restart= and RestartPreventExitStatus=.

Killing a node terminates its instance in moto (EC2 says "shutting-down" as AWS would) and
SIGKILLs every process of its tree at once: no goodbye, no flush. One node is drill_node.Node.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Callable, Optional

import boto3

from constructs_lib.runtime import contract
from tests.runtime.drill_node import VENV_BIN, Node
from tests.runtime.free_port import free_port

ROOT = Path(__file__).resolve().parents[2]
# The drill's training project, shipped to the nodes as a deployer's code is: -c code=DIR.
PROJECT = Path(__file__).with_name("drill_project")
TRAIN = PROJECT / "drill_train.py"


def start_moto_server(log_path: Path) -> tuple[subprocess.Popen, str]:
    """moto_server in a process of its own on 127.0.0.1: the nodes hammer it from many processes,
    and an in-process server would share the caller's GIL with the harness."""
    import urllib.request

    port = free_port()
    server = subprocess.Popen([str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            return server, endpoint
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"moto_server did not start on {endpoint}")
            time.sleep(0.1)


def unit_texts() -> dict[str, str]:
    from constructs_lib.bundle import unit_texts as rendered
    return rendered()


def build_lib(dest: Path) -> None:
    from constructs_lib.bundle import build_bundle
    build_bundle(str(dest))


class Drill:
    def __init__(self, root: Path, endpoint: str, *, steps: int, every: int = 10, sleep: float = 0.05,
                 pad_mb: int = 0, nodes: int = 2, nproc: int = 2, job: str = "drill",
                 command: Optional[str] = None, script: str = TRAIN.name, args: Optional[str] = None,
                 code: Path = PROJECT, context: Optional[dict] = None, job_command: Optional[str] = None) -> None:
        self.root = root
        self.nodes = nodes
        self.nproc = nproc
        self.cluster = f"dl-{job}"
        self.bucket = "drill-ckpt"
        self.prefix = f"jobs/{job}"
        self.events = root / "events.jsonl"
        self.final = root / "final.pt"
        self.steps = steps
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("DL_", "PYTEST", "COV_"))}
        self.base_env.update({
            "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "DL_PYTHON": sys.executable, "DL_TORCHRUN": str(VENV_BIN / "torchrun"),
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "DL_POLL_SECONDS": "0.3", "DL_LIVENESS_POLL_SECONDS": "1", "DL_AGENT_POLL_SECONDS": "0.2",
            "DL_MEMBER_GRACE_SECONDS": "60", "DL_STOP_TIMEOUT_SECONDS": "5", "DL_RETRY_BASE_SECONDS": "0.2",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
        })
        # torch's store listens on every address: drills running side by side need their own ports.
        # A hash of the path alone collided now and then (1 in 40 per pair): hold a lock per range.
        self._port_lock = _port_range(root)
        self.base_env["DL_RENDEZVOUS_PORT_BASE"] = str(port_base(self._port_lock))
        # The training command runs from the shipped code in its working directory (the app's own
        # JobDefinition: -c code= -c command=); other drills write a job file as enable_job does.
        self.job_env: dict[str, str] = {}
        if command is None:
            extra = f"--pad-mb {pad_mb}" if args is None else args
            command = job_command or (f"dl-torchrun {script} --steps {steps} --every {every} --sleep {sleep} {extra} "
                                      f"--events {self.events} --final {self.final}")
            self.job_env = deployed_job(root / "cdk.out", endpoint, job=job, nodes=nodes, code=code, command=command,
                                        context=context)
            command = ""
        self.command = command
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        self.s3.create_bucket(Bucket=self.bucket)
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20")["Subnet"]["SubnetId"]
        self.lib = root / "lib"
        build_lib(self.lib)
        self.units = unit_texts()
        self.all_nodes: list[Node] = []
        self._events: list[dict] = []
        self._offset = 0

    def add_node(self, addr: str, node_env: Optional[dict[str, str]] = None,
                 tools: Optional[dict[str, str]] = None) -> Node:
        node = Node(self, addr, node_env, tools)
        self.all_nodes.append(node)
        node.start_unit("dl-node-agent.service")
        node.start_unit("dl-job.service")
        return node

    def live(self) -> list[Node]:
        return [n for n in self.all_nodes if n.alive]

    def read_events(self) -> list[dict]:
        """Every event so far (read incrementally: the harness polls this often)."""
        if not self.events.exists():
            return []
        with open(self.events, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                self._events.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a SIGKILL
        return self._events

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 90.0, poll: float = 0.01) -> None:
        t0 = time.monotonic()
        end = t0 + timeout
        while time.monotonic() < end:
            if cond():
                print(f"[drill] {time.monotonic() - t0:6.1f} s waiting for {what}", flush=True)
                return
            time.sleep(poll)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n" + self.dump())

    def steps_seen(self, gen: Optional[str] = None) -> list[int]:
        return [e["step"] for e in self.read_events() if e["event"] == "step" and (gen is None or e["gen"] == gen)]

    def current_gen(self) -> Optional[str]:
        starts = [e for e in self.read_events() if e["event"] == "start"]
        return starts[-1]["gen"] if starts else None

    def running(self, gen: str, min_step: int) -> bool:
        """Every rank of generation `gen` has done a step >= min_step."""
        ev = [e for e in self.read_events() if e["event"] == "step" and e["gen"] == gen and e["step"] >= min_step]
        return len({e["rank"] for e in ev}) == self.nodes * self.nproc

    def node_with_rank0(self, gen: str) -> "Node":
        starts = [e for e in self.read_events() if e["event"] == "start" and e["gen"] == gen and e["rank"] == 0]
        return next(n for n in self.all_nodes if n.id == starts[0]["node"])

    def plan(self, gen: str) -> dict:
        key = f"{self.prefix}/{contract.CLUSTER_DIR}/gen-{int(gen):06d}/plan.json"
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def newest_in_s3(self) -> int:
        """The newest step with a manifest in S3 (-1 if none)."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/step-")
        keys = [o["Key"] for p in pages for o in p.get("Contents", []) if o["Key"].endswith("/MANIFEST.json")]
        return max((int(k.split("/step-")[1][:12]) for k in keys), default=-1)

    def finished(self) -> bool:
        return all(n.units["dl-job.service"].done for n in self.live())

    def dump(self) -> str:
        parts = []
        for n in self.all_nodes:
            parts.append(f"--- node {n.addr} {n.id} alive={n.alive} units="
                         + ", ".join(f"{u.name}: starts {u.starts} exits {u.exits}" for u in n.units.values()))
            parts.append(n.log_text()[-3000:])
        return "\n".join(parts)

    def stop(self) -> None:
        self._port_lock.close()
        for n in self.all_nodes:
            if n.alive:
                n.alive = False
                for pid in n.processes():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                n.imds.stop()


PORT_FLOOR = 10000  # drill ranges start here and end below the kernel's ephemeral ports


def _port_ranges() -> int:
    """How many rendezvous ranges fit between PORT_FLOOR and the first ephemeral port. A range in
    the ephemeral span (32768-60999 on Linux) can be taken by any outgoing connection on the
    machine (gloo's own pairs, boto3's, another drill's), and a probe or store that cannot bind
    its port waits out torch's timeout: CI lost a drill to that once."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(1, min(40, (low - PORT_FLOOR) // contract.RENDEZVOUS_PORT_SPAN))


def _port_range(root: Path):
    """An open, locked file naming a rendezvous port range no other drill on this machine holds
    (its base: port_base(lock)); the lock goes with the file or the process."""
    import fcntl
    import tempfile

    locks = Path(tempfile.gettempdir()) / "dl-drill-ports"
    locks.mkdir(exist_ok=True)
    count = _port_ranges()
    first = zlib.crc32(str(root).encode()) % count
    for i in range(count):
        f = open(locks / str((first + i) % count), "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            f.close()
    raise RuntimeError(f"{count} drills at once on this machine: no rendezvous port range left")


def port_base(lock) -> int:
    """The first port of the range `lock` (from _port_range) holds."""
    return PORT_FLOOR + int(Path(lock.name).name) * contract.RENDEZVOUS_PORT_SPAN


def deployed_job(out: Path, endpoint: str, *, job: str, nodes: int, code: Path, command: str,
                 context: Optional[dict] = None) -> dict[str, str]:
    """The app synthesizes the job (-c code, -c command) and its assets and parameter go into
    moto as a deploy leaves them; returns the DL_JOB_ settings of node.env, as its user data
    carries them."""
    from constructs_lib.userdata import HEREDOC
    from tests.job.deployed import deploy

    d = deploy({"profile": "multi-node-training", "job": job, "nodes": str(nodes), "code": str(code),
                "command": command, "observability": "false", **(context or {})}, out, endpoint)
    node_env = d.user_data.split('dl_put "$DL_NODE_ENV_FILE" <<' + f"'{HEREDOC}'\n", 1)[1].split(f"\n{HEREDOC}\n", 1)[0]
    return {k: v for k, v in contract.parse_env(node_env).items() if k.startswith("DL_JOB_")}


def reference_run(root: Path, *, steps: int, every: int, rebuild_at: list[int], world: int,
                  script: Path = TRAIN, args: Optional[list[str]] = None) -> Path:
    """The same job, never interrupted, one torchrun with the same world size, rebuilding DDP at the
    steps where the drill resumed."""
    events, final = root / "ref-events.jsonl", root / "ref-final.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL_")}
    env.update({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                "DL_CHECKPOINT_DIR": str(root / "ref-ckpt"), "DL_RUN_DIR": str(root / "ref-run")})
    extra = ["--rebuild-at", ",".join(map(str, rebuild_at))] if args is None else args
    r = subprocess.run([str(VENV_BIN / "torchrun"), "--standalone", f"--nproc-per-node={world}", str(script),
                        "--steps", str(steps), "--every", str(every), "--sleep", "0",
                        "--events", str(events), "--final", str(final), *extra],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return final


def generations(events: list[dict]) -> dict[str, dict]:
    """Per generation: the start step of every rank, the steps done, saves and stops."""
    out: dict[str, dict] = {}
    for e in events:
        if e["gen"] is None:  # a rank started before its plan (restart=in-process): not a generation's
            continue
        g = out.setdefault(e["gen"], {"starts": {}, "steps": [], "saves": [], "stops": [], "t0": None})
        if e["event"] == "start":
            g["starts"][e["rank"]] = e["step"]
        elif e["event"] == "step":
            g["steps"].append(e["step"])
            if g["t0"] is None:
                g["t0"] = e["t"]
        elif e["event"] == "save":
            g["saves"].append(e["step"])
            g.setdefault("reasons", {})[e["step"]] = e.get("reason")
        elif e["event"] == "stop":
            g["stops"].append((e["rank"], e["step"]))
    return out

