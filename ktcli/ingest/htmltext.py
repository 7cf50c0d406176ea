"""The visible text of an HTML page, with BeautifulSoup: each block starts a line, and
running text keeps the markup's own line breaks (a paragraph wrapped over lines 16-24 of
the file is lines of text from 16 to 24), so a citation names the lines its words are on.
Table rows and headings stay one line each."""

from __future__ import annotations

import inspect
import re
import sys
import warnings
from collections.abc import Iterator

from bs4 import BeautifulSoup, NavigableString, Tag, XMLParsedAsHTMLWarning
from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

from ktcli.ingest.layout import count_of, escaped_hash
from ktcli.ingest.pdf_marks import EXPONENT_BASE, RAISED_MARK

# Never visible (or not page content). <head> itself is walked, not dropped: a page may
# leave out its `</head>` (HTML allows it), and html.parser then nests the whole body
# inside <head>; its metadata tags are dropped one by one instead.
# <rt> and <rp>: a ruby annotation's reading (furigana) and its fallback brackets, which
# ran into the words they gloss ("清水寺きよみずでら"); the Word reader leaves them out too.
_DROP = frozenset({"title", "meta", "link", "base", "script", "style", "noscript", "template", "canvas", "iframe",
                   "rt", "rp"})
# Ends a paragraph: a blank line after it gives the chunker a natural break.
_PARAGRAPH = frozenset(
    {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "ul", "ol", "dl",
     "section", "article", "header", "footer", "nav", "main", "aside", "figure", "form", "address", "hr"}
)
# Ends a line.
_LINE = frozenset({"div", "li", "tr", "dt", "dd", "figcaption", "caption", "br", "option", "summary", "details",
                   "fieldset", "legend", "body", "html", "textarea"})
_CELL = frozenset({"td", "th"})
# Blocks read as one line whatever the markup's wrapping (a row's cells join there too).
_ONE_LINE = frozenset({"h1", "h2", "h3", "h4", "h5", "h6", "tr", "dt", "caption", "summary", "legend", "option"})
# Form controls and their labels: words of their own ("Notes" beside a text box's "Water
# on Mondays" read "NotesWater on Mondays").
_SPACED = frozenset({"label", "button", "select", "input"})
# A text box's value is text the page shows; a hidden field's, a password's or a box's is not.
_UNSHOWN_INPUTS = frozenset({"hidden", "password", "checkbox", "radio", "file", "image", "range", "color"})
# Elements with no end tag: one ends where its start tag does.
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})
# Their content is text up to their end tag: no tag of the same name nests inside.
_RAW_TEXT = frozenset({"script", "style", "textarea", "title"})
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
        # A list item's "- " or "3. " and a heading's "## ": written with the first words
        # after them, wherever those are (`<li><p>text</p></li>` was a lone "-" line, then
        # the text), and from those words' line.
        self.marker = ""
        self.skipped: set[int] = set()  # ids of elements left out whole (`_site_menus`)
        self._any = False  # the line holds a visible character (a separator counts)
        self._content = False  # ... of the page's text (a cell separator does not)
        self._heading = False  # the line is a heading's, its "## " marker written
        self._indent = 0  # spaces before the line: a nested list's item
        self.row_groups: dict[int, _RowGroup] = {}  # by id() of each table's row group: its rowspans

    def text(self, piece: str, source: int, separator: bool = False) -> None:
        piece = piece.replace("\u00ad", "")  # a soft hyphen (&shy;) shows only at a line end
        if not piece:
            return
        if not separator and not self._content and piece.strip():
            self._content = True
            self.current_source = source  # where its words start, not an empty first cell
            if self.marker:
                self.current.insert(0, self.marker.lstrip(" "))
                self._indent = len(self.marker) - len(self.marker.lstrip(" "))  # a nested list's item
                self._heading = self.marker.startswith("#")
                self.marker = ""
        self._any = self._any or bool(piece.strip())
        self.current.append(piece)

    def has_text(self) -> bool:
        return self._any

    def newline(self) -> None:
        # Spaces collapse across inline tags as a browser shows them ("a <b> b</b>": "a b").
        line = _SPACES.sub(" ", "".join(self.current)).strip() if self._content else ""
        if not self._heading:  # a "#" column's header row is no heading (`layout.escaped_hash`)
            line = escaped_hash(line)
        if line and self._indent:
            line = " " * self._indent + line
        self.current = []
        self._any = self._content = self._heading = False
        self._indent = 0
        if not line:  # nothing, or a table row of empty cells
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
        self.marker = ""
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


