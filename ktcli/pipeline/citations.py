"""Which lines of the evidence support the answer.

Small models rarely cite reliably, so citations are attributed after the fact: every
evidence line is scored by the rare answer words it contains, and the best lines become
`path:a-b` (or `file.pdf p.N`) references. Labels the model did write ([3]) are kept too.
"""

from __future__ import annotations

import bisect
import copy
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from ktcli.ingest.sections import MARKDOWN_RULE, SectionIndex, document_trails, paged_trails, row_cells
from ktcli.retrieval.lexical import cjk_terms, combining_marks, fold
from ktcli.retrieval.symbols import defined_name, split_dotted
from ktcli.pipeline.events import Reporter
from ktcli.types import CHAPTER, PARAGRAPH, Answer, Chunk, Citation, Corpus, Document, Span

# Words in any script ("Größe", "Кошка"; an ASCII-only pattern shredded the first and
# dropped the second, so notes in Russian counted as empty), and numbers.
# (An Indic word's vowel signs are combining marks, no \w: `_word_pattern` takes them in.)
# (A comma joins digits only as a thousands separator, as in the index: a CSV row's
# "2023,3,7.77" is three figures.)
_WORD = (r"(?:[^\W\d]|_)(?:\w|[{marks}])*|\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?(?!\d)|(?<![\d,])\d+,\d{{1,2}}(?![\d,.])"
         r"|\d+(?:\.\d+)*")
_LABEL = re.compile(r"\[(\d{1,3})\]")
# What an answer says of a name's definition
_DEFINITION_WORDS = frozenset({"defined", "defines", "define", "definition", "declared"})
_CAMEL = re.compile(r"[a-z][A-Z]")
_IDENTIFIER_PIECE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")  # as `retrieval.lexical` splits them
# Sentences end at . ! ? before a space, at CJK's stops, and at Devanagari's danda, Urdu's
# full stop and Arabic's question mark (a two-fact Hindi answer was one sentence: one cited)
_SENTENCE = re.compile(r"(?<=[.!?\u0964\u06d4\u061f])\s+|(?<=[。！？])|\n+")
_STOP = frozenset(
    "the a an and or of to in on for is are was were be been it its this that with as by at from "
    "which who what when where how why not no yes can could would should will do does did has have "
    "had their there they them these those than then also into about over under answer question "
    "source sources document text file according said says "
    # ktcli's own prompt words, which a small model echoes back instead of answering ("The
    # summary notes are: / The main points of this part are:"): cited as content, such an
    # echo got five sources, lines that merely held "summary" or "notes".
    "summary summarize notes note main points part parts following help helps gathered earlier "
    "shortened short line lines each update updated".split()
)


@lru_cache(maxsize=1)
def _word_pattern() -> re.Pattern[str]:
    return re.compile(_WORD.format(marks=combining_marks()))


def terms(text: str, pieces: bool = False) -> list[str]:
    """`pieces`: an identifier's words too (`pool_size`, `poolSize`: pool, size), as the
    index has them."""
    out: list[str] = []
    for m in _word_pattern().finditer(fold(text)):  # matched as the index matches: "ﬁnancial" is "financial"
        word = m.group(0)
        cjk = cjk_terms(word)  # Chinese, Japanese, Korean: character pairs, as the index has them
        out.extend(cjk if cjk is not None else [word.lower()])
        if pieces and cjk is None and word.isascii() and ("_" in word or _CAMEL.search(word)):
            # (not the one piece of a dunder: `__init__` and "init" counted it twice, and a
            # line `def __init__(` outranked the `class Context:` the answer named)
            out.extend(piece.lower() for piece in _IDENTIFIER_PIECE.findall(word)
                       if piece.lower() != word.lower().strip("_"))
    return [w for w in out if w not in _STOP and len(w) > 1]


def has_content(text: str) -> bool:
    """Whether `text` says anything beyond ktcli's own prompt words and markup ('The main
    points of this part are:', '#\n#\n#', '<pre><code>'): notes that do not are not passed
    on. ("<pre><code>" counted as two words: a CSV's summary was three parts' notes of it.)"""
    return not says_nothing_new(text)


# A sentence this much made of ktcli's own prompt words restates its instructions: a summary
# that ended "Write the final summary from these notes: what it is, how it is organised..."
# was cited to five lines of real code.
_ECHO_SHARE = 0.9


def restates_instructions(sentence: str) -> bool:
    words = terms(sentence)
    return len(words) >= 3 and sum(w in instruction_terms() for w in words) >= _ECHO_SHARE * len(words)


# Words only an echo of the instructions holds, two of them at least: a plain short answer
# ("The key is given on page 3 [1].") is all prompt words too, and lost its citation.
_ECHO_MARKERS = frozenset({"answer", "question", "sources", "source", "citing", "cite", "sentences", "summary",
                           "notes", "instructions", "passages"})


def echoes_instructions(sentence: str) -> bool:
    """Whether a sentence is ktcli's instructions written back (`restates_instructions`,
    and two of the words only they use)."""
    return restates_instructions(sentence) and len(_ECHO_MARKERS.intersection(terms(sentence))) >= 2


def only_restates_instructions(answer: str) -> bool:
    """Whether every sentence of `answer` that says anything restates ktcli's instructions."""
    said = [s for s in _SENTENCE.split(_LABEL.sub(" ", answer)) if terms(s)]
    return bool(said) and all(restates_instructions(s) for s in said)


def only_echoes_instructions(answer: str) -> bool:
    """Whether every sentence of `answer` that says anything is the instructions written
    back (`echoes_instructions`): the stricter test, for an answer whose labels go uncited."""
    said = [s for s in _SENTENCE.split(_LABEL.sub(" ", answer)) if terms(s)]
    return bool(said) and all(echoes_instructions(s) for s in said)


# Of the terms of the system prompt's sentence on who ktcli is or on quoting exactly, this
# share in one sentence of an answer writes it back. (Not its third, "If the sources do not
# contain the answer, say so plainly": an answer that does so is right.)
_SYSTEM_ECHO_SHARE = 0.7


def system_prompt_echoes(answer: str) -> list[str]:
    """The sentences of `answer` that write back the system prompt's first two sentences,
    in the model's own slight rewording: an answer whose first sentence was right went on
    "The source is a ktcli, a careful assistant that answers from the given sources only.
    Quotes names, numbers and code identifiers exactly as the sources write them." """
    out = []
    for sentence in _SENTENCE.split(_LABEL.sub(" ", answer)):
        said = {_stem(w) for w in terms(sentence)}
        if len(said) >= 4 and any(len(said & own) >= _SYSTEM_ECHO_SHARE * len(own) for own in _system_terms()):
            out.append(sentence.strip())
    return out


@lru_cache(maxsize=1)
def _system_terms() -> tuple[frozenset[str], ...]:
    from ktcli.pipeline.prompts import SYSTEM

    return tuple(frozenset(_stem(w) for w in terms(sentence)) for sentence in _SENTENCE.split(SYSTEM)[:2])


