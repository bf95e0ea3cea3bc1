"""A platform team's portfolio file and context that are wrong: one line naming the file, the key and
the closest match, exit 2 and no template, in-process and through the real CDK CLI."""
from __future__ import annotations

from pathlib import Path

import pytest

import app
from tests.cdk_checks import cdk_cli as cli


MALFORMED = [
    ("[products.multi-node-training]\nmax_node = 4\n", "unknown key 'max_node' in [products.multi-node-training]; "
                                                       "closest: max_nodes"),
    ("[products.multi-node-training]\nmax_nodes = 0\n", "max_nodes = 0: allowed 1 to 64; closest: 1"),
    ("[products.multi-node-training]\ninstance_types = [\"g4dn.xlarge\"]\n",
     "instance_types names g4dn.xlarge, which is not a candidate of profile multi-node-training"),
    ("[products.multi-node-training]\nmax_cluster_usd_per_hour = 1\n", "nothing can launch"),
    ("[products.multi-node-training]\nbudget_action = \"halt\"\n", "allowed notify, stop"),
    ("[portfolio]\nshare_with_accounts = [\"12345\"]\n", "portfolio.share_with_accounts has '12345': expected a "
                                                          "12-digit AWS account id"),
    ("[portfolio.tag_options]\nteam = []\n", "portfolio.tag_options.team is empty"),
    # Arabic-Indic digits: a regex \d took them, and the share failed only at deploy
    ("[portfolio]\nshare_with_accounts = [\"\u0661\u0661\u0661\u0661\u0662\u0662\u0662\u0662\u0663\u0663\u0663\u0663\"]\n",
     "expected a 12-digit AWS account id"),
    ("[portfolio]\nshare_with_organization_units = [\"r-ab12\"]\n", "expected an organizational unit id"),
    ("[portfolio]\nprincipals = [\"ml-engineers\"]\n", "expected an IAM role, group or user ARN"),
    ("[portfolio.tag_options]\ncost_center = [\"x\"]\n", "closest: cost-centre"),
    ("[portfolio]\n[product.x]\n", "unknown key 'product' in [the file's top level]; closest: products"),
    ("[products.nope]\n", "[products.nope] is not a profile of the portfolio"),
]

BAD_CONTEXT = [
    (["-c", "portfolio=Platform"], "context portfolio='Platform': use 1-40 lower-case letters"),
    (["-c", "portfolio=platform", "-c", "nodes=2"], "context nodes is not used with portfolio"),
    (["-c", "portfolio=platform", "-c", "product=multinode"], "closest: multi-node-training"),
    (["-c", "product=inference"], "context product belongs to a portfolio"),
]


def _in_process(tmp_path: Path, monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    """app.main, the entry `cdk synth` runs, with the same -c pairs: (exit status, stderr)."""
    monkeypatch.chdir(tmp_path)  # ProductStackHistory writes its snapshots under the working directory
    code = app.main(dict(a.split("=", 1) for a in args if a != "-c"), outdir=str(tmp_path / "out"))
    return code, capsys.readouterr().err


def _no_template(out: Path) -> bool:
    return not list(out.glob("*.template.json")) if out.exists() else True


# Every row in-process; the first of each list also through the real CDK CLI, which must print the
# very line app.main prints (one CLI run per list, not one per row: each is a node and a Python
# start, about 10 s on CI's machine).
@pytest.mark.parametrize("body,expected", MALFORMED)
def test_a_malformed_file_is_one_line_naming_file_and_key(tmp_path, monkeypatch, capsys, body, expected):
    f = tmp_path / "team.toml"
    f.write_text(body)
    code, err = _in_process(tmp_path, monkeypatch, capsys, ["-c", "portfolio=team", "-c", f"profiles_file={f}"])
    assert code == 2, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert str(f) in line and expected in line and "Traceback" not in err, err[-2000:]
    assert _no_template(tmp_path / "out")


@pytest.mark.parametrize("args,expected", BAD_CONTEXT)
def test_bad_portfolio_context_is_one_line(tmp_path, monkeypatch, capsys, args, expected):
    code, err = _in_process(tmp_path, monkeypatch, capsys, args)
    assert code == 2 and expected in err and "Traceback" not in err, err[-2000:]
    assert _no_template(tmp_path / "out")


def test_a_malformed_file_and_bad_context_through_the_cdk_cli_are_the_in_process_line(tmp_path, monkeypatch, capsys):
    body, expected = MALFORMED[0]
    f = tmp_path / "team.toml"
    f.write_text(body)
    for args, expected in ((["-c", "portfolio=team", "-c", f"profiles_file={f}"], expected), BAD_CONTEXT[0]):
        out = tmp_path / "cli-out"
        r = cli("synth", *args, "-o", str(out))
        assert r.returncode != 0, r.stderr[-2000:]  # app.py exits 2; the CDK CLI reports it as 1
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert expected in line and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert _no_template(out)
        code, err = _in_process(tmp_path, monkeypatch, capsys, args)
        assert code == 2 and [x for x in err.splitlines() if x.startswith("error:")] == [line], (err, line)


@pytest.mark.parametrize("make,expected", [
    (lambda d: (d / "afile").write_text("x") and str(d / "afile"), "is a file: expected the directory where each product"),
    (lambda d: str(d / "no" / "such" / "snaps"), "is not a directory; create it"),
])
def test_a_snapshots_path_that_cannot_be_a_directory_is_one_line(tmp_path, capsys, make, expected):

    code = app.main({"portfolio": "platform", "snapshots": make(tmp_path)}, outdir=str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.template.json"))
