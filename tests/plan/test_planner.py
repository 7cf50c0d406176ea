import math
import re
from dataclasses import replace

import pytest

from ktcli.errors import OutOfMemoryError, UsageError
from ktcli.plan import PlanRequest, Throughput, make_plan
from ktcli.config import parse_bytes
from ktcli.plan.estimates import kv_bytes_per_token
from ktcli.plan.planner import KERNEL_COMPILE_S, KEY_LINES_BYTES, KEY_LINES_LOAD_S
from ktcli.types import Mode, ModelFacts

SMOL = ModelFacts(name="smollm2", context_window=8192, n_layers=30, n_kv_heads=3, head_dim=64,
                  n_params=134_515_008, weight_bytes=538_090_408)
RATES = Throughput(prefill_tok_s=150, decode_tok_s=10, embed_tok_s=4000)


def req(**kw):
    base = dict(task="ask", corpus_tokens=1000, question_tokens=10, n_documents=1)
    base.update(kw)
    return PlanRequest(**base)


def test_small_input_is_read_whole():
    plan = make_plan(req(), SMOL, RATES)
    assert plan.mode is Mode.FULL
    assert plan.n_windows == 1 and plan.n_chunks == 0
    assert "fits" in plan.reasons[0]
    assert plan.alternatives and plan.alternatives[0]["mode"] == "retrieval"


def test_a_question_read_whole_counts_its_key_lines_embedder():
    plain, keyed = make_plan(req(), SMOL, RATES), make_plan(req(key_lines=2), SMOL, RATES)
    assert keyed.mode is plain.mode is Mode.FULL
    ranking = KEY_LINES_LOAD_S + 1000 / RATES.embed_tok_s  # the embedder's load and the input's 1,000 tokens
    assert keyed.est_seconds == pytest.approx(plain.est_seconds + ranking)
    assert keyed.est_first_token_seconds == pytest.approx(plain.est_first_token_seconds + ranking)
    assert keyed.est_memory_bytes == plain.est_memory_bytes + KEY_LINES_BYTES
    # a long input: its 256 lines most
    long_plain, long_keyed = (make_plan(req(corpus_tokens=6000, key_lines=k), SMOL, RATES) for k in (0, 2))
    assert long_keyed.est_seconds - long_plain.est_seconds == pytest.approx(KEY_LINES_LOAD_S + 5120 / RATES.embed_tok_s)


def test_input_just_over_the_window_uses_retrieval():
    plan = make_plan(req(corpus_tokens=8192 - 384 - 10 - 160 + 1, n_chunks=40), SMOL, RATES)
    assert plan.mode is Mode.RETRIEVAL
    assert plan.top_k == 8 and plan.n_chunks == 40
    assert plan.evidence_budget <= 3072


def test_answer_budget_counts_against_the_window():
    fits = 8192 - 384 - 10 - 160
    assert make_plan(req(corpus_tokens=fits), SMOL, RATES).mode is Mode.FULL
    tipped = make_plan(req(corpus_tokens=fits, max_new_tokens=385), SMOL, RATES)
    assert tipped.mode is Mode.RETRIEVAL
    assert tipped.reasons[0] == ("the input (~7,808 tokens with the prompt) and the answer budget (385) exceed "
                                 "the 8,192-token window")  # not "the input exceeds the window"
    over = make_plan(req(corpus_tokens=9000), SMOL, RATES)
    assert over.reasons[0] == "the input (~9,000 tokens) exceeds the 8,192-token window"
    asked_long = make_plan(req(corpus_tokens=6592, question_tokens=2400), SMOL, RATES)
    assert asked_long.reasons[0] == ("the input (~6,592 tokens) with the question (~2,400 tokens) exceeds the "
                                     "8,192-token window")  # the input alone fits


def test_forced_full_mode_that_cannot_fit_is_a_usage_error():
    with pytest.raises(UsageError, match="window"):
        make_plan(req(corpus_tokens=1_000_000, mode="full"), SMOL, RATES)


def test_forced_retrieval_on_small_input():
    plan = make_plan(req(mode="retrieval", n_chunks=4), SMOL, RATES)
    assert plan.mode is Mode.RETRIEVAL and plan.top_k == 4


def test_latency_budget_prefers_retrieval_when_faster():
    # 7K tokens at 150 tok/s is ~47 s of prefill; retrieval of 8 chunks is far less
    plan = make_plan(req(corpus_tokens=7000, n_chunks=30, max_seconds=20), SMOL, RATES)
    assert plan.mode is Mode.RETRIEVAL
    assert any("budget" in r for r in plan.reasons)


def test_a_whole_read_over_the_default_budget_gives_way_to_a_quicker_retrieval():
    """A window widened by --rope-scaling yarn:8 held a 60K-token input, and auto read it
    whole, planned at ~83 minutes, where retrieval took ~45 s. Without --max-seconds a full
    read is held to the default budget too; --mode full still reads it whole."""
    from ktcli.plan.planner import FULL_DEFAULT_SECONDS

    wide = replace(SMOL, context_window=65536)
    slow = replace(RATES, prefill_tok_s=15)  # 60K tokens: ~67 minutes of prefill
    plan = make_plan(req(corpus_tokens=60_000, n_chunks=250), wide, slow)
    assert plan.mode is Mode.RETRIEVAL
    assert any(f"> the {FULL_DEFAULT_SECONDS:.0f}s default budget" in r for r in plan.reasons)
    assert plan.alternatives[0]["mode"] == "full"  # still offered
    assert make_plan(req(corpus_tokens=60_000, n_chunks=250, mode="full"), wide, slow).mode is Mode.FULL
    # within the default budget (4K tokens: under 5 minutes), or asked for with a budget it meets: read whole
    assert make_plan(req(corpus_tokens=4_000, n_chunks=16), wide, slow).mode is Mode.FULL
    assert make_plan(req(corpus_tokens=60_000, n_chunks=250, max_seconds=9000), wide, slow).mode is Mode.FULL


def test_a_prompt_in_the_prompt_cache_is_not_counted_as_prefill():
    """7K tokens at 150 tok/s is ~47 s of prefill: over a 20 s budget, unless the engine
    will read 6.9K of them back from the prompt cache, which makes the whole read fit it."""
    cold = make_plan(req(corpus_tokens=7000, n_chunks=30, max_seconds=20, max_new_tokens=64), SMOL, RATES)
    warm = make_plan(req(corpus_tokens=7000, n_chunks=30, max_seconds=20, max_new_tokens=64, cached_tokens=6900),
                     SMOL, RATES)
    assert cold.mode is Mode.RETRIEVAL and warm.mode is Mode.FULL
    assert warm.cached_tokens == 6900 and warm.est_seconds < 20
    full = make_plan(req(corpus_tokens=7000, mode="full", max_new_tokens=64), SMOL, RATES)
    assert full.est_seconds - warm.est_seconds == pytest.approx(6900 / 150)
    # nor its memory: rows read back need no prefill chunk's activations (a hit was
    # planned at 1.39x its peak)
    from ktcli.plan.estimates import FULL_PREFILL_CHUNK, workspace_bytes

    widths = replace(SMOL, hidden_size=576, intermediate_size=1536)  # SmolLM2's, for the activations
    cold, warm = (make_plan(req(corpus_tokens=7000, mode="full", max_new_tokens=64, cached_tokens=n), widths, RATES)
                  for n in (0, 6900))
    chunk = workspace_bytes(widths, FULL_PREFILL_CHUNK)
    assert 0.8 * chunk < cold.est_memory_bytes - warm.est_memory_bytes < chunk


