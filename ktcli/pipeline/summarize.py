"""`ktcli summarize`: whole when it fits; otherwise map over windows with running notes,
then reduce. For a folder the model also sees the file listing, so the summary covers
per-file content and the overall structure. When the plan says so (reading every line
would exceed the time budget, or --outline always), code files and long prose with
headings are read as their outlines (`ingest.outline`) and everything else whole."""

from __future__ import annotations

import re
from dataclasses import replace

from ktcli.config import Settings
from ktcli.engine.backend import Backend, SamplingParams
from ktcli.engine.openai_http import StreamCutOffError
from ktcli.errors import Interrupted, InterruptedWithNotes, NotesCutOff, interruption
from ktcli.ingest.outline import outline_chunks, outline_text
from ktcli.pipeline import citations, prompts
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.file_map import file_map
from ktcli.pipeline.badges import badge_summary
from ktcli.pipeline.prepare import Prepared, badges_alone, shown_whole
from ktcli.pipeline.notes_memo import NotesMemo
from ktcli.pipeline.runner import (AnswerInterrupted, Tally, cited_if_interrupted, first_ones, stream_answer,
                                   take_notes)
from ktcli.pipeline.skip_report import first_named
from ktcli.pipeline.windows import as_read, merge_neighbours, pack, refit, refuse_named_full, source_order
from ktcli.plan.planner import MEMORY_TOKENS, evidence_cap, evidence_room, per_document_tokens, with_windows
from ktcli.types import CHAPTER, Answer, Chunk, Citation, Document, Mode

# A final summary with fewer words of its own than this (not ktcli's prompt words, not in
# markup tags) carries nothing: the notes it was written from follow it.
SUMMARY_MIN_TERMS = 4
# An outline is split into pieces of about this many tokens, so windows pack evenly.
OUTLINE_PIECE_TOKENS = 1024
# A document's section where the model wrote nothing of it (markup, made-up code: left out).
NO_SUMMARY = "(no summary: the model wrote nothing from this file)"


