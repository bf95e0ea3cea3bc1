"""The docs' Mermaid diagrams (what runs where and a node's life in docs/architecture.md, the
rendezvous in docs/capacity.md): each is a diagram Mermaid can draw, and every name it shows is
one the code uses, so renaming a unit, a script, a contract file or an S3 key fails here until the
picture follows.

- Mermaid's own parser (tests/mermaid_parse.mjs: the `mermaid` npm package under jsdom) when node
  finds both (the repository's node_modules, or NODE_PATH); without them that one test is skipped
  and the checks below stand alone.
- The S3 keys are not read from the code's text: ClusterState and CheckpointStore run against
  moto, and every key a diagram shows must be one of those they wrote (instance ids, addresses,
  times, generations and steps written as NODE, ADDR, MS, G and N).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from constructs_lib.runtime import contract

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```mermaid\n(.*?)^```", re.S | re.M)
NAME = re.compile(r"^%% diagram: ([\w-]+)$", re.M)
# Where each diagram lives: the pages people read for that question.
WHERE = {"architecture": "architecture.md", "node-life": "architecture.md", "rendezvous": "capacity.md"}
# The first statement of each: the diagram types mkdocs-material's Mermaid draws.
TYPES = ("flowchart", "graph", "sequenceDiagram", "stateDiagram-v2")
S3_PATH = re.compile(r"(?:jobs/JOB/)?(?:_cluster|_control|step-[NG])(?:/[\w.-]+)*/?")


def diagrams() -> dict[str, tuple[str, str]]:
    """{name: (page, text)} of every ```mermaid block under docs/ (named by its `%% diagram:` line)."""
    found: dict[str, tuple[str, str]] = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for text in FENCE.findall(page.read_text()):
            m = NAME.search(text)
            assert m, f"{page.name}: a mermaid block without its '%% diagram: NAME' line"
            assert m.group(1) not in found, f"two diagrams named {m.group(1)}"
            found[m.group(1)] = (page.relative_to(ROOT / "docs").as_posix(), text)
    return found


def test_the_three_diagrams_are_on_their_pages_and_each_names_a_diagram_type():
    found = diagrams()
    assert {n: p for n, (p, _) in found.items()} == WHERE
    for name, (_, text) in found.items():
        statements = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("%%")]
        assert statements[0].split()[0] in TYPES, f"{name}: starts with {statements[0]!r}"


def test_each_diagram_parses_with_mermaids_own_parser(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH")
    texts = [text for _, text in diagrams().values()]
    run = subprocess.run([node, str(ROOT / "tests" / "mermaid_parse.mjs")], input=json.dumps(texts), text=True,
                         capture_output=True, timeout=120, cwd=tmp_path)
    if run.returncode == 3:
        pytest.skip(f"Mermaid's parser is not installed ({run.stdout.strip()}): npm install mermaid jsdom")
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert len(run.stdout.splitlines()) == len(texts)


# ---- every name a diagram shows is the code's ------------------------------------------------------
def _normalised(key: str) -> str:
    key = re.sub(r"gen-[0-9]+", "gen-G", key)
    key = re.sub(r"step-[0-9]+", "step-N", key)
    key = re.sub(r"i-[0-9a-f]{8,17}_[0-9.]+_[0-9]+\.json", "NODE_ADDR_MS.json", key)
    return re.sub(r"i-[0-9a-f]{8,17}", "NODE", key)


@pytest.fixture
def written(aws, tmp_path) -> set[str]:
    """Every key the nodes' code writes in the checkpoint bucket, one of each, normalised; and the
    keys the controller and the idle guard keep under _control/ (the contract names them)."""
    import boto3

    from constructs_lib.runtime.cluster import ClusterState, Member, Plan
    from constructs_lib.runtime.store import CheckpointStore

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    store = CheckpointStore("ckpt", "jobs/JOB", client=s3)
    save = tmp_path / "step-000000000005"
    save.mkdir()
    (save / "model.pt").write_bytes(b"weights")
    store.push(str(save), 5)
    cluster = ClusterState(store)
    a, b = Member("i-0123456789abcdef0", "10.0.0.1"), Member("i-0fedcba9876543210", "10.0.0.2")
    cluster.join(1, a)
    cluster.join(1, b)
    cluster.propose(Plan(1, (a, b), 5))
    cluster.beat(a.node)
    cluster.record_gone(b.node, "terminated")
    cluster.record_failure(1, a.node, "exit 1")
    cluster.claim_kept(1, 6, b.node)
    cluster.leave(2, a.node, reason="termination notice", pushed=5)
    cluster.mark_finished(generation=2, node=a.node, step=5)
    cluster.mark_failed(generation=2, node=a.node, reason="r")
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="ckpt")
            for o in page.get("Contents", [])]
    return {_normalised(k) for k in keys} | {contract.capacity_state_key("CLUSTER"), contract.guard_state_key("CLUSTER")}


def test_every_s3_key_a_diagram_shows_is_one_the_code_writes(written):
    texts = "\n".join(text for _, text in diagrams().values())
    shown = {m.rstrip(".") for m in S3_PATH.findall(texts)}
    assert len(shown) >= 10, shown
    for path in shown:
        path = _normalised(path).replace("gen-N", "gen-G")
        full = path if path.startswith(("jobs/", "_control/")) else f"jobs/JOB/{path}"
        assert any(k.startswith(full) for k in written), f"{path}: the code writes no such key: {sorted(written)}"
    # And what every page says about the records: each kind the nodes write is in a picture.
    for kind in ("_cluster/gen-G/join/", "_cluster/gen-G/plan.json", "_cluster/beat/", "_cluster/gone/",
                 "step-N/MANIFEST.json", "_control/CLUSTER/capacity-state.json"):
        assert any(kind in _normalised(s).replace("gen-N", "gen-G") for s in shown), kind


def test_every_file_name_a_diagram_shows_is_written_or_in_the_node_contract(written):
    texts = "\n".join(text for _, text in diagrams().values())
    known = {k.rsplit("/", 1)[-1] for k in written} | {base for _, base in contract.FILES.values()}
    names = set(re.findall(r"[\w-]+\.(?:json|env)\b", texts))
    assert names and not names - known, sorted(names - known)


def test_the_units_and_scripts_shown_are_the_bundles():
    from constructs_lib.bundle import UNITS

    found = diagrams()
    shown = set(re.findall(r"dl-[\w-]+\.service", found["architecture"][1] + found["node-life"][1]))
    assert shown <= set(UNITS), shown - set(UNITS)
    assert set(re.findall(r"dl-[\w-]+\.service", found["architecture"][1])) == set(UNITS)  # what runs where: all of them
    scripts = {p.name for p in (ROOT / "constructs_lib" / "scripts").glob("*.sh")}
    shown_scripts = set(re.findall(r"[\w-]+\.sh\b", found["architecture"][1] + found["node-life"][1]))
    assert shown_scripts and shown_scripts <= scripts, shown_scripts - scripts


def test_the_nodes_life_shows_the_supervisors_phases_exit_codes_and_health_tag():
    from constructs_lib.runtime.supervisor import SupervisorConfig

    text = diagrams()["node-life"][1]
    for phase in contract.PHASES:
        if phase != "between":  # between two runs: no box of its own
            assert re.search(rf"\b{phase}\b", text), phase
    exits = {int(c) for c in re.findall(r"\bexit (\d+)", text)}
    assert exits == {contract.EXIT_FINISHED, contract.EXIT_FAILED}
    assert f"{contract.TAG_HEALTH} = {contract.HEALTH_REPLACE}" in text
    cfg = SupervisorConfig(cluster="c", nodes=2, nproc_per_node=8, node="i-0", addr="10.0.0.1")
    assert f"{cfg.max_failures} times in a row" in text and f"fewer than {cfg.max_failures} in a row" in text


def test_the_rendezvous_shows_the_supervisors_own_periods_and_port():
    from constructs_lib.runtime.cluster import Liveness
    from constructs_lib.runtime.supervisor import SupervisorConfig

    text = diagrams()["rendezvous"][1]
    cfg = SupervisorConfig(cluster="c", nodes=2, nproc_per_node=8, node="i-0", addr="10.0.0.1")
    assert f"looks every {cfg.poll:g} s" in text and f"loop every {cfg.poll:g} s" in text
    assert f"beat/NODE every {cfg.liveness_poll:g} s" in text
    assert f"older than {Liveness(None).stale:g} s" in text
    assert f"up to {cfg.member_grace / 60:g} min" in text
    assert f"port {contract.RENDEZVOUS_PORT_BASE} + G % {contract.RENDEZVOUS_PORT_SPAN}" in text
    assert "If-None-Match: *" in text and "412 Precondition Failed" in text
