"""Text of a PDF, page by page, with pypdf, table rows kept on one line."""

from __future__ import annotations

import io
import logging
import re
import warnings
from contextlib import contextmanager
from typing import Iterable, Iterator, NamedTuple

from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

from ktcli.ingest import pdf_columns, pdf_marks
from ktcli.ingest.errors import RejectedInput, TextOverLimit
from ktcli.ingest.normalize import normalize_text
from ktcli.ingest.pdf_headings import PageSections, numbered_headings, place_bookmarks
from ktcli.ingest.running_lines import strip_running_lines


# A page's note that begins so names a page that was read, if little of it (said "read
# <doc> p.N: only 51 characters...", not "skipped": its words were the answer's).
READ_BUT = "only"


class _Errors(logging.Handler):
    """pypdf's warnings and errors while a page is read: a content stream that fails to
    decompress is logged as a warning, and the page's text comes back empty, not raised."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _quiet_pypdf() -> Iterator[_Errors]:
    """pypdf logs and warns about every repairable defect; our stderr is for the user.
    Its errors are collected instead (the caller clears them page by page)."""
    logger = logging.getLogger("pypdf")
    level, propagate = logger.level, logger.propagate
    errors = _Errors()
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.addHandler(errors)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield errors
    finally:
        logger.removeHandler(errors)
        logger.setLevel(level)
        logger.propagate = propagate


def extract_pages(data: bytes, display: str, text_limit: int | None = None,
                  ) -> tuple[list[str], list[tuple[int, str]], list[str | None], list[PageSections]]:
    """As `_extract_pages`, pypdf's log kept off stderr throughout."""
    with _quiet_pypdf():  # its labels, bookmarks and attachments too: pypdf logged "Object 32 0 not defined."
        return _extract_pages(data, display, text_limit)


