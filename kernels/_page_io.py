"""Triton helpers shared by the attention kernels: read one page (or its staging slot)
as float32 keys and values, and one online-softmax step. Only imported when triton is.

All pools are contiguous (``allocate`` makes them so), which lets offsets be computed
from the shapes instead of carrying a dozen strides through every kernel.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .layout import PagedKVLayer

KIND_FLOAT, KIND_FP8, KIND_INT8, KIND_INT4 = 0, 1, 2, 3
_KIND_CODES = {"fp32": KIND_FLOAT, "bf16": KIND_FLOAT, "fp16": KIND_FLOAT, "fp8": KIND_FP8, "int8": KIND_INT8, "int4": KIND_INT4}


@triton.jit
def fp8e4m3_to_f32(bits):
    """e4m3fn bit patterns (int32 tensor, 0..255) -> float32, exactly. Decoding by hand
    keeps the kernels portable to GPUs (and the interpreter) without native fp8."""
    sign = (bits >> 7) & 1
    expo = (bits >> 3) & 0xF
    mant = bits & 7
    # A normal e4m3 number re-biased (7 -> 127) into float32 bits; subnormals are m * 2**-9.
    normal = (((expo + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(expo == 0, mant.to(tl.float32) * 0.001953125, normal)
    return tl.where(sign == 1, -mag, mag)


# Rows a loop step of the attention kernels reads: a step takes max(1, TILE_ROWS // BS)
# pages, so small pages do not leave each step a [16, D] sliver of work. One 16-row page
# per step was latency-bound on an H200: 5-41% of the bandwidth floor (BENCHMARKS.md).
TILE_ROWS = 64


def tile_pages(block_size: int, override: int | None = None) -> int:
    """Pages per loop step of the attention kernels (a power of two, >= 1)."""
    if override is not None:
        if override < 1 or override & (override - 1):
            raise ValueError(f"tile_pages must be a power of two >= 1, not {override}")
        return override
    return max(1, TILE_ROWS // block_size)


# Warps per program of the decode and prefill attention kernels. Compiled for sm_90 by
# ptxas (`python -m kernels.compile_check --baseline-warps 4`: 441 variants of the two),
# 4 warps ran out of registers in 160: up to 568 bytes a thread in int4 decode and 1.9 KB
# in int4 prefill at head_dim 128 (7 KB in fp32 decode's exact dot), where a [64, 128]
# tile of dequantized keys, and each integer temporary of its decoding, take 64 registers
# a thread at 128 threads. At 8 warps 67 variants spill, at most 372 bytes (BENCHMARKS.md).
# Not yet timed on a GPU: kernels.bench times 4 warps beside it as the same-run baseline.
ATTENTION_WARPS = 8


def attention_warps(override: int | None = None) -> int:
    """Warps of an attention kernel launch: ``override`` (a power of two), or ATTENTION_WARPS."""
    if override is None:
        return ATTENTION_WARPS
    if override < 1 or override & (override - 1):
        raise ValueError(f"warps must be a power of two >= 1, not {override}")
    return override


@triton.jit
def page_tile(pages, live, ctx, block_tables, stage_of_block, KIND: tl.constexpr, BS: tl.constexpr,
              TP: tl.constexpr):
    """For the logical pages [TP] of one sequence (``live`` masks the list's end): their
    blocks (int64), their staging slots (int64, read only for the unsealed tail of a
    quantized kind), whether each is that tail, and which of the tile's [TP * BS] rows
    hold tokens (in page order, BS rows per page)."""
    blk = tl.load(block_tables + pages, mask=live, other=0).to(tl.int64)
    n_valid = tl.minimum(ctx - pages * BS, BS)  # [TP]
    use_stage = (n_valid < BS) & live
    slot = tl.zeros_like(blk)
    if KIND != 0:
        slot = tl.load(stage_of_block + blk, mask=use_stage, other=0).to(tl.int64)
    offs_t = tl.arange(0, BS)
    ok = (offs_t[None, :] < n_valid[:, None]) & live[:, None]  # [TP, BS]
    return blk, slot, use_stage, tl.reshape(ok, (TP * BS,))


@triton.jit
def load_tile_kv(
    k_pages, v_pages, k_min, k_max, k_scale, v_scale, v_zero, stage_k, stage_v,
    blk, slot, use_stage, live, h, H,
    KIND: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, G: tl.constexpr, TP: tl.constexpr,
):
    """Keys and values [TP * BS, D] float32 of kv head ``h`` for the TP blocks ``blk``
    (int64 [TP]); a page whose ``use_stage`` is set (quantized kinds: the unsealed tail)
    reads its staging slot ``slot`` instead. Pages not ``live`` are not read (zeros).
    ``k_scale`` holds fp8's page scales, or int4's key widths (``k_bits``; `page_args`).
    Work is done on [TP, BS, D] tiles so a page's scales load once for its BS rows."""
    offs_t = tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    b3 = blk[:, None, None]
    d3 = offs_d[None, None, :]
    row = (b3 * BS + offs_t[None, :, None]) * H + h  # [TP, BS, 1] row index into [NB*BS*H]
    live3 = live[:, None, None]
    if KIND == 0:
        off = row * D + d3
        k = tl.load(k_pages + off, mask=live3, other=0.0).to(tl.float32)
        v = tl.load(v_pages + off, mask=live3, other=0.0).to(tl.float32)
    else:
        staged = use_stage[:, None, None]
        sealed = (live & (use_stage == 0))[:, None, None]
        if KIND == 1:
            off = row * D + d3
            ks = tl.load(k_scale + blk * H + h, mask=live, other=0.0)[:, None, None]
            vs = tl.load(v_scale + blk * H + h, mask=live, other=0.0)[:, None, None]
            k = fp8e4m3_to_f32(tl.load(k_pages + off, mask=sealed, other=0).to(tl.int32)) * ks
            v = fp8e4m3_to_f32(tl.load(v_pages + off, mask=sealed, other=0).to(tl.int32)) * vs
        else:
            summ = (b3 * H + h) * D + d3  # [TP, 1, D]
            kmn = tl.load(k_min + summ, mask=sealed, other=0.0)
            kmx = tl.load(k_max + summ, mask=sealed, other=0.0)
            if KIND == 3:
                # Values: two channels per byte, channel d in byte d // 2, nibble d % 2.
                vc = (tl.load(v_pages + row * (D // 2) + d3 // 2, mask=sealed, other=0).to(tl.int32)
                      >> ((d3 % 2) * 4)) & 15
                # Keys: channel d's w_d-bit code at bit o_d of the row's bitstream
                # (reference.unpack_bitstream): two bytes from byte o_d // 8 hold it.
                wb = tl.load(k_scale + (b3 * H + h) * (D // 2) + d3 // 2, mask=sealed, other=0).to(tl.int32)
                w = (wb >> ((d3 % 2) * 4)) & 15  # [TP, 1, D]
                o = tl.cumsum(w, 2) - w
                b0 = tl.minimum(o >> 3, D // 2 - 1)
                b1 = tl.minimum((o >> 3) + 1, D // 2 - 1)
                lo = tl.load(k_pages + row * (D // 2) + b0, mask=sealed, other=0).to(tl.int32)
                hi = tl.load(k_pages + row * (D // 2) + b1, mask=sealed, other=0).to(tl.int32)
                kc = ((lo | (hi << 8)) >> (o & 7)) & ((1 << w) - 1)
                # reference.key_affine; div_rn: the reference's IEEE division (a plain
                # `/` is approximate on GPUs)
                span = kmx - kmn
                kq = tl.maximum((1 << w) - 1, 1).to(tl.float32)
                step = tl.where(w > 0, tl.math.div_rn(span, kq), 0.0)
                base = tl.where(w > 0, kmn, kmn + span * 0.5)
                k = base + kc.to(tl.float32) * step
            else:
                off = row * D + d3
                kc = tl.load(k_pages + off, mask=sealed, other=0).to(tl.int32)
                vc = tl.load(v_pages + off, mask=sealed, other=0).to(tl.int32)
                k = kmn + kc.to(tl.float32) * tl.math.div_rn(kmx - kmn, 255.0)
            poff = row * (D // G) + d3 // G  # [TP, BS, D] -> its group's params
            vz = tl.load(v_zero + poff, mask=sealed, other=0.0).to(tl.float32)  # fp16 parameters
            v = vz + vc.to(tl.float32) * tl.load(v_scale + poff, mask=sealed, other=0.0).to(tl.float32)
        # The unsealed tail: full-precision rows of its staging slot.
        soff = ((slot[:, None, None] * BS + offs_t[None, :, None]) * H + h) * D + d3
        k = tl.where(staged, tl.load(stage_k + soff, mask=staged, other=0.0).to(tl.float32), k)
        v = tl.where(staged, tl.load(stage_v + soff, mask=staged, other=0.0).to(tl.float32), v)
    return tl.reshape(k, (TP * BS, D)), tl.reshape(v, (TP * BS, D))


@triton.jit
def qk_dot(q, k, DOT_FP32: tl.constexpr, DOT_BF16: tl.constexpr):
    """q [M, D] @ k[N, D]^T -> [M, N] float32; fp32 pages stay exact (ieee), everything
    else runs on 16-bit tensor cores with float32 accumulation."""
    if DOT_FP32:
        res = tl.dot(q, tl.trans(k), input_precision="ieee")
    elif DOT_BF16:
        res = tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16)))
    else:
        res = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16)))
    return res


@triton.jit
def pv_dot(p, v, DOT_FP32: tl.constexpr, DOT_BF16: tl.constexpr):
    if DOT_FP32:
        res = tl.dot(p, v, input_precision="ieee")
    elif DOT_BF16:
        res = tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16))
    else:
        res = tl.dot(p.to(tl.float16), v.to(tl.float16))
    return res


@triton.jit
def softmax_step(scores, v, m, l, acc, DOT_FP32: tl.constexpr, DOT_BF16: tl.constexpr):
    """One online-softmax step: scores [M, N] (-inf where hidden), v [N, D]."""
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m - m_safe)
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + pv_dot(p, v, DOT_FP32, DOT_BF16)
    return m_new, l, acc


def dot_flags(layer: PagedKVLayer) -> tuple[bool, bool]:
    """(DOT_FP32, DOT_BF16): the dot precision follows the page kind (quantized: fp16)."""
    kind = layer.spec.kv_dtype if not layer.spec.quantized else layer.spec.stage_dtype
    if kind == "bf16" and os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter's bf16 tl.dot returns garbage (triton 3.9); an exact fp32 dot
        # of the same bf16-valued operands stands in for it there.
        return True, False
    return kind == "fp32", kind == "bf16"


def page_args(layer: PagedKVLayer) -> list[torch.Tensor]:
    """The nine pool tensors in ``load_tile_kv`` order; absent ones are stood in for by
    k_pages (never read: the kind's constexpr branch skips them). The k_scale slot carries
    int4's key widths: the two never coexist."""
    d = layer.k_pages
    pick = lambda t: d if t is None else t  # noqa: E731
    k_aux = layer.k_bits if layer.k_bits is not None else layer.k_scale
    return [layer.k_pages, layer.v_pages, layer.k_min, layer.k_max, pick(k_aux),
            pick(layer.v_scale), pick(layer.v_zero), pick(layer.stage_k), pick(layer.stage_v)]


def stage_map(layer: PagedKVLayer) -> torch.Tensor:
    return layer.stage_of_block if layer.stage_of_block is not None else layer.k_min


def kind_code(layer: PagedKVLayer) -> int:
    return _KIND_CODES[layer.spec.kv_dtype]


def check_supported(layer: PagedKVLayer) -> None:
    """The Triton kernels need power-of-two tiles of at least 16 (tl.dot)."""
    spec = layer.spec
    pow2 = lambda n: n >= 16 and n & (n - 1) == 0  # noqa: E731
    if not (pow2(spec.block_size) and pow2(spec.head_dim)):
        raise ValueError("Triton kernels need block_size and head_dim powers of two >= 16")
    if spec.quantized and spec.kv_dtype != "fp8" and spec.group_size & (spec.group_size - 1):
        raise ValueError("Triton kernels need a power-of-two v_group_size")
    for t in (layer.k_pages, layer.v_pages, layer.k_min, layer.k_max):
        if not t.is_contiguous():
            raise ValueError("KV pools must be contiguous")


def triton_supports(layer: PagedKVLayer) -> bool:
    try:
        check_supported(layer)
    except ValueError:
        return False
    return True
