"""A PDF's running heads and feet: the title, journal line or "Page 3 of 12" printed at the
top or bottom of every page.

pypdf reads them as the page's first and last lines, so every page break put a line of
furniture in the middle of the text: a sentence running on to the next page was cut by
"Annual Report 2023 - page 4", a word hyphenated across it was not joined, and each
passage retrieved spent tokens on the same line. They are taken out of every page but the
first page with text; one with letters that does not count the pages (the title, a
"PRIVILEGED" legend) is read once there, where it stands or above the page's text. A copy
kept on a later page cut a sentence there: a report's foot first printed on page 6, after
its front matter, stood between "tokeni-" and "zation". A page number among them
names the page where the PDF declares no labels of its own: a paper whose pages print 345
to 360 is cited as "p.345 (page 1 of the file)".
"""

from __future__ import annotations

import re
from collections import Counter

# Lines looked at on each edge of a page: a head is often two lines (a journal's name,
# then its volume and pages), a foot a page number under a notice, and pypdf reads some
# writers' foot right after their head (a contract's "Page 3 of 14" third from the top).
_EDGE_LINES = 3
# A running line is on at least this share of the text pages, and on 3 or more. A share
# under one half lets a book's heads alternate (its title on left pages, the chapter's on
# right pages); a line this frequent at a page's edge is not the text's own. A short
# document's share is higher: a regulation of 6 pages had a wrapped line of its own
# wording at the foot of 3.
_MIN_SHARE = 0.4
_MIN_SHARE_SHORT = 0.6
_SHORT_PAGES = 10
_MIN_PAGES = 3
_MAX_CHARS = 120  # a paragraph's line that happens to recur is longer than a page's furniture
_NUMBER = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")
_LETTER = re.compile(r"[^\W\d_]")
# A number that counts with the pages is a page number only in a line that says so: bare
# ("12", "- 12 -", "3 / 40", "3 of 40") or after a word for page. "Invoice 1001" on a
# batch of one-page invoices counts too, and is each page's own.
_PAGE_NUMBER_LINE = re.compile(
    r"^\W*#\W*$|^\W*#\s*(?:/|of|von|de|sur|di|из|z|av|af)\s*#\W*$"
    r"|(?<!\w)(?:page|pages|p|pg|pp|seite|s|página|pág|pagina|pag|strona|str|страница|стр|sida|side|sivu|oldal"
    r"|stran|strana|σελίδα|σελ)\.?\s*#|#\s*(?:頁|页|ページ|쪽)")


def _shape(line: str) -> str | None:
    """The line with its numbers as "#", spaced and cased alike, so "Page 3 of 12" and
    "page 4 of 12" are one head; None for a line no running head can be: a table's row of
    3+ cells (joined by " | "; a head's left and right ends are joined so too, as two), a
    long one, or a sentence's wrapped line."""
    text = _SPACES.sub(" ", line).strip()
    if not text or len(text) > _MAX_CHARS or text.count(" | ") > 1:
        return None
    if text.startswith(("[form field ", "[comment")):
        return None  # a form's answer or a comment (`pdftext._annotation_lines`): each page's own
    # A "#" of the line's own is not a number's: "#" (a shell prompt, a heading) on one page
    # and "13" on another were one shape, with no number on the first (an IndexError)
    shape = _NUMBER.sub("#", text.lower().replace("#", "\N{FULLWIDTH NUMBER SIGN}"))
    if text[0].islower() and " " in text and not _PAGE_NUMBER_LINE.search(shape):
        return None  # a sentence's wrapped line ("shall be accompanied by written reasons."), not a URL
    return shape


def _halves(line: str) -> list[str]:
    """A head's two ends, where the table reader joined them as one row ("CONFIDENTIAL -
    Master Services Agreement | Ref: NW-17"): on the pages it took for tables only, so the
    same head was two lines on some pages and one on others."""
    return line.split(" | ") if line.count(" | ") == 1 else []


def _header_row(lines: list[str], i: int) -> bool:
    """Whether line `i` is a table's header row: cells (" | ") over a row of as many. A
    table of two columns running over pages repeats its header at the top of each: read as
    a head of two ends, "Vessel | Tonnage" went from every page and stood once above the
    report's title."""
    cells = lines[i].count(" | ")
    below = next((line for line in lines[i + 1:] if line.strip()), "")
    return cells > 0 and below.count(" | ") == cells