def _extract_pages(data: bytes, display: str, text_limit: int | None = None,
                   ) -> tuple[list[str], list[tuple[int, str]], list[str | None], list[PageSections]]:
    """Normalised text of every page (trailing newlines stripped), in page order, and the
    pages that could not be read, as (page number, why, in words for the user): their text
    is empty, and the caller reports them (a fact on such a page must not vanish unannounced).
    Third, each page's printed label where the PDF gives one other than its number (a
    book's "iv", or "12" on its 14th page), else None. Fourth, each page's sections
    (`pdf_headings.PageSections`): the trail at its top ("Part II > Tides"; "" before the
    first) and the lines on it where others start, from its bookmarks or else its
    numbered headings.

    Raises RejectedInput for a corrupt PDF, one that needs a password, and one with no
    text on any page (scanned), each with what the user can do about it; TextOverLimit
    as soon as its text passes `text_limit` characters."""
    with _quiet_pypdf() as errors:
        cut_short = _cut_short_fact(data)
        # a file cut short in an update written after it was first saved (a form filled in,
        # a page added, a signature): pypdf reads it as it was before the update,
        # unannounced; read from its objects, the update's changes it holds are read
        recovered = _whole_objects(data) if cut_short and _EARLIER_END.search(data) else None
        opened = _pages_of(recovered, display) if recovered else None
        if opened is None:
            try:
                opened = _open(data, display)
            except _Unopened as e:
                # a file cut short: its pages up to where it stops, if its page tree came before
                if recovered is None and cut_short:
                    recovered = _whole_objects(data)
                if recovered and _ENCRYPTION.search(data):  # its /ID, in the trailer, was part of its key
                    raise _cut_short_refusal(display, "encrypted PDF: the trailer its text's key needs is "
                                             "in the part missing", cut_short) from None
                opened = _pages_of(recovered, display) if recovered else None
                if opened is None:
                    raise _cut_short_refusal(display, f"corrupt or unreadable PDF ({_short(e.__cause__ or e)})",
                                             cut_short) from None
        reader, pages = opened
        if cut_short:  # the pages its page tree names but the file lacks, in their places
            pages = _with_lost_pages(reader, pages)
        missing: list[int] = []  # pages of a file cut short whose content the file lacks
        in_part: list[int] = []  # and those whose pictures or boxes of text (form XObjects) it lacks
        texts: list[str] = []
        unread: list[tuple[int, str]] = []
        failures = 0  # pages whose content could not be read at all (not scans)
        stamped = 0  # pages that are a page-sized image and a few characters
        run_together: list[int] = []  # pages whose right-to-left words lost their spaces
        read_chars = 0
        for number, page in enumerate(pages, start=1):
            errors.messages.clear()
            if page is None or (cut_short and _content_missing(page)):
                missing.append(number)
                texts.append("")
                continue
            if cut_short and _pictures_missing(page):
                in_part.append(number)  # its text read, less what its pictures and boxes hold
            try:
                raw = pdf_marks.page_text(page)
            except DependencyError as e:
                raise RejectedInput(display, f"cannot read this PDF: {_short(e)}") from None
            except Exception as e:  # noqa: BLE001 - pypdf raises anything on broken content streams
                failures += 1
                unread.append((number, f"page could not be read ({_short(e)})"))
                raw = ""
            else:
                if errors.messages and not raw.strip():
                    failures += 1
                    unread.append((number, f"page could not be read ({_short(Exception(errors.messages[0]))})"))
                elif not raw.strip() and _has_images(page):
                    # a scanned page amid text pages: its words are in a picture we cannot read
                    unread.append((number, "no text layer, only images (a scanned page?)"))
                elif not raw.strip() and _draws_shapes(page):
                    # text exported "as curves" (print shops, Illustrator, `gs -dNoOutputFonts`)
                    # or a drawing: read as a blank page, its words vanished unannounced
                    unread.append((number, "no text layer, only drawn shapes (text drawn as outlines? run OCR on it)"))
                elif (len(raw.strip()) < _FEW_CHARACTERS and _image_coverage(page) >= _SCAN_COVERAGE
                      and not _has_invisible_text(page)):
                    # a scan with a stamp (Bates number, fax header, scanner date): the stamp
                    # read, the page's words not, and nothing said. The image must cover most
                    # of the page: a slide's picture beside its title is not a scan.
                    unread.append((number, f"{READ_BUT} {len(raw.strip())} characters of text on a page-sized image "
                                           "(a scanned page with a stamp?)"))
                    stamped += 1
            layout, rows = None, raw
            if _may_hold_table(raw):
                layout = _layout_text(page)
                rows = _rejoin_rows(raw, layout)
            if rows == raw and pdf_columns.may_be_out_of_order(raw):  # two columns read across, or a word a line
                raw = pdf_columns.reread(raw, _layout_text(page) if layout is None else layout) or raw
            else:
                raw = rows
            notes = _annotation_lines(page, raw)
            if notes:
                raw = raw.rstrip("\n") + "\n" + "\n".join(notes)
            texts.append(normalize_text(raw).rstrip("\n"))
            if _rtl_words_run_together(texts[-1]):
                run_together.append(number)
            read_chars += len(texts[-1]) + 1
            if text_limit is not None and read_chars > text_limit:
                raise TextOverLimit(number, len(pages), read_chars)
    if not pages:
        if cut_short:
            raise _cut_short_refusal(display, "corrupt PDF (no pages)", cut_short)
        raise RejectedInput(display, "PDF with no pages (nothing to read)")
    texts, counted = strip_running_lines(texts)  # before mending: a foot parts a word's halves
    texts = mend_pages(texts)
    attached = _attachment_names(reader)
    if not any(t.strip() for t in texts):
        if missing and failures:  # (an encrypted file cut before its encryption dictionary)
            raise _cut_short_refusal(display, f"corrupt PDF: {len(missing)} of its {len(pages)} pages not in the file, "
                                     f"the text of the other {len(pages) - len(missing)} unreadable", cut_short)
        if missing:
            raise _cut_short_refusal(display, f"corrupt PDF: none of its {len(pages)} pages' text is in the file", cut_short)
        if failures == len(pages):
            raise _cut_short_refusal(display, f"corrupt PDF (no page could be read, {len(pages)} tried)", cut_short)
        if attached:  # a blank cover over attached files: they are what it holds
            raise RejectedInput(display, f"no text on its pages; {_attached_note(attached)}")
        if all(_is_blank(p) for p in pages):
            # nothing drawn on them at all: nothing to run OCR on either
            raise RejectedInput(display, f"blank PDF: nothing on {'its page' if len(pages) == 1 else f'its {len(pages)} pages'}"
                                " (no text, no pictures)")
        return _no_text(display, len(pages))
    if stamped == len(pages) > 1:  # one line for the file, not one per page; still read
        n_chars = sum(len(t.strip()) for t in texts)
        unread = [(0, f"only {n_chars} characters of text on its {len(pages)} pages, each a page-sized image "
                      "(a scanned PDF with stamps? run OCR first, e.g. `ocrmypdf in.pdf out.pdf`)")]
    if missing or in_part:  # one line for the file, as a list of pages would be for a file cut at its start
        lacks = [f"{_page_list(missing)} of {len(pages)} not in the file"] if missing else []
        if in_part:
            lacks.append(f"{_page_list(in_part)}{'' if missing else f' of {len(pages)}'} read in part "
                         "(pictures or boxes of text the file does not hold)")
        unread.append((0, f"{', '.join(lacks)}: it stops short "
                          f"({len(data):,} bytes, no %%EOF at its end); copy or download it again to read them"))
    elif cut_short and _EARLIER_END.search(data):  # all its pages there, but the changes saved last may not be
        unread.append((0, f"it stops short in a change saved to it after it was first written ({len(data):,} bytes, "
                          "no %%EOF at its end): read with as much of that change as the file holds; "
                          "copy or download it again to read all of it"))
    if run_together:
        unread.append((0, f"right-to-left words on {_page_list(run_together)} read run together, without their spaces "
                          "(a limit of the PDF reader); `pdftotext in.pdf out.txt` (poppler) reads them apart"))
    if attached:
        unread.append((0, _attached_note(attached)))
    labels = _printed_labels(reader, len(pages))
    if not any(labels):  # the PDF declares none: the numbers its heads or feet print, if any
        labels = counted
    bookmarks = _bookmarks(reader, len(pages))
    # each page's sections where they start on it: its bookmarks, else its numbered headings
    sections = place_bookmarks(texts, bookmarks) if bookmarks else numbered_headings(texts)
    return texts, unread, labels, sections


def _bookmarks(reader: PdfReader, n_pages: int) -> list[tuple[int, tuple[str, ...]]]:
    """The bookmarks (the PDF's outline), each as (its page's index, its trail), in the
    order they start: a PDF's headings are not told apart from its text, but its bookmarks
    name its chapters and sections, and a citation of p.217 said nothing of where in the
    book it was. Each bookmark's trail is its own title under its ancestors' in the
    outline's tree (a grouping bookmark with no page still names its children)."""
    starts: list[tuple[int, int, tuple[str, ...]]] = []  # (page index, order, trail)

    def walk(items, above: tuple[str, ...]) -> None:
        last: tuple[str, ...] = above
        for item in items:
            if isinstance(item, list):  # the children of the item before
                walk(item, last)
                continue
            title = " ".join(_plain(getattr(item, "title", "")).split())
            last = (*above, title) if title else above
            try:
                page = reader.get_destination_page_number(item)
            except Exception:  # noqa: BLE001 - a bookmark to nowhere: a title for its children only
                page = None
            if page is not None and 0 <= page < n_pages and title and len(last) <= 16:
                starts.append((page, len(starts), last))

    try:
        walk(reader.outline, ())
    except Exception:  # noqa: BLE001 - a malformed outline: no trails, the text as it is
        return []
    return [(page, trail) for page, _, trail in sorted(starts)]


