"""Where a PDF's sections start: on which line of which page.

A PDF's text does not mark its headings, and a page often holds several sections (a
paper's page 3 opens in 3.2, holds 3.2.1 and 3.3, and ends in 4.1). Giving a whole page the
trail of its last bookmark put every chunk of that page under "4.1 Datasets", so "what does
section 3.2 say?" found the sentence citing "Section 3.2" and not the section. Here:

- a bookmark (the PDF's outline) starts at the line of its page that carries its title;
  where no line does, at the top of the page (after the bookmark placed before it there);
- a PDF without bookmarks: numbered headings ("3.2 Data Augmentation"), taken only as a
  chain whose numbers follow one another (3.1 -> 3.2 -> 3.2.1 -> 4), so that a stray line
  that starts with a number is not a section; and the unnumbered ones every paper has
  (Abstract, References, Acknowledgements, Appendix).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ktcli.types import SECTION_SEPARATOR

# The deepest trail kept (as `sections.MAX_DEPTH`).
_MAX_DEPTH = 4
_MAX_TITLE_CHARS = 80
_MAX_TITLE_WORDS = 12
# Fewer numbered headings than this in a chain is no outline: a list, or chance.
_MIN_CHAIN = 3
_NUMBERED = re.compile(r"\s*(?P<number>\d{1,2}(?:\.\d{1,2}){0,3})\.?\s+(?P<title>[^\W\d_].*?)\s*$")
_UNNUMBERED = re.compile(r"\s*(?:abstract|references|bibliography|acknowledge?ments?|appendix(?:\s+[A-Z])?"
                         r"(?:\s*[:.\u2013\u2014-]?\s+\S.*)?)\s*$", re.IGNORECASE)
_NUMBER_LEAD = re.compile(r"^\s*(?:\d{1,2}(?:\.\d{1,2}){0,3}|[A-Z](?:\.\d{1,2}){0,3})\.?\s+")
_NOT_TITLE_END = tuple(".,;:")


class PageSections(NamedTuple):
    """A page's section trail at its first line, and the trail of each heading on it
    (its line in the page, 0-based)."""

    start: str
    headings: tuple[tuple[int, str], ...] = ()


def place_bookmarks(texts: list[str], starts: list[tuple[int, tuple[str, ...]]]) -> list[PageSections]:
    """The pages' sections from bookmarks: `starts` is (page index, trail) per bookmark in
    the order they start (the trail's last title is the bookmark's own)."""
    by_page: dict[int, list[tuple[str, ...]]] = {}
    for page, trail in starts:
        by_page.setdefault(page, []).append(trail)
    out: list[PageSections] = []
    trail = ""
    for index, text in enumerate(texts):
        start = trail
        lines = text.split("\n")
        headings: list[tuple[int, str]] = []
        at = 0  # a title is looked for below the one placed before it
        for marks in by_page.get(index, ()):
            found = next((k for k in range(at, len(lines)) if _is_title(lines[k], marks[-1])), None)
            trail = SECTION_SEPARATOR.join(marks)
            if found is not None:
                headings.append((found, trail))
                at = found + 1
            elif not headings:
                start = trail  # where it stands is not known: from the page's top, as before
            # (else: somewhere below the heading placed before it; the next page starts under it)
        out.append(PageSections(start, tuple(headings)))
    return out


def _is_title(line: str, title: str) -> bool:
    """Whether `line` carries the heading `title`: the same words (numbers before them
    aside, which a bookmark or the heading may leave out), or the first line of a title
    that wraps."""
    words, wanted = _words(_NUMBER_LEAD.sub("", line)), _words(_NUMBER_LEAD.sub("", title))
    if not words or not wanted:
        return False
    if words == wanted:
        return True
    return len(words) >= 3 and len(words) < len(wanted) and wanted[:len(words)] == words  # wrapped


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def numbered_headings(texts: list[str]) -> list[PageSections]:
    """The pages' sections from headings found in their text (a PDF without bookmarks);
    empty trails where it has no chain of numbered headings."""
    candidates: list[tuple[int, int, tuple[int, ...], str]] = []  # (page, line, number, title)
    keywords: list[tuple[int, int, str]] = []
    for page, text in enumerate(texts):
        for k, line in enumerate(text.split("\n")):
            if len(line) > _MAX_TITLE_CHARS + 12 or " | " in line:
                continue
            m = _NUMBERED.fullmatch(line)
            if m and _title_like(m["title"]):
                candidates.append((page, k, tuple(int(n) for n in m["number"].split(".")), line.strip()))
            elif _UNNUMBERED.fullmatch(line) and _title_like(line.strip()):
                keywords.append((page, k, line.strip()))
    chain = _longest_chain([c[2] for c in candidates])
    if len(chain) < _MIN_CHAIN:
        return [PageSections("") for _ in texts]
    marks = sorted([(candidates[i][0], candidates[i][1], len(candidates[i][2]), candidates[i][3]) for i in chain]
                   + [(page, k, 1, title) for page, k, title in keywords])
    headings: dict[int, list[tuple[int, str]]] = {}
    stack: list[tuple[int, str]] = []
    for page, k, level, title in marks:
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        headings.setdefault(page, []).append((k, SECTION_SEPARATOR.join(t for _, t in stack[-_MAX_DEPTH:])))
    out: list[PageSections] = []
    trail = ""
    for page in range(len(texts)):
        mine = headings.get(page, [])
        out.append(PageSections(trail, tuple(mine)))
        trail = mine[-1][1] if mine else trail
    return out


def _title_like(title: str) -> bool:
    """A heading's words: short, no sentence's end, and (in a script with capitals) a capital first."""
    words = title.split()
    return (0 < len(words) <= _MAX_TITLE_WORDS and len(title) <= _MAX_TITLE_CHARS
            and not title.endswith(_NOT_TITLE_END) and not title[0].islower())


def _follows(before: tuple[int, ...], number: tuple[int, ...]) -> bool:
    """Whether a heading numbered `number` can come right after one numbered `before`:
    its first subsection (3.2 -> 3.2.1), or the next one at its level or above it
    (3.2.1 -> 3.2.2, 3.3 or 4)."""
    if number == before + (1,):
        return True
    return any(number == before[:k] + (before[k] + 1,) for k in range(len(before)))


def _longest_chain(numbers: list[tuple[int, ...]]) -> list[int]:
    """Indexes of the longest run of `numbers`, in order, each following the one before it
    (`_follows`), starting at a first section (1, or 1.1) or anywhere a chain may resume
    (an excerpt): dynamic programming over the candidates, few per document."""
    best: list[int] = [1] * len(numbers)
    back: list[int] = [-1] * len(numbers)
    for j, number in enumerate(numbers):
        for i in range(j):
            if best[i] + 1 > best[j] and _follows(numbers[i], number):
                best[j], back[j] = best[i] + 1, i
    if not numbers:
        return []
    end = max(range(len(numbers)), key=lambda j: (best[j], -j))
    chain = []
    while end >= 0:
        chain.append(end)
        end = back[end]
    return chain[::-1]
