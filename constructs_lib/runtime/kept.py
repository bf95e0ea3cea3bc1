"""Between runs: the steps a run's ranks kept in memory become this node's newest save (issue 37).

Two kinds, both sent before the node rejoins, so the next plan resumes from them:
- a survivor save (survivor.py, DDP): the step a node's first rank wrote from memory when a peer
  died; one survivor sends it, the one whose claim in S3 wins;
- a memory snapshot (memory_tier.py, sharded state): this node's part of the newest settled
  snapshot, and the part it holds for a buddy that is gone, in the buddy's place.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from . import contract, memory_store, sharded_store, survivor
from .agent import NodeAgent
from .cluster import Plan

OWNER_WAIT = 2.0  # seconds a holder waits for a buddy's gone record (detection measured 0.2-1.5 s)


def promote(*, plan: Plan, node: str, local_dir: str, store: Any, cluster: Any, membership: Any,
            newest: Callable[[], Optional[int]], ride: Callable, log: Callable[[str], None],
            outcome: str = "") -> None:
    g = plan.generation
    has_memory = memory_store.settled(contract.memory_dir(), str(g)) is not None
    has_survivor = bool(survivor.survivor_saves(local_dir))
    if not has_survivor and not has_memory:
        return
    try:
        remote = ride(newest, "reading the newest checkpoint")
        if has_survivor:
            survivor.promote(local_dir, newest_remote=remote, log=log,
                             claim=lambda step: ride(lambda: cluster.claim_kept(g, step, node), "claiming the kept step"))
        if has_memory:
            nodes = plan.nodes()

            def owner_gone(rank: int) -> bool:
                owner = nodes[rank] if rank < len(nodes) else None
                if owner is None or owner == node:
                    return False
                # The failed run's askers record a dead member within a second or two; a holder that
                # is not an asker may look first. A live owner sends its own part, so after the
                # bound the copy stays here (the cost: that many seconds for the holders of live
                # owners; a dead owner's holder sends at the record).
                until = time.monotonic() + OWNER_WAIT
                if owner in membership.gone([owner], urgent=[owner], among=nodes):  # an asker asks EC2 here
                    return True
                while time.monotonic() < until:
                    time.sleep(0.5)
                    if owner in ride(cluster.gone_nodes, "reading the gone records"):  # one LIST
                        return True
                return False

            def push_held(path: str, step: int, part: dict) -> None:
                ride(lambda: sharded_store.push_part(store, path, step, part), f"sending node {part['node_rank']}'s part")
                ride(lambda: sharded_store.commit(store, step, part["attempt"]), f"committing step {step}")

            def push_older(path: str, step: int) -> None:
                agent = NodeAgent(store, local_dir, log=log)
                ride(lambda: agent.push(step, path), f"sending step {step}")

            memory_store.promote(contract.memory_dir(), str(g), local_dir, newest_remote=remote,
                                 owner_gone=owner_gone, push_held=push_held, push_older=push_older, log=log,
                                 outcome=outcome)
    except OSError as e:  # a full disk or a vanished directory: the newest checkpoint still stands
        log(f"could not keep the step saved from memory: {type(e).__name__}: {e}")
