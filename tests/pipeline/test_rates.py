"""Measured throughput is remembered per engine and model, and sparse runs apart."""

from dataclasses import replace

import pytest

from ktcli.config import Settings
from ktcli.pipeline.prepare import load_rates, save_rates
from ktcli.plan import Throughput


def test_sparse_runs_keep_their_own_rates(tmp_path):
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    assert load_rates(settings) == Throughput()
    save_rates(settings, 300.0, 20.0)
    save_rates(settings, 180.0, 4.0, sparse=True)
    rates = load_rates(settings)
    assert (rates.prefill_tok_s, rates.decode_tok_s) == (300.0, 20.0)  # not dragged down by the sparse run
    assert (rates.sparse_prefill_tok_s, rates.sparse_decode_tok_s) == (180.0, 4.0)
    save_rates(settings, 100.0, 10.0)  # blended half and half; the sparse rates stay
    rates = load_rates(settings)
    assert (rates.prefill_tok_s, rates.decode_tok_s, rates.sparse_prefill_tok_s) == (200.0, 15.0, 180.0)


def test_first_run_rates_follow_the_model_size(tmp_path):
    """Before any run measured them, the local CPU engine's rates come from the model: decode
    from its weight bytes, prefill from its parameter count; other backends keep defaults."""
    from ktcli.types import ModelFacts

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    small = ModelFacts("m", 8192, 30, 3, 64, n_params=135_000_000, weight_bytes=152_000_000)
    big = replace(small, n_params=1_350_000_000, weight_bytes=1_520_000_000)
    a, b = load_rates(settings, small), load_rates(settings, big)
    assert a.decode_tok_s > 9 * b.decode_tok_s and a.prefill_tok_s > 9 * b.prefill_tok_s
    # the sparse mode's too (a fake 8B was planned a sparse read as fast as SmolLM2's), and
    # the load: SmolLM2's are the measured defaults
    assert (a.sparse_prefill_tok_s, round(a.sparse_decode_tok_s), a.load_s) == (300.0, 24, 1.5)
    assert a.sparse_prefill_tok_s > 9 * b.sparse_prefill_tok_s and a.sparse_decode_tok_s > 9 * b.sparse_decode_tok_s
    eight_b = replace(small, n_params=8_000_000_000, weight_bytes=8_600_000_000)
    assert load_rates(settings, eight_b).load_s == 9.6
    assert load_rates(replace(settings, backend="openai"), small) == Throughput()
    save_rates(settings, 300.0, 20.0)  # measured rates win
    assert load_rates(settings, small).decode_tok_s == 20.0


def test_planned_weight_bytes_follow_the_dtype(monkeypatch):
    from ktcli.pipeline import prepare

    base = Settings()
    monkeypatch.setattr(prepare, "_on_gpu", lambda s: False)
    assert prepare.planned_weights(replace(base, weights="auto")) == "int8"
    assert prepare.planned_weights(replace(base, weights="bf16")) == "bf16"
    assert prepare.planned_weights(replace(base, engine="hf")) == "fp32"
    monkeypatch.setattr(prepare, "_on_gpu", lambda s: True)
    assert prepare.planned_weights(replace(base, weights="auto")) == "bf16"


def test_planned_kv_dtype_follows_the_weights(monkeypatch):
    from ktcli.pipeline import prepare

    base = Settings()
    monkeypatch.setattr(prepare, "_on_gpu", lambda s: False)
    assert prepare.planning_facts(replace(base, weights="auto")).kv_dtype == "fp16"
    assert prepare.planning_facts(replace(base, weights="fp32")).kv_dtype == "fp32"


def test_planning_facts_give_the_widths_and_count_the_runtime_where_the_budget_is_ram(monkeypatch):
    from ktcli.pipeline import prepare
    from ktcli.plan.estimates import CPU_RUNTIME_BYTES

    monkeypatch.setattr(prepare, "_on_gpu", lambda s: False)
    cpu = prepare.planning_facts(Settings())
    assert (cpu.hidden_size, cpu.intermediate_size) == (576, 1536)  # SmolLM2-135M
    assert cpu.host_bytes == CPU_RUNTIME_BYTES
    # transformers in bf16 casts from the fp32 file, which is resident while it loads
    hf_bf16 = prepare.planning_facts(replace(Settings(), engine="hf", weights="bf16"))
    assert hf_bf16.host_bytes == CPU_RUNTIME_BYTES + 4 * hf_bf16.n_params
    assert prepare.planning_facts(replace(Settings(), engine="hf")).host_bytes == CPU_RUNTIME_BYTES
    monkeypatch.setattr(prepare, "_on_gpu", lambda s: True)
    assert prepare.planning_facts(Settings()).host_bytes == 0  # a GPU's budget is its own memory


