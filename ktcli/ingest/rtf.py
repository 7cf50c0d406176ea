"""A Rich Text Format file (.rtf: WordPad, TextEdit, many exports and e-mail clients) as the
text a reader sees, laid out by `ingest.layout` as a Word document is: a paragraph a line,
table rows with " | " between cells, cited by paragraph (¶). Read raw, a 121 KB contract of
two sentences was 108K tokens of control words and a picture's hex.

RTF is 7-bit text: groups in braces, control words (`\\par`, `\\b0`), `\\'e9` for a byte
of the document's code page (`\\ansicpg1252`), `\\u1046?` for a Unicode character
followed by `\\uc` fallback characters to skip. Destinations that hold no text of the
document (font and colour tables, style sheets, document info, pictures, field
instructions, anything marked `\\*`) are skipped; a field's shown result is read. A
footnote is read as Word's are: "[^1]" where it is referenced, "[footnote 1: its text]"
on the line after its paragraph (an endnote, `\\ftnalt`, "[^i]", at the end).
"""

from __future__ import annotations

import codecs
import re

from ktcli.ingest.layout import PARA, Layout, count_of, left_out_notes
from ktcli.ingest.wordnumbers import roman
from ktcli.ingest.zipdoc import ZippedText

RTF_MAGIC = b"{\\rtf"
# Destinations whose text is not the document's.
_SKIPPED = frozenset({
    "fonttbl", "colortbl", "stylesheet", "info", "pict", "fldinst", "themedata", "colorschememapping",
    "datastore", "latentstyles", "listtable", "listoverridetable", "rsidtbl", "generator", "xmlnstbl", "filetbl",
    "revtbl", "pgdsctbl", "objdata", "objclass", "mmathPr", "header", "footer", "headerl", "headerr", "headerf",
    "footerl", "footerr", "footerf", "annotation", "atnid", "atnauthor", "bkmkstart", "bkmkend",
    "nonshppict", "sp", "sn", "sv", "template", "wgrffmtfilter", "defchp", "defpap",
})  # (a shape's text box, \shptxt inside \shpinst, is read; its properties are not)
# Destinations marked ignorable (\\*) whose text is the document's: a shape's, holding its
# text box (\\shptxt); its properties (\\sp) are skipped inside.
_READ_STARRED = frozenset({"shpinst"})
# Control words that are characters.
_CHARACTERS = {"tab": "\t", "emdash": "\u2014", "endash": "\u2013", "bullet": "\u2022", "lquote": "\u2018",
               "rquote": "\u2019", "ldblquote": "\u201c", "rdblquote": "\u201d", "emspace": " ", "enspace": " ",
               "qmspace": " ", "~": "\u00a0", "_": "\u2011", "line": "\n"}
_TOKEN = re.compile(rb"\\([a-zA-Z]+)(-?\d+)? ?|\\'([0-9a-fA-F]{2})|\\(.)|([{}])|([^\\{}\r\n]+)|[\r\n]+", re.DOTALL)


class _Group:
    __slots__ = ("skip", "uc", "hidden")

    def __init__(self, skip: bool = False, uc: int = 1, hidden: bool = False) -> None:
        self.skip, self.uc, self.hidden = skip, uc, hidden  # hidden: \v text, not shown (as Word's w:vanish)


def rtf_text(data: bytes) -> ZippedText:
    """The text of an RTF file's body, a paragraph a block; what was not read (pictures,
    headers and footers, notes) said."""
    reader = _Reader()
    reader.read(data)
    texts, paragraphs = reader.layout.finish()
    notes = left_out_notes([count_of(reader.pictures, "image")], 0, 0, 0)
    if reader.skipped_notes:
        notes.append(f"{count_of(reader.skipped_notes, 'header, footer or note', 'headers, footers or notes')} not read")
    if reader.hidden_text:
        notes.append("hidden text left out")
    return ZippedText(texts, source_lines=paragraphs, left_out=notes, images=reader.pictures)


