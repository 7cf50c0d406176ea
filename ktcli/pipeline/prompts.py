"""Every prompt ktcli sends, in one place. Written for small models: short instructions,
the question after the evidence (right before the answer), and labels the answer can cite."""

from __future__ import annotations

import os
import re

from ktcli.engine.backend import Message
from ktcli.ingest.sections import FENCE
from ktcli.types import CHAPTER, SECTION_SEPARATOR, TABLE_TRAIL

SYSTEM = (
    "You are ktcli, a careful assistant that answers from the given sources only. "
    "Quote names, numbers and code identifiers exactly as the sources write them. "
    "If the sources do not contain the answer, say so plainly."
)


def evidence_block(items: list[tuple[int, str, str]]) -> str:
    """items: (label, reference, text) -> '<source id="1" ref="path:3-9">text</source>' blocks.

    Tags, not a '[1] path:3-9' line above each text: given several sources headed that
    way, the bundled 135M model mostly continued the list ('[9] path p.10' and a copied
    page) instead of answering (`benchmarks/qa_accuracy`)."""
    return "\n\n".join(f'<source id="{label}" ref="{_quoted(ref)}">\n{_inert(text.rstrip())}\n</source>'
                       for label, ref, text in items)


# A document that itself holds source tags (an XML file, ktcli's own prompts.py) would
# otherwise close its block early, and the text after it would read as ours, outside any
# source. Written as the entity `&lt;` they read the same to a model and end nothing; the
# citations come from the documents' own lines, never from this text.
_TAG_IN_TEXT = re.compile(r"<(?=/?source)", re.IGNORECASE)


def _inert(text: str) -> str:
    return _TAG_IN_TEXT.sub("&lt;", text)


def _quoted(ref: str) -> str:
    """A reference (a path) as an attribute value: a quote in a file name ends it early."""
    return ref.replace("&", "&amp;").replace('"', "&quot;") if '"' in ref else ref


def passages(chunks, first_label: int = 1) -> str:
    """Retrieved passages (chunks) as one evidence block labelled from `first_label`, each
    under its place (`path:12-40`). A CSV's or TSV's rows from past its first line come
    under the table's header row: the model read `300,Tilia specimen 300,Tilia,37,38.9`
    without the column names the user's citation showed."""
    return evidence_block([(first_label + i, _ref(c.span), with_table_header(c)) for i, c in enumerate(chunks)])


def _ref(span) -> str:
    """A passage's place as the model reads it: a PDF page by its printed number where it
    has one, as the user's citations name it (the model told "p.5" wrote "page 5" of a
    paper whose fifth page prints 221)."""
    return f"{span.path} p.{span.page_label}" if span.page_label and span.page is not None else span.cite()


def with_table_header(chunk) -> str:
    """A table's chunk under its header row. The trail says it is a table, not the name: a
    CSV piped in or a TSV named .txt has the same "columns:" trail (`sections.document_trails`)
    and its chunks from the middle reached the model as bare rows."""
    # a CSV's trail, or a Word or HTML table's under its section (found from the left: the
    # header row itself may hold " > ")
    at = 0 if chunk.section.startswith(TABLE_TRAIL) else chunk.section.find(SECTION_SEPARATOR + TABLE_TRAIL)
    if at < 0:
        return chunk.text
    table = chunk.section[at:].removeprefix(SECTION_SEPARATOR)
    if chunk.span.line_start in (None, 1) and table == chunk.section:  # a CSV's first chunk holds its header
        return chunk.text
    return f"{table.removeprefix(TABLE_TRAIL)}\n{chunk.text}"


def whole_input(documents, texts: list[str] | None = None) -> str:
    """Every document of the input as one evidence block, labelled 1..n in input order: the
    sources of a question read whole (`pipeline.qa`), and what its prompt-cache entry holds;
    a summary's whole read gives its own `texts` (outlines)."""
    refs = _without_common_folders([d.path for d in documents])
    texts = [d.text for d in documents] if texts is None else texts
    return evidence_block([(i + 1, ref, text) for i, (ref, text) in enumerate(zip(refs, texts))])


def shared_folder(paths: list[str]) -> str:
    """The folders every path starts with ("" for none), which the source refs leave out."""
    folders = [p.split("/")[:-1] for p in paths]
    return "/".join(os.path.commonprefix(folders)) if folders else ""


def _without_common_folders(paths: list[str]) -> list[str]:
    """Paths less the folders they all start with. The first source tag is the prompt's
    first words after the system prompt, so its path decides what the prompt cache can
    reuse: the same file asked about as `report.pdf`, `./docs/report.pdf` from its parent
    or by its absolute path prefilled again (seconds to minutes). The user's citations
    still name the path as given (they come from the labels, not from these refs)."""
    folders = [p.split("/")[:-1] for p in paths]
    n = len(os.path.commonprefix(folders)) if folders else 0
    return ["/".join(p.split("/")[n:]) for p in paths]


