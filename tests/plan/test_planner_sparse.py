"""The planner's sparse mode: whole input in the paged, quantized cache."""

import pytest

from ktcli.errors import OutOfMemoryError, UsageError
from ktcli.plan import PlanRequest, Throughput, make_plan
from ktcli.plan.estimates import kv_bytes_per_token, paged_kv_bytes_per_token
from ktcli.types import Mode, ModelFacts

SMOL = ModelFacts(name="smollm2", context_window=8192, n_layers=30, n_kv_heads=3, head_dim=64,
                  n_params=134_515_008, weight_bytes=538_090_408)
RATES = Throughput(prefill_tok_s=150, decode_tok_s=10, embed_tok_s=4000, sparse_prefill_tok_s=100, sparse_decode_tok_s=8)


def req(**kw):
    base = dict(task="ask", corpus_tokens=20_000, question_tokens=10, n_documents=1, n_chunks=90, sparse_ok=True)
    base.update(kw)
    return PlanRequest(**base)


def test_paged_bytes_shrink_with_the_dtype():
    fp32, int8, int4 = (paged_kv_bytes_per_token(SMOL, k) for k in ("fp32", "int8", "int4"))
    assert int4 < int8 < fp32
    assert kv_bytes_per_token(SMOL, "int4") == int4  # quantized kinds: the kernels' exact figure


def test_forced_sparse_prefers_int8_topk_and_lists_every_option():
    plan = make_plan(req(mode="sparse"), SMOL, RATES)
    assert plan.mode is Mode.SPARSE and plan.kv_dtype == "int8" and plan.attention == "topk"
    listed = {(a.get("kv_dtype"), a.get("attention")) for a in plan.alternatives if a["mode"] == "sparse"}
    assert ("int4", "topk") in listed and ("int8", "window") in listed and ("fp32", "topk") in listed


