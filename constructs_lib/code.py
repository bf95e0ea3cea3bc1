"""A deployer's code directory as a CDK asset: exactly the files codescan.py lets through, staged
(hard links where the file system allows) so that the asset, its hash and the digest the nodes
check are all made from the same files."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3_assets as s3_assets
from constructs import Construct

from .bundle import acknowledge_asset_parameters
from .codescan import MAX_BYTES, MAX_FILES, CodeFiles, scan
from .runtime.codetree import TreeDigest, digest_tree


def stage(files: CodeFiles) -> str:
    """A temporary directory (removed at exit) holding exactly `files`, links resolved."""
    root = tempfile.mkdtemp(prefix="dl-launcher-code-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for rel, src in files.files:
        dest = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(src, dest)
    return root


class CodeAsset(Construct):
    """A directory of code for the nodes, as an S3 asset (zip). Each node unpacks it into the job's
    working directory and checks it against `digest` before a run (runtime/jobdef.py).

    Keyword-only props (defaults in brackets):
      path: the directory. Left out: .git, __pycache__, *.pyc, .venv, secret-like files (.env*,
        .netrc, .aws/, .ssh/, *.pem, id_rsa*, ...: codescan.SECRET_EXCLUDES, named in describe())
        and the patterns of its .dlignore (codescan.py). Refused (ConfigurationError): missing, a file, empty, a link out
        of it, or over max_bytes / max_files.
      max_bytes [256 MiB], max_files [20,000].

    Attributes: asset, url (s3://..., tokens until deploy), digest (TreeDigest: sha256, files,
    bytes), files (CodeFiles), stage_seconds.
    """

    def __init__(self, scope: Construct, construct_id: str, *, path: str, max_bytes: int = MAX_BYTES,
                 max_files: int = MAX_FILES) -> None:
        super().__init__(scope, construct_id)
        started = time.monotonic()
        self.files = scan(path, max_bytes=max_bytes, max_files=max_files)
        staged = stage(self.files)
        self.digest: TreeDigest = digest_tree(staged)
        self.asset = s3_assets.Asset(self, "Asset", path=staged, display_name=f"code {os.path.basename(self.files.root)}")
        self.url = self.asset.s3_object_url
        self.stage_seconds = time.monotonic() - started
        acknowledge_asset_parameters(self)

    def grant_fetch(self, grantee: iam.IGrantable) -> iam.Grant:
        """s3:GetObject on this code's object and nothing else."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetObject"],
            resource_arns=[self.asset.bucket.arn_for_objects(self.asset.s3_object_key)])

    def describe(self) -> str:
        secrets = self.files.secrets_line()
        return (f"{self.files.root}: {self.digest.files:,} files, {self.digest.bytes / 1e6:.1f} MB, "
                f"digest {self.digest.sha256[:12]}" + (f"; {secrets}" if secrets else ""))
