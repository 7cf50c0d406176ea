"""The planner: decides how a request uses the model, and says why.

It is a pure function of facts so it can be unit-tested without a model: the pipeline
counts tokens, reads the model's shape and the machine's memory, and passes them in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ktcli.config import canonical_attention, named_setting
from ktcli.errors import OutOfMemoryError, UsageError
from ktcli.plan.estimates import (
    EMBED_BYTES_PER_CHUNK,
    EMBED_GROWTH_CHUNKS,
    DENSE_PAGE_SPEED,
    EMBEDDER_BYTES,
    FLOAT32_BYTES_PER_PARAM,
    FLOAT32_WRITE_S_PER_PARAM,
    LATER_READS_GROWTH_BYTES,
    MODEL_PAGES,
    ContextCost,
    conversion_bytes,
    conversion_seconds,
    generation_memory,
    decode_seconds,
    dense_page_speed,
    generation_seconds,
    paged_dense_scores_bytes,
    prefill_seconds,
    read_cost,
    sparse_memory,
    sparse_speed,
)
from ktcli.types import Mode, ModelFacts, Plan

# Model tokens per tiktoken (cl100k) token, measured on the sample docs with SmolLM2's
# tokenizer; estimates are padded with it so "fits" errs on the safe side.
MODEL_TOKENS_PER_ESTIMATE = 1.25
# Chat template, instructions and citation labels around the evidence.
PROMPT_OVERHEAD_TOKENS = 160
# Room kept for the running notes passed from window to window.
MEMORY_TOKENS = 384
# Retrieval QA reads at most this much evidence per window: a small model answers better
# from a few focused passages than from a full window, and each window costs prefill time.
QA_EVIDENCE_CAP = 3072
# Summaries read everything; bigger windows mean fewer (fixed-cost) decode passes.
SUMMARY_WINDOW_CAP = 6144
# Sparse mode (whole input in the paged, quantized cache): the KV dtypes and policies it
# weighs, most preferred first (int8 is near-lossless at a quarter of fp32's bytes).
SPARSE_DTYPES = ("int8", "int4", "fp32")
SPARSE_POLICIES = ("topk", "window")
# Without --max-seconds, auto mode reads a too-long input whole only when that takes at
# most this long; otherwise retrieval, which reads a few chunks, is the answer.
SPARSE_DEFAULT_SECONDS = 600.0
# --mode sparse takes the kind of pages the prompt cache holds when it holds this share of the input.
HELD_SHARE = 0.5
# A sparse read's window (its KV pages, all allocated up front) leaves this much room past
# the estimated prompt and answer: the token estimate errs long, but not always.
SPARSE_WINDOW_MARGIN = 2048
# Without --max-seconds, auto reads an input whole in the window (full) when that takes at
# most this long, or retrieval is no quicker: a window widened by --rope-scaling yarn:8 took
# a 60K-token input whole, planned at ~83 minutes, where retrieval took ~45 s.
FULL_DEFAULT_SECONDS = 600.0
# A summary whose every line would take longer than this to read (without --max-seconds)
# reads its code files and long prose as outlines (`ingest.outline`), when that is faster.
SUMMARY_DEFAULT_SECONDS = 600.0
# How the reason of a plan over its time budget starts (the CLI finds it so, and kept notes
# drop it: matched by its figure, it stayed once that figure was rounded up)
BUDGET_MISS = "no plan is estimated within"
# ... and those of a summary over the default budget (no --max-seconds), which kept notes
# drop too: "even so it takes ~1216s, over the 600s default budget" stood beside an
# estimate of ~42 s with every note kept.
DEFAULT_BUDGET_MISSES = ("even so it takes ~", "reading every line takes ~")
OUTLINE_CHOICES = ("auto", "always", "never")


# A question read whole loads the embedder to rank its key lines and embeds up to 256 of
# them (`pipeline.key_lines`), ~125 MiB more. Timed on the 2-core EPYC beside one busy
# process: loading sentence-transformers and MiniLM 1.6-2.0 s; the sample PDF's 90 lines
# 1.2-1.9 s, 256 lines of a licence text 2.7-3.7 s. A flat 1.0 s planned a second
# question about a cached 60K-token text at 6.5 s to its first token; it took 20 s, 7.4 s
# of them here (a session probe).
KEY_LINES_LOAD_S = 2.0
KEY_LINES_MAX_TOKENS = 256 * 20  # the lines embedded at most (`key_lines.MAX_DENSE_LINES`), ~20 tokens each
KEY_LINES_BYTES = 128 * 2**20


def key_lines_seconds(req: "PlanRequest", rates: "Throughput") -> float:
    """What ranking a whole read's key lines adds: the embedder's load and its lines."""
    if not req.key_lines:
        return 0.0
    return KEY_LINES_LOAD_S + min(req.corpus_tokens, KEY_LINES_MAX_TOKENS) / max(rates.embed_tok_s, 1e-9)


@dataclass(frozen=True)
class Throughput:
    """Measured (or default) rates on this machine for the chosen engine and model."""

    prefill_tok_s: float = 150.0
    decode_tok_s: float = 10.0
    embed_tok_s: float = 4000.0
    # The sparse mode's own rates (paged quantized cache, chunked sparse prefill), until a
    # sparse run on this machine measures them: SmolLM2 with int8 weights, topk int8/int4
    # at 4K-16K tokens on 2 CPU cores, prefill 345-460 tok/s and decode 27-33 tok/s
    # (benchmarks/sparse_speed.py, 2026-12-03, with the C++ page plan); rounded down.
    sparse_prefill_tok_s: float = 300.0
    sparse_decode_tok_s: float = 24.0
    # From the plan to a loaded model (`pipeline.api`): the packed weights read back, the
    # tokenizer, the C++ kernels. ~1.0-1.5 s for SmolLM2 here once its cache is filled.
    load_s: float = 1.5
    # Tokens a model writes as notes for the next window (up to MEMORY_TOKENS), until a run
    # measures them: half the room. SmolLM2 writes ~120 on average (a session probe's 18
    # summaries; `pipeline.api` learns it per model).
    notes_tokens: float = 192.0
    # ... and over code, kept apart (`prepare.load_rates` takes it for an input mostly of
    # code): a summary of ktcli/plan wrote ~310 a step where the tutorial's wrote 49, and
    # planned at the 49 its prose runs had taught, it took 1.37x its plan (304 s for 222).
    code_notes_tokens: float = 320.0


@dataclass(frozen=True)
class PlanRequest:
    task: str  # "ask" | "summarize"
    corpus_tokens: int  # in the model's tokens (exact or scaled estimate)
    question_tokens: int
    n_documents: int
    # the largest document's tokens with its source tag (0: not known): a summary of a few
    # documents is read one by one where each fits the window alone
    largest_document_tokens: int = 0
    mode: str = "auto"  # auto | full | retrieval | sparse
    chunk_tokens: int = 256
    chunk_overlap: int = 32
    n_chunks: int = 0  # when known (after chunking); else estimated
    top_k: int = 8
    max_new_tokens: int = 384
    max_seconds: float = 0.0  # 0: no latency budget
    memory_budget: int = 0  # bytes; 0: no limit
    uncached_tokens: int | None = None  # tokens that still need embedding (None: all)
    # A question's index embeds the chunks its words point at: this many of `unembedded`
    # not in the index cache (--embed auto, `retrieval.retriever.FOCUS_FROM`); (0, 0): it
    # embeds all it lacks
    focus_chunks: int = 0
    unembedded_chunks: int = 0
    kv_dtype: str = "auto"  # auto or a kernels KV kind (fp32, bf16, fp16, fp8, int8, int4)
    attention: str = "auto"  # auto | dense | window | topk
    sparse_ok: bool = False  # the engine can run the sparse mode (local ktcli engine)
    # Model tokens of a whole read's prompt already in the engine's prompt cache
    # (`engine.prefix_store`): prefilled by reading, not computing.
    cached_tokens: int = 0
    # The same for sparse reads: (page dtype, policy, tokens) per kind of pages held.
    sparse_cached: tuple[tuple[str, str, int], ...] = ()
    window_cap: int = 0  # --context-window: no read's window may pass it (0: none)
    # Where settings came from other than a flag (`Settings.origins`): a reason or an error
    # names KTCLI_MODE, not a --mode the user never typed (`_named`)
    origins: tuple[tuple[str, str], ...] = ()
    # Summaries: the corpus's tokens with its files read as outlines where they can be, and how many
    # files those are (0: nothing to outline); whether to (auto: when over the budget).
    outline_tokens: int = 0
    outline_files: int = 0
    outline: str = "auto"
    # Parameters of a GGUF this run converts first (once per model; 0: nothing to convert),
    # and its largest tensor's where ktcli's own converter takes it (0: transformers' does).
    convert_params: int = 0
    convert_largest: int = 0
    # This run compiles the engine's C++ kernels before its model loads (once per install,
    # where scripts/setup.sh did not: `engine.cpp_ext.compile_pending`).
    compiles_kernels: bool = False
    # Parameters whose float32 copy this run writes before transformers loads them (--engine
    # hf on a GGUF, once per model: `engine.gguf_weights.write_safetensors`; 0: none).
    float32_params: int = 0
    # The key lines a question read whole quotes before itself (0: none), which load the
    # embedder (`pipeline.key_lines`).
    key_lines: int = 0
    # A read in the window runs over the kernels' pages, allocated for the whole window
    # (--rope-scaling; `engine.longctx.wants_kernels`), not the dense cache.
    kernel_pages: bool = False
    # Seconds the command has spent reading, chunking and counting its input before this
    # plan: paid before the first token too, and counted in the figures' ttft (a 10 MB file
    # read in 2.6 s: its first token planned at 3.3 s came at 6.1).
    read_s: float = 0.0
    # Model tokens per estimate token, measured on this input where it could be: numbers
    # cost SmolLM2 2.5 tokens each of tiktoken's, Korean 2.0, English 1.1-1.25.
    tokens_per_estimate: float = MODEL_TOKENS_PER_ESTIMATE
    # Note steps of this request an earlier run left in the notes memo (`notes_memo.kept`):
    # read back, not generated (a summary's rerun was planned at ~54 s and took 3).
    kept_notes: int = 0
    # ... and they are all its note steps: every one this plan has is then read back, however
    # many windows it estimates.
    notes_all_kept: bool = False
    # A retrieved chunk as a window reads it, in model tokens: the input's chunks' mean
    # (overlap included) and their source tags' (0: not known; estimated from the corpus,
    # the chunk settings and PASSAGE_TAG_TOKENS). Chunks cut at headings and blank lines
    # are shorter than --chunk-tokens: the estimate had the tutorial's at 265 tokens where
    # they are 227, and planned 2 windows for 10 retrieved chunks that the run read in 1.
    chunk_mean_tokens: float = 0.0
    passage_tag_tokens: float = 0.0
    # A summary's file listing, in model tokens (in corpus_tokens too): the summary written
    # from the parts' notes reads it beside them.
    listing_tokens: int = 0
    # The model tokens of the kept notes where every note step is kept (0: not counted;
    # planned at MEMORY_TOKENS a step): a summary's rerun reads them alone.
    kept_notes_tokens: int = 0
    # The windows the earlier run that kept the notes packed (`notes_memo.kept`; 0: not
    # known): the same read packs the same ones, where the estimate may not.
    known_windows: int = 0
    # The input's best count per token counted here: the token counts above carry a margin
    # where the input was sampled, not counted (the fixed ratio, 1.25 model tokens per
    # estimate token, is their floor: "fits" errs on the safe side), which the plan weighs
    # by but does not report. The tutorial's plan said input_tokens 78,975 under auto (its
    # sampled 1.09 floored at 1.25) and 68,575 under --mode sparse (counted whole): 1.09/1.25.
    count_scale: float = 1.0
    # Documents of a summary of a few (one by one: `summarized_per_document`) each short
    # enough to be shown whole, not summarized (`prepare.shown_whole`): no model reads them,
    # and where all are, none is loaded (two one-line files were planned at ~37 s and 607 MiB
    # for a run of 1.4 s and 142 MiB). A summary of one document: 1 where it is badges alone.
    shown_whole: int = 0


# Building a cached index for a question (BM25 over the chunks' words, the vectors read
# into faiss, the symbol table): 0.96 s for 12,591 chunks (2026-12-05, Xeon).
INDEX_LOAD_S_PER_CHUNK = 80e-6


# Compiling the engine's C++ kernels on a first run that scripts/setup.sh did not do: 38 s
# on the 2-core EPYC, idle, since the three units compile side by side (67 s as one unit,
# `benchmarks.kernel_build`, 2026-12-06); a busy machine takes longer (113 s was seen for
# the one unit). The compiler's peak (~2 GiB) is its own process's, not ktcli's RSS.
KERNEL_COMPILE_S = 45.0


def make_plan(req: PlanRequest, facts: ModelFacts, rates: Throughput) -> Plan:
    rates = replace(rates, load_s=rates.load_s + req.read_s)  # every mode pays both before its work
    plan = replace(_planned_with_kept_notes(req, facts, rates), read_s=req.read_s)
    # the input's tokens as best counted, in every mode: not the margin the plan weighed by
    plan = replace(plan, input_tokens=_reported(req, plan.input_tokens), read_tokens=_reported(req, plan.read_tokens),
                   question_tokens=_reported(req, plan.question_tokens))
    if req.task == "summarize" and req.n_documents == 1 and req.shown_whole:
        # a file of badges alone (`pipeline.badges`): listed, with no model, in any mode (planned
        # ~35 s for a run of 0.8)
        return replace(plan, mode=Mode.FULL, n_windows=1, est_seconds=req.read_s, est_first_token_seconds=req.read_s,
                       est_memory_bytes=NO_MODEL_BYTES, cached_tokens=0, alternatives=(),
                       reasons=("the file holds badges alone: what they say is listed, no model is loaded",))
    if plan.mode is Mode.FULL and plan.n_windows > 1 and _loads_no_model(req):
        return replace(plan, reasons=(*plan.reasons, f"a summary of {plan.n_windows} documents, each short enough to be "
                                      "shown whole, not summarized: no model is loaded"))
    if plan.mode is Mode.FULL and plan.n_windows > 1:
        whole = f"; {req.shown_whole} of them shown whole, too short to summarize" if req.shown_whole else ""
        plan = replace(plan, reasons=(*plan.reasons, f"a summary of {plan.n_windows} documents: each read alone and "
                                      f"summarized in turn, in up to {per_document_tokens(plan.n_windows, req.max_new_tokens)} "
                                      f"tokens{whole}"))
    if req.compiles_kernels:  # weighed as the conversion is: every mode pays it, once
        plan = _plus_once(plan, req, KERNEL_COMPILE_S,
                          f"this first run compiles the engine's C++ kernels (once: ~{KERNEL_COMPILE_S:.0f} s)")
    if req.convert_params:
        plan = _with_conversion(plan, req)
    if req.float32_params:  # (said after the conversion, as the run does it)
        seconds = FLOAT32_WRITE_S_PER_PARAM * req.float32_params
        plan = _plus_once(plan, req, seconds, "this first run on --engine hf writes the model's weights in float32 "
                          f"for transformers to read (once: ~{_gb(FLOAT32_BYTES_PER_PARAM * req.float32_params)} "
                          f"on disk, ~{seconds:.0f} s)")
    return plan


def _with_conversion(plan: Plan, req: PlanRequest) -> Plan:
    """A plan on a model this run converts first: its time and peak memory (the modes are
    weighed without it, as every one of them pays it, once). The plan said 750 MiB and a
    7 s wait for a first run that took 61 s and peaked at 1.3 GiB. A --max-memory budget
    holds for it too: no mode avoids it, so the run is refused with what to do."""
    seconds = conversion_seconds(req.convert_params, req.convert_largest)
    peak = conversion_bytes(req.convert_params, req.convert_largest)
    if req.memory_budget and peak > req.memory_budget:
        raise OutOfMemoryError(
            f"this first run converts the model (once), which peaks at ~{_gb(peak)}, over the --max-memory "
            f"budget of {_gb(req.memory_budget)}: run it once without the budget (`ktcli plan` does not convert; "
            "any ask does), then the budget holds for the reads")
    plan = _plus_once(plan, req, seconds, f"this first run converts the model (once: ~{seconds:.0f} s, ~{_gb(peak)} "
                                          "at its peak)")
    return replace(plan, est_memory_bytes=max(plan.est_memory_bytes, peak))


def _plus_once(plan: Plan, req: PlanRequest, seconds: float, why: str) -> Plan:
    """`plan` with work a first run does before any mode's, said as `why`: its seconds
    before the first token, and where that passes --max-seconds, said (the reasons above
    weighed the modes without it)."""
    total = plan.est_seconds + seconds
    if req.max_seconds and total > req.max_seconds:
        why += f": ~{total:.0f}s in all, over the {req.max_seconds:g}s budget"
    return replace(plan, est_seconds=total,
                   est_first_token_seconds=plan.est_first_token_seconds + seconds if plan.est_first_token_seconds else 0.0,
                   reasons=(*plan.reasons, why))


def _make_plan(req: PlanRequest, facts: ModelFacts, rates: Throughput) -> Plan:
    if req.task not in ("ask", "summarize"):
        raise UsageError(f"unknown task {req.task!r}")
    if req.mode not in ("auto", "full", "retrieval", "sparse"):
        raise UsageError(f"{_named(req, 'mode')} {req.mode!r}: choose auto, full, sparse or retrieval")
    if req.outline not in OUTLINE_CHOICES:
        raise UsageError(f"{_named(req, 'outline')} {req.outline!r}: choose {', '.join(OUTLINE_CHOICES)}")
    can_outline = req.task == "summarize" and req.outline_files > 0 and req.outline_tokens < req.corpus_tokens
    if can_outline and req.outline == "always":
        return _outlined(req, facts, rates, _asked(req, "outline"))
    plan = _plan(req, facts, rates)
    budget_s = req.max_seconds or SUMMARY_DEFAULT_SECONDS
    if can_outline and req.outline == "auto" and plan.est_seconds > budget_s:
        outlined = _outlined(req, facts, rates, f"reading every line would take ~{_over(plan.est_seconds)}s > "
                                                 f"{budget_s:g}s budget")
        if outlined.est_seconds < plan.est_seconds:
            if outlined.est_seconds > budget_s and not req.max_seconds:  # said, as a given budget's miss is
                over = f"{DEFAULT_BUDGET_MISSES[0]}{_over(outlined.est_seconds)}s, over the {budget_s:g}s default budget"
                outlined = replace(outlined, reasons=(*outlined.reasons, over))
            return outlined
    if req.task == "summarize" and plan.est_seconds > budget_s and not req.max_seconds:
        # Said, not left to be found out: a 300-page book with no headings planned ~1,160 s
        # and read every line with no word about the 600 s budget.
        why = _asked(req, "outline") if req.outline == "never" else "nothing in it reads shorter as an outline"
        over = f"{DEFAULT_BUDGET_MISSES[1]}{_over(plan.est_seconds)}s, over the {budget_s:g}s default budget ({why})"
        plan = replace(plan, reasons=(*plan.reasons, over))
    return plan


def _reported(req: PlanRequest, tokens: int) -> int:
    """A count of the request's as the plan says it: without the margin of a sampled count
    (`PlanRequest.count_scale`)."""
    return tokens if req.count_scale == 1.0 else round(tokens * req.count_scale)


def _over(seconds: float) -> int:
    """Seconds said to be over a budget, rounded up: 600.4 s was "~600s > 600s budget"."""
    return math.ceil(seconds)


def _outlined(req: PlanRequest, facts: ModelFacts, rates: Throughput, why: str) -> Plan:
    """The plan of reading the corpus with its files as outlines where they can be (`ingest.outline`):
    planned like any input of that many tokens, then labelled."""
    plan = _plan(replace(req, corpus_tokens=req.outline_tokens, n_chunks=0), facts, rates)
    reason = (f"{why}: {req.outline_files} file(s) read as outlines (code: signatures, docstrings, comments; "
              f"long prose: headings and first paragraphs), ~{_reported(req, req.outline_tokens):,} of ~{_reported(req, req.corpus_tokens):,} tokens; --outline never reads every line")
    return replace(plan, input_tokens=req.corpus_tokens, read_tokens=req.outline_tokens,
                   outline_files=req.outline_files, reasons=(reason, *plan.reasons))


def _does_not_fit(req: PlanRequest, facts: ModelFacts, full_tokens: int) -> str:
    if full_tokens <= facts.context_window:  # the answer's budget is what tips it over
        return (f"the input (~{_reported(req, full_tokens):,} tokens with the prompt) and the answer budget ({req.max_new_tokens:,}) "
                f"exceed the {facts.context_window:,}-token window")
    if req.corpus_tokens + PROMPT_OVERHEAD_TOKENS + req.max_new_tokens <= facts.context_window:
        # the question is what tips it over: "the input exceeds the window" said of a CSV of
        # 6,592 tokens asked a question of 2,400
        return (f"the input (~{_reported(req, req.corpus_tokens):,} tokens) with the question "
                f"(~{_reported(req, req.question_tokens):,} tokens) "
                f"exceeds the {facts.context_window:,}-token window")
    return f"the input (~{_reported(req, req.corpus_tokens):,} tokens) exceeds the {facts.context_window:,}-token window"


def _plan(req: PlanRequest, facts: ModelFacts, rates: Throughput) -> Plan:

    full_tokens = req.corpus_tokens + req.question_tokens + PROMPT_OVERHEAD_TOKENS
    fits = full_tokens + req.max_new_tokens <= facts.context_window
    full = _full_plan(req, facts, rates, full_tokens)
    if summarized_per_document(req.task, req.n_documents):
        full = _per_document_plan(full, req, facts, rates)
    # A small window (512 tokens) has no room for retrieval's evidence beside its notes and
    # the answer: that only matters where retrieval is needed (a 40-token file could not be
    # asked about at all).
    try:
        retrieval: Plan | None = _retrieval_plan(req, facts, rates)
        no_retrieval: UsageError | None = None
    except UsageError as e:
        retrieval, no_retrieval = None, e
    sparse = _sparse_options(req, facts, rates, full_tokens)
    if req.mode != "sparse" and not fits:  # dense past the window answers noise: not offered
        sparse = [p for p in sparse if p.attention.partition(":")[0] != "dense"]
    if req.mode == "sparse":
        if not sparse:
            if req.sparse_ok and req.window_cap:
                raise UsageError(f"{_named(req, 'mode')} sparse reads the input whole (~{_reported(req, full_tokens):,} tokens with "
                                 f"the prompt), past the --context-window cap of {req.window_cap:,}; raise or drop the cap")
            if not req.sparse_ok:
                raise UsageError(f"{_named(req, 'mode')} sparse reads the input whole in ktcli's own paged cache: "
                                 "it needs the local ktcli engine (--engine ktcli, --backend local)")
            raise UsageError(f"{_named(req, 'mode')} sparse: {_sparse_rejection(req, sparse).strip('()')}")
        return _choose_sparse(req, sparse, fits, full, retrieval)
    # Auto reads a too-long input whole only when asked to weigh it: a latency budget or
    # a sparse-mode flag (--kv-dtype, --attention); otherwise retrieval, as before. Not a
    # summary for its budget alone: sparse attention sees a few pages of the input as it
    # writes (window: the first and the last), and a repo's summary under --max-seconds
    # 120 was about the last file's last function, nothing else of 36 files.
    policy_kind = req.attention.partition(":")[0]  # "topk:16": topk with 16 pages per step
    wants_sparse = weighs_sparse(req.task, req.max_seconds, req.attention, req.kv_dtype)
    if req.mode == "auto" and not fits and req.sparse_ok and wants_sparse:
        if policy_kind == "dense" and req.kv_dtype not in MODEL_PAGES:
            # asked for by name beside --kv-dtype: its answers past the window are noise
            raise UsageError(_DENSE_PAST_WINDOW.replace("--mode sparse", f"--kv-dtype {req.kv_dtype}"))
        budget_s = req.max_seconds or SPARSE_DEFAULT_SECONDS
        # Window attention only where asked for by name: it reads the first and the last
        # pages (~320 of a 69K-token tutorial's tokens), and auto chose it over retrieval
        # for --max-seconds 30 once its prefill was in the prompt cache, or for --kv-dtype
        # int8 where topk was planned past the budget: answers from the input's last lines.
        ok = [p for p in sparse if (not req.memory_budget or p.est_memory_bytes <= req.memory_budget)
              and p.est_seconds <= budget_s and p.attention.partition(":")[0] != "dense" and _auto_may_take(p, req)]
        if ok:
            reasons = (
                _does_not_fit(req, facts, full_tokens),
                f"read it whole in the paged {ok[0].kv_dtype} KV cache with {ok[0].attention} attention: "
                f"~{ok[0].est_seconds:.0f}s <= {budget_s:.0f}s budget, ~{_gb(ok[0].est_memory_bytes)}",
            )
            return _with(ok[0], reasons, retrieval, sparse)

    if req.mode == "full":
        room = facts.context_window - full_tokens
        if not fits and room >= 1 and not req.window_cap:
            # the input fits; the answer budget does not: --mode auto then refused the same
            # budget ("leaves no room for evidence"), so the way out is the budget
            raise UsageError(
                f"{_named(req, 'mode')} full: the input (~{_reported(req, full_tokens):,} tokens with the prompt) fits the model's "
                f"{facts.context_window:,}-token window, but not with the {req.max_new_tokens:,} tokens kept for the "
                f"answer; lower --max-new-tokens to {room:,} or less"
            )
        if not fits:
            raise UsageError(
                f"{_named(req, 'mode')} full: the input is ~{_reported(req, req.corpus_tokens):,} tokens but the model's window is "
                f"{facts.context_window:,} (with {req.max_new_tokens} kept for the answer); use --mode auto, retrieval"
                + ("" if req.window_cap or not req.sparse_ok else " or sparse")  # a sparse read may not pass the cap
            )
        if req.memory_budget and full.est_memory_bytes > req.memory_budget:
            raise OutOfMemoryError(
                f"{_named(req, 'mode')} full needs ~{_gb(full.est_memory_bytes)}, over the "
                f"{_budget(req)}{_smaller_suggestion(req, sparse)}"
            )
        return _with(full, (_asked(req, "mode"),), retrieval)
    if req.mode == "retrieval":
        if retrieval is None:
            raise no_retrieval
        if req.memory_budget and retrieval.est_memory_bytes > req.memory_budget:
            # as --mode full and --mode sparse are: `--mode retrieval --max-memory 300MB` was
            # planned at ~1012 MiB and run (820 MiB peak) with no word of the budget
            raise OutOfMemoryError(
                f"{_named(req, 'mode')} retrieval needs ~{_gb(retrieval.est_memory_bytes)} "
                f"({_what_takes_memory(retrieval)}), over the "
                f"{_budget(req)}{_smaller_suggestion(req, sparse)}"
            )
        return _with(retrieval, (_asked(req, "mode"), *_focus_reasons(req)), full if fits else None)
    if not fits and req.mode == "auto" and _each_document_fits(req, facts):
        # together past the window, one by one within it: each summarized whole, in turn
        # (a folder of 4 documents 123 tokens over the window was read in two parts, and
        # the summary was about the first document only)
        each = replace(full, est_memory_bytes=_full_memory(req, facts, req.largest_document_tokens
                                                           + PROMPT_OVERHEAD_TOKENS)  # (`_per_document_plan`'s)
                       + LATER_READS_GROWTH_BYTES)  # (read one after another)
        within = ((not req.memory_budget or each.est_memory_bytes <= req.memory_budget)
                  and (not req.max_seconds or each.est_seconds <= req.max_seconds
                       or (retrieval is not None and each.est_seconds <= retrieval.est_seconds)))
        if within:  # (else weighed as ever below: parts, or what the budgets allow)
            why = (f"the input (~{_reported(req, full_tokens):,} tokens with the prompt) exceeds the {facts.context_window:,}-token "
                   f"window, but each of its {req.n_documents} documents fits it alone")
            return _with(each, (why,), retrieval)

    reasons: list[str] = []
    chosen = retrieval
    if fits:
        chosen = full
        reasons.append(
            f"the whole input (~{_reported(req, full_tokens):,} tokens with the prompt) fits the {facts.context_window:,}-token window"
        )
        if retrieval is None:
            pass  # nothing to weigh it against
        elif req.memory_budget and full.est_memory_bytes > req.memory_budget > 0 \
                and retrieval.est_memory_bytes < full.est_memory_bytes:
            # only to a smaller read: retrieval holds the embedder too (a 2K-token PDF under
            # --max-memory 800MB, full ~764 MiB, was refused as "even retrieval needs ~0.97 GiB")
            chosen = retrieval
            reasons.append(f"but full needs ~{_gb(full.est_memory_bytes)} > budget {_gb(req.memory_budget)}")
        elif req.max_seconds and full.est_seconds > req.max_seconds and retrieval.est_seconds < full.est_seconds:
            chosen = retrieval
            reasons.append(f"but full needs ~{full.est_seconds:.0f}s > budget {req.max_seconds:.0f}s")
        elif not req.max_seconds and full.est_seconds > FULL_DEFAULT_SECONDS and retrieval.est_seconds < full.est_seconds:
            chosen = retrieval
            reasons.append(f"but full needs ~{full.est_seconds:.0f}s > the {FULL_DEFAULT_SECONDS:.0f}s default budget "
                           "(--mode full reads it whole all the same)")
    else:
        reasons.append(_does_not_fit(req, facts, full_tokens))
        if retrieval is None:
            raise no_retrieval
    if chosen is retrieval:
        reasons.extend((_retrieval_reason(req, retrieval), *_focus_reasons(req)))
    if req.memory_budget and chosen.est_memory_bytes > req.memory_budget:
        raise OutOfMemoryError(
            f"even {chosen.mode.value} needs ~{_gb(chosen.est_memory_bytes)} ({_what_takes_memory(chosen)}), over the "
            f"{_budget(req)}{_smaller_suggestion(req, sparse)}"
        )
    other = retrieval if chosen is full else (full if fits else None)
    if chosen is retrieval and sparse and not fits and req.task == "ask":  # (a summary: not offered, above)
        reasons.append(_sparse_rejection(req, sparse))
    if req.max_seconds and chosen.est_seconds > req.max_seconds:
        # Every way was weighed against the budget above (sparse included, which a
        # budget asks to weigh) and none is within it. Auto does not switch to the
        # experimental sparse mode for being less late; it names it where it is quicker.
        quicker = min(sparse, key=lambda p: p.est_seconds, default=None)
        hint = (f" (sparse {quicker.kv_dtype} {quicker.attention} ~{quicker.est_seconds:.0f}s: --mode sparse)"
                if quicker is not None and quicker.est_seconds < chosen.est_seconds and req.task == "ask" else "")
        # rounded up: "within the 20s budget; this one takes ~20s" read as a contradiction
        reasons.append(f"{BUDGET_MISS} the {req.max_seconds:g}s budget; this one takes "
                       f"~{math.ceil(chosen.est_seconds)}s{hint}")
    return _with(chosen, tuple(reasons), other, sparse)


def _sparse_options(req: PlanRequest, facts: ModelFacts, rates: Throughput, full_tokens: int) -> list[Plan]:
    """One sparse plan per KV dtype and policy the request allows, most preferred first
    (none where the engine cannot run it: a remote server has no paged cache of ours)."""
    if not req.sparse_ok or facts.n_kv_heads <= 0:
        return []
    if req.window_cap and full_tokens + req.max_new_tokens + SPARSE_WINDOW_MARGIN > req.window_cap:
        return []  # reading it whole needs a window past the --context-window cap

    dtypes = SPARSE_DTYPES if req.kv_dtype in MODEL_PAGES else (req.kv_dtype,)
    policies = SPARSE_POLICIES if req.attention in ("auto", "") else (req.attention,)
    base = _full_plan(req, facts, rates, full_tokens)
    # The engine's window for this read (`engine.loading`): its KV pages are sized to it.
    window = full_tokens + req.max_new_tokens + SPARSE_WINDOW_MARGIN
    held = {(dtype, policy): n for dtype, policy, n in req.sparse_cached}
    out = []
    for policy in policies:
        for dtype in dtypes:
            cached = min(held.get((dtype, canonical_attention(policy)), 0), full_tokens - 1)
            prefill_x, decode_x = sparse_speed(policy, dtype)
            decode_tok_s = rates.sparse_decode_tok_s * decode_x
            answer_s = decode_seconds(full_tokens, req.max_new_tokens, decode_tok_s)  # a bounded read: no context cost
            # (sparse rates are kept as measured, their first prefill's setup in them)
            seconds = (rates.load_s + prefill_seconds(full_tokens - cached, rates.sparse_prefill_tok_s * prefill_x,
                                                      first=False) + answer_s
                       + key_lines_seconds(req, rates))
            out.append(replace(
                base, mode=Mode.SPARSE, kv_dtype=dtype, attention=policy, context_window=window,
                est_seconds=seconds,
                est_memory_bytes=sparse_memory(facts, window, dtype) + (KEY_LINES_BYTES if req.key_lines else 0),
                est_first_token_seconds=_before_answer(seconds, answer_s),
                cached_tokens=max(cached, 0),
            ))
    return out


_DENSE_PAST_WINDOW = "--mode sparse with --attention dense cannot go past the model's window; use window or topk"


def _named(req: PlanRequest, name: str) -> str:
    """How a reason or an error names setting `name` (`config.named_setting`)."""
    return named_setting(req.origins, name)


def _asked(req: PlanRequest, name: str) -> str:
    """The reason a setting gives: "--mode retrieval asked for", or "retrieval asked for by
    KTCLI_MODE" where no flag said it (probe 108: the plan blamed a --mode never typed)."""
    value = getattr(req, name)
    named = _named(req, name)
    return f"{named} {value} asked for" if named.startswith("--") else f"{value} asked for by {named}"


