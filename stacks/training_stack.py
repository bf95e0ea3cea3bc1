"""The training stack: the selector's pick for a profile, composed into deployable infrastructure."""
from __future__ import annotations

import sys

import aws_cdk as cdk
from constructs import Construct

from constructs_lib import CheckpointBucket, InterruptionAlerts, SpotCapacity
from constructs_lib.runtime.contract import TAG_CLUSTER

from .network import existing_subnets, training_vpc
from .selection import Selection, select
from .settings import Settings


def _money(v: float | None) -> str:
    return f"${v:,.2f}/h" if v is not None else "no price on record"


class TrainingStack(cdk.Stack):
    """N nodes of the profile's pick (or `instance_type`) with its alternates for spot capacity,
    a checkpoint bucket, interruption alerts, rendezvous and the job, in a VPC of one AZ."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, selection: Selection,
                 **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.selection = selection
        pick = selection.pick
        subnets = None
        if settings.subnet_ids:
            self.vpc, subnets = existing_subnets(self, vpc_id=settings.vpc_id, subnet_ids=settings.subnet_ids,
                                                 availability_zone=settings.availability_zone)
        else:
            self.vpc = training_vpc(self, vpc_id=settings.vpc_id, restrict_default_security_group=not settings.local)
        self.cluster = SpotCapacity(
            self, "Cluster", vpc=self.vpc, subnets=subnets, nodes=settings.nodes, spot=settings.spot,
            max_price=settings.max_price,
            instance_types=[pick.facts, *(c.facts for c in selection.alternates)],
            template_props={"root_volume_gib": settings.profile.root_volume_gib})
        self.checkpoints = CheckpointBucket(self, "Checkpoints")
        self.prefix = f"jobs/{settings.job}"
        self.cluster.enable_checkpoints(self.checkpoints, self.prefix)
        cluster_id = f"{construct_id}-{settings.job}"
        self.cluster.configure_job(cluster=cluster_id, command=settings.command)
        self.alerts = InterruptionAlerts(self, "Alerts", group=self.cluster.auto_scaling_group)

        od, sp = selection.hourly(settings.nodes)
        cdk.CfnOutput(self, "InstanceType", value=pick.instance_type,
                      description=f"profile {settings.profile.name}: {selection.recommendation.why}"[:1000])
        cdk.CfnOutput(self, "Alternates", value=",".join(c.instance_type for c in selection.alternates) or "none",
                      description="spot capacity falls back across these (same accelerators per node)")
        cdk.CfnOutput(self, "ClusterCostPerHour",
                      value=f"{settings.nodes} x {pick.instance_type}: on-demand {_money(od)}, spot {_money(sp)}")
        cdk.CfnOutput(self, "CheckpointBucket", value=self.checkpoints.bucket.bucket_name,
                      description=f"checkpoints under s3://<bucket>/{self.prefix}/; kept after cdk destroy")
        cdk.CfnOutput(self, "SsmSessionCommand", value=(
            f"aws ssm start-session --region {self.region} --target $(aws ec2 describe-instances --region {self.region} "
            f"--filters Name=tag:{TAG_CLUSTER},Values={cluster_id} Name=instance-state-name,Values=running "
            "--query 'Reservations[0].Instances[0].InstanceId' --output text)"))
        cdk.CfnOutput(self, "AlertsLogGroup", value=self.alerts.log_group.log_group_name)

    @classmethod
    def for_settings(cls, app: cdk.App, settings: Settings, *, synthesizer: cdk.IStackSynthesizer | None = None,
                     quiet: bool = False) -> "TrainingStack":
        selection = select(settings)
        import os
        # A VPC lookup needs an account; named subnets or a new VPC do not.
        account = os.environ.get("CDK_DEFAULT_ACCOUNT") if settings.vpc_id and not settings.subnet_ids else None
        stack = cls(app, f"dl-{settings.job}", settings=settings, selection=selection, synthesizer=synthesizer,
                    env=cdk.Environment(account=account, region=settings.region),
                    description=f"dl-launcher {settings.profile.name}: {settings.nodes} x {selection.pick.instance_type}")
        if not quiet:
            print(summary(settings, selection), file=sys.stderr)
        return stack


def summary(settings: Settings, selection: Selection) -> str:
    pick = selection.pick
    od, sp = selection.hourly(settings.nodes)
    return "\n".join([
        f"dl-launcher: profile {settings.profile.name} in {settings.region}: "
        f"{settings.nodes} x {pick.instance_type} ({pick.facts.accelerator_count} x {pick.facts.accelerator})",
        f"  why: {selection.recommendation.why}",
        f"  cost: on-demand {_money(od)}, spot {_money(sp)} for the whole cluster"
        + ("; launching on spot" if settings.spot else "; launching on-demand"),
        f"  alternates: {', '.join(c.instance_type for c in selection.alternates) or 'none'}",
        f"  checkpoints: s3://<CheckpointBucket>/jobs/{settings.job}/",
    ])