# Arabic and Hebrew letters (with their presentation forms). pypdf reads some writers'
# right-to-left lines (LibreOffice's, for one) as a run of letters with every space and
# full stop moved to the line's start: "     .   يصفهذاالتقريرالوضعالعام...". No word can
# be matched or read; said, so that the user knows.
_RTL_WORD = re.compile("[\u0590-\u05ff\u0600-\u06ff\u0750-\u077f\ufb1d-\ufdff\ufe70-\ufefc]+")
_RTL_MIN_LETTERS = 100
# Letters a word of Arabic or Hebrew has on average: 4-6; 12 is words run together.
_RTL_RUN_TOGETHER = 12


def _rtl_words_run_together(text: str) -> bool:
    words = _RTL_WORD.findall(text)
    letters = sum(map(len, words))
    return letters >= _RTL_MIN_LETTERS and letters / len(words) > _RTL_RUN_TOGETHER


def _page_list(numbers: list[int]) -> str:
    """"p.4", "pages 4-6", "pages 2, 5-7"."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    if len(numbers) == 1:
        return f"p.{numbers[0]}"
    return "pages " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def _attached_note(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"{len(names)} attached file{'s' if len(names) > 1 else ''} not read: {shown} "
            "(save them, e.g. `qpdf --list-attachments` and `--show-attachment=NAME`, and name them)")


def _attachment_names(reader: PdfReader) -> list[str]:
    """Files embedded in the PDF (a cover letter's "see the attached files", a portfolio):
    not read, and said so, not passed over."""
    try:
        return sorted(str(name) for name in reader.attachments)
    except Exception:  # noqa: BLE001 - a malformed names tree: nothing to claim
        return []


def _printed_labels(reader: PdfReader, n_pages: int) -> list[str | None]:
    """The /PageLabels a PDF declares (roman front matter, then 1, 2...), None where a label
    is the page's own number or none is declared."""
    try:
        labels = list(reader.page_labels) if "/PageLabels" in reader.trailer["/Root"] else []
    except Exception:  # noqa: BLE001 - a malformed label tree: pages keep their numbers
        labels = []
    if len(labels) != n_pages:
        return [None] * n_pages
    return [label if label and label != str(i) else None for i, label in enumerate(labels, start=1)]


# Typesetting inside words: ligature characters (LaTeX's "ﬁ", "ﬂ") and words broken at a
# line's end ("reorgan-" / "ization"). Left as they are, "final" and "reorganization"
# match nothing in BM25 or the citations (a page holding the answer ranked 4th, not 1st).
_LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                            "\ufb05": "st", "\ufb06": "st"})
# (the next line may be indented: a centred title's "Reco-" / " gnition")
_BROKEN_WORD = re.compile(r"([^\W\d_]{2,})-\n[ \t]*([^\W\d_]+)")


def mend_pages(texts: list[str]) -> list[str]:
    """`_mend_words` of every page, with the whole document's words as the evidence; a
    word hyphenated across a page break is joined at the end of the page it starts on
    ("contami-" / "nation" was quoted as "contami-\nnation")."""
    spelled = [t.translate(_LIGATURES) for t in texts]
    words = _DocumentWords("\n".join(spelled))
    mended = [_join_broken_words(t, words) for t in spelled]
    for i in range(len(mended) - 1):
        end = _PAGE_END_BREAK.search(mended[i])
        nxt = mended[i + 1]
        lead = len(nxt) - len(nxt.lstrip())
        start = _PAGE_START_WORD.match(nxt, lead) if end else None
        if start is None or not start[1][0].islower() or start[1] in _NOT_WORD_ENDS:
            continue
        left, right = end[1], start[1]
        joined = f"{left}-{right}" if _keeps_hyphen(left, right, words) else left + right
        mended[i] = mended[i][:end.start()] + joined + start[2]
        rest = nxt[start.end():]
        mended[i + 1] = rest[1:] if rest.startswith("\n") else rest.lstrip(" ")
    return mended


_PAGE_END_BREAK = re.compile(r"([^\W\d_]+)-\s*$")
_PAGE_START_WORD = re.compile(r"([^\W\d_]+)([,.;:!?)]?)(?=\s|$)")


def _mend_words(text: str) -> str:
    """Ligatures spelled out, and a word hyphenated across lines joined where it goes on in
    lower case: "reorgan-" / "ization" is "reorganization", but "well-" / "known" stays
    "well-known" (`_keeps_hyphen`), on one line either way (the text its own evidence)."""
    text = text.translate(_LIGATURES)
    return _join_broken_words(text, _DocumentWords(text))


def _join_broken_words(text: str, words: _DocumentWords) -> str:
    def mend(m: re.Match) -> str:
        left, right = m[1], m[2]
        if not right[0].islower():
            # a name broken before a capital ("Libri-" / "Speech"): joined where the
            # document writes it so elsewhere; else kept ("Jean-" / "Pierre")
            joined = (left + right).lower()
            return left + right if joined in words.words and f"{left}-{right}".lower() not in words.compounds \
                else m[0]
        if right in _NOT_WORD_ENDS:
            return m[0]
        return f"{left}-{right}" if _keeps_hyphen(left, right, words) else left + right

    return _BROKEN_WORD.sub(mend, text)


class _DocumentWords:
    """The words of a document as it spells them on one line: its hyphenated compounds
    and its other words (lower case)."""

    def __init__(self, text: str) -> None:
        low = text.lower()
        self.compounds = set(_COMPOUND.findall(low))
        self.words = set(_WORD.findall(low))


_COMPOUND = re.compile(r"(?<![\w-])[^\W\d_]+-[^\W\d_]+(?![\w-])")
_WORD = re.compile(r"[^\W\d_]+")