def html_to_text(markup: str, *, title: bool = True,
                 left_out: list[str] | None = None) -> tuple[str, tuple[int, ...]]:
    """The page's visible text, and for each of its lines the markup's line (1-based) it
    starts on, so that citations name lines of the file the user has. `title`: whether
    the page's <title> heads the text (not an EPUB chapter's, most often the book's name
    on every chapter). `left_out`: where given, a saved web page's navigation menus are
    left out and said there (`_site_menus`)."""
    with warnings.catch_warnings():
        # XHTML (an XML prolog) is read as HTML on purpose: its visible text is the same,
        # and bs4's multi-line advice reached the user's terminal.
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = _parse(markup)
    out = _Lines()
    if left_out is not None:
        menus, words = _site_menus(soup)
        if menus:
            out.skipped = {id(menu) for menu in menus}
            left_out.append(f"{count_of(len(menus), 'navigation menu')} ({words:,} words of site links) left out")
    # The walk recurses once per level of nesting: old markup that never closes its
    # <font> tags nests one level per line (1,500 lines passed Python's limit of 1,000).
    # Python frames cost no C stack here (3.11+), so the limit is lifted for the walk.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _MAX_NESTING))
    try:
        _walk(soup, out, _Cursor(markup))
    except RecursionError:
        raise ValueError(f"HTML nested more than {_MAX_NESTING:,} levels deep") from None
    finally:
        sys.setrecursionlimit(limit)
    out.newline()
    lines, sources = out.lines, out.sources
    # The <title> names the page (often more than its first heading); it is not in the
    # walk, so it is put first, on the line the markup has it. Not an SVG's <title> (an
    # icon's tooltip: "Open menu" named a page of rainfall figures).
    page_title = next((t for t in soup.find_all("title") if t.find_parent(["svg", "math"]) is None), None)
    name = _SPACES.sub(" ", page_title.get_text().replace("\u00ad", "")).strip() if page_title is not None else ""
    if title and name and not (lines and name.lower() == lines[0].lstrip("# ").lower()):
        lines, sources = [f"Title: {name}", "", *lines], [page_title.sourceline or 1] * 2 + sources
    return "\n".join(lines), tuple(sources)


