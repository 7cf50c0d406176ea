"""`ktcli ask`: answer a question from the whole input or from retrieved evidence."""

from __future__ import annotations

import time
from dataclasses import replace

from ktcli.config import Settings
from ktcli.errors import Interrupted, ModelNotInstalledError, NotesCutOff, UsageError, interruption
from ktcli.engine.backend import Backend, SamplingParams
from ktcli.engine.openai_http import StreamCutOffError
from ktcli.pipeline import citations, grounding, key_lines, option_entry, prompts
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.indexing import build_index, embedder_for
from ktcli.pipeline.prepare import Prepared, piped_beside_files, reads_piped_whole, search_query
from ktcli.pipeline.notes_memo import NotesMemo
from ktcli.pipeline.runner import Tally, cited_if_interrupted, first_ones, stream_answer, take_notes
from ktcli.pipeline.windows import (across_page_breaks, as_read, merge_neighbours, pack, refit, refuse_named_full,
                                    source_order)
from ktcli.plan.planner import MEMORY_TOKENS, evidence_cap, evidence_room, with_windows
from ktcli.ingest.loaders import STDIN_PATH
from ktcli.pipeline.summary_lines import made_up_blocks
from ktcli.retrieval.symbols import asked_definitions
from ktcli.types import Answer, Chunk, Mode


def answer_question(prep: Prepared, backend: Backend, settings: Settings, reporter: Reporter,
                    tally: Tally) -> Answer:
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                            stop=prompts.answer_stops(prep.question))
    plan = prep.plan
    if plan.mode in (Mode.FULL, Mode.SPARSE):  # sparse: the engine's window is the whole input
        whole = prompts.whole_input(prep.corpus.documents)
        messages = prompts.ask_messages(prep.question, whole)
        needed = backend.prompt_tokens(messages) + params.max_new_tokens
        if needed <= backend.context_window:
            sources = [(i + 1, d.text) for i, d in enumerate(prep.corpus.documents) if key_lines.quotes(d.kind)]
            messages, needed = _with_key_lines(messages, prompts.ask_messages(prep.question, whole, key_lines=_key_lines(
                prep.question, sources, settings, reporter)), needed, backend, params)
            reporter.status(f"reading the whole input ({needed - params.max_new_tokens:,} tokens)")
            # The next question about the same input starts with the same tokens up to its own.
            labels = citations.Relabel([d.text for d in prep.corpus.documents])  # as whole_input labels them
            with cited_if_interrupted() as streamed:
                streamed.text = stream_answer(backend, messages, replace(params, keep_prompt=True), tally, reporter,
                                              labels=labels)
                _warn_if_echo(streamed.text, reporter)
            _count_moved(labels, tally)

            def whole_read_answer(text: str) -> Answer:
                texts = [d.text for d in prep.corpus.documents]
                citations.warn_of_invented(text, texts, prep.question, reporter)
                _warn_of_made_up_code(text, texts, reporter)
                entry = _entry_unsaid(text, prep.question, texts)
                doc_label = {d.path: i + 1 for i, d in enumerate(prep.corpus.documents)}  # prompts.whole_input's
                cites = citations.attribute(text, list(prep.chunks), label_of=lambda c: doc_label.get(c.doc_path, 0),
                                            asked=asked_definitions(prep.question))
                cites += citations.document_citations(text, prep.corpus.documents, cites)
                return _grounded(Answer(text, tuple(cites), plan, tally.figures() | _whole_read_figures(prep) | entry,
                                        prep.corpus.skipped), prep.question, texts, settings)

            return streamed.finish(whole_read_answer)
        refuse_named_full(settings.mode, needed - params.max_new_tokens, backend.context_window, params.max_new_tokens)
        # The estimate said it fits, the exact count says no: retrieval is the safe path.
        switched = f"exact count {needed:,} tokens exceeds the {backend.context_window:,} window; using retrieval"
        reporter.warn(switched)  # and the plan's reason, for --json: the estimate's no longer holds
        # Windows of evidence as a retrieval plan has them, not the whole input's size.
        room = evidence_room(backend.context_window, plan.question_tokens, params.max_new_tokens, evidence_cap("ask"),
                             "ask")
        plan = replace(plan, mode=Mode.RETRIEVAL, top_k=settings.top_k, n_chunks=len(prep.chunks),
                       evidence_budget=room, reasons=(switched,))
    return _answer_from_retrieval(replace(prep, plan=plan), backend, settings, reporter, tally, params)


