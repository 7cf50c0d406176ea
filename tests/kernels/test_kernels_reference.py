"""The plain-torch reference against naive oracles: formats, bounds, policies."""

from __future__ import annotations

import math

import pytest
import torch
from tests.kernels.kernels_testutil import fill, materialize, naive_attention, naive_bound, page_kv, poisoned_layer

import kernels
from kernels import reference as R

ALL_KINDS = ["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
D = 32


def spec_of(kind, bs=16, h=2, group=16, stage="fp16"):
    return kernels.KVCacheSpec(n_kv_heads=h, head_dim=D, block_size=bs, kv_dtype=kind, v_group_size=group, stage_dtype=stage)


# ----------------------------------------------------------------------------- formats


def value_bound(kind, lo, hi):
    """quant_error_bound for values, whose fp16 (zero, scale) widen the range: zero is
    rounded down by at most one fp16 ulp (2^-10 relative, 2^-24 among subnormals) and
    scale up by as much."""
    lo16 = lo - lo.abs() * 2.0**-10 - 2.0**-24
    hi16 = lo16 + (hi - lo16) * (1 + 2.0**-10) + R.qmax_of(kind) * 2.0**-24
    return R.quant_error_bound(kind, lo16, hi16)


def width_bound(kmin, kmax, widths):
    """int4 keys: half a step of the channel's width, half the range at 0 bits."""
    span = kmax - kmin
    bound = torch.where(widths > 0, span / (2 * ((1 << widths) - 1).clamp(min=1)), span / 2)
    return bound * (1 + 1e-5) + 1e-6 * torch.maximum(kmin.abs(), kmax.abs())


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("group", [8, 16, 32])
def test_int_roundtrip_within_bound(kind, group):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 2, D, generator=g) * torch.logspace(-2, 2, D)  # channels of very different range
    codes, kmin, kmax, k_bits = R.quantize_keys(x, kind)
    k = R.dequantize_keys(codes.transpose(1, 2), kmin, kmax, kind, k_bits).transpose(1, 2)  # [3, 16, 2, D]
    if kind == "int4":  # half a step of each channel's own width; a 0-bit channel reads its midpoint
        widths = R.unpack_int4(k_bits).long()  # [3, 2, D]
        assert (widths.sum(-1) == 4 * D).all() and widths.max() > 4 and widths.min() < 4
        bound = width_bound(kmin, kmax, widths)[:, None]
    else:
        bound = R.quant_error_bound(kind, kmin[:, None], kmax[:, None])
    assert ((k - x).abs() <= bound).all()
    assert torch.equal(kmin, x.amin(1)) and torch.equal(kmax, x.amax(1))

    vc, zero, scale = R.quantize_values(x, kind, group)
    assert zero.dtype == scale.dtype == torch.float16
    v = R.dequantize_values(vc, zero, scale, kind)
    gx = x.view(*x.shape[:-1], D // group, group)  # [..., D/G, G]
    lo, hi = gx.amin(-1), gx.amax(-1)
    # The stored range covers the group's and is at most one fp16 ulp wider at each end.
    top = zero.float() + R.qmax_of(kind) * scale.float()
    assert (zero.float() <= lo).all() and (top >= hi * (1 - 1e-6)).all()
    assert ((lo - zero.float()) <= lo.abs() * 2.0**-10 + 2.0**-24).all()
    bound = R.quant_error_bound(kind, zero.float(), top).repeat_interleave(group, -1)
    assert ((v - x).abs() <= bound).all()
    # The bound is tight: rounding uses about half a step somewhere.
    assert (v - x).abs().max() > 0.25 * bound.max()


def test_fp16_rounding_is_outward_and_tight():
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(2000, generator=g) * 10.0 ** torch.randint(-9, 5, (2000,), generator=g),
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 65504.0, 1e-8, -1e-8, 0.1])])
    lo, hi = R.fp16_floor(x), R.fp16_ceil(x)
    assert lo.dtype == hi.dtype == torch.float16
    assert (lo.float() <= x).all() and (hi.float() >= x).all()
    exact = x.half().float() == x
    assert torch.equal(lo.float()[exact], x[exact]) and torch.equal(hi.float()[exact], x[exact])
    # Tight: floor and ceil are adjacent fp16 values (bit patterns one apart for x > 0).
    assert ((hi.view(torch.int16).int() - lo.view(torch.int16).int()).abs() <= 1)[x > 0].all()


