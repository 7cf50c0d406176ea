"""Decode attention over a block table, flash-decoding style.

Phase 1 (``_decode_split_kernel``), grid (S, H, n_splits): one program takes one kv head
of one sequence and a contiguous range of its pages (or of its selected pages, when
SPARSE), and all the query heads that share that kv head as the rows of a tile (padded
to 16 for tl.dot). It walks that range a few pages a loop step (``tile_pages``: 64
rows, so 16-token pages are read four at a time) and leaves an unnormalised partial
output with its running max and sum. Splitting along the sequence keeps every SM busy
when S * H is small and the context long, which is the decode case this tool exists for.

Phase 2 (``_decode_reduce_kernel``), grid (S, H): merges the partials with the usual
log-sum-exp rescaling, in chunks of splits so any number of splits works.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._page_io import (attention_warps, check_supported, dot_flags, kind_code, load_tile_kv, page_args, page_tile, qk_dot,
                       softmax_step, stage_map, tile_pages)
from .layout import PagedKVLayer


# pages_per_split is a runtime value, unspecialized: as a constexpr every context length
# whose split size crossed a power of two compiled five more decode variants (~1 s each).
# n_splits too (Triton specializes ints equal to 1 or divisible by 16 by default).
@triton.jit(do_not_specialize=["pages_per_split", "n_splits"])
def _decode_split_kernel(
    q_ptr, stride_qs, stride_qh,
    part_acc, part_m, part_l,  # [S, H, n_splits, GP, D], [S, H, n_splits, GP] float32
    block_tables, stride_bt, context_lens,
    selected, stride_sel_s, stride_sel_h, n_selected,
    k_pages, v_pages, k_min, k_max, k_scale, v_scale, v_zero, stage_k, stage_v, stage_of_block,
    scale, H, n_splits,
    GROUP: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
    pages_per_split, TP: tl.constexpr, KIND: tl.constexpr, SPARSE: tl.constexpr,
    DOT_FP32: tl.constexpr, DOT_BF16: tl.constexpr,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    ctx = tl.load(context_lens + s)
    if SPARSE:
        n_items = tl.load(n_selected + s)
    else:
        n_items = (ctx + BS - 1) // BS
    i0 = sp * pages_per_split
    i1 = tl.minimum(i0 + pages_per_split, n_items)

    rows = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    row_ok = rows < GROUP
    q_off = s.to(tl.int64) * stride_qs + (h * GROUP + rows[:, None]) * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0).to(tl.float32) * scale  # [GP, D]

    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    offs_p = tl.arange(0, TP)
    for i in range(i0, i1, TP):  # TP pages a step (`tile_pages`)
        idx = i + offs_p
        live = idx < i1
        if SPARSE:
            p = tl.load(selected + s.to(tl.int64) * stride_sel_s + h * stride_sel_h + idx, mask=live, other=0)
        else:
            p = idx
        blk, slot, use_stage, valid = page_tile(p, live, ctx, block_tables + s.to(tl.int64) * stride_bt,
                                                stage_of_block, KIND, BS, TP)
        k, v = load_tile_kv(k_pages, v_pages, k_min, k_max, k_scale, v_scale, v_zero, stage_k, stage_v,
                            blk, slot, use_stage, live, h, H, KIND, BS, D, G, TP)
        # Rows past the fill are stale memory: zero them so 0 * garbage cannot be NaN.
        v = tl.where(valid[:, None], v, 0.0)
        scores = qk_dot(q, k, DOT_FP32, DOT_BF16)  # [GP, TP * BS]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m, l, acc = softmax_step(scores, v, m, l, acc, DOT_FP32, DOT_BF16)

    part = ((s.to(tl.int64) * H + h) * n_splits + sp) * GP + rows  # [GP]
    tl.store(part_m + part, m)
    tl.store(part_l + part, l)
    tl.store(part_acc + part[:, None] * D + offs_d[None, :], acc)


@triton.jit(do_not_specialize=["n_splits"])
def _decode_reduce_kernel(
    out_ptr, stride_os, stride_oh,
    part_acc, part_m, part_l,
    H, n_splits,
    GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    rows = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    offs_sp = tl.arange(0, SPLIT_BLOCK)
    big_m = tl.full([GP], float("-inf"), tl.float32)
    total = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    base = (s.to(tl.int64) * H + h) * n_splits
    for c in range(0, n_splits, SPLIT_BLOCK):
        sp = c + offs_sp  # [SB]
        sp_ok = sp < n_splits
        idx = (base + sp[:, None]) * GP + rows[None, :]  # [SB, GP]
        m_c = tl.load(part_m + idx, mask=sp_ok[:, None], other=float("-inf"))
        l_c = tl.load(part_l + idx, mask=sp_ok[:, None], other=0.0)
        a_c = tl.load(part_acc + idx[:, :, None] * D + offs_d[None, None, :], mask=sp_ok[:, None, None], other=0.0)
        m_new = tl.maximum(big_m, tl.max(m_c, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.exp(m_c - m_safe[None, :])  # [SB, GP]; empty splits weigh 0
        alpha = tl.exp(big_m - m_safe)
        total = total * alpha + tl.sum(l_c * w, axis=0)
        acc = acc * alpha[:, None] + tl.sum(a_c * w[:, :, None], axis=0)
        big_m = m_new
    res = acc / tl.where(total > 0, total, 1.0)[:, None]
    o_off = s.to(tl.int64) * stride_os + (h * GROUP + rows[:, None]) * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_off, res.to(out_ptr.dtype.element_ty), mask=(rows < GROUP)[:, None])


class LaunchShape(NamedTuple):
    """What every decode-style launcher derives from (q, layer) before its grid."""

    q: torch.Tensor  # [S, HQ, D], unit stride along D (what the kernels index)
    n_seqs: int  # S
    head_dim: int  # D
    n_kv_heads: int  # H
    group: int  # HQ // H query heads per kv head
    group_pad: int  # GP: the group padded to a tl.dot tile (a power of two >= 16)


def _launch_shape(q: torch.Tensor, layer: PagedKVLayer) -> LaunchShape:
    """Check the layer suits the kernels and read the launch shape off q [S, HQ, D]."""
    check_supported(layer)
    s_n, hq, d = q.shape
    h = layer.spec.n_kv_heads
    group = hq // h
    q = q if q.stride(-1) == 1 else q.contiguous()
    return LaunchShape(q, s_n, d, h, group, max(16, triton.next_power_of_2(group)))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a few splits still exercise the reduction


def _plan_splits(n_seqs: int, n_kv_heads: int, max_items: int, device: torch.device, pages_per_split=None,
                 step_pages: int = 1):
    """Pages per split so that about two waves of programs cover the GPU, and at least
    one loop step (``step_pages``) each."""
    if pages_per_split is None:
        want = max(1, (2 * _num_sms(device)) // max(1, n_seqs * n_kv_heads))
        pages_per_split = max(1, triton.cdiv(triton.cdiv(max_items, want), step_pages)) * step_pages  # whole steps
    return pages_per_split, max(1, triton.cdiv(max_items, pages_per_split))


def decode_launch(q, layer: PagedKVLayer, block_tables, context_lens, scale, out, selected=None, n_selected=None,
                  pages_per_split=None, tile=None, warps=None):
    """Shared launcher of dense (selected None) and sparse decode. ``tile``: pages per
    loop step (default `tile_pages`: 64 rows a step); ``warps``: per program (default
    `attention_warps`)."""
    q, s_n, d, h, group, gp = _launch_shape(q, layer)
    spec = layer.spec
    sparse = selected is not None
    max_items = selected.shape[-1] if sparse else block_tables.shape[1]
    tp = tile_pages(spec.block_size, tile)
    pps, n_splits = _plan_splits(s_n, h, max_items, q.device, pages_per_split, tp)
    if out is None:
        out = torch.empty_like(q)
    part_acc = torch.empty(s_n, h, n_splits, gp, d, dtype=torch.float32, device=q.device)
    part_m = torch.empty(s_n, h, n_splits, gp, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    block_tables = block_tables.to(torch.int32)
    context_lens = context_lens.to(torch.int32)
    if sparse:
        selected = selected.to(torch.int32)
        sel_h_stride = 0 if selected.shape[1] == 1 else selected.stride(1)  # shared selection
        sel_args = (selected, selected.stride(0), sel_h_stride, n_selected.to(torch.int32))
    else:
        sel_args = (block_tables, 0, 0, context_lens)  # unused placeholders
    dot_fp32, dot_bf16 = dot_flags(layer)
    _decode_split_kernel[(s_n, h, n_splits)](
        q, q.stride(0), q.stride(1), part_acc, part_m, part_l,
        block_tables, block_tables.stride(0), context_lens, *sel_args,
        *page_args(layer), stage_map(layer), float(scale), h, n_splits,
        GROUP=group, GP=gp, BS=spec.block_size, D=d, G=spec.group_size,
        pages_per_split=pps, TP=tp, KIND=kind_code(layer), SPARSE=sparse, DOT_FP32=dot_fp32, DOT_BF16=dot_bf16,
        num_warps=attention_warps(warps),
    )
    _decode_reduce_kernel[(s_n, h)](
        out, out.stride(0), out.stride(1), part_acc, part_m, part_l, h, n_splits,
        GROUP=group, GP=gp, D=d, SPLIT_BLOCK=min(8, triton.next_power_of_2(n_splits)),
    )
    return out


def paged_attention_decode_triton(q, layer, block_tables, context_lens, scale, out=None, pages_per_split=None,
                                  tile=None, warps=None):
    """Triton twin of ``reference.paged_attention_decode``."""
    return decode_launch(q, layer, block_tables, context_lens, scale, out, pages_per_split=pages_per_split, tile=tile,
                         warps=warps)