class _ClosedVoidTags:
    """bs4's html.parser builder keeps a list of the void tags it closed itself (`<br>`,
    `<img>`: their `</br>` or `</img>`, should one follow, is then ignored), searched at
    every end tag and shortened only by such an end tag: in Node's all.html it held 600
    names, scanned at each of 180,000 end tags. The same multiset, counted by name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __contains__(self, name: object) -> bool:
        return self.counts.get(name, 0) > 0  # type: ignore[call-overload]

    def append(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def remove(self, name: str) -> None:
        if self.counts.get(name, 0) <= 0:
            raise ValueError(name)
        self.counts[name] -= 1


def _parse(markup: str) -> BeautifulSoup:
    """`BeautifulSoup(markup, "html.parser")`, its void tags counted by `_ClosedVoidTags`
    where this bs4 lets a builder name its parser class (4.13 and later)."""
    try:
        from bs4.builder._htmlparser import BeautifulSoupHTMLParser, HTMLParserTreeBuilder
    except ImportError:
        return BeautifulSoup(markup, "html.parser")
    if "_parser_class" not in inspect.signature(HTMLParserTreeBuilder.feed).parameters:
        return BeautifulSoup(markup, "html.parser")

    class Parser(BeautifulSoupHTMLParser):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.already_closed_empty_element = _ClosedVoidTags()  # type: ignore[assignment]

    class Builder(HTMLParserTreeBuilder):
        def feed(self, markup, _parser_class=Parser) -> None:  # type: ignore[override]
            super().feed(markup, _parser_class=_parser_class)

    return BeautifulSoup(markup, builder=Builder())


class _Cursor:
    """The markup line the walk is on. A tag knows where it starts (html.parser's
    sourceline and sourcepos): the cursor goes to the end of its start tag, found in the
    markup, since a start tag may span lines (prettier writes one attribute a line: the
    text after it was cited 1-3 lines early). A text node starts where the node before it
    ended, so the cursor moves on by the line breaks of every text it passes, and past
    the end tag of every element it skips."""

    def __init__(self, markup: str) -> None:
        self.markup = markup
        self.line = 1
        self._line_starts: list[int] | None = None
        self._tag_end: int | None = None  # where the last tag `at_tag` saw ends its start tag

    def at_tag(self, tag: Tag) -> None:
        self._tag_end = None
        if tag.sourceline is None:
            return
        self.line = tag.sourceline
        at = self._offset(tag)
        self._tag_end = self._start_tag_end(at)
        if self._tag_end is not None:
            self.line += self.markup.count("\n", at, self._tag_end)

    def past(self, text: str) -> int:
        """The line `text` (the node at the cursor) shows its first character on; moves
        the cursor to its end."""
        start = self.line + text[: len(text) - len(text.lstrip())].count("\n")
        self.line += text.count("\n")
        return start

    def past_element(self, tag: Tag) -> None:
        """Past a skipped element (after `at_tag`): to its end tag in the markup, else by
        the line breaks of its re-written markup, which has lost those inside its tags."""
        start, name = self._tag_end, (tag.name or "").lower()
        if start is None:
            self.past(str(tag))
            return
        if name in _VOID:
            return
        opened, depth = re.compile(rf"<(/?){re.escape(name)}(?=[\s/>])", re.IGNORECASE), 1
        for m in opened.finditer(self.markup, start):
            if name in _RAW_TEXT and not m.group(1):
                continue
            depth += -1 if m.group(1) else 1
            if depth == 0:
                end = self.markup.find(">", m.end())
                self.line += self.markup.count("\n", start, end if end >= 0 else m.end())
                return
        self.past(str(tag))  # never closed in the markup: the element ran to the end

    def _offset(self, tag: Tag) -> int:
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.markup)]
        starts = self._line_starts
        return starts[min(tag.sourceline, len(starts)) - 1] + (tag.sourcepos or 0)

    def _start_tag_end(self, at: int) -> int | None:
        """Offset just past the `>` of the start tag at offset `at`; None where the markup
        there is no start tag (a tag the parser made up)."""
        if not self.markup.startswith("<", at):
            return None
        m = _START_TAG.match(self.markup, at)
        return m.end() if m else None


# A start tag to its closing ">". As html.parser reads it, a quote opens a value only
# right after "=" (`title=don't` is an unquoted value); a quoted value may hold ">" and
# line breaks.
_START_TAG = re.compile(r"""<[^\s/>]+(?:=\s*"[^"]*"|=\s*'[^']*'|[^>])*+>""")

# Where html.parser leaves a tag open that HTML closes by itself (`<tr><td>a<td>b<tr>`,
# `<li>x<li>y`, `<dt>a<dd>b<dt>c`), the next one nests inside it: these name the tags
# whose parent of these names is really their sibling.
_SIBLINGS_OF = {"tr": {"td", "th", "tr"}, "td": {"td", "th"}, "th": {"td", "th"}, "li": {"li"},
                "dt": {"dt", "dd"}, "dd": {"dt", "dd"}}


_MAX_COLSPAN = 100  # a browser's limit is 1000; a wider span is a page's mistake, not columns
_MAX_ROWSPAN = 1000  # rowspan=0 is "to the end of the row group"


def _colspan(cell: Tag) -> int:
    value = str(cell.get("colspan") or "1").strip()
    return min(int(value), _MAX_COLSPAN) if value.isdecimal() and int(value) > 0 else 1


