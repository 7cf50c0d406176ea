"""Paged, quantized, sparse KV attention: Triton kernels and their plain-torch twins.

This package imports torch (and triton when present), never ktcli. Every public function
below dispatches: CUDA tensors go to the Triton kernel, anything else (or a machine
without triton) to ``kernels.reference``, which computes the same function and is the
test oracle. ``set_backend("reference" | "triton" | "auto")`` overrides the choice (tests
force "triton" on CPU tensors under ``TRITON_INTERPRET=1``); so does the environment
variable ``KTCLI_KERNELS``.

Notation: NB pages (blocks) per layer, BS tokens per page (``block_size``), H kv heads,
HQ query heads (a multiple of H; query head ``hq`` reads kv head ``hq // (HQ // H)``),
D head_dim, G value group size, NS staging slots, S sequences.

Paged KV layout (one ``PagedKVLayer`` per layer, all layers share one ``KVCacheSpec``)
---------------------------------------------------------------------------------------
* Token ``t`` of a sequence lives in logical page ``t // BS`` at offset ``t % BS``; the
  sequence's row of ``block_tables`` ([S, max_pages] int32) maps a logical page to a
  physical block. ``slot = block * BS + offset`` addresses one token row. Context
  lengths ([S] int32) count every stored token, the current query's own K/V included:
  callers store K/V (``kv_store``) *before* they attend.
* The engine writes each sequence's tokens in order (offset 0 first, offset BS-1 last).
  Writing offset 0 of a block starts it afresh, so blocks are reusable after a free.

Page kinds (``spec.kv_dtype``):

``"fp32" | "bf16" | "fp16"``
    ``k_pages``, ``v_pages``: [NB, BS, H, D] of that dtype, written in place.
``"fp8"``
    ``k_pages``, ``v_pages``: [NB, BS, H, D] uint8 holding float8 e4m3fn bit patterns;
    ``k_scale``, ``v_scale``: [NB, H] float32. Stored code = x / scale with
    ``scale = amax(|x| over the page's BS tokens and D channels) / 448``;
    dequantised x = float(code) * scale.
``"int8" | "int4"`` (KIVI: keys per channel, values per token)
    qmax = 255 (int8) or 15 (int4 values); codes are unsigned, asymmetric.
    Keys: one (zero, scale) per (block, kv head, channel) over the page's BS tokens, and
    they are the page summary itself: ``zero = k_min``, ``scale = (k_max - k_min) / qmax``,
    dequantised k = k_min + code * scale.
    int4 keys give each (block, kv head, channel) its own width w in 0..8 bits, 4 on
    average (4 * D bits per row, chosen at sealing by ``reference.key_widths`` from the
    channels' ranges and ``k_weight`` [H, D] float32, the per-model query weights):
    qmax = 2^w - 1 per channel, and a 0-bit channel reads as ``k_min + (k_max - k_min) / 2``.
    ``k_bits`` [NB, H, D // 2] uint8 holds the widths, two per byte as int4 codes. A key
    row is one little-endian bitstream: channel c's code at bits [o_c, o_c + w_c) with
    o_c = w_0 + ... + w_{c-1} (``reference.pack_bitstream``); widths all 4 make it the
    nibble layout below.
    Values: one (zero, scale) per (block, token, kv head, group of G channels):
    ``v_zero``, ``v_scale`` [NB, BS, H, D // G] float16, zero rounded down from the group's
    min and scale up from (max - zero) / qmax, v = v_zero + code * v_scale in float32.
    ``k_pages``, ``v_pages``: [NB, BS, H, D] uint8 for int8; [NB, BS, H, D // 2] uint8 for
    int4, values with channel ``2c`` in the low nibble and ``2c + 1`` in the high nibble of
    byte c, keys as bitstreams.
    Codes are ``floor((x - zero) / scale + 0.5)`` clamped to [0, qmax] (0 when scale is 0).

Staging and sealing (quantized kinds only: fp8, int8, int4). A page's scales need all
of its BS tokens, so the partial last page of a sequence lives at full precision in a
staging pool: ``stage_k``, ``stage_v`` [NS, BS, H, D] of ``spec.stage_dtype``;
``stage_of_block`` [NB] int32 gives a block's slot (-1 = none) and ``block_of_stage``
[NS] int32 the owner of a slot (-1 = free). ``kv_store`` gives a block a slot when it
first writes into it, and *seals* the block the moment its last row (offset BS-1) is
written: the slot's rows are quantised into the block's page, then the slot is freed.
Hence, for a sequence of length L, attention reads:

* logical pages ``p < L // BS`` (full ones): the sealed, quantised page;
* logical page ``p = L // BS`` when ``L % BS != 0`` (the tail): rows ``0 .. L % BS - 1``
  of staging slot ``stage_of_block[block_tables[s, p]]``, at full precision.

Float kinds have no staging: the tail is read from its page, rows beyond L masked.
When a sequence is freed with a partial page, call ``release_blocks(layer, blocks)`` so
its staging slot returns to the pool (a block that is re-written from offset 0 also
reuses its stale slot, so forgetting this leaks slots, never corrupts data).

Page summaries (Quest): ``k_min``, ``k_max`` [NB, H, D] float32, the per-channel min and
max of the page's keys *as attention sees them*: the dequantised page once sealed, the
full-precision keys while staged or for float kinds; rows beyond the fill are ignored
and a never-written block has (+inf, -inf). For int8/int4 they are also the key scales.
(fp8 and int kinds: the bound holds up to float32 rounding of the dequantisation.)

Memory: ``bytes_per_token(spec)`` (pages, scales, summaries, amortised over BS) and
``staging_bytes(spec, n_stage)`` let a planner size the pool without allocating;
``exact_page_bytes(spec, n_slots, n_pages)`` sizes pages kept at staging precision beside
quantized ones (a caller's exact sink pages).

Attention
---------
``scale`` is the softmax scale (usually D ** -0.5). Queries and outputs are
[tokens, HQ, D]; outputs have the query's dtype. Scores, softmax and accumulation are
float32 in both paths.

Sparse selection (Quest): ``score_pages`` gives each page an upper bound of q.k over its
keys, ``sum_d max(q_d * k_min_d, q_d * k_max_d)``, and takes the max over the HQ/H query
heads that share a kv head (a page matters if any head of the group may attend to it);
``per_kv_head=False`` also takes the max over kv heads (one selection per sequence).
Pages at or past ``ceil(L / BS)`` score -inf. Selection (``select_pages``) is by logical
page: the first ``n_sink_pages`` pages, the last ``n_local_pages`` pages (those ending at
the query's page), and the ``top_k_pages`` best-scoring other pages, sorted ascending and
padded with -1. Selections have shape [S, 1 or H, n_sink + n_local + top_k].

``AttentionPolicy`` names a policy: ``dense``; ``window`` (sinks + local pages, StreamingLLM
at page granularity); ``topk`` (sinks + local + top-k scored pages, Quest). For a query at
position i (page p_i) a key at position j is visible iff ``j <= i`` and its page is a sink,
or local (``p_i - n_local_pages < page(j) <= p_i``), or selected. In prefill the top-k is
chosen once per query chunk (max score over the chunk's queries) among the pages that are
neither sinks nor local to the chunk's last query; in decode the chunk is one query, so
prefill and decode follow the same rule. ``topk`` with a k covering every page is dense.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch

from . import reference
from .layout import (
    FLOAT_KINDS,
    KV_KINDS,
    QUANT_KINDS,
    KVCacheSpec,
    PagedKVLayer,
    allocate,
    bytes_per_block,
    bytes_per_token,
    exact_page_bytes,
    staging_bytes,
)
from .reference import AttentionPolicy, release_blocks
from .store_plan import StorePlan, plan_store

# triton is optional (without it every call takes the reference path) and imported only
# when a kernel first runs: triton chooses between compiling and interpreting
# (TRITON_INTERPRET) when its modules are first imported, so importing it here would
# fix that choice before a test or the bench could make it.
HAS_TRITON = importlib.util.find_spec("triton") is not None

__all__ = [
    "FLOAT_KINDS", "QUANT_KINDS", "KV_KINDS", "HAS_TRITON",
    "KVCacheSpec", "PagedKVLayer", "AttentionPolicy",
    "allocate", "bytes_per_block", "bytes_per_token", "exact_page_bytes", "staging_bytes", "release_blocks",
    "kv_store", "plan_store", "kv_store_planned", "StorePlan", "paged_attention_decode", "score_pages", "select_pages",
    "sparse_attention_decode", "attention_decode", "paged_prefill_attention",
    "set_backend", "get_backend",
]

_BACKENDS = ("auto", "reference", "triton")
_backend = os.environ.get("KTCLI_KERNELS", "auto")


def set_backend(name: str) -> None:
    """'auto' (Triton for CUDA tensors), 'reference' (always torch), 'triton' (always)."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}")
    _backend = name