def test_one_slow_run_does_not_move_the_estimate(tmp_path):
    """A run slowed by another process (2-3x on 2 cores) is one sample among the last five,
    not half the next estimate; a machine that stays slow moves it after three runs."""
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    for _ in range(3):
        save_rates(settings, 450.0, 70.0)
    save_rates(settings, 180.0, 25.0)  # under load
    assert (load_rates(settings).prefill_tok_s, load_rates(settings).decode_tok_s) == (450.0, 70.0)
    save_rates(settings, 440.0, 68.0)
    assert load_rates(settings).decode_tok_s == 70.0
    for _ in range(3):
        save_rates(settings, 180.0, 25.0)
    assert load_rates(settings).decode_tok_s == 25.0  # the last five: 25 68 25 25 25
    # only the last five runs count
    for _ in range(3):
        save_rates(settings, 450.0, 70.0)
    assert load_rates(settings).decode_tok_s == 70.0


def test_rates_written_before_the_history_start_it(tmp_path):
    import json

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    save_rates(settings, 300.0, 20.0)
    path = settings.cache_path / "rates.json"
    data = json.loads(path.read_text())
    del data["recent runs"]  # as an older ktcli wrote it: one blended rate per key
    path.write_text(json.dumps(data))
    save_rates(settings, 100.0, 10.0)
    assert load_rates(settings).decode_tok_s == 15.0  # the old rate is one sample


def test_a_cache_folder_that_cannot_be_written_keeps_no_rates_and_raises_nothing(tmp_path):
    # The answer has streamed when the rates are saved: a read-only or full cache folder
    # must not turn it into an error (it lost the answer's citations and exit status).
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    settings = replace(Settings(), cache_dir=str(blocked / "cache"))
    save_rates(settings, 300.0, 20.0)
    assert load_rates(settings) == Throughput()


def test_load_time_is_remembered_and_planned(tmp_path):
    """The plan's times include loading the model, the median of the last five loads: one
    slow load (packing new weights; a conversion is not recorded at all, `pipeline.api`)
    is outvoted by the next two."""
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    save_rates(settings, 300.0, 20.0, load_s=40.0)
    assert load_rates(settings).load_s == 40.0
    for _ in range(2):
        save_rates(settings, 300.0, 20.0, load_s=1.2)
    assert load_rates(settings).load_s == 1.2
    save_rates(settings, 300.0, 20.0)  # not measured: kept
    assert load_rates(settings).load_s == 1.2


def test_a_sparse_run_keeps_the_model_sized_rates_of_the_other_modes(tmp_path):
    """A first run in sparse mode stored sparse rates only, and the full mode's went back
    to the class defaults (150 / 10 tok/s) instead of the model's size."""
    from ktcli.types import ModelFacts

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    small = ModelFacts("m", 8192, 30, 3, 64, n_params=135_000_000, weight_bytes=152_000_000)
    before = load_rates(settings, small)
    save_rates(settings, 420.0, 30.0, sparse=True)
    after = load_rates(settings, small)
    assert (after.prefill_tok_s, after.decode_tok_s) == (before.prefill_tok_s, before.decode_tok_s)
    assert (after.sparse_prefill_tok_s, after.sparse_decode_tok_s) == (420.0, 30.0)


def test_the_figures_give_the_runs_rates_not_the_last_calls():
    """The engine's extras hold its last call's rates; they replaced the run's totals."""
    from ktcli.engine.backend import GenStats
    from ktcli.pipeline.runner import Tally

    class Calls:
        last_stats = None

    tally, backend = Tally(), Calls()
    for prompt, new, pre, dec in ((3000, 300, 10.0, 10.0), (100, 20, 0.2, 1.0)):
        backend.last_stats = GenStats(prompt_tokens=prompt, new_tokens=new, prefill_s=pre, decode_s=dec,
                                      extra={"prefill_tok_s": prompt / pre, "decode_tok_s": new / dec, "engine": "ktcli"})
        tally.add(backend)
    figures = tally.figures()
    assert figures["prefill_tok_s"] == round(3100 / 10.2, 1) and figures["decode_tok_s"] == round(320 / 11.0, 1)
    assert figures["engine"] == "ktcli"


