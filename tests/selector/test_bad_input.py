"""Every bad input to `python -m dl_selector` exits 2 with one line on stderr and writes nothing.

The table runs the real CLI as a subprocess, grouped by class of mistake: a new class is a new
list, a new case is one row. Each row is (id, files, argv, expected text in the error line).
`files` maps a name under tmp_path to its content (bytes or str), DIR (make a directory) or
UNREADABLE (a file with mode 000); "{tmp}" in argv is tmp_path.
"""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Union

import pytest

from dl_selector.errors import UserError
from dl_selector.validate import clean, finite_number

ROOT = Path(__file__).resolve().parents[2]
DIR = object()
UNREADABLE = object()
FileSpec = Union[bytes, str, object]

TP = "instance_type,samples_per_second,price_per_hour,spot_price_per_hour\n"
PRICES = "instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour\n"
REC = ["recommend", "--profile", "training"]


def tp(*rows: str) -> str:
    return TP + "".join(r + "\n" for r in rows)


def prices(*rows: str) -> str:
    return PRICES + "".join(r + "\n" for r in rows)


def toml(body: str) -> str:
    return '[profiles.team]\nextends = "training"\n' + body + "\n"


def catalog_with(change: Any) -> str:
    """The embedded catalog, with `change(doc)` applied in place (its return value is ignored)."""
    from dl_selector import embedded
    doc = embedded.joined()
    change(doc)
    # allow_nan (the default): some rows need a NaN literal in the file on purpose.
    return json.dumps(doc)


def _set_first(key: str, value: Any):
    return lambda d: d["types"][0].__setitem__(key, value)


def _deep(n: int = 100_000) -> str:
    """n nested lists: past any parser's recursion limit (PyYAML, pure Python and slow, needs 2000)."""
    return "[" * n + "]" * n


def _random_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


TRT = ["--throughput", "{tmp}/t.csv"]
TRJ = ["--throughput", "{tmp}/t.json"]
PR = ["--prices", "{tmp}/p.csv"]
PF = ["--profiles", "{tmp}/p.toml", "--profile", "team"]
PY = ["--profiles", "{tmp}/p.yaml", "--profile", "team"]
CAT = ["--catalog", "{tmp}/c.json"]

Row = tuple[str, dict[str, FileSpec], list[str], str]