def test_memory_budget_pushes_sparse_to_int4():
    int8 = make_plan(req(mode="sparse", kv_dtype="int8"), SMOL, RATES).est_memory_bytes
    int4 = make_plan(req(mode="sparse", kv_dtype="int4"), SMOL, RATES).est_memory_bytes
    plan = make_plan(req(mode="sparse", memory_budget=(int8 + int4) // 2), SMOL, RATES)
    assert plan.kv_dtype == "int4"
    with pytest.raises(OutOfMemoryError, match="even at int4"):
        make_plan(req(mode="sparse", memory_budget=int4 // 2), SMOL, RATES)
    # the one dtype asked for is not "even at" it: the smaller pages are named instead
    with pytest.raises(OutOfMemoryError, match=r"with the fp32 pages asked for \(--kv-dtype int4"):
        make_plan(req(mode="sparse", kv_dtype="fp32", memory_budget=int8), SMOL, RATES)


def test_auto_reads_long_input_whole_within_latency_budget():
    plan = make_plan(req(max_seconds=400), SMOL, RATES)  # 20K tokens at 100 tok/s ~ 200 s
    assert plan.mode is Mode.SPARSE
    assert plan.context_window >= 20_000


def test_auto_falls_back_to_retrieval_when_sparse_is_too_slow_or_unavailable():
    slow = make_plan(req(max_seconds=60), SMOL, RATES)
    assert slow.mode is Mode.RETRIEVAL and any("sparse" in r for r in slow.reasons)
    no_engine = make_plan(req(max_seconds=400, sparse_ok=False), SMOL, RATES)
    assert no_engine.mode is Mode.RETRIEVAL
    plain = make_plan(req(), SMOL, RATES)  # no budget, no sparse flags: retrieval as before
    assert plain.mode is Mode.RETRIEVAL
    # ~200 s is within the default budget: the reason says how to ask, not "too slow"
    assert any("could read it whole" in r and "--mode sparse" in r for r in plain.reasons)
    assert any("> 60s budget" in r for r in slow.reasons)


def test_auto_takes_window_attention_only_where_asked_for():
    # topk past the budget, window within it: a window read sees the input's first and last
    # pages only, so auto answers by retrieval unless window was asked for by name
    for asked in (dict(max_seconds=230), dict(kv_dtype="int8", max_seconds=230)):
        topk_only_past = make_plan(req(**asked), SMOL, RATES)
        assert topk_only_past.mode is Mode.RETRIEVAL, asked
        # nor is it offered in the reasons ("sparse mode could read it whole ... window attention")
        said = " ".join(topk_only_past.reasons)
        assert "sparse mode would take" in said and "window attention" not in said, said
    named = make_plan(req(attention="window", max_seconds=230), SMOL, RATES)
    assert named.mode is Mode.SPARSE and named.attention.startswith("window")


def test_short_input_stays_full_with_the_requested_dtype():
    plan = make_plan(req(corpus_tokens=1000, kv_dtype="int8"), SMOL, RATES)
    assert plan.mode is Mode.FULL and plan.kv_dtype == "int8"


def test_sparse_dense_past_the_window_is_refused():
    with pytest.raises(UsageError, match="window"):
        make_plan(req(mode="sparse", attention="dense"), SMOL, RATES)


def test_a_page_count_on_the_policy_still_asks_for_sparse():
    plan = make_plan(req(attention="topk:16", max_seconds=0), SMOL, RATES)
    assert plan.mode is Mode.SPARSE and plan.attention == "topk:16"
    with pytest.raises(UsageError):
        make_plan(req(mode="sparse", attention="dense:4"), SMOL, RATES)


def test_sparse_memory_counts_the_window_the_engine_allocates():
    """A sparse read's pages are all written when allocated: the estimate counts the plan's
    whole window (prompt, answer and margin), which `engine.loading` passes to the engine."""
    from ktcli.plan.estimates import paged_fixed_bytes, sparse_memory
    from ktcli.plan.planner import SPARSE_WINDOW_MARGIN

    plan = make_plan(req(mode="sparse", kv_dtype="int4"), SMOL, RATES)
    assert plan.context_window == 20_000 + 10 + 160 + 384 + SPARSE_WINDOW_MARGIN
    assert plan.est_memory_bytes == sparse_memory(SMOL, plan.context_window, "int4")
    kv = paged_kv_bytes_per_token(SMOL, "int4") * plan.context_window + paged_fixed_bytes(SMOL, "int4")
    assert plan.est_memory_bytes == pytest.approx(SMOL.weight_bytes + kv, rel=1e-6)  # no widths, no runtime given


def test_the_plans_page_constants_are_the_engines():
    """plan/ may not import the engine: its copies of the page size and the one-request
    staging count must match what the kernels and the engine use."""
    import kernels
    from ktcli.engine.longctx import _staging_slots
    from ktcli.plan.estimates import ONE_REQUEST_STAGE, PAGE_TOKENS, PAGED_PREFILL_CHUNK

    assert PAGE_TOKENS == kernels.KVCacheSpec(1, 2).block_size
    assert ONE_REQUEST_STAGE == _staging_slots(1, PAGED_PREFILL_CHUNK, PAGE_TOKENS)


def test_a_context_window_cap_rules_out_reading_past_it():
    # The plan said sparse with a 15K window under --context-window 2048; the run, capped,
    # then switched to retrieval unannounced.
    capped = dict(corpus_tokens=12_000, n_chunks=60, kv_dtype="int4", attention="topk", window_cap=2048)
    assert make_plan(req(**capped), SMOL, RATES).mode is Mode.RETRIEVAL
    with pytest.raises(UsageError, match="--mode sparse reads the input whole .* past the --context-window cap of 2,048"):
        make_plan(req(mode="sparse", **capped), SMOL, RATES)
    assert make_plan(req(**{**capped, "window_cap": 0}), SMOL, RATES).mode is Mode.SPARSE


def test_each_kind_of_sparse_read_is_timed_at_its_own_speed():
    """Every policy and page kind was planned at one rate: the plan's alternatives all said
    the same time (window prefilled 1.5-1.7x faster than topk, fp32 pages decoded at 0.4x)."""
    from ktcli.plan.estimates import SPARSE_SPEED

    plan = make_plan(req(mode="sparse", max_new_tokens=200), SMOL, RATES)
    seconds = {(a["kv_dtype"], a["attention"]): a["est_seconds"] for a in plan.alternatives if a["mode"] == "sparse"}
    seconds[(plan.kv_dtype, plan.attention)] = plan.est_seconds
    assert seconds[("int8", "window")] < seconds[("int4", "topk")] < seconds[("fp32", "topk")]
    assert seconds[("int8", "topk")] < seconds[("fp32", "topk")]
    prefill_x, decode_x = SPARSE_SPEED[("window", "int8")]
    expect = RATES.load_s + 20_010 / (RATES.sparse_prefill_tok_s * prefill_x) + 200 / (RATES.sparse_decode_tok_s * decode_x)
    assert abs(seconds[("int8", "window")] - expect) < 0.05 * expect


def test_a_sparse_runs_rates_are_stored_as_the_reference_kinds(tmp_path):
    """A window read's faster rates, stored as they are, planned the next topk read too fast."""
    from dataclasses import replace

    from ktcli.config import Settings
    from ktcli.pipeline.api import _remember_rates
    from ktcli.pipeline.prepare import load_rates
    from ktcli.pipeline.runner import Tally
    from ktcli.plan.estimates import SPARSE_SPEED

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    tally = Tally(prompt_tokens=16_000, new_tokens=64, prefill_s=10.0, decode_s=1.0)
    _remember_rates(settings, tally, sparse=True, load_s=1.0, embed_tok_s=0.0, attention="window", kv_dtype="int8")
    prefill_x, decode_x = SPARSE_SPEED[("window", "int8")]
    rates = load_rates(settings)
    assert abs(rates.sparse_prefill_tok_s - 1_600 / prefill_x) < 0.5
    assert abs(rates.sparse_decode_tok_s - 64 / decode_x) < 0.05


def test_mode_sparse_with_a_time_budget_takes_a_kind_within_it_or_says_it_misses():
    """--mode sparse --max-seconds 60 was planned at int8 topk's ~379 s where window took
    less, with no word of the budget."""
    from ktcli.plan.planner import BUDGET_MISS

    plain = make_plan(req(mode="sparse"), SMOL, RATES)
    assert (plain.kv_dtype, plain.attention) == ("int8", "topk") and plain.est_seconds > 200
    within = make_plan(req(mode="sparse", max_seconds=200), SMOL, RATES)
    assert within.attention == "window" and within.est_seconds <= 200
    assert not any(r.startswith(BUDGET_MISS) for r in within.reasons)
    missed = make_plan(req(mode="sparse", max_seconds=60), SMOL, RATES)
    assert (missed.kv_dtype, missed.attention) == ("int8", "topk")  # none within: the preferred, said
    assert any(r.startswith(f"{BUDGET_MISS} the 60s budget; this one takes ~") for r in missed.reasons)


def test_mode_sparse_does_not_take_cached_window_pages_unasked():
    """A window read of the input in the prompt cache made a later `--mode sparse` (no
    --attention) a window read too, answered from the input's last lines (probe 105): the
    cache speeds up the policy asked for, it does not choose one. Said, with how to take it."""
    from ktcli.config import canonical_attention

    window = canonical_attention("window")
    cached = req(mode="sparse", sparse_cached=(("int8", window, 19_000),))
    plan = make_plan(cached, SMOL, RATES)
    assert (plan.kv_dtype, plan.attention) == ("int8", "topk") and plan.cached_tokens == 0
    said = " ".join(plan.reasons)
    assert "holds 19,000 tokens of this input's int8 window pages" in said and "--attention window" in said
    asked = make_plan(req(mode="sparse", attention="window", sparse_cached=(("int8", window, 19_000),)), SMOL, RATES)
    assert asked.attention.startswith("window") and asked.cached_tokens == 19_000
    # the same policy's pages of another kind are taken: the same attention, read back
    int4 = make_plan(req(mode="sparse", sparse_cached=(("int4", canonical_attention("topk"), 19_000),)), SMOL, RATES)
    assert (int4.kv_dtype, int4.attention) == ("int4", "topk") and int4.cached_tokens == 19_000
    assert "not taken unasked" not in " ".join(int4.reasons)