def _answer_from_retrieval(prep: Prepared, backend: Backend, settings: Settings, reporter: Reporter,
                           tally: Tally, params: SamplingParams) -> Answer:
    started = time.perf_counter()
    piped = piped_beside_files(prep.corpus, prep.chunks)
    query = search_query(prep.question, piped)
    index = build_index(prep, settings, reporter, query)
    index_s = time.perf_counter() - started
    hits = index.search(query, prep.plan.top_k)
    if piped:
        hits = _with_piped_input(hits, piped, prep.document_tokens.get(STDIN_PATH, 0), prep.plan.evidence_budget,
                                 reporter)
    if index.last_blind:
        reporter.warn("no passage holds a word of the question, and the embedder reads the question or the documents "
                      "as letters, not words: the passages read are a guess (ask in the documents' language)")
    doc_rank = {d.path: i for i, d in enumerate(prep.corpus.documents)}
    ordered = across_page_breaks(source_order([h.chunk for h in hits], doc_rank), prep.chunks, backend.count_tokens)
    budget = prep.plan.evidence_budget
    passages = merge_neighbours(ordered, budget, backend.count_tokens)
    written = max(params.max_new_tokens, MEMORY_TOKENS)

    def fits(window: list[Chunk]) -> bool:
        evidence = as_read(window)
        # "." for the notes passed in: their header counted, their text (up to MEMORY_TOKENS) added
        prompt = max(backend.prompt_tokens(prompts.notes_messages(prep.question, evidence, ".")),
                     backend.prompt_tokens(prompts.ask_messages(prep.question, evidence, ".")))
        return prompt + MEMORY_TOKENS + written <= backend.context_window

    windows = refit(pack(passages, budget, backend.count_tokens), fits)
    labelled: list[Chunk] = [p for w in windows for p in w]

    notes = ""
    label = 1
    note_params = replace(params, max_new_tokens=MEMORY_TOKENS)
    memo = NotesMemo.for_run(settings.cache_path, settings.prompt_cache, backend, note_params, prep.notes_request)
    if memo is not None:
        memo.windows = len(windows)
    for i, window in enumerate(windows[:-1]):
        evidence, label = _labelled(window, label)
        try:
            new = take_notes(backend, prompts.notes_messages(prep.question, evidence, notes), note_params, tally,
                             reporter, memo, f"reading evidence window {i + 1}/{len(windows)}, passing notes on")
        except KeyboardInterrupt:
            # Said where it was, not a bare "interrupted" after minutes of reading windows;
            # a notes step's text is no answer, so nothing is shown (probe 124)
            kept = (f": the notes of {first_ones('window', i)} are kept; the same question again starts at window {i + 1}"
                    if i and memo is not None and not memo.failed else "")
            raise Interrupted(f"{interruption()[0]} while reading evidence window {i + 1} of {len(windows)}, "
                              f"before the answer{kept}") from None
        except StreamCutOffError as e:
            # The text of a notes step is no answer: it was printed as one, "partial answer
            # kept" (--json: its "answer"), where the server cut off before the answer began.
            raise NotesCutOff(
                f"the server cut off during the notes step (evidence window {i + 1} of {len(windows)}), before the "
                f"answer: {e.reason}; no answer was written",
                "", Answer("", (), with_windows(prep.plan, len(windows)),
                           tally.figures() | {"retrieved": len(hits), "windows": i}, prep.corpus.skipped),
            ) from None
        notes = new if citations.has_content(new) else notes  # an echo of the instructions carries nothing
    if memo is not None:
        memo.finish()
    evidence, _ = _labelled(windows[-1], label) if windows else ("", label)
    messages = prompts.ask_messages(prep.question, evidence, notes)
    kinds = {d.path: d.kind for d in prep.corpus.documents}
    sources = [(i + 1, prompts.with_table_header(c)) for i, c in enumerate(labelled)
               if key_lines.quotes(kinds.get(c.doc_path, ""))]
    messages, _ = _with_key_lines(messages, prompts.ask_messages(prep.question, evidence, notes, key_lines=_key_lines(
        prep.question, sources, settings, reporter, passages=True)), 0, backend, params)
    reporter.status("answering" + (f" from window {len(windows)}/{len(windows)} and notes" if len(windows) > 1 else ""))
    labels = citations.Relabel([c.text for c in labelled])
    with cited_if_interrupted() as streamed:
        streamed.text = stream_answer(backend, messages, params, tally, reporter, labels=labels)
        _warn_if_echo(streamed.text, reporter)
    _count_moved(labels, tally)

    def retrieval_answer(text: str) -> Answer:
        texts = [d.text for d in prep.corpus.documents]
        citations.warn_of_invented(text, [c.text for c in labelled] + ([notes] if notes else []), prep.question,
                                   reporter, elsewhere=texts)
        _warn_of_made_up_code(text, texts, reporter)
        entry = _entry_unsaid(text, prep.question, texts)
        label_of = {id(c): i + 1 for i, c in enumerate(labelled)}  # as _labelled numbers them, window after window
        documents = prep.corpus.documents
        attributed = citations.on_their_pages(
            citations.attribute(text, labelled, label_of=lambda c: label_of[id(c)],
                                asked=asked_definitions(prep.question)), documents)
        backed = citations.label_citations(citations.backed_labels(text, labelled), labelled)[:3]
        cited = citations.merge(citations.narrowed(citations.on_their_pages(backed, documents), attributed), attributed)
        # Every label the answer writes has its entry, last where its passage does not back
        # its sentence: "... arrives on Friday at gate Omega. [1] ... shelf 9. [2]" listed
        # no [2], so the answer's [2] pointed at nothing.
        listed = {c.label for c in cited}
        cited += tuple(citations.on_their_pages(citations.label_citations(
            [k for k in citations.cited_labels(text, len(labelled)) if k not in listed], labelled), documents))
        figures = tally.figures() | {
            "retrieved": len(hits), "windows": len(windows), "index_s": round(index_s, 3),
            "index_bytes": index.stats.get("index_bytes", 0),
            "embedded_now": index.stats.get("n_embedded_now", 0),
            "embedded_tokens": index.stats.get("embedded_tokens", 0), "embed_s": index.stats.get("embed_s", 0.0),
            "reused": index.stats.get("n_reused", 0),
            "not_embedded": index.stats.get("n_not_embedded", 0),
        } | entry
        # in retrieval order, each with the label the model read it under (a --json reader
        # could not tell which passage an answer's "[3]" was)
        figures["evidence"] = [citations.evidence_entry(h.chunk.span, round(h.score, 4), h.chunk.section)
                               | {"label": citations.passage_label(h.chunk.span, labelled)} for h in hits]
        return _grounded(Answer(text, cited, with_windows(prep.plan, len(windows)), figures, prep.corpus.skipped),
                         prep.question, [c.text for c in labelled], settings, passages=True, whole=texts)

    return streamed.finish(retrieval_answer)


