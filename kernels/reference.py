"""Plain-torch twin of every kernel: the test oracle and the CPU path.

Everything here is vectorised over tokens, sequences and heads; the only Python loops
run over tiles of pages (to bound memory at long contexts) or over pieces of a kv_store
call that touches more pages than there are free staging slots. The format is specified
in the package docstring (``kernels/__init__.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .layout import FP8_MAX, KVCacheSpec, PagedKVLayer, qmax_of
from .store_plan import apply_store, plan_store

# Bytes of float32 work a reference tile may use; bounds memory at 1M-token contexts.
_TILE_BYTES = 64 << 20


@dataclass(frozen=True)
class AttentionPolicy:
    """Which keys a query sees; page counts are in pages of the layer's block size."""

    kind: str = "dense"  # "dense" | "window" | "topk"
    n_sink_pages: int = 1
    n_local_pages: int = 4
    top_k_pages: int = 8
    per_kv_head: bool = True  # topk: one selection per kv head (else one per sequence)

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "window", "topk"):
            raise ValueError(f"unknown attention policy {self.kind!r}")
        if self.kind != "dense" and self.n_local_pages < 1:
            raise ValueError("sparse policies need n_local_pages >= 1 (the query's own page)")


DENSE = AttentionPolicy()

# --------------------------------------------------------------------------------------
# Quantisation helpers. Error bounds (x real, x' = dequantise(quantise(x))):
#   int8/int4 (asymmetric, round to nearest): |x - x'| <= (max - min) / (2 * qmax) over
#     the group the (zero, scale) pair covers, plus float32 rounding (~1e-6 relative).
#   fp8 e4m3 with scale s = amax / 448: |x - x'| <= max(|x| * 2**-4, s * 2**-10)
#     (3 mantissa bits: half an ulp is 2**-4 relative; subnormal step is s * 2**-9).
# --------------------------------------------------------------------------------------



def div_scalar(x: torch.Tensor, d: float) -> torch.Tensor:
    """x / d, a true (IEEE, round-to-nearest) division on every device.

    Why not ``x / d``: PyTorch on CUDA computes ``tensor / python_number`` as
    ``tensor * fp32(1 / number)`` (``div_true_kernel_cuda``: "may lose one bit of
    precision"), while the CPU and the Triton kernels (``tl.math.div_rn``) divide. The
    reference then disagreed with a correct kernel by one ulp in 74% of int8 key scales
    and 53% of fp8 page scales on a GPU (review of the GPU side, H1). A 0-dim tensor on
    x's own device is no CPU scalar, so it takes the division path there; on the CPU the
    result is the same division as before, bit for bit. ``torch.full`` fills on the
    device (no host-to-device copy, no sync in the decode loop)."""
    return x / torch.full((), d, dtype=x.dtype, device=x.device)