def _keeps_hyphen(left: str, right: str, doc: _DocumentWords) -> bool:
    """Whether a line-end hyphen belongs to a compound ("well-known", "long-term") rather
    than breaking a word ("reorgan-ization"). The document's own spelling decides where it
    has one; else a joined word that is one word of cl100k's vocabulary ("something",
    "understand") is joined, and two halves that are each whole words of it ("well",
    "known") keep their hyphen. Anything else is joined: a word cut mid-syllable."""
    pair, joined = f"{left}-{right}".lower(), (left + right).lower()
    if pair in doc.compounds:
        return True
    if joined in doc.words:
        return False
    return not _one_word(joined) and _one_word(left.lower()) and _one_word(right.lower())


def _one_word(word: str) -> bool:
    from ktcli.ingest.tokens import encoding

    return len(encoding().encode_ordinary(" " + word)) == 1


# Words after a hyphen that end a suspended compound ("pre- and post-war"), not a word.
_NOT_WORD_ENDS = frozenset({"and", "or", "nor", "to", "und", "oder", "et", "ou", "y", "o"})


# Table rows. pypdf's plain extraction emits each table cell (a separate text object) on
# a line of its own, so a row 'Q3 2023 | 5.87 | 39.6%' reaches the model as four lines
# among dozens, and a chunk boundary can fall inside it. Its layout mode keeps rows, but
# also places two-column prose side by side, line by line, and pads every line with
# spaces. So plain text stays the reference, and a run of its lines is joined only where
# those lines are exactly the cells of one row of the layout text, in order.
# A cell whose text wraps (a long description) is a plain line per fragment, and its row
# several layout lines: the one with the row's key, and lines holding only the wrapped
# fragments, under it (or over it, where cells are centred or bottom-aligned). Those lines
# are read into the row's cells by where their text stands, and the row is joined where
# the plain lines are its cells' fragments, cell after cell.
# Layout extraction costs about 1.5x the plain one: it runs only on pages with short
# lines close together (what cells look like).
_CELL_MAX_CHARS = 32
_MIN_SHORT_RUN = 3
# A table whose wrapped cells' fragments are all long shows no run of 3 short lines, but a
# pair at each row's end: its last cell and the next row's key.
_MIN_SHORT_PAIRS = 3
_LAYOUT_CELL = re.compile(r"\S+(?:\s\S+)*")  # text up to a gap of 2+ spaces
_CELL_SEPARATOR = " | "
# Lines a row's wrapped cells may add above or below the line with its key: it bounds the
# readings of a row tried against the plain text (a taller row stays as it is).
_MAX_WRAPPED_LINES = 12


def _may_hold_table(text: str) -> bool:
    run = pairs = 0
    for line in text.split("\n"):
        run = run + 1 if 0 < len(line.strip()) <= _CELL_MAX_CHARS else 0
        pairs += run == 2
        if run >= _MIN_SHORT_RUN or pairs >= _MIN_SHORT_PAIRS:
            return True
    return False


def _layout_text(page) -> str:  # type: ignore[no-untyped-def]
    try:
        return page.extract_text(extraction_mode="layout") or ""
    except Exception:  # noqa: BLE001 - an optional refinement: without it the plain text stands
        return ""


def _squeeze(text: str) -> str:
    return " ".join(text.split())


class _Piece(NamedTuple):
    """Text of a layout line between gaps of 2+ spaces, and the character columns it spans."""

    start: int
    end: int
    text: str


# A row read from the layout: its cells, left to right, each its fragments top to bottom.
_Cells = list[list[str]]


class _Reading(NamedTuple):
    """One way to read a row of the layout: the line with its key, and the lines around it
    taken as its wrapped cells; `table` False where the result does not look like a table's
    row (it is read all the same, to stop a shorter reading: see `_layout_rows`)."""

    cells: _Cells
    table: bool
    fragments: tuple[str, ...]  # the cells' fragments in the order a writer draws them, cell by cell


def _pieces(line: str) -> list[_Piece]:
    return [_Piece(m.start(), m.end(), _squeeze(m[0])) for m in _LAYOUT_CELL.finditer(line)]


def _rejoin_rows(plain: str, layout: str) -> str:
    """`plain` with each run of its lines that are the cells of one `layout` row (at least
    two cells, each on one line or wrapped over several) joined into one line by ' | ', a
    wrapped cell's fragments by spaces. A table in one column of a two-column page is
    looked for in each column's layout alone: read across the page, each of its rows had
    the other column's line for a first cell, and no row matched (a probe's mill table came
    out a cell a line, and the answer took a footnote's "1" for the mill's output)."""
    joined = _rejoin_layout_rows(plain, layout)
    if joined == plain:
        columns = pdf_columns.column_by_column(layout)
        if columns is not None:
            joined = _rejoin_layout_rows(plain, columns)
    return joined


def _rejoin_layout_rows(plain: str, layout: str) -> str:
    rows = _layout_rows([_pieces(line) for line in layout.split("\n")])
    if not rows:
        return plain
    lines = plain.split("\n")
    squeezed = [_squeeze(pdf_marks.unmarked(line)) for line in lines]  # the layout reads a mark as part of its word
    out: list[str] = []
    i = 0
    while i < len(lines):
        # Whether the lines from i on are a reading's fragments, one a line, cell after cell:
        # the order a writer draws a table in (nothing is taken otherwise).
        match = next((r for r in rows.get(tuple(squeezed[i : i + 2]), ())
                      if tuple(squeezed[i : i + len(r.fragments)]) == r.fragments), None)
        if match is None:
            out.append(lines[i])
            i += 1
        elif not match.table:  # its lines are not a row, nor is any run inside them
            out += lines[i : i + len(match.fragments)]
            i += len(match.fragments)
        else:
            out.append(_EMPTY_CELLS.sub("| ", _CELL_SEPARATOR.join(_join_fragments(cell) for cell in match.cells)).strip())
            i += len(match.fragments)
    return "\n".join(out)


