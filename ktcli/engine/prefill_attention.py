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

In fp32 on a CPU with AMX, `engine.amx_attention` runs the whole chunk (earlier and own
keys in one causal pass) on AMX tiles with every operand split into bf16 parts (two, or
three for the scores where they are large): fp32-grade (~1e-5 of float64, ~4e-6 with
six-pass scores) at 1.4-2.0x the flash kernel's speed on the 2-core Xeon (1.1-1.5x with
six-pass scores).

Otherwise, in fp32, where oneDNN is usable (`engine.cpu_gemm`), a chunk instead runs as blocks of
query positions: S = Q K^T over every key the block sees (one oneDNN product per kv head,
its G query heads folded into the rows), a causal softmax over S in place (our C++ pass,
which zeroes the keys past each row's position), and O = P V (a second product). On the
Zen 5 EPYC torch's flash kernel ran SmolLM2's prefill attention at 68-156 GFLOPS, about
MKL's fp32 GEMM rate there (its block products go through the CPU BLAS), where this runs at
112-235 (`python -m benchmarks.cpu_gemm`: 1.51-1.73x). On an Intel CPU MKL's fast paths
make the flash kernel the faster one (the blocked path ran at 0.71-0.80x on the 2-core
Xeon with AMX), so there oneDNN is off by default and the split runs. Each block's S stays under ~8 MB
(the last-level cache; 2, 4 and 16 MB measured slower), and only the diagonal block
computes scores it then masks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ktcli.engine import amx_attention, cpp_ext, cpu_gemm

SOURCE = r"""
// s [R, L] fp32 contiguous, scores of query rows against keys 0 .. L-1; row r is the query
// at position first_pos + r % block, which sees keys 0 .. that position. In place: the
// row's softmax over the keys it sees, 0 past them (so a product with V sums exactly those).
void causal_softmax_(torch::Tensor s, int64_t first_pos, int64_t block) {
    TORCH_CHECK(s.dtype() == torch::kFloat32 && s.dim() == 2 && s.is_contiguous(), "s [R, L] fp32 contiguous");
    TORCH_CHECK(block >= 1 && s.size(0) % block == 0 && first_pos >= 0, "rows a multiple of block");
    const int64_t R = s.size(0), L = s.size(1);
    float* sp = s.data_ptr<float>();
    at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            float* row = sp + r * L;
            const int64_t n = std::min<int64_t>(L, first_pos + r % block + 1);
            const int64_t n8 = n - n % 8;
            __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
            for (int64_t j = 0; j < n8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(row + j));
            float m = hmax(mv);
            for (int64_t j = n8; j < n; ++j) m = std::max(m, row[j]);
            const __m256 mb = _mm256_set1_ps(m);
            __m256 sum = _mm256_setzero_ps();
            for (int64_t j = 0; j < n8; j += 8) {
                const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(row + j), mb));
                _mm256_storeu_ps(row + j, e);
                sum = _mm256_add_ps(sum, e);
            }
            float l = ::hsum(sum);  // bf16_gemv's (cpu_attention has one of its own)
            for (int64_t j = n8; j < n; ++j) { row[j] = std::exp(row[j] - m); l += row[j]; }
            const __m256 inv = _mm256_set1_ps(1.f / l);
            for (int64_t j = 0; j < n8; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
            for (int64_t j = n8; j < n; ++j) row[j] *= 1.f / l;
            if (n < L) std::memset(row + n, 0, sizeof(float) * (L - n));
        }
    });
}
"""
FUNCTIONS = ["causal_softmax_"]
# Scores a block may hold (floats): ~8 MB, inside the last-level cache of the machines measured.
BLOCK_SCORES = 2 << 20

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
    if dtype is None and amx_attention.supports(q):
        return amx_attention.attend(q, k, v, scale)
    if q.dtype == torch.float32 and q.device.type == "cpu" and cpu_gemm.available() and _kernel() is not None:
        return _blocked_onednn(q, k, v, scale)
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


def _kernel():
    return cpp_ext.load("KTCLI_NO_BLOCKED_PREFILL")


def causal_softmax_kernel():
    """`causal_softmax_(s, first_pos, block)` (the C++ pass above), or None where the
    extension is not built or is turned off."""
    kernel = _kernel()
    return kernel.causal_softmax_ if kernel is not None else None


def _blocked_onednn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """attend_prefix in fp32 as blocks of query positions through oneDNN products (the
    module docstring). q [n, HQ, D]; k, v [p + n, H, D] -> [n, HQ, D]."""
    n, n_q, d = q.shape
    keys, n_kv = k.shape[0], k.shape[1]
    p, group = keys - n, n_q // n_kv
    softmax_ = _kernel().causal_softmax_
    block = max(16, min(n, BLOCK_SCORES // (group * keys)))
    out = torch.empty(n, n_kv, group, d)
    # [n, HQ, D] -> [H, G, n, D] with the scale folded in (one pass over q)
    q_fold = (q * scale).view(n, n_kv, group, d).permute(1, 2, 0, 3)
    for h in range(n_kv):
        kh = k[:, h].contiguous()  # [keys, D]
        vt = v[:, h].t().contiguous()  # [D, keys]: P V as a product with a [N, K] weight
        for r0 in range(0, n, block):
            r1 = min(n, r0 + block)
            seen = p + r1  # the block's last query sees keys 0 .. seen - 1
            rows = q_fold[h, :, r0:r1].reshape(group * (r1 - r0), d)  # rows (g, i)
            scores = cpu_gemm.linear(rows, kh[:seen])  # [G * b, seen]
            softmax_(scores, p + r0, r1 - r0)
            o = cpu_gemm.linear(scores, vt[:, :seen].contiguous() if seen < keys else vt)  # [G * b, D]
            out[r0:r1, h] = o.view(group, r1 - r0, d).transpose(0, 1)
    return out.view(n, n_q, d)


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