def _grounded(answer: Answer, question: str, read: list[str], settings: Settings, passages: bool = False,
              whole: list[str] = ()) -> Answer:
    """The answer with whether the documents seem not to hold it (`grounding.judge`): the
    bundled model never says so, and answered "Who won the 1998 World Cup?" from an annual
    report all the same. An answer with no text is judged too (its question alone can be
    one nothing read matches): the notice that it is no answer says so."""
    try:
        judged = grounding.judge(question, read, answer.text, embedder_for(settings), passages=passages, whole=whole)
    except (ModelNotInstalledError, UsageError):
        # No embedder: not judged, and not said again (a whole read's key lines said it,
        # "key lines ranked by their words alone: ..."; a retrieval read needs one to start)
        return answer
    if judged is None:
        return answer
    return replace(answer, not_in_documents=judged.not_in_documents, grounding=judged.as_dict())


def _count_moved(labels: citations.Relabel, tally: Tally) -> None:
    if labels.moved:  # (--json's figures: how many of the answer's labels were not the model's)
        tally.extra["labels_moved"] = labels.moved


def _key_lines(question: str, sources: list[tuple[int, str]], settings: Settings, reporter: Reporter,
               passages: bool = False) -> str:
    """The lines of `sources` ((label, text); `passages`: retrieved ones) quoted again before
    the question, as the prompt shows them ("" for none)."""
    if settings.key_lines <= 0 or not sources:
        return ""
    reporter.status("finding the lines that best match the question")
    try:
        picked = key_lines.pick(question, sources, embedder_for(settings), settings.key_lines, passages=passages)
    except (ModelNotInstalledError, UsageError) as e:  # a whole read needs no embedder: rank by words alone
        reporter.warn(f"key lines ranked by their words alone: {e}")
        picked = key_lines.pick(question, sources, None, settings.key_lines, passages=passages)
    return key_lines.block(picked)