# A small model drifts into writing source blocks of its own after the answer; these
# openings end the answer instead. A tag only ends it after a line break or a space: the
# bundled model sometimes *opens* its answer with a source tag and then answers inside
# it, and a bare "<source" stop left those answers empty (LeadingSourceTag drops the tag).
# The prompt's own headings end it too when the model writes them in bold, as Markdown: over
# the tutorial it answered "The pass statement does nothing." and went on "**Key facts:**"
# and empty bullets until the loop check cut them, all shown (probe 108).
ANSWER_STOPS = ("\n\n[", "\n<source", " <source", "\n</source", "\nQuestion:", "\nSources:", "\nKey facts:",
                "\n**Question:", "\n**Sources:", "\n**Key facts", "<|im_end|>")


def answer_stops(question: str) -> tuple[str, ...]:
    """ANSWER_STOPS and the question itself on a line of its own: after answering, the
    bundled model wrote the question again, bare, and went on as if asked it anew ("The
    hidden code is ZEBRA-42. [4]\n\nWhat is the hidden code?\nThe hidden code is ZEBRA-42.
    [4]"; "...\nWhat is the rocket named?\nCiting sources like"), all of it shown as the
    answer. An answer that opens with the question is not cut (no line break before it);
    a short question ("Why?") could be an answer's own line, and is no stop."""
    own = question.strip()
    if len(own) < _QUESTION_STOP_MIN or "\n" in own:
        return ANSWER_STOPS
    return (*ANSWER_STOPS, "\n" + own)


_QUESTION_STOP_MIN = 12
# A summary (and its running notes) ends at the same source tags: a summary of a mixed
# folder went on into eleven made-up `<source id="12" ref="...">` blocks, each with
# another id, so no repeat check stopped it before --max-new-tokens. Paragraphs opening
# with "[1]" are a summary's own, and it asks no question.
SUMMARY_STOPS = ("\n<source", " <source", "\n</source", "\nSources:", "<|im_end|>")
_TAG = "<source"


class LeadingSourceTag:
    """Streamed answer text with a source tag it opens with (`<source id="7" ref="...">`)
    taken out: held while the start could still be one, dropped once its `>` arrives.
    Only whitespace or an unfinished tag is ever held when the stream ends: nothing to
    flush."""

    def __init__(self) -> None:
        self.head = ""  # text held at the start
        self.done = False  # past the start: everything passes
        self.dropped = False  # a tag was dropped: the blank lines after it go too

    def feed(self, piece: str) -> str:
        if self.done:
            return piece
        self.head += piece
        start = self.head.lstrip()
        if not start or (len(start) < len(_TAG) and _TAG.startswith(start)):
            return ""  # could still become a tag
        if start.startswith(_TAG):
            close = start.find(">")
            if close < 0:
                return ""
            self.head, self.dropped = "", True
            return self.feed(start[close + 1 :])  # the answer, or another tag
        self.done = True
        return start if self.dropped else self.head


# A source tag the model writes inside its answer, in backticks or not, and a closing one.
_INLINE_TAG = re.compile(r'`?<source id="(\d{1,4})"[^>\n]{0,400}>`?|`?</source>`?')
_TAG_FORMS = ("<source", "</source")


