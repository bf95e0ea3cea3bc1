"""FSx for Lustre over the job's S3 prefixes, for data bigger than a node's NVMe or read by every
node at once (-c data_mode=fsx).

One PERSISTENT_2 file system (Lustre 2.15, SSD) in the cluster's subnet, one data repository
association per prefix at /BUCKET/PREFIX, so that every node sees the same paths under
DL_DATA_DIR as staging gives it. Metadata is imported when the association is created and kept
in step with the bucket (new, changed and deleted objects); file contents load lazily on first
read, then come from Lustre. Only the nodes reach it: its security group admits Lustre's ports
(TCP 988 and 1018-1023) from the nodes' group and from itself, nothing else. FSx reads the
bucket through its own service-linked role; the node role gets no S3 grant for the data.
"""
from __future__ import annotations

from typing import Sequence

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_fsx as fsx
from constructs import Construct

from .job_rules import data_list_problem
from .runtime.staging import data_source
from .validation import ConfigurationError

THROUGHPUTS = (125, 250, 500, 1000)  # MB/s per TiB, PERSISTENT_2 SSD
MIN_GIB, STEP_GIB = 1200, 2400       # 1,200 GiB, 2,400 GiB, then steps of 2,400 GiB
# FSx's default per-account quota for PERSISTENT_2 SSD storage in a region (98.4 TiB), which is
# also SageMaker HyperPod's ceiling for a cluster's Lustre (FSxLustreConfig.SizeInGiB); a dataset
# cache past it is a typo far more often than a raised quota.
MAX_GIB = 100_800
MAX_ASSOCIATIONS = 8                 # data repository associations per file system
LUSTRE_PORTS = ((988, 988), (1018, 1023))


def throughput_problem(throughput: int) -> str | None:
    if throughput in THROUGHPUTS:
        return None
    closest = min(THROUGHPUTS, key=lambda t: abs(t - throughput))
    return f"allowed {', '.join(map(str, THROUGHPUTS))} MB/s per TiB; closest: {closest}"


def associations_problem(prefixes: int) -> str | None:
    if prefixes <= MAX_ASSOCIATIONS:
        return None
    return (f"data names {prefixes} prefixes; an FSx for Lustre file system links at most {MAX_ASSOCIATIONS}: name a "
            "common parent prefix")


def capacity_problem(gib: int) -> str | None:
    if gib > MAX_GIB:
        return (f"{gib} GiB: above {MAX_GIB} GiB, FSx's default per-account quota for PERSISTENT_2 storage in a "
                f"region; closest: {MAX_GIB}")
    if gib == MIN_GIB or (gib >= STEP_GIB and gib % STEP_GIB == 0):
        return None
    up = MIN_GIB if gib < MIN_GIB else max(STEP_GIB, -(-gib // STEP_GIB) * STEP_GIB)
    return f"{gib} GiB: FSx for Lustre (PERSISTENT_2) takes 1200, 2400 or a multiple of 2400 GiB; closest above: {up}"


class LustreData(Construct):
    """FSx for Lustre linked to `data`, for the nodes that `attach` is given.

    Keyword-only props (defaults in brackets):
      vpc, subnet: the cluster's VPC and its one subnet (the nodes' AZ: cross-AZ traffic is
        slower and billed).
      data: s3://bucket/prefix URIs, one data repository association each (at most 8).
      storage_gib [1200]: 1200, 2400 or a multiple of 2400.
      throughput [125]: MB/s per TiB of storage: 125, 250, 500 or 1000.
    Attributes: file_system, security_group, dns_name, mount_name, associations, storage_gib,
      throughput, throughput_mbs (the whole file system's baseline, MB/s).
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, subnet: ec2.ISubnet,
                 data: Sequence[str], storage_gib: int = MIN_GIB, throughput: int = 125) -> None:
        super().__init__(scope, construct_id)
        if not data:
            raise ConfigurationError("LustreData needs at least one s3:// prefix (data)")
        problem = data_list_problem(data) or associations_problem(len(data))
        if problem:
            raise ConfigurationError(problem)
        sources = [data_source(u) for u in data]
        problem = capacity_problem(storage_gib)
        if problem:
            raise ConfigurationError(f"storage_gib {problem}")
        problem = throughput_problem(throughput)
        if problem:
            raise ConfigurationError(f"throughput {throughput}: {problem}")
        self.storage_gib, self.throughput = storage_gib, throughput
        self.throughput_mbs = storage_gib * throughput // 1000  # as FSx counts it: 1,200 GiB is 1.2 TiB
        self.security_group = ec2.SecurityGroup(self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
                                                description="FSx for Lustre of the job data - Lustre from the nodes only")
        for low, high in LUSTRE_PORTS:
            # The file servers talk to each other (LustreFileSystem itself admits its own group in).
            self.security_group.add_egress_rule(self.security_group, _ports(low, high), "Lustre between file servers")
        self.file_system = fsx.LustreFileSystem(
            self, "FileSystem", vpc=vpc, vpc_subnet=subnet, storage_capacity_gib=storage_gib,
            security_group=self.security_group, file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            # A cache of the bucket: the objects stay in S3, so nothing is lost with the stack.
            removal_policy=cdk.RemovalPolicy.DESTROY,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2, per_unit_storage_throughput=throughput,
                data_compression_type=fsx.LustreDataCompressionType.LZ4))
        self.dns_name = self.file_system.dns_name
        self.mount_name = self.file_system.mount_name
        self.associations = []
        for i, (bucket, prefix) in enumerate(sources):
            self.associations.append(fsx.CfnDataRepositoryAssociation(
                self, f"Link{i}", file_system_id=self.file_system.file_system_id,
                file_system_path=f"/{bucket}/{prefix}".rstrip("/"), data_repository_path=f"s3://{bucket}/{prefix}",
                batch_import_meta_data_on_create=True,
                s3=fsx.CfnDataRepositoryAssociation.S3Property(
                    auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                        events=["NEW", "CHANGED", "DELETED"]))))

    def allow_from(self, nodes: ec2.ISecurityGroup) -> None:
        """Lustre between `nodes` and the file system on its ports only: clients and servers both
        open connections (FSx for Lustre's documented rules), so each group admits the other."""
        for low, high in LUSTRE_PORTS:
            ports = _ports(low, high)
            self.security_group.add_ingress_rule(nodes, ports, "Lustre from the cluster nodes")
            self.security_group.add_egress_rule(nodes, ports, "Lustre to the cluster nodes")
            nodes.add_ingress_rule(self.security_group, ports, "Lustre from the job FSx file system")
            nodes.add_egress_rule(self.security_group, ports, "Lustre to the job FSx file system")

    def node_env(self) -> dict[str, str]:
        """What node.env carries: the node mounts the file system at DL_DATA_DIR before setup."""
        return {"DL_FSX_DNS": self.dns_name, "DL_FSX_MOUNT_NAME": self.mount_name}


def _ports(low: int, high: int) -> ec2.Port:
    return ec2.Port.tcp(low) if low == high else ec2.Port.tcp_range(low, high)