def test_fp8_roundtrip_within_bound():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 16, 2, D, generator=g) * 3
    x[0, 0, 0, 0] = 1e-6  # a subnormal after scaling
    bits, scale = R.quantize_fp8(x)
    y = R.dequantize_fp8(bits.transpose(1, 2), scale).transpose(1, 2)
    bound = R.quant_error_bound("fp8", None, scale[:, None, :, None], x)
    assert ((y - x).abs() <= bound).all()
    assert torch.allclose(y.abs().amax(dim=(1, 3)), x.abs().amax(dim=(1, 3)))  # amax maps onto 448 exactly


def test_int4_pack_roundtrip():
    codes = torch.randint(0, 16, (5, 7, 2 * 6), dtype=torch.uint8)
    assert torch.equal(R.unpack_int4(R.pack_int4(codes)), codes)
    assert R.pack_int4(torch.tensor([[1, 2]], dtype=torch.uint8)).item() == 0x21  # low nibble = channel 0


def test_constant_group_quantizes_exactly():
    x = torch.full((1, 16, 1, D), 0.3)
    codes, kmin, kmax, k_bits = R.quantize_keys(x, "int4")
    assert torch.equal(R.dequantize_keys(codes.transpose(1, 2), kmin, kmax, "int4", k_bits).transpose(1, 2), x)


def greedy_widths(err, budget, max_bits=8):
    """One bit at a time to the channel whose error model err * 4^-w drops the most."""
    w = [0] * len(err)
    for _ in range(budget):
        gains = [e * 4.0**-b * 0.75 if b < max_bits else -1.0 for e, b in zip(err, w)]
        w[max(range(len(err)), key=lambda c: (gains[c], -c))] += 1
    return w


def test_key_widths_are_the_greedy_allocation():
    g = torch.Generator().manual_seed(4)
    span = torch.rand(6, D, generator=g) ** 3 * 10
    weight = torch.rand(6, D, generator=g)
    widths = R.key_widths(span, weight)
    assert (widths.sum(-1) == 4 * D).all() and widths.max() <= 8
    for row in range(6):
        err = (span[row].square() * weight[row]).tolist()
        assert widths[row].tolist() == greedy_widths(err, 4 * D)
    # Equal ranges and weights: 4 bits each, which is the nibble layout byte for byte.
    assert (R.key_widths(torch.ones(2, D)) == 4).all()
    codes = torch.randint(0, 16, (3, D))
    assert torch.equal(R.pack_bitstream(codes, torch.full((D,), 4)), R.pack_int4(codes.to(torch.uint8)))
    # A channel the queries weigh heavily takes bits from the others.
    heavy = torch.ones(D)
    heavy[3] = 4.0**4
    assert R.key_widths(torch.ones(D), heavy)[3] == 8


