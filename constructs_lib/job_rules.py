"""The rules a job's settings must meet, as pure functions (no CDK import): the app checks its
context with them before any stack exists, and JobDefinition checks its props with the same.
Each returns why a value cannot be used, or None."""
from __future__ import annotations

import re
from typing import Optional, Sequence

from .runtime import contract
from .runtime.staging import data_source

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_ARN = re.compile(r"^arn:(?P<partition>aws[a-z-]*):(?P<service>secretsmanager|ssm):(?P<region>[a-z0-9-]+):"
                         r"(?P<account>\d{12}):(?P<kind>secret:|parameter/)(?P<name>[A-Za-z0-9/_+=.@-]+)\Z", re.ASCII)
KMS_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}\Z", re.ASCII)
_IMAGE = re.compile(r"^(?:(?P<registry>[a-z0-9.-]+(?::\d+)?)/)?(?P<path>[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
                    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?\Z", re.ASCII)


def env_problem(name: str) -> Optional[str]:
    """Why `name` cannot be one of the deployer's environment variables, or None."""
    if not _ENV_NAME.match(name):
        return f"{name!r} is not a shell variable name (letters, digits and _, not starting with a digit)"
    if name in contract.RESERVED_ENV or name.startswith(contract.RESERVED_ENV_PREFIXES):
        return (f"{name} is set by dl-launcher for every run (rendezvous, paths: "
                f"{', '.join(contract.RESERVED_ENV[:6])}, ..., and every DL_ name)")
    return None


def secret_problem(arn: str, region: Optional[str]) -> Optional[str]:
    """Why `arn` cannot be a secret the nodes read, or None."""
    m = _SECRET_ARN.match(arn)
    if not m:
        return ("not a Secrets Manager secret (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf) or an SSM "
                "parameter (arn:aws:ssm:REGION:ACCOUNT:parameter/NAME) ARN")
    if (m["service"] == "secretsmanager") != (m["kind"] == "secret:"):
        return f"a {m['service']} ARN names a {m['kind'].rstrip(':/')}"
    if region and m["region"] != region:
        return f"it is in {m['region']}, the nodes run in {region} (copy the secret to {region})"
    expected = "aws-cn" if region and region.startswith("cn-") else "aws-us-gov" if region and region.startswith("us-gov-") else "aws"
    if region and m["partition"] != expected:
        return f"partition {m['partition']}, the nodes run in {expected}"
    return None


def image_problem(image: str) -> Optional[str]:
    if not _IMAGE.match(image) or len(image) > 512:
        return ("not an image reference like 123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1, "
                "public.ecr.aws/org/image:tag or nvcr.io/nvidia/pytorch:24.05-py3")
    return None


def secret_resource(arn: str) -> str:
    """Secrets Manager ARNs end in -XXXXXX (six random characters) that a deployer often leaves
    off; IAM then needs the six characters matched."""
    if ":secretsmanager:" in arn and not re.search(r"-[A-Za-z0-9]{6}$", arn):
        return arn + "-??????"
    return arn


# Bucket names as S3 takes them (general purpose buckets): contract.S3_BUCKET's shape, no "..",
# not an IP address, none of the reserved prefixes and suffixes.
_BUCKET_RESERVED = (("xn--", "sthree-", "amzn-s3-demo-"), ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))


def data_problem(uri: str) -> Optional[str]:
    """Why `uri` cannot be a dataset the nodes stage (s3://bucket/prefix), or None."""
    if not uri.startswith("s3://"):
        return "not an s3:// URI (e.g. s3://my-datasets/imagenet/train)"
    bucket, prefix = data_source(uri)
    if not contract.S3_BUCKET.match(bucket) or ".." in bucket or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", bucket) \
            or bucket.startswith(_BUCKET_RESERVED[0]) or bucket.endswith(_BUCKET_RESERVED[1]):
        closest = bucket.lower()
        hint = f"; did you mean s3://{closest}/{prefix}" if closest != bucket and contract.S3_BUCKET.match(closest) else ""
        return (f"bucket {bucket!r} is not a name S3 takes (3-63 lower-case letters, digits, dots and hyphens, "
                f"a letter or digit at each end){hint}")
    if any(c in prefix for c in "*?[]{}"):
        return "a wildcard in the prefix: name the prefix itself; everything under it is staged"
    if any(part in (".", "..") for part in prefix.split("/")):
        return "'.' or '..' in the prefix: name the prefix as S3 stores it"
    if "//" in uri[len("s3://"):].rstrip("/") or any(ord(c) < 32 for c in prefix):
        return "an empty path segment or a control character in the prefix"
    return None


def data_overlap(sources: list[tuple[str, str]]) -> Optional[str]:
    """Why these (bucket, prefix) pairs cannot be staged together (one inside another would be
    staged twice into two directories), or None."""
    for i, (b, p) in enumerate(sources):
        for b2, p2 in sources[i + 1:]:
            if b == b2 and (p.startswith(p2) or p2.startswith(p)):
                return f"s3://{b}/{p} and s3://{b2}/{p2} overlap: name each dataset once"
    return None


