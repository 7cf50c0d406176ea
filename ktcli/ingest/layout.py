"""A word processor's document (Word, OpenDocument) laid out as the text ktcli reads: one
line a paragraph, Markdown's marks where the document has structure, its pages where the
file records them, its notes after the text of their page, and the paragraph (¶) of each
line for citations where it records none.

- Headings are "# Title" ("## " a level down...), so `ingest.sections` gives each line
  its trail of headings as it does for Markdown, and the chunker starts chunks there.
- List items are "- item" ("1.2 item", "(a) item" where the document numbers them),
  indented two spaces a level; table rows one line, " | "
  between cells (a row read across lines loses which value is in which column).
- A blank line between paragraphs, as Markdown has them (the chunker likes to cut there),
  but none inside a list or a table.
- Footnotes and comments are lines of their own ("[footnote 2: ...]", "[comment by Ann on
  "the fee": ...]") right after the paragraph that refers to them, so that they are cited
  with its page, its paragraph and its section (placed after the page's text, as a PDF's
  comments are, they took the section of the page's last heading); endnotes come at the
  end, where they are printed, and the headers' and footers' texts first, once each.

Pages: Word and LibreOffice write where pages broke when they last laid the document out
(`w:lastRenderedPageBreak`, `text:soft-page-break`). Where the file holds such marks
(`paged`), every break, those and the hard ones (a page break, a section on a new page),
starts a page, and the text is cited by page like a PDF. A file written by other tools
(a converter, python-docx, pandoc) has none: its hard breaks alone would number pages
wrongly, so it is read as one text and cited by paragraph (`layout.paragraph_of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEADING, ITEM, PARA, ROW, NOTE = "heading", "item", "para", "row", "note"
HARD, RENDERED = "hard", "rendered"  # a break the author made, one the last layout made
_DEEPEST_HEADING = 6  # Markdown's; Word has 9 outline levels
_SPACES = re.compile(r" {2,}")
# What is left of a footer of page numbers once the layout's counters are left out ("Page
# of", "- -"): nothing to say.
_PAGE_FURNITURE = re.compile(r"[\W\d_]*(?:page|pg|p|seite|página|pagina)?[\W\d_]*(?:of|von|de|sur|di)?[\W\d_]*",
                             re.IGNORECASE)


def _unhyphened(text: str) -> str:
    return text.replace("\u00ad", "")


def _one_line(text: str) -> str:
    return " ".join(_unhyphened(text).split())


def escaped_hash(line: str) -> str:
    """A line of body text that starts with a hash ("# of units shipped", a table's "#"
    column) with a backslash before it, as Markdown escapes one: read as a heading, it
    became the section trail of all the text after it, and the model read it as one too."""
    return "\\" + line if _ATX_LIKE.match(line) else line


_ATX_LIKE = re.compile(r"#{1,6}(?:\s|$)")  # as Markdown reads a heading: "#include", "#1" are none


def says_something(running_text: str) -> bool:
    """Whether a header's or footer's text is more than page numbering."""
    return bool(running_text.strip()) and not _PAGE_FURNITURE.fullmatch(running_text.strip())


class LinePieces:
    """The text of one paragraph (or table cell, note, heading) as a word processor's
    elements are read (`docx._Line`, `odt._Line`): its pieces, a line break a space where
    `one_line` (a cell, a heading, a note), each piece also added to the words of every
    comment range open (`captures`: comment id -> its words so far)."""

    def __init__(self, captures: dict[str, list[str]] | None, one_line: bool = False) -> None:
        self.parts: list[str] = []
        self.captures = captures
        self.one_line = one_line

    def add(self, text: str) -> None:
        if not text:
            return
        if self.one_line:
            text = text.replace("\n", " ")
        self.parts.append(text)
        if self.captures:  # the words a comment is anchored on
            for words in self.captures.values():
                words.append(text)

    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class _Page:
    lines: list[str] = field(default_factory=list)
    paragraphs: list[int] = field(default_factory=list)  # the ¶ of each line
    has_text: bool = False


class Layout:
    """Blocks in reading order in, page texts (and each line's ¶) out."""

    def __init__(self, paged: bool) -> None:
        self.paged = paged
        self.pages = [_Page()]
        self.paragraphs = 0  # ¶ numbers given so far: every paragraph with text, a table row counting one
        self._last_kind = ""
        # A document may open on a blank page only by a hard break: a rendered one there
        # is the start of the first page.
        self._last_break = HARD
        self._front: list[str] = []  # headers and footers: before the first page's text
        self._end: list[tuple[str, int]] = []  # endnotes: at the end, where they are printed
        # While set, blocks are left out of the text (a table of contents' entries, which
        # repeat the headings with page numbers: read, a question found them and was cited
        # to their page), each still counted as a ¶ as a reader counts it, and their page
        # kept as a page with text so that the pages after it keep their numbers.
        self.leaving_out = False
        self.left_out = 0  # paragraphs left out so

    def table_row(self, cells: list[str]) -> None:
        """A table's row as one line, its cells between " | ", empty cells at its end left
        out (a row narrower than the table's widest)."""
        while cells and not cells[-1]:
            cells = cells[:-1]
        self.block(" | ".join(cells), ROW)

    def block(self, text: str, kind: str = PARA, level: int = 0, *, continued: bool = False,
              marker: bool | str = True) -> bool:
        """One paragraph (heading, list item, table row). `continued`: the rest of the
        paragraph before it, cut by a page break (its ¶ is that one's). `marker`: a list
        item's "- " (not on its second paragraph), or the number its word processor gives
        it ("1.2", "(a)") in its place. False where it holds no text."""
        # Runs of spaces are layout (a double space after a full stop, a column lined up with
        # spaces, the gap beside a picture's alt text): one, as a browser shows HTML's.
        # A soft hyphen shows only where the line wraps (LibreOffice keeps it in the text as
        # U+00AD): "co\xadoperate" is the word "cooperate", as HTML's &shy; is read.
        lines = [_SPACES.sub(" ", line).strip() for line in _unhyphened(text).replace("\r", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        while lines and not lines[0]:
            lines.pop(0)
        if not lines:
            return False
        if self.leaving_out:
            self.paragraphs += not continued
            self.left_out += not continued
            self.pages[-1].has_text = True
            return True
        if kind == HEADING and not continued:
            lines = [f"{'#' * max(1, min(level, _DEEPEST_HEADING))} {' '.join(' '.join(lines).split())}"]
        elif kind != ITEM:  # (an item's lines follow its marker or indentation)
            lines = [escaped_hash(line) for line in lines]
        else:
            indent = "  " * level
            first = "  " if continued or not marker else f"{marker} " if isinstance(marker, str) else "- "
            lines = [f"{indent}{first}{lines[0]}", *(f"{indent}  {line}" for line in lines[1:] if line)]
        page = self.pages[-1]
        if not continued:
            self.paragraphs += 1
        number = max(self.paragraphs, 1)
        together = kind == NOTE or (kind == self._last_kind and kind in (ITEM, ROW))
        if page.lines and not continued and not together:
            page.lines.append("")
            page.paragraphs.append(max(number - 1, 1))
        page.lines.extend(lines)
        page.paragraphs.extend([number] * len(lines))
        page.has_text = True
        self._last_kind = kind
        return True

    def page_break(self, kind: str) -> None:
        """A new page, where the document is `paged`. A break on a page with no text yet is
        the same boundary said twice (Word writes a rendered break after a hard one), but
        for a hard break after a hard break: a blank page the author made."""
        if not self.paged:
            return
        if not self.pages[-1].has_text and not (kind == HARD and self._last_break == HARD):
            return
        self.pages.append(_Page())
        self._last_break = kind
        self._last_kind = ""

    def note(self, line: str) -> None:
        """A footnote or comment, on the line after the paragraph it is referenced in (and
        with that paragraph's ¶)."""
        page = self.pages[-1]
        page.lines.append(_one_line(line))
        page.paragraphs.append(max(self.paragraphs, 1))
        page.has_text = True
        self._last_kind = NOTE

    def end_note(self, line: str, paragraph: int | None = None) -> None:
        """An endnote, printed at the end, with the ¶ of the paragraph that refers to it
        (`paragraph`; else the last written)."""
        self._end.append((_one_line(line), max(paragraph or self.paragraphs, 1)))

    def front_note(self, line: str) -> None:
        self._front.append(_one_line(line))

    def finish(self) -> tuple[list[str], tuple[int, ...]]:
        """(the text of each page, the ¶ of each line of them all joined by line breaks)."""
        pages = self.pages
        while len(pages) > 1 and not pages[-1].has_text:
            pages = pages[:-1]  # a break after the last words opens no page anyone sees
        first, last = pages[0], pages[-1]
        if self._end:
            blank = [""] if last.lines else []
            last.lines += blank + [line for line, _ in self._end]
            last.paragraphs += last.paragraphs[-1:] * len(blank) + [number for _, number in self._end]
        if self._front:
            blank = [""] if first.lines else []
            first.lines[:0] = self._front + blank
            first.paragraphs[:0] = [1] * (len(self._front) + len(blank))
        texts: list[str] = []
        numbers: list[int] = []
        for page in pages:
            texts.append("\n".join(page.lines))
            numbers.extend(page.paragraphs or [max(numbers[-1:] or [1])])  # an empty page is one (empty) line
        return texts, tuple(numbers)


def left_out_notes(parts: list[str], described: int, deletions: int, hidden: int) -> list[str]:
    """What a word processor's reader said it left out, in one wording for every format:
    `parts` ("3 images", "1 chart"), of which `described` were read by their alt text;
    tracked deletions and hidden text."""
    parts = [p for p in parts if p]
    out = []
    if parts:
        read = f" (the alt text of {described} read)" if described else ""
        joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        out.append(f"{joined} not read{read}")
    if deletions:
        out.append(f"tracked changes read as accepted ({count_of(deletions, 'deletion')} left out)")
    if hidden:
        out.append("hidden text left out")
    return out


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """'3 images', '1 image'; '' for none."""
    return "" if not n else f"{n:,} {noun if n == 1 else plural or noun + 's'}"
