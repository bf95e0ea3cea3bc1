"""The node bundle: everything a node runs (the runtime's Python, the shell scripts, contract.sh
and the systemd units), laid out as DL_LIB_DIR holds it and shipped as one CDK asset.

User data only fetches it (see userdata.py and scripts/bootstrap.sh), so the runtime can grow
without meeting EC2's 16 KB user-data limit. The layout is deterministic: the same sources give
byte-identical files, so the asset hash is stable and every launch template of an app shares one
S3 object.
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from typing import Callable, Optional

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3_assets as s3_assets
from constructs import Construct

from .runtime import contract
from .userdata import script_path

PACKAGE = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join(PACKAGE, "runtime")
# The bottom package (AWS calls, one-line argparse errors): node code imports it, so it ships whole.
CORE = os.path.join(os.path.dirname(PACKAGE), "dl_core")


def copy_core(python_dir: str) -> None:
    """dl_core/*.py into python_dir/dl_core (the node bundle's python/, the Lambda package's root)."""
    for name in sorted(os.listdir(CORE)):
        if name.endswith(".py"):
            _copy(os.path.join(CORE, name), os.path.join(python_dir, "dl_core", name))

# Scripts at the top of the bundle, where the units and each other expect them ($DL_LIB_DIR/x.sh).
BUNDLE_SCRIPTS = ("dl_job.sh", "dl_runtime.sh", "dl_torchrun.sh", "dl_env.sh", "nvme_raid0.sh", "efa_env.sh",
                  "install.sh", "dl_cwagent.sh", "dl_container.sh")

# Settings files of the boot-time units, beside the contract's own in DL_ETC_DIR.
NVME_ENV = "nvme.env"
EFA_SDK_ENV = "efa-sdk.env"

RAID_UNIT = "dl-nvme-raid0.service"
EFA_UNIT = "dl-efa-env.service"
AGENT_UNIT = "dl-node-agent.service"
JOB_UNIT = "dl-job.service"
MONITOR_UNIT = "dl-monitor.service"
LOGS_UNIT = "dl-logs.service"  # the CloudWatch agent for the job's log alone, where the monitor is off
UNITS = (RAID_UNIT, EFA_UNIT, AGENT_UNIT, LOGS_UNIT, JOB_UNIT, MONITOR_UNIT)  # install.sh starts them in this order


def _unit(description: str, unit: list[str], service: list[str]) -> str:
    return "\n".join(["[Unit]", f"Description=dl-launcher: {description}", *unit, "",
                      "[Service]", *service, "",
                      "[Install]", "WantedBy=multi-user.target", ""])


def unit_texts(*, etc_dir: Optional[str] = None, lib_dir: Optional[str] = None) -> dict[str, str]:
    """The systemd units by name, for the given directories (default: the contract's defaults,
    which is what the bundle ships; a multi-node test can render its per-node copies)."""
    etc = etc_dir or contract.DIR_DEFAULTS["DL_ETC_DIR"]
    lib = lib_dir or contract.DIR_DEFAULTS["DL_LIB_DIR"]
    node_env = f"EnvironmentFile=-{etc}/{contract.FILES['node_env'][1]}"
    return {
        RAID_UNIT: _unit("instance-store NVMe RAID 0 scratch",
                         ["After=local-fs.target dlami-nvme.service"],
                         ["Type=oneshot", "RemainAfterExit=yes", f"EnvironmentFile=-{etc}/{NVME_ENV}",
                          f"ExecStart=/bin/bash {lib}/nvme_raid0.sh"]),
        EFA_UNIT: _unit("EFA/NCCL environment for jobs", [],
                        ["Type=oneshot", "RemainAfterExit=yes", f"EnvironmentFile=-{etc}/{EFA_SDK_ENV}",
                         f"ExecStart=/bin/bash {lib}/efa_env.sh"]),
        AGENT_UNIT: _unit("node agent (spot notices, checkpoint uploads)",
                          ["After=network-online.target", "Wants=network-online.target"],
                          ["Type=simple", node_env, f"ExecStart=/bin/bash {lib}/dl_runtime.sh agent",
                           "Restart=always", "RestartSec=5"]),
        JOB_UNIT: _unit("the training job",
                        # The log shipper first where there is one: the run's first lines go with the rest.
                        [f"After={RAID_UNIT} {EFA_UNIT} {AGENT_UNIT} {LOGS_UNIT} network-online.target",
                         "Wants=network-online.target"],
                        ["Type=simple", node_env, f"ExecStart=/bin/bash {lib}/dl_job.sh",
                         "Restart=on-failure", "RestartSec=30",
                         # A wrong setting or a job that keeps failing is not cured by a restart.
                         "RestartPreventExitStatus=" + " ".join(str(c) for c in contract.NO_RESTART_EXITS),
                         "KillMode=control-group", "TimeoutStopSec=90"]),
        LOGS_UNIT: _unit("CloudWatch agent for the job's log",
                         ["After=network-online.target", "Wants=network-online.target"],
                         ["Type=oneshot", "RemainAfterExit=yes", node_env, f"ExecStart=/bin/bash {lib}/dl_cwagent.sh",
                          "TimeoutStartSec=300"]),
        MONITOR_UNIT: _unit("node monitor (CloudWatch agent; throughput, progress and GPU health)",
                            [f"After={RAID_UNIT} network-online.target", "Wants=network-online.target"],
                            ["Type=simple", node_env, f"ExecStartPre=-/bin/bash {lib}/dl_cwagent.sh",
                             f"ExecStart=/bin/bash {lib}/dl_runtime.sh monitor", "Restart=always", "RestartSec=30",
                             # Room for dl_cwagent.sh's bounded install (download at most 3 min, 45 s for dpkg's lock).
                             "TimeoutStartSec=300"]),
    }


def build_bundle(dest_dir: str) -> None:
    """Lay out the bundle in `dest_dir` (created; must be empty): python/constructs_lib/ and
    python/dl_core/ (AWS calls, argv errors, the dl-bench line), the scripts, contract.sh and units/."""
    os.makedirs(dest_dir, exist_ok=True)
    if os.listdir(dest_dir):
        raise ValueError(f"{dest_dir} is not empty: the bundle must hold nothing but its own files")
    pkg = os.path.join(dest_dir, "python", "constructs_lib")
    _copy(os.path.join(PACKAGE, "__init__.py"), os.path.join(pkg, "__init__.py"))
    for name in sorted(os.listdir(RUNTIME)):
        if name.endswith(".py"):
            _copy(os.path.join(RUNTIME, name), os.path.join(pkg, "runtime", name))
    copy_core(os.path.join(dest_dir, "python"))
    for name in BUNDLE_SCRIPTS:
        _copy(script_path(name), os.path.join(dest_dir, name), mode=0o755)
    _write(os.path.join(dest_dir, "contract.sh"), contract.shell())
    for name, text in unit_texts().items():
        _write(os.path.join(dest_dir, "units", name), text)


def _copy(src: str, dest: str, mode: int = 0o644) -> None:
    with open(src, "rb") as f:
        _write(dest, f.read(), mode)


def _write(path: str, content: str | bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    os.chmod(path, mode)


def acknowledge_asset_parameters(scope: Construct) -> None:
    """Only the legacy synthesizer passes assets as parameters, under this child of the stack
    (reading stack.synthesizer from Python makes jsii warn on every synth); the rule can only be
    acknowledged for the whole stack, where parameters live."""
    stack = cdk.Stack.of(scope)
    if stack.node.try_find_child("AssetParameters") is not None:
        cdk.Validations.of(stack).acknowledge(cdk.Acknowledgment(
            id="CloudFormation-Validate::W2001",
            reason="the legacy synthesizer declares an ArtifactHash parameter for each asset (the node "
                   "bundle, the benchmark runner) that nothing references; the CDK CLI fills it in at deploy"))


@functools.lru_cache(maxsize=None)
def staged(build: Callable[[str], None]) -> str:
    """`build` run once per process into a temporary directory (removed at exit): CDK copies it
    into each app's cloud assembly when the asset is constructed."""
    root = tempfile.mkdtemp(prefix="dl-launcher-asset-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    build(os.path.join(root, "asset"))
    return os.path.join(root, "asset")


class NodeBundle(Construct):
    """The bundle as an S3 asset; one per stack (`NodeBundle.of(scope)`), and since its content
    is the same everywhere, one S3 object for the whole app.

    Attributes: asset (aws_s3_assets.Asset), url (s3://bucket/key, tokens until deploy).
    """

    ID = "DlLauncherNodeBundle"

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.asset = s3_assets.Asset(self, "Asset", path=staged(build_bundle), display_name="dl-launcher node bundle")
        self.url = self.asset.s3_object_url
        acknowledge_asset_parameters(self)

    @classmethod
    def of(cls, scope: Construct) -> "NodeBundle":
        stack = cdk.Stack.of(scope)
        return stack.node.try_find_child(cls.ID) or cls(stack, cls.ID)

    def grant_fetch(self, grantee: iam.IGrantable) -> iam.Grant:
        """s3:GetObject on the bundle's object and nothing else (Asset.grant_read would also
        allow listing and reading the whole staging bucket, every app's assets included)."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetObject"],
            resource_arns=[self.asset.bucket.arn_for_objects(self.asset.s3_object_key)])