def test_rope_scaling_sets_the_planned_window(monkeypatch):
    """The engine runs --rope-scaling yarn:2 with twice the trained window; the plan kept
    8K and refused `--mode full` for a 10K-token input."""
    from ktcli.pipeline import prepare

    monkeypatch.setattr(prepare, "_on_gpu", lambda s: False)
    assert prepare.planning_facts(Settings()).context_window == 8192  # SmolLM2-135M
    assert prepare.planning_facts(replace(Settings(), rope_scaling="yarn:2")).context_window == 16384
    assert prepare.planning_facts(replace(Settings(), rope_scaling="none")).context_window == 8192
    capped = replace(Settings(), rope_scaling="linear:4", context_window=12000)
    assert prepare.planning_facts(capped).context_window == 12000


def test_the_embedding_rate_is_learned_from_runs_that_embedded_enough(tmp_path):
    """The plan assumed 4,000 tok/s for ever: cold 300K and 1.2M-token indexes took 2.5x
    their estimates on a busy machine."""
    from ktcli.pipeline.api import _embed_rate

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    assert _embed_rate({"embedded_tokens": 500, "embed_s": 0.1}) == 0.0  # a few chunks: warm-up, not a rate
    rate = _embed_rate({"embedded_tokens": 100_000, "embed_s": 80.0})
    assert rate == pytest.approx(100_000 * 1.25 / 80.0)
    save_rates(settings, 300.0, 20.0, embed_tok_s=rate)
    assert load_rates(settings).embed_tok_s == pytest.approx(rate, abs=0.01)
    save_rates(settings, 300.0, 20.0)  # a run that embedded nothing keeps it
    assert load_rates(settings).embed_tok_s == pytest.approx(rate, abs=0.01)


@pytest.mark.parametrize("content", ['[]', '{"recent runs": []}', '{"ktcli:smollm2:auto": 5}',
                                     '{"ktcli:smollm2:auto": {"decode_tok_s": "fast", "prefill_tok_s": NaN}}',
                                     '{"recent runs": {"ktcli:smollm2:auto": {"decode_tok_s": "x"}}}'])
def test_a_rates_file_of_another_shape_is_replaced_not_trusted(tmp_path, content):
    """Valid JSON of the wrong shape failed every ask after its answer (internal error)."""
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "rates.json").write_text(content)
    assert load_rates(settings).decode_tok_s == Throughput().decode_tok_s
    save_rates(settings, 300.0, 20.0)
    assert load_rates(settings).decode_tok_s == 20.0


def test_the_prefill_rate_leaves_the_prompt_caches_reads_out():
    """930 of 931 tokens read back in 0.27 s gave "prefill 3.5 tok/s" in --json."""
    from ktcli.engine.backend import GenStats
    from ktcli.pipeline.runner import Tally

    class Read:
        last_stats = GenStats(prompt_tokens=931, new_tokens=5, prefill_s=0.28, decode_s=0.1,
                              extra={"reused_tokens": 930, "reuse_s": 0.27})

    tally = Tally()
    tally.add(Read())
    assert tally.figures()["prefill_tok_s"] == 0.0  # one token: not a rate
    Read.last_stats = GenStats(prompt_tokens=1000, new_tokens=5, prefill_s=1.3, decode_s=0.1,
                               extra={"reused_tokens": 500, "reuse_s": 0.3})
    fresh = Tally()
    fresh.add(Read())
    assert fresh.figures()["prefill_tok_s"] == 500.0


def test_reads_past_the_window_or_wider_policies_teach_no_rates(tmp_path):
    """A --rope-scaling read decoded 4.3 tok/s over 19K tokens of context; stored, it
    planned every later short read at that (16 s -> 99 s)."""
    from ktcli.pipeline.api import _remember_rates
    from ktcli.pipeline.runner import Tally

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    tally = Tally(prompt_tokens=19_000, new_tokens=43, prefill_s=40.0, decode_s=10.0)
    _remember_rates(replace(settings, rope_scaling="yarn:4"), tally, sparse=False, load_s=1.2, embed_tok_s=0.0)
    assert load_rates(settings).decode_tok_s == Throughput().decode_tok_s and load_rates(settings).load_s == 1.2
    _remember_rates(settings, tally, sparse=True, load_s=1.2, embed_tok_s=0.0, attention="topk:64")
    assert load_rates(settings).sparse_decode_tok_s == Throughput().sparse_decode_tok_s
    _remember_rates(settings, tally, sparse=True, load_s=1.2, embed_tok_s=0.0, attention="topk")
    assert load_rates(settings).sparse_decode_tok_s == 4.3


