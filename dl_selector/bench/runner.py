"""python3 -m dl_selector.bench.runner: what each benchmark instance runs (standard library + boto3).

    python3 -m dl_selector.bench.runner --bucket B --prefix bench/NAME --instance-type T --minutes M \
        [--market spot] [--no-shutdown] -- 'the benchmark command'

1. writes started/<type>.json (so `bench collect` can tell "never launched" from "hung");
2. runs the command with bash in its own process group, echoing its output (the journal and the
   console keep it) and keeping the last OUTPUT_TAIL_BYTES;
3. at the deadline (the limit less UPLOAD_MARGIN, so the upload still fits) kills the whole group,
   SIGTERM then SIGKILL, and records timed_out;
4. writes results/<type>.json, retrying S3 with backoff; a crash of the runner itself still tries
   to upload a result that says so, and so does a SIGTERM to the runner (the instance shutting
   down: a spot interruption, the `shutdown -h +M` backstop, a manual stop): the command's group
   is killed first and the result says why;
5. powers the instance off (`shutdown -h now`; the launch template makes that a termination).

The command is one shell string run with `bash -c` (everything after `--`, joined with spaces),
so pipes, `&&` and `VAR=x cmd` work as written in the plan. A command that cannot start (bash
itself missing, or bash reports the command's first word not found) gives exit_code None and a
reason, not a bare 127.

The user data has already scheduled `shutdown -h +M` before starting this, so a runner that hangs
is terminated too. The collector, not this runner, reads the dl-bench lines.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

from dl_core.aws import Backoff

from .contract import OUTPUT_TAIL_BYTES, Result, result_key, started_key

UPLOAD_MARGIN = 90  # seconds kept after the command's deadline for the result upload and shutdown
KILL_GRACE = 15  # seconds between SIGTERM and SIGKILL
PUT_ATTEMPTS = 5
IMDS = "http://169.254.169.254"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Tail:
    """The last `limit` bytes of what passes through."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self.limit, self.data = limit, bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.limit:
            del self.data[:-self.limit]

    def text(self) -> str:
        return bytes(self.data[-self.limit:]).decode("utf-8", errors="replace")


class Interrupted(Exception):
    """The runner itself was told to stop (SIGTERM/SIGINT/SIGHUP) while the command ran."""


def run_command(command: str, limit_seconds: float, tail: Tail, echo=sys.stdout.buffer,
                grace: float = KILL_GRACE, stopped: threading.Event | None = None) -> tuple[int | None, bool]:
    """(exit code, timed out). The command and everything it started live in one process group,
    so a timeout kills the data-loader workers and torchrun's children too, not only bash.
    `stopped`, set from a signal handler, ends the group the same way (not a timeout)."""
    proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = threading.Event()
    killing = threading.Lock()

    def kill(deadline: bool = True) -> None:
        if deadline:
            timed_out.set()
        if not killing.acquire(blocking=False):
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGKILL)

    timer = threading.Timer(limit_seconds, kill)
    timer.daemon = True
    timer.start()
    if stopped is not None:
        def watch() -> None:
            stopped.wait()
            if proc.poll() is None:
                kill(deadline=False)
        threading.Thread(target=watch, daemon=True).start()
    try:
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):
            tail.add(chunk)
            try:
                echo.write(chunk)
                echo.flush()
            except (OSError, ValueError):
                pass
        code = proc.wait()
    finally:
        timer.cancel()
    if timed_out.is_set() or (stopped is not None and stopped.is_set()):
        _signal_group(proc.pid, signal.SIGKILL)  # a child that closed its output and lingers
    if stopped is not None and stopped.is_set() and not timed_out.is_set():
        raise Interrupted(code)
    return code, timed_out.is_set()


def not_found(command: str, code: int | None, tail: str) -> str | None:
    """The reason when bash could not start the command's first word (127 and its own message
    naming that word); None otherwise (a 127 from deeper inside a script is the script's exit)."""
    if code != 127:
        return None
    words = command.split()
    first = next((w for w in words if "=" not in w), "")
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    last = lines[-1] if lines else ""
    if first and re.fullmatch(rf"bash: (line 1: )?{re.escape(first)}: "
                              r"(command not found|No such file or directory|Permission denied)", last):
        return f"the command could not start: {last[:300]}"
    return None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def put_with_retry(put: Callable[[str, bytes], None], key: str, body: bytes, log=None,
                   attempts: int = PUT_ATTEMPTS, delay: float = 1.0, cap: float = 16.0) -> bool:
    """put(key, body) up to `attempts` times, after full-jitter waits growing from `delay` to `cap`;
    False when every try failed (the caller says so; an upload never crashes the runner)."""
    backoff = Backoff(delay, cap)
    for i in range(1, attempts + 1):
        try:
            put(key, body)
            return True
        except Exception as e:  # noqa: BLE001 - any S3 or network error: retry, then report; never crash the upload path
            print(f"runner: upload of {key} failed ({i}/{attempts}): {e}", file=log or sys.stderr, flush=True)
            if i < attempts:
                time.sleep(backoff.next())
    return False


