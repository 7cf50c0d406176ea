"""The paged KV cache's tensors: the per-layer container and its allocation.

The format and its memory figures are ``kernels/page_format.py`` (no torch); the full
specification is in the docstring of ``kernels/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .page_format import (  # noqa: F401 - the format's names, re-exported beside its tensors
    FLOAT_KINDS,
    FP8_MAX,
    KV_KINDS,
    QUANT_KINDS,
    V_PARAM_BYTES,
    KVCacheSpec,
    bytes_per_block,
    bytes_per_token,
    exact_page_bytes,
    qmax_of,
    staging_bytes,
)

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# int8/int4 value (zero, scale) pairs: see page_format.V_PARAM_BYTES.
V_PARAM_DTYPE = torch.float16


def page_dtype(spec: KVCacheSpec) -> torch.dtype:
    """dtype of the page tensors: the float kind, or uint8 codes (fp8 pages are viewed)."""
    return TORCH_DTYPES.get(spec.kv_dtype, torch.uint8)


def stage_dtype(spec: KVCacheSpec) -> torch.dtype:
    """dtype of the staging pool that holds unsealed pages of quantized kinds."""
    return TORCH_DTYPES[spec.stage_dtype]


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
    pages = lambda: torch.zeros(nb, bs, h, spec.packed_dim, dtype=page_dtype(spec), device=dev)  # noqa: E731
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
        layer.stage_k = torch.zeros(n_stage, bs, h, d, dtype=stage_dtype(spec), device=dev)
        layer.stage_v = torch.zeros(n_stage, bs, h, d, dtype=stage_dtype(spec), device=dev)
        layer.stage_of_block = torch.full((nb,), -1, dtype=torch.int32, device=dev)
        layer.block_of_stage = torch.full((n_stage,), -1, dtype=torch.int32, device=dev)
    return layer
