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
from collections import Counter
from typing import NamedTuple

from ktcli.types import SECTION_MAX_DEPTH, SECTION_SEPARATOR

_MAX_TITLE_CHARS = 80
_MAX_TITLE_WORDS = 12
# Fewer numbered headings than this in a chain is no outline: a list, or chance.
_MIN_CHAIN = 3
_NUMBERED = re.compile(r"\s*(?P<number>\d{1,2}(?:\.\d{1,2}){0,3})\.?\s+(?P<title>[^\W\d_].*?)\s*$")
_UNNUMBERED = re.compile(r"\s*(?:abstract|references|bibliography|acknowledge?ments?|appendix(?:\s+[A-Z])?"
                         r"(?:\s*[:.\u2013\u2014-]?\s+\S.*)?)\s*$", re.IGNORECASE)
# A regulation's or a contract's divisions, by their kind: "Article 4 - Retention periods",
# "SCHEDULE 1", "Annex A", "Part II: Definitions" (Schedules and Annexes were filed under
# the clause before them, an Article-style regulation had no sections at all).
_KIND_HEADING = re.compile(r"\s*(?i:article|schedule|annex|exhibit|part|chapter|section)\s+(?:\d{1,3}|[A-Z]|[IVXLC]{1,6})"
                           r"(?:\s*[:.\u2013\u2014-]\s*\S.*|\s+[^\W\d_a-z]\S*.*)?\s*$")
# A number line's title with this many figures is a row of a list or a table, not a
# heading ("1 Widget A 2 10.00 20.00"; "4. Effective Date means 1 April 2024").
_MAX_TITLE_FIGURES = 1
_FIGURE = re.compile(r"\d+(?:[.,]\d+)*")
# A number that opens this many candidate lines or more numbers lines, not sections (a
# transcript's line numbers, a list's items restarting under every clause).
_MAX_REPEATS = 3
# Headings are a few lines among many: a numbered log ("1 Worker started", "2 INFO Request
# served") made every line a section.
_MAX_HEADING_SHARE = 0.3
_DENSE_CHAIN = 12  # (a short outline may be most of a short text)
_Candidate = tuple[int, int, tuple[int, ...], str]  # a numbered heading's (page, line, number, title)
_LIST_RUN = 3  # siblings on consecutive lines: "2 Method" over an empty section's "3 Results" is two
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
    candidates: list[_Candidate] = []
    keywords: list[tuple[int, int, str]] = []
    lines = 0  # with text
    for page, text in enumerate(texts):
        for k, line in enumerate(text.split("\n")):
            lines += bool(line.strip())
            if len(line) > _MAX_TITLE_CHARS + 12 or " | " in line:
                continue
            m = _NUMBERED.fullmatch(line)
            if m and _title_like(m["title"]) and len(_FIGURE.findall(m["title"])) <= _MAX_TITLE_FIGURES:
                candidates.append((page, k, tuple(int(n) for n in m["number"].split(".")), line.strip()))
            elif (_UNNUMBERED.fullmatch(line) or _KIND_HEADING.fullmatch(line)) and _title_like(line.strip()):
                keywords.append((page, k, line.strip()))
    repeats = Counter(c[2] for c in candidates)
    candidates = [c for c in candidates if repeats[c[2]] < _MAX_REPEATS]
    candidates = _without_lists(candidates)
    chain = _longest_chain([c[2] for c in candidates])
    nested = any(len(candidates[i][2]) > 1 for i in chain)
    if len(chain) < _MIN_CHAIN or (len(chain) >= _DENSE_CHAIN and len(chain) > _MAX_HEADING_SHARE * lines
                                   and not nested):
        # (a numbered log or list, where a line in three or more is "numbered"; a chain
        # with subsections, "2.1 Who is covered", is a short document's outline)
        chain = []
    if not chain and len(keywords) < _MIN_CHAIN:  # (Abstract and References alone: no outline)
        return [PageSections("") for _ in texts]
    marks = sorted([(candidates[i][0], candidates[i][1], len(candidates[i][2]), candidates[i][3]) for i in chain]
                   + [(page, k, 1, title) for page, k, title in keywords])
    headings: dict[int, list[tuple[int, str]]] = {}
    stack: list[tuple[int, str]] = []
    for page, k, level, title in marks:
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        headings.setdefault(page, []).append((k, SECTION_SEPARATOR.join(t for _, t in stack[-SECTION_MAX_DEPTH:])))
    out: list[PageSections] = []
    trail = ""
    for page in range(len(texts)):
        mine = headings.get(page, [])
        out.append(PageSections(trail, tuple(mine)))
        trail = mine[-1][1] if mine else trail
    return out


