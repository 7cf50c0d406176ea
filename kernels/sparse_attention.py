"""Attention over sink + local + selected pages, and the Quest page scores behind it.

``_score_pages_kernel``, grid (S, H, page tiles): the bound sum_d max(q_d kmin_d,
q_d kmax_d) is computed as two small matmuls, relu(q) . kmax + min(q, 0) . kmin, then
maxed over the query heads of the group. Selection (top-k) stays in torch
(``reference.select_pages``): it is a tiny [S, H, n_pages] problem and torch.topk is fast.

The attention itself is the decode kernel of ``paged_attention`` with SPARSE on: the
programs walk the selection list instead of every page, split the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from .paged_attention import _launch_shape, decode_launch


@triton.jit
def _score_pages_kernel(
    q_ptr, stride_qs, stride_qh,
    out_ptr, stride_os, stride_oh,
    block_tables, stride_bt, context_lens, k_min, k_max,
    H, max_pages,
    GROUP: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, TP: tl.constexpr,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    pt = tl.program_id(2)
    rows = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    row_ok = rows < GROUP
    q_off = s.to(tl.int64) * stride_qs + (h * GROUP + rows[:, None]) * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0).to(tl.float32)  # [GP, D]

    ctx = tl.load(context_lens + s)
    n_pages = (ctx + BS - 1) // BS
    pages = pt * TP + tl.arange(0, TP)  # [TP]
    live = pages < n_pages
    blk = tl.load(block_tables + s.to(tl.int64) * stride_bt + pages, mask=live, other=0).to(tl.int64)
    summ = (blk[:, None] * H + h) * D + offs_d[None, :]  # [TP, D]
    # Dead pages load 0 instead of +-inf so that 0 * inf cannot poison the dot.
    kmn = tl.load(k_min + summ, mask=live[:, None], other=0.0)
    kmx = tl.load(k_max + summ, mask=live[:, None], other=0.0)
    bound = tl.dot(tl.maximum(q, 0.0), tl.trans(kmx), input_precision="ieee")
    bound += tl.dot(tl.minimum(q, 0.0), tl.trans(kmn), input_precision="ieee")  # [GP, TP]
    bound = tl.where(row_ok[:, None], bound, float("-inf"))
    best = tl.max(bound, axis=0)  # [TP]: a page matters if any head of the group may want it
    best = tl.where(live, best, float("-inf"))
    tl.store(out_ptr + s.to(tl.int64) * stride_os + h * stride_oh + pages, best, mask=pages < max_pages)


def score_pages_triton(q, layer, block_tables, context_lens, per_kv_head=True, out=None):
    """Triton twin of ``reference.score_pages`` -> [S, H or 1, max_pages] float32."""
    q, s_n, d, h, group, gp = _launch_shape(q, layer)
    spec = layer.spec
    max_pages = block_tables.shape[1]
    scores = torch.empty(s_n, h, max_pages, dtype=torch.float32, device=q.device)
    block_tables = block_tables.to(torch.int32)
    tp = 16
    _score_pages_kernel[(s_n, h, triton.cdiv(max_pages, tp))](
        q, q.stride(0), q.stride(1), scores, scores.stride(0), scores.stride(1),
        block_tables, block_tables.stride(0), context_lens.to(torch.int32), layer.k_min, layer.k_max,
        h, max_pages, GROUP=group, GP=gp, BS=spec.block_size, D=d, TP=tp,
    )
    return reference.finish_page_scores(scores, per_kv_head, out)


def sparse_attention_decode_triton(q, layer, block_tables, selected, n_selected, context_lens, scale, out=None,
                                   pages_per_split=None, tile=None):
    """Triton twin of ``reference.sparse_attention_decode``."""
    return decode_launch(q, layer, block_tables, context_lens, scale, out, selected=selected, n_selected=n_selected,
                         pages_per_split=pages_per_split, tile=tile)