NUMBERS: list[Row] = [
    ("top-zero", {}, REC + ["--top", "0"], "--top must be at least 1"),
    ("top-negative", {}, REC + ["--top", "-3"], "closest: 1"),
    ("top-huge", {}, REC + ["--top", "1" + "0" * 30], "--top must be at least 1 and at most"),
    ("top-fraction", {}, REC + ["--top", "1.5"], "not a whole number"),
    ("top-nan", {}, REC + ["--top", "nan"], "not a finite number"),
    ("top-inf", {}, REC + ["--top", "inf"], "not a finite number"),
    ("top-word", {}, REC + ["--top", "five"], "is not a number"),
    ("tp-nan", {"t.csv": tp("g5.xlarge,nan,,")}, REC + TRT, "samples_per_second = nan is not a finite number"),
    ("tp-inf", {"t.csv": tp("g5.xlarge,inf,,")}, REC + TRT, "not a finite number"),
    ("tp-minus-inf", {"t.csv": tp("g5.xlarge,-inf,,")}, REC + TRT, "not a finite number"),
    ("tp-1e999", {"t.csv": tp("g5.xlarge,1e999,,")}, REC + TRT, "closest: 1e+12"),
    ("tp-huge", {"t.csv": tp("g5.xlarge,1e300,,")}, REC + TRT, "at most 1e+12"),
    ("tp-zero", {"t.csv": tp("g5.xlarge,0,,")}, REC + TRT, "must be above zero"),
    ("tp-negative", {"t.csv": tp("g5.xlarge,-5,,")}, REC + TRT, "must be above zero"),
    ("tp-price-zero", {"t.csv": tp("g5.xlarge,10,0,")}, REC + TRT, "price_per_hour must be at least 0.0001"),
    ("tp-spot-nan", {"t.csv": tp("g5.xlarge,10,1,nan")}, REC + TRT, "spot_price_per_hour = nan"),
    ("tp-json-NaN", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": NaN}]'}, REC + TRJ,
     "NaN is not allowed"),
    ("tp-json-Infinity", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": -Infinity}]'}, REC + TRJ,
     "-Infinity is not allowed"),
    ("tp-json-1e999", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": 1e999}]'}, REC + TRJ,
     "not a finite number"),
    ("tp-json-string", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": "fast"}]'}, REC + TRJ,
     "'fast' is not a number"),
    ("tp-json-bool", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": true}]'}, REC + TRJ,
     "got True"),
    ("tp-json-price-negative", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": 5, '
                                          '"price_per_hour": -1}]'}, REC + TRJ, "closest: 0.0001"),
    ("prices-nan", {"p.csv": prices("g5.xlarge,us-east-1,nan,")}, REC + PR, "not a finite number"),
    ("prices-negative", {"p.csv": prices("g5.xlarge,us-east-1,-1,")}, REC + PR, "at least 0.0001"),
    ("prices-1e999", {"p.csv": prices("g5.xlarge,us-east-1,1e999,")}, REC + PR, "closest: 100000"),
    ("prices-spot-zero", {"p.csv": prices("g5.xlarge,us-east-1,1,0")}, REC + PR, "at least 0.0001"),
    ("prices-word", {"p.csv": prices("g5.xlarge,us-east-1,cheap,")}, REC + PR, "'cheap' is not a number"),
    ("profile-memory-nan", {"p.toml": toml("min_accelerator_memory_gib = nan")}, REC[:1] + PF,
     "min_accelerator_memory_gib = nan is not a finite number"),
    ("profile-memory-inf", {"p.toml": toml("min_accelerator_memory_gib = inf")}, REC[:1] + PF, "closest: 1e+06"),
    ("profile-memory-negative", {"p.toml": toml("min_accelerator_memory_gib = -1")}, REC[:1] + PF, "closest: 0"),
    ("profile-reference-zero", {"p.toml": toml("reference_samples_per_second = 0")}, REC[:1] + PF,
     "reference_samples_per_second must be above zero"),
    ("profile-reference-string", {"p.toml": toml('reference_samples_per_second = "fast"')}, REC[:1] + PF,
     "must be a number"),
    ("profile-nodes-zero", {"p.toml": toml("multi_node = true\nnodes = 0")}, REC[:1] + PF, "nodes must be at least 1"),
    ("profile-nodes-fraction", {"p.toml": toml("multi_node = true\nnodes = 1.5")}, REC[:1] + PF, "closest: 2"),
    ("profile-max-acc-huge", {"p.toml": toml("max_accelerators = 100000")}, REC[:1] + PF, "closest: 1024"),
    ("profile-min-acc-string", {"p.toml": toml('min_accelerators = "eight"')}, REC[:1] + PF,
     "min_accelerators must be a whole number"),
    ("profile-yaml-nan", {"p.yaml": "profiles:\n  team:\n    extends: training\n    min_relative_throughput: .nan\n"},
     REC[:1] + PY, "not a finite number"),
    ("profile-yaml-huge-int", {"p.yaml": "profiles:\n  team:\n    extends: training\n    nodes: " + "9" * 40 + "\n"},
     REC[:1] + PY, "closest: 10000"),
    ("catalog-nan", {"c.json": catalog_with(_set_first("memory_gib", float("nan")))}, REC + CAT,
     "not valid JSON (NaN is not allowed"),
    ("catalog-negative", {"c.json": catalog_with(_set_first("vcpus", -1))}, REC + CAT, "vcpus must be at least 0"),
    ("catalog-fraction-zero", {"c.json": catalog_with(_set_first("accelerator_fraction", 0))}, REC + CAT,
     "accelerator_fraction must be above zero"),
    ("catalog-string-count", {"c.json": catalog_with(_set_first("accelerator_count", "8"))}, REC + CAT,
     "accelerator_count must be a whole number"),
    ("catalog-efa-string", {"c.json": catalog_with(_set_first("efa_gbps", "3200"))}, REC + CAT,
     "efa_gbps must be null or a number"),
    ("catalog-ena-zero", {"c.json": catalog_with(_set_first("ena_gbps", 0))}, REC + CAT,
     "ena_gbps must be above zero"),
    ("catalog-ena-negative", {"c.json": catalog_with(_set_first("ena_gbps", -100))}, REC + CAT,
     "ena_gbps must be above zero"),
    ("catalog-efa-huge", {"c.json": catalog_with(_set_first("efa_gbps", 1e12))}, REC + CAT,
     "efa_gbps must be above zero and at most 100000"),
    ("catalog-network-bool", {"c.json": catalog_with(_set_first("network_gbps", True))}, REC + CAT,
     "network_gbps must be above zero"),
]

