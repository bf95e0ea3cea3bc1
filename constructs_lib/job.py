"""What every node of a cluster runs: the deployer's command with its code, setup, environment,
secrets and container image (JobDefinition), and where its output goes (JobLogs).

A definition is a small JSON file shipped as a CDK asset beside the code's; one SSM parameter,
which only CloudFormation writes, names the current pair. A redeploy rewrites it, and the next
generation on the running nodes picks it up (runtime/jobdef.py says how and who may change it).
"""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import tempfile
from typing import Mapping, Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_kms as kms
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3_assets as s3_assets
import aws_cdk.aws_ssm as ssm
from constructs import Construct

from .bundle import acknowledge_asset_parameters
from .code import CodeAsset
from .runtime import contract
from .job_rules import (KMS_ARN, data_list_problem, env_problem, image_problem, secret_problem, secret_resource,
                        shipped_overlap)
from .nag import resource_of
from .runtime.container import ecr_registry
from .runtime.framework_checkpoints import checkpoint_dir_problem, normalized
from .runtime.job_definition import definition_bytes
from .runtime.staging import data_source
from .validation import ConfigurationError

class JobLogs(Construct):
    """The log group of a job's output, one stream per node (the CloudWatch agent ships each
    node's job log: runtime/joblog.py, cwagent_config.py), encrypted with a key of its own.

    Keyword-only props (defaults in brackets):
      cluster: names the group, /dl-launcher/<cluster>/job.
      retention [three months].
    Attributes: log_group, key, log_group_name.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: str,
                 retention: logs.RetentionDays = logs.RetentionDays.THREE_MONTHS) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.log_group_name = contract.job_log_group(cluster)
        self.key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY,
                           description=f"dl-launcher job logs of {cluster}")
        group_arn = stack.format_arn(service="logs", resource="log-group", resource_name=self.log_group_name,
                                     arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
        # ServicePrincipal is an IPrincipal, to jsii; its stub names a parameter differently from the
        # interface's, so pyright finds none (aws/jsii#4541).
        logs_service: iam.IPrincipal = (
            iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com"))  # pyright: ignore[reportAssignmentType]  # jsii stub: aws/jsii#4541
        # CloudWatch Logs encrypts and decrypts for this group only (its documented key policy, less
        # kms:Describe*: no Describe action carries the encryption context, so that grant never held).
        self.key.add_to_resource_policy(iam.PolicyStatement(
            principals=[logs_service],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*"],
            resources=["*"],  # in a key policy, "*" is this key
            conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": group_arn}}))
        # Destroyed with the stack: a kept group of a fixed name would make the next deploy of the
        # same job fail ("already exists"). Export what you need first (README, Logs).
        self.log_group = logs.LogGroup(self, "Group", log_group_name=self.log_group_name, retention=retention,
                                       encryption_key=self.key, removal_policy=cdk.RemovalPolicy.DESTROY)

    def grant_write(self, grantee: iam.IGrantable) -> iam.Grant:
        """What the CloudWatch agent needs to ship a node's lines: its streams in this group only."""
        stack = cdk.Stack.of(self)
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resource_arns=[self.log_group.log_group_arn])
        if isinstance(grantee, Construct):
            cdk.Validations.of(grantee).acknowledge(cdk.Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::<{stack.get_logical_id(resource_of(self.log_group))}.Arn>]",
                reason="the group's ARN as CloudFormation gives it ends in ':*' (its streams); streams are named "
                       "by instance id at run time, and the grant is this job's group only"))
        return grant