def _stem(word: str) -> str:
    """A word less a plural's or a verb's -s ("Quotes" for "Quote")."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def markup_or_echo(text: str) -> bool:
    """Whether `text` holds HTML tags or a sentence restating ktcli's instructions."""
    return bool(MARKUP_TAG.search(text)) or any(restates_instructions(s) for s in _SENTENCE.split(text))


def says_nothing_new(text: str, fewer_than: int = 1) -> bool:
    """Whether `text` holds fewer than `fewer_than` words that are neither ktcli's own
    prompt words nor inside markup tags: "The final summary is:" holds none; a summary of
    `<span class="varname">LlamaTokenizerFast</span>` and the instructions echoed, one.
    Nor does an echo of the instructions with a word or two of its own among many of
    theirs ("Update the summary notes with the main points of this part, one short line
    each, using the following format": 'using' and 'format'), passed on as a summary's
    notes and printed as them after 10 minutes of reading."""
    plain = MARKUP_TAG.sub(" ", text)
    new = set(terms(plain)) - instruction_terms()
    return len(new) < fewer_than or (len(new) < _FEW_NEW_TERMS and len(new) < _NEW_SHARE * len(_ANY_WORD.findall(plain)))


def says_nothing_of(text: str, source: str) -> bool:
    """Whether `text` (a summary) holds no word of `source` beyond ktcli's own prompt words
    and markup: asked to summarize a one-line `py.typed`, the bundled model wrote "This is a
    summary of the content. It provides a brief overview of the content, including the main
    points and key facts." (a few words of its own, none of the file's)."""
    said = set(terms(MARKUP_TAG.sub(" ", text))) - instruction_terms()
    return bool(said) and not said & set(terms(source))


_FEW_NEW_TERMS = 3  # words of its own under which a text is an echo, where they are ...
_NEW_SHARE = 0.2  # ... under this share of all its words
_ANY_WORD = re.compile(r"\w+")


# HTML's own tags only: `Vec<T>` or `<config>` in a summary are words of the input.
MARKUP_TAG = re.compile(r"</?(?:a|b|i|p|br|hr|em|strong|span|div|pre|code|ul|ol|li|h[1-6]|table|tr|td|th|img|"
                         r"html|body|head|section|blockquote|sup|sub|small|font|tt|kbd|var|"
                         # a page's own scaffolding: man-db's summary was `<script type="text/javascript">`
                         # and `</script>` lines, 11 of them, shown (probe 117)
                         r"script|style|noscript|meta|title|nav|thead|tbody|"
                         r"dl|dt|dd|center)\b[^<>]*>?", re.IGNORECASE)


@lru_cache(maxsize=1)
def instruction_terms() -> frozenset[str]:
    """The words of ktcli's own prompt: an answer that repeats them says nothing of the input."""
    from ktcli.pipeline.prompts import instructions

    return frozenset(terms(instructions()))


@dataclass(frozen=True)
class _Line:
    chunk: Chunk
    number: int | None  # 1-based line number in the document, None when unknown
    text: str
    header: str = ""  # a table row's header row, matched as if written beside it


def _lines(chunk: Chunk) -> list[_Line]:
    """The chunk's lines, each table row with its header row's words: an answer that quotes
    a row as its key line does ("Item: Desk, Price: 210 EUR, Stock: 5") was cited to the
    header, the one line holding "item", "price" and "stock", not to the desk's row."""
    start = chunk.span.line_start
    out = []
    header = ""  # the header row of the table being read
    for i, text in enumerate(chunk.text.split("\n")):
        number = None if start is None else start + i
        if header and MARKDOWN_RULE.fullmatch(text):  # the rule under a Markdown header row
            out.append(_Line(chunk, number, text))
        elif len(row_cells(text)) < 2:
            header = ""
            out.append(_Line(chunk, number, text))
        elif not header:
            header = text  # a table's first row: its header
            out.append(_Line(chunk, number, text))
        else:
            out.append(_Line(chunk, number, text, header))
    return out


def cited_labels(answer: str, n_labels: int) -> list[int]:
    """The source labels `answer` writes ([3]), in order, each once, but those inside a
    sentence that restates ktcli's instructions: 'Answer the question in a few sentences,
    citing sources like [1].' was a whole answer, and [1] its Sources."""
    return list(dict.fromkeys(label for label, _said in _labels_written(answer, n_labels)))


def backed_labels(answer: str, labelled: list[Chunk]) -> list[int]:
    """`cited_labels` less each label whose passage backs the sentence that writes it less
    than half as well as the passage that backs it best (shared words weighted by rarity
    among the passages; a label standing alone after a sentence is that sentence's). The
    bundled model ends sentences with "[1]" whatever it read, copying "citing sources like
    [1]": "The Halden factory opened on 14 September 2023. [1]" put page 1 first under
    Sources, not the factory's page 5; attribution finds the line instead."""
    backing = _Backing([chunk.text for chunk in labelled])
    backed: list[int] = []
    for label, said in _labels_written(answer, len(labelled)):
        if label not in backed and backing.best_for(said, label) == label:
            backed.append(label)
    return backed


class _Backing:
    """How well each labelled passage backs a sentence: the words they share, each weighted
    by its rarity among the passages."""

    def __init__(self, passages: list[str]) -> None:
        self.passages = [set(terms(text)) for text in passages]
        self.df = Counter(t for words in self.passages for t in words)

    def best_for(self, sentence: str, label: int) -> int | None:
        """`label` where its passage backs `sentence` at least half as well as the best one
        does; else the best one's label; None where no passage shares a word with it."""
        words = set(terms(sentence))
        n = len(self.passages)
        scores = [sum(math.log(1 + n / self.df[t]) for t in words & present) for present in self.passages]
        best = max(scores, default=0.0)
        if best <= 0:
            return None
        return label if 1 <= label <= n and scores[label - 1] >= 0.5 * best else scores.index(best) + 1


# "[" and up to 3 digits at the end of streamed text: a label ("[12]") may be arriving
_LABEL_STARTED = re.compile(r"\[\d{0,3}$")


