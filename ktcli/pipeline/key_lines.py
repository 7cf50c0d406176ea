"""Key lines: the sentences or table rows of the sources that best match the question,
quoted again between the sources and the question.

Why: a small model answers from what it read last. Given the sample report whole, the
bundled 135M model answered "Q3 revenue" with Q4's figure from the sentence after it, and
20 of 58 questions right on three documents; with the two best-matching lines repeated
right before the question, 37-40 over the five layouts tried (`python -m
benchmarks.qa_accuracy --baseline key-lines`).
A table row is quoted with its header's names ("Quarter: Q3 2023, Revenue ($M): 5.87"):
as a bare "Q3 2023 | 5.87 | 39.6%" the model had to find which figure is which in a
header it read far above.

Lines are ranked as the retriever ranks chunks: a dense score (the bundled embedder)
plus a lexical one (BM25), each scaled to [0, 1] over the candidates. BM25 alone put
"per share" first for "what share of electricity came from renewable sources?".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ktcli.ingest.sections import MARKDOWN_RULE, row_cells

if TYPE_CHECKING:
    from ktcli.retrieval.embedder import TextEmbedder

KEY_LINES = 2  # 3 scored 30/58, 2 scored 34/58 (the third line was mostly a distractor)
LEXICAL_WEIGHT = 0.5
# Lines the embedder scores at most, the best by BM25: the sample report's 66 took 0.27 s
# here, 1,024 of the tutorial's 1,660 took 3.8 s (and 180 MB); a sparse read of a book
# would have tens of thousands.
MAX_DENSE_LINES = 256
MIN_CHARS = 12  # "Total | 412" and shorter carry no fact a question finds
MAX_CHARS = 400  # a quote, not a page: a run-on paragraph with no full stop is cut at a word

# A sentence ends at . ! ? before a space and a capital, digit or quote: "e.g. the" and
# "$5.87 million" stay whole.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(“‘])")
_LIST_ITEM = re.compile(r"\s*(?:[-*•]|\d{1,3}[.)])\s+")
_BULLET = re.compile(r"^[-*•]\s+")
_HEADING = re.compile(r"\s*#{1,6}\s")
# a figure, not a column's name: "5.87", "61,200", "40.9%", "$4.6", "1.2 kg"; a year is a
# name ("2023")
_FIGURE = re.compile(r"[-+−]?[$£€¥]?\d[\d,.]*\s*(?:%|[^\W\d_]{1,5}\.?)?")
_YEAR = re.compile(r"(?:19|20)\d\d")
_FENCE = re.compile(r"(```|~~~)")
# reStructuredText: a title's underline ("====="), a directive (".. method:: list.append(x)")
# and its options (":noindex:"; a role opening a sentence, ":keyword:`pass`", is prose)
_UNDERLINE = re.compile(r"([=\-~^\"'`#*+_:.])\1{2,}")
_DIRECTIVE = re.compile(r"\.\. [\w:-]+::(.*)")
_OPTION = re.compile(r":[\w-]+:(?:\s|$)")
# a sentence that leans on the one before it
_ANAPHOR = re.compile(r"(?:It|Its|This|These|They|Their|That|Those|Such|He|She|His|Her|Both|Each)\b")

def lines_of(text: str) -> list[str]:
    """`text` as the units a question's answer sits in: prose as sentences (a PDF's lines
    run on, so lines join up to a blank line, a list item, a heading or a table), table
    rows as "column: cell" pairs under their header row. Code is no unit: fenced or
    literal blocks (after a "::" line) and doctest lines are passed over. Out of its
    context a sentence can mislead, so a sentence that opens with a pronoun ("It can be
    used when a statement is required syntactically") comes with the one before it, and
    one in the body of a reStructuredText directive (".. method:: list.append(x)") under
    what the directive names."""
    out: list[str] = []
    prose: list[str] = []
    header: list[str] | None = None
    literal: int | None = None  # the indentation of the "::" line whose block is being passed over
    fenced = False
    subject, subject_indent = "", 0

    def end_paragraph() -> None:
        if prose:
            out.extend(_sentences(" ".join(prose), subject))
            prose.clear()

    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if _FENCE.match(stripped):
            end_paragraph()
            fenced = not fenced
            continue
        if fenced:
            continue
        if literal is not None:
            if not stripped or indent > literal:
                continue
            literal = None
        if subject and stripped and indent <= subject_indent:
            end_paragraph()
            subject = ""
        if (directive := _DIRECTIVE.match(stripped)) is not None:
            end_paragraph()
            subject, subject_indent = directive.group(1).strip(), indent
            continue
        if MARKDOWN_RULE.fullmatch(stripped) and header is not None:
            continue
        cells = row_cells(stripped)
        if len(cells) >= 2:
            end_paragraph()
            if header is None or (header and len(cells) != len(header)):  # a table starts
                header = cells if _is_header(cells) else []
                if header:
                    continue
            out.append(_row(header, cells))
            continue
        header = None
        if _UNDERLINE.fullmatch(stripped):
            if len(prose) == 1:
                prose.clear()  # a reStructuredText title: a heading, no sentence
            end_paragraph()
            continue
        if not stripped or _HEADING.match(stripped) or _OPTION.match(stripped):
            end_paragraph()
            continue
        if stripped.startswith((">>>", "... ")) or stripped == "...":
            end_paragraph()
            continue
        if _LIST_ITEM.match(stripped):
            end_paragraph()
        prose.append(_BULLET.sub("", stripped, count=1))  # a numbered step keeps its number
        if stripped.endswith("::"):
            prose[-1] = prose[-1][:-1]  # "the list methods::" reads "the list methods:"
            end_paragraph()
            literal = indent
    end_paragraph()
    return [_short(u.strip()) for u in out if len(u.strip()) >= MIN_CHARS]


def _sentences(paragraph: str, subject: str) -> list[str]:
    said = _SENTENCE_END.split(paragraph)
    units = [f"{before} {sentence}" if k and _ANAPHOR.match(sentence) else sentence
             for k, (before, sentence) in enumerate(zip([""] + said, said))]
    return [f"{subject}: {unit}" for unit in units] if subject else units


def _is_header(cells: list[str]) -> bool:
    """A table's first row names its columns unless it holds figures (a headerless table of
    "Weight | 1.2 kg" rows); years name columns ("Item | 2023 | 2022")."""
    return not any(_FIGURE.fullmatch(c) and not _YEAR.fullmatch(c) for c in cells)


def _row(header: list[str], cells: list[str]) -> str:
    if len(header) != len(cells):
        return " | ".join(cells)
    return ", ".join(f"{name}: {cell}" if name else cell for name, cell in zip(header, cells) if cell)


def _short(unit: str) -> str:
    if len(unit) <= MAX_CHARS:
        return unit
    cut = unit.rfind(" ", 0, MAX_CHARS)
    return unit[: cut if cut > MAX_CHARS // 2 else MAX_CHARS] + " ..."


def pick(question: str, sources: Sequence[tuple[int, str]], embedder: TextEmbedder | None,
         k: int = KEY_LINES) -> list[tuple[int, str]]:
    """The `k` lines of `sources` ((label, text) pairs) that best match `question`, best
    first, each with its source's label; ranked by BM25 alone where `embedder` is None."""
    from ktcli.retrieval.lexical import BM25Index

    seen: set[str] = set()
    candidates: list[tuple[int, str]] = []
    for label, text in sources:
        for unit in lines_of(text):
            if unit not in seen:
                seen.add(unit)
                candidates.append((label, unit))
    if not candidates:
        return []
    lexical = BM25Index(u for _, u in candidates).scores(question)
    if embedder is None:
        if not lexical.max() > 0:
            return []  # no word of the question anywhere: nothing to point at
        best = np.argsort(-lexical, kind="stable")[:k]
        return [candidates[i] for i in best]
    shortlist = np.argsort(-lexical, kind="stable")[:MAX_DENSE_LINES]
    dense = embedder.embed([candidates[i][1] for i in shortlist]) @ embedder.embed_query(question)
    score = _scaled(dense) + LEXICAL_WEIGHT * _scaled(lexical[shortlist])
    best = np.argsort(-score, kind="stable")[:k]
    return [candidates[shortlist[i]] for i in best]


def _scaled(scores: np.ndarray) -> np.ndarray:
    """Scores to [0, 1] over the candidates; all equal: all 1 (no ranking says more)."""
    low, high = float(scores.min()), float(scores.max())
    return (scores - low) / (high - low) if high > low else np.ones_like(scores)


def block(lines: Sequence[tuple[int, str]]) -> str:
    """The key lines as the prompt shows them, `lines` best first: one a line, ending with
    its source's label, the best last. Last, right before the question: the bundled model
    copies the figure it read most recently ("Q3 revenue was $5.83 million", Q4's, from the
    line after Q3's)."""
    return "\n".join(f"{text} [{label}]" for label, text in reversed(lines))