def summarize(prep: Prepared, backend: Backend, settings: Settings, reporter: Reporter, tally: Tally) -> Answer:
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                            stop=prompts.SUMMARY_STOPS)
    listing = prompts.file_listing(prep.corpus.documents)
    plan = prep.plan
    if prep.outlines:  # which files, not only how many: most of an input may go unread
        reporter.warn(_outlined_files(prep))
    if len(prep.corpus.documents) == 1 and badges_alone(prep.corpus.documents[0].text.strip()):
        return _badges_alone(prep, reporter, tally)
    if plan.mode is Mode.FULL and plan.n_windows > 1:  # a few documents: one at a time (`planner.PER_DOCUMENT_MAX`)
        each = [prompts.summary_messages(prompts.whole_input([d], [_text(prep, d)]), outlined=d.path in prep.outlines)
                for d in prep.corpus.documents]
        share = replace(params, max_new_tokens=per_document_tokens(len(each), params.max_new_tokens))
        # (a file shown whole is not read: where every one is, the model is never loaded)
        if all(shown_whole(d) or backend.prompt_tokens(m) + share.max_new_tokens <= backend.context_window
               for d, m in zip(prep.corpus.documents, each)):
            return _each_document(prep, each, backend, share, reporter, tally)
        plan = replace(plan, n_windows=1)  # (a document's prompt past the window: read together, as below)
    if plan.mode in (Mode.FULL, Mode.SPARSE):  # sparse: the engine's window is the whole input
        # The source refs of a question read whole: what the plan counted
        text = prompts.whole_input(prep.corpus.documents, [_text(prep, d) for d in prep.corpus.documents])
        messages = prompts.summary_messages(text, listing, outlined=bool(prep.outlines))
        needed = backend.prompt_tokens(messages) + params.max_new_tokens
        if needed <= backend.context_window:
            reporter.status(f"summarizing the whole input ({needed - params.max_new_tokens:,} tokens{_outlined(prep)})")
            with cited_if_interrupted() as streamed:
                streamed.text = stream_answer(backend, messages, params, tally, reporter, subject="the summary",
                                              source=_sources(prep))
                _warn_if_echo(streamed.text, reporter)
            return streamed.finish(lambda summary: _answer(summary, prep, plan, tally, 1, reporter=reporter))
        refuse_named_full(settings.mode, needed - params.max_new_tokens, backend.context_window, params.max_new_tokens)
        switched = f"exact count {needed:,} tokens exceeds the {backend.context_window:,} window; summarizing in parts"
        reporter.warn(switched)  # and the plan's reason, for --json: the estimate's no longer holds
        # Windows of a read in parts, not the whole input's size.
        room = evidence_room(backend.context_window, 0, params.max_new_tokens, evidence_cap("summarize"), "summarize")
        plan = replace(plan, mode=Mode.RETRIEVAL, evidence_budget=room, reasons=(switched,))

    doc_rank = {d.path: i for i, d in enumerate(prep.corpus.documents)}
    budget = plan.evidence_budget
    passages = merge_neighbours(source_order(_read_chunks(prep, budget), doc_rank), budget, backend.count_tokens)
    written = max(params.max_new_tokens, MEMORY_TOKENS)

    def fits(window: list[Chunk]) -> bool:
        # "." for the notes passed in: their header counted, their text (up to MEMORY_TOKENS) added
        messages = prompts.summary_notes_messages(as_read(window), ".", f"part 999 of 999: {_where(window)}", True)
        return backend.prompt_tokens(messages) + MEMORY_TOKENS + written <= backend.context_window

    windows = refit(pack(passages, budget, backend.count_tokens), fits)
    notes = ""
    # Each part's notes, kept for the summary: asked to keep the earlier notes, the bundled
    # model wrote of its own part only, and a summary of a 24-page report written from the
    # last part's notes was of its last chapter alone.
    taken: list[str] = []
    note_params = replace(params, max_new_tokens=MEMORY_TOKENS)
    memo = NotesMemo.for_run(settings.cache_path, settings.prompt_cache, backend, note_params, prep.notes_request)
    if memo is not None:
        memo.windows = len(windows)
    read = 0
    hollow: list[int] = []  # the parts whose notes said nothing from the input (dropped)
    try:
        for read, window in enumerate(windows):
            body = prompts.passages(window)
            position = f"part {read + 1} of {len(windows)}: {_where(window)}"
            outlined = any(c.doc_path in prep.outlines for c in window)
            messages = prompts.summary_notes_messages(body, notes, position, outlined)
            # Parts read back from an earlier run are no pace of reading: after a resume at
            # part 11 of 50 the bar said "~1:32 left" for six minutes' work.
            if memo is None or not memo.holds(messages):
                reporter.progress("map", read, len(windows))
            new = _without_position_echo(take_notes(backend, messages, note_params, tally, reporter, memo,
                                                    f"reading part {read + 1}/{len(windows)}{_outlined(prep)}"))
            if citations.has_content(new):  # an echo of the instructions carries nothing
                notes = new
                taken.append(new)
            else:
                hollow.append(read)
    except KeyboardInterrupt:
        resume = f"; the same command again starts at part {read + 1}" if memo is not None and not memo.failed else ""
        if not notes:
            if read and resume:
                # Parts read whose notes said nothing are kept all the same: said, not a bare
                # "interrupted" the rerun then contradicted by starting at the next part.
                raise Interrupted(f"{interruption()[0]} while reading part {read + 1} of {len(windows)}: the notes of "
                                  f"{first_ones('part', read)} said nothing from the input; they are kept{resume}") from None
            raise
        raise _interrupted_with_notes(f"while reading part {read + 1} of {len(windows)}", read, windows, notes, resume,
                                      prep, plan, tally) from None
    except StreamCutOffError as e:
        raise _cut_off_in_notes(e, read, windows, notes, memo, prep, plan, tally) from None
    if memo is not None:
        memo.finish()
    reporter.progress("map", len(windows), len(windows))
    if not notes:
        # Every part's notes were markup or the instructions again: a summary written from
        # none was made up ("The final summary is a concise and clear summary of the input").
        reporter.warn(f"the model wrote nothing from the input in the notes of its {len(windows)} parts, so no summary "
                      "is written from them (a larger model, --model, does better)")
        return _answer("", prep, with_windows(plan, len(windows)), tally, len(windows))
    if hollow:
        reporter.warn(_hollow_parts(hollow, windows))
    reporter.status("writing the summary from the notes")

    def room(text: str) -> bool:
        return backend.prompt_tokens(prompts.summary_reduce_messages(text, listing)) + params.max_new_tokens \
            <= backend.context_window

    notes = every_parts_notes(taken, room) or notes
    messages = prompts.summary_reduce_messages(notes, listing)
    rows = prompts.LISTING_MAX_LINES
    while backend.prompt_tokens(messages) + params.max_new_tokens > backend.context_window and rows > 1:
        rows //= 2  # a long listing of deep paths beside the notes, in a small window
        messages = prompts.summary_reduce_messages(notes, prompts.file_listing(prep.corpus.documents, rows))
    summary_text = None
    try:
        with cited_if_interrupted() as streamed:
            summary_text = stream_answer(backend, messages, params, tally, reporter, subject="the summary",
                                         source=_sources(prep))
            streamed.text = _with_notes_if_empty(summary_text, notes, len(windows), reporter)
    except KeyboardInterrupt:
        # Before the summary's first token (its prompt read): the notes of every part are
        # kept, as they are where the parts are read. Said "terminated (SIGTERM)" alone, and
        # --json's object was the error alone, after every part was read (probe 124).
        if summary_text is not None:  # (the summary shown, Ctrl-C while it was checked)
            raise
        resume = "; the same command again writes the summary from them" if memo is not None and not memo.failed else ""
        raise _interrupted_with_notes("while writing the summary from the notes", len(windows), windows, notes, resume,
                                      prep, plan, tally) from None
    return streamed.finish(lambda summary: _answer(summary, prep, with_windows(plan, len(windows)), tally,
                                                   len(windows), reporter=reporter))