def test_the_notes_a_model_writes_are_learned_for_the_next_plan(tmp_path):
    """Plans timed every window's notes at the 384 tokens of room; the model's own average
    is kept, as its rates are (a median of recent runs)."""
    from ktcli.pipeline.api import _remember_rates
    from ktcli.pipeline.runner import Tally

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    assert load_rates(settings).notes_tokens == Throughput().notes_tokens
    tally = Tally(prompt_tokens=9_000, new_tokens=500, prefill_s=9.0, decode_s=10.0, notes_calls=3, notes_tokens=360)
    _remember_rates(settings, tally, sparse=False, load_s=1.2, embed_tok_s=0.0)
    assert load_rates(settings).notes_tokens == 120.0
    _remember_rates(settings, Tally(prompt_tokens=900, new_tokens=50, prefill_s=1.0, decode_s=1.0), sparse=False,
                    load_s=1.2, embed_tok_s=0.0)  # a run without notes keeps what was learned
    assert load_rates(settings).notes_tokens == 120.0


def test_notes_over_code_are_learned_apart_from_notes_over_prose(tmp_path):
    """A summary of ktcli/plan wrote ~310 tokens of notes a step where the tutorial's wrote
    49; planned at the 49 (the median of the runs before, prose), it took 304 s for 222
    planned. An input mostly of code is planned at what code runs taught (until one has,
    Throughput's code_notes_tokens), prose at what prose runs did."""
    from ktcli.pipeline.api import _remember_rates
    from ktcli.pipeline.prepare import mostly_code
    from ktcli.pipeline.runner import Tally
    from ktcli.types import Document

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    assert load_rates(settings, code=True).notes_tokens == Throughput().code_notes_tokens
    prose = Tally(prompt_tokens=9_000, new_tokens=500, prefill_s=9.0, decode_s=10.0, notes_calls=3, notes_tokens=147)
    for _ in range(3):
        _remember_rates(settings, prose, sparse=False, load_s=1.2, embed_tok_s=0.0)
    assert load_rates(settings, code=True).notes_tokens == Throughput().code_notes_tokens
    code = Tally(prompt_tokens=9_000, new_tokens=500, prefill_s=9.0, decode_s=10.0, notes_calls=6, notes_tokens=1847)
    _remember_rates(settings, code, sparse=False, load_s=1.2, embed_tok_s=0.0, code=True)
    assert load_rates(settings).notes_tokens == 49.0
    assert load_rates(settings, code=True).notes_tokens == pytest.approx(307.83)

    module = Document(path="planner.py", text="def plan():\n    return 1\n" * 50, kind="code")
    readme = Document(path="README.md", text="# Plan\n\nThe planner decides.\n", kind="markdown")
    assert mostly_code([module, readme]) and not mostly_code([readme]) and not mostly_code([])


def test_an_answer_is_not_counted_as_notes():
    """stream_answer counted the answer as notes: a whole-read ask of 12 tokens taught
    every later summary plan "notes = 12 tokens"."""
    from ktcli.engine.backend import SamplingParams
    from ktcli.pipeline.events import NullReporter
    from ktcli.pipeline.runner import Tally, generate_text, stream_answer
    from tests.pipeline.fake_backend import FakeBackend

    tally = Tally()
    stream_answer(FakeBackend(), [{"role": "user", "content": "Question: q"}], SamplingParams(max_new_tokens=8),
                  tally, NullReporter())
    assert tally.notes_calls == 0 and tally.notes_tokens == 0
    generate_text(FakeBackend(), [{"role": "user", "content": "notes"}], SamplingParams(max_new_tokens=8), tally,
                  NullReporter(), "notes")
    assert tally.notes_calls == 1 and tally.notes_tokens > 0


def test_rates_are_kept_without_context_so_a_short_and_a_long_read_agree(tmp_path):
    """A rate learned at 1K tokens planned a 7K read 1.5x too quick, one learned at 7K a 1K
    read too slow: kept as rates of steps without context, both runs teach the same."""
    from ktcli.engine.backend import GenStats
    from ktcli.pipeline.api import _remember_rates
    from ktcli.pipeline.runner import Tally
    from tests.plan.test_context_cost import SMOL

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    learned = []
    # measured through the CLI on the Xeon: 2,458 tok/s at 1,027 tokens, 1,545 at 6,877
    for prompt, prefill, new, decode in ((1027, 2458, 90, 104), (6877, 1545, 93, 42.3)):
        class Call:
            last_stats = GenStats(prompt_tokens=prompt, new_tokens=new, prefill_s=prompt / prefill,
                                  decode_s=new / decode)

        tally = Tally()
        tally.add(Call())
        _remember_rates(replace(settings, cache_dir=str(tmp_path / str(prompt))), tally, sparse=False, load_s=1.0,
                        embed_tok_s=0.0, facts=SMOL)
        learned.append(load_rates(replace(settings, cache_dir=str(tmp_path / str(prompt)))))
    short, long = learned
    assert short.prefill_tok_s == pytest.approx(long.prefill_tok_s, rel=0.15) and short.prefill_tok_s > 2458
    assert short.decode_tok_s == pytest.approx(long.decode_tok_s, rel=0.25) and long.decode_tok_s > 2 * 42.3