def _join_fragments(fragments: list[str]) -> str:
    """A wrapped cell on one line. After a hyphen that ends a fragment within a word
    ("north-" / "east") the text goes on without a space: one word broken at the cell's
    edge, not two."""
    if not fragments:  # an empty cell (`_with_empty_cells`)
        return ""
    text = fragments[0]
    for fragment in fragments[1:]:
        broken = len(text) >= 2 and text[-1] == "-" and text[-2].isalpha() and fragment[:1].isalpha()
        text += fragment if broken else " " + fragment
    return text


def _layout_rows(lines: list[list[_Piece]]) -> dict[tuple[str, ...], list[_Reading]]:
    """Every reading of the layout's rows, by their first two fragments (a row has at least
    two: keyed by the first alone, 200 rows whose key is "Yes" were each tried at every
    "Yes" line, 1.2 s a page): each line of 2+ pieces alone, and with each number of the
    lines above and below it that continue its cells; a reading met twice (rows alike) is
    kept once. Which one holds is the plain text's to say: a line between two rows may end
    the one or begin the other. The longest comes first and wins, even where it is not a
    table's: a shorter one is then the same text cut short (the first lines of a column of
    prose beside a one-line column), not a row."""
    rows: dict[tuple[str, ...], list[_Reading]] = {}
    seen: set[tuple] = set()
    for at, row in enumerate(lines):
        if len(row) < 2:
            continue
        # A piece under the key is taken from below only: above the key line, it is a
        # caption or the prose over a table as often as a wrapped key.
        above = _continuations(row, (lines[j] for j in range(at - 1, -1, -1)), key_may_wrap=False)
        below = _continuations(row, (lines[j] for j in range(at + 1, len(lines))), key_may_wrap=True)
        for n_above in range(len(above) + 1):
            for n_below in range(len(below) + 1):
                cells = _row_cells(row, above[:n_above][::-1], below[:n_below])
                table = not (n_above or n_below) or _table_row(lines, at - n_above, at + n_below, row, cells)
                reading = _Reading(_with_empty_cells(lines, at, row, cells), table,
                                   tuple(fragment for cell in cells for fragment in cell))
                identity = (tuple(map(tuple, cells)), table)
                if identity not in seen:
                    seen.add(identity)
                    rows.setdefault(reading.fragments[:2], []).append(reading)
    for readings in rows.values():
        readings.sort(key=lambda reading: len(reading.fragments), reverse=True)
    return rows


# Lines either side of a row looked at for the table's columns (`_with_empty_cells`).
_COLUMNS_REACH = 3
_EMPTY_CELLS = re.compile(r"\| {2}(?=\|)")


def _with_empty_cells(lines: list[list[_Piece]], at: int, row: list[_Piece], cells: _Cells) -> _Cells:
    """`row`'s cells with an empty one for each column it leaves blank, where a nearby line
    (`_COLUMNS_REACH`) has more pieces and each of the row's stands under one of them, in
    order: a row with an empty cell is a piece short in the layout, and its cells after the
    gap were read under the headers before it ("Depots | 9.3", its 2022 cell blank, put the
    2023 figure under 2022). Else `cells` as they are."""
    for step in (-1, 1):
        for other in (lines[j] for j in range(at + step, at + step * (_COLUMNS_REACH + 1), step) if 0 <= j < len(lines)):
            if len(other) <= len(row):
                continue
            columns: list[int] = []
            for piece in row:
                under = [k for k, column in enumerate(other) if piece.start < column.end and column.start < piece.end]
                if len(under) != 1 or (columns and under[0] <= columns[-1]):
                    break
                columns.append(under[0])
            else:
                aligned: _Cells = [[] for _ in range(columns[-1] + 1)]
                for column, cell in zip(columns, cells):
                    aligned[column] = cell
                return aligned
    return cells


def _continuations(row: list[_Piece], lines: Iterable[list[_Piece]], key_may_wrap: bool) -> list[list[tuple[int, str]]]:
    """The lines next to `row` (nearest first, up to a line that does not continue it, a
    blank one included) that continue its cells, each as (cell, text) of its pieces."""
    found: list[list[tuple[int, str]]] = []
    for line in lines:
        if len(found) == _MAX_WRAPPED_LINES:
            break
        placed = _placed(line, row)
        if not placed or (not key_may_wrap and any(cell == 0 for cell, _ in placed)):
            break
        found.append(placed)
    return found


def _placed(line: list[_Piece], row: list[_Piece]) -> list[tuple[int, str]] | None:
    """(cell, text) of each piece of `line`, the cell of `row` it stands under or over (it
    overlaps that cell's piece and no other's), left to right; None where a piece has no
    such cell (text across columns, or in a gap between them)."""
    placed: list[tuple[int, str]] = []
    for piece in line:
        cells = [k for k, cell in enumerate(row) if piece.start < cell.end and cell.start < piece.end]
        if len(cells) != 1 or (placed and cells[0] < placed[-1][0]):
            return None
        placed.append((cells[0], piece.text))
    return placed


def _row_cells(row: list[_Piece], above: list[list[tuple[int, str]]],
               below: list[list[tuple[int, str]]]) -> _Cells:
    """`row`'s cells with the fragments of the lines above (top to bottom) before its own
    piece and those of the lines below after it."""
    cells: _Cells = [[] for _ in row]
    for line in above:
        for cell, text in line:
            cells[cell].append(text)
    for cell, piece in enumerate(row):
        cells[cell].append(piece.text)
    for line in below:
        for cell, text in line:
            cells[cell].append(text)
    return cells


