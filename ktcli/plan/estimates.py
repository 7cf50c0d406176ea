"""Memory and time estimates the planner weighs. Pure arithmetic, no model needed."""

from __future__ import annotations

from dataclasses import dataclass

from ktcli.types import ModelFacts

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
# Bytes a weight takes in the local engine's formats (int8: uint8 codes plus an fp16 scale
# and minimum per 32 values, engine.int8_gemv).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.125}


def kv_bytes_per_token(facts: ModelFacts, kv_dtype: str = "fp32") -> float:
    """K and V for every layer. Float dtypes: the engine's plain cache (no summaries);
    quantized ones: the kernels' paged format, scales and page summaries included."""
    if kv_dtype in ("fp8", "int8", "int4"):
        return paged_kv_bytes_per_token(facts, kv_dtype)
    return 2 * facts.n_layers * facts.n_kv_heads * facts.head_dim * DTYPE_BYTES[kv_dtype]


def paged_kv_bytes_per_token(facts: ModelFacts, kv_dtype: str) -> float:
    """Bytes per token of the kernels' paged cache (the sparse mode's), every layer."""
    from kernels.page_format import KVCacheSpec, bytes_per_token

    return facts.n_layers * bytes_per_token(KVCacheSpec(facts.n_kv_heads, facts.head_dim, kv_dtype=kv_dtype))


FULL_PREFILL_CHUNK = 2048  # engine.runner.DEFAULT_PREFILL_CHUNK
PAGED_PREFILL_CHUNK = 512  # a load over the kernels' pages (quantized or sparse; engine.native)
PAGE_TOKENS = 64  # the kernels' page size (kernels.KVCacheSpec.block_size)
# Staging slots of a one-request load (`engine.longctx._staging_slots`): a prefill
# chunk's pages, and its partial one.
ONE_REQUEST_STAGE = PAGED_PREFILL_CHUNK // PAGE_TOKENS + 2


def paged_fixed_bytes(facts: ModelFacts, kv_dtype: str, n_stage: int = ONE_REQUEST_STAGE, sink_pages: int = 1) -> int:
    """Per layer, for quantized kinds: the staging pool (full-precision partial pages) and
    the sparse policies' exact sink pages (`engine.exact_sinks`: as many fp32 slots of
    `sink_pages` pages as staging slots), every layer."""
    from kernels.page_format import KVCacheSpec, exact_page_bytes, staging_bytes

    spec = KVCacheSpec(facts.n_kv_heads, facts.head_dim, kv_dtype=kv_dtype, stage_dtype="fp32")
    return facts.n_layers * (staging_bytes(spec, n_stage) + exact_page_bytes(spec, n_stage, sink_pages))