def _rowspan(cell: Tag) -> int:
    value = str(cell.get("rowspan") or "1").strip()
    if not value.isdecimal():
        return 1
    return _MAX_ROWSPAN if int(value) == 0 else min(int(value), _MAX_ROWSPAN)


class _RowGroup:
    """A table's rows (its tbody, thead or tfoot) as the walk meets them: the row it is on,
    the column its next cell stands in, and the columns that cells with rowspan above hold,
    with the rows they still hold (this one included)."""

    def __init__(self) -> None:
        self.row: Tag | None = None
        self.column = 0
        self.held: dict[int, int] = {}

    def covered_before(self, cell: Tag) -> int:
        """The columns held from above where `cell` would stand (it stands after them),
        the cell then counted, its own rowspan held below it."""
        row = _ancestor(cell, ("tr",))
        if row is not self.row:  # a new row: the spans from above reach one row further
            if self.row is not None:
                self.held = {column: rows - 1 for column, rows in self.held.items() if rows > 1}
            self.row, self.column = row, 0
        covered = 0
        while self.held.get(self.column + covered, 0) > 0:
            covered += 1
        self.column += covered
        span, rows = _colspan(cell), _rowspan(cell)
        if rows > 1:
            for column in range(self.column, self.column + span):
                self.held[column] = max(self.held.get(column, 0), rows)
        self.column += span
        return covered


def _covered_columns(cell: Tag, out: _Lines) -> int:
    """Columns of `cell`'s row, before it, that a cell above it spans into (rowspan): read
    as empty cells, so that those after stay under their headers (a browser shows them
    shifted right; read without them, "Varnholm Annex | 3 | 420" put a city under Depot
    and a forklift count under City)."""
    row = _ancestor(cell, ("tr",))
    group = _ancestor(row, ("tbody", "thead", "tfoot", "table")) if row is not None else None
    if group is None:
        return 0
    return out.row_groups.setdefault(id(group), _RowGroup()).covered_before(cell)


