"""Long context in the engine (ktcli.engine.longctx): quantized pages, attention policies
and InfLLM-style positions, on tiny random models (fast) against the SDPA path and
against plain-torch oracles restricted to the selected positions."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import AttentionPolicy
from kernels.reference import chunk_page_plan, gather_kv
from ktcli.engine import longctx, page_groups
from ktcli.engine.config import ModelConfig
from ktcli.engine.native import NativeBackend
from ktcli.engine.rope import RotaryTable
from ktcli.errors import InputError

BS = 16


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def reference(llama, ids):
    return NativeBackend.load(llama, weights="fp32", block_size=BS, kv_budget_bytes=8 << 20).prompt_logits(ids)


def load(path, **kw):
    kw.setdefault("prefill_chunk", 64)
    kw.setdefault("weights", "fp32")  # the reference's weights
    return NativeBackend.load(path, block_size=BS, kv_budget_bytes=32 << 20, **kw)


@pytest.mark.parametrize("policy,remap", [
    (AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=64), False),  # k covers every page
    (AttentionPolicy("window", n_sink_pages=1, n_local_pages=64), False),  # window covers everything
    (AttentionPolicy("window", n_sink_pages=1, n_local_pages=64), True),  # every key local: true distances
    # Every page selected: compact virtual positions are the true positions.
    (AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=64), True),
    (AttentionPolicy("window", n_sink_pages=64, n_local_pages=1), True),
])
def test_policies_covering_every_page_equal_dense(llama, ids, reference, policy, remap):
    got = load(llama, attention=policy, position_remap=remap).prompt_logits(ids)
    torch.testing.assert_close(got, reference, atol=2e-4, rtol=1e-4)


def test_keys_stored_before_rope_when_asked_or_remapped():
    opts = longctx.LongContextOptions
    assert not opts(kv_dtype="int4").keys_unroped and opts(kv_dtype="int4", unroped_keys=True).keys_unroped
    assert opts(kv_dtype="int8", policy=AttentionPolicy("topk"), position_remap=True).keys_unroped


@pytest.mark.parametrize("policy", [
    kernels.reference.DENSE,  # the CPU's flat path: RoPE on the dequantised context
    AttentionPolicy("window", n_sink_pages=1, n_local_pages=2),  # true positions through _remapped
    AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=64),
])
def test_keys_stored_before_rope_leave_attention_unchanged(llama, ids, policy):
    """Unroped keys get RoPE at their true positions when read: on fp32 pages prefill
    logits and greedy tokens equal those of keys stored rotated, for any policy."""
    from ktcli.engine.backend import SamplingParams

    plain = load(llama, attention=policy, position_remap=False, unroped_keys=False)
    unroped = load(llama, attention=policy, position_remap=False, unroped_keys=True)
    assert unroped.kv.options.keys_unroped  # plain: rotated keys (dense fp32: the SDPA path's cache)
    torch.testing.assert_close(unroped.prompt_logits(ids), plain.prompt_logits(ids), atol=2e-4, rtol=1e-4)
    params = SamplingParams(max_new_tokens=8)
    assert unroped.generate_ids([ids], params) == plain.generate_ids([ids], params)


# A dequantised value is off by at most half a code step of its group's range; logits
# move by a small multiple of that relative step (measured ~1-2x on the tiny model).
STEP = {"fp8": 2.0**-4, "int8": 1 / 255, "int4": 1 / 15}


@pytest.mark.parametrize("kind", ["fp8", "int8", "int4"])
def test_quantized_logits_close_to_fp32(llama, ids, reference, kind):
    got = load(llama, kv_dtype=kind).prompt_logits(ids)
    rel = float((got - reference).norm() / reference.norm())
    assert rel <= 4 * STEP[kind], (kind, rel)
    if kind == "int8":  # a random tiny model's logits are flat: only int8 keeps every argmax
        assert got.argmax(-1).eq(reference.argmax(-1)).float().mean() > 0.95


def test_sparse_decode_generates_and_summaries_bound_keys(llama, ids):
    b = load(llama, kv_dtype="int4", attention="topk")
    from ktcli.engine.backend import SamplingParams

    out = b.generate_ids([ids[:120]], SamplingParams(max_new_tokens=5))
    assert len(out[0]) == 5
    # Prefill only (pages kept): every stored key lies inside its page's [k_min, k_max].
    seq_ids = ids[:128]
    table = []
    b.engine.blocks.grow(table, len(seq_ids))
    from ktcli.engine.runner import Sequence

    s = Sequence(999, list(seq_ids), len(seq_ids), 0, block_table=table)
    step, _ = b.engine._build_step([(s, len(seq_ids))], all_rows=True)
    b.engine.model.forward(torch.tensor(seq_ids), step)
    layer = b.kv.layers[1]
    pages = torch.arange(len(table)).view(1, 1, -1).expand(1, layer.spec.n_kv_heads, -1)
    k, _, pos = gather_kv(layer, torch.tensor([table]), pages, torch.tensor([len(seq_ids)]))
    k = k[0].view(layer.spec.n_kv_heads, len(table), BS, -1)  # [H, P, BS, D]
    lo = layer.k_min[torch.tensor(table)].transpose(0, 1)[:, :, None].float()  # [H, P, 1, D]
    hi = layer.k_max[torch.tensor(table)].transpose(0, 1)[:, :, None].float()
    slack = 1e-5 * (lo.abs() + hi.abs() + 1)
    assert bool(((k >= lo - slack) & (k <= hi + slack)).all())
    b.engine.blocks.free(table)


def _cache(policy, n_blocks=16, kind="fp32", head_dim=16):
    cfg = ModelConfig("llama", 10, 32, 32, 1, n_heads=4, n_kv_heads=2, head_dim=head_dim, rms_eps=1e-6, max_position=64,
                      rope={"rope_type": "default", "rope_theta": 10000.0})
    cache = longctx.KernelKVCache(cfg, longctx.LongContextOptions(kv_dtype=kind, policy=policy, position_remap=True,
                                                                  block_size=8))
    cache.allocate(n_blocks)
    cache.rope = RotaryTable(cfg.rope, head_dim, 64)
    return cache


def _rot(cache, x, pos):
    """RoPE of x [..., D] at integer positions pos [...] (oracle: explicit angles)."""
    freq, _ = __import__("ktcli.engine.rope", fromlist=["inv_freq"]).inv_freq(cache.cfg.rope, 16, 64)
    ang = pos[..., None].double() * freq.double()
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], 8, 2).contiguous())
    return torch.view_as_real(xc * torch.polar(torch.ones_like(ang), ang)).reshape(x.shape)


@pytest.mark.parametrize("kind,n_q,start,extra", [
    ("topk", 1, 82, None), ("topk", 5, 78, None), ("topk", 19, 64 + 3, None), ("window", 1, 82, None),
    ("window", 12, 70, None), ("dense", 7, 76, None),
    # pages the question chose, on top of the policy's own
    ("topk", 1, 82, [2, 5]), ("topk", 19, 64 + 3, [1, 3, 4]), ("window", 12, 70, [3]),
])
@pytest.mark.parametrize("cpp_softmax", [True, False])
def test_remapped_attention_equals_oracle_on_virtual_positions(kind, n_q, start, extra, cpp_softmax, monkeypatch):
    if not cpp_softmax:  # the masked torch softmax that runs off the CPU
        monkeypatch.setattr(page_groups.prefill_attention, "causal_softmax_kernel", lambda: None)
    elif page_groups.prefill_attention.causal_softmax_kernel() is None:
        pytest.skip("the C++ extension is not built here")
    torch.manual_seed(0)
    policy = AttentionPolicy("topk" if kind == "dense" else kind, n_sink_pages=1, n_local_pages=2, top_k_pages=3)
    layer_policy = kernels.reference.DENSE if kind == "dense" else policy
    cache = _cache(policy)
    layer, bs = cache.layers[0], 8
    ctx = start + n_q
    table = torch.randperm(16)[: math.ceil(ctx / bs)].to(torch.int32)
    k, v = torch.randn(ctx, 2, 16), torch.randn(ctx, 2, 16)
    slots = table.long()[torch.arange(ctx) // bs] * bs + torch.arange(ctx) % bs
    kernels.kv_store(layer, k, v, slots)
    q = torch.randn(n_q, 4, 16)
    extra = None if extra is None else torch.tensor(extra, dtype=torch.int32)
    out = cache._remapped(q, layer, table, start, layer_policy, ctx, extra)

    for i in range(n_q):
        qi = start + i
        # The query's group: its page (the whole call for a dense layer), planned with
        # the group's own queries.
        g0, g1 = (start, ctx) if kind == "dense" else (max(start, qi // bs * bs), min(ctx, (qi // bs + 1) * bs))
        pages, local_only, _ = chunk_page_plan(q[g0 - start : g1 - start], layer, table, g0, layer_policy, extra)
        lo = 0 if kind == "dense" else max(0, qi // bs - policy.n_local_pages + 1)
        for h in range(2):
            row = min(h, pages.shape[0] - 1)
            vis = {int(p) for p, only in zip(pages[row], local_only[row]) if p >= 0 and (not only or p >= lo)}
            keys = [j for j in range(g1) if j // bs in vis]  # the group's keys, document order
            vq = keys.index(qi)  # virtual positions: ranks in this list
            for g in range(2):
                hq = h * 2 + g
                qr = _rot(cache, q[i, hq], torch.tensor(vq))
                logits = torch.stack([qr @ _rot(cache, k[j, h], torch.tensor(r)) for r, j in enumerate(keys[: vq + 1])])
                p = torch.softmax(logits * 16**-0.5, 0)
                want = (p[:, None] * v[keys[: vq + 1], h].double()).sum(0)
                torch.testing.assert_close(out[i, hq].double(), want, atol=1e-4, rtol=1e-4)
            if kind != "dense":  # distances stay inside sinks + top-k + question + local pages
                n_extra = 0 if extra is None else extra.numel()
                assert vq < (policy.n_sink_pages + policy.top_k_pages + n_extra + policy.n_local_pages) * bs
        if extra is not None and kind != "dense":  # every question page is visible
            assert set(extra.tolist()) <= {int(p) for p in pages[0] if p >= 0}


@pytest.mark.parametrize("block_scores", [None, 40])  # one block; blocks of a few queries
def test_attend_columns_sees_a_causal_prefix_of_columns_per_head(block_scores, monkeypatch):
    """Query i of a group sees columns 0 .. lead[h] + i of its head: the C++ softmax and the
    masked torch path both equal explicit softmax attention over those columns."""
    if block_scores:
        monkeypatch.setattr(page_groups.prefill_attention, "BLOCK_SCORES", block_scores)
    torch.manual_seed(3)
    heads, group, n, width, d = 3, 2, 5, 13, 8
    q, k, v = torch.randn(heads, group * n, d), torch.randn(heads, width, d), torch.randn(heads, width, d)
    lead = torch.tensor([8, 0, 5])  # per head: heads see different column counts
    want = torch.empty(heads, group * n, d, dtype=torch.float64)
    for h in range(heads):
        for g in range(group):
            for i in range(n):
                seen = int(lead[h]) + i + 1
                p = torch.softmax(q[h, g * n + i].double() @ k[h, :seen].double().T * 0.3, 0)
                want[h, g * n + i] = p @ v[h, :seen].double()
    got = page_groups.attend_columns(q, k, v, lead, n, 0.3)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(page_groups.prefill_attention, "causal_softmax_kernel", lambda: None)
    torch.testing.assert_close(page_groups.attend_columns(q, k, v, lead, n, 0.3).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind,per_kv_head", [("topk", True), ("topk", False), ("window", True)])
@pytest.mark.parametrize("start,n_q,extra", [(0, 61, None), (40, 45, None), (83, 50, [2, 4, 11]), (96, 1, [3]),
                                             (127, 1, None), (148, 4, [3, 9, 18]),  # one group: a decode step
                                             (5, 1, None), (17, 1, [0, 1, 2])])  # fewer pages than sinks + local
@pytest.mark.parametrize("cpp", [True, False])  # one group: cpu_kivi_attention.page_plan, or the torch ops
def test_group_page_plans_equal_chunk_page_plan_per_group(kind, per_kv_head, start, n_q, extra, cpp, monkeypatch):
    """The chunk's one-pass plan gives each one-page group the pages `chunk_page_plan`
    gives it alone (a random layer, so top-k picks a few of many pages)."""
    from ktcli.engine import cpu_kivi_attention

    ran = []
    real = cpu_kivi_attention.page_plan
    monkeypatch.setattr(cpu_kivi_attention, "page_plan", lambda *a: None if not cpp else ran.append(1) or real(*a))
    torch.manual_seed(start + n_q)
    policy = AttentionPolicy(kind, n_sink_pages=1, n_local_pages=2, top_k_pages=3, per_kv_head=per_kv_head)
    cache = _cache(policy, n_blocks=20, kind="int8")
    layer, bs = cache.layers[0], 8
    ctx = start + n_q
    table = torch.randperm(20)[: math.ceil(ctx / bs)].to(torch.int32)
    slots = table.long()[torch.arange(ctx) // bs] * bs + torch.arange(ctx) % bs
    kernels.kv_store(layer, torch.randn(ctx, 2, 16) * torch.rand(ctx, 1, 1) * 4, torch.randn(ctx, 2, 16), slots)
    q = torch.randn(n_q, 4, 16)
    extra = None if extra is None else torch.tensor(extra, dtype=torch.int32)
    plans = page_groups.group_page_plans(q, layer, table, start, policy, extra)
    bounds = [(max(start, g * bs), min(ctx, (g + 1) * bs)) for g in range(start // bs, (ctx - 1) // bs + 1)]
    assert len(plans) == len(bounds)
    for plan, (a, b) in zip(plans, bounds):
        want, _, _ = chunk_page_plan(q[a - start : b - start], layer, table, a, policy, extra)
        assert torch.equal(plan, want), (a, b, plan, want)
    if cpp and len(bounds) == 1 and cpu_kivi_attention.available():
        assert ran  # the C++ plan was the one compared


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("n_q,start,extra,head_dim", [
    (1, 82, [2, 5], 16), (19, 64 + 3, None, 16),
    # head_dim 64: a decode step takes cpu_kivi_attention.remapped_decode (one pass, no
    # gathered rows), after a sealed last page, one staged row, several staged rows
    (1, 87, [2, 5], 64), (1, 88, None, 64), (1, 100, [3, 4, 9], 64),
])
def test_remapped_attention_through_the_cpp_gather_equals_the_torch_gather(kind, n_q, start, extra, head_dim,
                                                                           monkeypatch):
    """int8/int4 pages on the CPU: the C++ gather (exact rows copied in, keys rotated as they
    are written) and the fused decode give the attention the torch gather, swap_in_ and
    rotation give."""
    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=3)
    cache = _cache(policy, kind=kind, head_dim=head_dim)
    layer, bs = cache.layers[0], 8
    if not page_groups._gathers_here(layer):
        pytest.skip("the C++ extension is not built here")
    torch.manual_seed(start + n_q)
    ctx = start + n_q
    table = torch.randperm(16)[: math.ceil(ctx / bs)].to(torch.int32)
    k, v = torch.randn(ctx, 2, head_dim) * 2, torch.randn(ctx, 2, head_dim)
    slots = table.long()[torch.arange(ctx) // bs] * bs + torch.arange(ctx) % bs
    kernels.kv_store(layer, k, v, slots)
    q = torch.randn(n_q, 4, head_dim)
    extra = None if extra is None else torch.tensor(extra, dtype=torch.int32)
    exact = [(0, k[:bs], v[:bs]), (start, k[start:], v[start:])]  # the sink, the step's own rows
    fused = []
    real = page_groups.cpu_kivi_attention.remapped_decode
    monkeypatch.setattr(page_groups.cpu_kivi_attention, "remapped_decode", lambda *a: fused.append(1) or real(*a))
    got = cache._remapped(q, layer, table, start, policy, ctx, extra, exact=exact)
    assert len(fused) == (n_q == 1 and head_dim == 64)
    monkeypatch.setattr(page_groups, "_gathers_here", lambda layer: False)
    want = cache._remapped(q, layer, table, start, policy, ctx, extra, exact=exact)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_virtual_plan_refuses_a_sparse_group_over_two_pages():
    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=3)
    cache = _cache(policy)
    table = torch.arange(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="one page at most"):
        page_groups.virtual_plan(torch.randn(4, 4, 16), cache.layers[0], table, 6, policy)


def test_question_pages_find_the_page_one_head_attends_to():
    """A page whose keys match the question in one head of one layer, among noise: its
    z-scored attention mass is the highest, it is chosen, and layers fold in by max."""
    torch.manual_seed(1)
    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    cache = _cache(policy, n_blocks=16)
    bs, ctx = 8, 100
    table = torch.randperm(16)[: math.ceil(ctx / bs)].to(torch.int32)
    slots = table.long()[torch.arange(ctx) // bs] * bs + torch.arange(ctx) % bs
    q = torch.randn(6, 4, 16)
    k = torch.randn(ctx, 2, 16) * 0.3
    needle_page = 5
    k[needle_page * bs : needle_page * bs + 3, 1] = 4 * q[:, 2:].mean((0, 1))  # kv head 1 only
    layer0, layer1 = cache.layers[0], kernels.allocate(cache.spec, 16, torch.device("cpu"), 4)  # a second layer
    kernels.kv_store(layer0, torch.randn(ctx, 2, 16) * 0.3, torch.randn(ctx, 2, 16), slots)  # noise only
    kernels.kv_store(layer1, k, torch.randn(ctx, 2, 16), slots)
    pages = longctx.QuestionPages(3, policy)
    pages.observe(q, layer0, table, ctx, 0.25)
    first = pages.score.clone()
    pages.observe(q, layer1, table, ctx, 0.25)
    assert int(pages.chosen[0]) == needle_page  # the best page first
    assert pages.chosen.numel() == 3
    n_pages = math.ceil(ctx / bs)
    assert bool((pages.chosen >= 1).all()) and bool((pages.chosen < n_pages - 2).all())  # candidates only
    assert bool((pages.score >= first).all())  # a running max over layers
    # z of one outlier among n = 10 candidates is at most sqrt(n - 1) = 3
    assert float(pages.score[needle_page]) > 2.5


@pytest.mark.parametrize("kind", ["fp32", "int8", "int4"])
def test_question_page_mass_in_blocks_matches_one_softmax_over_the_context(kind, monkeypatch):
    """QuestionPages reads the context a block of pages at a time (its fp32 keys and scores
    at 68K tokens took ~0.5 GB at once): the per-page mass must be that of one softmax over
    every key, the staged tail page and exact rows included."""
    from kernels.reference import context_kv
    from ktcli.engine.exact_sinks import overlay_keys

    torch.manual_seed(3)
    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    cache = _cache(policy, n_blocks=16, kind=kind)
    bs, ctx = 8, 101  # 13 pages, the last one partial (staged for quantized kinds)
    table = torch.randperm(16)[: math.ceil(ctx / bs)].to(torch.int32)
    slots = table.long()[torch.arange(ctx) // bs] * bs + torch.arange(ctx) % bs
    layer = cache.layers[0]
    kernels.kv_store(layer, torch.randn(ctx, 2, 16), torch.randn(ctx, 2, 16), slots)
    exact = [(0, torch.randn(8, 2, 16), torch.randn(8, 2, 16)), (93, torch.randn(8, 2, 16), torch.randn(8, 2, 16))]
    qg = torch.randn(2, 6, 16)
    k, v = context_kv(layer, table, ctx)
    overlay_keys(exact, k, 0, v)
    probs = torch.nn.functional.pad(torch.bmm(qg, k.permute(1, 2, 0)).mul(0.25).softmax(-1), (0, 13 * bs - ctx))
    want = probs.view(2, 6, 13, bs).sum(-1).mean(1)
    pages = longctx.QuestionPages(3, policy)
    for block in (3, 5, 128):  # blocks that split the context unevenly, and one block
        monkeypatch.setattr(longctx.QuestionPages, "BLOCK_PAGES", block)
        got = pages._page_mass(qg, layer, table, ctx, 0.25, exact)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_question_pages_replay_the_prompt_end_with_the_final_choice(llama, ids, monkeypatch):
    """The prompt's last chunk runs twice: the second pass, and every decode step, read the
    pages the question chose over all layers, as if they had been known from the start."""
    from ktcli.engine.backend import SamplingParams

    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=1)
    prompt, params = ids[:140], SamplingParams(max_new_tokens=6)
    b = load(llama, attention=policy)
    replays = []
    real_replay = longctx.KernelKVCache.replay
    monkeypatch.setattr(longctx.KernelKVCache, "replay",
                        lambda self, step: replays.append(real_replay(self, step)) or replays[-1])
    got = b.generate_ids([prompt], params)[0]
    assert replays.count(True) == 1  # the last prefill chunk, not the other chunks or decode steps
    (entry,) = b.kv._question.values()
    chosen = entry.chosen.clone()
    assert chosen.numel() == longctx.LongContextOptions.question_pages or chosen.numel() == math.ceil(140 / BS) - 2

    # The same run with the final choice forced at the last chunk and every decode step.
    monkeypatch.setattr(longctx.KernelKVCache, "replay", lambda self, step: False)

    def forced(self, li, q, layer, table, ctx, observe, sink=None):
        return chosen if ctx >= len(prompt) else None

    monkeypatch.setattr(longctx.KernelKVCache, "_question_pages", forced)
    want = load(llama, attention=policy).generate_ids([prompt], params)[0]
    assert got == want


@pytest.mark.parametrize("kind,chunk", [("fp32", 64), ("int8", 64), ("fp32", 60), ("int8", 60)])
def test_replay_leaves_the_pages_of_a_run_that_knew_the_choice(llama, ids, monkeypatch, kind, chunk):
    """After the replay every stored page equals those of an engine that used the final
    page choice from the start. Exception: quantized pages keep the first pass's rows
    before the last chunk's first page boundary (chunk 60 starts the last chunk at 120,
    mid-page 7), which must still be finite, never a stale staging slot."""
    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=1)
    prompt = ids[:150]
    tables = []
    real_begin = longctx.KernelKVCache._begin_step

    def spy(self, step):
        real_begin(self, step)
        tables.append(self._tables[0].clone())

    monkeypatch.setattr(longctx.KernelKVCache, "_begin_step", spy)

    def pages_after(engine):
        engine.prompt_logits(prompt)
        table = tables[-1]
        n = table.numel()
        out = []
        for layer in engine.kv.layers:
            sel = torch.arange(n, dtype=torch.int32).view(1, 1, -1).expand(1, layer.spec.n_kv_heads, -1)
            k, v, pos = gather_kv(layer, table[None], sel, torch.tensor([len(prompt)]))
            out.append((k[0], v[0]))
        return out

    a = load(llama, attention=policy, kv_dtype=kind, prefill_chunk=chunk)
    got = pages_after(a)
    (entry,) = a.kv._question.values()
    chosen = entry.chosen.clone()
    monkeypatch.setattr(longctx.KernelKVCache, "replay", lambda self, step: False)
    monkeypatch.setattr(longctx.KernelKVCache, "_question_pages",
                        lambda self, li, q, layer, table, ctx, observe, sink=None: chosen if ctx >= len(prompt) else None)
    want = pages_after(load(llama, attention=policy, kv_dtype=kind, prefill_chunk=chunk))
    kept = (120 // BS) if (kind == "int8" and chunk == 60) else None
    for (gk, gv), (wk, wv) in zip(got, want):
        gk, gv, wk, wv = (x.view(x.shape[0], -1, BS, x.shape[-1]) for x in (gk, gv, wk, wv))  # [H, P, BS, D]
        assert torch.isfinite(gk).all() and torch.isfinite(gv).all()
        if kept is not None:
            gk, gv, wk, wv = (torch.cat([x[:, :kept], x[:, kept + 1 :]], 1) for x in (gk, gv, wk, wv))
        torch.testing.assert_close(gk, wk, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gv, wv, atol=1e-5, rtol=1e-5)


def test_rope_scaling_parse_and_window():
    cfg = ModelConfig("llama", 10, 32, 32, 1, 4, 2, 16, 1e-6, 8192, rope={"rope_type": "default", "rope_theta": 1e4})
    params = longctx.parse_rope_scaling("yarn:4", cfg)
    assert params == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    from dataclasses import replace

    assert replace(cfg, rope={**cfg.rope, **params}).window == 32768 and cfg.window == 8192
    for bad in ("magic:2", "linear:x", "linear:0.5"):
        with pytest.raises(InputError):
            longctx.parse_rope_scaling(bad, cfg)


def test_rope_scaling_in_the_config_sets_the_window(tiny_models, tmp_path):
    # A Qwen2.5 config with YaRN x4 was run and planned at its unscaled 512 positions.
    from tests.engine.conftest import build_tiny

    from ktcli.engine.model_store import ModelSource, model_facts

    folder = build_tiny("qwen2", tmp_path / "yarn", rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512})
    assert NativeBackend.load(folder, weights="fp32", kv_budget_bytes=8 << 20).context_window == 2048
    assert model_facts(ModelSource("yarn", "hf", folder), tmp_path).context_window == 2048


def test_rope_scaled_engine_runs_past_the_trained_window(tiny_models):
    # tiny llama is trained for 512 positions; linear:2 stretches it to 1024.
    b = load(tiny_models["llama"], rope_scaling="linear:2")
    assert b.context_window == 1024
    logits = b.prompt_logits([i % 256 for i in range(1, 700)])
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("kv_windows", [None, 1])  # the plain engine; the kernels' pages
def test_dynamic_ntk_uses_one_base_whatever_the_chunks(tiny_models, tmp_path, kv_windows):
    """One base, the scaled window's (512 x 2), as vLLM: rebuilt per chunk from the step's
    length, a 900-token prompt's logits depended on --prefill-chunk (argmax 186 vs 75)."""
    from transformers import AutoModelForCausalLM

    from tests.engine.conftest import build_tiny

    ids = torch.randint(0, 256, (1024,), generator=torch.Generator().manual_seed(5)).tolist()
    extra = {"kv_windows": kv_windows} if kv_windows else {}
    logits = [load(tiny_models["llama"], rope_scaling="dynamic:2", prefill_chunk=chunk, **extra).prompt_logits(ids)
              for chunk in (64, 1024)]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    # transformers at the scaled window's length computes that same base
    dyn = build_tiny("llama", tmp_path / "dyn", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                                 "factor": 2.0})
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(str(dyn), dtype=torch.float32).eval()(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits[1], want, rtol=1e-3, atol=1e-3)