def test_memory_budget_too_small_for_anything():
    with pytest.raises(OutOfMemoryError):
        make_plan(req(memory_budget=100_000_000), SMOL, RATES)


def test_summary_of_long_input_reads_everything_in_windows():
    plan = make_plan(req(task="summarize", corpus_tokens=100_000, question_tokens=0), SMOL, RATES)
    assert plan.mode is Mode.RETRIEVAL
    assert plan.n_windows * plan.evidence_budget >= 100_000


def test_question_that_fills_the_window_is_refused():
    with pytest.raises(UsageError, match="question"):
        make_plan(req(corpus_tokens=100_000, question_tokens=8000), SMOL, RATES)


def test_unknown_mode():
    with pytest.raises(UsageError):
        make_plan(req(mode="magic"), SMOL, RATES)


def test_estimates_grow_with_input():
    small = make_plan(req(corpus_tokens=2000), SMOL, RATES)
    big = make_plan(req(corpus_tokens=6000), SMOL, RATES)
    assert big.est_seconds > small.est_seconds
    assert big.est_memory_bytes > small.est_memory_bytes


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(SMOL, "fp32") == 2 * 30 * 3 * 64 * 4
    assert kv_bytes_per_token(SMOL, "int4") < 0.3 * kv_bytes_per_token(SMOL, "fp32")


def test_full_read_memory_counts_the_models_kv_dtype():
    # 6K tokens of fp32 pages are 276 MB; fp16 pages (the CPU default beside int8 weights) half that.
    big = req(corpus_tokens=6000)
    fp32 = make_plan(big, SMOL, RATES).est_memory_bytes
    fp16 = make_plan(big, replace(SMOL, kv_dtype="fp16"), RATES).est_memory_bytes
    tokens = 6000 + 10 + 160 + 384
    assert fp32 - fp16 == pytest.approx(tokens * kv_bytes_per_token(SMOL, "fp16"), rel=1e-3)
    assert make_plan(replace(big, kv_dtype="fp32"), replace(SMOL, kv_dtype="fp16"), RATES).est_memory_bytes == fp32


@pytest.mark.parametrize("text,value", [("4GB", 4 * 10**9), ("512MiB", 512 * 2**20), ("1e9", 10**9), ("2 gib", 2 * 2**30),
                                        ("2.01MB", 2_010_000), ("1.5KB", 1500)])  # exact: float made 2,009,999
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1GB", "4XB", "1.5", "0.5", "nan", "1e999GB"])  # 1.5 was 1 byte
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_remote_server_facts_without_shape_plan_without_sparse_estimates():
    # an OpenAI-compatible server tells its window, not its KV shape
    remote = ModelFacts(name="remote", context_window=32768, n_layers=0, n_kv_heads=0, head_dim=0,
                        n_params=0, weight_bytes=0)
    plan = make_plan(req(corpus_tokens=100_000, n_chunks=400), remote, RATES)
    assert plan.mode is Mode.RETRIEVAL
    with pytest.raises(UsageError, match="sparse"):
        make_plan(req(corpus_tokens=100_000, mode="sparse"), remote, RATES)


def test_memory_estimates_count_the_process_not_just_the_model():
    """`--max-memory` is held against the process: the runtime around the model (where the
    budget is RAM), a prefill chunk's activations, and for retrieval the embedder. Before,
    the README's question was estimated at 216 MB and peaked at 714 MB RSS."""
    from ktcli.plan.estimates import CPU_RUNTIME_BYTES, EMBEDDER_BYTES, FULL_PREFILL_CHUNK, workspace_bytes

    cpu = replace(SMOL, hidden_size=576, intermediate_size=1536, host_bytes=CPU_RUNTIME_BYTES)
    big = req(corpus_tokens=6000)
    bare, full = make_plan(big, SMOL, RATES), make_plan(big, cpu, RATES)
    assert full.mode is Mode.FULL
    assert full.est_memory_bytes - bare.est_memory_bytes == CPU_RUNTIME_BYTES + workspace_bytes(cpu, FULL_PREFILL_CHUNK)
    assert workspace_bytes(cpu, 2048) == pytest.approx(173e6, rel=0.01)  # SmolLM2's measured ~170 MB
    small = make_plan(req(corpus_tokens=500), cpu, RATES)  # a chunk no longer than the prompt
    assert small.est_memory_bytes < full.est_memory_bytes - workspace_bytes(cpu, 2048) + workspace_bytes(cpu, 1100)
    retrieval = make_plan(req(corpus_tokens=50_000, n_chunks=220), cpu, RATES)
    assert retrieval.mode is Mode.RETRIEVAL and retrieval.est_memory_bytes > CPU_RUNTIME_BYTES + EMBEDDER_BYTES
    assert make_plan(req(corpus_tokens=50_000, n_chunks=220), SMOL, RATES).est_memory_bytes > EMBEDDER_BYTES


def summary_req(**kw):
    return req(task="summarize", question_tokens=0, **kw)


def test_a_summary_in_parts_is_timed_by_the_notes_the_model_writes():
    """Each part was timed as 384 tokens of notes; SmolLM2 writes ~120: summaries read in
    parts were planned 2-2.7x too long (and sent to outlines for it)."""
    from dataclasses import replace

    big = req(task="summarize", corpus_tokens=60_000, n_chunks=300)
    room = make_plan(big, SMOL, replace(RATES, notes_tokens=384))
    learned = make_plan(big, SMOL, replace(RATES, notes_tokens=120))
    assert learned.n_windows == room.n_windows > 5
    saved = (room.n_windows - 1) * (384 - 120) / RATES.decode_tok_s  # decode of the notes not written
    assert room.est_seconds - learned.est_seconds > 0.9 * saved
    assert learned.est_memory_bytes == room.est_memory_bytes  # memory keeps room for the most


def test_a_summary_over_the_time_budget_reads_code_files_as_outlines():
    # 100K tokens at 150 tok/s: far over the 600 s default; the outline is a fifth of it
    whole = make_plan(summary_req(corpus_tokens=100_000, outline="never", outline_tokens=20_000, outline_files=40),
                      SMOL, RATES)
    plan = make_plan(summary_req(corpus_tokens=100_000, outline_tokens=20_000, outline_files=40), SMOL, RATES)
    assert whole.outline_files == 0 and whole.read_tokens == 0
    assert plan.outline_files == 40 and plan.read_tokens == 20_000
    assert plan.input_tokens == 100_000  # the plan still says how big the input is
    assert plan.est_seconds < whole.est_seconds / 3
    assert plan.n_windows < whole.n_windows
    assert "> 600s budget" in plan.reasons[0] and "40 file(s) read as outlines" in plan.reasons[0]
    assert "--outline never" in plan.reasons[0]
    # read whole anyway, over the default budget: said, with why
    assert "over the 600s default budget (--outline never asked for)" in whole.reasons[-1]
    # as prepare asks under never: no outlines built, still the reason the user gave
    never = make_plan(summary_req(corpus_tokens=100_000, outline="never"), SMOL, RATES)
    assert "(--outline never asked for)" in never.reasons[-1]
    book = make_plan(summary_req(corpus_tokens=100_000, outline_tokens=100_000, outline_files=0), SMOL, RATES)
    assert "over the 600s default budget (nothing in it reads shorter as an outline)" in book.reasons[-1]
    given = make_plan(summary_req(corpus_tokens=100_000, max_seconds=900), SMOL, RATES)
    assert not any("default budget" in r for r in given.reasons)


