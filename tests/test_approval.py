"""The price before the spend (issue 34 item 4): a stack whose worst case per hour is above the
threshold synthesizes only with -c approve_hourly at or above that figure; the docs' first deploy
asks nothing. The figure is held against the selector's catalog, not against dl_stacks/approval.py."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import app
from dl_selector.catalog import load_catalog
from dl_selector.recommend import recommend

ROOT = Path(__file__).resolve().parents[1]
BIG = {"profile": "multi-node-training", "job": "big"}


def _error(capsys, code: int, out: Path) -> str:
    err = capsys.readouterr().err
    assert code == 2 and not list(out.glob("*.template.json")) if out.exists() else code == 2
    (line,) = err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in err
    return line


def test_the_approval_refuses_and_accepts(tmp_path, capsys):
    pick = recommend("multi-node-training", spot=True).pick.instance_type  # the profile launches on spot
    on_demand = load_catalog().get(pick).price("us-east-1").on_demand
    # no approval: one line naming the exact key, nothing synthesized
    out = tmp_path / "none"
    line = _error(capsys, app.main(BIG, outdir=str(out)), out)
    assert f"2 x {pick}" in line and "above the $10.00/h that needs an approval" in line, line
    figure = float(re.search(r"add -c approve_hourly=([0-9.]+) to deploy it", line)[1])
    # the worst case on spot is every node at the max price, the on-demand price: the rest of the stack is cents
    assert 2 * on_demand <= figure < 2 * on_demand + 1, (figure, on_demand)
    assert f"${figure:,.2f}/h" in line
    # a cent below it: refused, with the figure again
    out = tmp_path / "below"
    line = _error(capsys, app.main({**BIG, "approve_hourly": f"{figure - 0.01:.2f}"}, outdir=str(out)), out)
    assert f"is below this stack's worst case ${figure:,.2f}/h" in line and f"-c approve_hourly={figure:.2f}" in line
    # the figure itself: synthesized, and the summary says what was approved
    out = tmp_path / "at"
    assert app.main({**BIG, "approve_hourly": f"{figure:.2f}"}, outdir=str(out)) == 0
    assert (out / "dl-big.template.json").exists()
    assert f"approval: worst case ${figure:,.2f}/h approved up to ${figure:,.2f}/h" in capsys.readouterr().err


def _first_deploy(text: str) -> list[str]:
    """The first `cdk deploy` command of a page, its -c pairs."""
    joined = text.replace("\\\n", " ")
    (first, *_) = [x for x in joined.splitlines() if x.strip().startswith("cdk deploy ")]
    args = shlex.split(first.split("#")[0])
    return [args[i + 1] for i, a in enumerate(args) if a == "-c"]


@pytest.mark.parametrize("page", ["README.md", "docs/real-account.md"])
def test_the_docs_first_deploy_is_a_cheap_stack_that_asks_nothing(page, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # code=examples/train_project is relative to the checkout, as cdk runs it
    ctx = dict(p.split("=", 1) for p in _first_deploy((ROOT / page).read_text()))
    assert int(ctx.get("nodes", "1")) >= 2 and ctx.get("command", "").startswith("dl-torchrun"), \
        "it proves the multi-node path: a gang launch and a rendezvous across nodes"
    assert app.main(ctx, outdir=str(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "approval: not needed (worst case at or under the $10.00/h threshold)" in err, err[-3000:]
    worst = float(re.search(r"; worst case \$([0-9.,]+)/h \(AWS list prices", err)[1].replace(",", ""))
    assert worst <= 10


def test_local_deploys_into_moto_are_not_asked_and_other_endpoints_are(tmp_path, capsys, monkeypatch):
    """conftest points AWS_ENDPOINT_URL at 127.0.0.1, as local_deploy.py points it at its moto_server."""
    ctx = {**BIG, "local": "true", "vpc_id": "vpc-0123456789abcdef0", "subnet_ids": "subnet-0123456789abcdef0",
           "availability_zone": "us-east-1a"}
    out = tmp_path / "moto"
    assert app.main(ctx, outdir=str(out)) == 0
    assert "approval: not needed (-c local=true into moto on this machine: nothing is billed)" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://ec2.us-east-1.amazonaws.com")
    out = tmp_path / "real"
    line = _error(capsys, app.main(ctx, outdir=str(out)), out)
    assert "needs an approval: add -c approve_hourly=" in line


def test_the_threshold_is_a_key(tmp_path, capsys):
    cheap = {"profile": "dev-prototyping", "job": "cheap"}
    out = tmp_path / "a"
    line = _error(capsys, app.main({**cheap, "approval_threshold": "0.1"}, outdir=str(out)), out)
    assert "above the $0.10/h that needs an approval" in line


@pytest.mark.parametrize("ctx,expected", [
    ({"approve_hourly": "lots"}, "context approve_hourly='lots': expected USD per hour, above 0 to 1,000,000"),
    ({"approve_hourly": "$290"}, "closest: 290"),
    ({"approve_hourly": "0"}, "context approve_hourly='0': allowed USD per hour, above 0 to 1,000,000"),
    ({"approve_hourly": "-5"}, "allowed USD per hour, above 0"),
    ({"approve_hourly": "1e9"}, "closest: 1e+06"),
    ({"approve_hourly": "nan"}, "expected USD per hour"),
    ({"approve_hourly": True}, "context approve_hourly=true (JSON true): expected USD per hour"),
    ({"approval_threshold": "-1"}, "context approval_threshold='-1': allowed USD per hour, 0 to 1,000,000"),
    ({"approve-hourly": "290"}, "unknown context key 'approve-hourly'; closest: approve_hourly"),
])
def test_bad_approval_values_are_one_line(ctx, expected, tmp_path, capsys):
    out = tmp_path / "cdk.out"
    line = _error(capsys, app.main(ctx, outdir=str(out)), out)
    assert expected in line, line
