"""Decode attention straight from int8 / int4 pages against the dequantise-then-attend path."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.reference import context_kv
from ktcli.engine import cpu_kivi_attention
from ktcli.engine.attention import decode_grouped
from ktcli.engine.exact_sinks import swap_in_

pytestmark = pytest.mark.skipif(not cpu_kivi_attention.available(), reason="C++ kernels unavailable")


def _filled_layer(kind: str, n_kv: int, d: int, ctx: int, seed: int, group: int = 128):
    """A layer holding one sequence of `ctx` tokens on shuffled physical blocks."""
    torch.manual_seed(seed)
    spec = kernels.KVCacheSpec(n_kv, d, 64, kind, v_group_size=group, stage_dtype="fp32")
    n_pages = -(-ctx // 64)
    layer = kernels.allocate(spec, n_pages + 5, "cpu", n_stage=4)
    table = torch.randperm(n_pages + 5)[:n_pages].to(torch.int32)
    if kind == "int4":  # uneven query weights: key widths from 0 to 8 bits (kernels.reference.key_widths)
        layer.k_weight = torch.rand(n_kv, d) ** 4
    # keys with a few loud channels and a non-zero mean, as real keys have
    k = torch.randn(ctx, n_kv, d) * (1 + 4 * (torch.arange(d) % 17 == 0)) + 0.5
    v = torch.randn(ctx, n_kv, d)
    slots = (table.long()[torch.arange(ctx) // 64] * 64 + torch.arange(ctx) % 64)
    for start in range(0, ctx, 100):  # several stores, as prefill chunks and decode steps do
        kernels.kv_store(layer, k[start : start + 100], v[start : start + 100], slots[start : start + 100])
    return layer, table


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("ctx", [1, 63, 64, 65, 700, 4096 + 17])
def test_matches_dequantised_attention(kind, ctx):
    n_kv, group, d = 3, 3, 64
    layer, table = _filled_layer(kind, n_kv, d, ctx, seed=ctx)
    q = torch.randn(1, n_kv * group, d) * 2
    scale = d**-0.5
    k_all, v_all = context_kv(layer, table, ctx)
    want = decode_grouped(q, k_all, v_all, scale)
    got = cpu_kivi_attention.decode(q, layer, table, ctx, scale)
    assert got.shape == want.shape == (1, n_kv * group, d)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-5)
    if kind == "int4" and ctx >= 64:
        widths = kernels.reference.unpack_int4(layer.k_bits[table[: ctx // 64].long()])
        assert widths.min() == 0 and widths.max() >= 7


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_head_dim_128_two_value_groups_and_one_query_head_per_kv_head(kind):
    layer, table = _filled_layer(kind, 2, 128, 300, seed=7, group=64)
    q = torch.randn(1, 2, 128)
    k_all, v_all = context_kv(layer, table, 300)
    torch.testing.assert_close(cpu_kivi_attention.decode(q, layer, table, 300, 0.1),
                               decode_grouped(q, k_all, v_all, 0.1), rtol=2e-4, atol=2e-5)


def test_supports_only_what_it_computes():
    spec = lambda kind, **kw: kernels.KVCacheSpec(3, 64, 64, kind, stage_dtype=kw.pop("stage", "fp32"), **kw)  # noqa: E731
    assert cpu_kivi_attention.supports(spec("int8"), 9)
    assert cpu_kivi_attention.supports(spec("int4"), 9)
    assert not cpu_kivi_attention.supports(spec("fp8"), 9)
    assert not cpu_kivi_attention.supports(spec("int8", stage="fp16"), 9)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_engine_decode_through_the_kernel_gives_the_torch_paths_tokens(smollm2_dir, kind):
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.native import NativeBackend

    backend = NativeBackend.load(smollm2_dir, weights="fp32", kv_dtype=kind, threads=2)
    assert backend.kv._kivi_decode
    prompt = backend.chat_ids([{"role": "user", "content": "Name three colours of the rainbow and say why it forms."}])
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    ours = backend.generate_ids([prompt], params)
    backend.kv._kivi_decode = False  # the dequantise-then-attend path
    assert backend.generate_ids([prompt], params) == ours


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("cpp", [True, False])  # stage_mid_page_rows, or store_mid_page's torch ops
def test_mid_page_store_leaves_the_cache_as_the_reference_store_does(smollm2_dir, kind, cpp, monkeypatch):
    """Decode rows stored by `longctx.store_mid_page` (most of them) and `kernels.kv_store`
    (a page's first and last rows): the same pages, summaries and staging as the reference
    store alone, through 24 tokens from row 120 (page 128's boundary crossed: a page sealed
    on the way; 70 tokens from row 100 took ~10 s a case, six cases)."""
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.native import NativeBackend

    from ktcli.engine import longctx

    if not cpp:
        monkeypatch.setattr(cpu_kivi_attention, "stage_mid_page_rows", lambda *a: None)
    taken = []
    real = longctx.store_mid_page
    monkeypatch.setattr(longctx, "store_mid_page", lambda *a: taken.append(real(*a)) or taken[-1])
    prompt = list(range(1000, 1120))
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    # int4's key calibration measures on a process's first int4 load, through that load's
    # pages (freed, not cleared): load once first, so both runs start from clean pages.
    if kind == "int4":
        NativeBackend.load(smollm2_dir, weights="fp32", kv_dtype=kind, threads=2, kv_budget_bytes=256 << 20)
    runs = []
    for fast in (True, False):
        backend = NativeBackend.load(smollm2_dir, weights="fp32", kv_dtype=kind, threads=2, kv_budget_bytes=256 << 20)
        backend.kv._fast_store = fast
        tokens = backend.generate_ids([prompt], params)
        runs.append((tokens, backend.kv.layers))
    (fast_tokens, fast_layers), (ref_tokens, ref_layers) = runs
    assert taken.count(True) > 20 * 30 and taken.count(False) > 0  # most rows, every layer; a few fell back
    assert fast_tokens == ref_tokens and len(fast_tokens[0]) == 24
    for a, b in zip(fast_layers, ref_layers):
        for name in ("k_pages", "v_pages", "k_min", "k_max", "k_scale", "v_zero", "v_scale", "stage_k", "stage_v",
                     "stage_of_block", "block_of_stage"):
            if getattr(b, name) is not None:  # fp8 has per-page scales, int kinds value zero/scale
                assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("ctx", [64, 700, 4096 + 17])
def test_gather_matches_the_reference_gather(kind, ctx):
    from kernels.reference import gather_kv

    layer, table = _filled_layer(kind, 3, 64, ctx, seed=ctx + 1)
    n_pages = -(-ctx // 64)
    gen = torch.Generator().manual_seed(ctx)
    # per-head selections: random pages, the last (tail) page, padding, a page past the context
    pages = torch.stack([torch.cat([torch.randint(0, n_pages, (5,), generator=gen).sort().values,
                                    torch.tensor([n_pages - 1, -1, n_pages + 3 if h == 2 else -1])]) for h in range(3)])
    big_table = torch.cat([table, torch.zeros(8, dtype=torch.int32)])  # entries past the context exist
    want_k, want_v, want_pos = gather_kv(layer, big_table[None], pages[None], torch.tensor([ctx]))
    k, v, pos = cpu_kivi_attention.gather(layer, big_table, pages, ctx)
    assert torch.equal(pos, want_pos[0])
    torch.testing.assert_close(k, want_k[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v, want_v[0], rtol=1e-6, atol=1e-6)
    # Exact spans (a sink, a step's own rows overlapping it and running past the context):
    # their rows instead of the pages', as swap_in_ writes them over the reference gather.
    spans = [(0, torch.randn(64, 3, 64, generator=gen), torch.randn(64, 3, 64, generator=gen)),
             (ctx // 2, torch.randn(ctx, 3, 64, generator=gen), torch.randn(ctx, 3, 64, generator=gen))]
    if ctx == 64:  # the second span starts inside the first: the later span wins
        spans[1] = (32, *spans[1][1:])
    want_k, want_v = want_k[0].clone(), want_v[0].clone()
    swap_in_(spans, want_k, want_v, want_pos[0])
    k, v, pos = cpu_kivi_attention.gather(layer, big_table, pages, ctx, spans)
    assert torch.equal(pos, want_pos[0])
    torch.testing.assert_close(k, want_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v, want_v, rtol=1e-6, atol=1e-6)
    held = (pos >= 0) & ((pos < 64) | (pos >= spans[1][0]))  # copied, not dequantised: bit-equal
    assert held.any() and torch.equal(k[held], want_k[held]) and torch.equal(v[held], want_v[held])
    # Keys turned by a rotation per column (RoPE at virtual positions), values untouched.
    angle = torch.rand(pages.shape[1] * 64, 32, generator=gen) * 6.3
    rotation = torch.polar(torch.full_like(angle, 1.1), angle)  # an attention factor in the magnitude
    turned_k, turned_v, _ = cpu_kivi_attention.gather(layer, big_table, pages, ctx, spans, rotation)
    want_turned = torch.view_as_real(torch.view_as_complex(k.reshape(3, -1, 32, 2)) * rotation).reshape(k.shape)
    torch.testing.assert_close(turned_k, want_turned, rtol=1e-5, atol=1e-5)
    assert torch.equal(turned_v, v)
