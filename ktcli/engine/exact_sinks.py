"""The sink pages of sparse policies kept exact beside their quantized copies.

Why: under `window` and `topk` every query of every layer reads the sequence's first
page (the attention sink, StreamingLLM), and over a few hundred visible keys instead of
the whole context it takes a larger share of each head's attention than under dense
attention. With int4 pages its quantisation error is therefore in every output. Keeping
those tokens at full precision is IntactKV's observation (the sink tokens' KV left
unquantised); in a fake-quantised ablation on SmolLM2 it took 31% off int4's KL to
fp32 (BENCHMARKS.md, `kv_sink_ablation`).

How: the quantized page is stored as usual (so every reader that does not know about
this one still works), and a pool of slots, one per sequence like the staging pool,
holds the same rows at the staging precision. `KernelKVCache` writes a sequence's rows
at positions below `n_tokens` into its slot as it stores them and swaps them into what
the remapped attention and `QuestionPages` gather. The cost is fixed per sequence
(one page per layer, as a staging slot), not per token: KV bytes per token do not move.
A sequence that finds no free slot reads its quantized sink, as before.

`swap_in_` and `overlay_keys` put any such rows known at full precision (`ExactRows`) over
what was read from the pages; `KernelKVCache` also passes a step's own rows that way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Rows known at full precision, read instead of their quantized copies: the first
# position they hold and k, v [N, H, D] (a sequence's sink rows, a step's own rows).
ExactRows = tuple[int, torch.Tensor, torch.Tensor]


class ExactSinks:
    def __init__(self, n_layers: int, n_tokens: int, n_kv_heads: int, head_dim: int, n_slots: int,
                 dtype: torch.dtype, device: torch.device):
        self.n_tokens = n_tokens
        shape = (n_slots, n_layers, n_tokens, n_kv_heads, head_dim)
        # Uninitialised: a row is read only once its sequence has stored it (positions below
        # the context), and on the CPU untouched slots then cost no resident memory (one
        # sequence of the CLI uses 1 of the 32).
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self._slot_of: dict[int, int] = {}  # sequence (its first physical block) -> slot
        self._free = list(range(n_slots - 1, -1, -1))

    def store(self, key: int, layer: int, start: int, k: torch.Tensor, v: torch.Tensor,
              is_free: Callable[[int], bool] | None) -> None:
        """Rows k, v [N, H, D] of sequence `key` at positions start..start+N-1: keep those
        below n_tokens. A sequence takes its slot when its position 0 arrives (a new
        prompt, or a recompute after preemption, writes the whole sink again)."""
        n = min(k.shape[0], self.n_tokens - start)
        if n <= 0:
            return
        slot = self._slot_of.get(key)
        if slot is None:
            if start != 0:  # its first rows went by without a slot: it keeps reading the page
                return
            slot = self._take(is_free)
            if slot is None:
                return
            self._slot_of[key] = slot
        self.k[slot, layer, start : start + n] = k[:n].to(self.k.dtype)
        self.v[slot, layer, start : start + n] = v[:n].to(self.v.dtype)

    def rows(self, key: int, layer: int) -> ExactRows | None:
        """The exact sink rows (from position 0, [n_tokens, H, D]) of sequence `key` in
        `layer`, if it has a slot."""
        slot = self._slot_of.get(key)
        return None if slot is None else (0, self.k[slot, layer], self.v[slot, layer])

    def _take(self, is_free: Callable[[int], bool] | None) -> int | None:
        if not self._free and is_free is not None:
            for key in [k for k in self._slot_of if is_free(k)]:
                self._free.append(self._slot_of.pop(key))
        return self._free.pop() if self._free else None


def swap_in_(spans: Sequence[ExactRows], k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
             shared: bool = False) -> None:
    """In gathered keys and values k, v [H, W, D] (the caller's own: written in place) at
    token positions pos [H, W] (-1: none), replace every row a span holds by the exact
    one. `shared`: every head has the same positions (one page set for all heads), so the
    rows are found once, in head 0, and written as whole columns."""
    for first, ek, ev in spans:
        if shared:
            p = pos[0]
            cols = ((p >= first) & (p < first + ek.shape[0])).nonzero().squeeze(1)
            if cols.numel():
                at = p[cols] - first
                k[:, cols] = ek[at].transpose(0, 1).to(k.dtype)  # [n, H, D] -> [H, n, D]
                v[:, cols] = ev[at].transpose(0, 1).to(v.dtype)
            continue
        hit = (pos >= first) & (pos < first + ek.shape[0])
        head, col = hit.nonzero(as_tuple=True)
        if head.numel():
            at = pos[head, col] - first
            k[head, col] = ek[at, head].to(k.dtype)
            v[head, col] = ev[at, head].to(v.dtype)


def overlay_keys(spans: Sequence[ExactRows], k: torch.Tensor, offset: int, v: torch.Tensor | None = None) -> torch.Tensor:
    """Keys k [rows, H, D] of positions offset.. (and values v alike, if given) with the
    rows the spans hold written over the dequantised ones, in place."""
    end = offset + k.shape[0]
    for first, ek, ev in spans:
        lo, hi = max(first, offset), min(end, first + ek.shape[0])
        if hi > lo:
            k[lo - offset : hi - offset] = ek[lo - first : hi - first].to(k.dtype)
            if v is not None:
                v[lo - offset : hi - offset] = ev[lo - first : hi - first].to(v.dtype)
    return k
