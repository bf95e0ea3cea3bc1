"""Issue 27: throttling is account-wide, so it hits every node of a cluster at once; it must never
stop a run. Two nodes train with real torchrun against moto_server through a proxy that answers
every S3 request with 503 SlowDown and every EC2 request with RequestLimitExceeded for 15 s
(15 liveness periods of the drill, 50 polls: two and a half minutes at a node's own periods). Then,
with S3 back, EC2 stays throttled while one node's supervisor is frozen (SIGSTOP), so that its
heartbeat goes stale and the other node must ask EC2 about it, and is refused (its ranks are
frozen with it, so the job cannot finish first). The training command is never stopped, nobody
is counted gone, no new generation forms, and the job finishes in generation 1."""
from __future__ import annotations

import os
import signal
import time

import pytest

from constructs_lib.runtime import contract
from tests.runtime.drill import TRAIN, Drill, generations
from tests.runtime.throttle_proxy import ThrottleProxy

pytestmark = pytest.mark.drill

THROTTLED_SECONDS = 15


def _tree(root: int) -> list[int]:
    """root and every process below it (the supervisor's runs are sessions of their own, so not
    its process group)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += frontier
    return found


def test_minutes_of_s3_and_ec2_throttling_leave_the_run_running(tmp_path, moto_process):
    (tmp_path / "run").mkdir()
    run = tmp_path / "run"
    # The job file, not a deployed job definition: the same supervisor, without a CDK synth.
    command = (f"dl-torchrun {TRAIN} --steps 600 --every 30 --sleep 0.04 --pad-mb 1 "
               f"--events {run / 'events.jsonl'} --final {run / 'final.pt'}")
    d = Drill(run, moto_process, steps=600, command=command)
    proxy = ThrottleProxy(moto_process, d.bucket).start()
    d.base_env["AWS_ENDPOINT_URL"] = proxy.endpoint  # the nodes' endpoint; the harness talks to moto
    try:
        nodes = [d.add_node("127.0.0.2"), d.add_node("127.0.0.3")]
        d.wait("generation 1 training", lambda: d.running("1", 40), timeout=180)
        proxy.throttle = {"s3", "ec2"}
        began = max(d.steps_seen("1"))
        time.sleep(THROTTLED_SECONDS)
        during = max(d.steps_seen("1"))
        proxy.throttle = {"ec2"}
        assert proxy.refused["s3"] > 10, proxy.refused
        assert during > began + 60, f"training went on while throttled: step {began} -> {during}"
        # A suspect while EC2 throttles: node 2's heartbeat stops, node 1 asks EC2 and is refused.
        # Node 2's whole job is frozen, its ranks too: training then waits in its collectives, where
        # with the supervisor alone frozen a quiet machine finished the job before the beat went
        # stale (30 s), and a finished run asks nobody.
        frozen = _tree(nodes[1].units["dl-job.service"].proc.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            d.wait("an EC2 check about the silent node, refused", lambda: "EC2 said RequestLimitExceeded; no node is "
                   "counted gone on that" in nodes[0].log_text(), timeout=60, poll=0.2)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        proxy.throttle = set()
        assert d.current_gen() == "1"
        d.wait("the job to finish on every node", d.finished, timeout=240)
    finally:
        d.stop()
        proxy.stop()
    assert set(generations(d.read_events())) == {"1"}, "no re-formation: nobody was counted gone"
    gone = d.s3.list_objects_v2(Bucket=d.bucket, Prefix=f"{d.prefix}/{contract.CLUSTER_DIR}/gone/").get("KeyCount", 0)
    assert gone == 0
    assert [n.units["dl-job.service"].exits for n in nodes] == [[0], [0]], d.dump()
    logs = "".join(n.log_text() for n in nodes)
    assert "stopping generation" not in logs, logs[-3000:]
    assert proxy.refused["ec2"] >= 3, proxy.refused
