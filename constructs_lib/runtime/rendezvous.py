"""A generation's plan as what torchrun and the job read: rendezvous.env and the hostfile.

torchrun runs with its static rendezvous (dl-torchrun passes --node-rank, --master-addr and
--master-port from here), so torch's group rank IS the plan's rank: no second ordering (torch
sorts agents by host name as text, which disagrees with numbers: .10 before .9) can disagree
with where rank 0 (MASTER_ADDR, the writer of full-state saves) is.
"""
from __future__ import annotations

from . import contract
from .cluster import Plan
from .layout import write_atomic


def env_for(plan: Plan, node: str, nproc_per_node: int, cluster: str = "") -> dict[str, str]:
    rank = plan.rank_of(node)
    if rank is None:
        raise ValueError(f"{node} is not a member of generation {plan.generation}")
    return {
        "MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(plan.port), "NNODES": str(len(plan.members)),
        "NODE_RANK": str(rank), "NPROC_PER_NODE": str(nproc_per_node),
        "WORLD_SIZE": str(len(plan.members) * nproc_per_node), "DL_GENERATION": str(plan.generation),
        "DL_CLUSTER": cluster,
    }


def write(plan: Plan, node: str, nproc_per_node: int, cluster: str = "") -> dict[str, str]:
    env = env_for(plan, node, nproc_per_node, cluster)
    write_atomic(contract.path("rendezvous_env"), contract.env_text(env))
    write_atomic(contract.path("hostfile"), "".join(f"{m.addr} slots={nproc_per_node}\n" for m in plan.members))
    return env