def _with_key_lines(plain: list, keyed: list, needed: int, backend: Backend, params: SamplingParams) -> tuple[list, int]:
    """The prompt with the key lines where it still fits the window, else without; and its
    tokens plus the answer's (`needed`: the plain prompt's, 0 if not counted)."""
    if keyed != plain:
        with_lines = backend.prompt_tokens(keyed) + params.max_new_tokens
        if with_lines <= backend.context_window:
            return keyed, with_lines
    return plain, needed


def _with_piped_input(hits: list, piped: list[Chunk], tokens: int, budget: int, reporter: Reporter) -> list:
    """Standard input read whole beside the passages retrieved from the files (`Hit`s),
    where it takes at most half the evidence budget (else its chunks compete as any others).
    `tokens`: its model tokens as the plan counted them, so that the run does what it said."""
    from ktcli.retrieval.retriever import Hit

    if not reads_piped_whole(tokens, budget):
        reporter.status(f"{STDIN_PATH} ({tokens:,} tokens) is over half the {budget:,}-token evidence budget: "
                        "not read whole, its chunks ranked with the files'")
        return hits
    reporter.status(f"reading all of {STDIN_PATH} ({tokens:,} tokens) beside the passages retrieved from the files")
    pinned = [Hit(chunk=c, score=0.0, dense_rank=None, lexical_rank=None) for c in piped]
    return pinned + [h for h in hits if h.chunk.doc_path != STDIN_PATH]


def _warn_of_made_up_code(text: str, sources: list[str], reporter: Reporter) -> None:
    """Said where a code block of the answer is not the input's (mostly other lines, or a
    definition the input has not): asked what calls `_parse_letter_version`, the bundled
    model wrote a body of its own for it, cited to the real definition's lines (probe 101)."""
    made_up = made_up_blocks(text, sources)
    if made_up:
        reporter.warn(f"{made_up} code block{'s' if made_up > 1 else ''} of the answer "
                      f"{'are' if made_up > 1 else 'is'} not in the input (written by the model): check "
                      f"{'them' if made_up > 1 else 'it'} in the sources")


def _entry_unsaid(text: str, question: str, texts: list[str]) -> dict:
    """Where an answer about an option says little of the option's own entry, the entry,
    for stdout to quote after the answer (`option_entry`), as the figures' `option_entry`
    ({} where it says enough, or nothing is asked of one option): "-f ...
    remove directories recursively" (-r's entry) stands in rm's man page, so no check
    against what was read caught it. Said on stdout, not as a warning on stderr: the model
    ignored the right entry in ~8 of 32 option questions (`benchmarks.option_answers`), and
    the entry is the answer a reader of `ktcli ask ... | less` needs."""
    found = option_entry.check(question, text, texts)
    return {"option_entry": {"option": found.option, "entry": found.entry}} if found is not None and found.unsaid else {}


def _warn_if_echo(text: str, reporter: Reporter) -> None:
    """Said, so that an answer shown with no Sources under it is not taken for one the
    input could not back: the model wrote back ktcli's own instructions, '[1]' and all."""
    if citations.only_echoes_instructions(text):
        reporter.warn("the answer only restates ktcli's instructions, so it cites nothing: try rewording the "
                      "question, or a larger --model")
    elif echoed := citations.system_prompt_echoes(text):
        first = echoed[0] if len(echoed[0]) <= 120 else echoed[0][:117].rstrip() + "..."
        reporter.warn(f"{len(echoed)} sentence{'s' if len(echoed) > 1 else ''} of the answer "
                      f"{'are' if len(echoed) > 1 else 'is'} ktcli's own instructions written back, not the sources "
                      f"(\"{first}\")")


def _whole_read_figures(prep: Prepared) -> dict:
    """The keys a retrieval answer's --json figures have, for a read of the whole input:
    one window, every document its evidence (scripts read `figures.evidence` whatever the
    mode; it was missing), each document with its `label`: the number the model read it
    under (`prompts.whole_input`: 1..n in input order), which an answer's [N] names."""
    read = citations.documents_read(prep.corpus.documents)
    return {"retrieved": 0, "windows": 1, "evidence": [entry | {"label": i + 1} for i, entry in enumerate(read)]}


def _labelled(window: list[Chunk], first_label: int) -> tuple[str, int]:
    return prompts.passages(window, first_label), first_label + len(window)
