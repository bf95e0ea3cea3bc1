"""The job's secrets: each value read at each run from Secrets Manager or SSM (so a rotated
secret reaches the next run) and handed to the command's environment only: never written to disk
or logged, and masked in every record the supervisor writes to S3 (redact.py).

Standard library only: this module ships to the node with the runtime.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

from .job_definition import JobError, Log, read_retrying


def _service(arn: str) -> str:
    parts = arn.split(":")
    return parts[2] if len(parts) > 5 and parts[0] == "arn" else ""


def parameter_name(arn: str) -> str:
    """An SSM parameter's name from its ARN: hierarchical names keep their leading '/'."""
    name = arn.split(":parameter/", 1)[1] if ":parameter/" in arn else ""
    return f"/{name}" if "/" in name else name


def read_secrets(secrets: Mapping[str, str], *, region: Optional[str], log: Log,
                 client: Callable[..., object]) -> dict[str, str]:
    """Each name's value, read now (so a rotated secret reaches the next run). Errors name the
    variable and ARN, never a value."""
    out = {}
    for name, arn in sorted(secrets.items()):
        service = _service(arn)
        if service == "secretsmanager":
            sm = client("secretsmanager", region_name=region)
            got = read_retrying(f"secret {name} ({arn})", lambda: sm.get_secret_value(SecretId=arn), log=log)
            if "SecretString" not in got:
                raise JobError(f"secret {name} ({arn}) holds binary data: environment variables take text", final=True)
            out[name] = got["SecretString"]
        elif service == "ssm":
            ssm = client("ssm", region_name=region)
            got = read_retrying(f"secret {name} ({arn})",
                                lambda: ssm.get_parameter(Name=parameter_name(arn), WithDecryption=True), log=log)
            out[name] = got["Parameter"]["Value"]
        else:
            raise JobError(f"secret {name}: {arn} is neither a Secrets Manager secret nor an SSM parameter", final=True)
    return out
