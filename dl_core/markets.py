"""The market names, spelled once: where an instance's capacity comes from and what its hour costs.

Users type these (`-c market=`, `recommend --spot`, a plan's `market`), the controller's spec and
the CDK constructs carry them, the selector ranks on them: every module that checks or lists a
market imports it from here, so a new market or a spelling cannot drift between them.

    spot            EC2 spare capacity at the spot price; EC2 may take it back with 2 minutes' notice
    on-demand       the list price; also what a Capacity Reservation (cr-..., or a resource group
                    of them) holds
    capacity-block  a Capacity Block for ML: reserved ahead for a fixed term at the block's price,
                    launched into by its reservation id

Standard library only (nothing at all): node code and the controller's Lambda ship dl_core whole.
"""
from __future__ import annotations

SPOT = "spot"
ON_DEMAND = "on-demand"
CAPACITY_BLOCK = "capacity-block"

# Every market a cluster launches in, in the order errors list them.
MARKETS = (SPOT, ON_DEMAND, CAPACITY_BLOCK)
# What needs no reservation: a benchmark's plan and a Service Catalog product offer these.
OPEN_MARKETS = (SPOT, ON_DEMAND)