def test_outlines_only_when_needed_and_only_for_summaries():
    small = summary_req(corpus_tokens=3_000, outline_tokens=1_000, outline_files=5)
    assert make_plan(small, SMOL, RATES).outline_files == 0  # fast enough read whole
    forced = make_plan(replace(small, outline="always"), SMOL, RATES)
    assert forced.outline_files == 5 and forced.reasons[0].startswith("--outline always")
    # a budget of its own: --max-seconds
    tight = make_plan(replace(small, max_seconds=5), SMOL, RATES)
    assert tight.outline_files == 5 and "> 5s budget" in tight.reasons[0]
    ask = make_plan(req(corpus_tokens=100_000, outline_tokens=20_000, outline_files=40), SMOL, RATES)
    assert ask.outline_files == 0
    no_code = make_plan(summary_req(corpus_tokens=100_000, outline_tokens=100_000, outline_files=0), SMOL, RATES)
    assert no_code.outline_files == 0
    with pytest.raises(UsageError, match="--outline"):
        make_plan(replace(small, outline="sometimes"), SMOL, RATES)


def test_a_summary_plans_no_embedding_time_or_memory():
    # a summary maps over every chunk in order: no index is built
    summary = make_plan(summary_req(corpus_tokens=100_000, n_chunks=450), SMOL, RATES)
    slow_embedder = make_plan(summary_req(corpus_tokens=100_000, n_chunks=450), SMOL,
                              replace(RATES, embed_tok_s=1))
    assert summary.est_seconds == slow_embedder.est_seconds
    many_chunks = make_plan(summary_req(corpus_tokens=100_000, n_chunks=45_000), SMOL, RATES)
    assert many_chunks.est_memory_bytes == summary.est_memory_bytes  # no index held
    asks = [make_plan(req(corpus_tokens=100_000, n_chunks=n), SMOL, RATES) for n in (450, 45_000)]
    assert asks[1].est_memory_bytes > asks[0].est_memory_bytes  # a question's index grows with the chunks


def test_a_read_of_several_parts_plans_what_later_reads_leave_the_process_grown_by(monkeypatch):
    """A summary in 3 parts peaked at 951 MiB for 895 planned (probe 97 saw up to 983): the
    engine keeps freed temporaries up to RELEASE_OVER past its first read."""
    from ktcli.engine.host_alloc import RELEASE_OVER
    from ktcli.plan import planner
    from ktcli.plan.estimates import LATER_READS_GROWTH_BYTES

    assert LATER_READS_GROWTH_BYTES == 2 * RELEASE_OVER
    one, three = (summary_req(corpus_tokens=n, mode="retrieval") for n in (5_000, 16_000))
    planned = [make_plan(r, SMOL, RATES) for r in (one, three)]
    monkeypatch.setattr(planner, "LATER_READS_GROWTH_BYTES", 0)
    without = [make_plan(r, SMOL, RATES) for r in (one, three)]
    assert planned[0].n_windows == 1 and planned[1].n_windows > 1
    assert planned[0].est_memory_bytes == without[0].est_memory_bytes  # one read: nothing later
    assert planned[1].est_memory_bytes == without[1].est_memory_bytes + LATER_READS_GROWTH_BYTES


def test_a_budget_no_plan_meets_is_said():
    plan = make_plan(req(corpus_tokens=3_000, max_seconds=0.1), SMOL, RATES)
    assert plan.reasons[-1].startswith("no plan is estimated within the 0.1s budget")
    assert not any("no plan" in r for r in make_plan(req(corpus_tokens=3_000, max_seconds=1e6), SMOL, RATES).reasons)


def test_memory_errors_point_to_a_sparse_read_that_fits():
    # The README's PDF case: retrieval holds the embedder and a window; int4 pages of the
    # whole short input are smaller.
    base = req(corpus_tokens=2_500, n_chunks=12, sparse_ok=True)
    int4 = make_plan(replace(base, mode="sparse", kv_dtype="int4"), SMOL, RATES).est_memory_bytes
    retrieval = make_plan(replace(base, mode="retrieval"), SMOL, RATES).est_memory_bytes
    full = make_plan(base, SMOL, RATES).est_memory_bytes
    budget = int4 + 1
    assert budget < min(retrieval, full)
    with pytest.raises(OutOfMemoryError, match="--mode sparse --kv-dtype int4 --attention topk needs"):
        make_plan(replace(base, memory_budget=budget), SMOL, RATES)
    with pytest.raises(OutOfMemoryError, match="--mode full needs .* over the --max-memory budget"):
        make_plan(replace(base, mode="full", memory_budget=full - 1), SMOL, RATES)
    with pytest.raises(OutOfMemoryError, match="1,000 bytes"):
        make_plan(replace(base, memory_budget=1000), SMOL, RATES)


def test_mode_retrieval_respects_the_memory_budget():
    base = req(corpus_tokens=30_000, n_chunks=157, mode="retrieval")
    need = make_plan(base, SMOL, RATES).est_memory_bytes
    assert make_plan(replace(base, memory_budget=need), SMOL, RATES).mode is Mode.RETRIEVAL
    with pytest.raises(OutOfMemoryError, match="--mode retrieval needs .* over the --max-memory budget"):
        make_plan(replace(base, memory_budget=need - 1), SMOL, RATES)


def test_a_chunk_larger_than_a_window_is_refused_for_retrieval():
    with pytest.raises(UsageError, match="--chunk-tokens 100000: a chunk must fit"):
        make_plan(req(corpus_tokens=100_000, chunk_tokens=100_000, chunk_overlap=0), SMOL, RATES)
    assert make_plan(req(corpus_tokens=1_000, chunk_tokens=100_000, chunk_overlap=0), SMOL, RATES).mode is Mode.FULL
    # Cut in estimate tokens, a chunk costs the model this input's own ratio: 4,000 of a CSV
    # of numbers (2.47 model tokens each) are 9.9K, past the 8K window.
    numbers = req(corpus_tokens=200_000, chunk_tokens=4000, chunk_overlap=0, mode="retrieval")
    assert make_plan(numbers, SMOL, RATES).mode is Mode.RETRIEVAL
    with pytest.raises(UsageError, match="--chunk-tokens 4000: a chunk must fit"):
        make_plan(replace(numbers, tokens_per_estimate=2.47), SMOL, RATES)


