"""What the supervisor decides, as pure functions: no S3, no EC2, no process, no clock.

The loops (membership.py, run.py, supervisor.py) gather the facts and act; every rule that turns
facts into "what next" lives here, so each one has a unit test that runs in microseconds and pins
the edges a two-node drill cannot reach (a run that finished and was interrupted, a peer whose
heartbeat lands in the same second as the exit, the failure count across a checkpoint).

Outcomes of one generation's run:
    finished      exit 0, no notice: the job is done
    interrupted   the ranks stopped together for a termination notice (Checkpointer's record)
    peer-lost     a member is gone, or a node joined or left the next generation
    failed        non-zero exit with every member alive (or recorded as failed by another node)
    job-error     the job cannot run here as deployed (no command, a final setup error)
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

Outcome = tuple[str, str]  # (outcome, detail)

# Names the runtime sets in a run's environment: the deployer's env may not shadow them.
RENDEZVOUS_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE"})
# What a container keeps of the host's environment besides the deployer's own names.
CONTAINER_PREFIXES = ("DL_", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "NCCL_", "FI_")
# A run's resume names come only from this generation's restore (resume_env), never from the unit's env.
STALE_NAMES = ("DL_RESUME_FROM", "DL_RESUME_STEP")


# ---- counting failures ------------------------------------------------------------------------------
def failures_after(outcome: str, failures: int, resume_step: Optional[int], last_resume: Optional[int]) -> int:
    """Failed runs in a row without a newer checkpoint. A failure that resumed from a newer step than
    the previous generation made progress first: it starts the count again at 1. Any other outcome
    clears it (a lost peer or a notice says nothing about the command)."""
    if outcome != "failed":
        return 0
    progressed = (resume_step if resume_step is not None else -1) > (last_resume if last_resume is not None else -1)
    return 1 if progressed else failures + 1


def gives_up(outcome: str, failures: int, max_failures: int, repeated: bool = False) -> bool:
    """Whether the job is failed for every node now (exit 3, no restart): after max_failures failures
    in a row without a newer checkpoint, or at the first repeat of the same error from the same step
    (a deterministic crash: a third try on every node of a large cluster would only cost the hour)."""
    return outcome == "failed" and (failures >= max_failures or (repeated and failures >= 2))


_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def error_signature(lines: Sequence[str], keep: int = 3) -> str:
    """What makes two failures "the same error": the command's last `keep` non-empty lines, with every
    number and address made 0 (a timestamp, a pid, a rank or an address differs between two runs of
    the same crash). "" when the command printed nothing: no two silent failures count as the same."""
    tail = [line.strip() for line in lines if line.strip()][-keep:]
    if not tail:
        return ""
    return hashlib.sha256("\n".join(_NUMBERS.sub("0", line) for line in tail).encode()).hexdigest()[:16]


def repeated_error(signature: str, previous: Optional[str]) -> bool:
    """Whether a failure repeats the previous failure's error (failures_after says whether it came
    from the same step: a count of 2 or more means no newer checkpoint in between)."""
    return bool(signature) and signature == previous


def agreed_outcome(outcome: str, detail: str, me: str, failed_on: Mapping[str, str]) -> Outcome:
    """The same outcome on every node: a node that saw only "peer lost" (its run was stopped by the
    failing node's next join) counts the generation failed when another node recorded a failure,
    and says which node failed and how ({node: its detail}, e.g. "exit 5"), not why its own run stopped."""
    if outcome != "peer-lost":
        return outcome, detail
    elsewhere = sorted(n for n in failed_on if n != me)
    if elsewhere:
        how = "; ".join(f"{n} ({failed_on[n]})" if failed_on[n] else n for n in elsewhere)
        return "failed", f"the command failed on {how}; this node's run was stopped for it"
    return outcome, detail


# ---- how a run ended ------------------------------------------------------------------------------
def exit_outcome(rc: int, outcomes: Mapping[str, object]) -> Optional[Outcome]:
    """The outcome an exit settles by itself, or None when a non-zero exit needs the cluster's word
    (settled_outcome). A notice's record wins over exit 0: the ranks that stopped together for a
    termination notice exit 0 too, and the job is not finished."""
    if "interrupted" in outcomes:
        return "interrupted", f"termination notice; saved step {outcomes['interrupted']}"
    if rc == 0:
        return "finished", ""
    return None


def stop_reason(next_generation: int, next_active: bool, gone: Iterable[str]) -> str:
    """Why a running generation must stop now ("" to go on): a node joined or left the next
    generation (a failing node records itself there), or a member is gone."""
    if next_active:
        return f"a node joined or left generation {next_generation}"
    gone = sorted(gone)
    return f"{', '.join(gone)} gone" if gone else ""


def settle_seconds(poll: float, liveness_poll: float, stale: float) -> float:
    """How long a non-zero exit waits for the cluster's word before it counts as the job's failure.
    A peer's death fails the collectives here before S3 or EC2 show it; the askers ask EC2 about
    every peer at once (urgent suspects), so a terminated peer is known within a look. A live
    peer proves itself with a beat after the exit (one liveness period); one that never beats
    while EC2 says "running" (a hung host) is not confirmed gone, and after this long the exit
    counts as the job's failure."""
    return max(3 * poll, stale / 2 + 2 * liveness_poll)


# ---- who asks EC2, and about whom ------------------------------------------------------------------
def askers(candidates: Iterable[str], fresh: Iterable[str], recorded: Iterable[str], urgent: bool) -> list[str]:
    """The nodes that ask EC2: the first of `candidates` in id order that beat lately and are not
    recorded gone; under urgency the first two. An urgent suspect may have died a second after its
    last beat and still look fresh: if it is also first in id order, a single asker would be the
    dead node itself and nobody would ask until its beat went stale. With two, one death never
    leaves the cluster without an asker, at two DescribeInstances per look instead of one."""
    fresh, recorded = set(fresh), set(recorded)
    return sorted(n for n in set(candidates) if n in fresh and n not in recorded)[:2 if urgent else 1]


def suspects(nodes: Iterable[str], recorded: Iterable[str], beats: Mapping[str, float], now: float, *,
             stale: float, urgent: Iterable[str] = (), since: Optional[float] = None) -> set[str]:
    """Whom an asker asks EC2 about: a node whose beat is older than `stale` by S3's clock, and every
    `urgent` node (this node's run just failed; a previous member has not joined the next generation)
    whatever its beat's age, unless it beat a full second after `since` (alive after the exit;
    LastModified has whole seconds). EC2 knows a terminated instance at once; a heartbeat takes `stale`."""
    recorded = set(recorded)
    out = {n for n in set(nodes) - recorded if now - beats.get(n, float("-inf")) > stale}
    alive_since = set() if since is None else {n for n, t in beats.items() if t >= since + 1}
    return out | (set(urgent) - recorded - alive_since)


def settled_outcome(rc: int, next_generation: int, next_active: bool, gone: Iterable[str], others: Iterable[str],
                    beats: Optional[Mapping[str, float]] = None, exited_at: Optional[float] = None) -> Optional[Outcome]:
    """One look while a non-zero exit settles: peer-lost when the cluster shows a loss, failed when every
    peer beat a full second after the exit by S3's clock (they lived past it: the failure is the job's,
    LastModified having whole seconds), None to look again."""
    reason = stop_reason(next_generation, next_active, gone)
    if reason:
        return "peer-lost", f"exit {rc}; {reason}"
    others = list(others)
    if beats is not None and exited_at is not None and others \
            and all(beats.get(o, 0.0) >= exited_at + 1 for o in others):
        return "failed", f"exit {rc}"
    return None


# ---- a run's environment ---------------------------------------------------------------------------
def run_environment(base: Mapping[str, str], extra: Mapping[str, str], rendezvous: Mapping[str, str],
                    resume: Mapping[str, str], *, lib_python: str, checkpoint_dir: str, notice_file: str,
                    notice_signal: str) -> dict[str, str]:
    """The command's environment: the unit's (less stale resume names), the deployer's env and
    secrets, then the runtime's names, which the deployer's can never shadow."""
    env = {k: v for k, v in base.items() if k not in STALE_NAMES}
    env.update(extra)
    env.update(rendezvous)
    env.update(resume)
    env["PYTHONPATH"] = lib_python + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DL_CHECKPOINT_DIR"] = checkpoint_dir
    env["DL_NOTICE_FILE"], env["DL_NOTICE_SIGNAL"] = notice_file, notice_signal
    return env


def container_env(env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """What a job's container gets of the run's environment: the deployer's env and secrets, the
    runtime's DL_ names and rendezvous, the region (credentials come from IMDS, as on the host)."""
    return {k: v for k, v in env.items() if k in extra or k in RENDEZVOUS_NAMES or k.startswith(CONTAINER_PREFIXES)}


# ---- rendezvous ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What a node does at one look of the rendezvous.
    action: "run" (the newest plan already holds this node), "rejoin" (it does, but the job was
    redeployed since: join the next one with the new revision), "join", or "spare-check" (the
    newest plan is full without this node: wait as a spare unless a member is gone or the next
    generation is forming)."""
    action: str
    generation: int


def rendezvous_target(newest: int, members: Optional[Iterable[str]], me: str, last_ran: int,
                      newest_set_aside: bool, redeployed: bool = False) -> Target:
    """Which generation to run or join, from the newest generation, its plan's members (None: no
    plan, or one set aside), and the last generation this node ran. A generation whose plan was set
    aside is spent (a plan is written once): the next one forms."""
    if members is None:
        spent = newest if newest_set_aside else last_ran
        return Target("join", newest if newest > spent else spent + 1)
    members = list(members)
    if me in members and newest > last_ran:
        return Target("rejoin", newest + 1) if redeployed else Target("run", newest)
    if me not in members and last_ran < newest:
        return Target("spare-check", newest + 1)
    return Target("join", newest + 1)


def ready_to_propose(have_members: bool, waiting: Iterable[str], waited: float, grace: float) -> bool:
    """A plan is written once enough live nodes have joined and no previous member is unaccounted
    for, or the grace for those members is over (a leaving node's last upload and a slow survivor
    are waited for, a vanished one not forever)."""
    return have_members and (not list(waiting) or waited >= grace)


def waiting_poll(poll: float, liveness_poll: float, complete: bool) -> float:
    """Seconds between looks of a node waiting for a generation's plan. While fewer live nodes have
    joined than the job needs, this node cannot write the plan: the node whose join completes the
    set writes it at its own first look, and a waiting node need only find it. So it looks at half
    the liveness period (5 s on a node) rather than every poll: a fleet that boots over a minute
    costs each node about what an all-at-once start does, for a start up to a few seconds later."""
    return poll if complete else max(poll, liveness_poll / 2)

