"""Attention over sink + local + selected pages, and the Quest page scores behind it.

``_score_pages_kernel``, grid (S, H, page tiles): the bound sum_d max(q_d kmin_d,
q_d kmax_d) is computed as two small matmuls, relu(q) . kmax + min(q, 0) . kmin, then
maxed over the query heads of the group.

``_select_pages_kernel``, grid (S, heads of the selection): sinks + local window + the
top-k candidates, written in page order with no sort: a radix select finds the k-th best
score, then one pass keeps what beats it. In torch (``reference.select_pages``) the same
tiny problem took 0.5-1.2 ms on an H200 whatever the length, more than the sparse
attention itself up to 64K tokens: a dozen launches (mask, topk, scatter, sort).

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
                                   pages_per_split=None, tile=None, warps=None):
    """Triton twin of ``reference.sparse_attention_decode``."""
    return decode_launch(q, layer, block_tables, context_lens, scale, out, selected=selected, n_selected=n_selected,
                         pages_per_split=pages_per_split, tile=tile, warps=warps)


@triton.jit
def _sortable(x):
    """float32 -> int32 with the same order (NaN as -3e38 and infinities clamped to
    +-3e38 first, as ``reference.select_pages`` does), so a threshold search can run on
    integers."""
    x = tl.where(x != x, -3e38, x)
    x = tl.minimum(tl.maximum(x, -3e38), 3e38)
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _select_pages_kernel(
    scores_ptr, stride_ss, stride_sh, context_lens, out_ptr, stride_os, stride_oh, n_out,
    max_pages, BS, N_SINK, N_LOCAL, TOP_K, WIDTH,
    HAS_SCORES: tl.constexpr, BLOCK: tl.constexpr,
):
    s = tl.program_id(0)
    hh = tl.program_id(1)
    ctx = tl.load(context_lens + s)
    n_pages = (ctx + BS - 1) // BS
    last = n_pages - 1
    local_lo = last - N_LOCAL + 1
    cand_end = tl.minimum(local_lo, max_pages)
    n_cand = tl.maximum(cand_end - N_SINK, 0)  # candidates: pages in [N_SINK, cand_end)
    k = tl.minimum(TOP_K, n_cand)
    row = scores_ptr + s.to(tl.int64) * stride_ss + hh * stride_sh
    offs = tl.arange(0, BLOCK)

    # The k-th best candidate score T, by radix select: four passes over the scores, each
    # a 256-bin histogram of the next 8 bits of the candidates that share the bits chosen
    # so far. No sort and no top-k buffer; the selection then comes out in page order by
    # itself (keys above T, then the first `need` keys equal to T).
    thresh = 2147483647
    need = 0
    if HAS_SCORES:
        if k > 0:
            bins = tl.arange(0, 256)
            prefix = 0  # the threshold's bits so far, in the unsigned order (sign bit flipped)
            k_left = k
            for r in tl.static_range(4):
                shift = 24 - 8 * r
                hist = tl.zeros([256], tl.int32)
                for c in range(N_SINK, cand_end, BLOCK):
                    idx = c + offs
                    cand = idx < cand_end
                    u = _sortable(tl.load(row + idx, mask=cand, other=0.0)) ^ -2147483648
                    if r > 0:
                        cand = cand & (((u ^ prefix) >> (shift + 8)) == 0)
                    hist += tl.histogram((u >> shift) & 255, 256, mask=cand)
                at_least = tl.sum(hist, axis=0) - tl.cumsum(hist, 0) + hist  # [256]: keys with digit >= bin
                digit = tl.max(tl.where(at_least >= k_left, bins, 0), axis=0)
                k_left -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
                prefix = prefix | (digit << shift)
            thresh = prefix ^ -2147483648
            need = k_left  # keys equal to the threshold to take, first pages first

    # Compaction in page order: sinks, the local window and the chosen candidates.
    out_row = out_ptr + s.to(tl.int64) * stride_os + hh * stride_oh
    written = 0
    ties = 0
    end = tl.minimum(n_pages, max_pages)
    for c in range(0, end, BLOCK):
        idx = c + offs
        live = idx < end
        chosen = (idx < N_SINK) | (idx >= local_lo)
        if HAS_SCORES:
            cand = (idx >= N_SINK) & (idx < cand_end)
            key = _sortable(tl.load(row + idx, mask=cand, other=0.0))
            eq = (cand & (key == thresh)).to(tl.int32)
            eq_rank = ties + tl.cumsum(eq, 0) - eq
            chosen = chosen | (cand & (key > thresh)) | ((eq == 1) & (eq_rank < need))
            ties += tl.sum(eq, axis=0)
        chosen = (chosen & live).to(tl.int32)
        pos = written + tl.cumsum(chosen, 0) - chosen
        tl.store(out_row + pos, idx, mask=(chosen == 1) & (pos < WIDTH))
        written += tl.sum(chosen, axis=0)
    for c in range(0, WIDTH, BLOCK):
        j = c + offs
        tl.store(out_row + j, tl.full([BLOCK], -1, tl.int32), mask=(j >= written) & (j < WIDTH))
    if hh == 0:
        tl.store(n_out + s, written)


def select_pages_triton(scores, context_lens, block_size, policy, max_pages=None):
    """Triton twin of ``reference.select_pages`` (no ``last_page``: the decode case): one
    program per (sequence, head of the selection), with no sort and no host reads."""
    top_k = policy.top_k_pages if policy.kind == "topk" else 0
    has_scores = scores is not None and top_k > 0
    if max_pages is None:
        max_pages = scores.shape[-1]
    s_n = context_lens.shape[0]
    hs = scores.shape[1] if has_scores else 1
    width = policy.n_sink_pages + policy.n_local_pages + top_k
    dev = context_lens.device
    selected = torch.empty(s_n, hs, width, dtype=torch.int32, device=dev)
    n_selected = torch.empty(s_n, dtype=torch.int32, device=dev)
    if has_scores:
        scores = scores.float()
        args = (scores, scores.stride(0), scores.stride(1))
    else:
        args = (selected, 0, 0)  # never read
    _select_pages_kernel[(s_n, hs)](
        *args, context_lens.to(torch.int32), selected, selected.stride(0), selected.stride(1), n_selected,
        max_pages, block_size, policy.n_sink_pages, policy.n_local_pages, top_k, width,
        HAS_SCORES=has_scores, BLOCK=256,
    )
    return selected, n_selected