def weighs_sparse(task: str, max_seconds: float, attention: str, kv_dtype: str) -> bool:
    """Whether auto weighs reading a too-long input whole in sparse pages: a question's
    latency budget, or a sparse flag (--attention window or topk, --kv-dtype)."""
    return ((bool(max_seconds) and task == "ask") or attention.partition(":")[0] in ("window", "topk")
            or kv_dtype not in MODEL_PAGES)


def _choose_sparse(req: PlanRequest, sparse: list[Plan], fits: bool, full: Plan, retrieval: Plan) -> Plan:
    if req.attention.partition(":")[0] == "dense" and not fits:
        raise UsageError(_DENSE_PAST_WINDOW)
    ok = [p for p in sparse if not req.memory_budget or p.est_memory_bytes <= req.memory_budget]
    if not ok:
        least = min(sparse, key=lambda p: p.est_memory_bytes)
        # "even at fp32" said of the one dtype asked for read as if fp32 were the smallest
        asked = req.kv_dtype not in MODEL_PAGES
        how = (f"with the {least.kv_dtype} pages asked for (--kv-dtype int4 pages take the least)" if asked
               else f"even at {least.kv_dtype}")
        raise OutOfMemoryError(
            f"{_named(req, 'mode')} sparse needs ~{_gb(least.est_memory_bytes)} {how}, over the "
            f"{_budget(req)}"
        )
    # Most preferred first, unless the prompt cache holds most of this input's pages of
    # another kind: read back, a minutes-long prefill takes seconds (a shared start of a
    # few chunks is not worth another policy's answers).
    # With --max-seconds, the kinds within it first (`--mode sparse --max-seconds 60` was
    # planned at ~379 s with int8 topk where window took less, and said nothing of the budget).
    if req.max_seconds and any(p.est_seconds <= req.max_seconds for p in ok):
        ok = [p for p in ok if p.est_seconds <= req.max_seconds]
    # Not window pages, unless window was asked for (`_auto_may_take`): a window read of the
    # tutorial in the prompt cache made every later `--mode sparse` question a window read,
    # answered from the input's last lines (probe 105).
    cached = [p for p in ok if p.cached_tokens >= HELD_SHARE * p.input_tokens]
    held = [p for p in cached if _auto_may_take(p, req)]
    chosen = max(held, key=lambda p: p.cached_tokens) if held else ok[0]
    reasons = (_asked(req, "mode"),
               f"{chosen.kv_dtype} pages with {chosen.attention} attention: ~{_gb(chosen.est_memory_bytes)}, ~{chosen.est_seconds:.0f}s")
    if not held and cached and chosen not in cached:
        other = max(cached, key=lambda p: p.cached_tokens)
        reasons += (f"the prompt cache holds {other.cached_tokens:,} tokens of this input's {other.kv_dtype} "
                    f"{other.attention} pages, not taken unasked ({other.attention} attention reads the input's first "
                    f"and last pages alone): --attention {other.attention} --kv-dtype {other.kv_dtype} reads them back "
                    f"in ~{other.est_seconds:.0f}s",)
    if req.max_seconds and chosen.est_seconds > req.max_seconds:
        reasons += (f"{BUDGET_MISS} the {req.max_seconds:g}s budget; this one takes ~{math.ceil(chosen.est_seconds)}s",)
    return _with(chosen, reasons, retrieval, sparse)


