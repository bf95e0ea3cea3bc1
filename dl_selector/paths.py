"""Where the selector's data files live. os.path, not pathlib: pathlib costs the CLI ~10 ms."""
from __future__ import annotations

import os

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def data_file(name: str) -> str:
    return os.path.join(DATA, name)