def test_attention_spec_sets_the_page_counts():
    assert longctx.make_policy("topk").top_k_pages == 8
    assert longctx.make_policy("topk:16").top_k_pages == 16
    assert longctx.make_policy("window:6").n_local_pages == 6
    for bad in ("topk:x", "topk:0", "dense:4", "sparse"):
        with pytest.raises(InputError):
            longctx.make_policy(bad)


def test_finished_sequences_give_back_their_staging_slots(llama):
    """Each finished sequence leaves its partial page in a staging slot. More sequences
    than the pool holds run one after another, and the reclaim (run by `_begin_step`
    once the pool is low) frees every slot whose block the block manager has freed, in
    every layer."""
    from ktcli.engine.backend import SamplingParams

    rng = torch.Generator().manual_seed(3)
    params = SamplingParams(max_new_tokens=2)
    b = load(llama, kv_dtype="int8")
    n_stage = b.kv.options.n_stage
    for i in range(n_stage + 8):  # lengths vary, so partial pages land on different blocks
        prompt = torch.randint(0, 256, (BS * (1 + i % 3) + 5,), generator=rng).tolist()
        list(b.engine.generate([prompt], params, frozenset()))  # tokens only: no tokenizer here

    def stale(layer):
        owners = layer.block_of_stage[layer.block_of_stage >= 0].tolist()
        return [o for o in owners if b.kv.blocks.is_free(o)]

    assert all(stale(layer) for layer in b.kv.layers)  # the last sequence's partial page at least
    b.kv._reclaim_staging(need=n_stage)  # what _begin_step does when free slots run low
    assert not any(stale(layer) for layer in b.kv.layers)
    assert all(int((layer.block_of_stage < 0).sum()) == n_stage for layer in b.kv.layers)