def quant_error_bound(kind: str, lo: torch.Tensor, hi: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
    """Largest |x - dequantise(quantise(x))| allowed by the format: ``lo``/``hi`` are the
    group's min/max (int kinds) or ``hi`` the page scale (fp8, with ``x`` the inputs)."""
    if kind in ("int8", "int4"):
        return div_scalar(hi - lo, 2 * qmax_of(kind)) * (1 + 1e-5) + 1e-6 * torch.maximum(lo.abs(), hi.abs())
    if kind == "fp8":
        return torch.maximum(x.abs() * 2.0**-4, hi * 2.0**-10) * (1 + 1e-5)
    raise ValueError(kind)


def asym_codes(x: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor, qmax: int) -> torch.Tensor:
    """Unsigned codes floor((x - lo) / scale + 0.5) in [0, qmax] (0 when scale is 0)."""
    # A tensor division, like div_scalar's: `1.0 / scale` is `reciprocal(scale) * 1.0`, one more
    # device-specific path (IEEE on both today, but not promised).
    inv = torch.where(scale > 0, torch.ones_like(scale) / scale, torch.zeros_like(scale))
    return torch.floor((x - lo) * inv + 0.5).clamp_(0, qmax).to(torch.uint8)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes in 0..15 -> [..., D // 2] bytes, channel 2c low nibble, 2c+1 high."""
    pairs = codes.view(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # [..., D/2, 2]
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[..., D // 2] bytes -> [..., D] codes."""
    pairs = torch.stack((packed & 0xF, packed >> 4), dim=-1)  # [..., D/2, 2]
    return pairs.view(*packed.shape[:-1], packed.shape[-1] * 2)  # [..., D]


def quantize_keys(k: torch.Tensor, kind: str, weight: torch.Tensor | None = None):
    """KIVI keys, one (zero, scale) per channel over the page's tokens.
    k [T, BS, H, D] float32 -> (codes [T, BS, H, Dp] uint8, k_min [T, H, D], k_max [T, H, D],
    k_bits [T, H, D // 2] uint8 or None). int4: each channel gets its own width
    (``key_widths``, by range and ``weight`` [H, D]) and a row is their bitstream."""
    k_min, k_max = k.amin(dim=1), k.amax(dim=1)  # [T, H, D]
    if kind != "int4":
        qmax = qmax_of(kind)
        scale = div_scalar(k_max - k_min, qmax)
        return asym_codes(k, k_min[:, None], scale[:, None], qmax), k_min, k_max, None
    widths = key_widths(k_max - k_min, weight)  # [T, H, D]
    qmax = (1 << widths) - 1
    scale = (k_max - k_min) / qmax.clamp(min=1)  # 0-bit channels: code 0, read as the midpoint
    codes = asym_codes(k, k_min[:, None], scale[:, None], 255).minimum(qmax[:, None].to(torch.uint8))
    return pack_bitstream(codes, widths[:, None]), k_min, k_max, pack_int4(widths.to(torch.uint8))


def dequantize_keys(codes: torch.Tensor, k_min: torch.Tensor, k_max: torch.Tensor, kind: str,
                    k_bits: torch.Tensor | None = None) -> torch.Tensor:
    """codes [..., BS, Dp], k_min/k_max [..., D] (int4: k_bits [..., D // 2]) -> keys
    [..., BS, D] float32."""
    if kind != "int4":
        scale = div_scalar(k_max - k_min, qmax_of(kind))
        return k_min.unsqueeze(-2) + codes.float() * scale.unsqueeze(-2)
    widths = unpack_int4(k_bits).long()
    base, step = key_affine(k_min, k_max, widths)
    q = unpack_bitstream(codes, widths.unsqueeze(-2))
    return base.unsqueeze(-2) + q.float() * step.unsqueeze(-2)


# --------------------------------------------------------------------------------------
# int4 keys with allocated widths. A page's keys get 4 bits per channel on average, but
# not everywhere: channel c of kv head h gets w_c in 0..KEY_MAX_BITS bits, sum w_c = 4 D,
# chosen per page to minimise the summed error model weight_c * span_c^2 * 4^-w_c
# (uniform rounding error of a channel with range span_c, weighted by how much the
# queries use the channel: mean q_c^2, calibrated per model). Channels whose range is
# wide, or that the queries look at, get more bits; quiet ones fewer, down to 0 (read
# as the middle of the range). On SmolLM2 (BENCHMARKS.md, "int4 with per-channel key
# widths") it cuts uniform int4's KL per token by 44% and its perplexity cost by a third,
# and brings the needle's log-probability at 2K tokens back to fp32's level.
# Layout: a row's D codes are one little-endian bitstream, channel c at bits
# [o_c, o_c + w_c) with o_c = w_0 + .. + w_{c-1}; 4 D bits = D / 2 bytes, the size of
# nibble-packed int4. Widths all 4 give exactly the nibble layout. Widths are stored
# two per byte (``pack_int4``) in ``k_bits`` [NB, H, D // 2].
# --------------------------------------------------------------------------------------

KEY_MEAN_BITS = 4
KEY_MAX_BITS = 8


def key_widths(span: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """span [..., D] (per-channel key ranges of a page), weight broadcastable to it ->
    widths [..., D] int64 in 0..KEY_MAX_BITS summing to KEY_MEAN_BITS * D.

    The error model is convex in the width, so the best widths take the KEY_MEAN_BITS * D
    largest marginal gains weight * span^2 * 4^-j (j = 0..KEY_MAX_BITS-1; the 3/4 factor
    common to all is dropped) over all channels. Each gain is a float32 product scaled by
    a power of two (exact), and ties go to the lower channel (a stable sort): the widths
    are the same on every device."""
    d = span.shape[-1]
    err = span.float().square()
    if weight is not None:
        err = err * weight.float()
    lead = err.shape[:-1]
    steps = torch.tensor([4.0**-j for j in range(KEY_MAX_BITS)], device=span.device)
    gains = (err[..., None] * steps).reshape(-1, d * KEY_MAX_BITS)  # [N, D * 8], channel-major
    order = torch.sort(gains, dim=-1, descending=True, stable=True).indices[:, : KEY_MEAN_BITS * d]
    widths = torch.zeros(gains.shape[0], d, dtype=torch.long, device=span.device)
    widths.scatter_add_(1, order // KEY_MAX_BITS, torch.ones_like(order))
    return widths.view(*lead, d)


def key_affine(k_min: torch.Tensor, k_max: torch.Tensor, widths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, step) [..., D] with key = base + code * step: base = k_min (a 0-bit channel:
    the middle of its range), step = (k_max - k_min) / (2^w - 1) (0 for 0 bits)."""
    span = k_max - k_min
    qmax = ((1 << widths) - 1).float()
    step = torch.where(widths > 0, span / qmax.clamp(min=1.0), torch.zeros_like(span))
    base = torch.where(widths > 0, k_min, k_min + span * 0.5)
    return base, step


def bit_offsets(widths: torch.Tensor) -> torch.Tensor:
    """Where each channel's code starts in its row's bitstream: [..., D] -> [..., D]."""
    return torch.cumsum(widths, dim=-1) - widths


def pack_bitstream(codes: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """codes [..., D] (code c < 2^w_c), widths broadcastable to them, summing to
    KEY_MEAN_BITS * D -> bytes [..., D * KEY_MEAN_BITS // 8].

    A code has at most 8 bits, so shifted to its bit offset within its first byte it
    spans that byte and perhaps the next: its low 8 bits are added to the one and the
    rest to the other. Codes never share a bit, so adding is or-ing. (Two scatters over
    [..., D]; setting bits one at a time over [..., D, 8] was ~5x slower and made int4
    sealing the bulk of a prefill chunk's store.)"""
    widths = widths.expand(codes.shape).to(torch.int32)
    n_bytes = codes.shape[-1] * KEY_MEAN_BITS // 8
    off = bit_offsets(widths)
    code = codes.to(torch.int32) & ((1 << widths) - 1)
    shifted = (code << (off & 7)).to(torch.int32)  # < 2^15
    at = (off >> 3).long()  # <= n_bytes: a 0-bit last channel starts at the end (and adds 0)
    out = torch.zeros(*codes.shape[:-1], n_bytes + 2, dtype=torch.int32, device=codes.device)
    out.scatter_add_(-1, at, shifted & 0xFF)
    out.scatter_add_(-1, at + 1, shifted >> 8)
    return out[..., :n_bytes].to(torch.uint8)


def unpack_bitstream(packed: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """bytes [..., Dp], widths [..., D] broadcastable to [..., D] rows -> codes [..., D]
    int32. Code c is bits [o_c, o_c + w_c) of the row: at most 8 bits starting in byte
    o_c // 8, so the 16-bit little-endian window at that byte holds it."""
    widths = widths.to(torch.int32)
    off = bit_offsets(widths)
    # A byte index past the row only arises for bits that are masked off (a 0-bit channel
    # at the end): clamp it.
    at = (off >> 3).clamp(max=packed.shape[-1] - 1)
    shape = (*torch.broadcast_shapes(packed.shape[:-1], widths.shape[:-1]), widths.shape[-1])
    b = packed.to(torch.int32)
    words = b | torch.nn.functional.pad(b[..., 1:], (0, 1)) << 8  # [..., Dp]: bytes i, i+1
    codes = torch.gather(words.expand(*shape[:-1], b.shape[-1]), -1, at.expand(shape))
    return (codes >> (off & 7)) & ((1 << widths) - 1)


def fp16_floor(x: torch.Tensor) -> torch.Tensor:
    """float32 -> the largest fp16 <= x."""
    y = x.to(torch.float16)  # round to nearest
    bits = y.view(torch.int16)
    # One fp16 step down on the bit pattern: +x -> bits - 1, +0 -> the negative smallest
    # subnormal (0x8001), -x -> bits + 1 (sign-magnitude: a larger magnitude).
    down = torch.where(bits > 0, bits - 1, torch.where(bits == 0, torch.full_like(bits, -32767), bits + 1))
    return torch.where(y.float() > x, down.view(torch.float16), y)


def fp16_ceil(x: torch.Tensor) -> torch.Tensor:
    """float32 -> the smallest fp16 >= x."""
    return -fp16_floor(-x)


def quantize_values(v: torch.Tensor, kind: str, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KIVI values, one (zero, scale) per token and group of ``group`` channels.
    v [..., D] float32 -> (codes [..., Dp] uint8, zero [..., D/G] fp16, scale [..., D/G] fp16)."""
    qmax = qmax_of(kind)
    d = v.shape[-1]
    g = v.view(*v.shape[:-1], d // group, group)  # [..., D/G, G]
    zero = fp16_floor(g.amin(-1))  # [..., D/G]
    scale = fp16_ceil(div_scalar(g.amax(-1) - zero.float(), qmax))
    # Codes against the stored (rounded) parameters: what dequantisation will use.
    codes = asym_codes(g, zero.float()[..., None], scale.float()[..., None], qmax).view(v.shape)  # [..., D]
    return (pack_int4(codes) if kind == "int4" else codes), zero, scale


def dequantize_values(codes: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor, kind: str) -> torch.Tensor:
    """codes [..., Dp], zero/scale [..., D/G] -> values [..., D] float32."""
    q = (unpack_int4(codes) if kind == "int4" else codes).float()
    ng = zero.shape[-1]
    g = q.view(*q.shape[:-1], ng, q.shape[-1] // ng)  # [..., D/G, G]
    return (zero.float()[..., None] + g * scale.float()[..., None]).view(q.shape)  # [..., D]


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, BS, H, D] float32 -> (e4m3fn bit patterns as uint8, scale [T, H])."""
    amax = x.abs().amax(dim=(1, 3))  # [T, H]
    scale = torch.where(amax > 0, div_scalar(amax, FP8_MAX), torch.ones_like(amax))
    scaled = (x / scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX)
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantize_fp8(bits: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """bits [..., BS, D] uint8, scale [...] -> [..., BS, D] float32."""
    return bits.view(torch.float8_e4m3fn).float() * scale[..., None, None]


# --------------------------------------------------------------------------------------
# kv_store. The bookkeeping (which blocks are touched, staging slots, when to seal) is a
# ``store_plan.StorePlan``, shared with the Triton path, which swaps the three data
# operations in ``StoreOps``.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreOps:
    # write rows: (dst [M, BS, H, D], major [N], minor [N], src [N, H, D]) -> None
    write_rows: Callable
    # summaries of rows [0, fill) of src [M, BS, H, D] at (src_index [T], fill [T]) into
    # layer.k_min/k_max[blocks [T]]
    refresh_summary: Callable
    # seal: (layer, blocks [T], slots [T]) -> None
    seal: Callable


def _write_rows_torch(dst, major, minor, src):
    dst[major.long(), minor.long()] = src.to(dst.dtype)


def _refresh_summary_torch(layer, src, src_index, fill, blocks):
    bs = layer.spec.block_size
    rows = src[src_index.long()].float()  # [T, BS, H, D]
    valid = (torch.arange(bs, device=rows.device)[None, :] < fill[:, None])[..., None, None]  # [T, BS, 1, 1]
    layer.k_min[blocks.long()] = torch.where(valid, rows, math.inf).amin(dim=1)
    layer.k_max[blocks.long()] = torch.where(valid, rows, -math.inf).amax(dim=1)


def seal_torch(layer: PagedKVLayer, blocks: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantise full staging slots ``slots`` [T] into pages ``blocks`` [T]."""
    spec, b, s = layer.spec, blocks.long(), slots.long()
    k = layer.stage_k[s].float()  # [T, BS, H, D]
    v = layer.stage_v[s].float()
    if spec.kv_dtype == "fp8":
        layer.k_pages[b], layer.k_scale[b] = quantize_fp8(k)
        layer.v_pages[b], layer.v_scale[b] = quantize_fp8(v)
        # The summary must bound what attention reads: the dequantised page.
        kd = dequantize_fp8(layer.k_pages[b].transpose(1, 2), layer.k_scale[b])  # [T, H, BS, D]
        layer.k_min[b], layer.k_max[b] = kd.amin(dim=2), kd.amax(dim=2)
        return
    codes, layer.k_min[b], layer.k_max[b], k_bits = quantize_keys(k, spec.kv_dtype, layer.k_weight)
    layer.k_pages[b] = codes
    if k_bits is not None:
        layer.k_bits[b] = k_bits
    layer.v_pages[b], layer.v_zero[b], layer.v_scale[b] = quantize_values(v, spec.kv_dtype, spec.group_size)


TORCH_OPS = StoreOps(_write_rows_torch, _refresh_summary_torch, seal_torch)


def release_blocks(layer: PagedKVLayer, blocks: torch.Tensor) -> None:
    """Return the staging slots of freed blocks [N] to the pool (no-op for float kinds)."""
    if layer.stage_of_block is None or blocks.numel() == 0:
        return
    blocks = blocks.to(device=layer.device, dtype=torch.long)
    slots = layer.stage_of_block[blocks]
    layer.block_of_stage[slots[slots >= 0].long()] = -1
    layer.stage_of_block[blocks] = -1
    layer.store_version += 1


def kv_store(layer: PagedKVLayer, k_new: torch.Tensor, v_new: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write K/V rows [N, H, D] to slots [N]; see the package docstring. A caller writing
    every layer of a model plans once (``store_plan.plan_store``) and applies the plan to
    each layer (``store_plan.apply_store``)."""
    apply_store(TORCH_OPS, layer, k_new, v_new, plan_store(layer, slot_mapping))


# --------------------------------------------------------------------------------------
# Reading pages: gather + dequantise, the staged tail swapped in.
# --------------------------------------------------------------------------------------


def gather_kv(layer: PagedKVLayer, block_tables: torch.Tensor, pages: torch.Tensor, context_lens: torch.Tensor):
    """Keys and values of logical ``pages`` [S, H, P] (entries < 0 are padding) as
    attention sees them.

    Returns k, v [S, H, P * BS, D] float32, pos [S, H, P * BS] (token position, -1 where
    the token does not exist: padding, or at/after the context length)."""
    spec = layer.spec
    bs, nh = spec.block_size, spec.n_kv_heads
    s_n, h_n, p_n = pages.shape
    dev = block_tables.device
    pages = pages.long()
    ok = pages >= 0
    logical = pages.clamp(min=0)
    phys = torch.gather(block_tables.long(), 1, logical.view(s_n, -1)).view(s_n, h_n, p_n)  # [S, H, P]
    phys = torch.where(ok, phys, 0).clamp_(0, layer.num_blocks - 1)
    heads = torch.arange(nh, device=dev).view(1, nh, 1).expand(s_n, nh, p_n)  # [S, H, P]
    k, v = _dequantize(layer, phys, heads)  # [S, H, P, BS, D] each

    lens = context_lens.to(device=dev, dtype=torch.long).view(s_n, 1, 1)
    if spec.quantized:
        tail = ok & (logical == lens // bs) & (lens % bs != 0)  # [S, H, P]
        if bool(tail.any()):
            idx = tail.nonzero(as_tuple=True)
            slot = layer.stage_of_block[phys[idx]].long()
            # stage rows [n, BS, H, D] -> this entry's head: [n, BS, D]
            k[idx] = layer.stage_k[slot, :, heads[idx]].float()
            v[idx] = layer.stage_v[slot, :, heads[idx]].float()
    pos = logical[..., None] * bs + torch.arange(bs, device=dev)  # [S, H, P, BS]
    pos = torch.where(ok[..., None] & (pos < lens[..., None]), pos, -1)
    # Rows past the fill are stale memory: zero them so 0-weight * garbage cannot be NaN.
    dead = (pos < 0)[..., None]  # [S, H, P, BS, 1]
    k, v = k.masked_fill(dead, 0.0), v.masked_fill(dead, 0.0)
    d = spec.head_dim
    return k.reshape(s_n, h_n, p_n * bs, d), v.reshape(s_n, h_n, p_n * bs, d), pos.reshape(s_n, h_n, p_n * bs)


def _dequantize(layer: PagedKVLayer, phys: torch.Tensor, heads: torch.Tensor):
    """Dequantised sealed pages at (phys, heads) [...] -> k, v [..., BS, D] float32."""
    kind = layer.spec.kv_dtype
    # Pages are [NB, BS, H, Dp]; index (block, head) on a [NB, H, BS, Dp] view.
    kp = layer.k_pages.transpose(1, 2)[phys, heads]  # [..., BS, Dp]
    vp = layer.v_pages.transpose(1, 2)[phys, heads]
    if kind in ("fp32", "bf16", "fp16"):
        return kp.float(), vp.float()
    if kind == "fp8":
        return dequantize_fp8(kp, layer.k_scale[phys, heads]), dequantize_fp8(vp, layer.v_scale[phys, heads])
    k_bits = layer.k_bits[phys, heads] if kind == "int4" else None
    k = dequantize_keys(kp, layer.k_min[phys, heads], layer.k_max[phys, heads], kind, k_bits)
    vz = layer.v_zero.transpose(1, 2)[phys, heads]  # [..., BS, D/G]
    vs = layer.v_scale.transpose(1, 2)[phys, heads]
    return k, dequantize_values(vp, vz, vs, kind)


def dequantize_page_keys(layer: PagedKVLayer, phys: torch.Tensor) -> torch.Tensor:
    """Keys of sealed pages ``phys`` [P], every head -> [P, BS, H, D] float32."""
    kind = layer.spec.kv_dtype
    kp = layer.k_pages[phys]  # [P, BS, H, Dp]
    if kind in ("fp32", "bf16", "fp16"):
        return kp.float()
    if kind == "fp8":
        return kp.view(torch.float8_e4m3fn).float() * layer.k_scale[phys][:, None, :, None]  # scale [P, 1, H, 1]
    lo, hi = layer.k_min[phys][:, None], layer.k_max[phys][:, None]  # [P, 1, H, D]
    if kind == "int4":
        widths = unpack_int4(layer.k_bits[phys]).long()[:, None]  # [P, 1, H, D]
        base, step = key_affine(lo, hi, widths)
        return base + unpack_bitstream(kp, widths).float() * step  # as dequantize_keys, to the bit
    return lo + kp.float() * div_scalar(hi - lo, qmax_of(kind))


def dequantize_pages(layer: PagedKVLayer, phys: torch.Tensor):
    """Sealed pages ``phys`` [P], every head, in the pages' own layout -> k, v
    [P, BS, H, D] float32. One gather per tensor (no per-head indexing): the fast way to
    read a whole context."""
    kind = layer.spec.kv_dtype
    k, vp = dequantize_page_keys(layer, phys), layer.v_pages[phys]
    if kind in ("fp32", "bf16", "fp16"):
        return k, vp.float()
    if kind == "fp8":
        return k, vp.view(torch.float8_e4m3fn).float() * layer.v_scale[phys][:, None, :, None]
    return k, dequantize_values(vp, layer.v_zero[phys], layer.v_scale[phys], kind)


def context_kv(layer: PagedKVLayer, block_table: torch.Tensor, ctx: int):
    """Every key and value of one sequence's first ``ctx`` tokens, dequantised, staged tail
    included: k, v [ctx, H, D] float32 (block_table [pages] int)."""
    spec = layer.spec
    bs = spec.block_size
    n_pages = -(-ctx // bs)
    phys = block_table[:n_pages].long()
    k, v = dequantize_pages(layer, phys)  # [P, BS, H, D]
    tail = ctx % bs
    if spec.quantized and tail:  # the last page is still in its staging slot
        slot = layer.stage_of_block[phys[-1]].long()
        k[-1, :tail] = layer.stage_k[slot, :tail].float()
        v[-1, :tail] = layer.stage_v[slot, :tail].float()
    h, d = spec.n_kv_heads, spec.head_dim
    return k.view(n_pages * bs, h, d)[:ctx], v.view(n_pages * bs, h, d)[:ctx]


def context_keys(layer: PagedKVLayer, block_table: torch.Tensor, ctx: int, first_page: int, end_page: int) -> torch.Tensor:
    """The keys of pages [first_page, end_page) of a sequence's first ``ctx`` tokens,
    dequantised, staged tail included: [rows, H, D] float32, rows from first_page * BS up to
    min(ctx, end_page * BS). `context_kv`'s keys a slice at a time, for a pass over a long
    context that must not hold all of it in fp32 at once."""
    spec = layer.spec
    bs = spec.block_size
    end_page = min(end_page, -(-ctx // bs))
    phys = block_table[first_page:end_page].long()
    k = dequantize_page_keys(layer, phys)  # [P, BS, H, D]
    rows = min(ctx, end_page * bs) - first_page * bs
    tail = ctx % bs
    if spec.quantized and tail and end_page * bs > ctx:  # the context's last page, still staged
        slot = layer.stage_of_block[phys[-1]].long()
        k[-1, :tail] = layer.stage_k[slot, :tail].float()
    return k.view(-1, spec.n_kv_heads, spec.head_dim)[:rows]


# --------------------------------------------------------------------------------------
# Attention: online softmax over tiles of pages.
# --------------------------------------------------------------------------------------


class _OnlineSoftmax:
    """Running max / sum / weighted values for rows of queries, tile by tile."""

    def __init__(self, shape_rows: tuple[int, ...], d: int, device) -> None:
        self.m = torch.full(shape_rows, -math.inf, device=device)
        self.l = torch.zeros(shape_rows, device=device)
        self.acc = torch.zeros(*shape_rows, d, device=device)

    def update(self, scores: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> None:
        """scores [..., R, T] (already scaled), v [..., T, D], visible [..., R, T] bool."""
        scores = scores.masked_fill(~visible, -math.inf)
        m_new = torch.maximum(self.m, scores.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # rows that saw nothing yet
        p = torch.exp(scores - m_safe[..., None])
        alpha = torch.exp(self.m - m_safe)
        self.l = self.l * alpha + p.sum(-1)
        self.acc = self.acc * alpha[..., None] + p @ v
        self.m = m_new

    def result(self) -> torch.Tensor:
        return self.acc / torch.where(self.l > 0, self.l, 1.0)[..., None]


def _pages_per_tile(layer: PagedKVLayer, score_rows: int, kv_rows: int) -> int:
    """Pages per tile so that scores ([score_rows, T], twice for exp) and dequantised
    k/v ([kv_rows, T, D] each) stay under _TILE_BYTES."""
    per_page = layer.spec.block_size * 4 * (2 * score_rows + 2 * kv_rows * layer.spec.head_dim)
    return max(1, _TILE_BYTES // per_page)


def _check_q(q: torch.Tensor, spec: KVCacheSpec) -> int:
    if q.dim() != 3 or q.shape[-1] != spec.head_dim or q.shape[1] % spec.n_kv_heads:
        raise ValueError(f"q must be [tokens, n_heads, {spec.head_dim}] with n_heads a multiple of {spec.n_kv_heads}")
    return q.shape[1] // spec.n_kv_heads


def _decode_over_pages(q, layer, block_tables, pages, context_lens, scale, out):
    """Shared by dense and sparse decode: q [S, HQ, D], pages [S, 1 or H, P] logical."""
    spec = layer.spec
    group = _check_q(q, spec)
    s_n, hq, d = q.shape
    h = spec.n_kv_heads
    qg = q.float().view(s_n, h, group, d) * scale  # [S, H, G, D]
    pages = pages.expand(s_n, h, pages.shape[-1])  # shared selection -> every kv head
    state = _OnlineSoftmax((s_n, h, group), d, q.device)
    tile = _pages_per_tile(layer, s_n * hq, s_n * h)
    for p0 in range(0, pages.shape[-1], tile):
        k, v, pos = gather_kv(layer, block_tables, pages[..., p0 : p0 + tile], context_lens)
        scores = qg @ k.transpose(-1, -2)  # [S, H, G, T]
        state.update(scores, v, (pos >= 0)[:, :, None, :].expand_as(scores))
    res = state.result().view(s_n, hq, d).to(q.dtype)  # [S, HQ, D]
    if out is None:
        return res
    out.copy_(res)
    return out


def paged_attention_decode(q, layer, block_tables, context_lens, scale, out=None):
    """Dense decode attention: q [S, HQ, D] -> [S, HQ, D]."""
    s_n, max_pages = block_tables.shape
    pages = torch.arange(max_pages, device=q.device).view(1, 1, max_pages).expand(s_n, 1, max_pages)
    return _decode_over_pages(q, layer, block_tables, pages, context_lens, scale, out)


def sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale, out=None):
    """Decode over ``selected`` [S, 1 or H, K] logical pages, first n_selected [S] valid."""
    k_n = selected.shape[-1]
    valid = torch.arange(k_n, device=q.device) < n_selected.to(q.device).long().view(-1, 1, 1)
    pages = torch.where(valid, selected.long(), -1)
    return _decode_over_pages(q, layer, block_tables, pages, context_lens, scale, out)


# --------------------------------------------------------------------------------------
# Quest page scores and selection.
# --------------------------------------------------------------------------------------


def quest_bound(q: torch.Tensor, k_min: torch.Tensor, k_max: torch.Tensor) -> torch.Tensor:
    """sum_d max(q_d k_min_d, q_d k_max_d) as two matmuls: q+ . k_max + q- . k_min.
    q [..., R, D], k_min/k_max [..., P, D] -> [..., R, P]."""
    # 0 * inf would be NaN for never-written pages; those are masked by the caller.
    k_min = torch.nan_to_num(k_min, posinf=0.0, neginf=0.0)
    k_max = torch.nan_to_num(k_max, posinf=0.0, neginf=0.0)
    return q.clamp(min=0) @ k_max.transpose(-1, -2) + q.clamp(max=0) @ k_min.transpose(-1, -2)


def score_pages(q, layer, block_tables, context_lens, per_kv_head=True, out=None):
    """Quest scores q [S, HQ, D] -> [S, H or 1, max_pages] float32, -inf past the end."""
    spec = layer.spec
    group = _check_q(q, spec)
    s_n, max_pages = block_tables.shape
    h, d, bs = spec.n_kv_heads, spec.head_dim, spec.block_size
    phys = block_tables.long().clamp(0, layer.num_blocks - 1)  # [S, P]
    kmin = layer.k_min[phys].transpose(1, 2)  # [S, H, P, D]
    kmax = layer.k_max[phys].transpose(1, 2)
    qg = q.float().view(s_n, h, group, d)  # [S, H, G, D]
    scores = quest_bound(qg, kmin, kmax).amax(dim=2)  # [S, H, P]: max over the group
    n_pages = (context_lens.to(q.device).long() + bs - 1) // bs
    live = torch.arange(max_pages, device=q.device)[None, :] < n_pages[:, None]  # [S, P]
    scores = scores.masked_fill(~live[:, None, :], -math.inf)
    return finish_page_scores(scores, per_kv_head, out)


def finish_page_scores(scores: torch.Tensor, per_kv_head: bool, out: torch.Tensor | None) -> torch.Tensor:
    """Shared tail of both score_pages: one score per kv head, or the max over heads when
    the sequence selects one page set for all heads; written into `out` when given."""
    if not per_kv_head:
        scores = scores.amax(dim=1, keepdim=True)  # [S, H, P] -> [S, 1, P]
    if out is None:
        return scores
    out.copy_(scores)
    return out


def select_pages(scores, context_lens, block_size, policy: AttentionPolicy, max_pages=None, last_page=None):
    """Sinks + local + top-k pages by logical index.

    scores: [S, Hs, P] (or None for window / top_k 0); context_lens [S]. ``last_page``
    [S] overrides the page of the query that defines "local" (prefill: the chunk's last
    query). Returns (selected [S, Hs, n_sink + n_local + top_k] int32 ascending, -1
    padded; n_selected [S] int32)."""
    lens = context_lens.long()
    dev = lens.device
    s_n = lens.shape[0]
    if max_pages is None:
        max_pages = scores.shape[-1]
    top_k = policy.top_k_pages if policy.kind == "topk" else 0
    hs = scores.shape[1] if (scores is not None and top_k > 0) else 1
    n_pages = (lens + block_size - 1) // block_size  # [S]
    last = n_pages - 1 if last_page is None else last_page.to(dev).long()
    idx = torch.arange(max_pages, device=dev)[None, :]  # [1, P]
    sink = idx < torch.clamp(n_pages, max=policy.n_sink_pages)[:, None]
    local_lo = (last - policy.n_local_pages + 1)[:, None]
    local = (idx >= local_lo) & (idx <= last[:, None])
    chosen = (sink | local)[:, None, :].expand(s_n, hs, max_pages).clone()  # [S, Hs, P]
    if top_k > 0:
        cand = (idx >= policy.n_sink_pages) & (idx < local_lo)  # [S, P]
        # Candidates always outrank non-candidates, whatever their (finite or not) score.
        sc = torch.nan_to_num(scores.float(), nan=-3e38, neginf=-3e38, posinf=3e38)
        sc = sc.masked_fill(~cand[:, None, :], -math.inf)
        k = min(top_k, max_pages)
        top_val, top_idx = sc.topk(k, dim=-1)  # [S, Hs, k]
        chosen.scatter_(-1, top_idx, torch.isfinite(top_val) | chosen.gather(-1, top_idx))
    width = policy.n_sink_pages + policy.n_local_pages + top_k
    # Sort selected indices first (ascending) by pushing the rest to max_pages.
    keyed = torch.where(chosen, idx, max_pages)  # [S, Hs, P]
    ordered = keyed.sort(dim=-1).values[..., :width]
    if ordered.shape[-1] < width:  # fewer pages exist than the selection width
        pad = torch.full((s_n, hs, width - ordered.shape[-1]), max_pages, device=dev, dtype=ordered.dtype)
        ordered = torch.cat([ordered, pad], dim=-1)
    selected = torch.where(ordered < max_pages, ordered, -1).to(torch.int32)
    n_selected = chosen[:, 0].sum(-1).to(torch.int32)  # same count for every head
    return selected, n_selected


# --------------------------------------------------------------------------------------
# Prefill: a chunk of one sequence against its pages.
# --------------------------------------------------------------------------------------


def chunk_page_plan(q, layer, block_table, start_pos: int, policy: AttentionPolicy, extra=None):
    """Which logical pages a prefill chunk visits, per kv head.

    ``extra``: logical pages [E] every query of the chunk sees besides the policy's own
    (a selection made elsewhere, e.g. from the question); ignored for dense.
    Returns (pages [Hs, L] int32 ascending, -1 padded; local_only [Hs, L] bool: the page
    is visible only to queries for which it is local; n_pages [Hs] int32)."""
    spec = layer.spec
    bs = spec.block_size
    n_q = q.shape[0]
    dev = q.device
    end = start_pos + n_q
    p_first, p_last = start_pos // bs, (end - 1) // bs
    n_total = p_last + 1
    idx = torch.arange(n_total, device=dev)
    if policy.kind == "dense":
        pages = idx[None].to(torch.int32)
        return pages, torch.zeros_like(pages, dtype=torch.bool), torch.tensor([n_total], dtype=torch.int32, device=dev)
    always = (idx < policy.n_sink_pages)[None]  # [1, P]
    if policy.kind == "topk" and policy.top_k_pages > 0:
        scores = chunk_scores(q, layer, block_table, end, policy.per_kv_head)  # [Hs, P]
        lens = torch.tensor([end], device=dev)
        sel, n_sel = select_pages(scores[None], lens, bs, policy, max_pages=n_total,
                                  last_page=torch.tensor([p_last], device=dev))
        # Padding (-1) goes to a spare last column, so it cannot clobber a real page.
        always = torch.zeros(sel.shape[1], n_total + 1, dtype=torch.bool, device=dev)
        always.scatter_(1, torch.where(sel[0] >= 0, sel[0].long(), n_total), True)
        always = always[:, :n_total]
        # Local pages of the last query are in sel too; only sinks and top-k are "always".
        local_last = idx >= p_last - policy.n_local_pages + 1
        always &= ~local_last[None] | (idx < policy.n_sink_pages)[None]
    if extra is not None and extra.numel():
        forced = torch.zeros(n_total, dtype=torch.bool, device=dev)
        forced[extra.long()[(extra >= 0) & (extra < n_total)]] = True
        always = always | forced[None]
    local_any = (idx >= p_first - policy.n_local_pages + 1)[None]  # local to some query
    visit = always | local_any  # [Hs, P]
    keyed = torch.where(visit, idx, n_total).sort(dim=-1).values  # selected first, ascending
    width = int(visit.sum(-1).max())
    keyed = keyed[:, :width]
    pages = torch.where(keyed < n_total, keyed, -1).to(torch.int32)
    local_only = ~always.gather(1, keyed.clamp(max=n_total - 1)) & (pages >= 0)
    return pages, local_only, visit.sum(-1).to(torch.int32)


def chunk_scores(q, layer, block_table, ctx_len: int, per_kv_head=True, max_rows=None):
    """Quest scores of every page for a query chunk: max over the chunk's queries and the
    group's heads. q [N, HQ, D] -> [H or 1, n_pages]."""
    spec = layer.spec
    bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
    n_pages = (ctx_len + bs - 1) // bs
    phys = block_table[:n_pages].long()
    kmin = layer.k_min[phys].transpose(0, 1)  # [H, P, D]
    kmax = layer.k_max[phys].transpose(0, 1)
    group = q.shape[1] // h
    qg = q.float().view(-1, h, group, d).permute(1, 0, 2, 3).reshape(h, -1, d)  # [H, N*G, D]
    rows = max_rows or max(1, _TILE_BYTES // (4 * max(n_pages, 1) * h))
    best = torch.full((h, n_pages), -math.inf, device=q.device)
    for r0 in range(0, qg.shape[1], rows):
        best = torch.maximum(best, quest_bound(qg[:, r0 : r0 + rows], kmin, kmax).amax(dim=1))
    return best if per_kv_head else best.amax(dim=0, keepdim=True)


def paged_prefill_attention(q, layer, block_table, start_pos: int, scale: float, policy=None, out=None):
    """Causal attention of a chunk q [N, HQ, D] (positions start_pos..) over its pages."""
    policy = policy or DENSE
    spec = layer.spec
    group = _check_q(q, spec)
    n_q, hq, d = q.shape
    h, bs = spec.n_kv_heads, spec.block_size
    dev = q.device
    end = start_pos + n_q
    pages, local_only, _ = chunk_page_plan(q, layer, block_table, start_pos, policy)
    pages = pages.expand(h, pages.shape[-1])
    local_only = local_only.expand(h, local_only.shape[-1])
    # Rows are (query, head-in-group) pairs of one kv head: [H, N*G, D].
    qh = (q.float() * scale).view(n_q, h, group, d).permute(1, 0, 2, 3).reshape(h, n_q * group, d)
    q_pos = (start_pos + torch.arange(n_q, device=dev)).repeat_interleave(group)  # [N*G]
    q_page = q_pos // bs
    state = _OnlineSoftmax((h, n_q * group), d, dev)
    tile = _pages_per_tile(layer, n_q * hq, h)
    lens = torch.tensor([end], device=dev)
    for p0 in range(0, pages.shape[-1], tile):
        pg, lo = pages[:, p0 : p0 + tile], local_only[:, p0 : p0 + tile]
        k, v, pos = gather_kv(layer, block_table[None], pg[None], lens)  # [1, H, T, D]
        k, v, pos = k[0], v[0], pos[0]  # [H, T, D], [H, T]
        lo_tok = lo.repeat_interleave(bs, dim=-1)  # [H, T]
        k_page = pos // bs
        visible = (pos[:, None, :] >= 0) & (pos[:, None, :] <= q_pos[None, :, None])  # [H, R, T]
        near = k_page[:, None, :] > q_page[None, :, None] - policy.n_local_pages
        visible &= ~lo_tok[:, None, :] | near
        state.update(qh @ k.transpose(-1, -2), v, visible)
    res = state.result().view(h, n_q, group, d).permute(1, 0, 2, 3).reshape(n_q, hq, d).to(q.dtype)
    if out is None:
        return res
    out.copy_(res)
    return out
