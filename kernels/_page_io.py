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


@triton.jit
def load_page_kv(
    k_pages, v_pages, k_min, k_max, k_scale, v_scale, v_zero, stage_k, stage_v,
    blk, slot, use_stage, h, H,
    KIND: tl.constexpr, BS: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
):
    """Keys and values [BS, D] float32 of kv head ``h`` of block ``blk`` (int64), or of
    staging slot ``slot`` when ``use_stage`` (quantized kinds: the unsealed tail).
    ``k_scale`` holds fp8's page scales, or int4's key widths (``k_bits``; `page_args`)."""
    offs_t = tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    if KIND == 0:
        off = ((blk * BS + offs_t[:, None]) * H + h) * D + offs_d[None, :]
        k = tl.load(k_pages + off).to(tl.float32)
        v = tl.load(v_pages + off).to(tl.float32)
    else:
        if use_stage:
            off = ((slot * BS + offs_t[:, None]) * H + h) * D + offs_d[None, :]
            k = tl.load(stage_k + off).to(tl.float32)
            v = tl.load(stage_v + off).to(tl.float32)
        else:
            row = (blk * BS + offs_t[:, None]) * H + h  # [BS, 1] row index into [NB*BS*H]
            if KIND == 1:
                off = row * D + offs_d[None, :]
                ks = tl.load(k_scale + blk * H + h)
                vs = tl.load(v_scale + blk * H + h)
                k = fp8e4m3_to_f32(tl.load(k_pages + off).to(tl.int32)) * ks
                v = fp8e4m3_to_f32(tl.load(v_pages + off).to(tl.int32)) * vs
            else:
                kmn = tl.load(k_min + (blk * H + h) * D + offs_d)  # [D]
                kmx = tl.load(k_max + (blk * H + h) * D + offs_d)
                if KIND == 3:
                    # Values: two channels per byte, channel d in byte d // 2, nibble d % 2.
                    off = row * (D // 2) + offs_d[None, :] // 2
                    shift = (offs_d[None, :] % 2) * 4
                    vc = (tl.load(v_pages + off).to(tl.int32) >> shift) & 15
                    # Keys: channel d's w_d-bit code at bit o_d of the row's bitstream
                    # (reference.unpack_bitstream): two bytes from byte o_d // 8 hold it.
                    wb = tl.load(k_scale + (blk * H + h) * (D // 2) + offs_d // 2).to(tl.int32)
                    w = (wb >> ((offs_d % 2) * 4)) & 15  # [D]
                    o = tl.cumsum(w, 0) - w
                    b0 = tl.minimum(o >> 3, D // 2 - 1)
                    b1 = tl.minimum((o >> 3) + 1, D // 2 - 1)
                    lo = tl.load(k_pages + row * (D // 2) + b0[None, :]).to(tl.int32)
                    hi = tl.load(k_pages + row * (D // 2) + b1[None, :]).to(tl.int32)
                    kc = ((lo | (hi << 8)) >> (o & 7)[None, :]) & ((1 << w) - 1)[None, :]
                    # reference.key_affine; div_rn: the reference's IEEE division (a plain
                    # `/` is approximate on GPUs)
                    span = kmx - kmn
                    kq = tl.maximum((1 << w) - 1, 1).to(tl.float32)
                    step = tl.where(w > 0, tl.math.div_rn(span, kq), 0.0)
                    base = tl.where(w > 0, kmn, kmn + span * 0.5)
                    k = base[None, :] + kc.to(tl.float32) * step[None, :]
                else:
                    off = row * D + offs_d[None, :]
                    kc = tl.load(k_pages + off).to(tl.int32)
                    vc = tl.load(v_pages + off).to(tl.int32)
                    k = kmn[None, :] + kc.to(tl.float32) * tl.math.div_rn(kmx - kmn, 255.0)[None, :]
                poff = row * (D // G) + offs_d[None, :] // G  # [BS, D] -> its group's params
                vz = tl.load(v_zero + poff).to(tl.float32)  # fp16 parameters
                v = vz + vc.to(tl.float32) * tl.load(v_scale + poff).to(tl.float32)
    return k, v


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
    """The nine pool tensors in ``load_page_kv`` order; absent ones are stood in for by
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
