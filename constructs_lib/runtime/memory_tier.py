"""The memory tier for sharded state (issue 37): a dead node's shards come back from its buddy.

Every K steps (Checkpointer.save_to_memory) each rank copies its shard of the state to CPU buffers
(the only part on the training thread; memory_refill.py: from the model and optimizer themselves,
with no state dict made, where it can), then, on a thread of its own:
1. writes its bytes into host memory (tmpfs: memory_store.own_root), raw, over the older of its two
   slots (memory_slots.py) in the layout the last full save fixed (memory_raw.py);
2. sends them from that slot (sendfile) to the same local rank on its buddy node (the next node
   in a ring ordered so that neighbours differ in failure domain where the cluster allows:
   memory_ring.py) over a connection of its own (memory_link.py), and takes the previous node's,
   which the link's reader read straight into this node's copy of that node's slots
   (memory_store.held_root);
3. takes part in one all-reduce on the tier's own gloo group: once it returns anywhere, every rank
   wrote, sent and received step N, so the step is whole across the cluster and the rank marks it
   settled. The same all-reduce is the vote: a rank that could not write raw (its items changed
   size, or it holds the first snapshot) makes step N a full save everywhere, with
   torch.distributed.checkpoint, the files and markers a sharded save writes, sent whole to the
   buddy; its layout is the one the raw snapshots after it follow.
Per raw snapshot: no directory, marker, rename or listing, and one collective (bench/goodput.py
--overhead: 0.7 ms of the tier thread's CPU, against 3.7 ms with files and gloo's isend/irecv).

When a node dies, each survivor holds its own part of the newest settled step and a copy of its
buddy's; between runs the supervisor makes node parts of them (memory_slots.materialize), and of
the next step where they are whole here, sends them to S3 (memory_store.promote), and the next
generation resumes from the newer one whole there through the ordinary sharded restore. Steps
lost: the one in flight and at most the one whose snapshot had not reached S3 from every node.
A snapshot's attempt is fixed by its generation and step (memory_store.attempt_for) and differs
from every periodic save's: S3 merges parts of one attempt only, and a slot's stamp names its
step and attempt, so a stale copy from another generation or step is never mixed in.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import queue
import sys
import threading
from typing import Any, Callable, Optional

from . import contract, memory_link, memory_raw, memory_refill, memory_slots, memory_store, memory_threads, shards
from .memory_ring import neighbours, ring
from .layout import name_for
from .memory_staging import nbytes as _nbytes, stage as _stage  # by these names: tests stand in for them here
from .records import whole

# A peer that vanishes without closing its sockets fails the tier's collectives after this long;
# the run's own watch stops the run well before on a lost peer.
TIMEOUT = dt.timedelta(seconds=120)


class MemoryTier:
    """One per training process, made by Checkpointer.save_to_memory on its first call (every
    rank at the same call: creating the tier's process group is collective)."""

    def __init__(self, *, root: str, generation: str, rank: int, world_size: int, local_world_size: int,
                 node_rank: int, finish: Callable[..., tuple[list[str], list[str]]],
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        self.root, self.generation, self.rank, self.log = root, generation, rank, log
        self.world_size, self.local = world_size, local_world_size
        self.node_rank, self.nodes = node_rank, world_size // local_world_size
        self.finish = finish  # Checkpointer._finish_sharded: this rank's marker, the node's part complete
        before = memory_threads.threads()
        self.group = dist.new_group(backend="gloo", timeout=TIMEOUT)
        # The group's own threads (gloo's socket loop, its run loops): made by now, named maybe
        # not yet (each names itself once it runs), so they are the threads new_group made.
        memory_threads.yield_cores(memory_threads.threads() - before)
        domains: list[Any] = [None] * world_size
        dist.all_gather_object(domains, (node_rank, os.environ.get("DL_FAILURE_DOMAIN", "")), group=self.group)
        by_node = dict(domains)
        self.order = ring([by_node[n] for n in range(self.nodes)])
        self.send_node, self.recv_node = neighbours(self.order, node_rank)
        # No plan caching: DCP keeps it per process, so after an in-process restart a survivor sent
        # a plan "unchanged" to a coordinator new to the job, whose save then failed. Full saves are
        # rare here (the first snapshot, a changed layout); raw snapshots plan nothing.
        self.planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
        self.staged: Optional[dict] = None
        self.refill = memory_refill.Refill(log=log)
        # From the last full save (of step layout_step): this rank's layout (memory_raw), where its
        # items come from, and the template its raw snapshots need to become a node part.
        self.fast: Optional[dict] = None
        self.sources: Any = None  # memory_raw.Sources of the last full save
        self.layout_step = -1
        self.template: Optional[dict] = None
        self._prune = 0  # settles left that drop older snapshot directories (after a full save)
        self.recv_rank = self._peer(self.recv_node)
        self.slots = memory_slots.Slots(memory_store.own_root(root, generation), rank)
        self.held_slots = memory_slots.Slots(memory_store.held_root(root, generation, self.recv_node), self.recv_rank)
        self.link: Optional[memory_link.Link] = None
        # One worker thread for the run, fed a snapshot at a time: a thread per snapshot held the
        # training thread until it was scheduled (0.8-1.3 ms a step, 4 ranks on 2 cores).
        self.thread: Optional[threading.Thread] = None
        self._jobs: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self.broken: Optional[str] = None
        # The vote's one tensor, kept: fewer torch calls a snapshot on the tier's thread (below)
        self._vote = torch.zeros(1, dtype=torch.int64)
        self._vote_opts = dist.AllreduceOptions()
        self._vote_opts.reduceOp = dist.ReduceOp.MIN
        self._settled = memory_store.Settled(root, generation, rank)
        if self.nodes > 1:
            self._connect()

    def _connect(self) -> None:
        """The link to the buddies, agreed by every rank: a tier on only some ranks would leave the
        others waiting in its collective. Without it the tier is off for the run, never the job."""
        os.makedirs(self.root, exist_ok=True)
        hostfile = contract.path("hostfile") if os.environ.get("DL_RUN_DIR") else None
        why = ""
        try:
            addr: Any = memory_link.node_address(self.node_rank, hostfile, os.environ.get("MASTER_ADDR", "127.0.0.1"))
        except OSError as e:  # Link still takes part in the gather, so that every rank learns of it
            addr = e
        try:
            self.link = memory_link.Link(self.group, rank=self.rank, to=self._peer(self.send_node), frm=self.recv_rank,
                                         addr=addr, fits=self._fits, timeout=TIMEOUT.total_seconds())
        except (OSError, memory_link.LinkError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
        if self._everyone(self.link is not None):
            self.link.start(self._receive, self._receive_into)  # type: ignore[union-attr]
            memory_threads.yield_cores({self.link.reader.native_id})  # type: ignore[union-attr]
            return
        if self.link is not None:
            self.link.close()
            self.link = None
        self.broken = f"no link to its buddy ({why or 'on another rank'})"
        self.log(f"dl-launcher: the memory tier is off for this run: {self.broken}; the job goes on with its checkpoints")

    def _fits(self, header: dict, plen: int) -> bool:
        """Whether a buddy's frame of `plen` bytes may be read: with no look at the file system
        when it is a raw snapshot going over a held slot at least as large (every step's, once both
        slots were written), else up to the free space plus what the held slots hold now (a
        snapshot replaces one there; with /dev/shm sized to the tier's 4 x, the free space alone
        is short of a snapshot once the slots are full)."""
        step = header.get("step")
        if header.get("kind") == "raw" and whole(step) and plen <= self.held_slots.size_of(step):
            return True
        return plen <= self._free() + self.held_slots.size()

    def _free(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def _peer(self, node: int) -> int:
        return node * self.local + self.rank % self.local

    def snapshot(self, step: int, state_dict: Optional[dict] = None, *, live: Optional[tuple] = None) -> bool:
        """Start the snapshot of `step` of `state_dict`, or of live = (model, optimizer, state_of):
        refilled from them where memory_refill's plan holds; False when the tier stopped in this run."""
        self.wait()
        if self.broken:
            return False
        first = self.staged is None
        if live is None:
            self.refill.forget()  # new buffers may come of it: the plan's are no longer the ones sent
            self.staged, fresh = _stage(state_dict, self.staged)
        else:
            self.staged, fresh = self.refill.copy(*live, self.staged, _stage)
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
        os.makedirs(self.root, exist_ok=True)
        free, need = self._free(), 4 * _nbytes(staged) * self.local
        ok = self._everyone(need <= free)
        if not ok:
            self.broken = f"{self.root} has {free / 2**30:.1f} GiB free, a node needs {need / 2**30:.1f} GiB"
            self.log(f"dl-launcher: the memory tier is off for this run: {self.broken} on some node (4 x its "
                     "share of the state: two snapshots, its own and its buddy's); the job goes on with its checkpoints")
        return ok

    def _everyone(self, mine: bool) -> bool:
        """Whether every rank of the tier says yes: one all-reduce (MIN) on the tier's group.
        On one kept tensor, read and written through a numpy view, and called on the group itself
        rather than through dist.all_reduce's wrappers: the tier's thread runs while the next step
        computes, and its CPU there is time some rank's training thread waits for a core
        (bench/goodput.py --overhead: with the other calls cut in the same change, 0.57 to 0.47 ms
        of the thread's CPU a snapshot)."""
        view = self._vote.numpy()
        view[0] = int(mine)
        self.group.allreduce([self._vote], self._vote_opts).wait()
        return bool(view[0])

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
        tier, whose snapshot may wait out its collectives' timeout on a dead peer): the buddy
        connections end now, so that nothing waits on them."""
        if self.link is not None:
            self.link.close()
        self.staged = None  # the tier is done: nothing of this generation's state kept from here
        self.refill.forget()
        if self.thread is not None:
            self._jobs.put(None)
            self.thread = None
        else:
            self._close_files()

    def _close_files(self) -> None:
        self.slots.close()
        self.held_slots.close()
        self._settled.close()

    def _worker(self) -> None:
        memory_threads.yield_cores({threading.get_native_id()})
        while True:
            job = self._jobs.get()
            if job is None:
                self._close_files()
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
        import torch.distributed as dist

        attempt = memory_store.attempt_for(self.generation, step)
        # Raw only if every rank can: a rank whose items changed (an optimizer's state appearing, a
        # learning rate pickled longer) makes this snapshot a full save everywhere, a new layout.
        chunks = self.sources.chunks(staged, self.fast) if self.fast is not None and not fresh else None
        if chunks is not None:
            self.slots.write(step, attempt, self.layout_step, chunks)
        held = True
        if self.link is not None:  # every rank sends one frame a snapshot, raw or none: the streams stay in step
            header = {"kind": "raw" if chunks is not None else "none", "step": step, "rank": self.rank,
                      "attempt": attempt, "layout": self.layout_step}
            if chunks is not None:  # from the slot just written: sendfile, no copy into the socket first
                self.link.send_file(header, *self.slots.raw_of(step))
            else:
                self.link.send(header)
            header, got = self.link.take()
            held = header.get("step") == step and got is True
        # The one collective of a raw snapshot: once any rank passes it, every rank wrote its slot
        # and holds its buddy's bytes of step N, so the step is whole across the cluster.
        if not self._everyone(chunks is not None and held):
            self.slots.drop(step)  # a full save of step N stands in its place: two copies a node, not three
            own = memory_store.own_root(self.root, self.generation)
            tmp = shards.tmp_dir(own, step, attempt)
            # The node's ranks share the directory and reach this point at different times: each clears
            # only what it writes itself (from a snapshot of this step cut short in this generation).
            self._clear_mine(tmp)
            os.makedirs(tmp, exist_ok=True)
            self._save_full(step, attempt, own, tmp, staged)
            dist.barrier(group=self.group)  # every node's part complete: its files are in step-N now
            if self.link is not None:
                self._exchange(step, attempt, os.path.join(own, name_for(step)))
            dist.barrier(group=self.group)  # every rank sent and received: step N is whole across the cluster
            self._prune = 2  # older snapshot directories go at this settle, and step N's at the next
        self._settled.mark(step, prune=self._prune > 0)
        self._prune -= 1

    def _clear_mine(self, tmp: str) -> None:
        for name in os.listdir(tmp) if os.path.isdir(tmp) else []:
            if name.startswith(f"__{self.rank}_") or (self.rank == 0 and name == shards.METADATA):
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
        meta_bytes = None
        if self.rank == 0:  # read before this rank's marker: the node's last marker moves the directory
            with open(os.path.join(tmp, shards.METADATA), "rb") as f:
                meta_bytes = f.read()
        # fills metadata.storage_data; its read sets are what every raw snapshot's marker repeats
        reads, expect = self.finish(step, attempt, staged, metadata, self.group, root=own)
        self.fast = memory_raw.layout_of(self.planner, metadata.storage_data or {}, self.rank)
        self.sources = memory_raw.Sources(self.planner)
        self.layout_step = step
        self.template = None
        if self.fast is not None:
            mark = {"rank": self.rank, "node_rank": self.node_rank, "local_world_size": self.local,
                    "world_size": self.world_size, "reads": reads, "layout": step,
                    **({"expect": expect} if self.rank == 0 else {})}
            self.template = {"layout_json": json.dumps(self.fast), "mark": mark}
            memory_slots.write_template(own, self.rank, step, metadata=meta_bytes, **self.template)

    def _exchange(self, step: int, attempt: str, part: str) -> None:
        """A full save's files to the buddy, with the template its raw snapshots after it need."""
        assert self.link is not None
        files, data = memory_store.pack(part, self.rank)
        self.link.send({"kind": "part", "step": step, "rank": self.rank, "attempt": attempt, "files": files,
                        "template": self.template}, [data])
        header, got = self.link.take()
        if header.get("kind") != "part" or header.get("step") != step or got is not True:
            raise ValueError(f"the buddy sent {header.get('kind')!r} of step {header.get('step')!r} for step {step}'s full save")

    def _checked(self, header: dict) -> tuple[Any, str]:
        """A buddy's frame header's step and attempt, or ValueError (hostile input until checked)."""
        step, kind = header.get("step"), header.get("kind")
        if header.get("rank") != self.recv_rank or not whole(step):
            raise ValueError(f"a frame from rank {header.get('rank')!r} of step {step!r} on rank {self.recv_rank}'s connection")
        attempt = memory_store.attempt_for(self.generation, step)
        if kind != "none" and header.get("attempt") != attempt:
            raise ValueError(f"a frame of step {step} with attempt {header.get('attempt')!r}, not {attempt}")
        if kind == "raw" and not whole(header.get("layout")):
            raise ValueError("a raw frame without its layout's step")
        return step, attempt

    def _receive_into(self, header: dict, size: int) -> Optional[memoryview]:
        """On the link's reader thread, before a frame's payload is read: a raw snapshot's bytes go
        straight into the held slot (checked first: nothing of a bad frame is written there)."""
        if header.get("kind") != "raw":
            return None
        step, _ = self._checked(header)
        return self.held_slots.receive_into(step, size)

    def _receive(self, header: dict, payload: memoryview) -> bool:
        """On the link's reader thread: a frame from the buddy (hostile input until checked). True
        when it holds a copy of the step here, False for a rank that had nothing raw to send."""
        step, attempt = self._checked(header)
        kind = header.get("kind")
        if kind == "none":
            return False
        if kind == "raw":  # its bytes are in the held slot already (_receive_into)
            self.held_slots.received(step, attempt, header["layout"], payload.nbytes)
            return True
        if kind != "part" or not isinstance(header.get("files"), list):
            raise ValueError(f"a frame of kind {kind!r}")
        self.held_slots.drop(step)
        held = self.held_slots.root
        memory_store.receive(held, step, attempt, header["files"], payload)
        t = header.get("template")
        if isinstance(t, dict) and isinstance(t.get("layout_json"), str) and isinstance(t.get("mark"), dict):
            memory_slots.write_template(held, self.recv_rank, step, layout_json=t["layout_json"], mark=t["mark"],
                                        metadata=memory_store.file_in(header["files"], payload, shards.METADATA))
        return True