class _Reader:
    def __init__(self) -> None:
        self.layout = Layout(paged=False)
        self.stack = [_Group()]
        self.codepage = "cp1252"
        self.line: list[str] = []
        self.cells: list[str] = []
        self.pending = bytearray()  # \'hh bytes of the code page, decoded together (a multi-byte one's)
        self.fallback = 0  # characters after \uN still to skip
        self.destination_next = False  # after \*: the next control word names an ignorable destination
        self.pictures = 0
        self.skipped_notes = 0
        self.hidden_text = False  # a \v run was met (and left out)
        self.in_table = False  # in a table's paragraph (\intbl up to \pard or \row)
        # A footnote being read: the stack's depth its group opened at, and the body's line,
        # cells and table state, put aside while its text is read into `line`.
        self.note_depth = 0
        self.body: tuple[list[str], list[str], bool] | None = None
        self.endnote = False  # the note read is an endnote (\ftnalt)
        self.n_footnotes = self.n_endnotes = 0
        self.notes: list[str] = []  # footnotes of the paragraph being read

    def read(self, data: bytes) -> None:
        at = 0
        while at < len(data):
            m = _TOKEN.match(data, at)
            if m is None:  # a lone "\" at the very end
                break
            at = m.end()
            word, arg, hexbyte, symbol, brace, text = m.groups()
            if hexbyte is not None:
                if self.fallback:
                    self.fallback -= 1
                elif not self.stack[-1].skip and not self.stack[-1].hidden:
                    self.pending.append(int(hexbyte, 16))
                continue
            if text is not None:
                self._text(text)
                continue
            self._flush_bytes()
            if brace is not None:
                self._brace(brace)
            elif word == b"bin" and arg is not None:
                at += max(0, int(arg))  # \binN: N raw bytes of binary data, braces in it no groups
            elif word is not None:
                self._word(word.decode("ascii"), int(arg) if arg is not None else None)
            elif symbol is not None:
                self._symbol(symbol.decode("latin-1"))
        self._flush_bytes()
        self._paragraph()

    def _brace(self, brace: bytes) -> None:
        self.fallback = 0
        if brace == b"{":
            top = self.stack[-1]
            self.stack.append(_Group(top.skip, top.uc, top.hidden))
        elif len(self.stack) > 1:
            self.stack.pop()
            if self.note_depth and len(self.stack) < self.note_depth:
                self._end_note()

    def _word(self, word: str, arg: int | None) -> None:
        group = self.stack[-1]
        if self.destination_next and word in _READ_STARRED:
            self.destination_next = False
            return
        if word == "footnote" and not self.destination_next and not group.skip and not self.note_depth:
            self._start_note()
            return
        if self.destination_next or word in _SKIPPED:
            self.destination_next = False
            if not group.skip:
                if word == "pict":
                    self.pictures += 1
                elif word in ("header", "footer", "footnote", "annotation") or word.startswith(("header", "footer")):
                    self.skipped_notes += 1
            group.skip = True
            return
        if self.fallback:  # a control word counts as one fallback character
            self.fallback -= 1
            return
        if group.skip:
            return
        if word == "ansicpg" and arg is not None:
            self.codepage = _codepage(arg)
        elif word == "uc" and arg is not None:
            group.uc = max(0, arg)
        elif word == "v":  # hidden text (\v0 ends it): not what a reader sees
            group.hidden = arg != 0
            self.hidden_text = self.hidden_text or group.hidden
        elif word == "plain":  # character formatting reset, hidden text's among it
            group.hidden = False
        elif word == "u" and arg is not None:
            if not group.hidden:
                self.line.append(chr(arg % 65536))  # signed 16-bit; a pair of surrogates joined in _paragraph
            self.fallback = group.uc
        elif self.note_depth and word in ("par", "sect", "page", "cell", "nestcell", "row", "line"):
            self.line.append(" ")  # a note is one line
        elif word == "ftnalt" and self.note_depth:
            self.endnote = True
        elif word == "intbl":
            self.in_table = True
        elif word == "pard":
            self.in_table = False
        elif word == "par" and self.in_table:
            self.line.append(" / ")  # a cell's paragraphs on its row's line
        elif word in ("par", "sect", "page"):
            self._paragraph()
        elif word == "cell" or word == "nestcell":
            self.cells.append(_joined(self.line).strip())
            self.line = []
        elif word == "row":
            self._row()
            self.in_table = False
        elif word in _CHARACTERS and not group.hidden:
            self.line.append(_CHARACTERS[word])

    def _symbol(self, symbol: str) -> None:
        if symbol == "*":
            self.destination_next = True
            return
        if self.fallback:
            self.fallback -= 1
            return
        if self.stack[-1].skip or (self.stack[-1].hidden and symbol not in "\r\n"):
            return
        if symbol in "\\{}":
            self.line.append(symbol)
        elif symbol in _CHARACTERS:
            self.line.append(_CHARACTERS[symbol])
        elif symbol in "\r\n":
            self._paragraph()  # "\" before a line break is a \par
        # "\-" (an optional hyphen) and others show nothing

    def _text(self, text: bytes) -> None:
        """Literal bytes, in the document's code page as its \\'hh bytes are, and with them:
        a double-byte code page's character is often an escaped lead byte and a literal
        trail byte (cp932's \\'83e is "テ")."""
        if self.fallback:
            skip = min(self.fallback, len(text))
            text, self.fallback = text[skip:], self.fallback - skip
        if text and not self.stack[-1].skip and not self.stack[-1].hidden:
            self.pending.extend(text)

    def _flush_bytes(self) -> None:
        if self.pending:
            self.line.append(bytes(self.pending).decode(self.codepage, errors="replace"))
            self.pending = bytearray()

    def _paragraph(self) -> None:
        if self.note_depth:  # a note left open at the file's end
            self._end_note()
        text = _joined(self.line)
        self.line = []
        if self.cells:  # a row's last cell without its \row
            self.cells.append(text.strip())
            self._row()
            return
        self.layout.block(text, PARA)
        self._flush_notes()

    def _start_note(self) -> None:
        """`{\\footnote ...}`: its mark where it is referenced, its text read apart."""
        self.note_depth = len(self.stack)
        self.body = (self.line, self.cells, self.in_table)
        self.line, self.cells, self.endnote = [], [], False

    def _end_note(self) -> None:
        text = " ".join(_joined(self.line).split())
        self.line, self.cells, self.in_table = self.body or ([], [], False)
        self.note_depth, self.body = 0, None
        if self.endnote:
            self.n_endnotes += 1
            mark = roman(self.n_endnotes)  # as Word numbers them
            if text:
                self.layout.end_note(f"[endnote {mark}: {text}]", self.layout.paragraphs + 1)
        else:
            self.n_footnotes += 1
            mark = str(self.n_footnotes)
            if text:
                self.notes.append(f"[footnote {mark}: {text}]")
        self.line.append(f"[^{mark}]")

    def _flush_notes(self) -> None:
        for note in self.notes:
            self.layout.note(note)
        self.notes = []

    def _row(self) -> None:
        if self.line and _joined(self.line).strip():
            self.cells.append(_joined(self.line).strip())
        self.line = []
        if any(self.cells):
            self.layout.table_row(self.cells)
        self.cells = []
        self._flush_notes()


def _joined(parts: list[str]) -> str:
    """Pieces as one string, a character past the BMP (written as two \\u surrogates) whole."""
    return "".join(parts).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _codepage(number: int) -> str:
    """Python's codec for RTF's \\ansicpgN, cp1252 where Python has none."""
    name = f"cp{number}"
    try:
        codecs.lookup(name)
    except LookupError:
        return "cp1252"
    return name