class Relabel:
    """Streamed answer text with each source label ("[1]") moved to the passage that backs
    the sentence it ends, where the one written backs it less than half as well
    (`backed_labels`' measure). The bundled model ends sentences with "[1]" whatever it
    read, copying "citing sources like [1]": 6 of a probe's 30 answers cited [1] for a
    sentence whose words stood in another passage, so a reader who looked [1] up under
    Sources found nothing of it there. A label inside a sentence is judged by the words
    before it; one that comes out the same as the label just before it ("[8] [8]") is left
    out, and so is one whose sentence shares no word with any passage. `feed` holds back a
    "[" until it is known to be a label or not."""

    def __init__(self, passages: list[str]) -> None:
        self.backing = _Backing(passages)
        self.n = len(passages)
        self.shown = ""  # the text given out, labels as rewritten
        self.held = ""
        self.moved = 0  # labels rewritten

    def rewritten(self, text: str) -> str:
        """`text` (a part of the stream as the model wrote it) with its labels moved as
        `feed` moves them, counting nothing: what a loop guard keeps of the raw stream."""
        again = copy.copy(self)  # the same passages and backing, a stream of its own
        again.shown, again.held, again.moved = "", "", 0
        return again.feed(text) + again.flush()

    def feed(self, piece: str) -> str:
        text = self.held + piece
        m = _LABEL_STARTED.search(text)
        cut = m.start() if m else len(text)
        self.held = text[cut:]
        return self._release(text[:cut])

    def flush(self) -> str:
        text, self.held = self.held, ""
        if re.fullmatch(r"\[\d{1,3}", text) and not _in_code(self.shown):
            # "[1" with no "]": the token limit cut a label in half ("... 18 euros. [1" was
            # shown), and half a label names no source
            return ""
        return self._release(text)

    def _release(self, text: str) -> str:
        out, at = [], 0
        for m in _LABEL.finditer(text):
            out.append(text[at : m.start()])
            written = int(m.group(1))
            before = self.shown + "".join(out)
            if _in_code(before):  # `prices[1]`: an index, not a label
                out.append(m.group(0))
                at = m.end()
                continue
            label = self._label(before, written)
            if not label and _NAMES_A_SOURCE.search(before) and 1 <= written <= self.n:
                # "... breaks the tests for [1]." names the source as a word of its sentence:
                # left out, the answer read "the tests for ."
                label = written
            if label and label != written and re.search(rf"\[{label}\]\s*$", before):
                label = 0  # the label just before it says the same
            if label != written:
                self.moved += 1
            out.append(f"[{label}]" if label else "")
            at = m.end()
        out.append(text[at:])
        released = "".join(out)
        self.shown += released
        return released

    def _label(self, before: str, written: int) -> int:
        # A label past the passages read ("[3]" with two documents read whole, "in [2] is
        # in [3]" with one) names no source: Sources listed nothing under it. It goes to the
        # passage that backs its sentence, as a misplaced one does, else it is left out.
        known = 1 <= written <= self.n
        if known and self.n < 2:
            return written
        sentences = [_LABEL.sub(" ", s) for s in _SENTENCE.split(before)]
        said = next((s for s in reversed(sentences) if terms(s)), "")  # "... 2023. [1]": the sentence before
        if not said or echoes_instructions(said):
            return written if known else 0
        best = self.backing.best_for(said, written)
        # a sentence that shares no word with any passage ("The source of the information
        # is: [1]") has no source: its label pointed at a page with nothing of it
        return 0 if best is None else best


# A label standing where its sentence needs a word: the object of a preposition or a verb
# of reading ("see [2]", "as shown in [1]"), not a citation after a claim.
# ... and after an article: "parsed in the [1] section is the [2] config" came out "in the  section".
_NAMES_A_SOURCE = re.compile(r"(?i)\b(?:for|in|of|from|see|at|by|to|per|on|with|under|and|or|the|a|an|this|that)\s*$")


def _in_code(before: str) -> bool:
    """Whether text after `before` is inside a fenced code block or an inline `code` span."""
    if before.count("```") % 2:
        return True
    return before[before.rfind("\n") + 1:].count("`") % 2 == 1


