"""Synth-time checks in ParallelCluster's style: each rule a small class with a level and a
remediation. Errors stop the synth with one line; warnings become CDK annotations, each naming
what to do; notes are facts of a type the user chose (the synth summary says them once)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from dl_selector.errors import UserError
from dl_selector.facts import InstanceFacts

ERROR, WARNING, NOTE = "error", "warning", "note"


class ConfigurationError(UserError):
    """A node configuration that cannot work. Raised at synth, before anything is deployed."""


@dataclass(frozen=True)
class Finding:
    rule: str
    level: str
    message: str
    remediation: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}. Fix: {self.remediation}"


@dataclass(frozen=True)
class NodeRequest:
    """What a launch template is asked to build, as the validators see it."""

    facts: InstanceFacts
    efa: bool
    multi_node: bool
    public_ip: bool
    interfaces: int
    ami_architecture: Optional[str]
    raid: bool
    subnet_azs: tuple[str, ...] = ()
    placement_group: bool = False


class Validator:
    rule = ""
    level = ERROR
    remediation = ""

    def check(self, r: NodeRequest) -> Optional[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, r: NodeRequest) -> Optional[Finding]:
        message = self.check(r)
        return Finding(self.rule, self.level, message, self.remediation) if message else None


class EfaSupported(Validator):
    rule = "EfaSupported"
    remediation = "pick a type with EFA (python -m dl_selector recommend --profile multi-node-training) or set efa=False"

    def check(self, r):
        if r.efa and not r.facts.efa:
            return f"EFA requested on {r.facts.instance_type}, which has no EFA"


class MultiNodeNeedsEfa(Validator):
    rule = "MultiNodeNeedsEfa"
    remediation = "use one node, or a type with EFA and cluster placement (p4d, p5, p6, trn1, trn2, ...)"

    def check(self, r):
        if r.multi_node and not r.facts.efa:
            return f"multi-node training on {r.facts.instance_type} would run collectives over TCP: it has no EFA"


class PlacementGroupOneAz(Validator):
    rule = "PlacementGroupOneAz"
    remediation = ("give the nodes subnets in a single Availability Zone, e.g. subnets=ec2.SubnetSelection("
                   "availability_zones=[vpc.availability_zones[0]], subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS) "
                   "(a cluster placement group cannot span AZs)")

    def check(self, r):
        azs = {a for a in r.subnet_azs if a}
        if r.placement_group and len(azs) > 1:
            return f"the cluster placement group would span {len(azs)} AZs ({', '.join(sorted(azs))})"


class OnePublicIpInterface(Validator):
    rule = "PublicIpWithSeveralInterfaces"
    remediation = "run EFA nodes in private subnets and reach them with SSM Session Manager"

    def check(self, r):
        if r.public_ip and r.interfaces > 1:
            return f"a public IP cannot be requested at launch with {r.interfaces} network interfaces"


class AmiArchitecture(Validator):
    rule = "AmiArchitecture"
    remediation = "use an AMI built for the instance's architecture (DeepLearningAmi picks it from the instance type)"

    def check(self, r):
        if r.ami_architecture and r.ami_architecture not in r.facts.architectures:
            return (f"an {r.ami_architecture} AMI cannot boot {r.facts.instance_type} "
                    f"({'/'.join(r.facts.architectures)})")


class RaidNeedsInstanceStore(Validator):
    # How the type is, not a mistake: said once in the summary, never a warning that teaches
    # people to skip warnings (most G and Inf types have no instance store).
    rule = "RaidNeedsInstanceStore"
    level = NOTE
    remediation = "for fast local data, pick a type with NVMe: recommend lists 'NVMe (GB)'"

    def check(self, r):
        if r.raid and not r.facts.nvme:
            return f"{r.facts.instance_type} has no instance-store NVMe: /scratch is on the root volume"


class RetiredType(Validator):
    rule = "RetiredType"
    level = WARNING
    remediation = "move to a current type"

    def check(self, r):
        if r.facts.retired:
            return f"{r.facts.instance_type} is retired by AWS; successors: {', '.join(r.facts.successors)}"


VALIDATORS: tuple[Validator, ...] = (
    EfaSupported(), MultiNodeNeedsEfa(), PlacementGroupOneAz(), OnePublicIpInterface(), AmiArchitecture(),
    RaidNeedsInstanceStore(), RetiredType(),
)


def validate(request: NodeRequest, validators: Iterable[Validator] = VALIDATORS) -> list[Finding]:
    """All findings; raises ConfigurationError with the first error (one line) if there is one."""
    findings = [f for f in (v(request) for v in validators) if f]
    errors = [f for f in findings if f.level == ERROR]
    if errors:
        raise ConfigurationError(str(errors[0]) + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return findings
