"""In-process restart, the rank's side (restart=in-process; issue 37): when a peer dies, this
process keeps its interpreter, torch and the script's imports, and joins the next generation.

    ckpt = Checkpointer()
    def train():                     # once per generation, in this same process
        model, opt = build(ckpt.resume_path)   # resume as any script does
        ckpt.keep_on_failure(write_state)
        for step in range(start, steps): ...
    ckpt.run_generations(train)

Under the supervisor in this mode (DL_INPROCESS_DIR set by ranks.py), when train raises a failed
collective (survivor.collective_failure; never the job's own bug, never a stop of the run):
the completed step is kept as torchrun's path keeps it (survivor.Keeper), the process group is
torn down without waiting on the dead peer (gloo: destroy_process_group returns at once, measured;
NCCL would need ProcessGroupNCCL.abort() first, untested here), this rank says it is parked
(a file per local rank), waits for the supervisor's assignment of the next generation, takes its
rank from it (RANK, WORLD_SIZE, MASTER_ADDR, ...: env:// as torchrun would set it), makes a new
process group and calls train again. Every wait is bounded: an assignment that never comes, or a
launcher (ranks.py) that is gone, ends the process. Outside the supervisor train runs once.
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import re
import signal
import sys
import time
from typing import Any, Callable, Mapping, Optional

from dl_core.aws import brief
from .layout import write_atomic

ENV_DIR = "DL_INPROCESS_DIR"            # the supervisor's directory for this node's parked ranks
ENV_WAIT = "DL_INPROCESS_WAIT_SECONDS"  # how long a parked rank waits for its next generation
WAIT_DEFAULT = 1800.0                   # a replacement's launch and boot take minutes; past this, exit
ASSIGNMENT = "assignment.json"
POLL = 0.05
SAVE_WAIT = 5.0  # seconds a leaving rank waits for its generation's async save (ranks.PARK_WAIT is 10)
# A rank still leaving its generation after this long writes every thread's stack to the job's log:
# the supervisor gives up on it at ranks.PARK_WAIT (10 s) and the next generation starts cold, and
# where it hung (once in the suite's drill, under load; parking takes about 0.3 s) is otherwise lost.
STACKS_AFTER = 7.0
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}", re.ASCII)


class AssignmentError(ValueError):
    """An assignment file that a rank cannot act on (the supervisor wrote it, but it is checked)."""


def parked_name(generation: int, local_rank: int) -> str:
    return f"parked-gen-{generation}-rank-{local_rank}"


def _whole(d: Mapping[str, Any], key: str, low: int, high: int) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise AssignmentError(f"assignment {key}={v!r}: expected a whole number from {low} to {high}")
    return v


def parse_assignment(text: str, local_world_size: int) -> dict[str, Any]:
    """The checked assignment: {generation, node_rank, nnodes, nproc_per_node, master_addr,
    master_port, resume_from, resume_step}; AssignmentError says which field is wrong."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise AssignmentError(f"assignment is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise AssignmentError("assignment is not a JSON object")
    out: dict[str, Any] = {"generation": _whole(d, "generation", 1, 10**9), "nnodes": _whole(d, "nnodes", 1, 10**5)}
    out["node_rank"] = _whole(d, "node_rank", 0, out["nnodes"] - 1)
    out["nproc_per_node"] = _whole(d, "nproc_per_node", local_world_size, local_world_size)
    out["master_port"] = _whole(d, "master_port", 1, 65535)
    addr = d.get("master_addr")
    if not isinstance(addr, str) or not _HOST.fullmatch(addr):
        raise AssignmentError(f"assignment master_addr={addr!r}: expected a host name or IP address")
    out["master_addr"] = addr
    path, step = d.get("resume_from"), d.get("resume_step")
    if (path is None) != (step is None):
        raise AssignmentError("assignment resume_from and resume_step: both or neither")
    if path is not None:
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise AssignmentError(f"assignment resume_from={path!r}: expected an absolute path")
        _whole(d, "resume_step", 0, 10**12)
    out["resume_from"], out["resume_step"] = path, step
    return out


def assignment_text(*, generation: int, node_rank: int, nnodes: int, nproc_per_node: int, master_addr: str,
                    master_port: int, resume_from: Optional[str], resume_step: Optional[int]) -> str:
    return json.dumps({"generation": generation, "node_rank": node_rank, "nnodes": nnodes,
                       "nproc_per_node": nproc_per_node, "master_addr": master_addr, "master_port": master_port,
                       "resume_from": resume_from, "resume_step": resume_step if resume_from else None})


