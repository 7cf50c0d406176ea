"""Memory and time estimates the planner weighs. Pure arithmetic, no model needed."""

from __future__ import annotations

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
    from kernels.layout import KVCacheSpec, bytes_per_token

    return facts.n_layers * bytes_per_token(KVCacheSpec(facts.n_kv_heads, facts.head_dim, kv_dtype=kv_dtype))


def paged_fixed_bytes(facts: ModelFacts, kv_dtype: str, n_stage: int = 32, sink_pages: int = 1) -> int:
    """Per layer, for quantized kinds: the staging pool (full-precision partial pages) and
    the sparse policies' exact sink pages (`engine.exact_sinks`: as many fp32 slots of
    `sink_pages` pages as staging slots), every layer."""
    from kernels.layout import KVCacheSpec, exact_page_bytes, staging_bytes

    spec = KVCacheSpec(facts.n_kv_heads, facts.head_dim, kv_dtype=kv_dtype, stage_dtype="fp32")
    return facts.n_layers * (staging_bytes(spec, n_stage) + exact_page_bytes(spec, n_stage, sink_pages))


def sparse_memory(facts: ModelFacts, context_tokens: int, kv_dtype: str) -> int:
    """Weights + paged KV for the whole context + staging + activations (rough 10%)."""
    kv = paged_kv_bytes_per_token(facts, kv_dtype) * context_tokens + paged_fixed_bytes(facts, kv_dtype)
    return int((facts.weight_bytes + kv) * 1.1)


def generation_memory(facts: ModelFacts, context_tokens: int, kv_dtype: str = "fp32") -> int:
    """Weights + KV for the context + activations of one prefill chunk (rough 10%)."""
    kv = kv_bytes_per_token(facts, kv_dtype) * context_tokens
    return int((facts.weight_bytes + kv) * 1.1)


def generation_seconds(prompt_tokens: int, new_tokens: int, prefill_tok_s: float, decode_tok_s: float) -> float:
    return prompt_tokens / max(prefill_tok_s, 1e-9) + new_tokens / max(decode_tok_s, 1e-9)


def parse_bytes(text: str) -> int:
    """'4GB', '512MiB', '1e9' -> bytes. Raises ValueError on nonsense."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number):]
    if unit not in units or not number:
        raise ValueError(text)
    value = float(number) * units[unit]
    if value <= 0:
        raise ValueError(text)
    return int(value)