def _walk(node: Tag, out: _Lines, cursor: _Cursor, one_line: str = "", items_before: int = 0) -> None:
    """`one_line`: "row" inside a heading, a table row or a term, whose markup line breaks
    are only layout (a row's cells are one line of text); "cell" inside a table cell,
    whose paragraphs and line breaks are too (Confluence, Word and MediaWiki exports wrap
    each cell in <p>). `items_before`: list items before this node's first (an <li>
    html.parser nested in the one before it)."""
    cells, items = 0, items_before
    spanned = 0  # columns the row's last cell spans past its own (colspan), owed before the next cell
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
        nested = (node.name or "").lower() in _SIBLINGS_OF.get(name, ())  # an implied end before it
        if name in _DROP or _hidden(child) or id(child) in out.skipped or (name == "a" and _permalink(child)) \
                or _editor_chrome(child):
            cursor.past_element(child)  # its line breaks still count
            continue
        if name in ("math", "svg", "input"):
            shown = _control_text(child, name)
            if shown:
                out.text(f" {shown} ", cursor.line)
            cursor.past_element(child)
        elif name == "tr" and not one_line and ((code := _code_row(child)) or _layout_row(child)):
            # A code block laid out as a table beside its line numbers (Pygments'
            # `linenos="table"`: Sphinx, MkDocs; Rouge, Chroma): read as a row, its
            # code's lines ran into one ("1 2 3 4 | from tidepool import Client, ...
            # policy = ..."). Its lines are kept, its number column left out.
            # A table that lays a page out (a sidebar cell beside the article's, an HTML
            # mail's frame): read as a row, a whole page was one line of 5,000 characters,
            # its headings no section trail and every citation "page.html:3 (chars ...)".
            # Its cells are read as the blocks they hold, one after the other.
            out.newline()
            for cell in child.children:
                if isinstance(cell, NavigableString):
                    cursor.past(str(cell))
                elif isinstance(cell, Tag):
                    cursor.at_tag(cell)
                    cell_name = (cell.name or "").lower()
                    if (code and _NUMBERS.fullmatch(cell.get_text())) or cell_name in _DROP or _hidden(cell):
                        cursor.past_element(cell)
                    else:
                        _walk(cell, out, cursor)
                        out.paragraph()
            out.paragraph()
        elif name in _CELL:
            # Every cell after a row's first adds its separator, also after an empty one
            # (an empty corner cell put "Autumn" over the summer's figure).
            covered = _covered_columns(child, out)
            first = not (cells or (nested and out.has_text()))
            out.text(" | " * ((0 if first else 1 + spanned) + covered), cursor.line, separator=True)
            cells += 1
            _walk(child, out, cursor, one_line="cell")
            # A merged cell's columns are empty ones after it, so the cells that follow stay
            # under their headers; owed until a cell follows (none after the row's last).
            spanned = _colspan(child) - 1
        elif one_line == "cell" and (name in _PARAGRAPH or name in _LINE) and not nested:
            out.text(" ", cursor.line, separator=True)  # a block inside a cell stays in its row
            _walk(child, out, cursor, one_line="cell")
            out.text(" ", cursor.line, separator=True)
        elif name == "pre":
            blocks = [c for c in child.children if isinstance(c, Tag) or str(c).strip()]
            if len(blocks) > 1 and all(isinstance(c, Tag) and c.name == "code" for c in blocks):
                # Node's docs put an example's ESM and CommonJS forms in one <pre>, <code> after
                # <code>: the first's last line and the second's first were one ("});const http2 = ...")
                for code in blocks:
                    out.raw_lines(code.get_text(), code.sourceline or cursor.line)
            else:
                out.raw_lines(child.get_text(), cursor.line)
            cursor.line += _newlines_of(child)
            out.paragraph()
        elif name == "br":
            out.text(" ", cursor.line, separator=True) if one_line else out.newline()
        elif name == "img":
            alt = _SPACES.sub(" ", str(child.get("alt") or "")).strip()
            if alt:  # what the page says an image shows: text a reader gets too
                out.text(f"[image: {alt}]", cursor.line)
        elif name in _PARAGRAPH or name in _LINE:
            out.newline()
            items += name == "li"
            marker = _marker(name, node, items)
            out.marker = marker or out.marker  # an item's <p> keeps the item's marker
            # A block in a row (a <p> in a heading html.parser never saw closed) reads as
            # any other; in a cell it reached here only as an implied sibling.
            inner = "row" if name in _ONE_LINE else ""
            _walk(child, out, cursor, one_line=inner, items_before=items if name == "li" else 0)
            if marker:
                out.marker = ""  # an empty item's or heading's marker is not a line
            out.paragraph() if name in _PARAGRAPH else out.newline()
        elif name == "sup" and (mark := _raised_mark(child, out)):
            out.text(mark, cursor.line)
            cursor.past_element(child)
        elif name in _SPACED:
            out.text(" ", cursor.line, separator=True)
            _walk(child, out, cursor, one_line)
            out.text(" ", cursor.line, separator=True)
        else:
            _walk(child, out, cursor, one_line)


# A heading's or a definition's permalink, shown on hover: Sphinx's and MkDocs'
# `<a class="headerlink" href="#x">¶</a>` put "¶" after every heading ("Retry policies¶ >
# Configuring retries¶" in a citation's trail) and every API entry of a reference page.
_PERMALINK_SIGNS = frozenset({"", "¶", "§", "#", "🔗", "\u200b"})


def _permalink(link: Tag) -> bool:
    classes = {c.lower() for c in (link.get("class") or ())}
    return bool(classes & {"headerlink", "hash-link", "anchor-link"}) or (
        str(link.get("href") or "").startswith("#") and link.get_text().strip() in _PERMALINK_SIGNS
        and _ancestor(link, ("h1", "h2", "h3", "h4", "h5", "h6", "dt")) is not None)


