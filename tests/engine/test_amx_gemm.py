"""engine.amx_gemm: wide bf16/int8-weight GEMMs on AMX tiles with fp32 activations split
into two bf16 parts and fp32 output. The reference path (any CPU) is as exact as an fp32
GEMM over the same weights; the kernel (CPUs with AMX) equals the reference up to
summation order, over shapes that need every kind of padding, with bias and residual add;
a model's prefill through it stays with the fp32 prefill where a one-pass bf16 GEMM does
not; and only steps of up to EXACT_MAX_ROWS rows take it."""

from __future__ import annotations

import pytest
import torch

from ktcli.engine import amx_gemm, int8_gemv

needs_amx = pytest.mark.skipif(not amx_gemm.available(), reason="no AMX (or C++ kernels) here")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_reference_split_is_fp32_grade_and_one_pass_is_not():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 576, generator=g), torch.randn(96, 576, generator=g).to(torch.bfloat16)
    exact = x.double() @ w.double().T
    assert _rel(amx_gemm.linear_reference(x, w), exact) < 2e-5  # hi + lo hold x to ~2^-17
    assert _rel(amx_gemm.linear_reference(x, w, split=False), exact) > 2e-4  # x rounded to bf16: ~2^-9 each


def test_reference_reads_packed_int8_as_its_bf16_weights():
    g = torch.Generator().manual_seed(1)
    x, packed = torch.randn(8, 64, generator=g), int8_gemv.pack(torch.randn(40, 64, generator=g))
    want = amx_gemm.linear_reference(x, int8_gemv.unpack_reference(packed).to(torch.bfloat16))
    assert torch.equal(amx_gemm.linear_reference(x, packed), want)


SHAPES = [(1, 32, 16), (33, 576, 960), (300, 1536, 576), (17, 64, 3)]
# K = 100 pads K too; int8 weights come in 32-weight blocks, so only bf16 has such a K.
CASES = [(*shape, w) for shape in SHAPES for w in ("bf16", "int8")] + [(100, 100, 70, "bf16")]


@needs_amx
@pytest.mark.parametrize("m,k,n,weights", CASES)
@pytest.mark.parametrize("split", [True, False])
def test_kernel_equals_reference(m, k, n, weights, split):
    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k, generator=g) * 3
    wf = torch.randn(n, k, generator=g)
    w = int8_gemv.pack(wf) if weights == "int8" else wf.to(torch.bfloat16)
    bias, add = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    for b, a in ((None, None), (bias, None), (None, add), (bias, add)):
        got = amx_gemm.linear(x, w, b, a, split)
        want = amx_gemm.linear_reference(x, w, b, a, split)
        assert got.dtype == torch.float32 and got.shape == (m, n)
        assert _rel(got, want) < 1e-5  # the same products, summed in another order


@needs_amx
def test_kernel_reads_strided_and_half_precision_activations():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(576, 40, generator=g).t()  # [40, 576], not contiguous
    w = torch.randn(64, 576, generator=g).to(torch.bfloat16)
    assert _rel(amx_gemm.linear(x, w), amx_gemm.linear_reference(x.contiguous(), w)) < 1e-5
    xb = x.to(torch.bfloat16)
    assert _rel(amx_gemm.linear(xb, w), xb.double() @ w.double().T) < 1e-5  # bf16 x: lo is 0, exact


