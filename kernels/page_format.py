"""The paged KV format's spec and its memory arithmetic, without torch.

``kernels/layout.py`` allocates the tensors this describes; the planner (`ktcli plan`)
sizes a cache from these figures alone, so it need not import torch (~1.2 s of a 2.6 s
plan on the 2-core CPU). The full specification is in the docstring of
``kernels/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT_KINDS = ("fp32", "bf16", "fp16")
QUANT_KINDS = ("fp8", "int8", "int4")
KV_KINDS = FLOAT_KINDS + QUANT_KINDS

# Bytes of one element of a float kind (quantized pages hold one-byte codes).
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# Largest finite float8 e4m3fn value; fp8 pages map each (block, kv_head) amax onto it.
FP8_MAX = 448.0
# int8/int4 value (zero, scale) pairs are stored in fp16: with head_dim 64 and one group
# per token, fp32 pairs cost 8 of int4's 80 bytes per token and head. Values arrive from an
# fp16 staging page, so fp16 holds their range; zero is rounded down and scale up
# (reference.quantize_values), so the codes still span [lo, hi], each step at most one fp16
# ulp (2^-11 relative) wider. (Keys keep fp32: a key channel often sits far from 0 with a
# narrow range, where one fp16 ulp of its offset is several quantisation steps; 514be61
# measured that.)
V_PARAM_BYTES = 2  # fp16; layout.V_PARAM_DTYPE


def qmax_of(kind: str) -> int:
    """Largest code of an asymmetric integer kind (codes run 0..qmax)."""
    return {"int8": 255, "int4": 15}[kind]


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape and format of one layer's paged KV cache (every layer shares it)."""

    n_kv_heads: int
    head_dim: int
    # 64-token pages: the fp32 key summaries (2 x 4 B per channel) amortise to 1/8 B per
    # channel-token, which int4 needs to stay under 0.3x fp16; Quest selection still sees
    # pages small enough to isolate a sentence (benchmarks/kv_memory.py has the sweep).
    block_size: int = 64
    kv_dtype: str = "fp16"
    # int8/int4 values: one (scale, zero) per this many channels of one token. 128 covers a
    # whole head for head_dim <= 128 (KIVI's per-token values), halving scale bytes vs 64.
    v_group_size: int = 128
    # Precision of the staging pool that holds unsealed pages of quantized kinds.
    stage_dtype: str = "fp16"

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_KINDS:
            raise ValueError(f"kv_dtype must be one of {KV_KINDS}, got {self.kv_dtype!r}")
        if self.stage_dtype not in FLOAT_KINDS:
            raise ValueError(f"stage_dtype must be one of {FLOAT_KINDS}")
        if self.block_size < 1 or self.n_kv_heads < 1 or self.head_dim < 1:
            raise ValueError("block_size, n_kv_heads and head_dim must be positive")
        if self.kv_dtype == "int4" and self.head_dim % 2:
            raise ValueError("int4 pages pack two channels per byte: head_dim must be even")
        if self.kv_dtype in ("int8", "int4") and self.head_dim % self.group_size:
            raise ValueError(f"head_dim {self.head_dim} is not a multiple of v_group_size {self.group_size}")

    @property
    def group_size(self) -> int:
        # A group wider than a head is one group per token.
        return min(self.v_group_size, self.head_dim)

    @property
    def n_groups(self) -> int:
        return self.head_dim // self.group_size

    @property
    def quantized(self) -> bool:
        return self.kv_dtype in QUANT_KINDS

    @property
    def page_bytes(self) -> int:
        """Bytes of one element of the page tensors (uint8 codes or fp8 for quantized kinds)."""
        return ELEMENT_BYTES.get(self.kv_dtype, 1)

    @property
    def stage_bytes(self) -> int:
        return ELEMENT_BYTES[self.stage_dtype]

    @property
    def packed_dim(self) -> int:
        """Last dimension of the page tensors (int4 packs two channels per byte)."""
        return self.head_dim // 2 if self.kv_dtype == "int4" else self.head_dim


def bytes_per_block(spec: KVCacheSpec) -> int:
    """Bytes one page of one layer costs: K and V codes, their scales, the key summary."""
    bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
    elem = spec.page_bytes
    total = 2 * bs * h * spec.packed_dim * elem  # K and V pages
    total += 2 * h * d * 4  # k_min, k_max (also the int8/int4 key scale and zero)
    if spec.kv_dtype == "fp8":
        total += 2 * h * 4  # k_scale, v_scale
    elif spec.kv_dtype in ("int8", "int4"):
        total += 2 * bs * h * spec.n_groups * V_PARAM_BYTES  # v_scale, v_zero
    if spec.kv_dtype == "int4":
        total += h * d // 2  # k_bits
    if spec.quantized:
        total += 4  # stage_of_block entry
    return total


def bytes_per_token(spec: KVCacheSpec) -> float:
    """Amortised bytes per cached token per layer, scales and summaries included
    (staging excluded: it is a fixed cost, see ``staging_bytes``)."""
    return bytes_per_block(spec) / spec.block_size


def exact_page_bytes(spec: KVCacheSpec, n_slots: int, n_pages: int) -> int:
    """Fixed per-layer cost of keeping `n_pages` pages per slot at the staging precision
    beside quantized pages (ktcli's exact sink pages; 0 for float kinds, which need none)."""
    if not spec.quantized:
        return 0
    elem = spec.stage_bytes
    return 2 * n_slots * n_pages * spec.block_size * spec.n_kv_heads * spec.head_dim * elem


def staging_bytes(spec: KVCacheSpec, n_stage: int) -> int:
    """Fixed per-layer cost: the staging pool, and int4's key weights (0 for float kinds)."""
    if not spec.quantized:
        return 0
    elem = spec.stage_bytes
    weights = 4 * spec.n_kv_heads * spec.head_dim if spec.kv_dtype == "int4" else 0
    return 2 * n_stage * spec.block_size * spec.n_kv_heads * spec.head_dim * elem + 4 * n_stage + weights  # + block_of_stage
