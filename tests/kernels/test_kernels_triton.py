"""Every Triton kernel against its reference twin, on the CPU under TRITON_INTERPRET=1.

Shapes are tiny (the interpreter runs each program in Python); what varies is what
breaks kernels: page kinds, block sizes, GQA ratios (including a non-power-of-two
group), odd lengths, partial last pages, staged tails, split counts. Outputs are
pre-filled with NaN so an element a kernel forgets to write fails the comparison, and
the pools' unwritten memory is poisoned (see ``poisoned_layer``) so reading it does too.
"""

from __future__ import annotations

import os

import pytest
import torch

import kernels
from kernels import reference as R
from tests.kernels.kernels_testutil import dot_tolerance, fill

pytestmark = pytest.mark.triton

if kernels.HAS_TRITON:
    from kernels.kv_store_triton import kv_store_triton
    from kernels.paged_attention import paged_attention_decode_triton
    from kernels.prefill_attention import paged_prefill_attention_triton
    from kernels.sparse_attention import score_pages_triton, select_pages_triton, sparse_attention_decode_triton

D = 32
KINDS = ["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
# (kind, block size, query heads): every kind at BS 16 with GQA 3; a few at BS 32 / MHA.
CASES = [(k, 16, 6) for k in KINDS] + [("fp16", 32, 2), ("int4", 32, 2), ("int8", 16, 2), ("fp8", 32, 6)]
LENS = [1, 16, 37, 70]  # one token, exactly one page, partial tails, several pages


@pytest.fixture(autouse=True)
def _interpreted():
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is off (triton was imported before the kernels conftest)")


def spec_of(kind, bs):
    return kernels.KVCacheSpec(n_kv_heads=2, head_dim=D, block_size=bs, kv_dtype=kind, v_group_size=16)


def nan_like(x):
    return torch.full_like(x, float("nan"))


@pytest.mark.parametrize("kind,bs,hq", CASES)
def test_kv_store_matches_reference(kind, bs, hq):
    ref = fill(spec_of(kind, bs), LENS, seed=1)
    tri = fill(spec_of(kind, bs), LENS, seed=1, store=kv_store_triton)
    a, b = ref.layer, tri.layer
    assert torch.equal(a.stage_of_block, b.stage_of_block) if a.stage_of_block is not None else True
    # bf16: the interpreter casts fp32 -> bf16 by truncation where torch rounds, so pages
    # (and the summaries read back from them) may sit 1 ulp apart.
    rtol = 2**-7 if kind == "bf16" else 1e-6
    for name in ("k_min", "k_max", "k_scale", "k_bits", "v_scale", "v_zero"):
        x, y = getattr(a, name), getattr(b, name)
        if x is not None:
            torch.testing.assert_close(y, x, rtol=rtol, atol=1e-6, equal_nan=True, msg=name)
    if kind == "bf16":
        torch.testing.assert_close(b.k_pages.float(), a.k_pages.float(), rtol=2**-7, atol=0, equal_nan=True)
    elif kind in ("int8", "int4"):
        # Codes may differ by one where x / scale lands on .5 up to float rounding.
        for x, y in ((a.k_pages, b.k_pages), (a.v_pages, b.v_pages)):
            if kind == "int4":
                x, y = R.unpack_int4(x), R.unpack_int4(y)
            assert (x.int() - y.int()).abs().max() <= 1
    else:
        assert torch.equal(a.k_pages.view(torch.uint8), b.k_pages.view(torch.uint8))
        assert torch.equal(a.v_pages.view(torch.uint8), b.v_pages.view(torch.uint8))
    if a.stage_k is not None:
        live = a.block_of_stage >= 0
        torch.testing.assert_close(b.stage_k[live], a.stage_k[live], equal_nan=True)  # NaN: never-written rows


@pytest.mark.parametrize("kind,bs,hq", CASES)
@pytest.mark.parametrize("pages_per_split", [1, None])
def test_decode_matches_reference(kind, bs, hq, pages_per_split):
    f = fill(spec_of(kind, bs), LENS, seed=2)
    q = torch.randn(len(LENS), hq, D)
    want = R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    out = paged_attention_decode_triton(q, f.layer, f.block_tables, f.context_lens, D**-0.5, out=nan_like(q),
                                        pages_per_split=pages_per_split)
    tol = dot_tolerance(f.layer)
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)


def test_decode_half_precision_queries_and_output():
    f = fill(spec_of("fp16", 16), LENS, seed=3)
    q = torch.randn(len(LENS), 4, D).half()
    want = R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    out = paged_attention_decode_triton(q, f.layer, f.block_tables, f.context_lens, D**-0.5, out=nan_like(q))
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, want, rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("kind,bs,hq", CASES[:6] + CASES[7:8])
def test_score_pages_matches_reference(kind, bs, hq):
    f = fill(spec_of(kind, bs), LENS + [5 * bs + 3], seed=4, extra_pages=20)  # > one 16-page tile
    q = torch.randn(len(LENS) + 1, hq, D)
    for per_kv_head in (True, False):
        want = R.score_pages(q, f.layer, f.block_tables, f.context_lens, per_kv_head=per_kv_head)
        got = score_pages_triton(q, f.layer, f.block_tables, f.context_lens, per_kv_head=per_kv_head,
                                 out=nan_like(want))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind,bs,hq", CASES[:6] + CASES[6:7])
