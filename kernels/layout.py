"""The paged KV format: spec, per-layer container, allocation and memory figures.

The full specification is in the docstring of ``kernels/__init__.py``; this module
only holds the data. It is a pure torch module so a planner can call
``bytes_per_token`` without triton or a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FLOAT_KINDS = ("fp32", "bf16", "fp16")
QUANT_KINDS = ("fp8", "int8", "int4")
KV_KINDS = FLOAT_KINDS + QUANT_KINDS

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Largest finite float8 e4m3fn value; fp8 pages map each (block, kv_head) amax onto it.
FP8_MAX = 448.0
# int8/int4 value (zero, scale) pairs are stored in fp16: with head_dim 64 and one group
# per token, fp32 pairs cost 8 of int4's 80 bytes per token and head. Values arrive from an
# fp16 staging page, so fp16 holds their range; zero is rounded down and scale up
# (reference.quantize_values), so the codes still span [lo, hi], each step at most one fp16
# ulp (2^-11 relative) wider. (Keys keep fp32: a key channel often sits far from 0 with a
# narrow range, where one fp16 ulp of its offset is several quantisation steps; 514be61
# measured that.)
V_PARAM_DTYPE = torch.float16


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
    def page_torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES.get(self.kv_dtype, torch.uint8)

    @property
    def stage_torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.stage_dtype]

    @property
    def packed_dim(self) -> int:
        """Last dimension of the page tensors (int4 packs two channels per byte)."""
        return self.head_dim // 2 if self.kv_dtype == "int4" else self.head_dim


@dataclass
class PagedKVLayer:
    """One layer's KV pool. Tensors are allocated once by ``allocate``; see the package
    docstring for the meaning of every field."""

    spec: KVCacheSpec
    k_pages: torch.Tensor  # [NB, BS, H, Dp]
    v_pages: torch.Tensor  # [NB, BS, H, Dp]
    k_min: torch.Tensor  # [NB, H, D] float32
    k_max: torch.Tensor  # [NB, H, D] float32
    # fp8: [NB, H] per-page scales. int8/int4: v_scale, v_zero [NB, BS, H, D // G].
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    v_zero: torch.Tensor | None = None
    # int4: key widths per (block, kv head, channel), two per byte [NB, H, D // 2] uint8, and
    # the weight per (kv head, channel) that allocates them (mean q^2; ones until a caller
    # calibrates it). See reference.key_widths.
    k_bits: torch.Tensor | None = None
    k_weight: torch.Tensor | None = None
    # Staging pool for the unsealed (partial) page of each sequence; quantized kinds only.
    stage_k: torch.Tensor | None = None  # [NS, BS, H, D] stage dtype
    stage_v: torch.Tensor | None = None  # [NS, BS, H, D]
    stage_of_block: torch.Tensor | None = None  # [NB] int32, -1 = not staged
    block_of_stage: torch.Tensor | None = None  # [NS] int32, -1 = free slot
    # Store plans applied and slot releases so far: a store plan (kernels.store_plan) is
    # valid for the staging state it was made at, counted here.
    store_version: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return self.k_pages.shape[0]

    @property
    def n_stage(self) -> int:
        return 0 if self.stage_k is None else self.stage_k.shape[0]

    @property
    def device(self) -> torch.device:
        return self.k_pages.device


def allocate(spec: KVCacheSpec, num_blocks: int, device: torch.device | str = "cpu", n_stage: int = 64) -> PagedKVLayer:
    """Allocate one layer's pool. ``n_stage`` staging slots (quantized kinds only) must be
    at least the number of sequences that can hold a partial page at once (one each);
    kv_store splits a call that touches more pages than there are free slots."""
    nb, bs, h, d = num_blocks, spec.block_size, spec.n_kv_heads, spec.head_dim
    dev = torch.device(device)
    pages = lambda: torch.zeros(nb, bs, h, spec.packed_dim, dtype=spec.page_torch_dtype, device=dev)  # noqa: E731
    layer = PagedKVLayer(
        spec=spec,
        k_pages=pages(),
        v_pages=pages(),
        # Empty pages get an empty interval (+inf, -inf): a bound that admits no key.
        k_min=torch.full((nb, h, d), float("inf"), dtype=torch.float32, device=dev),
        k_max=torch.full((nb, h, d), float("-inf"), dtype=torch.float32, device=dev),
    )
    if spec.kv_dtype == "fp8":
        layer.k_scale = torch.ones(nb, h, dtype=torch.float32, device=dev)
        layer.v_scale = torch.ones(nb, h, dtype=torch.float32, device=dev)
    elif spec.kv_dtype in ("int8", "int4"):
        layer.v_scale = torch.zeros(nb, bs, h, spec.n_groups, dtype=V_PARAM_DTYPE, device=dev)
        layer.v_zero = torch.zeros(nb, bs, h, spec.n_groups, dtype=V_PARAM_DTYPE, device=dev)
    if spec.kv_dtype == "int4":
        layer.k_bits = torch.full((nb, h, d // 2), 0x44, dtype=torch.uint8, device=dev)  # 4 bits everywhere
        layer.k_weight = torch.ones(h, d, dtype=torch.float32, device=dev)
    if spec.quantized:
        if n_stage < 1:
            raise ValueError("quantized kinds need at least one staging slot")
        layer.stage_k = torch.zeros(n_stage, bs, h, d, dtype=spec.stage_torch_dtype, device=dev)
        layer.stage_v = torch.zeros(n_stage, bs, h, d, dtype=spec.stage_torch_dtype, device=dev)
        layer.stage_of_block = torch.full((nb,), -1, dtype=torch.int32, device=dev)
        layer.block_of_stage = torch.full((n_stage,), -1, dtype=torch.int32, device=dev)
    return layer


def bytes_per_block(spec: KVCacheSpec) -> int:
    """Bytes one page of one layer costs: K and V codes, their scales, the key summary."""
    bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
    elem = torch.tensor([], dtype=spec.page_torch_dtype).element_size()
    total = 2 * bs * h * spec.packed_dim * elem  # K and V pages
    total += 2 * h * d * 4  # k_min, k_max (also the int8/int4 key scale and zero)
    if spec.kv_dtype == "fp8":
        total += 2 * h * 4  # k_scale, v_scale
    elif spec.kv_dtype in ("int8", "int4"):
        total += 2 * bs * h * spec.n_groups * V_PARAM_DTYPE.itemsize  # v_scale, v_zero
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
    elem = torch.tensor([], dtype=spec.stage_torch_dtype).element_size()
    return 2 * n_slots * n_pages * spec.block_size * spec.n_kv_heads * spec.head_dim * elem


def staging_bytes(spec: KVCacheSpec, n_stage: int) -> int:
    """Fixed per-layer cost: the staging pool, and int4's key weights (0 for float kinds)."""
    if not spec.quantized:
        return 0
    elem = torch.tensor([], dtype=spec.stage_torch_dtype).element_size()
    weights = 4 * spec.n_kv_heads * spec.head_dim if spec.kv_dtype == "int4" else 0
    return 2 * n_stage * spec.block_size * spec.n_kv_heads * spec.head_dim * elem + 4 * n_stage + weights  # + block_of_stage