def _editor_chrome(tag: Tag) -> bool:
    """A wiki's "[edit]" link beside each heading (MediaWiki's `mw-editsection`: a saved
    Wikipedia page read "## History[edit]", in every section trail too)."""
    classes = tag.get("class")
    return bool(classes) and "mw-editsection" in classes


_NUMBERS = re.compile(r"[\d\s]*")


def _code_row(row: Tag) -> bool:
    """A table row that is a code block beside its line numbers: a cell holding a <pre>
    of several lines, and every other cell numbers alone."""
    cells = _cells(row)
    numbers = [c for c in cells if _NUMBERS.fullmatch(c.get_text())]
    # (not `c not in numbers`: a Tag's == compares the markup of the two, every cell's)
    code = [c for c in cells if not any(c is n for n in numbers)
            and any("\n" in pre.get_text().strip() for pre in _descendants_named(c, ("pre",)))]
    return len(code) == 1 and bool(numbers) and len(code) + len(numbers) == len(cells)


_BLOCKS_OF_A_PAGE = frozenset({"h1", "h2", "h3", "h4", "h5", "h6", "table"})


def _layout_row(row: Tag) -> bool:
    """A row of a table that lays a page out, not one of data: its table says so
    (role="presentation"), or a cell holds a heading or a table of its own."""
    table = _ancestor(row, ("table",))
    if table is not None and str(table.get("role") or "").lower() in ("presentation", "none"):
        return True
    return any(next(_descendants_named(cell, _BLOCKS_OF_A_PAGE), None) is not None for cell in _cells(row))


def _raised_mark(sup: Tag, out: _Lines) -> str:
    """A <sup> right after a word, as the PDF reader reads a raised mark (`pdf_marks`):
    "[^2]" for a footnote's mark, "^2" for an exponent after a unit or a 10 ("m^2",
    "10^6"); "" for any other (read as it stands). Glued on, "340<sup>1</sup> marks"
    read "3401 marks", and "1998<sup>2</sup>" a year 19982 (Pandoc's and many EPUBs'
    note references are such marks)."""
    text = _SPACES.sub("", sup.get_text())
    mark = text[1:-1] if text.startswith("[") and text.endswith("]") else text  # Wikipedia's "[1]"
    before = "".join(out.current)
    if not RAISED_MARK.fullmatch(mark) or not before or before[-1].isspace():
        return ""
    linked = any(str(a.get("href") or "").startswith("#") for a in [*sup.find_all("a"), *sup.find_parents("a", limit=1)])
    return f"^{mark}" if not linked and mark.isdecimal() and EXPONENT_BASE.search(before) else f"[^{mark}]"


def _marker(name: str, parent: Tag, item: int) -> str:
    """Markdown-like markers keep headings and list items recognisable to the chunker; an
    ordered list's items keep their numbers ("step 3" is a question's words). `item`: the
    item's number in its list (counting those html.parser nested in one another)."""
    if len(name) == 2 and name[0] == "h" and name[1].isdecimal():
        return "#" * int(name[1]) + " "
    if name != "li":
        return ""
    while parent is not None and (parent.name or "").lower() == "li":  # `<li>x<li>y`: its list is further up
        parent = parent.parent
    # A list inside another's item is indented under it, as Markdown writes it: flattened,
    # "- Supervisor: Bo" read as an item of the shift list, not of the night shift's.
    depth = sum(1 for a in (parent.parents if parent is not None else ()) if (a.name or "").lower() in ("ul", "ol"))
    indent = "  " * min(depth, 8)
    if parent is not None and (parent.name or "").lower() == "ol":
        try:
            first = int(str(parent.get("start") or 1))
        except ValueError:
            first = 1
        return f"{indent}{first + item - 1}. "
    return f"{indent}- "


