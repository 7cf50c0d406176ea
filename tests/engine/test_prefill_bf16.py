"""Wide steps in bf16 (`engine.device.resolve_prefill_dtype`: the default on CPUs with AMX
under bf16 or int8 weights). Forced here on any CPU, so the path is tested on machines
without AMX too (slowly there): prefill logits stay close to the fp32 prefill's over
several chunks, the first chunk included, and decode after a bf16 prefill picks the same
greedy tokens on the bundled model."""

from __future__ import annotations

import pytest
import torch

from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend


def _load(folder, prefill: str, monkeypatch, **kw) -> NativeBackend:
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", prefill)
    b = NativeBackend.load(folder, **kw)
    assert b.engine.model.prefill_dtype == prefill
    return b


def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: qkv bias on a bf16 product
@pytest.mark.parametrize("weights", ["int8", "bf16"])
def test_tiny_models_prefill_in_bf16_close_to_fp32(tiny_models, monkeypatch, kind, weights):
    folder = tiny_models[kind]
    ids = list(range(3, 200))  # 197 tokens in 64-token chunks: the causal first chunk, then prefixes
    kw = dict(weights=weights, prefill_chunk=64, kv_budget_bytes=8 << 20)
    a = _load(folder, "fp32", monkeypatch, **kw).prompt_logits(ids)
    b = _load(folder, "bf16", monkeypatch, **kw).prompt_logits(ids)
    # bf16 rounds each GEMM's inputs and outputs and attention's q, k, v (2^-9 relative);
    # these random models' sharp attention amplifies that: measured 2.0-2.3% RMS here (a
    # wrong or unrounded weight gives tens of percent). SmolLM2: 1.1-1.3%.
    assert _rel_rms(a, b) < 0.04
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9  # measured 0.95-1.0: near-ties of a random model


def test_fp32_weights_never_prefill_in_bf16(tiny_models, monkeypatch):
    b = _load(tiny_models["llama"], "fp32", monkeypatch, weights="fp32")
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "bf16")
    assert NativeBackend.load(tiny_models["llama"], weights="fp32").engine.model.prefill_dtype == "fp32"
    assert b.engine.model.prefill_attn_dtype is None


def test_smollm2_int8_bf16_prefill_keeps_greedy_tokens(smollm2_dir, monkeypatch):
    """The bundled model's answer after a bf16 prefill of a multi-chunk prompt."""
    text = " ".join(f"Item {i} of the harbour inventory lists {i * 7 % 13} crates of rope." for i in range(40))
    kw = dict(weights="int8", kv_budget_bytes=64 << 20, prefill_chunk=256)
    fp32 = _load(smollm2_dir, "fp32", monkeypatch, **kw)
    ids = fp32.chat_ids([{"role": "user", "content": text + "\nHow many crates does item 12 list?"}])
    assert len(ids) > 512  # three chunks or more
    bf16 = _load(smollm2_dir, "bf16", monkeypatch, **kw)
    a, b = fp32.prompt_logits(ids), bf16.prompt_logits(ids)
    assert _rel_rms(a, b) < 0.02
    params = SamplingParams(max_new_tokens=24)
    want, got = fp32.generate_ids([ids], params)[0], bf16.generate_ids([ids], params)[0]
    assert sum(x == y for x, y in zip(want, got)) >= 0.9 * len(want)


def test_quantized_pages_prefill_in_bf16_close_to_fp32(tiny_models, monkeypatch):
    """int8 KV pages (engine.longctx): dense prefill attention over the dequantised context
    takes the model's bf16 too."""
    kw = dict(weights="int8", kv_dtype="int8", prefill_chunk=64, kv_budget_bytes=8 << 20)
    ids = list(range(3, 200))
    a = _load(tiny_models["llama"], "fp32", monkeypatch, **kw)
    b = _load(tiny_models["llama"], "bf16", monkeypatch, **kw)
    assert a.kv.prefill_attn_dtype is None and b.kv.prefill_attn_dtype == torch.bfloat16
    la, lb = a.prompt_logits(ids), b.prompt_logits(ids)
    assert _rel_rms(la, lb) < 0.04


@pytest.mark.parametrize("prefill", ["bf16", "fp32"])
def test_swiglu_step_in_one_pass_equals_the_torch_path(tiny_models, monkeypatch, prefill):
    """engine.cpu_mlp's silu(gate) * up (bf16 in and out under bf16 wide steps) against the
    torch path it replaces (the product widened, fp32 silu and product, rounded for the down
    GEMM): the same rounding, so the logits agree to far below the bf16 step."""
    from ktcli.engine import cpu_mlp

    if not cpu_mlp.available():
        pytest.skip("C++ kernels not built here")
    kw = dict(weights="int8", prefill_chunk=64, kv_budget_bytes=8 << 20)
    ids = list(range(3, 200))
    b = _load(tiny_models["llama"], prefill, monkeypatch, **kw)
    fast = b.prompt_logits(ids)
    monkeypatch.setattr(b.engine.model, "_silu_mul", cpu_mlp.silu_mul_reference)
    torch_path = b.prompt_logits(ids)
    assert _rel_rms(torch_path, fast) < (2e-3 if prefill == "bf16" else 1e-5)  # fp32: summation order only
