"""The controller's memory between invocations: one JSON object in S3 that also holds its lease.

    s3://<state_bucket>/<state_key>    ControllerState, with lease_until

Why a lease: EventBridge invokes the Lambda concurrently (a node loss is several events at once),
and two runs that each saw "no capacity" could each launch a different type. A run takes the
lease by writing the state back with `lease_until` set, conditional on the ETag it read
(If-Match; If-None-Match: * for the first write ever), so of several runs exactly one wins; the
others do nothing: the holder, the next event or the 1-minute schedule sees what their events
were about. Every later write is conditional on the holder's last ETag, so a run whose lease was
taken over cannot overwrite the new holder's state (fencing). The holder starts no EC2 change
near the end of its lease (the controller checks before each), so an expired lease means its
holder has stopped acting, and taking it over is safe.

One object, so the function's role needs s3:GetObject and s3:PutObject on that key only, plus
s3:ListBucket on the bucket (without it S3 answers a missing key with 403, not 404). It lives
outside every job's prefix (contract.capacity_state_key), where the bucket policy denies the
nodes: a node that could write it could hold the lease for ever and keep teardown, the idle
guard and the budget stop from stopping its cluster. Even so, nothing read here is trusted: a
state that is not what this module writes is set aside and rebuilt from EC2, and a lease further
ahead than any run takes is treated as expired.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from dl_core.aws import error_code

HISTORY = 200
# Longer than any one reconcile needs (a few CreateFleet calls); the Lambda's timeout must exceed
# it (plus a teardown's own work), so that a teardown can wait out a running reconcile.
LEASE_SECONDS = 120.0


@dataclass
class ControllerState:
    cluster: str = ""
    instance_type: Optional[str] = None   # the cluster's current option; None while nothing runs
    loss_since: Optional[float] = None    # when fewer than `nodes` were first seen
    stopped: bool = False                 # torn down: reconcile launches nothing until resumed
    # Instances this controller launched in the last minute: DescribeInstances is eventually
    # consistent, and a launch it does not show yet must not look like missing capacity.
    recent: dict[str, dict[str, Any]] = field(default_factory=dict)
    noticed: dict[str, float] = field(default_factory=dict)  # spot interruption warnings: id -> when
    history: list[dict[str, Any]] = field(default_factory=list)
    updated_at: Optional[float] = None
    lease_until: float = 0.0              # a reconcile or teardown is under way until then
    # Why the cluster cannot launch, while it cannot (shortfall.py): since, what, kind, error, next.
    short: Optional[dict[str, Any]] = None
    # The cluster's instances at the last reconcile: an EC2 event naming any other instance is
    # dropped before any EC2 call (the region's every state change wakes every controller).
    members: list[str] = field(default_factory=list)
    # Where the job's end is read and what is done then (job_end.JobEndWatch's fields), as the
    # controller last had it; None: a job without a command, which never ends (status says so).
    job: Optional[dict[str, Any]] = None
    # How the job ended (job_end.JobEnd.to_dict() and the on_end acted on): nothing is launched
    # or replaced while it is set; a resume clears it and looks at the nodes' records again.
    ended: Optional[dict[str, Any]] = None

    def record(self, transition: dict[str, Any]) -> None:
        self.history.append(transition)
        del self.history[:-HISTORY]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ControllerState":
        """The state as stored; StateCorrupt for anything this module would not have written."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise StateCorrupt(f"not JSON: {e}") from None
        if not isinstance(data, dict):
            raise StateCorrupt(f"a JSON {type(data).__name__}, not an object")
        known = set(cls.__dataclass_fields__)
        state = cls(**{k: v for k, v in data.items() if k in known})
        problem = _schema_problem(state)
        if problem:
            raise StateCorrupt(problem)
        return state


