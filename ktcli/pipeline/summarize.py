"""`ktcli summarize`: whole when it fits; otherwise map over windows with running notes,
then reduce. For a folder the model also sees the file listing, so the summary covers
per-file content and the overall structure."""

from __future__ import annotations

from dataclasses import replace

from ktcli.config import Settings
from ktcli.engine.backend import Backend, SamplingParams
from ktcli.pipeline import citations, prompts
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.prepare import Prepared
from ktcli.pipeline.runner import Tally, generate_text, stream_answer
from ktcli.pipeline.windows import merge_neighbours, pack, source_order
from ktcli.plan.planner import MEMORY_TOKENS
from ktcli.types import Answer, Chunk, Corpus, Mode

LISTING_MAX_LINES = 200


def summarize(prep: Prepared, backend: Backend, settings: Settings, reporter: Reporter, tally: Tally) -> Answer:
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    listing = file_listing(prep.corpus) if len(prep.corpus.documents) > 1 else ""
    plan = prep.plan
    if plan.mode in (Mode.FULL, Mode.SPARSE):  # sparse: the engine's window is the whole input
        text = prompts.evidence_block([(i + 1, d.path, d.text) for i, d in enumerate(prep.corpus.documents)])
        messages = prompts.summary_messages(text, listing)
        needed = backend.prompt_tokens(messages) + params.max_new_tokens
        if needed <= backend.context_window:
            reporter.status(f"summarizing the whole input ({needed - params.max_new_tokens:,} tokens)")
            summary = stream_answer(backend, messages, params, tally, reporter)
            return _answer(summary, prep, plan, tally, 1)
        reporter.warn(f"exact count {needed:,} tokens exceeds the {backend.context_window:,} window; summarizing in parts")
        plan = replace(plan, mode=Mode.RETRIEVAL)

    doc_rank = {d.path: i for i, d in enumerate(prep.corpus.documents)}
    budget = plan.evidence_budget if plan.mode is Mode.RETRIEVAL and plan.evidence_budget else 4096
    passages = merge_neighbours(source_order(list(prep.chunks), doc_rank), budget, backend.count_tokens)
    windows = pack(passages, budget, backend.count_tokens)
    notes = ""
    note_params = replace(params, max_new_tokens=MEMORY_TOKENS)
    for i, window in enumerate(windows):
        reporter.status(f"reading part {i + 1}/{len(windows)}")
        reporter.progress("map", i, len(windows))
        body = prompts.evidence_block([(j + 1, c.span.cite(), c.text) for j, c in enumerate(window)])
        position = f"part {i + 1} of {len(windows)}: {_where(window)}"
        notes = generate_text(backend, prompts.summary_notes_messages(body, notes, position), note_params,
                              tally, reporter, "notes")
    reporter.progress("map", len(windows), len(windows))
    reporter.status("writing the summary from the notes")
    summary = stream_answer(backend, prompts.summary_reduce_messages(notes, listing), params, tally, reporter)
    return _answer(summary, prep, replace(plan, n_windows=len(windows)), tally, len(windows))


def _answer(summary: str, prep: Prepared, plan, tally: Tally, n_windows: int) -> Answer:
    cites = citations.attribute(summary, list(prep.chunks), max_citations=5)
    figures = tally.figures() | {"windows": n_windows}
    return Answer(summary, tuple(cites), plan, figures, prep.corpus.skipped)


def _where(window: list[Chunk]) -> str:
    paths: list[str] = []
    for c in window:
        if c.doc_path not in paths:
            paths.append(c.doc_path)
    if len(paths) == 1:
        first, last = window[0].span, window[-1].span
        if first.page is not None:
            return f"{paths[0]} pages {first.page}-{last.page}"
        return f"{paths[0]} lines {first.line_start}-{last.line_end}"
    return ", ".join(paths[:6]) + (f" and {len(paths) - 6} more files" if len(paths) > 6 else "")


def file_listing(corpus: Corpus) -> str:
    """'path (N lines)' per document; long listings say how many were left out of the prompt."""
    rows = [f"{d.path} ({d.n_lines} lines)" for d in corpus.documents]
    if len(rows) > LISTING_MAX_LINES:
        rest = len(rows) - LISTING_MAX_LINES
        rows = rows[:LISTING_MAX_LINES] + [f"... and {rest} more files (all of them are read; only the listing is short)"]
    return "\n".join(rows)
