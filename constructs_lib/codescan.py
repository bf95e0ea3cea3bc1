"""Which files of a deployer's code directory ship to the nodes (`-c code=DIR`, CodeAsset), and
why a directory cannot: missing, a file, empty, over the limit, or holding a link that leads out
of it. Standard library only, so that the app's context check runs before any CDK import.

What is left out: DEFAULT_EXCLUDES and SECRET_EXCLUDES, then the patterns of DIR/.dlignore if there is one, in
.gitignore's manner: one pattern a line, `#` comments, a pattern without `/` matches a name at
any depth, one with `/` matches the path from DIR, a trailing `/` matches directories only, `!`
takes a name back in (the last matching line wins), `*` and `?` and `[...]` as in fnmatch (a `*`
also crosses `/`, as `**` does in git).

Secret-like files (SECRET_EXCLUDES) never ship unless .dlignore takes them back with `!`: the code
goes into the CDK asset bucket and onto every node, where any process of the job can read it.
The files left out that way are named (CodeFiles.secrets) so the deployer sees it happen.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from .validation import ConfigurationError

DEFAULT_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/")
# Credentials and keys that a project directory often holds beside the code: dotenv files, the AWS
# CLI's and SSH's directories, netrc, private keys and key stores, package-registry tokens.
SECRET_EXCLUDES = (".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".aws/", ".ssh/", ".gnupg/", ".docker/",
                   ".kube/", "credentials", "credentials.json", ".git-credentials", ".pgpass", ".npmrc", ".pypirc",
                   ".htpasswd", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "id_rsa*", "id_dsa*",
                   "id_ecdsa*", "id_ed25519*")
IGNORE_FILE = ".dlignore"
# CDK zips and uploads the directory on every deploy that changes it, and every node downloads
# and unpacks it before each new revision: code, not data (datasets go to S3 and are fetched).
MAX_BYTES = 256 * 1024 * 1024
MAX_FILES = 20_000
_MIB = 1024 * 1024


@dataclass(frozen=True)
class CodeFiles:
    root: str                          # the directory, absolute
    files: tuple[tuple[str, str], ...]  # (relative POSIX path, path on disk, a link's target resolved)
    bytes: int
    patterns: tuple[str, ...]          # the excludes applied, in order
    secrets: tuple[str, ...] = ()      # what SECRET_EXCLUDES left out (a directory as "name/"), sorted

    def secrets_line(self) -> str:
        """One line naming the secret-like files left out, or ''."""
        if not self.secrets:
            return ""
        shown = ", ".join(self.secrets[:8]) + (f" and {len(self.secrets) - 8} more" if len(self.secrets) > 8 else "")
        return (f"left out as secret-like (never shipped to the nodes): {shown}; to ship one on purpose, add "
                f"!NAME to {IGNORE_FILE}")


@dataclass(frozen=True)
class _Rule:
    pattern: str
    negate: bool
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return fnmatch.fnmatchcase(rel, self.pattern)
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.pattern) or fnmatch.fnmatchcase(rel, f"*/{self.pattern}")


def _rules(lines: list[str]) -> list[_Rule]:
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append(_Rule(line.lstrip("/"), negate, dir_only, anchored))
    return rules


def _excluded(rules: list[_Rule], rel: str, is_dir: bool) -> bool:
    out = False
    for r in rules:
        if r.matches(rel, is_dir):
            out = not r.negate
    return out


def _show(path: str) -> str:
    return ascii(path) if len(path) <= 200 else ascii(path[:180]) + "..."


def scan(directory: str, *, max_bytes: int = MAX_BYTES, max_files: int = MAX_FILES,
         what: str = "code") -> CodeFiles:
    """The files that ship, or ConfigurationError naming what is wrong and what to do instead."""
    where = f"{what} {_show(directory)}"
    if not os.path.exists(directory):
        raise ConfigurationError(f"{where}: no such directory (relative paths are from {_show(os.getcwd())})")
    if not os.path.isdir(directory):
        raise ConfigurationError(f"{where} is a file: expected the directory of your training project "
                                 "(its parent, if this is your script)")
    root = os.path.realpath(directory)
    lines = [*DEFAULT_EXCLUDES, *SECRET_EXCLUDES]
    ignore = os.path.join(root, IGNORE_FILE)
    if os.path.isfile(ignore):
        try:
            with open(ignore, encoding="utf-8") as f:
                lines += f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigurationError(f"{what} {_show(ignore)} cannot be read as text: {e}") from None
    rules = _rules(lines)
    # The same rules without the secret ones: what they alone leave out is reported.
    plain = _rules(lines[:len(DEFAULT_EXCLUDES)] + lines[len(DEFAULT_EXCLUDES) + len(SECRET_EXCLUDES):])
    secrets: list[str] = []
    files: list[tuple[str, str]] = []
    total = 0
    sizes: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for d in sorted(dirnames):
            rel = rel_dir + d
            full = os.path.join(dirpath, d)
            if _excluded(rules, rel, True):
                if not _excluded(plain, rel, True):
                    secrets.append(rel + "/")
                continue
            if os.path.islink(full):
                raise ConfigurationError(f"{where}: {_show(rel)} is a link to a directory "
                                         f"({_show(os.readlink(full))}): ship the directory itself, or list the "
                                         f"link in {IGNORE_FILE}")
            kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = rel_dir + name
            full = os.path.join(dirpath, name)
            if _excluded(rules, rel, False):
                if not _excluded(plain, rel, False):
                    secrets.append(rel)
                continue
            real = os.path.realpath(full)
            if os.path.islink(full):
                if not real.startswith(root + os.sep):
                    raise ConfigurationError(f"{where}: {_show(rel)} is a link out of the directory (to "
                                             f"{_show(os.readlink(full))}): copy the file in, or list the link in "
                                             f"{IGNORE_FILE}")
                if not os.path.isfile(real):
                    raise ConfigurationError(f"{where}: {_show(rel)} is a link to nothing that can ship "
                                             f"({_show(os.readlink(full))}): remove it or list it in {IGNORE_FILE}")
            elif not os.path.isfile(full):
                continue  # sockets, fifos: nothing a job can use from a zip
            size = os.path.getsize(real)
            files.append((rel, real))
            total += size
            top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
            sizes[top] = sizes.get(top, 0) + size
    if not files:
        raise ConfigurationError(f"{where} has no files to ship (after the excludes {', '.join(DEFAULT_EXCLUDES)}"
                                 f"{' and ' + IGNORE_FILE if os.path.isfile(ignore) else ''}"
                                 f"{'; ' + CodeFiles(root, (), 0, (), tuple(sorted(secrets))).secrets_line() if secrets else ''}"
                                 "): point it at your training project")
    if total > max_bytes or len(files) > max_files:
        top = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        largest = ", ".join(f"{k} {v / _MIB:.0f} MiB" for i, (k, v) in enumerate(top) if i == 0 or v >= _MIB)
        raise ConfigurationError(
            f"{where} is {total / _MIB:.1f} MiB in {len(files):,} files: over the limit for code shipped with "
            f"each deploy ({max_bytes // _MIB} MiB, {max_files:,} files); largest: {largest}. Keep data, "
            f"checkpoints and environments out (list them in {_show(os.path.join(directory, IGNORE_FILE))}), fetch data from S3 in setup, "
            "or put dependencies in an image (-c image=URI)")
    return CodeFiles(root, tuple(files), total, tuple(lines), tuple(sorted(secrets)))