def _headed_notes(read: int, total: int, what: str, notes: str) -> str:
    """The notes of the parts read, headed as notes: no summary was written from them."""
    return f"Notes from {first_ones('part', read)} of {total} ({what} before the summary was written):\n\n{notes}"


def _interrupted_with_notes(doing: str, read: int, windows: list[list[Chunk]], notes: str, resume: str,
                            prep: Prepared, plan, tally: Tally) -> InterruptedWithNotes:
    """Ctrl-C `doing` something, the notes of the first `read` parts kept (stdout and --json)."""
    kept = _headed_notes(read, len(windows), "interrupted", notes)
    return InterruptedWithNotes(f"{interruption()[0]} {doing}: the notes of {first_ones('part', read)} are kept{resume}",
                                kept, _notes_answer(kept, prep, with_windows(plan, len(windows)), tally, windows[:read]))


def _cut_off_in_notes(e: StreamCutOffError, read: int, windows: list[list[Chunk]], notes: str, memo, prep: Prepared,
                      plan, tally: Tally) -> NotesCutOff:
    """A server cut off part `read + 1`'s notes: no summary was written. The text of that
    step is notes, not a summary (it was printed as the answer, "partial answer kept"); the
    notes of the parts before are kept, headed as notes, as Ctrl-C keeps them."""
    said = (f"the server cut off during the notes step (part {read + 1} of {len(windows)}), before the summary: "
            f"{e.reason}; no summary was written")
    resume = f"; the same command again starts at part {read + 1}" if memo is not None and not memo.failed else ""
    planned = with_windows(plan, len(windows))
    if not notes:
        return NotesCutOff(said + resume, "", _notes_answer("", prep, planned, tally, windows[:read]))
    kept = _headed_notes(read, len(windows), "the server cut off", notes)
    return NotesCutOff(f"{said}: the notes of {first_ones('part', read)} are printed instead, headed as notes{resume}", kept,
                       _notes_answer(kept, prep, planned, tally, windows[:read]))


def every_parts_notes(taken: list[str], fits) -> str:
    """The notes of every part, in reading order, a line said before left out; where they
    do not all `fit`, each part's first lines (as many of each as fit), down to the last
    part's notes alone (which the model was asked to write with the earlier ones kept)."""
    seen: set[str] = set()
    parts: list[list[str]] = []
    for text in taken:
        lines = []
        for line in text.splitlines():
            key = " ".join(line.split()).lower()
            if key and key in seen:
                continue
            seen.add(key)
            lines.append(line)
        if any(line.strip() for line in lines):
            parts.append(lines)
    if not parts:
        return ""
    most = max(len(lines) for lines in parts)
    while most >= 1:
        joined = "\n".join("\n".join(lines[:most]).strip() for lines in parts)
        if fits(joined):
            return joined
        most //= 2
    return taken[-1]


