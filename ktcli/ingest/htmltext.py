"""The visible text of an HTML page, one block per line, with BeautifulSoup."""

from __future__ import annotations

import re

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

# Never visible (or not page content).
_DROP = frozenset({"head", "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "math"})
# Ends a paragraph: a blank line after it gives the chunker a natural break.
_PARAGRAPH = frozenset(
    {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "ul", "ol", "dl",
     "section", "article", "header", "footer", "nav", "main", "aside", "figure", "form", "address", "hr"}
)
# Ends a line.
_LINE = frozenset({"div", "li", "tr", "dt", "dd", "figcaption", "caption", "br", "option", "summary", "details", "fieldset", "legend", "body", "html"})
_CELL = frozenset({"td", "th"})
_SKIP_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_SPACES = re.compile(r"\s+")


class _Lines:
    """Collects inline text into lines; blocks call newline()/paragraph()."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.current: list[str] = []
        self.pending_blank = False

    def text(self, piece: str) -> None:
        if piece:
            self.current.append(piece)

    def newline(self) -> None:
        line = "".join(self.current).strip()
        self.current = []
        if not line:
            return
        if self.pending_blank and self.lines:
            self.lines.append("")
        self.pending_blank = False
        self.lines.append(line)

    def paragraph(self) -> None:
        self.newline()
        self.pending_blank = True

    def raw_lines(self, text: str) -> None:
        """Preformatted text keeps its own line breaks and indentation."""
        self.newline()
        if self.pending_blank and self.lines:
            self.lines.append("")
        self.pending_blank = False
        self.lines.extend(text.strip("\n").split("\n"))


def html_to_text(markup: str) -> str:
    soup = BeautifulSoup(markup, "html.parser")
    out = _Lines()
    _walk(soup, out)
    out.newline()
    return "\n".join(out.lines)


def _walk(node: Tag, out: _Lines) -> None:
    for child in node.children:
        if isinstance(child, NavigableString):
            if not isinstance(child, _SKIP_STRINGS):
                out.text(_SPACES.sub(" ", str(child)))
            continue
        if not isinstance(child, Tag):
            continue
        name = (child.name or "").lower()
        if name in _DROP:
            continue
        if name == "pre":
            out.raw_lines(child.get_text())
            out.paragraph()
        elif name == "br":
            out.newline()
        elif name in _CELL:
            out.text(" | " if out.current else "")
            _walk(child, out)
        elif name in _PARAGRAPH or name in _LINE:
            out.newline()
            _prefix(name, child, out)
            _walk(child, out)
            out.paragraph() if name in _PARAGRAPH else out.newline()
        else:
            _walk(child, out)


def _prefix(name: str, tag: Tag, out: _Lines) -> None:
    """Markdown-like markers keep headings and list items recognisable to the chunker."""
    if len(name) == 2 and name[0] == "h" and name[1].isdigit():
        out.text("#" * int(name[1]) + " ")
    elif name == "li":
        out.text("- ")
