"""Write (and quantise) new K/V rows into the paged pool (Triton).

(Not named ``kv_store.py``: a submodule of that name would shadow the package-level
``kernels.kv_store`` function the moment it was imported.)

The bookkeeping (which blocks a write touches, their fill, staging slots, which pages
seal) is a ``store_plan.StorePlan``, shared with the reference; this module supplies the
three data operations as kernels:

* ``_write_rows_kernel``, grid (N,): copy token n's [H, D] row into ``dst[major, minor]``
  (a page for float kinds, a staging slot for quantized ones), casting on store.
* ``_summary_kernel``, grid (T, H): per-channel min/max over rows [0, fill) of a page or
  slot into ``k_min``/``k_max`` (recomputed from the page, so no atomics and no reset
  step when a freed block is reused).
* ``_seal_int_kernel``, grid (T, H): quantise a full slot into an int8 page: keys
  per channel (zero = min, scale = (max - min) / qmax), values per token and group.
  fp8 pages seal with the torch code of the reference (one cast per sealed page; Triton
  has no portable float->e4m3 cast with round-to-nearest-even), and so do int4 pages
  (their keys' per-channel widths come from a sort, `reference.key_widths`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from .layout import PagedKVLayer
from .store_plan import apply_store, plan_store


@triton.jit
def _write_rows_kernel(dst, major, minor, src, stride_sn, stride_sh, H,
                       BS: tl.constexpr, HP: tl.constexpr, D: tl.constexpr):
    n = tl.program_id(0)
    b = tl.load(major + n).to(tl.int64)
    t = tl.load(minor + n).to(tl.int64)
    offs_h = tl.arange(0, HP)
    offs_d = tl.arange(0, D)
    ok = (offs_h < H)[:, None]
    row = tl.load(src + n.to(tl.int64) * stride_sn + offs_h[:, None] * stride_sh + offs_d[None, :], mask=ok)
    dst_off = ((b * BS + t) * H + offs_h[:, None]) * D + offs_d[None, :]
    tl.store(dst + dst_off, row.to(dst.dtype.element_ty), mask=ok)


@triton.jit
def _summary_kernel(src, src_index, fill, blocks, k_min, k_max, H, BS: tl.constexpr, D: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    a = tl.load(src_index + i).to(tl.int64)
    f = tl.load(fill + i)
    b = tl.load(blocks + i).to(tl.int64)
    offs_t = tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    rows = tl.load(src + ((a * BS + offs_t[:, None]) * H + h) * D + offs_d[None, :]).to(tl.float32)
    valid = (offs_t < f)[:, None]
    tl.store(k_min + (b * H + h) * D + offs_d, tl.min(tl.where(valid, rows, float("inf")), axis=0))
    tl.store(k_max + (b * H + h) * D + offs_d, tl.max(tl.where(valid, rows, float("-inf")), axis=0))


@triton.jit
def _fp16_floor(x):
    """float32 -> the largest float16 <= x, bit for bit as reference.fp16_floor."""
    y = x.to(tl.float16)
    bits = y.to(tl.int16, bitcast=True)
    down = tl.where(bits > 0, bits - 1, tl.where(bits == 0, -32767, bits + 1)).to(tl.int16)
    return tl.where(y.to(tl.float32) > x, down.to(tl.float16, bitcast=True), y)


@triton.jit
def _asym_codes(x, lo, scale, QMAX: tl.constexpr):
    """floor((x - lo) / scale + 0.5) clamped to [0, QMAX]; 0 where scale is 0.

    Codes must equal the torch reference's bit for bit: a code one step off at a rounding
    boundary is a whole int4 step (1/15 of the range). So the reciprocal is IEEE-rounded
    (div_rn: a plain `/` compiles to an approximate division on NVIDIA GPUs) and the
    launch disables FMA contraction (torch rounds the product before adding 0.5)."""
    inv = tl.where(scale > 0, tl.math.div_rn(1.0, scale), 0.0)
    c = tl.floor((x - lo) * inv + 0.5)
    return tl.minimum(tl.maximum(c, 0.0), QMAX).to(tl.int32)


@triton.jit
def _seal_int_kernel(stage_k, stage_v, slots, blocks, k_pages, v_pages, k_min, k_max, v_scale, v_zero, H,
                     BS: tl.constexpr, D: tl.constexpr, G: tl.constexpr, QMAX: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    a = tl.load(slots + i).to(tl.int64)
    b = tl.load(blocks + i).to(tl.int64)
    offs_t = tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    src = ((a * BS + offs_t[:, None]) * H + h) * D + offs_d[None, :]
    k = tl.load(stage_k + src).to(tl.float32)  # [BS, D]
    v = tl.load(stage_v + src).to(tl.float32)
    row = (b * BS + offs_t[:, None]) * H + h  # [BS, 1]

    # Keys: one (zero, scale) per channel over the page's tokens; min/max are the summary.
    kmn = tl.min(k, axis=0)
    kmx = tl.max(k, axis=0)
    tl.store(k_min + (b * H + h) * D + offs_d, kmn)
    tl.store(k_max + (b * H + h) * D + offs_d, kmx)
    kc = _asym_codes(k, kmn[None, :], tl.math.div_rn(kmx - kmn, QMAX * 1.0)[None, :], QMAX)
    tl.store(k_pages + row * D + offs_d[None, :], kc.to(tl.uint8))

    # Values: one (zero, scale) per token and group of G channels.
    # Stored in fp16, zero rounded down and scale up (reference.quantize_values, bit for bit).
    vg = tl.reshape(v, (BS, D // G, G))
    vmn16 = _fp16_floor(tl.min(vg, axis=2))  # [BS, D/G]
    vmn = vmn16.to(tl.float32)
    vsc16 = -_fp16_floor(-tl.math.div_rn(tl.max(vg, axis=2) - vmn, QMAX * 1.0))
    vsc = vsc16.to(tl.float32)
    vc = tl.reshape(_asym_codes(vg, vmn[:, :, None], vsc[:, :, None], QMAX), (BS, D))
    tl.store(v_pages + row * D + offs_d[None, :], vc.to(tl.uint8))
    poff = row * (D // G) + tl.arange(0, D // G)[None, :]
    tl.store(v_zero + poff, vmn16)
    tl.store(v_scale + poff, vsc16)


def _write_rows(dst, major, minor, src):
    n, h, d = src.shape
    src = src if src.stride(-1) == 1 else src.contiguous()
    _write_rows_kernel[(n,)](dst, major.to(torch.int32), minor.to(torch.int32), src, src.stride(0), src.stride(1), h,
                             BS=dst.shape[1], HP=triton.next_power_of_2(h), D=d)


def _refresh_summary(layer: PagedKVLayer, src, src_index, fill, blocks):
    spec = layer.spec
    _summary_kernel[(blocks.numel(), spec.n_kv_heads)](
        src, src_index.to(torch.int32), fill.to(torch.int32), blocks.to(torch.int32), layer.k_min, layer.k_max,
        spec.n_kv_heads, BS=spec.block_size, D=spec.head_dim)


def _seal(layer: PagedKVLayer, blocks, slots):
    spec = layer.spec
    if spec.kv_dtype in ("fp8", "int4"):
        # fp8: see the module doc. int4: the key widths come from a sort over each page's
        # channels (reference.key_widths), once per 64 tokens; torch does it on the device.
        return reference.seal_torch(layer, blocks, slots)
    _seal_int_kernel[(blocks.numel(), spec.n_kv_heads)](
        layer.stage_k, layer.stage_v, slots.to(torch.int32), blocks.to(torch.int32), layer.k_pages, layer.v_pages,
        layer.k_min, layer.k_max, layer.v_scale, layer.v_zero, spec.n_kv_heads,
        BS=spec.block_size, D=spec.head_dim, G=spec.group_size, QMAX=reference.qmax_of(spec.kv_dtype), enable_fp_fusion=False)


TRITON_OPS = reference.StoreOps(_write_rows, _refresh_summary, _seal)


def kv_store_planned_triton(layer: PagedKVLayer, k_new, v_new, plan) -> None:
    """Triton twin of ``store_plan.apply_store`` with the reference's data operations."""
    from ._page_io import check_supported

    check_supported(layer)
    apply_store(TRITON_OPS, layer, k_new, v_new, plan)


def kv_store_triton(layer: PagedKVLayer, k_new, v_new, slot_mapping) -> None:
    """Triton twin of ``reference.kv_store``."""
    kv_store_planned_triton(layer, k_new, v_new, plan_store(layer, slot_mapping))