@pytest.mark.parametrize("per_kv_head", [True, False])
def test_sparse_decode_matches_reference(kind, bs, hq, per_kv_head):
    f = fill(spec_of(kind, bs), [3 * bs + 5, 7 * bs, 2 * bs - 1], seed=5)
    q = torch.randn(3, hq, D)
    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2, per_kv_head=per_kv_head)
    scores = R.score_pages(q, f.layer, f.block_tables, f.context_lens, per_kv_head=per_kv_head)
    sel, n = R.select_pages(scores, f.context_lens, bs, pol, max_pages=f.block_tables.shape[1])
    want = R.sparse_attention_decode(q, f.layer, f.block_tables, sel, n, f.context_lens, D**-0.5)
    got = sparse_attention_decode_triton(q, f.layer, f.block_tables, sel, n, f.context_lens, D**-0.5,
                                         out=nan_like(q), pages_per_split=2)
    tol = dot_tolerance(f.layer)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


PREFILL_POLICIES = [
    kernels.AttentionPolicy("dense"),
    kernels.AttentionPolicy("window", n_sink_pages=1, n_local_pages=1),
    kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=1),
]


@pytest.mark.parametrize("kind,bs,hq", CASES[:6] + CASES[7:8])
@pytest.mark.parametrize("policy", PREFILL_POLICIES, ids=lambda p: p.kind)
def test_prefill_matches_reference(kind, bs, hq, policy):
    n = 4 * bs + 7
    start = 2 * bs + 3  # the chunk starts mid-page and ends on a staged partial page
    f = fill(spec_of(kind, bs), [n], seed=6)
    q = torch.randn(n - start, hq, D)
    want = R.paged_prefill_attention(q, f.layer, f.block_tables[0], start, D**-0.5, policy)
    got = paged_prefill_attention_triton(q, f.layer, f.block_tables[0], start, D**-0.5, policy, out=nan_like(q),
                                         block_m=16)
    tol = dot_tolerance(f.layer)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_prefill_own_output_is_unit_stride_for_a_permuted_query():
    """A dense but permuted q (stride(-1) != 1) made the output with empty_like(q) before q
    was made contiguous: `out` kept q's strides, and the kernel writes unit-stride rows."""
    bs, hq = 16, 6
    n, start = 3 * bs + 5, bs + 2
    f = fill(spec_of("fp16", bs), [n], seed=8)
    q = torch.randn(D, n - start, hq).permute(1, 2, 0)  # [N, HQ, D], stride(-1) == N * HQ
    assert q.stride(-1) != 1 and torch.empty_like(q).stride() == q.stride()  # dense: empty_like keeps it
    want = R.paged_prefill_attention(q, f.layer, f.block_tables[0], start, D**-0.5)
    got = paged_prefill_attention_triton(q, f.layer, f.block_tables[0], start, D**-0.5, block_m=16)
    assert got.stride(-1) == 1
    tol = dot_tolerance(f.layer)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_dispatch_routes_cpu_tensors_to_triton_when_forced(monkeypatch):
    f = fill(spec_of("int4", 16), [40], seed=7)
    q = torch.randn(1, 4, D)
    calls = []
    import kernels.paged_attention as pa

    real = pa.paged_attention_decode_triton
    monkeypatch.setattr(pa, "paged_attention_decode_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    kernels.set_backend("triton")
    try:
        got = kernels.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    finally:
        kernels.set_backend("auto")
    assert calls == [1]
    want = kernels.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)  # CPU -> reference
    torch.testing.assert_close(got, want, rtol=dot_tolerance(f.layer), atol=dot_tolerance(f.layer))


def test_a_kernel_the_gpu_cannot_load_falls_back_to_the_reference_once_warned(monkeypatch):
    """OutOfResources (a block needing more shared memory than the GPU's SMs give, as fp32
    decode at head_dim 128 on sm_89) sends that kernel's calls for that page spec to the
    torch reference, with one warning; other specs still try Triton."""
    from triton.runtime.errors import OutOfResources

    import kernels.paged_attention as pa
    import kernels.prefill_attention as pf

    f = fill(spec_of("fp32", 16), [40], seed=7)
    q = torch.randn(1, 4, D)
    tries = []

    def too_big(*a, **k):
        tries.append(1)
        raise OutOfResources(139280, 101376, "shared memory")

    monkeypatch.setattr(kernels.dispatch, "_UNFIT", set())
    monkeypatch.setattr(pa, "paged_attention_decode_triton", too_big)
    monkeypatch.setattr(pf, "paged_prefill_attention_triton", too_big)
    kernels.set_backend("triton")
    try:
        with pytest.warns(RuntimeWarning, match="cannot run the Triton kernel on fp32 pages"):
            got = kernels.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
        again = kernels.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
        qc = torch.randn(5, 4, D)
        with pytest.warns(RuntimeWarning, match="paged_prefill_attention"):
            got_pf = kernels.paged_prefill_attention(qc, f.layer, f.block_tables[0], 35, D**-0.5)
    finally:
        kernels.set_backend("auto")
    assert tries == [1, 1]  # once per kernel: the second decode went straight to the reference
    want = R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(again, want)
    torch.testing.assert_close(got_pf, R.paged_prefill_attention(qc, f.layer, f.block_tables[0], 35, D**-0.5))


