"""The built-in profiles are read from data/profiles.json, a copy of data/profiles.toml (the file
people edit) that spares every cold start tomllib: the copy must be the TOML, parsed by tomllib."""
from __future__ import annotations

import json
import tomllib

from dl_selector.paths import data_file


def test_the_json_copy_is_the_toml():
    with open(data_file("profiles.toml"), "rb") as f:
        toml = tomllib.load(f)["profiles"]
    with open(data_file("profiles.json")) as f:
        copy = json.load(f)["profiles"]
    assert copy == toml, "dl_selector/data/profiles.toml changed: run `python scripts/build_profiles.py` and commit profiles.json"
    assert list(copy) == list(toml), "the same order: the CLI lists profiles as the TOML does"
