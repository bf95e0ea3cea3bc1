"""Trainium and Inferentia utilisation for the idle guard, from `neuron-monitor` (aws-neuron-tools,
on the Neuron DLAMI): it streams one JSON report per line (every 5 s by default); each report's
`neuron_runtime_data[].report.neuroncore_counters.neuroncores_in_use` holds, for every NeuronCore
a Neuron application uses, its `neuroncore_utilization` in percent over that period (the Neuron
Monitor User Guide, "The JSON output format" and "neuroncore_counters").

The node monitor publishes one value a minute per node, contract.M_NEURON_UTIL: the busiest
NeuronCore of the busiest report that minute. A core no application uses counts as 0, and so
does a report with no application at all (nothing runs: idle); a report that is not what
neuron-monitor writes counts as nothing, so a node whose neuron-monitor is missing or broken
publishes no datum and the guard, seeing a gap, never calls it idle.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional

# Where aws-neuron-tools installs it (the Neuron DLAMI; not on a systemd unit's PATH).
NEURON_MONITOR = "/opt/aws/neuron/bin/neuron-monitor"


def busiest_core(report: Any) -> Optional[float]:
    """The highest NeuronCore utilisation (percent) in one neuron-monitor report; 0.0 when no
    application uses a core; None for a report of another shape (or one reporting an error for
    every application)."""
    if not isinstance(report, dict) or not isinstance(report.get("neuron_runtime_data"), list):
        return None
    best, errors, runtimes = 0.0, 0, report["neuron_runtime_data"]
    for runtime in runtimes:
        counters = ((runtime.get("report") or {}).get("neuroncore_counters") or {}) if isinstance(runtime, dict) else {}
        cores = counters.get("neuroncores_in_use") if isinstance(counters, dict) else None
        if not isinstance(cores, dict):
            errors += 1
            continue
        for core in cores.values():
            u = core.get("neuroncore_utilization") if isinstance(core, dict) else None
            if isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u):
                best = max(best, min(max(float(u), 0.0), 100.0))
    if runtimes and errors == len(runtimes):
        return None
    return best


def on_report_line(record: Callable[[float], None]) -> Callable[[], Callable[[str], None]]:
    """A follower's handler (monitor.follow): each report line's busiest core goes to `record`."""
    def handle(line: str) -> None:
        try:
            value = busiest_core(json.loads(line))
        except ValueError:
            return
        if value is not None:
            record(value)
    return lambda: handle
