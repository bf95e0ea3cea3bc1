"""The idle guard's decision, as a pure function of metric series (issue 13's first piece).

Stopping a cluster is the one decision that loses work if it is wrong, so it needs two signals
that agree and never fires on missing data:

- every GPU of every node under `threshold_pct` for the whole `idle_minutes` window (a single
  GPU still working, or one busy sample, is not idle: a loader-starved job spikes between
  batches, and a job with a hung rank needs a human, not a stop); AND
- the job has stopped making progress: its training process is gone, or no checkpoint has
  completed within the window.

It never fires while a node is inside its grace period after boot or after a restore (the
GPUs are idle while the DLAMI boots, data is staged or a checkpoint is pulled), nor while any
GPU has no samples covering the window (an agent that stopped reporting is a health problem,
reported as such, not proof of idleness).

An interactive cluster (deployed without a command, or with interactive=true) has no job to make
progress: `decide_interactive` counts someone at work instead: an open Session Manager session
or a process on a GPU at any minute of the window, or a busy GPU. `escalate` puts a warning
period between "idle" and the stop: the first idle verdict warns, the stop comes only when the
warning is `warning_minutes` old and nothing has happened since.

Two hints ride along, never acting by themselves: a starved GPU (low utilisation while the disk
or the CPU is saturated, with the remedy) and an imbalance (some GPUs idle while others work).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

Series = Sequence[tuple[float, float]]  # (epoch seconds, value), any order


@dataclass(frozen=True)
class GuardConfig:
    threshold_pct: float = 5.0  # GPU utilisation below this is idle
    idle_minutes: float = 30.0
    grace_minutes: float = 20.0  # after boot and after a restore
    # A sample every minute is what the CloudWatch agent sends by default; a window whose series
    # has a gap longer than this does not count as covered.
    max_gap_minutes: float = 5.0
    # Starved hint: GPUs this busy at most while the disk or CPU is at least this saturated.
    starved_gpu_pct: float = 50.0
    saturated_pct: float = 90.0


@dataclass(frozen=True)
class NodeMetrics:
    node: str
    booted_at: float
    gpu_util: dict[int, Series]  # per GPU index, percent
    expected_gpus: int  # from the catalog: fewer series than this is a health problem
    restored_at: Optional[float] = None  # when the last checkpoint restore finished
    restoring: bool = False
    cpu_pct: Series = ()
    disk_read_pct: Series = ()  # read throughput as a percent of what the scratch array can do
    sessions: Series = ()  # Session Manager sessions open (the node monitor's M_SESSIONS)
    gpu_processes: Series = ()  # processes holding a CUDA context (M_GPU_PROCESSES)


@dataclass(frozen=True)
class JobProgress:
    process_alive: Optional[bool]  # None: unknown
    checkpoint_times: Sequence[float] = ()  # when each checkpoint completed


@dataclass(frozen=True)
class Decision:
    stop: bool
    state: str  # idle | busy | grace | no-data
    reason: str
    hints: tuple[str, ...] = field(default=())


def _window(series: Series, start: float, end: float) -> list[tuple[float, float]]:
    return sorted((t, v) for t, v in series if start <= t <= end)


def _covered(points: list[tuple[float, float]], start: float, end: float, max_gap: float) -> bool:
    if not points:
        return False
    times = [start, *(t for t, _ in points), end]
    return all(b - a <= max_gap for a, b in zip(times, times[1:]))


def _unjudgeable(nodes: Sequence[NodeMetrics], start: float, now: float, cfg: GuardConfig,
                 hints: tuple[str, ...]) -> Optional[Decision]:
    """No data, a grace period, or a GPU whose series has gaps: never a stop."""
    gap = cfg.max_gap_minutes * 60
    if not nodes:
        return Decision(False, "no-data", "no node reports metrics: nothing to judge")
    for n in nodes:
        if n.restoring:
            return Decision(False, "grace", f"{n.node} is restoring a checkpoint", hints)
        since = max(n.booted_at, n.restored_at or 0.0)
        if now - since < cfg.grace_minutes * 60:
            what = "a restore" if n.restored_at and n.restored_at >= n.booted_at else "boot"
            return Decision(False, "grace", f"{n.node} is {(now - since) / 60:.0f} min after {what} "
                                            f"(grace {cfg.grace_minutes:g} min)", hints)
    for n in nodes:
        if len(n.gpu_util) < n.expected_gpus:
            return Decision(False, "no-data", f"{n.node} reports {len(n.gpu_util)} of {n.expected_gpus} GPUs: "
                                              "a health problem, not idleness", hints)
        for gpu, series in sorted(n.gpu_util.items()):
            if not _covered(_window(series, start, now), start, now, gap):
                return Decision(False, "no-data", f"{n.node} GPU {gpu} has gaps over {cfg.max_gap_minutes:g} min "
                                                  f"in the last {cfg.idle_minutes:g} min", hints)
    return None


def _busy_gpus(nodes: Sequence[NodeMetrics], start: float, now: float, cfg: GuardConfig,
               hints: tuple[str, ...]) -> Optional[Decision]:
    busy = [(n.node, gpu, max(v for _, v in _window(s, start, now)))
            for n in nodes for gpu, s in sorted(n.gpu_util.items())
            if max(v for _, v in _window(s, start, now)) >= cfg.threshold_pct]
    if not busy:
        return None
    node, gpu, peak = busy[0]
    return Decision(False, "busy", f"{len(busy)} GPU(s) reached {cfg.threshold_pct:g}% or more in the last "
                                   f"{cfg.idle_minutes:g} min (e.g. {node} GPU {gpu} at {peak:.0f}%)", hints)


def decide(nodes: Sequence[NodeMetrics], job: JobProgress, now: float, cfg: GuardConfig = GuardConfig()) -> Decision:
    start = now - cfg.idle_minutes * 60
    hints = tuple(h for n in nodes for h in _hints(n, start, now, cfg))
    held = _unjudgeable(nodes, start, now, cfg, hints) or _busy_gpus(nodes, start, now, cfg, hints)
    if held:
        return held
    total = sum(len(n.gpu_util) for n in nodes)
    if job.process_alive is False:
        return Decision(True, "idle", f"all {total} GPUs under {cfg.threshold_pct:g}% for {cfg.idle_minutes:g} min "
                                      "and the training process is gone", hints)
    if any(start <= t <= now for t in job.checkpoint_times):
        return Decision(False, "busy", f"all {total} GPUs under {cfg.threshold_pct:g}% but a checkpoint completed in "
                                       f"the last {cfg.idle_minutes:g} min: the job still progresses", hints)
    last = max(job.checkpoint_times, default=None)
    age = "no checkpoint yet" if last is None else f"last checkpoint {(now - last) / 60:.0f} min ago"
    return Decision(True, "idle", f"all {total} GPUs under {cfg.threshold_pct:g}% for {cfg.idle_minutes:g} min and "
                                  f"the job makes no progress ({age})", hints)


def decide_interactive(nodes: Sequence[NodeMetrics], now: float, cfg: GuardConfig = GuardConfig()) -> Decision:
    """A development cluster is idle when, for the whole window, no Session Manager session was
    open on any node, no process held a GPU, and every GPU stayed under the threshold. A node
    whose session count has gaps is not judged (the monitor that counts them is down)."""
    start = now - cfg.idle_minutes * 60
    hints = tuple(h for n in nodes for h in _hints(n, start, now, cfg) if "NPROC_PER_NODE" not in h)
    held = _unjudgeable(nodes, start, now, cfg, hints)
    if held:
        return held
    for n in nodes:
        seen = _window(n.sessions, start, now)
        if not _covered(seen, start, now, cfg.max_gap_minutes * 60):
            return Decision(False, "no-data", f"{n.node} has not reported its open sessions for the whole last "
                                              f"{cfg.idle_minutes:g} min: the node monitor may be down", hints)
        last = max((t for t, v in seen if v >= 1), default=None)
        if last is not None:
            return Decision(False, "busy", f"a Session Manager session was open on {n.node} "
                                           f"{(now - last) / 60:.0f} min ago (someone is at work)", hints)
    for n in nodes:
        procs = [(t, v) for t, v in _window(n.gpu_processes, start, now) if v >= 1]
        if procs:
            t, v = procs[-1]
            return Decision(False, "busy", f"{v:.0f} process(es) held {n.node}'s GPUs {(now - t) / 60:.0f} min ago "
                                           "(a notebook or a run keeps its model there)", hints)
    busy = _busy_gpus(nodes, start, now, cfg, hints)
    if busy:
        return busy
    total = sum(len(n.gpu_util) for n in nodes)
    return Decision(True, "idle", f"no session open, no process on a GPU and all {total} GPUs under "
                                  f"{cfg.threshold_pct:g}% for {cfg.idle_minutes:g} min", hints)


@dataclass(frozen=True)
class Step:
    """What one guard run does about a decision, given the warning already given (if any)."""
    act: str  # none | warn | wait | stop | cancel
    warned_at: Optional[float]  # the pending warning after this run
    stop_at: Optional[float]  # when the stop comes if nothing happens


def escalate(decision: Decision, warned_at: Optional[float], now: float, warning_minutes: float) -> Step:
    """Warn first, stop once the warning is `warning_minutes` old and the cluster is still idle;
    anything but idle withdraws a warning. With no warning period an idle verdict stops at once."""
    if not decision.stop:
        return Step("cancel" if warned_at is not None else "none", None, None)
    if warning_minutes <= 0:
        return Step("stop", warned_at, now)
    if warned_at is None:
        return Step("warn", now, now + warning_minutes * 60)
    stop_at = warned_at + warning_minutes * 60
    return Step("stop" if now >= stop_at else "wait", warned_at, stop_at)


def _mean(points: list[tuple[float, float]]) -> Optional[float]:
    return sum(v for _, v in points) / len(points) if points else None


def _hints(n: NodeMetrics, start: float, end: float, cfg: GuardConfig) -> list[str]:
    out = []
    means = {g: _mean(_window(s, start, end)) for g, s in n.gpu_util.items()}
    known = [m for m in means.values() if m is not None]
    if not known:
        return out
    gpu = sum(known) / len(known)
    disk, cpu = _mean(_window(n.disk_read_pct, start, end)), _mean(_window(n.cpu_pct, start, end))
    if cfg.threshold_pct <= gpu < cfg.starved_gpu_pct:
        if disk is not None and disk >= cfg.saturated_pct:
            out.append(f"{n.node}: GPUs at {gpu:.0f}% while disk reads run at {disk:.0f}% of the array: starved by "
                       "storage; stage the data on the NVMe RAID (/scratch) or cache it in memory")
        elif cpu is not None and cpu >= cfg.saturated_pct:
            out.append(f"{n.node}: GPUs at {gpu:.0f}% while the CPUs run at {cpu:.0f}%: starved by the data loader; "
                       "more loader workers, decode on the GPU (DALI), or a size with more vCPUs per GPU")
    idle = sorted(g for g, m in means.items() if m is not None and m < cfg.threshold_pct)
    if idle and len(idle) < len(known):
        out.append(f"{n.node}: GPU(s) {', '.join(map(str, idle))} idle while the others work: a hung or missing "
                   "rank, or a job that does not use every GPU (check NPROC_PER_NODE)")
    return out
