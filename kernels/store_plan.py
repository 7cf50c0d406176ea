"""The bookkeeping of a K/V write, planned once per step and applied to every layer.

A write's bookkeeping (which blocks it touches and their fill, which staging slots they
take, which pages seal, how a chunk that needs more slots than are free splits into
pieces) depends only on the slot mapping and the staging state. Every layer of a model
gets the same writes, so every layer's staging state is the same, and so is the plan.
Computing it takes values back from the device (`tolist`, `nonzero`, `unique`); done per
layer, that is several host-device synchronisations per layer per token on a GPU: the
likely reason the engine decoded at 13-26 tok/s on an H200 (BENCHMARKS.md, "GPU kernels").
Here it is done once per step (`plan_store`: one device read for the slot mapping, one
for the staging state), and `apply_store` then issues only device work: writes, the
bookkeeping updates as index writes, summaries and seals, whose shapes are all known on
the host. (`tests/kernels/test_store_plan.py` applies a plan to a layer on the "meta"
device, where any read of a value fails.)

A plan is valid for the staging state it was made from: each layer counts the plans
applied to it and the slots released (``PagedKVLayer.store_version``), and a plan made
at another count is refused, so a layer that missed a write cannot be silently
corrupted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, fields, replace

import torch

from .layout import PagedKVLayer


@dataclass(frozen=True)
class StorePiece:
    """Rows ``rows`` of a write, stored together; every tensor int32 on the layer's device.
    Quantized kinds: the rows go to staging slots, and full pages seal at the end."""

    rows: slice
    dst: torch.Tensor  # [n] where each row goes: its staging slot (quantized) or its block
    offsets: torch.Tensor  # [n] row within the page
    touched: torch.Tensor  # [T] blocks whose key summary is recomputed
    touched_src: torch.Tensor  # [T] where their rows are now: staging slot or block
    fill: torch.Tensor  # [T] rows filled after the write
    assign_blocks: torch.Tensor  # [A] blocks that take a staging slot before the write...
    assign_slots: torch.Tensor  # [A] ... and their slots
    sealed: torch.Tensor  # [Z] blocks full after the write: quantised, slots freed
    sealed_slots: torch.Tensor  # [Z]


@dataclass(frozen=True)
class StorePlan:
    n_rows: int
    pieces: tuple[StorePiece, ...]
    version: int  # the layers' store_version it was made at

    def to(self, device: torch.device | str) -> StorePlan:
        moved = tuple(
            replace(p, **{f.name: getattr(p, f.name).to(device) for f in fields(p) if f.name != "rows"})
            for p in self.pieces
        )
        return replace(self, pieces=moved)


def plan_store(layer: PagedKVLayer, slot_mapping: torch.Tensor | list[int]) -> StorePlan:
    """The plan of writing rows to ``slot_mapping`` [N] (block * BS + offset) in a layer
    at its current staging state; the same for every layer at that state. Raises
    RuntimeError when a page needs a staging slot and none is free or can be freed."""
    spec = layer.spec
    bs = spec.block_size
    slots = slot_mapping.tolist() if isinstance(slot_mapping, torch.Tensor) else list(slot_mapping)
    if any(s < 0 or s >= layer.num_blocks * bs for s in slots):
        raise ValueError(f"slot_mapping holds slots outside the pool's {layer.num_blocks * bs}")
    blocks = [s // bs for s in slots]
    offsets = [s % bs for s in slots]
    if not spec.quantized:
        fill = _fills(blocks, offsets)
        pieces = [_Piece(0, len(slots), blocks, offsets, fill, list(fill), [], {})] if slots else []
        return _upload(pieces, len(slots), layer)

    uniq = sorted(set(blocks))
    state = torch.cat([layer.stage_of_block[torch.tensor(uniq, dtype=torch.long, device=layer.device)],
                       layer.block_of_stage]).tolist()  # one device read
    stage = dict(zip(uniq, state[: len(uniq)]))
    free = [i for i, owner in enumerate(state[len(uniq):]) if owner < 0]  # ascending
    pieces: list[_Piece] = []
    start = 0
    fill: dict[int, int] = {}  # blocks this piece touches -> fill after it
    assigned: list[tuple[int, int]] = []
    i = 0
    while i < len(slots):
        b = blocks[i]
        j = i
        while j < len(slots) and blocks[j] == b:
            j += 1
        if stage[b] < 0:
            if not free and i > start:  # seal what this piece fills, to free slots, and go on
                pieces.append(_close(start, i, blocks, offsets, fill, assigned, stage, free, layer))
                start, fill, assigned = i, {}, []
            if not free:
                need = len({x for x in blocks[i:] if stage[x] < 0})
                raise RuntimeError(
                    f"KV staging pool exhausted: {need} pages need a slot, 0 free of {layer.n_stage}; "
                    "allocate more n_stage or release_blocks() of finished sequences"
                )
            stage[b] = free.pop(0)
            assigned.append((b, stage[b]))
        fill[b] = max(fill.get(b, 0), max(offsets[i:j]) + 1)
        i = j
    if start < len(slots):
        pieces.append(_close(start, len(slots), blocks, offsets, fill, assigned, stage, free, layer))
    return _upload(pieces, len(slots), layer)


def _fills(blocks: list[int], offsets: list[int]) -> dict[int, int]:
    """Each block written -> rows filled after the write (float kinds: no staging)."""
    fill: dict[int, int] = {}
    for b, o in zip(blocks, offsets):
        fill[b] = max(fill.get(b, 0), o + 1)
    return fill


@dataclass
class _Piece:
    """A piece on the host, as lists (see StorePiece)."""

    start: int
    end: int
    dst: list[int]
    offsets: list[int]
    fill: dict[int, int]
    touched_src: list[int]
    assigned: list[tuple[int, int]]
    sealed: dict[int, int]


def _close(start, end, blocks, offsets, fill, assigned, stage, free, layer) -> _Piece:
    """The piece of rows [start, end); its full pages seal and give their slots back."""
    bs = layer.spec.block_size
    sealed = {b: stage[b] for b, f in fill.items() if f == bs}
    piece = _Piece(start, end, [stage[b] for b in blocks[start:end]], offsets[start:end], fill,
                   [stage[b] for b in fill], assigned, sealed)
    for b, slot in sealed.items():
        stage[b] = -1
        bisect.insort(free, slot)
    return piece


def _upload(pieces: list[_Piece], n_rows: int, layer: PagedKVLayer) -> StorePlan:
    """Every piece's integers in one int32 tensor on the layer's device (one host-to-device
    copy per step), each field a view of it."""
    flat: list[int] = []
    spans: list[dict[str, tuple[int, int]]] = []
    for p in pieces:
        lists = {
            "dst": p.dst, "offsets": p.offsets, "touched": list(p.fill), "touched_src": p.touched_src,
            "fill": list(p.fill.values()), "assign_blocks": [b for b, _ in p.assigned],
            "assign_slots": [s for _, s in p.assigned], "sealed": list(p.sealed), "sealed_slots": list(p.sealed.values()),
        }
        at = {}
        for name, values in lists.items():
            at[name] = (len(flat), len(flat) + len(values))
            flat.extend(values)
        spans.append(at)
    host = torch.tensor(flat, dtype=torch.int32)
    if layer.device.type == "cuda":  # pinned: the copy joins the stream, no wait for it
        host = host.pin_memory()
    data = host.to(layer.device, non_blocking=True)
    out = tuple(
        StorePiece(rows=slice(p.start, p.end), **{name: data[a:b] for name, (a, b) in at.items()})
        for p, at in zip(pieces, spans)
    )
    return StorePlan(n_rows, out, layer.store_version)


def apply_store(ops, layer: PagedKVLayer, k_new: torch.Tensor, v_new: torch.Tensor, plan: StorePlan) -> None:
    """Write K/V rows [N, H, D] as ``plan`` says, with the data operations of ``ops``
    (``reference.StoreOps``). Device work only: nothing is read back to the host."""
    spec = layer.spec
    if k_new.shape != v_new.shape or k_new.shape[1:] != (spec.n_kv_heads, spec.head_dim):
        raise ValueError(f"k/v rows must be [N, {spec.n_kv_heads}, {spec.head_dim}], got {tuple(k_new.shape)}")
    if k_new.shape[0] != plan.n_rows:
        raise ValueError(f"the store plan is for {plan.n_rows} rows, got {k_new.shape[0]}")
    if plan.version != layer.store_version:
        raise RuntimeError(
            f"store plan made at staging state {plan.version}, layer is at {layer.store_version}: "
            "every layer must get the same writes and releases"
        )
    for p in plan.pieces:
        k, v = k_new[p.rows], v_new[p.rows]
        if not spec.quantized:
            ops.write_rows(layer.k_pages, p.dst, p.offsets, k)
            ops.write_rows(layer.v_pages, p.dst, p.offsets, v)
            ops.refresh_summary(layer, layer.k_pages, p.touched_src, p.fill, p.touched)
            continue
        if p.assign_blocks.numel():
            layer.stage_of_block[p.assign_blocks.long()] = p.assign_slots
            layer.block_of_stage[p.assign_slots.long()] = p.assign_blocks
        ops.write_rows(layer.stage_k, p.dst, p.offsets, k)
        ops.write_rows(layer.stage_v, p.dst, p.offsets, v)
        ops.refresh_summary(layer, layer.stage_k, p.touched_src, p.fill, p.touched)
        if p.sealed.numel():
            ops.seal(layer, p.sealed, p.sealed_slots)
            layer.block_of_stage[p.sealed_slots.long()] = -1
            layer.stage_of_block[p.sealed.long()] = -1
    layer.store_version += 1