def test_bitstream_roundtrip_with_any_widths():
    g = torch.Generator().manual_seed(6)
    widths = R.key_widths(torch.rand(4, D, generator=g) ** 6)
    assert (widths == 0).any() and (widths == 8).any()
    codes = (torch.rand(5, 4, D, generator=g) * (1 << widths)).long()
    packed = R.pack_bitstream(codes, widths)
    assert packed.shape == (5, 4, D // 2)
    assert torch.equal(R.unpack_bitstream(packed, widths), codes)


# ----------------------------------------------------------------------------- store


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("bs", [8, 16])
def test_store_then_read_matches_inputs(kind, bs):
    f = fill(spec_of(kind, bs), [1, bs, 2 * bs + 3, 5 * bs - 1], seed=3)
    stage = torch.float16
    for s in range(len(f.keys)):
        k, v = materialize(f, s)
        assert torch.isfinite(k).all() and torch.isfinite(v).all()
        n = k.shape[0]
        if kind in kernels.FLOAT_KINDS:
            dt = kernels.layout.TORCH_DTYPES[kind]
            assert torch.equal(k, f.keys[s].to(dt).float()) and torch.equal(v, f.values[s].to(dt).float())
            continue
        ks, vs = f.keys[s].to(stage).float(), f.values[s].to(stage).float()  # what was staged
        full = (n // bs) * bs
        # The tail is still staged: exact copies at stage precision.
        assert torch.equal(k[full:], ks[full:]) and torch.equal(v[full:], vs[full:])
        if full == 0:
            continue
        pk = ks[:full].view(-1, bs, *ks.shape[1:])  # [pages, BS, H, D]
        pv = vs[:full].view(-1, bs, *vs.shape[1:])
        if kind == "fp8":
            kb = R.quant_error_bound("fp8", None, pk.abs().amax(dim=(1, 3))[:, None, :, None] / 448, pk)
            vb = R.quant_error_bound("fp8", None, pv.abs().amax(dim=(1, 3))[:, None, :, None] / 448, pv)
        else:
            kb = R.quant_error_bound(kind, pk.amin(1, keepdim=True), pk.amax(1, keepdim=True))
            if kind == "int4":  # each channel's own width (reference.key_widths)
                blocks = f.block_tables[s, : full // bs].long()
                kb = width_bound(pk.amin(1), pk.amax(1), R.unpack_int4(f.layer.k_bits[blocks]).long())[:, None]
            gv = pv.view(*pv.shape[:-1], -1, 16)  # group 16
            vb = value_bound(kind, gv.amin(-1), gv.amax(-1)).repeat_interleave(16, -1)
        assert ((k[:full].view_as(pk) - pk).abs() <= kb).all()
        assert ((v[:full].view_as(pv) - pv).abs() <= vb).all()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_context_kv_reads_what_attention_sees(kind):
    """The whole-context fast read (every head, one gather) equals the per-page reads,
    for full pages and for a tail still in its staging slot."""
    f = fill(spec_of(kind, 16), [1, 16, 35, 79], seed=5)
    for s in range(len(f.keys)):
        k, v = R.context_kv(f.layer, f.block_tables[s], int(f.context_lens[s]))
        want_k, want_v = materialize(f, s)
        assert torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_page_summaries_bound_every_key(kind):
    f = fill(spec_of(kind), [7, 16, 45, 64], seed=4)
    bs = 16
    for s in range(len(f.keys)):
        n = int(f.context_lens[s])
        for p in range(math.ceil(n / bs)):
            b = int(f.block_tables[s, p])
            k, _ = page_kv(f.layer, b, min(bs, n - p * bs))  # [rows, H, D]
            kmin, kmax = f.layer.k_min[b], f.layer.k_max[b]
            # Dequantisation may land an ulp outside the interval (int kinds), no more.
            eps = 1e-6 * torch.maximum(kmin.abs(), kmax.abs()) if kind in ("int8", "int4") else 0.0
            assert (k >= kmin - eps).all() and (k <= kmax + eps).all()
            # ... and the bound is tight: every channel's min and max is attained (int4: but
            # for 0-bit channels, which read the middle of the range).
            full = kind == "int4" and n - p * bs >= bs
            coded = R.unpack_int4(f.layer.k_bits[b]) > 0 if full else torch.ones_like(kmin, dtype=torch.bool)
            assert torch.allclose(torch.where(coded, k.amin(0), kmin), kmin, rtol=1e-6, atol=1e-6)
            assert torch.allclose(torch.where(coded, k.amax(0), kmax), kmax, rtol=1e-6, atol=1e-6)
            if full:
                assert not coded.all()  # the case is exercised


def test_staging_pool_is_split_released_and_exhausted():
    spec = spec_of("int4", bs=8)
    # A 100-token prefill with 2 slots: stored in pieces, 12 pages sealed, 1 staged.
    f = fill(spec, [100], seed=5, n_stage=2, chunk=100)
    assert int((f.layer.block_of_stage >= 0).sum()) == 1
    k, _ = materialize(f, 0)
    assert torch.isfinite(k).all()
    tail_block = f.block_tables[0, 100 // 8]
    kernels.release_blocks(f.layer, tail_block.view(1))
    assert int((f.layer.block_of_stage >= 0).sum()) == 0 and int(f.layer.stage_of_block[tail_block]) == -1

    layer = kernels.allocate(spec, 8, n_stage=1)
    kv = torch.randn(2, 2, D)
    R.kv_store(layer, kv[:1], kv[:1], torch.tensor([0]))  # block 0 takes the only slot
    with pytest.raises(RuntimeError, match="staging pool exhausted"):
        R.kv_store(layer, kv[1:], kv[1:], torch.tensor([8]))  # block 1 needs another


def test_reused_block_starts_afresh():
    spec = spec_of("fp16", bs=8)
    layer = kernels.allocate(spec, 2)
    big = torch.full((8, 2, D), 5.0)
    R.kv_store(layer, big, big, torch.arange(8))
    small = torch.zeros(3, 2, D)
    R.kv_store(layer, small, small, torch.arange(3))  # block 0 re-used from offset 0
    assert (layer.k_max[0] == 0).all()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_bytes_per_token_matches_allocation(kind):
    spec = spec_of(kind)
    layer = kernels.allocate(spec, 10, n_stage=3)
    per_block = [layer.k_pages, layer.v_pages, layer.k_min, layer.k_max, layer.k_scale, layer.v_scale,
                 layer.v_zero, layer.k_bits, layer.stage_of_block]
    total = sum(t.numel() * t.element_size() for t in per_block if t is not None)
    assert total == 10 * kernels.bytes_per_block(spec) == 10 * 16 * kernels.bytes_per_token(spec)
    stage = [layer.stage_k, layer.stage_v, layer.block_of_stage, layer.k_weight]
    assert sum(t.numel() * t.element_size() for t in stage if t is not None) == kernels.staging_bytes(spec, 3)
    if kind == "int4":  # 4 bits per K and V element plus scales: well under fp16's 4 bytes
        assert kernels.bytes_per_token(spec) < kernels.bytes_per_token(spec_of("fp16")) / 2


# ----------------------------------------------------------------------------- attention


def _decode_visible(f, s, hq, pages=None):
    n = int(f.context_lens[s])
    pos = torch.arange(n)
    vis = torch.ones(1, hq, n, dtype=torch.bool)
    if pages is not None:  # pages: [hq, n_pages] bool, per query head
        vis = pages[:, pos // f.layer.spec.block_size][None]
    return vis


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("hq", [2, 6])
def test_reference_decode_equals_naive(kind, hq):
    f = fill(spec_of(kind), [1, 17, 33, 64], seed=6)
    q = torch.randn(4, hq, D)
    out = torch.full_like(q, float("nan"))
    R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5, out=out)
    for s in range(4):
        k, v = materialize(f, s)
        want = naive_attention(q[s : s + 1], k, v, D**-0.5, _decode_visible(f, s, hq))
        torch.testing.assert_close(out[s : s + 1], want, rtol=1e-5, atol=1e-5)


def test_reference_decode_long_context_tiles(monkeypatch):
    monkeypatch.setattr(R, "_TILE_BYTES", 1 << 14)  # force many tiles
    f = fill(spec_of("int8"), [300, 129], seed=7)
    q = torch.randn(2, 4, D)
    out = R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    for s in range(2):
        k, v = materialize(f, s)
        torch.testing.assert_close(out[s : s + 1], naive_attention(q[s : s + 1], k, v, D**-0.5, _decode_visible(f, s, 4)),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["fp32", "int4"])
def test_score_pages_is_the_quest_bound(kind):
    f = fill(spec_of(kind), [5, 40, 70], seed=8)
    hq, bs = 6, 16
    q = torch.randn(3, hq, D)
    scores = R.score_pages(q, f.layer, f.block_tables, f.context_lens)  # [S, H, P]
    assert scores.shape == (3, 2, f.block_tables.shape[1])
    for s in range(3):
        n = int(f.context_lens[s])
        k, _ = materialize(f, s)
        for p in range(f.block_tables.shape[1]):
            if p >= math.ceil(n / bs):
                assert (scores[s, :, p] == -math.inf).all()
                continue
            b = int(f.block_tables[s, p])
            for h in range(2):
                heads = q[s, 3 * h : 3 * h + 3]  # [G, D]
                want = naive_bound(heads, f.layer.k_min[b, h], f.layer.k_max[b, h]).max()
                torch.testing.assert_close(scores[s, h, p], want, rtol=1e-5, atol=1e-5)
                # An upper bound of every q.k in the page.
                dots = heads @ k[p * bs : min(n, (p + 1) * bs), h].T
                assert dots.max() <= scores[s, h, p] + 1e-4
    shared = R.score_pages(q, f.layer, f.block_tables, f.context_lens, per_kv_head=False)
    assert torch.equal(shared[:, 0], scores.amax(1))


def test_select_pages_structure():
    lens = torch.tensor([16 * 10 - 3, 16 * 2, 16 * 10])
    scores = torch.randn(3, 2, 12)
    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=3)
    sel, n = R.select_pages(scores, lens, 16, pol, max_pages=12)
    assert sel.shape == (3, 2, 6) and n.tolist() == [6, 2, 6]
    for h in range(2):
        row = sel[0, h, :6].tolist()
        assert row == sorted(row) and row[0] == 0 and row[-2:] == [8, 9]
        cand = scores[0, h, 1:8]
        assert set(row[1:4]) == set((cand.topk(3).indices + 1).tolist())
    assert sel[1, 0].tolist() == [0, 1, -1, -1, -1, -1]
    window = kernels.AttentionPolicy("window", n_sink_pages=2, n_local_pages=3)
    sel, n = R.select_pages(None, lens, 16, window, max_pages=12)
    assert sel[0, 0].tolist() == [0, 1, 7, 8, 9] and n.tolist() == [5, 2, 5]


POLICIES = [
    kernels.AttentionPolicy("dense"),
    kernels.AttentionPolicy("window", n_sink_pages=1, n_local_pages=2),
    kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=2),
    kernels.AttentionPolicy("topk", n_sink_pages=0, n_local_pages=1, top_k_pages=1, per_kv_head=False),
]


def _prefill_visible(f, q, start, policy):
    """[N, HQ, ctx] visibility by the rule in the package docstring, with the chunk's
    top-k recomputed from the definition of the bound."""
    layer, bs = f.layer, f.layer.spec.block_size
    n_q, hq, _ = q.shape
    h = layer.spec.n_kv_heads
    group = hq // h
    ctx = start + n_q
    n_pages = math.ceil(ctx / bs)
    q_pos = torch.arange(start, ctx)
    k_pos = torch.arange(ctx)
    vis = (k_pos[None, :] <= q_pos[:, None])[:, None, :].repeat(1, hq, 1)  # [N, HQ, ctx]
    if policy.kind == "dense":
        return vis
    kp, qp = k_pos // bs, q_pos // bs
    allowed = (kp[None, :] < policy.n_sink_pages) | (kp[None, :] > qp[:, None] - policy.n_local_pages)  # [N, ctx]
    allowed = allowed[:, None, :].repeat(1, hq, 1)
    if policy.kind == "topk":
        p_last = (ctx - 1) // bs
        cand = [p for p in range(n_pages) if policy.n_sink_pages <= p < p_last - policy.n_local_pages + 1]
        blocks = f.block_tables[0, :n_pages].long()
        bound = torch.stack([naive_bound(q[:, :, None, :], layer.k_min[blocks].transpose(0, 1)[None].repeat_interleave(group, 1),
                                         layer.k_max[blocks].transpose(0, 1)[None].repeat_interleave(group, 1))])[0]
        # bound [N, HQ, P]: max over the chunk's queries and each kv head's group
        per_kv = bound.amax(0).view(h, group, n_pages).amax(1)  # [H, P]
        if not policy.per_kv_head:
            per_kv = per_kv.amax(0, keepdim=True).expand(h, n_pages)
        for kh in range(h):
            best = sorted(cand, key=lambda p: -float(per_kv[kh, p]))[: policy.top_k_pages]
            for p in best:
                allowed[:, kh * group : (kh + 1) * group, (kp == p)] = True
    return vis & allowed


@pytest.mark.parametrize("kind", ["fp16", "int8", "fp8"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.kind}-{p.per_kv_head}")
@pytest.mark.parametrize("start,n_q", [(0, 13), (53, 30), (90, 1)])
def test_reference_prefill_equals_naive(kind, policy, start, n_q):
    f = fill(spec_of(kind, bs=8), [start + n_q], seed=9)
    q = torch.randn(n_q, 4, D)
    out = torch.full_like(q, float("nan"))
    R.paged_prefill_attention(q, f.layer, f.block_tables[0], start, D**-0.5, policy, out=out)
    k, v = materialize(f, 0)
    want = naive_attention(q, k, v, D**-0.5, _prefill_visible(f, q, start, policy))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_prefill_tiles_never_hold_the_whole_sequence(monkeypatch):
    monkeypatch.setattr(R, "_TILE_BYTES", 1 << 15)
    f = fill(spec_of("fp32", bs=8), [200], seed=10)
    q = torch.randn(40, 2, D)
    seen = []
    real = R.gather_kv
    monkeypatch.setattr(R, "gather_kv", lambda *a: seen.append(a[2].shape[-1]) or real(*a))
    out = R.paged_prefill_attention(q, f.layer, f.block_tables[0], 160, D**-0.5)
    assert len(seen) > 1 and max(seen) < 25  # several tiles, each a fraction of 25 pages
    k, v = materialize(f, 0)
    torch.testing.assert_close(out, naive_attention(q, k, v, D**-0.5, _prefill_visible(f, q, 160, POLICIES[0])),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", POLICIES[1:], ids=lambda p: f"{p.kind}-{p.per_kv_head}")
@pytest.mark.parametrize("kind", ["fp16", "int4"])
def test_decode_policy_equals_one_query_prefill(policy, kind):
    """Decode (select + sparse) and prefill follow one visibility rule."""
    lens = [77, 100]
    f = fill(spec_of(kind, bs=8), lens, seed=11)
    q = torch.randn(2, 4, D)
    dec = kernels.attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5, policy)
    for s, n in enumerate(lens):
        pre = R.paged_prefill_attention(q[s : s + 1], f.layer, f.block_tables[s], n - 1, D**-0.5, policy)
        torch.testing.assert_close(dec[s : s + 1], pre, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_topk_covering_every_page_is_dense(kind):
    f = fill(spec_of(kind, bs=8), [61, 9], seed=12)
    q = torch.randn(2, 4, D)
    everything = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=64)
    dense = R.paged_attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5)
    sparse = kernels.attention_decode(q, f.layer, f.block_tables, f.context_lens, D**-0.5, everything)
    torch.testing.assert_close(sparse, dense, rtol=1e-6, atol=1e-6)
    qc = torch.randn(20, 4, D)
    a = R.paged_prefill_attention(qc, f.layer, f.block_tables[0], 41, D**-0.5, everything)
    b = R.paged_prefill_attention(qc, f.layer, f.block_tables[0], 41, D**-0.5)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_sparse_decode_equals_naive_over_selected_pages():
    f = fill(spec_of("int8", bs=8), [90, 33], seed=13)
    q = torch.randn(2, 4, D)
    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    scores = R.score_pages(q, f.layer, f.block_tables, f.context_lens)
    sel, n = R.select_pages(scores, f.context_lens, 8, pol, max_pages=f.block_tables.shape[1])
    out = R.sparse_attention_decode(q, f.layer, f.block_tables, sel, n, f.context_lens, D**-0.5)
    for s in range(2):
        k, v = materialize(f, s)
        pages = torch.zeros(4, f.block_tables.shape[1], dtype=torch.bool)
        for hq in range(4):
            chosen = sel[s, hq // 2, : int(n[s])].long()
            pages[hq, chosen] = True
        want = naive_attention(q[s : s + 1], k, v, D**-0.5, _decode_visible(f, s, 4, pages))
        torch.testing.assert_close(out[s : s + 1], want, rtol=1e-5, atol=1e-5)


def test_poisoned_pool_is_all_nan_before_writes():
    layer = poisoned_layer(spec_of("fp16"), 2)
    assert torch.isnan(layer.k_pages).all()  # guards the guard: poisoning really happens


# ------------------------------------------------------ division: the same on every device


class _Divisions(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each division's divisor and each reciprocal the reference asks for."""

    def __init__(self):
        super().__init__()
        self.divisors, self.reciprocals = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.div, torch.ops.aten.div_):
            self.divisors.append((args[0], args[1]))
        if func.overloadpacket in (torch.ops.aten.reciprocal, torch.ops.aten.reciprocal_):
            self.reciprocals += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_reference_quantisation_never_divides_by_a_python_number(device):
    """On CUDA, PyTorch turns `tensor / python_number` (or a CPU scalar tensor) into a
    multiply by its fp32 reciprocal, one ulp off a true division in 74% of int8 key scales;
    the Triton kernels and the CPU divide. So every division on the store path must take a
    divisor tensor on the dividend's own device (shown on "meta": a divisor made on the
    CPU would say so), and none may go through reciprocal()."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 16, 2, D, generator=g) * 4).to(device)
    w = torch.rand(2, D, generator=g).to(device)
    with _Divisions() as seen:
        for kind in ("int8", "int4"):
            codes, lo, hi, bits = R.quantize_keys(x, kind, w if kind == "int4" else None)
            if device == "cpu":  # the meta device has no values to unpack
                R.dequantize_keys(codes.transpose(1, 2), lo, hi, kind, bits)
            R.quantize_values(x, kind, 16)
            R.quant_error_bound(kind, lo, hi)
        R.quantize_fp8(x)
    if device == "cpu":  # the whole store path too: seal_torch and the page readers
        for kind in ("fp8", "int8", "int4"):
            layer = kernels.allocate(spec_of(kind), 6, device="cpu")
            k, v = torch.randn(2, 37, 2, D, generator=g)
            with seen:
                R.kv_store(layer, k, v, torch.arange(37))
                R.context_kv(layer, torch.arange(6, dtype=torch.int32), 37)
                R.dequantize_page_keys(layer, torch.arange(2))
    assert seen.divisors and seen.reciprocals == 0
    for num, den in seen.divisors:
        assert isinstance(den, torch.Tensor), f"divides by the Python number {den!r}"
        assert den.device == num.device, f"a {den.device} divisor for a {num.device} tensor"


def test_div_scalar_is_the_true_division_bit_for_bit():
    """The divisor tensor changes nothing on the CPU: the same IEEE quotient as `x / d`
    (the pages written before the change read back unchanged)."""
    g = torch.Generator().manual_seed(9)
    x = torch.cat([torch.randn(100_000, generator=g) * s for s in (1e-38, 1e-3, 1.0, 1e4, 3e38)])
    for d in (15, 255, 448.0, 30, 510, 7.0):
        assert torch.equal(R.div_scalar(x, d).view(torch.int32), (x / d).view(torch.int32))
