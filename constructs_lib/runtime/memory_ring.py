"""Which node holds a copy of which in the memory tier (issue 37): a ring of the nodes, each
sending its snapshot to the next, ordered so that a node and its buddy are in different failure
domains (DL_FAILURE_DOMAIN: the zone, or the placement group's partition) wherever the counts allow.
"""
from __future__ import annotations


def ring(domains: list[str]) -> list[int]:
    """Node ranks in ring order, each node's buddy the next: neighbours in different failure
    domains wherever the counts allow (round robin over the domains, the largest first)."""
    groups: dict[str, list[int]] = {}
    for node, d in enumerate(domains):
        groups.setdefault(d, []).append(node)
    queues = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    order: list[int] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return order


def neighbours(order: list[int], node: int) -> tuple[int, int]:
    """(the node this node sends to, the node it receives from)."""
    i = order.index(node)
    return order[(i + 1) % len(order)], order[(i - 1) % len(order)]
