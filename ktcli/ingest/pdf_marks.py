"""Footnote marks and other raised or lowered runs in a PDF page's text, read apart from
the word they touch.

pypdf reads a superscript as more characters of the word before it: "net zero by 2025²"
comes out "by 20252", a year the document never names, and "$5.87 million¹,³" as
"million1,3". A mark drawn on its own raised baseline (Word, LaTeX) fares worse: pypdf
breaks the line around it ("grew to 412" / "4" / "employees."). Here the page is read
with pypdf's visitors, which give every run of text its font size and baseline, and the
text rise (`Ts`) is followed alongside. A run of digits (or a dagger, an asterisk) set
smaller and raised, starting where a word ends (`_Pen` places the runs: a table's values
centred beside a bigger label, a chart's numbers, a sidebar's are further off), becomes "[^2]", as Word's footnote references are
read (`docx`), or "^2" after a unit or a 10 ("m^2", "10^6"). A lowered run (the 2 of
"CO₂") is glued back to its word with no mark. Anything else is left as pypdf read it.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

# What a footnote or exponent mark may hold: "2", "1,3", "12-14", "*", "†". Not letters: a
# font that builds "ä" from a raised small "a" would read "l[^a]ers".
RAISED_MARK = re.compile(r"(?:\d{1,3}(?:[,\u2013-]\d{1,3})*|[*\u2020\u2021\u00a7\u00b6]{1,3})")
_SYMBOLS = "*\u2020\u2021\u00a7\u00b6"
# An exponent's base: a 10 ("10^6"), a unit or a one- or two-letter symbol ("m^2", "cm^3", "x^2").
EXPONENT_BASE = re.compile(r"(?:^|\W)(?:10|[A-Za-z]{1,2})$")
_SMALLER = 0.85  # a mark's font is at most this fraction of its word's
_RAISED = (0.15, 0.8)  # a mark's baseline sits this far above its word's, in its word's font sizes
_LOWERED = (0.08, 0.6)
_SAME_BASELINE = 0.1  # baselines this close (in font sizes) are one line
_WORD_GAP = 0.12  # text this close after a mark (in font sizes) goes on with its word: no space between
_NEXT_TO = 0.5  # a mark starts at most this far after its word ends (in the word's font sizes) ...
_OVERLAP = 0.3  # ... or this far before (kerning, an italic's overhang, widths taken from metrics)
_TEXT_OPERATORS = (b"Tj", b"TJ", b"'", b'"')


class _Run(NamedTuple):
    """One stretch of text as pypdf hands it to its visitor: what it added to the page's
    text, its font size on the page, where it starts and ends across the page and its
    baseline's height (its text rise included)."""

    text: str
    size: float
    x: float
    end: float | None  # None where its font's widths are unknown, or it holds a line break
    y: float
    upright: bool  # neither rotated nor skewed: heights compare
    drawn_on: bool = False  # set with the run before it, starting where that one ends (`_Pen`)


class _RiseTracker:
    """The text rise (`Ts`) each run of text was drawn with. pypdf does not pass it on, and
    hands text over only when something ends the run (a font change, a move), by which time
    the rise may already be the next run's."""

    def __init__(self) -> None:
        self.rise = 0.0
        self.saved: list[float] = []
        self.last_drawn = 0.0  # the rise the latest text operator drew with
        self.before_last = 0.0
        self.drawing = False  # inside a text operator, which can end the run before it

    def before(self, operator: bytes, operands: list[Any], _cm: Any, _tm: Any) -> None:
        if operator == b"Ts" and operands:
            self.rise = _number(operands[0], self.rise)
        elif operator == b"q":
            self.saved.append(self.rise)
        elif operator == b"Q" and self.saved:
            self.rise = self.saved.pop()
        elif operator in _TEXT_OPERATORS:
            self.before_last, self.last_drawn, self.drawing = self.last_drawn, self.rise, True

    def after(self, operator: bytes, _operands: Any, _cm: Any, _tm: Any) -> None:
        if operator in _TEXT_OPERATORS:
            self.drawing = False

    def of_run_ending_now(self) -> float:
        return self.before_last if self.drawing else self.last_drawn