MALFORMED: list[Row] = [
    ("tp-binary", {"t.csv": b"\x00" + _random_bytes(256, 1)}, REC + TRT, "binary data"),
    ("tp-latin1", {"t.csv": (TP + "g5.xlarge,10,,\n# café\n").encode("latin-1")}, REC + TRT, "not UTF-8"),
    ("tp-utf16", {"t.csv": tp("g5.xlarge,10,,").encode("utf-16")}, REC + TRT, "UTF-16"),
    ("tp-truncated-row", {"t.csv": TP + "g5.xlarge\n"}, REC + TRT, "missing samples_per_second (truncated?)"),
    ("tp-extra-cells", {"t.csv": tp("g5.xlarge,10,1,1,1")}, REC + TRT, "5 cells for 4 columns"),
    ("tp-missing-column", {"t.csv": "instance_type,sps\ng5.xlarge,1\n"}, REC + TRT, "missing samples_per_second"),
    ("tp-json-object", {"t.json": '{"g5.xlarge": 10}'}, REC + TRJ, "expected a JSON list of objects"),
    ("tp-json-list-of-lists", {"t.json": '[["g5.xlarge", 10]]'}, REC + TRJ, "expected a JSON list of objects"),
    ("tp-json-name-not-string", {"t.json": '[{"instance_type": ["g5.xlarge"], "samples_per_second": 1}]'},
     REC + TRJ, "instance_type must be a string"),
    ("tp-json-deep", {"t.json": _deep()}, REC + TRJ, "nested too deeply"),
    ("tp-json-truncated", {"t.json": '[{"instance_type": "g5.xlarge"'}, REC + TRJ, "not valid JSON"),
    ("tp-empty", {"t.csv": ""}, REC + TRT, "is empty"),
    ("tp-header-only", {"t.csv": TP}, REC + TRT, "no rows"),
    ("tp-directory", {"t.csv": DIR}, REC + TRT, "is a directory"),
    ("tp-missing-path", {}, REC + TRT, "No such file or directory"),
    ("tp-endless", {}, REC + ["--throughput", "/dev/zero"], "larger than 64 MiB"),
    ("tp-crlf-truncated", {"t.csv": TP.replace("\n", "\r\n") + "g5.xlarge\r\n"}, REC + TRT, "line 2: row ends"),
    ("tp-unreadable", {"t.csv": UNREADABLE}, REC + TRT, "Permission denied"),
    ("prices-binary", {"p.csv": _random_bytes(512, 2) + b"\x00"}, REC + PR, "binary data"),
    ("prices-utf16", {"p.csv": prices("g5.xlarge,us-east-1,1,").encode("utf-16")}, REC + PR, "UTF-16"),
    ("prices-truncated-row", {"p.csv": PRICES + "g5.xlarge,us-east-1\n"}, REC + PR,
     "missing on_demand_usd_per_hour (truncated?)"),
    ("prices-missing-column", {"p.csv": "instance_type,on_demand_usd_per_hour\ng5.xlarge,1\n"}, REC + PR,
     "missing region"),
    ("prices-extra-cells", {"p.csv": prices("g5.xlarge,us-east-1,1,1,x,y,z")}, REC + PR, "7 cells for 4 columns"),
    ("prices-blank-region", {"p.csv": prices("g5.xlarge,,1,1")}, REC + PR, "missing region"),
    ("prices-empty", {"p.csv": b""}, REC + PR, "is empty"),
    ("prices-directory", {"p.csv": DIR}, REC + PR, "is a directory"),
    ("profiles-binary", {"p.toml": _random_bytes(300, 3) + b"\x00"}, REC[:1] + PF, "binary data"),
    ("profiles-latin1", {"p.toml": toml('description = "équipe"').encode("latin-1")}, REC[:1] + PF, "not UTF-8"),
    ("profiles-bad-toml", {"p.toml": "[profiles.team\n"}, REC[:1] + PF, "not valid TOML"),
    ("profiles-extends-list", {"p.toml": '[profiles.team]\nextends = ["training"]\n'}, REC[:1] + PF,
     "extends must be the name of one profile"),
    ("profiles-not-a-table", {"p.toml": "profiles = [1, 2]\n"}, REC[:1] + PF, "expected a 'profiles' table"),
    ("profiles-profile-not-a-table", {"p.toml": 'profiles.team = "fast"\n'}, REC[:1] + PF, "must be a table of settings"),
    ("profiles-description-number", {"p.toml": toml("description = 5")}, REC[:1] + PF, "description must be a string"),
    ("profiles-sdks-number", {"p.toml": toml("sdks = [1]")}, REC[:1] + PF, "sdks must be a list of strings"),
    ("profiles-toml-deep", {"p.toml": "a = " + _deep() + "\n"}, REC[:1] + PF, "nested too deeply"),
    ("profiles-yaml-int-name", {"p.yaml": "profiles:\n  1:\n    description: x\n"}, ["profiles", "--profiles",
                                                                                 "{tmp}/p.yaml"],
     "profile names must be non-empty strings"),
    ("profiles-yaml-int-setting", {"p.yaml": "profiles:\n  team:\n    extends: training\n    1: x\n"}, REC[:1] + PY,
     "setting names must be strings"),
    ("profiles-yaml-list", {"p.yaml": "- profiles\n- team\n"}, REC[:1] + PY, "expected a 'profiles' table"),
    ("profiles-yaml-deep", {"p.yaml": _deep(2_000)}, REC[:1] + PY, "nested too deeply"),
    ("profiles-empty", {"p.toml": ""}, REC[:1] + PF, "is empty"),
    ("profiles-directory", {"p.toml": DIR}, REC[:1] + PF, "is a directory"),
    ("profiles-missing-path", {}, REC[:1] + PF, "No such file or directory"),
    ("catalog-binary", {"c.json": _random_bytes(1000, 4) + b"\x00"}, REC + CAT, "binary data"),
    ("catalog-list", {"c.json": "[]"}, REC + CAT, "expected a JSON object"),
    ("catalog-empty-object", {"c.json": "{}"}, REC + CAT, "as_of must be a string"),
    ("catalog-types-not-objects", {"c.json": catalog_with(lambda d: d.__setitem__("types", [1]))}, REC + CAT,
     "types[0] must be an object"),
    ("catalog-missing-field", {"c.json": catalog_with(lambda d: d["types"][0].pop("vcpus"))}, REC + CAT,
     "is not a dl-launcher catalog"),
    ("catalog-unknown-accelerator", {"c.json": catalog_with(_set_first("accelerator", "Z9000"))}, REC + CAT,
     "unknown accelerator"),
    ("catalog-deep", {"c.json": _deep()}, REC + CAT, "nested too deeply"),
    ("catalog-missing-path", {}, ["show", "p5.48xlarge"] + CAT, "No such file or directory"),
]