def _each_document(prep: Prepared, each: list[list], backend: Backend, params: SamplingParams, reporter: Reporter,
                   tally: Tally) -> Answer:
    """The summary of each document read alone, in input order, under its path: read
    together the bundled model wrote about the first and mixed the others into it. Ctrl-C
    keeps the summaries written and the part of the one being written."""
    docs = prep.corpus.documents
    parts: list[tuple[Document, str]] = []
    budget = f"its share of --max-new-tokens, one of {len(docs)} documents"
    # a figure that gives each more: "raise past 384" was met by 385, still 128 each (probe 102)
    longer = f"--max-new-tokens {2 * len(docs) * params.max_new_tokens:,} gives each {2 * params.max_new_tokens:,}"
    cut: list[str] = []  # the documents whose summaries reached their share: said in one line
    reporter = _Tail(reporter)
    with cited_if_interrupted() as streamed:
        # Ctrl-C anywhere in the loop keeps the summaries written: it came while the next
        # document's heading was written (outside the stream's guard), and the summary of
        # the first was lost, --json's object an error alone (probe 124).
        i, doc, written = 0, docs[0], []
        try:
            for i, (doc, messages) in enumerate(zip(docs, each)):
                written = []  # its text, once shown whole: kept if Ctrl-C comes while it is checked
                parts.append((doc, _summarize_one(i, doc, messages, prep, backend, params, reporter, tally, budget,
                                                  longer, cut, written)))
            streamed.text = _joined(parts)
        except AnswerInterrupted as e:
            parts.append((doc, e.shown.strip()))  # its part shown: kept, and traced to its own lines
            raise AnswerInterrupted(_joined(parts), f"while the summary of {doc.path} streamed "
                                                    f"(document {i + 1} of {len(docs)})") from None
        except KeyboardInterrupt:  # reading the next document's prompt: the summaries written are kept
            if written and not any(d is doc for d, _ in parts):
                parts.append((doc, written[-1]))
            if not parts:
                raise
            at = f"(document {i + 1} of {len(docs)})"
            # (said "while the answer streamed" where nothing streamed: probe 124)
            doing = f"after the summary of {doc.path} {at}" if parts[-1][0] is doc else f"while reading {doc.path} {at}"
            raise AnswerInterrupted(_joined(parts), f"{doing}: the summaries of {first_ones('document', len(parts))} "
                                                    "are kept") from None
    if cut:
        paths = [subject.removeprefix("the summary of ") for subject in cut]
        what = "reached their share" if len(cut) > 1 else "reached its share"
        reporter.warn(f"{len(cut)} of {len(docs)} summaries {what} of --max-new-tokens "
                      f"({params.max_new_tokens:,} tokens each) and may be cut short: {first_named(paths, 5)}; "
                      f"{longer}")
    def summaries(summary: str) -> Answer:
        # each part traced to its own document's lines, an interrupted run's too (it cited a
        # document it never reached), and checked against them
        _warn_of_invented(parts, prep, reporter)  # (so _answer, given no reporter, checks nothing more)
        # (interrupted: the documents read, the one cut short among them; --json's figures
        # said windows 3 and listed the 3 documents as evidence after 9 tokens of the first)
        answer = _answer(summary, prep, prep.plan, tally, len(parts), _cited_by_document(parts, prep))
        read = {doc.path for doc, _ in parts}
        evidence = [e for e in answer.stats["evidence"] if e["path"] in read]
        return replace(answer, parts=tuple((doc.path, text) for doc, text in parts), files=None,  # (each has its own)
                       stats=answer.stats | {"evidence": evidence})

    return streamed.finish(summaries)


