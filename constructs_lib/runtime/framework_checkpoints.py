"""A framework's own checkpoint directory as the job's checkpoints (`-c checkpoint_dir=PATH`).

Scripts that save with Hugging Face `Trainer`, PyTorch Lightning, torch.distributed.checkpoint or
a plain `torch.save` write into a directory of their working directory and, when started again,
resume from the newest thing they find there. On a node that directory is local disk: nothing
would upload it, and after a fault each node would look at its own. So, on the node that runs
global rank 0 (where these frameworks write), the supervisor collects every checkpoint the
framework *completes* there into the checkpoint layout (layout.py: `step-N`, hard links, one
rename), which the node agent uploads with the manifest protocol like any save. Before every
generation the step the cluster agreed on is put back at the same path on every node, and every
other checkpoint there is set aside, so the framework's own "newest" is that step on every rank.

What counts as one checkpoint, and when it is complete (the framework's own marker where it has
one; for the rest, files unchanged for a settle period):

    name in the directory          kind        complete when
    checkpoint-N/                  hf          trainer_state.json is there (the Trainer writes it
                                               last) and each local rank's rng_state_R.pth, if
                                               it saves RNG state at all
    *step=N*.ckpt                  lightning   the file is there (Lightning writes it whole)
    last*.ckpt                     (never collected: a copy of the newest; made again at restore)
    a directory with .metadata     dcp         .metadata is there (DCP writes it last)
    any other name with a number   generic     unchanged for the settle period (default 10 s)

The step is the number in the name (the last one, for generic names): names without one are not
checkpoints here and are left alone. Every kind must also look the same twice in a row before it
is collected, and after the command exits by itself (finished, or stopped for a notice) what is
complete by its kind's marker is collected at once. After a kill nothing more is collected: a
half-written file would look settled for ever.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from .layout import make_final, name_for

Log = Callable[[str], None]

HF_STATE = "trainer_state.json"
DCP_METADATA = ".metadata"
SET_ASIDE = ".dl-set-aside"  # in the working directory, beside the checkpoint directory
_HF = re.compile(r"^checkpoint-(\d{1,12})\Z", re.ASCII)
_LIGHTNING_STEP = re.compile(r"step=(\d{1,12})", re.ASCII)
_NUMBER = re.compile(r"(\d{1,12})", re.ASCII)
_SEGMENT = re.compile(r"^[A-Za-z0-9_.=+-]+\Z", re.ASCII)
# Names a writer uses before its final rename: never a checkpoint of their own.
_PARTIAL = (".tmp", ".partial", ".incomplete", ".lock", "~")
DEFAULT_SETTLE = 10.0


def checkpoint_dir_problem(path: object) -> Optional[str]:
    """Why `path` cannot be a job's checkpoint_dir, or None: relative to the working directory,
    inside it, a directory of its own (not the working directory itself). One rule for the app's
    context, the construct and the node, which reads it from a job definition in S3."""
    allowed = ("a relative path inside the working directory, e.g. outputs (Hugging Face output_dir) "
               "or checkpoints (Lightning dirpath)")
    if not isinstance(path, str) or not path.strip():
        return f"checkpoint_dir is empty: use {allowed}"
    p = path.strip()
    if p.startswith(("/", "~")):
        return f"checkpoint_dir={p} is absolute: use {allowed}"
    parts = [s for s in p.split("/") if s not in ("", ".")]
    if not parts:
        return f"checkpoint_dir={p} is the working directory itself (your code is there): use {allowed}"
    if ".." in parts:
        return f"checkpoint_dir={p} leaves the working directory: use {allowed}"
    bad = next((s for s in parts if not _SEGMENT.match(s) or s.startswith(".dl-")), None)
    if bad is not None or len(p) > 255:
        return (f"checkpoint_dir={p}: each segment may hold letters, digits and _ . = + - (not .dl-, the "
                f"runtime's); use {allowed}")
    return None


def normalized(path: str) -> str:
    return "/".join(s for s in path.strip().split("/") if s not in ("", "."))


@dataclass(frozen=True)
class Entry:
    name: str
    step: int
    kind: str  # hf, lightning, lightning-last, dcp, generic


def recognize(root: str, name: str) -> Optional[Entry]:
    """What the directory entry `name` is, by its name (and, for DCP, its marker), or None."""
    if name.startswith(".") or name.endswith(_PARTIAL) or name.startswith(("tmp", "temp")):
        return None
    path = os.path.join(root, name)
    m = _HF.match(name)
    if m and os.path.isdir(path):
        return Entry(name, int(m.group(1)), "hf")
    if name.endswith(".ckpt") and os.path.isfile(path):
        if "last" in name:
            return Entry(name, -1, "lightning-last")
        m = _LIGHTNING_STEP.search(name)
        if m:
            return Entry(name, int(m.group(1)), "lightning")
    numbers = _NUMBER.findall(name)
    if not numbers:
        return None
    step = int(numbers[-1])
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, DCP_METADATA)):
        return Entry(name, step, "dcp")
    return Entry(name, step, "generic")


def entries(root: str) -> list[Entry]:
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted((e for e in (recognize(root, n) for n in names) if e), key=lambda e: (e.step, e.name))


def signature(path: str) -> tuple:
    """Every file's (relative path, size, mtime): equal twice means nothing was written between."""
    if os.path.isfile(path):
        st = os.stat(path)
        return (("", st.st_size, st.st_mtime_ns),)
    out = []
    for d, _dirs, files in os.walk(path):
        for n in files:
            full = os.path.join(d, n)
            try:
                st = os.stat(full)
            except OSError:
                return (("vanished", 0, time.monotonic_ns()),)
            out.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def marked(root: str, e: Entry, local_ranks: Iterable[int]) -> bool:
    """Whether the framework's own marker says the entry is whole (generic entries have none)."""
    path = os.path.join(root, e.name)
    if e.kind == "hf":
        if not os.path.isfile(os.path.join(path, HF_STATE)):
            return False
        rng = [n for n in os.listdir(path) if n.startswith("rng_state")]
        if not rng or "rng_state.pth" in rng:
            return True  # save_only_model, or a single process
        return all(f"rng_state_{r}.pth" in rng for r in local_ranks)
    if e.kind == "dcp":
        return os.path.isfile(os.path.join(path, DCP_METADATA))
    return e.kind == "lightning"