def _table_row(lines: list[list[_Piece]], top: int, bottom: int, row: list[_Piece], cells: _Cells) -> bool:
    """Whether a row on layout lines `top`..`bottom` is a table's: where its key wraps, in
    short fragments (a narrow column's; not a paragraph with a note in the margin), and
    the table going on above or below it (`_table_goes_on`). A row of several lines alone
    is two columns of prose side by side as often: a heading beside a paragraph, a column
    of one line beside a longer one."""
    if len(cells[0]) > 1 and any(len(fragment) > _CELL_MAX_CHARS for fragment in cells[0]):
        return False
    return _table_goes_on(lines, range(top - 1, -1, -1), row) or _table_goes_on(lines, range(bottom + 1, len(lines)), row)


def _table_goes_on(lines: list[list[_Piece]], steps: Iterable[int], row: list[_Piece]) -> bool:
    """Whether, going from a row by `steps`, the lines in its columns reach one with text
    past the key column (another row, or another row's wrapped cells) before any other line:
    lines with text in the key column only are passed (the end of a wrapped key)."""
    for n, at in enumerate(steps):
        placed = _placed(lines[at], row)
        if not placed or n == _MAX_WRAPPED_LINES:
            return False
        if any(cell > 0 for cell, _ in placed):
            return True
    return False


def _unlock(reader: PdfReader, display: str) -> None:
    """Many PDFs are encrypted with an empty user password (only printing/copying is
    restricted); those open. Only a real password requirement is an error."""
    if not reader.is_encrypted:
        return
    try:
        opened = reader.decrypt("")
    except DependencyError as e:
        raise RejectedInput(
            display, "encrypted PDF", f"reading it needs an extra package: {_short(e)}"
        ) from None
    except (FileNotDecryptedError, PyPdfError, ValueError, NotImplementedError) as e:
        raise RejectedInput(display, f"encrypted PDF that cannot be opened ({_short(e)})") from None
    if not opened:
        raise RejectedInput(
            display,
            "encrypted PDF that needs a password",
            "decrypt it first, e.g. `qpdf --password=PASSWORD --decrypt in.pdf out.pdf`",
        )


def _annotation_lines(page, text: str) -> list[str]:  # type: ignore[no-untyped-def]
    """What a viewer shows on the page beside its content stream, which pypdf's text
    leaves out: filled-in form fields ("[form field Applicant name: ...]") and comments
    ("[comment: ...]"), after the page's text. A form's answers were dropped unannounced."""
    lines: list[str] = []
    try:
        annotations = page.get("/Annots") or []
        for ref in annotations:
            note = ref.get_object()
            kind = note.get("/Subtype")
            if kind == "/Widget":
                label, value = _field(note)
                line = f"[form field {label}: {value}]" if label else f"[form field: {value}]"
                # not when shown in the text already, nor twice: a radio group's buttons
                # each carry the group's value
                if value and not (len(value) >= 8 and value in text) and line not in lines:
                    lines.append(line)
            elif kind in ("/Text", "/FreeText", "/Highlight", "/Underline", "/StrikeOut", "/Squiggly"):
                contents = _plain(note.get("/Contents"))
                if contents and contents not in text:
                    lines.append(f"[comment: {contents}]")
    except Exception:  # noqa: BLE001 - a malformed annotation leaves the page's own text as it is
        return lines
    return lines


def _field(widget) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A widget's label (its tooltip, else its name) and value, looked up through its
    parents as a form's kids inherit them; no value for an unticked box."""
    label = value = ""
    node, depth = widget, 0
    while node is not None and depth < 16:
        label = label or _plain(node.get("/TU")) or _plain(node.get("/T"))
        if not value and node.get("/V") is not None:
            raw = node.get("/V")
            items = raw if isinstance(raw, list) else [raw]
            value = ", ".join(v for v in (_plain(i) for i in items) if v and v != "Off")
        parent = node.get("/Parent")
        node, depth = (parent.get_object() if parent is not None else None), depth + 1
    return label, value


def _plain(value) -> str:  # type: ignore[no-untyped-def]
    """A PDF string or name as one line of text ("/Yes" -> "Yes")."""
    if value is None:
        return ""
    text = str(value.get_object() if hasattr(value, "get_object") else value)
    return " ".join(text.removeprefix("/").split())


# A page with less text than this on an image covering _SCAN_COVERAGE of it is taken for a
# scan with a stamp.
_FEW_CHARACTERS = 100
_SCAN_COVERAGE = 0.7


def _image_coverage(page) -> float:  # type: ignore[no-untyped-def]
    """The share of the page's area its largest image is drawn over (a form XObject's box
    counting as its image's), from the transformation in force at each draw: only the
    determinant matters for an area, and it multiplies."""
    try:
        from pypdf.generic import ContentStream

        box = page.mediabox
        page_area = abs(float(box.width) * float(box.height))
        contents = page.get_contents()
        if contents is None or page_area <= 0:
            return 0.0
        xobjects = (page.get("/Resources") or {}).get("/XObject") or {}
        det, stack, best = 1.0, [], 0.0
        for operands, op in ContentStream(contents, page.pdf).operations:
            if op == b"q":
                stack.append(det)
            elif op == b"Q":
                det = stack.pop() if stack else det
            elif op == b"cm" and len(operands) == 6:
                a, b, c, d = (float(x) for x in operands[:4])
                det *= a * d - b * c
            elif op == b"INLINE IMAGE":
                best = max(best, abs(det) / page_area)
            elif op == b"Do" and operands and operands[0] in xobjects:
                xobject = xobjects[operands[0]].get_object()
                if xobject.get("/Subtype") == "/Image":
                    best = max(best, abs(det) / page_area)
                elif xobject.get("/Subtype") == "/Form" and _draws_image(xobject.get("/Resources"), depth=1):
                    x0, y0, x1, y1 = (float(v) for v in xobject.get("/BBox", [0, 0, 0, 0]))
                    best = max(best, abs(det * (x1 - x0) * (y1 - y0)) / page_area)
        return min(best, 1.0)
    except Exception:  # noqa: BLE001 - a content stream we cannot follow: no claim
        return 0.0