# What a `ktcli ask` process holds besides the model, its KV and its activations, on the
# CPU: Python, torch, the tokenizer and ktcli (~270 MB after imports, ~320 MB with the
# tokenizer loaded, measured on x86-64 Linux; benchmarks/plan_memory.py), with room for
# the allocator's variation between runs (+-15 MB).
# Counted where the budget is RAM (`ModelFacts.host_bytes`), not on a GPU, whose budget
# is its own memory.
# 2026-12-04 on a Zen 4 EPYC (AVX-512 kernels) whole reads peaked 20-60 MB above the
# 12-03 figures on a Zen 3 with the same estimate (0.96 -> 1.02-1.06 of it at 6K tokens,
# also with that day's code): the margin is 50 MB wider since.
CPU_RUNTIME_BYTES = 430 * 2**20
# Retrieval also loads the embedder (all-MiniLM-L6-v2, fp32) and embeds batches of
# chunks: a cold index of the 68K-token tutorial peaked ~180 MB above a full read.
# Measured again (2026-12-07, 2-core EPYC beside other jobs, RSS sampled by phase): the
# model loaded, the embedder and an index read back add 90 MiB (1,470 chunks; the key
# lines' embedder 122), and the answer's prefill then reuses what embedding batches freed:
# the window's read added 152-156 MiB after a cold index of 341-540 chunks, where a full
# read of as many tokens added 206-235. At 200 MiB (with 32 KB a chunk) retrieval was
# planned at 0.76-0.83 of its peak under ~600 chunks (`--max-memory 1GB` refused the
# tutorial's question planned at 0.98 GiB, which peaked at 0.75-0.79) and 0.88-0.92 at
# 1,470. The fixed part is the key lines' (KEY_LINES_BYTES), the growth steeper, to the
# same total past the cap.
EMBEDDER_BYTES = 128 * 2**20
# And grows with the chunks it embeds (batches of other padded lengths leave the heap in
# pieces, even with each batch's memory handed back): after the embedding of 341, 540 and
# 1,470 chunks (prose, code, code) the process held 203, 292 and 388 MiB above the loaded
# model, ~0.1 MB a chunk from 341 to 1,470, not the ~30 KB once measured from 600 to
# 1,500 chunks of a code repo. A cold 1.2M-token folder (5,199 chunks) peaked at 1,102 MiB
# against 973 planned without it. The pieces are reused past a few thousand chunks: cold
# indexes of 5,000, 9,439 and 12,591 chunks peaked at 846, 941 and 924 MiB (2026-12-05,
# Xeon), where 32 KB a chunk for all of them planned 1.1-1.4 GiB (and refused a 63K-chunk
# input at 3 GiB under --max-memory 1.5GB). Past the cap the fixed part and the growth
# make 338 MiB, as 200 + 32 KB x 4,096 made 328.
EMBED_BYTES_PER_CHUNK = 96 * 2**10
EMBED_GROWTH_CHUNKS = 2240  # the chunks past which the heap grows no more
# A prefill step's peak working set per token of its chunk, in fp32 values per (hidden +
# intermediate) width: the step's activations (the MLP's [chunk, 2 * intermediate] the
# largest), an int8 weight unpacked for the wide GEMM, and what the allocator keeps from
# earlier layers. Measured: ~170 MB for SmolLM2 (576 + 1536) at 2,048-token chunks, ~10x.
WORKSPACE_VALUES_PER_WIDTH = 10


def workspace_bytes(facts: ModelFacts, chunk_tokens: int) -> int:
    """A prefill chunk's activations (0 where the model's widths are not known: a remote server)."""
    return widths_workspace_bytes(facts.hidden_size + facts.intermediate_size, chunk_tokens)


def widths_workspace_bytes(widths: int, chunk_tokens: int) -> int:
    """The same from the model's hidden + intermediate widths (a loaded engine's, `ktcli serve`)."""
    return int(WORKSPACE_VALUES_PER_WIDTH * chunk_tokens * widths * 4)


# A sparse chunk's Quest bounds (`engine.page_groups`): query rows x pages in fp32, the
# two products and their sum, in tiles of at most 64 MB (its TILE_BYTES).
QUEST_TILE_BYTES = 64 * 2**20


