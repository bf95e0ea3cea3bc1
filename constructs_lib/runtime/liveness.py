"""Which members of the cluster are gone, from their heartbeats and one node's EC2 check.

Every node rewrites `_cluster/beat/<node>` once per liveness period (cluster.py writes and lists
them); a member whose beat stopped is asked about by one node only, and what EC2 confirms is
recorded under `_cluster/gone/` for every node to read: whatever the cluster's size, the cluster's
EC2 calls are at most one per period.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable, Optional

from dl_core.aws import error_code, not_found

from .decisions import askers, suspects

if TYPE_CHECKING:
    from .cluster import ClusterState

_NOT_FOUND = re.compile(r"i-[0-9a-f]{8,17}")


class Liveness:
    """Which nodes are gone: terminated, shutting down, stopping or stopped, or unknown to EC2.

    Every node beats (ClusterState.beat, once a period); a node whose beat is older than `stale`
    seconds by S3's clock is a suspect. One node, the first of those beating in id order, asks
    EC2 about the suspects (at most 200 ids a call) and records the ones it confirms; every node
    reads those records. So EC2 is asked at most once a period per cluster, and only while a beat
    is missing; a node that is only slow (a long restore, S3 throttling its beats) is confirmed
    running and stays. EC2 throttling, 5xx and timeouts confirm nothing: never gone on an error.

    Urgent suspects skip the wait for a stale beat: when a run's collectives fail, or a previous
    member has not rejoined, the first two of the nodes sharing that urgency ask EC2 at once about
    the peers not proven alive since (issue 37: a kill is known in seconds, not after 30 s). The
    fleet controller records a member's termination here too, from its own EC2 event.
    """

    ALIVE = ("pending", "running")
    CHUNK = 200  # DescribeInstances' most instance ids per filter (EC2 API reference)

    def __init__(self, ec2, cluster: Optional["ClusterState"] = None, *, me: str = "", stale: float = 30.0,
                 log=lambda line: None) -> None:
        self.ec2, self.cluster, self.me, self.stale, self.log = ec2, cluster, me, stale, log

    def gone(self, nodes: Iterable[str], *, urgent: Iterable[str] = (), among: Optional[Iterable[str]] = None,
             since: Optional[float] = None) -> set[str]:
        """The `nodes` recorded gone, after the askers' EC2 check of the suspects (decisions.suspects).
        urgent: ask EC2 about these now whatever their heartbeat (a failed run's peers, a previous
            member that has not rejoined), unless they beat a full second after `since` (S3's clock).
        among: the nodes whose first live ones ask (decisions.askers) [every beating node]: under
            urgency the members that share the urgency, so a node that does not is never relied on."""
        nodes, urgent = set(nodes), set(urgent)
        if not nodes:
            return set()
        if self.cluster is None:  # no heartbeats to go by: ask EC2 about every node
            return self.confirm(nodes)
        recorded = self.cluster.gone_nodes()
        beats, now = self.cluster.beats()
        fresh = {n for n, t in beats.items() if now - t <= self.stale}
        asking = askers(beats if among is None else among, fresh, recorded, urgent=bool(urgent))
        ask = suspects(nodes, recorded, beats, now, stale=self.stale, urgent=urgent & nodes, since=since)
        if ask and self.me in asking:
            for n in self.confirm(ask):
                self.cluster.record_gone(n, "terminated or unknown to EC2")
                recorded.add(n)
        return nodes & recorded

    def confirm(self, nodes: Iterable[str]) -> set[str]:
        """The nodes EC2 says are gone. An error other than 'this id does not exist' confirms
        nothing (logged): throttling is account-wide and must not end every run at once."""
        from botocore.exceptions import BotoCoreError, ClientError
        todo, gone = sorted(set(nodes)), set()
        for i in range(0, len(todo), self.CHUNK):
            chunk = todo[i:i + self.CHUNK]
            while chunk:
                try:
                    states = self._states(chunk)
                except ClientError as e:
                    code = error_code(e)
                    unknown = set(_NOT_FOUND.findall(str(e))) & set(chunk) if not_found(e) else set()
                    if not unknown:  # throttled, 5xx, or an answer we cannot read: nothing is confirmed
                        self.log(f"liveness: EC2 said {code or type(e).__name__}; no node is counted gone on that")
                        break
                    gone |= unknown
                    chunk = [n for n in chunk if n not in unknown]
                    continue
                except BotoCoreError as e:  # timeouts, connection errors
                    self.log(f"liveness: EC2 unreachable ({type(e).__name__}); no node is counted gone on that")
                    break
                gone |= {n for n in chunk if states.get(n) not in self.ALIVE}  # not listed: unknown
                break
        return gone

    def _states(self, nodes: list[str]) -> dict[str, str]:
        out = {}
        for page in self.ec2.get_paginator("describe_instances").paginate(InstanceIds=nodes):
            for r in page["Reservations"]:
                for i in r["Instances"]:
                    out[i["InstanceId"]] = i["State"]["Name"]
        return out
