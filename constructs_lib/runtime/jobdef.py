"""The deployer's job on a node: which revision a generation runs, the working directory that
holds exactly its code, its setup (once per boot), the environment and secrets the command gets,
and the command line (on the host, or in the job's container image). What a revision is:
job_definition.py; the secrets: job_secrets.py; the container: container.py.

Who may change what a node runs: the proposer of a generation reads the pointer and records the
revision in the plan, so every member runs the same one. A node fetches the definition itself,
checks it against the plan's sha256 and the code against the definition, and its role may read
only the deployer's current objects (exact keys, IAM): a plan cannot change the command, setup,
image, env or which secrets are read. It is not a trust boundary between a job's nodes, though:
every node (and any process on it, the job's own code included) may write anything under the
job's prefix, so one compromised node can forge plans (members, rank order, master address,
resume step), checkpoints every node restores and loads (DCP's .metadata is a pickle, as is a
torch.save file loaded without weights_only: code of its choosing then runs in every node's job,
with the job's secrets in its environment), and the end records. The nodes of one job are one trust domain; the boundary is the job's role: its prefix,
its secrets, its definition (docs: the trust model). Records are checked for their form
(records.py) so that a bad one is set aside, never a crash.
Secret values never reach disk or a log (job_secrets.py, redact.py).

Standard library and boto3 only: this module ships to the node with the runtime.
"""
from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from . import contract
from .codetree import UnsafeArchive, digest_tree, unpack
from .container import CONTAINER, docker_run, ecr_registry, shell_quote
from .job_definition import Definition, JobError, Log, Revision, read_retrying, revision_from_env, split_s3
from .job_secrets import read_secrets
from .layout import write_atomic
from .redact import Redactor
from .staging import StagingError, prepare_data
from .stream import stream

__all__ = ["Definition", "JobError", "NodeJob", "Prepared", "Revision"]


@dataclass
class Prepared:
    revision: Revision
    definition: Definition
    workdir: str