class JobDefinition(Construct):
    """The deployer's job, shipped to every node of `cluster` and named by one SSM parameter.

    Keyword-only props (defaults in brackets):
      cluster: the cluster id (names the parameter /dl-launcher/<cluster>/job).
      command [None]: a bash script body run once per generation in the working directory; None:
        nodes unpack the code, run setup and wait for you.
      code [None]: a directory (CodeAsset) or a CodeAsset; every node of a generation runs the
        same digest, unpacked into the working directory (contract.work_dir()).
      setup [None]: a bash script body run once per boot per code digest before the first
        generation, in the working directory (pip install -r requirements.txt).
      env [{}]: environment variables every rank gets (names as env_problem allows).
      secrets [{}]: NAME -> Secrets Manager secret or SSM parameter ARN, read on the node at
        each run; the value never appears in the template, user data, logs or status.
      secrets_kms [()]: KMS key ARNs that encrypt those secrets (kms:Decrypt through
        Secrets Manager and SSM only).
      image [None]: run the command in this container image (ECR or a public registry) with every
        GPU, the EFA devices and the host network; not with setup (build it into the image).
      data [()]: s3://bucket/prefix datasets, staged onto every node's scratch RAID at
        DL_DATA_DIR/bucket/prefix before the first generation (runtime/staging.py); the node role
        may read exactly those prefixes.
      data_owner [the stack's account]: the 12-digit account that owns the data buckets; the
        node role's reads hold only for buckets of that account (s3:ResourceAccount, checked by S3
        on every request, the AWS CLI's sync included), so a bucket name someone else registers
        is never read.
      checkpoint_dir [None]: where the command's framework writes its own checkpoints, relative
        to the working directory (an HF output_dir, a Lightning dirpath): every checkpoint it
        completes there is the job's (uploaded, and restored there before each generation),
        without Checkpointer (runtime/framework_checkpoints.py).
      restart ["torchrun"]: "in-process": the supervisor runs the command once per rank and a
        survivor of a peer's death keeps its ranks' processes (runtime/ranks.py, inprocess.py).

    Attributes: parameter (ssm.StringParameter), definition (s3_assets.Asset), sha256, code
    (CodeAsset or None), env_names, image.
    `grant_run(role)`: read the parameter, the two objects, the secrets (and their keys) and the
    image's ECR repository; nothing wider.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: str, command: Optional[str] = None,
                 code: Optional[str | CodeAsset] = None, setup: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, secrets: Optional[Mapping[str, str]] = None,
                 secrets_kms: Sequence[str] = (), image: Optional[str] = None, data: Sequence[str] = (),
                 checkpoint_dir: Optional[str] = None, data_owner: Optional[str] = None,
                 restart: str = "torchrun") -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        region = None if cdk.Token.is_unresolved(stack.region) else stack.region
        env, secrets = dict(env or {}), dict(secrets or {})
        for name in [*env, *secrets]:
            problem = env_problem(name)
            if problem:
                raise ConfigurationError(f"environment variable {problem}")
        both = sorted(set(env) & set(secrets))
        if both:
            raise ConfigurationError(f"{', '.join(both)} is both an env value and a secret: name it once")
        for name, arn in secrets.items():
            problem = secret_problem(arn, region)
            if problem:
                raise ConfigurationError(f"secret {name}={arn}: {problem}")
        for key in secrets_kms:
            if not KMS_ARN.match(key):
                raise ConfigurationError(f"secrets_kms {key!r}: expected a key ARN like "
                                         "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab")
        if image is not None and image_problem(image):
            raise ConfigurationError(f"image {image!r}: {image_problem(image)}")
        if image and setup:
            raise ConfigurationError("image and setup together: a container starts fresh for every run, so setup "
                                     "would not last; build what setup does into the image")
        problem = data_list_problem(data)
        if problem:
            raise ConfigurationError(problem)
        self.data = tuple(data_source(u) for u in data)
        if data_owner is not None and not re.fullmatch(r"[0-9]{12}", data_owner):
            raise ConfigurationError(f"data_owner {data_owner!r} is not an AWS account id (12 digits)")
        self.data_owner = data_owner or stack.account
        for label, text in (("command", command), ("setup", setup)):
            if text is not None and (cdk.Token.is_unresolved(text) or not text.strip()):
                raise ConfigurationError(f"{label}: a bash script body known at synth (not empty, not a token)")
        self.code = code if isinstance(code, CodeAsset) or code is None else CodeAsset(self, "Code", path=code)
        problem = checkpoint_dir_problem(checkpoint_dir) if checkpoint_dir is not None else None
        problem = problem or (shipped_overlap(checkpoint_dir, [rel for rel, _ in self.code.files.files])
                              if checkpoint_dir and self.code else None)
        if problem:
            raise ConfigurationError(problem)
        self.checkpoint_dir = normalized(checkpoint_dir) if checkpoint_dir else None
        if restart not in contract.RESTARTS:
            raise ConfigurationError(f"restart {restart!r}: allowed {', '.join(contract.RESTARTS)}")
        self.restart = restart
        self.cluster = cluster
        self.command = command  # None: nodes that wait for you (the job never ends by itself)
        self.image, self.env_names, self.secrets, self.secrets_kms = image, sorted(env), secrets, tuple(secrets_kms)
        body = definition_bytes(command=command, setup=setup, env=env, secrets=secrets, image=image,
                                code=({"sha256": self.code.digest.sha256, "files": self.code.digest.files,
                                       "bytes": self.code.digest.bytes} if self.code else None),
                                data=[f"s3://{b}/{p}" for b, p in self.data], checkpoint_dir=self.checkpoint_dir)
        self.sha256 = hashlib.sha256(body).hexdigest()
        self.definition = s3_assets.Asset(self, "Definition", path=_write_temp(body, "job.json"),
                                          display_name="dl-launcher job definition")
        acknowledge_asset_parameters(self)
        self.revision = {"definition": self.definition.s3_object_url, "sha256": self.sha256,
                         "code": self.code.url if self.code else None}
        self.parameter_name = contract.job_parameter(cluster)
        self.parameter = ssm.StringParameter(
            self, "Revision", parameter_name=self.parameter_name, simple_name=False,
            string_value=stack.to_json_string(self.revision),
            description=f"the job revision every {cluster} node runs at its next generation (dl-launcher)")

    def node_env(self) -> dict[str, str]:
        """What node.env carries: where the parameter is, and the revision the node boots with."""
        return {"DL_JOB_PARAMETER": self.parameter_name,
                "DL_JOB_DEFINITION_URL": self.definition.s3_object_url, "DL_JOB_DEFINITION_SHA256": self.sha256,
                **({"DL_JOB_CODE_URL": self.code.url} if self.code else {}),
                **({contract.ENV_RESTART: self.restart} if self.restart != contract.RESTARTS[0] else {})}

    def grant_read_data(self, grantee: iam.IGrantable) -> None:
        """Read-only access to exactly the `data` prefixes (none without data)."""
        if not self.data:
            return
        for statement in _data_grants(cdk.Stack.of(self), self.data, self.data_owner):
            grantee.grant_principal.add_to_principal_policy(statement)
        if isinstance(grantee, Construct):
            for bucket, prefix in self.data:
                cdk.Validations.of(grantee).acknowledge(cdk.Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket}/{prefix}*]",
                    reason=f"s3:GetObject under the dataset prefix s3://{bucket}/{prefix} that the deployer named "
                           "(-c data): every object under it is staged, nothing else in the bucket is readable"))

    def grant_run(self, grantee: iam.IGrantable) -> None:
        stack = cdk.Stack.of(self)
        # GetParameter alone (grant_read adds the parameter's history and DescribeParameters).
        iam.Grant.add_to_principal(grantee=grantee, actions=["ssm:GetParameter"],
                                   resource_arns=[self.parameter.parameter_arn])
        iam.Grant.add_to_principal(grantee=grantee, actions=["s3:GetObject"], resource_arns=[
            self.definition.bucket.arn_for_objects(self.definition.s3_object_key)])
        if self.code:
            self.code.grant_fetch(grantee)
        self.grant_read_data(grantee)
        by_service: dict[str, list[str]] = {}
        for arn in self.secrets.values():
            by_service.setdefault(arn.split(":")[2], []).append(secret_resource(arn))
        if by_service.get("secretsmanager"):
            iam.Grant.add_to_principal(grantee=grantee, actions=["secretsmanager:GetSecretValue"],
                                       resource_arns=sorted(by_service["secretsmanager"]))
        if by_service.get("ssm"):
            iam.Grant.add_to_principal(grantee=grantee, actions=["ssm:GetParameter"],
                                       resource_arns=sorted(by_service["ssm"]))
        if self.secrets_kms:
            iam.Grant.add_to_principal(grantee=grantee, actions=["kms:Decrypt"], resource_arns=list(self.secrets_kms),
                                       conditions={"StringEquals": {"kms:ViaService": [
                                           f"secretsmanager.{stack.region}.amazonaws.com",
                                           f"ssm.{stack.region}.amazonaws.com"]}})
        acks = []
        for arn in by_service.get("secretsmanager", []):
            if arn.endswith("-??????"):
                acks.append((f"AwsSolutions-IAM5[Resource::{arn}]",
                             "a secret named without its six-character suffix: IAM matches exactly those six"))
        image = self.image
        registry = ecr_registry(image) if image else None
        if image and registry:
            account, region = registry[0].split(".")[0], registry[1]
            repo = image.split("/", 1)[1].split("@")[0].rsplit(":", 1)[0] if "/" in image else ""
            repo_arn = f"arn:{stack.partition}:ecr:{region}:{account}:repository/{repo}"
            iam.Grant.add_to_principal(grantee=grantee, resource_arns=[repo_arn], actions=[
                "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"])
            iam.Grant.add_to_principal(grantee=grantee, actions=["ecr:GetAuthorizationToken"], resource_arns=["*"])
            acks.append(("AwsSolutions-IAM5[Resource::*]",
                         "ecr:GetAuthorizationToken supports no resource-level permission; pulls are held to the "
                         f"job's one repository ({repo})"))
        if isinstance(grantee, Construct):
            for rule, reason in acks:
                cdk.Validations.of(grantee).acknowledge(cdk.Acknowledgment(id=rule, reason=reason))


def _data_grants(stack: cdk.Stack, sources: Sequence[tuple[str, str]], owner: str) -> list[iam.PolicyStatement]:
    """Read-only, exactly the prefixes: GetObject under each, ListBucket only with each prefix;
    only in buckets `owner` owns (a bucket ARN names no account: s3:ResourceAccount does)."""
    by_bucket: dict[str, list[str]] = {}
    for bucket, prefix in sources:
        by_bucket.setdefault(bucket, []).append(prefix)
    owned = {"StringEquals": {"s3:ResourceAccount": owner}}
    objects = [f"arn:{stack.partition}:s3:::{b}/{p}*" for b, ps in by_bucket.items() for p in ps]
    out = [iam.PolicyStatement(actions=["s3:GetObject"], resources=objects, conditions=owned)]
    for bucket, prefixes in by_bucket.items():
        listing = {"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}} if all(prefixes) else {}
        out.append(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[f"arn:{stack.partition}:s3:::{bucket}"],
            conditions={**owned, **listing}))
    return out


def _write_temp(data: bytes, name: str) -> str:
    root = tempfile.mkdtemp(prefix="dl-launcher-job-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    path = os.path.join(root, name)
    with open(path, "wb") as f:
        f.write(data)
    return path

