"""User data for a node: the contract's names, this node's settings, then the packaged bootstrap
(scripts/bootstrap.sh), which fetches the node bundle (bundle.py) and installs it.

Plain text, not compressed: it is a few KB, and it may hold CDK tokens (the bundle's bucket and
key, anything a deployer adds) that CloudFormation resolves at deploy time. EC2's 16 KB limit is
still checked at synth, with each unresolved token counted at TOKEN_BYTES.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import aws_cdk as cdk
import jsii

from .runtime import contract
from .validation import ConfigurationError

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64: EC2's documented maximum
# What one unresolved token may add once deployed: S3 bucket names are at most 63 bytes, asset
# keys about 70, regions 14, ARNs rarely over 200.
TOKEN_BYTES = 256
HEREDOC = "DL_LAUNCHER_EOF"


def script_path(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def script_text(name: str) -> str:
    with open(script_path(name)) as f:
        return f.read()


@dataclass(frozen=True)
class SettingsFile:
    """A file the bootstrap writes verbatim. `path` is a shell word such as
    "$DL_NODE_ENV_FILE" (the contract's names are set when it runs); `content` may hold tokens."""

    label: str
    path: str
    content: str

    def __post_init__(self) -> None:
        if HEREDOC in self.content:
            raise ConfigurationError(f"{self.label} contains {HEREDOC}, the marker that ends it in user data; "
                                     "rename that word")

    def script(self) -> str:
        body = self.content if self.content.endswith("\n") else self.content + "\n"
        return f'  dl_put "{self.path}" <<\'{HEREDOC}\'\n{body}{HEREDOC}\n'


def user_data_parts(files: Sequence[SettingsFile], extra: Sequence[str]) -> list[tuple[str, str]]:
    """(label, text) in order; their concatenation is the user data."""
    shebang, bootstrap = script_text("bootstrap.sh").split("\n", 1)
    parts = [("bootstrap.sh and contract.sh", f"{shebang}\n{contract.shell()}dl_settings() {{\n")]
    parts += [(f.label, f.script()) for f in files]
    parts.append(("bootstrap.sh and contract.sh", "}\n" + bootstrap))
    if extra:
        parts.append(("extra user data (extra_user_data, add_user_data)", "".join(line + "\n" for line in extra)))
    return parts


@jsii.implements(cdk.ITokenMapper)
class _Blank:
    def map_token(self, t: cdk.IResolvable) -> str:
        return ""


def measure(text: str) -> tuple[int, int]:
    """(bytes of literal text, number of unresolved tokens) of a string that may hold tokens."""
    if not cdk.Token.is_unresolved(text):
        return len(text.encode()), 0
    fragments = cdk.Tokenization.reverse_string(text)
    literal = fragments.map_tokens(_Blank()).join(cdk.StringConcat())
    return len(literal.encode()), len(fragments.tokens)


def upper_bound(text: str) -> int:
    literal, tokens = measure(text)
    return literal + tokens * TOKEN_BYTES


def limit_problem(parts: Sequence[tuple[str, str]]) -> Optional[str]:
    """Why these parts cannot be one node's user data, naming the largest, or None."""
    sizes: dict[str, list[int]] = {}
    for label, text in parts:
        literal, tokens = measure(text)
        size = sizes.setdefault(label, [0, 0])
        size[0] += literal
        size[1] += tokens
    literal = sum(s[0] for s in sizes.values())
    tokens = sum(s[1] for s in sizes.values())
    total = literal + tokens * TOKEN_BYTES
    if total <= USER_DATA_LIMIT:
        return None
    largest = sorted(sizes.items(), key=lambda kv: -(kv[1][0] + kv[1][1] * TOKEN_BYTES))
    listed = ", ".join(f"{label} {lit + n * TOKEN_BYTES} bytes" for label, (lit, n) in largest)
    return (f"user data would be up to {total} bytes ({literal} of text and {tokens} token(s) counted at "
            f"{TOKEN_BYTES} bytes each), over EC2's {USER_DATA_LIMIT}-byte limit. Largest first: {listed}. "
            "Ship large scripts as an asset (aws_s3_assets.Asset) and fetch them at boot")
