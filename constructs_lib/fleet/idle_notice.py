"""What the idle guard remembers between runs and what it tells people before it acts.

The record (contract.guard_state_key, under the controller's CONTROL_DIR, which the nodes may
not write) holds the last judgement and the pending warning: the guard reads it to know whether
it already warned, and `dl-launcher status` reads it to say when the cluster would stop and why.
A warning, a withdrawn warning and the reason go to the job's topic and, as one line each, to
the job's log group (stream contract.GUARD_LOG_STREAM), where the user already reads the
cluster's output.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from ..runtime import contract


@dataclass(frozen=True)
class GuardRecord:
    checked_at: float = 0.0
    mode: str = "job"  # job | interactive
    state: str = ""  # the decision's state: idle | busy | grace | no-data
    reason: str = ""
    act: str = "none"  # the last run's step: none | warn | wait | stop | cancel
    warned_at: Optional[float] = None
    stop_at: Optional[float] = None
    action: str = "stop"  # what the guard does at stop_at: stop | notify
    hints: list[str] = field(default_factory=list)

    def line(self, now: Optional[float] = None) -> str:
        """One line for `dl-launcher status`."""
        now = time.time() if now is None else now
        age = f"{(now - self.checked_at) / 60:.0f} min ago" if self.checked_at else "never"
        head = f"idle guard ({self.mode} cluster, checked {age}): {self.state or 'no judgement yet'}"
        if self.stop_at is not None and self.act in ("warn", "wait"):
            verb = "stops" if self.action == "stop" else "reports it idle"
            return (f"{head}; {verb} at {stamp(self.stop_at)} ({max(0.0, (self.stop_at - now) / 60):.0f} min) unless "
                    f"someone works on it: {self.reason}")
        if self.act == "stop":
            return f"{head}; {'stopped' if self.action == 'stop' else 'reported idle'} at {stamp(self.checked_at)}: {self.reason}"
        return f"{head}: {self.reason}" if self.reason else head


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def load(s3: Any, bucket: str, key: str) -> GuardRecord:
    """The last record, or an empty one (first run, or the record unreadable: no warning given)."""
    if not bucket:
        return GuardRecord()
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        fields = {k: v for k, v in json.loads(body).items() if k in GuardRecord.__dataclass_fields__}
        return GuardRecord(**fields)
    except Exception:  # noqa: BLE001 - NoSuchKey or a damaged record: warn again rather than stop unwarned
        return GuardRecord()


def save(s3: Any, bucket: str, key: str, record: GuardRecord) -> None:
    if bucket:
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(asdict(record), sort_keys=True).encode(),
                      ContentType="application/json")


def warning_text(cluster: str, record: GuardRecord, how: str) -> tuple[str, str]:
    """(subject, message) of a warning."""
    verb = "will be stopped" if record.action == "stop" else "will be reported idle"
    assert record.stop_at is not None
    return (f"dl-launcher: idle cluster {cluster} {verb} at {stamp(record.stop_at)}"[:100],
            f"dl-launcher idle guard: cluster {cluster} {verb} at {stamp(record.stop_at)} "
            f"({(record.stop_at - record.checked_at) / 60:.0f} min from now): {record.reason}.\n"
            f"To keep it: {how}.\n"
            + ("A stopped cluster keeps its checkpoints; start it again with the stack's ResumeCommand."
               if record.action == "stop" else ""))


def cancel_text(cluster: str, record: GuardRecord) -> tuple[str, str]:
    return (f"dl-launcher: cluster {cluster} is in use again; no stop"[:100],
            f"dl-launcher idle guard: the warning for cluster {cluster} is withdrawn: {record.reason}")


def tell(*, sns: Any, logs: Any, topic_arn: str, log_group: str, cluster: str, subject: str, message: str,
         now: float) -> list[str]:
    """The log line first (where the user is reading), then the topic. Returns what failed: a
    notice that cannot be logged still goes to the topic, and the other way round."""
    failed = []
    if log_group and logs is not None:
        try:
            try:
                logs.create_log_stream(logGroupName=log_group, logStreamName=contract.GUARD_LOG_STREAM)
            except logs.exceptions.ResourceAlreadyExistsException:
                pass
            logs.put_log_events(logGroupName=log_group, logStreamName=contract.GUARD_LOG_STREAM,
                                logEvents=[{"timestamp": int(now * 1000), "message": f"[idle-guard] {message}"}])
        except Exception as e:  # noqa: BLE001 - reported in the run's line; the topic still hears
            failed.append(f"log: {' '.join(str(e).split())[:200]}")
    try:
        sns.publish(TopicArn=topic_arn, Subject=subject, Message=message,
                    MessageAttributes={"cluster": {"DataType": "String", "StringValue": cluster}})
    except Exception as e:  # noqa: BLE001
        failed.append(f"topic: {' '.join(str(e).split())[:200]}")
    return failed
