"""Settings -> the instance type to launch, its alternates and the reasons: asked once per synth."""
from __future__ import annotations

from dataclasses import dataclass, replace

from selector.catalog import load_catalog
from selector.errors import UserError
from selector.facts import InstanceFacts
from selector.recommend import Candidate, Recommendation, recommend

from .settings import Settings


@dataclass(frozen=True)
class Selection:
    pick: Candidate
    alternates: tuple[Candidate, ...]
    recommendation: Recommendation

    @property
    def facts(self) -> InstanceFacts:
        return self.pick.facts

    def hourly(self, nodes: int) -> tuple[float | None, float | None]:
        od, sp = self.pick.price_per_hour, self.pick.spot_price_per_hour
        return (od * nodes if od else None, sp * nodes if sp else None)


def select(settings: Settings, max_alternates: int = 4) -> Selection:
    profile = settings.profile
    if settings.multi_node and not profile.multi_node:
        profile = replace(profile, multi_node=True)  # several nodes need EFA and a cluster placement group
    rec = recommend(profile, region=settings.region, spot=settings.spot, catalog=load_catalog())
    if settings.instance_type:
        chosen = [c for c in rec.candidates if c.instance_type == settings.instance_type]
        if not chosen:
            why = next((e.reasons for e in rec.excluded if e.instance_type == settings.instance_type), ())
            raise UserError(
                f"instance_type {settings.instance_type} does not fit profile {profile.name}"
                f"{' with ' + str(settings.nodes) + ' nodes' if settings.multi_node else ''}: {'; '.join(why)}"
                + (f"; the profile's pick is {rec.pick.instance_type}" if rec.pick else ""))
        pick = chosen[0]
    elif rec.pick is None:
        raise UserError(f"{rec.why}; try another profile or region")
    else:
        pick = rec.pick
    # Alternates must be interchangeable with the pick for capacity fallback: same accelerator
    # count and architecture, so the job's world size and the AMI stay valid.
    alternates = tuple(c for c in rec.candidates
                       if c.instance_type != pick.instance_type
                       and c.facts.processes_per_node == pick.facts.processes_per_node
                       and c.facts.architecture == pick.facts.architecture
                       and c.facts.sdk == pick.facts.sdk)[:max_alternates]
    return Selection(pick=pick, alternates=alternates, recommendation=rec)
