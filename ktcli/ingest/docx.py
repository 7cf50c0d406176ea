"""A Word document (.docx, .docm, .dotx) as the text a reader of it sees in Word, laid out
by `ingest.layout`: its paragraphs, headings, lists and tables in reading order, its
footnotes, endnotes and comments, its pages where Word recorded them.

What is read as Word shows it with tracked changes accepted: insertions kept, deletions
(`w:del`, `w:moveFrom`) left out; hidden text (`w:vanish`) left out; a field's result
kept (not its code), except the page counters (PAGE, NUMPAGES), which are the layout's.
A text box is read after the paragraph it is anchored in; a picture by its alt text;
charts, embedded objects and pictures themselves are counted and reported. Numbered
paragraphs carry the number Word computes for them (`ingest.wordnumbers`): "1.2 item" for
"- item", "# 4.2 Termination" for a heading numbered by its style.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Callable
from xml.etree import ElementTree as ET

from ktcli.ingest.layout import (HARD, HEADING, ITEM, PARA, RENDERED, Layout, LinePieces, count_of,
                                 left_out_notes, says_something)
from ktcli.ingest.wordnumbers import Numbering, roman
from ktcli.ingest.zipdoc import DamagedDocument, ZipDocument, ZippedText, local, resolve

_NS = {
    "w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
    "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
    "wp": "http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing",
    "a": "http://schemas.openxmlformats.org/drawingml/2006/main",
    "pic": "http://schemas.openxmlformats.org/drawingml/2006/picture",
    "m": "http://schemas.openxmlformats.org/officeDocument/2006/math",
    "mc": "http://schemas.openxmlformats.org/markup-compatibility/2006",
    "v": "urn:schemas-microsoft-com:vml",
    "pr": "http://schemas.openxmlformats.org/package/2006/relationships",
}
W, R, WP, A, PIC, M, MC, V, PR = (f"{{{_NS[k]}}}" for k in ("w", "r", "wp", "a", "pic", "m", "mc", "v", "pr"))
# ISO 29500 Strict names the same elements in other namespaces: read as the usual ones.
_STRICT = {
    "http://purl.oclc.org/ooxml/wordprocessingml/main": _NS["w"],
    "http://purl.oclc.org/ooxml/officeDocument/relationships": _NS["r"],
    "http://purl.oclc.org/ooxml/drawingml/wordprocessingDrawing": _NS["wp"],
    "http://purl.oclc.org/ooxml/drawingml/main": _NS["a"],
    "http://purl.oclc.org/ooxml/drawingml/picture": _NS["pic"],
    "http://purl.oclc.org/ooxml/officeDocument/math": _NS["m"],
}
# Fields whose result is the layout's count of pages, stale in any copy of the file.
_COUNTER_FIELDS = frozenset({"PAGE", "NUMPAGES", "SECTIONPAGES"})
_WORD_STYLE_HEADING = re.compile(r"heading\s*([1-9])$")
# A table of contents' styles, by their built-in names (Word's "toc 1", LibreOffice's
# "Contents 1" in a .docx it wrote) and its title's.
# Word's built-in list styles past the first ("List Bullet 2", "List Number 3"): each is
# numbered by a one-level list of its own (level 0), nested only by its indentation.
_NESTED_LIST_STYLE = re.compile(r"list(?:\s+(?:bullet|number))?\s+([2-9])$")
_CONTENTS_STYLE = re.compile(r"(toc|contents)\s*([1-9]|heading)$")
_ON = frozenset({None, "1", "true", "on"})  # a toggle's w:val; absent means on
_MAX_STYLE_CHAIN = 32
_MAX_ANCHOR_CHARS = 80


def docx_text(z: ZipDocument) -> ZippedText:
    return _Reader(z).read()


def _toggle(el: ET.Element | None) -> bool:
    return el is not None and el.get(f"{W}val") in _ON


def _val(el: ET.Element | None, default: str | None = None) -> str | None:
    return el.get(f"{W}val", default) if el is not None else default


class _Styles:
    """What a paragraph or character style means for the text: heading level, list level,
    hidden, a page break before; each looked up through the styles it is based on."""

    def __init__(self, root: ET.Element | None) -> None:
        self.by_id: dict[str, ET.Element] = {}
        self.default_paragraph: str | None = None
        for style in root.iter(f"{W}style") if root is not None else ():
            sid = style.get(f"{W}styleId")
            if sid is None:
                continue
            self.by_id[sid] = style
            if style.get(f"{W}type") == "paragraph" and style.get(f"{W}default") in ("1", "true", "on"):
                self.default_paragraph = sid

    def _chain(self, sid: str | None):
        seen: set[str] = set()
        while sid is not None and sid in self.by_id and sid not in seen and len(seen) < _MAX_STYLE_CHAIN:
            seen.add(sid)
            style = self.by_id[sid]
            yield style
            sid = _val(style.find(f"{W}basedOn"))

    def heading_level(self, sid: str | None) -> int:
        """1..9 for a heading style (by its outline level, else its built-in name: Word
        stores "heading 1" in English whatever the user's language), 1 for Title, else 0."""
        for style in self._chain(sid):
            level = _val(style.find(f"{W}pPr/{W}outlineLvl"))
            if level is not None and level.isdecimal():
                return int(level) + 1 if int(level) < 9 else 0  # 9: body text
            name = (_val(style.find(f"{W}name")) or "").strip().lower()
            if name == "title":
                return 1
            if m := _WORD_STYLE_HEADING.match(name):
                return int(m.group(1))
        return 0

    def list_level(self, sid: str | None) -> int | None:
        for style in self._chain(sid):
            num = style.find(f"{W}pPr/{W}numPr")
            if num is not None:
                if _val(num.find(f"{W}numId")) == "0":
                    return None
                return _level(num) if num.find(f"{W}ilvl") is not None else self.nesting(sid)
        return None

    def nesting(self, sid: str | None) -> int:
        """How deep a paragraph of a built-in nested list style sits ("List Bullet 2": 1),
        its level in its own list being 0; 0 for any other style."""
        for style in self._chain(sid):
            if m := _NESTED_LIST_STYLE.match((_val(style.find(f"{W}name")) or "").strip().lower()):
                return int(m.group(1)) - 1
        return 0

    def numbering(self, sid: str | None) -> tuple[str | None, int | None]:
        """(numId, level) of the first style in the chain that numbers its paragraphs; a
        level only where that style names one."""
        for style in self._chain(sid):
            num = style.find(f"{W}pPr/{W}numPr")
            if num is not None:
                ilvl = _val(num.find(f"{W}ilvl"))
                return _val(num.find(f"{W}numId")), _level(num) if ilvl is not None else None
        return None, None

    def contents_entry(self, sid: str | None) -> bool:
        """A table of contents' entry or title, by its style."""
        return any(_CONTENTS_STYLE.match((_val(style.find(f"{W}name")) or "").strip().lower())
                   for style in self._chain(sid))

    def hidden(self, sid: str | None) -> bool:
        return self._first_toggle(sid, f"{W}rPr/{W}vanish")

    def break_before(self, sid: str | None) -> bool:
        return self._first_toggle(sid, f"{W}pPr/{W}pageBreakBefore")

    def _first_toggle(self, sid: str | None, path: str) -> bool:
        """The on/off property at `path` of the first style in the chain that sets it."""
        for style in self._chain(sid):
            flag = style.find(path)
            if flag is not None:
                return _toggle(flag)
        return False


def _level(num: ET.Element) -> int:
    ilvl = _val(num.find(f"{W}ilvl"), "0") or "0"
    return min(int(ilvl), 8) if ilvl.isdecimal() else 0


class _Line(LinePieces):
    """The text of one paragraph (or table cell, note, heading) as its runs are read
    (`layout.LinePieces`). `on_break`: what a page break inside does (a body paragraph ends
    its part there); None: remembered in `broke` for the caller (a table row goes to the
    page it ends on)."""

    def __init__(self, captures: dict[str, list[str]] | None, one_line: bool = False,
                 on_break: Callable[[str], None] | None = None) -> None:
        super().__init__(captures, one_line)
        self.on_break = on_break
        self.broke: str | None = None

    def page_break(self, kind: str) -> None:
        if self.on_break is not None:
            self.on_break(kind)
        elif self.broke != HARD:
            self.broke = kind

    def take(self) -> str:
        text, self.parts = "".join(self.parts), []
        return text


@dataclass
class _Counts:
    images: int = 0
    described: int = 0  # images, charts or diagrams with alt text (read as "[image: ...]")
    charts: int = 0
    objects: int = 0  # embedded OLE objects (a spreadsheet, an equation of the old editor)
    embedded: int = 0  # altChunk: a document imported whole (HTML, RTF) that Word renders
    deletions: int = 0
    hidden: int = 0
    unreferenced_comments: int = 0
    notes_missing: list[str] = field(default_factory=list)


class _Reader:
    def __init__(self, z: ZipDocument) -> None:
        self.z = z
        self.main = self._main_part()
        self.rels = self._relationships(self.main)
        self.styles = _Styles(self._related_xml("styles"))
        self.numbers = Numbering(self._related_xml("numbering"), lambda sid: self.styles.numbering(sid)[0])
        self.footnotes = self._notes("footnotes", "footnote")
        self.endnotes = self._notes("endnotes", "endnote")
        self.comments = self._comments()
        self.counts = _Counts()
        self.fields: list[list] = []  # open fields: [state "code"/"result"/"hidden", instruction]
        self.captures: dict[str, list[str]] = {}  # comment id -> words since its range started
        self.anchors: dict[str, str] = {}  # comment id -> the words its range held
        self.pending: list[str] = []  # footnotes and comments of the paragraph being read
        self.deferred: list[ET.Element] = []  # text boxes of the paragraph being read
        self.carry = ""  # a paragraph whose mark was deleted: its text joins the next one
        self.n_footnotes = self.n_endnotes = 0
        self.used_comments: set[str] = set()
        self.layout = Layout(paged=False)
        self.in_contents = False  # inside a content control Word made for a table of contents

    # ---- parts ---------------------------------------------------------------------

    def _xml(self, name: str, required: bool = True) -> ET.Element | None:
        root = self.z.xml(name, required=required)
        if root is not None and root.tag.startswith("{http://purl.oclc.org/ooxml/"):
            _to_transitional(root)
        return root

    def _main_part(self) -> str:
        rels = self._xml("_rels/.rels", required=False)
        for rel in rels.iter(f"{PR}Relationship") if rels is not None else ():
            if rel.get("Type", "").endswith("/officeDocument") and rel.get("TargetMode") != "External":
                name = resolve("", rel.get("Target", ""))
                if self.z.has(name):
                    return name
        if self.z.has("word/document.xml"):
            return "word/document.xml"
        raise DamagedDocument("no main document part (word/document.xml)")

    def _relationships(self, part: str) -> dict[str, tuple[str, str]]:
        """rId -> (type's last word, member name) of a part's internal relationships."""
        folder, name = posixpath.split(part)
        root = self._xml(posixpath.join(folder, "_rels", f"{name}.rels"), required=False)
        out: dict[str, tuple[str, str]] = {}
        for rel in root.iter(f"{PR}Relationship") if root is not None else ():
            if rel.get("TargetMode") != "External" and rel.get("Id"):
                out[rel.get("Id", "")] = (rel.get("Type", "").rsplit("/", 1)[-1], resolve(part, rel.get("Target", "")))
        return out

    def _related_xml(self, kind: str) -> ET.Element | None:
        target = next((name for typ, name in self.rels.values() if typ == kind), None)
        return self._xml(target, required=False) if target else None

    def _notes(self, kind: str, element: str) -> dict[str, ET.Element]:
        root = self._related_xml(kind)
        notes: dict[str, ET.Element] = {}
        for note in root.iter(f"{W}{element}") if root is not None else ():
            if note.get(f"{W}type") in (None, "normal"):  # not the separator lines
                notes[note.get(f"{W}id", "")] = note
        return notes

    def _comments(self) -> dict[str, ET.Element]:
        root = self._related_xml("comments")
        return {c.get(f"{W}id", ""): c for c in root.iter(f"{W}comment")} if root is not None else {}

    # ---- the document ----------------------------------------------------------------

    def read(self) -> ZippedText:
        root = self._xml(self.main)
        body = root.find(f"{W}body") if root is not None else None
        if body is None:
            raise DamagedDocument(f"{self.main} has no body")
        self.layout = Layout(paged=any(True for _ in body.iter(f"{W}lastRenderedPageBreak")))
        self._blocks(body)
        self._flush_paragraph_extras()
        if self.carry.strip():
            self.layout.block(self.carry)
        for cid in self.comments:  # in a header, or never referenced: at the end, in their order
            if cid not in self.used_comments:
                self.layout.end_note(self._comment_line(cid, self.anchors.get(cid, "")))
        self._headers_and_footers(body)
        texts, paragraphs = self.layout.finish()
        return ZippedText(texts, paged=self.layout.paged, source_lines=paragraphs, left_out=self._left_out(),
                          images=self.counts.images)

    def _blocks(self, container: ET.Element) -> None:
        for child in container:
            tag = child.tag
            if tag == f"{W}p":
                self._paragraph(child)
            elif tag == f"{W}tbl":
                self._table(child)
            elif tag == f"{W}sdt":  # a content control (a cover page, a table of contents)
                content = child.find(f"{W}sdtContent")
                if content is not None:
                    gallery = _val(child.find(f"{W}sdtPr/{W}docPartObj/{W}docPartGallery")) or ""
                    was, self.in_contents = self.in_contents, self.in_contents or gallery.lower() == "table of contents"
                    self._blocks(content)
                    self.in_contents = was
            elif tag in (f"{W}customXml", f"{W}ins", f"{W}moveTo"):
                self._blocks(child)
            elif tag in (f"{W}del", f"{W}moveFrom"):
                self.counts.deletions += 1
            elif tag == f"{MC}AlternateContent":
                chosen = _chosen(child)
                if chosen is not None:
                    self._blocks(chosen)
            elif tag == f"{W}altChunk":
                self.counts.embedded += 1

    def _paragraph(self, p: ET.Element) -> None:
        ppr = p.find(f"{W}pPr")
        style = _val(ppr.find(f"{W}pStyle")) if ppr is not None else None
        style = style or self.styles.default_paragraph
        level = self._heading_level(ppr, style)
        item = None if level else self._list_level(ppr, style)
        kind = HEADING if level else ITEM if item is not None else PARA
        mark_deleted = ppr is not None and ppr.find(f"{W}rPr/{W}del") is not None
        # Its number, counted; not where its mark is deleted (its words join the next
        # paragraph, numbered as that one is).
        label = None if mark_deleted else self._number(ppr, style)
        # A table of contents' entry is left out (`Layout.leaving_out`), its ¶ counted.
        contents = self.in_contents or self.styles.contents_entry(style)
        if (ppr is not None and _toggle(ppr.find(f"{W}pageBreakBefore"))) or (
                (ppr is None or ppr.find(f"{W}pageBreakBefore") is None) and self.styles.break_before(style)):
            self.layout.page_break(HARD)
        parts_written = False

        def page_break(kind_of_break: str) -> None:
            # The words before a break mid-paragraph are on the page before it.
            nonlocal parts_written
            text = self.carry + line.take()
            if text.strip():
                write(text)
                self.carry, parts_written = "", True
            self.layout.page_break(kind_of_break)

        def write(text: str) -> None:
            if kind == HEADING and label and not parts_written and text.strip():
                text = f"{label} {text}"
            self.layout.block(text, kind, level or (item or 0), continued=parts_written, marker=label or True)

        line = _Line(self.captures, one_line=kind == HEADING, on_break=page_break)
        self.layout.leaving_out = contents
        self._inline(p, line, style)
        self._close_field_codes()
        text = self.carry + line.take()
        if mark_deleted:
            # Its mark deleted, as the change is accepted: one paragraph with the next
            # (which writes its notes).
            self.carry = text
            self.counts.deletions += 1
        else:
            self.carry = ""
            write(text)
            self._flush_paragraph_extras()
        self.layout.leaving_out = False
        sect = ppr.find(f"{W}sectPr") if ppr is not None else None
        if sect is not None and _val(sect.find(f"{W}type"), "nextPage") != "continuous":
            self.layout.page_break(HARD)  # a section that starts on a new page (the default)

    def _heading_level(self, ppr: ET.Element | None, style: str | None) -> int:
        direct = _val(ppr.find(f"{W}outlineLvl")) if ppr is not None else None
        if direct is not None and direct.isdecimal():
            return int(direct) + 1 if int(direct) < 9 else 0
        return self.styles.heading_level(style)

    def _list_level(self, ppr: ET.Element | None, style: str | None) -> int | None:
        num = ppr.find(f"{W}numPr") if ppr is not None else None
        if num is not None:
            if _val(num.find(f"{W}numId")) == "0":  # numbering switched off for this paragraph
                return None
            return _level(num) if num.find(f"{W}ilvl") is not None else self.styles.nesting(style)
        return self.styles.list_level(style)

    def _number(self, ppr: ET.Element | None, style: str | None) -> str | None:
        """The number Word shows before a paragraph ("1.2", "(a)"), counted; "" for a
        bullet; None where it is not numbered (or by numbering the file does not define).
        Its own numbering, else its style's (a heading style linked to a list)."""
        num = ppr.find(f"{W}numPr") if ppr is not None else None
        num_id = _val(num.find(f"{W}numId")) if num is not None else None
        ilvl = _level(num) if num is not None and num.find(f"{W}ilvl") is not None else None
        if num_id is None:
            num_id, style_ilvl = self.styles.numbering(style)
            ilvl = ilvl if ilvl is not None else style_ilvl
        if num_id is None or num_id == "0":
            return None
        return self.numbers.label(num_id, ilvl, style)

    def _flush_paragraph_extras(self) -> None:
        """The notes referenced in the paragraph just written, after its page's text, and
        its text boxes, as paragraphs after it."""
        for note in self.pending:
            self.layout.note(note)
        self.pending = []
        boxes, self.deferred = self.deferred, []
        for box in boxes:
            self._blocks(box)

    def _table(self, tbl: ET.Element) -> None:
        for row in _rows(tbl):
            trpr = row.find(f"{W}trPr")
            if trpr is not None and trpr.find(f"{W}del") is not None:
                self.counts.deletions += 1
                continue
            # Grid columns a row skips (gridBefore) and a merged cell spans past its own
            # (gridSpan) are empty cells: the cells after them stay under their headers.
            cells: list[str] = [""] * _grid_count(trpr, "gridBefore", 0)
            broke: str | None = None
            for cell in _cells(row):
                line = _Line(self.captures, one_line=True)
                self._cell(cell, line)
                cells.append(" ".join(line.take().split()))
                cells += [""] * (_grid_count(cell.find(f"{W}tcPr"), "gridSpan", 1) - 1)
                broke = broke or line.broke
            if broke is not None:  # a row is on the page it starts on: Word marks the break in it
                self.layout.page_break(broke)
            self.layout.table_row(cells)
        self._flush_paragraph_extras()  # the table's notes after it, not between its rows

    def _cell(self, cell: ET.Element, line: _Line) -> None:
        """A table cell's paragraphs on one line; a table inside it flattened: its cells
        joined by " / ", its rows by "; "."""
        for child in cell:
            if child.tag == f"{W}p":
                ppr = child.find(f"{W}pPr")
                style = _val(child.find(f"{W}pPr/{W}pStyle"))
                if ppr is None or ppr.find(f"{W}rPr/{W}del") is None:
                    label = self._number(ppr, style or self.styles.default_paragraph)
                    line.add(f"{label} " if label else "")
                self._inline(child, line, style)
                self._close_field_codes()
                line.add(" ")
            elif child.tag == f"{W}tbl":
                rows = []
                for row in _rows(child):
                    texts = []
                    for inner in _cells(row):
                        nested = _Line(self.captures, one_line=True)
                        self._cell(inner, nested)
                        texts.append(" ".join(nested.take().split()))
                        line.broke = line.broke or nested.broke
                    rows.append(" / ".join(t for t in texts if t))
                line.add(" " + "; ".join(r for r in rows if r) + " ")
            elif child.tag in (f"{W}sdt", f"{W}customXml"):
                content = child.find(f"{W}sdtContent") if child.tag == f"{W}sdt" else child
                if content is not None:
                    self._cell(content, line)

    # ---- runs ------------------------------------------------------------------------

    def _inline(self, el: ET.Element, line: _Line, style: str | None) -> None:
        for child in el:
            tag = child.tag
            if tag == f"{W}r":
                self._run(child, line, style)
            elif tag in (f"{W}hyperlink", f"{W}smartTag", f"{W}customXml", f"{W}ins", f"{W}moveTo", f"{W}bdo",
                         f"{W}dir", f"{W}sdtContent"):
                self._inline(child, line, style)
            elif tag == f"{W}fldSimple":
                if _field_name(child.get(f"{W}instr", "")) not in _COUNTER_FIELDS:
                    self._inline(child, line, style)
            elif tag == f"{W}sdt":
                content = child.find(f"{W}sdtContent")
                if content is not None:
                    self._inline(content, line, style)
            elif tag in (f"{W}del", f"{W}moveFrom"):
                if any((t.text or "").strip() for t in child.iter(f"{W}delText")) or child.find(f".//{W}t") is not None:
                    self.counts.deletions += 1
            elif tag == f"{W}commentRangeStart":
                self.captures[child.get(f"{W}id", "")] = []
            elif tag == f"{W}commentRangeEnd":
                cid = child.get(f"{W}id", "")
                if cid in self.captures:
                    self.anchors[cid] = "".join(self.captures.pop(cid))
            elif tag in (f"{M}oMath", f"{M}oMathPara"):
                line.add(" ".join(t.text or "" for t in child.iter(f"{M}t")))
            elif tag == f"{MC}AlternateContent":
                chosen = _chosen(child)
                if chosen is not None:
                    self._inline(chosen, line, style)

    def _run(self, run: ET.Element, line: _Line, style: str | None) -> None:
        rpr = run.find(f"{W}rPr")
        hidden = self._hidden(rpr, style)
        self._run_content(run, line, hidden)

    def _run_content(self, run: ET.Element, line: _Line, hidden: bool) -> None:
        for child in run:
            tag = child.tag
            if tag == f"{W}fldChar":
                self._field_char(child.get(f"{W}fldCharType", ""))
            elif tag == f"{W}instrText":
                if self.fields:
                    self.fields[-1][1] += child.text or ""
            elif hidden:
                if tag == f"{W}t" and (child.text or "").strip():
                    self.counts.hidden += 1
            elif tag == f"{W}t":
                if self._showing():
                    line.add(child.text or "")
            elif tag in (f"{W}tab", f"{W}ptab"):
                line.add("\t")
            elif tag == f"{W}br":
                kind = child.get(f"{W}type")
                if kind == "page":
                    line.page_break(HARD)
                else:
                    line.add(" " if kind == "column" else "\n")
            elif tag == f"{W}cr":
                line.add("\n")
            elif tag == f"{W}noBreakHyphen":
                line.add("-")
            elif tag == f"{W}lastRenderedPageBreak":
                line.page_break(RENDERED)
            elif tag == f"{W}footnoteReference":
                self._note_reference(child, line, footnote=True)
            elif tag == f"{W}endnoteReference":
                self._note_reference(child, line, footnote=False)
            elif tag == f"{W}commentReference":
                self._comment_reference(child.get(f"{W}id", ""))
            elif tag == f"{W}drawing":
                self._drawing(child, line)
            elif tag == f"{W}pict":
                self._vml(child, line)
            elif tag == f"{W}object":
                self.counts.objects += 1
            elif tag == f"{MC}AlternateContent":
                chosen = _chosen(child)
                if chosen is not None:
                    self._run_content(chosen, line, hidden)
            elif tag == f"{W}ruby" and not hidden:
                # East Asian text with its reading above it (furigana): the text is its base;
                # the reading (w:rt) is a guide to it, as ODF's text:ruby-text is left out
                base = child.find(f"{W}rubyBase")
                if base is not None:
                    self._inline(base, line, None)

    def _hidden(self, rpr: ET.Element | None, paragraph_style: str | None) -> bool:
        vanish = rpr.find(f"{W}vanish") if rpr is not None else None
        if vanish is not None:
            return _toggle(vanish)
        run_style = _val(rpr.find(f"{W}rStyle")) if rpr is not None else None
        return self.styles.hidden(run_style) or self.styles.hidden(paragraph_style)

    # ---- fields ----------------------------------------------------------------------

    def _field_char(self, kind: str) -> None:
        if kind == "begin":
            self.fields.append(["code", ""])
        elif kind == "separate" and self.fields:
            self.fields[-1][0] = "hidden" if _field_name(self.fields[-1][1]) in _COUNTER_FIELDS else "result"
        elif kind == "end" and self.fields:
            self.fields.pop()

    def _showing(self) -> bool:
        """Whether text now is a field's result (or no field's): not its code."""
        return all(state == "result" for state, _ in self.fields)

    def _close_field_codes(self) -> None:
        """A field code, or a page counter's result, does not run past its paragraph: one
        left open (a file cut short, a converter's slip) would hide the rest of the
        document. (A field's result may: a table of contents runs over many.)"""
        for f in self.fields:
            if f[0] in ("code", "hidden"):
                f[0] = "result"

    # ---- notes and comments ----------------------------------------------------------

    def _note_reference(self, ref: ET.Element, line: _Line, *, footnote: bool) -> None:
        custom = ref.get(f"{W}customMarkFollows") in ("1", "true", "on")
        if footnote:
            self.n_footnotes += 1
            mark, kind, notes = str(self.n_footnotes), "footnote", self.footnotes
        else:
            self.n_endnotes += 1
            mark, kind, notes = roman(self.n_endnotes), "endnote", self.endnotes
        if custom:  # its mark is the run after it ("*"), read as text
            self.n_footnotes -= footnote
            self.n_endnotes -= not footnote
        else:
            line.add(f"[^{mark}]")
        note = notes.get(ref.get(f"{W}id", ""))
        text = self._note_text(note) if note is not None else ""
        if not text:
            return
        entry = f"[{kind}{'' if custom else ' ' + mark}: {text}]"
        if footnote:
            self.pending.append(entry)
        else:  # printed at the end, with the ¶ of the paragraph (or row) being read: taken after it was one early
            self.layout.end_note(entry, self.layout.paragraphs + 1)

    def _note_text(self, note: ET.Element) -> str:
        """A note's or comment's paragraphs as one line (its own mark left out)."""
        fields, self.fields = self.fields, []
        line = _Line(None, one_line=True)
        for p in [note] if note.tag == f"{W}p" else _paragraphs(note):
            self._inline(p, line, _val(p.find(f"{W}pPr/{W}pStyle")))
            line.add(" ")
        self.fields = fields
        return " ".join(line.take().split())

    def _comment_reference(self, cid: str) -> None:
        if cid not in self.comments or cid in self.used_comments:
            return
        self.used_comments.add(cid)
        anchor = self.anchors.pop(cid, None)
        if anchor is None:
            anchor = "".join(self.captures.pop(cid, []))
        self.pending.append(self._comment_line(cid, anchor))

    def _comment_line(self, cid: str, anchor: str) -> str:
        comment = self.comments[cid]
        author = (comment.get(f"{W}author") or "").strip()
        anchor = " ".join(anchor.split())
        if len(anchor) > _MAX_ANCHOR_CHARS:
            anchor = anchor[: _MAX_ANCHOR_CHARS - 1].rstrip() + "\u2026"
        on = f' on "{anchor}"' if anchor else ""
        return f"[comment{' by ' + author if author else ''}{on}: {self._note_text(comment)}]"

    # ---- drawings --------------------------------------------------------------------

    def _drawing(self, drawing: ET.Element, line: _Line) -> None:
        for shape in drawing:  # wp:inline or wp:anchor
            props = shape.find(f"{WP}docPr")
            alt = " ".join(((props.get("descr") or props.get("title") or "") if props is not None else "").split())
            data = shape.find(f"{A}graphic/{A}graphicData")
            uri = data.get("uri", "") if data is not None else ""
            pictures = sum(1 for _ in shape.iter(f"{PIC}pic"))
            boxes = list(shape.iter(f"{W}txbxContent"))
            if uri.endswith("/chart") or uri.endswith("/chartex"):
                self.counts.charts += 1
                self._described(line, "chart", alt)
            elif uri.endswith("/diagram"):
                text = self._diagram_text(data)
                line.add(f" [diagram: {text}] " if text else "")
                if not text:
                    self.counts.charts += 1
                    self._described(line, "diagram", alt)
            elif pictures:
                self.counts.images += pictures
                self._described(line, "image", alt)
            elif alt and not boxes:  # a shape with a description
                line.add(f" [shape: {alt}] ")
            for box in boxes:
                self._text_box(box, line)

    def _described(self, line: _Line, what: str, alt: str) -> None:
        if alt:
            self.counts.described += 1
            line.add(f" [{what}: {alt}] ")

    def _diagram_text(self, data: ET.Element | None) -> str:
        """SmartArt's words, from its data part (the drawing holds only a picture of them)."""
        ids = next((c for c in data if local(c.tag) == "relIds"), None) if data is not None else None
        target = self.rels.get(ids.get(f"{R}dm", "")) if ids is not None else None
        root = self._xml(target[1], required=False) if target else None
        if root is None:
            return ""
        words = [" ".join((t.text or "").split()) for t in root.iter(f"{A}t")]
        return " / ".join(w for w in words if w)

    def _vml(self, pict: ET.Element, line: _Line) -> None:
        """Word 2003's drawings: pictures, text boxes, and a watermark's words."""
        for shape in pict.iter():
            if shape.tag == f"{V}imagedata":
                self.counts.images += 1
            elif shape.tag == f"{V}textpath" and shape.get("string"):
                line.add(f" [watermark: {shape.get('string')}] ")
            elif shape.tag == f"{W}txbxContent":
                self._text_box(shape, line)
        alts = [s.get("alt") for s in pict.iter() if s.get("alt")]
        if alts:
            self._described(line, "image", " ".join(alts[0].split()))

    def _text_box(self, box: ET.Element, line: _Line) -> None:
        if line.on_break is not None:  # in a body paragraph: its own paragraphs, after it
            self.deferred.append(box)
            return
        for p in _paragraphs(box):
            self._inline(p, line, None)
            line.add(" ")

    # ---- headers, footers, what was left out -----------------------------------------

    def _headers_and_footers(self, body: ET.Element) -> None:
        """The distinct texts of its headers and footers, once each (a running title, a
        document number, "Confidential"), after the first page's text."""
        seen: set[str] = set()
        for sect in body.iter(f"{W}sectPr"):
            for ref in sect:
                kind = "header" if ref.tag == f"{W}headerReference" else "footer" if ref.tag == f"{W}footerReference" else ""
                target = self.rels.get(ref.get(f"{R}id", "")) if kind else None
                if target is None or target[1] in seen:
                    continue
                seen.add(target[1])
                root = self._xml(target[1], required=False)
                said = [t for t in (self._note_text(p) for p in _paragraphs(root)) if says_something(t)] if root is not None else []
                if said:
                    self.layout.front_note(f"[{kind}: {' / '.join(said)}]")

    def _left_out(self) -> list[str]:
        c = self.counts
        return left_out_notes([count_of(c.images, "image"), count_of(c.charts, "chart or diagram", "charts or diagrams"),
                               count_of(c.objects, "embedded object"), count_of(c.embedded, "embedded document"),
                               count_of(self.layout.left_out, "table-of-contents entry", "table-of-contents entries")],
                              c.described, c.deletions, c.hidden)


def _to_transitional(root: ET.Element) -> None:
    """A Strict document's names rewritten to the usual ones, in place."""
    def renamed(name: str) -> str:
        if name.startswith("{"):
            ns, _, rest = name[1:].partition("}")
            return f"{{{_STRICT.get(ns, ns)}}}{rest}"
        return name

    for el in root.iter():
        el.tag = renamed(el.tag)
        if el.attrib:
            el.attrib = {renamed(k): v for k, v in el.attrib.items()}


def _chosen(alternate: ET.Element) -> ET.Element | None:
    """One reading of an mc:AlternateContent, never both: the first Choice (Word's
    drawing), else the Fallback (its VML copy)."""
    return alternate.find(f"{MC}Choice") if alternate.find(f"{MC}Choice") is not None else alternate.find(f"{MC}Fallback")


def _paragraphs(el: ET.Element):
    """The paragraphs under `el` in order, not those inside a paragraph (a text box's,
    which its paragraph reads)."""
    for child in el:
        if child.tag == f"{W}p":
            yield child
        else:
            yield from _paragraphs(child)


_MAX_GRID_SPAN = 100  # Word's tables have at most 63 columns; more is a broken file's number


def _grid_count(props: ET.Element | None, name: str, default: int) -> int:
    """A row's `gridBefore` or a cell's `gridSpan`: grid columns, `default` where not given."""
    value = _val(props.find(f"{W}{name}")) if props is not None else None
    return min(int(value), _MAX_GRID_SPAN) if value and value.isdecimal() else default


def _rows(tbl: ET.Element):
    return _wrapped(tbl, f"{W}tr")


def _cells(row: ET.Element):
    return _wrapped(row, f"{W}tc")


def _wrapped(parent: ET.Element, tag: str):
    """`parent`'s children of `tag`, also those a content control or custom XML wraps."""
    for child in parent:
        if child.tag == tag:
            yield child
        elif child.tag in (f"{W}sdt", f"{W}customXml"):
            content = child.find(f"{W}sdtContent") if child.tag == f"{W}sdt" else child
            if content is not None:
                yield from _wrapped(content, tag)


def _field_name(instruction: str) -> str:
    words = instruction.split()
    return words[0].upper() if words else ""
