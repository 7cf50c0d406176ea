"""Paged attention behind one small interface, so `kernels` (quantized or sparse pages,
Triton on CUDA) can replace the body without touching the model.

The runner describes each sequence of a step once (`SeqAttn`); every layer then calls
`store_kv` and `attend`. This CPU path reads a sequence's keys as one strided view when
its pages are consecutive (the block manager arranges that whenever it can) and gathers
them otherwise; it never builds more than an [n_chunk, context] score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ktcli.engine import prefill_attention


@dataclass
class SeqAttn:
    """One sequence's part of a step: query rows [start, start + n) of the flattened
    batch, at positions ctx - n .. ctx - 1, over a cache that holds ctx tokens after the
    step's K/V are stored."""

    start: int
    n: int
    ctx: int
    first_slot: int | None  # slot of token 0 when the pages are consecutive, else None
    slots: torch.Tensor | None  # [ctx] slot of every token, when they are not
    masks: dict  # window (None: full) -> (key offset, [n, keys] bool mask or None)
    # The step ends the sequence's pending tokens (a token is sampled after it): for a
    # prefill chunk, the prompt's last, whose final queries are the question.
    samples: bool = True

    def keys(self, cache: torch.Tensor, lo: int) -> torch.Tensor:
        """[ctx - lo, H, D] rows of tokens lo .. ctx-1."""
        if self.first_slot is not None:
            return cache[self.first_slot + lo : self.first_slot + self.ctx]  # a view
        return cache.index_select(0, self.slots[lo:])  # gather

    def block_table(self, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """[pages] int32 physical block of each logical page (read back from the slots)."""
        n_pages = -(-self.ctx // block_size)
        if self.first_slot is not None:
            return torch.arange(n_pages, dtype=torch.int32, device=device) + self.first_slot // block_size
        return (self.slots[::block_size] // block_size).to(torch.int32)  # first slot of each page


def block_slots(table: list[int], block_size: int, n_tokens: int) -> tuple[int | None, torch.Tensor | None]:
    """(first slot, None) when the pages in `table` covering n_tokens are consecutive,
    else (None, [n_tokens] slot index)."""
    used = -(-n_tokens // block_size)
    if used == 0 or table[used - 1] - table[0] == used - 1 and _consecutive(table, used):
        return (table[0] * block_size if used else 0), None
    blocks = torch.tensor(table[:used], dtype=torch.int64)
    # [used, 1] * BS + [1, BS] -> [used, BS] -> flat [used * BS], cut to n_tokens
    slots = (blocks[:, None] * block_size + torch.arange(block_size)[None, :]).reshape(-1)
    return None, slots[:n_tokens]


def _consecutive(table: list[int], used: int) -> bool:
    first = table[0]
    return all(table[i] == first + i for i in range(used))


def make_masks(n: int, ctx: int, windows: set, device: torch.device | None = None) -> dict:
    """For each window: the first key position attended to, and a bool mask [n, keys]
    (True = attend, on `device`), or None where plain causal (or no mask) is exact;
    "causal" for a whole prompt in one chunk, "prefix" for a later chunk on the host."""
    out = {}
    for window in windows:
        first_q = ctx - n
        lo = 0 if window is None else max(0, first_q - window + 1)
        if n == 1:
            out[window] = (lo, None)  # one query sees every key in [lo, ctx)
            continue
        if lo == 0 and n == ctx and window is None:
            out[window] = (0, "causal")
            continue
        if window is None and device is None:
            # A later chunk on the host: earlier keys whole, its own causally, without a
            # mask tensor (engine.prefill_attention).
            out[window] = (0, "prefix")
            continue
        q_pos = torch.arange(first_q, ctx, device=device)[:, None]  # [n, 1]
        k_pos = torch.arange(lo, ctx, device=device)[None, :]  # [1, keys]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        out[window] = (lo, mask)
    return out


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write the step's K/V rows [T, H, D] into slots [T] of one layer's cache. fp16 pages
    saturate at +-65504 (as the C++ decode store does) rather than store inf."""
    if k_cache.dtype == torch.float16 and k.dtype != torch.float16:
        k, v = k.clamp(-_FP16_MAX, _FP16_MAX), v.clamp(-_FP16_MAX, _FP16_MAX)
    k_cache.index_copy_(0, slot_mapping, k.to(k_cache.dtype))  # fp32 rows into half pages: one cast
    v_cache.index_copy_(0, slot_mapping, v.to(v_cache.dtype))


_FP16_MAX = torch.finfo(torch.float16).max  # 65504


# A decode query runs as two BLAS batched products with the query heads grouped by the
# kv head they share ([H, G, D] x [H, D, keys]), so each key row is read once per step.
# SDPA's CPU flash kernel with enable_gqa reads K/V once per *query* head (G times the
# bytes; measured 5x slower at 4096 keys over a real, uncached cache) and splits even
# tiny decode work across OpenMP threads.
SMALL_DECODE_KEYS = 1 << 30


def decode_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    n_kv, d = k.shape[1], k.shape[2]
    group = q.shape[1] // n_kv
    qg = q.reshape(n_kv, group, d)  # [1, HQ, D] -> [H, G, D]: query heads grouped by kv head
    scores = torch.bmm(qg, k.permute(1, 2, 0))  # [H, G, D] x [H, D, keys] -> [H, G, keys]
    probs = torch.softmax(scores.mul_(scale), dim=-1)
    out = torch.bmm(probs, v.transpose(0, 1))  # [H, G, keys] x [H, keys, D] -> [H, G, D]
    return out.view(1, n_kv * group, d)  # [H, G, D] -> [1, HQ, D]


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: SeqAttn, window: int | None, scale: float,
           prefill_dtype: torch.dtype | None = None) -> torch.Tensor:
    """q [n, HQ, D] of one sequence -> [n, HQ, D]. GQA is handled by SDPA (enable_gqa),
    which on CPU runs its flash kernel over the strided cache views without copies.
    `prefill_dtype`: what a prefill chunk on the host computes in (bf16 on a CPU with AMX;
    None: fp32, see `prefill_attention.attend_prefix`)."""
    lo, mask = seq.masks[window]
    k = seq.keys(k_cache, lo)  # [keys, H, D]
    v = seq.keys(v_cache, lo)
    if isinstance(mask, str) and (mask == "prefix" or q.device.type == "cpu"):
        return prefill_attention.attend_prefix(q, k, v, scale, prefill_dtype)  # a prefill chunk on the host
    if q.dtype != k.dtype:
        q = q.to(k.dtype)
    if seq.n == 1 and k.shape[0] <= SMALL_DECODE_KEYS and k.dtype == torch.float32:
        return decode_grouped(q, k, v, scale)
    # [n, HQ, D] -> [1, HQ, n, D]; [keys, H, D] -> [1, H, keys, D] (views)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask if isinstance(mask, torch.Tensor) else None,
        is_causal=mask == "causal",
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)  # [1, HQ, n, D] -> [n, HQ, D]


def attend_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: SeqAttn, window: int | None, scale: float) -> torch.Tensor:
    """Plain softmax(q k^T) v over gathered keys with explicit positions: the oracle."""
    first_slot, slots = seq.first_slot, seq.slots
    idx = torch.arange(seq.ctx) + first_slot if first_slot is not None else slots
    k = k_cache[idx].float()  # [ctx, H, D]
    v = v_cache[idx].float()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [ctx, HQ, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale  # [HQ, n, ctx]
    q_pos = torch.arange(seq.ctx - seq.n, seq.ctx)[:, None]
    k_pos = torch.arange(seq.ctx)[None, :]
    visible = k_pos <= q_pos
    if window is not None:
        visible &= k_pos > q_pos - window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)
