"""A PDF page whose plain text (pypdf's reading order: the order its text was drawn) is
not the order a reader reads it, read again from pypdf's layout text, which places each
piece where it sits on the page.

Two kinds, both from a probe's PDFs:
- Two columns of prose drawn a line at a time across the page (left line, right line, ...):
  the plain text interleaved them, and the answer mixed the columns ("extended to 1992,
  when the last keeper..."). The layout shows one gap down the page between them: read the
  left column top to bottom, then the right one.
- Each word (or each character) drawn as a text object of its own: the plain text put one
  word, or one letter, on a line (four short lines cost 373 tokens, and citations and key
  lines worked on fragments). The layout has the lines whole.

Tables are left to `pdftext._rejoin_rows`, and columns that the plain text already reads one
after the other (drawn so) are left as they are.
"""

from __future__ import annotations

import difflib
import re

# A page with fewer lines than this is not judged (a title page, a caption).
_MIN_LINES = 6
# One word (or character) a line, on this share of a page's lines: drawn word by word.
_WORD_PER_LINE_SHARE = 0.6
# A column gap: this many spaces at least, at one place on this share of the lines with text.
_GAP_SPACES = 4
_GAP_SHARE = 0.8
# Each column's lines hold prose: this many characters on average.
_COLUMN_MIN_CHARS = 20
_SPACES = re.compile(r" {2,}")


# Lines this long at most (the median): a column's, not a page-wide line's (~80-100
# characters): only such pages, or pages of single words, are worth their layout text's
# extraction (~5 ms a page against the plain text's ~3).
_COLUMN_LINE_CHARS = 60


def may_be_out_of_order(plain: str) -> bool:
    """Whether `reread` could find `plain` out of order (a cheap look at its lines)."""
    lines = sorted(len(line.strip()) for line in plain.split("\n") if line.strip())
    if len(lines) < _MIN_LINES:
        return False
    return lines[len(lines) // 2] <= _COLUMN_LINE_CHARS or sum(
        len(line.split()) <= 1 for line in plain.split("\n") if line.strip()) >= _WORD_PER_LINE_SHARE * len(lines)


def reread(plain: str, layout: str) -> str | None:
    """The page's text in reading order from `layout`, where `plain` has it out of order;
    None where `plain` stands."""
    plain_lines = [line.strip() for line in plain.split("\n") if line.strip()]
    layout_lines = [line.rstrip() for line in layout.split("\n") if line.strip()]
    if len(plain_lines) < _MIN_LINES or len(layout_lines) < 2:
        return None
    if sum(len(line.split()) <= 1 for line in plain_lines) >= _WORD_PER_LINE_SHARE * len(plain_lines):
        whole = [_squeezed(line) for line in layout_lines]
        # the layout must join them (a list of single words is a list: left as it is)
        return "\n".join(whole) if len(whole) < len(plain_lines) / 2 else None
    gap = _column_gap(layout_lines)
    if gap is None:
        return None
    halves = [_halves(line, gap) for line in layout_lines]
    left = [_squeezed(a) for a, _ in halves]
    right = [_squeezed(b) for _, b in halves]
    if not _interleaved(plain_lines, left, right):
        return None
    return "\n".join([line for line in left if line] + [line for line in right if line])


def column_by_column(layout: str) -> str | None:
    """`layout`'s left column's lines (as laid out, blank ones kept) and then its right
    column's, where a gap runs down the page between two columns of prose; else None."""
    lines = layout.split("\n")
    gap = _column_gap([line.rstrip() for line in lines if line.strip()])
    if gap is None:
        return None
    halves = [_halves(line, gap) for line in lines]
    return "\n".join([a.rstrip() for a, _ in halves] + [b.rstrip() for _, b in halves])


def _halves(line: str, gap: int) -> tuple[str, str]:
    """`line` cut at the column gap, or whole on the left where a word runs across it: a
    line under both columns that ends just past the gap (a page-wide note, too short to be
    held to the gap) was cut in its last word, "volume 12." read "volume 1" and "2." went
    with the page numbers."""
    if 0 < gap < len(line) and not line[gap - 1].isspace() and not line[gap].isspace():
        return line, ""
    return line[:gap], line[gap:]


def _squeezed(text: str) -> str:
    return _SPACES.sub(" ", text.strip())


def _column_gap(lines: list[str]) -> int | None:
    """The character column of a gap of _GAP_SPACES or more spaces that runs down the page
    between two columns of prose, or None."""
    width = max(len(line) for line in lines)
    for x in range(width // 4, 3 * width // 4):
        spanning = [line for line in lines if len(line) > x + _GAP_SPACES]
        if len(spanning) < _GAP_SHARE * len(lines):
            continue
        if all(line[x:x + _GAP_SPACES] == " " * _GAP_SPACES for line in spanning):
            left = [line[:x].strip() for line in lines]
            right = [line[x:].strip() for line in lines]
            if min(_mean_chars(left), _mean_chars(right)) >= _COLUMN_MIN_CHARS:
                return x + _GAP_SPACES // 2
    return None


def _mean_chars(parts: list[str]) -> float:
    filled = [p for p in parts if p]
    return sum(map(len, filled)) / len(filled) if filled else 0.0


def _interleaved(plain: list[str], left: list[str], right: list[str]) -> bool:
    """Whether the plain text reads the two columns across, a line of each in turn: in the
    same order, lines out of place aside. A page number drawn before the text (reportlab's
    page templates, LaTeX's foot) is the plain text's first line and the layout's last:
    compared line by line in place, every line was one off and the columns stayed mixed."""
    across = [_squeezed(p) for pair in zip(left, right) for p in pair if p]
    squeezed = [_squeezed(p) for p in plain]
    matcher = difflib.SequenceMatcher(None, squeezed, across, autojunk=False)
    same = sum(block.size for block in matcher.get_matching_blocks())
    return same >= 0.8 * min(len(squeezed), len(across))