def test_a_whole_read_with_a_sparse_policy_counts_the_sparse_machinery():
    # --attention topk on an input that fits: the kernels' pages for the model's window,
    # exact sinks and page bounds, as a sparse read holds them (it measured 0.96x after)
    base = req(corpus_tokens=2_500, kv_dtype="int4")
    dense = make_plan(base, SMOL, RATES)
    topk = make_plan(replace(base, attention="topk:4"), SMOL, RATES)
    assert topk.mode is dense.mode is Mode.FULL
    assert topk.est_memory_bytes > dense.est_memory_bytes


def test_retrieval_counts_only_the_embedding_still_to_do():
    """A second question about a long input reuses the index: its plan leaves out the
    embedding time the first one paid."""
    cold = make_plan(req(corpus_tokens=100_000, n_chunks=400), SMOL, RATES)
    warm = make_plan(req(corpus_tokens=100_000, n_chunks=400, uncached_tokens=0), SMOL, RATES)
    assert cold.mode is warm.mode is Mode.RETRIEVAL
    assert cold.est_seconds - warm.est_seconds == pytest.approx(100_000 / RATES.embed_tok_s)


def test_no_room_names_what_takes_it():
    with pytest.raises(UsageError, match=r"^the answer budget \(--max-new-tokens\) leaves no room.*lower --max-new-tokens"):
        make_plan(req(corpus_tokens=100_000, question_tokens=2, max_new_tokens=100_000), SMOL, RATES)
    with pytest.raises(UsageError, match=r"^the question leaves no room.*shorten the question"):
        make_plan(req(corpus_tokens=100_000, question_tokens=8_000, max_new_tokens=64), SMOL, RATES)
    # the limit named is one that plans (probe 102: "lower --max-new-tokens" gave none)
    with pytest.raises(UsageError, match=r"lower --max-new-tokens to ([0-9,]+) or less$") as refused:
        make_plan(req(corpus_tokens=100_000, question_tokens=2, max_new_tokens=8_000), SMOL, RATES)
    most = int(re.search(r"to ([0-9,]+) or less", str(refused.value)).group(1).replace(",", ""))
    assert make_plan(req(corpus_tokens=100_000, question_tokens=2, max_new_tokens=most), SMOL, RATES).mode is Mode.RETRIEVAL
    with pytest.raises(UsageError):
        make_plan(req(corpus_tokens=100_000, question_tokens=2, max_new_tokens=most + 1), SMOL, RATES)


def test_a_small_window_reads_what_fits_and_says_why_parts_cannot_be_read():
    # A 512-token window has no room for retrieval's parts (prompt, notes, evidence,
    # answer): that made even a 40-token file fail, blaming --max-new-tokens.
    small = replace(SMOL, context_window=512)
    plan = make_plan(req(corpus_tokens=40, question_tokens=4, max_new_tokens=16, n_chunks=1), small, RATES)
    assert plan.mode is Mode.FULL
    assert make_plan(req(corpus_tokens=40, question_tokens=4, max_new_tokens=16, n_chunks=1, mode="full"),
                     small, RATES).mode is Mode.FULL
    with pytest.raises(UsageError, match="^the 512-token window is too small to answer from retrieved passages"):
        make_plan(req(corpus_tokens=5_000, question_tokens=4, max_new_tokens=16), small, RATES)
    with pytest.raises(UsageError, match="^the 512-token window is too small to read the input in parts"):
        make_plan(req(task="summarize", corpus_tokens=5_000, question_tokens=0, max_new_tokens=16), small, RATES)


def test_a_window_too_small_for_retrieval_is_said_in_a_questions_terms():
    """`ask --context-window 1000 --mode retrieval` was told of "384 of notes in and as
    many out", a summary's words, and not whether a lower --max-new-tokens would help
    (it cannot: a window that passes notes on writes 384 tokens of them)."""
    with pytest.raises(UsageError) as caught:
        make_plan(req(corpus_tokens=5_000, question_tokens=4, max_new_tokens=64, mode="retrieval"),
                  replace(SMOL, context_window=1000), RATES)
    message = str(caught.value)
    assert message.startswith("the 1,000-token window is too small to answer from retrieved passages")
    assert "even under a lower --max-new-tokens" in message and "raise --context-window" in message
    assert "read the input in parts" not in message


def test_retrieval_keeps_the_kv_dtype_and_policy_asked_for():
    plan = make_plan(req(corpus_tokens=100_000, n_chunks=400, mode="retrieval", kv_dtype="int4", attention="topk"),
                     SMOL, RATES)
    assert (plan.mode, plan.kv_dtype, plan.attention) == (Mode.RETRIEVAL, "int4", "topk")
    default = make_plan(req(corpus_tokens=100_000, n_chunks=400, mode="retrieval"), SMOL, RATES)
    assert (default.kv_dtype, default.attention) == ("model", "dense")
    assert plan.est_memory_bytes < default.est_memory_bytes  # int4 pages for each window


def test_first_token_is_planned_without_the_answer_and_with_the_load():
    rates = replace(RATES, load_s=2.0)
    full = make_plan(req(corpus_tokens=1500, max_new_tokens=300), SMOL, rates)
    assert full.est_first_token_seconds == pytest.approx(full.est_seconds - 300 / 10)
    assert full.est_first_token_seconds > 2.0 + 1500 / 150  # the load, and the prompt's prefill
    assert full.est_seconds - make_plan(req(corpus_tokens=1500, max_new_tokens=300), SMOL, RATES).est_seconds \
        == pytest.approx(2.0 - RATES.load_s)
    big = make_plan(req(corpus_tokens=200_000, n_chunks=800, max_new_tokens=300), SMOL, rates)
    assert big.mode is Mode.RETRIEVAL and 2.0 < big.est_first_token_seconds == pytest.approx(big.est_seconds - 30)


def test_a_first_run_that_converts_the_model_plans_its_time_and_peak():
    """The plan said 750 MiB and a 7 s wait for a first run that converted the GGUF through
    transformers' loader: 61 s and 1.3 GiB (28-32 s in a fresh process, `benchmarks.gguf_convert`).
    ktcli's own converter took ~2 s and 319 MiB for the same file."""
    warm = make_plan(req(corpus_tokens=2000), SMOL, RATES)
    first = make_plan(req(corpus_tokens=2000, convert_params=SMOL.n_params), SMOL, RATES)
    assert first.mode is warm.mode
    assert first.est_seconds - warm.est_seconds == pytest.approx(first.est_first_token_seconds - warm.est_first_token_seconds)
    assert 25 < first.est_seconds - warm.est_seconds < 40
    assert 1.15 * 2**30 < first.est_memory_bytes < 1.35 * 2**30 and warm.est_memory_bytes < 2**30
    assert "converts the model" in first.reasons[-1]
    largest = 49152 * 576  # SmolLM2's embedding
    own = make_plan(req(corpus_tokens=2000, convert_params=SMOL.n_params, convert_largest=largest), SMOL, RATES)
    assert 1 < own.est_seconds - warm.est_seconds < 4
    assert own.est_memory_bytes < 1.1 * warm.est_memory_bytes  # one tensor at a time: about the run's own peak
    assert "converts the model (once: ~2 s" in own.reasons[-1]


