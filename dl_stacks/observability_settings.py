"""The training stack's observability context keys, validated into one value object.

    observability   true|false   the CloudWatch agent, the node monitor, the dashboard and the
                                 alarms (default: true, every profile)
    idle_guard      true|false   stop the cluster when every GPU idles (default: as observability)
    idle_minutes    10..1440     how long every GPU must stay idle (default: the profile's workload,
                                 GUARD_DEFAULTS: 30 training, 60 development and inference)
    idle_threshold  0.5..50      GPU utilisation in percent under which a GPU counts as idle (default:
                                 5 training and development, 2 inference)
    idle_action     stop|notify  stop: push checkpoints, release the nodes (resumable), tell the topic;
                                 notify: only tell (default stop)
    interactive     true|false   a development cluster: the idle guard counts an open Session Manager
                                 session or a process on a GPU as work (default: true when there is
                                 no command)
    idle_warning    0..240       minutes between the guard's warning (topic and job log) and its
                                 action (default 15 for interactive clusters and inference, 0 for
                                 training)
    alarm_topic     an SNS topic ARN in the stack's region for the guard and the alarms (default:
                                 a new encrypted topic; subscribe to it)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dl_selector.errors import UserError
from dl_selector.profiles import Profile

from .context_values import boolean, choice, number, show, whole

KEYS = ("observability", "idle_guard", "idle_minutes", "idle_threshold", "idle_action", "alarm_topic", "interactive",
        "idle_warning")
BOOL_KEYS = ("observability", "idle_guard", "interactive")
NUMBER_KEYS = ("idle_minutes", "idle_threshold", "idle_warning")
EXAMPLES = {"observability": "true", "idle_guard": "false", "idle_minutes": "60", "idle_threshold": "5",
            "interactive": "true", "idle_warning": "15",
            "idle_action": "notify", "alarm_topic": "arn:aws:sns:us-east-1:123456789012:ml-alerts"}
IDLE_MINUTES = (10, 1440)
IDLE_THRESHOLD = (0.5, 50.0)
IDLE_WARNING = (0, 240)
INTERACTIVE_WARNING = 15  # minutes: time to save a notebook and say so
# What "idle" means for each workload: (idle_minutes, idle_threshold %, idle_warning minutes).
# Training: its GPUs are busy while it runs, and the guard also needs it to make no progress.
# Development: someone thinks between runs (the guard also counts sessions and GPU processes).
# Inference: a server with no requests keeps its model loaded at ~0%, and traffic comes in bursts:
# a longer window, a lower threshold (one request lifts it), and a warning before the stop.
GUARD_DEFAULTS = {"training": (30, 5.0, 0), "development": (60, 5.0, INTERACTIVE_WARNING),
                  "inference": (60, 2.0, INTERACTIVE_WARNING)}
ACTIONS = ("stop", "notify")
_TOPIC = re.compile(r"arn:aws(?:-cn|-us-gov)?:sns:(?P<region>[a-z0-9-]+):\d{12}:[A-Za-z0-9_-]{1,256}(?:\.fifo)?", re.ASCII)


@dataclass(frozen=True)
class ObservabilitySettings:
    enabled: bool = True
    idle_guard: bool = True
    idle_minutes: int = 30
    idle_threshold: float = 5.0
    idle_action: str = "stop"
    alarm_topic: Optional[str] = None
    interactive: bool = False
    idle_warning: int = 0


def observability_from_context(ctx: Mapping[str, Any], profile: Profile, region: str,
                               has_command: bool = True) -> ObservabilitySettings:
    """Keys already passed the shared type and text checks (settings.py)."""
    enabled = boolean("observability", ctx.get("observability", True))
    minutes_default, threshold_default, warning_default = GUARD_DEFAULTS.get(profile.workload, GUARD_DEFAULTS["training"])
    guard = boolean("idle_guard", ctx.get("idle_guard", enabled))
    if guard and not enabled:
        raise UserError("context idle_guard=true needs observability=true: the guard reads the GPU metrics "
                        "the CloudWatch agent sends; closest: idle_guard=false")
    minutes = whole("idle_minutes", ctx.get("idle_minutes", minutes_default), *IDLE_MINUTES)
    threshold = number(ctx.get("idle_threshold", threshold_default))
    lo, hi = IDLE_THRESHOLD
    if threshold is None or not lo <= threshold <= hi:
        near = None if threshold is None or threshold != threshold else min(max(threshold, lo), hi)
        raise UserError(f"context idle_threshold={show(ctx.get('idle_threshold'))}: GPU utilisation in percent, "
                        f"allowed {lo:g} to {hi:g}" + (f"; closest: {near:g}" if near is not None else "; e.g. idle_threshold=5"))
    action = choice("idle_action", ctx.get("idle_action", "stop"), ACTIONS)
    interactive = boolean("interactive", ctx.get("interactive", not has_command))
    warning = whole("idle_warning", ctx.get("idle_warning", max(warning_default, INTERACTIVE_WARNING if interactive else 0)),
                   *IDLE_WARNING)
    topic = None
    if "alarm_topic" in ctx:
        topic = str(ctx["alarm_topic"]).strip()
        m = _TOPIC.fullmatch(topic)
        if not m:
            raise UserError(f"context alarm_topic={show(topic)}: expected an SNS topic ARN, "
                            f"e.g. alarm_topic={EXAMPLES['alarm_topic']}")
        if m.group("region") != region:
            raise UserError(f"context alarm_topic={show(topic)} is in {m.group('region')}, the stack in {region}: "
                            "CloudWatch alarms and the guard publish to a topic in their own region; closest: "
                            f"{topic.replace(':' + m.group('region') + ':', ':' + region + ':', 1)}")
    return ObservabilitySettings(enabled=enabled, idle_guard=guard, idle_minutes=minutes, idle_threshold=threshold,
                                 idle_action=action, alarm_topic=topic, interactive=interactive, idle_warning=warning)