def data_list_problem(uris: Sequence[str]) -> Optional[str]:
    """Why a construct's `data` list cannot be used (the first bad URI, then any overlap), or None."""
    for uri in uris:
        problem = data_problem(uri)
        if problem:
            return f"data {uri!r}: {problem}"
    overlap = data_overlap([data_source(u) for u in uris])
    return f"data: {overlap}" if overlap else None


def shipped_overlap(checkpoint_dir: str, shipped: Sequence[str]) -> Optional[str]:
    """Why checkpoint_dir may not be where the code puts files, or None: the node sets aside
    every checkpoint there before each run, and shipped checkpoints would be resumed from."""
    from .runtime.framework_checkpoints import normalized

    d = normalized(checkpoint_dir)
    inside = [rel for rel in shipped if rel == d or rel.startswith(d + "/")]
    if not inside:
        return None
    return (f"checkpoint_dir={checkpoint_dir}: your code ships {len(inside)} file(s) there ({inside[0]}"
            f"{', ...' if len(inside) > 1 else ''}); the directory is the job's checkpoints on the nodes: "
            f"add '{d}/' to the code's .dlignore, or name a directory your code does not hold")


# What forms one job from one command per node: a launcher that starts the node's ranks and joins
# them with the other nodes' (MASTER_ADDR, NODE_RANK, NNODES: every node gets them).
LAUNCHERS = ("dl-torchrun", "torchrun", "deepspeed", "mpirun", "mpiexec", "horovodrun", "srun", "composer")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                    "deepspeed.launcher.runner")
_WRAPPERS = ("exec", "env", "time", "nohup", "stdbuf", "nice")
_RUNNERS = (("uv", "run"), ("poetry", "run"), ("pipenv", "run"))
# A framework that starts its ranks itself from those variables: `python train.py` is one job there.
_SELF_LAUNCHING = re.compile(r"^\s*(?:import|from)\s+(?:lightning|pytorch_lightning)\b", re.MULTILINE)


def _program(words: list[str]) -> list[str]:
    """The words from the program on: leading VAR=value, exec/env/time and `uv run` left out."""
    while words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in _WRAPPERS:
            words = words[1:]
        elif tuple(words[:2]) in _RUNNERS:
            words = words[2:]
        else:
            break
    return words


def _kind(words: list[str], code: Optional[str], depth: int) -> tuple[str, Optional[str]]:
    """('launcher' | 'python' | 'unknown', the script python runs)."""
    import os

    if not words:
        return "unknown", None
    prog = os.path.basename(words[0])
    if prog in LAUNCHERS or (prog == "accelerate" and words[1:2] == ["launch"]):
        return "launcher", None
    if re.fullmatch(r"python[0-9.]*", prog):
        args = words[1:]
        if "-m" in args:
            module = args[args.index("-m") + 1] if args.index("-m") + 1 < len(args) else ""
            return ("launcher" if module in LAUNCHER_MODULES else "python"), None
        script = next((a for a in args if not a.startswith("-")), None)
        return "python", script
    # A shell script in the code: what it runs decides (one level deep); one we cannot read, we cannot judge.
    script = words[1] if prog in ("bash", "sh") and len(words) > 1 else words[0] if words[0].endswith(".sh") else None
    if script and code and depth == 0:
        path = os.path.join(code, script)
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                return _judge(f.read(), code, depth + 1), None
    return "unknown", None


def _judge(text: str, code: Optional[str], depth: int = 0) -> str:
    """'launcher' when any step starts one, 'python' when a step runs a plain script and none
    does, else 'unknown'."""
    import os
    import shlex

    kinds = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        for segment in re.split(r"&&|\|\||;|\|", line):
            try:
                words = _program(shlex.split(segment, comments=True))
            except ValueError:  # an open quote: shell the check cannot read
                return "unknown"
            kind, script = _kind(words, code, depth)
            if kind == "python" and script and code:
                path = os.path.join(code, script)
                if os.path.isfile(path):
                    with open(path, errors="replace") as f:
                        if _SELF_LAUNCHING.search(f.read()):
                            kind = "launcher"
            kinds.append(kind)
    if "launcher" in kinds:
        return "launcher"
    return "python" if "python" in kinds else "unknown"


def one_job_problem(command: Optional[str], nodes: int, code: Optional[str] = None) -> Optional[str]:
    """Why `command` on `nodes` nodes would run unrelated copies instead of one job, with the fix;
    None when it forms one job or cannot be judged (a script in the image, or one not in the code).

    A warning, never a refusal: a script that reads NODE_RANK and MASTER_ADDR (which every node
    gets) and starts its ranks itself forms one job from plain `python`, and no string check can
    tell it from one that does not; Lightning, the common case, is recognised from its import."""
    if nodes < 2 or not command or _judge(command, code) != "python":
        return None
    return (f"command {command.strip().splitlines()[0][:80]!r} on {nodes} nodes runs a plain python process per "
            f"node: {nodes} unrelated copies (each sees WORLD_SIZE, none a RANK), not one job. Fix: start it with a "
            "launcher: -c command=\"dl-torchrun train.py\" (torchrun with this cluster's rendezvous; also torchrun, "
            "python -m torch.distributed.run, accelerate launch, deepspeed); ignore this if the script starts its "
            "ranks itself from NODE_RANK and MASTER_ADDR")
