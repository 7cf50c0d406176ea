"""The shared front half of every command: read the sources, count, chunk, and plan.

`ktcli plan` stops here; `ask` and `summarize` go on to execute the Plan.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ktcli.config import Settings, canonical_attention, canonical_rope_scaling, named_setting, parse_bytes
from ktcli.engine.model_store import is_converted, model_facts, model_folder, resolve_model
from ktcli.errors import KtcliError, OutOfMemoryError, UsageError
from ktcli.ingest import count_tokens, load_corpus
from ktcli.ingest.chunk_cache import chunked
from ktcli.ingest.extract_cache import kept_under
from ktcli.ingest.loaders import STDIN_PATH
from ktcli.ingest.outline import PROSE_OUTLINE_CHARS, outline_lines, outline_text
from ktcli.ingest.walk import EXCLUDED_BY
from ktcli.pipeline import notes_memo
from ktcli.pipeline.badges import badges_only
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.key_lines import quotes
from ktcli.pipeline.skip_report import first_named, report_skipped
from ktcli.pipeline.prompts import file_listing, whole_input
from ktcli.pipeline.windows import as_read
from ktcli.plan import PlanRequest, Throughput, make_plan
from ktcli.plan.planner import (DEFAULT_MEMORY_BUDGET, MODEL_TOKENS_PER_ESTIMATE, summarized_per_document,
                                weighs_sparse)
from ktcli.plan.estimates import CPU_RUNTIME_BYTES, WEIGHT_BYTES
from ktcli.types import Chunk, Corpus, Mode, ModelFacts, Plan

RATES_FILE = "rates.json"
SAMPLES_KEY = "recent runs"  # rates.json: each rates key's last RATE_SAMPLES measurements
# A rates key's entry with this set keeps its dense prefill and decode rates without context
# (`plan.estimates.rates_without_context`); older files kept them as measured, with a run's
# context in them, and plans scaled by the context again read a 7.5K-token read at 2.8x.
# Such rates are left out (and their samples dropped at the next save), not converted: the
# lengths they were measured at were not kept.
CONTEXT_FREE = "rates_without_context"
CONTEXT_FREE_MARK = "yes"  # not a number: an older ktcli, which keeps numbers only, drops it when it saves
_DENSE_RATES = ("prefill_tok_s", "decode_tok_s")
RATE_SAMPLES = 5
# First-run rates of the local engine on a CPU, before a run has measured any, from the
# model's size: decode reads every weight once per token, prefill is bound by GEMM FLOPs.
# Set at the slowest of the three 2-core machines measured (SmolLM2 int8: decode 76 tok/s
# on the Xeon, prefill ~450 on the AVX2 EPYC; the Zen 5 EPYC 164-217 and 730-1200), so the
# first estimate errs long, never short: 73 and 444 tok/s.
CPU_BYTES_PER_S = 11e9
CPU_FLOPS = 120e9
# The sparse mode's default rates (`Throughput`) were measured on SmolLM2, whose full-mode
# defaults by the rules above are 444 and 73 tok/s: another model's scale by its own (a
# fake 8B was planned a 247 s sparse read, as fast as the 135M model, and recommended over
# retrieval). Loading reads the weights back: a second a GB past the tokenizer's and kernels'.
_SPARSE_PREFILL_SHARE = 300.0 / 444
_SPARSE_DECODE_SHARE = 24.0 / 73
_LOAD_BYTES_PER_S = 1e9


@dataclass(frozen=True)
class Prepared:
    corpus: Corpus
    chunks: tuple[Chunk, ...]
    plan: Plan
    facts: ModelFacts
    question: str
    # Summaries: each code document's outline (`ingest.outline`), read instead of its text
    # when the plan says so (plan.outline_files).
    outlines: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    converts_model: bool = False  # the load converts the model first (a GGUF's first run)
    # The request's key in the notes memo (`notes_memo.request_key`; "" where notes are not
    # kept), under which the run records its note steps for the next one's plan.
    notes_request: str = ""
    # Model tokens per estimate token by document kind, where the input mixes kinds and the
    # model's tokenizer was at hand (`_kind_ratios`); else empty: the input's one ratio.
    kind_ratios: dict[str, float] = field(default_factory=dict)
    # Each document's own text in model tokens, as plan.input_tokens counts it (each kind at
    # its ratio), without its source tag or the summary's file listing: those are the rest
    # of plan.input_tokens (`plan --json`'s `overhead_tokens`).
    document_tokens: dict[str, int] = field(default_factory=dict)


def memory_budget(settings: Settings) -> int:
    if settings.max_memory:
        try:
            return parse_bytes(settings.max_memory)
        except ValueError:
            raise UsageError(f"--max-memory {settings.max_memory!r}: give a size like 4GB or 512MiB") from None
    if _on_gpu(settings):
        # Weights and KV pages live in GPU memory: the budget is what the GPU has free.
        import torch

        return int(torch.cuda.mem_get_info()[0] * 0.8)
    try:
        import psutil

        return int(psutil.virtual_memory().available * 0.8)
    except Exception:  # noqa: BLE001 - no reading, no limit
        return 0


def _on_gpu(settings: Settings) -> bool:
    """Whether the local ktcli engine will run on CUDA (`--device`)."""
    if settings.backend != "local" or settings.engine != "ktcli":
        return False
    from ktcli.engine.device import device_kind

    return device_kind(settings.device, settings.named("device")) == "cuda"


def _rates_key(settings: Settings) -> str:
    # A server's speed says nothing about the local engine's, and the reverse; nor does a
    # GPU's about the CPU's.
    if settings.backend == "openai":
        return f"openai:{settings.base_url}:{settings.model}"
    # --weights naming what auto loads anyway (int8 on a CPU) is the same run: keyed apart,
    # `--weights int8` was planned from untrained defaults (~14 s where auto's said ~30).
    weights = settings.weights or "auto"
    if weights != "auto" and planned_weights(settings) == planned_weights(replace(settings, weights="auto")):
        weights = "auto"
    if _on_gpu(settings):
        return f"{settings.engine}:{settings.model}:{weights}:cuda"
    return f"{settings.engine}:{settings.model}:{weights}"


def load_rates(settings: Settings, facts: ModelFacts | None = None, code: bool = False) -> Throughput:
    """Throughput measured by earlier runs with this engine and model, else defaults (from
    the model's size for the local engine on a CPU, when `facts` are given). `code`: an
    input mostly of code, whose notes are those learned over code (`code_notes_tokens`)."""
    rates = _load_rates(settings, facts)
    return replace(rates, notes_tokens=rates.code_notes_tokens) if code else rates


def mostly_code(documents) -> bool:
    """Whether most of an input's text is code: a model's notes on it run longer (it lists
    the functions), and are learned apart (`save_rates`' `code`)."""
    code = sum(len(d.text) for d in documents if d.kind == "code")
    return code > sum(len(d.text) for d in documents) / 2


def _load_rates(settings: Settings, facts: ModelFacts | None) -> Throughput:
    if facts is None or settings.backend != "local" or _on_gpu(settings) or not facts.weight_bytes:
        defaults = Throughput()
    else:
        prefill, decode = CPU_FLOPS / (2 * facts.n_params), CPU_BYTES_PER_S / facts.weight_bytes
        defaults = Throughput(prefill_tok_s=round(prefill), decode_tok_s=round(decode, 1),
                              sparse_prefill_tok_s=round(min(prefill * _SPARSE_PREFILL_SHARE, Throughput.sparse_prefill_tok_s), 1),
                              sparse_decode_tok_s=round(min(decode * _SPARSE_DECODE_SHARE, Throughput.sparse_decode_tok_s), 2),
                              load_s=max(Throughput.load_s, 1.0 + facts.weight_bytes / _LOAD_BYTES_PER_S))
    try:
        stored = json.loads((settings.cache_path / RATES_FILE).read_text())[_rates_key(settings)]
        known = {f.name for f in fields(Throughput)} - (set() if stored.get(CONTEXT_FREE) == CONTEXT_FREE_MARK
                                                           else set(_DENSE_RATES))
        # Over the defaults, rate by rate: a first run in sparse mode stores only sparse
        # rates, and the full mode's fell back to the class's 150 / 10 tok/s, not the
        # model's size (446 / 73 for SmolLM2), turning a summary's plan to outlines.
        measured = {k: float(v) for k, v in stored.items() if k in known and _rate(v)}
    except (OSError, KeyError, ValueError, TypeError, AttributeError):
        return defaults
    rates = replace(defaults, **measured)
    # A sparse read not measured yet on a machine whose dense reads are: its defaults as
    # much slower or faster as the dense ones came out (a first sparse read was planned at
    # 300 tok/s of prefill on a machine that ran 121, where its dense reads ran 0.6x theirs).
    for sparse_rate, dense_rate in (("sparse_prefill_tok_s", "prefill_tok_s"), ("sparse_decode_tok_s", "decode_tok_s")):
        if sparse_rate not in measured and dense_rate in measured:
            scale = getattr(rates, dense_rate) / getattr(defaults, dense_rate)
            rates = replace(rates, **{sparse_rate: round(getattr(defaults, sparse_rate) * scale, 2)})
    return rates


def save_rates(settings: Settings, prefill_tok_s: float, decode_tok_s: float, sparse: bool = False,
               load_s: float = 0.0, embed_tok_s: float = 0.0, notes_tokens: float = 0.0, code: bool = False) -> None:
    """Add this run's measured rates to the last few stored (used by the next plan): each
    stored rate is the median of the last RATE_SAMPLES runs. A run slowed 2-3x by another
    process on a 2-core machine (`benchmarks/threads_under_load.py`) then moves no estimate,
    where a half-and-half blend inflated the next few plans' times; a machine that stays
    busy moves them after three runs. A sparse-mode run keeps its own rates, which differ
    from full attention's; every run its model's load time, and one that embedded enough
    of its input the embedding rate, and one that passed notes between windows how long
    its model writes them (over code, `code`, kept apart). A rate of 0 is not measured
    (kept as it was)."""
    if prefill_tok_s <= 0 and decode_tok_s <= 0 and load_s <= 0 and embed_tok_s <= 0 and notes_tokens <= 0:
        return
    path = settings.cache_path / RATES_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    # Anything of another shape (`[]`, a rate that is a string) is dropped, not trusted:
    # it failed every ask after its answer, before the citations.
    data = data if isinstance(data, dict) else {}
    key = _rates_key(settings)
    entry = _dict(data.get(key))
    rates = {k: v for k, v in entry.items() if _rate(v)}
    history = _dict(data.get(SAMPLES_KEY))
    data[SAMPLES_KEY] = history
    history[key] = mine = _dict(history.get(key))
    if entry.get(CONTEXT_FREE) != CONTEXT_FREE_MARK:  # measured with their context in them: not this kind
        for name in _DENSE_RATES:
            rates.pop(name, None)
            mine.pop(name, None)
    rates[CONTEXT_FREE] = CONTEXT_FREE_MARK
    prefix = "sparse_" if sparse else ""
    for name, value in ((f"{prefix}prefill_tok_s", prefill_tok_s), (f"{prefix}decode_tok_s", decode_tok_s),
                        ("load_s", load_s), ("embed_tok_s", embed_tok_s),
                        ("code_notes_tokens" if code else "notes_tokens", notes_tokens)):
        if not _rate(value):
            continue
        # a file written before the history was kept starts it from its one blended rate
        earlier = [v for v in mine.get(name) or [] if _rate(v)] if isinstance(mine.get(name), list) else []
        recent = (earlier or ([rates[name]] if name in rates else []))[-(RATE_SAMPLES - 1):]
        mine[name] = recent + [round(value, 2)]
        rates[name] = round(statistics.median(mine[name]), 2)
    data[key] = rates
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache folder: the next plan keeps the old rates
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _rate(value) -> bool:
    """A usable measurement: a finite number above 0 (not a bool, a string or NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def planning_facts(settings: Settings, contact_server: bool = True) -> ModelFacts:
    """The model's shape, its weight bytes in the dtype the engine will load and its KV
    pages' dtype; for a remote server, its window (and no local memory to plan), which
    `ktcli plan` takes from --context-window where it is given (`contact_server` False):
    the plan needs nothing else of the server (it counts with tiktoken, not the server's
    tokenizer), and it planned nothing with the server down."""
    if settings.backend == "openai":
        from ktcli.engine.openai_backend import remote_model_facts

        if not contact_server and settings.context_window > 0:
            return ModelFacts(name=assumed_server_model(settings), context_window=settings.context_window, n_layers=0,
                              n_kv_heads=0, head_dim=0, n_params=0, weight_bytes=0)

        return remote_model_facts(settings)
    from ktcli.engine.device import auto_kv_dtype

    facts = model_facts(resolve_model(settings.model, settings.named("model")), settings.cache_path)
    if settings.rope_scaling and settings.engine == "ktcli":
        facts = replace(facts, context_window=_rope_window(settings.rope_scaling, facts))
    if settings.context_window and settings.context_window < facts.context_window:
        facts = replace(facts, context_window=settings.context_window)  # --context-window caps it
    weights = planned_weights(settings)
    on_gpu = _on_gpu(settings)
    # transformers casts from the files' dtype, which stay mapped (and resident) through the
    # load: SmolLM2 to bf16 from its converted fp32 file peaked at 1,306 MB against 1,111 MB
    # in fp32 (the plan had said 764 MB); a bf16 release (185M parameters) at 1,582 MiB in
    # fp32 (planned 1.3 GiB) and 981 MiB in bf16 (planned 1.6 GiB, as if cast from fp32).
    # An fp16 release loaded in bf16 is cast too, the same size as it is.
    source = facts.source_bytes or facts.n_params * 4
    loaded = int(facts.n_params * WEIGHT_BYTES.get(weights, 4.0))
    differs = facts.source_dtype != weights if facts.source_dtype else abs(source - loaded) > 0.1 * loaded
    cast = source if settings.engine == "hf" and differs else 0
    return replace(facts, weight_bytes=loaded, kv_dtype=auto_kv_dtype(weights, "cuda" if on_gpu else "cpu"),
                   host_bytes=0 if on_gpu else CPU_RUNTIME_BYTES + cast)


def assumed_server_model(settings: Settings) -> str:
    """The model a server not contacted is taken to serve: --model where one was picked,
    else the one it lists first (`openai_backend.discover_model`)."""
    return settings.model if settings.model != Settings().model else "the server's first model"


def server_assumption(settings: Settings) -> str:
    """What a plan for a server it did not contact took for granted ("" where it asked)."""
    if settings.backend != "openai" or settings.context_window <= 0:
        return ""
    model = assumed_server_model(settings)
    model = repr(model) if model == settings.model else model
    return (f"the server was not contacted: its window taken as {settings.named('context_window')} "
            f"{settings.context_window} (a smaller one the server has caps a run), the model as {model}, "
            "tokens counted with tiktoken")


def _rope_window(spec: str, facts: ModelFacts) -> int:
    """The window --rope-scaling gives the engine (`engine.longctx.parse_rope_scaling`: the
    trained window times the factor; 'none' the trained window). The plan used to keep the
    model's own, so `--rope-scaling yarn:2 --mode full` was refused at 8K tokens."""
    from ktcli.config import parse_rope_scaling

    trained = facts.max_position or facts.context_window
    parsed = parse_rope_scaling(spec)
    return trained if parsed is None else max(trained, int(trained * parsed[1]))


def planned_weights(settings: Settings) -> str:
    """The weight dtype the local engine will load: `--weights`, or what auto resolves to
    (engine.device.AUTO_WEIGHTS; transformers: fp32). Planning does not build the C++
    kernels to check that int8 runs: setup builds them."""
    from ktcli.engine.device import AUTO_WEIGHTS

    if settings.engine == "hf":
        return "bf16" if settings.weights == "bf16" else "fp32"
    if settings.weights not in ("", "auto"):
        return settings.weights
    return AUTO_WEIGHTS["cuda" if _on_gpu(settings) else "cpu"]


def _server(settings: Settings) -> str:
    """The OpenAI-compatible server's address (its URL checked), or "" for a local model."""
    if settings.backend != "openai":
        return ""
    from ktcli.engine.openai_backend import server_address

    return server_address(settings)


def _tokens_masked(corpus, server: str, reporter: Reporter):
    """The corpus with access tokens written in its files masked (`ingest.credentials`),
    said: its text goes to `server`."""
    from ktcli.ingest.credentials import masked_documents

    documents, notes = masked_documents(corpus.documents)
    if notes:
        reporter.warn(f"masked what look like access tokens before sending the input to {server}: "
                      f"{first_named(notes, 3)}")
    return replace(corpus, documents=documents)


def _warn_if_nothing_excluded(paths: list[str], corpus, settings: Settings, reporter: Reporter) -> None:
    """--exclude patterns that left nothing out of the folders read: said, as a pattern that
    can match nothing is refused. `--exclude certifi/tests/` given the folder `certifi`
    itself (patterns with a slash are relative to the folder given) read the tests unawares."""
    excluding = [p for p in settings.exclude if not p.startswith("!")]
    if not excluding:
        return
    if not any(os.path.isdir(p) for p in paths if p != "-"):
        return  # files named are read whatever the patterns say
    excluded = [s.path for s in corpus.skipped if s.reason.startswith(EXCLUDED_BY)]
    # Each pattern on its own: `--exclude console.py --exclude tset/` said nothing of the
    # second while the first left a file out.
    unused = [p for p in excluding if not _pattern_left_out(p, excluded)]
    if not unused:
        return
    shown = ", ".join(repr(p) for p in unused)
    # the hint where it can be the cause: a pattern with a slash before its end
    hint = (" (a pattern with a slash is relative to the folder given: 'src/tests/' for repo/src/tests given repo)"
            if any("/" in p.rstrip("/") for p in unused) else "")
    reporter.warn(f"{settings.named('exclude')} {shown} left out nothing of the folders read{hint}")


def _pattern_left_out(text: str, excluded: list[str]) -> bool:
    """Whether the pattern matches a path --exclude left out (as shown, or relative to any
    folder above it: the walk matched it relative to the folder given or as shown)."""
    from ktcli.ingest.gitignore import parse_pattern

    pattern = parse_pattern(text[1:] if text.startswith("./") else text)
    if pattern is None:
        return True  # refused before the walk; nothing to say here
    for path in excluded:
        is_dir = path.endswith("/")
        parts = path.rstrip("/").split("/")
        if any(pattern.matches("/".join(parts[k:]), is_dir) for k in range(len(parts))):
            return True
    return False


def prepare(
    paths: list[str], question: str, task: str, settings: Settings, reporter: Reporter,
    stdin_text: str | None = None, contact_server: bool = True,
) -> Prepared:
    """`contact_server` False (`ktcli plan`): a server's window from --context-window where
    it is given, the server not asked (`planning_facts`)."""
    if task == "ask" and not question.strip():
        raise UsageError("the question is empty")
    # A mistyped --model or a --base-url that is no URL fails now, not after reading a large folder.
    server = _server(settings)
    if not server:
        resolve_model(settings.model, settings.named("model"))
    reporter.status("reading input")
    started = time.perf_counter()
    with kept_under(settings.cache_path):  # a PDF's pages, for the next question about it
        corpus = load_corpus(paths, max_file_bytes=settings.max_file_bytes, stdin_text=stdin_text,
                             exclude=settings.exclude, exclude_named=settings.named("exclude"))
    report_skipped(corpus.skipped, reporter)
    _warn_if_nothing_excluded(paths, corpus, settings, reporter)
    if server:
        corpus = _tokens_masked(corpus, server, reporter)
    # (each document's chunks and token count kept by its content: a warm question cuts only what changed)
    chunk_list, doc_tokens = chunked(corpus, chunk_tokens=settings.chunk_tokens,
                                     overlap_tokens=settings.overlap_tokens, cache_dir=settings.cache_path)
    chunks = tuple(chunk_list)
    # Read whole, each document sits in a <source id ref> tag naming its path: ~25 tokens a
    # file, which a folder of 330 small files made 9K of its 13K (the plan said 4K).
    estimate = sum(doc_tokens) + count_tokens(whole_input(corpus.documents, [""] * len(corpus.documents)))
    # A summary also lists the files it reads (~25 tokens a file): 80 small files were
    # planned "full" at 7.3K tokens and ran in parts at 9.2K, 126 s for an estimated 21.
    listing = count_tokens(file_listing(corpus.documents)) if task == "summarize" else 0
    outlines = _outlines(corpus) if task == "summarize" and settings.outline != "never" else {}
    # Documents have distinct paths (load_corpus drops a file named twice).
    outline_estimate = sum(count_tokens(outline_text(outlines[d.path])) if d.path in outlines else n
                           for d, n in zip(corpus.documents, doc_tokens))
    asks_server = bool(server) and (contact_server or settings.context_window <= 0)
    if asks_server:  # its first call: a server slow to answer is not a silence after "reading input"
        reporter.status(f"contacting {server}")
    facts = planning_facts(settings, contact_server=asks_server)
    _refuse_what_the_engine_cannot_run(settings, facts)
    tokenizer = _model_tokenizer(settings, facts, estimate, task) or _tokenizer_for_cached_pages(task, settings)
    # The model's own count where it can decide the mode: tiktoken's estimate scaled by
    # 1.25 is right for English and code, but Japanese text of 7.5K estimated tokens was
    # 10.1K of SmolLM2's, so the plan said "full" and the run switched to retrieval. Also
    # where the prompt cache may hold a sparse read's pages: its exact count beside the
    # estimate's planned 3.2K tokens of prefill for 0.5K (14 s for a 5 s first token).
    if tokenizer is not None:
        per_estimate = len(tokenizer.encode(whole_input(corpus.documents))) / max(estimate, 1)
        kind_ratios = _kind_ratios(corpus, tokenizer)
        sampled, counter = per_estimate, tokenizer
    else:
        sampler = _converted_tokenizer(settings) if settings.backend == "local" else None
        sampled = _sampled_ratio("\n".join(d.text for d in corpus.documents), sampler, floor=0.0)
        per_estimate = max(sampled, MODEL_TOKENS_PER_ESTIMATE)
        kind_ratios = _kind_ratios(corpus, sampler)
        counter = sampler
    # (the plan weighs the floor's margin; it reports the sampled count: `count_scale`)
    count_scale = sampled / per_estimate if counter is not None and tokenizer is None else 1.0
    cached = _cached_prompts(corpus, question, task, settings, facts, tokenizer)
    # (the query the run searches for: it chooses what a focused index embeds)
    to_embed, focus = (_unembedded_share(chunks, settings, search_query(question, piped_beside_files(corpus, chunks)))
                       if task == "ask" else (None, (0, 0)))
    converts = _converts_first(settings)
    request = PlanRequest(
        task=task,
        corpus_tokens=int((estimate + listing) * per_estimate),
        question_tokens=int(count_tokens(question) * per_estimate) if question else 0,
        n_documents=len(corpus.documents),
        largest_document_tokens=int(max(((n + 30) * kind_ratios.get(d.kind, per_estimate)  # (and its source tag)
                                         for d, n in zip(corpus.documents, doc_tokens)), default=0)),
        mode=settings.mode,
        chunk_tokens=settings.chunk_tokens,
        chunk_overlap=settings.overlap_tokens,
        n_chunks=len(chunks),
        top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens,
        max_seconds=settings.max_seconds,
        memory_budget=memory_budget(settings),
        kv_dtype=settings.kv_dtype,
        attention=settings.attention,
        sparse_ok=settings.backend == "local" and settings.engine == "ktcli" and not facts.sliding_window,
        outline_tokens=int((outline_estimate + listing) * per_estimate),
        outline_files=len(outlines),
        outline=settings.outline,
        cached_tokens=_whole_read_cached(cached, settings, facts),
        sparse_cached=tuple((dtype, policy, n) for (dtype, policy), n in cached.items() if policy != "dense"),
        window_cap=settings.context_window,
        # a budget no setting gave is named as the default's (`planner.DEFAULT_MEMORY_BUDGET`)
        origins=settings.origins + ((("max_memory", DEFAULT_MEMORY_BUDGET),) if not settings.max_memory else ()),
        uncached_tokens=None if to_embed is None else int(estimate * per_estimate * to_embed),
        focus_chunks=focus[0],
        unembedded_chunks=focus[1],
        convert_params=facts.n_params if converts else 0,
        convert_largest=facts.convert_largest_params if converts else 0,
        compiles_kernels=_compiles_kernels(settings),
        float32_params=_float32_file_params(settings, facts, converts),
        # a question read whole quotes its key lines (`pipeline.key_lines`), never from code
        key_lines=settings.key_lines if task == "ask" and any(quotes(d.kind) for d in corpus.documents) else 0,
        kernel_pages=bool(settings.rope_scaling) and settings.engine == "ktcli",
        read_s=time.perf_counter() - started,
        tokens_per_estimate=per_estimate,
        **_passage_sizes(chunks, sampled, counter),
        listing_tokens=int(listing * per_estimate),
        count_scale=count_scale,
        shown_whole=sum(map(shown_whole, corpus.documents)) if summarized_per_document(task, len(corpus.documents))
        else int(task == "summarize" and len(corpus.documents) == 1 and badges_alone(corpus.documents[0].text.strip())),
    )
    rates = load_rates(settings, facts, code=mostly_code(corpus.documents))
    try:
        plan, over_budget = make_plan(request, facts, rates), None
    except OutOfMemoryError as e:
        if not request.memory_budget:
            raise
        # Over --max-memory as a fresh run: a rerun whose every note step is kept reads only
        # its notes, which may fit (a summary's rerun planned at ~1 GiB peaked at ~0.5). The
        # read it would be, unbudgeted, tells which notes to look for; refused unless they
        # are all kept and that read fits.
        plan, over_budget = make_plan(replace(request, memory_budget=0), facts, rates), e
    # Keyed by the read the plan chose, which kept notes do not change (`planner.
    # _planned_with_kept_notes`): the plan again, with them, where an earlier run kept some.
    notes_request = _notes_request(task, question, corpus, settings, plan)
    whole = False
    if notes_request:
        kept = notes_memo.kept(settings.cache_path, notes_request)
        whole = kept.whole
        if kept.steps:
            notes = int(count_tokens(kept.text) * per_estimate) if whole else 0
            plan = make_plan(replace(request, kept_notes=kept.steps, notes_all_kept=whole, kept_notes_tokens=notes,
                                     known_windows=kept.windows,
                                     memory_budget=0 if over_budget else request.memory_budget), facts, rates)
    if over_budget is not None:
        if not whole or plan.est_memory_bytes > request.memory_budget:
            raise over_budget
        budget = settings.max_memory or f"{request.memory_budget / 2**30:.2f} GiB"  # (the default's: it said "()")
        plan = replace(plan, reasons=(*plan.reasons, f"within the {named_setting(request.origins, 'max_memory')} "
                                      f"budget ({budget}) with every note kept, though not as a fresh run"))
    document_tokens = _document_tokens(corpus.documents, doc_tokens, per_estimate * count_scale,
                                       {k: r * count_scale for k, r in kind_ratios.items()})
    plan = _with_piped_reason(plan, corpus, chunks, document_tokens.get(STDIN_PATH, 0))
    _warn_if_chunks_too_small(settings, plan, reporter)
    _warn_if_window_reads_little(plan, reporter)
    if task == "summarize" and settings.outline == "always":
        _warn_if_not_outlined(corpus, outlines, reporter)
    return Prepared(corpus=corpus, chunks=chunks, plan=plan, facts=facts, question=question.strip(),
                    outlines=outlines if plan.outline_files else {}, converts_model=converts,
                    notes_request=notes_request,
                    kind_ratios={kind: ratio / per_estimate for kind, ratio in kind_ratios.items()},
                    document_tokens=document_tokens)


# A document this short (a `py.typed` marker, a one-line config) is shown whole in a summary
# of several, not summarized (`summarize`): a summary would be longer than it, and the bundled
# model's summaries of such files restated the instructions ("This is a summary of the content...").
QUOTED_MAX_CHARS = 160
QUOTED_MAX_LINES = 6


def shown_whole(doc) -> bool:
    """A document a summary of several shows whole instead of summarizing (QUOTED_MAX_CHARS),
    or lists as the badges it is alone (`badges`: a README of badge lines)."""
    text = doc.text.strip()
    return bool(text) and (len(text) <= QUOTED_MAX_CHARS and len(text.splitlines()) <= QUOTED_MAX_LINES
                           or badges_alone(text))


def badges_alone(text: str) -> bool:
    """Whether `text` is lines of Markdown badges alone (`badges.badges_only`)."""
    return badges_only(text) is not None


def piped_beside_files(corpus: Corpus, chunks) -> list[Chunk]:
    """The chunks of standard input where files or folders are read beside it (`git diff |
    ktcli ask - repo/ "What does this change break?"`): what was piped is what the question
    is about, and the files are where to look."""
    if len(corpus.documents) < 2 or not any(d.path == STDIN_PATH for d in corpus.documents):
        return []
    return [c for c in chunks if c.doc_path == STDIN_PATH]


def search_query(question: str, piped: list[Chunk]) -> str:
    """The question, and where what was piped is a diff, a question after the callers of
    the names it changes (`symbols.changed_names`): a question of no content word found
    8 arbitrary passages, none the caller that breaks. The plan counts what a focused index
    embeds for it, not for the question alone (895 of torch/fx's chunks planned, 1,000 run)."""
    if not piped:
        return question
    from ktcli.retrieval.symbols import changed_names

    names = changed_names("\n".join(c.text for c in piped))
    return f"{question} What calls {', '.join(f'`{n}`' for n in names)}?" if names else question


def reads_piped_whole(piped_model_tokens: int, evidence_budget: int) -> bool:
    """Whether a question's retrieval reads standard input whole beside the files' passages:
    where it takes at most half the evidence budget (else its chunks compete as any others).
    Both in the model's tokens: the chunks' own counts are the estimate tokenizer's, which
    counted a digit-heavy log at well under half of what the model reads."""
    return 0 < piped_model_tokens <= evidence_budget // 2


def _with_piped_reason(plan: Plan, corpus: Corpus, chunks, tokens: int) -> Plan:
    """The plan, with one line on standard input read beside files by retrieval: whether the
    model reads it whole. `git log -p | ktcli plan - folder "q"` said only "retrieve the top 8
    of 156 chunks", of a piped log too long to read whole (probe 128)."""
    piped = piped_beside_files(corpus, chunks)
    if plan.task != "ask" or plan.mode is not Mode.RETRIEVAL or not piped:
        return plan
    from ktcli.retrieval.symbols import changed_names

    names = changed_names("\n".join(c.text for c in piped))
    looked_up = f"; the {len(names)} name(s) its diff changes are looked up in the files" if names else ""
    if reads_piped_whole(tokens, plan.evidence_budget):
        said = f"{STDIN_PATH} (~{tokens:,} tokens) is read whole, beside the chunks retrieved from the files{looked_up}"
    else:
        said = (f"{STDIN_PATH} (~{tokens:,} tokens) is over half the {plan.evidence_budget:,}-token evidence budget, "
                f"so it is not read whole: its chunks are ranked with the files'{looked_up}")
    return replace(plan, reasons=(*plan.reasons, said))


def _document_tokens(documents, estimates: list[int], ratio: float, kind_ratios: dict[str, float]) -> dict[str, int]:
    """Each document's own tokens, as the plan reports the input's (`ratio`: model tokens
    per estimate token, its margin left out): each kind at its own ratio (`kind_ratios`),
    scaled so that together they are the documents' share of plan.input_tokens. A 36-character
    file was said to be 52 tokens, the prompt's tags and listing spread over the files by size."""
    weighted = [n * kind_ratios.get(d.kind, ratio) for d, n in zip(documents, estimates)]
    scale = sum(estimates) * ratio / max(sum(weighted), 1e-9)
    return {d.path: round(w * scale) for d, w in zip(documents, weighted)}


# Documents whose source tag `_passage_sizes` counts at most (spread over the input).
TAG_SAMPLE_DOCUMENTS = 256


def _passage_sizes(chunks: tuple[Chunk, ...], ratio: float, tokenizer) -> dict[str, float]:
    """A retrieved chunk as a window reads it, in model tokens: the chunks' mean and their
    source tags' (`PlanRequest.chunk_mean_tokens`, `passage_tag_tokens`), each tag counted
    on a document's middle chunk (its path and place, line numbers of a typical width; a
    table's header row), weighted by the document's chunks. `ratio`: model tokens per
    estimate token of the input as measured (not padded: the tutorial's chunks are 1.09x
    tiktoken's, planned at 1.25x); `tokenizer`: the model's, which counts the tags (SmolLM2
    spells their line numbers digit by digit: 1.4-1.5x tiktoken's count), else tiktoken's
    at `ratio`."""
    if not chunks:
        return {}
    by_doc: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_doc.setdefault(c.doc_path, []).append(c)
    docs = [(of[len(of) // 2], len(of)) for of in by_doc.values()]
    docs = docs[::max(1, -(-len(docs) // TAG_SAMPLE_DOCUMENTS))]
    if tokenizer is not None:
        def count(text: str) -> float:
            return len(tokenizer.encode(text))
    else:
        def count(text: str) -> float:
            return count_tokens(text) * ratio
    tags = sum((count(as_read([c])) + 1 - count(c.text)) * n for c, n in docs) / sum(n for _, n in docs)
    return {"chunk_mean_tokens": sum(c.n_tokens for c in chunks) / len(chunks) * ratio,
            "passage_tag_tokens": max(tags, 0.0)}


def _notes_request(task: str, question: str, corpus: Corpus, settings: Settings, plan: Plan) -> str:
    """The request's key in the notes memo, or "" where its notes are not kept (as
    `NotesMemo.for_run` decides once the backend is loaded: a sampled run, the prompt cache
    off, a server)."""
    if not settings.prompt_cache or settings.temperature > 0 or settings.backend != "local":
        return ""
    return notes_memo.request_key(task, question.strip(), corpus.documents, settings, notes_memo.read_chosen(plan))


# A question answered from retrieved chunks reads only those: under this many tokens (a
# line or two) each holds a few words (--chunk-tokens 1 retrieved 8 single tokens of
# 78,766). Warned, not refused: the run works, and a small chunk is a choice an experiment
# or a corpus of one-line records may make on purpose.
MIN_USEFUL_CHUNK_TOKENS = 32


# Tokens of a KV page (`kernels.page_format.KVCacheSpec.block_size`, whose import is kept
# out of the plan's path here; a test holds them equal).
PAGE_TOKENS = 64


def _warn_if_window_reads_little(plan: Plan, reporter: Reporter) -> None:
    """A window policy reads the first page and the last N pages at each step: asked for an
    input several times that, the answer sees little of it before its question (probe 100:
    `--attention window:1` over a 2K-token PDF answered "The answer.html\">", unwarned)."""
    kind, _, pages = canonical_attention(plan.attention).partition(":")
    if kind != "window" or not pages.isdigit():
        return
    seen = (int(pages) + 1) * PAGE_TOKENS
    if plan.input_tokens > 2 * seen:
        reporter.warn(f"--attention {kind}:{pages} reads the first and the last {pages} page(s) of the input at "
                      f"each step (~{seen:,} of its ~{plan.input_tokens:,} tokens): the answer sees little of it; "
                      "topk reads the pages that match the question")


def _warn_if_chunks_too_small(settings: Settings, plan: Plan, reporter: Reporter) -> None:
    """Only where chunks are what the model reads: a summary joins neighbouring chunks up
    to a window, and a whole read cites by them."""
    if plan.task == "ask" and plan.mode is Mode.RETRIEVAL and settings.chunk_tokens < MIN_USEFUL_CHUNK_TOKENS:
        one = plan.top_k == 1
        held = "the chunk retrieved holds" if one else f"the {plan.top_k} chunks retrieved hold"
        reporter.warn(f"{settings.named('chunk_tokens')} {settings.chunk_tokens}: {held} ~{settings.chunk_tokens} "
                      f"tokens{'' if one else ' each'}, too little to answer from (under "
                      f"{MIN_USEFUL_CHUNK_TOKENS}; the default is {Settings().chunk_tokens})")


def _converts_first(settings: Settings) -> bool:
    """Whether this run converts its model before loading it: a local GGUF not converted
    yet (`engine.model_store`)."""
    if settings.backend != "local":
        return False
    source = resolve_model(settings.model, settings.named("model"))
    return source.kind == "gguf" and not is_converted(source, settings.cache_path)


def _float32_file_params(settings: Settings, facts: ModelFacts, converts: bool) -> int:
    """Parameters whose float32 copy this run writes before its model loads: --engine hf
    on a GGUF that ktcli's converter takes (transformers' own writes the file as it
    converts) and whose folder reads its weights from the GGUF still (`engine.gguf_weights`)."""
    from ktcli.engine.gguf_weights import linked_gguf

    if settings.backend != "local" or settings.engine != "hf":
        return 0
    source = resolve_model(settings.model, settings.named("model"))
    if source.kind != "gguf":
        return 0
    if converts:
        return facts.n_params if facts.convert_largest_params else 0
    return facts.n_params if linked_gguf(model_folder(source, settings.cache_path)) is not None else 0


def _compiles_kernels(settings: Settings) -> bool:
    """Whether this run's model load compiles the engine's C++ kernels first (the ktcli
    engine on the CPU, where no build is there yet: `engine.cpp_ext.compile_pending`)."""
    from ktcli.engine import cpp_ext
    from ktcli.engine.device import device_kind

    return (settings.backend == "local" and settings.engine == "ktcli"
            and device_kind(settings.device, settings.named("device")) == "cpu" and cpp_ext.compile_pending())


def _refuse_what_the_engine_cannot_run(settings: Settings, facts: ModelFacts) -> None:
    """What the ktcli engine cannot run, refused before any work (the plan showed a plan
    for it): a model type it does not implement, and the flags that need the paged KV
    cache for a model with sliding-window layers (the plan proposed sparse for one)."""
    from ktcli.engine.config import SLIDING_WINDOW_REFUSAL, SUPPORTED, quantized_refusal

    if settings.engine != "ktcli" or settings.backend != "local":
        return
    if facts.quantized:
        raise UsageError(f"--model {settings.model}: {quantized_refusal(facts.quantized)}")
    if facts.model_type not in SUPPORTED:
        raise UsageError(f"model type {facts.model_type!r} is not supported by the ktcli engine (use --engine hf)")
    if ":" in settings.attention:  # topk:N / window:N: what `ask` checks before its load, said by the plan too
        from ktcli.engine.longctx import check_attention_span

        folder = model_folder(resolve_model(settings.model, settings.named("model")), settings.cache_path)
        if (folder / "config.json").is_file():
            check_attention_span(folder, settings.attention, settings.rope_scaling or None)
    if not facts.sliding_window:
        return
    asked = settings.kv_dtype in ("fp8", "int8", "int4") or settings.attention.partition(":")[0] in ("window", "topk") \
        or bool(settings.rope_scaling) or settings.mode == "sparse"
    if asked:
        raise UsageError(SLIDING_WINDOW_REFUSAL)


def _model_tokenizer(settings: Settings, facts: ModelFacts, estimate: int, task: str = "ask"):
    """The local model's own tokenizer, where the input is near enough to the window for
    its count to decide the mode (up to twice the window by the estimate), or where a
    sparse read of it whole may follow (`_may_read_whole`); None for a server, a model not
    converted yet, or an input far past the window. Costs the tokenizer's load (the engine
    then reuses it) and one tokenisation (~20 ms for 10K; ~1 s for the 68K-token tutorial
    on a busy 2-core machine, whose sparse read takes minutes)."""
    if settings.backend != "local":
        return None
    tokens = estimate * MODEL_TOKENS_PER_ESTIMATE
    if tokens > 2 * facts.context_window and not (tokens <= EXACT_COUNT_TOKENS and _may_read_whole(settings, task)):
        return None
    return _converted_tokenizer(settings)


# Past this many (estimated) tokens a possible sparse read is planned from the sampled
# ratio: counting costs ~1 s per 115K tokens on 2 busy cores (a 36M-token folder asked
# with --max-seconds would have waited ~5 minutes for its plan), and a read that long
# takes most of an hour whatever its count.
EXACT_COUNT_TOKENS = 300_000


def _may_read_whole(settings: Settings, task: str) -> bool:
    """Whether the plan may choose a sparse read of the whole input (`planner._plan`: asked
    for, or weighed by auto for a sparse flag or a question's time budget): its window, time
    and memory go by the input's tokens, and the sampled ratio's floor (`_sampled_ratio`)
    planned the tutorial at ~78,975 tokens where the engine read 68,784."""
    if settings.engine != "ktcli" or settings.mode not in ("auto", "sparse"):
        return False
    return settings.mode == "sparse" or weighs_sparse(task, settings.max_seconds, settings.attention, settings.kv_dtype)


_SAMPLES, _SAMPLE_CHARS = 16, 4096


def _sampled_ratio(text: str, tokenizer, floor: float = MODEL_TOKENS_PER_ESTIMATE) -> float:
    """Model tokens per tiktoken token over 16 slices of 4 KB spread across an input too
    long to count whole (~0.15 s with the tokenizer's load): logs and CSV run 1.46x,
    minified code 1.62x, so the fixed 1.25 planned a 353K-token file at 226K. The fixed
    ratio where the model's tokenizer is not at hand (not converted yet, a server)."""
    if tokenizer is None:
        return MODEL_TOKENS_PER_ESTIMATE
    step = max(len(text) // _SAMPLES, _SAMPLE_CHARS)
    slices = [text[at : at + _SAMPLE_CHARS] for at in range(0, len(text), step)][:_SAMPLES]
    ours, theirs = sum(len(tokenizer.encode(t)) for t in slices), sum(count_tokens(t) for t in slices)
    # Never below the fixed ratio: "fits" errs on the safe side, as the padding meant
    # (`floor` 0: the ratio as sampled, what a chunk of the input costs on average).
    return max(ours / theirs, floor) if theirs else MODEL_TOKENS_PER_ESTIMATE


def _kind_ratios(corpus: Corpus, tokenizer) -> dict[str, float]:
    """`_sampled_ratio` for each kind of document (pdf, code, markdown...) in an input that
    mixes kinds; empty for one kind, or without the model's tokenizer. The input's one
    ratio counted a 3,254-token PDF as 4,378 in a folder of code, and it decides whether
    a summary's largest document is read whole. ~10 ms a kind."""
    by_kind: dict[str, list[str]] = {}
    for d in corpus.documents:
        by_kind.setdefault(d.kind, []).append(d.text)
    if tokenizer is None or len(by_kind) < 2:
        return {}
    return {kind: _sampled_ratio("\n".join(texts), tokenizer) for kind, texts in by_kind.items()}


def _converted_tokenizer(settings: Settings):
    from ktcli.engine.model_store import is_converted
    from ktcli.engine.tokenizer import load_chat_tokenizer

    source = resolve_model(settings.model, settings.named("model"))
    if not is_converted(source, settings.cache_path):
        return None
    folder = model_folder(source, settings.cache_path)
    if not (folder / "tokenizer.json").is_file():
        return None
    return load_chat_tokenizer(folder)


def _may_read_cached_prompts(task: str, settings: Settings) -> bool:
    """Whether a run could read a whole-read prompt back from the prompt cache."""
    return (task == "ask" and settings.prompt_cache and settings.engine == "ktcli" and settings.backend == "local"
            and settings.mode != "retrieval" and (settings.cache_path / "prompts").is_dir())


def _tokenizer_for_cached_pages(task: str, settings: Settings):
    """The model's tokenizer for an input far past the window, where the prompt cache holds
    pages of a sparse read (it costs its load and ~0.2 s per 100K tokens; a sparse prefill
    of them, minutes); else None."""
    from ktcli.engine.prefix_store import holds_chunked

    if not _may_read_cached_prompts(task, settings) or not holds_chunked(settings.cache_path / "prompts"):
        return None
    return _converted_tokenizer(settings)


def _cached_prompts(corpus: Corpus, question: str, task: str, settings: Settings, facts: ModelFacts,
                    tokenizer) -> dict[tuple[str, str], int]:
    """Per (page dtype, attention policy), the tokens of this question's whole-read prompt
    the engine's prompt cache holds (what `pipeline.qa` would send; `engine.prefix_store`),
    so the plan does not count their prefill: a second question about the same input
    answers in ~2 s, not the ~9 s of a first (a sparse read of 80K tokens: seconds, not
    minutes). Empty where no whole read on the local engine can follow, or the model's
    tokenizer is not at hand (`_model_tokenizer`: no entry can exist)."""
    if tokenizer is None or not _may_read_cached_prompts(task, settings):
        return {}
    from ktcli.engine.prefix_store import prompt_cache_description, stored_prefixes
    from ktcli.pipeline import prompts

    root = settings.cache_path / "prompts"
    messages = prompts.ask_messages(question.strip(), whole_input(corpus.documents))
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    described = prompt_cache_description(Path(tokenizer.name_or_path), planned_weights(settings), "",
                                         "cuda" if _on_gpu(settings) else "cpu")
    wanted = {k: described[k] for k in ("model", "weights", "device")} | {
        "rope": canonical_rope_scaling(settings.rope_scaling)}  # rows of another scaling are never read
    return stored_prefixes(root, ids, wanted)


def _whole_read_cached(cached: dict[tuple[str, str], int], settings: Settings, facts: ModelFacts) -> int:
    """Of `_cached_prompts`, the tokens a read in the model's window would read back (its
    pages: the model's, or --kv-dtype's, attended densely)."""
    if settings.mode not in ("auto", "full") or settings.attention not in ("auto", "dense"):
        return 0
    return cached.get((facts.kv_dtype if settings.kv_dtype == "auto" else settings.kv_dtype, "dense"), 0)


def _unembedded_share(chunks: tuple[Chunk, ...], settings: Settings,
                      question: str = "") -> tuple[float | None, tuple[int, int]]:
    """The share of the input's tokens whose chunks the question's index embeds, those the
    index cache does not hold yet (of them the ones its words point at, where they are many:
    --embed auto, chosen as the run will: `retriever.planned_embeddings`), so the plan counts
    only their embedding: a second question about the tutorial was estimated at ~31 s and
    answered in ~8. None (count it all) when that cannot be told. And the chunks a focused
    build embeds, of those not held ((0, 0): not focused)."""
    if not chunks:
        return None, (0, 0)
    try:
        from ktcli.retrieval.embedder import Embedder
        from ktcli.retrieval.retriever import cached_chunks, planned_embeddings
        from ktcli.retrieval.store import IndexStore

        held = cached_chunks(chunks, Embedder(settings.embedder).name, IndexStore(settings.cache_path))
    except KtcliError:
        if settings.mode == "full":
            return None, (0, 0)  # no retrieval will run: the embedder is not needed
        raise  # a bad --embedder, said now: it was said only after the model had loaded
    except Exception:  # noqa: BLE001 - an estimate; the index build reports real problems
        return None, (0, 0)
    total = sum(c.n_tokens for c in chunks)
    if not total:
        return None, (0, 0)
    missing = len(held) - sum(held)
    # (the focus is chosen over the BM25 index, built here where no question kept it: not
    # for a read of the whole input, which builds no index)
    focused = settings.embed == "auto" and question and settings.mode in ("auto", "retrieval")
    try:
        embedded = planned_embeddings(chunks, held, question if focused else None, Path(settings.cache_path))
    except Exception:  # noqa: BLE001 - an estimate: every chunk not held, as before the focus
        embedded = [pos for pos, is_held in enumerate(held) if not is_held]
    share = sum(chunks[pos].n_tokens for pos in embedded) / total
    return share, ((0, 0) if len(embedded) == missing else (len(embedded), missing))


def _warn_if_not_outlined(corpus: Corpus, outlines: dict, reporter: Reporter) -> None:
    """--outline always over files that have no outline: said (a 59-page PDF planned and
    read exactly as without the flag, and nothing told why). The reasons named are
    `ingest.outline.outline_lines`': "PDFs" were named, though a long PDF with headings
    has one, and a 29-line README with headings was told it had none for want of them."""
    whole = [d.path for d in corpus.documents if d.path not in outlines]
    if whole:
        reporter.warn(f"--outline always: {first_named(whole)} {'has' if len(whole) == 1 else 'have'} no outline "
                      f"(data, documents under {PROSE_OUTLINE_CHARS:,} characters or without headings, code an "
                      "outline would not shorten) and "
                      f"{'is' if len(whole) == 1 else 'are'} read whole")


def _outlines(corpus: Corpus) -> dict[str, list[tuple[int, str]]]:
    """path -> outline of every document that has one (`ingest.outline`)."""
    out = {}
    for doc in corpus.documents:
        kept = outline_lines(doc)
        if kept is not None:
            out[doc.path] = kept
    return out
