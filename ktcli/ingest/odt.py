"""An OpenDocument text (.odt, .ott: LibreOffice, Google Docs' export) as the text a
reader sees, laid out by `ingest.layout` as a Word document is (`ingest.docx`).

Tracked changes are read accepted: ODF keeps deleted text apart (`text:tracked-changes`)
and inserted text in place. Hidden text and sections (`text:display="none"`, a hidden
paragraph) are left out; a field's shown value is kept but for the page counters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.etree import ElementTree as ET

from ktcli.ingest.layout import (HARD, HEADING, ITEM, PARA, RENDERED, Layout, LinePieces, count_of,
                                 left_out_notes, says_something)
from ktcli.ingest.odtnumbers import ListNumbers
from ktcli.ingest.zipdoc import DamagedDocument, ZipDocument, ZippedText

_NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "dc": "http://purl.org/dc/elements/1.1/",
    "xlink": "http://www.w3.org/1999/xlink",
}
OFFICE, STYLE, TEXT, TABLE, DRAW, FO, SVG, DC, XLINK = (
    f"{{{_NS[k]}}}" for k in ("office", "style", "text", "table", "draw", "fo", "svg", "dc", "xlink"))
# Fields whose value is the layout's count of pages; marks and declarations with no text.
_SKIPPED_INLINE = frozenset(f"{TEXT}{name}" for name in (
    "page-number", "page-count", "page-continuation", "ruby-text", "bookmark", "bookmark-start", "bookmark-end",
    "reference-mark", "reference-mark-start", "reference-mark-end", "toc-mark", "toc-mark-start", "toc-mark-end",
    "alphabetical-index-mark", "alphabetical-index-mark-start", "alphabetical-index-mark-end", "user-index-mark",
    "user-index-mark-start", "user-index-mark-end", "change-start", "change-end", "hidden-paragraph"))
# Parts of office:text that are declarations, not text.
_DECLARATIONS = frozenset({f"{TEXT}variable-decls", f"{TEXT}sequence-decls", f"{TEXT}user-field-decls",
                           f"{TEXT}dde-connection-decls", f"{OFFICE}forms", f"{TABLE}calculation-settings",
                           f"{TABLE}content-validations", f"{TABLE}label-ranges", f"{TEXT}alphabetical-index-auto-mark-file"})
_INDEXES = frozenset(f"{TEXT}{name}" for name in ("table-of-content", "illustration-index", "table-index", "object-index",
                                                  "user-index", "alphabetical-index", "bibliography"))
# Indexes that only list the document's own headings or captions with their pages: left out
# (`Layout.leaving_out`); an alphabetical index or a bibliography says more, and is read.
_LISTING_NAMES = {f"{TEXT}table-of-content": "table-of-contents", f"{TEXT}illustration-index": "list-of-figures",
                  f"{TEXT}table-index": "list-of-tables", f"{TEXT}object-index": "list-of-objects"}
_LISTINGS = frozenset(_LISTING_NAMES)
_SPACES = re.compile(r"[ \t\r\n]+")  # ODF collapses white space in text; text:s and text:tab say more
_MAX_STYLE_CHAIN = 32
_MAX_ANCHOR_CHARS = 80
_MAX_REPEATED_CELLS = 64  # a row of 1,024 repeated empty cells (a pasted spreadsheet) is not 1,024 columns


def odt_text(z: ZipDocument) -> ZippedText:
    return _Reader(z).read()


@dataclass
class _Style:
    parent: str | None = None
    hidden: bool | None = None
    break_before: bool | None = None
    break_after: bool | None = None
    master_page: bool = False  # a paragraph style that names a page style starts a page
    title: bool = False


class _Styles:
    def __init__(self, *roots: ET.Element | None) -> None:
        self.by_name: dict[tuple[str, str], _Style] = {}
        for root in roots:
            for el in root.iter(f"{STYLE}style") if root is not None else ():
                family, name = el.get(f"{STYLE}family", ""), el.get(f"{STYLE}name", "")
                para = el.find(f"{STYLE}paragraph-properties")
                if para is None:
                    para = el.find(f"{STYLE}table-properties")
                text = el.find(f"{STYLE}text-properties")
                display = text.get(f"{TEXT}display") if text is not None else None
                shown_name = (el.get(f"{STYLE}display-name") or name).strip().lower()
                self.by_name[(family, name)] = _Style(
                    parent=el.get(f"{STYLE}parent-style-name"),
                    hidden=None if display is None else display == "none",
                    break_before=_page(para, "break-before"), break_after=_page(para, "break-after"),
                    master_page=bool(el.get(f"{STYLE}master-page-name")), title=shown_name == "title")

    def _chain(self, family: str, name: str | None):
        seen: set[str] = set()
        while name and (family, name) in self.by_name and name not in seen and len(seen) < _MAX_STYLE_CHAIN:
            seen.add(name)
            style = self.by_name[(family, name)]
            yield style
            name = style.parent

    def _first(self, family: str, name: str | None, attribute: str) -> bool:
        return next((v for s in self._chain(family, name) if (v := getattr(s, attribute)) is not None), False)

    def hidden(self, family: str, name: str | None) -> bool:
        return self._first(family, name, "hidden")

    def break_before(self, family: str, name: str | None) -> bool:
        own = self.by_name.get((family, name or ""))
        return self._first(family, name, "break_before") or bool(own and own.master_page)

    def break_after(self, family: str, name: str | None) -> bool:
        return self._first(family, name, "break_after")

    def title(self, name: str | None) -> bool:
        return any(s.title for s in self._chain("paragraph", name))


def _page(props: ET.Element | None, attribute: str) -> bool | None:
    value = props.get(f"{FO}{attribute}") if props is not None else None
    return None if value is None else value == "page"


class _Line(LinePieces):
    """One paragraph's (or cell's, note's) text as its elements are read (`layout.LinePieces`),
    adding to the reader's open annotations' words where a reader is given."""

    def __init__(self, reader: _Reader | None, one_line: bool = False, body: bool = False) -> None:
        super().__init__(reader.captures if reader is not None else None, one_line)
        self.body = body  # a body paragraph: a page break inside ends its part, text boxes follow it
        self.breaks: list[tuple[int, str]] = []  # (characters before it, kind) of page breaks inside

    def page_break(self, kind: str) -> None:
        self.breaks.append((sum(len(p) for p in self.parts), kind))


class _Reader:
    def __init__(self, z: ZipDocument) -> None:
        self.z = z
        self.content = z.xml("content.xml")
        styles_root = z.xml("styles.xml", required=False)
        automatic = self.content.find(f"{OFFICE}automatic-styles") if self.content is not None else None
        self.styles = _Styles(styles_root, automatic)
        self.styles_root = styles_root
        self.numbers = ListNumbers(styles_root, automatic)
        self.layout = Layout(paged=False)
        self.captures: dict[str, list[str]] = {}  # annotation name -> words since it started
        self.open_comments: dict[str, ET.Element] = {}
        self.pending: list[str] = []
        self.deferred: list[ET.Element] = []
        self.images = self.described = self.objects = self.deletions = self.hidden = 0
        self.first_paragraph = True
        self.listed: dict[str, int] = {}  # a listing index's kind -> its entries left out

    def read(self) -> ZippedText:
        body = self.content.find(f"{OFFICE}body/{OFFICE}text") if self.content is not None else None
        if body is None:
            raise DamagedDocument("content.xml has no office:text body (not a text document?)")
        self.layout = Layout(paged=any(True for _ in body.iter(f"{TEXT}soft-page-break")))
        self._blocks(body, None)
        self._flush()
        for name, note in self.open_comments.items():  # an annotation whose end never came
            self.layout.end_note(self._comment_line(note, "".join(self.captures.get(name, []))))
        self._headers_and_footers()
        texts, paragraphs = self.layout.finish()
        return ZippedText(texts, paged=self.layout.paged, source_lines=paragraphs, left_out=self._left_out(),
                          images=self.images)

    # ---- blocks ------------------------------------------------------------------------

    def _blocks(self, container: ET.Element, list_level: int | None) -> None:
        for child in container:
            tag = child.tag
            if tag in (f"{TEXT}p", f"{TEXT}h"):
                self._paragraph(child, list_level)
            elif tag == f"{TEXT}list":
                self._list(child, 0 if list_level is None else list_level + 1)
            elif tag == f"{TEXT}numbered-paragraph":
                self._list_item(child, int(child.get(f"{TEXT}level", "1") or 1) - 1)
            elif tag == f"{TABLE}table":
                self._table(child)
            elif tag == f"{TEXT}soft-page-break":
                self.layout.page_break(RENDERED)
            elif tag == f"{TEXT}section":
                if child.get(f"{TEXT}display") == "none" or self.styles.hidden("section", child.get(f"{TEXT}style-name")):
                    self.hidden += 1
                else:
                    self._blocks(child, list_level)
            elif tag == f"{TEXT}tracked-changes":
                self.deletions += sum(1 for _ in child.iter(f"{TEXT}deletion"))
            elif tag in _INDEXES:
                index_body = child.find(f"{TEXT}index-body")
                if index_body is not None:
                    was, self.layout.leaving_out = self.layout.leaving_out, self.layout.leaving_out or tag in _LISTINGS
                    before = self.layout.left_out
                    self._blocks(index_body, list_level)
                    self.layout.leaving_out = was
                    if tag in _LISTINGS:
                        self.listed[tag] = self.listed.get(tag, 0) + self.layout.left_out - before
            elif tag == f"{TEXT}index-title":
                self._blocks(child, list_level)
            elif tag in _DECLARATIONS:
                continue
            elif tag.startswith(DRAW):  # a frame anchored to the page
                line = _Line(self, body=True)
                self._frame(child, line)
                self.layout.block(line.text())
                self._flush()

    def _list(self, lst: ET.Element, level: int) -> None:
        self.numbers.begin_list(lst)
        for item in lst:
            if item.tag == f"{TEXT}list-item":
                self._list_item(item, level, marker=self._label(item, level))
            elif item.tag == f"{TEXT}list-header":
                self._list_item(item, level, marker=False)
            elif item.tag == f"{TEXT}soft-page-break":
                self.layout.page_break(RENDERED)
        self.numbers.end_list()

    def _label(self, item: ET.Element, level: int) -> str | bool:
        """An item's number as its list style gives it ("2.1", "(b)"), or as the file last
        showed it (`text:number`), else True (a bullet: "- ")."""
        label = self.numbers.label(item, level)
        shown = item.find(f"{TEXT}number")
        if shown is not None and "".join(shown.itertext()).strip():
            label = " ".join("".join(shown.itertext()).split())
        return label or True

    def _list_item(self, item: ET.Element, level: int, marker: bool | str = True) -> None:
        first = True
        for child in item:
            if child.tag == f"{TEXT}p":
                self._paragraph(child, level, marker=marker if first else False)
                first = False
            elif child.tag == f"{TEXT}h":  # a numbered heading: LibreOffice lists its outline
                self._paragraph(child, None)
                first = False
            elif child.tag == f"{TEXT}list":
                self._list(child, level + 1)
            elif child.tag == f"{TEXT}soft-page-break":
                self.layout.page_break(RENDERED)
            elif child.tag == f"{TABLE}table":
                self._table(child)

    def _paragraph(self, p: ET.Element, list_level: int | None, marker: bool | str = True) -> None:
        style = p.get(f"{TEXT}style-name")
        if self.styles.hidden("paragraph", style) or any(
                h.get(f"{TEXT}is-hidden") == "true" for h in p.iter(f"{TEXT}hidden-paragraph")):
            self.hidden += 1
            return
        if p.tag == f"{TEXT}h":
            kind, level = HEADING, int(p.get(f"{TEXT}outline-level", "1") or 1)
        elif self.styles.title(style):
            kind, level = HEADING, 1
        elif list_level is not None:
            kind, level = ITEM, list_level
        else:
            kind, level = PARA, 0
        if self.styles.break_before("paragraph", style) and not self.first_paragraph:
            self.layout.page_break(HARD)
        self.first_paragraph = False
        line = _Line(self, one_line=kind == HEADING, body=True)
        self._inline(p, line)
        text, written = line.text(), 0
        for at, kind_of_break in line.breaks:  # the words before a break mid-paragraph: on the page before
            if self.layout.block(text[written:at], kind, level, continued=written > 0, marker=marker):
                written = at
            self.layout.page_break(kind_of_break)
        self.layout.block(text[written:], kind, level, continued=written > 0, marker=marker)
        self._flush()
        if self.styles.break_after("paragraph", style):
            self.layout.page_break(HARD)

    def _flush(self) -> None:
        for note in self.pending:
            self.layout.note(note)
        self.pending = []
        boxes, self.deferred = self.deferred, []
        for box in boxes:
            self._blocks(box, None)

    def _table(self, table: ET.Element) -> None:
        if self.styles.break_before("table", table.get(f"{TABLE}style-name")) and not self.first_paragraph:
            self.layout.page_break(HARD)
        self.first_paragraph = False
        for row in _rows(table):
            if row.tag == f"{TEXT}soft-page-break":
                self.layout.page_break(RENDERED)
                continue
            line = _Line(self, one_line=True)  # collects the page breaks inside the row's cells
            cells = [self._cell_text(cell, line) for cell in _cells(row)]
            for _, kind in line.breaks[:1]:  # a row is on the page it starts on
                self.layout.page_break(kind)
            self.layout.table_row(cells)
        self._flush()  # the table's notes after it, not between its rows

    def _cell_text(self, cell: ET.Element, row: _Line) -> str:
        """A cell's paragraphs on one line; a table in it flattened (cells " / ", rows "; ").
        Page breaks inside go to `row`'s."""
        line = _Line(self, one_line=True)
        for child in _cell_blocks(cell):
            if child.tag == f"{TEXT}soft-page-break":
                line.page_break(RENDERED)
            elif child.tag == f"{TABLE}table":
                rows = [" / ".join(t for t in (self._cell_text(c, row) for c in _cells(r)) if t)
                        for r in _rows(child) if r.tag != f"{TEXT}soft-page-break"]
                line.add(" " + "; ".join(r for r in rows if r) + " ")
            else:
                if not self.styles.hidden("paragraph", child.get(f"{TEXT}style-name")):
                    self._inline(child, line)
                line.add(" ")
        row.breaks.extend(line.breaks)
        return " ".join(line.text().split())

    # ---- inline ------------------------------------------------------------------------

    def _inline(self, el: ET.Element, line: _Line) -> None:
        line.add(_SPACES.sub(" ", el.text or ""))
        for child in el:
            self._inline_element(child, line)
            line.add(_SPACES.sub(" ", child.tail or ""))  # the words after an element are its parent's

    def _inline_element(self, el: ET.Element, line: _Line) -> None:
        tag = el.tag
        if tag == f"{TEXT}s":
            line.add(" " * max(1, min(int(el.get(f"{TEXT}c", "1") or 1), 100)))
        elif tag == f"{TEXT}tab":
            line.add("\t")
        elif tag == f"{TEXT}line-break":
            line.add("\n")
        elif tag == f"{TEXT}number":
            # a numbered heading's or item's number as last shown ("1.2"): its list style puts
            # a space or a tab after it, not written in the text ("1.2Scope")
            line.add(_SPACES.sub(" ", "".join(el.itertext())).strip() + " ")
        elif tag == f"{TEXT}soft-page-break":
            line.page_break(RENDERED)
        elif tag == f"{TEXT}span":
            if self.styles.hidden("text", el.get(f"{TEXT}style-name")):
                self.hidden += 1
            else:
                self._inline(el, line)
        elif tag == f"{TEXT}hidden-text":
            if el.get(f"{TEXT}is-hidden") == "false":
                line.add(el.get(f"{TEXT}string-value", ""))
            else:
                self.hidden += 1
        elif tag == f"{TEXT}note":
            self._note(el, line)
        elif tag == f"{OFFICE}annotation":
            self._annotation(el)
        elif tag == f"{OFFICE}annotation-end":
            name = el.get(f"{OFFICE}name", "")
            note = self.open_comments.pop(name, None)
            if note is not None:
                self.pending.append(self._comment_line(note, "".join(self.captures.pop(name, []))))
        elif tag in _SKIPPED_INLINE or tag == f"{TEXT}change":  # (a deletion's place: counted with its text)
            return
        elif tag.startswith(DRAW):
            self._frame(el, line)
        else:  # links, fields and other spans: their text is what is shown
            self._inline(el, line)

    def _note(self, note: ET.Element, line: _Line) -> None:
        citation = note.find(f"{TEXT}note-citation")
        mark = (citation.get(f"{TEXT}label") or "".join(citation.itertext())).strip() if citation is not None else ""
        endnote = note.get(f"{TEXT}note-class") == "endnote"
        line.add(f"[^{mark}]" if mark else "")
        body = note.find(f"{TEXT}note-body")
        text = self._text_of(body) if body is not None else ""
        if text:
            entry = f"[{'endnote' if endnote else 'footnote'}{' ' + mark if mark else ''}: {text}]"
            if endnote:  # at the end, with the ¶ of the paragraph (or row) being read
                self.layout.end_note(entry, self.layout.paragraphs + 1)
            else:
                self.pending.append(entry)

    def _annotation(self, note: ET.Element) -> None:
        name = note.get(f"{OFFICE}name")
        if name:  # a range: said when its end is reached, with the words it covers
            self.open_comments[name] = note
            self.captures[name] = []
        else:
            self.pending.append(self._comment_line(note, ""))

    def _comment_line(self, note: ET.Element, anchor: str) -> str:
        creator = note.find(f"{DC}creator")
        author = " ".join((creator.text or "").split()) if creator is not None else ""
        anchor = " ".join(anchor.split())
        if len(anchor) > _MAX_ANCHOR_CHARS:
            anchor = anchor[: _MAX_ANCHOR_CHARS - 1].rstrip() + "\u2026"
        on = f' on "{anchor}"' if anchor else ""
        words = self._text_of(note)  # its paragraphs: not dc:creator and dc:date
        return f"[comment{' by ' + author if author else ''}{on}: {words}]"

    def _text_of(self, el: ET.Element) -> str:
        """The paragraphs under `el` as one line (a note's body, a comment, a header)."""
        captures, self.captures = self.captures, {}
        line = _Line(None, one_line=True)
        for child in [el] if el.tag in (f"{TEXT}p", f"{TEXT}h") else _paragraphs(el):
            self._inline(child, line)
            line.add(" ")
        self.captures = captures
        return " ".join(line.text().split())

    def _frame(self, frame: ET.Element, line: _Line) -> None:
        """A picture by its description, a text box by its paragraphs; an embedded object
        (a chart, a formula, a spreadsheet) counted."""
        if frame.tag == f"{DRAW}a" or frame.tag == f"{DRAW}g":
            for child in frame:
                if child.tag.startswith(DRAW):
                    self._frame(child, line)
            return
        title, desc = frame.find(f"{SVG}title"), frame.find(f"{SVG}desc")
        alt = " ".join(((desc.text if desc is not None else None) or (title.text if title is not None else None) or "").split())
        box = frame.find(f"{DRAW}text-box")
        if box is not None:
            if line.body:
                self.deferred.append(box)
            else:
                line.add(" " + self._text_of(box) + " ")
        elif frame.find(f"{DRAW}object") is not None or frame.find(f"{DRAW}object-ole") is not None:
            self.objects += 1
            self._described(line, "object", alt)
        elif frame.find(f"{DRAW}image") is not None:
            self.images += 1
            self._described(line, "image", alt)
        elif any(c.tag in (f"{TEXT}p", f"{TEXT}list") for c in frame):  # a shape with words in it
            line.add(" " + self._text_of(frame) + " ")

    def _described(self, line: _Line, what: str, alt: str) -> None:
        if alt:
            self.described += 1
            line.add(f" [{what}: {alt}] ")

    # ---- headers, footers, what was left out --------------------------------------

    def _headers_and_footers(self) -> None:
        masters = self.styles_root.find(f"{OFFICE}master-styles") if self.styles_root is not None else None
        seen: set[str] = set()
        for page in masters.iter(f"{STYLE}master-page") if masters is not None else ():
            for part in page:
                kind = "header" if part.tag.startswith(f"{STYLE}header") else "footer" if part.tag.startswith(f"{STYLE}footer") else ""
                if not kind or part.get(f"{STYLE}display") == "false":
                    continue
                text = " / ".join(t for t in (self._text_of(p) for p in _paragraphs(part)) if says_something(t))
                if text and text not in seen:
                    seen.add(text)
                    self.layout.front_note(f"[{kind}: {text}]")

    def _left_out(self) -> list[str]:
        return left_out_notes([count_of(self.images, "image"),
                               count_of(self.objects, "embedded object (a chart, a formula...)",
                                        "embedded objects (charts, formulas...)"),
                               *(count_of(n, f"{_LISTING_NAMES[tag]} entry", f"{_LISTING_NAMES[tag]} entries")
                                 for tag, n in self.listed.items())],
                              self.described, self.deletions, self.hidden)