def test_a_first_run_that_compiles_the_kernels_plans_its_time():
    """A first run without scripts/setup.sh compiled the C++ kernels for 113 s after a plan
    that said 13 s; every mode pays it, so the mode stays and the reason says it."""
    warm = make_plan(req(corpus_tokens=2000), SMOL, RATES)
    first = make_plan(req(corpus_tokens=2000, compiles_kernels=True), SMOL, RATES)
    assert first.mode is warm.mode and first.est_memory_bytes == warm.est_memory_bytes
    assert first.est_seconds - warm.est_seconds == pytest.approx(KERNEL_COMPILE_S)
    assert first.est_first_token_seconds - warm.est_first_token_seconds == pytest.approx(KERNEL_COMPILE_S)
    assert "compiles the engine's C++ kernels" in first.reasons[-1]
    late = make_plan(req(corpus_tokens=2000, compiles_kernels=True, max_seconds=30), SMOL, RATES)
    assert "over the 30s budget" in late.reasons[-1]


def test_a_read_over_the_kernels_pages_plans_their_window_and_scores():
    """--rope-scaling runs a whole read over the kernels' pages (allocated for the window)
    with each 512-token chunk's scores against the context: planned as the dense cache,
    950 MiB for a 1,062-1,123 MiB peak."""
    wide = replace(SMOL, context_window=16384, hidden_size=576, intermediate_size=1536, host_bytes=380 << 20,
                   weight_bytes=151_430_400, kv_dtype="fp16")  # int8 weights and fp16 pages, as run
    dense = make_plan(req(corpus_tokens=10_700, mode="full"), wide, RATES)
    paged = make_plan(req(corpus_tokens=10_700, mode="full", kernel_pages=True), wide, RATES)
    assert paged.est_memory_bytes - dense.est_memory_bytes > 200 * 2**20
    assert 1.05 * 2**30 < paged.est_memory_bytes < 1.25 * 2**30


def test_a_plan_over_its_budget_says_so_and_names_a_quicker_sparse_read():
    """A 1.2M-token summary read as outlines was planned at ~2,994 s against the default
    600 s without a word; under --max-seconds 300 the plan said "no plan is estimated
    within the budget" while sparse was estimated 3x quicker."""
    big = summary_req(corpus_tokens=1_200_000, outline_tokens=400_000, outline_files=250)
    plan = make_plan(big, SMOL, RATES)
    assert plan.outline_files and "over the 600s default budget" in plan.reasons[-1]
    sparse_rates = replace(RATES, sparse_prefill_tok_s=500, sparse_decode_tok_s=30)  # 20K in ~50 s: over 30
    asked = make_plan(req(corpus_tokens=20_000, max_seconds=30, sparse_ok=True), SMOL, sparse_rates)
    assert any("no plan is estimated within the 30s budget" in r and "--mode sparse" in r for r in asked.reasons)
    # not for a summary, which sparse attention reads a few pages of (below)
    summary = make_plan(replace(big, corpus_tokens=20_000, outline_tokens=0, outline_files=0, max_seconds=30,
                                sparse_ok=True), SMOL, sparse_rates)
    assert any("no plan is estimated within the 30s budget" in r for r in summary.reasons)
    assert "sparse" not in " ".join(summary.reasons)


def test_a_summary_is_not_read_sparse_for_a_time_budget():
    """`summarize repo/ --max-seconds 120` read it whole with window attention, which sees
    the first and last pages as it writes: the summary was about the last file's last
    function, nothing else of 36 files. A summary's budget picks parts or outlines; sparse
    only where asked for by a sparse flag."""
    fast_sparse = replace(RATES, sparse_prefill_tok_s=5_000, sparse_decode_tok_s=30)
    budget = summary_req(corpus_tokens=40_000, max_seconds=600, sparse_ok=True)
    assert make_plan(budget, SMOL, fast_sparse).mode is Mode.RETRIEVAL
    assert "sparse" not in " ".join(make_plan(replace(budget, max_seconds=0), SMOL, fast_sparse).reasons)
    assert make_plan(replace(budget, attention="topk"), SMOL, fast_sparse).mode is Mode.SPARSE  # asked for
    question = req(corpus_tokens=40_000, max_seconds=600, sparse_ok=True)
    assert make_plan(question, SMOL, fast_sparse).mode is Mode.SPARSE  # a question still is


def test_a_cold_index_plans_the_memory_its_embedding_takes():
    """A cold 1.2M-token folder (5,199 chunks) peaked at 1,102 MiB against 973 planned: the
    embedding's heap grows with the chunks it embeds; a warm index embeds none."""
    cold = make_plan(req(corpus_tokens=1_200_000, n_chunks=5199), SMOL, RATES)
    warm = make_plan(req(corpus_tokens=1_200_000, n_chunks=5199, uncached_tokens=0), SMOL, RATES)
    assert cold.mode is warm.mode is Mode.RETRIEVAL
    assert 200 * 2**20 < cold.est_memory_bytes - warm.est_memory_bytes <= 210 * 2**20
    # Past a few thousand chunks the heap grows no more (12,591 chunks peaked at 924 MiB,
    # planned at 1.4 GiB): a 63K-chunk input plans the same growth.
    huge = make_plan(req(corpus_tokens=15_000_000, n_chunks=63_000), SMOL, RATES)
    huge_warm = make_plan(req(corpus_tokens=15_000_000, n_chunks=63_000, uncached_tokens=0), SMOL, RATES)
    assert huge.est_memory_bytes - huge_warm.est_memory_bytes == cold.est_memory_bytes - warm.est_memory_bytes


def test_retrieval_memory_is_planned_as_measured_by_chunks_embedded():
    """Retrieval was planned at 0.76-0.83 of its peak under ~600 chunks, and `--max-memory
    1GB` refused the tutorial's question planned at 0.98 GiB (peaks 770-806 MiB; probe 107).
    Measured (2026-12-07, 2-core EPYC, SmolLM2 int8): the peak RSS of questions over the
    tutorial (341 chunks), typer (540) and rich (1,470), cold and warm index, against the
    planned read of the same window; each within 0.95 of its plan, none over."""
    from ktcli.plan.estimates import EMBED_BYTES_PER_CHUNK, EMBED_GROWTH_CHUNKS, EMBEDDER_BYTES

    def embedder(chunks: int) -> int:  # what a cold index of `chunks` adds to the read's own
        return EMBEDDER_BYTES + min(chunks, EMBED_GROWTH_CHUNKS) * EMBED_BYTES_PER_CHUNK

    mib = 2**20
    # (chunks, cold, the plan's read and index without the embedder in MiB, peaks in MiB)
    for chunks, cold, read, peaks in ((341, True, 807.0, (787, 806)), (341, False, 807.0, (770,)),
                                      (540, True, 824.7, (867, 889)), (540, False, 824.7, (778,)),
                                      (1470, True, 813.4, (931, 979)),
                                      (1470, False, 813.4, (819,))):
        planned = read * mib + (embedder(chunks) if cold else EMBEDDER_BYTES)
        assert all(peak * mib <= 0.95 * planned for peak in peaks), (chunks, cold, planned / mib)
    # the tutorial's warm question, planned at 0.98 GiB, is within --max-memory 1GB
    assert 807.0 * mib + EMBEDDER_BYTES < 10**9
    # past the cap no less than before (200 MiB + 32 KB x 4,096): a 5,199-chunk folder peaked at 1,102 MiB
    assert embedder(5199) >= 200 * mib + 4096 * 32 * 2**10