def test_importing_the_kernel_modules_keeps_the_package_functions():
    import kernels.kv_store_triton  # noqa: F401
    import kernels.paged_attention  # noqa: F401

    assert kernels.kv_store is kernels.dispatch.kv_store and kernels.paged_attention_decode.__module__ == "kernels.dispatch"


# Pages per loop step: 1 (one page a step, the bench's baseline) and more than the
# default, so a step straddles the end of a split, of a selection and of the plan.
TILE_CASES = [("fp16", 16, 6), ("int4", 16, 6), ("fp8", 32, 6), ("int8", 16, 2)]


@pytest.mark.parametrize("kind,bs,hq", TILE_CASES)
@pytest.mark.parametrize("tile", [1, 8])
def test_attention_kernels_match_reference_at_any_tile_width(kind, bs, hq, tile):
    f = fill(spec_of(kind, bs), LENS + [9 * bs + 2], seed=7)
    q = torch.randn(len(LENS) + 1, hq, D)
    tol = dot_tolerance(f.layer)
    want = R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    got = paged_attention_decode_triton(q, f.layer, f.block_tables, f.context_lens, D**-0.5, out=nan_like(q),
                                        pages_per_split=4, tile=tile)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)

    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    scores = R.score_pages(q, f.layer, f.block_tables, f.context_lens)
    sel, n = R.select_pages(scores, f.context_lens, bs, pol, max_pages=f.block_tables.shape[1])
    want = R.sparse_attention_decode(q, f.layer, f.block_tables, sel, n, f.context_lens, D**-0.5)
    got = sparse_attention_decode_triton(q, f.layer, f.block_tables, sel, n, f.context_lens, D**-0.5,
                                         out=nan_like(q), tile=tile)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)

    start = 8 * bs - 3  # the chunk's queries see every page of a 10-page sequence
    qc = torch.randn(9 * bs + 2 - start, hq, D)
    for policy in PREFILL_POLICIES:
        want = R.paged_prefill_attention(qc, f.layer, f.block_tables[-1], start, D**-0.5, policy)
        got = paged_prefill_attention_triton(qc, f.layer, f.block_tables[-1], start, D**-0.5, policy,
                                             out=nan_like(qc), block_m=16, tile=tile)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=policy.kind)


def test_tile_width_must_be_a_power_of_two():
    from kernels._page_io import tile_pages

    assert (tile_pages(16), tile_pages(64), tile_pages(128), tile_pages(16, 1)) == (4, 1, 1, 1)
    with pytest.raises(ValueError):
        tile_pages(16, 3)


SELECT_POLICIES = [
    kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=3),
    kernels.AttentionPolicy("topk", n_sink_pages=2, n_local_pages=1, top_k_pages=300),  # more than the candidates
    kernels.AttentionPolicy("topk", n_sink_pages=0, n_local_pages=4, top_k_pages=1),
    kernels.AttentionPolicy("window", n_sink_pages=1, n_local_pages=3),
]


@pytest.mark.parametrize("policy", SELECT_POLICIES, ids=lambda p: f"{p.kind}-{p.n_sink_pages}-{p.n_local_pages}-{p.top_k_pages}")
@pytest.mark.parametrize("hs", [1, 3])
def test_select_pages_matches_reference(policy, hs):
    # Lengths: one token, fewer pages than sinks + window, some, and more than one
    # 256-page block of the kernel's passes; bs 16.
    lens = torch.tensor([1, 40, 16 * 9 + 3, 16 * 600 - 5], dtype=torch.int32)
    max_pages = 600
    scores = torch.randn(len(lens), hs, max_pages)  # distinct scores: top-k has no ties to break
    scores[2, :, 3] = float("nan")  # non-finite candidates: NaN and -inf rank last, +inf first
    scores[3, :, 100] = float("inf")
    scores[3, :, 200] = float("-inf")
    want_sel, want_n = R.select_pages(scores, lens, 16, policy, max_pages=max_pages)
    sel, n = select_pages_triton(scores if policy.kind == "topk" else None, lens, 16, policy, max_pages=max_pages)
    assert torch.equal(n, want_n)
    if want_sel.shape[1] != sel.shape[1]:  # window: one shared selection
        want_sel = want_sel.expand_as(sel)
    assert torch.equal(sel, want_sel)


def test_select_pages_breaks_ties_by_taking_exactly_k():
    lens = torch.tensor([16 * 20], dtype=torch.int32)
    scores = torch.zeros(1, 1, 20)  # every candidate ties
    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=5)
    sel, n = select_pages_triton(scores, lens, 16, pol, max_pages=20)
    assert int(n[0]) == 7 and sel[0, 0].tolist() == [0, 1, 2, 3, 4, 5, 19]
