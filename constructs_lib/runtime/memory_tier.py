"""The memory tier for sharded state (issue 37): a dead node's shards come back from its buddy.

Every K steps (Checkpointer.save_to_memory) each rank copies its shard of the state to CPU buffers
(the only part on the training thread), then, on a thread of its own and over a gloo process group
of its own:
1. writes it into host memory (tmpfs: memory_store.own_root): the first snapshot, and any whose
   items changed size, with torch.distributed.checkpoint, the same files and markers a sharded
   save writes, so the node's part is complete exactly as shards.py decides for a save on disk;
   the others raw, in the layout that save fixed (memory_raw.py: no planning collectives, no
   torch.save per tensor), turned back into DCP's files only when a node dies;
2. sends its rank's files to the same local rank on its buddy node (the next node in a ring
   ordered so that neighbours differ in failure domain where the cluster allows) and receives
   the previous node's in turn (memory_store.held_root);
3. waits at a barrier: once any rank passes it, every rank of every node had sent and received
   step N, so the step is whole across the cluster, and the rank marks it settled here.
Two snapshots are kept (the settled one and the one in flight), the older ones dropped.

When a node dies, each survivor holds its own part of the newest settled step and a copy of its
buddy's; between runs the supervisor sends those parts to S3 (memory_store.promote) and the next
generation resumes there through the ordinary sharded restore. Steps lost: the one in flight and
at most the one whose snapshot had not settled. A snapshot's attempt is fixed by its generation
and step (memory_store.attempt_for) and differs from every periodic save's: S3 merges parts of one attempt
only, so a stale copy from another generation or step is never mixed in.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import queue
import shutil
import sys
import threading
from typing import Any, Callable, Optional

from . import memory_raw, memory_store, shards
from .layout import name_for

# A peer that vanishes without closing its sockets fails the tier's collectives after this long;
# the run's own watch stops the run well before on a lost peer.
TIMEOUT = dt.timedelta(seconds=120)


def ring(domains: list[str]) -> list[int]:
    """Node ranks in ring order, each node's buddy the next: neighbours in different failure
    domains wherever the counts allow (round robin over the domains, the largest first)."""
    groups: dict[str, list[int]] = {}
    for node, d in enumerate(domains):
        groups.setdefault(d, []).append(node)
    queues = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    order: list[int] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return order


def neighbours(order: list[int], node: int) -> tuple[int, int]:
    """(the node this node sends to, the node it receives from)."""
    i = order.index(node)
    return order[(i + 1) % len(order)], order[(i - 1) % len(order)]


class MemoryTier:
    """One per training process, made by Checkpointer.save_to_memory on its first call (every
    rank at the same call: creating the tier's process group is collective)."""

    def __init__(self, *, root: str, generation: str, rank: int, world_size: int, local_world_size: int,
                 node_rank: int, finish: Callable[..., tuple[list[str], list[str]]],
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        import torch.distributed as dist
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        self.root, self.generation, self.rank, self.log = root, generation, rank, log
        self.world_size, self.local = world_size, local_world_size
        self.node_rank, self.nodes = node_rank, world_size // local_world_size
        self.finish = finish  # Checkpointer._finish_sharded: this rank's marker, the node's part complete
        self.group = dist.new_group(backend="gloo", timeout=TIMEOUT)
        domains: list[Any] = [None] * world_size
        dist.all_gather_object(domains, (node_rank, os.environ.get("DL_FAILURE_DOMAIN", "")), group=self.group)
        by_node = dict(domains)
        self.order = ring([by_node[n] for n in range(self.nodes)])
        self.send_node, self.recv_node = neighbours(self.order, node_rank)
        self.planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True, enable_plan_caching=True)
        self.staged: Optional[dict] = None
        # From the last full save: this rank's layout (memory_raw), the flattened keys it covered,
        # its marker's read sets and (global rank 0) DCP's .metadata, for the raw snapshots after it.
        self.fast: Optional[dict] = None
        self.fast_json = ""
        self.sources: Any = None  # memory_raw.Sources of the last full save
        self.reads: list[str] = []
        self.expect: list[str] = []
        self.meta_bytes = b""
        # One worker thread for the run, fed a snapshot at a time: starting a thread per snapshot
        # held the training thread until the new one was scheduled (measured: 0.8-1.3 ms a step,
        # 3-3.7 ms at the 90th percentile, 4 ranks on 2 cores).
        self.thread: Optional[threading.Thread] = None
        self._jobs: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self.broken: Optional[str] = None

    def _peer(self, node: int) -> int:
        return node * self.local + self.rank % self.local

    def snapshot(self, step: int, state_dict: dict) -> bool:
        """Start the snapshot of `step`; False when the tier stopped after an error in this run."""
        self.wait()
        if self.broken:
            return False
        first = self.staged is None
        self.staged, fresh = _stage(state_dict, self.staged)
        if first and not self._room(self.staged):
            return False
        self._idle.clear()
        if self.thread is None:
            self.thread = threading.Thread(target=self._worker, daemon=True, name="dl-memory-tier")
            self.thread.start()
        self._jobs.put((step, self.staged, fresh))
        return True

    def _room(self, staged: dict) -> bool:
        """Whether the memory directory can hold this node's two snapshots, its own and its buddy's
        (4 x its share of the state), agreed by every rank: a tier on only some ranks would leave
        the others waiting in its collectives, and a full tmpfs takes the node's memory."""
        import torch
        import torch.distributed as dist

        os.makedirs(self.root, exist_ok=True)
        st = os.statvfs(self.root)
        free, need = st.f_bavail * st.f_frsize, 4 * _nbytes(staged) * self.local
        ok = torch.tensor([int(need <= free)], dtype=torch.int64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        if not int(ok[0]):
            self.broken = f"{self.root} has {free / 2**30:.1f} GiB free, a node needs {need / 2**30:.1f} GiB"
            self.log(f"dl-launcher: the memory tier is off for this run: {self.broken} on some node (4 x its "
                     "share of the state: two snapshots, its own and its buddy's); the job goes on with its checkpoints")
        return bool(int(ok[0]))

    def wait(self, timeout: Optional[float] = None) -> None:
        """Until the snapshot in flight settled or failed (or `timeout` seconds passed)."""
        self._idle.wait(timeout)

    def close(self) -> None:
        """After the last snapshot settled: the worker ends (the run's end, or its group is released)."""
        self.wait()
        thread = self.thread
        self.stop()
        if thread is not None:
            thread.join()

    def stop(self) -> None:
        """The worker ends once the snapshot in flight is over, unwaited (a failed generation's
        tier, whose snapshot may wait out its collectives' timeout on a dead peer)."""
        if self.thread is not None:
            self._jobs.put(None)
            self.thread = None

    def _worker(self) -> None:
        # This thread only (Linux: a thread is a task): where CPUs are short the training
        # threads go first (1.05x a 1 s step here, against 1.07x at the same priority).
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._work(*job)
            finally:
                self._idle.set()

    def _work(self, step: int, staged: dict, fresh: bool) -> None:
        try:
            self._write_send_settle(step, staged, fresh)
        except BaseException as e:  # noqa: BLE001 - a lost peer: the training thread's next collective says so
            self.broken = f"{type(e).__name__}: {e}"
            self.log(f"dl-launcher: the memory tier stopped at step {step} ({self.broken}); "
                     "the job resumes from its newest settled snapshot or checkpoint")

    def _write_send_settle(self, step: int, staged: dict, fresh: bool) -> None:
        import torch
        import torch.distributed as dist

        attempt = memory_store.attempt_for(self.generation, step)
        own = memory_store.own_root(self.root, self.generation)
        tmp = shards.tmp_dir(own, step, attempt)
        # The node's ranks share the directory and reach this point at different times: each clears
        # only what it writes itself (from a snapshot of this step cut short in this generation).
        self._clear_mine(tmp)
        os.makedirs(tmp, exist_ok=True)
        # Raw only if every rank can: a rank whose items changed (an optimizer's state appearing, a
        # learning rate pickled longer) makes this snapshot a full save everywhere, a new layout.
        # A rank writes and finishes its raw part before the vote, so the one all-reduce also stands
        # for the barrier before the exchange (every node's part complete): one round fewer a step.
        chunks = self._write_raw(tmp, staged) if not fresh else None
        if chunks is not None:
            self._finish_raw(step, attempt, own, tmp)
        ok = torch.tensor([int(chunks is not None)], dtype=torch.int64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        if not int(ok[0]):
            self._undo_raw(own, step, tmp)
            chunks = None
            self._save_full(step, attempt, own, tmp, staged)
            dist.barrier(group=self.group)  # every node's part complete: its files are in step-N now
        if self.nodes > 1:
            self._exchange(step, attempt, os.path.join(own, name_for(step)), chunks)
        dist.barrier(group=self.group)  # every rank sent and received: step N is whole across the cluster
        memory_store.settle(self.root, self.generation, step)

    def _undo_raw(self, own: str, step: int, tmp: str) -> None:
        """Some rank could not write raw: this rank's raw files go, and the node's step-N if its
        ranks' markers had completed it. Every rank of the node passed the vote, so no marker
        moves the directory any more; each rank enters the full save only after this. (The full
        save's rename would replace step-N anyway; removing it first leaves no part of a step that
        was voted down looking complete if this process dies meanwhile.)"""
        self._clear_mine(tmp)
        if self.rank % self.local == 0:
            shutil.rmtree(os.path.join(own, name_for(step)), ignore_errors=True)
        os.makedirs(tmp, exist_ok=True)

    def _clear_mine(self, tmp: str) -> None:
        for name in os.listdir(tmp) if os.path.isdir(tmp) else []:
            if (memory_raw.is_fast_file(name, self.rank) or name.startswith(f"__{self.rank}_")
                    or (self.rank == 0 and name == shards.METADATA)):
                os.unlink(os.path.join(tmp, name))
        marker = os.path.join(tmp, shards.MARKERS, f"rank-{self.rank}.json")
        if os.path.exists(marker):
            os.unlink(marker)

    def _save_full(self, step: int, attempt: str, own: str, tmp: str, staged: dict) -> None:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save

        # Host memory: nothing to sync to a disk (the copy that must survive is the buddy's).
        writer = FileSystemWriter(tmp, sync_files=False)
        metadata = save(staged, storage_writer=writer, process_group=self.group, planner=self.planner)
        meta_bytes = b""
        if self.rank == 0:  # read before this rank's marker: the node's last marker moves the directory
            with open(os.path.join(tmp, shards.METADATA), "rb") as f:
                meta_bytes = f.read()
        # fills metadata.storage_data; its read sets are what every raw snapshot's marker repeats
        self.reads, self.expect = self.finish(step, attempt, staged, metadata, self.group, root=own)
        self.fast = memory_raw.layout_of(self.planner, metadata.storage_data or {}, self.rank)
        self.fast_json = json.dumps(self.fast)
        self.sources = memory_raw.Sources(self.planner)
        self.meta_bytes = meta_bytes

    def _write_raw(self, tmp: str, staged: dict) -> Optional[list]:
        """This rank's raw files; the raw bytes as written (memory_raw.write), or None."""
        if self.fast is None:
            return None
        # New staging buffers (a key or a shape changed) never get here: `fresh` makes a full save.
        chunks = memory_raw.write(os.path.join(tmp, memory_raw.raw_name(self.rank)), self.sources, staged, self.fast)
        if chunks is None:
            return None
        with open(os.path.join(tmp, memory_raw.layout_name(self.rank)), "w") as f:
            f.write(self.fast_json)
        if self.rank == 0:
            with open(os.path.join(tmp, shards.METADATA), "wb") as f:
                f.write(self.meta_bytes)
        return chunks

    def _finish_raw(self, step: int, attempt: str, own: str, tmp: str) -> None:
        shards.finish_rank(own, step, attempt, rank=self.rank, node_rank=self.node_rank, local_world_size=self.local,
                           world_size=self.world_size, reads=self.reads,
                           expect=self.expect if self.rank == 0 else None, guard_uploads=False, sync=False)

    def _exchange(self, step: int, attempt: str, part: str, chunks: Optional[list]) -> None:
        import torch
        import torch.distributed as dist

        header, data = memory_store.pack(part, self.rank, chunks)
        to, frm = self._peer(self.send_node), self._peer(self.recv_node)
        sends = [dist.isend(t, to, group=self.group)
                 for t in (torch.tensor([len(header), data.numel()], dtype=torch.int64), data)]
        got = torch.empty(2, dtype=torch.int64)
        dist.irecv(got, frm, group=self.group).wait()
        d = torch.empty(int(got[1]), dtype=torch.uint8)
        dist.irecv(d, frm, group=self.group).wait()
        for work in sends:
            work.wait()
        view = memoryview(d.numpy())
        cut = int(got[0])
        if not 0 <= cut <= len(view):
            raise ValueError(f"a buddy's header of {cut} bytes does not fit the {len(view)} it sent")
        memory_store.receive(memory_store.held_root(self.root, self.generation, self.recv_node), step, attempt,
                             json.loads(bytes(view[:cut])), view[cut:])


def _nbytes(state: Any) -> int:
    """Bytes of the tensors in a state dict (a DTensor counts its local shard)."""
    import torch

    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_nbytes(v) for v in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0


def _stage(state_dict: dict, staged: Optional[dict]) -> tuple[dict, bool]:
    """A copy of the state in CPU memory (pinned when CUDA is there), reusing the last one's buffers
    while the state's shape stays the same: training goes on changing the original meanwhile.
    (the copy, whether its buffers are new)."""
    import torch
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    cuda = torch.cuda.is_available()
    if staged is not None:
        try:
            out = _copy_state_dict(state_dict, staged, non_blocking=cuda)
            if cuda:
                torch.cuda.synchronize()
            return out, False
        except (RuntimeError, KeyError, TypeError, ValueError, AssertionError):
            pass  # the shape changed (an optimizer's state appears after its first step): new buffers
    fresh = _create_cpu_state_dict(state_dict, pin_memory=cuda)
    out = _copy_state_dict(state_dict, fresh, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    return out, True