class StateCorrupt(ValueError):
    """A stored state that this module did not write as it stands."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _schema_problem(s: ControllerState) -> Optional[str]:
    checks = [
        ("cluster", isinstance(s.cluster, str)),
        ("instance_type", s.instance_type is None or isinstance(s.instance_type, str)),
        ("loss_since", s.loss_since is None or _number(s.loss_since)),
        ("stopped", isinstance(s.stopped, bool)),
        ("recent", isinstance(s.recent, dict) and all(
            isinstance(k, str) and isinstance(r, dict) and _number(r.get("at")) and isinstance(r.get("instance_type"), str)
            and isinstance(r.get("subnet"), str) for k, r in s.recent.items())),
        ("noticed", isinstance(s.noticed, dict) and all(isinstance(k, str) and _number(v) for k, v in s.noticed.items())),
        ("history", isinstance(s.history, list) and all(isinstance(h, dict) for h in s.history)),
        ("updated_at", s.updated_at is None or _number(s.updated_at)),
        ("lease_until", _number(s.lease_until)),
        ("members", isinstance(s.members, list) and all(isinstance(m, str) for m in s.members)),
        ("short", s.short is None or (isinstance(s.short, dict) and _number(s.short.get("since")) and all(
            isinstance(s.short.get(k), str) for k in ("what", "kind", "error", "next")))),
        ("job", s.job is None or (isinstance(s.job, dict) and all(isinstance(s.job.get(k), str)
                                                                   for k in ("bucket", "prefix", "on_end")))),
        ("ended", s.ended is None or (isinstance(s.ended, dict) and s.ended.get("kind") in ("finished", "failed")
                                      and _number(s.ended.get("at")))),
    ]
    bad = [name for name, ok in checks if not ok]
    return f"fields of the wrong type or shape: {', '.join(bad)}" if bad else None


class LeaseLost(Exception):
    """Another run took the lease over (this one outlived it): its state is not this run's to write."""


@dataclass(frozen=True)
class Lease:
    until: float
    etag: str   # of the holder's last write: the next must match it


# 412: the condition failed; 409: S3 saw another conditional write to the key at the same moment;
# NoSuchKey: an If-Match write to a key that is gone.
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409", "NoSuchKey")


class StateStore:
    """ControllerState and its lease in S3 (`s3` is a boto3 S3 client)."""

    def __init__(self, s3: Any, bucket: str, key: str) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.key = key
        # Why the stored state was set aside on the last read (the controller logs it), or None.
        self.problem: Optional[str] = None

    def _read(self) -> tuple[Optional[ControllerState], Optional[str]]:
        try:
            r = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as e:
            if error_code(e) in ("NoSuchKey", "404"):
                return None, None
            raise
        body = r["Body"].read()
        try:
            return ControllerState.from_json(body.decode(errors="replace")), r["ETag"]
        except StateCorrupt as e:
            # Rebuilt from EC2 by the controller (its type is what the cluster runs); the write
            # that follows is still conditional on this object's ETag.
            self.problem = f"s3://{self.bucket}/{self.key} set aside ({len(body)} bytes): {e}"
            return ControllerState(), r["ETag"]

    def _write(self, state: ControllerState, **condition: str) -> str:
        return self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=state.to_json().encode(),
                                  ContentType="application/json", **condition)["ETag"]

    def load(self) -> Optional[ControllerState]:
        """The stored state (whoever holds the lease), or None before the controller's first run."""
        return self._read()[0]

    def acquire(self, now: float, seconds: float = LEASE_SECONDS) -> Optional[tuple[Lease, ControllerState]]:
        """The lease until now + seconds and the state, or None while another run holds a valid lease."""
        state, etag = self._read()
        if state is not None and state.lease_until > now + 2 * seconds:
            # No run takes a lease that long: not one of ours, or a clock gone wrong. Expired.
            self.problem = (f"a lease until {state.lease_until:.0f}, {state.lease_until - now:.0f} s ahead: no run "
                            f"takes more than {seconds:.0f} s; taken over")
            state.lease_until = 0.0
        if state is not None and state.lease_until > now:
            return None
        state = state or ControllerState()
        state.lease_until = now + seconds
        try:
            new = self._write(state, **({"IfMatch": etag} if etag else {"IfNoneMatch": "*"}))
        except Exception as e:
            if error_code(e) in _LOST_RACE:
                return None
            raise
        return Lease(state.lease_until, new), state

    def wait_for_lease(self, clock: Callable[[], float], *, poll: float = 2.0,
                       patience: float = LEASE_SECONDS + 30) -> tuple[Lease, ControllerState]:
        """The lease and the state, waiting out a holder (whose lease ends within LEASE_SECONDS)."""
        give_up = time.monotonic() + patience
        while True:
            got = self.acquire(clock())
            if got:
                return got
            if time.monotonic() > give_up:
                raise TimeoutError(f"the lease on s3://{self.bucket}/{self.key} stayed held for {patience:.0f} s")
            time.sleep(poll)

    def overwrite(self, state: ControllerState) -> None:
        """Write the state with no lease at all: only a forced teardown does this."""
        state.lease_until = 0.0
        self._write(state)

    def save(self, lease: Lease, state: ControllerState, *, release: bool = False) -> Lease:
        """Write the state under the lease (and give the lease up with release=True)."""
        state.lease_until = 0.0 if release else lease.until
        try:
            return Lease(lease.until, self._write(state, IfMatch=lease.etag))
        except Exception as e:
            if error_code(e) in _LOST_RACE:
                raise LeaseLost(f"s3://{self.bucket}/{self.key} was taken over: this run's state is dropped") from None
            raise