def _summarize_one(i: int, doc: Document, messages: list, prep: Prepared, backend: Backend, params: SamplingParams,
                   reporter: _Tail, tally: Tally, budget: str, longer: str, cut: list[str], written: list[str]) -> str:
    """One document's turn in `_each_document`: its heading, then its summary streamed (or
    the file shown whole), checked; the text its section keeps, also put in `written` as
    soon as it is shown."""
    docs = prep.corpus.documents
    # one blank line above each heading, whatever line breaks the part before ended with
    heading = ("\n" * max(0, 2 - reporter.line_breaks()) if i else "") + f"## {doc.path}\n"
    if i == 0 and all(shown_whole(d) for d in docs):
        reporter.status(f"showing the {len(docs)} documents whole: each is too short to summarize, so no model is loaded")
    elif i == 0:  # (later, between parts, a status line landed mid-line beside the text streamed)
        reporter.status(f"summarizing {len(docs)} documents one by one, {doc.path} first "
                        f"({backend.prompt_tokens(messages):,} tokens{_outlined(prep)})")
    reporter.answer_text(heading)
    if shown_whole(doc):
        text = _quote(doc)
        reporter.answer_text(text)
        written.append(text)
        tally.first_shown()  # (two quoted files said "ttft_s": 0.0 after 5 s)
        return text
    text = stream_answer(backend, messages, params, tally, reporter, budget, f"the summary of {doc.path}",
                         longer, source=_text(prep, doc), cut=cut, under_heading=True)
    written.append(text or NO_SUMMARY)
    _warn_if_echo(text, reporter)
    if not text:  # (stream_answer said why on stderr)
        # nothing of it shown, so nothing "cut short": certifi's test file was said to be
        # both "no summary" and among the summaries that "may be cut short" (probe 117)
        cut[:] = [subject for subject in cut if subject != f"the summary of {doc.path}"]
        reporter.answer_text(NO_SUMMARY)
        return NO_SUMMARY
    if citations.says_nothing_of(text, _text(prep, doc)):
        reporter.warn(f"the summary of {doc.path} holds no word of it: the model wrote about nothing in it "
                      "(a larger model, --model, does better)")
    return text