IGNORED_SETTINGS: list[Row] = [
    ("tp-duplicate-csv", {"t.csv": tp("g5.xlarge,10,,", "g6.xlarge,5,,", "g5.xlarge,12,,")}, REC + TRT,
     "g5.xlarge is measured twice (lines 2 and 4)"),
    ("tp-duplicate-json", {"t.json": json.dumps([{"instance_type": "g5.xlarge", "samples_per_second": 1}] * 2)},
     REC + TRJ, "g5.xlarge is measured twice (rows 1 and 2)"),
    ("prices-unknown-region", {"p.csv": prices("g5.xlarge,us-east-9,1,")}, REC + PR,
     "unknown region for g5.xlarge in price file 'us-east-9'; closest: us-east-2, us-east-1"),
    ("prices-duplicate", {"p.csv": prices("g5.xlarge,us-east-1,1,", "g5.xlarge,us-east-1,2,")}, REC + PR,
     "priced twice (lines 2 and 3)"),
    ("families-comma", {}, REC + ["--families", ","], "--families needs at least one family"),
    ("families-empty", {}, REC + ["--families", ""], "--families needs at least one family"),
    ("families-empty-name", {}, REC + ["--families", "p5,,g6"], "has an empty name; closest: p5,g6"),
]

CASE: list[Row] = [
    ("region-upper", {}, REC + ["--region", "US-EAST-1"], "unknown region 'US-EAST-1'; closest: us-east-1"),
    ("show-upper", {}, ["show", "P4D.24XLARGE"], "closest: p4d.24xlarge"),
    ("profile-mixed", {}, ["recommend", "--profile", "Multi-Node-Training"], "closest: multi-node-training"),
    ("families-upper", {}, REC + ["--families", "P5"], "unknown family 'P5'; closest: p5"),
    ("tp-type-upper", {"t.csv": tp("G5.XLARGE,10,,")}, REC + TRT, "closest: g5.xlarge"),
    ("prices-region-upper", {"p.csv": prices("g5.xlarge,US-EAST-1,1,")}, REC + PR, "closest: us-east-1"),
]