def get_backend() -> str:
    return _backend


def _use_triton(t: torch.Tensor, layer: PagedKVLayer | None = None) -> bool:
    """Triton for CUDA tensors (or always, if forced) when the layer's shapes suit the
    kernels (power-of-two block_size, head_dim, group >= 16); the reference otherwise.
    No layer: a kernel that reads no pages (selection), with no shapes to check."""
    if _backend == "reference" or not HAS_TRITON:
        return False
    if not (_backend == "triton" or t.is_cuda):
        return False
    if layer is None:
        return True
    from ._page_io import triton_supports

    return triton_supports(layer)


def kv_store(layer: PagedKVLayer, k_new: torch.Tensor, v_new: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write K/V rows [N, H, D] to ``slot_mapping`` [N] (block * BS + offset), quantising
    and sealing pages and refreshing the key summaries of every touched block."""
    kv_store_planned(layer, k_new, v_new, plan_store(layer, slot_mapping))


def kv_store_planned(layer: PagedKVLayer, k_new: torch.Tensor, v_new: torch.Tensor, plan: StorePlan) -> None:
    """``kv_store`` with its bookkeeping planned beforehand (``plan_store``, once for all
    the layers of a step): device work only, no value read back to the host."""
    if _use_triton(k_new, layer):
        from .kv_store_triton import kv_store_planned_triton

        return kv_store_planned_triton(layer, k_new, v_new, plan)
    return reference.apply_store(reference.TORCH_OPS, layer, k_new, v_new, plan)


# (kernel, page spec, device) that this GPU cannot load: Triton raised OutOfResources (a
# block needing more shared memory than its SMs give; e.g. decode over fp32 pages at
# head_dim 128 takes 139 KB, which sm_86 / sm_89 GPUs lack: `python -m
# kernels.compile_check --arch 89`). Those calls run on the reference, after one warning.
_UNFIT: set[tuple] = set()


def _fitted(name: str, layer: PagedKVLayer, device: torch.device, triton_call, reference_call):
    key = (name, layer.spec, str(device))
    if key not in _UNFIT:
        from triton.runtime.errors import OutOfResources

        try:
            return triton_call()
        except OutOfResources as e:  # raised as the kernel loads, before it writes anything
            _UNFIT.add(key)
            spec = layer.spec
            warnings.warn(f"{name}: this GPU cannot run the Triton kernel on {spec.kv_dtype} pages of "
                          f"{spec.block_size} tokens at head_dim {spec.head_dim} ({e}); using the torch version",
                          RuntimeWarning, stacklevel=3)
    return reference_call()


def paged_attention_decode(q, layer, block_tables, context_lens, scale, out=None):
    """Dense decode: q [S, HQ, D], one query per sequence -> [S, HQ, D]."""
    def ref():
        return reference.paged_attention_decode(q, layer, block_tables, context_lens, scale, out=out)

    if _use_triton(q, layer):
        from .paged_attention import paged_attention_decode_triton

        return _fitted("paged_attention_decode", layer, q.device,
                       lambda: paged_attention_decode_triton(q, layer, block_tables, context_lens, scale, out=out), ref)
    return ref()


def score_pages(q, layer, block_tables, context_lens, per_kv_head=True, out=None):
    """Quest upper bound per page: q [S, HQ, D] -> [S, H or 1, max_pages] float32."""
    def ref():
        return reference.score_pages(q, layer, block_tables, context_lens, per_kv_head=per_kv_head, out=out)

    if _use_triton(q, layer):
        from .sparse_attention import score_pages_triton

        return _fitted("score_pages", layer, q.device,
                       lambda: score_pages_triton(q, layer, block_tables, context_lens, per_kv_head=per_kv_head, out=out),
                       ref)
    return ref()


def select_pages(scores, context_lens, block_size, policy: AttentionPolicy, max_pages=None, last_page=None):
    """Sinks + local + top-k pages by logical index (see ``reference.select_pages``); a
    decode step's selection (no ``last_page``) on CUDA runs as one Triton kernel."""
    if last_page is None and _use_triton(context_lens):
        from .sparse_attention import select_pages_triton

        return select_pages_triton(scores, context_lens, block_size, policy, max_pages=max_pages)
    return reference.select_pages(scores, context_lens, block_size, policy, max_pages=max_pages, last_page=last_page)


def sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale, out=None):
    """Decode over the selected logical pages ``selected`` [S, 1 or H, K] (first
    ``n_selected[s]`` valid) -> [S, HQ, D]."""
    def ref():
        return reference.sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale,
                                                 out=out)

    if _use_triton(q, layer):
        from .sparse_attention import sparse_attention_decode_triton

        return _fitted("sparse_attention_decode", layer, q.device,
                       lambda: sparse_attention_decode_triton(q, layer, block_tables, selected, n_selected,
                                                              context_lens, scale, out=out), ref)
    return ref()


