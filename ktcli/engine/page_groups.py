"""Sparse attention of a chunk in one-page query groups over gathered pages (CPU and torch).

This is the attention of `KernelKVCache._remapped`: sparse policies at remapped (virtual)
positions, or at true positions for keys stored unroped. A chunk's queries go in groups
of one page. Each group selects its own pages (sinks, top-k by Quest's bound, the
question's pages, its local pages: `group_page_plans`, one pass for the whole chunk),
reads them through one gather (`virtual_plan`: dequantised, exact rows swapped in, keys
turned to their virtual positions) and attends over them with two batched products
around a causal softmax (`attend_columns`): the pages ascend and end at the group's own
rows, so the mask is a prefix of the columns that grows by one per query. A decode step
on int8/int4 pages does all of that in one C++ pass (`decode_remapped`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

import kernels
from kernels import AttentionPolicy
from kernels.reference import chunk_page_plan, chunk_scores, gather_kv, quest_bound, select_pages
from ktcli.engine import cpu_kivi_attention, prefill_attention
from ktcli.engine.exact_sinks import ExactRows, swap_in_

# The Quest bounds of a tile of groups ([H, groups, rows, pages] fp32) stay under this.
TILE_BYTES = 64 << 20


def group_page_plans(q: torch.Tensor, layer, table: torch.Tensor, start: int, policy: AttentionPolicy,
                     extra: torch.Tensor | None = None) -> list[torch.Tensor]:
    """`chunk_page_plan`'s pages for every one-page group of a chunk q [N, HQ, D]
    (unrotated, positions start..), in one pass: one Quest bound over the chunk's rows, a
    max per group, one `select_pages` over the groups as if they were sequences. A group
    at page g sees pages up to g, its own top-k among those before its local ones, the
    sinks, its local pages and the `extra` pages up to g. Returns per group (in order)
    pages [Hs, L] int32 ascending, -1 padded (Hs: kv heads, or 1 for one selection per
    sequence). Calling `chunk_page_plan` per group instead costs ~1 ms of small torch
    ops each, 8 groups per 512-token chunk per layer."""
    bs = layer.spec.block_size
    dev = q.device
    end = start + q.shape[0]
    g_first, g_last = start // bs, (end - 1) // bs
    n_total = g_last + 1
    if g_first == g_last:  # one group (a decode step): one C++ call on the CPU
        pages = cpu_kivi_attention.page_plan(q, layer, table, n_total, policy, extra)
        if pages is not None:
            return [pages]
    groups = torch.arange(g_first, n_total, device=dev)
    ends = torch.clamp((groups + 1) * bs, max=end)  # each group's context
    scores = None
    if policy.kind == "topk" and policy.top_k_pages > 0:
        scores = _group_scores(q, layer, table, start, n_total, policy.per_kv_head)
    if g_first == g_last:  # one group (a decode step): the same pages in fewer operations
        visit = _one_group_visits(scores, n_total, policy, dev)
    else:
        sel, _ = select_pages(scores, ends, bs, policy, max_pages=n_total, last_page=groups)  # [groups, Hs, width]
        visit = torch.zeros(*sel.shape[:2], n_total + 1, dtype=torch.bool, device=dev)
        visit.scatter_(2, torch.where(sel >= 0, sel.long(), n_total), True)  # padding -> the spare last column
        visit = visit[..., :n_total]
    idx = torch.arange(n_total, device=dev)
    if extra is not None and extra.numel():
        forced = torch.zeros(n_total, dtype=torch.bool, device=dev)
        forced[extra.long()[(extra >= 0) & (extra < n_total)]] = True
        visit |= forced & (idx <= groups[:, None])[:, None, :]  # a group sees none past its own page
    keyed = torch.where(visit, idx, n_total).sort(dim=-1).values  # [groups, Hs, P]: visited first, ascending
    pages = torch.where(keyed < n_total, keyed, -1).to(torch.int32)
    widths = visit.sum(-1).amax(-1).tolist()  # [groups]: one read for the chunk
    return [pages[g, :, :w] for g, w in enumerate(widths)]


def _one_group_visits(scores: torch.Tensor | None, n_total: int, policy: AttentionPolicy,
                      device: torch.device) -> torch.Tensor:
    """`select_pages` for the one group at the last page (n_total - 1), as a mask [1, Hs,
    n_total]: its sinks, its local pages and the top-k of the candidates between them
    (scores [1, Hs, n_total], or None for no top-k)."""
    hs = scores.shape[1] if scores is not None else 1
    visit = torch.zeros(1, hs, n_total, dtype=torch.bool, device=device)  # the window policy has no scores
    local_lo = n_total - policy.n_local_pages
    visit[..., : policy.n_sink_pages] = True
    visit[..., max(0, local_lo) :] = True
    if scores is not None and local_lo > policy.n_sink_pages:
        # As select_pages: non-finite scores rank last but are still candidates.
        cand = torch.nan_to_num(scores[..., policy.n_sink_pages : local_lo].float(), nan=-3e38, neginf=-3e38,
                                posinf=3e38)
        top = cand.topk(min(policy.top_k_pages, cand.shape[-1]), dim=-1).indices
        visit.scatter_(2, top + policy.n_sink_pages, True)
    return visit


def _group_scores(q: torch.Tensor, layer, table: torch.Tensor, start: int, n_total: int,
                  per_kv_head: bool) -> torch.Tensor:
    """`chunk_scores` of each one-page group of q [N, HQ, D] over the chunk's pages 0 ..
    n_total - 1 -> [groups, H or 1, n_total] (a group's pages past its own are scored
    too; `select_pages` never takes them)."""
    spec = layer.spec
    bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
    n_q, hq = q.shape[0], q.shape[1]
    group = hq // h
    off = start % bs
    n_groups = -(-(off + n_q) // bs)
    if n_groups == 1:  # a decode step, a chunk within a page: the chunk's own scores
        return chunk_scores(q, layer, table, start + n_q, per_kv_head)[None]
    phys = table[:n_total].long()
    kmin = layer.k_min[phys].transpose(0, 1)  # [H, P, D]
    kmax = layer.k_max[phys].transpose(0, 1)
    # Rows (position, head in group) of each kv head, padded with zero rows to whole pages
    # (a zero row's bound is 0; the padding is masked to -inf below).
    qg = torch.zeros(n_groups * bs, h, group, d, device=q.device).index_copy_(
        0, torch.arange(off, off + n_q, device=q.device), q.float().view(n_q, h, group, d))
    qg = qg.permute(1, 0, 2, 3).reshape(h, n_groups, bs * group, d)  # [H, groups, rows, D]
    pad = torch.ones(n_groups * bs, dtype=torch.bool, device=q.device)
    pad[off : off + n_q] = False
    pad = pad.view(n_groups, bs, 1).expand(n_groups, bs, group).reshape(n_groups, bs * group, 1)
    per_tile = max(1, TILE_BYTES // (4 * h * bs * group * max(n_total, 1)))
    best = torch.empty(h, n_groups, n_total, device=q.device)
    for g0 in range(0, n_groups, per_tile):
        g1 = min(n_groups, g0 + per_tile)
        bound = quest_bound(qg[:, g0:g1], kmin[:, None], kmax[:, None])  # [H, tile, rows, P]
        best[:, g0:g1] = bound.masked_fill_(pad[g0:g1], -math.inf).amax(dim=2)
    best = best.transpose(0, 1)  # [groups, H, P]
    return best if per_kv_head else best.amax(dim=1, keepdim=True)


def _gathers_here(layer) -> bool:
    return layer.device.type == "cpu" and kernels.get_backend() != "triton" and cpu_kivi_attention.reads(layer.spec)


def virtual_plan(q: torch.Tensor, layer, table: torch.Tensor, start: int, policy: AttentionPolicy,
                 extra: torch.Tensor | None = None, true_positions: bool = False, exact: Sequence[ExactRows] = (),
                 pages: torch.Tensor | None = None, rotation: torch.Tensor | None = None):
    """Visible keys of a query group q [N, HQ, D] (unrotated, positions start.., all in
    one page unless the policy is dense) at compact virtual positions.

    The keys a group sees are sink pages, selected pages and its local pages, in document
    order; they get positions 0..m-1 as if they were one short contiguous text, and each
    query the position right after the keys before it. Local keys keep their true
    distances; every distance stays below (sinks + top-k + local) pages, inside the
    trained range whatever the length (InfLLM / SelfExtend-style, without a fixed far
    distance). With `true_positions` the same keys keep their document positions instead.
    `exact`: rows read at full precision instead of the quantized ones
    (`KernelKVCache._exact_rows`). `pages`: the group's plan when made already
    (`group_page_plans`), else `chunk_page_plan` makes it. `rotation` (virtual positions
    only): complex64 [>= the columns, D / 2], RoPE for column c; keys come back rotated,
    turned by the C++ gather as it writes them where it runs.

    Returns k, v [H, W, D] (keys unrotated unless `rotation`), key positions [W] (virtual:
    the column) or [H, W] (true), query positions [H, N] and lead [H]: query i sees
    columns 0 .. lead[h] + i. That is the whole mask, because the group's pages come in ascending order, every one
    visible to all its queries (their local pages are the same: one page), and end at the
    group's own rows: each head's keys up to the group's last query are a prefix of its
    columns, and the query at virtual position lead + i sees those at or before it. Columns
    past a head's prefix (padding pages, the last page past the group) read as zeros."""
    bs = layer.spec.block_size
    n_q = q.shape[0]
    end = start + n_q
    if policy.kind != "dense" and start // bs != (end - 1) // bs:
        raise ValueError(f"a {policy.kind} query group spans pages {start // bs}-{(end - 1) // bs}: one page at most")
    pages = pages if pages is not None else chunk_page_plan(q, layer, table, start, policy, extra)[0]
    h = layer.spec.n_kv_heads
    shared = pages.shape[0] == 1  # one page set for every head: the same positions in each
    pages = pages.expand(h, pages.shape[-1])
    if true_positions and rotation is not None:
        raise ValueError("a rotation per column is for virtual positions")
    if _gathers_here(layer):  # the same rows in one C++ pass, exact ones copied in place of theirs
        k, v, pos = cpu_kivi_attention.gather(layer, table, pages, end, exact, rotation)
    else:
        k, v, pos = gather_kv(layer, table[None], pages[None], torch.tensor([end], device=q.device))
        k, v, pos = k[0], v[0], pos[0]  # [H, T, D], [H, T]
        swap_in_(exact, k, v, pos, shared)
        if rotation is not None:
            h_n, width, d = k.shape
            turned = torch.view_as_complex(k.view(h_n, width, d // 2, 2)) * rotation[:width]
            k = torch.view_as_real(turned).view(h_n, width, d)
    n_keys = (pos >= 0).sum(-1)  # [H]
    if q.device.type == "cpu":  # drop the columns no head reads (the last page's tail)
        width = int(n_keys.max())
        k, v, pos = k[:, :width], v[:, :width], pos[:, :width]
    lead = n_keys - n_q
    arange = torch.arange(n_q, device=q.device)
    if true_positions:
        return k, v, pos.clamp(min=0), (start + arange)[None, :].expand(h, n_q), lead
    return k, v, torch.arange(k.shape[1], device=q.device), lead[:, None] + arange[None, :], lead


def decode_remapped(q: torch.Tensor, layer, table: torch.Tensor, start: int, policy: AttentionPolicy,
                    extra: torch.Tensor | None, exact: Sequence[ExactRows], pages: torch.Tensor | None,
                    rotation: torch.Tensor, scale: float) -> torch.Tensor | None:
    """`virtual_plan` then `attend_columns` for one decode query q [1, HQ, D] at position
    `start`, in one C++ pass that writes no gathered rows (`cpu_kivi_attention.
    remapped_decode`) -> [HQ, D]; None where that does not run (not int8/int4 pages on the
    CPU). A decode step's attention was ~1 ms a layer of small torch operations."""
    if q.shape[0] != 1 or not _gathers_here(layer) or not cpu_kivi_attention.decodes_remapped(layer, q.shape[1]):
        return None
    pages = pages if pages is not None else chunk_page_plan(q, layer, table, start, policy, extra)[0]
    pages = pages.expand(layer.spec.n_kv_heads, pages.shape[-1])
    return cpu_kivi_attention.remapped_decode(q, layer, table, pages, start + 1, exact, rotation, scale)


def attend_columns(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lead: torch.Tensor, n: int,
                   scale: float) -> torch.Tensor:
    """Softmax attention of rows q [H, G * n, D] (row (g, i): head g of the group's query
    i, rotated) over k, v [H, W, D], where query i sees columns 0 .. lead[h] + i
    (`virtual_plan`) -> [H, G * n, D] float32.

    Two batched products around the causal softmax of `engine.prefill_attention` (our C++
    pass, in place, skipping what a row does not see). SDPA with a boolean mask took ~2.2
    ms for one of SmolLM2's page groups (192 rows of a kv head against ~1.3K keys), the
    largest share of the CPU's sparse prefill (BENCHMARKS.md, sparse prefill). Off the
    CPU, a mask from the column index and torch's softmax. Queries go in blocks whose
    scores stay under `prefill_attention.BLOCK_SCORES` (a page group is one block; a dense
    layer's whole chunk is not), each against the columns its last query sees."""
    heads, rows, d = q.shape
    group, width = rows // n, k.shape[1]
    softmax_ = prefill_attention.causal_softmax_kernel() if q.device.type == "cpu" else None
    firsts = lead.tolist() if softmax_ is not None else None
    seen_max = int(lead.max()) + n if softmax_ is not None else width  # a host value only where it is free
    block = max(1, min(n, prefill_attention.BLOCK_SCORES // max(1, heads * group * width)))
    qs = (q * scale).view(heads, group, n, d)
    out = torch.empty(heads, group, n, d, device=q.device)
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        cols = min(width, seen_max - n + i1)  # the block's last query sees no further
        qb = qs[:, :, i0:i1].reshape(heads, group * (i1 - i0), d)
        scores = torch.bmm(qb, k[:, :cols].transpose(1, 2))  # [H, G * b, cols]
        if softmax_ is not None:
            for h, first in enumerate(firsts):
                softmax_(scores[h], first + i0, i1 - i0)
        else:
            pos = lead[:, None] + torch.arange(i0, i1, device=q.device)  # [H, b]
            sees = torch.arange(cols, device=q.device) <= pos[..., None]  # [H, b, cols]
            scores = scores.view(heads, group, i1 - i0, cols).masked_fill_(~sees[:, None], float("-inf"))
            scores = torch.softmax(scores, dim=-1).view(heads, group * (i1 - i0), cols)
        out[:, :, i0:i1] = torch.bmm(scores, v[:, :cols]).view(heads, group, i1 - i0, d)
    return out.view(heads, rows, d)
