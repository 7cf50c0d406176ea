"""What ktcli reads from a GGUF file's header itself, because transformers' GGUF reader
does not: the architecture, checked before a conversion that would fail after tens of
seconds with an internal error; and the RoPE scaling, which the reader drops (a converted
Llama 3.1 or Qwen2.5-YaRN ran with plain RoPE, silently wrong past the trained window).

llama.cpp's converter stores RoPE scaling two ways: `<arch>.rope.scaling.*` keys (linear,
yarn) and, for Llama 3's "llama3" scaling, a `rope_freqs.weight` tensor of per-dimension
divisors of the inverse frequencies, with the parameters that made it not written at all.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ktcli.errors import UsageError

# Architectures a GGUF may declare: those ktcli converts (`gguf_convert`, else transformers'
# reader) and the engine implements. llama.cpp writes Mistral models as "llama" and has no
# "mistral" architecture: a file naming one failed inside transformers' reader.
CONVERTIBLE = ("llama", "qwen2", "qwen3")

# Llama 3.1's published parameters; preferred whenever they give the same divisors.
LLAMA3_STANDARD = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}

# The divisors are float32 from float64 arithmetic: a matching set agrees to ~1e-7.
_MATCH_RTOL = 1e-4


def _value(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def architecture(reader) -> str:
    return str(_value(reader, "general.architecture", ""))


def check_convertible(reader, path: Path) -> None:
    """One line for a GGUF ktcli cannot convert, before the conversion is tried: another
    architecture, or one part of a split file (`model-00001-of-00003.gguf`), whose first
    part converted into a model without most of its layers and was cached so."""
    parts = _value(reader, "split.count", 1)
    if isinstance(parts, int) and parts > 1:
        number = _value(reader, "split.no", 0)
        raise UsageError(f"--model {path.name}: part {int(number) + 1 if isinstance(number, int) else '?'} of a GGUF "
                         f"split into {parts} files; merge them into one first (llama.cpp's "
                         "`llama-gguf-split --merge FIRST-PART merged.gguf`)")
    arch = architecture(reader)
    if arch not in CONVERTIBLE:
        raise UsageError(f"--model {path.name}: GGUF architecture {arch or '(none)'!r} is not supported "
                         f"(ktcli converts {', '.join(CONVERTIBLE)} GGUFs; for others give a Hugging Face "
                         "folder with --engine hf)")


def rope_scaling(reader, path: Path) -> dict | None:
    """The HF rope parameters (rope_type, factor, ...) the GGUF's scaling stands for, or
    None for plain RoPE; one line for a scaling ktcli cannot express."""
    arch = architecture(reader)
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    kind = str(_value(reader, f"{arch}.rope.scaling.type", "none"))
    factor = _value(reader, f"{arch}.rope.scaling.factor")
    original = _value(reader, f"{arch}.rope.scaling.original_context_length")
    if kind == "none" and _value(reader, f"{arch}.rope.scale_linear") is not None:  # the key before .scaling.*
        kind, factor = "linear", _value(reader, f"{arch}.rope.scale_linear")
    if freqs is not None:
        if kind != "none":
            raise UsageError(f"--model {path.name}: both rope_freqs and {kind} RoPE scaling, which ktcli "
                             "cannot express; refusing to run it with the wrong positions")
        import gguf

        divisors = gguf.dequantize(freqs.data, freqs.tensor_type).reshape(-1)
        theta = float(_value(reader, f"{arch}.rope.freq_base", 10000.0))
        found = llama3_from_divisors(divisors, theta, int(original) if original else None)
        if found is None:
            raise UsageError(f"--model {path.name}: its rope_freqs tensor is not Llama 3 RoPE scaling ktcli "
                             "can reproduce; refusing to run it with the wrong positions")
        return found or None  # all ones: no scaling
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        params = {"rope_type": "yarn", "factor": float(factor)}
        if original:
            params["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            value = _value(reader, f"{arch}.rope.scaling.{gguf_key}")
            if value is not None:
                params[hf_key] = float(value)
        return params
    raise UsageError(f"--model {path.name}: RoPE scaling {kind!r} is not supported (linear, yarn, llama3)")


def llama3_divisors(theta: float, n: int, params: dict) -> np.ndarray:
    """[n] divisors of the inverse frequencies of a 2n-dim head under llama3 scaling,
    computed as llama.cpp's converter does."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    orig = float(params["original_max_position_embeddings"])
    inv_wavelen = theta ** (-np.arange(n, dtype=np.float64) / n) / (2 * math.pi)
    smooth = (orig * inv_wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    return np.where(inv_wavelen > high / orig, 1.0, np.where(inv_wavelen < low / orig, factor, blended))


def _reproduces(divisors: np.ndarray, theta: float, params: dict) -> bool:
    return bool(np.allclose(llama3_divisors(theta, len(divisors), params), divisors, rtol=_MATCH_RTOL, atol=0))


def llama3_from_divisors(divisors, theta: float, original: int | None = None) -> dict | None:
    """llama3 rope parameters that give exactly `divisors`; {} when they are all 1 (no
    scaling); None when no llama3 parameters give them.

    Between its two cut-offs the formula is linear in 1/wavelength, and depends on the
    window and the two factors only through low/orig and high/orig: one point of that band
    fixes them given high/low = 4 (Llama 3's), two fix both. The window itself is then
    `original` (the GGUF's own figure) or 1/(low/orig) with low = 1, as every llama3
    config has it; the standard Llama 3.1 values win when they give the same divisors."""
    d = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if np.allclose(d, 1.0, rtol=_MATCH_RTOL, atol=0):
        return {}
    inv_wavelen = theta ** (-np.arange(len(d), dtype=np.float64) / len(d)) / (2 * math.pi)
    for factor in dict.fromkeys((float(np.round(d.max(), 4)), LLAMA3_STANDARD["factor"])):
        if factor <= 1:
            continue
        for candidate in _llama3_candidates(d, inv_wavelen, factor, original):
            params = {"rope_type": "llama3", **candidate}
            if _reproduces(d, theta, params):
                return params
    return None


def _llama3_candidates(d: np.ndarray, inv_wavelen: np.ndarray, factor: float, original: int | None):
    yield {**LLAMA3_STANDARD, "factor": factor}
    ones = np.isclose(d, 1.0, rtol=_MATCH_RTOL, atol=0)
    scaled = np.isclose(d, factor, rtol=_MATCH_RTOL, atol=0)
    band = ~(ones | scaled)
    x = inv_wavelen[band]
    s = (1 / d[band] - 1 / factor) / (1 - 1 / factor)  # 0 at the low cut-off, 1 at the high
    if len(x) >= 2:
        slope, intercept = np.polyfit(x, s, 1)  # s = (x - u) / (v - u)
        u = -intercept / slope
        v = u + 1 / slope
    elif len(x) == 1:
        u = x[0] / (3 * s[0] + 1)  # v = 4u
        v = 4 * u
    elif scaled.any() and ones.any():  # no point inside the band: any cut-offs in the gap
        u = math.sqrt(inv_wavelen[scaled].max() * inv_wavelen[ones].min() / 4)
        v = 4 * u
    else:
        return
    if not (0 < u < v):
        return
    orig = original or round(1 / u)
    low, high = u * orig, v * orig
    for digits in (4, None):  # round figures first, when they give the same divisors
        yield {"factor": factor, "low_freq_factor": float(round(low, digits) if digits else low),
               "high_freq_factor": float(round(high, digits) if digits else high),
               "original_max_position_embeddings": int(orig)}