@dataclass
class NodeJob:
    """The job's revisions on this node: fetch, check, unpack, pull, set up; and the command line.

    `client(service, region_name=...)` makes boto3 clients (a test passes its own);
    `run_output(argv, **popen_kw)` is how setup and image pulls run (the supervisor streams
    their lines into the job log)."""

    log: Log
    region: Optional[str] = None
    client: Callable[..., object] = None  # type: ignore[assignment]
    cluster: str = ""
    docker: str = "docker"
    setup_timeout: float = 3600.0
    pull_timeout: float = 1800.0
    attempts: int = 5
    retry_base: float = 1.0
    _definitions: dict = field(default_factory=dict)
    # Every secret value read on this node, to mask in what the supervisor writes to S3 (redact.py).
    redactor: Redactor = field(default_factory=Redactor)
    prepared: Optional[Prepared] = None
    # What the supervisor is doing (its phase file) and each component's health; no-ops in tests
    # that exercise the job alone.
    on_phase: Callable[[str], None] = lambda phase: None
    health: Callable[[str, str, str], None] = lambda component, level, message: None

    def __post_init__(self) -> None:
        if self.client is None:
            import boto3
            from botocore.config import Config

            from dl_core.aws import retries

            # Adaptive retries: a whole cluster reads the same parameter and secrets at once.
            config = Config(retries=retries("adaptive", 10))
            self.client = lambda service, **kw: boto3.client(service, config=config, **kw)

    # ---- which revision ----------------------------------------------------------------------
    def boot_revision(self) -> Optional[Revision]:
        return revision_from_env()

    def deployed_revision(self) -> Optional[Revision]:
        """The revision in the SSM parameter (a redeploy changes it), or None where it cannot be read."""
        name = os.environ.get("DL_JOB_PARAMETER")
        if not name:
            return None
        ssm = self.client("ssm", region_name=self.region)
        try:
            value = read_retrying(f"job parameter {name}", lambda: ssm.get_parameter(Name=name)["Parameter"]["Value"],
                              log=self.log, attempts=3, base=self.retry_base)
            return Revision.from_json(json.loads(value))
        except (JobError, ValueError) as e:
            self.log(f"could not read the job's deployed revision: {e}")
            return None

    def current_revision(self) -> Optional[Revision]:
        """The deployer's revision now, else the one this node booted with (a throttled or
        unreadable parameter never stops a generation)."""
        return self.deployed_revision() or self.boot_revision()

    # ---- the definition ----------------------------------------------------------------------
    def definition(self, rev: Revision) -> Definition:
        if rev.sha256 in self._definitions:
            return self._definitions[rev.sha256]
        cache = os.path.join(contract.path("definitions_dir"), f"{rev.sha256}.json")
        try:
            with open(cache, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            bucket, key = split_s3(rev.definition)
            s3 = self.client("s3", region_name=self.region)
            data = read_retrying(f"job definition {rev.definition}",
                             lambda: s3.get_object(Bucket=bucket, Key=key)["Body"].read(),
                             log=self.log, attempts=self.attempts, base=self.retry_base)
        got = hashlib.sha256(data).hexdigest()
        if got != rev.sha256:
            raise JobError(f"job definition {rev.definition} has sha256 {got}, the revision says {rev.sha256}")
        d = Definition.parse(data, rev.sha256)
        if d.code is not None and not rev.code:
            raise JobError(f"job definition {rev.sha256[:12]} has code but the revision names no code object", final=True)
        write_atomic(cache, data.decode())
        self._definitions[rev.sha256] = d
        return d

    # ---- the working directory ---------------------------------------------------------------
    def checkout(self, rev: Revision, d: Definition) -> str:
        """The directory holding exactly the revision's code (unpacked once per boot per digest),
        linked as contract.work_dir(); a job without code gets an empty directory of its own."""
        if d.code is None:
            target = os.path.join(contract.code_dir(), "none")
            os.makedirs(target, exist_ok=True)
        else:
            digest = d.code["sha256"]
            target = os.path.join(contract.code_dir(), digest)
            if not os.path.isdir(target):
                self._unpack(rev.code or "", digest, target)
        _link(target, contract.work_dir())
        return target

    def _unpack(self, url: str, digest: str, target: str) -> None:
        bucket, key = split_s3(url)
        os.makedirs(contract.code_dir(), exist_ok=True)
        partial = f"{target}.partial-{os.getpid()}"
        archive = f"{partial}.zip"
        shutil.rmtree(partial, ignore_errors=True)
        for stale in glob.glob(f"{target}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True) if os.path.isdir(stale) else os.unlink(stale)
        s3 = self.client("s3", region_name=self.region)
        started = time.monotonic()
        try:
            read_retrying(f"code {url}", lambda: s3.download_file(bucket, key, archive), log=self.log,
                      attempts=self.attempts, base=self.retry_base)
            try:
                unpack(archive, partial)
            except (UnsafeArchive, OSError, EOFError, zipfile.BadZipFile) as e:
                raise JobError(f"code {url} cannot be unpacked: {type(e).__name__}: {e}") from None
            got = digest_tree(partial)
            if got.sha256 != digest:
                raise JobError(f"code {url} unpacked to digest {got.sha256[:12]} ({got.files} files), the job "
                               f"definition says {digest[:12]}: not running it")
            os.rename(partial, target)
            self.log(f"code {digest[:12]} ({got.files} files, {got.bytes / 1e6:.1f} MB) unpacked in "
                     f"{time.monotonic() - started:.1f} s into {target}")
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            if os.path.exists(archive):
                os.unlink(archive)

    # ---- setup, image, secrets ---------------------------------------------------------------
    def secrets(self, d: Definition) -> dict[str, str]:
        values = read_secrets(d.secrets, region=self.region, log=self.log, client=self.client) if d.secrets else {}
        self.redactor.add(values.values())
        return values

    def environment(self, d: Definition, secrets: Mapping[str, str], workdir: str) -> dict[str, str]:
        """What the deployer's setup and command see beyond the unit's environment."""
        return {**d.env, **secrets, "DL_WORK_DIR": workdir, "DL_DATA_DIR": contract.data_dir()}

    def setup_key(self, d: Definition) -> str:
        code = d.code["sha256"] if d.code else ""
        return hashlib.sha256(f"{d.setup}\0{code}\0{d.image or ''}".encode()).hexdigest()

    def run_setup(self, d: Definition, workdir: str, env: Mapping[str, str], emit: Log) -> bool:
        """Setup once per boot for this code and setup text (a marker in the run directory, which
        a reboot clears); False when it had already run. Its lines go to `emit`."""
        if not d.setup:
            return False
        marker = os.path.join(contract.path("setup_dir"), self.setup_key(d))
        if os.path.exists(marker):
            return False
        script = os.path.join(contract.path("setup_dir"), f"{self.setup_key(d)}.sh")
        write_atomic(script, d.setup if d.setup.endswith("\n") else d.setup + "\n")
        self.log(f"setup: running in {workdir}")
        started = time.monotonic()
        rc, tail = stream(["/bin/bash", script], cwd=workdir, env=env, emit=lambda line: emit(f"[setup] {line}"),
                          timeout=self.setup_timeout)
        if rc != 0:
            why = "ran over its time limit" if rc is None else f"exited {rc}"
            last = " | ".join(tail[-5:])
            raise JobError(f"setup {why} after {time.monotonic() - started:.0f} s; last lines: {last}", final=True)
        write_atomic(marker, f"{time.time()}\n")
        self.log(f"setup: done in {time.monotonic() - started:.0f} s")
        return True

    def pull(self, d: Definition, emit: Log) -> None:
        """Pull the job's image (logging in to ECR first where it is an ECR image): bounded in
        time and retried; a pull that keeps failing is final, with the registry's own words."""
        if not d.image:
            return
        registry = ecr_registry(d.image)
        last = ""
        for attempt in range(1, 4):
            if registry:
                self._ecr_login(registry[0], registry[1], emit)
            rc, tail = stream([self.docker, "pull", "--quiet", d.image], env=os.environ, emit=emit,
                              timeout=self.pull_timeout)
            if rc == 0:
                self.log(f"image {d.image} pulled")
                return
            last = " | ".join(tail[-3:]) or ("timed out" if rc is None else f"exit {rc}")
            self.log(f"image pull failed (try {attempt} of 3): {last}")
            time.sleep(min(30.0, self.retry_base * 5 * attempt))
        raise JobError(f"image {d.image} could not be pulled: {last}", final=True)

    def _ecr_login(self, host: str, region: str, emit: Log) -> None:
        ecr = self.client("ecr", region_name=region)
        auth = read_retrying(f"ECR login for {host}", lambda: ecr.get_authorization_token()["authorizationData"][0],
                         log=self.log, attempts=self.attempts, base=self.retry_base)
        user, password = base64.b64decode(auth["authorizationToken"]).decode().split(":", 1)
        r = subprocess.run([self.docker, "login", "--username", user, "--password-stdin", host], input=password,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise JobError(f"docker login to {host} failed: {(r.stderr or r.stdout).strip()[-300:]}")

    def prepare_data(self, d: Definition, emit: Log) -> None:
        """The job's data (staging.prepare_data); what cannot be fixed by trying again is final."""
        try:
            prepare_data(d.data, s3=lambda: self.client("s3", region_name=self.region), region=self.region, emit=emit,
                         on_phase=self.on_phase, health=self.health)
        except StagingError as e:
            raise JobError(str(e), final=e.final) from None

    def prepare(self, rev: Revision, emit: Log) -> Prepared:
        """Everything before a run of `rev`: definition, code, image, data, setup (each skipped when done)."""
        d = self.definition(rev)
        workdir = self.checkout(rev, d)
        self.pull(d, emit)
        self.prepare_data(d, emit)  # before setup, which may read it
        if d.setup and not os.path.exists(os.path.join(contract.path("setup_dir"), self.setup_key(d))):
            env = {**os.environ, **self.environment(d, self.secrets(d), workdir)}
            self.run_setup(d, workdir, env, emit)
        self.prepared = Prepared(rev, d, workdir)
        return self.prepared

    # ---- the command line --------------------------------------------------------------------
    def command_file(self, d: Definition) -> str:
        path = os.path.join(contract.path("definitions_dir"), f"{d.sha256}.sh")
        if not os.path.exists(path):
            text = d.command or ""
            write_atomic(path, text if text.endswith("\n") else text + "\n")
            os.chmod(path, 0o700)
        return path

    def argv(self, d: Definition, workdir: str, pass_env: Mapping[str, str]) -> list[str]:
        """How the command runs: bash on the host, or bash in the image with every GPU (or Neuron
        device), the EFA devices and the host's network, the node's directories at their own
        paths; `pass_env` names what the container gets (values come from docker's own
        environment, so none is written in its arguments)."""
        script = self.command_file(d)
        if not d.image:
            return ["/bin/bash", script]
        # Secrets never go in docker's arguments or `--env` (docker stores the values in the
        # container's config, where `docker inspect` shows them): a root-only file on the boot's
        # tmpfs that the container's entry script reads into the command's environment and removes.
        secret_names = sorted(set(d.secrets) & set(pass_env))
        secrets_file = None
        if secret_names:
            secrets_file = os.path.join(contract.run_dir(), contract.CONTAINER_SECRETS)
            write_atomic(secrets_file, "".join(f"export {n}={shell_quote(pass_env[n])}\n" for n in secret_names), mode=0o600)
        return docker_run(self.docker, d.image, script=script, workdir=workdir,
                          names=sorted(set(pass_env) - set(secret_names)), sdk=os.environ.get("DL_SDK", "cuda"),
                          secrets_file=secrets_file)

    def stop_container(self) -> None:
        """Remove a container left by an earlier run (a restart of the supervisor, a kill), and a
        secrets file that a container which never started left behind."""
        if self.prepared and self.prepared.definition.image:
            subprocess.run([self.docker, "rm", "--force", CONTAINER], capture_output=True, timeout=120)
        try:
            os.unlink(os.path.join(contract.run_dir(), contract.CONTAINER_SECRETS))
        except FileNotFoundError:
            pass



def _link(target: str, link: str) -> None:
    tmp = f"{link}.new-{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)