def page_text(page: Any) -> str:
    """`page.extract_text()`, with its footnote marks and exponents read apart (see the
    module's doc). Where the visitors' runs do not add up to the page's text (a pypdf that
    reports them otherwise), its text as pypdf read it."""
    runs: list[_Run] = []
    rises = _RiseTracker()
    pen = _Pen()

    def on_text(text: str, cm: list[float], tm: list[float], font: Any, font_size: float) -> None:
        runs.append(pen.place(text, cm, tm, font, font_size, rises.of_run_ending_now()))

    raw = page.extract_text(visitor_operand_before=rises.before, visitor_operand_after=rises.after,
                            visitor_text=on_text) or ""
    if "".join(run.text for run in runs) != raw:
        return raw
    return read_marks(runs) if any(_may_be_mark(run) for run in runs) else raw


class _Pen:
    """Where each run starts and ends across the page. pypdf hands each run the text matrix
    its line was set with, so runs drawn one after another on a line ("... by 2025", then
    the smaller "2") all start at the line's left edge: a run with the same matrix as the
    one before starts where that one ended. Its width is its characters' widths in its font
    (pypdf's font metrics; spacing operators and kerning aside: a mark is judged within
    half an em)."""

    def __init__(self) -> None:
        self.fonts: dict[int, Any] = {}  # id of a font resource -> pypdf's Font, or None
        self.matrix: tuple | None = None  # the latest run's
        self.end: float | None = None

    def place(self, text: str, cm: list[float], tm: list[float], font: Any, font_size: float, rise: float) -> _Run:
        try:
            a, b, c, d, e, f = (float(v) for v in _multiply(tm, cm))
            matrix = (*map(float, tm), *map(float, cm))
        except (TypeError, ValueError):
            return _Run(text, 0.0, 0.0, None, 0.0, False)
        size = abs(float(font_size)) * math.sqrt(abs(a * d - b * c))
        upright = abs(b) < 1e-6 and abs(c) < 1e-6 and a > 0 and d > 0
        if not text.strip():
            return _Run(text, size, e, None, f + rise * d, upright)
        drawn_on = matrix == self.matrix and self.end is not None
        start = self.end if drawn_on else e
        width = self._width(text.rstrip("\n"), font)
        end = None if width is None or "\n" in text.rstrip("\n") else start + width * abs(float(font_size)) * a
        self.matrix, self.end = matrix, end
        return _Run(text, size, start, end, f + rise * d, upright, drawn_on)

    def _width(self, text: str, font_resource: Any) -> float | None:
        """`text`'s width in ems of its font; None where pypdf cannot say."""
        key = id(font_resource)
        if key not in self.fonts:
            try:
                from pypdf.generic._font import Font  # (metrics pypdf reads for its own spacing)

                self.fonts[key] = Font.from_font_resource(font_resource) if font_resource is not None else None
            except Exception:  # noqa: BLE001 - no widths: no marks read on this font's runs
                self.fonts[key] = None
        font = self.fonts[key]
        if font is None:
            return None
        widths = font.character_widths
        default = widths.get("default", 500)
        return sum(widths.get(ch, default) for ch in text) / 1000


def _multiply(m: list[float], n: list[float]) -> tuple[float, ...]:
    """The PDF matrix product m x n of two [a b c d e f] matrices."""
    a, b, c, d, e, f = (float(v) for v in m)
    a2, b2, c2, d2, e2, f2 = (float(v) for v in n)
    return (a * a2 + b * c2, a * b2 + b * d2, c * a2 + d * c2, c * b2 + d * d2,
            e * a2 + f * c2 + e2, e * b2 + f * d2 + f2)


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _may_be_mark(run: _Run) -> bool:
    return run.upright and RAISED_MARK.fullmatch(run.text.strip()) is not None


