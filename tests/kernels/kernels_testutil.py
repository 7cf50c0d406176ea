"""Builders and naive oracles shared by the kernel tests (plain loops: clarity over speed)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import kernels
from kernels import reference as R


def poisoned_layer(spec: kernels.KVCacheSpec, num_blocks: int, n_stage: int = 8) -> kernels.PagedKVLayer:
    """A pool whose never-written memory is NaN (floats) or the e4m3 NaN code 0x7F
    (fp8 pages), so any read of an unwritten row or scale shows up in the result."""
    layer = kernels.allocate(spec, num_blocks, n_stage=n_stage)
    for name in ("k_pages", "v_pages", "k_scale", "v_scale", "v_zero", "stage_k", "stage_v"):
        t = getattr(layer, name)
        if t is None:
            continue
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif spec.kv_dtype == "fp8":
            t.fill_(0x7F)
        else:
            t.fill_(0xAB)
    return layer


@dataclass
class Filled:
    layer: kernels.PagedKVLayer
    block_tables: torch.Tensor  # [S, max_pages] int32, -1 padded
    context_lens: torch.Tensor  # [S] int32
    keys: list  # per sequence [L, H, D] float32 originals
    values: list


def fill(spec, lens, seed=0, extra_pages=1, n_stage=8, store=None, outliers=True, chunk=None) -> Filled:
    """Store random K/V for sequences of ``lens`` tokens, interleaving the sequences in
    chunks of random size (prefill pieces, then single decode tokens), into randomly
    permuted blocks. ``store`` defaults to the reference kv_store."""
    store = store or R.kv_store
    g = torch.Generator().manual_seed(seed)
    bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
    pages = [math.ceil(n / bs) for n in lens]
    max_pages = max(pages) + extra_pages
    nb = sum(pages) + 2
    layer = poisoned_layer(spec, nb, n_stage=n_stage)
    if spec.kv_dtype == "int4":  # uneven query weights: key widths from 0 to 8 bits
        layer.k_weight = torch.rand(h, d, generator=g) ** 6
    perm = torch.randperm(nb, generator=g)
    bt = torch.full((len(lens), max_pages), -1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(pages):
        bt[s, :n] = perm[used : used + n].to(torch.int32)
        used += n
    keys, values = [], []
    for n in lens:
        k = torch.randn(n, h, d, generator=g)
        if outliers:  # KIVI's reason for per-channel keys: a few large channels
            k[:, :, 0] *= 8.0
        keys.append(k)
        values.append(torch.randn(n, h, d, generator=g))
    written = [0] * len(lens)
    while any(w < n for w, n in zip(written, lens)):
        rows_k, rows_v, slots = [], [], []
        for s, n in enumerate(lens):
            if written[s] >= n:
                continue
            step = chunk or int(torch.randint(1, 2 * bs + 3, (1,), generator=g))
            step = min(step, n - written[s])
            pos = torch.arange(written[s], written[s] + step)
            slots.append(bt[s, pos // bs].long() * bs + pos % bs)
            rows_k.append(keys[s][pos])
            rows_v.append(values[s][pos])
            written[s] += step
        store(layer, torch.cat(rows_k), torch.cat(rows_v), torch.cat(slots))
    return Filled(layer, bt, torch.tensor(lens, dtype=torch.int32), keys, values)


def page_kv(layer, block: int, n_rows: int):
    """Keys and values [n_rows, H, D] float32 of one page as attention must see them,
    decoded straight from the layout spec (independent of reference.gather_kv)."""
    spec = layer.spec
    kind = spec.kv_dtype
    if spec.quantized and n_rows < spec.block_size:
        slot = int(layer.stage_of_block[block])
        assert slot >= 0, "a partial page of a quantized kind must be staged"
        return layer.stage_k[slot, :n_rows].float(), layer.stage_v[slot, :n_rows].float()
    if kind in kernels.FLOAT_KINDS:
        k, v = layer.k_pages[block].float(), layer.v_pages[block].float()
    elif kind == "fp8":
        k = layer.k_pages[block].view(torch.float8_e4m3fn).float() * layer.k_scale[block][None, :, None]
        v = layer.v_pages[block].view(torch.float8_e4m3fn).float() * layer.v_scale[block][None, :, None]
    else:
        qmax = 255 if kind == "int8" else 15
        kc, vc = layer.k_pages[block], layer.v_pages[block]
        kmin, kmax = layer.k_min[block], layer.k_max[block]  # [H, D]
        if kind == "int4":
            vc = torch.stack((vc & 15, vc >> 4), -1).flatten(-2)
            widths = torch.stack((layer.k_bits[block] & 15, layer.k_bits[block] >> 4), -1).flatten(-2).long()  # [H, D]
            k = naive_bitstream_keys(kc, widths, kmin, kmax)
        else:
            k = kmin + kc.float() * ((kmax - kmin) / qmax)
        grp = spec.group_size
        zero = layer.v_zero[block].float().repeat_interleave(grp, dim=-1)  # [BS, H, D]
        scl = layer.v_scale[block].float().repeat_interleave(grp, dim=-1)
        v = zero + vc.float() * scl
    return k[:n_rows], v[:n_rows]


def naive_bitstream_keys(rows, widths, kmin, kmax):
    """int4 key rows [BS, H, D/2] bytes, widths [H, D] -> keys [BS, H, D]: each row read
    as a list of bits, channel c's code the next w_c of them, least significant first."""
    bits = ((rows.long()[..., None] >> torch.arange(8)) & 1).flatten(-2)  # [BS, H, 4D]
    keys = torch.empty(*rows.shape[:-1], widths.shape[-1])
    for h in range(widths.shape[0]):
        at = 0
        for c, w in enumerate(widths[h].tolist()):
            code = sum(bits[:, h, at + j] << j for j in range(w)) if w else torch.zeros(rows.shape[0], dtype=torch.long)
            at += w
            span = kmax[h, c] - kmin[h, c]
            keys[:, h, c] = kmin[h, c] + code.float() * (span / (2**w - 1)) if w else kmin[h, c] + span * 0.5
        assert at == 4 * widths.shape[-1]
    return keys


def materialize(f: Filled, s: int):
    """A sequence's whole K/V [L, H, D] as attention must see it."""
    bs = f.layer.spec.block_size
    n = int(f.context_lens[s])
    ks, vs = [], []
    for p in range(math.ceil(n / bs)):
        k, v = page_kv(f.layer, int(f.block_tables[s, p]), min(bs, n - p * bs))
        ks.append(k)
        vs.append(v)
    return torch.cat(ks), torch.cat(vs)


def naive_attention(q, k, v, scale, visible):
    """q [R, HQ, D], k/v [T, H, D], visible [R, HQ, T] bool -> [R, HQ, D] float32."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [T, HQ, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("rhd,thd->rht", q.float(), k) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("rht,thd->rhd", scores.softmax(-1), v)


def naive_bound(q, kmin, kmax):
    """The Quest bound by its definition: q [..., D], kmin/kmax [..., D] -> [...]."""
    return torch.maximum(q * kmin, q * kmax).sum(-1)


def dot_tolerance(layer) -> float:
    """Tolerance of a Triton result vs the float32 reference, from the kernel's dot
    precision: 16-bit operands lose about one eps of the dtype per rounding."""
    from kernels._page_io import dot_flags

    fp32, bf16 = dot_flags(layer)
    if fp32:
        return 2e-5
    return 8 * (2.0**-7 if bf16 else 2.0**-10)