def sparse_memory(facts: ModelFacts, window_tokens: int, kv_dtype: str) -> int:
    """Peak memory of a sparse read: the runtime, the weights, paged KV for the whole
    window (written when allocated, so resident from the start) with its staging pool,
    and a 512-token prefill chunk's activations and page bounds."""
    kv = paged_kv_bytes_per_token(facts, kv_dtype) * window_tokens + paged_fixed_bytes(facts, kv_dtype)
    n_pages = -(-window_tokens // PAGE_TOKENS)
    q_heads = facts.hidden_size // max(facts.head_dim, 1)
    bounds = 3 * min(QUEST_TILE_BYTES, 4 * q_heads * PAGED_PREFILL_CHUNK * n_pages)
    return int(facts.host_bytes + facts.weight_bytes + kv + workspace_bytes(facts, PAGED_PREFILL_CHUNK) + bounds)


def paged_dense_scores_bytes(facts: ModelFacts, context_tokens: int) -> int:
    """Dense attention of a 512-token prefill chunk over the kernels' pages holds its fp32
    scores against the whole context: with --rope-scaling yarn:2, SmolLM2 over 10.7K tokens
    peaked at 1,062-1,123 MiB against 950 planned without them (9 heads x 512 x 10.7K x 4
    bytes = 198 MB)."""
    q_heads = facts.hidden_size // max(facts.head_dim, 1)
    return 4 * q_heads * PAGED_PREFILL_CHUNK * context_tokens


# A process's later reads may leave it this much above its first: the engine keeps a
# prefill's freed temporaries for the next one and hands the free heap back only once the
# process has grown past `engine.host_alloc.RELEASE_OVER` (64 MiB) after a read, and a
# later read's own temporaries land beside what is kept. Counted for plans of several
# reads (parts, documents one by one), at twice RELEASE_OVER (a test holds them so): summaries
# in parts peaked 56-103 MB above one read's estimate through the CLI (895 planned, 951 peak
# at 16.8K tokens; 887 and 990 at 17.9K, `benchmarks.plan_memory --cases summary-parts-16k`;
# a probe saw up to 983), and in process at 900 MiB in part 1, 934 in part 2 (2026-12-06).
LATER_READS_GROWTH_BYTES = 128 << 20


def generation_memory(facts: ModelFacts, context_tokens: int, kv_dtype: str = "fp32",
                      prefill_tokens: int | None = None) -> int:
    """Peak memory of one read of `context_tokens` in the model's window: the runtime, the
    weights, the KV it fills (float pages are touched as they are written: the context's;
    quantized pages are written when allocated: the model's whole window and the staging
    pool) and a prefill chunk's activations. `prefill_tokens`: the tokens actually
    prefilled, where the prompt cache holds the rest (their rows are read, not computed:
    a hit was planned with a whole chunk's activations, 1.39x its peak)."""
    prefilled = context_tokens if prefill_tokens is None else max(1, prefill_tokens)
    if kv_dtype in ("fp8", "int8", "int4"):
        kv = paged_kv_bytes_per_token(facts, kv_dtype) * max(context_tokens, facts.context_window)
        kv += paged_fixed_bytes(facts, kv_dtype, sink_pages=0)
        kv += paged_dense_scores_bytes(facts, context_tokens)  # dense prefill chunks over the pages
        chunk = min(prefilled, PAGED_PREFILL_CHUNK)
    else:
        kv = kv_bytes_per_token(facts, kv_dtype) * context_tokens
        chunk = min(prefilled, FULL_PREFILL_CHUNK)
    return int(facts.host_bytes + facts.weight_bytes + kv + workspace_bytes(facts, chunk))


# A sparse read's speed by its policy and kind of pages, against topk over int8 pages (the
# rates `plan.planner.Throughput` holds for the sparse mode): (prefill, decode) ratios of
# tok/s. window scores no pages and reads fewer a step than topk; fp32 pages have no fused
# C++ decode. Measured by `python -m benchmarks.sparse_speed --configs ... --lengths 8192`
# (Xeon, 2 cores, 2026-12-05, SmolLM2 int8 weights; topk-int8 873 tok/s prefill, 49.0
# decode; BENCHMARKS.md); a kind not measured counts as the reference. fp8, bf16 and fp16
# pages (asked for by --kv-dtype) have no fused C++ decode either: their ratios from
# `--configs ...,topk-fp8,topk-bf16,topk-fp16,window-fp8,window-bf16,window-fp16 --name
# sparse_speed_float_pages` (EPYC Zen 3, 2 cores, beside other jobs, 2026-12-06; topk-int8
# 309 / 34.7 tok/s): fp8 decode was planned at int8's speed and ran at a quarter of it.
SPARSE_REFERENCE = ("topk", "int8")
SPARSE_SPEED: dict[tuple[str, str], tuple[float, float]] = {
    ("topk", "int8"): (1.0, 1.0),
    ("topk", "int4"): (0.93, 0.97),
    ("topk", "fp32"): (0.91, 0.38),
    ("topk", "fp8"): (0.49, 0.22),
    ("topk", "bf16"): (0.82, 0.33),
    ("topk", "fp16"): (0.60, 0.36),
    ("window", "int8"): (1.66, 1.31),
    ("window", "int4"): (1.49, 1.27),
    ("window", "fp32"): (1.57, 0.65),
    ("window", "fp8"): (1.02, 0.50),
    ("window", "bf16"): (0.79, 0.67),
    ("window", "fp16"): (0.47, 0.68),
}


def sparse_speed(attention: str, kv_dtype: str) -> tuple[float, float]:
    """(prefill, decode) speed of a sparse read of this policy (`topk`, `window:6`, ...) and
    page dtype relative to the reference kind's."""
    return SPARSE_SPEED.get((attention.partition(":")[0], kv_dtype), (1.0, 1.0))


@dataclass(frozen=True)
class ContextCost:
    """What a token of context adds to a step, relative to the step's own work, where
    every token attends to all before it (dense attention; 0 for the sparse policies,
    which read a bounded set of pages).

    Prefill: attention's products for a token at position p are ~4·p·heads·head_dim
    FLOPs per layer against the weights' ~2·(non-embedding parameters), so a
    whole prompt of n tokens takes n·(1 + prefill·n) token-times, prefill = layers·heads·
    head_dim / parameters. For SmolLM2 that is 1.6e-4: prefill on the 2-core Xeon ran
    3,047 / 2,013 / 1,454 tok/s at 512 / 4,096 / 7,680 tokens (int8 weights, bf16 steps,
    2026-12-05), 1,983 and 1,471 predicted from the first; the EPYC's 497 / 327 at 512 /
    4,096 (BENCHMARKS.md), 1.53x predicted for 1.52x. A 185M Qwen2 at 27K tokens ran at a
    sixth of its 1.2K rate: planned flat, auto chose a 68 s full read over a 25 s sparse
    one.

    Decode: a step reads the weights and the whole cache, decode = cache bytes per token /
    weight bytes, times DECODE_CACHE_READ_COST (the cache's pages are read slower than the
    weights' stream, and attention's work per byte is more: on the Xeon 95 / 59.8 / 39.5
    tok/s at 512 / 4,096 / 7,680 tokens of fp16 pages beside int8 weights in the engine, a
    factor of 1.3-1.6, through the CLI 104 and 42 tok/s at 1,027 and 6,877 tokens, 2.2;
    the EPYC's 97 / 51 at 512 / 4,096, near 2)."""

    prefill: float = 0.0
    decode: float = 0.0


DECODE_CACHE_READ_COST = 2.0
NO_CONTEXT_COST = ContextCost()


def context_cost(facts: ModelFacts, kv_dtype: str) -> ContextCost:
    """The dense attention's ContextCost of `facts` (weights as run, pages of `kv_dtype`);
    none where the model's shape is not known."""
    heads = facts.n_heads or (facts.hidden_size // facts.head_dim if facts.head_dim else 0)
    linear = facts.n_params - facts.vocab_size * facts.hidden_size
    if not heads or linear <= 0 or not facts.weight_bytes:
        return NO_CONTEXT_COST
    return ContextCost(prefill=facts.n_layers * heads * facts.head_dim / linear,
                       decode=DECODE_CACHE_READ_COST * kv_bytes_per_token(facts, kv_dtype) / facts.weight_bytes)


# A read in the window with dense attention over pages other than the model's own
# (--kv-dtype without a sparse policy): its prefill and decode speed against the model's
# fp16 pages at 2,048 and 6,144 tokens of context, on the 2-core EPYC (Zen 3, AVX2):
# `python -m benchmarks.sparse_speed --configs full-fp16,full-fp8,full-int8,full-int4,
# full-bf16,full-fp32 --lengths 2048,6144 --rounds 2 --name dense_kv_speed`, 2026-12-06.
# The bytes-read model (`context_cost`) made int8 and int4 pages cheaper to decode over
# than fp16; on the CPU they are dearer, dequantised as they are read, and fp8 10-16x (the
# torch reference reads them): three fp8 runs of a probe decoded 2-3 tok/s where their plan
# said ~28. Such a read is timed as one over the model's pages at these speeds.
DENSE_PAGE_SPEED: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    # kv dtype -> ((prefill at 2K, at 6K), (decode at 2K, at 6K))
    "fp8": ((0.86, 0.80), (0.10, 0.06)),
    "int8": ((0.88, 0.86), (0.69, 0.60)),
    "int4": ((0.88, 0.80), (0.57, 0.41)),
    "bf16": ((0.96, 0.97), (0.97, 0.74)),
    "fp32": ((1.03, 0.98), (0.94, 0.79)),
}
_DENSE_SPEED_AT = (2048, 6144)


def dense_page_speed(kv_dtype: str, context: int) -> tuple[float, float]:
    """(prefill, decode) speed of a dense read over `kv_dtype` pages against the model's
    own, at `context` tokens (between the two measured lengths, and held beyond them)."""
    measured = DENSE_PAGE_SPEED.get(kv_dtype)
    if measured is None:
        return 1.0, 1.0
    lo, hi = _DENSE_SPEED_AT
    at = min(max((context - lo) / (hi - lo), 0.0), 1.0)
    return tuple(a + (b - a) * at for a, b in measured)  # type: ignore[return-value]


# A request's kv_dtype where no --kv-dtype was asked for: the model's own pages.
MODEL_PAGES = ("auto", "", "model")


def read_cost(facts: ModelFacts, attention: str, kv_dtype: str) -> ContextCost:
    """The ContextCost of a read in the model's window with policy `attention` over pages
    of `kv_dtype` ("auto", "model" or "": the model's own, `facts.kv_dtype`): none for a
    window or topk policy, which reads a bounded set of pages. The planner times reads by
    it and `pipeline.api` keeps a run's rates without it."""
    if attention.partition(":")[0] in ("window", "topk"):
        return NO_CONTEXT_COST
    return context_cost(facts, kv_dtype if kv_dtype not in MODEL_PAGES else facts.kv_dtype)


# What a process's first prefill costs beyond its tokens, in token-times of a step without
# context: through the CLI (a fresh process each run) the 2-core Xeon's prefill took
# 0.046 s + n(1 + 1.63e-4 n) / 3,406 tok/s within 0.3% at 2.3K-7.6K tokens and 4% at 649
# (`benchmarks.plan_time`, 2026-12-05), where the engine warm took no such 46 ms
# (3,047 / 2,013 / 1,454 tok/s at 512 / 4,096 / 7,680 tokens fit n(1 + 1.63e-4 n) alone):
# the first steps' one-time setup, ~157 tokens' worth. Counted in the rates, a short read
# spread it over its few tokens, and longer reads were planned ~25% long.
FIRST_PREFILL_TOKENS = 150


def prefill_seconds(tokens: int, rate: float, cost: ContextCost = NO_CONTEXT_COST, cached: int = 0,
                    first: bool = True) -> float:
    """Computing a prompt's tokens past the `cached` ones at `rate` tokens/s of a step
    without context: a token at position p costs 1 + 2·cost.prefill·p, and the run's
    `first` prefill FIRST_PREFILL_TOKENS more."""
    cached = min(cached, tokens)
    if tokens <= cached:
        return 0.0  # nothing computed
    work = (tokens - cached) + first * FIRST_PREFILL_TOKENS + cost.prefill * (tokens * tokens - cached * cached)
    return work / max(rate, 1e-9)


def decode_seconds(context: int, new_tokens: int, rate: float, cost: ContextCost = NO_CONTEXT_COST) -> float:
    """`new_tokens` decoded after `context` tokens, at `rate` tokens/s without context."""
    return (new_tokens + cost.decode * (new_tokens * context + new_tokens * new_tokens / 2)) / max(rate, 1e-9)


def generation_seconds(prompt_tokens: int, new_tokens: int, prefill_tok_s: float, decode_tok_s: float,
                       cost: ContextCost = NO_CONTEXT_COST, cached: int = 0, first: bool = True) -> float:
    return (prefill_seconds(prompt_tokens, prefill_tok_s, cost, cached, first)
            + decode_seconds(prompt_tokens, new_tokens, decode_tok_s, cost))


def rates_without_context(prefill_tok_s: float, prompt_tokens: int, prompt_square: float, decode_tok_s: float,
                          new_tokens: int, decode_context: float, cost: ContextCost) -> tuple[float, float]:
    """A run's measured rates as rates of steps without context (what `Throughput`
    keeps): `prompt_square` = the sum over its calls of prompt tokens squared,
    `decode_context` = the sum over its calls of new tokens x their mean context; its
    first prefill's FIRST_PREFILL_TOKENS counted as work, not slowness."""
    work = prompt_tokens + FIRST_PREFILL_TOKENS + cost.prefill * prompt_square
    prefill = prefill_tok_s * work / prompt_tokens if prompt_tokens else 0.0
    decode = decode_tok_s * (new_tokens + cost.decode * decode_context) / new_tokens if new_tokens else 0.0
    return prefill, decode


# A GGUF's first run converts it (`engine.model_store`), once. ktcli's own converter
# (`engine.gguf_convert`) took 1.9-2.0 s for SmolLM2-135M in a fresh process on the 2-core
# EPYC (~0.5 s of it imports), holding one tensor at a time: its raw bytes and its float32
# values (a Llama file's q and k reordered in a copy). Since it writes no float32 copy
# (`engine.gguf_weights`), the conversion is its config and tokenizer (0.6-1.1 s) and the
# first load dequantizes the GGUF instead (+1.4-2.4 s): together about the same (4.7 vs 5.2 s
# with the first int8 pack, beside other jobs, `benchmarks.gguf_weights`), so the figures stand. A whole first ask peaked at 606-620 MiB
# (a probe's /usr/bin/time), the runtime and ~6 bytes per parameter of the embedding.
OWN_CONVERT_FIXED_S = 0.5
OWN_CONVERT_S_PER_PARAM = 0.011e-6
OWN_CONVERT_BYTES_PER_LARGEST_PARAM = 6
# transformers' loader, for the GGUFs ours does not take, dequantizes the file whole and
# writes safetensors: SmolLM2-135M took ~22 s on the idle 2-core EPYC (a whole first ask
# 26.9 s; 40-43 s beside other jobs) and peaked at 1,250 MiB, against a warm load's ~1.5 s
# and a full read's ~590 MiB; 27.8-31.9 s in a fresh process on 2026-12-06
# (`benchmarks.gguf_convert`), of which ~15 s its metadata reader's walks over the 49K-token
# vocabulary and the tokenizer's build: fixed costs, whatever the parameters.
CONVERT_FIXED_S = 15.0
CONVERT_S_PER_PARAM = 0.12e-6
CONVERT_BYTES_PER_PARAM = 7


# --engine hf on a GGUF writes the float32 model.safetensors transformers reads, once
# (`engine.gguf_weights.write_safetensors`): 538 MB for SmolLM2-135M in 1.07 s beside a
# test run on the 2-core EPYC (2026-12-06), one tensor at a time.
FLOAT32_WRITE_S_PER_PARAM = 8e-9
FLOAT32_BYTES_PER_PARAM = 4


def conversion_seconds(n_params: int, largest: int = 0) -> float:
    """`largest`: the largest tensor's parameters where ktcli's own converter takes the
    file (0: transformers' loader converts it)."""
    if largest:
        return OWN_CONVERT_FIXED_S + OWN_CONVERT_S_PER_PARAM * n_params
    return CONVERT_FIXED_S + CONVERT_S_PER_PARAM * n_params


def conversion_bytes(n_params: int, largest: int = 0) -> int:
    if largest:
        return CPU_RUNTIME_BYTES + OWN_CONVERT_BYTES_PER_LARGEST_PARAM * largest
    return CPU_RUNTIME_BYTES + CONVERT_BYTES_PER_PARAM * n_params
