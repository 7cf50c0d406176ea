"""Prefill attention on the CPU: a chunk of n > 1 queries after `ctx - n` cached tokens.

A later chunk of a long prompt sees two kinds of keys: the earlier tokens, which every
query of the chunk sees whole, and the chunk's own tokens, which it sees causally. The
two halves run as separate flash-attention calls and are merged with their log-sum-exps,
so no [n, ctx] mask is ever built, read or converted (it grows with the context), and
the causal half skips its upper triangle:

- earlier keys, no mask: the query heads that share a kv head are folded into the rows
  ([n, HQ, D] -> [H, G * n, D]), so each key row is read once per kv head rather than
  once per query head, and the kernel works on taller blocks (better GEMM shapes);
- own keys, causal: the chunk's K/V rows (a small copy) repeated per query head.

    out = o_past * s + o_own * (1 - s),  s = sigmoid(lse_past - lse_own)

which is softmax over the union of the keys, exactly. Sliding-window layers and non-CPU
devices keep the masked SDPA call in `attention.attend`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# (out [B, H, L, D], logsumexp [B, H, L]) = flash(q, k, v, dropout, is_causal, scale=...)
_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def attend_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """q [n, HQ, D] at positions p .. p+n-1; k, v [p + n, H, D] (positions 0 .. p+n-1,
    views or gathered rows). Query i sees keys 0 .. p+i. Returns [n, HQ, D] in q's dtype
    (float32 on the CPU over half-precision pages), or in `dtype` when given: every
    operand is converted to it (bf16 on a CPU with AMX, where the flash kernel's products
    run 2.4-2.6x its fp32 speed)."""
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # no-ops where the dtype matches
    elif q.device.type == "cpu" and k.dtype != torch.float32:
        # Half-precision pages: widen the keys read (a copy of [keys, H, D]); the CPU flash
        # kernel is slower in fp16 than in fp32 (measured 1.6x at 4096 keys; bf16 without
        # AMX likewise).
        q, k, v = q.float(), k.float(), v.float()
    n, n_q, d = q.shape
    keys, n_kv = k.shape[0], k.shape[1]
    p = keys - n
    group = n_q // n_kv
    if p <= 0:
        return _causal_sdpa(q, k, v, scale)
    if _flash is None or q.device.type != "cpu" or q.dtype not in _FLASH_DTYPES:
        return _masked_sdpa(q, k, v, scale)

    # Earlier keys [0, p): rows (g, i) of each kv head, no mask.
    # [n, HQ, D] -> [n, H, G, D] -> [H, G, n, D] -> [1, H, G * n, D] (a copy)
    q_fold = q.view(n, n_kv, group, d).permute(1, 2, 0, 3).reshape(1, n_kv, group * n, d)
    # [p, H, D] -> [1, H, p, D] (strided views of the pages)
    o_past, lse_past = _flash(q_fold, k[:p].transpose(0, 1)[None], v[:p].transpose(0, 1)[None], scale=scale)
    # [1, H, G * n, D] -> [HQ, n, D]; [1, H, G * n] -> [HQ, n] (head h = kv * G + g)
    o_past = o_past.reshape(n_q, n, d)
    lse_past = lse_past.reshape(n_q, n)

    # Own keys [p, p + n): causal. [n, H, D] -> [n, HQ, D] (repeat per query head) -> [1, HQ, n, D]
    k_own = k[p:].repeat_interleave(group, dim=1).transpose(0, 1)[None]
    v_own = v[p:].repeat_interleave(group, dim=1).transpose(0, 1)[None]
    o_own, lse_own = _flash(q.transpose(0, 1)[None], k_own, v_own, is_causal=True, scale=scale)
    o_own = o_own.reshape(n_q, n, d)
    lse_own = lse_own.reshape(n_q, n)

    # Softmax over both key sets: weight of the earlier part = e^lse_past / (e^lse_past + e^lse_own)
    s = torch.sigmoid(lse_past - lse_own).unsqueeze(-1)  # [HQ, n, 1]
    return torch.lerp(o_own, o_past, s.to(o_own.dtype)).transpose(0, 1)  # [HQ, n, D] -> [n, HQ, D]


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # [n, HQ, D] -> [1, HQ, n, D]; [n, H, D] -> [1, H, n, D] (views)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def _masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The same function with an explicit [n, keys] mask: the fallback."""
    n, keys = q.shape[0], k.shape[0]
    q_pos = torch.arange(keys - n, keys, device=q.device)[:, None]  # [n, 1]
    mask = torch.arange(keys, device=q.device)[None, :] <= q_pos  # [n, keys]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)
