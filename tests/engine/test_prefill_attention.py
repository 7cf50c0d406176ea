"""Prefill attention (chunks of n > 1 queries after cached tokens) against the oracle."""

from __future__ import annotations

import pytest
import torch

from ktcli.engine import amx_attention, prefill_attention
from ktcli.engine.attention import SeqAttn, attend, attend_reference, block_slots, make_masks

BS = 16


def _case(table, n, ctx, n_q, n_kv, d=64, dtype=torch.float32, windows=(None,), seed=0):
    g = torch.Generator().manual_seed(seed)
    slots = (max(table) + 1) * BS
    k_cache = torch.randn(slots, n_kv, d, generator=g).to(dtype)
    v_cache = torch.randn(slots, n_kv, d, generator=g).to(dtype)
    q = torch.randn(n, n_q, d, generator=g)
    first, slot_index = block_slots(table, BS, ctx)
    seq = SeqAttn(0, n, ctx, first, slot_index, make_masks(n, ctx, set(windows)))
    return q, k_cache, v_cache, seq


def _rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.mark.parametrize("n,ctx", [(2, 2), (5, 40), (16, 48), (33, 100), (64, 64), (40, 200), (100, 101)])
@pytest.mark.parametrize("n_q,n_kv", [(9, 3), (4, 4), (8, 1)])
def test_chunk_after_cached_tokens_matches_reference(n, ctx, n_q, n_kv):
    table = list(range(3, 3 + -(-ctx // BS)))  # consecutive pages, not starting at 0
    q, kc, vc, seq = _case(table, n, ctx, n_q, n_kv)
    scale = 64**-0.5
    got = attend(q, kc, vc, seq, None, scale)
    assert got.shape == (n, n_q, 64)
    assert _rel(got, attend_reference(q, kc, vc, seq, None, scale)) < 1e-5


@pytest.mark.parametrize("n,ctx", [(7, 50), (48, 130)])
def test_non_consecutive_pages_are_gathered(n, ctx):
    used = -(-ctx // BS)
    table = [2 * i + 1 for i in range(used)][::-1]  # scattered and out of order
    q, kc, vc, seq = _case(table, n, ctx, 9, 3, seed=1)
    assert seq.first_slot is None
    scale = 0.125
    assert _rel(attend(q, kc, vc, seq, None, scale), attend_reference(q, kc, vc, seq, None, scale)) < 1e-5


@pytest.mark.parametrize("window", [8, 30, 500])
def test_sliding_window_chunks(window):
    n, ctx = 40, 150
    table = list(range(-(-ctx // BS)))
    q, kc, vc, seq = _case(table, n, ctx, 9, 3, windows=(None, window), seed=2)
    scale = 0.125
    for w in (None, window):
        assert _rel(attend(q, kc, vc, seq, w, scale), attend_reference(q, kc, vc, seq, w, scale)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,ctx", [(24, 90), (50, 50)])
def test_half_precision_pages_are_widened(dtype, n, ctx):
    table = list(range(-(-ctx // BS)))
    q, kc, vc, seq = _case(table, n, ctx, 9, 3, dtype=dtype, seed=3)
    scale = 0.125
    got = attend(q, kc, vc, seq, None, scale)
    assert got.dtype == torch.float32  # fp32 queries over the widened pages
    assert _rel(got, attend_reference(q, kc, vc, seq, None, scale)) < 1e-5


def test_later_chunks_build_no_mask_tensor():
    masks = make_masks(512, 8192, {None})
    assert masks[None] == (0, "prefix")
    assert make_masks(512, 512, {None})[None] == (0, "causal")


def test_masked_fallback_equals_split():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(30, 9, 64, generator=g)
    k = torch.randn(100, 3, 64, generator=g)
    v = torch.randn(100, 3, 64, generator=g)
    split = prefill_attention.attend_prefix(q, k, v, 0.125)
    masked = prefill_attention._masked_sdpa(q, k, v, 0.125)
    assert _rel(split, masked) < 1e-5


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_last_layer_on_logit_rows_only_gives_the_same_logits(tiny_models, kind):
    """A prefill step of two sequences computes the last layer for their last rows only;
    those logits equal the last rows of the every-row forward."""
    from ktcli.engine.native import NativeBackend
    from ktcli.engine.sequence import Sequence

    engine = NativeBackend.load(tiny_models[kind], weights="fp32", block_size=4, kv_budget_bytes=4 << 20).engine
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (30, 45)]
    out = {}
    for all_rows in (False, True):
        seqs = []
        for p in prompts:
            s = Sequence(engine._next_id, list(p), len(p), 0)
            engine._next_id += 1
            engine.blocks.grow(s.block_table, len(p))
            seqs.append(s)
        step, ids = engine._build_step([(s, len(s.token_ids)) for s in seqs], all_rows=all_rows)
        assert (engine.model._last_layer_seqs(step, ids.shape[0]) is None) == all_rows
        out[all_rows] = engine.model.forward(ids, step)
        for s in seqs:
            engine.blocks.free(s.block_table)
    assert _rel(out[False], out[True][[29, 74]]) < 1e-5


@pytest.mark.parametrize("n,keys,n_q,n_kv", [(30, 30, 9, 3), (30, 100, 9, 3), (77, 300, 4, 4), (5, 200, 8, 1)])
@pytest.mark.parametrize("block_scores", [1 << 21, 3000])  # one block; many blocks (the minimum of 16 positions)
def test_blocked_onednn_path_equals_masked_sdpa(n, keys, n_q, n_kv, block_scores, monkeypatch):
    """The fp32 CPU path (oneDNN products, our causal softmax) over single and many query
    blocks, a first chunk (no earlier keys) and later ones, GQA folds of 1-8 heads."""
    from ktcli.engine import cpu_gemm

    if not cpu_gemm.usable() or prefill_attention._kernel() is None:
        pytest.skip("no oneDNN linear or C++ kernels here")
    monkeypatch.setattr(cpu_gemm, "available", lambda: True)  # the engine's default on Intel CPUs is MKL
    monkeypatch.setattr(amx_attention, "supports", lambda q: False)  # CPUs with AMX take that kernel first
    monkeypatch.setattr(prefill_attention, "BLOCK_SCORES", block_scores)
    g = torch.Generator().manual_seed(n + keys)
    q = torch.randn(n, n_q, 64, generator=g)
    k = torch.randn(keys, n_kv, 64, generator=g) * 2  # peaky rows: the max subtraction matters
    v = torch.randn(keys, n_kv, 64, generator=g)
    got = prefill_attention._blocked_onednn(q, k, v, 0.125)
    assert _rel(got, prefill_attention._masked_sdpa(q, k, v, 0.125)) < 1e-5
    assert _rel(prefill_attention.attend_prefix(q, k, v, 0.125), got) == 0  # what attend runs here


def test_flash_split_path_where_oneDNN_is_absent(monkeypatch):
    from ktcli.engine import cpu_gemm

    monkeypatch.setattr(cpu_gemm, "available", lambda: False)
    monkeypatch.setattr(amx_attention, "supports", lambda q: False)
    g = torch.Generator().manual_seed(5)
    for n, keys in ((30, 30), (30, 100)):
        q = torch.randn(n, 9, 64, generator=g)
        k, v = torch.randn(keys, 3, 64, generator=g), torch.randn(keys, 3, 64, generator=g)
        split = prefill_attention.attend_prefix(q, k, v, 0.125)
        assert _rel(split, prefill_attention._masked_sdpa(q, k, v, 0.125)) < 1e-5
