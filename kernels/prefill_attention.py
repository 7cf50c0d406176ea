"""Chunked-prefill attention: a chunk of one sequence's queries against its pages.

Grid (row tiles, H). A tile's rows are (query, head-in-group) pairs of one kv head, so
the GQA heads that share a page read it once. Each program walks the page list of the
chunk's plan (``reference.chunk_page_plan``: every page for dense, sinks + the chunk's
local range for window, plus the chunk's top-k pages for topk), a few pages a step
(``tile_pages``: 64 rows), with an online softmax: no score matrix larger than
[BLOCK_M, max(64, BS)] ever exists. Visibility of a key at position j for a query at i:
``j <= i``, ``j < ctx`` and, for pages marked local-only, ``page(j) > page(i) - n_local_pages``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._page_io import (attention_warps, check_supported, dot_flags, kind_code, load_tile_kv, page_args, page_tile, qk_dot,
                       softmax_step, stage_map, tile_pages)
from .reference import DENSE, chunk_page_plan


@triton.jit
def _prefill_kernel(
    q_ptr, stride_qn, stride_qh, out_ptr, stride_on, stride_oh,
    block_table, plan_pages, plan_local, stride_plan, plan_n,
    k_pages, v_pages, k_min, k_max, k_scale, v_scale, v_zero, stage_k, stage_v, stage_of_block,
    scale, H, n_q, start_pos, n_local,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
    TP: tl.constexpr, KIND: tl.constexpr, PER_HEAD_PLAN: tl.constexpr, DOT_FP32: tl.constexpr, DOT_BF16: tl.constexpr,
):
    mt = tl.program_id(0)
    h = tl.program_id(1)
    r = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # row = query * GROUP + head-in-group
    row_ok = r < n_q * GROUP
    qi = r // GROUP
    head = h * GROUP + r % GROUP
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + qi[:, None].to(tl.int64) * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32) * scale  # [BLOCK_M, D]
    q_pos = start_pos + qi
    q_pos = tl.where(row_ok, q_pos, -1)  # padding rows see nothing
    q_page = q_pos // BS
    last_pos = tl.max(q_pos, axis=0)
    ctx = start_pos + n_q

    hp = 0
    if PER_HEAD_PLAN:
        hp = h
    n_list = tl.load(plan_n + hp)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    offs_p = tl.arange(0, TP)
    offs_t = tl.arange(0, BS)
    for i in range(0, n_list, TP):  # TP pages of the plan a step (`tile_pages`)
        idx = i + offs_p
        live = idx < n_list
        p = tl.load(plan_pages + hp * stride_plan + idx, mask=live, other=0)
        # Pages wholly after this tile's queries are causally hidden: skip a step of them.
        if tl.min(tl.where(live, p, 2147483647), axis=0) * BS <= last_pos:
            local_only = tl.load(plan_local + hp * stride_plan + idx, mask=live, other=0)
            blk, slot, use_stage, valid = page_tile(p, live, ctx, block_table, stage_of_block, KIND, BS, TP)
            k, v = load_tile_kv(k_pages, v_pages, k_min, k_max, k_scale, v_scale, v_zero, stage_k, stage_v,
                                blk, slot, use_stage, live, h, H, KIND, BS, D, G, TP)
            v = tl.where(valid[:, None], v, 0.0)
            # Per key row: its position, and its page's plan entries, [TP, BS] -> [TP * BS].
            k_pos = tl.reshape(p[:, None] * BS + offs_t[None, :], (TP * BS,))
            k_page = tl.reshape(tl.broadcast_to(p[:, None], (TP, BS)), (TP * BS,))
            k_local = tl.reshape(tl.broadcast_to(local_only[:, None], (TP, BS)), (TP * BS,))
            vis = valid[None, :] & (k_pos[None, :] <= q_pos[:, None])
            near = (k_page[None, :] > q_page[:, None] - n_local) | (k_local[None, :] == 0)  # [BLOCK_M, TP * BS]
            vis = vis & near
            scores = qk_dot(q, k, DOT_FP32, DOT_BF16)
            scores = tl.where(vis, scores, float("-inf"))
            m, l, acc = softmax_step(scores, v, m, l, acc, DOT_FP32, DOT_BF16)

    res = acc / tl.where(l > 0, l, 1.0)[:, None]
    o_off = qi[:, None].to(tl.int64) * stride_on + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_off, res.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def paged_prefill_attention_triton(q, layer, block_table, start_pos, scale, policy=None, out=None, block_m=None,
                                   tile=None, warps=None):
    """Triton twin of ``reference.paged_prefill_attention``. ``tile``: pages per loop
    step (default `tile_pages`: 64 rows a step); ``warps``: per program (default
    `attention_warps`)."""
    policy = policy or DENSE
    check_supported(layer)
    spec = layer.spec
    n_q, hq, d = q.shape
    h = spec.n_kv_heads
    group = hq // h
    # The plan (and, for topk, the chunk's page scores) is small host-side torch work.
    pages, local_only, n_list = chunk_page_plan(q, layer, block_table, start_pos, policy)
    pages = pages.to(torch.int32).contiguous()
    local_only = local_only.to(torch.int32).contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    if out is None:
        # After the contiguous(): empty_like keeps a dense q's strides, and the kernel
        # writes `out` as unit-stride rows (a permuted q gave a permuted, wrongly written out).
        out = torch.empty_like(q)
    rows = n_q * group
    dot_fp32, dot_bf16 = dot_flags(layer)
    # fp32 pages take an exact (FMA, not tensor-core) dot: at 64 rows its tiles spilled
    # 14-30 KB of registers a thread on sm_90 (benchmarks/results/kernels_compile_sm90_before.json);
    # at 16, at most 12 bytes (kernels_compile_sm90.json).
    block_m = block_m or max(16, min(16 if dot_fp32 else 64, triton.next_power_of_2(rows)))
    _prefill_kernel[(triton.cdiv(rows, block_m), h)](
        q, q.stride(0), q.stride(1), out, out.stride(0), out.stride(1),
        block_table.to(torch.int32), pages, local_only, pages.stride(0), n_list.to(torch.int32),
        *page_args(layer), stage_map(layer), float(scale), h, n_q, int(start_pos), policy.n_local_pages,
        GROUP=group, BLOCK_M=block_m, BS=spec.block_size, D=d, G=spec.group_size,
        TP=tile_pages(spec.block_size, tile), KIND=kind_code(layer), PER_HEAD_PLAN=pages.shape[0] > 1, DOT_FP32=dot_fp32, DOT_BF16=dot_bf16,
        num_warps=attention_warps(warps),
    )
    return out
