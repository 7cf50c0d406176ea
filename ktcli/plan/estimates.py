"""Memory and time estimates the planner weighs. Pure arithmetic, no model needed."""

from __future__ import annotations

from ktcli.types import ModelFacts

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def kv_bytes_per_token(facts: ModelFacts, kv_dtype: str = "fp32") -> float:
    """K and V for every layer; quantized dtypes also pay for their scales (roughly one
    fp32 scale+zero per 32 values)."""
    values = 2 * facts.n_layers * facts.n_kv_heads * facts.head_dim
    per_value = DTYPE_BYTES[kv_dtype]
    if kv_dtype in ("int8", "int4"):
        per_value += 8 / 32
    return values * per_value


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