def instance_identity(timeout: float = 2.0) -> tuple[str, str]:
    """(instance id, AZ) from IMDSv2, or ("", "") off EC2; bounded, never raises. Honours botocore's
    AWS_EC2_METADATA_DISABLED and AWS_EC2_METADATA_SERVICE_ENDPOINT (tests point it nowhere)."""
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        return "", ""
    base = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", IMDS).rstrip("/") + "/latest"
    try:
        req = urllib.request.Request(f"{base}/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        token = urllib.request.urlopen(req, timeout=timeout).read().decode()

        def get(path: str) -> str:
            r = urllib.request.Request(f"{base}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
            return urllib.request.urlopen(r, timeout=timeout).read().decode()
        return get("instance-id"), get("placement/availability-zone")
    except Exception:  # noqa: BLE001 - off EC2, or IMDS slow: the ids are only labels
        return "", ""


def s3_put(bucket: str, region: str | None) -> Callable[[str, bytes], None]:
    import boto3
    client = boto3.session.Session().client("s3", region_name=region)

    def put(key: str, body: bytes) -> None:
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    return put


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m dl_selector.bench.runner")
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--instance-type", required=True)
    p.add_argument("--minutes", type=int, required=True, help="the hard limit, boot included")
    p.add_argument("--market", default="")
    p.add_argument("--region")
    p.add_argument("--booted-at", type=float, help="epoch seconds the limit counts from (default: now)")
    p.add_argument("--limit-seconds", type=float, help="the command's own limit (default: minutes less the margin)")
    p.add_argument("--kill-grace", type=float, default=KILL_GRACE, help=argparse.SUPPRESS)
    p.add_argument("--retry-delay", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--no-shutdown", action="store_true", help="leave the machine running (tests, manual runs)")
    p.add_argument("command", nargs="+", help="after --: the benchmark command, run with bash -c")
    a = p.parse_args(argv)
    command = " ".join(a.command)
    # From here a stop request (the instance shutting down) ends the command, not the runner: the
    # result still goes up saying why.
    stopped = threading.Event()
    got: list[str] = []

    def on_signal(signum, _frame) -> None:
        got.append(signal.Signals(signum).name)
        stopped.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        return _run(a, command, stopped, got)
    finally:  # main() is also called in-process (tests)
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def _run(a: argparse.Namespace, command: str, stopped: threading.Event, got: list[str]) -> int:
    put = s3_put(a.bucket, a.region)
    started = now_iso()
    instance_id, az = instance_identity()
    base = {"instance_type": a.instance_type, "started": started, "instance_id": instance_id,
            "availability_zone": az, "market": a.market}
    put_with_retry(put, started_key(a.prefix, a.instance_type),
                   json.dumps({"started": started, "instance_id": instance_id, "command": command}).encode(),
                   delay=a.retry_delay)
    tail = Tail()
    try:
        limit = a.limit_seconds
        if limit is None:
            elapsed = time.time() - a.booted_at if a.booted_at else 0.0
            limit = max(30.0, a.minutes * 60 - UPLOAD_MARGIN - elapsed)
        print(f"runner: {a.instance_type}: running for at most {limit:.0f} s: {command}", file=sys.stderr, flush=True)
        try:
            code, timed_out = run_command(command, limit, tail, grace=a.kill_grace, stopped=stopped)
        except OSError as e:  # bash itself cannot be started
            code, timed_out, reason = None, False, f"the command could not start: {type(e).__name__}: {e}"
        else:
            reason = not_found(command, code, tail.text())
            if reason:
                code = None
        result = Result(exit_code=code, timed_out=timed_out, ended=now_iso(), output_tail=tail.text(),
                        reason=reason or "", **base)
    except Interrupted as e:
        result = Result(exit_code=None, timed_out=False, ended=now_iso(), output_tail=tail.text(),
                        reason=(f"interrupted: the runner got {got[0] if got else 'a signal'} and killed the command "
                                f"(exit {e.args[0]}); the instance was shutting down: a spot interruption, the "
                                "time-limit backstop or a manual stop"), **base)
    except Exception as e:  # noqa: BLE001 - the runner's own failure: still say so in the result
        result = Result(exit_code=None, timed_out=False, ended=now_iso(), output_tail=tail.text(),
                        reason=f"runner error: {type(e).__name__}: {e}", **base)
    ok = put_with_retry(put, result_key(a.prefix, a.instance_type), result.to_json().encode(), delay=a.retry_delay)
    print(f"runner: result {'uploaded' if ok else 'NOT uploaded'}: exit {result.exit_code}, "
          f"timed out {result.timed_out}", file=sys.stderr, flush=True)
    if not a.no_shutdown:
        try:
            subprocess.run(["shutdown", "-h", "now"], check=False)
        except OSError as e:  # the user data powers off after us anyway, and the backstop is scheduled
            print(f"runner: shutdown failed: {e}", file=sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
