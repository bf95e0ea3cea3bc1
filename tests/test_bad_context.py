"""Every bad context value: exit 2, exactly one line on stderr (what was wrong, what is allowed,
the closest valid value), no traceback, no template. Most rows run in-process through app.main,
the entry `cdk synth` runs; a few run through the real CDK CLI to show that path is the same."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import app
from dl_stacks.settings import HEREDOC, from_context
from tests.cdk_checks import cdk_cli as cli
from tests.constructs.userdata_text import user_data_text

ROOT = Path(__file__).resolve().parents[1]
CR = "cr-0123456789abcdef0"
VPC, SUBNET = "vpc-0123456789abcdef0", "subnet-0123456789abcdef0"
OWN_SUBNETS = {"vpc_id": VPC, "subnet_ids": SUBNET}

# (class, context, what the one line must say). "{tmp}" in a value is the test's file folder
# (see files()). Every row is a distinct bad input.
ROWS = [
    # ---- on_end: what a finished or failed job's cluster does ------------------------------------
    ("text", {"on_end": "kep"}, "context on_end='kep': allowed stop, keep; closest: keep"),
    ("text", {"on_end": "terminate"}, "context on_end='terminate': allowed stop, keep"),
    ("case", {"on_end": "STOP"}, "context on_end='STOP': names are case-sensitive and lower-case; closest: stop"),
    ("json type", {"on_end": True}, "context on_end=true (JSON true): expected a string; e.g. on_end=keep"),
    ("text", {"on_end": ""}, "context on_end is empty: give a value or leave the key out for its default"),
    ("key", {"on-end": "keep"}, "unknown context key 'on-end'; closest: on_end"),
    # a key like none of ours is refused too, never synthesized as if not given
    ("key", {"max_hourly": "10"}, "unknown context key 'max_hourly'"),
    ("key", {"wandb_project": "x"}, "unknown context key 'wandb_project'"),
    # ---- memory_tier_gb: the job's state, against /dev/shm of every type the cluster may launch ----
    ("number", {"memory_tier_gb": "abc"}, "context memory_tier_gb='abc': expected GB of the whole job's model"),
    ("number", {"memory_tier_gb": "0"}, "above 0 and at most 1,000,000; e.g. memory_tier_gb=112"),
    ("number", {"memory_tier_gb": "nan"}, "context memory_tier_gb='nan': expected GB"),
    ("json type", {"memory_tier_gb": [112]}, "context memory_tier_gb=[112] (a JSON list): expected GB of the whole"),
    ("cluster", {"profile": "multi-node-training", "nodes": "1", "memory_tier_gb": "112"},
     "the memory tier keeps each node's state on another node, and this cluster has 1; use -c nodes=2 or more"),
    # p5en.48xlarge (the profile's spot pick): 2,048 GiB of RAM, half of it /dev/shm (1,100 GB);
    # 4 x 2,500 GB does not fit
    ("cluster", {"profile": "multi-node-training", "nodes": "2", "memory_tier_gb": "5000"},
     "a p5en.48xlarge node needs 10,000 GB of /dev/shm for the memory tier (4 x its 2,500 GB share: two "
     "snapshots, its own and its buddy's) and has 1,100 GB (half its 2,048 GiB of RAM); use -c nodes=19 or more"),
    # ---- budget (USD a month) and interactive nodes ------------------------------------------------
    ("number", {"budget": "0"}, "context budget=0: allowed 1 to 1000000; closest: 1"),
    ("number", {"budget": "1_000"}, "context budget='1_000': expected a whole number from 1 to 1000000"),
    ("number", {"budget": "100.5"}, "context budget='100.5': expected a whole number from 1 to 1000000; closest: 101"),
    ("number", {"budget": "100 USD"}, "context budget='100 USD': expected a whole number from 1 to 1000000"),
    ("json type", {"budget": True}, "context budget=true (JSON true): expected a whole number of USD per month"),
    ("text", {"interactive": "yes please"}, "context interactive='yes please': expected true or false"),
    ("json type", {"interactive": 1}, "context interactive=1 (a JSON number): expected true or false"),
    ("number", {"interactive": "true", "idle_warning": "99999"}, "context idle_warning=99999: allowed 0 to 240; closest: 240"),
    # ---- numbers: non-finite, out of range, not plain decimals ----------------------------------
    ("number", {"max_price": "nan"}, "context max_price='nan': not a number; expected USD per hour per node"),
    ("number", {"max_price": "inf"}, "context max_price='inf': not a finite number;"),
    ("number", {"max_price": "-inf"}, "context max_price='-inf': must be above zero"),
    ("number", {"max_price": "1e999"}, "context max_price='1e999': not a finite number; expected USD per hour per node, above 0 and at most 1000; closest: 1000"),
    ("number", {"max_price": "0"}, "context max_price='0': must be above zero (USD per hour per node, above 0 and at most 1000); closest: 0.01"),
    ("number", {"max_price": "-3"}, "must be above zero"),
    ("number", {"max_price": "12,5"}, "context max_price='12,5': expected USD per hour per node, above 0 and at most 1000 (a plain decimal number); closest: 12.5"),
    ("number", {"max_price": float("nan")}, "context max_price=NaN: not a number"),
    ("number", {"max_price": float("inf")}, "context max_price=Infinity: not a finite number"),
    ("number", {"max_price": 5000}, "context max_price=5000: above any price on record; expected USD per hour per node, above 0 and at most 1000; closest: 1000"),
    ("number", {"max_price": "1_000"}, "context max_price='1_000': expected USD per hour per node"),
    ("number", {"max_price": "\uff11\uff12.5"}, "(a plain decimal number); closest: 12.5"),
    ("number", {"max_price": "$12"}, "context max_price='$12': expected USD per hour per node"),
    # a spot ceiling under every quote on record: a cluster that would wait for ever, never launching
    ("number", {"profile": "multi-node-training", "instance_type": "p6-b200.48xlarge", "max_price": "0.004"},
     "max_price $0.004/h is under half of every spot price on record for p6-b200.48xlarge in us-east-1 (the lowest, in any AZ:"),
    # a type with no spot quote on record: AWS's own bound (at most 90% off on-demand)
    ("number", {"profile": "multi-node-training", "instance_type": "p6-b300.48xlarge", "max_price": "0.004"},
     "max_price $0.004/h is under a tenth of p6-b300.48xlarge's on-demand price"),
    ("number", {"nodes": "0"}, "context nodes=0: allowed 1 to 64; closest: 1"),
    ("number", {"nodes": "-1"}, "context nodes=-1: allowed 1 to 64; closest: 1"),
    ("number", {"nodes": "1.5"}, "context nodes='1.5': expected a whole number from 1 to 64; closest: 2"),
    ("number", {"nodes": "1e3"}, "context nodes='1e3' (1000): allowed 1 to 64; closest: 64"),
    ("number", {"nodes": "two"}, "context nodes='two': expected a whole number from 1 to 64"),
    ("number", {"nodes": 1.5}, "context nodes=1.5: expected a whole number from 1 to 64; closest: 2"),
    ("number", {"nodes": "nan"}, "context nodes='nan': not a finite number; expected a whole number from 1 to 64"),
    ("number", {"nodes": "\uff12"}, "context nodes='\\uff12': expected a whole number from 1 to 64; closest: 2"),
    ("number", {"nodes": 65}, "context nodes=65: allowed 1 to 64; closest: 64"),
    # ---- JSON types cdk.json can carry where a string (or number, or boolean) is expected ------
    ("json type", {"subnet_ids": [SUBNET, "subnet-0123456789abcdef1"], "vpc_id": VPC, "availability_zone": "us-east-1a"},
     f"context subnet_ids=[\"{SUBNET}\", \"subnet-0123456789abcdef1\"] (a JSON list): expected a string; closest: "
     f"{SUBNET},subnet-0123456789abcdef1"),
    ("json type", {"region": ["us-east-1"]}, "context region=[\"us-east-1\"] (a JSON list): expected a string; closest: us-east-1"),
    ("json type", {"profile": {"name": "inference"}}, "(a JSON object): expected a string; e.g. profile=multi-node-training"),
    ("json type", {"max_price": None}, "context max_price=null (JSON null): expected USD per hour per node, above 0 and at most 1000; leave the key out for its default"),
    ("json type", {"instance_type": True}, "context instance_type=true (JSON true): expected a string"),
    ("json type", {"nodes": True}, "context nodes=true (JSON true): expected a whole number from 1 to 64"),
    ("json type", {"spot": 1}, "context spot=1 (a JSON number): expected true or false"),
    ("json type", {"job": 5}, "context job=5 (a JSON number): expected a string; closest: \"5\""),
    ("json type", {"command": ["python", "train.py"]}, "context command=[\"python\", \"train.py\"] (a JSON list): expected a string"),
    ("json type", {"local": None}, "context local=null (JSON null): expected true or false"),
    # ---- empty, very long, control characters, look-alikes -------------------------------------
    ("text", {"region": ""}, "context region is empty: give a value or leave the key out for its default; e.g. region=us-east-1"),
    ("text", {"profile": "   "}, "context profile is empty"),
    ("text", {"capacity_reservation": "", "market": "on-demand"}, "context capacity_reservation is empty"),
    ("text", {"command": ""}, "context command is empty: give a value or leave it out for nodes that wait for you"),
    ("text", {"job": "a" * 300}, "... (300 characters): at most 256 characters"),
    ("text", {"instance_type": "x" * 5000}, "(5000 characters): at most 256 characters"),
    ("text", {"profile": "multi-node-training\x1b[31m"}, "context profile='multi-node-training\\x1b[31m' has a control character ('\\x1b'): not allowed; closest: 'multi-node-training'"),
    ("text", {"region": "us-east-1\x00"}, "context region='us-east-1\\x00' has a control character ('\\x00'): not allowed; closest: 'us-east-1'"),
    ("text", {"job": "my-job\r"}, "context job='my-job\\r' has a control character ('\\r')"),
    ("text", {"profile": "multi\u2010node-training"}, "context profile='multi\\u2010node-training' has a character that is not plain ASCII (U+2010 HYPHEN): names are ASCII; closest: 'multi-node-training'"),
    ("text", {"instance_type": "\u04404d.24xlarge"}, "(U+0440 CYRILLIC SMALL LETTER ER): names are ASCII; closest: 'p4d.24xlarge'"),
    ("text", {"market": "sp\u043et"}, "closest: 'spot'"),
    ("text", {"region": "us\u2013east\u20131"}, "(U+2013 EN DASH): names are ASCII; closest: 'us-east-1'"),
    ("text", {"job": "my\u00a0job"}, "(U+00A0 NO-BREAK SPACE): names are ASCII; closest: 'my-job'"),
    # ---- the job command -------------------------------------------------------------------------
    ("command", {"command": f"python train.py # {HEREDOC}"}, f"context command contains {HEREDOC}, the marker that ends the job file"),
    ("command", {"command": "python train.py \\\n  --epochs 10"}, "context command has a line break: the CDK CLI cuts -c values at one, so a multi-line command goes in a file: -c command_file=PATH"),
    ("command", {"command": "python train.py", "command_file": "{tmp}/train.sh"}, "context command and command_file are both given: pass one"),
    ("command", {"command_file": "{tmp}/missing.sh"}, "/missing.sh': no such file (relative paths are from"),
    ("command", {"command_file": "{tmp}"}, "is a directory: expected a script file"),
    ("command", {"command_file": "{tmp}/binary.bin"}, "is not a text file (not UTF-8, or it has NUL bytes): expected a bash script"),
    ("command", {"command_file": "{tmp}/empty.sh"}, "/empty.sh' is empty: expected the command the nodes run"),
    ("command", {"command_file": "{tmp}/crlf.sh"}, "has Windows line ends (CRLF)"),
    ("command", {"command_file": "{tmp}/marker.sh"}, f"/marker.sh' contains {HEREDOC}, the marker that ends the job file"),
    ("command", {"command_file": "{tmp}/huge.sh"}, "is over 8192 bytes (the node's bootstrap takes the rest of EC2's 16384-byte user data)"),
    ("command", {"command": "python train.py " + "x" * 20000}, "context command is 20016 bytes: at most 8192 (the node's bootstrap takes the rest"),
    ("command", {"command": "python train.py " + "y" * 8177}, "context command is 8193 bytes: at most 8192"),
    ("command", {"command": "python train.py\x00"}, "context command='python train.py\\x00' has a control character ('\\x00'): not allowed"),
    ("command", {"command": "", "command_file": "{tmp}/train.sh"}, "context command and command_file are both given"),
    # ---- settings that were silently ignored, or contradict each other ---------------------------
    ("ignored", {"availability_zone": "us-east-1a"}, "context availability_zone=us-east-1a is used only with subnet_ids and vpc_id"),
    ("ignored", {"availability_zone": "us-east-1b", "vpc_id": VPC}, "a new VPC picks its AZ itself"),
    ("ignored", {"availability_zone": "us-west-2a", **OWN_SUBNETS}, "context availability_zone='us-west-2a' is not in region us-east-1; e.g. us-east-1a"),
    ("ignored", {"subnet_ids": SUBNET, "availability_zone": "us-east-1a"}, "context subnet_ids needs vpc_id"),
    ("ignored", {"spot": "true", "market": "on-demand"}, "context spot=true contradicts market=on-demand; pass market alone"),
    ("ignored", {"spot": True, "market": "capacity-block", "capacity_reservation": CR}, "context spot=true contradicts market=capacity-block"),
    ("ignored", {"spot": "true", "capacity_reservation": CR}, "with spot: reservations are on-demand capacity"),
    ("ignored", {"spot": "maybe"}, "context spot='maybe': expected true or false"),
    # ---- case: names are case-sensitive and lower-case, refused with the name meant --------------
    ("case", {"region": "US-EAST-1"}, "context region='US-EAST-1': names are case-sensitive and lower-case; closest: us-east-1"),
    ("case", {"instance_type": "P4D.24XLARGE"}, "context instance_type='P4D.24XLARGE': names are case-sensitive and lower-case; closest: p4d.24xlarge"),
    ("case", {"profile": "Multi-Node-Training"}, "context profile='Multi-Node-Training': names are case-sensitive and lower-case; closest: multi-node-training"),
    ("case", {"market": "SPOT"}, "context market='SPOT': names are case-sensitive and lower-case; closest: spot"),
    ("case", {"interchange": "Same-Count"}, "closest: same-count"),
    ("case", {"availability_zone": "US-EAST-1A", **OWN_SUBNETS}, "context availability_zone='US-EAST-1A': names are case-sensitive and lower-case; closest: us-east-1a"),
    ("case", {"vpc_id": "VPC-0123456789ABCDEF0"}, "expected an id like vpc-0123456789abcdef0; closest: vpc-0123456789abcdef0"),
    ("case", {"capacity_reservation": "CR-0123456789ABCDEF0", "market": "on-demand"}, f"closest: {CR}"),
    ("case", {"job": "My Job"}, "context job='My Job': use 1-40 lower-case letters, digits and dashes (it names the checkpoint prefix); closest: my-job"),
    # ---- unknown keys close to known ones --------------------------------------------------------
    ("key", {"instance-type": "p4d.24xlarge"}, "unknown context key 'instance-type'; closest: instance_type"),
    ("key", {"maxprice": "12"}, "unknown context key 'maxprice'; closest: max_price"),
    ("key", {"MAX_PRICE": "12"}, "unknown context key 'MAX_PRICE'; closest: max_price"),
    ("key", {"Instance-Type": "p4d.24xlarge"}, "unknown context key 'Instance-Type'; closest: instance_type"),
    ("key", {"command-file": "train.sh"}, "unknown context key 'command-file'; closest: command_file"),
    ("key", {"capacityreservation": CR}, "closest: capacity_reservation"),
    ("key", {"Nodes": "2"}, "unknown context key 'Nodes'; closest: nodes"),
]
assert len({json.dumps(ctx, sort_keys=True, default=str) for _, ctx, _ in ROWS}) == len(ROWS), "rows are distinct"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    d = tmp_path / "files"
    d.mkdir()
    (d / "train.sh").write_text("python train.py\n")
    (d / "binary.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    (d / "empty.sh").write_text("  \n\n")
    (d / "crlf.sh").write_bytes(b"cd /work\r\npython train.py\r\n")
    (d / "marker.sh").write_text(f"cat <<EOF\n{HEREDOC}\nEOF\n")
    (d / "huge.sh").write_text("# pad\n" * 3000)
    return d


def _fill(ctx: dict, tmp: Path) -> dict:
    return {k: v.replace("{tmp}", str(tmp)) if isinstance(v, str) else v for k, v in ctx.items()}


def _one_line_and_no_template(code: int, err: str, outdir: Path, expected: str) -> str:
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err[-2000:]
    (line,) = lines
    assert line.startswith("error: ") and "Traceback" not in err
    assert expected in line, line
    assert all(c.isprintable() for c in line), "control characters are escaped, never echoed raw"
    assert not list(outdir.glob("*.template.json")) if outdir.exists() else True
    return line


@pytest.mark.parametrize("kind,ctx,expected", ROWS, ids=[f"{i:02d}-{r[0]}" for i, r in enumerate(ROWS)])
def test_bad_context_in_process(kind, ctx, expected, files, tmp_path, capsys):
    out = tmp_path / "cdk.out"
    code = app.main(_fill(ctx, files), outdir=str(out))
    captured = capsys.readouterr()
    _one_line_and_no_template(code, captured.err, out, expected)


def test_at_least_fifty_rows_in_every_class():
    kinds = [k for k, _, _ in ROWS]
    assert len(ROWS) >= 50
    assert {"number", "json type", "text", "command", "ignored", "case", "key"} <= set(kinds)


def test_heredoc_marker_is_the_user_datas():
    from constructs_lib.userdata import HEREDOC as USER_DATA_HEREDOC
    assert HEREDOC == USER_DATA_HEREDOC


def test_one_line_escapes_whatever_a_message_holds():
    assert app.one_line("a\nb\x1bc\u2028d") == "a\\nb\\x1bc\\u2028d"
    assert app.one_line("x" * 5000).endswith("... (5000 characters)")


# ---- the command is the deployer's code: accepted and written as given ----------------------------
COMMAND = 'python train.py --lr $LR "quoted" `x` \\ back'
SCRIPT = ('#!/bin/bash\nset -euo pipefail\nexport LR="${LR:-0.1}"\n'
          'for f in "$@"; do echo "$f" | sed \'s/\\\\/\\//g\'; done\n'
          'dl-torchrun train.py \\\n  --lr "$LR" --tag `hostname` --note \'single quoted $NOT\'\n')


@pytest.mark.parametrize("value", [COMMAND, "python -c 'import os; print(os.environ[\"RANK\"])'", "echo caf\u00e9 \t ok"])
def test_shell_commands_pass_settings_as_written(value):
    assert from_context({"command": value}).command == value


def _user_data(out: Path, stack: str) -> list[str]:
    """Each launch template's user data (the pick and each alternate)."""
    template = json.loads((out / f"{stack}.template.json").read_text())
    lts = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert lts
    return [user_data_text(lt["Properties"]["LaunchTemplateData"]) for lt in lts]