TERMINAL: list[Row] = [
    ("profile-name-esc", {}, ["recommend", "--profile", "x\x1b[31mred"], r"'x\x1b[31mred'"),
    ("tp-type-esc", {"t.csv": tp("g5\x1b[2J.xlarge,10,,")}, REC + TRT, r"g5\x1b[2J.xlarge"),
    ("prices-type-bel", {"p.csv": prices("g5\x07.xlarge,us-east-1,1,")}, REC + PR, r"g5\x07.xlarge"),
    ("profiles-name-cr", {"p.toml": '[profiles."team\\roverwrite"]\nobjective = "min_price"\n'},
     ["profiles", "--profiles", "{tmp}/p.toml"], r"'team\roverwrite': needs a description"),
    ("profiles-value-esc", {"p.toml": toml('objective = "fast\\u001b[0m"')}, REC[:1] + PF, r"'fast\x1b[0m'"),
    ("path-newline", {}, REC + ["--throughput", "{tmp}/a\nb.csv"], r"a\nb.csv"),
]

REFRESH: list[Row] = [
    ("refresh-out-directory", {"out": DIR}, ["catalog", "refresh", "--out", "{tmp}/out"], "is a directory"),
    ("refresh-out-no-folder", {}, ["catalog", "refresh", "--out", "{tmp}/nope/c.json"], "does not exist"),
    ("refresh-no-credentials", {}, ["catalog", "refresh", "--out", "{tmp}/c.json"], "needs AWS credentials"),
]

LIVE: list[Row] = [
    ("recommend-live-no-credentials", {}, REC + ["--live"], "recommend --live needs AWS credentials"),
    ("recommend-live-spot-no-credentials", {}, REC + ["--live", "--spot", "--az", "us-east-1a"], "needs AWS credentials"),
    ("recommend-az-without-live", {}, REC + ["--az", "us-east-1a"], "--az only applies with --live"),
    ("recommend-max-age-without-live", {}, REC + ["--max-age", "5"], "--max-age only applies with --live"),
    ("recommend-live-az-other-region", {}, REC + ["--live", "--az", "us-west-2a"],
     "'us-west-2a' is not an Availability Zone of us-east-1"),
    ("recommend-live-az-empty", {}, REC + ["--live", "--az", "us-east-1a,"], "has an empty name"),
    ("recommend-live-az-esc", {}, REC + ["--live", "--az", "us-east-1\x1b[2Ja"], r"us-east-1\x1b[2Ja"),
    ("recommend-live-max-age-negative", {}, REC + ["--live", "--max-age", "-5"], "--max-age must be at least 0"),
    ("recommend-live-max-age-nan", {}, REC + ["--live", "--max-age", "nan"], "--max-age = nan is not a finite"),
    ("recommend-live-unknown-region", {}, REC + ["--live", "--region", "us-east-9"], "unknown region 'us-east-9'"),
    ("recommend-live-unknown-profile", {}, ["recommend", "--profile", "nope", "--live"], "unknown profile 'nope'"),
    ("refresh-prices-no-credentials", {}, ["catalog", "refresh", "--prices", "--out", "{tmp}/c.json"],
     "catalog refresh needs AWS credentials"),
    ("refresh-prices-and-no-live-prices", {}, ["catalog", "refresh", "--prices", "--no-live-prices"],
     "pass one of the two"),
    ("refresh-prices-unknown-region", {}, ["catalog", "refresh", "--prices", "--region", "US-EAST-1"],
     "closest: us-east-1"),
    ("refresh-prices-out-directory", {"out": DIR}, ["catalog", "refresh", "--prices", "--out", "{tmp}/out"],
     "is a directory"),
]

