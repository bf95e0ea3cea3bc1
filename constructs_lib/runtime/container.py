"""The job's command in its container image: docker's arguments (every GPU or Neuron device, the
EFA devices, the host's network, the node's directories at their own paths) and which private
ECR registry an image needs a login to.

Standard library only: this module ships to the node with the runtime.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Optional

from . import contract

CONTAINER = "dl-job"     # the job's container name: one per node, removed before each run


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def docker_run(docker: str, image: str, *, script: str, workdir: str, names: list[str], sdk: str,
               secrets_file: Optional[str] = None) -> list[str]:
    argv = [docker, "run", "--rm", "--name", CONTAINER, "--network", "host", "--ipc", "host",
            "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    if sdk == "cuda":
        argv += ["--gpus", "all"]
    devices = sorted(glob.glob("/dev/infiniband/uverbs*")) + sorted(glob.glob("/dev/neuron*"))
    for dev in devices:
        argv += ["--device", dev]
    mounts = [contract.lib_dir() + ":ro", contract.etc_dir() + ":ro", contract.run_dir(), contract.scratch_dir()]
    for m in mounts:
        path, _, mode = m.partition(":")
        argv += ["--volume", f"{path}:{path}" + (f":{mode}" if mode else "")]
    if not workdir.startswith(contract.scratch_dir() + os.sep):
        argv += ["--volume", f"{workdir}:{workdir}"]
    argv += ["--workdir", workdir]
    for name in names:
        argv += ["--env", name]
    # The run directory is mounted at its own path, so the entry script finds the secrets file there.
    return argv + [image, "/bin/bash", os.path.join(contract.lib_dir(), "dl_container.sh"), script,
                   *([secrets_file] if secrets_file else [])]


_ECR = re.compile(r"^(\d{12})\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/", re.ASCII)


def ecr_registry(image: str) -> Optional[tuple[str, str]]:
    """(registry host, region) of a private ECR image, or None (public registries need no login)."""
    m = _ECR.match(image)
    return (image.split("/", 1)[0], m[2]) if m else None
