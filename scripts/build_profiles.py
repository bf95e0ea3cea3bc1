"""Rebuild dl_selector/data/profiles.json from dl_selector/data/profiles.toml, the file people edit.

The CLI reads the JSON copy: `tomllib` (with `string` and its regular expressions) cost every cold
`recommend` about a fifth of its start beyond the bare interpreter (issue 39 item 7).
tests/selector/test_profiles_json.py fails when the copy and the TOML differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from dl_selector.profiles import write_builtin_json
    path = write_builtin_json()
    print(f"{path} rebuilt from profiles.toml")
