"""The training stack: the selector's pick for a profile, composed into deployable infrastructure."""
from __future__ import annotations

import aws_cdk as cdk
from constructs import Construct

from .selection import Selection, select
from .settings import Settings


def _money(v: float | None) -> str:
    return f"${v:,.2f}/h" if v is not None else "no price on record"


class TrainingStack(cdk.Stack):
    """Nodes of the profile's pick (or `instance_type`), with the outputs a user needs first."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, selection: Selection,
                 **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.selection = selection
        pick = selection.pick
        od, sp = selection.hourly(settings.nodes)
        cdk.CfnOutput(self, "InstanceType", value=pick.instance_type,
                      description=f"profile {settings.profile.name}: {selection.recommendation.why}"[:1000])
        cdk.CfnOutput(self, "Alternates", value=",".join(c.instance_type for c in selection.alternates) or "none")
        cdk.CfnOutput(self, "ClusterCostPerHour",
                      value=f"{settings.nodes} x {pick.instance_type}: on-demand {_money(od)}, spot {_money(sp)}")

    @classmethod
    def for_settings(cls, app: cdk.App, settings: Settings) -> "TrainingStack":
        selection = select(settings)
        name = f"dl-{settings.job}"
        stack = cls(app, name, settings=settings, selection=selection,
                    env=cdk.Environment(region=settings.region),
                    description=f"dl-launcher {settings.profile.name}: {settings.nodes} x {selection.pick.instance_type}")
        print(summary(settings, selection), file=__import__("sys").stderr)
        return stack


def summary(settings: Settings, selection: Selection) -> str:
    pick = selection.pick
    od, sp = selection.hourly(settings.nodes)
    lines = [
        f"dl-launcher: profile {settings.profile.name} in {settings.region}: "
        f"{settings.nodes} x {pick.instance_type} ({pick.facts.accelerator_count} x {pick.facts.accelerator})",
        f"  why: {selection.recommendation.why}",
        f"  cost: on-demand {_money(od)}, spot {_money(sp)} for the whole cluster"
        + ("; launching on spot" if settings.spot else "; launching on-demand"),
        f"  alternates: {', '.join(c.instance_type for c in selection.alternates) or 'none'}",
    ]
    return "\n".join(lines)
