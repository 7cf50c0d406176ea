"""The visible text of an HTML page, with BeautifulSoup: each block starts a line, and
running text keeps the markup's own line breaks (a paragraph wrapped over lines 16-24 of
the file is lines of text from 16 to 24), so a citation names the lines its words are on.
Table rows and headings stay one line each."""

from __future__ import annotations

import re
import sys
import warnings

from bs4 import BeautifulSoup, NavigableString, Tag, XMLParsedAsHTMLWarning
from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

# Never visible (or not page content).
_DROP = frozenset({"head", "title", "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "math"})
# Ends a paragraph: a blank line after it gives the chunker a natural break.
_PARAGRAPH = frozenset(
    {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "ul", "ol", "dl",
     "section", "article", "header", "footer", "nav", "main", "aside", "figure", "form", "address", "hr"}
)
# Ends a line.
_LINE = frozenset({"div", "li", "tr", "dt", "dd", "figcaption", "caption", "br", "option", "summary", "details", "fieldset", "legend", "body", "html"})
_CELL = frozenset({"td", "th"})
# Blocks read as one line whatever the markup's wrapping (a row's cells join there too).
_ONE_LINE = frozenset({"h1", "h2", "h3", "h4", "h5", "h6", "tr", "dt", "caption", "summary", "legend", "option"})
_SKIP_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_SPACES = re.compile(r"\s+")


class _Lines:
    """Collects inline text into lines; blocks call newline()/paragraph(). Each line keeps
    the source line its first visible character came from (`sources`)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sources: list[int] = []
        self.current: list[str] = []
        self.current_source = 0
        self.pending_blank = False

    def text(self, piece: str, source: int) -> None:
        if piece:
            if not self.has_text():
                self.current_source = source
            self.current.append(piece)

    def has_text(self) -> bool:
        return bool("".join(self.current).strip())

    def newline(self) -> None:
        # Spaces collapse across inline tags as a browser shows them ("a <b> b</b>": "a b").
        line = _SPACES.sub(" ", "".join(self.current)).strip()
        self.current = []
        if not line:
            return
        self._blank_if_pending(self.current_source)
        self.lines.append(line)
        self.sources.append(self.current_source)

    def paragraph(self) -> None:
        self.newline()
        self.pending_blank = True

    def raw_lines(self, text: str, first_source: int) -> None:
        """Preformatted text keeps its own line breaks and indentation."""
        self.newline()
        leading = len(text) - len(text.lstrip("\n"))
        self._blank_if_pending(first_source + leading)
        lines = text.strip("\n").split("\n")
        self.lines.extend(lines)
        self.sources.extend(first_source + leading + i for i in range(len(lines)))

    def _blank_if_pending(self, source: int) -> None:
        if self.pending_blank and self.lines:
            self.lines.append("")
            self.sources.append(source)
        self.pending_blank = False


_MAX_NESTING = 50_000


def html_to_text(markup: str) -> tuple[str, tuple[int, ...]]:
    """The page's visible text, and for each of its lines the markup's line (1-based) it
    starts on, so that citations name lines of the file the user has."""
    with warnings.catch_warnings():
        # XHTML (an XML prolog) is read as HTML on purpose: its visible text is the same,
        # and bs4's multi-line advice reached the user's terminal.
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(markup, "html.parser")
    out = _Lines()
    # The walk recurses once per level of nesting: old markup that never closes its
    # <font> tags nests one level per line (1,500 lines passed Python's limit of 1,000).
    # Python frames cost no C stack here (3.11+), so the limit is lifted for the walk.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _MAX_NESTING))
    try:
        _walk(soup, out, _Cursor())
    except RecursionError:
        raise ValueError(f"HTML nested more than {_MAX_NESTING:,} levels deep") from None
    finally:
        sys.setrecursionlimit(limit)
    out.newline()
    lines, sources = out.lines, out.sources
    # The <title> names the page (often more than its first heading); <head> is dropped as
    # not page content, so it is put first, on the line the markup has it.
    title = soup.find("title")
    name = _SPACES.sub(" ", title.get_text()).strip() if title is not None else ""
    if name and not (lines and name.lower() == lines[0].lstrip("# ").lower()):
        lines, sources = [f"Title: {name}", "", *lines], [title.sourceline or 1] * 2 + sources
    return "\n".join(lines), tuple(sources)


class _Cursor:
    """The markup line the walk is on. Tags know the line they start on (html.parser's
    sourceline); a text node starts where the node before it ended, so the cursor moves on
    by the line breaks of every text it passes, and of every subtree it skips."""

    def __init__(self) -> None:
        self.line = 1

    def at_tag(self, tag: Tag) -> None:
        if tag.sourceline is not None:
            self.line = tag.sourceline

    def past(self, text: str) -> int:
        """The line `text` (the node at the cursor) shows its first character on; moves
        the cursor to its end."""
        start = self.line + text[: len(text) - len(text.lstrip())].count("\n")
        self.line += text.count("\n")
        return start


def _walk(node: Tag, out: _Lines, cursor: _Cursor, one_line: bool = False) -> None:
    """`one_line`: inside a table cell or heading, where the markup's line breaks are
    only layout (a row's cells are one line of text)."""
    for child in node.children:
        if isinstance(child, NavigableString):
            start = cursor.line
            line = cursor.past(str(child))
            if isinstance(child, _SKIP_STRINGS):
                continue
            if one_line:
                out.text(_SPACES.sub(" ", str(child)), line)
                continue
            for k, part in enumerate(str(child).split("\n")):
                if k:
                    out.newline()
                out.text(_SPACES.sub(" ", part), start + k)
            continue
        if not isinstance(child, Tag):
            continue
        cursor.at_tag(child)
        name = (child.name or "").lower()
        if name in _DROP or _hidden(child):
            cursor.past(str(child))  # its line breaks still count
            continue
        if name == "pre":
            text = child.get_text()
            out.raw_lines(text, cursor.line)
            cursor.past(str(child))
            out.paragraph()
        elif name == "br":
            out.newline()
        elif name == "img":
            alt = _SPACES.sub(" ", str(child.get("alt") or "")).strip()
            if alt:  # what the page says an image shows: text a reader gets too
                out.text(f"[image: {alt}]", cursor.line)
        elif name in _CELL:
            out.text(" | " if out.has_text() else "", cursor.line)
            _walk(child, out, cursor, one_line=True)
        elif name in _PARAGRAPH or name in _LINE:
            out.newline()
            _prefix(name, child, out, cursor.line)
            _walk(child, out, cursor, one_line=one_line or name in _ONE_LINE)
            out.paragraph() if name in _PARAGRAPH else out.newline()
        else:
            _walk(child, out, cursor, one_line)


def _prefix(name: str, tag: Tag, out: _Lines, line: int) -> None:
    """Markdown-like markers keep headings and list items recognisable to the chunker."""
    if len(name) == 2 and name[0] == "h" and name[1].isdigit():
        out.text("#" * int(name[1]) + " ", line)
    elif name == "li":
        out.text("- ", line)


def _hidden(tag: Tag) -> bool:
    """Marked never to show: the `hidden` attribute or an inline display:none."""
    style = str(tag.get("style") or "").replace(" ", "").lower()
    return tag.has_attr("hidden") or "display:none" in style