def test_rates_kept_before_they_were_kept_without_context_are_left_out(tmp_path):
    """A file's rates measured with their context in them, read as rates without context,
    planned a 7.5K-token read at 68.6 s instead of 24.5 (and pushed summaries to outlines)."""
    import json

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    (tmp_path / "cache").mkdir()
    old = {"ktcli:smollm2:auto": {"prefill_tok_s": 841.0, "decode_tok_s": 28.0, "load_s": 1.2},
           "recent runs": {"ktcli:smollm2:auto": {"prefill_tok_s": [841.0], "decode_tok_s": [28.0], "load_s": [1.2]}}}
    (tmp_path / "cache" / "rates.json").write_text(json.dumps(old))
    rates = load_rates(settings)
    assert rates.prefill_tok_s == Throughput().prefill_tok_s and rates.load_s == 1.2  # the rest is kept
    save_rates(settings, 3000.0, 120.0)
    assert (load_rates(settings).prefill_tok_s, load_rates(settings).decode_tok_s) == (3000.0, 120.0)  # not a median with 841
    save_rates(settings, 3200.0, 110.0)
    assert load_rates(settings).prefill_tok_s == 3100.0


def test_reads_over_other_pages_or_policies_in_the_window_teach_no_dense_rates(tmp_path):
    """`ask --kv-dtype fp8` (full mode) decoded 2-4 tok/s where the model's own pages decode
    15-40: stored as the dense rates, three such runs planned a plain ask at ~121 s (~45 s)."""
    from ktcli.pipeline.api import _remember_rates
    from ktcli.pipeline.runner import Tally

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    slow = Tally(prompt_tokens=2_000, new_tokens=30, prefill_s=10.0, decode_s=10.0)
    for kv_dtype, attention in (("fp8", "dense"), ("int4", "dense"), ("model", "window:2"), ("model", "topk:4")):
        _remember_rates(settings, slow, sparse=False, load_s=1.2, embed_tok_s=0.0, attention=attention,
                        kv_dtype=kv_dtype)
    assert load_rates(settings).decode_tok_s == Throughput().decode_tok_s and load_rates(settings).load_s == 1.2
    _remember_rates(settings, slow, sparse=False, load_s=1.2, embed_tok_s=0.0, attention="dense", kv_dtype="model")
    assert load_rates(settings).decode_tok_s == 3.0


def test_naming_the_weights_auto_loads_keeps_autos_rates(tmp_path):
    """`--weights int8` on a CPU loads what auto does: it was planned from untrained
    defaults (~14 s) beside auto's measured ~30 s."""
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    save_rates(settings, 123.0, 12.0)
    assert load_rates(replace(settings, weights="int8")).prefill_tok_s == 123.0
    assert load_rates(replace(settings, weights="fp32")).prefill_tok_s != 123.0


def test_a_sparse_read_not_measured_yet_scales_with_the_dense_ones(tmp_path):
    """Probe 100: a first sparse read was planned at the default 300 tok/s of prefill (71 s
    to its first token) on a machine whose dense reads ran 0.6x their defaults; it ran 121
    tok/s (148 s). Until a sparse read is measured, its rates move as the dense ones did."""
    from ktcli.types import ModelFacts

    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), device="cpu")
    small = ModelFacts("m", 8192, 30, 3, 64, n_params=135_000_000, weight_bytes=152_000_000)
    before = load_rates(settings, small)
    save_rates(settings, before.prefill_tok_s * 0.5, before.decode_tok_s * 0.25)
    slow = load_rates(settings, small)
    assert slow.sparse_prefill_tok_s == pytest.approx(before.sparse_prefill_tok_s * 0.5, rel=0.01)
    assert slow.sparse_decode_tok_s == pytest.approx(before.sparse_decode_tok_s * 0.25, rel=0.01)
    save_rates(settings, 100.0, 9.0, sparse=True)  # measured: its own
    assert (load_rates(settings, small).sparse_prefill_tok_s, load_rates(settings, small).sparse_decode_tok_s) == (100.0, 9.0)
