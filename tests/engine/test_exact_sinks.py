"""Exact sink pages for remapped window/topk over quantized pages (ktcli.engine.exact_sinks):
the slots, the swap into what attention gathers, and the engine keeping the rows the model
computed."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import AttentionPolicy
from ktcli.engine import longctx, page_groups
from ktcli.engine.backend import SamplingParams
from ktcli.engine.config import ModelConfig
from ktcli.engine.exact_sinks import ExactSinks, overlay_keys, swap_in_
from ktcli.engine.native import NativeBackend
from ktcli.engine.rope import RotaryTable

BS = 16
TOPK = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(11)).tolist()


def load(path, **kw):
    kw.setdefault("weights", "fp32")
    kw.setdefault("attention", TOPK)
    return NativeBackend.load(path, block_size=BS, kv_budget_bytes=32 << 20, prefill_chunk=64, **kw)


def test_slots_taken_at_position_zero_and_reclaimed_from_freed_sequences():
    sinks = ExactSinks(n_layers=2, n_tokens=4, n_kv_heads=1, head_dim=2, n_slots=2, dtype=torch.float32,
                       device=torch.device("cpu"))
    rows = lambda n, x: torch.full((n, 1, 2), float(x))  # noqa: E731
    freed: set[int] = set()
    sinks.store(10, 0, 0, rows(6, 1), rows(6, -1), freed.__contains__)  # 6 rows: the first 4 kept
    sinks.store(20, 1, 0, rows(2, 2), rows(2, -2), freed.__contains__)
    sinks.store(20, 1, 2, rows(5, 3), rows(5, -3), freed.__contains__)  # rows 2-3 of a later chunk
    assert sinks.rows(10, 0)[1].flatten().tolist() == [1.0] * 8
    assert sinks.rows(20, 1)[1][:, 0, 0].tolist() == [2, 2, 3, 3]
    assert sinks.rows(20, 1)[2][:, 0, 0].tolist() == [-2, -2, -3, -3]
    sinks.store(30, 0, 4, rows(1, 9), rows(1, 9), freed.__contains__)  # past the sink: nothing to keep
    sinks.store(30, 0, 0, rows(1, 4), rows(1, 4), freed.__contains__)  # pool full, none freed
    assert sinks.rows(30, 0) is None
    sinks.store(30, 0, 1, rows(1, 4), rows(1, 4), freed.__contains__)  # started without a slot: stays so
    assert sinks.rows(30, 0) is None
    freed.add(10)
    sinks.store(30, 0, 0, rows(1, 5), rows(1, 5), freed.__contains__)
    assert sinks.rows(10, 0) is None and sinks.rows(30, 0)[1][0, 0, 0] == 5
    spec = kernels.KVCacheSpec(n_kv_heads=1, head_dim=2, block_size=4, kv_dtype="int8", stage_dtype="fp32")
    assert 2 * kernels.exact_page_bytes(spec, n_slots=2, n_pages=1) == sinks.k.nbytes + sinks.v.nbytes  # 2 layers


@pytest.mark.parametrize("shared", [False, True])
def test_swap_in_replaces_the_sink_positions_of_every_head(shared):
    pos = torch.tensor([[0, 1, 8, 9, -1], [1, 3, 4, 5, -1]])  # head 1 was not given position 0
    if shared:  # one page set for both heads
        pos = pos[:1].expand(2, 5)
    ek = torch.arange(4 * 2 * 3, dtype=torch.float32).view(4, 2, 3)  # [n_tokens, H, D]

    def swapped(spans):
        k, v = torch.zeros(2, 5, 3), torch.zeros(2, 5, 3)
        swap_in_(spans, k, v, pos, shared)
        return k, v

    got_k, got_v = swapped([(0, ek, -ek)])
    for h in range(2):
        cols = [c for c in range(5) if 0 <= pos[h, c] < 4]
        assert torch.equal(got_k[h, cols], ek[pos[h, cols], h]) and torch.equal(got_v[h, cols], -ek[pos[h, cols], h])
        others = [c for c in range(5) if c not in cols]
        assert not got_k[h, others].any() and not got_v[h, others].any()
    assert torch.equal(swapped([])[0], torch.zeros(2, 5, 3))
    # a span further on (a step's own rows): positions 8-9 only, counted from its first
    own = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 2, 3) + 100
    got_k, _ = swapped([(0, ek, -ek), (8, own, own)])
    assert torch.equal(got_k[0, 2:4], own[:, 0]) and not got_k[:, 4].any()
    if not shared:
        assert not got_k[1, 2:].any()


def test_overlay_writes_each_span_at_its_positions_within_the_context():
    spans = [(0, torch.ones(2, 1, 2), torch.ones(2, 1, 2)), (4, torch.full((3, 1, 2), 5.0), torch.full((3, 1, 2), 7.0))]
    k, v = torch.zeros(6, 1, 2), torch.zeros(6, 1, 2)
    overlay_keys(spans, k, 0, v)
    assert k[:, 0, 0].tolist() == [1, 1, 0, 0, 5, 5]  # the span's third row lies past the context
    assert v[:, 0, 0].tolist() == [1, 1, 0, 0, 7, 7]
    part = torch.zeros(3, 1, 2)  # positions 1..3 of the same context: each span's overlap only
    overlay_keys(spans, part, 1)
    assert part[:, 0, 0].tolist() == [1, 0, 0]
    part = torch.zeros(2, 1, 2)  # positions 5..6
    overlay_keys(spans, part, 5)
    assert part[:, 0, 0].tolist() == [5, 5]


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("n_q,start", [(1, 82), (6, 64 + 2)])  # one page: a sparse group
@pytest.mark.parametrize("cpp_gather", [True, False])
def test_virtual_plan_reads_the_exact_rows_at_sink_positions_only(kind, n_q, start, cpp_gather, monkeypatch):
    if not cpp_gather:  # the torch gather (kernels.reference.gather_kv) instead of cpu_kivi_attention's
        monkeypatch.setattr(page_groups, "_gathers_here", lambda layer: False)
    cfg = ModelConfig("llama", 10, 32, 32, 1, n_heads=4, n_kv_heads=2, head_dim=16, rms_eps=1e-6, max_position=64,
                      rope={"rope_type": "default", "rope_theta": 10000.0})
    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=3)
    cache = longctx.KernelKVCache(cfg, longctx.LongContextOptions(kv_dtype=kind, policy=policy, position_remap=True,
                                                                  block_size=8))
    cache.allocate(16)
    cache.rope = RotaryTable(cfg.rope, 16, 64)
    layer, bs = cache.layers[0], 8
    torch.manual_seed(0)
    ctx = start + n_q
    table = torch.randperm(16)[: math.ceil(ctx / bs)].to(torch.int32)
    k, v = torch.randn(ctx, 2, 16) * 3, torch.randn(ctx, 2, 16) * 3
    slots = table.long()[torch.arange(ctx) // bs] * bs + torch.arange(ctx) % bs
    kernels.kv_store(layer, k, v, slots)
    q = torch.randn(n_q, 4, 16)
    qk, qv, kpos, qpos, lead = page_groups.virtual_plan(q, layer, table, start, policy)
    sk, sv, skpos, sqpos, slead = page_groups.virtual_plan(q, layer, table, start, policy, exact=[(0, k[:bs], v[:bs])])
    assert torch.equal(kpos, skpos) and torch.equal(qpos, sqpos) and torch.equal(lead, slead)
    # page 0 is first in document order: columns 0..bs-1, virtual = true positions
    torch.testing.assert_close(sk[:, :bs], k[:bs].transpose(0, 1))
    torch.testing.assert_close(sv[:, :bs], v[:bs].transpose(0, 1))
    assert not torch.allclose(qk[:, :bs], sk[:, :bs])  # the quantized copy differs
    assert torch.equal(sk[:, bs:], qk[:, bs:]) and torch.equal(sv[:, bs:], qv[:, bs:])


def test_engine_keeps_the_rows_the_model_stored(llama, ids):
    """Layer 0's keys come from the embeddings alone, so an fp32 load stores the same first
    page: int4 topk's exact sink equals it, where its int4 page does not."""
    exact = load(llama, kv_dtype="int4")
    plain = load(llama, kv_dtype="fp32")
    assert exact.kv.sinks is not None and plain.kv.sinks is None  # float pages need none
    tables = {}
    for name, b in (("int4", exact), ("fp32", plain)):
        real = b.kv._begin_step

        def spy(step, real=real, name=name, b=b):
            real(step)
            tables[name] = b.kv._tables[0].clone()

        b.kv._begin_step = spy
        b.engine.prompt_logits(ids)
    first = int(tables["int4"][0])
    _, ek, ev = exact.kv.sinks.rows(first, 0)
    sel = torch.zeros(1, exact.kv.n_kv_heads, 1, dtype=torch.int32)  # logical page 0
    pk, pv, _ = kernels.reference.gather_kv(plain.kv.layers[0], tables["fp32"][None], sel, torch.tensor([len(ids)]))
    qk, _, _ = kernels.reference.gather_kv(exact.kv.layers[0], tables["int4"][None], sel, torch.tensor([len(ids)]))
    torch.testing.assert_close(ek, pk[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ev, pv[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    assert (qk[0].transpose(0, 1) - ek).abs().max() > 1e-3


def test_memory_counts_the_sink_pool_where_it_applies(llama):
    with_sinks = load(llama, kv_dtype="int4")
    without = load(llama, kv_dtype="int4", exact_sinks=False)
    kv = with_sinks.kv
    pool = kv.n_layers * kernels.exact_page_bytes(kv.spec, kv.options.n_stage, n_pages=1)
    assert with_sinks.kv.fixed_bytes - without.kv.fixed_bytes == pool
    assert without.kv.sinks is None and kv.sinks.k.nbytes + kv.sinks.v.nbytes == pool
    assert load(llama, kv_dtype="int4", attention="dense").kv.sinks is None  # dense reads every page as stored


def test_batched_sequences_keep_their_own_sinks(llama, ids):
    """Two prompts in one batch answer as each does alone (each sequence its own slot), and
    the answers differ from reading the sinks quantized."""
    b = load(llama, kv_dtype="int4")
    params = SamplingParams(max_new_tokens=6)
    other = list(reversed(ids[:120]))
    alone = [b.generate_ids([p], params)[0] for p in (ids, other)]
    assert b.generate_ids([ids, other], params) == alone
    logits = b.prompt_logits(ids)
    quantized = load(llama, kv_dtype="int4", exact_sinks=False).prompt_logits(ids)
    assert not torch.allclose(logits, quantized, atol=1e-4)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_planner_counts_the_fixed_bytes_a_sparse_load_allocates(llama, kind):
    from ktcli.plan.estimates import paged_fixed_bytes
    from ktcli.types import ModelFacts

    # A one-request load (`ktcli ask`), as the planner assumes; `ktcli serve`'s has more staging slots.
    b = NativeBackend.load(llama, weights="fp32", kv_budget_bytes=32 << 20, kv_dtype=kind, attention="topk", kv_windows=1)
    kv = b.kv
    facts = ModelFacts("tiny", 256, kv.n_layers, kv.n_kv_heads, kv.head_dim, 0, 0)
    assert kv.sinks is not None and paged_fixed_bytes(facts, kind) == kv.fixed_bytes
    served = NativeBackend.load(llama, weights="fp32", kv_budget_bytes=32 << 20, kv_dtype=kind, attention="topk").kv
    assert served.fixed_bytes == paged_fixed_bytes(facts, kind, n_stage=32) > kv.fixed_bytes


@pytest.mark.parametrize("attention", [TOPK, AttentionPolicy("window", n_sink_pages=1, n_local_pages=2)],
                         ids=["topk", "window"])
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_prompt_in_one_chunk_reads_none_of_its_rows_quantized(llama, ids, attention, kind):
    """Under remapped positions a step attends to its own rows as computed, not as read
    back from the pages it has just written: a prompt that fits one prefill chunk gets
    fp32's logits exactly, one that takes two does not (its second chunk reads the first
    from the pages). Dense attention reads the pages as the kernels do."""
    ref, quant = load(llama, kv_dtype="fp32", attention=attention), load(llama, kv_dtype=kind, attention=attention)
    one = ids[:60]  # prefill_chunk 64
    torch.testing.assert_close(quant.engine.prompt_logits(one), ref.engine.prompt_logits(one), atol=2e-5, rtol=1e-5)
    two = ids[:120]
    assert (quant.engine.prompt_logits(two) - ref.engine.prompt_logits(two)).abs().max() > 1e-3
    dense, dense_ref = (load(llama, kv_dtype=k, attention="dense") for k in (kind, "fp32"))
    assert (dense.engine.prompt_logits(one) - dense_ref.engine.prompt_logits(one)).abs().max() > 1e-3
