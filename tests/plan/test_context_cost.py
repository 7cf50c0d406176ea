"""Prefill and decode slow down with the context dense attention reads: plans scale rates
kept without context by each read's length."""

from dataclasses import replace

import pytest

from ktcli.plan import PlanRequest, Throughput, make_plan
from ktcli.plan.estimates import (NO_CONTEXT_COST, context_cost, decode_seconds, prefill_seconds,
                                  rates_without_context)
from ktcli.types import Mode, ModelFacts

# SmolLM2-135M as the plan sees it run: int8 weights, fp16 pages
SMOL = ModelFacts(name="smollm2", context_window=8192, n_layers=30, n_kv_heads=3, head_dim=64,
                  n_params=134_515_008, weight_bytes=151_329_384, kv_dtype="fp16", hidden_size=576,
                  intermediate_size=1536, n_heads=9, vocab_size=49152)


def test_smollm2s_measured_prefill_rates_follow_from_the_shorter_one():
    """Prefill through the CLI on the 2-core Xeon (`benchmarks.plan_time`): 2,419 / 2,369 /
    1,947 / 1,512 tok/s at 649 / 2,274 / 4,406 / 7,603 tokens. Without the first prefill's
    setup (~46 ms) apart, the longer reads were planned 21-27% long."""
    cost = context_cost(SMOL, "fp16")
    assert cost.prefill == pytest.approx(30 * 9 * 64 / (134_515_008 - 49152 * 576))
    r0, _ = rates_without_context(2419, 649, 649 ** 2, 95, 64, 64 * (649 + 32), cost)
    for n, measured in ((2274, 2369), (4406, 1947), (7603, 1512)):
        assert n / prefill_seconds(n, r0, cost) == pytest.approx(measured, rel=0.06)
    assert prefill_seconds(4096, r0, NO_CONTEXT_COST) < 0.7 * prefill_seconds(4096, r0, cost)
    # the engine warm has no such setup: 3,047 / 2,013 / 1,454 tok/s at 512 / 4,096 / 7,680
    warm = 3047 * (512 + cost.prefill * 512 ** 2) / 512
    for n, measured in ((4096, 2013), (7680, 1454)):
        assert n / prefill_seconds(n, warm, cost, first=False) == pytest.approx(measured, rel=0.05)


def test_a_prompt_read_back_computes_only_the_rest_at_their_positions():
    cost = context_cost(SMOL, "fp16")
    whole = prefill_seconds(6000, 3000, cost)
    assert prefill_seconds(6000, 3000, cost, cached=5000) == pytest.approx(
        whole - prefill_seconds(5000, 3000, cost, first=False))
    assert prefill_seconds(6000, 3000, cost, cached=9000) == 0.0


def test_decode_slows_with_the_cache_it_reads():
    cost = context_cost(SMOL, "fp16")
    near, far = decode_seconds(512, 64, 100, cost), decode_seconds(7680, 64, 100, cost)
    assert 2.0 < far / near < 3.5  # 95 against 39.5 tok/s on the Xeon
    assert context_cost(SMOL, "fp32").decode == pytest.approx(2 * cost.decode)  # twice the bytes a token


def test_rates_kept_without_context_give_back_the_measured_rate_at_its_length():
    cost = context_cost(SMOL, "fp16")
    r0p, r0d = rates_without_context(1500, 6877, 6877 ** 2, 42, 93, 93 * (6877 + 46.5), cost)
    assert 6877 / prefill_seconds(6877, r0p, cost) == pytest.approx(1500)
    assert 93 / decode_seconds(6877, 93, r0d, cost) == pytest.approx(42)
    assert rates_without_context(1500, 0, 0, 42, 0, 0, cost) == (0.0, 0.0)


def test_a_long_full_read_is_planned_at_its_length_and_a_budget_then_weighs_sparse():
    """A 185M Qwen2 over 27.5K tokens was planned at its 1.2K rate: a 13 s first token for
    68 s, and under a budget auto kept the full read, over a 25 s sparse one."""
    qwen = replace(SMOL, name="qwen2-mid", context_window=32768, n_layers=24, n_kv_heads=2, head_dim=64,
                   n_params=185_000_000, weight_bytes=2 * 185_000_000, kv_dtype="bf16", hidden_size=896,
                   n_heads=14, vocab_size=32000)
    rates = Throughput(prefill_tok_s=2354 * 1.1, decode_tok_s=40, sparse_prefill_tok_s=1400, sparse_decode_tok_s=20)
    request = PlanRequest(task="ask", corpus_tokens=27_500, question_tokens=10, n_documents=1, sparse_ok=True)
    full = make_plan(request, qwen, rates)
    assert full.mode is Mode.FULL and full.est_first_token_seconds > 40
    budget = make_plan(replace(request, max_seconds=45), qwen, rates)
    assert budget.mode is not Mode.FULL  # retrieval, quicker still
    sparse = [a for a in budget.alternatives if a["mode"] == "sparse"]
    assert sparse and min(a["est_seconds"] for a in sparse) < full.est_seconds / 2
    sparse_only = replace(qwen, hidden_size=0, n_heads=0)  # a shape not known: rates as measured
    assert make_plan(request, sparse_only, rates).est_first_token_seconds < 15


def test_a_question_over_several_windows_answers_in_its_last_one():
    """The final step was timed as notes and question alone; a question's last window is
    read with the notes and answered there, its evidence prefilled before the first token."""
    rates = Throughput(prefill_tok_s=1000, decode_tok_s=50, notes_tokens=100)
    request = PlanRequest(task="ask", corpus_tokens=400_000, question_tokens=10, n_documents=1, n_chunks=3000,
                          top_k=40, mode="retrieval", uncached_tokens=0)
    plan = make_plan(request, SMOL, rates)
    assert plan.n_windows > 1
    cost = context_cost(SMOL, "fp16")
    # the answer is written after the last window's evidence, not after the notes alone
    answer_s = plan.est_seconds - plan.est_first_token_seconds
    assert answer_s > 1.2 * decode_seconds(100 + 10 + 200, 384, 50, cost)  # notes, question, prompt