def _control_text(tag: Tag, name: str) -> str:
    """What a formula, a drawing or a form field shows as text: MathML's alternative text
    (else its tokens: `<mn>3</mn><mo>/</mo><mn>4</mn>` is "3 / 4"), an SVG's <text>
    elements (not its <title>, a tooltip), a text box's or button's value."""
    if name == "math":
        shown = str(tag.get("alttext") or "") or tag.get_text(" ", strip=True)
    elif name == "svg":
        shown = " ".join(t.get_text(" ", strip=True) for t in tag.find_all("text"))
    else:
        kind = str(tag.get("type") or "text").lower()
        shown = "" if kind in _UNSHOWN_INPUTS else str(tag.get("value") or "")
    return _SPACES.sub(" ", shown).strip()


# A page keeps its menus where the rest of it holds fewer words than this (a site map, a
# table of contents page): they are its content.
_MIN_WORDS_BESIDE_MENUS = 50


def _site_menus(soup: BeautifulSoup) -> tuple[list[Tag], int]:
    """A saved page's navigation menus (<nav>, role="navigation"; not one inside another)
    and their words. A documentation page's sidebar lists the whole site: read, it takes
    the window's tokens, and its chunks of link titles, which hold many of the site's
    keywords, compete with the page's text in retrieval. None where the rest of the page
    holds under _MIN_WORDS_BESIDE_MENUS words."""
    found = [tag for tag in soup.descendants
             if isinstance(tag, Tag) and ((tag.name or "").lower() == "nav"
                                          or str(tag.get("role") or "").lower() == "navigation")]
    found_ids = {id(tag) for tag in found}
    menus = [tag for tag in found if not any(id(parent) in found_ids for parent in tag.parents)]
    # an empty one (a menu a script fills) leaves nothing out: "1 navigation menu (0 words
    # of site links) left out" was said of underscore.js's docs
    counted = [(menu, _words(menu)) for menu in menus]
    menus = [menu for menu, n in counted if n]
    if not menus:
        return [], 0
    words = sum(n for _, n in counted)
    if _words(next(_descendants_named(soup, ("body",)), None) or soup) - words < _MIN_WORDS_BESIDE_MENUS:
        return [], 0
    return menus, words


def _words(tag: Tag) -> int:
    """Words of `tag`'s text, not counting scripts, styles or comments."""
    return sum(len(text.split()) for text in tag.descendants
               if isinstance(text, NavigableString) and not isinstance(text, _SKIP_STRINGS)
               and (text.parent.name or "").lower() not in _DROP)


def _hidden(tag: Tag) -> bool:
    """Marked never to show: the `hidden` attribute or an inline display:none or
    visibility:hidden."""
    style = str(tag.get("style") or "").replace(" ", "").lower()
    return tag.has_attr("hidden") or "display:none" in style or "visibility:hidden" in style


# bs4's find_parent() and find_all() build a SoupStrainer at every call: in the walk, once
# a table cell, link or row, they took a third of the time of Node's 8 MB all.html.


def _ancestor(element: Tag, names: tuple[str, ...]) -> Tag | None:
    """`element.find_parent(names)`: its nearest ancestor named one of `names`."""
    parent = element.parent
    while parent is not None:
        if parent.name in names:
            return parent
        parent = parent.parent
    return None


def _cells(row: Tag) -> list[Tag]:
    """`row.find_all(["td", "th"], recursive=False)`."""
    return [c for c in row.children if isinstance(c, Tag) and c.name in ("td", "th")]


def _descendants_named(tag: Tag, names) -> Iterator[Tag]:
    """`tag.find_all(names)`, lazily."""
    return (d for d in tag.descendants if isinstance(d, Tag) and d.name in names)


def _newlines_of(tag: Tag) -> int:
    """`str(tag).count("\\n")` without writing the markup out again (a <pre> of Node's
    docs, its code highlighted in a <span> a word, took 4 ms): the line breaks of its
    strings and of its and its descendants' attribute values."""
    count = 0
    for element in (tag, *tag.descendants):
        if isinstance(element, NavigableString):
            count += element.count("\n")
        elif isinstance(element, Tag):
            if element.name == "meta":  # its charset is written as the output's
                return str(tag).count("\n")
            for value in element.attrs.values():
                if isinstance(value, list):
                    count += sum(str(v).count("\n") for v in value)
                elif value is not None:
                    count += str(value).count("\n")
    return count