# A fenced code block (to the end of the text while it is still open) or an inline code span.
_CODE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`", re.DOTALL)


def _labels_written(answer: str, n_labels: int) -> Iterator[tuple[int, str]]:
    """(label, the sentence it is written in, less its labels) for each label in 1..n_labels
    that `answer` writes, in order, outside sentences that restate ktcli's instructions
    (judged without their labels, as `attribute` judges them). A label standing alone
    ("2023. [1]": a sentence of its own), or opening the next one ("2023. [1] The board
    ..."), is given the sentence before it."""
    before = ""
    for sentence in _SENTENCE.split(_CODE.sub(lambda m: " " * len(m[0]), answer)):  # `prices[1]` is no label
        bare = _LABEL.sub(" ", sentence)
        if echoes_instructions(bare):
            continue
        said = bare if terms(bare) else before
        for m in _LABEL.finditer(sentence):
            if 1 <= (label := int(m.group(1))) <= n_labels:
                yield label, said if terms(_LABEL.sub(" ", sentence[: m.start()])) else before or said
        before = said


def document_citations(answer: str, documents, cited: list[Citation]) -> list[Citation]:
    """A whole read labels its documents [1]..[n]: the documents the answer names by label
    and no line citation already points into. An answer of labels and no words the
    sources share ('The [1] is a [2') had no Sources at all."""
    have = {c.span.path for c in cited}
    return [Citation(ref=documents[k - 1].path, span=Span(documents[k - 1].path), label=k)
            for k in cited_labels(answer, len(documents)) if documents[k - 1].path not in have]


# A reader's verdict on the input, which no line of it can back: "The code is well
# organized and easy to read." was cited to a comment that held "code" and "well".
_VERDICT_WORDS = frozenset(
    "well good better best nice great easy easier easily clearly simple simply overall readable "
    "readability maintainable straightforward concise robust elegant neat understandable".split()
)
_AS_WELL = re.compile(r"(?i)\bas well\b")  # "Sales rose as well." judges nothing
# A sentence that says the input lacks something: "The warranty period of the X200 is not
# mentioned." was cited to the X200's page for the question's words it repeats, as if that
# page said it (probe 103). What no line says no line can back.
_ABSENT = re.compile(
    r"(?i)\b(?:(?:is|are|was|were)\s+not\s+(?:explicitly\s+)?(?:mentioned|stated|given|provided|specified|"
    r"included|listed|discussed|described|found|available)"
    r"|(?:does|do|did)(?:\s+not|n['\u2019]t)\s+(?:explicitly\s+)?(?:mention|state|say|give|provide|specify|"
    r"include|list|discuss|describe|contain)"
    r"|no\s+(?:information|mention|data|details?)\s+(?:about|on|of|regarding|is|was)"
    r"|not\s+(?:found\s+)?in\s+the\s+(?:documents?|text|input|sources?|context))\b")
# A Markdown heading the answer writes ("## Release history", copied from the page's <h2>)
# heads what follows and claims nothing: it took one of three citations from the table row
# below it that answered the question (probe 108).
_HEADING = re.compile(r"\s*#{1,6}\s")
_BUT = re.compile(r"(?i)[,;]?\s+(?:but|however|though|although|while|whereas)\b|;")


def says_absent(text: str) -> bool:
    """Whether `text` says the input lacks something ("... is not mentioned")."""
    return bool(_ABSENT.search(text))


def _only_absence(sentence: str, known: set[str]) -> bool:
    """A sentence that only says something is not in the input (`_ABSENT`): none of its
    figures is the evidence's, and no "but" adds what is there."""
    return says_absent(sentence) and not _BUT.search(sentence) \
        and not any(_held(f, known) and not YEAR.fullmatch(f) for f in _figures(sentence))


def _only_a_verdict(sentence: str) -> bool:
    """A judgement with few words of its own besides, none a name or a figure ("The code is
    well written.", "Overall, the tests are clear.", "The code is well organized and easy to
    read."): no claim to cite."""
    words = set(terms(_AS_WELL.sub(" ", sentence)))
    rest = words - _VERDICT_WORDS
    judged = len(words) - len(rest)
    return judged > 0 and len(rest) <= (2 if judged == 1 else 3) and not rest & _names_and_figures(sentence)


def attribute(answer: str, evidence: list[Chunk], *, max_citations: int = 3, context: int = 1,
              by_sentence: bool = True, label_of: Callable[[Chunk], int] | None = None,
              asked: Iterable[str] = (), by_figure: bool = True, year_alone: bool = False) -> list[Citation]:
    """The evidence lines that best support `answer`, as merged, de-duplicated citations:
    first each sentence's best line, in answer order (`by_sentence`), then the lines that
    best match the answer as a whole. Scoring only the whole answer let its longest
    sentence decide: the README's question ('Q3 revenue was ... The report also mentions a
    recordable incident ...') was cited to the incident's page alone, not the revenue's.
    `label_of`: the source label the model read a chunk under (Citation.label). A sentence
    that restates ktcli's own instructions (`restates_instructions`) is no claim to cite.
    `asked`: the code names whose definitions the question asks for (`symbols.asked_definitions`).
    `by_figure`: a sentence with a figure the evidence holds is cited to a line holding it
    (False: by its words alone, as until 2026-12-07; `benchmarks.qa_accuracy` compares).
    `year_alone`: a line sharing only a year with the answer supports it (as until
    2026-12-07; `benchmarks.qa_accuracy --baseline years` compares)."""
    # joined by line breaks: a sentence split keeps list items apart (`by_sentence`); a
    # sentence with a figure no evidence holds is no claim of the evidence (`invented_figures`)
    known = _known_figures(chunk.text for chunk in evidence)
    text = "\n".join(s for s in _SENTENCE.split(_LABEL.sub(" ", answer))
                     if not restates_instructions(s) and not _only_invented(s, known) and not _only_a_verdict(s)
                     and not _only_absence(s, known) and not _HEADING.match(s))
    # (an identifier's words too: a config's `"pool_size": 25` is the answer "The pool size
    # is 25.", cited nowhere with "25" its one shared word)
    wanted = set(terms(text, pieces=True))
    if not wanted or not evidence:
        return []
    lines = [line for chunk in evidence for line in _lines(chunk)]
    line_terms = [set(terms(f"{line.text} {line.header}", pieces=True)) for line in lines]
    if wanted & _DEFINITION_WORDS:
        # A line of code that defines a name ("def format_filename(") holds "defined" as
        # well as the name: "format_filename is defined in utils.py" was cited to a call,
        # `self.ui_filename = format_filename(filename)`, which holds the name's words as
        # often and came first.
        # (only a name the answer writes: "class PacifyFlushWrapper:" is no place where
        # "the `typer.main` class is defined")
        # Where the question asks about a name the evidence defines, only that name's
        # definition is "defined": "where is `class Context` defined?" answered "... defined in
        # the `__init__` method of the `Context` class" was cited to another class's
        # `def __init__(`, not to `class Context:` in the same evidence.
        # A dotted name's definition is its last part's inside its owner's, and holds the
        # whole name's words: "CliRunner.invoke is defined" in `def invoke(` under class
        # CliRunner, not in `class CliRunner:` (named more often) nor in Context's `def invoke(`.
        defining = [(present, name.lower(), line) for present, line in zip(line_terms, lines)
                    if line.number is not None and (name := defined_name(line.text)) and name.lower() in wanted]
        parts = {name: [part.lower() for part in split_dotted(name)] for name in asked}
        whole = {p[-1]: (p[:-1], set(terms(name, pieces=True))) for name, p in parts.items()}

        def asked_for(name: str, line: _Line) -> bool:
            owners = whole[name][0] if name in whole else None
            return owners is not None and all(owner in line.chunk.section.lower() for owner in owners)

        asked_names = {name for _present, name, line in defining if asked_for(name, line)}
        for present, name, line in defining:
            if not asked_names:
                present |= _DEFINITION_WORDS
            elif asked_for(name, line):
                present |= _DEFINITION_WORDS | whole[name][1]
    running = _running_lines(lines) | {i for i, line in enumerate(lines) if _DIFF_HEADER.match(line.text)}
    df = Counter(t for present in line_terms for t in present)
    n = len(lines)

    def scored(words: set[str]) -> list[tuple[float, int, int]]:
        """(score, lines index, answer words present) for every line, in line order."""
        rows = []
        for i, present in enumerate(line_terms):
            hits = words & present if i not in running else set()
            rows.append((sum(math.log(1 + n / df[t]) for t in hits), i, len(hits)))
        return rows

    def best_first(row: tuple[float, int, int]) -> tuple[float, int]:
        return -row[0], row[1]

    whole = sorted(scored(wanted), key=best_first)
    best = whole[0][0]
    if best <= 0:
        return []
    picks: list[tuple[float, int]] = []
    line_figures: dict[int, set[str]] = {}

    def holding(rows: list[tuple[float, int, int]], figures: set[str]) -> list[tuple[float, int, int]]:
        """The rows whose line holds one of `figures` (a sentence's, the evidence holds them)."""
        for _s, i, _hits in rows:
            if i not in line_figures:
                line_figures[i] = _known_figures([lines[i].text])
        return [row for row in rows if line_figures[row[1]] & figures]

    if by_sentence:
        for sentence in _SENTENCE.split(text):
            words = set(terms(sentence, pieces=True))
            rows = scored(words) if len(words) >= 2 else []
            # A sentence's figure is backed by a line that holds it: "closed for 18 days due
            # to a fire" was cited to a report page with no 18, that shared its other words.
            figures = {f for f in _figures(sentence) if f in known and not YEAR.fullmatch(f)}
            if figures and by_figure:
                rows = holding(rows, figures)
            s, i, hits = min(rows, key=best_first) if rows else (0.0, 0, 0)
            if hits >= 2:  # one shared word is coincidence
                picks.append((s, i))
    # Lines far weaker than the best one are coincidental word overlap, and so is a line
    # that shares one everyday word of an answer of several (a summary about quiver trees
    # was cited to a nav bar's "Home" and an image's "south bench"); one name or figure
    # ("It is Whitfield, per the staff page.") is enough; a year is not: a junk answer,
    # `<script> document.write(`<h1>2023</h1>`); </script>`, was cited to three pages of an
    # annual report by "2023" alone, which every page holds (probe 112).
    enough = min(2, len(wanted))
    named = {t for t in _names_and_figures(text) if year_alone or not YEAR.fullmatch(t)}

    def supports(i: int, hits: int) -> bool:
        return hits >= enough or (hits == 1 and bool(line_terms[i] & wanted & named))

    picks += [(s, i) for s, i, hits in whole if s >= 0.5 * best and supports(i, hits)]
    citations: list[Citation] = []
    for s, i in picks:
        if len(citations) >= max_citations:
            break
        span = _span_around(lines, i, context)
        if any(_overlaps(span, c.span) for c in citations):  # equal spans overlap too
            continue
        label = label_of(lines[i].chunk) if label_of is not None else 0
        citations.append(Citation(ref=span.cite(), span=span, score=round(s, 3), label=label,
                                  line=lines[i].number))
    return citations


# A figure as written: "2.1", "38,000", "1 000", ".5"; a list item's number ("10. ") is
# none, nor is a part of a date, a time or a range ("2024-03-01", "10:00", "3/4", "5-7"),
# which a source may write otherwise ("1 March 2024", "10 am").
_FIGURE = re.compile(r"(?<![\w.,:/\-])(?:\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?!\d)|\d+(?:[.,]\d+)*|\.\d+)(?![:/\-]?\d)")
_ITEM_NUMBER = re.compile(r"^\s*\d{1,3}[.)]\s", re.MULTILINE)
_THOUSANDS = re.compile(r"[, \u00a0\u202f](?=\d{3}(?!\d))")


def _canonical(written: str) -> str:
    """A figure as one string however it is written: "38,000" and "38 000" are "38000",
    "5.0" is "5", "12.50" is "12.5", ".5" is "0.5"."""
    figure = _THOUSANDS.sub("", written.rstrip(".,"))
    if figure.startswith("."):
        figure = "0" + figure
    if "." in figure and figure.count(".") == 1:
        figure = figure.rstrip("0").rstrip(".")
    return figure


def _figures_in_order(text: str, written_out: bool = False) -> list[str]:
    """The figures of `text` of two characters or more (a single digit is as often written
    out: "3 pumps", "three pumps"), each `_canonical`, with its ISO dates and clock times
    whole ("2024-03-01", "05:56:12"); `written_out`: dates and times as a source may write
    them too ("1 March 2024", "2:30 pm"), in those forms, and a day and month without a
    year as "--03-01". Without it (an answer's figures) such a date or time is read whole,
    in the same forms, instead of its parts: an answer's "2:30 pm" was "02:30", said to be
    in none of a source's "14:30", and its "14 July 2024" passed as a 14 and a 2024 from
    anywhere in the passages (probe 103)."""
    text = _ITEM_NUMBER.sub(" ", _LABEL.sub(" ", text))
    found = [(m.start(), _canonical(m.group(0))) for m in _FIGURE.finditer(text)]
    found += [(m.start(), f"{m[1]}-{m[2]}-{m[3]}") for m in _ISO_DATE.finditer(text)]
    found += [(m.start(), f"{int(m[1]):02d}:{m[2]}" + (f":{m[3]}" if m[3] else "")) for m in _CLOCK.finditer(text)]
    whole: list[tuple[int, str]] = []
    for m in _DAY_MONTH_YEAR.finditer(text):
        day, month, year = (m[1], m[2], m[3]) if m[1] else (m[5], m[4], m[6])
        whole.append((m.start(), f"{year}-{_MONTHS[month.lower()[:3]]:02d}-{int(day):02d}", m.end()))
    for m in _TWELVE_HOUR.finditer(text):
        hour = int(m[1]) % 12 + (12 if m[3].lower() == "p" else 0)
        whole.append((m.start(), f"{hour:02d}:{m[2] or '00'}", m.end()))
    if written_out:
        found += [(m.start(), m[1]) for m in _ISO_DATE.finditer(text)]  # its year, as "March 1, 2024" writes it
        found += [(m.start(), f"--{_MONTHS[(m[2] or m[3]).lower()[:3]]:02d}-{int(m[1] or m[4]):02d}")
                  for m in _DAY_MONTH.finditer(text)]
    else:
        found = [(at, f) for at, f in found if not any(start <= at < end for start, _, end in whole)]
    found += [(start, f) for start, f, _ in whole]
    return [f for _, f in sorted(found) if len(f) >= 2]


def _held(figure: str, known: set[str]) -> bool:
    """Whether `figure` (an answer's) stands in what `known` was read from: a date also
    where a source gives its day and month, and its year elsewhere ("opened on 14
    September", "in 2023")."""
    if figure in known:
        return True
    date = _ISO_DATE.fullmatch(figure)
    return bool(date) and f"--{date[2]}-{date[3]}" in known and date[1] in known


_ISO_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")
_CLOCK = re.compile(r"(?<![\d:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])")
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                       "dec"), start=1)}
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
_DAY_MONTH_YEAR = re.compile(rf"(?i)\b(?:(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH},?\s+(\d{{4}})|{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}}))\b")
_DAY_MONTH = re.compile(rf"(?i)\b(?:(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH}|{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?)\b")
_TWELVE_HOUR = re.compile(r"(?i)(?<![\d:])(\d{1,2})(?::(\d{2}))?\s*([ap])\.?m\b\.?")


def _figures(text: str) -> set[str]:
    return set(_figures_in_order(text))


def _only_invented(sentence: str, known: set[str]) -> bool:
    """Whether `sentence` writes a figure none of the evidence holds, and none that it does
    but years: "The salary in 2023 was 2.1 million" claims nothing the evidence says, while
    "The margin was 39.6%, up 3.8%" is cited for its 39.6 (and its 3.8 said all the same)."""
    figures = _figures(sentence)
    return any(not _held(f, known) for f in figures) \
        and not any(_held(f, known) and not YEAR.fullmatch(f) for f in figures)


# A year, as every check of ours reads one: 1500-2099 (a history's "1776" is a year too).
YEAR = re.compile(r"1[5-9]\d\d|20\d\d")
# A number that is a whole field of a delimited row (CSV, TSV, `a | b`, `a;b`), quoted or not.
_FIELD = re.compile(r"(?:^|(?<=[,;|\t]))[ \t]*\"?(\d+(?:\.\d+)?)\"?[ \t]*(?=[,;|\t\r]|$)", re.MULTILINE)


def _known_figures(texts: Iterable[str]) -> set[str]:
    """The figures of `texts`, and each whole one of 1,000 or more in thousands, millions
    and billions as an answer rounds it ("$1,200,000" is "1.2 million")."""
    known: set[str] = set()
    for text in texts:
        known |= set(_figures_in_order(text, written_out=True))
        # a delimited row's fields: `_FIGURE` starts no figure after a comma, so a CSV's
        # "Marketing,Online ads,97500,Sofia Marin" held no figure, and an answer quoting
        # its 97500 was said to be made up and cited nowhere
        known |= {f for m in _FIELD.finditer(text) if len(f := _canonical(m[1])) >= 2}
    for figure in [f for f in known if f.isdigit() and len(f) >= 4]:
        for scale in (1_000, 1_000_000, 1_000_000_000):
            scaled = int(figure) / scale
            if scaled >= 1 and round(scaled, 2) == scaled:
                known.add(_canonical(f"{scaled:.2f}"))
    return known


def invented_figures(answer: str, sources: Iterable[str], question: str = "") -> list[str]:
    """The figures `answer` writes that stand in none of `sources`, nor in the question, in
    answer order: made up. Asked a salary no document gave, the bundled model answered
    "2.1 million kroners", cited to a line that shared "chief" and "2023"; `attribute`
    now cites no sentence whose figures are all such (years aside), and the caller says
    which they are."""
    known = _known_figures([*sources, question])
    return list(dict.fromkeys(f for f in _figures_in_order(answer) if not _held(f, known)))


# Capitalised words that are no name a source must hold: months, days, languages an answer
# names its sources' by.
_NOT_NAMES = frozenset(
    "january february march april may june july august september october november december monday tuesday "
    "wednesday thursday friday saturday sunday english german french spanish italian russian chinese japanese".split())


def invented_names(answer: str, sources: Iterable[str], question: str = "", elsewhere: Iterable[str] = ()) -> list[str]:
    """The names `answer` writes (a word of letters capitalised inside a sentence, three or
    more of them, or a code of letters and digits: `_code_word`) that stand in none of `sources`, the question or `elsewhere` (the rest of
    the input), in any case: made up. Asked a mascot no document named, the bundled model
    answered "Marisol Venkataraman, a local artist", cited, unflagged: the figures check
    (`invented_figures`) has no figure to find in it."""
    said = []
    for k, word in _words_by_sentence(_LABEL.sub(" ", answer)):
        # (an acronym of four letters or fewer is as often a common word's: "CEO", "API")
        if k > 0 and len(word) >= 3 and word.isalpha() and word[0].isupper() and word.lower() not in _NOT_NAMES \
                and not (word.isupper() and len(word) <= 4):
            said.append(word)
        elif _code_word(word):
            said.append(word)
    if not said:
        return []
    # (found as a piece of text, in any case: a name inside a longer word counts as said)
    missing = list(dict.fromkeys(said))
    for texts in ((*sources, question), elsewhere):
        if missing:
            held = "\n".join(fold(t) for t in texts).lower()
            missing = [w for w in missing if fold(w).lower() not in held]
        if any(_code_word(w) for w in missing):  # a code written apart there: "ISO 8601", "CMAU 555000-1"
            compact = _CODE_SEPARATORS.sub("", held)
            missing = [w for w in missing if not _code_word(w) or _CODE_SEPARATORS.sub("", fold(w).lower()) not in compact]
    return missing


# A fiscal year or quarter written as one word ("FY2023", "2023Q3", "H1'24"): the sources
# may write it apart ("fiscal 2023", "Q3 2023"), so it is no code to look up.
_CODE_SEPARATORS = re.compile(r"[\s\-_./]+")
_PERIOD_WORD = re.compile(r"(?i)(?:fy|cy|q[1-4]|h[12])?'?\d{2,4}(?:q[1-4]|h[12])?")


def _code_word(word: str) -> bool:
    """Whether `word` is a code of letters and four or more digits: a container, invoice,
    part or case number ("CMAU5550001", "INV20230042"). Asked which container went to
    Gdansk, the bundled model numbered on from the one a CSV held ("CMAU5550002,
    CMAU5550003"), unflagged: glued to letters, its digits are no figure (probe 118)."""
    return (sum(c.isdigit() for c in word) >= 4 and any(c.isalpha() for c in word)
            and not _PERIOD_WORD.fullmatch(word))


# A code name the answer writes in backticks: `to_ascii()`, `Codec.encode`, `SHELF_FILE`. Not
# a path (`storage.py`: a file's name need not stand in any file's text) nor a fenced block
# (`summary_lines` checks those whole).
_INLINE_CODE = re.compile(r"(?<!`)`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\(\))?`(?!`)")
_FENCED = re.compile(r"^\s*(```|~~~).*?(?:^\s*\1|\Z)", re.MULTILINE | re.DOTALL)
_NOT_CODE_NAMES = frozenset({"None", "True", "False", "self", "cls"})


def invented_code_names(answer: str, sources: Iterable[str], question: str = "",
                        elsewhere: Iterable[str] = ()) -> list[str]:
    """The code names `answer` writes in backticks (three characters or more; a dotted name
    by its last part, where it is a call) that stand as a word in none of `sources`, the
    question or `elsewhere`, as written: made up. The bundled model summed idna up as "use
    the `to_ascii()` function ... `to_unicode()`", names no file of it holds, cited to
    `cli.py` and `core.py` with nothing said (probe 117)."""
    said: list[str] = []
    for m in _INLINE_CODE.finditer(_FENCED.sub(" ", answer)):
        name, call = m.group(1), m.group(2)
        if "." in name:
            if not call:
                continue  # `cacert.pem`, `pyproject.toml`: a file's name, or a module's path
            name = name.rsplit(".", 1)[1]
        if len(name) >= 3 and name not in _NOT_CODE_NAMES and not _code_word(name):  # (that, a name: said so)
            said.append(name + (call or ""))
    if not said:
        return []
    missing = list(dict.fromkeys(said))
    for texts in ((*sources, question), elsewhere):
        if missing:
            held = "\n".join(texts)
            missing = [w for w in missing if not re.search(rf"(?<![\w]){re.escape(w.removesuffix('()'))}(?!\w)", held)]
    return [f"`{w}`" for w in missing]


def warn_of_invented(text: str, sources: list[str], question: str, reporter: Reporter,
                     subject: str = "answer", elsewhere: Iterable[str] = (), read: str = "") -> None:
    """Says on `reporter` which figures and names of `text` stand in nothing it was written
    from (`invented_figures`, `invented_names`; a name found `elsewhere` in the input is not
    made up); `read`: what `sources` are, as the figures' line names them."""
    where = read or ("the passages it read" if subject == "answer" else "the input")
    made_up = invented_figures(text, sources, question)
    if made_up:
        some = f"figures {', '.join(made_up[:5])} stand" if len(made_up) > 1 else f"figure {made_up[0]} stands"
        # "(not cited)" only where it is so: a sentence that also writes a figure the
        # sources hold is cited for it (`_only_invented`), and "0.21, ... 2.1%" was said
        # "not cited" above the Sources that listed its line (probe 108)
        uncited = " (not cited)" if _left_uncited(text, made_up, _known_figures(sources)) else ""
        reporter.warn(f"the {subject}'s {some} in none of {where}{uncited}: check "
                      f"{'them' if len(made_up) > 1 else 'it'} in the sources")
    names = invented_names(text, sources, question, elsewhere)
    if names:
        some = f"names {', '.join(names[:5])} stand" if len(names) > 1 else f"name {names[0]} stands"
        where = "the input" if subject != "answer" or elsewhere else where
        reporter.warn(f"the {subject}'s {some} in none of {where}: check "
                      f"{'them' if len(names) > 1 else 'it'} in the sources")
    # (a summary's only, for now: an answer's how-to may name a call of its own on purpose)
    code = invented_code_names(text, sources, question, elsewhere) if subject != "answer" else []
    if code:
        some = f"code names {', '.join(code[:5])} stand" if len(code) > 1 else f"code name {code[0]} stands"
        reporter.warn(f"the {subject}'s {some} in none of the input: check "
                      f"{'them' if len(code) > 1 else 'it'} in the sources")


def _left_uncited(text: str, figures: list[str], known: set[str]) -> bool:
    """Whether every sentence of `text` that writes one of `figures` is cited nowhere, as
    `attribute` leaves a sentence whose figures, years aside, are all made up."""
    wanted = set(figures)
    return all(_only_invented(s, known) for s in _SENTENCE.split(_LABEL.sub(" ", text)) if _figures(s) & wanted)


def _names_and_figures(text: str) -> set[str]:
    """Terms of `text` that name something, not everyday words: a word capitalised inside a
    sentence ("Whitfield"), one with a digit, an underscore or a capital inside ("B2",
    `max_len`, "iPhone"), a number of three characters or more ("412", "5.87")."""
    out: set[str] = set()
    for k, word in _words_by_sentence(text):
        if word[0].isdigit():
            named = len(word) >= 3
        else:
            named = (k > 0 and word[0].isupper()) or any(c.isdigit() or c == "_" for c in word) \
                or any(c.isupper() for c in word[1:])
        if named:
            out.add(word.lower())
    return out


def _words_by_sentence(text: str) -> Iterator[tuple[int, str]]:
    """Each word of `text` with its place in its sentence (0: the sentence's first, whose
    capital says nothing of a name). A line break inside a sentence (after a lowercase word
    or a comma, before a word) is no sentence's end: the bundled model wraps its answers
    near 100 characters, and "... sold to the new\nTidal lantern." named no Tidal."""
    for sentence in _SENTENCE.split(_unwrapped(text)):
        for k, m in enumerate(_word_pattern().finditer(sentence)):
            yield k, m.group(0)


def _unwrapped(text: str) -> str:
    """`text` with each line that runs on into the next (ends in a lowercase letter or a
    comma; the next starts with a letter) joined to it; a heading's line never is."""
    lines = text.split("\n")
    for i in range(len(lines) - 1):
        line, after = lines[i].rstrip(), lines[i + 1].lstrip()
        if line.endswith(",") or line[-1:].islower():
            if after[:1].isalpha() and not line.lstrip().startswith("#"):
                lines[i] += " "
                continue
        lines[i] += "\n"
    return "".join(lines)


_DIGITS = re.compile(r"\d+")
RUNNING_PAGES = 3
_LETTER_WORD = re.compile(r"[^\W\d_]{2,}")


# A unified diff's file header lines: they name the file a hunk changes, so a piped diff's
# answer was cited to them ("diff --git", "index", "---", "+++": probe 101), not to the
# changed lines; no claim stands on them.
_DIFF_HEADER = re.compile(r"(?:diff --git a/|index [0-9a-f]{7,}\.\.[0-9a-f]{7,}|--- (?:a/|/dev/null)|\+\+\+ (?:b/|/dev/null))")


def _running_lines(lines: list[_Line]) -> set[int]:
    """Indices of a PDF's running headers and footers: lines that come back, equal but for
    their numbers, on RUNNING_PAGES or more pages ('Harbor Light Lantern Company - Annual
    Report 2023 - page 3' on every page). They share the answer's proper names, so on the
    sample PDF they were cited beside (never instead of) the fact's line on 6 of 18
    answers, and such a citation points at nothing. A line needs three words of letters to
    count: table rows ('Q3 2023 | 5.87 | 39.6%') also differ only in their numbers. Paged
    documents only: in a text file, lines that repeat (log lines) are content. Nor do lines
    whose numbers say something of their own ('Revenue in Q3 2023 was $5.87 million.' on
    each quarter's page): a running line's numbers are the same on every page or follow
    the page number (`_numbers_are_running`)."""
    shapes: dict[str, list[int]] = {}  # line shape -> the indices of paged lines with it
    for i, line in enumerate(lines):
        if line.chunk.span.page is not None and len(_LETTER_WORD.findall(line.text)) >= 3:
            shapes.setdefault(_DIGITS.sub("#", line.text.strip().lower()), []).append(i)
    return {i for same in shapes.values()
            if len({(lines[i].chunk.span.path, lines[i].chunk.span.page) for i in same}) >= RUNNING_PAGES
            and _numbers_are_running([lines[i] for i in same])
            for i in same}


def _numbers_are_running(same: list[_Line]) -> bool:
    """Whether each number of lines of one shape is the same on every page or the page
    number plus a constant ('page 3 of 12', '- 14 -' on page 13)."""
    numbers = [[int(x) for x in _DIGITS.findall(line.text)] for line in same]
    pages = [line.chunk.span.page for line in same]
    for column in zip(*numbers):
        if len(set(column)) > 1 and len({x - page for x, page in zip(column, pages)}) > 1:
            return False
    return True


def _span_around(lines: list[_Line], i: int, context: int) -> Span:
    line = lines[i]
    chunk_span = line.chunk.span
    if line.number is None:
        return chunk_span
    lo, hi = line.number, line.number
    # widen within the same chunk only, so the range stays inside real evidence
    for j in range(i - 1, max(i - context, 0) - 1, -1):
        if lines[j].chunk is line.chunk and lines[j].number is not None and lines[j].text.strip():
            lo = lines[j].number
    for j in range(i + 1, min(i + context, len(lines) - 1) + 1):
        if lines[j].chunk is line.chunk and lines[j].number is not None and lines[j].text.strip():
            hi = lines[j].number
    return replace(chunk_span, line_start=lo, line_end=hi)


def _overlaps(a: Span, b: Span) -> bool:
    if a.path != b.path or a.page != b.page:
        return False
    if a.page is not None or a.line_start is None or b.line_start is None:
        return True  # a page is cited as a whole: two lines of one page are one citation
    if a.chars and b.chars and a.line_start == b.line_start:  # two pieces of one long line
        return a.chars[0] < b.chars[1] and b.chars[0] < a.chars[1]
    return not (a.line_end < b.line_start or b.line_end < a.line_start)  # type: ignore[operator]


def label_citations(labels: list[int], labelled: list[Chunk]) -> list[Citation]:
    return [Citation(ref=labelled[k - 1].span.cite(), span=labelled[k - 1].span, label=k) for k in labels]


def narrowed(labelled: list[Citation], attributed: list[Citation]) -> list[Citation]:
    """Each label's citation of its whole passage replaced by the lines attribution found
    in it under that label, where it found any. Neighbouring chunks are read as one passage
    (`windows.merge_neighbours`), and a probe's answer from line 13 of an HTML guide was
    cited `guide.html:1-36`, the whole file, `<script>` and all, the line itself dropped
    as inside it (`merge`). A page stays a page: a PDF is cited by its pages."""
    out: list[Citation] = []
    for c in labelled:
        inside = [a for a in attributed if a.label == c.label and c.span.page is None and a.span.page is None
                  and a.span.line_start is not None and _contains(c.span, a.span)]
        out += inside or [c]
    return out


def on_their_pages(cited: list[Citation], documents: Sequence[Document]) -> list[Citation]:
    """Each PDF citation named by the page most of its lines are on. A passage that ends a
    page mid-sentence is read with the next page's first lines (`windows.across_page_breaks`)
    and keeps its page, so a name on page 5's first line was cited "p.4"."""
    pages_of = {d.path: d.pages for d in documents if d.kind == "pdf" and d.pages}
    out = []
    for c in cited:
        pages, span = pages_of.get(c.span.path), c.span
        if pages is None or span.page is None or span.line_start is None or span.unit:
            out.append(c)
            continue
        offsets = [p.line_offset for p in pages]
        lines = range(span.line_start, (span.line_end or span.line_start) + 1)
        held = Counter(max(0, bisect.bisect_left(offsets, line) - 1) for line in lines)
        page = pages[max(held, key=lambda i: held[i])]  # (ties: the first, as Counter keeps its order)
        if page.number is None or page.number == span.page:
            out.append(c)
            continue
        span = replace(span, page=page.number, page_label=page.label)
        out.append(replace(c, span=span, ref=span.cite()))
    return out


def merge(*groups: list[Citation]) -> tuple[Citation, ...]:
    out: list[Citation] = []
    for group in groups:
        for c in group:
            if not any(_overlaps(c.span, o.span) and (c.span.line_start is None) == (o.span.line_start is None)
                       and _contains(o.span, c.span) for o in out):
                out.append(c)
    return tuple(out)


def _contains(outer: Span, inner: Span) -> bool:
    if outer.line_start is None or inner.line_start is None:
        return outer.path == inner.path and outer.page == inner.page
    return outer.line_start <= inner.line_start and inner.line_end <= outer.line_end  # type: ignore[operator]


def with_sections(answer: Answer, corpus: Corpus) -> Answer:
    """Each line citation named with the section trail above its first line, so a reader
    sees "Classes > Class Definition Syntax" without opening the file. Runs before
    `in_source_lines`: trails are counted in the text's lines, as spans are until then."""
    docs = {d.path: d for d in corpus.documents}
    trails: dict[str, SectionIndex] = {}
    cites = []
    for c in answer.citations:
        doc = docs.get(c.span.path)
        if doc is not None and doc.kind == "pdf" and c.span.page is not None and c.span.line_start is None:
            # a PDF page read whole: the section at its top (bookmarks' or numbered headings')
            page = next((p for p in doc.pages if p.number == c.span.page), None) if not c.section else None
            cites.append(replace(c, section=page.section) if page is not None else c)
            continue
        # (a Word page's or an EPUB chapter's trail: the headings of its text, as a file's)
        if doc is None or c.span.line_start is None:
            cites.append(c)
            continue
        if doc.path not in trails:
            lines = doc.text.split("\n")
            trails[doc.path] = (paged_trails(doc.pages, lines) if doc.kind == "pdf"
                                else document_trails(doc.path, doc.kind, lines, doc.language))
        cites.append(replace(c, section=trails[doc.path].at(c.span.line_start - 1)))
    return replace(answer, citations=tuple(cites))


def evidence_entry(span: Span, score: float | None, section: str = "") -> dict:
    """One entry of --json's `figures.evidence`, whatever the mode or task; `section`: the
    passage's trail (a reviewer could not tell which clauses were read but not cited)."""
    return {"ref": span.cite(), "path": span.path, "line_start": span.line_start, "line_end": span.line_end,
            "page": span.page, "page_label": span.page_label, "unit": span.kind, "chars": _chars(span),
            "section": section, "score": score}


def passage_label(span: Span, passages: Sequence) -> int | None:
    """The number (1-based) of the passage, among those the model read (chunks, in label
    order), that holds `span`: a retrieved chunk merged with its neighbours is read inside
    a longer one. None for a chunk left out of every window."""
    for i, p in enumerate(passages, start=1):
        if p.span.path == span.path and _contains(p.span, span):
            return i
    return None


def _chars(span: Span) -> list[int] | None:
    """A piece of a long line: its characters, [start, end) 0-based, for --json."""
    return list(span.chars) if span.chars else None


def documents_read(documents, outlined=frozenset()) -> list[dict]:
    """`figures.evidence` of a read of whole documents: each one, all its lines (a PDF:
    its pages, named by the path alone); those in `outlined` (paths) read as outlines,
    said so, with no lines claimed."""
    out = []
    for d in documents:
        if d.path in outlined:
            out.append(evidence_entry(Span(d.path), None) | {"ref": f"{d.path} (outline)", "outlined": True})
            continue
        if d.pages:  # its pages (a PDF's, a Word file's) or an EPUB's chapters: their range
            numbered = [p for p in d.pages if p.number is not None]
            numbers = [p.number for p in numbered]
            unit = CHAPTER if d.unit == CHAPTER else "page"
            ref = f"{d.path} {'ch.' if unit == CHAPTER else 'p.'}{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else d.path
            entry = {"ref": ref, "unit": unit, "pages": [numbers[0], numbers[-1]] if numbers else None}
            if len(numbered) > 1 and (numbered[0].label or numbered[-1].label):
                # printed numbers, as its citations name its pages (a book's "p.i-217", not "p.1-230")
                first, last = (p.label or str(p.number) for p in (numbered[0], numbered[-1]))
                entry |= {"ref": f"{d.path} p.{first}-{last} (pages {numbers[0]}-{numbers[-1]} of the file)",
                          "page_labels": [first, last]}
            out.append(evidence_entry(Span(d.path), None) | entry)
            continue
        out.append(evidence_entry(Span(d.path, 1, d.text.rstrip("\n").count("\n") + 1, unit=d.unit), None)
                   | {"ref": d.path})
    return out


def in_source_lines(answer: Answer, corpus: Corpus) -> Answer:
    """Citations (and the evidence list in the figures) in the lines and pages of the files
    the user has: a document whose text is drawn from other lines (HTML) counts its spans in
    text lines until here (`Document.source_lines`); a PDF page is named by its printed
    number where that differs from its index (`Page.label`)."""
    maps = {d.path: d.source_lines for d in corpus.documents if d.source_lines}
    units = {d.path: d.unit for d in corpus.documents if d.unit}
    # A PDF page's printed number where it is not its index (a book's front matter in roman
    # numerals: printed page 2 was cited as p.4, which no reader finds on the page).
    printed = {(d.path, p.number): p.label for d in corpus.documents for p in d.pages if p.label}
    if not maps and not printed:
        return answer

    def moved(span: Span) -> Span:
        lines = maps.get(span.path)
        if not lines or span.line_start is None:
            return span
        end = span.line_end if span.line_end is not None else span.line_start
        # a piece's characters count in a paragraph's text (Word's ¶), not in a page's
        # source line (HTML's): there they name nothing
        chars = span.chars if span.unit == PARAGRAPH else None
        return replace(span, line_start=lines[min(span.line_start, len(lines)) - 1],
                       line_end=lines[min(end, len(lines)) - 1], chars=chars)

    def ref(span: Span) -> str:
        label = printed.get((span.path, span.page))
        return f"{span.path} p.{label} (page {span.page} of the file)" if label else span.cite()

    def labelled(span: Span) -> Span:
        label = printed.get((span.path, span.page))
        return replace(span, page_label=label) if label else span

    def moved_line(c: Citation) -> int | None:
        lines = maps.get(c.span.path)
        if not lines or c.line is None:
            return c.line
        return lines[min(c.line, len(lines)) - 1]

    cites = []
    for c in answer.citations:
        span = labelled(moved(c.span))
        cites.append(replace(c, ref=ref(span), span=span, line=moved_line(c)))
    figures = dict(answer.stats)
    if "evidence" in figures:
        evidence = []
        for e in figures["evidence"]:
            if e.get("outlined") or e.get("pages"):  # no lines claimed, or a range of pages: its ref as it is
                evidence.append(e)
                continue
            span = moved(Span(e["path"], e["line_start"], e["line_end"], e["page"], units.get(e["path"], ""),
                              chars=tuple(e["chars"]) if e.get("chars") else None))
            evidence.append(e | {"ref": ref(span), "line_start": span.line_start, "line_end": span.line_end,
                                 "unit": span.kind, "page_label": printed.get((span.path, span.page)),
                                 "chars": _chars(span)})
        figures["evidence"] = evidence
    return replace(answer, citations=tuple(cites), stats=figures)
