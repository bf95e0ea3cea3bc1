"""A code tree's identity and its unpacking, the same on both sides: the constructs stage a
deployer's directory and record its digest at synth (constructs_lib.code), the node checks the
directory it unpacked against that digest before a generation runs there.

The digest covers each regular file's relative path and bytes, in sorted path order; not its
mode or time (zip tools differ there), not empty directories (zip archives may drop them).
Standard library only: this module ships to the node with the runtime.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import zipfile
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class TreeDigest:
    sha256: str
    files: int
    bytes: int


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_of(entries: Iterable[tuple[str, str]]) -> TreeDigest:
    """The digest of (relative POSIX path, file on disk) pairs."""
    h = hashlib.sha256()
    files = size = 0
    for rel, path in sorted(entries):
        n = os.path.getsize(path)
        h.update(f"{rel}\0{n}\0{file_sha256(path)}\n".encode())
        files += 1
        size += n
    return TreeDigest(h.hexdigest(), files, size)


def tree_files(root: str) -> list[tuple[str, str]]:
    """Every regular file under root as (relative POSIX path, path); links are not followed
    (an unpacked tree has none)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                out.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    return out


def digest_tree(root: str) -> TreeDigest:
    return digest_of(tree_files(root))


class UnsafeArchive(Exception):
    pass


def unpack(archive: str, dest: str) -> None:
    """Unzip into dest (created, must not exist), refusing any member that would land outside it;
    the owner's execute bits are kept where the archive records them."""
    os.makedirs(dest)
    root = os.path.realpath(dest)
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            target = os.path.realpath(os.path.join(root, info.filename))
            if target != root and not target.startswith(root + os.sep):
                raise UnsafeArchive(f"archive member {info.filename!r} would land outside {dest}")
            if info.is_dir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o100:
                os.chmod(target, 0o755)
