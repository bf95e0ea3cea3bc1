"""What the idle guard does once `idle_guard.decide` says stop: push the newest checkpoint from
every node, release the cluster's capacity, tell the team.

1. SSM Run Command on every node of the cluster: `python -m constructs_lib.runtime checkpoint
   push` (the newest complete local save; a node with none has nothing to add), waited for up to
   `push_timeout` seconds. The node agent uploads checkpoints as they are written, so this is
   the last word, not the only copy; a push that fails or times out is reported, and the cluster
   is stopped anyway: an idle cluster costs money every minute and the failure is in the message.
2. The capacity controller's teardown (terminates every node, stores `stopped` first so that
   nothing relaunches them until `resume`).
3. One SNS message with the decision's reason, the push outcome per node and what was terminated.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from .controller import Controller
from .idle_guard import Decision

PUSH_COMMAND = "python3 -m constructs_lib.runtime checkpoint push"
DONE = {"Success", "Failed", "Cancelled", "TimedOut", "Cancelling", "DeliveryTimedOut", "ExecutionTimedOut",
        "Undeliverable", "Terminated", "InvalidPlatform", "AccessDenied"}


@dataclass(frozen=True)
class StopReport:
    cluster: str
    reason: str
    pushed: dict[str, str]  # instance id -> the push's outcome
    terminated: tuple[str, ...]
    message_id: str

    def text(self) -> str:
        lines = [f"dl-launcher idle guard stopped cluster {self.cluster}: {self.reason}"]
        lines += [f"  final checkpoint push on {i}: {outcome}" for i, outcome in sorted(self.pushed.items())]
        lines.append(f"  terminated: {', '.join(self.terminated) or 'nothing was running'}")
        lines.append("  to start it again: python -m constructs_lib.fleet reconcile --spec SPEC --resume "
                     "(the job resumes from its newest complete checkpoint)")
        return "\n".join(lines)


SEND_COMMAND_IDS = 50  # SendCommand's most InstanceIds per call (the SSM API reference)
INVOCATIONS_PER_SECOND = 10.0  # GetCommandInvocation, one per node per look: kept under this


def push_checkpoints(ssm: Any, instance_ids: list[str], *, timeout: float = 300.0, poll: float = 5.0,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                     ) -> dict[str, str]:
    if not instance_ids:
        return {}
    outcome: dict[str, str] = {}
    sent: dict[str, str] = {}  # instance id -> its command id (one command per 50 nodes)
    for i in range(0, len(instance_ids), SEND_COMMAND_IDS):
        part = instance_ids[i:i + SEND_COMMAND_IDS]
        try:
            cmd = ssm.send_command(InstanceIds=part, DocumentName="AWS-RunShellScript",
                                   Comment="dl-launcher idle guard: final checkpoint push",
                                   Parameters={"commands": [PUSH_COMMAND]}, TimeoutSeconds=max(30, int(timeout)))
        except Exception as e:  # SSM unreachable or not allowed: say so, do not keep the cluster billed
            outcome.update({n: f"not sent: {' '.join(str(e).split())[:200]}" for n in part})
            continue
        sent.update({n: cmd["Command"]["CommandId"] for n in part})
    # One GetCommandInvocation per node per look: look less often on a big cluster.
    poll = max(poll, len(sent) / INVOCATIONS_PER_SECOND)
    deadline = clock() + timeout
    while True:
        for i, command_id in sent.items():
            if i in outcome:
                continue
            try:
                inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=i)
            except Exception as e:  # InvocationDoesNotExist right after sending: ask again
                if clock() >= deadline:
                    outcome[i] = f"no answer: {' '.join(str(e).split())[:160]}"
                continue
            if inv.get("Status") in DONE:
                outcome[i] = inv["Status"] if inv["Status"] == "Success" else (
                    f"{inv['Status']}: {' '.join(str(inv.get('StandardErrorContent', '')).split())[-200:]}")
        if len(outcome) == len(instance_ids):
            return outcome
        if clock() >= deadline:
            return {**{i: f"still running after {timeout:.0f} s" for i in instance_ids if i not in outcome}, **outcome}
        sleep(poll)


def stop_idle(decision: Decision, *, controller: Controller, ssm: Any, sns: Any, topic_arn: str,
              instance_ids: list[str], push_timeout: float = 300.0, **push_kw: Any) -> StopReport:
    """Act on a stop decision; refuses any other (the guard's caller must not stop a busy cluster)."""
    if not decision.stop:
        raise ValueError(f"the idle guard decided not to stop ({decision.state}: {decision.reason})")
    pushed = push_checkpoints(ssm, instance_ids, timeout=push_timeout, **push_kw)
    done = controller.teardown(why=f"idle guard: {decision.reason}")
    terminated = tuple(i for t in done if t.kind == "torn-down" for i in t.instances)
    cluster = controller.spec.cluster
    draft = StopReport(cluster, decision.reason, pushed, terminated, "")
    reply = sns.publish(TopicArn=topic_arn, Subject=f"dl-launcher: idle cluster {cluster} stopped"[:100],
                        Message=draft.text(),
                        MessageAttributes={"cluster": {"DataType": "String", "StringValue": cluster}})
    return StopReport(cluster, decision.reason, pushed, terminated, reply["MessageId"])


def report_json(report: StopReport) -> str:
    return json.dumps({"cluster": report.cluster, "reason": report.reason, "pushed": report.pushed,
                       "terminated": list(report.terminated), "message_id": report.message_id})
