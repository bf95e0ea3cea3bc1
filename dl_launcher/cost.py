"""The cost of a running job, for `dl-launcher status`: the stack's CostModel output (what synth
priced, dl_stacks/stack_cost.py) applied to the nodes that run now and how long they have run."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class RunningCost:
    per_hour: float
    so_far: float
    since: float  # the stack's creation
    unpriced: tuple[str, ...]  # running types with no price in the model
    as_of: str

    def line(self) -> str:
        day = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.since))
        gap = f"; no price on record for {', '.join(self.unpriced)} (counted as $0)" if self.unpriced else ""
        return (f"cost: ${self.per_hour:,.2f}/h now (${self.per_hour * 24:,.2f}/day); about ${self.so_far:,.2f} so far "
                f"(the stack's resources since {day}, the running nodes since each launched; nodes already gone are "
                f"not counted: Cost Explorer by tag dl-launcher:job has the bill){gap}; {self.as_of}")


def running_cost(model_json: Optional[str], created: float, nodes: Sequence[Any], now: Optional[float] = None,
                 ) -> Optional[RunningCost]:
    """`nodes`: the running instances (instance_type, launched epoch). None without a model (a stack
    deployed before the cost model existed)."""
    if not model_json:
        return None
    now = time.time() if now is None else now
    m = json.loads(model_json)
    fixed, per_node, prices = m["fixed_per_hour"], m["per_node_hour"], m["instance_per_node_hour"]
    per_hour, so_far = fixed, fixed * max(0.0, now - created) / 3600
    unpriced = []
    for n in nodes:
        price = prices.get(n.instance_type)
        if price is None:
            unpriced.append(n.instance_type)
            price = 0.0
        per_hour += price + per_node
        so_far += (price + per_node) * max(0.0, now - n.launched) / 3600
    return RunningCost(per_hour, so_far, created, tuple(sorted(set(unpriced))), m.get("as_of", ""))