class Collector:
    """Turns what the framework completes in `source` into `step-N` saves in `local_dir`.
    floor: steps up to it are already in S3 (the restored one): never collected again."""

    def __init__(self, source: str, local_dir: str, *, local_ranks: Iterable[int], floor: Optional[int] = None,
                 settle: float = DEFAULT_SETTLE, log: Log = print,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.local_dir = source, local_dir
        self.local_ranks = tuple(local_ranks)
        self.floor = -1 if floor is None else floor
        self.settle, self.log, self.clock = settle, log, clock
        self._seen: dict[str, tuple[tuple, float]] = {}  # name -> (signature, since)
        self._done: set[int] = set()

    def poll(self, *, exited: bool = False) -> list[int]:
        """One look; returns the steps made complete locally (the agent uploads them).
        exited: the command has exited by itself, so what its marker calls whole is whole now.
        Entries sharing a step (model_100.pt, optim_100.pt) make one save, once all are ready."""
        by_step: dict[int, list[tuple[Entry, bool]]] = {}
        now = self.clock()
        for e in entries(self.source):
            if e.kind == "lightning-last" or e.step <= self.floor or e.step in self._done:
                continue
            path = os.path.join(self.source, e.name)
            try:
                sig = signature(path)
                has_marker = marked(self.source, e, self.local_ranks)
            except OSError:
                continue  # deleted under us (rotation)
            before = self._seen.get(e.name)
            same = before is not None and before[0] == sig
            since = before[1] if same else now
            self._seen[e.name] = (sig, since)
            if e.kind == "generic":
                ready = now - since >= self.settle or (exited and same)
            else:
                ready = has_marker and (exited or same)
            by_step.setdefault(e.step, []).append((e, ready))
        made = []
        for step, group in sorted(by_step.items()):
            if not all(ready for _e, ready in group):
                continue
            self._done.add(step)
            if os.path.isdir(os.path.join(self.local_dir, name_for(step))):
                continue
            names = [e.name for e, _ in group]
            try:
                self._collect(step, [e for e, _ in group])
            except OSError as err:  # the framework's rotation deleted it under us: the next one will do
                self.log(f"checkpoint {', '.join(names)} not collected ({type(err).__name__}: {err})")
                continue
            made.append(step)
            self.log(f"collected {group[0][0].kind} checkpoint {', '.join(names)} as step {step}")
        return made

    def _collect(self, step: int, group: list[Entry]) -> None:
        os.makedirs(self.local_dir, exist_ok=True)
        tmp = os.path.join(self.local_dir, f".tmp-{name_for(step)}-fw")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for e in group:
            put(os.path.join(self.source, e.name), os.path.join(tmp, e.name), link=writes_once(e))
        make_final(tmp, os.path.join(self.local_dir, name_for(step)), guard_uploads=True)


def writes_once(e: Entry) -> bool:
    """Hard links for what a framework writes once (its rotation only unlinks it); copies for
    generic names, which a script may overwrite in place (torch.save truncates the same inode)."""
    return e.kind in ("hf", "lightning", "dcp")


def put(src: str, dest: str, *, link: bool) -> None:
    """src (file or tree) at dest: hard links where allowed (same file system), else copies."""
    def one(s: str, d: str) -> None:
        if link:
            try:
                os.link(s, d)
                return
            except OSError:
                pass
        shutil.copy2(s, d)

    if os.path.isdir(src):
        shutil.copytree(src, dest, copy_function=lambda s, d: one(s, d))
    else:
        one(src, dest)


def place(step_path: Optional[str], target: str, set_aside: str, *, log: Log = print) -> list[str]:
    """Before a generation: make `target` hold exactly the restored step's checkpoint (None: none),
    moving every other checkpoint there into `set_aside` (kept for a person, the previous batch
    dropped). Other files (logs, a final model) stay. Returns the names placed."""
    os.makedirs(target, exist_ok=True)
    moving = entries(target)
    if moving:
        shutil.rmtree(set_aside, ignore_errors=True)
        os.makedirs(set_aside, exist_ok=True)
        for e in moving:
            os.rename(os.path.join(target, e.name), os.path.join(set_aside, e.name))
        log(f"set aside {len(moving)} checkpoint(s) in {target} ({', '.join(e.name for e in moving[-3:])}"
            f"{', ...' if len(moving) > 3 else ''}) to {set_aside}: every rank resumes the cluster's step")
    if step_path is None:
        return []
    placed = []
    for name in sorted(os.listdir(step_path)):
        e = recognize(step_path, name)
        if name.startswith(".dl-") or e is None:
            continue
        put(os.path.join(step_path, name), os.path.join(target, name), link=writes_once(e))
        placed.append(name)
    stepped = [n for n in placed if n.endswith(".ckpt") and _LIGHTNING_STEP.search(n)]
    if stepped and not any("last" in n for n in placed):
        # Lightning's ckpt_path="last" looks for a file named last*.ckpt: a copy, not a link,
        # since Lightning may rewrite it in place.
        shutil.copy2(os.path.join(target, stepped[-1]), os.path.join(target, "last.ckpt"))
        placed.append("last.ckpt")
    return placed


def before_run(workdir: str, checkpoint_dir: str, restored: Optional[str], local_dir: str, *, collects: bool,
               local_ranks: Iterable[int], floor: Optional[int], settle: float = DEFAULT_SETTLE,
               log: Log = print) -> Optional[Collector]:
    """Put the cluster's step in the framework's directory; the Collector for this node's run
    when it hosts global rank 0 (`collects`), else None (the others' copies are never read back)."""
    target = os.path.join(workdir, checkpoint_dir)
    placed = place(restored, target, os.path.join(workdir, SET_ASIDE, checkpoint_dir.replace("/", "_")), log=log)
    if placed:
        log(f"restored {', '.join(placed)} into {target}")
    if not collects:
        return None
    return Collector(target, local_dir, local_ranks=local_ranks, floor=floor, settle=settle, log=log)
