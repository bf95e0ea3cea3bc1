"""Why a cluster cannot launch, in one line a person can act on: EC2's fleet errors sorted into
quota, capacity and price, each with what the controller does next and what the user can do.

A deploy completes whether or not EC2 has the capacity (the controller launches after it), so
this line (in the controller's state, `status`, and the CapacityShort alarm's log) is where a
user learns that their account's vCPU quota is 0 or that the AZ has no p5 today.
"""
from __future__ import annotations

from typing import Iterable

# EC2 error codes (CreateFleet's Errors[].ErrorCode, RunInstances' exceptions), from the EC2 API
# reference's "Error codes" page.
QUOTA = ("VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded",
         "MaxSpotFleetRequestCountExceeded", "ReservationCapacityExceeded")
CAPACITY = ("InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
            "InsufficientReservedInstanceCapacity", "UnfulfillableCapacity", "InsufficientCapacityOnHost")
PRICE = ("SpotMaxPriceTooLow",)

REMEDY = {
    "quota": ("the account's vCPU quota for this instance family and market is below what the cluster "
              "needs: `dl-launcher preflight` names the quota and the number to ask for (Service Quotas, "
              "EC2); increases take hours to days"),
    "capacity": ("AWS has no free capacity for the type in these AZs now: the controller keeps trying; "
                 "more subnets (-c subnet_ids), a wider -c interchange, on-demand, or a Capacity Block "
                 "help sooner"),
    "price": ("the spot price is above the max price sent to EC2: raise -c max_price, or leave it unset "
              "(EC2's default, the on-demand price)"),
    "other": "see the error; `python -m constructs_lib.fleet status` lists every attempt",
}


def classify(errors: Iterable[str]) -> str:
    """'quota', 'capacity', 'price' or 'other', from 'Code: message' strings (quota first: it
    never clears by waiting)."""
    codes = {e.split(":", 1)[0].strip() for e in errors}
    for kind, known in (("quota", QUOTA), ("price", PRICE), ("capacity", CAPACITY)):
        if codes & set(known):
            return kind
    return "other"


def describe(short: dict) -> str:
    """The one line `status` prints for a shortfall stored in the controller's state."""
    return (f"short: {short['what']}: {short['kind']}: {short['error']}; next: {short['next']}; "
            f"what you can do: {REMEDY.get(short['kind'], REMEDY['other'])}")
