"""When a peer dies mid-step, the survivors keep the last step they completed (issue 37).

With DDP every rank holds the whole model and optimizer state, and a step changes it only in the
optimizer's step, after the gradients' all-reduce. When that all-reduce fails because a peer died,
each survivor still holds exactly the state after the last step it completed. So, once the user
has said how to write it (Checkpointer.keep_on_failure), the first rank of each surviving node
writes that state, as the user's periodic save would, under `.survivor-step-N`: a name the node
agent never uploads. Between runs the supervisor promotes the newest such save to `step-N` on the
one node whose claim in S3 wins (every survivor holds the same state) and pushes it before it
rejoins; the next generation resumes from it. Steps lost: at most the one in flight.

The state is written only when it is exact:
- no optimizer step began since the last `should_checkpoint(step)`: that step is then complete
  on this rank (an all-reduce that completed here included every rank's gradients), and an
  optimizer half-way through its update is never saved;
- buffers that the failed step's forward changed (BatchNorm's running statistics) are put back to
  the completed step's when `model=` is given.
- the error is a failed collective (gloo, NCCL, torch.distributed's own errors) or a stop of the
  run (SIGTERM: the supervisor or torchrun stopping it), never the user's own bug. A SIGTERM that
  arrives mid-update is held until that step completes (the next should_checkpoint), so the run
  still stops with a whole step in hand.
After a failed collective the process ends at once once its traceback is printed (os._exit):
the interpreter's exit would wait on the dead peer in the process group's teardown, and atexit
handlers are skipped.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from typing import Any, Callable, Optional

from .layout import local_checkpoints, make_final, name_for, newest_local

PREFIX = ".survivor-"
COLLECTIVE_FAILED = "collective-failed"  # a rank's outcome record (rundir.outcomes): the supervisor stops the run
_COLLECTIVE = re.compile(r"gloo|NCCL|ProcessGroup|Connection (reset|closed) by peer|Broken pipe", re.IGNORECASE)


class RunStopped(BaseException):
    """SIGTERM reached a training process that keeps its state on failure: the run is being stopped
    (a peer is gone, or torchrun stops the node's other ranks after one failed)."""


def survivor_name(step: int) -> str:
    return PREFIX + name_for(step)


def survivor_saves(root: str) -> list[tuple[int, str]]:
    """Complete survivor saves under root, oldest first: (step, path)."""
    return local_checkpoints(root, PREFIX)


def clear(root: str) -> None:
    """Every survivor save and half-written one under root: at a run's start they belong to a run
    that is over (the supervisor promoted what it could when that run ended)."""
    if os.path.isdir(root):
        for e in os.listdir(root):
            if e.startswith((PREFIX, ".tmp" + PREFIX)):
                shutil.rmtree(os.path.join(root, e), ignore_errors=True)


def collective_failure(e: BaseException) -> bool:
    """Whether `e` says a collective failed (a peer died or the run is being stopped), not the job's own bug."""
    if isinstance(e, RunStopped):
        return True
    try:
        import torch.distributed as dist
        if isinstance(e, getattr(dist, "DistError", ())):
            return True
    except ImportError:
        pass
    return isinstance(e, RuntimeError) and bool(_COLLECTIVE.search(str(e)))


class Keeper:
    """The training process's side. Under the supervisor every Checkpointer has one: a failed
    collective is recorded for the supervisor at once (`report`: it then stops the run and asks
    about the peers now, instead of waiting for torchrun to give up on a dead node's store). Once
    `enable`d (Checkpointer.keep_on_failure) it also follows the last completed step and, on the
    node's first rank, writes it."""

    def __init__(self, directory: str, *, writer: bool, report: Callable[[Optional[int]], None],
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        self.directory, self.writer, self.report, self.log = directory, writer, report, log
        self.write: Optional[Callable[[str], None]] = None
        self.model: Any = None
        self._hooked = False  # once per process: an in-process restart (inprocess.py) enables again
        self.completed: Optional[int] = None
        self.moved = False
        self._buffers: Optional[dict] = None
        self._stop_at_boundary = False  # a SIGTERM came mid-update: raise RunStopped once the step completes
        self._previous_hook = sys.excepthook
        # Called before the process ends after a failed collective: the memory tier's thread may
        # be writing that its last snapshot settled (memory_tier.MemoryTier.wait, bounded).
        self.before_exit: list[Callable[[], None]] = []
        self._also: list[Callable[[int, Any], Any]] = []
        sys.excepthook = self._excepthook

    def enable(self, write: Callable[[str], None], *, model: Any = None, marks_updates: bool = False,
               take_sigterm: bool = False) -> None:
        """marks_updates: the caller calls update_begins() where an optimizer step starts to change
        the state, instead of the optimizers' step pre-hook: Lightning runs forward and backward
        inside optimizer.step(closure), so the pre-hook comes before the all-reduce that fails.
        take_sigterm: replace a SIGTERM handler the framework installed (a user's own is kept)."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        if not self._hooked:
            self._hooked = True
            if not marks_updates:
                register_optimizer_step_pre_hook(self._moving)
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_DFL or (take_sigterm and current != self._terminated):
            self._also = _not_the_frameworks(current)
            signal.signal(signal.SIGTERM, self._terminated)
        self.write, self.model = write, model

    def step_completed(self, step: int) -> None:
        """Every rank, after its optimizer step for `step` (Checkpointer.should_checkpoint calls it)."""
        self.completed, self.moved = step, False
        if self.model is not None:
            self._buffers = {k: b.detach().clone() for k, b in self.model.named_buffers()}
        if self._stop_at_boundary:
            raise RunStopped(f"SIGTERM during step {step}: stopped once it completed")

    def _moving(self, *_args: Any) -> None:
        self.moved = True

    def update_begins(self) -> None:
        """The optimizer step is about to change the state (enable(marks_updates=True))."""
        self.moved = True

    def _terminated(self, signum: int, frame: Any) -> None:
        for handler in self._also:  # the user's own, that the framework's handler called too
            handler(signum, frame)
        if self.moved:  # an optimizer step has begun: stop at the next should_checkpoint, where the state is whole
            self._stop_at_boundary = True
            return
        raise RunStopped(f"signal {signum}")

    def _excepthook(self, kind: type, e: BaseException, tb: Any) -> None:
        failed = collective_failure(e)
        try:
            if failed:
                self.report(self.completed)
                self.keep(e)
        finally:
            self._previous_hook(kind, e, tb)
        if failed:
            # The interpreter's own exit would tear the process group down, and gloo's teardown waits
            # on the dead peer for seconds while the next generation waits for this run to stop.
            for wait in self.before_exit:
                try:
                    wait()
                except BaseException:  # noqa: BLE001 - the process ends anyway
                    pass
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def keep(self, e: BaseException) -> Optional[str]:
        """The survivor save's path, or None (not this rank's to write, not exact, not a peer's failure)."""
        if self.write is None or not self.writer or not collective_failure(e):
            return None
        if self.completed is None or self.moved:
            self.log("dl-launcher: a collective failed mid-update (an optimizer step had begun): no step is kept "
                     "from memory; the job resumes from its newest checkpoint")
            return None
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun stops the node's other ranks: not this write
        if self._buffers is not None:
            import torch
            with torch.no_grad():
                for k, b in self.model.named_buffers():
                    if k in self._buffers:
                        b.copy_(self._buffers[k])
        final = os.path.join(self.directory, survivor_name(self.completed))
        tmp = os.path.join(self.directory, f".tmp{survivor_name(self.completed)}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            self.write(tmp)
            make_final(tmp, final, guard_uploads=False)
        except BaseException as err:  # noqa: BLE001 - the original error is what the run ends with
            shutil.rmtree(tmp, ignore_errors=True)
            self.log(f"dl-launcher: could not keep step {self.completed} from memory: {type(err).__name__}: {err}")
            return None
        self.log(f"dl-launcher: a collective failed ({type(e).__name__}); kept step {self.completed} from memory")
        return final


def _not_the_frameworks(handler: Any) -> list[Callable[[int, Any], Any]]:
    """The handlers a replaced SIGTERM handler ran that are not Lightning's own: Lightning composes
    the handler it found at fit() (a user's) with its notifier (signal_connector._HandlersCompose)."""
    if not callable(handler):
        return []
    inner = getattr(handler, "signal_handlers", None)
    if not isinstance(inner, list):
        return [handler]
    return [h for h in inner if callable(h) and type(getattr(h, "__self__", None)).__name__ != "_SignalConnector"]


def promote(local_dir: str, *, newest_remote: Optional[int], claim: Callable[[int], bool],
            log: Callable[[str], None]) -> Optional[int]:
    """The supervisor's side, between runs: the newest survivor save becomes `step-N` (then pushed
    like any save) when it is newer than every checkpoint here and in S3 and this node's claim on it
    wins; every other survivor save is removed. Returns the step promoted, or None."""
    saves = survivor_saves(local_dir)
    if not saves:
        return None
    for _s, path in saves[:-1]:
        shutil.rmtree(path, ignore_errors=True)
    step, path = saves[-1]
    local = newest_local(local_dir)
    if (newest_remote is not None and step <= newest_remote) or (local is not None and step <= local[0]):
        shutil.rmtree(path, ignore_errors=True)
        return None
    if not claim(step):
        shutil.rmtree(path, ignore_errors=True)
        log(f"step {step} kept from memory here too; another survivor sends it")
        return None
    os.rename(path, os.path.join(local_dir, name_for(step)))
    log(f"step {step} kept from memory after the peer's failure: sending it, the next generation resumes there")
    return step