def test_a_conversion_over_the_memory_budget_is_refused_with_what_to_do():
    """It raised the plan to 1.34 GB under a 1 GB budget without a word."""
    with pytest.raises(OutOfMemoryError, match="converts the model"):
        make_plan(req(corpus_tokens=2000, convert_params=SMOL.n_params, memory_budget=10**9), SMOL, RATES)
    late = make_plan(req(corpus_tokens=2000, convert_params=SMOL.n_params, max_seconds=30), SMOL, RATES)
    assert "over the 30s budget" in late.reasons[-1]


def test_retrieval_over_the_kernels_pages_plans_pages_for_what_a_read_holds():
    """Retrieval under --rope-scaling yarn:4 was planned at 973 MiB, with the engine's
    pages for the scaled window alone at 744 MiB; under yarn:8 a 2,200-token read held
    pages for 65K tokens (1,486 MiB). Its pages are now sized to the most one read puts in
    the window, and planned so."""
    from ktcli.plan.planner import MEMORY_TOKENS, PARTS_MARGIN_TOKENS, PROMPT_OVERHEAD_TOKENS

    wide = replace(SMOL, context_window=32768, hidden_size=576, intermediate_size=1536, host_bytes=380 << 20,
                   weight_bytes=151_430_400, kv_dtype="fp16")
    plain = make_plan(req(corpus_tokens=200_000, n_chunks=800, mode="retrieval"), wide, RATES)
    paged = make_plan(req(corpus_tokens=200_000, n_chunks=800, mode="retrieval", kernel_pages=True), wide, RATES)
    assert plain.kv_window == 0  # the dense pages on the host are resident only once written
    assert paged.kv_window == (paged.evidence_budget + PROMPT_OVERHEAD_TOKENS + MEMORY_TOKENS + 10
                               + max(paged.answer_budget, MEMORY_TOKENS) + PARTS_MARGIN_TOKENS)
    from ktcli.plan.estimates import sparse_memory

    pages = 2 * 30 * 3 * 64 * 2 * paged.kv_window  # fp16 K and V
    assert sparse_memory(wide, paged.kv_window, "fp16") - sparse_memory(wide, 0, "fp16") > 0.8 * pages
    assert paged.est_memory_bytes < plain.est_memory_bytes + pages  # (the whole window's: +1.3 GB)
    # a summary's windows hold more; a window the read would fill keeps its own size
    summary = make_plan(req(task="summarize", corpus_tokens=200_000, n_chunks=800, mode="retrieval",
                            kernel_pages=True), wide, RATES)
    assert summary.kv_window > paged.kv_window
    narrow = make_plan(req(corpus_tokens=200_000, n_chunks=800, mode="retrieval", kernel_pages=True), SMOL, RATES)
    assert narrow.kv_window in (0, *range(1, 8192))


@pytest.mark.parametrize("n,size,budget", [(30, 265, 3072), (30, 400, 3072), (8, 700, 3072), (12, 250, 1200),
                                           (5, 1900, 6144), (40, 120, 3072)])
def test_windows_are_planned_as_whole_passages_in_their_tags_pack_them(n, size, budget):
    """The plan divided the evidence by the budget (2 windows where the run read 3, and 3
    for 4): a window holds whole passages of varied size, each in its source tag."""
    import random

    from ktcli.plan.planner import PASSAGE_TAG_TOKENS, _windows_packed

    rng = random.Random(n * size)
    counts = []
    for _ in range(300):
        sizes = [rng.uniform(0.5, 1.5) * size for _ in range(n)]
        windows, used = 1, 0.0
        for s in sizes:  # windows.pack: greedy, in order
            item = s + PASSAGE_TAG_TOKENS
            if used and used + item > budget:
                windows, used = windows + 1, 0.0
            used += item
        counts.append(windows)
    mean = sum(counts) / len(counts)
    assert abs(_windows_packed(n * size, n, budget) - mean) <= 0.75, mean


def test_passages_near_a_window_each_take_one():
    """A summary's passages are joined up to a window each: the half-passage waste doubled
    the windows (26 planned for the tutorial, 12 read)."""
    from ktcli.plan.planner import _windows_packed

    assert _windows_packed(79_000, 13, 6144) == 13
    assert _windows_packed(3000, 1, 6144) == 1


def test_retrieved_chunks_are_planned_at_the_inputs_own_chunk_and_tag_sizes():
    """The tutorial's chunks average ~227 model tokens in tags of ~40 (most end early, at a
    heading or blank line): planned as full chunks with their overlap (265) in tags of 30,
    10 or 11 retrieved chunks were 2 windows where the run read 1 (2,426 and 2,662 tokens
    as read). 16 were read in 2, and still are planned so."""
    from ktcli.plan.planner import _windows_packed

    tutorial = dict(corpus_tokens=78_975, n_chunks=341, mode="retrieval", chunk_mean_tokens=233.0,
                    passage_tag_tokens=41.0)
    for top_k in (8, 10, 11):
        assert make_plan(req(top_k=top_k, **tutorial), SMOL, RATES).n_windows == 1
    assert make_plan(req(top_k=16, **tutorial), SMOL, RATES).n_windows == 2
    # the same read without the sizes: full chunks with their overlap, in tags of PASSAGE_TAG_TOKENS
    guessed = req(top_k=11, **(tutorial | dict(chunk_mean_tokens=0.0, passage_tag_tokens=0.0)))
    assert make_plan(guessed, SMOL, RATES).n_windows == 2
    # the last window leaves nothing out: 8 chunks of 340 tokens in their tags of 30
    # (2,960) fill one 3,072-token window, which the plan had as 2
    assert _windows_packed(8 * 340, 8, 3072) == 1


def test_a_summary_of_six_documents_within_one_windows_evidence_is_one_part():
    """Six documents of ~5.6K tokens with their tags (5,237 of SmolLM2's as read) are read
    in one part of 6,144: planned as 2 while the half passage was left out of the last
    window too. That part takes notes, then the summary is written from them (`summarize`),
    so the plan has a note step for it: it was timed as the reduce step alone."""
    from ktcli.plan.planner import note_steps

    six = req(task="summarize", corpus_tokens=5610, question_tokens=0, n_documents=6, mode="retrieval")
    plan = make_plan(six, SMOL, RATES)
    assert plan.n_windows == 1
    assert note_steps("summarize", 1) == 1 and note_steps("ask", 1) == 0
    kept = make_plan(replace(six, kept_notes=1, notes_all_kept=True), SMOL, RATES)
    assert kept.est_seconds < plan.est_seconds - 5_000 / RATES.prefill_tok_s  # its part's read, not done again


