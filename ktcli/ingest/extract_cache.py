"""What a PDF's pages read as, kept on disk by the file's bytes: the next question about the
same PDF starts from its text, not from its content streams.

Reading a PDF is most of what `ktcli ask` does before the model: a 36-page manual took
2.5 s of a question's 19 s to its first token, every time it was asked about, and a book's
hundreds of pages take tens of seconds. An entry holds the pages' texts, what could not be
read, the printed page labels and the section trails (`pdftext.extract_pages`' result),
under the sha256 of the file's bytes and a fingerprint of the reader: ktcli's ingest
sources and pypdf's version, so an upgrade or an edit of the reader reads the file again.

Where the cache lives is set for a run (`kept_under`): the pipeline sets it around reading
its input; elsewhere (tests, a library call) nothing is kept. Entries are written whole
(a temporary file renamed into place) with a digest of their payload and name
(`checked_json`), and a damaged or changed one is read again, never an error; past
MAX_ENTRIES the least recently used go.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path

from ktcli.cache_files import mark_used, sources_fingerprint, trim, write_whole
from ktcli.checked_json import dumps, loads
from ktcli.ingest.errors import TextOverLimit
from ktcli.ingest.pdf_headings import PageSections

FOLDER = "extracted"
MAX_ENTRIES = 256
_ROOT: ContextVar[Path | None] = ContextVar("ktcli_extract_cache", default=None)

# pdftext.extract_pages' result: page texts, unread pages (number, why), labels, sections
Pages = tuple[list[str], list[tuple[int, str]], list[str | None], list[PageSections]]


@contextmanager
def kept_under(cache_dir: Path | None) -> Iterator[None]:
    """PDFs read inside keep their pages under `cache_dir` (None: nowhere)."""
    token = _ROOT.set(cache_dir / FOLDER if cache_dir is not None else None)
    try:
        yield
    finally:
        _ROOT.reset(token)


def pdf_pages(data: bytes, text_limit: int | None, read: Callable[[], Pages]) -> Pages:
    """`read()`'s result for the PDF `data`, from the cache where it holds it. A kept entry
    is held to `text_limit` as `read` holds the file (TextOverLimit past it); a read that
    raises keeps nothing."""
    folder = _ROOT.get()
    if folder is None:
        return read()
    path = folder / f"{_key(data)}.json"
    pages = _load(path)
    if pages is None:
        pages = read()
        _save(path, folder, pages)
    elif text_limit is not None:
        _check_limit(pages[0], text_limit)
    return pages


# An HTML page this long (characters) keeps its text too: bs4's html.parser takes most of
# reading one, about 2.5 s a megabyte (Node's 8 MB single-page all.html: about 20 s, each
# question); a smaller page is read again (a folder walk's pages would push the PDFs out).
HTML_MIN_CHARS = 1_000_000

# htmltext.html_to_text's result: the text, each line's line in the markup, what was left out
HtmlText = tuple[str, tuple[int, ...], list[str]]


def html_text(markup: str, read: Callable[[], HtmlText]) -> HtmlText:
    """`read()`'s result for the HTML page `markup`, from the cache where it holds it and
    the page is HTML_MIN_CHARS long; a read that raises keeps nothing."""
    folder = _ROOT.get()
    if folder is None or len(markup) < HTML_MIN_CHARS:
        return read()
    import bs4

    key = _key(f"html {bs4.__version__}\0".encode() + markup.encode("utf-8", "surrogatepass"))
    path = folder / f"{key}.json"
    kept = _load_html(path)
    if kept is not None:
        return kept
    result = read()
    text, lines, notes = result
    _write(path, folder, {"text": text, "lines": list(lines), "notes": notes})
    return result


def _load_html(path: Path) -> HtmlText | None:
    try:
        entry = loads(path.name, path.read_text(encoding="utf-8"))
        if entry is None:
            return None
        text, lines, notes = entry["text"], entry["lines"], entry["notes"]
        if not (isinstance(text, str) and isinstance(lines, list) and isinstance(notes, list)
                and all(type(n) is int for n in lines) and all(isinstance(n, str) for n in notes)
                and len(lines) == text.count("\n") + 1):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    mark_used(path)  # used: the last to go
    return text, tuple(lines), notes


def _key(data: bytes) -> str:
    return hashlib.sha256(f"{_reader()}\0".encode() + hashlib.sha256(data).digest()).hexdigest()[:40]


@lru_cache(maxsize=1)
def _reader() -> str:
    """The reader's fingerprint: the ingest package's sources and pypdf's version."""
    import pypdf

    return sources_fingerprint(pypdf.__version__, sorted(Path(__file__).parent.glob("*.py")))


def _check_limit(texts: list[str], limit: int) -> None:
    """TextOverLimit as `extract_pages` raises it: at the page where the text passes `limit`
    (counted without the running heads and feet `extract_pages` counts: a few characters a
    page, at the edge of a folder walk's limit)."""
    read = 0
    for number, text in enumerate(texts, start=1):
        read += len(text) + 1
        if read > limit:
            raise TextOverLimit(number, len(texts), read)


def _load(path: Path) -> Pages | None:
    try:
        entry = loads(path.name, path.read_text(encoding="utf-8"))
        if entry is None:
            return None  # edited or damaged since it was written (an answer cited pages it made up)
        if not all(isinstance(entry[key], list) for key in ("texts", "unread", "labels", "sections")):
            return None  # ("abc" read as three pages "a", "b", "c")
        texts = [t for t in entry["texts"] if isinstance(t, str)]
        unread = [(int(n), str(why)) for n, why in entry["unread"]]
        labels = [None if label is None else str(label) for label in entry["labels"]]
        sections = [PageSections(str(start), tuple((int(line), str(trail)) for line, trail in headings))
                    for start, headings in entry["sections"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none kept, or a damaged entry: read the file again
    if not texts or not len(texts) == len(entry["texts"]) == len(labels) == len(sections):
        return None  # (a PDF has a page at least)
    mark_used(path)  # used: the last to go
    return texts, unread, labels, sections


def _save(path: Path, folder: Path, pages: Pages) -> None:
    """Keep `pages`; a disk that refuses keeps nothing, quietly (this run has them)."""
    texts, unread, labels, sections = pages
    entry = {"texts": texts, "unread": unread, "labels": labels,
             "sections": [[s.start, [list(h) for h in s.headings]] for s in sections]}
    _write(path, folder, entry)


def _write(path: Path, folder: Path, entry: dict) -> None:
    if write_whole(path, dumps(path.name, entry, ensure_ascii=False)):
        trim(folder, ".json", MAX_ENTRIES)