def _definition(out: Path, stack: str) -> dict:
    """The job definition the nodes fetch: the stack's one JSON file asset, as the CLI publishes it."""
    manifest = json.loads((out / f"{stack}.assets.json").read_text())
    (path,) = [a["source"]["path"] for a in manifest["files"].values()
               if a["source"]["packaging"] == "file" and a["source"]["path"].endswith(".json")
               and not a["source"]["path"].endswith(".template.json")]
    return json.loads((out / path).read_text())


def test_command_with_shell_syntax_reaches_the_nodes_verbatim(tmp_path, capsys):
    out = tmp_path / "cdk.out"
    assert app.main({"command": COMMAND, "job": "verbatim"}, outdir=str(out)) == 0
    assert _definition(out, "dl-verbatim")["command"] == COMMAND
    for ud in _user_data(out, "dl-verbatim"):
        assert COMMAND not in ud, "the command ships in the job definition, not in the user data"


def test_command_file_with_a_multi_line_script_reaches_the_nodes_verbatim(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    out = tmp_path / "cdk.out"
    assert app.main({"command_file": str(script), "job": "script"}, outdir=str(out)) == 0
    assert _definition(out, "dl-script")["command"] == SCRIPT


# ---- the real CDK CLI: the same one line, exit status non-zero, no template ----------------------
CLI_ROWS = [
    ({"max_price": "nan"}, "context max_price='nan': not a number"),
    ({"nodes": "1e3"}, "context nodes='1e3' (1000): allowed 1 to 64; closest: 64"),
    ({"region": "US-EAST-1"}, "closest: us-east-1"),
    ({"profile": "multi\x1bnode-training"}, "context profile='multi\\x1bnode-training' has a control character"),
    ({"command_file": "no/such/train.sh"}, "context command_file='no/such/train.sh': no such file"),
]


@pytest.mark.parametrize("ctx,expected", CLI_ROWS, ids=[next(iter(c)) for c, _ in CLI_ROWS])
def test_bad_context_through_the_cdk_cli(ctx, expected, tmp_path, capsys):
    out = tmp_path / "cdk.out"
    args = [a for k, v in ctx.items() for a in ("-c", f"{k}={v}")]
    r = cli("synth", *args, "-o", str(out))
    assert r.returncode != 0 and "Subprocess exited with error 2" in r.stderr, r.stderr[-2000:]
    app_lines = [x for x in r.stderr.splitlines() if "Subprocess exited with error 2" not in x]
    assert len(app_lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert expected in app_lines[0]
    assert not list(out.glob("*.template.json")) if out.exists() else True
    # ... and it is the very line the in-process entry prints
    assert app.main(ctx, outdir=str(tmp_path / "in-process")) == 2
    assert capsys.readouterr().err.splitlines() == app_lines


def test_a_command_at_the_settings_limit_synthesizes_a_multi_node_stack(tmp_path, capsys):
    """The budget in settings is honest: the largest command it accepts still synthesizes."""
    from dl_stacks.settings import COMMAND_LIMIT
    command = "python train.py " + "x" * (COMMAND_LIMIT - 16)
    out = tmp_path / "cdk.out"
    assert app.main({"profile": "multi-node-training", "command": command, "approve_hourly": "1000"},
                    outdir=str(out)) == 0
    assert _definition(out, "dl-multi-node-training")["command"] == command


def test_a_constructs_validation_error_is_one_line():
    """What only synth finds (CDK's validation, raised through jsii) prints as its first error."""
    message = ("ValidationFailedWithErrors: Validation failed with the following errors:\n"
               "  [dl-x/Cluster/Node/Bootstrap] user data would be up to 22640 bytes\n"
               "  [dl-x/Other] second\n\n    at Function.validate (/x.js:1:2)")
    assert app._validation_error(message) == "user data would be up to 22640 bytes (dl-x/Cluster/Node/Bootstrap) (and 1 more)"
    assert app._validation_error("RuntimeError: something else") is None


def test_the_summary_states_the_memory_tiers_host_memory_per_node():
    from dl_stacks.selection import select
    from dl_stacks.training_stack import summary

    s = from_context({"profile": "multi-node-training", "nodes": "4", "memory_tier_gb": "1000", "region": "us-east-1"})
    line = next(x for x in summary(s, select(s)).splitlines() if "memory tier" in x)
    # p5en.48xlarge (the profile's spot pick): 2,048 GiB of RAM, /dev/shm half of it
    assert line == ("  memory tier: 1,000 GB of state over 4 nodes: 1,000 GB of /dev/shm per node (4 x its 250 GB "
                    "share) of 1,100 GB, and 250 GB staging in the training processes"), line