def _auto_may_take(plan: Plan, req: PlanRequest) -> bool:
    """Window attention only where asked for by name: it reads the input's first and last
    pages alone, so auto takes it neither to meet a time budget nor because it is cached
    (nor does --mode sparse for being cached: `_choose_sparse`)."""
    return plan.attention.partition(":")[0] != "window" or req.attention.partition(":")[0] == "window"


def _sparse_rejection(req: PlanRequest, sparse: list[Plan]) -> str:
    if not req.sparse_ok:
        return "(sparse mode, reading it whole, needs the local ktcli engine: --engine ktcli)"
    best = min(sparse, key=lambda p: p.est_memory_bytes)
    budget_s = req.max_seconds or SPARSE_DEFAULT_SECONDS
    if req.memory_budget and best.est_memory_bytes > req.memory_budget:
        return f"sparse mode would need ~{_gb(best.est_memory_bytes)} even at {best.kv_dtype}, over the budget"
    offered = [p for p in sparse if _auto_may_take(p, req)] or sparse  # (what auto would not take is not offered)
    quickest = min(offered, key=lambda p: p.est_seconds)  # the most preferred of equals
    if quickest.est_seconds > budget_s:
        return f"sparse mode would take ~{quickest.est_seconds:.0f}s > {budget_s:.0f}s budget"
    held = (f" ({quickest.cached_tokens:,} tokens of its {quickest.kv_dtype} {quickest.attention} pages are in the "
            "prompt cache)" if quickest.cached_tokens else "")
    # Within budget: auto did not weigh it because nothing asked for it (see make_plan).
    # (its pages named: --mode sparse alone takes the preferred kind, which may be slower)
    return (f"sparse mode could read it whole in ~{quickest.est_seconds:.0f}s ({quickest.kv_dtype} pages, "
            f"{quickest.attention} attention){held}: run with --mode sparse, --kv-dtype, --attention or --max-seconds")