_INLINE_IMAGE = re.compile(rb"(?:^|\s)BI\s")


def _has_images(page) -> bool:  # type: ignore[no-untyped-def]
    """Whether the page draws an image: an image XObject of its own or inside a form
    XObject (pdfpages and pdfjam put scanned pages in forms), or an inline image."""
    try:
        if _draws_image(page.get("/Resources"), depth=0):
            return True
        contents = page.get_contents()
        return contents is not None and _INLINE_IMAGE.search(contents.get_data()) is not None
    except Exception:  # noqa: BLE001 - a malformed resource dictionary: no claim either way
        return False


# Path operators of a content stream: curves (c, v, y) and fills (f, F, f*, B, B*, b, b*).
_CURVE = re.compile(rb"(?<![^\s\]\)>])[cvy](?=\s)")
_FILL = re.compile(rb"(?<![^\s\]\)>])(?:f\*?|F|[Bb]\*?)(?=\s)")
# A page of text drawn as outlines has a few curves a glyph, hundreds a page; a blank
# page or a rule under a header has none or a handful.
_SHAPES_CURVES = 150
_SHAPES_FILLS = 40


def _draws_shapes(page) -> bool:  # type: ignore[no-untyped-def]
    """Whether a page with no text draws many paths: its words, or a drawing, as shapes."""
    try:
        data = b"\n".join(_content_streams(page))
    except Exception:  # noqa: BLE001 - a malformed content stream: no claim either way
        return False
    return len(_CURVE.findall(data)) >= _SHAPES_CURVES or len(_FILL.findall(data)) >= _SHAPES_FILLS


# Text render mode 3 (neither filled nor stroked): how OCR tools (Tesseract, ocrmypdf,
# scanners' software) lay the words they read over the picture of a page.
_INVISIBLE_TEXT = re.compile(rb"(?<![\w.])3\s+Tr(?![\w*])")


def _has_invisible_text(page) -> bool:  # type: ignore[no-untyped-def]
    """Whether a page's text is an OCR layer: its few characters are then all the page
    says, not a stamp over words nobody has read."""
    try:
        return any(_INVISIBLE_TEXT.search(data) for data in _content_streams(page))
    except Exception:  # noqa: BLE001 - a malformed content stream: no claim either way
        return False


def _content_streams(page):  # type: ignore[no-untyped-def]
    """The data of a page's content stream and of the forms it draws (ocrmypdf places its
    text layer in a form)."""
    contents = page.get_contents()
    if contents is not None:
        yield contents.get_data()
    for form in _forms(page.get("/Resources"), depth=0):
        yield form.get_data()


def _xobjects(resources, depth: int):  # type: ignore[no-untyped-def]
    """(depth, XObject) of every image and form a resource dictionary draws, and of what
    its forms draw, down to forms 4 deep (pdfpages and pdfjam nest scanned pages in them)."""
    xobjects = (resources or {}).get("/XObject") or {}
    for name in xobjects:
        xobject = xobjects[name].get_object()
        yield depth, xobject
        if xobject.get("/Subtype") == "/Form" and depth < 4:
            yield from _xobjects(xobject.get("/Resources"), depth + 1)


def _forms(resources, depth: int):  # type: ignore[no-untyped-def]
    return (x for d, x in _xobjects(resources, depth) if x.get("/Subtype") == "/Form" and d < 4)


def _is_blank(page) -> bool:  # type: ignore[no-untyped-def]
    """Whether the page draws nothing: no content stream, or one of no operators."""
    try:
        contents = page.get_contents()
        return contents is None or not contents.get_data().replace(b"q", b"").replace(b"Q", b"").strip()
    except Exception:  # noqa: BLE001 - a malformed page: no claim
        return False


def _draws_image(resources, depth: int) -> bool:  # type: ignore[no-untyped-def]
    return any(x.get("/Subtype") == "/Image" for _, x in _xobjects(resources, depth))


def _no_text(display: str, n_pages: int) -> list[str]:
    pages = "its page" if n_pages == 1 else f"any of its {n_pages} pages"
    raise RejectedInput(
        display,
        f"no text layer on {pages} (a scanned or image-only PDF?)",
        "run OCR first, e.g. `ocrmypdf in.pdf out.pdf`",
    )


# A PDF ends in "%%EOF" (some writers add a newline or a few bytes after it): one without
# it in its last KiB was cut short, a download or a copy that stopped. pypdf said only
# "Stream has ended unexpectedly", and cannot read such a file's pages even with the
# marker put back (probe 116). `_whole_objects` gives it what it needs to read the pages
# before the cut; the user is told which pages the file lacks.
_EOF_MARK, _EOF_TAIL = b"%%EOF", 1024


class _Unopened(Exception):
    """pypdf could not open the file or list its pages (the cause is pypdf's error)."""


def _open(data: bytes, display: str) -> tuple[PdfReader, list]:  # type: ignore[type-arg]
    """The reader and its pages; RejectedInput for encryption it cannot open, else
    _Unopened from pypdf's error."""
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        _unlock(reader, display)
        return reader, list(reader.pages)
    except RejectedInput:
        raise
    except NotImplementedError as e:  # pypdf: "only Standard PDF encryption handler is available"
        raise RejectedInput(display, f"PDF that cannot be opened ({_short(e)})",
                            "a certificate or DRM security handler: export it without one") from None
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, OSError) as e:
        raise _Unopened() from e


def _pages_of(recovered: bytes, display: str) -> tuple[PdfReader, list] | None:  # type: ignore[type-arg]
    """`_open` of a file rebuilt from its whole objects (`_whole_objects`), None where it
    does not open or lists no page."""
    try:
        reader, pages = _open(recovered, display)
    except _Unopened:
        return None
    return (reader, pages) if pages else None


