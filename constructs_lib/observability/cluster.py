"""Observability of one training cluster, composed: the agent and the node monitor on every node
type, the dashboard, the starved-GPU and node-health alarms, and the idle guard, all telling one
topic."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, cast

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
from constructs import Construct

from .alarms import CapacityShortAlarm, NodeHealthAlarm, StarvedGpuAlarm
from .dashboard import TrainingDashboard
from .guard import IdleGuard
from .notifications import NotificationTopic

if TYPE_CHECKING:
    from ..capacity import ClusterCapacity


class ClusterObservability(Construct):
    """Keyword-only props (defaults in brackets):
      capacity: the cluster (ClusterCapacity): its node types, spec and controller state.
      log_group: where the guard logs each decision (the stack's alerts log group).
      topic [None]: where the guard and the alarms tell; None: a new NotificationTopic.
      checkpoints [None], checkpoint_prefix [""]: the job's checkpoints (the guard's progress signal).
      idle_guard [True]: stop the cluster when every GPU idles (on Trainium/Inferentia: every
        node's busiest NeuronCore, which the node monitor reads from neuron-monitor).
      idle_minutes [30], idle_threshold [5.0], idle_action ["stop"]: see IdleGuard.
      interactive [False], idle_warning [0]: a development cluster, and minutes of warning before
        the guard acts (see IdleGuard); warnings also go to the cluster's job log group if it has one.
      alarm_status [True]: the dashboard's alarm row (off for moto, whose CloudFormation does not
        create metric-math alarms, so the row's references to them would fail the deploy).
    Attributes: topic, notifications (NotificationTopic or None), dashboard (TrainingDashboard),
    short (CapacityShortAlarm), starved and health (the alarms, NVIDIA types only), guard (IdleGuard or None).
    """

    def __init__(self, scope: Construct, construct_id: str, *, capacity: "ClusterCapacity", log_group: logs.ILogGroup,
                 topic: Optional[sns.ITopic] = None, checkpoints: Optional[s3.IBucket] = None,
                 checkpoint_prefix: str = "", idle_guard: bool = True, idle_minutes: float = 30.0,
                 idle_threshold: float = 5.0, idle_action: str = "stop", alarm_status: bool = True,
                 interactive: bool = False, idle_warning: float = 0.0) -> None:
        super().__init__(scope, construct_id)
        capacity.enable_monitoring()
        self.notifications = None
        if topic is None:
            self.notifications = NotificationTopic(self, "Notifications", display_name="dl-launcher")
            # A Topic is an ITopic, to jsii; its stub names some parameters differently, which hides
            # that from a type checker (aws/jsii#4541).
            topic = cast(sns.ITopic, self.notifications.topic)
        self.topic = topic
        facts = [t.facts for t in capacity.templates]
        pick = facts[0]
        choose = getattr(capacity, "per_choice", None)  # ChoiceCapacity: the type is chosen at deploy
        cuda = all(f.sdk == "cuda" for f in facts)
        # Every cluster, any accelerator: a deploy completes whether or not EC2 has the capacity.
        self.short = CapacityShortAlarm(self, "CapacityShort", cluster=capacity.cluster,
                                        log_group=capacity.controller_log_group, topic=topic)
        alarms = []
        if cuda:
            self.starved = StarvedGpuAlarm(self, "StarvedGpu", job=capacity.cluster, topic=topic)
            self.health = NodeHealthAlarm(self, "NodeHealth", job=capacity.cluster, topic=topic, expected_gpus=(
                choose(lambda o, f: f.accelerator_count) if choose else min(f.accelerator_count for f in facts)))
            alarms = [self.starved.alarm, self.health.alarm]
        if choose is not None:
            shown = dict(instance_type=choose(lambda o, f: f.instance_type),
                         gpus_per_node=cdk.Token.as_number(choose(lambda o, f: f.accelerator_count)),
                         price_per_node_hour=cdk.Token.as_number(choose(lambda o, f: o.price)))
        else:
            shown = dict(instance_type=pick.instance_type, gpus_per_node=pick.accelerator_count,
                         price_per_node_hour=capacity.spec["options"][0]["price"] or 0.0)
        self.dashboard = TrainingDashboard(self, "Dashboard", job=capacity.cluster, nodes=capacity.nodes, **shown,
                                           alarms=alarms if alarm_status else ())
        self.guard = None
        job_logs = getattr(capacity, "job_logs", None)  # set by configure_job, if it ran
        neuron = [f.instance_type for f in facts if f.sdk == "neuron"]
        if idle_guard and all(f.sdk in ("cuda", "neuron") for f in facts):
            self.guard = IdleGuard(
                self, "IdleGuard", cluster=capacity.cluster, spec=capacity.spec_json, state_bucket=capacity.state_bucket,
                state_key=capacity.state_key, neuron_types=neuron,
                # A Neuron node reports one series (its busiest NeuronCore), judged as one GPU.
                expected_gpus={f.instance_type: 1 if f.sdk == "neuron" else f.accelerator_count for f in facts},
                topic=topic, log_group=log_group, checkpoints=checkpoints, checkpoint_prefix=checkpoint_prefix,
                threshold_pct=idle_threshold, idle_minutes=idle_minutes, action=idle_action, interactive=interactive,
                warning_minutes=idle_warning, job_log_group=job_logs.log_group if job_logs is not None else None)
        elif idle_guard:
            cdk.Annotations.of(self).add_warning_v2(
                "dl-launcher:idle-guard-unsupported", "the idle guard is off: it reads NVIDIA utilisation (the "
                "CloudWatch agent) or Neuron utilisation (neuron-monitor), and "
                f"{', '.join(sorted({f.instance_type for f in facts if f.sdk not in ('cuda', 'neuron')}))} report neither. Fix: stop an idle cluster "
                "yourself (dl-launcher destroy JOB, or terminate the provisioned product); idle_guard=False "
                "(-c idle_guard=false) says you know")