def _rows(table: ET.Element):
    for child in table:
        if child.tag == f"{TABLE}table-row":
            yield child
        elif child.tag == f"{TEXT}soft-page-break":
            yield child
        elif child.tag in (f"{TABLE}table-header-rows", f"{TABLE}table-rows", f"{TABLE}table-row-group"):
            yield from _rows(child)


def _cells(row: ET.Element):
    for cell in row:
        if cell.tag in (f"{TABLE}table-cell", f"{TABLE}covered-table-cell"):
            repeat = cell.get(f"{TABLE}number-columns-repeated", "1")
            n = int(repeat) if repeat.isdecimal() else 1
            yield from [cell] * max(1, min(n, _MAX_REPEATED_CELLS))


def _cell_blocks(cell: ET.Element):
    """A cell's paragraphs, tables and page breaks in order (lists opened): a break right
    inside a cell, before its paragraph, was passed over, and every later page cited one low."""
    for child in cell:
        if child.tag in (f"{TEXT}p", f"{TEXT}h", f"{TABLE}table", f"{TEXT}soft-page-break"):
            yield child
        elif child.tag in (f"{TEXT}list", f"{TEXT}list-item", f"{TEXT}list-header", f"{TEXT}section"):
            yield from _cell_blocks(child)


def _paragraphs(el: ET.Element):
    """The paragraphs under `el` in order, not those inside a paragraph (a text box's)."""
    for child in el:
        if child.tag in (f"{TEXT}p", f"{TEXT}h"):
            yield child
        else:
            yield from _paragraphs(child)