def read_marks(runs: list[_Run]) -> str:
    """The runs' text, each mark among them read apart from its word (see the module's doc)."""
    out = ""
    word: _Run | None = None  # the latest run of text: the word a mark would follow
    resumes: _Run | None = None  # a mark ended a line that may go on after it: that line's word
    starts_note = False  # ... a footnote's own line, after its mark
    for i, run in enumerate(runs):
        text = run.text
        if resumes is not None and text.strip():
            if _same_baseline(run, resumes):  # pypdf broke the line at the mark: mend it
                text = ("" if starts_note or text[0] not in " \t" else " ") + text.lstrip(" \t")
            else:
                out += "\n"
            resumes, starts_note = None, False
        shift = _shift(run, word) if word is not None and _may_be_mark(run) and _adjacent(word, run, word.size) else 0
        if shift > 0 and _word_goes_on(runs, i, word):  # a raised mark ends a word, never starts one
            shift = 0
        if not shift and _may_be_mark(run) and out[-1:] in ("", "\n") and not _on_line_of(run, word):
            note = _following(runs, i)
            if note is not None and _shift(run, note) > 0 and _adjacent(run, note, note.size):  # a footnote's text
                out += f"[^{text.strip()}]: "
                resumes, starts_note = note, True
                continue
        broke = out.endswith("\n") and not out.endswith("\n\n")  # pypdf's break before a raised line
        head = out[:-1] if broke else out
        if shift and head[-1:].strip():
            out = head + _written(text.strip(), head, shift)
            if broke:  # pypdf broke the line at a raised mark: the line may go on after it
                resumes = word
            elif text.endswith("\n"):
                out += "\n"
            continue  # not a word itself: a mark after it still measures against the word
        out += text
        if text.strip():
            word = run if "\n" not in text.rstrip("\n") else None  # a run of lines has no one baseline
    return out + ("\n" if resumes is not None else "")


def _following(runs: list[_Run], i: int) -> _Run | None:
    return next((run for run in runs[i + 1:] if run.text.strip()), None)


def _word_goes_on(runs: list[_Run], i: int, word: _Run) -> bool:
    """Whether a letter or digit follows runs[i] on `word`'s line with no space between."""
    mark, following = runs[i], _following(runs, i)
    if following is None or not _same_baseline(following, word):
        return False
    if not following.text.lstrip(" ")[:1].isalnum():
        return False
    if following.drawn_on:  # set with the mark (`_Pen`): its spaces are the page's
        return following.text[:1].isalnum()
    # set apart: pypdf broke the line at the mark and starts the rest with a space of its
    # own, so a second one is drawn on the page; else the gap on the page says
    if len(following.text) - len(following.text.lstrip(" ")) > 1:
        return False
    return mark.end is None or following.x - mark.end < _WORD_GAP * word.size


def _adjacent(left: _Run, right: _Run, size: float) -> bool:
    """Whether `right` starts where `left` ends, within a kern or a space (a table's next
    cell, a chart's label beside its bar, a sidebar's number are further off)."""
    return left.end is not None and -_OVERLAP * size <= right.x - left.end <= _NEXT_TO * size


def _shift(mark: _Run, word: _Run) -> int:
    """1 where `mark` is set smaller and raised against `word`, -1 smaller and lowered, else 0."""
    if not (mark.upright and word.upright) or word.size <= 0 or mark.size > _SMALLER * word.size:
        return 0
    rise = (mark.y - word.y) / word.size
    if _RAISED[0] <= rise <= _RAISED[1]:
        return 1
    return -1 if _LOWERED[0] <= -rise <= _LOWERED[1] else 0


def _on_line_of(run: _Run, word: _Run | None) -> bool:
    """Whether `run` is drawn within the height of `word`'s line (raised or lowered on it)."""
    return word is not None and run.upright and -_LOWERED[1] * word.size <= run.y - word.y <= _RAISED[1] * word.size


def _same_baseline(run: _Run, word: _Run) -> bool:
    return run.upright and abs(run.y - word.y) <= _SAME_BASELINE * word.size


def _written(mark: str, before: str, shift: int) -> str:
    if shift < 0 or mark[0] in _SYMBOLS:  # a subscript, a dagger: unambiguous once glued back
        return mark
    if EXPONENT_BASE.search(before[-4:]) and re.fullmatch(r"\d{1,3}", mark):  # the tail: `before` is the page so far
        return f"^{mark}"
    return f"[^{mark}]"


_WRITTEN_MARK = re.compile(r"\[\^([^\]\s]{1,12})\]|\^(\d{1,3})")


def unmarked(line: str) -> str:
    """`line` with the marks `read_marks` wrote back as pypdf's layout mode reads them, glued
    to their word, so that the two readings of a table row can be matched."""
    return _WRITTEN_MARK.sub(lambda m: m[1] or m[2], line)