def test_a_batch_larger_than_the_staging_pool_runs(llama):
    """Each running sequence keeps a partial page in a staging slot, a prefill step a
    chunk's pages more: 40 prompts at once (serve --max-batch 40) failed every one with
    "KV staging pool exhausted". The engine admits what the pool holds; the rest wait."""
    from ktcli.engine.backend import SamplingParams

    rng = torch.Generator().manual_seed(5)
    b = load(llama, kv_dtype="int8", kv_windows=4)
    chunk_pages = -(-64 // BS)
    assert b.engine.max_batch == b.kv.options.n_stage - chunk_pages - 1
    prompts = [torch.randint(0, 256, (20 + i % 30,), generator=rng).tolist() for i in range(40)]
    out = list(b.engine.generate(prompts, SamplingParams(max_new_tokens=4), frozenset()))
    assert sorted({i for i, _ in out}) == list(range(40)) and b.engine.blocks.num_used == 0


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_a_step_plans_its_store_once_for_every_layer(llama, ids, monkeypatch, kind):
    """`kernels.plan_store` reads the device (on a GPU, a wait per read), so the engine
    plans each step's write once and applies it to every layer; with int8 pages,
    prompt chunks and page-boundary decode tokens seal and take staging slots, and the
    logits still match those of a plain `kv_store` per layer."""
    from ktcli.engine.backend import SamplingParams

    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    plain = load(llama, kv_dtype=kind, attention=policy)
    monkeypatch.setattr(plain.kv, "_store", lambda layer, k, v, slots: kernels.kv_store(
        layer, k.contiguous(), v.contiguous(), slots))
    expected = plain.generate_ids([ids[:100]], SamplingParams(max_new_tokens=20))

    calls = {"plan": 0, "apply": 0, "steps": 0}

    def counted(name, fn):
        def wrapper(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapper

    b = load(llama, kv_dtype=kind, attention=policy)
    monkeypatch.setattr(kernels, "plan_store", counted("plan", kernels.plan_store))
    monkeypatch.setattr(kernels, "kv_store_planned", counted("apply", kernels.kv_store_planned))
    monkeypatch.setattr(b.kv, "_begin_step", counted("steps", b.kv._begin_step))
    assert b.generate_ids([ids[:100]], SamplingParams(max_new_tokens=20)) == expected
    assert calls["plan"] >= 2 and calls["apply"] == calls["plan"] * b.kv.n_layers
    # fp32: every step stores through a plan; int8 decode rows inside a page take
    # `store_mid_page` (no staging slot changes hands) and plan nothing.
    assert calls["plan"] == calls["steps"] if kind == "fp32" else calls["plan"] < calls["steps"]


@pytest.mark.parametrize("kind", ["fp32", "int4"])
def test_topk_prompts_are_cut_as_alone_whatever_the_batch(llama, ids, kind):
    """topk's question pages come from a prompt's last queries and only its last chunk is
    replayed, so where chunks end changes the answer: a prompt is cut the same way alone
    and batched, its last chunk holds at least QuestionPages.WINDOW tokens (150 tokens in
    64-token chunks: 64, 54, 32, not 64, 64, 22), and greedy answers do not depend on the
    batch."""
    from ktcli.engine.backend import SamplingParams

    policy = AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    b = load(llama, attention=policy, kv_dtype=kind)
    chunks: dict[int, list[int]] = {}
    real = b.kv._begin_step

    def spy(step):
        real(step)
        for seq, table in zip(step.seqs, b.kv._tables):
            if seq.n > 1 and b.kv._store_rows is None:  # a prompt chunk, not its replay
                chunks.setdefault(int(table[0]), []).append(seq.n)

    b.kv._begin_step = spy
    other = list(reversed(ids[:120]))
    params = SamplingParams(max_new_tokens=6)
    alone = []
    for p in (ids, other):
        chunks.clear()
        alone.append((b.generate_ids([p], params)[0], next(iter(chunks.values()))))
    assert alone[0][1] == [64, 54, 32] and alone[1][1] == [64, 56]
    for batch in ([ids, other], [other, ids]):
        chunks.clear()
        got = b.generate_ids(batch, params)
        want = [alone[0] if p is ids else alone[1] for p in batch]
        assert got == [w[0] for w in want]
        assert sorted(chunks.values()) == sorted(w[1] for w in want)


@pytest.mark.parametrize("kind,policy", [
    ("fp32", "dense"), ("int4", "dense"),
    ("fp32", AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)),
    ("int4", AttentionPolicy("topk", n_sink_pages=1, n_local_pages=2, top_k_pages=2)),
])
def test_answer_logits_are_what_generation_computes(llama, ids, kind, policy):
    """Teacher-forcing the engine's own greedy answer step by step reproduces it (the same
    chunks, replay and decode steps as `generate`); with dense fp32 pages the rows also
    equal prompt_logits over prompt + answer (quantized pages seal at other times there)."""
    from ktcli.engine.backend import SamplingParams

    b = load(llama, attention=policy, kv_dtype=kind)
    prompt = ids[:140]
    answer = b.generate_ids([prompt], SamplingParams(max_new_tokens=8))[0]
    rows = b.answer_logits(prompt, answer)
    assert rows.shape[0] == len(answer) and rows.argmax(-1).tolist() == answer
    if policy == "dense" and kind == "fp32":
        whole = b.prompt_logits(prompt + answer)[len(prompt) - 1 : -1]
        torch.testing.assert_close(rows, whole, atol=2e-4, rtol=1e-4)


def test_a_one_request_window_gets_pages_for_itself_only(llama, monkeypatch):
    """`ktcli ask` sizes the pages to its input (context_window, kv_windows=1). Kernel pages
    are written when allocated, so four serve-sized windows cost their full size in RSS:
    1.30 GB peak at 16K tokens of int4 pages, 0.94 GB once sized to the one request. A
    window the request gives is not capped at the default's 32K tokens (a longer input
    then ran out of pages mid-prefill), and one that cannot fit says so before any work."""
    from ktcli.engine import device as device_mod
    from ktcli.errors import OutOfMemoryError

    monkeypatch.setattr(device_mod, "available_bytes", lambda device: 64 << 30)
    for window in (3000, 100_000):
        b = NativeBackend.load(llama, weights="fp32", kv_dtype="int4", attention="topk", context_window=window,
                               kv_windows=1)
        tokens = b.kv.num_blocks * b.kv.block_size
        assert window <= tokens <= window + 2 * b.kv.block_size
        assert b.context_window == window
    served = NativeBackend.load(llama, weights="fp32", kv_dtype="int4", attention="topk")  # `ktcli serve`: 4 x 32K
    assert served.kv.num_blocks * served.kv.block_size >= 4 * 32768
    # Its window is what the pool holds, not the 1M positions remapping could reach: a
    # longer prompt is refused on its own (a 400), never taken in to fail its batch.
    assert served.context_window == served.kv.num_blocks * served.kv.block_size
    monkeypatch.setattr(device_mod, "available_bytes", lambda device: 1 << 20)
    with pytest.raises(OutOfMemoryError, match="100,000-token window needs"):
        NativeBackend.load(llama, weights="fp32", kv_dtype="int4", attention="topk", context_window=100_000, kv_windows=1)


def test_the_cli_loads_one_window_of_pages():
    from types import SimpleNamespace

    from ktcli.engine.loading import _long_context
    from ktcli.types import Mode

    settings = SimpleNamespace(rope_scaling=None)
    sparse = SimpleNamespace(mode=Mode.SPARSE, kv_dtype="int4", attention="topk", context_window=52_600)
    opts = _long_context(settings, sparse)
    assert opts["kv_windows"] == 1 and opts["context_window"] == 52_600  # the plan's window, as its estimate counted
    assert "kv_windows" not in _long_context(settings, None)  # serve: the default, several windows


@pytest.mark.parametrize("kind", ["window", "topk"])
def test_a_decode_steps_page_mask_is_made_on_the_querys_device(kind):
    """The window policy has no scores to take a device from: its mask was made on the
    CPU beside CUDA queries, and every window decode step on a GPU failed. ("meta" stands
    in for a GPU here.)"""
    policy = AttentionPolicy(kind, n_sink_pages=1, n_local_pages=2, top_k_pages=2)
    scores = torch.randn(1, 2, 9, device="meta") if kind == "topk" else None
    visit = page_groups._one_group_visits(scores, 9, policy, torch.device("meta"))
    assert visit.device.type == "meta" and visit.shape[-1] == 9


def test_staging_precision_is_the_device_default_unless_asked(llama, ids):
    """kernels.bench's end-to-end exactness rows stage at fp32 on a GPU (fp32 dots, as the
    CPU reference); by default the CPU stages at fp32 and CUDA at fp16. Asking fp16 on the
    CPU stages there at fp16 and still answers."""
    assert load(llama, kv_dtype="int8").long_context.stage_dtype == "fp32"
    b = load(llama, kv_dtype="int8", stage_dtype="fp16")
    assert b.long_context.stage_dtype == "fp16" and b.kv.layers[0].stage_k.dtype == torch.float16
    assert torch.isfinite(b.prompt_logits(ids[:40])).all()
