"""A framework's own checkpoint directory (runtime/framework_checkpoints.py), decided in
milliseconds: what is complete, what is collected and how, what every node finds before a run.
The layouts are the ones the real frameworks write (tests/runtime/test_framework_drill.py runs
them); where it matters the frameworks' own lookups judge the result (transformers'
get_last_checkpoint)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from constructs_lib.runtime import framework_checkpoints as fc
from constructs_lib.runtime import notice
from constructs_lib.runtime.jobdef import Definition, JobError


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def hf_checkpoint(root: Path, step: int, ranks=(0, 1), state: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors").write_bytes(b"m" * 64)
    (d / "optimizer.pt").write_bytes(b"o" * 64)
    for r in ranks:
        (d / f"rng_state_{r}.pth").write_bytes(b"r")
    if state:
        (d / "trainer_state.json").write_text('{"global_step": %d}' % step)
    return d


def collector(tmp_path: Path, clock: Clock, **kw) -> fc.Collector:
    return fc.Collector(str(tmp_path / "outputs"), str(tmp_path / "layout"), local_ranks=range(2), log=lambda m: None,
                        clock=clock, **kw)


def test_hf_checkpoint_is_collected_once_its_marker_and_every_local_rank_are_there(tmp_path):
    clock = Clock()
    c = collector(tmp_path, clock)
    d = hf_checkpoint(tmp_path / "outputs", 10, ranks=(0,), state=False)
    assert c.poll() == [] and c.poll() == []  # no trainer_state.json: the Trainer is still writing
    (d / "trainer_state.json").write_text("{}")
    assert c.poll() == [] and c.poll() == []  # rank 1's RNG state is still missing
    (d / "rng_state_1.pth").write_bytes(b"r")
    assert c.poll() == []  # changed since the last look
    assert c.poll() == [10]
    saved = tmp_path / "layout" / "step-000000000010" / "checkpoint-10"
    assert sorted(os.listdir(saved)) == sorted(os.listdir(d))
    assert os.stat(saved / "model.safetensors").st_ino == os.stat(d / "model.safetensors").st_ino, "a hard link, not a copy"
    assert c.poll() == [], "collected once"


def test_save_only_model_has_no_rng_state_and_is_complete_without_it(tmp_path):
    c = collector(tmp_path, Clock())
    hf_checkpoint(tmp_path / "outputs", 5, ranks=())
    assert c.poll() == [] and c.poll() == [5]


def test_generic_names_wait_out_the_settle_period_share_a_step_and_are_copied(tmp_path):
    clock = Clock()
    c = collector(tmp_path, clock, settle=10.0)
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "model_100.pt").write_bytes(b"a")
    (out / "snapshot.pt").write_bytes(b"no step in the name: not a checkpoint here")
    (out / "model_200.pt.tmp").write_bytes(b"a writer's temporary name")
    assert c.poll() == []
    clock.t = 9.0
    (out / "optim_100.pt").write_bytes(b"b")  # the same step, written later: the step waits for it
    assert c.poll() == []
    clock.t = 12.0
    assert c.poll() == []
    clock.t = 19.5
    assert c.poll() == [100]
    saved = tmp_path / "layout" / "step-000000000100"
    assert sorted(os.listdir(saved)) == ["model_100.pt", "optim_100.pt"]
    assert os.stat(saved / "model_100.pt").st_ino != os.stat(out / "model_100.pt").st_ino, \
        "a copy: torch.save over the same name truncates the same inode"


def test_after_the_command_exits_marked_checkpoints_are_collected_at_once_generic_ones_only_if_seen_settled(tmp_path):
    c = collector(tmp_path, Clock(), settle=10.0)
    hf_checkpoint(tmp_path / "outputs", 30)
    (tmp_path / "outputs" / "extra_30.bin").write_bytes(b"x")  # generic, same step: first look now
    assert c.poll(exited=True) == [], "a generic file first seen after the exit proves nothing yet"
    assert c.poll(exited=True) == [30]


def test_lightning_last_is_never_collected_and_is_made_again_at_restore(tmp_path):
    c = collector(tmp_path, Clock())
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "epoch=0-step=40.ckpt").write_bytes(b"state at 40")
    (out / "last.ckpt").write_bytes(b"state at 40")
    assert c.poll() == [] and c.poll() == [40]
    assert os.listdir(tmp_path / "layout" / "step-000000000040") == ["epoch=0-step=40.ckpt"]
    node = tmp_path / "other-node" / "checkpoints"
    placed = fc.place(str(tmp_path / "layout" / "step-000000000040"), str(node), str(tmp_path / "aside"), log=lambda m: None)
    assert placed == ["epoch=0-step=40.ckpt", "last.ckpt"]
    assert (node / "last.ckpt").read_bytes() == b"state at 40"
    assert os.stat(node / "last.ckpt").st_ino != os.stat(node / "epoch=0-step=40.ckpt").st_ino, \
        "a copy: Lightning may rewrite last.ckpt in place"


def test_restore_leaves_only_the_clusters_step_where_the_framework_looks(tmp_path):
    from transformers.trainer_utils import get_last_checkpoint

    layout = tmp_path / "layout"
    hf_checkpoint(layout / "step-000000000020", 20)
    out = tmp_path / "work" / "outputs"
    hf_checkpoint(out, 10)
    hf_checkpoint(out, 30)  # saved here, never sent: the cluster did not continue from it
    hf_checkpoint(out, 20, ranks=(2, 3), state=False)  # another node's partial copy of the same step
    (out / "runs").mkdir()
    (out / "runs" / "events.out").write_text("tensorboard")
    (out / "README.md").write_text("the user's own file")
    aside = tmp_path / "work" / fc.SET_ASIDE / "outputs"
    fc.place(str(layout / "step-000000000020"), str(out), str(aside), log=lambda m: None)
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-20"), "the Trainer's own lookup finds the step"
    assert (out / "checkpoint-20" / "trainer_state.json").exists() and not (out / "checkpoint-20" / "rng_state_2.pth").exists()
    assert sorted(os.listdir(out)) == ["README.md", "checkpoint-20", "runs"]
    assert sorted(os.listdir(aside)) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    # The next generation starts from scratch (no step complete in S3): nothing is left to resume from.
    fc.place(None, str(out), str(aside), log=lambda m: None)
    assert get_last_checkpoint(str(out)) is None
    assert sorted(os.listdir(aside)) == ["checkpoint-20"], "only the last batch is kept aside"


def test_a_checkpoint_the_framework_rotates_away_mid_collection_is_skipped(tmp_path, monkeypatch):
    c = collector(tmp_path, Clock())
    d = hf_checkpoint(tmp_path / "outputs", 8)
    assert c.poll() == []
    real = fc.put

    def rotated(src, dest, *, link):
        import shutil
        shutil.rmtree(d)  # save_total_limit deletes it between the look and the link
        return real(src, dest, link=link)

    monkeypatch.setattr(fc, "put", rotated)
    assert c.poll() == []
    assert not (tmp_path / "layout" / "step-000000000008").exists(), "nothing half-made is final"


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../../b", ".", "", "x y", ".dl-set-aside", 5, ["a"], "a" * 300])
def test_a_hostile_checkpoint_dir_in_the_job_definition_is_refused_on_the_node(bad):
    import json

    body = json.dumps({"format": 1, "command": "true", "checkpoint_dir": bad}).encode()
    with pytest.raises(JobError) as e:
        Definition.parse(body, "0" * 64)
    assert e.value.final and "checkpoint_dir" in str(e.value)


def test_the_notice_signal_reaches_only_processes_that_catch_it(tmp_path):
    """A real process tree: bash, under it a python that handles SIGUSR1 and one that does not
    (its default action would end it), in a session of its own as torchrun's workers may be."""
    got = tmp_path / "got"
    handler = (f"import signal, time, pathlib\n"
               f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path({str(got)!r}).write_text('notice'))\n"
               f"pathlib.Path({str(tmp_path / 'ready')!r}).write_text('')\n"
               "time.sleep(30)\n")
    (tmp_path / "handles.py").write_text(handler)
    (tmp_path / "plain.py").write_text("import time\ntime.sleep(30)\n")
    script = f"{sys.executable} {tmp_path / 'handles.py'} & setsid {sys.executable} {tmp_path / 'plain.py'} & wait"
    root = subprocess.Popen(["/bin/bash", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        sent = notice.deliver(root.pid)
        assert len(sent) == 1, f"one process catches SIGUSR1: {sent}"
        while not got.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got.read_text() == "notice"
        tree = notice.descendants(root.pid)
        assert len(tree) >= 2 and root.poll() is None, "nothing in the tree was killed by the signal"
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait(timeout=10)
        subprocess.run(["pkill", "-f", str(tmp_path / "plain.py")], check=False)


def test_the_deadline_from_the_notice():
    import datetime as dt
    n = notice.Notices(termination={"action": "terminate", "time": "2026-11-27T10:02:00Z"})
    assert notice.deadline(n) == dt.datetime(2026, 11, 27, 10, 2, tzinfo=dt.timezone.utc).timestamp()
    assert notice.deadline(notice.Notices()) is None
    assert notice.deadline(notice.Notices(termination={"time": "soon"})) is None


def test_callbacks_off_a_node_do_nothing_and_say_so_once(monkeypatch, capsys):
    monkeypatch.delenv("DL_GENERATION", raising=False)
    from transformers import TrainerControl, TrainerState

    from constructs_lib.runtime import callbacks

    callbacks._warned.clear()
    cb, cb2 = callbacks.HFNoticeCallback(), callbacks.HFNoticeCallback()
    control = TrainerControl()
    cb.on_step_end(None, TrainerState(global_step=3), control)
    cb2.on_step_end(None, TrainerState(global_step=4), control)
    assert not control.should_save and not control.should_training_stop
    err = capsys.readouterr().err
    assert err.count("HFNoticeCallback does nothing here: not a dl-launcher node") == 1
    lit = callbacks.LightningNoticeCallback()
    lit.on_train_batch_end(None, None, None, None, 0)  # never touches the trainer off a node
    assert capsys.readouterr().err.count("LightningNoticeCallback does nothing here") == 1
    with pytest.raises(AttributeError):
        callbacks.NoSuchCallback  # noqa: B018
