"""Sections a question names by number: "What does section 3.2 say?", "clause 7.3",
"Article 12", "§ 4".

Neither ranking finds them: BM25 matched "Section 3.2" where another section cites it
("...the silver data of Section 3.2"), and the embedder reads "3.2" as noise; the chunk
under the heading "3.2 Data Augmentation" ranked 18th. A chunk is in a named section where
its trail's innermost numbered heading is that number or under it (3.2.1 is in 3.2), or
where the heading itself starts on a line of its first half; those chunks get
`retriever.SECTION_BONUS`, and the rankings order them among themselves.
"""

from __future__ import annotations

import re
from typing import Sequence

from ktcli.types import SECTION_SEPARATOR, TABLE_TRAIL, Chunk

_KINDS = r"(?:(?:sub)?sections?|sec\.|§§?|clauses?|articles?|art\.|chapters?|ch\.|parts?|appendix|appendices|schedules?|annex(?:es)?|exhibits?|paragraphs?|para\.)"
_NUMBER = r"(?:\d{1,3}(?:\.\d{1,3}){0,4}|[A-Z](?:\.\d{1,3}){0,3}|[IVXLC]{1,6})"
# in a question: a kind of section, then its number ("section 3.2", "clause 4.2(b)", "Art. 12")
# (the kind in any case; a letter or roman number in capitals: "in this section I show")
_NAMED = re.compile(rf"(?<![\w.])((?i:{_KINDS}))\s*({_NUMBER})(?:\([a-z0-9]{{1,4}}\))?(?![\w])")
# Kinds numbered apart from the clauses: "Schedule 2" is not clause 2 (a question about
# clause 2 was given the chunks of Schedule 2). Their numbers carry their kind ("schedule:2").
_APART = ("schedule", "annex", "appendi", "exhibit")


def _kind(words: str | None) -> str:
    """The prefix a number of this kind carries: "schedule:" for a schedule's, "" for a
    clause's, section's or article's."""
    low = (words or "").strip().lower()
    family = next((k for k in _APART if low.startswith(k)), "")
    return f"{family}:" if family else ""
# in a trail or a line of text: its number first, after a kind of section or not
_LEADING = re.compile(rf"\s*(?P<kind>(?i:{_KINDS})\s*)?(?P<number>{_NUMBER})(?:[.):]?\s+(?P<rest>\S.*)|[.):]?\s*)$")
_DOTTED = re.compile(r"\d+(?:\.\d+)+")
_MAX_HEADING_CHARS = 80


def named_sections(query: str) -> set[str]:
    """The section numbers the query names ("3.2", "12", "IV", "A"). "I" before a word
    in lower case is the pronoun ("in this section I show")."""
    return {_kind(m.group(1)) + m.group(2) for m in _NAMED.finditer(query)
            if not (m.group(2) in ("I", "A") and re.match(r"\s+[a-z]", query[m.end():]))}


def _number(title: str) -> str | None:
    """A heading's number: "3.2 Data Augmentation", "Article 12 Termination", "Appendix B".
    The trail's titles are headings already (`ingest.sections`, `pdf_headings`)."""
    m = _LEADING.match(title)
    return _kind(m["kind"]) + m["number"].upper().rstrip(".") if m else None


def _line_number(line: str) -> str | None:
    """The number of the section a line of text opens: after a kind of section ("Clause
    7.3 ..."), a dotted number ("7.3 Either party may..."; a contract's clause is its
    numbered paragraph), or a plain one on a heading's short line ("2 Related Work"). A
    letter or a roman number alone is not one ("A Study of Tides", "I think")."""
    m = _LEADING.match(line)
    if m is None or " | " in line:  # (a table's row)
        return None
    number = _kind(m["kind"]) + m["number"].upper().rstrip(".")
    titled = m["rest"] is not None and (m["rest"][0].isupper() or m["rest"][0] in "(:\u2013\u2014-")
    if m["kind"] and (m["rest"] is None or titled):
        return number  # ("Clause 9 Notices", "Appendix B"; a wrapped "section 2.2 shows." is prose)
    if _DOTTED.fullmatch(number) and titled:
        return number  # ("1.5 million people" is a figure)
    if m["rest"] and number.isdigit() and len(line) <= _MAX_HEADING_CHARS and m["rest"][0].isupper() \
            and not line.rstrip().endswith((".", ",", ";", ":")):
        return number
    return None


def _within(number: str, wanted: str) -> bool:
    return number == wanted or number.startswith(wanted + ".")


class SectionTable:
    """For each chunk, the numbers of the sections it is in or opens: read on the first
    question that names one, as `symbols.SymbolTable` reads definitions (every index load
    paid ~13 us a chunk, half a second for a 40K-chunk repo, asked about a section or not)."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self._chunks = chunks
        self._numbers: list[tuple[str, ...]] | None = None

    @staticmethod
    def _of(chunk: Chunk) -> tuple[str, ...]:
        numbers: list[str] = []
        titles = [t for t in chunk.section.split(SECTION_SEPARATOR) if t and not t.startswith(TABLE_TRAIL)]
        for title in reversed(titles):  # the innermost numbered one
            number = _number(title)
            if number is not None:
                numbers.append(number)
                break
        lines = chunk.text.split("\n")
        # a heading in its first half: the chunk is mostly that section's (one that ends
        # with the next section's heading is the section before's)
        numbers += [n for n in map(_line_number, lines[:max(1, (len(lines) + 1) // 2)]) if n is not None]
        return tuple(numbers)

    def naming(self, wanted: set[str]) -> set[int]:
        """Indexes of the chunks in (or opening) a section numbered as in `wanted`."""
        if not wanted:
            return set()
        if self._numbers is None:
            self._numbers = [self._of(c) for c in self._chunks]
        return {i for i, numbers in enumerate(self._numbers)
                if any(_within(n, w) for n in numbers for w in wanted)}