def rank_env(*, local_rank: int, nproc_per_node: int, node_rank: Optional[int] = None, nnodes: Optional[int] = None,
             master_addr: Optional[str] = None, master_port: Optional[int] = None,
             generation: Optional[int] = None) -> dict[str, str]:
    """torchrun's environment for one rank (what init_process_group's env:// and Checkpointer read).
    Without a node rank (a rank started before its plan) only the local names."""
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(nproc_per_node)}
    if node_rank is None or nnodes is None or master_addr is None or master_port is None:
        return env
    world = nnodes * nproc_per_node
    rank = node_rank * nproc_per_node + local_rank
    env.update({"RANK": str(rank), "GROUP_RANK": str(node_rank), "ROLE_RANK": str(rank), "NODE_RANK": str(node_rank),
                "WORLD_SIZE": str(world), "ROLE_WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(nnodes),
                "NNODES": str(nnodes), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"})
    if generation is not None:
        env["DL_GENERATION"] = str(generation)
    return env


def wait_assignment(directory: str, after: Optional[int], local_world_size: int, *, timeout: float,
                    launcher: Optional[int] = None, poll: float = POLL) -> dict[str, Any]:
    """The first assignment of a generation after `after` (None: any). Raises TimeoutError past
    `timeout`, RuntimeError once the launcher process (this rank's parent) is gone, and
    AssignmentError for a file it cannot act on."""
    path = os.path.join(directory, ASSIGNMENT)
    until = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            text = None
        if text is not None:
            a = parse_assignment(text, local_world_size)
            if after is None or a["generation"] > after:
                return a
        if launcher is not None and os.getppid() != launcher:
            raise RuntimeError("the node's rank launcher is gone: nothing will assign a next generation")
        if time.monotonic() >= until:
            raise TimeoutError(f"no assignment of a generation after {after} within {timeout:.0f} s")
        time.sleep(poll)


def apply(a: Mapping[str, Any], local_rank: int) -> None:
    """The assignment into os.environ, as torchrun and the supervisor would have set it."""
    os.environ.update(rank_env(local_rank=local_rank, nproc_per_node=a["nproc_per_node"], node_rank=a["node_rank"],
                               nnodes=a["nnodes"], master_addr=a["master_addr"], master_port=a["master_port"],
                               generation=a["generation"]))
    for k in ("DL_RESUME_FROM", "DL_RESUME_STEP"):
        os.environ.pop(k, None)
    if a["resume_from"]:
        os.environ["DL_RESUME_FROM"], os.environ["DL_RESUME_STEP"] = a["resume_from"], str(a["resume_step"])


def _log(line: str) -> None:
    print(f"dl-launcher: {line}", file=sys.stderr, flush=True)


def run_generations(ckpt: Any, train: Callable[[], Any], *, backend: Optional[str] = None) -> Any:
    """Call train() once per generation in this process (see the module's text); its return value.
    The default process group is made here (env://, `backend` [torch's default for the device]) when
    torchrun's RANK is set and none exists yet: train() never calls init_process_group."""
    import torch.distributed as dist

    directory = os.environ.get(ENV_DIR)
    if not directory:  # plain torchrun, a laptop, torchrun's own path under the supervisor
        if "RANK" in os.environ and dist.is_available() and not dist.is_initialized():
            dist.init_process_group(backend)
        return train()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    wait = float(os.environ.get(ENV_WAIT, WAIT_DEFAULT))
    launcher = os.getppid()
    backend = backend or os.environ.get("DL_INPROCESS_BACKEND") or None
    if ckpt.generation is None:  # started before its plan (ranks.WarmRanks.prewarm): the first assignment
        apply(wait_assignment(directory, None, nproc, timeout=wait, launcher=launcher), local)
        rebind(ckpt)
    while True:
        generation = int(ckpt.generation)
        if not dist.is_initialized():
            dist.init_process_group(backend)
        backend = dist.get_backend()
        try:
            return train()
        except BaseException as e:  # noqa: BLE001 - anything but a peer's failure goes on up
            if not _peer_failure(e):
                raise
            _log(f"generation {generation}: a collective failed ({brief(e)})")
            faulthandler.dump_traceback_later(STACKS_AFTER, exit=False, file=sys.stderr)
            _keep(ckpt, e)
        # Out of the except block: the failed generation's frames (its model, its DDP and the
        # group DDP holds) are released before the group is torn down.
        _teardown(ckpt, dist)
        faulthandler.cancel_dump_traceback_later()
        write_atomic(os.path.join(directory, parked_name(generation, local)), str(os.getpid()))
        _log(f"generation {generation}: parked (process {os.getpid()}), waiting for the next generation")
        a = wait_assignment(directory, generation, nproc, timeout=wait, launcher=launcher)
        apply(a, local)
        rebind(ckpt)
        _log(f"generation {a['generation']}: rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}, in process "
             f"{os.getpid()}")


def _peer_failure(e: BaseException) -> bool:
    from .survivor import RunStopped, collective_failure

    return not isinstance(e, RunStopped) and collective_failure(e)


def _keep(ckpt: Any, e: BaseException) -> None:
    """What survivor.Keeper's hook does before os._exit on torchrun's path: report, keep the step."""
    keeper = ckpt._keeper
    if keeper is None:
        return
    handler = signal.getsignal(signal.SIGTERM)
    keeper.report(keeper.completed)
    try:
        keeper.keep(e)
    finally:
        signal.signal(signal.SIGTERM, handler)  # keep() ignores SIGTERM while it writes
    keeper.write = keeper.model = None  # the failed generation's model: not held into the next


def _teardown(ckpt: Any, dist: Any) -> None:
    from . import contract, peer_sockets

    cut = peer_sockets.cut(peer_sockets.members(contract.path("hostfile")))  # a sibling may wait on this rank
    _log(f"generation {ckpt.generation}: {cut} connection(s) to the generation's peers shut down")
    # An async save of this generation in flight: its collectives fail on the cut connections. Its
    # error (or a complete step of a generation the supervisor is promoting past) must not surface
    # at the next generation's first save, as it did once in the drill; past the bound it is left.
    pending, ckpt._pending = ckpt._pending, None
    if pending is not None and not pending.wait(SAVE_WAIT):
        _log(f"generation {ckpt.generation}: its async save still runs after {SAVE_WAIT:g} s: left behind")
    ckpt._failed = None
    ckpt._release_group()
    memory, ckpt._memory = ckpt._memory, None
    if memory is not None:
        memory.stop()
        memory.group = None
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    forget_meshes()


def forget_meshes() -> None:
    """Drop torch's memo of DTensor ops' output specs. It is keyed by specs whose DeviceMesh
    compares equal by ranks and layout alone, not by this process's rank in it nor its groups, so
    after the group is made again a new mesh over the same ranks hits the old generation's entries:
    FSDP2's parameters then came out on the old mesh, with the old rank's coordinate, so a survivor
    whose rank changed loaded and trained another rank's shard (torch 2.13, measured:
    tests/runtime/test_inprocess_fsdp.py; Megatron-LM#7029 met the same memo naming dead groups)."""
    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
        _clear_sharding_prop_cache()
    except (ImportError, AttributeError) as e:  # a torch without the memo or its clear: nothing to drop
        _log(f"DTensor's sharding memo not cleared ({type(e).__name__}: {e})")


def rebind(ckpt: Any) -> None:
    """The Checkpointer's view of who this rank is, for the generation now in os.environ."""
    from .steps import StepClock

    ckpt.rank = int(os.environ["RANK"])
    ckpt.world_size = int(os.environ["WORLD_SIZE"])
    ckpt.generation = os.environ["DL_GENERATION"]
    ckpt._stop = False
    ckpt._clock = StepClock(int(os.environ.get("LOCAL_RANK", "0")), ckpt.generation)
    if ckpt._keeper is None:  # made before its first generation: Checkpointer() made none
        from .survivor import COLLECTIVE_FAILED, Keeper

        ckpt._keeper = Keeper(ckpt.directory, writer=int(os.environ.get("LOCAL_RANK", "0")) == 0,
                              report=lambda step: ckpt._record(COLLECTIVE_FAILED, step))
    keeper = ckpt._keeper
    if keeper is not None:
        keeper.completed, keeper.moved, keeper._buffers, keeper._stop_at_boundary = None, False, None, False