def test_a_summary_is_written_from_every_parts_notes_and_the_file_listing():
    """The reduce step reads every part's notes beside the file listing (fitted to the
    window): planned as one part's notes and the prompt (209 tokens), ktcli/plan's 6 parts
    were written from ~440, and code notes run ~300 tokens a part."""
    from ktcli.plan.estimates import prefill_seconds

    code = replace(RATES, notes_tokens=300.0)
    base = req(task="summarize", corpus_tokens=27_000, question_tokens=0, n_documents=3, mode="retrieval")
    plain = make_plan(base, SMOL, code)
    listed = make_plan(replace(base, listing_tokens=2000), SMOL, code)
    assert plain.n_windows >= 5
    assert listed.est_seconds - plain.est_seconds == pytest.approx(2000 / RATES.prefill_tok_s)
    # all the parts' notes: more than one part's worth of reduce prompt
    one_part = prefill_seconds(300 + 160, RATES.prefill_tok_s)
    every = prefill_seconds(plain.n_windows * 300 + 160, RATES.prefill_tok_s)
    fewer_notes = make_plan(base, SMOL, replace(RATES, notes_tokens=300.0 / plain.n_windows))
    assert plain.est_seconds > fewer_notes.est_seconds + (every - one_part) * 0.9
    # never past the window: a hundred parts' notes are fitted to it
    huge = req(task="summarize", corpus_tokens=600_000, question_tokens=0, n_documents=1, mode="retrieval",
               listing_tokens=3000)
    assert make_plan(huge, SMOL, code).est_seconds == make_plan(replace(huge, listing_tokens=30_000), SMOL, code).est_seconds


def test_the_time_spent_reading_counts_and_a_big_index_takes_time_to_load():
    """A 10 MB file read in 2.6 s and a cached index of 12,591 chunks built for the
    question in ~1 s: its first token came at 6.1 s, planned at 3.3 s."""
    for mode, tokens in (("full", 2000), ("retrieval", 500_000)):
        plain = make_plan(req(corpus_tokens=tokens, mode=mode, n_chunks=2000, uncached_tokens=0), SMOL, RATES)
        read = make_plan(req(corpus_tokens=tokens, mode=mode, n_chunks=2000, uncached_tokens=0, read_s=2.5),
                         SMOL, RATES)
        assert read.est_seconds - plain.est_seconds == pytest.approx(2.5)
        assert read.est_first_token_seconds - plain.est_first_token_seconds == pytest.approx(2.5)
        assert read.read_s == 2.5
    small = make_plan(req(corpus_tokens=240_000, mode="retrieval", n_chunks=1000, uncached_tokens=0), SMOL, RATES)
    big = make_plan(req(corpus_tokens=2_400_000, mode="retrieval", n_chunks=10_000, uncached_tokens=0), SMOL, RATES)
    assert big.est_first_token_seconds - small.est_first_token_seconds == pytest.approx(9_000 * 80e-6)


def test_a_memory_refusal_names_what_the_plan_holds():
    with pytest.raises(OutOfMemoryError, match=r"even retrieval needs .*\(the model, one window, the embedder and an index of 2,000 chunks\)"):
        make_plan(req(corpus_tokens=500_000, n_chunks=2000, memory_budget=600 * 2**20), SMOL, RATES)
    with pytest.raises(OutOfMemoryError, match=r"even retrieval needs .*\(the model and one window\)"):  # a summary indexes nothing
        make_plan(req(task="summarize", question_tokens=0, corpus_tokens=500_000, n_chunks=2000,
                      memory_budget=600 * 2**20), SMOL, RATES)


def test_a_plan_over_the_budget_is_said_to_take_more_than_it():
    """"no plan is estimated within the 20s budget; this one takes ~20s": rounded up."""
    for tokens in (3000, 5000, 7000, 20_000):
        over = make_plan(req(corpus_tokens=tokens, n_chunks=30, max_seconds=1), SMOL, RATES)
        said = next(r for r in over.reasons if r.startswith("no plan is estimated within"))
        assert int(said.rsplit("~", 1)[1].split("s")[0]) >= over.est_seconds


def test_mode_full_past_the_window_suggests_only_the_modes_that_can_run():
    """Under --context-window the error said "use --mode auto, retrieval or sparse", and
    sparse was then refused for passing the cap (probe 95)."""
    base = req(corpus_tokens=30_000, n_chunks=157, mode="full", sparse_ok=True)
    with pytest.raises(UsageError, match=r"use --mode auto, retrieval or sparse$"):
        make_plan(base, SMOL, RATES)
    with pytest.raises(UsageError, match=r"use --mode auto, retrieval$"):
        make_plan(replace(base, window_cap=2048), replace(SMOL, context_window=2048), RATES)
    with pytest.raises(UsageError, match=r"use --mode auto, retrieval$"):
        make_plan(replace(base, sparse_ok=False), SMOL, RATES)  # another engine: no sparse mode


def test_a_first_run_on_engine_hf_plans_the_float32_file_it_writes():
    """--engine hf on a GGUF writes its weights in float32 once (538 MB, ~1 s for the
    bundled model); the plan said nothing of it."""
    warm = make_plan(req(corpus_tokens=2000), SMOL, RATES)
    first = make_plan(req(corpus_tokens=2000, float32_params=SMOL.n_params), SMOL, RATES)
    assert first.mode is warm.mode and 0.5 < first.est_seconds - warm.est_seconds < 3
    assert "writes the model's weights in float32" in first.reasons[-1] and "0.50 GiB on disk" in first.reasons[-1]
    both = make_plan(req(corpus_tokens=2000, convert_params=SMOL.n_params, convert_largest=49152 * 576,
                         float32_params=SMOL.n_params), SMOL, RATES)
    assert "converts the model" in both.reasons[-2] and "float32" in both.reasons[-1]  # in the run's order


def test_a_budget_just_under_a_full_read_is_not_refused_as_retrievals():
    """A 2K-token PDF under --max-memory 800MB (full ~764 MiB, retrieval ~0.97 GiB with its
    embedder) was refused with "even retrieval needs ~0.97 GiB": full is the smallest read."""
    base = req(corpus_tokens=2_000, n_chunks=10)
    full = make_plan(base, SMOL, RATES).est_memory_bytes
    retrieval = make_plan(replace(base, mode="retrieval"), SMOL, RATES).est_memory_bytes
    assert full < retrieval
    with pytest.raises(OutOfMemoryError, match="even full needs"):
        make_plan(replace(base, memory_budget=full - 1), SMOL, RATES)
    assert make_plan(replace(base, memory_budget=full), SMOL, RATES).mode is Mode.FULL


def test_mode_full_whose_answer_budget_overflows_says_to_lower_it():
    """`--mode full --max-new-tokens 8000` on a 2K-token input said "use --mode auto", which
    then refused the same budget: the budget is what to change."""
    with pytest.raises(UsageError, match="lower --max-new-tokens to [0-9,]+ or less"):
        make_plan(req(corpus_tokens=2_000, mode="full", max_new_tokens=8_000), SMOL, RATES)
    with pytest.raises(UsageError, match="use --mode auto, retrieval"):
        make_plan(req(corpus_tokens=20_000, n_chunks=90, mode="full"), SMOL, RATES)


