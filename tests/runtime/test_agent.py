"""The node agent against a fake IMDSv2 and moto_server: notices, uploads, pruning, failures."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from constructs_lib.runtime import contract, notice
from constructs_lib.runtime.agent import NodeAgent, pushed_step, upload_lock
from constructs_lib.runtime.imds import Imds
from constructs_lib.runtime.resume import restore
from tests.runtime.s3_faults import s3_error
from tests.runtime.test_store import make_checkpoint


def _agent(store, local, imds, **kw) -> NodeAgent:
    return NodeAgent(store, str(local), imds=Imds(imds.endpoint), poll_seconds=0.01, upload_poll_seconds=0.01,
                     log=kw.pop("log", lambda m: None), **kw)


def test_a_termination_notice_is_recorded_once_and_the_agent_keeps_running(store, imds, tmp_path):
    logs = []
    agent = _agent(store, tmp_path / "ck", imds, log=logs.append)
    agent.watch_once()
    assert not notice.read().terminating
    imds.interrupt(seconds=120)
    for _ in range(3):
        n = agent.watch_once()
    assert n.termination["action"] == "terminate" and notice.read().terminating
    assert sum("termination notice" in line for line in logs) == 1, "handled once, however often it is polled"
    t = threading.Thread(target=agent.run, kwargs={"duration": 0.5})
    t.start()
    t.join(5)
    assert not t.is_alive(), "runs until stopped, not until the first notice"


def test_each_rebalance_recommendation_counts_once_even_across_agent_restarts(store, imds, tmp_path):
    imds.recommend_rebalance()
    _agent(store, tmp_path, imds).watch_once()
    _agent(store, tmp_path, imds).watch_once()  # systemd restarted the agent: same recommendation
    assert notice.read().rebalances == 1 and not notice.read().terminating
    time.sleep(1.1)
    imds.recommend_rebalance()  # a new one (new noticeTime)
    _agent(store, tmp_path, imds).watch_once()
    assert notice.read().rebalances == 2


def test_the_newest_save_is_uploaded_older_unpushed_ones_are_skipped_and_pruned(store, imds, tmp_path):
    local = tmp_path / "ck"
    for step in (1, 2, 3):
        make_checkpoint(local, step, sizes=(100,))
    agent = _agent(store, local, imds, keep=1)
    assert agent.upload_once() == 3
    assert [c.step for _, c in store.list() if c] == [3], "only the newest went up"
    assert pushed_step() == 3
    assert sorted(p.name for p in local.iterdir()) == ["step-000000000003"]
    assert agent.upload_once() is None, "nothing new: nothing uploaded"
    make_checkpoint(local, 4, sizes=(100,))
    assert agent.upload_once() == 4


def test_a_step_already_in_s3_is_not_uploaded_again(store, imds, tmp_path):
    local = tmp_path / "ck"
    store.push(str(make_checkpoint(tmp_path / "other", 8, sizes=(100,))), 8)
    make_checkpoint(local, 8, sizes=(100,))
    puts = []
    store.client.meta.events.register("before-parameter-build.s3.PutObject", lambda params, **kw: puts.append(1))
    assert _agent(store, local, imds).upload_once() is None and not puts and pushed_step() == 8


def test_a_save_being_uploaded_is_never_moved_or_deleted(store, imds, tmp_path):
    """The supervisor sets aside saves newer than the agreed step; it waits for an upload in flight."""
    local = tmp_path / "ck"
    make_checkpoint(local, 3, sizes=(100,))
    store.push(str(local / "step-000000000003"), 3)
    make_checkpoint(local, 5, sizes=(6 * 1024 * 1024,))
    slow = threading.Event()

    def crawl(**kw):  # every part of the upload takes a while
        slow.set()
        time.sleep(0.3)
    store.client.meta.events.register("before-send.s3.UploadPart", crawl)
    store.client.meta.events.register("before-send.s3.PutObject", crawl)
    agent = _agent(store, local, imds)
    t = threading.Thread(target=agent.upload_once)
    t.start()
    assert slow.wait(10)
    started = time.monotonic()
    restore(store, str(local), 3, log=lambda m: None)
    waited = time.monotonic() - started
    t.join(10)
    assert waited >= 0.2, "restore waited for the upload lock"
    assert store.has_step(5), "the upload finished whole"
    assert not (local / "step-000000000005").exists() and list(local.glob(".stale-step-000000000005-*")), \
        "then the save the cluster did not continue from was set aside, not deleted"


def test_upload_failures_are_reported_and_retried(store, imds, tmp_path):
    local = tmp_path / "ck"
    make_checkpoint(local, 2, sizes=(100,))
    denied = {"on": True}

    def deny(request, **kw):
        if denied["on"] and request.method == "PUT":
            return s3_error(request, 403, "AccessDenied")
        return None
    store.client.meta.events.register_first("before-send.s3.*", deny)
    agent = _agent(store, local, imds)
    t = threading.Thread(target=agent.run, kwargs={"duration": 3})
    t.start()
    health = Path(contract.path("health_dir")) / "upload"
    deadline = time.monotonic() + 5
    while not health.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert health.read_text().startswith("failed access denied"), health.read_text()
    denied["on"] = False
    deadline = time.monotonic() + 5
    while pushed_step() != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    agent.stop()
    t.join(5)
    assert pushed_step() == 2 and health.read_text().startswith("ok")


def test_the_upload_lock_is_exclusive_between_processes(tmp_path):
    import subprocess
    import sys
    with upload_lock():
        p = subprocess.Popen([sys.executable, "-c", "from constructs_lib.runtime.agent import upload_lock\n"
                              "with upload_lock(): print('got it')"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        assert p.poll() is None, "the other process waits"
    assert p.communicate(timeout=10)[0].strip() == "got it"
