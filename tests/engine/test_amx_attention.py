"""engine.amx_attention: causal prefill attention on AMX tiles with every fp32 operand split
into two bf16 parts. On CPUs with AMX: the kernel against float64 attention over first and
later chunks, GQA folds of 1-9 query heads per kv head, head sizes 64-256, ragged row
counts, strided key / value views and peaky scores; causality exact; the engine's fp32
prefill takes it and its logits stay with the torch path's. Elsewhere the tests skip and
`supports` says no."""

from __future__ import annotations

import math

import pytest
import torch

from ktcli.engine import amx_attention, prefill_attention

needs_amx = pytest.mark.skipif(not amx_attention.available(), reason="no AMX (or C++ kernels) here")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_reference_is_causal_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 4, 8, generator=g), torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    out = amx_attention.attend_reference(q, k, v, 0.5)
    # query 0 sits at position 2: keys 0-2, heads 0-1 read kv head 0
    s = (q[0, 1].double() @ k[:3, 0].double().T) * 0.5
    want = s.softmax(-1) @ v[:3, 0].double()
    assert torch.allclose(out[0, 1].double(), want, atol=1e-6)


def test_unsupported_shapes_are_declined():
    assert not amx_attention.supports(torch.randn(4, 2, 32))  # head size not a multiple of 64
    assert not amx_attention.supports(torch.randn(4, 2, 320))


CASES = [  # n, earlier keys p, HQ, H, D
    (1, 0, 9, 3, 64), (5, 0, 9, 3, 64), (37, 0, 9, 3, 64), (100, 29, 9, 3, 64), (64, 0, 2, 2, 64),
    (130, 200, 4, 2, 128), (70, 3, 8, 1, 256), (300, 1000, 9, 3, 64), (129, 60, 1, 1, 192),
]


@needs_amx
@pytest.mark.parametrize("n,p,n_q,n_kv,d", CASES)
def test_kernel_is_fp32_grade(n, p, n_q, n_kv, d):
    g = torch.Generator().manual_seed(n + p + d)
    q = torch.randn(n, n_q, d, generator=g)
    k = torch.randn(p + n, n_kv, d, generator=g) * 2  # peaky rows: the running max matters
    v = torch.randn(p + n, n_kv, d, generator=g)
    scale = 1 / math.sqrt(d)
    exact = amx_attention.attend_reference(q, k, v, scale)
    got = amx_attention.attend(q, k, v, scale)
    assert got.shape == (n, n_q, d) and got.dtype == torch.float32
    # hi + lo hold each operand to ~2^-17: ~1e-5 (torch's fp32 flash kernel: ~1e-6; one bf16 pass: ~3e-3)
    assert _rel(got, exact) < 3e-5
    one_pass = amx_attention.attend_reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale)
    assert _rel(one_pass, exact) > 10 * _rel(got, exact)
    # six passes for the scores: closer still (the p.v side keeps three)
    six = amx_attention._module().amx_prefill_attention(q, k, v, scale, True)
    three = amx_attention._module().amx_prefill_attention(q, k, v, scale, False)
    if p + n > 1:  # (one key: its weight is 1 whatever the score)
        assert _rel(six, exact) < 0.8 * _rel(three, exact)


@needs_amx
def test_strided_views_and_future_keys():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(50, 9, 64, generator=g)
    kv = torch.randn(80, 2, 3, 64, generator=g)  # pages as [slots, k|v, H, D]: strided rows
    got = amx_attention.attend(q, kv[:, 0], kv[:, 1], 0.125)
    assert _rel(got, amx_attention.attend_reference(q, kv[:, 0], kv[:, 1], 0.125)) < 3e-5
    # the chunk's own keys past a query's position never reach it: changing them leaves
    # every earlier row bit for bit the same
    kv2 = kv.clone()
    kv2[60:] = torch.randn(20, 2, 3, 64, generator=g)
    again = amx_attention.attend(q, kv2[:, 0], kv2[:, 1], 0.125)
    assert torch.equal(again[:30], got[:30]) and not torch.equal(again[30:], got[30:])


@needs_amx
def test_prefill_attention_takes_it_in_fp32_only():
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(40, 9, 64, generator=g), torch.randn(90, 3, 64, generator=g), torch.randn(90, 3, 64, generator=g)
    assert torch.equal(prefill_attention.attend_prefix(q, k, v, 0.125), amx_attention.attend(q, k, v, 0.125))
    assert amx_attention.score_error(q, k, 0.125) < amx_attention.SIX_PASS_ABOVE  # unit-scale rows: three passes
    bf16 = prefill_attention.attend_prefix(q, k, v, 0.125, torch.bfloat16)  # bf16 prefill keeps torch's flash
    assert bf16.dtype == torch.bfloat16


@needs_amx
def test_smollm2_fp32_prefill_logits_stay_with_the_torch_path(smollm2, monkeypatch):
    """A 700-token prompt in three chunks of 256: the logits through the kernel within ~1e-5 of the
    torch flash path's (both fp32 GEMMs; the issue's bound against transformers is 1e-4)."""
    text = "The quick brown fox jumps over the lazy dog. " * 80
    ids = smollm2.tokenizer.encode(text)[:700]
    calls = []
    real = amx_attention.score_error
    monkeypatch.setattr(amx_attention, "score_error", lambda *a: calls.append(real(*a)) or calls[-1])
    with torch.no_grad():
        got = smollm2.prompt_logits(ids)
    assert calls and max(calls) < amx_attention.SIX_PASS_ABOVE  # through the kernel, three-pass scores
    monkeypatch.setattr(amx_attention, "supports", lambda q: False)
    with torch.no_grad():
        ref = smollm2.prompt_logits(ids)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert 0 < err < 5e-5


@needs_amx
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_head_size_128_models_match_transformers(kind, tmp_path):
    """Llama 3 / Qwen2.5-style heads (D = 128, GQA 4:1 and 2:1): prompts over several 16-token
    chunks and 4-token pages through the kernel, logits within the engine's 1e-4 of
    transformers' and greedy tokens equal. The wide random init makes the scores large:
    these take the six-pass scores (three passes gave 1.2-3.9e-4)."""
    from ktcli.engine.native import NativeBackend
    from tests.engine.conftest import build_tiny
    from tests.engine.test_model_vs_hf import hf_greedy, hf_model, ours_greedy, rel_err

    heads = {"llama": (4, 1), "qwen2": (2, 1)}[kind]
    folder = build_tiny(kind, tmp_path / kind, hidden_size=128 * heads[0], num_attention_heads=heads[0],
                        num_key_value_heads=heads[1], head_dim=128, intermediate_size=256)
    ref = hf_model(folder)
    ours = NativeBackend.load(folder, weights="fp32", block_size=4, prefill_chunk=16, kv_budget_bytes=16 << 20)
    calls = []
    real = amx_attention.score_error
    g = torch.Generator().manual_seed(11)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(amx_attention, "score_error", lambda *a: calls.append(real(*a)) or calls[-1])
        for n in (20, 77):
            ids = torch.randint(0, 256, (n,), generator=g).tolist()
            with torch.no_grad():
                expected = ref(torch.tensor([ids])).logits[0]
            assert rel_err(ours.prompt_logits(ids), expected) < 1e-4, n
        prompt = torch.randint(0, 256, (40,), generator=g).tolist()
        assert ours_greedy(ours, [prompt], 24)[0] == hf_greedy(ref, prompt, 24)
    assert calls and min(calls) > amx_attention.SIX_PASS_ABOVE