class InlineSourceTags:
    """Streamed answer text with the source tags it writes inside its sentences as the
    labels they stand for: "defined in `<source id="4" ref="click/exceptions.py:107-183">`"
    reads "defined in [4]", and a closing tag goes (probe 101: four such tags printed in
    one answer). The stops end an answer at a tag after a space or a line break only (the
    model may open its answer with one: `LeadingSourceTag`), so one after a backtick, a
    bracket or a word came through. Text that may still become a tag is held; `flush`
    gives back what is held when the stream ends."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, piece: str) -> str:
        text, out, at = self.held + piece, [], 0
        for m in _INLINE_TAG.finditer(text):
            if m.end() == len(text) and m.group(0).startswith("`") and not m.group(0).endswith("`"):
                self.held = text[m.start():]  # its closing backtick may be in the next piece
                return "".join(out) + text[at:m.start()]
            out += [text[at:m.start()], f"[{m.group(1)}]" if m.group(1) else ""]
            at = m.end()
        rest = text[at:]
        cut = _open_tag_start(rest)
        self.held = rest[cut:]
        return "".join(out) + rest[:cut]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return _INLINE_TAG.sub(lambda m: f"[{m.group(1)}]" if m.group(1) else "", held)


def _open_tag_start(text: str) -> int:
    """Where a tag `text` ends in the middle of starts (a backtick before it included), or
    len(text); a last backtick alone is held too, as a tag may follow it."""
    at = text.rfind("<")
    if at >= 0:
        tail = text[at:]
        if ">" not in tail and "\n" not in tail and len(tail) <= 420 \
                and any(form.startswith(tail[:len(form)]) for form in _TAG_FORMS):
            return at - 1 if at and text[at - 1] == "`" else at
    return len(text) - 1 if text.endswith("`") else len(text)


class LeadingEcho:
    """Streamed answer text less the prompt's format echoed at its start: a small model
    opens one answer in four with "Question: <the question>" and "Answer:" (seen on code
    questions), which read as ktcli's own output. Held while the start could still be one
    ("A" may be "Answer:"): `flush` gives back what is held when the stream ends, so a
    one-letter answer is kept; a question's echo with no answer after it comes out empty."""

    _MARKS = ("question:", "answer:")

    def __init__(self) -> None:
        self.head = ""
        self.done = False
        self.marked = False  # "Answer:" dropped: the spaces after it go too, whatever piece holds them

    def feed(self, piece: str) -> str:
        if self.done:
            if self.marked:
                piece = piece.lstrip(" ")
                self.marked = not piece
            return piece
        self.head += piece
        start = self.head.lstrip()
        folded = start.lower()
        if any(mark.startswith(folded) for mark in self._MARKS):
            return ""  # "Quest", "Answer": could still be a mark
        if folded.startswith("question:"):
            end = start.find("\n")
            line = start if end < 0 else start[:end]
            answer = _ANSWER_MARK.search(line)
            if answer is not None:  # "Question: A or B? Answer: B [1]." on one line
                self.head, self.done, self.marked = "", True, True
                return self.feed(start[answer.end() :])
            if end < 0:
                return ""
            self.head = ""
            return self.feed(start[end + 1 :])  # the answer, maybe after "Answer:"
        self.done = True
        if folded.startswith("answer:"):
            self.marked = True
            return self.feed(start[len("answer:") :])
        return _without_blank_lines(self.head)

    def flush(self) -> str:
        """What is still held when the stream ends: a start that could have been a mark
        ("A", the whole answer), not an echoed question."""
        folded = self.head.strip().lower()
        # "Answer:" and nothing after it is the mark alone, not an answer: a question about
        # a PDF manual printed "Answer:" as the whole answer (the question's echo before it).
        if self.done or folded.startswith("question:") or folded in self._MARKS:
            return ""
        return _without_blank_lines(self.head)


def _without_blank_lines(text: str) -> str:
    """`text` less the blank lines it opens with (a line's own indent kept): an answer the
    model opened with a line break began the user's stdout with an empty line."""
    blank = len(text) - len(text.lstrip())
    return text[text.rfind("\n", 0, blank) + 1 :]


_ANSWER_MARK = re.compile(r"\banswer:", re.IGNORECASE)


# "Most relevant lines:" over the same lines: 34/58 against 40/58 (the bundled model opened
# a few answers with "<script>document.write(" under it; benchmarks/qa_accuracy)
KEY_LINES_HEADER = "Key facts:"
ASK_INSTRUCTION = "Answer the question in a few sentences, citing sources like [1]."
NOTES_INSTRUCTION = ("Update the notes: copy every fact from these sources that helps answer the question, "
                     "one short line each, ending with its source label like [3]. Keep the useful notes so far. "
                     "If nothing here helps, repeat the notes so far unchanged.")
SUMMARY_INSTRUCTION = ("Summarize the content above: its purpose, its main parts and the key facts, in a few short "
                       "paragraphs.")
SUMMARY_NOTES_INSTRUCTION = ("Update the summary notes with the main points of this part, one short line each, "
                             "naming the file or page they come from. Keep the earlier notes, shortened if needed.")
SUMMARY_REDUCE_INSTRUCTION = ("Write the final summary from these notes: what it is, how it is organised, and the key "
                              "facts, in a few short paragraphs.")


def instructions() -> str:
    """Every word ktcli itself writes into a prompt: an answer that restates them (the
    bundled model often does) cites nothing (`citations.attribute`, `citations.cited_labels`)."""
    # Not OUTLINE_NOTE: its words (function, docstrings, comments) are what a code summary says.
    return " ".join((SYSTEM, ASK_INSTRUCTION, NOTES_INSTRUCTION, SUMMARY_INSTRUCTION, SUMMARY_NOTES_INSTRUCTION,
                     SUMMARY_REDUCE_INSTRUCTION, "Notes gathered from earlier sources. Key facts. Notes so far. "
                     "Summary notes so far. Notes taken while reading the whole input. Next part. Files. Content."))


