"""Bad job settings (code, image, setup, env, secrets, data): exit 2, one line that says what was
wrong and what to do instead, nothing synthesized."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import app
from constructs_lib import codescan
from tests.test_bad_context import _one_line_and_no_template

SM = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
PARAM = "arn:aws:ssm:us-east-1:123456789012:parameter/team/wandb"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1"

ROWS = [
    # ---- the code directory ------------------------------------------------------------------
    ({"code": "{tmp}/missing"}, "context code '{tmp}/missing': no such directory"),
    ({"code": "{tmp}/proj/train.py"}, "is a file: expected the directory of your training project"),
    ({"code": "{tmp}/empty"}, "has no files to ship (after the excludes .git/, __pycache__/, *.pyc, .venv/)"),
    ({"code": "{tmp}/only-ignored"}, "has no files to ship"),
    ({"code": "{tmp}/escapes"}, "secret.txt' is a link out of the directory (to '../outside/secret.txt'): copy the "
                                "file in, or list the link in .dlignore"),
    ({"code": "{tmp}/dirlink"}, "'data' is a link to a directory"),
    ({"code": "{tmp}/big"}, "over the limit for code shipped with each deploy (256 MiB, 20,000 files); largest: "
                            "weights/ 257 MiB. Keep data, checkpoints and environments out"),
    # ---- data_owner: the account that owns the data buckets (issue 35) -------------------------
    ({"data": "s3://team-data/x", "data_owner": "12345678901"}, "context data_owner='12345678901': an AWS account "
                                                                "id is 12 digits, e.g. data_owner=123456789012"),
    ({"data": "s3://team-data/x", "data_owner": "arn:aws:iam::123456789012:root"}, "an AWS account id is 12 digits"),
    ({"data_owner": "123456789012"}, "context data_owner names who owns the buckets of data=... staged onto the "
                                     "nodes: pass data=s3://... with it"),
    # ---- checkpoint_dir: the framework's own checkpoints, relative to the working directory ----
    ({"checkpoint_dir": "/scratch/outputs"}, "context checkpoint_dir=/scratch/outputs is absolute: use a relative "
                                             "path inside the working directory, e.g. outputs"),
    ({"checkpoint_dir": "../outputs"}, "context checkpoint_dir=../outputs leaves the working directory"),
    ({"checkpoint_dir": "a/../../b"}, "context checkpoint_dir=a/../../b leaves the working directory"),
    ({"checkpoint_dir": "./"}, "context checkpoint_dir=./ is the working directory itself (your code is there)"),
    ({"checkpoint_dir": "my outputs"}, "context checkpoint_dir=my outputs: each segment may hold letters, digits"),
    ({"checkpoint_dir": ".dl-set-aside"}, "(not .dl-, the runtime's)"),
    ({"code": "{tmp}/shipped-ckpt", "checkpoint_dir": "outputs/"}, "context checkpoint_dir=outputs/: your code ships "
     "2 file(s) there (outputs/checkpoint-10/model.safetensors, ...); the directory is the job's checkpoints on the "
     "nodes: add 'outputs/' to the code's .dlignore"),
    # ---- env -----------------------------------------------------------------------------------
    ({"env": "1X=2"}, "context env: '1X' is not a shell variable name"),
    ({"env": "MY-VAR=2"}, "context env: 'MY-VAR' is not a shell variable name"),
    ({"env": "MASTER_ADDR=10.0.0.1,RANK=3"}, "context env: MASTER_ADDR is set by dl-launcher for every run"),
    ({"env": "A=1,DL_CLUSTER=x"}, "DL_CLUSTER is set by dl-launcher for every run"),
    ({"env": "PYTHONPATH=/x"}, "PYTHONPATH is set by dl-launcher"),
    ({"env": "EPOCHS"}, "context env: 'EPOCHS' has no '=' (expected NAME=VALUE)"),
    ({"env": "A=1,A=2"}, "context env: A is given twice"),
    ({"env": "A=1 B=2"}, "context env: A='1 B=2' holds B= after a space: separate variables with commas (A=...,B=...)"),
    ({"env": "STEPS=2000 LR=0.05"}, "holds LR= after a space"),
    ({"env": "A=1,B"}, "context env: 'B' has no '=' (expected NAME=VALUE) (a comma inside a value is written \\,)"),
    ({"env": "A=1", "secrets": f"A={SM}"}, "context env and secrets both name A"),
    # ---- secrets -------------------------------------------------------------------------------
    ({"secrets": "HF_TOKEN=arn:aws:s3:::bucket/key"}, "not a Secrets Manager secret"),
    # a pasted secret value instead of its ARN is never echoed (see test_a_pasted_secret_value_is_never_echoed)
    ({"secrets": "HF_TOKEN=hf-token"}, "HF_TOKEN=<not an ARN, value hidden>: not a Secrets Manager secret"),
    ({"secrets": f"HF_TOKEN={SM.replace('us-east-1', 'eu-west-1')}"}, "it is in eu-west-1, the nodes run in us-east-1"),
    ({"secrets": f"HF_TOKEN={SM.replace('arn:aws:', 'arn:aws-cn:')}"}, "partition aws-cn, the nodes run in aws"),
    ({"secrets": "T=arn:aws:secretsmanager:us-east-1:123456789012:parameter/x"}, "a secretsmanager ARN names a parameter"),
    ({"secrets": f"RANK={SM}"}, "context secrets: RANK is set by dl-launcher"),
    ({"secrets_kms": "alias/mine", "secrets": f"T={SM}"}, "context secrets_kms: 'alias/mine' is not a KMS key ARN"),
    ({"secrets_kms": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
      "secrets": f"T={SM}"}, "is a key in eu-west-1, the nodes run in us-east-1"),
    ({"secrets_kms": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"},
     "secrets_kms names keys but secrets names no secret"),
    # ---- image ---------------------------------------------------------------------------------
    ({"image": "Not An Image"}, "context image='Not An Image': not an image reference"),
    ({"image": "https://registry/x:1"}, "not an image reference"),
    ({"image": "repo:tag:again"}, "not an image reference"),
    ({"image": ECR, "setup": "pip install x"}, "context image and setup together: a container starts fresh"),
    # ---- setup ---------------------------------------------------------------------------------
    ({"setup": "a", "setup_file": "{tmp}/setup.sh"}, "context setup and setup_file are both given"),
    ({"setup_file": "{tmp}/missing.sh"}, "context setup_file='{tmp}/missing.sh': no such file"),
    ({"setup_file": "{tmp}/empty.sh"}, "is empty: expected the script the nodes run"),
    ({"code": "{tmp}/proj", "coed": "x"}, "unknown context key 'coed'; closest: code"),
    # a key like none of ours is refused too: a safety setting must not vanish behind a typo
    ({"burn_in": "thorough"}, "unknown context key 'burn_in'; allowed: profile, "),
    ({"max_hourly": "10"}, "unknown context key 'max_hourly'"),
    # ---- data (issue 23) -------------------------------------------------------------------------
    ({"data": "/mnt/datasets/imagenet"}, "context data=/mnt/datasets/imagenet: not an s3:// URI"),
    ({"data": "https://my-data.s3.amazonaws.com/train"}, "not an s3:// URI (e.g. s3://my-datasets/imagenet/train)"),
    ({"data": "s3://My_Data/train"}, "bucket 'My_Data' is not a name S3 takes"),
    ({"data": "s3://My-Data/train"}, "did you mean s3://my-data/train/"),
    ({"data": "s3://ab/train"}, "bucket 'ab' is not a name S3 takes"),
    ({"data": "s3://192.168.0.1/train"}, "is not a name S3 takes"),
    ({"data": "s3://my-data/train/*.tar"}, "a wildcard in the prefix: name the prefix itself"),
    ({"data": "s3://my-data/train/../val"}, "'.' or '..' in the prefix"),
    ({"data": "s3://my-data/train,s3://my-data/train/part1"}, "s3://my-data/train/ and s3://my-data/train/part1/ overlap"),
    ({"data": " , "}, "context data is empty: name one or more s3:// prefixes"),
    ({"data": "s3://dl-dev-prototyping-checkpointsbucket6ba0c50d-1x2y3z4w/jobs/dev-prototyping"}, "that is this job's own checkpoint bucket"),
    ({"data": "s3://my-data/train", "data_mode": "lustre"}, "context data_mode=lustre: allowed stage, fsx"),
    ({"data": "s3://my-data/train", "data_mode": "FSX"}, "context data_mode=FSX: allowed stage, fsx; closest: fsx"),
    ({"data_mode": "fsx"}, "context data_mode=fsx needs data=s3://bucket/prefix"),
    ({"data": "s3://my-data/train", "fsx_gib": "2400"}, "context fsx_gib sizes an FSx file system: pass data_mode=fsx"),
    ({"data": "s3://my-data/train", "data_mode": "fsx", "fsx_gib": "3000"},
     "context fsx_gib=3000 GiB: FSx for Lustre (PERSISTENT_2) takes 1200, 2400 or a multiple of 2400 GiB; closest above: 4800"),
    ({"data": "s3://my-data/train", "data_mode": "fsx", "fsx_gib": "1.2TiB"}, "context fsx_gib=1.2TiB: a whole number"),
    ({"data": "s3://my-data/train", "data_mode": "fsx", "fsx_gib": "24000000000"},
     "context fsx_gib=24000000000 GiB: above 100800 GiB, FSx's default per-account quota"),
    ({"data": "s3://my-data/train", "data_mode": "fsx", "fsx_gib": "2_400"}, "context fsx_gib=2_400: a whole number"),
    ({"data": "s3://my-data/train", "data_mode": "fsx", "fsx_gib": "\u00b2"}, "has a character that is not plain ASCII"),
    ({"data": "s3://my-data/train", "data_mode": "fsx", "fsx_throughput": "200"},
     "context fsx_throughput=200: allowed 125, 250, 500, 1000 MB/s per TiB; closest: 250"),
    ({"data": ",".join(f"s3://my-data/part{i}" for i in range(9)), "data_mode": "fsx"},
     "context data names 9 prefixes; an FSx for Lustre file system links at most 8"),
]


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    (tmp_path / "empty").mkdir()
    ignored = tmp_path / "only-ignored"
    (ignored / "__pycache__").mkdir(parents=True)
    (ignored / "__pycache__" / "x.pyc").write_bytes(b"x")
    (ignored / ".git").mkdir()
    (ignored / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("s\n")
    esc = tmp_path / "escapes"
    esc.mkdir()
    (esc / "train.py").write_text("x\n")
    (esc / "secret.txt").symlink_to("../outside/secret.txt")
    dl = tmp_path / "dirlink"
    dl.mkdir()
    (dl / "train.py").write_text("x\n")
    (dl / "data").symlink_to(tmp_path / "outside")
    big = tmp_path / "big" / "weights"
    big.mkdir(parents=True)
    (big.parent / "train.py").write_text("x\n")
    with open(big / "model.bin", "wb") as f:  # sparse: the size counts, the disk does not
        f.truncate(codescan.MAX_BYTES + 1024 * 1024)
    shipped = tmp_path / "shipped-ckpt"
    (shipped / "outputs" / "checkpoint-10").mkdir(parents=True)
    (shipped / "train.py").write_text("x\n")
    (shipped / "outputs" / "checkpoint-10" / "model.safetensors").write_text("m\n")
    (shipped / "outputs" / "checkpoint-10" / "trainer_state.json").write_text("{}\n")
    (tmp_path / "setup.sh").write_text("pip install x\n")
    (tmp_path / "empty.sh").write_text("\n")
    return tmp_path


@pytest.mark.parametrize("ctx,expected", ROWS, ids=[f"{i:02d}-{next(iter(c))}" for i, (c, _) in enumerate(ROWS)])
def test_bad_job_input(ctx, expected, tmp, capsys):
    out = tmp / "cdk.out"
    filled = {k: v.replace("{tmp}", str(tmp)) for k, v in ctx.items()}
    code = app.main({"command": "python train.py", **filled}, outdir=str(out))
    _one_line_and_no_template(code, capsys.readouterr().err, out, expected.replace("{tmp}", str(tmp)))


def test_checkpoint_dir_needs_a_command_and_ignored_outputs_are_fine(tmp, capsys):
    out = tmp / "cdk.out"
    code = app.main({"checkpoint_dir": "outputs"}, outdir=str(out))
    _one_line_and_no_template(code, capsys.readouterr().err, out, "context checkpoint_dir names where a command's "
                              "framework saves: pass command= with it")
    (tmp / "shipped-ckpt" / ".dlignore").write_text("outputs/\n")
    ctx = {"code": str(tmp / "shipped-ckpt"), "checkpoint_dir": "outputs", "command": "dl-torchrun train.py",
           "approve_hourly": "1000"}
    assert app.main(ctx, outdir=str(out)) == 0


@pytest.mark.parametrize("value", ["hf_ZyXwVuTsRqPoNmLkJi", "HF_TOKEN=hf_ZyXwVuTsRqPoNmLkJi",
                                   "HF_TOKEN=hf_ZyXwVuTsRqPoNmLkJi\x07"])
def test_a_pasted_secret_value_is_never_echoed(value, tmp, capsys):
    out = tmp / "cdk.out"
    code = app.main({"command": "python train.py", "secrets": value}, outdir=str(out))
    line = _one_line_and_no_template(code, capsys.readouterr().err, out, "context secrets")
    assert "ZyXwVu" not in line, line


def test_env_takes_spaces_after_commas_and_escaped_commas(tmp):
    from dl_stacks.job_settings import job_from_context
    js = job_from_context({"env": "STEPS=2000, LR=0.05 ,GPUS=0\\,1,ARGS=--lr=3 --bs=4"}, "us-east-1", None)
    assert js.env == (("STEPS", "2000"), ("LR", "0.05"), ("GPUS", "0,1"), ("ARGS", "--lr=3 --bs=4"))


def test_many_files_are_refused_too(tmp_path, capsys):
    proj = tmp_path / "many"
    proj.mkdir()
    for i in range(codescan.MAX_FILES + 1):
        (proj / f"f{i}.txt").write_bytes(b"")
    code = app.main({"command": "python train.py", "code": str(proj)}, outdir=str(tmp_path / "out"))
    line = _one_line_and_no_template(code, capsys.readouterr().err, tmp_path / "out", "in 20,001 files: over the limit")
    assert "largest: f" in line


def test_dlignore_patterns_in_gitignores_manner(tmp_path):
    root = tmp_path / "p"
    for rel in ("train.py", "data/a.bin", "sub/data/b.bin", "logs/x.log", "keep.log", "out/model.pt", "out/readme.md",
                "pkg/__pycache__/m.pyc", "pkg/m.py", ".venv/lib/x.py", "nested/.git/HEAD"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".dlignore").write_text("# comment\n\n/data/\n*.log\n!keep.log\nout/*.pt\n")
    shipped = {rel for rel, _ in codescan.scan(str(root)).files}
    assert shipped == {"train.py", "sub/data/b.bin", "keep.log", "out/readme.md", "pkg/m.py", ".dlignore"}
    os.chmod(root / ".dlignore", 0o000)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(codescan.ConfigurationError, match="cannot be read"):
            codescan.scan(str(root))