def _edges(lines: list[str]) -> list[tuple[str, int]]:
    """("top" or "bottom", the index of the line) for up to `_EDGE_LINES` text lines at
    each edge, outermost first; a short page's line is at its top only."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    top = filled[:_EDGE_LINES]
    bottom = [i for i in reversed(filled[-_EDGE_LINES:]) if i not in top]
    return [("top", i) for i in top] + [("bottom", i) for i in bottom]


class _Head:
    """The lines of one shape at one edge, page by page; its pages are those whose numbers
    follow the shape's rule: each number either the same on every page (a year, a volume)
    or, in a line that reads as a page number (`_PAGE_NUMBER_LINE`), the page's index plus
    the same offset. A line of the text whose figures change from page to page ("Net pay:
    2,810.00", "Invoice 1001") is on none."""

    def __init__(self, shape: str) -> None:
        self.may_count = _PAGE_NUMBER_LINE.search(shape) is not None
        self.numbers: dict[int, tuple[int, ...]] = {}  # page index (1-based) -> the line's numbers
        self.counts = False  # one of its numbers counts the pages (`pages` decides)

    def pages(self) -> dict[int, int | None]:
        """Its pages, each with the number it prints for itself (None where it prints none)."""
        if not self.numbers:
            return {}
        width = len(next(iter(self.numbers.values())))
        rules: list[tuple[bool, int]] = []  # per place: (counts with the page?, its value or offset)
        for place in range(width):
            same = Counter(values[place] for values in self.numbers.values()).most_common(1)[0]
            step = Counter(values[place] - index for index, values in self.numbers.items()).most_common(1)[0]
            rules.append((True, step[0]) if self.may_count and step[1] > same[1] else (False, same[0]))
        self.counts = any(counts for counts, _ in rules)
        out: dict[int, int | None] = {}
        for index, values in self.numbers.items():
            if all(v - index == k if counts else v == k for v, (counts, k) in zip(values, rules)):
                out[index] = next((v for v, (counts, _) in zip(values, rules) if counts), None)
        return out


def strip_running_lines(texts: list[str]) -> tuple[list[str], list[str | None]]:
    """The pages' texts without their running heads and feet, and the printed page number
    each page's heads or feet give where it is not the page's own number (else None).

    A line is running where its shape (`_shape`) stands at the same edge of enough of the
    pages with text (`_MIN_SHARE`, `_MIN_SHARE_SHORT`), and 3 of them, with numbers that
    keep to its rule (`_Head`); only the outermost lines of an edge go, up to the first
    that is the page's own. One that counts the pages ("Page 3 of 14") goes everywhere.
    One that does not, with letters (a title, "PRIVILEGED & CONFIDENTIAL"), is read once:
    where it stands on the first page with text, or above that page's text where it does
    not stand there (a cover without the legend lost it from the whole text)."""
    pages = [t.split("\n") for t in texts]
    n_text_pages = sum(1 for t in texts if t.strip())
    if n_text_pages < _MIN_PAGES:
        return texts, [None] * len(texts)
    heads: dict[tuple[str, str], _Head] = {}
    for index, lines in enumerate(pages, start=1):
        for edge, i in _edges(lines):
            for line in (lines[i], *_halves(lines[i])):
                shape = _shape(line)
                if shape is not None:
                    head = heads.setdefault((edge, shape), _Head(shape))
                    head.numbers.setdefault(index, tuple(int(n) for n in _NUMBER.findall(line)))
    share = _MIN_SHARE_SHORT if n_text_pages < _SHORT_PAGES else _MIN_SHARE
    needed = max(_MIN_PAGES, share * n_text_pages)
    running = {key: on for key, head in heads.items() if len(on := head.pages()) >= needed}
    numbered = _numbered_heads(pages, needed)
    if not running and not numbered:
        return texts, [None] * len(texts)
    first = next(i for i, t in enumerate(texts, start=1) if t.strip())
    furniture = _furniture(pages, running, heads)
    # A line that does not count the pages goes only from a text that runs on from page to
    # page (a report, a contract, a paper): in a batch of invoices, forms or slides each
    # page is its own, and its "Payment terms: Net 30 days", a form's answer or a slide's
    # title, the same on many pages, are each page's text. So do heads that end in the
    # page's number under a title that changes ("Chapter 4: Function reference 9"): a
    # payslip's "Pay period: month 3" counts with its pages too.
    runs_on = _runs_on(pages, furniture)
    if not runs_on:
        numbered = {}
    if numbered:
        for key, on in numbered.items():
            running[key] = {**running.get(key, {}), **on}
            heads[key].counts = True
        furniture = _furniture(pages, running, heads)
    if not running:
        return texts, [None] * len(texts)
    kept: dict[tuple[str, str], str] = {}  # the lines read once, by key: the first copy of each
    out: list[str] = []
    for index, (lines, found) in enumerate(zip(pages, furniture), start=1):
        drop: set[int] = set()
        cut: dict[int, str] = {}  # a head of two ends kept without its page number
        for i, parts, once, texts_of in found:
            if once and runs_on:
                for part, text in zip(parts, texts_of):
                    if part in once:
                        kept.setdefault(part, text.strip())
            if not once or (runs_on and index != first):
                drop.add(i)
            elif any(heads[part].counts for part in parts):
                # "Confidential | 4": the table reader joined a foot to its page number; the
                # number goes as it does where the two are lines of their own
                cut[i] = " | ".join(text.strip() for part, text in zip(parts, texts_of) if not heads[part].counts)
        out.append(_trimmed([cut.get(i, line) for i, line in enumerate(lines) if i not in drop])
                   if drop or cut else texts[index - 1])
    on_first = {key for key, on in running.items() if first in on}
    missing = [line for key, line in kept.items() if key not in on_first]
    if missing:
        out[first - 1] = "\n".join(missing + [out[first - 1]])
    # a numbered head's pages, whatever its chapter's title: the numbers of all of them
    families = {(edge, "numbered"): {i: n for key, on in numbered.items() if key[0] == edge for i, n in on.items()}
                for edge in {key[0] for key in numbered}}
    return out, _page_numbers({**running, **families}, len(texts))


_Furniture = list[tuple[int, list[tuple[str, str]], list[tuple[str, str]], list[str]]]


def _furniture(pages: list[list[str]], running: dict[tuple[str, str], dict[int, int | None]],
               heads: dict[tuple[str, str], _Head]) -> list[_Furniture]:
    """Each page's furniture: (its line, the line's running keys, those read once, their
    texts), walking each edge from the outside in up to the page's own text."""
    furniture: list[_Furniture] = []
    for index, lines in enumerate(pages, start=1):
        found: _Furniture = []
        ended: set[str] = set()  # edges where the page's own text began
        for where, i in _edges(lines):  # (each edge's lines, outermost first)
            if where in ended:
                continue
            key = (where, _shape(lines[i]) or "")
            whole = index in running.get(key, ())
            parts = [key] if whole else [(where, _shape(h) or "") for h in _halves(lines[i])]
            if not parts or any(index not in running.get(part, ()) for part in parts) \
                    or (where == "top" and _header_row(lines, i)):
                ended.add(where)  # the page's own text: nothing past it is furniture
                continue
            texts_of = [lines[i]] if whole else _halves(lines[i])
            once = [part for part in parts if not heads[part].counts and _LETTER.search(part[1])]
            found.append((i, parts, once, texts_of))
        furniture.append(found)
    return furniture


# A head that ends in its page's number: the number after a title of 2 or more words (or
# a section's number and title: "2.1. TIDES 13"). One word before it is a heading or a
# record's own ("Step 3", "Section 3", "Invoice 1001").
_ENDS_IN_NUMBER = re.compile(r"^(.*\S)\s+(\d+)\W*$")
# A head that starts with it, a book's left page ("12 CHAPTER 2. LANTERNS"), stands on 2
# pages at least: a numbered heading ("3 Results" atop page 3) on one.
_STARTS_WITH_NUMBER = re.compile(r"^(\d+)\s+(\S.*)$")
_YEARS = (1800, 2100)  # a number among them is a year, not a page's


def _page_number_at_an_end(text: str) -> tuple[int, bool] | None:
    """The number a head may end with (`_ENDS_IN_NUMBER`), start with (`_STARTS_WITH_NUMBER`)
    or be, and whether it starts it; None where there is none, or it is a year ("Harbor
    traffic in 2021" atop a page a year is a heading; "5 Annual Report 2023" a head that
    starts with its page's number)."""
    if text.isdigit():
        return int(text), False
    if (m := _ENDS_IN_NUMBER.match(text)) and len(m[1].split()) >= 2 and _LETTER.search(m[1]) \
            and not _YEARS[0] <= int(m[2]) <= _YEARS[1]:
        return int(m[2]), False
    if (m := _STARTS_WITH_NUMBER.match(text)) and _LETTER.search(m[2]) and not _YEARS[0] <= int(m[1]) <= _YEARS[1]:
        return int(m[1]), True
    return None


def _numbered_heads(pages: list[list[str]], needed: float) -> dict[tuple[str, str], dict[int, int | None]]:
    """Heads whose title changes from chapter to chapter, each ending in the page's number:
    a GNU manual's "Chapter 2: Utilities 6" and "Chapter 4: Function reference 9" are
    shapes of their own, each on too few pages, and no page word says the number counts;
    a LaTeX book's "12 CHAPTER 2. LANTERNS" and "2.1. TIDES 13" the same. By shape, the
    pages where such a line (or a bare page number) stands at an edge and its number is
    the page's index plus the offset that most pages at that edge share, where those are
    `needed` pages or more."""
    lines_at: dict[tuple[str, int], dict[tuple[str, str], dict[int, int | None]]] = {}
    leading: set[tuple[str, str]] = set()  # shapes whose number starts them
    for index, lines in enumerate(pages, start=1):
        seen: set[str] = set()  # one such line an edge, the outermost: "... in section 12" under it is text
        for edge, i in _edges(lines):
            shape = _shape(lines[i])
            if shape is None or edge in seen:
                continue
            found = _page_number_at_an_end(lines[i].strip())
            if found is None:
                continue
            number, starts = found
            if starts:
                leading.add((edge, shape))
            seen.add(edge)
            lines_at.setdefault((edge, number - index), {}).setdefault((edge, shape), {})[index] = number
    out: dict[tuple[str, str], dict[int, int | None]] = {}
    for edge in ("top", "bottom"):
        families = [{key: on for key, on in shapes.items() if key not in leading or len(on) >= 2}
                    for (where, _), shapes in lines_at.items() if where == edge]
        families = [shapes for shapes in families if shapes]
        if not families:
            continue
        best = max(families, key=lambda shapes: len(set().union(*(on.keys() for on in shapes.values()))))
        if len(set().union(*(on.keys() for on in best.values()))) >= needed:
            out.update(best)
    return out


# A page break inside a sentence: the page's text ends in a hyphen or a comma, or in a
# word on a long (wrapped prose) line, or the next page's starts in lower case. Not a short
# line without a full stop: a slide's bullet, an invoice's total, a form's field.
# Of the page breaks, at least this share and 2 fall inside a sentence: a contract's 3 of
# 19, a 60-page report's 7 of 60, a paper's 3 of 7; invoices, forms, slides and the sample
# annual report (a page a section) none.
_RUNS_ON_SHARE = 0.1
_RUNS_ON_MIN = 2
_PROSE_LINE_CHARS = 50
# A page of prose holds this many long lines at least (the median page), and half the
# lines are long. Long lines, not lines: a report of a section a page (the sample annual
# report with a head at its top) has pages of 6 to 14 lines, its median 10, and kept its
# head on every page; an invoice's, form's or slide's page has none. A long line is a
# column's: a newsletter in two columns (lines of 39 to 50 characters) kept its head.
_PROSE_PAGE_LONG_LINES = 5
_PROSE_PAGE_LINE_CHARS = 40
_PROSE_SHARE = 0.5
_ENDS_IN_A_WORD = re.compile(r"[^\W\d_]$")


def _runs_on(pages: list[list[str]], furniture: list[list]) -> bool:
    """Whether the text runs on from page to page: its pages are prose, or enough of its
    page breaks, furniture left aside, fall inside a sentence (`_RUNS_ON_SHARE`, `_RUNS_ON_MIN`)."""
    bodies = []
    for lines, found in zip(pages, furniture):
        gone = {i for i, *_ in found}
        body = [line.strip() for i, line in enumerate(lines) if i not in gone and line.strip()]
        if body:
            bodies.append(body)
    breaks = list(zip(bodies, bodies[1:]))
    if not breaks:
        return False
    # pages of prose, whether or not they end mid-sentence: a report whose every page ends
    # a paragraph kept its head on every page. A record's page (an invoice, a form, a
    # slide) is a few short lines.
    lines = [line for body in bodies for line in body]
    long_lines = sorted(sum(len(line) >= _PROSE_PAGE_LINE_CHARS for line in body) for body in bodies)
    if long_lines[len(long_lines) // 2] >= _PROSE_PAGE_LONG_LINES and \
            sum(len(line) >= _PROSE_PAGE_LINE_CHARS for line in lines) >= _PROSE_SHARE * len(lines):
        return True
    inside = sum(1 for before, after in breaks
                 if before[-1].endswith(("-", ",")) or after[0][0].islower()
                 or (len(before[-1]) >= _PROSE_LINE_CHARS and _ENDS_IN_A_WORD.search(before[-1])))
    return inside >= max(_RUNS_ON_MIN, _RUNS_ON_SHARE * len(breaks))


def _trimmed(lines: list[str]) -> str:
    """The page's lines without the blank ones a dropped head or foot leaves at its edges."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return "\n".join(lines)


def _page_numbers(running: dict[tuple[str, str], dict[int, int | None]], n_pages: int) -> list[str | None]:
    """Each page's printed number from the running line that prints one on the most pages;
    None everywhere where its numbers are the pages' own."""
    labels: list[str | None] = [None] * n_pages
    counted = max(({i: n for i, n in on.items() if n is not None} for on in running.values()), key=len)
    if len(counted) < _MIN_PAGES:
        return labels
    offset = next(n - i for i, n in counted.items())
    if offset == 0:
        return labels
    first, last = min(counted), max(counted)
    # pages between two that print their numbers count on (a chapter's opening page often
    # prints none); pages before the first printed number or after the last keep their own
    for index in range(first, last + 1):
        if index + offset >= 1:
            labels[index - 1] = str(index + offset)
    return labels