class _Tail:
    """`reporter`, knowing the line breaks the answer shown so far ends with: a summary
    stopped at a repeat ended in the blank line before it, and the next file's "\n\n## path"
    stood under three blank lines (probe 117)."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter, self._tail = reporter, ""

    def line_breaks(self) -> int:
        return self._tail.count("\n")

    def answer_text(self, delta: str) -> None:
        self._reporter.answer_text(delta)
        bare = delta.rstrip()
        self._tail = (self._tail + delta) if not bare else delta[len(bare):]

    def __getattr__(self, name: str):
        return getattr(self._reporter, name)


def _warn_of_invented(parts: list[tuple[Document, str]], prep: Prepared, reporter: Reporter) -> None:
    """Each document's summary checked against its own document (which `_cited_by_document`
    cites it to), named: checked as one text against the whole input, a library page's
    summary of "12 librarians" passed on another file's 12, its sentence cited nowhere and
    nothing said, and a figure no file held was said of "the summary" of eight (probe 103)."""
    for doc, text in parts:
        if text and text != NO_SUMMARY and not shown_whole(doc):
            others = [d.text for d in prep.corpus.documents if d.path != doc.path]
            citations.warn_of_invented(text, [doc.text], "", reporter, f"summary of {doc.path}", elsewhere=others,
                                       read=doc.path)


def _badges_alone(prep: Prepared, reporter: Reporter, tally: Tally) -> Answer:
    """A document of badges alone (libcbor's README): what they say, listed, with no model
    (it wrote made-up prose of one, and copied badge lines, left out, of another)."""
    doc = prep.corpus.documents[0]
    reporter.status(f"{doc.path} holds badges alone: listing what they say, no model is loaded")
    text = _quote(doc)
    reporter.answer_text(text)
    tally.first_shown()
    cites = [Citation(ref=c.span.cite(), span=c.span, label=1) for c in prep.chunks if c.doc_path == doc.path]
    return _answer(text, prep, prep.plan, tally, 1, cites)


def _quote(doc: Document) -> str:
    """A document shown whole (`shown_whole`): its text, or what its badges say."""
    text = doc.text.strip()
    if badges_alone(text):
        return badge_summary(text) or ""
    if "\n" not in text and "`" not in text:
        return f"The whole file: `{text}`"
    return f"The whole file:\n```\n{text}\n```"


def _sources(prep: Prepared) -> str:
    """The text a summary of the whole input is of: what it read of each document."""
    return "\n".join(_text(prep, d) for d in prep.corpus.documents)


def _joined(parts: list[tuple[Document, str]]) -> str:
    return "\n\n".join(f"## {doc.path}\n{text}" for doc, text in parts)


def _cited_by_document(parts: list[tuple[Document, str]], prep: Prepared) -> list:
    """Each document's summary traced to its own lines only: another document's chunk that
    shares its words is not its source."""
    label = {d.path: i + 1 for i, d in enumerate(prep.corpus.documents)}
    cites = []
    for doc, text in parts:
        own = [c for c in prep.chunks if c.doc_path == doc.path]
        if shown_whole(doc) and text == _quote(doc):  # the file itself: its lines, all of them (a heading
            # and two words matched no line, and `# Title / Short note.` shown whole was cited nowhere)
            cites += [Citation(ref=c.span.cite(), span=c.span, label=label[doc.path]) for c in own]
            continue
        cites += citations.attribute(text, own, max_citations=3, label_of=lambda c: label[c.doc_path])
    return cites


def _with_notes_if_empty(summary: str, notes: str, n_windows: int, reporter: Reporter) -> str:
    """The summary, or, when it says nothing from the input, the summary followed by the
    notes it was written from."""
    # A short summary is fine; one of markup or echoed instructions around a word or two is not
    junk = citations.markup_or_echo(summary)
    if citations.says_nothing_new(summary, fewer_than=SUMMARY_MIN_TERMS if junk else 1) or \
            citations.only_restates_instructions(summary):
        # The notes hold what the parts said: a summary of transformers' llama folder was
        # "The final summary is:" after 44 s of reading, its notes thrown away. Notes that
        # say as little are not shown as if they did: a repo's summary printed "Notes from
        # the 6 parts: 1. The main point is to provide a summary of the main points of this
        # part." (probe 97).
        if citations.says_nothing_new(notes, fewer_than=SUMMARY_MIN_TERMS) or \
                citations.only_restates_instructions(notes):
            reporter.warn("the final summary says nothing from the input, nor do the notes taken from its parts "
                          "(a larger model, --model, does better)")
            return summary
        reporter.warn("the final summary says nothing from the input: the notes taken from its parts follow")
        shown = f"\n\nNotes from the {n_windows} parts:\n{notes}"
        reporter.answer_text(shown)
        summary = summary.rstrip() + shown
    return summary


def _warn_if_echo(summary: str, reporter: Reporter) -> None:
    if citations.only_restates_instructions(summary):
        reporter.warn("the summary only restates ktcli's instructions: the model wrote nothing from the input "
                      "(a larger model, --model, does better)")


OUTLINED_NAMED = 10


def _outlined_paths(prep: Prepared) -> list[str]:
    """The documents read as outlines, in input order."""
    return [d.path for d in prep.corpus.documents if d.path in prep.outlines]


def _outlined_files(prep: Prepared) -> str:
    return (f"read as outlines (signatures, docstrings, comments; headings and first paragraphs), not line by "
            f"line: {first_named(_outlined_paths(prep), OUTLINED_NAMED)} (--outline never reads every line)")


def _outlined(prep: Prepared) -> str:
    return f"; {len(prep.outlines)} file(s) as outlines" if prep.outlines else ""


def _text(prep: Prepared, doc: Document) -> str:
    """What the summary reads of a document: its outline when the plan outlines it; a
    document's Markdown headings without their marks (`prompts.plain_headings`; code's
    "# comment" lines are its own)."""
    kept = prep.outlines.get(doc.path)
    text = outline_text(kept) if kept is not None else doc.text
    return text if doc.kind == "code" else prompts.plain_headings(text)


def _read_chunks(prep: Prepared, budget: int) -> list[Chunk]:
    """The chunks a summary maps over: outlines in pieces for the outlined documents,
    the documents' own chunks for the rest."""
    out = [c for c in prep.chunks if c.doc_path not in prep.outlines]
    for doc in prep.corpus.documents:
        kept = prep.outlines.get(doc.path)
        if kept is not None:
            out.extend(outline_chunks(doc, kept, min(OUTLINE_PIECE_TOKENS, budget // 2)))
    return out


def _answer(summary: str, prep: Prepared, plan, tally: Tally, n_windows: int, cites: list | None = None,
            reporter: Reporter | None = None) -> Answer:
    # Numbered by document, in input order, as a question read whole numbers them: a
    # summary asks for no labels, and numbered one by one a single PDF's pages read
    # "[1] p.1, [2] p.2", as if they were two sources.
    doc_label = {d.path: i + 1 for i, d in enumerate(prep.corpus.documents)}
    if reporter is not None and summary:
        citations.warn_of_invented(summary, [d.text for d in prep.corpus.documents], "", reporter, "summary")
    if cites is None:
        cites = citations.attribute(summary, list(prep.chunks), max_citations=5,
                                    label_of=lambda c: doc_label.get(c.doc_path, 0))
    # What it read, for --json and for a summary no sentence of which traces to a line
    # (shown under it, as an answer's is: one printed with no sources left nothing to check).
    figures = tally.figures() | {"windows": n_windows, "outlined_files": len(prep.outlines),
                                 "outlined": _outlined_paths(prep),
                                 "evidence": citations.documents_read(prep.corpus.documents, prep.outlines.keys())}
    return Answer(summary, tuple(cites), plan, figures, prep.corpus.skipped, files=file_map(prep.corpus.documents))


def _notes_answer(notes: str, prep: Prepared, plan, tally: Tally, read: list[list[Chunk]]) -> Answer:
    """The notes of the parts `read` before an interruption, as --json's object has them: the
    summary's keys (plan, figures, skipped, files) with no citations (notes, not a summary),
    its evidence the passages of those parts (an interrupted ask's object had them all, a
    summary's only `answer`, `incomplete`, `error` and `exit_code`)."""
    answer = _answer(notes, prep, plan, tally, len(read), cites=[])
    evidence = [citations.evidence_entry(c.span, None, c.section) for w in read for c in w]
    return replace(answer, stats=answer.stats | {"evidence": evidence})


# The prompt's own header of a part ("part 4 of 4: millers.md lines 446-478"), said back in
# a part's notes: the summary then printed "The summary notes for the part of the part 4 of
# 4: millers.md lines 446-478:" (a probe's). A line of a document naming "Part 2 of 3" with no
# place after it is kept.
_POSITION_ECHO = re.compile(r"\bpart \d+ of \d+: \S.*?(?:\blines \d+-\d+|\b(?:pages|chapters) \S+-\S+|\.\w{1,5}\b)",
                            re.IGNORECASE)


def _without_position_echo(notes: str) -> str:
    """`notes` less the lines that say the prompt's part header back."""
    if not _POSITION_ECHO.search(notes):
        return notes
    return "\n".join(line for line in notes.split("\n") if not _POSITION_ECHO.search(line))


def _where(window: list[Chunk]) -> str:
    paths: list[str] = []
    for c in window:
        if c.doc_path not in paths:
            paths.append(c.doc_path)
    if len(paths) == 1:
        first, last = window[0].span, window[-1].span
        if first.page is not None:  # a PDF's pages by their printed numbers, as its citations name them
            return (f"{paths[0]} {'chapters' if first.unit == CHAPTER else 'pages'} "
                    f"{first.page_label or first.page}-{last.page_label or last.page}")
        return f"{paths[0]} lines {first.line_start}-{last.line_end}"
    return ", ".join(paths[:6]) + (f" and {len(paths) - 6} more files" if len(paths) > 6 else "")


def _hollow_parts(hollow: list[int], windows: list[list[Chunk]]) -> str:
    """Said where some parts' notes were dropped (markup, the instructions again): the
    summary of the Python tutorial read in 2 parts was of its second half alone, the first
    part's notes "The summary notes are shortened to 1 short line each.", nothing said."""
    named = first_named([f"part {i + 1} ({_where(windows[i])})" for i in hollow], 3)
    return (f"the notes of {len(hollow)} of {len(windows)} parts said nothing from the input, so the summary is "
            f"written without them: {named} (a larger model, --model, does better)")


