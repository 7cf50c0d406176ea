"""The paged KV cache: the tensors, allocated once. The block manager decides who owns
which page; this module only stores.

Layout per layer: pages [num_blocks, block_size, n_kv_heads, head_dim] (the layout of
`kernels.layout`), kept as one flat slot axis [num_blocks * block_size, H, D] so a slot
index addresses a token row and a run of consecutive pages is one strided view.
"""

from __future__ import annotations

import torch

from ktcli.engine.attention import block_slots
from ktcli.errors import OutOfMemoryError


class PagedKVCache:
    """`__init__` records the shape; `allocate(num_blocks)` creates the tensors once."""

    # torch.empty: a page takes memory when a request first writes it, so a server's
    # resident size at start leaves the pool out (`ktcli serve`'s start line adds it)
    written_at_allocation = False

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size, self.dtype, self.device = block_size, dtype, torch.device(device)
        self.num_blocks = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    @property
    def bytes_per_block(self) -> int:
        element = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.n_layers * self.block_size * self.n_kv_heads * self.head_dim * element

    def blocks_for_budget(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_block

    def allocate(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise OutOfMemoryError(
                f"KV memory budget is below one page ({self.bytes_per_block} bytes for {self.block_size} tokens)"
            )
        slots = num_blocks * self.block_size
        try:
            # One tensor per kind for all layers; torch.empty leaves pages untouched until
            # written, so resident memory grows with use, not with the budget.
            k = torch.empty(self.n_layers, slots, self.n_kv_heads, self.head_dim, dtype=self.dtype, device=self.device)
            v = torch.empty(self.n_layers, slots, self.n_kv_heads, self.head_dim, dtype=self.dtype, device=self.device)
        except RuntimeError as e:  # allocation failure (torch.OutOfMemoryError on CUDA)
            raise OutOfMemoryError(f"cannot allocate a KV cache of {num_blocks} pages: {e}") from None
        self.num_blocks = num_blocks
        self.k = list(k.unbind(0))  # per layer [slots, H, D], views of the one tensor
        self.v = list(v.unbind(0))
        self._k_all, self._v_all = k, v

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as [num_blocks, block_size, H, D] (the kernels layout)."""
        # [slots, H, D] -> [NB, BS, H, D]
        shape = (self.num_blocks, self.block_size, self.n_kv_heads, self.head_dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    @property
    def allocated_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    # -- prompt rows kept on disk (engine.prefix_store) ---------------------------------
    # A token's rows depend only on the tokens before it, whatever chunks the prompt was
    # prefilled in: any prefix of a kept prompt serves, one token row per unit.

    prefix_unit = 1
    prefix_fixed: frozenset[str] = frozenset()

    def reusable_prefix(self, shared: int, prompt_len: int, prefill_chunk: int, min_last_chunk: int = 0) -> int:
        """Of `shared` leading tokens held, how many a prompt of `prompt_len` reads: all
        but its last token, whose logits give the first answer token."""
        return max(0, min(shared, prompt_len - 1))

    def keepable_prefix(self, prompt_len: int, aligned: int) -> int:
        """How many of a finished prompt's leading tokens an entry keeps: all."""
        return prompt_len

    def prefix_arrays(self, layer: int, block_table: list[int], n: int) -> dict[str, torch.Tensor]:
        slots = self._slots(block_table, n)
        return {"k": self.k[layer].index_select(0, slots), "v": self.v[layer].index_select(0, slots)}

    def write_prefix(self, layer: int, block_table: list[int], n: int, arrays: dict[str, torch.Tensor]) -> None:
        """Rows read back from an entry into the slots of a sequence's first n tokens;
        ValueError for rows of another shape."""
        k, v = arrays.get("k"), arrays.get("v")
        want = (n, self.n_kv_heads, self.head_dim)
        if k is None or v is None or tuple(k.shape) != want or tuple(v.shape) != want:
            raise ValueError("rows of another shape")
        slots = self._slots(block_table, n)
        self.k[layer].index_copy_(0, slots, k.to(self.device, self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.device, self.dtype))

    def _slots(self, block_table: list[int], n: int) -> torch.Tensor:
        first, slot_index = block_slots(block_table, self.block_size, n)
        return (torch.arange(first, first + n) if first is not None else slot_index).to(self.device)