def test_a_dense_read_over_other_pages_is_timed_at_their_measured_speed():
    """Probe 100: --kv-dtype fp8 decoded 2.1 tok/s where its plan said ~28 (the model's own
    pages' rate); int8 and int4 pages, which the bytes-read model made cheaper, are dearer
    on the CPU too (`estimates.DENSE_PAGE_SPEED`)."""
    plain = make_plan(req(corpus_tokens=2000), SMOL, RATES)
    plans = {k: make_plan(req(corpus_tokens=2000, kv_dtype=k), SMOL, RATES) for k in ("fp8", "int8", "int4")}
    assert plans["fp8"].est_seconds > 5 * plain.est_seconds
    assert plain.est_seconds < plans["int8"].est_seconds < plans["int4"].est_seconds < plans["fp8"].est_seconds
    # a sparse policy's pages are timed by the sparse mode's own factors, not these
    windowed = make_plan(req(corpus_tokens=2000, kv_dtype="fp8", attention="window:4"), SMOL, RATES)
    assert windowed.est_seconds < plans["fp8"].est_seconds


def test_a_setting_from_the_environment_or_the_config_file_is_named_as_such():
    """Probe 108: KTCLI_MODE=retrieval was planned with the reason "--mode retrieval asked
    for", a flag the user never typed; so were the errors."""
    assert make_plan(req(mode="retrieval"), SMOL, RATES).reasons[0] == "--mode retrieval asked for"
    env = make_plan(req(mode="retrieval", origins=(("mode", "KTCLI_MODE"),)), SMOL, RATES)
    assert env.reasons[0] == "retrieval asked for by KTCLI_MODE"
    filed = make_plan(req(mode="full", origins=(("mode", "mode in /home/u/ktcli.toml"),)), SMOL, RATES)
    assert filed.reasons[0] == "full asked for by mode in /home/u/ktcli.toml"
    with pytest.raises(UsageError, match=r"^KTCLI_MODE full: the input is ~50,000 tokens"):
        make_plan(req(mode="full", corpus_tokens=50_000, origins=(("mode", "KTCLI_MODE"),)), SMOL, RATES)


@pytest.mark.parametrize("task", ["summarize", "ask"])
def test_a_read_in_windows_says_its_count_as_an_estimate_and_the_run_says_its_own(task):
    """A summary's plan said "map over 13 window(s)" of a run whose `n_windows` (and
    `figures.windows`) were 12: the plan counts windows before the passages are packed by
    their exact sizes."""
    from ktcli.plan.planner import with_windows

    plan = make_plan(req(task=task, corpus_tokens=100_000, question_tokens=0 if task == "summarize" else 10,
                         n_chunks=200), SMOL, RATES)
    assert plan.mode is Mode.RETRIEVAL and plan.n_windows > 1
    said = [r for r in plan.reasons if "window(s)" in r]
    assert len(said) == 1 and f"about {plan.n_windows} window(s)" in said[0]
    ran = with_windows(plan, plan.n_windows - 1)
    assert ran.n_windows == plan.n_windows - 1
    read = [r for r in ran.reasons if "window(s)" in r]
    assert len(read) == 1 and f" {plan.n_windows - 1} window(s)" in read[0] and "about" not in read[0]
    assert [r for r in ran.reasons if r not in read] == [r for r in plan.reasons if r not in said]  # the rest as they were


def test_a_time_said_over_the_budget_reads_over_it():
    # A mixed folder planned 600.4 s read whole: "reading every line would take ~600s > 600s budget".
    whole = make_plan(summary_req(corpus_tokens=100_000, outline="never", outline_tokens=20_000, outline_files=40),
                      SMOL, RATES)
    budget = whole.est_seconds - 0.05  # the estimate a hair over it
    plan = make_plan(summary_req(corpus_tokens=100_000, outline_tokens=20_000, outline_files=40, max_seconds=budget),
                     SMOL, RATES)
    said, over = map(float, re.search(r"~(\d+)s > ([\d.]+)s budget", plan.reasons[0]).groups())
    assert said > over


def test_a_sampled_counts_margin_is_weighed_not_reported():
    """Probe 124: the tutorial's plan said input_tokens 78,975 under auto (a sampled count,
    floored at 1.25 model tokens per estimate token) and 68,575 under --mode sparse (counted
    whole). The margin still decides (the same windows and times); the plan says the count."""
    padded = summary_req(corpus_tokens=100_000, outline_tokens=20_000, outline_files=40)
    scaled = replace(padded, count_scale=0.87)
    plain, plan = make_plan(padded, SMOL, RATES), make_plan(scaled, SMOL, RATES)
    assert (plan.mode, plan.n_windows, plan.est_seconds) == (plain.mode, plain.n_windows, plain.est_seconds)
    assert (plan.input_tokens, plan.read_tokens) == (87_000, 17_400)
    assert (plain.input_tokens, plain.read_tokens) == (100_000, 20_000)
    assert any("~17,400 of ~87,000 tokens" in r for r in plan.reasons)
    asked = make_plan(req(corpus_tokens=100_000, question_tokens=10, count_scale=0.87), SMOL, RATES)
    assert asked.input_tokens == 87_000 and any("the input (~87,000 tokens) exceeds" in r for r in asked.reasons)


def test_a_memory_budget_no_setting_gave_is_named_as_the_default():
    """Probe 124: on a machine whose free memory had dropped, a command with no --max-memory
    was refused "over the --max-memory budget of 0.34 GiB"."""
    from ktcli.plan.planner import DEFAULT_MEMORY_BUDGET

    tight = req(corpus_tokens=2000, memory_budget=300 * 2**20)
    with pytest.raises(OutOfMemoryError) as given:
        make_plan(tight, SMOL, RATES)
    assert "over the --max-memory budget of 0.29 GiB" in str(given.value)
    with pytest.raises(OutOfMemoryError) as default:
        make_plan(replace(tight, origins=(("max_memory", DEFAULT_MEMORY_BUDGET),)), SMOL, RATES)
    said = str(default.value)
    assert "--max-memory budget" not in said
    assert "over the default memory budget of 0.29 GiB (80% of the memory available now; --max-memory sets another)" in said


def test_a_summary_of_documents_all_shown_whole_is_planned_without_a_model():
    """Probe 128: two one-line files, each shown whole (no model loads), were planned at
    ~37 s and 607 MiB, the kernels' compile on a first run added; the run took 1.4 s and
    141 MiB. One of two shown whole: the other's summary alone is timed."""
    from ktcli.plan.planner import NO_MODEL_BYTES

    req = PlanRequest(task="summarize", corpus_tokens=80, question_tokens=0, n_documents=2,
                      largest_document_tokens=60, read_s=0.4)
    read_both = make_plan(req, SMOL, RATES)
    alone = make_plan(replace(req, shown_whole=2, compiles_kernels=True), SMOL, RATES)
    assert alone.mode is Mode.FULL and alone.n_windows == 2
    assert alone.est_seconds == alone.est_first_token_seconds == 0.4 and alone.est_memory_bytes == NO_MODEL_BYTES
    assert any("no model is loaded" in r for r in alone.reasons) and not any("compiles" in r for r in alone.reasons)
    one = make_plan(replace(req, shown_whole=1), SMOL, RATES)
    assert one.est_seconds < read_both.est_seconds and one.est_memory_bytes == read_both.est_memory_bytes
    assert any("1 of them shown whole" in r for r in one.reasons)
