"""The shapes of the cluster's records (cluster.py): what a plan, an end record and a join must be
for a node to use them. Any node may write these records, so each check bounds what it accepts
before anything is sized by it; records.read sets aside whatever fails, with the reason given here."""
from __future__ import annotations

import re
import time
from typing import Any, Iterable, Optional

from .contract import GONE_DIR
from .job_definition import Revision
from .records import addr_problem, node_problem, printable, texts, whole

GEN_NAME = re.compile(r"^gen-[0-9]{6,12}\Z", re.ASCII)  # gen_name's, below 10**12 (whole()): a key stays short
MAX_MEMBERS = 10_000


def plan_problem(d: Any, g: int) -> Optional[str]:
    """Why a plan read for generation g cannot be run, or None. A plan is written by whichever node
    proposed it (any node may write there): it names members, addresses, a step and a revision,
    and each is checked for its form here; what a well-formed plan can still do is in jobdef.py."""
    if not isinstance(d, dict):
        return "not a JSON object"
    if d.get("generation") != g or not whole(d.get("generation"), 1):
        return f"generation {printable(d.get('generation'), 40)} in the plan of generation {g}"
    members = d.get("members")
    if not isinstance(members, list) or not 1 <= len(members) <= MAX_MEMBERS:
        return f"members are not a list of 1 to {MAX_MEMBERS:,}"
    for m in members:
        if not isinstance(m, dict):
            return "a member that is not an object"
        why = node_problem(m.get("node")) or addr_problem(m.get("addr"))
        if why:
            return f"member {printable(why, 120)}"
    if len({m["node"] for m in members}) != len(members):
        return "a node listed twice"
    step = d.get("resume_step")
    if step is not None and not whole(step):
        return f"resume_step {printable(step, 40)} is not a whole number 0 <= step < 10**12"
    if d.get("job") is not None:
        try:
            Revision.from_json(d["job"])
        except ValueError as e:
            return printable(e, 200)
    return None


def object_problem(d: Any) -> Optional[str]:
    return None if isinstance(d, dict) else "not a JSON object"


def finished_problem(d: Any) -> Optional[str]:
    if not isinstance(d, dict):
        return "not a JSON object"
    if "generation" in d and not whole(d["generation"]):
        return f"generation {printable(d['generation'], 40)}"
    if d.get("step") is not None and not whole(d["step"]):
        return f"step {printable(d['step'], 40)}"
    return None


def failed_problem(d: Any) -> Optional[str]:
    why = finished_problem(d)
    if why:
        return why
    if not isinstance(d.get("reason", ""), str):
        return "a reason that is not text"
    if "attempts" in d and not whole(d["attempts"]):
        return f"attempts {printable(d['attempts'], 40)}"
    if "last_lines" in d and not texts(d["last_lines"]):
        return "last_lines that are not a list of lines"
    return None


def failure_problem(d: Any) -> Optional[str]:
    """A generation's failure record (gen-N/failed/<node>.json): how the command failed there."""
    if not isinstance(d, dict):
        return "not a JSON object"
    if not isinstance(d.get("detail", ""), str) or not isinstance(d.get("signature", ""), str):
        return "a detail or signature that is not text"
    if len(d.get("signature", "")) > 64:
        return "a signature over 64 characters"
    if "last_lines" in d and not texts(d["last_lines"]):
        return "last_lines that are not a list of lines"
    return None


def join_problem(d: Any) -> Optional[str]:
    if not isinstance(d, dict):
        return "not a JSON object"
    health = d.get("health", {})
    if not isinstance(health, dict) or not all(isinstance(v, str) for v in health.values()):
        return "health that is not a map of components to text"
    return None


def gone_record(node: str, state: str, **extra: str) -> tuple[str, dict]:
    """(its key below the cluster's directory, its body): the record that `node` is gone, as a
    node's liveness check writes it and, with by="controller", the capacity controller. Readers go
    by the key alone (ClusterState.gone_nodes lists the names), so the body is for people."""
    return f"{GONE_DIR}/{node}.json", {"node": node, "state": state, "at": time.time(), **extra}


def nodes_in(names: Iterable[str]) -> set[str]:
    """The node ids a listing's names (node.json) give; names no node writes are left out."""
    return {n.removesuffix(".json") for n in names if not node_problem(n.removesuffix(".json"))}