def _dense_kv(req: PlanRequest, facts: ModelFacts) -> str:
    """The KV dtype a full read holds its context in: --kv-dtype, else the model's default."""
    return req.kv_dtype if req.kv_dtype not in MODEL_PAGES else facts.kv_dtype


def _asked_cache(req: PlanRequest) -> dict[str, str]:
    """The Plan fields of a read in the model's window: the KV dtype and attention policy
    asked for, else the model's own pages and dense attention."""
    return {"kv_dtype": req.kv_dtype if req.kv_dtype not in ("auto", "") else "model",
            "attention": req.attention if req.attention not in ("auto", "") else "dense"}


def _full_plan(req: PlanRequest, facts: ModelFacts, rates: Throughput, full_tokens: int) -> Plan:
    cost = _read_cost(req, facts)
    rates = _read_rates(req, facts, rates, full_tokens)
    answer_s = decode_seconds(full_tokens, req.max_new_tokens, rates.decode_tok_s, cost)
    seconds = rates.load_s + prefill_seconds(full_tokens, rates.prefill_tok_s, cost,
                                             cached=min(req.cached_tokens, full_tokens - 1)) + answer_s
    seconds += key_lines_seconds(req, rates)
    return Plan(
        mode=Mode.FULL, task=req.task, input_tokens=req.corpus_tokens, question_tokens=req.question_tokens,
        context_window=facts.context_window, answer_budget=req.max_new_tokens,
        evidence_budget=req.corpus_tokens, n_documents=req.n_documents, n_chunks=0, n_windows=1, top_k=0,
        est_seconds=seconds, est_first_token_seconds=_before_answer(seconds, answer_s),
        est_memory_bytes=_full_memory(req, facts, full_tokens),
        **_asked_cache(req),
        cached_tokens=min(req.cached_tokens, full_tokens),
    )