# A clause's verbs: a numbered line holding one is a sentence (a definition "2. Affiliate
# means a group company", an obligation), not a heading.
_SENTENCE_WORDS = frozenset({"means", "shall", "must", "is", "are", "was", "were", "will", "may", "has", "have"})


def _without_lists(candidates: list[_Candidate]) -> list[_Candidate]:
    """`candidates` less runs of _LIST_RUN or more siblings on lines one after another: a
    list's items, not headings. A meeting's agenda ("1. Budget review", "2. Vendor
    selection", "3. Launch timeline") labelled every line after it "3. Launch timeline"; a
    table of contents so too."""
    kept: list[_Candidate] = []
    run: list[_Candidate] = []
    for c in candidates + [(-1, -1, (), "")]:  # (the last closes the last run)
        if run and (c[0], c[1] - 1, len(c[2])) != (run[-1][0], run[-1][1], len(run[-1][2])):
            kept += run if len(run) < _LIST_RUN else []
            run = []
        run.append(c)
    return kept


def _title_like(title: str) -> bool:
    """A heading's words: short, no sentence's end or clause's verb, and (in a script with
    capitals) a capital first."""
    words = title.split()
    return (0 < len(words) <= _MAX_TITLE_WORDS and len(title) <= _MAX_TITLE_CHARS
            and not title.endswith(_NOT_TITLE_END) and not title[0].islower()
            and not any(w.lower() in _SENTENCE_WORDS for w in words))


def _longest_chain(numbers: list[tuple[int, ...]]) -> list[int]:
    """Indexes of the longest run of `numbers`, in order, each following the one before it:
    its first subsection (3.2 -> 3.2.1), or the next one at its level or above it (3.2.1 ->
    3.2.2, 3.3 or 4); any number may start a run (an excerpt). Of runs as long, the one
    through the nearer predecessor: a contract's definitions listed "2.", "3.", "4." under clause 1 came before its clauses "2. Term",
    "3. Fees", "4. Confidentiality", and the clauses are what "5. Termination" follows.
    Linear in the candidates (times their depth): a 1,000-page transcript's 25,000
    numbered lines took 86 s by comparing every pair."""
    # the best run ending at a number exactly, and at any number under a prefix (3.2 -> 3.2.x)
    exact: dict[tuple[int, ...], tuple[int, int]] = {}  # number -> (run length, index)
    under: dict[tuple[int, ...], tuple[int, int]] = {}  # prefix -> (run length, index)
    length: list[int] = []
    back: list[int] = []
    for j, number in enumerate(numbers):
        options = []
        if number[-1] == 1 and len(number) > 1 and number[:-1] in exact:
            options.append(exact[number[:-1]])  # its parent, then its first subsection
        if number[-1] > 1:
            options.append(under.get(number[:-1] + (number[-1] - 1,), (0, -1)))  # the one before it, or inside that
        best = max(options, default=(0, -1), key=lambda o: (o[0], o[1]))
        length.append(best[0] + 1)
        back.append(best[1])
        mark = (length[j], j)
        if mark[0] >= exact.get(number, (0, -1))[0]:
            exact[number] = mark
        for depth in range(1, len(number) + 1):
            if mark[0] >= under.get(number[:depth], (0, -1))[0]:
                under[number[:depth]] = mark
    if not numbers:
        return []
    end = max(range(len(numbers)), key=lambda j: (length[j], -j))
    chain = []
    while end >= 0:
        chain.append(end)
        end = back[end]
    return chain[::-1]
