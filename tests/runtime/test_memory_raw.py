"""memory_raw.to_dcp: a raw snapshot part becomes the DCP files its layout names, each item read back
by torch.load; a layout or raw file that does not hold together (a buddy's part is hostile input)
is refused before a file is written, and promote then falls back to S3 for that part.
(test_memory_tier.py restores a real FSDP2 job's raw snapshot through S3 and DCP's own reader.)"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from constructs_lib.runtime import memory_raw, memory_store


def _part(root: Path, items: list[dict], raw: bytes, rank: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / memory_raw.raw_name(rank)).write_bytes(raw)
    (root / memory_raw.layout_name(rank)).write_text(json.dumps({"rank": rank, "items": items, "size": len(raw)}))
    (root / ".dl-shards").mkdir(exist_ok=True)
    (root / ".dl-shards" / f"rank-{rank}.json").write_text("{}")
    return root


def _tensor_item(t: torch.Tensor, off: int, raw: int) -> dict:
    blob = io.BytesIO()
    torch.save(t, blob)
    return {"kind": "tensor", "n": t.untyped_storage().nbytes(), "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape), "stride": list(t.stride()), "at": 0, "file": "__0_0.distcp", "off": off,
            "len": len(blob.getvalue()), "raw": raw}


def test_a_raw_part_becomes_files_torch_load_reads(tmp_path):
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    obj = io.BytesIO()
    torch.save({"lr": 0.1}, obj)
    first = {"kind": "bytes", "n": len(obj.getvalue()), "file": "__0_0.distcp", "off": 0, "len": len(obj.getvalue()), "raw": 0}
    ia = _tensor_item(a, first["len"], first["n"])
    ib = _tensor_item(b, ia["off"] + ia["len"], ia["raw"] + ia["n"])
    raw = obj.getvalue() + a.numpy().tobytes() + b.view(torch.uint8).numpy().tobytes()
    part = _part(tmp_path / "part", [ib, first, ia], raw)  # any order: written by offset
    memory_raw.to_dcp(str(part), str(tmp_path / "out"))

    out = (tmp_path / "out" / "__0_0.distcp").read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".dl-shards", "__0_0.distcp"]
    assert torch.load(io.BytesIO(out[:first["len"]]), weights_only=True) == {"lr": 0.1}
    assert torch.equal(torch.load(io.BytesIO(out[ia["off"]:ia["off"] + ia["len"]]), weights_only=True), a)
    assert torch.equal(torch.load(io.BytesIO(out[ib["off"]:]), weights_only=True), b)


def _good() -> tuple[list[dict], bytes]:
    t = torch.arange(4, dtype=torch.int64)
    return [_tensor_item(t, 0, 0)], t.numpy().tobytes()


@pytest.mark.parametrize("field,value", [
    ("file", "__1_0.distcp"),          # another rank's file
    ("file", "../../etc/x.distcp"),
    ("raw", 10**9),                    # past the raw bytes
    ("off", -1),
    ("dtype", "object"),
    ("shape", [2, 2, "x"]),
    ("stride", [1, 1]),                # not one per dimension
    ("kind", "pickle"),
    ("len", 5),                        # not the length DCP wrote
    ("off", 8),                        # a gap in the file
])
def test_a_layout_that_does_not_hold_together_is_refused(tmp_path, field, value):
    items, raw = _good()
    items[0][field] = value
    part = _part(tmp_path / "part", items, raw)
    with pytest.raises(ValueError):
        memory_raw.to_dcp(str(part), str(tmp_path / "out"))
    assert not list(tmp_path.rglob("x.distcp"))


def test_promote_sends_no_held_part_that_cannot_be_turned_into_files(tmp_path):
    mem, gen, step = tmp_path / "mem", "3", 4
    attempt = memory_store.attempt_for(gen, step)
    items, raw = _good()
    items[0]["raw"] = 10**9
    for node, base in ((0, memory_store.own_root), (1, None)):
        root = Path(base(str(mem), gen) if base else memory_store.held_root(str(mem), gen, 1))
        part = root / f"step-{step:012d}"
        for rank in (node * 2, node * 2 + 1):
            good, body = _good()
            good[0]["file"] = f"__{rank}_0.distcp"
            bad = [{**items[0], "file": f"__{rank}_0.distcp"}]
            _part(part, bad if node == 1 else good, body if node == 0 else raw, rank=rank)
            (part / ".dl-shards" / f"rank-{rank}.json").write_text(json.dumps(
                {"rank": rank, "node_rank": node, "local_world_size": 2, "world_size": 4, "attempt": attempt,
                 "step": step, "reads": [f"__{rank}_0.distcp"]}))
    memory_store.settle(str(mem), gen, step)
    sent, lines = [], []
    got = memory_store.promote(str(mem), gen, str(tmp_path / "ckpt"), newest_remote=None, owner_gone=lambda n: True,
                               push_held=lambda p, s, part: sent.append(part), push_older=lambda *a: None,
                               log=lines.append)
    assert got == step and sent == [], lines
    assert any("node 1's part of snapshot 4 cannot be turned" in line for line in lines)
    mine = tmp_path / "ckpt" / f"step-{step:012d}"
    assert torch.equal(torch.load(mine / "__1_0.distcp", weights_only=True), torch.arange(4))


def test_a_plain_value_keeps_its_bytes_only_while_it_is_the_same_value(tmp_path):
    """Sources.chunks reuses a pickled value's bytes while the value is equal (param_groups), and
    pickles again when it changes, even at the same size (a learning rate's schedule), only in
    sign (-0.0 equals 0.0 and is not the same bytes), or in place (a list)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    state = {"w": torch.arange(4, dtype=torch.float32), "lr": 0.001, "betas": (0.9, 0.99), "wd": 0.0,
             "params": ["layer.weight"]}
    planner = DefaultSavePlanner()
    meta = save(state, storage_writer=FileSystemWriter(str(tmp_path / "full")), planner=planner, no_dist=True)
    layout = memory_raw.layout_of(planner, meta.storage_data, 0)
    sources = memory_raw.Sources(planner)

    def value_of(chunks: list, fqn: str):
        i = next(k for k, wi in enumerate(planner.plan.items) if wi.index.fqn == fqn)
        return torch.load(io.BytesIO(bytes(chunks[i])), weights_only=True)

    first = sources.chunks(state, layout)
    again = sources.chunks(state, layout)
    assert value_of(again, "lr") == 0.001 and value_of(again, "betas") == (0.9, 0.99)
    assert [bytes(c) for c in again] == [bytes(c) for c in first]
    for fqn, value in [("lr", 0.002), ("betas", (0.8, 0.99)), ("wd", -0.0)]:
        state[fqn] = value
        got = value_of(sources.chunks(state, layout), fqn)
        assert got == value and repr(got) == repr(value), f"{fqn}: the step's own value, not the last one's"
    state["params"][0] = "layer.bias"  # a list changed in place: the same object, another value
    assert value_of(sources.chunks(state, layout), "params") == ["layer.bias"]
    state["w"].add_(1)  # a live buffer, refilled in place: its bytes are the step's too
    i = next(k for k, wi in enumerate(planner.plan.items) if wi.index.fqn == "w")
    assert bytes(sources.chunks(state, layout)[i]) == torch.arange(1, 5, dtype=torch.float32).numpy().tobytes()