# A summary of a few documents that fit the window together is written document by
# document, each read alone (`pipeline.summarize`): read together, the bundled model wrote
# about the first and mixed the rest into it (a lighthouse "built with 68 harmonic
# constituents", from a tide service's release notes). More than this many are one read:
# a small repo's dozens of files would take a call each.
PER_DOCUMENT_MAX = 8
# Each document's summary may write --max-new-tokens shared out, but no fewer than this.
PER_DOCUMENT_MIN_TOKENS = 128


def summarized_per_document(task: str, n_documents: int) -> bool:
    """Whether a summary read whole is written one document at a time."""
    return task == "summarize" and 2 <= n_documents <= PER_DOCUMENT_MAX


def _each_document_fits(req: PlanRequest, facts: ModelFacts) -> bool:
    """A summary of a few documents each of which fits the window alone, with its prompt
    and its share of the answer."""
    if not summarized_per_document(req.task, req.n_documents) or not req.largest_document_tokens:
        return False
    alone = req.largest_document_tokens + PROMPT_OVERHEAD_TOKENS + per_document_tokens(req.n_documents,
                                                                                        req.max_new_tokens)
    return alone <= facts.context_window


def per_document_tokens(n_documents: int, max_new_tokens: int) -> int:
    """What each document's summary may write: --max-new-tokens shared out, at least
    PER_DOCUMENT_MIN_TOKENS (never more than --max-new-tokens)."""
    return min(max_new_tokens, max(PER_DOCUMENT_MIN_TOKENS, max_new_tokens // max(n_documents, 1)))


# A summary that loads no model (its documents all shown whole): the process's peak, Python
# and the tokenizer's tables (142 MiB for two one-line files, 2026-12-07).
NO_MODEL_BYTES = 160 * 2**20


def _loads_no_model(req: PlanRequest) -> bool:
    return summarized_per_document(req.task, req.n_documents) and req.shown_whole >= req.n_documents


def _per_document_plan(full: Plan, req: PlanRequest, facts: ModelFacts, rates: Throughput) -> Plan:
    """A whole read's plan as a read of each document alone: a prompt and a summary each,
    but for those shown whole, which take no model (nor its load, where all are)."""
    n = req.n_documents
    if _loads_no_model(req):
        return replace(full, n_windows=n, answer_budget=n * per_document_tokens(n, req.max_new_tokens),
                       est_seconds=req.read_s, est_first_token_seconds=req.read_s, est_memory_bytes=NO_MODEL_BYTES,
                       cached_tokens=0)
    read = n - min(req.shown_whole, n - 1)
    each = per_document_tokens(n, req.max_new_tokens)
    cost = _read_cost(req, facts)
    prompt = req.corpus_tokens / n + PROMPT_OVERHEAD_TOKENS  # the documents' mean: times are near linear
    rates = _read_rates(req, facts, rates, prompt)
    first = rates.load_s + prefill_seconds(int(prompt), rates.prefill_tok_s, cost)
    each_s = decode_seconds(int(prompt), each, rates.decode_tok_s, cost)
    later = generation_seconds(int(prompt), each, rates.prefill_tok_s, rates.decode_tok_s, cost, first=False)
    return replace(full, n_windows=n, answer_budget=n * each, est_seconds=first + each_s + (read - 1) * later,
                   est_first_token_seconds=first, cached_tokens=0)


def _full_memory(req: PlanRequest, facts: ModelFacts, full_tokens: int) -> int:
    return _read_memory(req, facts, full_tokens, prefill_tokens=full_tokens - min(req.cached_tokens, full_tokens)) \
        + (KEY_LINES_BYTES if req.key_lines else 0)


def _read_memory(req: PlanRequest, facts: ModelFacts, prompt_tokens: int, prefill_tokens: int | None = None,
                 kv_window: int = 0) -> int:
    """One read's peak in the model's window (a whole read, or a retrieval window). With a
    window or topk policy it runs over the kernels' pages like a sparse read (sinks, page
    bounds), with pages for the whole window (or `kv_window`, a read in parts'); so does a
    dense one under --rope-scaling, with each chunk's scores. (Retrieval under
    --rope-scaling yarn:4 was planned at 973 MiB with 744 MiB of pages alone.)"""
    kv = _dense_kv(req, facts)
    window = kv_window or facts.context_window
    if req.attention.partition(":")[0] in ("window", "topk"):
        return sparse_memory(facts, window, kv)
    if req.kernel_pages:
        return sparse_memory(facts, window, kv) + paged_dense_scores_bytes(facts, prompt_tokens + req.max_new_tokens)
    return generation_memory(facts, prompt_tokens + req.max_new_tokens, kv, prefill_tokens=prefill_tokens)


def _before_answer(seconds: float, answer_seconds: float) -> float:
    """A plan's time without the final answer's decoding: when its first token shows.
    Budgets are held to the whole (est_seconds); this is what a user waits for, since
    answers stream and most stop far short of the budget (the sample PDF's: 15 tokens
    of 384)."""
    return max(seconds - answer_seconds, 0.0)


def _read_cost(req: PlanRequest, facts: ModelFacts) -> ContextCost:
    """What context adds to a read in the model's window (`estimates.read_cost`); a dense
    read over other pages than the model's is timed as one over its own (`_read_rates`)."""
    if _other_dense_pages(req, facts):
        return read_cost(facts, "dense", facts.kv_dtype)
    return read_cost(facts, req.attention, req.kv_dtype)


def _other_dense_pages(req: PlanRequest, facts: ModelFacts) -> bool:
    return req.attention.partition(":")[0] not in ("window", "topk") \
        and req.kv_dtype not in (*MODEL_PAGES, facts.kv_dtype) and req.kv_dtype in DENSE_PAGE_SPEED


def _read_rates(req: PlanRequest, facts: ModelFacts, rates: Throughput, context: float) -> Throughput:
    """`rates` for a read in the model's window of `context` tokens: slower over pages it
    dequantises as it reads (`estimates.DENSE_PAGE_SPEED`; --kv-dtype fp8 decoded at 0.06-
    0.10x the model's own pages), as they are for the model's own."""
    if not _other_dense_pages(req, facts):
        return rates
    prefill, decode = dense_page_speed(req.kv_dtype, int(context))
    return replace(rates, prefill_tok_s=rates.prefill_tok_s * prefill, decode_tok_s=rates.decode_tok_s * decode)


def _estimated_chunks(req: PlanRequest) -> int:
    if req.n_chunks:
        return req.n_chunks
    stride = max(req.chunk_tokens - req.chunk_overlap, 1)
    return max(req.n_documents, math.ceil(req.corpus_tokens / stride))


# The least window a read in parts can use: the prompt, notes in, notes out, 256 tokens
# of evidence and a few of question.
SMALLEST_PARTS_WINDOW = PROMPT_OVERHEAD_TOKENS + 2 * MEMORY_TOKENS + 256 + 16


def _window_too_small(context_window: int, task: str) -> str:
    if task == "summarize":
        return (f"the {context_window:,}-token window is too small to read the input in parts: each part needs "
                f"~{PROMPT_OVERHEAD_TOKENS} tokens of prompt, {MEMORY_TOKENS} of notes in and as many out and 256+ "
                "of evidence; give an input that fits whole, or a model with a larger window")
    # A question's terms: its evidence is retrieved, and its answer budget is what a user
    # would lower first, which cannot help here (a window that passes notes on writes
    # MEMORY_TOKENS of them, whatever --max-new-tokens says).
    return (f"the {context_window:,}-token window is too small to answer from retrieved passages: each window of "
            f"them needs {SMALLEST_PARTS_WINDOW:,}+ tokens (~{PROMPT_OVERHEAD_TOKENS} of prompt, up to "
            f"{MEMORY_TOKENS} of notes from the windows before, {MEMORY_TOKENS} for the notes or the answer it writes "
            "even under a lower --max-new-tokens, the question and 256+ of evidence); raise --context-window, use "
            "a model with a larger window, or give an input that fits whole")


def evidence_room(context_window: int, question_tokens: int, max_new_tokens: int, cap: int, task: str,
                  chunk: int = 256) -> int:
    """Evidence tokens one window of a read in parts holds: the window less the prompt,
    the notes passed in, the question and what the call writes, which is the answer or,
    in every window but an answer's last, new notes (MEMORY_TOKENS): with
    --max-new-tokens 64 a summary's map steps wrote 384 tokens of notes into a window
    planned for 64, past its end. At most `cap`. `task`: whose terms a refusal is in;
    `chunk`: the model tokens of one chunk, which the answer budget a refusal names leaves."""
    written = max(max_new_tokens, MEMORY_TOKENS)
    room = context_window - PROMPT_OVERHEAD_TOKENS - MEMORY_TOKENS - question_tokens - written
    if context_window < SMALLEST_PARTS_WINDOW:  # whatever the question and answer
        raise UsageError(_window_too_small(context_window, task))
    if room < 256:
        # Name what takes the room: a 2-token question was blamed for a 100K-token answer budget.
        taken = {"the answer budget (--max-new-tokens)": max_new_tokens, "the question": question_tokens,
                 f"the notes passed between parts ({MEMORY_TOKENS} tokens in, as many out)": 2 * MEMORY_TOKENS}
        culprit = max(taken, key=taken.get)
        # the most that leaves room for a chunk (as `--mode full`'s refusal names its own)
        most = context_window - PROMPT_OVERHEAD_TOKENS - MEMORY_TOKENS - question_tokens - max(256, chunk)
        lower = f"lower --max-new-tokens to {most:,} or less" if most >= MEMORY_TOKENS else "lower --max-new-tokens"
        raise UsageError(
            f"{culprit} leaves no room for evidence in the {context_window:,}-token window "
            f"(question ~{question_tokens:,} tokens, answer budget {max_new_tokens:,}); "
            + (lower if culprit.startswith("the answer") else "shorten the question"
               if culprit == "the question" else "give an input that fits whole, or a model with a larger window")
        )
    return min(room, cap)


def evidence_cap(task: str) -> int:
    return QA_EVIDENCE_CAP if task == "ask" else SUMMARY_WINDOW_CAP


# A passage's source tag with its path and line range, and the blank line after it
# (`windows.pack` counts them: 20-50 tokens; 33-43 of SmolLM2's on sample_docs, ktcli/ and
# tests/), where the request does not say (`PlanRequest.passage_tag_tokens`).
PASSAGE_TAG_TOKENS = 30


def _windows_packed(evidence: int, passages: int, budget: int, tag: float = PASSAGE_TAG_TOKENS) -> int:
    """Windows that `windows.pack` fills with `passages` totalling `evidence` tokens: whole
    passages in order, each in its `tag`, so a window of passages of varied size ends on
    average half a passage short of its budget (the plan divided the evidence by the
    budget: 2 windows where the run read 3, and 3 for 4). The last window has nothing
    after it to leave out: 8 passages of 370 tokens with their tags fill one 3,072-token
    window, planned as 2."""
    passages = max(1, passages)
    item = evidence / passages + tag
    if item > budget / 2:  # no two fit one window (a summary's passages are joined up to a window each)
        return passages
    return max(1, min(passages, math.ceil((passages * item - item / 2) / (budget - item / 2))))


def note_steps(task: str, n_windows: int) -> int:
    """The note steps of a read in `n_windows` windows: a question reads its last window
    with the notes and answers there (`pipeline.qa`); a summary takes notes in every
    window, one window too, then writes from the notes (`summarize`: a summary in parts of
    one window was planned as one read, and its rerun with the part's note kept as none)."""
    return n_windows - 1 if task == "ask" else n_windows


def _retrieval_plan(req: PlanRequest, facts: ModelFacts, rates: Throughput) -> Plan:
    n_chunks = _estimated_chunks(req)
    # Chunks are cut in estimate tokens: this input's own ratio says what one costs the model
    # (a 4,000-token chunk of a CSV of numbers was 9,871 model tokens, sent into 8,192).
    per_estimate = max(req.tokens_per_estimate, MODEL_TOKENS_PER_ESTIMATE)
    room = evidence_room(facts.context_window, req.question_tokens, req.max_new_tokens, facts.context_window,
                         req.task, chunk=math.ceil(req.chunk_tokens * per_estimate))
    if req.chunk_tokens * per_estimate > room:  # also under --mode retrieval, which skipped it
        raise UsageError(f"--chunk-tokens {req.chunk_tokens}: a chunk must fit a window's room for evidence "
                         f"(~{int(room / per_estimate):,} tokens of this input here)")
    budget = min(room, evidence_cap(req.task))
    if req.task == "ask":
        top_k = min(req.top_k, n_chunks)
        # chunk sizes are set in estimate tokens; the average chunk in model tokens,
        # overlap included, is what a window really holds: the chunks' own mean where the
        # request has it, else as if every chunk were cut full (most end early, at a
        # heading or blank line, with less overlap)
        per_chunk = req.chunk_mean_tokens or (req.corpus_tokens / max(n_chunks, 1) * req.chunk_tokens
                                              / max(req.chunk_tokens - req.chunk_overlap, 1))
        evidence = int(top_k * min(per_chunk, req.chunk_tokens * 2))
        passages = top_k  # retrieved chunks are mostly apart: a passage each
    else:
        evidence = req.corpus_tokens  # a summary reads everything
        top_k = 0
        passages = max(req.n_documents, math.ceil(evidence / budget))  # neighbours join up to a window
    n_windows = req.known_windows or _windows_packed(evidence, passages, budget,
                                                     req.passage_tag_tokens or PASSAGE_TAG_TOKENS)
    # Each window: its evidence, the notes so far, and new notes; then one final answer.
    # Memory is sized for the most notes a window may pass on, time for what they run to.
    per_window_prompt = min(evidence, budget) + MEMORY_TOKENS + req.question_tokens + PROMPT_OVERHEAD_TOKENS
    notes = min(rates.notes_tokens, MEMORY_TOKENS)
    # Timed at the evidence a window holds on average: the windows share it out, the last
    # one short (timed at a full budget each, a 21.5K-token summary in 5 windows was
    # planned at 6.1K a window for 4.3K read, and summaries took half their plans).
    held = evidence / n_windows if n_windows > 1 else min(evidence, budget)
    timed_prompt = held + notes + req.question_tokens + PROMPT_OVERHEAD_TOKENS
    cost = _read_cost(req, facts)
    rates = _read_rates(req, facts, rates, timed_prompt)
    note_windows = note_steps(req.task, n_windows)
    # A summary is written from every part's notes beside the file listing, fitted to the
    # window (`summarize.every_parts_notes`): planned as one part's notes, the reduce step
    # of ktcli/plan's 6 parts was timed at 209 tokens of prompt for ~440 (sample_docs' 4
    # outlined parts ~620; code notes run ~300 tokens a part).
    final_prompt = timed_prompt if note_windows < n_windows else \
        min(notes * note_windows + req.listing_tokens + PROMPT_OVERHEAD_TOKENS,
            facts.context_window - req.max_new_tokens)
    answer_s = decode_seconds(final_prompt, req.max_new_tokens, rates.decode_tok_s, cost)
    noted = max(0, note_windows - req.kept_notes)  # the rest are read back from an earlier run
    # (the run's first prefill alone pays its setup: the final one's, counted once)
    seconds = (rates.load_s + noted * generation_seconds(timed_prompt, notes, rates.prefill_tok_s,
                                                         rates.decode_tok_s, cost, first=False)
               + prefill_seconds(final_prompt, rates.prefill_tok_s, cost) + answer_s)
    if req.task == "ask":  # a summary embeds nothing: it reads every chunk in order
        to_embed = req.corpus_tokens if req.uncached_tokens is None else req.uncached_tokens
        seconds += to_embed / max(rates.embed_tok_s, 1e-9) + n_chunks * INDEX_LOAD_S_PER_CHUNK
    kv_window = _parts_kv_window(req, facts, budget)
    return Plan(
        mode=Mode.RETRIEVAL, task=req.task, input_tokens=req.corpus_tokens, question_tokens=req.question_tokens,
        context_window=facts.context_window, answer_budget=req.max_new_tokens, evidence_budget=budget,
        n_documents=req.n_documents, n_chunks=n_chunks, n_windows=n_windows, top_k=top_k,
        est_seconds=seconds, est_first_token_seconds=_before_answer(seconds, answer_s), kv_window=kv_window,
        est_memory_bytes=_read_memory(req, facts, per_window_prompt, kv_window=kv_window)
        + (LATER_READS_GROWTH_BYTES if n_windows > 1 else 0)
        + (EMBEDDER_BYTES + _index_memory(req, n_chunks) + _embedding_memory(req, n_chunks) if req.task == "ask" else 0),
        # Each window is read with the KV dtype and policy asked for, as a full read is
        # (they were dropped here, silently: `--mode retrieval --kv-dtype int4` ran fp16 pages).
        **_asked_cache(req),
    )


# Room a read in parts' pages keep past the planned prompt: the key lines quoted before
# the question (two lines) and the prompt's own text where it runs past its estimate.
PARTS_MARGIN_TOKENS = 512


def _parts_kv_window(req: PlanRequest, facts: ModelFacts, evidence_budget: int) -> int:
    """The tokens a read in parts puts in the window at most, where the kernels' pages
    (allocated whole) would otherwise hold the whole window; 0 elsewhere. Under
    --rope-scaling yarn:8 a retrieval read of 2,200 tokens held pages for 65K (1,486 MiB
    of 2,263 peak, against 794 MiB without the flag), and `--max-memory 2GB` refused it."""
    if not (req.kernel_pages or req.attention.partition(":")[0] in ("window", "topk")):
        return 0
    most = (evidence_budget + PROMPT_OVERHEAD_TOKENS + MEMORY_TOKENS + req.question_tokens
            + max(req.max_new_tokens, MEMORY_TOKENS) + PARTS_MARGIN_TOKENS)
    return most if most < facts.context_window else 0


def _embedding_memory(req: PlanRequest, n_chunks: int) -> int:
    """What embedding the chunks the index cache lacks adds (EMBED_BYTES_PER_CHUNK)."""
    share = 1.0 if req.uncached_tokens is None else req.uncached_tokens / max(req.corpus_tokens, 1)
    return int(min(min(share, 1.0) * n_chunks, EMBED_GROWTH_CHUNKS) * EMBED_BYTES_PER_CHUNK)


# A chunk held for a question: its text, span and section, and its BM25 postings. torch's
# 111,409 chunks (46 MB of sources) held 468 MiB after `prepare` and the BM25 index read
# back (2026-12-08), ~4.4 KB a chunk; planned at 1.5 KB, the whole question's peak was
# 1.07-1.15x its estimate.
CHUNK_BYTES = 4400
VECTOR_BYTES = 384 * 4  # a float32 MiniLM vector in faiss


def _index_memory(req: PlanRequest, n_chunks: int) -> int:
    """Every chunk, and the vectors of those embedded (a focused index leaves most out)."""
    vectors = n_chunks - req.unembedded_chunks + req.focus_chunks
    return n_chunks * CHUNK_BYTES + vectors * VECTOR_BYTES


def _what_takes_memory(plan: Plan) -> str:
    if plan.mode is Mode.RETRIEVAL and plan.task == "ask":
        return f"the model, one window, the embedder and an index of {plan.n_chunks:,} chunks"
    return "the model and one window"


def _retrieval_reason(req: PlanRequest, plan: Plan) -> str:
    return _windows_reason(req.task, plan, estimated=True)


def _focus_reasons(req: PlanRequest) -> tuple[str, ...]:
    """What a question's index embeds, where it is not every chunk the cache lacks."""
    if not req.unembedded_chunks:
        return ()
    if not req.focus_chunks:
        return (f"embed none: the chunks the question's words point at are in the index cache, and the "
                f"{req.unembedded_chunks:,} others not needed (--embed all: every one)",)
    return (f"embed the ~{req.focus_chunks:,} chunks the question's words point at, of "
            f"{req.unembedded_chunks:,} not in the index cache (--embed all: every one)",)


def _windows_reason(task: str, plan: Plan, estimated: bool) -> str:
    """How a read in windows goes. `estimated`: the plan's count of windows, said as an
    estimate ("about 13"): the run packs the passages into windows by their exact token
    counts, which may come to another number (a summary's plan said "map over 13 window(s)"
    of a run whose `n_windows` and `figures.windows` were 12)."""
    n = f"about {plan.n_windows}" if estimated else f"{plan.n_windows}"
    if task == "ask":
        return (
            f"retrieve the top {plan.top_k} of {plan.n_chunks:,} chunks, read them in {n} "
            f"window(s) of up to {plan.evidence_budget:,} tokens" + (" passing notes between windows" if plan.n_windows > 1 else "")
        )
    return f"map over {n} window(s) of up to {plan.evidence_budget:,} tokens with running notes, then reduce"


def with_windows(plan: Plan, n_windows: int) -> Plan:
    """The plan a run in windows carried out: its `n_windows` the windows it packed, and its
    reason of the read saying that count, not the estimate (the plan before the run said
    "about 13" and its `n_windows` 13; the run read 12)."""
    planned = _windows_reason(plan.task, plan, estimated=True)
    ran = replace(plan, n_windows=n_windows)
    said = _windows_reason(plan.task, ran, estimated=False)
    return replace(ran, reasons=tuple(said if reason == planned else reason for reason in plan.reasons))


def _planned_with_kept_notes(req: PlanRequest, facts: ModelFacts, rates: Throughput) -> Plan:
    """The plan, its time counting the notes an earlier run kept as read back. Chosen as if
    none were kept: they are the notes of the plan that run chose, and counted in, they
    could tip a summary from outlines to every line, whose notes none are."""
    chosen = _make_plan(replace(req, kept_notes=0, known_windows=0), facts, rates)
    # The windows the earlier run packed, where it said (the estimate's may be more or fewer)
    windows = req.known_windows if req.known_windows and chosen.mode is Mode.RETRIEVAL else chosen.n_windows
    note_windows = note_steps(chosen.task, windows)
    kept = (note_windows if req.notes_all_kept else min(req.kept_notes, note_windows)) \
        if chosen.mode is Mode.RETRIEVAL else 0
    if not kept:
        return chosen
    # The chosen read's time, as estimated, replaced by the read's in the windows it packs
    # with its kept steps read back.
    read = replace(req, corpus_tokens=req.outline_tokens, n_chunks=0) if chosen.outline_files else req
    without = _retrieval_plan(replace(read, kept_notes=0, known_windows=0), facts, rates)
    kept_plan = _retrieval_plan(replace(read, kept_notes=kept, known_windows=windows), facts, rates)
    saved = without.est_seconds - kept_plan.est_seconds
    total = max(0.0, chosen.est_seconds - saved)
    # A reason that weighed the whole time against a budget says it no more (the plan showed
    # "est <=42s" beside "this one takes ~361s"); said again where the new time is over.
    reasons = [r for r in chosen.reasons if not r.startswith((BUDGET_MISS, *DEFAULT_BUDGET_MISSES))]
    budget_s = req.max_seconds or (SUMMARY_DEFAULT_SECONDS if req.task == "summarize" else 0.0)
    if len(reasons) < len(chosen.reasons) and budget_s and total > budget_s:
        reasons.append(f"with the notes kept it takes ~{math.ceil(total)}s, over the {budget_s:g}s budget")
    reasons.append(f"the notes of {kept} of its {note_windows} note steps are kept from an earlier run: "
                   "read back, not written")
    memory = _all_kept_memory(req, facts, chosen, note_windows) if kept >= note_windows else chosen.est_memory_bytes
    plan = replace(chosen, est_seconds=total, est_first_token_seconds=max(0.0, chosen.est_first_token_seconds - saved),
                   reasons=tuple(reasons), est_memory_bytes=memory)
    return with_windows(plan, windows) if windows != chosen.n_windows else plan


def _all_kept_memory(req: PlanRequest, facts: ModelFacts, chosen: Plan, note_windows: int) -> int:
    """The peak of a read in parts whose every note step is kept: one model read, no part's.
    A question reads its last window once (no later read's growth); a summary reads only
    its parts' notes (as kept, else MEMORY_TOKENS a step) and file listing
    (`summarize.every_parts_notes`, at most the window less the answer). A summary's rerun
    with its 3 parts' notes kept was planned at 1,023 MiB, sized for a 6K-token part read
    after others, and peaked at 497-576 MiB."""
    if chosen.task == "ask":
        return chosen.est_memory_bytes - (LATER_READS_GROWTH_BYTES if chosen.n_windows > 1 else 0)
    notes = (req.kept_notes_tokens or note_windows * MEMORY_TOKENS) + req.listing_tokens + PROMPT_OVERHEAD_TOKENS
    return _read_memory(req, facts, min(notes, facts.context_window - req.max_new_tokens), kv_window=chosen.kv_window)


def _with(plan: Plan, reasons: tuple[str, ...], other: Plan | None, sparse: list[Plan] = ()) -> Plan:
    alternatives: tuple[dict, ...] = ()
    if other is not None:
        alternatives = (
            {"mode": other.mode.value, "est_seconds": round(other.est_seconds, 1),
             "est_memory_bytes": other.est_memory_bytes, "n_windows": other.n_windows},
        )
    # Every sparse estimate (per KV dtype and policy) except the chosen one, for `ktcli plan`.
    alternatives += tuple(
        {"mode": p.mode.value, "kv_dtype": p.kv_dtype, "attention": p.attention, "est_seconds": round(p.est_seconds, 1),
         "est_memory_bytes": p.est_memory_bytes, "n_windows": p.n_windows}
        for p in sparse if p is not plan
    )
    return replace(plan, reasons=reasons, alternatives=alternatives)


# How the planner's messages name a memory budget no setting gave (`prepare.memory_budget`:
# 80% of the memory available): "over the --max-memory budget of 0.34 GiB" was said to a
# command with no --max-memory, on a machine whose free memory had dropped (probe 124).
DEFAULT_MEMORY_BUDGET = "default memory"


def _budget(req: PlanRequest) -> str:
    """The memory budget as an error says it: "--max-memory budget of 2.00 GiB", or the
    default's, with what it is and how to set another."""
    named = _named(req, "max_memory")
    said = f"{named} budget of {_gb(req.memory_budget)}"
    return said + (" (80% of the memory available now; --max-memory sets another)"
                   if named == DEFAULT_MEMORY_BUDGET else "")


def _smaller_suggestion(req: PlanRequest, sparse: list[Plan]) -> str:
    """The sparse read that fits the memory budget, if one does (retrieval holds an
    embedder and a window; a quantized cache of a short input can be smaller)."""
    fits = [p for p in sparse if p.est_memory_bytes <= req.memory_budget]
    if not fits:
        return ""
    best = min(fits, key=lambda p: p.est_memory_bytes)
    return (f"; --mode sparse --kv-dtype {best.kv_dtype} --attention {best.attention} needs "
            f"~{_gb(best.est_memory_bytes)}")


def _gb(n: int) -> str:
    """Binary units, as the plan's table and the figures line's peak RSS."""
    if n >= 2**27:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**17 else f"{n:,} bytes"
