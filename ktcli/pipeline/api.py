"""The three things the CLI can ask of the pipeline. Each is one call."""

from __future__ import annotations

import time
from dataclasses import replace

from ktcli.config import Settings, canonical_attention
from ktcli.engine import loading as engine_loading
from ktcli.engine.loading import load_backend, weights_note
from ktcli.engine.model_store import resolve_model
from ktcli.errors import InterruptedAnswer, KtcliError
from ktcli.pipeline import citations
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.prepare import Prepared, mostly_code, prepare, save_rates, server_assumption
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.pipeline.summarize import summarize
from ktcli.plan.estimates import MODEL_PAGES, rates_without_context, read_cost, sparse_speed
from ktcli.plan.planner import MODEL_TOKENS_PER_ESTIMATE
from ktcli.types import Answer, Mode, ModelFacts


def ask(paths: list[str], question: str, settings: Settings, reporter: Reporter,
        stdin_text: str | None = None, on_plan=None, on_answer=None) -> Answer:
    return _execute(paths, question, "ask", answer_question, settings, reporter, stdin_text, on_plan, on_answer)


def summarize_paths(paths: list[str], settings: Settings, reporter: Reporter,
                    stdin_text: str | None = None, on_plan=None, on_answer=None) -> Answer:
    return _execute(paths, "", "summarize", summarize, settings, reporter, stdin_text, on_plan, on_answer)


def _execute(paths, question, task, run, settings: Settings, reporter: Reporter, stdin_text, on_plan,
             on_answer) -> Answer:
    """prepare -> (show the plan) -> load the backend -> run the task -> (show the answer)
    -> finish the backend's held-back work -> remember the rates.

    `on_answer(answer)` is given the answer before the backend finishes: the engine's
    prompt-cache write (0.3-0.8 s for a 200-400 MB entry) then never delays the sources.
    Without it the answer returned has the figures of that write too."""
    tally = Tally()
    prep = prepare(paths, question, task, settings, reporter, stdin_text)
    if on_plan:
        on_plan(prep)
    # Loaded where the task first needs it: a summary of files each shown whole (`summarize._quoted`)
    # needs none, and loaded all the same it took seconds and a few hundred MiB.
    backend = _OnFirstUse(lambda: _load(settings, reporter, prep.plan))
    if task == "ask":  # (every question reads the model, and its load is said before retrieval's lines)
        backend.load()
    try:
        answer = run(prep, backend, settings, reporter, tally)
    except InterruptedAnswer as e:  # its Sources in the user's lines and pages too, with their sections
        raise InterruptedAnswer(str(e), _placed(e.answer, prep)) from None
    except KtcliError as e:
        if getattr(e, "partial", None) is not None:
            # Text kept past an error (a summary's notes, an answer a server cut off): --json's
            # object has the plan, figures and skipped files as an interrupted answer's does.
            kept = getattr(e, "answer", None) or Answer(e.partial, (), prep.plan, tally.figures(), prep.corpus.skipped)
            e.answer = _placed(kept, prep)
        raise
    answer = _placed(answer, prep)
    try:
        if on_answer is not None:
            on_answer(answer)
    finally:  # the entry is kept even where showing the answer failed (a closed pipe)
        trouble = backend.finish()
    if trouble:
        reporter.warn(trouble)
    if backend.loaded and (kept := backend.last_stats.extra.get("kept_tokens")):
        answer = replace(answer, stats=answer.stats | {"kept_tokens": kept})
    # A first run's conversion (~20-40 s, once), a compile of the kernels or a measurement
    # of int4 key weights (`engine.loading.one_time_s`) is no load time to plan runs with:
    # such a run's load is not measured (0); nor is one that loaded nothing.
    one_time = prep.converts_model or engine_loading.one_time_s > 0
    load_s = 0.0 if one_time else backend.load_s
    _remember_rates(settings, tally, sparse=answer.plan.mode is Mode.SPARSE, load_s=load_s,
                    embed_tok_s=_embed_rate(answer.stats), attention=answer.plan.attention,
                    kv_dtype=answer.plan.kv_dtype, facts=prep.facts, code=mostly_code(prep.corpus.documents))
    return answer


def plan_only(paths: list[str], question: str, settings: Settings, reporter: Reporter,
              stdin_text: str | None = None) -> tuple[Prepared, dict]:
    task = "ask" if question.strip() else "summarize"
    prep = prepare(paths, question, task, settings, reporter, stdin_text, contact_server=False)
    if settings.backend == "openai":
        model = {"name": prep.facts.name, "server": settings.base_url, "context_window": prep.facts.context_window,
                 "contacted": not server_assumption(settings)}
        if assumed := server_assumption(settings):
            model["assumed"] = assumed
    else:
        source = resolve_model(settings.model, settings.named("model"))
        model = {"name": prep.facts.name, "path": str(source.path), "converted": not prep.converts_model,
                 "context_window": prep.facts.context_window, "layers": prep.facts.n_layers}
    extra = {
        "model": model,
        "engine": "openai" if settings.backend == "openai" else settings.engine,
        "documents": len(prep.corpus.documents),
        "chunks": len(prep.chunks),
    }
    return prep, extra


