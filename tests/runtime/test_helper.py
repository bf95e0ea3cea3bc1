"""Checkpointer: where to resume, atomic saves."""
from __future__ import annotations

import os

from constructs_lib.runtime import Checkpointer
from constructs_lib.runtime.layout import resume_file


def test_resume_path_follows_the_boot_time_restore_then_newer_local_saves(tmp_path, monkeypatch):
    restored = tmp_path / "restored" / "step-000000000007"
    restored.mkdir(parents=True)
    monkeypatch.setenv("DL_RESUME_FILE", str(tmp_path / "resume-from"))
    monkeypatch.delenv("DL_RESUME_FROM", raising=False)
    (tmp_path / "resume-from").write_text(f"{restored}\n")
    assert resume_file() == str(tmp_path / "resume-from")
    ckpt = Checkpointer(str(tmp_path / "local"), handle_signal=False)
    assert ckpt.resume_path == str(restored) and ckpt.resume_step == 7
    with ckpt.save(9) as d:
        open(os.path.join(d, "state"), "w").close()
    assert ckpt.resume_step == 9, "a save after the restore is newer"


def test_a_failed_save_leaves_nothing(tmp_path):
    ckpt = Checkpointer(str(tmp_path), handle_signal=False)
    try:
        with ckpt.save(3):
            raise RuntimeError("disk full")
    except RuntimeError:
        pass
    assert os.listdir(tmp_path) == [] and ckpt.resume_path is None