@needs_amx
def test_smollm2_prefill_through_the_kernel_stays_with_fp32(smollm2_dir, monkeypatch):
    """bf16 weights (exact in the tiles; int8 weights round to bf16 there, not in an fp32
    prefill), a multi-chunk prompt: AMX GEMMs against the fp32 prefill, and the one-pass
    bf16 GEMMs they replace against it too. Attention runs in fp32 in both, to see the
    GEMMs alone (in bf16 it moves the logits by ~1% RMS, far more than they do)."""
    from ktcli.engine.native import NativeBackend

    text = " ".join(f"Item {i} of the harbour inventory lists {i * 7 % 13} crates of rope." for i in range(60))
    kw = dict(weights="bf16", kv_budget_bytes=64 << 20, prefill_chunk=amx_gemm.EXACT_MAX_ROWS)
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "fp32")
    fp32 = NativeBackend.load(smollm2_dir, **kw)
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "auto")
    fast = NativeBackend.load(smollm2_dir, **kw)
    model = fast.engine.model
    assert model.prefill_dtype == "bf16" and model._amx
    model.prefill_attn_dtype = None
    ids = fp32.chat_ids([{"role": "user", "content": text + "\nHow many crates does item 12 list?"}])
    want = fp32.prompt_logits(ids)

    def rel_rms(x):
        return ((x - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()

    split = rel_rms(fast.prompt_logits(ids))
    model._amx = False  # torch's bf16 GEMMs: activations and outputs rounded to bf16
    one_pass = rel_rms(fast.prompt_logits(ids))
    # measured 0.04% against 1.0% RMS
    assert split < 2e-3 and split < 0.1 * one_pass, (split, one_pass)


@needs_amx
def test_only_short_wide_steps_take_the_kernel(tiny_models, monkeypatch):
    from ktcli.engine.native import NativeBackend

    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "auto")
    model = NativeBackend.load(tiny_models["llama"], weights="int8", kv_budget_bytes=8 << 20).engine.model
    calls = []
    real = amx_gemm.linear
    monkeypatch.setattr(amx_gemm, "linear", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    x = torch.randn(amx_gemm.EXACT_MAX_ROWS, model.cfg.hidden_size)
    w = model.w.layers[0].qkv
    model._linear(x, w, None, x.shape[0])
    model._linear(torch.cat([x, x]), w, None, 2 * x.shape[0])  # one-pass bf16 GEMM
    model._linear_add(x, x, model.w.layers[0].o, None, x.shape[0])
    assert calls == [amx_gemm.EXACT_MAX_ROWS, amx_gemm.EXACT_MAX_ROWS]


@needs_amx
def test_a_short_prompts_logits_do_not_depend_on_the_prompts_beside_it(tiny_models, monkeypatch):
    """A step past EXACT_MAX_ROWS rows took torch's one-pass bf16 GEMM for every row: a short
    prompt alone had fp32-grade products, beside a long one bf16-rounded ones, and a served
    request's greedy answer changed with what others sent. Each sequence's rows now take the
    kernel they take alone."""
    from ktcli.engine.native import NativeBackend
    from ktcli.engine.sequence import Sequence

    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "auto")
    engine = NativeBackend.load(tiny_models["llama"], weights="bf16", kv_budget_bytes=16 << 20).engine
    assert engine.model._amx

    def last_logits(prompts: list[list[int]]) -> torch.Tensor:
        """One prefill step of all the prompts together: each one's last-row logits."""
        seqs = [Sequence(100 + i, list(p), len(p), 1) for i, p in enumerate(prompts)]
        for s in seqs:
            engine.blocks.grow(s.block_table, len(s.token_ids))
        try:
            step, ids = engine._build_step([(s, len(s.token_ids)) for s in seqs])
            return engine.model.forward(ids, step)
        finally:
            for s in seqs:
                engine.blocks.free(s.block_table)

    short = [5 + i % 50 for i in range(35)]
    alone = last_logits([short])[0]
    calls = []
    real = amx_gemm.linear
    monkeypatch.setattr(amx_gemm, "linear", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    for beside, rows in (([7 + i % 40 for i in range(120)], 155), ([9 + i % 30 for i in range(300)], 35)):
        calls.clear()
        logits = last_logits([short, beside])[0]
        assert (logits - alone).abs().max().item() < 1e-3 * alone.abs().max().item(), beside
        assert rows in calls  # both prompts short: the whole step on the kernel; else the short one's rows