def attention_decode(q, layer, block_tables, context_lens, scale, policy: AttentionPolicy | None = None):
    """One decode step under ``policy``: dense, or select pages then sparse attention."""
    policy = policy or AttentionPolicy()
    if policy.kind == "dense":
        return paged_attention_decode(q, layer, block_tables, context_lens, scale)
    scores = None
    if policy.kind == "topk" and policy.top_k_pages > 0:
        scores = score_pages(q, layer, block_tables, context_lens, per_kv_head=policy.per_kv_head)
    selected, n_selected = select_pages(
        scores, context_lens, layer.spec.block_size, policy, max_pages=block_tables.shape[1]
    )
    return sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale)


def paged_prefill_attention(q, layer, block_table, start_pos, scale, policy: AttentionPolicy | None = None, out=None):
    """A chunk of one sequence: q [N, HQ, D] at positions start_pos .. start_pos+N-1,
    causal over its stored pages (the chunk's own K/V stored first) -> [N, HQ, D]."""
    def ref():
        return reference.paged_prefill_attention(q, layer, block_table, start_pos, scale, policy=policy, out=out)

    if _use_triton(q, layer):
        from .prefill_attention import paged_prefill_attention_triton

        return _fitted("paged_prefill_attention", layer, q.device,
                       lambda: paged_prefill_attention_triton(q, layer, block_table, start_pos, scale, policy=policy,
                                                              out=out), ref)
    return ref()