def chat(user: str) -> list[Message]:
    """Our system prompt plus one user turn: the shape of every request ktcli makes."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def ask_messages(question: str, evidence: str, notes: str = "", key_lines: str = "") -> list[Message]:
    # The question comes after the sources only, so that every question about the same
    # input starts with the same tokens and the engine reads their K/V back instead of
    # prefilling them again (engine.prefix_store). Asking it before the sources too made
    # no difference to the bundled model's answers: 26/48 either way (benchmarks/qa_accuracy).
    # The key lines too come after them (`pipeline.key_lines`).
    parts = [f"Sources:\n{evidence}"] if evidence else []
    if notes:
        parts.append(f"Notes gathered from earlier sources:\n{notes}")
    if key_lines:
        parts.append(f"{KEY_LINES_HEADER}\n{_inert(key_lines)}")
    parts.append(f"Question: {question}\n{ASK_INSTRUCTION}")
    return chat("\n\n".join(parts))


def notes_messages(question: str, evidence: str, notes: str) -> list[Message]:
    """One window of memory passing: keep what helps, drop the rest."""
    prior = f"Notes so far:\n{notes}\n\n" if notes else ""
    return chat(
        f"{prior}Sources:\n{evidence}\n\nQuestion: {question}\n{NOTES_INSTRUCTION}"
    )


# Said when code files are read as outlines (`ingest.outline`), so that a missing body
# reads as left out, not as an empty function.
OUTLINE_NOTE = ("Some files are shown as outlines: code as its signatures, docstrings and comments, without "
                "function bodies; long documents as their headings and the first paragraph under each.\n\n")


LISTING_MAX_LINES = 200


def file_listing(documents, max_lines: int = LISTING_MAX_LINES) -> str:
    """'path (N lines)' per document, shown to a summary of several ("" for one); a long
    listing says how many were left out of it."""
    if len(documents) < 2:
        return ""
    # Named as the source tags name them, less the folders all share (said once, above):
    # 55 files under one deep folder spent a third of a summary's prompt on its name.
    paths = [d.path for d in documents]
    rows = [f"{ref} ({_size(d)})" for ref, d in zip(_without_common_folders(paths), documents)]
    if len(rows) > max_lines:
        rest = len(rows) - max_lines
        rows = rows[:max_lines] + [f"... and {rest} more files (all of them are read; only the listing is short)"]
    root = shared_folder(paths)
    return "\n".join(([f"(all in {root}/)"] if root else []) + rows)


def _size(doc) -> str:
    """A document's length as its reader counts it: a PDF's pages, an EPUB's chapters, a
    file's lines ("paper.pdf (536 lines)" named no page a summary could cite)."""
    numbered = [p for p in doc.pages if p.number is not None]
    if doc.kind == "pdf" and numbered:
        return f"{len(numbered)} page{'s' if len(numbered) != 1 else ''}"
    if doc.unit == CHAPTER and numbered:
        return f"{len(numbered)} chapter{'s' if len(numbered) != 1 else ''}"
    return f"{doc.n_lines} lines"


def summary_messages(text: str, listing: str = "", outlined: bool = False) -> list[Message]:
    what = f"Files:\n{listing}\n\n" if listing else ""
    return chat(
        f"{what}{OUTLINE_NOTE if outlined else ''}Content:\n{text}\n\n{SUMMARY_INSTRUCTION}"
    )


_ATX_HEADING = re.compile(r"#{1,6}[ \t]+(?=\S)")


def plain_headings(text: str) -> str:
    """`text` with its Markdown headings' marks taken off ("## NAME" reads "NAME"), fenced
    code left as it is (a "# comment" is code). Over a man page read whole (ktcli's roff
    reader writes "# LS(1)", "## NAME"), the bundled model wrote headings of its own in
    place of a summary ("## Contents\n\n## 1. What is ls?\n\n## 2. What is ls? ..."):
    prose for 2 of 7 pages with the marks, 5 without; 3 of 4 Markdown READMEs either way
    (probe 125)."""
    if "#" not in text:
        return text
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (mark := _ATX_HEADING.match(line)):
            line = line[mark.end():]
        out.append(line)
    return "\n".join(out)


def summary_notes_messages(text: str, notes: str, position: str, outlined: bool = False) -> list[Message]:
    prior = f"Summary notes so far:\n{notes}\n\n" if notes else ""
    return chat(
        f"{prior}{OUTLINE_NOTE if outlined else ''}Next part ({position}):\n{text}\n\n{SUMMARY_NOTES_INSTRUCTION}"
    )


def summary_reduce_messages(notes: str, listing: str = "") -> list[Message]:
    what = f"Files:\n{listing}\n\n" if listing else ""
    return chat(
        f"{what}Notes taken while reading the whole input:\n{notes}\n\n{SUMMARY_REDUCE_INSTRUCTION}"
    )
