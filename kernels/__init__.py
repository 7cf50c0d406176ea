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

import importlib

# The public names, each from the module that defines it, imported on first use: the
# planner reads the page format's byte figures (``page_format``, no torch), and importing
# torch for them made `ktcli plan` twice as slow.
_HOMES = {
    **dict.fromkeys(("FLOAT_KINDS", "QUANT_KINDS", "KV_KINDS", "KVCacheSpec", "bytes_per_block", "bytes_per_token",
                     "exact_page_bytes", "staging_bytes"), "page_format"),
    **dict.fromkeys(("PagedKVLayer", "allocate"), "layout"),
    **dict.fromkeys(("AttentionPolicy", "release_blocks"), "reference"),
    **dict.fromkeys(("StorePlan", "plan_store"), "store_plan"),
    **dict.fromkeys(("HAS_TRITON", "kv_store", "kv_store_planned", "paged_attention_decode", "score_pages",
                     "select_pages", "sparse_attention_decode", "attention_decode", "paged_prefill_attention",
                     "set_backend", "get_backend"), "dispatch"),
}
_SUBMODULES = ("page_format", "layout", "reference", "store_plan", "dispatch")

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups skip this function (kernels are called per layer and step)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES) | set(_SUBMODULES))
