"""For training code: where to resume, when to save and stop (decided by all ranks together), and
atomic saves. Made for DDP under dl-launcher's supervisor; works in a single process too.

    from constructs_lib.runtime import Checkpointer
    ckpt = Checkpointer()                       # after init_process_group (or before: it waits)
    start = 0
    if ckpt.resume_path:                        # the same step on every rank of every node
        state = torch.load(f"{ckpt.resume_path}/model.pt", map_location="cpu")
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        start = ckpt.resume_step + 1
    ckpt.keep_on_failure(lambda d: torch.save(state, f"{d}/model.pt"))  # DDP: a dead peer costs <= 1 step
    for step in range(start, steps):
        train_one_step()
        if ckpt.should_checkpoint(step, every=500):   # collective: call it on every rank
            with ckpt.save(step) as d:                 # rank 0 gets a directory, the others None
                if d:
                    torch.save(state, f"{d}/model.pt")
        if ckpt.interrupted:                           # agreed by every rank: stop together
            break

The rules it keeps:
- Resume: under the supervisor, exactly the step the cluster agreed on (DL_RESUME_FROM), never
  a newer local save of one node; alone, the newest complete local save.
- Save/stop: a termination notice on ANY node makes every rank save the same step and stop; a
  rebalance recommendation makes them save early and carry on. One all-reduce (MAX) per
  should_checkpoint call, over a gloo group on the CPU, so NCCL jobs never sync the GPU for it.
- save(): only global rank 0 writes (DDP state is the same on every rank): local ranks never race
  on a directory. A save becomes complete by one rename; the node agent uploads it, outside the
  training processes, so an upload outlives the worker that made the save.
- save_sharded(): every rank writes its shard with torch.distributed.checkpoint (FSDP2 and other
  sharded state), asynchronously if asked; the node's last rank to finish makes the node's part
  complete, and the step is complete in S3 only when every node's part is there (shards.py,
  sharded_store.py).
No torch import until a distributed decision needs one.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import threading
from typing import Any, Callable, Iterator, Optional

from . import contract, notice, shards
from .layout import env_int as _env_int, local_checkpoints, make_final, name_for, step_of, write_atomic
from .state_of import StateOf
from .steps import StepClock


# Seconds a process that lost a peer waits for its memory snapshot in flight: a thread past the
# settling barrier writes one small file; one still in a collective fails at once on the dead peer.
EXIT_WAIT = 5.0


class Checkpointer:
    """directory: where saves go [$DL_CHECKPOINT_DIR, else <scratch>/checkpoints].
    keep: complete local saves kept when no node agent prunes them (outside the supervisor) [3].
    """

    def __init__(self, directory: Optional[str] = None, *, keep: int = 3) -> None:
        self.directory = directory or contract.checkpoint_dir()
        self.keep = max(1, keep)
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.generation = os.environ.get("DL_GENERATION")
        self._notice_file = contract.path("notice")
        self._notice_stamp = notice.mtime(self._notice_file)
        self._notices = notice.read(self._notice_file)
        # Recommendations that arrived before this process started were the last run's business.
        self._rebalances_seen = self._notices.rebalances
        self._stop = False
        self._group: Any = None
        self._save_group: Any = None  # async saves talk over a group of their own (DCP's rule)
        self._pending: Optional[threading.Event] = None  # set when the async save in flight is complete
        self._failed: Optional[BaseException] = None  # why the last async save's completion failed
        self.reason: Optional[str] = None  # why the last should_checkpoint said yes
        os.makedirs(self.directory, exist_ok=True)
        self._memory: Any = None  # memory_tier.MemoryTier, made by the first save_to_memory
        self._state_of: Any = None  # state_of.StateOf, made by the first state_of
        self._keeper: Any = None  # survivor.Keeper: under the supervisor, reports a failed collective
        self._clock = StepClock(_env_int("LOCAL_RANK", 0), self.generation) if self.managed else None
        if self.managed:
            from .survivor import COLLECTIVE_FAILED, Keeper

            self._keeper = Keeper(self.directory, writer=_env_int("LOCAL_RANK", 0) == 0,
                                  report=lambda step: self._record(COLLECTIVE_FAILED, step))

    @property
    def managed(self) -> bool:
        """Running under dl-launcher's supervisor: it chose the resume step, the agent uploads."""
        return self.generation is not None

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    # ---- where to resume ------------------------------------------------------------------------
    @property
    def resume_path(self) -> Optional[str]:
        """The save to resume from, or None: under the supervisor the step the cluster agreed on, alone the newest."""
        path = os.environ.get("DL_RESUME_FROM")
        if path is None:
            path = contract.read_env("resume_env").get("DL_RESUME_FROM")
        if path and os.path.isdir(path):
            return path
        if self.managed:
            return None  # the cluster agreed to start from scratch: a stray local save must not win
        newest = local_checkpoints(self.directory)
        return newest[-1][1] if newest else None

    @property
    def resume_step(self) -> Optional[int]:
        """The step resume_path holds, or None; training continues at this step + 1."""
        p = self.resume_path
        return step_of(os.path.basename(p)) if p else None

    # ---- when to save and stop ----------------------------------------------------------------------
    def _local_flags(self) -> tuple[int, int]:
        stamp = notice.mtime(self._notice_file)
        if stamp != self._notice_stamp:
            self._notice_stamp = stamp
            self._notices = notice.read(self._notice_file)
        n = self._notices
        return int(n.terminating), int(n.rebalances > self._rebalances_seen)

    def _agree(self, flags: tuple[int, int]) -> tuple[int, int]:
        if self.world_size <= 1:
            return flags
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return flags
        t = torch.tensor(flags, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._control_group())
        return int(t[0]), int(t[1])

    def _control_group(self) -> Any:
        """The gloo group for control messages: None, the default group, when that is gloo already.
        With NCCL they would need a CUDA tensor and a device sync every step. Creating the group
        is collective: every rank gets here at the same call."""
        import torch.distributed as dist

        if self._group is None and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")
            # A process group still referenced after destroy_process_group aborts the interpreter
            # at exit ("terminate called without an active exception"): let go of ours first.
            atexit.register(self._release_group)
        return self._group

    def _release_group(self) -> None:
        self._group = None
        self._save_group = None

    def _agree_attempt(self) -> str:
        """One id for this save on every rank: rank 0's random pick (MAX with the others' 0)."""
        pick = shards.new_attempt(self.generation)
        if self.world_size <= 1:
            return pick
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return pick
        n = int(pick.rsplit("-", 1)[1], 16) if self.rank == 0 else 0
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._control_group())
        return shards.new_attempt(self.generation, int(t[0]))

    def should_checkpoint(self, step: int, every: int) -> bool:
        """True every `every` steps, on a rebalance recommendation (once), and when any node got a
        termination notice. Collective: every rank must call it at the same steps, and every rank
        gets the same answer. `reason` says which: "periodic", "rebalance" or "termination".
        Call it after the step's optimizer step: it also marks `step` complete on this rank."""
        if self._keeper is not None:
            self._keeper.step_completed(step)
        if self._clock is not None:  # the step the supervisor's hang and straggler watch see (steps.py)
            self._clock.arrived(step)
        stop, early = self._agree(self._local_flags())
        if self._clock is not None:
            self._clock.left()
        if early:
            self._rebalances_seen = self._notices.rebalances
        if stop and not self._stop:
            self._stop = True
            self._record("interrupted", step)
        periodic = every > 0 and (step + 1) % every == 0
        self.reason = ("termination" if stop else "rebalance" if early else "periodic" if periodic else None)
        return self.reason is not None

    def keep_on_failure(self, write: Callable[[str], None], *, model: Any = None) -> None:
        """When a peer dies mid-step, keep the last step every rank completed from memory (DDP:
        every rank holds the whole state), so a hard kill costs at most the step in flight.
        write(d): write this rank's state into directory d, the same files your periodic save
            writes (the next generation resumes from it the same way).
        model: the module whose buffers forward changes (BatchNorm's running statistics): they are
            put back to the completed step's before write [None: no such buffers].
        Under the supervisor only, on each node's first rank. See survivor.py for when it writes."""
        if self._keeper is not None:
            self._keeper.enable(write, model=model)

    def run_generations(self, train: Callable[[], Any], *, backend: Optional[str] = None) -> Any:
        """-c restart=in-process: train() once per generation in this process (inprocess.py); else once."""
        from .inprocess import run_generations
        return run_generations(self, train, backend=backend)

    @property
    def interrupted(self) -> bool:
        """A termination notice reached some node: the same on every rank after should_checkpoint."""
        return self._stop

    def _record(self, outcome: str, step: Optional[int]) -> None:
        if not self.managed:
            return
        write_atomic(os.path.join(contract.path("outcome_dir"), f"gen-{self.generation}-rank-{self.rank}"),
                     json.dumps({"outcome": outcome, "step": step}))

    # ---- saving -----------------------------------------------------------------------------------------
    def save_sharded(self, step: int, state_dict: dict, *, asynchronous: bool = False, planner: Any = None) -> None:
        """Every rank: write `state_dict` with torch.distributed.checkpoint (DCP) as step N, each
        rank its own shard (an FSDP2 model and optimizer from get_state_dict, or any DCP state).
        Collective: every rank calls it at the same step.

        asynchronous: return once the state is copied to CPU memory (dcp.async_save) and let the
        writes go on beside training; call wait() before the next save is due at the latest, and
        before destroy_process_group. After a termination notice the save is synchronous anyway:
        the job stops next, so there is nothing to overlap.
        planner: a DCP SavePlanner [DefaultSavePlanner(dedup_save_to_lowest_rank=True)].
        Load it back with dcp.load(state_dict, checkpoint_id=ckpt.resume_path)."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.state_dict_saver import async_save, save

        if self.world_size > 1 and "LOCAL_WORLD_SIZE" not in os.environ:
            raise RuntimeError("save_sharded needs torchrun's LOCAL_WORLD_SIZE and GROUP_RANK (dl-torchrun sets "
                               "them): without them no node's part of a save can ever count as complete")
        self.wait()  # one save in flight at a time
        attempt = self._agree_attempt()
        os.makedirs(tmp := shards.tmp_dir(self.directory, step, attempt), exist_ok=True)
        # Replicated state (optimizer param groups, step counters) goes to global rank 0's file, not
        # scattered over every rank's: a node's restore then pulls its own ranks' shards and that one.
        planner = planner or DefaultSavePlanner(dedup_save_to_lowest_rank=True)
        if not asynchronous or self._stop:
            self._finish_sharded(step, attempt, state_dict,
                                 save(state_dict, checkpoint_id=tmp, planner=planner), self._group)  # made by _agree_attempt
            return
        if self._save_group is None and dist.is_available() and dist.is_initialized():
            # async_save on the default group deadlocks or crashes gloo: the main thread goes on
            # with its own collectives while the writer thread runs DCP's.
            self._save_group = dist.new_group(backend="gloo")
            atexit.register(self._release_group)
        group, gen = self._save_group, self.generation  # this save's: an in-process restart makes new ones
        started = async_save(state_dict, checkpoint_id=tmp, process_group=group, planner=planner)
        future: Any = getattr(started, "upload_completion", started)  # an AsyncSaveResponse with an async stager
        finished = threading.Event()  # Future.result() returns before its callbacks run: wait() waits for this
        self._pending = finished

        def done(f) -> None:
            try:
                self._finish_sharded(step, attempt, state_dict, f.result(), group)
            except BaseException as e:  # DCP's CheckpointException is a BaseException
                if self.generation == gen:  # a failed generation's save is never the next one's error
                    self._failed = e
            finally:
                finished.set()
        future.add_done_callback(done)

    def _finish_sharded(self, step: int, attempt: str, state_dict: dict, metadata: Any, group: Any = None, *,
                        root: Optional[str] = None) -> tuple[list[str], list[str]]:
        """This rank's marker (the node's part complete if it is the last); (its read set, every file)."""
        # What dcp.save returns lacks storage_data on some torch versions (2.11 seen): the file
        # DCP wrote on global rank 0 has it, so rank 0 reads that and hands it to every rank.
        import torch.distributed as dist

        tmp = shards.tmp_dir(root or self.directory, step, attempt)
        if metadata.storage_data:  # DCP broadcast the same object to every rank: the same answer everywhere
            return self._commit_sharded(step, attempt, state_dict, metadata, root)
        storage = None
        if self.rank == 0:
            from torch.distributed.checkpoint.filesystem import FileSystemReader
            try:
                storage = FileSystemReader(tmp).read_metadata().storage_data
            except Exception:  # every rank must still get an answer, or the others wait forever
                storage = None
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            box = [storage]
            dist.broadcast_object_list(box, src=0, group=group)
            storage = box[0]
        if not storage:  # not complete anywhere: every rank fails this save the same way
            raise RuntimeError(f"sharded save of step {step}: DCP's .metadata on global rank 0 is unreadable")
        metadata.storage_data = storage
        return self._commit_sharded(step, attempt, state_dict, metadata, root)

    def _commit_sharded(self, step: int, attempt: str, state_dict: dict, metadata: Any,
                        root: Optional[str] = None) -> tuple[list[str], list[str]]:
        reads, written = shards.read_set(state_dict, metadata)
        final = shards.finish_rank(
            root or self.directory, step, attempt, rank=self.rank, node_rank=_env_int("GROUP_RANK", _env_int("NODE_RANK", 0)),
            local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
            world_size=self.world_size, reads=reads, expect=written if self.rank == 0 else None,
            guard_uploads=self.managed and root is None, sync=root is None)
        if final and root is None:
            self._prune_unmanaged()
        return reads, written

    def state_of(self, model: Any, optimizer: Any) -> dict:
        """{"model": ..., "optim": ...}: torch's get_state_dict(model, optimizer), the state that
        save_sharded and save_to_memory take, without torch naming every parameter each call."""
        self._state_of = self._state_of or StateOf()
        return self._state_of(model, optimizer)

    def save_to_memory(self, step: int, state_dict: Optional[dict] = None, *, every: int = 1,
                       model: Any = None, optimizer: Any = None) -> bool:
        """Every rank, after should_checkpoint (and save_sharded, if due): every `every` steps, keep
        `state_dict` (DCP state, as save_sharded takes; or state_of(model, optimizer), made only
        on the steps kept) in this node's host memory and a copy on a buddy node: a node that dies
        costs at most `every` steps. Asynchronous but for the copy to CPU; collective (every rank,
        the same steps). On two or more nodes under the supervisor only (else False). Host memory
        per node: 4 x its share of the state, plus 1 x for the CPU copy. See memory_tier.py."""
        if (state_dict is None) == (model is None or optimizer is None):
            raise TypeError("save_to_memory takes a state_dict, or a model and an optimizer")
        local = _env_int("LOCAL_WORLD_SIZE", 1)
        if every < 1 or (step + 1) % every or not self.managed or self.world_size % local or self.world_size <= local:
            return False  # not a kept step, or one node: no buddy to hold a copy
        if self._memory is None:
            from .memory_tier import MemoryTier

            self._memory = MemoryTier(root=contract.memory_dir(), generation=str(self.generation), rank=self.rank,
                                      world_size=self.world_size, local_world_size=local,
                                      node_rank=_env_int("GROUP_RANK", _env_int("NODE_RANK", 0)),
                                      finish=self._finish_sharded)
            atexit.register(self._release_memory)
            if self._keeper is not None:  # a peer's death ends this process: let a settling snapshot finish
                self._keeper.before_exit.append(lambda tier=self._memory: tier.wait(timeout=EXIT_WAIT))
        return self._memory.snapshot(step, state_dict, live=None if state_dict is not None else (model, optimizer, self.state_of))

    def _release_memory(self) -> None:
        memory, self._memory = self._memory, None
        if memory is not None:
            memory.close()
            memory.group = None  # see _control_group: no group may outlive the interpreter's exit

    def _prune_unmanaged(self) -> None:
        """Outside the supervisor no node agent prunes: keep the newest `keep` complete saves."""
        if not self.managed:
            for _s, path in local_checkpoints(self.directory)[: -self.keep]:
                shutil.rmtree(path, ignore_errors=True)

    def wait(self) -> None:
        """Until the async save and the memory snapshot in flight are written and complete on this
        node; raises the save's error (a snapshot's is only logged: the tier stops for the run)."""
        if self._memory is not None:
            self._memory.wait()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    @contextlib.contextmanager
    def save(self, step: int) -> Iterator[Optional[str]]:
        """Rank 0: a temporary directory that becomes step-N, complete, when the block ends
        (removed if it raises). Other ranks: None."""
        if not self.is_writer:
            yield None
            return
        final = os.path.join(self.directory, name_for(step))
        tmp = os.path.join(self.directory, f".tmp-{name_for(step)}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            yield tmp
            make_final(tmp, final, guard_uploads=self.managed)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune_unmanaged()