# Issue 22's held-out classes: accepted before, each now one line.
REVIEW: list[Row] = [
    ("top-fullwidth-digit", {}, REC + ["--top", "\uff13"], "not plain ASCII; allowed: at least 1"),
    ("top-arabic-indic", {}, REC + ["--top", "\u0665"], "closest: 5"),
    ("tp-arabic-indic", {"t.csv": tp("g5.xlarge,\u0661\u0660,,")}, REC + TRT, "in ASCII digits; closest: 10"),
    ("prices-fullwidth", {"p.csv": prices("g5.xlarge,us-east-1,\uff11.5,")}, REC + PR, "not plain ASCII"),
    ("tp-json-duplicate-key", {"t.json": '[{"instance_type": "g5.xlarge", "samples_per_second": 5, '
                                         '"samples_per_second": 7}]'}, REC + TRJ,
     "key 'samples_per_second' appears twice in one object"),
    ("catalog-duplicate-key", {"c.json": '{"as_of": "2026-01-01", "as_of": "2026-02-01"}'}, REC + CAT,
     "key 'as_of' appears twice"),
    ("prices-near-miss-column", {"p.csv": "instance_type,region,on_demand_usd_per_hour,spot_usd_per_hr\n"
                                          "g5.xlarge,us-east-1,1,0.5\n"}, REC + PR,
     "column 'spot_usd_per_hr' is not one this file takes; closest: spot_usd_per_hour"),
    ("prices-column-case", {"p.csv": "instance_type,region,on_demand_usd_per_hour,Spot_USD_Per_Hour\n"
                                     "g5.xlarge,us-east-1,1,0.5\n"}, REC + PR, "closest: spot_usd_per_hour"),
    ("tp-near-miss-column", {"t.csv": "instance_type,samples_per_second,spot_price_per_hr\ng5.xlarge,10,1\n"},
     REC + TRT, "closest: spot_price_per_hour"),
    ("prices-as-of-word", {"p.csv": PRICES.strip() + ",as_of\ng5.xlarge,us-east-1,1,,yesterday\n"}, REC + PR,
     "as_of = 'yesterday' is not a date; allowed: YYYY-MM-DD"),
    ("prices-as-of-impossible", {"p.csv": PRICES.strip() + ",as_of\ng5.xlarge,us-east-1,1,,2026-02-30\n"},
     REC + PR, "'2026-02-30' is not a date"),
    ("prices-as-of-future", {"p.csv": PRICES.strip() + ",as_of\ng5.xlarge,us-east-1,1,,2999-01-01\n"},
     REC + PR, "is in the future"),
    ("prices-spot-as-of-word", {"p.csv": PRICES.strip() + ",spot_as_of\ng5.xlarge,us-east-1,1,0.5,last week\n"},
     REC + PR, "spot_as_of = 'last week' is not a date"),
    ("catalog-as-of-word", {"c.json": catalog_with(lambda d: d.__setitem__("as_of", "recently"))}, REC + CAT,
     "as_of = 'recently' is not a date"),
    ("plan-model-with-command", {}, ["bench", "plan", "--profile", "training", "--command", "echo x", "--model",
                                     "gpt2", "--out", "{tmp}/plan.json"], "--model picks the reference benchmark"),
    ("plan-command-line-break", {}, ["bench", "plan", "--profile", "training", "--command", "echo a\nrm -rf b",
                                     "--out", "{tmp}/plan.json"], "no line breaks or other control characters"),
    ("plan-command-cr", {}, ["bench", "plan", "--profile", "training", "--command", "echo a\rb",
                             "--out", "{tmp}/plan.json"], "must be one non-empty line of printable characters"),
    ("flag-typo", {}, REC + ["--topp", "3"], "unrecognized arguments: --topp 3; closest: --top; flags: --profile"),
    ("flag-typo-equals", {}, REC + ["--famlies=p5"], "closest: --families"),
    ("command-typo", {}, ["recomend", "--profile", "training"], "invalid choice: 'recomend'"),
    ("command-typo-closest", {}, ["recomend"], "closest: recommend"),
    ("bench-verb-typo", {}, ["bench", "colect"], "closest: collect"),
    ("extra-value", {}, ["show", "p5.48xlarge", "p4d.24xlarge"], "takes no further values"),
]