# The figures every answer's --json has, whatever its mode and task (a read of the whole
# input has no index, a question no outlines): a script read `figures.index_s` and met a
# KeyError on the next input. The backend's own (kv pages, device) vary with it.
FIGURE_DEFAULTS = {
    "retrieved": 0, "windows": 1, "evidence": [], "index_s": 0.0, "index_bytes": 0, "embedded_now": 0,
    "embedded_tokens": 0, "embed_s": 0.0, "reused": 0, "not_embedded": 0, "outlined_files": 0, "outlined": [], "stopped_repeating": 0,
    # the prompt cache's (read, written) and the answer budget's (its value where reached):
    # there only when nonzero, they were KeyErrors for the next run's script
    "reused_tokens": 0, "reuse_s": 0.0, "kept_tokens": 0, "hit_max_new_tokens": 0,
    # the answer's labels moved to the passage that backs their sentence (`qa._count_moved`):
    # there only when some were, and never in a summary, which writes no labels to move
    "labels_moved": 0,
    # an option's own entry, where the answer about it says little of it (`qa._check_the_entry`)
    "option_entry": None,
}


def _placed(answer: Answer, prep: Prepared) -> Answer:
    """Citations named with their sections and in the lines and pages of the user's files;
    the figures with every key (FIGURE_DEFAULTS)."""
    answer = replace(answer, stats=FIGURE_DEFAULTS | answer.stats)
    return citations.in_source_lines(citations.with_sections(answer, prep.corpus), prep.corpus)


class _OnFirstUse:
    """The backend `load()` gives, loaded the first time any of it is used; `finish()`
    before that has nothing to finish. `load_s`: the load's seconds (0: not loaded)."""

    def __init__(self, load) -> None:
        object.__setattr__(self, "_loader", load)
        object.__setattr__(self, "_backend", None)
        object.__setattr__(self, "load_s", 0.0)

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def load(self):
        if self._backend is None:
            start = time.perf_counter()
            object.__setattr__(self, "_backend", self._loader())
            object.__setattr__(self, "load_s", time.perf_counter() - start)
        return self._backend

    def finish(self) -> str | None:
        return self._backend.finish() if self._backend is not None else None

    def __getattr__(self, name: str):
        return getattr(self.load(), name)

    def __setattr__(self, name: str, value) -> None:  # (runner sets `on_prefill` on the backend)
        setattr(self.load(), name, value)


def _load(settings: Settings, reporter: Reporter, plan=None):
    if settings.backend == "openai":
        reporter.status(f"connecting to {settings.base_url} (OpenAI-compatible server)")
    else:
        reporter.status(f"loading model {settings.model} ({settings.engine} engine{weights_note(settings.weights)})")
    return load_backend(settings, reporter.status, plan, on_warning=reporter.warn)


def _remember_rates(settings: Settings, tally: Tally, sparse: bool, load_s: float, embed_tok_s: float,
                    attention: str = "", kv_dtype: str = "", facts: ModelFacts | None = None,
                    code: bool = False) -> None:
    prefill = decode = 0.0
    if tally.prefill_s and tally.decode_s:
        # A prompt read back from the prefix store says nothing about the prefill rate.
        prefill = 0.0 if tally.reused_tokens else tally.prompt_tokens / tally.prefill_s
        decode = tally.new_tokens / tally.decode_s
        if not sparse and facts is not None:  # kept as rates without context, which plans scale by each read's
            prefill, decode = rates_without_context(prefill, tally.prompt_tokens, tally.prompt_square, decode,
                                                    tally.new_tokens, tally.decode_context,
                                                    read_cost(facts, attention, kv_dtype))
    # A read in the window over pages other than the model's own (--kv-dtype fp8 decoded
    # 2-4 tok/s where the default decodes 15-40) or with a sparse policy (--attention
    # window:2) is not the dense read whose rates `rates.json` keeps: stored, a few such
    # runs moved the median, and a plain ask was planned at ~121 s where it took ~45.
    other_read = not sparse and (kv_dtype not in MODEL_PAGES or canonical_attention(attention) != "dense")
    if settings.rope_scaling or other_read or (sparse and canonical_attention(attention) not in _DEFAULT_POLICIES):
        # Not the rates a plan weighs: a read past the trained window (--rope-scaling)
        # decoded 4.3 tok/s over 19K tokens of context, and short reads were then planned
        # at that (a 16 s answer at 99 s); a sparse policy reading more pages than the
        # default's is slower in proportion. Its load time and embedding rate still count.
        prefill = decode = 0.0
    if sparse:  # stored as the reference kind's rates, which each kind's plan scales (`plan.estimates`)
        prefill_x, decode_x = sparse_speed(attention, kv_dtype)
        prefill, decode = prefill / prefill_x, decode / decode_x
    # A model's notes for the next window run ~120 tokens where 384 may be written (SmolLM2):
    # planned at 384, summaries read in parts were planned 2-2.7x too long.
    notes = tally.notes_tokens / tally.notes_calls if tally.notes_calls else 0.0
    save_rates(settings, prefill, decode, sparse, load_s, embed_tok_s, notes, code=code)


_DEFAULT_POLICIES = (canonical_attention("topk"), canonical_attention("window"), "dense")
# Embedding fewer tokens than this times mostly the first batches' warm-up: not a rate.
MIN_EMBED_TOKENS_TIMED = 20_000


def _embed_rate(figures: dict) -> float:
    """Tokens embedded per second in this run, in the plan's (model) tokens; 0: not timed.
    The plan assumed 4,000 tok/s and never learned otherwise: cold indexes of 300K and 1.2M
    tokens ran at 1,300-1,400 tok/s on a busy 2-core machine, 2.5x the estimate."""
    tokens, seconds = figures.get("embedded_tokens", 0), figures.get("embed_s", 0.0)
    if tokens < MIN_EMBED_TOKENS_TIMED or seconds <= 0:
        return 0.0
    return tokens * MODEL_TOKENS_PER_ESTIMATE / seconds
