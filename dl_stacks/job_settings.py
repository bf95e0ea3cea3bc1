"""The job's context keys beyond `command`: what the nodes run it with.

- `code`: a directory shipped to every node (constructs_lib.codescan says what is left out and
  what is refused); the command runs in it.
- `image`: run the command in this container image instead of on the host.
- `setup` / `setup_file`: bash run once per boot per code digest before the first generation
  (`setup_file` for several lines, as `command_file`); not with `image`.
- `env`: KEY=VALUE,KEY=VALUE (spaces after a comma are fine; a literal comma in a value as `\\,`);
  names are shell identifiers and never the runtime's own (MASTER_ADDR, RANK, DL_...). A value
  that holds " NAME=" is refused as two variables missing their comma.
- `secrets`: NAME=ARN,... of Secrets Manager secrets or SSM (SecureString) parameters in the
  deployment's region, read on the node at each run.
- `secrets_kms`: KMS key ARNs that encrypt those secrets, comma-separated.
- `data`: s3://bucket/prefix[,s3://...]: datasets staged onto every node's scratch RAID before the
  first generation (constructs_lib/runtime/staging.py); the node role may read exactly those.
- `data_owner`: the 12-digit account that owns the `data` buckets (the stack's own by default):
  the node role reads them only there (s3:ResourceAccount), so a look-alike bucket of another
  account is never read.
- `checkpoint_dir`: where the command's framework writes its own checkpoints, relative to the
  working directory (`outputs` for an HF output_dir, `checkpoints` for a Lightning dirpath): the
  node uploads what the framework completes there and restores the cluster's step there before
  each generation (constructs_lib/runtime/framework_checkpoints.py). Needs `command`.
- `restart`: `torchrun` (the default) or `in-process`: the supervisor runs the command once per
  rank itself (constructs_lib/runtime/ranks.py) and a node that survives a peer's death keeps its
  ranks' processes (Checkpointer.run_generations); the command is then the per-rank program
  (`python train.py`, not `dl-torchrun train.py`). Not with `image` or `checkpoint_dir`.
- `data_mode`: `stage` (the default) or `fsx`: an FSx for Lustre file system linked to the same
  prefixes, mounted at the same path (constructs_lib/fsx.py); `fsx_gib` (1200, 2400 or a multiple
  of 2400) and `fsx_throughput` (125, 250, 500 or 1000 MB/s per TiB) size it.

Every mistake is one line (UserError); several mistakes in one `env` or `secrets` value are
listed in that one line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from constructs_lib.codescan import scan
from constructs_lib.job_rules import (KMS_ARN, data_overlap, data_problem, env_problem, image_problem, secret_problem,
                                     shipped_overlap)
from constructs_lib.runtime.framework_checkpoints import checkpoint_dir_problem, normalized
from constructs_lib.runtime.staging import data_source
from dl_selector.errors import UserError

KEYS = ("code", "image", "setup", "setup_file", "env", "secrets", "secrets_kms", "data", "data_mode", "fsx_gib",
        "fsx_throughput", "checkpoint_dir", "data_owner", "restart")
DATA_MODES = ("stage", "fsx")
PATH_KEYS = ("code", "setup_file")
LONG_KEYS = ("env", "secrets", "secrets_kms", "setup")  # may be long and hold any printable text (env, setup)
EXAMPLES = {"code": "examples/train_project", "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1",
            "setup": "pip install -r requirements.txt", "setup_file": "setup.sh", "env": "EPOCHS=10,LR=3e-4",
            "secrets": "HF_TOKEN=arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf",
            "secrets_kms": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "data": "s3://my-datasets/imagenet/train", "data_mode": "fsx", "fsx_gib": "2400", "fsx_throughput": "250",
            "checkpoint_dir": "outputs", "data_owner": "123456789012", "restart": "in-process"}
SETUP_LIMIT = 64 * 1024  # the setup text ships in the job definition (an S3 asset), not in user data
VALUE_LIMIT = 4096       # one env value
PLAIN_INT = re.compile(r"[0-9]+", re.ASCII)
_SPLIT = re.compile(r"(?<!\\),")
# " NAME=" inside a value: two variables with a space where the comma belongs ("A=1 B=2").
_GLUED = re.compile(r"\s([A-Za-z_][A-Za-z0-9_]*)=")


@dataclass(frozen=True)
class JobSettings:
    code: Optional[str] = None
    image: Optional[str] = None
    setup: Optional[str] = None
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()
    secrets_kms: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    data_mode: str = "stage"
    fsx_gib: int = 1200
    fsx_throughput: int = 125
    checkpoint_dir: Optional[str] = None
    data_owner: Optional[str] = None
    restart: str = "torchrun"

    @property
    def any(self) -> bool:
        return bool(self.code or self.image or self.setup or self.env or self.secrets or self.data)


def _pairs(key: str, text: str, split: Callable[[str], list[str]]) -> list[tuple[str, str]]:
    out, problems = [], []
    for item in split(text):
        item = item.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        if not eq:
            hint = " (a comma inside a value is written \\,)" if key == "env" and out else ""
            if key == "secrets":  # a token is often identifier-like (hf_..., AKIA...): never shown
                problems.append("an item has no '=' (expected NAME=ARN; not shown, in case it is a secret's value)")
                continue
            problems.append(f"{item!r} has no '=' (expected NAME=VALUE){hint}")
            continue
        glued = _GLUED.search(value) if key == "env" else None
        if glued:
            problems.append(f"{name.strip()}={value.strip()!r} holds {glued[1]}= after a space: separate variables "
                            f"with commas ({name.strip()}=...,{glued[1]}=...)")
            continue
        out.append((name.strip(), value.replace("\\,", ",") if key == "env" else value.strip()))
    seen: set[str] = set()
    for name, _ in out:
        if name in seen:
            problems.append(f"{name} is given twice")
        seen.add(name)
    if problems:
        raise UserError(f"context {key}: " + "; ".join(problems) + f"; e.g. {key}={EXAMPLES[key]}")
    return out


def _names(key: str, pairs: list[tuple[str, str]]) -> None:
    problems = [p for p in (env_problem(n) for n, _ in pairs) if p]
    if problems:
        raise UserError(f"context {key}: " + "; ".join(problems))


def _setup(ctx: Mapping[str, Any], read_script: Callable[[str, str, int], str]) -> Optional[str]:
    if "setup" in ctx and "setup_file" in ctx:
        raise UserError("context setup and setup_file are both given: pass one (setup_file for several lines)")
    if "setup_file" in ctx:
        return read_script("setup_file", ctx["setup_file"], SETUP_LIMIT)
    if "setup" in ctx:
        text = ctx["setup"].strip()
        if "\n" in text or "\r" in text:
            raise UserError("context setup has a line break: the CDK CLI cuts -c values at one, so a multi-line "
                            "setup goes in a file: -c setup_file=PATH")
        return text
    return None


def _data(ctx: Mapping[str, Any], job: str) -> tuple[str, ...]:
    uris = [u.strip() for u in ctx["data"].split(",") if u.strip()] if "data" in ctx else []
    if "data" in ctx and not uris:
        raise UserError(f"context data is empty: name one or more s3:// prefixes, e.g. data={EXAMPLES['data']}")
    for uri in uris:
        problem = data_problem(uri)
        if problem:
            raise UserError(f"context data={uri}: {problem}")
        bucket, prefix = data_source(uri)
        # The stack's own checkpoint bucket (CloudFormation names it dl-JOB-checkpoints...): its
        # nodes already write there, and staging it would mirror checkpoints into the data.
        if bucket.startswith(f"dl-{job}-checkpoints"):
            raise UserError(f"context data={uri}: that is this job's own checkpoint bucket; stage the dataset from "
                            "a bucket of its own (the checkpoints are restored to the nodes already)")
    overlap = data_overlap([data_source(u) for u in uris])
    if overlap:
        raise UserError(f"context data: {overlap}")
    return tuple(uris)


def _data_mode(ctx: Mapping[str, Any], data: tuple[str, ...]) -> tuple[str, int, int]:
    from difflib import get_close_matches

    from constructs_lib.fsx import MIN_GIB, associations_problem, capacity_problem, throughput_problem

    mode = ctx.get("data_mode", "stage").strip()
    if mode not in DATA_MODES:
        near = get_close_matches(mode.lower(), DATA_MODES, n=1)
        raise UserError(f"context data_mode={mode}: allowed {', '.join(DATA_MODES)}" + (f"; closest: {near[0]}" if near else ""))
    if mode == "fsx" and not data:
        raise UserError("context data_mode=fsx needs data=s3://bucket/prefix: the prefixes the file system links")
    fsx_keys = [k for k in ("fsx_gib", "fsx_throughput") if k in ctx]
    if fsx_keys and mode != "fsx":
        raise UserError(f"context {fsx_keys[0]} sizes an FSx file system: pass data_mode=fsx with it")
    too_many = associations_problem(len(data)) if mode == "fsx" else None
    if too_many:
        raise UserError(f"context {too_many}")

    def number(key: str, default: int) -> int:
        text = str(ctx.get(key, default)).strip()
        if not PLAIN_INT.fullmatch(text):  # not str.isdigit(): that takes '²' and other digits int() refuses
            raise UserError(f"context {key}={text}: a whole number, e.g. {key}={EXAMPLES[key]}")
        return int(text[:19])  # past any limit below either way; int() refuses over 4300 digits

    gib, throughput = number("fsx_gib", MIN_GIB), number("fsx_throughput", 125)
    problem = capacity_problem(gib)
    if problem:
        raise UserError(f"context fsx_gib={problem}")
    problem = throughput_problem(throughput)
    if problem:
        raise UserError(f"context fsx_throughput={throughput}: {problem}")
    return mode, gib, throughput


def job_from_context(ctx: Mapping[str, Any], region: str,
                     read_script: Callable[[str, str, int], str], job: str = "") -> JobSettings:
    """The job keys of `ctx`, each checked (types and text were checked by the caller)."""
    code, shipped = None, ()
    if "code" in ctx:
        # missing, a file, empty, links out, over the limit
        shipped = tuple(rel for rel, _ in scan(ctx["code"].strip(), what="context code").files)
        code = os.path.abspath(ctx["code"].strip())
    image = ctx["image"].strip() if "image" in ctx else None
    if image is not None and image_problem(image):
        raise UserError(f"context image={image!r}: {image_problem(image)}")
    setup = _setup(ctx, read_script)
    if image and setup:
        raise UserError("context image and setup together: a container starts fresh for every run, so setup would "
                        "not last; build what setup does into the image (code may go with image: it is mounted)")
    env = _pairs("env", ctx["env"], _SPLIT.split) if "env" in ctx else []
    _names("env", env)
    for name, value in env:
        if len(value) > VALUE_LIMIT:
            raise UserError(f"context env {name}: value is {len(value)} characters, at most {VALUE_LIMIT}; "
                            "put long settings in a file in your code")
    secrets = _pairs("secrets", ctx["secrets"], lambda t: t.split(",")) if "secrets" in ctx else []
    _names("secrets", secrets)
    # The value is shown only when it is an ARN: a pasted secret value must not reach a terminal or a CI log.
    problems = [f"{n}={a if a.startswith('arn:') else '<not an ARN, value hidden>'}: {p}"
                for n, a in secrets for p in [secret_problem(a, region)] if p]
    if problems:
        raise UserError("context secrets: " + "; ".join(problems))
    both = sorted({n for n, _ in env} & {n for n, _ in secrets})
    if both:
        raise UserError(f"context env and secrets both name {', '.join(both)}: name each variable once")
    kms = tuple(k.strip() for k in ctx.get("secrets_kms", "").split(",") if k.strip())
    bad = [k for k in kms if not KMS_ARN.match(k)]
    if bad:
        raise UserError(f"context secrets_kms: {bad[0]!r} is not a KMS key ARN; e.g. secrets_kms={EXAMPLES['secrets_kms']}")
    foreign = [k for k in kms if k.split(":")[3] != region]
    if foreign:
        raise UserError(f"context secrets_kms: {foreign[0]} is a key in {foreign[0].split(':')[3]}, the nodes run in "
                        f"{region}; name the key that encrypts the secrets in {region}")
    if kms and not secrets:
        raise UserError("context secrets_kms names keys but secrets names no secret: pass secrets=NAME=ARN with it")
    data = _data(ctx, job)
    mode, gib, throughput = _data_mode(ctx, data)
    return JobSettings(code=code, image=image, setup=setup, env=tuple(env), secrets=tuple(secrets), secrets_kms=kms,
                       data=data, data_mode=mode, fsx_gib=gib, fsx_throughput=throughput,
                       checkpoint_dir=_checkpoint_dir(ctx, shipped), data_owner=_data_owner(ctx, data, mode),
                       restart=_restart(ctx))


def _restart(ctx: Mapping[str, Any]) -> str:
    """-c restart=: who restarts the ranks after a peer's death (see the module's text)."""
    from difflib import get_close_matches

    from constructs_lib.runtime.contract import RESTARTS

    value = ctx.get("restart", RESTARTS[0])
    value = value.strip() if isinstance(value, str) else value
    if value not in RESTARTS:
        near = get_close_matches(str(value).lower(), RESTARTS, n=1, cutoff=0.3)
        raise UserError(f"context restart={value!r}: allowed {', '.join(RESTARTS)}; closest: {(near or RESTARTS[1:])[0]}")
    if value != RESTARTS[0]:
        clash = next((k for k in ("image", "checkpoint_dir") if k in ctx), None)
        if clash:
            raise UserError(f"context restart={value} runs the ranks in the supervisor's processes, which {clash}= "
                            f"does not allow ({'a container' if clash == 'image' else 'a framework that restarts itself'}); "
                            f"drop one, or restart=torchrun")
        if "command" not in ctx and "command_file" not in ctx:
            raise UserError(f"context restart={value} needs the per-rank command: pass command=, e.g. "
                            "command=\"python train.py\"")
    return value


def _data_owner(ctx: Mapping[str, Any], data: tuple[str, ...], mode: str) -> Optional[str]:
    if "data_owner" not in ctx:
        return None
    value = ctx["data_owner"].strip()
    if not re.fullmatch(r"[0-9]{12}", value):
        raise UserError(f"context data_owner={value!r}: an AWS account id is 12 digits, e.g. "
                        f"data_owner={EXAMPLES['data_owner']}")
    if not data or mode != "stage":
        raise UserError("context data_owner names who owns the buckets of data=... staged onto the nodes: pass "
                        "data=s3://... with it (data_mode=stage)")
    return value


def _checkpoint_dir(ctx: Mapping[str, Any], shipped: tuple[str, ...]) -> Optional[str]:
    """shipped: the code's files as it ships them (after .dlignore)."""
    if "checkpoint_dir" not in ctx:
        return None
    value = ctx["checkpoint_dir"]
    problem = checkpoint_dir_problem(value)
    if problem:
        raise UserError(f"context {problem}")
    if "command" not in ctx and "command_file" not in ctx:
        raise UserError("context checkpoint_dir names where a command's framework saves: pass command= with it "
                        "(e.g. command=\"dl-torchrun train.py\")")
    overlap = shipped_overlap(value, shipped)
    if overlap:
        raise UserError(f"context {overlap}")
    return normalized(value)
