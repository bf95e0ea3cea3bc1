"""User data assembled from the shell scripts in this package (files, so tests can run and lint them).

Each construct contributes files and systemd units; the launch template renders them into one
bash script, checked against EC2's 16 KB user-data limit at synth.
"""
from __future__ import annotations

import ast
import base64
import functools
import gzip
import os
from dataclasses import dataclass, field
from typing import Optional

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
LIB_DIR = "/usr/local/lib/dl-launcher"
ETC_DIR = "/etc/dl-launcher"
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64: EC2's documented maximum
_EOF = "DL_LAUNCHER_EOF"


def script_path(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def script_text(name: str) -> str:
    with open(script_path(name)) as f:
        return f.read()


def env_file(values: dict[str, str]) -> str:
    """KEY="value" lines that both systemd's EnvironmentFile= and bash's `.` read the same way."""
    for k, v in values.items():
        if any(c in str(v) for c in '"\\$`\n'):
            raise ValueError(f"{k}: value {v!r} has a character that env files cannot carry safely")
    return "".join(f'{k}="{v}"\n' for k, v in values.items())


@dataclass
class NodeScript:
    """Files, units and commands for the node, in the order they were added."""

    steps: list[str] = field(default_factory=list)

    def add_file(self, path: str, content: str, mode: str = "0644") -> "NodeScript":
        if _EOF in content:
            raise ValueError(f"{path}: content contains the heredoc marker {_EOF}")
        body = content if content.endswith("\n") else content + "\n"
        self.steps.append(f"install -d -m 0755 {os.path.dirname(path)}\n"
                          f"cat > {path} <<'{_EOF}'\n{body}{_EOF}\nchmod {mode} {path}")
        return self

    def add_script(self, name: str) -> str:
        """Install a packaged script under /usr/local/lib/dl-launcher; returns its path on the node."""
        path = f"{LIB_DIR}/{name}"
        self.add_file(path, compact_shell(script_text(name)), mode="0755")
        return path

    def add_python_package(self, package_dir: str, dest: str) -> "NodeScript":
        """Install the .py files of package_dir (compacted) into dest on the node."""
        for name in sorted(os.listdir(package_dir)):
            if name.endswith(".py"):
                with open(os.path.join(package_dir, name)) as f:
                    self.add_file(f"{dest}/{name}", compact_python(f.read()))
        return self

    def add_unit(self, name: str, unit: str, start: bool = True) -> "NodeScript":
        self.add_file(f"/etc/systemd/system/{name}", unit)
        self.steps.append(f"systemctl daemon-reload\nsystemctl enable {'--now ' if start else ''}{name}")
        return self

    def add_commands(self, *commands: str) -> "NodeScript":
        self.steps.extend(commands)
        return self

    def render(self) -> str:
        return "\n".join(["set -euo pipefail", *self.steps]) + "\n"


def boot_unit(description: str, exec_start: str, *, env_files: tuple[str, ...] = (), after: str = "",
              before: str = "", remain: bool = True) -> str:
    """A oneshot systemd unit that runs on every boot (cloud-init user data runs only on the first)."""
    lines = ["[Unit]", f"Description=dl-launcher: {description}"]
    if after:
        lines.append(f"After={after}")
    if before:
        lines.append(f"Before={before}")
    lines += ["", "[Service]", "Type=oneshot"]
    lines += [f"EnvironmentFile=-{e}" for e in env_files]
    lines += [f"ExecStart={exec_start}", f"RemainAfterExit={'yes' if remain else 'no'}", "",
              "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=64)
def compact_python(source: str) -> str:
    """The same program without docstrings, comment lines and blank lines: what the node runs,
    in about two thirds of the bytes. Lines are dropped, never rewritten, so the code is the
    code that the tests ran."""
    drop: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body[0]
            if len(body) == 1:  # a body that is only a docstring keeps a statement
                continue
            drop.update(range(doc.lineno, doc.end_lineno + 1))
    out = []
    for n, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if n in drop or not stripped or stripped.startswith("#"):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def compact_shell(source: str) -> str:
    """The script without its comment lines (the shebang stays): the node needs the code, the
    comments live in the package."""
    lines = source.splitlines()
    kept = [line for i, line in enumerate(lines) if i == 0 or not line.lstrip().startswith("#") or
            line.lstrip().startswith("# shellcheck")]
    return "\n".join(kept) + "\n"


def gzip_user_data(script: str) -> bytes:
    """The bytes EC2 receives (and its 16 KB limit applies to): cloud-init unpacks gzip."""
    return gzip.compress(script.encode(), mtime=0)


def encode_user_data(script: str) -> str:
    """base64 of the gzip-compressed script, as a launch template carries it."""
    return base64.b64encode(gzip_user_data(script)).decode()


def decode_user_data(value: str) -> str:
    return gzip.decompress(base64.b64decode(value)).decode()


def user_data_size(rendered: str, extra: Optional[str] = None) -> int:
    return len((rendered + (extra or "")).encode())
