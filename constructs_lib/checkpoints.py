"""The checkpoint store: an S3 bucket that outlives the stack."""
from __future__ import annotations

from typing import TypedDict

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
from constructs import Construct

from .nag import resource_of
from .runtime.layout import prefix_problem
from .validation import ConfigurationError


# Why the access-log bucket is not versioned (checkov CKV_AWS_21), written into its template.
ACCESS_LOGS_UNVERSIONED = (
    "only S3 log delivery writes here, each record under a new unique key, never overwritten; no node or "
    "job role may write or delete in it; the bucket is retained on stack delete and its lifecycle "
    "expires records after 365 days, so versions would only add copies of nothing")


class _BucketProps(TypedDict):
    """What both buckets share (s3.Bucket's keyword props of these names)."""

    encryption: s3.BucketEncryption
    block_public_access: s3.BlockPublicAccess
    enforce_ssl: bool
    removal_policy: cdk.RemovalPolicy
    object_ownership: s3.ObjectOwnership


def check_prefix(prefix: str) -> str:
    """The runtime's own rule (constructs_lib.runtime.layout), so the grant covers exactly the
    prefix the nodes write under."""
    problem = prefix_problem(prefix)
    if problem:
        raise ConfigurationError(problem)
    return prefix.strip("/")


class CheckpointBucket(Construct):
    """Encrypted, versioned, TLS-only, private; RETAIN on delete (`cdk destroy` never deletes checkpoints).

    Keyword-only props (defaults in brackets):
      noncurrent_version_days [30]: how long overwritten or deleted versions are kept.
      bucket_name [generated].
      access_logs [True]: server access logs into a second retained bucket.

    `grant_read_write(grantee, prefix)` gives one job's role its prefix and nothing else.
    """

    def __init__(self, scope: Construct, construct_id: str, *, noncurrent_version_days: int = 30,
                 bucket_name: str | None = None, access_logs: bool = True) -> None:
        super().__init__(scope, construct_id)
        # Log delivery through a bucket policy, not ACLs, whatever the app's feature flags say:
        # both buckets keep ACLs disabled (BucketOwnerEnforced).
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        if noncurrent_version_days < 1:
            raise ConfigurationError(f"noncurrent_version_days must be at least 1, got {noncurrent_version_days}")
        common = _BucketProps(encryption=s3.BucketEncryption.S3_MANAGED,
                              block_public_access=s3.BlockPublicAccess.BLOCK_ALL, enforce_ssl=True,
                              removal_policy=cdk.RemovalPolicy.RETAIN,
                              object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED)
        self.access_log_bucket: s3.Bucket | None = None
        if access_logs:
            self.access_log_bucket = s3.Bucket(self, "AccessLogs", **common, lifecycle_rules=[
                s3.LifecycleRule(expiration=cdk.Duration.days(365))])
            resource_of(self.access_log_bucket).add_metadata("checkov", {"skip": [{
                "id": "CKV_AWS_21", "comment": ACCESS_LOGS_UNVERSIONED}]})
            cdk.Validations.of(self.access_log_bucket).acknowledge(cdk.Acknowledgment(
                id="AwsSolutions-S1", reason="this is the access-log bucket; logging it into itself would loop"))
        self.bucket = s3.Bucket(
            self, "Bucket", **common, versioned=True, bucket_name=bucket_name,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="checkpoints/" if access_logs else None,
            lifecycle_rules=[s3.LifecycleRule(
                id="checkpoint-hygiene",
                abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
                noncurrent_version_expiration=cdk.Duration.days(noncurrent_version_days))])

    def grant_read_write(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Read, write and delete objects under `prefix/`, and list only that prefix."""
        prefix = check_prefix(prefix)
        objects = self.bucket.arn_for_objects(f"{prefix}/*")
        iam.Grant.add_to_principal(grantee=grantee, actions=["s3:ListBucket"], resource_arns=[self.bucket.bucket_arn],
                                   conditions={"StringLike": {"s3:prefix": [f"{prefix}/*", f"{prefix}/"]}})
        grant = iam.Grant.add_to_principal(
            grantee=grantee, resource_arns=[objects],
            actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                     "s3:ListMultipartUploadParts"])
        if grantee.grant_principal.policy_fragment and isinstance(grantee, Construct):
            self._acknowledge_prefix_wildcard(grantee, prefix)
        return grant

    def _acknowledge_prefix_wildcard(self, grantee: Construct, prefix: str) -> None:
        # Only for the one '/*' this grant appends: check_prefix refuses wildcards in `prefix`
        # itself, so no acknowledgement ever covers a wildcard the caller passed.
        if "*" in prefix or "?" in prefix:
            raise ConfigurationError(f"internal: refusing to acknowledge a wildcard in prefix {prefix!r}")
        cdk.Validations.of(grantee).acknowledge(cdk.Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::<{cdk.Stack.of(self).get_logical_id(resource_of(self.bucket))}.Arn>/{prefix}/*]",
            reason="checkpoint files are named by step at run time; the wildcard is confined to this job's prefix"))
