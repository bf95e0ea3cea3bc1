"""Nodes find each other with no manual step: the cluster's running instances (by tag, from the
EC2 API), ordered by private IP, give every node the same hostfile, rank 0 and torchrun settings.

When AWS replaces a spot node, every node derives the list again before the job restarts (the
job unit runs this before each start), so ranks and MASTER_ADDR stay consistent.
"""
from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from typing import Callable

from .errors import RuntimeUserError
from .layout import write_atomic

TAG_CLUSTER = "dl-launcher:cluster"
TAG_NODES = "dl-launcher:nodes"
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Rendezvous:
    hosts: tuple[str, ...]       # private IPs, rank order
    node_rank: int
    nproc_per_node: int
    port: int = DEFAULT_PORT
    cluster: str = ""

    @property
    def master_addr(self) -> str:
        return self.hosts[0]

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    def env(self) -> dict[str, str]:
        return {
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.port), "NNODES": str(self.nnodes),
            "NODE_RANK": str(self.node_rank), "NPROC_PER_NODE": str(self.nproc_per_node),
            "WORLD_SIZE": str(self.nnodes * self.nproc_per_node),
            "DL_RDZV_ENDPOINT": f"{self.master_addr}:{self.port}", "DL_RDZV_ID": self.cluster or "dl-launcher",
        }


def cluster_members(ec2, cluster: str) -> list[str]:
    """Private IPs of the cluster's pending or running instances, in rank order."""
    ips = []
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                if inst.get("PrivateIpAddress"):
                    ips.append(inst["PrivateIpAddress"])
    return sorted(set(ips), key=ipaddress.ip_address)


def discover(ec2, cluster: str, my_ip: str, nodes: int, nproc_per_node: int, *, port: int = DEFAULT_PORT,
             timeout: float = 900.0, poll: float = 10.0, sleep: Callable[[float], None] = time.sleep,
             log: Callable[[str], None] = print) -> Rendezvous:
    """Wait until `nodes` members are up (a spot replacement may still be launching), then rank."""
    deadline = time.monotonic() + timeout
    while True:
        members = cluster_members(ec2, cluster)
        if len(members) >= nodes and my_ip in members[:nodes]:
            hosts = tuple(members[:nodes])
            return Rendezvous(hosts, hosts.index(my_ip), nproc_per_node, port, cluster)
        if my_ip in members[nodes:]:
            # More members than nodes: a replacement came up before the old node was gone.
            log(f"{len(members)} members for {nodes} nodes; {my_ip} is a spare until one leaves")
        if time.monotonic() >= deadline:
            raise RuntimeUserError(f"rendezvous: {len(members)} of {nodes} nodes of cluster {cluster!r} are up after "
                                   f"{timeout:.0f} s; check the Auto Scaling group's activity for capacity errors")
        log(f"waiting for nodes: {len(members)}/{nodes} up")
        sleep(poll)


def write(r: Rendezvous, env_file: str, hostfile: str) -> None:
    write_atomic(env_file, "".join(f'{k}="{v}"\n' for k, v in r.env().items()))
    write_atomic(hostfile, "".join(f"{h} slots={r.nproc_per_node}\n" for h in r.hosts))