# Issue 25's ad-hoc filters.
FILTERS: list[Row] = [
    ("gpu-unknown", {}, REC + ["--gpu", "H10:8"], "unknown accelerator model; closest: H100; allowed: A100"),
    ("gpu-empty", {}, REC + ["--gpu", ""], "unknown accelerator model"),
    ("gpu-count-word", {}, REC + ["--gpu", "H100:eight"], "--gpu H100:COUNT = 'eight' is not a number"),
    ("gpu-count-zero", {}, REC + ["--gpu", "A10G:0"], "at least 1"),
    ("gpu-count-fraction", {}, REC + ["--gpu", "A10G:1.5"], "not a whole number"),
    ("gpu-esc", {}, REC + ["--gpu", "H100\x1b[2J"], r"H100\x1b[2J"),
    ("min-gpu-memory-negative", {}, REC + ["--min-gpu-memory", "-4"], "--min-gpu-memory must be above zero"),
    ("min-gpu-memory-word", {}, REC + ["--min-gpu-memory", "lots"], "is not a number"),
    ("max-price-zero", {}, REC + ["--max-price", "0"], "--max-price must be above zero"),
    ("max-price-nan", {}, REC + ["--max-price", "nan"], "not a finite number"),
    ("max-price-underscore", {}, REC + ["--max-price", "1_0"], "--max-price = '1_0' is not a number; allowed: "
     "above zero and at most 1e+06, in plain digits; closest: 10"),
]

CLASSES = {"numbers": NUMBERS, "malformed": MALFORMED, "ignored": IGNORED_SETTINGS, "case": CASE,
           "terminal": TERMINAL, "refresh": REFRESH, "live": LIVE, "review": REVIEW,
           "filters": FILTERS}
ROWS = [pytest.param(files, argv, expected, id=f"{cls}:{name}")
        for cls, rows in CLASSES.items() for name, files, argv, expected in rows]


def test_table_is_big_and_ids_unique():
    assert len(ROWS) >= 60
    assert len({p.id for p in ROWS}) == len(ROWS)


def _make(tmp: Path, files: dict[str, FileSpec]) -> None:
    for name, content in files.items():
        path = tmp / name
        if content is DIR:
            path.mkdir()
        elif content is UNREADABLE:
            path.write_text(TP + "g5.xlarge,1,,\n")
            path.chmod(0)
        else:
            path.write_bytes(content.encode() if isinstance(content, str) else content)


def _env() -> dict[str, str]:
    # No AWS credentials, no metadata service, no network endpoint: refresh must fail at once.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_ENDPOINT_URL="http://127.0.0.1:9", PYTHONPATH=str(ROOT))
    return env