# An indirect object's header, "12 0 obj": its number is what the trailer's /Size counts.
_OBJECT_HEADER = re.compile(rb"(\d{1,10})\s+\d{1,5}\s+obj\b")


# A revision's end on a line of its own: a file cut short that holds one was cut in a change
# saved to it later (an incremental update: a form filled in, a page added, a signature).
_EARLIER_END = re.compile(rb"[\r\n]%%EOF")
# The standard security handler's dictionary: an encrypted file (its text is read with a
# key made from it and the trailer's /ID).
_ENCRYPTION = re.compile(rb"/Filter\s*/Standard\b")


def _whole_objects(data: bytes) -> bytes | None:
    """A file cut short, up to its last whole object, closed with a trailer that names no
    root and points to no cross-reference table: pypdf then rebuilds the table by scanning
    the objects and finds the catalog by its /Type. That reads the pages written before the
    cut where the catalog and page tree came first (ReportLab, many simple writers); where
    they come last, in object streams (pdfTeX), nothing is found and the file is refused."""
    end = len(data)
    while (end := data.rfind(b"endobj", 0, end)) >= 0:
        opened = data.rfind(b"stream", 0, end)  # "endstream" too
        if opened < 0 or data[opened - 3:opened] == b"end":
            break
        end = opened  # the word inside a stream the cut left open (a text about PDFs): the object before
    if end < 0:
        return None
    size = 1 + max((int(m.group(1)) for m in _OBJECT_HEADER.finditer(data, 0, end)), default=0)
    return data[:end + len(b"endobj")] + b"\ntrailer\n<< /Size %d >>\nstartxref\n0\n%%%%EOF\n" % size


def _with_lost_pages(reader: PdfReader, pages: list) -> list:  # type: ignore[type-arg]
    """`pages` with None where the page tree names a page the file does not hold: pypdf
    leaves such a page out, so a file cut before its last pages' objects (pypdf's own
    writer puts each page's object beside its content) lost them unannounced, and the
    pages after a lost one took its number."""
    slots: list[bool] = []  # True: a page pypdf lists, False: one the file lacks

    def walk(node, depth: int) -> None:  # type: ignore[no-untyped-def]
        kids = node.get("/Kids")
        kids = kids.get_object() if kids is not None else None
        for kid in kids if isinstance(kids, list) else []:
            obj = kid.get_object()
            if not isinstance(obj, dict) or not obj:
                slots.append(False)
            elif "/Kids" in obj and obj.get("/Type") != "/Page" and depth < 32:
                walk(obj, depth + 1)
            else:
                slots.append(True)

    try:
        root = reader.root_object["/Pages"].get_object()
        walk(root, 0)
        count = int(root.get("/Count", 0))
    except Exception:  # noqa: BLE001 - a damaged tree: the pages pypdf found
        return pages
    if sum(slots) != len(pages):  # a tree pypdf read otherwise: lost pages placed last
        slots = [True] * len(pages) + [False] * (len(slots) - sum(slots))
    if len(pages) <= count <= len(pages) + 100_000:  # a lost branch of the tree: its pages last
        slots += [False] * (count - len(slots))
    found = iter(pages)
    return [next(found) if present else None for present in slots]


def _content_missing(page) -> bool:  # type: ignore[no-untyped-def]
    """Whether the page names content or fonts the file does not hold (it was cut before them)."""
    try:
        contents = page.get("/Contents")
        if contents is None:
            return False  # a blank page: nothing missing
        resolved = contents.get_object()
        if resolved is None:
            return True
        if isinstance(resolved, list) and any(part.get_object() is None for part in resolved):
            return True
        # its fonts: pypdf reads a page whose font objects are missing as U+FFFD, a line of "����"
        # (pypdf's writer puts a page's fonts after its content)
        return _resources_missing(page, "/Font")
    except Exception:  # noqa: BLE001 - a malformed page: read it, and say what reading says
        return False


def _pictures_missing(page) -> bool:  # type: ignore[no-untyped-def]
    """Whether the page draws pictures or boxes of text (XObjects) the file does not hold:
    pypdf's writer puts them after the page's content, and a box's words went unannounced."""
    try:
        return _resources_missing(page, "/XObject")
    except Exception:  # noqa: BLE001 - a malformed page: read it, and say what reading says
        return False


def _resources_missing(page, kind: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether the page's resources of `kind` ("/Font", "/XObject"), or its resources
    whole, are objects the file does not hold."""
    resources = page.get("/Resources")
    if resources is None:
        return False
    resources = resources.get_object()
    if not isinstance(resources, dict):
        return True
    named = resources.get(kind)
    if named is None:
        return False
    named = named.get_object()
    return not isinstance(named, dict) or any(one.get_object() is None for one in named.values())


def _cut_short_fact(data: bytes) -> str:
    """That `data` seems cut short, in words, where it lacks the PDF's end marker, else ""."""
    tail = data[-_EOF_TAIL:]
    if _EOF_MARK in tail and not _OBJECT_HEADER.search(tail, tail.rfind(_EOF_MARK)):
        return ""  # (an object after the last %%EOF: an update to the file, cut short)
    return f"the file seems cut short ({len(data):,} bytes, no %%EOF at its end)"


def _cut_short_refusal(display: str, reason: str, cut_short: str) -> RejectedInput:
    """The refusal, saying the file seems cut short where it does: in its reason, as a
    folder walk's skipped line shows only that (it said "corrupt or unreadable PDF (Stream
    has ended unexpectedly)", no word of the cut)."""
    if not cut_short:
        return RejectedInput(display, reason)
    return RejectedInput(display, f"{reason}; {cut_short}", "copy or download it again")


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else type(error).__name__
