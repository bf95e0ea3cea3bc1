"""For training code: save checkpoints atomically, know when to save, find where to resume.

    from constructs_lib.runtime import Checkpointer
    ckpt = Checkpointer()                     # $DL_CHECKPOINT_DIR or /scratch/checkpoints
    start = 0
    if ckpt.resume_path:                      # restored from S3 at boot, newest complete
        state = torch.load(f"{ckpt.resume_path}/model.pt"); start = ckpt.resume_step + 1
    for step in range(start, steps):
        train_one_step()
        if ckpt.should_checkpoint(step, every=500):
            with ckpt.save(step) as d:        # a temporary directory, renamed when the block ends
                torch.save(state, f"{d}/model.pt")
        if ckpt.interrupted:                  # spot notice: the watcher uploads the newest save
            break

No torch import here: any framework's save function works inside `save()`.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import threading
from typing import Iterator, Optional

from .layout import local_checkpoints, marker_path, name_for, notify_dir, resume_file, step_of

NOTICE_SIGNAL = signal.SIGUSR1


def interruption_notice(marker: Optional[str] = None) -> bool:
    """True once the watcher has seen a spot interruption or rebalance notice on this node."""
    return os.path.exists(marker or marker_path())


class Checkpointer:
    """Atomic local checkpoints and the interruption flag, for a training loop.

    directory: where checkpoints live (default $DL_CHECKPOINT_DIR, else /scratch/checkpoints).
    keep: how many complete local checkpoints to keep (older ones are deleted after a save).
    handle_signal: install a SIGUSR1 handler (the watcher's notice) in the main thread and
      register this process for it (only registered processes are signalled).
    upload: a callable(step, path) run in a background thread after each save, e.g. a
      CheckpointStore push; the watcher also pushes the newest save on a spot notice.
    """

    def __init__(self, directory: Optional[str] = None, *, keep: int = 3, handle_signal: bool = True,
                 upload=None, marker: Optional[str] = None) -> None:
        self.directory = directory or os.environ.get("DL_CHECKPOINT_DIR", "/scratch/checkpoints")
        self.keep = max(1, keep)
        self.upload = upload
        self.marker = marker or marker_path()
        self._signalled = threading.Event()
        self._uploads: list[threading.Thread] = []
        os.makedirs(self.directory, exist_ok=True)
        if handle_signal and threading.current_thread() is threading.main_thread():
            signal.signal(NOTICE_SIGNAL, lambda *_: self._signalled.set())
            self._register(notify_dir())

    @staticmethod
    def _register(notify_dir: str) -> None:
        path = os.path.join(notify_dir, str(os.getpid()))
        try:
            os.makedirs(notify_dir, exist_ok=True)
            open(path, "w").close()
        except OSError:
            return  # not on a dl-launcher node (no /run/dl-launcher): the marker file still works
        atexit.register(lambda: os.path.exists(path) and os.unlink(path))

    # ---- where to resume ------------------------------------------------------------------
    @property
    def resume_path(self) -> Optional[str]:
        """The restored checkpoint (DL_RESUME_FROM, set by the boot-time restore), else the newest local one."""
        path = os.environ.get("DL_RESUME_FROM")
        if not path and os.path.exists(resume_file()):
            with open(resume_file()) as f:
                path = f.read().strip() or None
        newest = local_checkpoints(self.directory)
        if path and os.path.isdir(path):
            if newest and newest[-1][0] > (step_of(os.path.basename(path)) or -1):
                return newest[-1][1]  # saved locally after the restore (same boot): newer
            return path
        return newest[-1][1] if newest else None

    @property
    def resume_step(self) -> Optional[int]:
        p = self.resume_path
        return step_of(os.path.basename(p)) if p else None

    # ---- when to save ---------------------------------------------------------------------
    @property
    def interrupted(self) -> bool:
        return self._signalled.is_set() or interruption_notice(self.marker)

    def should_checkpoint(self, step: int, every: int) -> bool:
        """Every `every` steps, and at once when an interruption notice has arrived."""
        return (every > 0 and step % every == every - 1) or self.interrupted

    # ---- saving -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def save(self, step: int) -> Iterator[str]:
        """Yields a temporary directory; on success it becomes step-N, complete. On error it is removed."""
        final = os.path.join(self.directory, name_for(step))
        tmp = os.path.join(self.directory, f".tmp-{name_for(step)}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            yield tmp
            for root, _dirs, files in os.walk(tmp):
                for n in files:
                    with open(os.path.join(root, n), "rb+") as f:
                        os.fsync(f.fileno())
            if os.path.isdir(final):
                shutil.rmtree(final)
            os.rename(tmp, final)  # the moment the checkpoint becomes complete locally
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        if self.upload:
            t = threading.Thread(target=self.upload, args=(step, final), daemon=True, name=f"upload-{step}")
            t.start()
            self._uploads.append(t)

    def wait_for_uploads(self, timeout: Optional[float] = None) -> None:
        for t in self._uploads:
            t.join(timeout)
        self._uploads = [t for t in self._uploads if t.is_alive()]

    def _prune(self) -> None:
        found = local_checkpoints(self.directory)
        for _step, path in found[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)
