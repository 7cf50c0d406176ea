"""The CPU decode-attention kernel against `attend_reference`: lengths (odd ones, several
key blocks and work splits), consecutive and scattered pages, GQA ratios, head sizes,
sliding windows, fp32 and 16-bit pages, several sequences in one call, and the store of
the step's new K/V rows."""

import pytest
import torch

from ktcli.engine import cpu_attention
from ktcli.engine.attention import SeqAttn, attend_reference, block_slots, make_masks, store_kv

pytestmark = pytest.mark.skipif(not cpu_attention.available(), reason="no C++ compiler / AVX2 here")

BS = 16
NUM_BLOCKS = 160


def _seq(table: list[int], ctx: int, windows: set) -> SeqAttn:
    first, slots = block_slots(table, BS, ctx)
    return SeqAttn(0, 1, ctx, first, slots, make_masks(1, ctx, windows))


def _tables(ctxs: list[int], scattered: bool, g: torch.Generator) -> list[list[int]]:
    """Disjoint page lists, one per sequence: a consecutive run or shuffled pages."""
    order = torch.randperm(NUM_BLOCKS, generator=g).tolist() if scattered else list(range(NUM_BLOCKS))
    out, at = [], 0
    for ctx in ctxs:
        used = -(-ctx // BS)
        out.append(order[at : at + used])
        at += used
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (8, 1, 16), (8, 2, 128)])
@pytest.mark.parametrize("scattered", [False, True])
@pytest.mark.parametrize("window", [None, 37])
def test_decode_matches_reference(dtype, heads, kv_heads, head_dim, scattered, window):
    g = torch.Generator().manual_seed(heads * 100 + head_dim + int(scattered))
    ctxs = [1, 7, 100, 513, 1001]  # one sequence per length, all in one call
    tables = _tables(ctxs, scattered, g)
    shape = (NUM_BLOCKS * BS, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    seqs = [_seq(t, ctx, {None, window}) for t, ctx in zip(tables, ctxs)]
    # the step's new rows (token ctx-1 of each sequence), stored by the kernel itself
    q = torch.randn(len(ctxs), heads, head_dim, generator=g)
    k_new = torch.randn(len(ctxs), kv_heads, head_dim, generator=g)
    v_new = torch.randn(len(ctxs), kv_heads, head_dim, generator=g)
    slot_mapping = torch.tensor([t[(c - 1) // BS] * BS + (c - 1) % BS for t, c in zip(tables, ctxs)])
    batch = cpu_attention.DecodeBatch.from_seqs(seqs, BS, slot_mapping)
    scale = head_dim**-0.5
    kc, vc = k_cache.clone(), v_cache.clone()
    got = batch.attend(q, k_new, v_new, kc, vc, window, scale)

    store_kv(k_cache, v_cache, k_new, v_new, slot_mapping)  # the torch path's store
    assert torch.equal(kc, k_cache) and torch.equal(vc, v_cache)
    for i, s in enumerate(seqs):
        want = attend_reference(q[i : i + 1], k_cache, v_cache, s, window, scale)[0]
        # The reference reads the same (widened) page values: only the order of the fp32
        # sums differs.
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=2e-6)


def test_decode_long_context_splits_agree():
    """4096 keys split into many ranges across threads: the merge of their partial
    softmaxes equals one pass."""
    g = torch.Generator().manual_seed(7)
    ctx, heads, kv_heads, d = 4096 + 3, 9, 3, 64
    table = list(range(-(-ctx // BS)))
    k_cache = torch.randn(len(table) * BS, kv_heads, d, generator=g) * 3  # peaky softmax
    v_cache = torch.randn(len(table) * BS, kv_heads, d, generator=g)
    seq = SeqAttn(0, 1, ctx, 0, None, make_masks(1, ctx, {None}))
    q = torch.randn(1, heads, d, generator=g)
    batch = cpu_attention.DecodeBatch.from_seqs([seq], BS, torch.tensor([ctx - 1]))
    got = batch.attend(q, None, None, k_cache, v_cache, None, d**-0.5)
    want = attend_reference(q, k_cache, v_cache, seq, None, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def test_supports():
    assert cpu_attention.supports(64, 9, 3, torch.float32)
    assert cpu_attention.supports(128, 32, 8, torch.float16)
    assert not cpu_attention.supports(80, 8, 8, torch.float32)  # head size without a kernel
    assert not cpu_attention.supports(64, 64, 2, torch.float32)  # group of 32
    assert not cpu_attention.supports(64, 8, 8, torch.int8)


def test_fp16_pages_saturate_instead_of_overflowing():
    """A K/V value past fp16's range is stored as +-65504 by both stores (the decode
    kernel's and the prefill's `store_kv`), never as inf, so attention stays finite."""
    k_cache = torch.zeros(2 * BS, 1, 16, dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    k = torch.full((1, 1, 16), 1e5)
    k[0, 0, 1] = -3e5
    store_kv(k_cache, v_cache, k, k, torch.tensor([0]))
    seq = SeqAttn(0, 1, 2, 0, None, make_masks(1, 2, {None}))
    batch = cpu_attention.DecodeBatch.from_seqs([seq], BS, torch.tensor([1]))
    out = batch.attend(torch.ones(1, 1, 16), k, k, k_cache, v_cache, None, 0.25)  # stores row 1 itself
    for row in (0, 1):
        assert k_cache[row, 0, 0] == 65504 and k_cache[row, 0, 1] == -65504 and v_cache[row, 0, 0] == 65504
    assert torch.isfinite(out).all()


def test_avx2_body_matches_reference_where_avx512_would_run():
    """On AVX-512 CPUs the kernel runs its 16-lane body; KTCLI_NO_AVX512 (read once per
    process) keeps the AVX2 one, so the reference tests above run again in a child with it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "KTCLI_NO_AVX512": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
         "-k", "test_decode_matches_reference and 9-3-64 or test_decode_long_context_splits_agree"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