def selector(*argv: str) -> subprocess.CompletedProcess:
    """The real CLI, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "dl_selector", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=_env(), timeout=60, errors="backslashreplace")


@pytest.mark.parametrize("files,argv,expected", ROWS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, files, argv, expected):
    if UNREADABLE in files.values() and os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file")
    _make(tmp_path, files)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    p = selector(*(a.replace("{tmp}", str(tmp_path)) for a in argv))
    err = p.stderr
    assert p.returncode == 2, (p.returncode, err, p.stdout[:300])
    assert "Traceback" not in err, err
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert clean(err[:-1]) == err[:-1], f"raw control character in {err!r}"
    assert expected in err, err
    assert p.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "the CLI wrote a file"


# ---- property-style: the number parser ----------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999",
                                   float("nan"), float("inf"), -float("inf"), 10 ** 400, True, False, None, [],
                                   {}, "", " ", "1,5", "0x10", "1e", "--1", "\x1b[31m1", "1\n2"])
def test_finite_number_refuses_garbage_in_one_line(value):
    with pytest.raises(UserError) as e:
        finite_number(value, "x", 0, 100)
    msg = str(e.value)
    assert "\n" not in msg and clean(msg) == msg and msg.startswith("x")


def test_finite_number_range_property():
    rng = random.Random(7)
    for _ in range(2000):
        v = rng.choice([rng.uniform(-1e6, 1e6), rng.randint(-10 ** 6, 10 ** 6), 10 ** rng.uniform(-5, 30)])
        lo, hi = sorted(rng.sample(range(-100, 1000), 2))
        for value in (v, repr(v), str(v)):
            try:
                got = finite_number(value, "x", lo, hi)
            except UserError as e:
                assert not lo <= float(v) <= hi, (v, lo, hi)
                assert "closest:" in str(e) and "\n" not in str(e)
            else:
                assert math.isfinite(got) and lo <= got <= hi and got == float(v)


def test_finite_number_integer_and_above():
    assert finite_number("7", "--top", 1, 10, integer=True) == 7
    with pytest.raises(UserError, match="closest: 3"):
        finite_number("2.6", "--top", 1, 10, integer=True)
    with pytest.raises(UserError, match="must be above zero"):
        finite_number(0, "sps", 0, 10, above=True)
    assert finite_number("1e-9", "sps", 0, 10, above=True) == 1e-9


# ---- property-style: the file loaders -------------------------------------------------------

def _loaders(tmp: Path):
    from dl_selector.catalog import load_catalog
    from dl_selector.prices import load_prices
    from dl_selector.profiles import load_profiles
    from dl_selector.throughput import load_measurements
    known = load_catalog().types
    return [("t.csv", lambda p: load_measurements(p, known)), ("t.json", lambda p: load_measurements(p, known)),
            ("p.csv", load_prices), ("p.toml", load_profiles), ("p.yaml", load_profiles), ("c.json", load_catalog)]


GOOD = {"t.csv": tp("g5.xlarge,410,0.9,", "p4d.24xlarge,9120,18.5,6.1"),
        "t.json": json.dumps([{"instance_type": "g5.xlarge", "samples_per_second": 410, "price_per_hour": 1.5}]),
        "p.csv": prices("g5.xlarge,us-east-1,1.006,0.45", "p4d.24xlarge,us-west-2,21.96,"),
        "p.toml": toml('description = "d"\nmin_accelerator_memory_gib = 24'),
        "p.yaml": "profiles:\n  team:\n    extends: training\n    nodes: 1\n",
        "c.json": catalog_with(lambda d: None)}


def _only_user_errors(load, path: Path) -> None:
    try:
        load(str(path))
    except UserError as e:
        assert "\n" not in str(e), str(e)


def test_loaders_survive_random_bytes(tmp_path):
    rng = random.Random(11)
    for name, load in _loaders(tmp_path):
        for i in range(40):
            path = tmp_path / f"{i}-{name}"
            # random.Random(seed).randbytes, not os.urandom: a failure must be reproducible.
            path.write_bytes(rng.randbytes(rng.randint(0, 400)))
            _only_user_errors(load, path)


def test_loaders_survive_every_truncation(tmp_path):
    for name, load in _loaders(tmp_path):
        good = GOOD[name].encode()
        load(str(_write(tmp_path / f"whole-{name}", good)))  # the untruncated file is valid
        cuts = range(len(good)) if len(good) < 400 else sorted(random.Random(5).sample(range(len(good)), 60))
        for n in cuts:
            _only_user_errors(load, _write(tmp_path / f"{n}-{name}", good[:n]))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_control_characters_in_tables_are_escaped(tmp_path):
    f = _write(tmp_path / "p.toml", b'[profiles."evil\\u001b[31m"]\nextends = "training"\n'
                                    b'description = "beep\\u0007 and \\r overwrite"\n')
    p = selector("profiles", "--profiles", str(f))
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "\x07" not in p.stdout and "\r" not in p.stdout
    assert r"evil\x1b[31m" in p.stdout and r"beep\x07 and \r overwrite" in p.stdout
    p = selector("profiles", "--profiles", str(f), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)[-1]["name"] == "evil\x1b[31m"


def test_json_output_is_strict(tmp_path):
    f = _write(tmp_path / "t.csv", tp("g5.xlarge,1e12,0.0001,0.0001").encode())
    p = selector("recommend", "--profile", "training", "--throughput", str(f), "--json")
    assert p.returncode == 0, p.stderr
    json.loads(p.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))
