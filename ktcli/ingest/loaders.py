"""One source (a file's bytes or stdin) to one Document, whatever its format."""

from __future__ import annotations

import codecs
import io
import os
import re
import shlex
import stat
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path, PurePath
from typing import BinaryIO

from ktcli.ingest import compressed
from ktcli.ingest.errors import RejectedInput
from ktcli.ingest.layout import count_of
from ktcli.ingest.pdf_headings import PageSections
from ktcli.ingest.normalize import UndecodableError, bom_encoding, decode_bytes, is_utf8, normalize_text, text_sha256
from ktcli.ingest.roff import has_man_page_name, looks_like_roff
from ktcli.ingest.rtf import RTF_MAGIC
from ktcli.ingest.sniff import (
    SNIFF_BYTES,
    could_be_utf16,
    doc_kind_for_name,
    language_for_name,
    language_from_content,
    looks_binary,
)
from ktcli.types import PARAGRAPH, Document, Page, Skipped

STDIN_PATH = "<stdin>"
_READABLE = "ktcli reads text, source code, PDF, HTML, Word, OpenDocument text and EPUB"
EMPTY_FILE = "empty file"  # a walk's reason for it, which reports them together (pipeline.prepare)


def load_file(path: Path, display: str) -> Document:
    """A file the user named: never skipped for size, every problem an InputError. A man
    page that is only a link to another (`.so man1/other.1`) is read as that page."""
    data = read_file_bytes(path, display)
    # (by its name too: a notes.txt whose one line is ".so x" is no man page)
    link = _man_link(data) if has_man_page_name(path.name) else None
    if link is not None:
        return _linked_man_page(path, display, link)
    return document_from_bytes(data, display, path.name, path=path)


# Many of /usr/share/man's pages (bash's rbash.1.gz, systemd's init.1.gz) are only a link,
# `.so man1/systemd.1`, which `man` follows; read, such a page was "See man1/systemd.1.".
# The link names a page under the manual's root (the folder above man1/), compressed or not.
_SO_LINE = re.compile(r"^\.so[ \t]+(\S+)[ \t]*$")
_MAN_SUFFIXES = ("", ".gz", ".bz2", ".xz", ".zst", ".lzma", ".Z")
_MAX_MAN_LINKS = 8
_MAX_LINK_PAGE = 4096  # bytes: a link page is a line or two (and a comment)


def _man_link(data: bytes) -> str | None:
    """The page a man page links to where it holds nothing else (comments aside)."""
    if len(data) > _MAX_LINK_PAGE:
        return None
    try:
        data = _decompressed(data, _MAX_LINK_PAGE)
    except RejectedInput:
        return None
    lines = [line for line in data.decode("utf-8", "replace").splitlines()
             if line.strip() and not re.match(r"^[.'][ \t]*(?:\\[\"#]|$)", line)]
    m = _SO_LINE.match(lines[0]) if len(lines) == 1 else None
    return m.group(1) if m else None


def _decompressed(data: bytes, limit: int) -> bytes:
    """A man page's bytes as written, where the file is compressed whole (`ingest.compressed`):
    RejectedInput past `limit` bytes or damaged."""
    compression = compressed.format_of(data)
    return data if compression is None else compressed.decompress(data, compression, "", limit, "")[0]


def _linked_man_page(path: Path, display: str, link: str) -> Document:
    """The page `link` names, as `man` finds it: under the manual's root (the folder above
    the link's man1/), compressed or not, link after link (at most _MAX_MAN_LINKS). Read
    under its own path, where its lines are (a citation of init.1.gz:45 named a line the
    file does not have); a note says which link led there."""
    first, seen, where = link, {os.path.realpath(path)}, path
    for _ in range(_MAX_MAN_LINKS):
        target = _man_page_at(where, link)
        if target is None:
            looked = (Path(link) if os.path.isabs(link) else where.parent.parent / link)
            raise RejectedInput(display, f"a link to another man page (`.so {link}`) that is not there",
                                f"looked for {looked} (and .gz, .xz, .bz2); `man {Path(link).stem}` may find it")
        if os.path.realpath(target) in seen:
            raise RejectedInput(display, f"man page links that lead back to a page already followed (`.so {link}`)")
        seen.add(os.path.realpath(target))
        shown = _shown_beside(target, display, path)
        data = read_file_bytes(target, shown)
        link = _man_link(data)
        if link is None:
            doc = document_from_bytes(data, shown, target.name, path=target)
            via = "" if len(seen) == 2 else f", through {len(seen) - 2} other link{'s' if len(seen) > 3 else ''}"
            note = Skipped(display, f"a link to another man page (`.so {first}`{via}): read {shown} instead, "
                                    "and cited there", replaced=True)
            return replace(doc, left_out=(note, *doc.left_out))
        where = target
    raise RejectedInput(display, f"more than {_MAX_MAN_LINKS} man page links one after another (`.so {first}`)")


def _man_page_at(page: Path, link: str) -> Path | None:
    """The file `.so link` in `page` names: from the manual's root (the folder above
    `page`'s man1/; else beside `page`), with or without a compression's suffix. Only a
    file named as a man page: a page from elsewhere saying `.so /home/me/.ssh/id_rsa`
    would put that file before the model, and a remote backend's server."""
    bases = [Path(link)] if os.path.isabs(link) else [page.parent.parent / link, page.parent / PurePath(link).name]
    for base in bases:
        for suffix in _MAN_SUFFIXES:
            candidate = base.with_name(base.name + suffix)
            if has_man_page_name(candidate.name) and candidate.is_file():
                return candidate
    return None


def _shown_beside(target: Path, display: str, given: Path) -> str:
    """`target` as the user would write it: relative where the path they gave was."""
    if os.path.isabs(display):
        return os.path.normpath(os.path.abspath(target))
    shown = os.path.relpath(target)
    return os.path.normpath(os.path.abspath(target)) if shown.startswith("..") else shown


def read_file_bytes(path: Path, display: str) -> bytes:
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise RejectedInput(display, "is a folder, not a file")
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            raise RejectedInput(display, "not a regular file (a device or socket)")
        # FIFOs are allowed: `ktcli ask <(git diff) ...` hands us one.
        with open(path, "rb") as handle:
            return read_bounded(handle, display)
    except RejectedInput:
        raise
    except FileNotFoundError:
        reason = "broken symlink" if os.path.islink(path) else "no such file or directory"
        raise RejectedInput(display, reason) from None
    except PermissionError:
        raise RejectedInput(display, "unreadable (permission denied)") from None
    except OSError as e:
        raise RejectedInput(display, f"unreadable ({e.strerror or e})") from None


def load_stdin(stdin_text: str | None, stream: BinaryIO | None = None) -> Document:
    """`-`: text handed over by the caller, else the bytes of sys.stdin (so a PDF or a
    UTF-16 file piped in is decoded like a file)."""
    if stdin_text is not None:
        text = normalize_text(stdin_text)
        if not text.strip():
            raise RejectedInput(STDIN_PATH, "empty input", "pipe some text into `-`")
        return _text_document(text, STDIN_PATH, "stdin", language_from_content(text))
    if stream is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise RejectedInput(STDIN_PATH, "`-` reads standard input, but nothing is piped in")
        stream = sys.stdin.buffer
    data = read_bounded(stream, STDIN_PATH)
    return document_from_bytes(data, STDIN_PATH, "", is_stdin=True)


# Reading a text takes about 13 times its size in memory on its way to chunks and tokens
# (a 47 MB text peaked at 630 MB); a source past what the memory free can hold that way
# (a sixteenth of it, a margin over 13) is refused in one line. Unbounded, `ktcli plan -
# q < /dev/zero` grew to 24 GB in a minute, deaf to Ctrl-C, until the kernel killed it.
READ_MEMORY_TAKES = 13
READ_MEMORY_FACTOR = 16
_MIN_READ_LIMIT = 256 << 20
_READ_PIECE = 8 << 20


@lru_cache(maxsize=1)
def read_limit_bytes() -> int:
    """Measured once a run: a folder walk reads thousands of files (67 us a reading)."""
    try:
        import psutil

        free = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001 - no reading: the floor
        return _MIN_READ_LIMIT
    return max(_MIN_READ_LIMIT, free // READ_MEMORY_FACTOR)


def read_bounded(stream: BinaryIO, display: str, limit: int | None = None) -> bytes:
    """All of `stream`, in pieces (Ctrl-C is heard between them), or RejectedInput once it
    passes `limit` bytes (default: what this machine's free memory can read)."""
    limit = read_limit_bytes() if limit is None else limit
    pieces, total = [], 0
    while piece := stream.read(_READ_PIECE):
        total += len(piece)
        if total > limit:
            raise RejectedInput(display, f"over {limit / 2**20:,.0f} MiB, more than this machine's free memory can "
                                         f"read (reading takes about {READ_MEMORY_TAKES}x the text's size)",
                                "split it, or give the part the question is about")
        pieces.append(piece)
    return b"".join(pieces)


def document_from_bytes(data: bytes, display: str, name: str, *, is_stdin: bool = False,
                        text_limit: int | None = None, unpacked_limit: tuple[int, str] | None = None,
                        _unpacked: str = "", path: Path | None = None) -> Document:
    """Dispatch on the name first and the content second. Raises RejectedInput; a PDF
    whose text passes `text_limit` characters, pdftext.TextOverLimit as soon as it does.
    A file compressed whole is read as what it decompresses to (`ingest.compressed`), up to
    `unpacked_limit` (bytes, and what to do past them; default: what the free memory reads).
    `path`: the file a user named, where a man page's `.so` inside it is read in from."""
    if not data:
        if is_stdin:  # (`git diff | ktcli ask - ...` with no changes)
            raise RejectedInput(display, "empty input", "nothing came in: the command before `|` printed nothing, "
                                                        "or the file after `<` is empty")
        raise RejectedInput(display, EMPTY_FILE)
    compression = None if _unpacked else compressed.format_of(data)
    if compression is not None and not _holds_tar(data, f"{compression}-compressed data"):
        limit, hint = unpacked_limit or (read_limit_bytes(), "split it, or give the part the question is about")
        inner, trailing = compressed.decompress(data, compression, display, limit, hint)
        doc = document_from_bytes(inner, display, compressed.inner_name(name, compression), is_stdin=is_stdin,
                                  text_limit=text_limit, _unpacked=compression, path=path)
        if trailing:
            note = (f"{trailing:,} byte{'s' if trailing > 1 else ''} after its {compression}-compressed data left out "
                    f"(not {compression} data)")
            doc = replace(doc, left_out=(*doc.left_out, Skipped(display, note, replaced=True)))
        return doc
    kind = doc_kind_for_name(name)
    # A PDF's header may follow some junk (readers look in the first KB). A file named as
    # text or code is a PDF only if it starts with one: a Python PDF writer or notes about
    # the format hold "%PDF-1.4" near their start, and were refused as corrupt PDFs.
    if data.startswith(b"%PDF-") or (kind in (None, "pdf") and b"%PDF-" in data[:1024]):
        try:
            return _pdf_document(data, display, text_limit)
        except RejectedInput:
            if kind == "pdf" or (kind is None and data.startswith(b"%PDF-")):
                raise
            # named as text, or "%PDF-" past the start (a diff of a PDF writer piped in),
            # and not a PDF: read as text
    if kind == "pdf":  # not read as text: often a download's error page saved under the name
        raise RejectedInput(display, f"not a PDF: no %PDF- header, it holds {_what_it_holds(data)}",
                            f"to read it as text, pipe it in: `ktcli ask - \"question\" < {_shell_name(display)}`")
    if data.startswith(b"%!PS"):
        # PostScript is ASCII, but its words are strings among drawing commands: a docs
        # folder's manual.ps.gz was read as 69K tokens of them
        # (ps2pdf reads no gzip: `ps2pdf manual.ps.gz` failed in Ghostscript)
        pdf = shlex.quote(PurePath(name).stem or "out")
        convert = (f"{_UNPACK[_unpacked]} {_shell_name(display)} | ps2pdf - {pdf}.pdf"
                   if _unpacked else f"ps2pdf {_shell_name(display)}")
        raise RejectedInput(display, "PostScript (a printer's page description: its text is among drawing commands)",
                            f"convert it first: `{convert}` and give the PDF")
    zipped = _zipped_format(data, display, kind)
    if zipped is not None:
        return _zipped_document(data, display, zipped)
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(RTF_MAGIC):  # by content: a .doc WordPad saved is one
        return _rtf_document(data, display)
    if _looks_like_mhtml(data, name, kind):
        return _mhtml_document(data, display)
    if _is_mbox(data, name, kind):
        return _mbox_document(data, display)
    if (PurePath(name).suffix.lower() == ".eml" and not _several_mails(data)) or (kind is None and _mail_by_content(data)):
        return _mail_document(data, display)
    if data.startswith(_OLE):
        raise _ole_refusal(display, data)
    if kind in _ZIPPED_KINDS:  # named as one, and no zip: as a PDF without its header
        raise RejectedInput(display, f"not {_a(_ZIPPED_KINDS[kind])}: no zip header, it holds {_what_it_holds(data)}",
                            f"to read it as text, pipe it in: `ktcli ask - \"question\" < {_shell_name(display)}`")
    if _known_binary(data):  # an archive's header, even where what follows reads as text (a stored zip)
        raise _binary(display, data, _unpacked)
    data, padding = _without_nul_padding(data)
    if looks_binary(data[:SNIFF_BYTES]) and not _text_before_binary(data):
        utf16 = could_be_utf16(data)
        if utf16:
            if _unpacked:  # (iconv reads no gzip)
                raise RejectedInput(display, f"holds binary data ({_unpacked}-compressed; or {utf16} text without a "
                                             "byte-order mark?)",
                                    f"if it is text, convert it: `{_UNPACK[_unpacked]} {_shell_name(display)} | "
                                    f"iconv -f {utf16} -t UTF-8 > converted.txt`")
            raise RejectedInput(display, f"binary (or {utf16} text without a byte-order mark?)",
                                f"if it is text, convert it: `iconv -f {utf16} -t UTF-8 {_shell_name(display)} > converted.txt`")
        raise _binary(display, data, _unpacked)
    try:
        raw, note = _decode(data, kind, is_stdin)
        nuls = raw.count("\x00")  # normalize_text drops them: said below with the other controls
        text = normalize_text(raw)
    except UndecodableError as e:
        raise RejectedInput(display, f"undecodable text ({e})", "convert it to UTF-8, e.g. with iconv") from None
    text, controls = _CONTROL.subn("", text)
    controls += nuls
    if not text.strip():
        held = ("only NUL bytes" if padding or nuls else "only control characters" if controls
                else "only whitespace")
        raise RejectedInput(display, "empty input" if is_stdin else EMPTY_FILE, f"it holds {held}")
    doc = _typed_document(text, display, name, kind, is_stdin, path)
    notes = [note] if note else []
    if padding:
        notes.append(f"{padding:,} NUL bytes of padding left out")
    if controls:  # binary bytes after a text head were read into the text, unsaid
        notes.append(f"{controls:,} control character{'s' if controls > 1 else ''} left out")
    if notes:
        doc = replace(doc, left_out=(*doc.left_out, Skipped(display, "; ".join(notes), replaced=True)))
    return doc


# A run of NUL bytes this long in text is padding: a log truncated in place while a writer
# kept its offset (logrotate's copytruncate), a crash before a flush. The file was refused
# as binary, its thousands of lines with it.
_NUL_PADDING = re.compile(rb"\x00{64,}")
_BINARY_BYTE = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")
_MIN_TEXT_BEFORE_BINARY = 256


def _without_nul_padding(data: bytes) -> tuple[bytes, int]:
    """`data` without runs of NUL padding, and how many bytes went; as it was where what is
    left is not text either (or a UTF-16/32 file, whose NULs are half its bytes)."""
    if b"\x00" * 64 not in data or looks_binary(_NUL_PADDING.sub(b"", data[: 4 * SNIFF_BYTES])[:SNIFF_BYTES]):
        return data, 0
    if could_be_utf16(data) or bom_encoding(data) is not None:
        return data, 0
    kept = _NUL_PADDING.sub(b"", data)
    if b"\x00" in kept:  # NULs between fields too (a tar header, a database page): binary
        return data, 0
    return kept, len(data) - len(kept)


def _text_before_binary(data: bytes) -> bool:
    """Whether `data` starts with text and turns binary later in its first SNIFF_BYTES (a
    short log with a dump after it): the text part is kept and the rest reported
    (`decode_bytes`), where the sniff of the whole head said binary."""
    first = _BINARY_BYTE.search(data, 0, SNIFF_BYTES)
    return first is not None and first.start() >= _MIN_TEXT_BEFORE_BINARY and not looks_binary(data[: first.start()])


def _typed_document(text: str, display: str, name: str, kind: str | None, is_stdin: bool,
                    path: Path | None = None) -> Document:
    if kind is None and looks_like_roff(text, name):  # a man page's source (`ls.1`, `ls.1.gz`, piped in)
        doc = _roff_document(text, display, path)
        if doc is not None:
            return doc
    if kind == "html" or (kind is None and (_looks_like_html(text) or (is_stdin and _looks_like_html_fragment(text)))):
        return _html_document(text, display)
    if kind in (None, "text") and _looks_like_man_output(text):  # `man ls | ktcli ask - ...`
        text = _unhyphenated(text)
    if name.lower().endswith(".ipynb") or (is_stdin and _looks_like_notebook(text)):
        # piped in (`cat a.ipynb | ktcli ask -`), its raw JSON and base64 images were read
        return _notebook_document(text, display)
    if is_stdin:
        return _text_document(text, display, "stdin", language_from_content(text))
    if kind == "code":
        return _text_document(text, display, "code", language_for_name(name))
    if kind == "markdown":
        shown, comments = without_markdown_comments(text)
        doc = _text_document(shown, display, kind, None)
        note = Skipped(display, f"{count_of(comments, 'HTML comment')} left out (a rendered page shows none)", part=True)
        return replace(doc, left_out=(note,)) if comments else doc
    if kind == "text":
        return _text_document(text, display, kind, None)
    language = language_from_content(text)
    return _text_document(text, display, "code" if language else "text", language)


# C0 controls but tab, line feed, vertical tab, form feed and carriage return (handled by
# normalize_text), and DEL: no text means them, a tokenizer reads them as noise.
_CONTROL = re.compile(r"[\x01-\x08\x0e-\x1f\x7f]")


def _looks_like_notebook(text: str) -> bool:
    head = text.lstrip()[:200_000]
    return head.startswith("{") and '"cells"' in head and '"nbformat"' in text[-2000:] + head[:2000]


def _decode(data: bytes, kind: str | None, is_stdin: bool = False) -> tuple[str, str | None]:
    """Our decoding policy, except that an HTML page that is not UTF-8 may declare its
    own charset (`<meta charset="shift_jis">`), which beats our Latin-1 guess; also a page
    known by its content (on stdin, `curl URL | ktcli ask - ...`, or with no extension),
    and a fragment piped in (read as HTML by `_typed_document` too: its charset was not)."""
    is_html = kind == "html" or (kind is None and (
        _bytes_look_like_html(data) or (is_stdin and _looks_like_html_fragment(data[:65536].decode("latin-1")))))
    if is_html and bom_encoding(data) is None and not is_utf8(data):
        from bs4.dammit import EncodingDetector

        declared = EncodingDetector.find_declared_encoding(data[:4096], is_html=True)
        if declared:
            try:
                return _decode_as_browsers_do(data, declared), None
            except (LookupError, UnicodeDecodeError):
                pass  # a wrong or unknown declaration: fall back to our policy
    return decode_bytes(data)


# Labels browsers read as a superset (the WHATWG Encoding standard): a page that declares
# iso-8859-1 and uses Windows-1252's quotes, dashes and euro sign is the common case, and
# read literally those became C1 control characters.
_BROWSER_ENCODINGS = {
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "l1": "cp1252",
    "ascii": "cp1252", "us-ascii": "cp1252", "iso-8859-9": "cp1254", "latin5": "cp1254", "iso-8859-11": "cp874",
    "tis-620": "cp874", "gb2312": "gb18030", "gbk": "gb18030", "euc-kr": "cp949", "ks_c_5601-1987": "cp949",
}


def _decode_as_browsers_do(data: bytes, declared: str) -> str:
    encoding = _BROWSER_ENCODINGS.get(declared.strip().lower(), declared)
    if encoding == "cp1252":  # its five unassigned bytes read as Latin-1, as browsers do
        return data.decode("cp1252", errors="latin1_fallback")
    return data.decode(encoding)


def _latin1_fallback(error: UnicodeDecodeError) -> tuple[str, int]:
    return error.object[error.start : error.end].decode("latin-1"), error.end


codecs.register_error("latin1_fallback", _latin1_fallback)


_UNPACK = {"gzip": "gunzip -c", "bzip2": "bunzip2 -c", "xz": "xz -dc", "lzma": "xz -dc"}
# LZMA-alone has no magic for _MAGIC to match: told by its header's shape (`compressed.is_lzma_alone`)
_LZMA_ALONE = ("lzma-compressed data", "decompress it first: `xz -dc FILE | ktcli ask - \"question\"`")

# Formats told by their first bytes, for a refusal that says what to do with them.
_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed data", "decompress it first: `gunzip -c FILE | ktcli ask - \"question\"`"),
    (b"BZh", "bzip2-compressed data", "decompress it first: `bunzip2 -c FILE | ktcli ask - \"question\"`"),
    (b"\xfd7zXZ\x00", "xz-compressed data", "decompress it first: `xz -dc FILE | ktcli ask - \"question\"`"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data", "decompress it first: `zstd -dc FILE | ktcli ask - \"question\"`"),
    # no reader in Python's standard library for these either: said, not "binary" alone
    (b"\x1f\x9d", "compress'd (.Z) data", "decompress it first: `zcat FILE | ktcli ask - \"question\"`"),
    (b"\x04\x22\x4d\x18", "lz4-compressed data", "decompress it first: `lz4 -dc FILE | ktcli ask - \"question\"`"),
    (b"PK\x03\x04", "a zip archive (or a .xlsx/.pptx/.ods, which are zips)",
     "unpack it and give the folder, or export the document as PDF, text or CSV"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an encrypted or legacy .doc/.docx (OLE) file", "save it as .docx or PDF"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive", "unpack it and give the folder"),
    (b"Rar!\x1a\x07", "a RAR archive", "unpack it and give the folder"),
    (b"SQLite format 3\x00", "an SQLite database", "export what you need as text or CSV"),
    (b"\x7fELF", "an executable (ELF)", f"not text; {_READABLE}"),
    (b"\x89PNG", "a PNG image", "ktcli reads no images; run OCR on it for its text"),
    (b"\xff\xd8\xff", "a JPEG image", "ktcli reads no images; run OCR on it for its text"),
    (b"GIF8", "a GIF image", "ktcli reads no images"),
    # TeX's typeset pages (its preamble opcode and DVI version 2): a docs folder's refcard.dvi.gz
    (_DVI_MAGIC := b"\xf7\x02", "a TeX DVI file (typeset pages, their text among positioning commands)",
     "convert it first: `dvipdf FILE` and give the PDF (or `dvi2tty FILE` for its text)"),
)


def _known_binary(data: bytes) -> bool:
    """A header no text starts with: a known format's, with a byte that is not printable
    ASCII in it (not "BZh" or "GIF8", which a line of text may begin with)."""
    return any(data.startswith(magic) and any(b < 0x20 or b > 0x7E for b in magic) for magic, _, _ in _MAGIC)


def _format_of(data: bytes) -> tuple[str, str] | None:
    """(what it is, what to do) of the format `data` starts with, where _MAGIC knows it."""
    return next(((what, hint) for magic, what, hint in _MAGIC if data.startswith(magic)), None)


def _binary(display: str, data: bytes, unpacked: str = "") -> RejectedInput:
    """The refusal of a binary file, naming its format where its first bytes tell it, and
    in its hint the file's own name. `unpacked`: the compression it was found inside (a
    `head -c 5000 /bin/ls | gzip > x.gz` was "binary: an executable (ELF)", as if x.gz
    itself were one)."""
    if unpacked:
        refusal = _binary(display, data)
        what = refusal.reason.removeprefix("binary").removeprefix(": ")
        hint = refusal.hint
        if data.startswith(_DVI_MAGIC) and unpacked in _UNPACK:  # (dvipdf and dvi2tty read no gzip)
            dvi = shlex.quote(PurePath(display).stem if PurePath(display).suffix else "out.dvi")
            hint = (f"decompress and convert it first: `{_UNPACK[unpacked]} {_shell_name(display)} > {dvi} && "
                    f"dvipdf {dvi}` and give the PDF (or `dvi2tty {dvi}` for its text)")
        return RejectedInput(display, f"holds binary data ({unpacked}-compressed){': ' + what if what else ''}", hint)
    file = _shell_name(display)
    from ktcli.ingest.zipdoc import unread_office

    office = unread_office(data)
    if office is not None:
        return RejectedInput(display, f"{office[0]}: not read", office[1])
    known = _format_of(data) or (_LZMA_ALONE if compressed.is_lzma_alone(data) else None)
    if known is not None and _holds_tar(data, known[0]):  # `gunzip -c a.tgz | ktcli ask -` met the tar refusal next
        return TarArchive(display, known[0].removesuffix(" data"))
    if known is not None:
        return RejectedInput(display, f"binary: {known[0]}", known[1].replace("FILE", file))
    if data[257:262] == b"ustar":
        return TarArchive(display)
    return RejectedInput(display, "binary", f"not text; {_READABLE}")


class TarArchive(RejectedInput):
    """A tar archive, compressed (`packed`: "gzip-compressed") or not, refused with the
    command that unpacks it; a folder walk names it so too (`hint`), where "binary" alone
    said nothing of what to do."""

    def __init__(self, display: str, packed: str = "") -> None:
        what = f"{'an' if packed[0] in 'aeilox' else 'a'} {packed} tar archive" if packed else "a tar archive"
        super().__init__(display, f"binary: {what}",
                         f"unpack it and give the folder: `mkdir unpacked && tar xf {_shell_name(display)} -C unpacked`")


# A tar archive by its name, and its compression (a folder walk skips them unread)
_TAR_SUFFIXES = {".tar": "", ".tgz": "gzip-compressed", ".taz": "gzip-compressed", ".tbz": "bzip2-compressed",
                 ".tbz2": "bzip2-compressed", ".tb2": "bzip2-compressed", ".txz": "xz-compressed",
                 ".tlz": "lzma-compressed", ".tzst": "zstd-compressed"}
_TAR_PACKED = {".gz": "gzip-compressed", ".bz2": "bzip2-compressed", ".xz": "xz-compressed",
               ".lzma": "lzma-compressed", ".zst": "zstd-compressed"}


# Other archives and compressions ktcli does not read, by their names: their _MAGIC entries
_PACKED_BY_SUFFIX = {".zip": b"PK\x03\x04", ".7z": b"7z\xbc\xaf\x27\x1c", ".zst": b"\x28\xb5\x2f\xfd",
                     ".lz4": b"\x04\x22\x4d\x18", ".rar": b"Rar!\x1a\x07"}


def archive_by_name(name: str, display: str) -> RejectedInput | None:
    """The refusal of a file its name calls an archive ktcli does not read ("site.tar.gz",
    "a.tgz", "photos.zip", "dump.zst"), with what to do, else None: a folder walk skips
    them unread, and said only "binary"."""
    path = PurePath(name)
    suffix = path.suffix.lower()
    if suffix in _TAR_SUFFIXES:
        return TarArchive(display, _TAR_SUFFIXES[suffix])
    if suffix in _TAR_PACKED and PurePath(path.stem).suffix.lower() == ".tar":
        return TarArchive(display, _TAR_PACKED[suffix])
    known = _format_of(_PACKED_BY_SUFFIX.get(suffix, b""))
    if known is not None:  # (a .zip is a zip: not "or a .xlsx")
        return RejectedInput(display, f"binary: {known[0].split(' (or ')[0]}", known[1].replace("FILE", _shell_name(display)))
    return None


def _shell_name(display: str) -> str:
    """`display` as a hint's command line names it ("FILE" for stdin, which has no name)."""
    return "FILE" if display == STDIN_PATH else shlex.quote(display)


def _holds_tar(data: bytes, what: str) -> bool:
    """Whether `data`, compressed data of the kind `_MAGIC` calls `what` (gzip, bzip2, xz),
    is a tar archive (a .tgz, .tar.bz2, .tar.xz): its first 512 bytes decompressed say so
    (`ustar` at 257). bzip2 gives nothing before its first block (up to 900 KB) is read
    whole: it is given the first few MB."""
    import bz2
    import lzma
    import zlib

    decompressors = {"gzip-compressed data": lambda: zlib.decompressobj(wbits=31),
                     "bzip2-compressed data": bz2.BZ2Decompressor, "xz-compressed data": lzma.LZMADecompressor,
                     "lzma-compressed data": lambda: lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)}
    make = decompressors.get(what)
    if make is None:
        return False
    try:
        head = make().decompress(data[: 4 << 20], 512)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError):  # damaged
        return False
    return head[257:262] == b"ustar"


def _what_it_holds(data: bytes) -> str:
    if looks_binary(data[:SNIFF_BYTES]):
        known = _format_of(data)
        return known[0] if known is not None else "binary data"
    return "an HTML page (an error page saved under that name?)" if _bytes_look_like_html(data) else "text"


# An inline code span (`` `<!--` ``, a backtick run closed by one as long, within a paragraph)
# is code, as CommonMark reads it before any HTML: a README that wrote "start a comment with
# `<!--`" and later "end it with `-->`" lost every line between as one comment (probe 126).
_CODE_SPAN_OR_COMMENT = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)|<!--.*?-->", re.S)
_FENCE_LINE = re.compile(r"^[ \t]{0,3}(```|~~~)")
# An indented code block's line: four spaces or a tab, after a blank line or another such line.
_INDENTED_LINE = re.compile(r"^(?: {4}|\t)[ \t]*\S")


def without_markdown_comments(text: str) -> tuple[str, int]:
    """Markdown's `<!-- ... -->` comments blanked out where code (fenced, indented or an
    inline code span) does not hold them (their line breaks kept, so lines are cited where
    they are), and how many there were. A rendered page shows none of them: a README's
    "<!-- TODO: prices from $9 -->" was read as its text (a probe's)."""
    if "<!--" not in text:
        return text, 0
    out, count, fence = [], 0, ""
    prose: list[str] = []

    def flush() -> None:
        nonlocal count
        if prose:
            block = "".join(prose)

            def blank(m: re.Match) -> str:
                nonlocal count
                if m[1]:  # a code span: kept as written
                    return m[0]
                count += 1
                return "\n" * m[0].count("\n")

            out.append(_CODE_SPAN_OR_COMMENT.sub(blank, block))
            prose.clear()

    def comment_open() -> bool:  # the prose so far ends inside a comment
        block = _CODE_SPAN_OR_COMMENT.sub(lambda m: "", "".join(prose))
        return "<!--" in block

    after_blank, in_indented = True, False
    for line in text.splitlines(keepends=True):
        opened = _FENCE_LINE.match(line)
        if fence:
            out.append(line)
            if opened and opened[1] == fence:
                fence = ""
        elif opened:
            flush()
            out.append(line)
            fence = opened[1]
        elif _INDENTED_LINE.match(line) and (after_blank or in_indented) and not comment_open():
            # an indented code block (`    <!-- begin widget` in a README's example) is code
            # as a fenced one is: it opened a "comment" that ran to a later `-->` (probe 126)
            flush()
            out.append(line)
            in_indented = True
        else:
            prose.append(line)
            in_indented = in_indented and not line.strip()  # a blank line inside the block
        after_blank = not line.strip()
    flush()
    return "".join(out), count


# `man`'s own output (piped in, or saved): its first line "LS(1)   User Commands   LS(1)".
_MAN_OUTPUT_HEAD = re.compile(r"\A\s*(\S+)\(([0-9n][\w+]*)\)[ \t]{2,}.*\S[ \t]{2,}\1\(\2\)[ \t]*$", re.MULTILINE)
# A word groff broke at a line's end: it writes that break's hyphen as U+2010 HYPHEN in
# UTF-8 (a hyphen of the source, "system-dependent", is "-"). "brack‐" / "eted-paste"
# reached the model and the index as two words.
_BROKEN_WORD = re.compile(r"[ \t]*(\S+)\u2010\n([ \t]*)(?=[^\W\d_])")


def _looks_like_man_output(text: str) -> bool:
    return "\u2010\n" in text and _MAN_OUTPUT_HEAD.match(text[:500]) is not None


def _unhyphenated(text: str) -> str:
    """`man`'s output with the words it hyphenated at line ends whole again: the first
    part is moved to the start of the next line, so that every line keeps its number
    (a line that would be left empty keeps its hyphen: an empty line ends a paragraph)."""
    def join(m: re.Match) -> str:
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not text[line_start:m.start()].strip():  # the broken word is its line's only one
            return m.group(0)
        return f"\n{m.group(2)}{m.group(1)}"

    return _BROKEN_WORD.sub(join, text)


def _text_document(text: str, display: str, kind: str, language: str | None) -> Document:
    return Document(path=display, text=text, kind=kind, language=language, sha256=text_sha256(text))


def _bytes_look_like_html(data: bytes) -> bool:
    """`_looks_like_html` before decoding (the markers are ASCII in any ASCII-based charset)."""
    return _looks_like_html(data[:1024].removeprefix(b"\xef\xbb\xbf").decode("latin-1"))


_HTML_PREAMBLE = re.compile(r"\A(?:\ufeff|\s|<\?xml[^>]*>|<!--.*?-->)*", re.S)


def _looks_like_html(text: str) -> bool:
    """A page by its start, past an XML prolog and comments ("<!-- saved from url=... -->")."""
    head = _HTML_PREAMBLE.sub("", text[:1024], count=1).lower()
    return head.startswith(("<!doctype html", "<html", "<head", "<body"))


# What a fragment opens with: a block or inline element, or a head's element a snippet may
# carry along (`<meta charset=...>` first, then its paragraphs).
_FRAGMENT_START = re.compile(
    r"<(?:h[1-6]|p|div|section|article|main|nav|header|footer|table|ul|ol|dl|blockquote|pre|figure|span|a|b|i|em|strong"
    r"|meta|title|style|link)\b",
    re.I)
_BLOCK_END = re.compile(r"</(?:p|div|h[1-6]|li|ul|ol|table|tr|td|th|section|article|pre|blockquote|dd|dt|figure)\s*>", re.I)
_MARKDOWN = re.compile(r"^(?:#{1,6}\s|```|~~~|\s*[-*+]\s|\s*\d+[.)]\s|\|.*\|\s*$|[=-]{3,}\s*$)|\[[^\]\n]+\]\([^)\n]+\)", re.M)
_TAG = re.compile(r"</?[a-zA-Z]")
_CODE_SAMPLE = re.compile(r"<(pre|code)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
# A template or server page: its code is what a question is about, and read as HTML it is
# gone (PHP's `<?php ... ?>`, Jinja's `{% %}`/`{{ }}`, ERB/JSP's `<% %>`, Vue's and
# Angular's `v-if`, `:prop`, `@click`, `*ngFor`, `[prop]`, `(event)` attributes).
_TEMPLATE = re.compile(r"<\?|<%|\{%|\{\{|\{#|\s(?:v-[\w-]+|:[\w-]+|@[\w-]+|\*ng\w+|\[[\w.-]+\]|\([\w.-]+\))=")


def _looks_like_html_fragment(text: str) -> bool:
    """Piped-in HTML without <html> or <body> (pandoc's default output, an API's or a
    CMS's snippet): read as raw markup, the model got tags and attributes. A Markdown
    README that opens with HTML (`<p align="center"><img ...></p>`) is not one: its
    Markdown, and its paragraphs with no tag in them, say so."""
    sample = text[:65536]
    if not _FRAGMENT_START.match(_HTML_PREAMBLE.sub("", sample[:1024], count=1)):
        return False
    if _TEMPLATE.search(_CODE_SAMPLE.sub(" ", sample)):  # (a page quoting `{{ .Values }}` in <pre> is a page)
        return False
    blocks = [b for b in re.split(r"\n\s*\n", sample) if b.strip()]
    untagged = sum(1 for b in blocks if not _TAG.search(b))
    ends = len(_BLOCK_END.findall(sample))
    return ends >= 2 and untagged * 10 <= len(blocks) and len(_MARKDOWN.findall(sample)) * 10 <= ends


def _html_document(markup: str, display: str) -> Document:
    # Imported here: BeautifulSoup and pypdf cost ~0.15 s of every start, used or not.
    from ktcli.ingest.htmltext import html_to_text

    from ktcli.ingest.extract_cache import html_text

    def read() -> tuple[str, tuple[int, ...], list[str]]:
        notes: list[str] = []
        text, source_lines = html_to_text(markup, left_out=notes)
        return text, source_lines, notes

    try:
        text, source_lines, notes = html_text(markup, read)
    except ValueError as e:
        raise RejectedInput(display, f"unreadable HTML ({e})") from None
    if not text.strip():
        raise RejectedInput(display, "HTML page without visible text")
    left_out = tuple(Skipped(display, note, part=True) for note in notes)
    return replace(_text_document(text, display, "html", None), source_lines=source_lines, left_out=left_out)


def _roff_document(source: str, display: str, path: Path | None = None) -> Document | None:
    """A man page as `man` shows it (`ingest.roff`), its lines cited as the source's: read
    raw, its `.TH`, `.SH NAME`, `\\fB...\\fR` and `\\-` reached the model and the citations.
    None where nothing is left to show (a page of comments): read as the text it is. A page
    the user named (`path`) reads in the pages its `.so` lines name (rbash.1 holds bash.1's
    restricted shell section so), as man does."""
    from ktcli.ingest.roff import roff_to_text

    text, source_lines = roff_to_text(source, _man_includer(path) if path is not None else None)
    if not text.strip():
        return None
    return replace(_text_document(normalize_text(text), display, "markdown", None), source_lines=source_lines)


def _man_includer(page: Path) -> Callable[[str], str | None]:
    """The source of the page a `.so` in `page` names, found as a `.so` link is
    (`_man_page_at`), compressed or not; None where it is not there or not readable."""
    def include(link: str) -> str | None:
        target = _man_page_at(page, link)
        if target is None:
            return None
        try:
            data = _decompressed(read_file_bytes(target, str(target)), read_limit_bytes())
        except RejectedInput:
            return None
        return normalize_text(data.decode("utf-8", "replace"))

    return include


def _notebook_document(raw: str, display: str) -> Document:
    """A notebook's cells as markdown with fenced code (`ingest.notebook`); a .ipynb that
    is not nbformat JSON is read as the text it is, with a note."""
    from ktcli.ingest.notebook import NotANotebook, notebook_text

    try:
        text, source_lines, rich = notebook_text(raw)
    except NotANotebook as e:
        # Read as the text it is, and said: a notebook cut short in a copy was read as
        # raw JSON, unannounced.
        note = Skipped(display, f"not a Jupyter notebook ({e}): read as its JSON text", part=True)
        return replace(_text_document(raw, display, "code", "json"), left_out=(note,))
    if not text.strip():
        raise RejectedInput(display, "notebook without cells")
    left_out = (Skipped(display, f"{rich} image or other rich output{'s' if rich > 1 else ''} of its cells left out", part=True),) if rich else ()
    return replace(_text_document(text, display, "markdown", None), source_lines=source_lines, left_out=left_out)


def _pdf_document(data: bytes, display: str, text_limit: int | None = None) -> Document:
    from ktcli.ingest.extract_cache import pdf_pages
    from ktcli.ingest.pdftext import READ_BUT, extract_pages

    # unread page 0: the whole file
    page_texts, unread, labels, sections = pdf_pages(data, text_limit, lambda: extract_pages(data, display, text_limit))
    text, pages = _paged(page_texts, labels, sections)
    left_out = tuple(Skipped(f"{display} p.{n}" if n else display, why, part=not n or why.startswith(READ_BUT))
                     for n, why in unread)
    return Document(path=display, text=text, kind="pdf", pages=pages, sha256=text_sha256(text), left_out=left_out)


def _paged(texts: list[str], labels: list[str | None] | None = None,
           sections: list[PageSections] | None = None) -> tuple[str, tuple[Page, ...]]:
    """The pages' texts joined, and each page with the line it starts on."""
    pages: list[Page] = []
    offset = 0
    for number, page_text in enumerate(texts, start=1):
        pages.append(Page(number=number, text=page_text, line_offset=offset,
                          label=labels[number - 1] if labels else None,
                          section=sections[number - 1].start if sections else "",
                          headings=sections[number - 1].headings if sections else ()))
        offset += page_text.count("\n") + 1  # each page is at least one (maybe empty) line
    return "\n".join(texts), tuple(pages)


# Word, OpenDocument and EPUB files are zips, told apart by what they hold (`ingest.zipdoc`);
# by the kind their names give (`sniff.doc_kind_for_name`), as the user calls them.
_ZIPPED_KINDS = {"docx": "Word document (.docx)", "odt": "OpenDocument text (.odt)", "epub": "EPUB book (.epub)"}


def _a(name: str) -> str:
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"


def _zipped_format(data: bytes, display: str, kind: str | None) -> str | None:
    """"docx", "odt" or "epub" for a zip holding one, whatever its name (stdin, a
    misnamed file); None for other zips (refused as archives) and other bytes. A zip
    named as one of them that holds none is refused here."""
    from ktcli.ingest.zipdoc import ZIP_MAGIC, zip_format

    if not data.startswith(ZIP_MAGIC):
        return None
    found = zip_format(data)
    if found is None and kind in _ZIPPED_KINDS:
        if not _opens_as_zip(data):  # a damaged one (cut short, overwritten): its reader says so
            return kind
        raise RejectedInput(display, f"not {_a(_ZIPPED_KINDS[kind])}: a zip archive without one in it "
                                     "(a spreadsheet, a presentation or another zip, renamed?)",
                            "export it as PDF or text")
    return found


def _opens_as_zip(data: bytes) -> bool:
    import zipfile

    try:
        zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError):
        return False
    return True


def _zipped_document(data: bytes, display: str, kind: str) -> Document:
    """A Word, OpenDocument or EPUB file read by its reader: cited by page where the file
    records its pages (`ingest.layout`), by chapter (EPUB), else by paragraph."""
    import zipfile
    import zlib

    from ktcli.ingest.zipdoc import DamagedDocument, ZipDocument

    what = _ZIPPED_KINDS[kind]
    try:
        archive = ZipDocument(data, display, what, read_limit_bytes())
        if kind == "docx":
            from ktcli.ingest.docx import docx_text as read
        elif kind == "odt":
            from ktcli.ingest.odt import odt_text as read
        else:
            from ktcli.ingest.epub import epub_text as read
        found = read(archive)
    except RejectedInput:
        raise
    except DamagedDocument as e:
        raise RejectedInput(display, f"damaged {what}: {e}") from None
    except RecursionError:
        raise RejectedInput(display, f"unreadable {what}: nested too deeply") from None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, OSError, EOFError, RuntimeError,
            NotImplementedError, zipfile.BadZipFile, zlib.error) as e:
        # a reader's own slip on an odd file: one line that names it, never a traceback
        detail = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise RejectedInput(display, f"unreadable {what} ({type(e).__name__}{': ' + detail if detail else ''})") from None
    return _laid_out_document(found, display, kind, what)


def _laid_out_document(found, display: str, kind: str, what: str) -> Document:
    """A Document of a word processor's text as its reader laid it out (`ingest.layout`):
    by page where it recorded them, else by paragraph."""
    texts = [normalize_text(t) for t in found.texts]
    if not any(t.strip() for t in texts):
        if found.images:
            # as a scanned PDF: its words are in pictures ktcli cannot read
            n = found.images
            why = "a book of pictures?" if kind == "epub" else "scanned pages pasted in?"
            raise RejectedInput(display, f"no text, only {n} image{'s' if n > 1 else ''} ({why})",
                                "save it as PDF and run OCR first, e.g. `ocrmypdf in.pdf out.pdf`")
        raise RejectedInput(display, f"{what} without text")
    left_out = (Skipped(display, "; ".join(found.left_out), part=True),) if found.left_out else ()
    if found.paged:
        text, pages = _paged(texts)
        return Document(path=display, text=text, kind=kind, pages=pages, sha256=text_sha256(text), left_out=left_out,
                        unit=found.unit)
    text = texts[0]
    return Document(path=display, text=text, kind=kind, sha256=text_sha256(text), source_lines=found.source_lines,
                    left_out=left_out, unit=PARAGRAPH)


def _looks_like_mhtml(data: bytes, name: str, kind: str | None) -> bool:
    """A web page saved as one file (.mhtml, .mht: Chrome's and Edge's "Save as single
    file"): by its name, or, where the name says nothing (stdin), a MIME header block
    that says so (Chrome's `Snapshot-Content-Location`). Code or notes that quote such
    headers, and an e-mail (.eml: `ingest.mail`), are not one."""
    if PurePath(name).suffix.lower() in (".mhtml", ".mht"):
        return True
    if kind is not None:
        return False
    header = data[:8192].replace(b"\r\n", b"\n").split(b"\n\n", 1)[0].lower()
    return (header.startswith((b"from:", b"mime-version:", b"snapshot-content-location:", b"subject:"))
            and b"multipart/related" in header and b"snapshot-content-location:" in header)


def _mhtml_document(data: bytes, display: str) -> Document:
    """The page of a saved MHTML file, its HTML part decoded: read raw, its quoted-printable
    markup ("Meals are reimbu=") and a base64 picture were 37K tokens. Cited by paragraph:
    no line of the file is a line of the page."""
    import email
    import email.policy

    html, images = None, 0
    try:
        for part in email.message_from_bytes(data, policy=email.policy.default).walk():
            if part.is_multipart():
                continue
            if part.get_content_type() == "text/html" and html is None:
                raw = part.get_payload(decode=True) or b""
                charset = part.get_content_charset()
                # its own charset where the part names one, else as a page: UTF-8, its
                # <meta charset>, our guess (Chrome names none)
                try:
                    html = raw.decode(charset, "replace") if charset else _decode(raw, "html")[0]
                except LookupError:  # a charset Python does not know
                    html = _decode(raw, "html")[0]
            elif part.get_content_maintype() == "image":
                images += 1
    except (LookupError, ValueError, TypeError, AttributeError, UnicodeError) as e:
        raise RejectedInput(display, f"unreadable saved web page (MHTML: {type(e).__name__})") from None
    if not isinstance(html, str):
        raise RejectedInput(display, "a saved web page (MHTML) without an HTML part")
    doc = _html_document(html, display)
    left = (Skipped(display, f"{images:,} image{'s' if images != 1 else ''} of the page not read", part=True),) if images else ()
    return replace(doc, source_lines=paragraph_numbers(doc.text), unit=PARAGRAPH, left_out=doc.left_out + left)


def _mail_by_content(data: bytes) -> bool:
    from ktcli.ingest.mail import looks_like_mail

    return looks_like_mail(data)


def _several_mails(data: bytes) -> bool:
    """An mbox named .eml: read as the text it is, not as its first message alone."""
    from ktcli.ingest.mail import holds_several

    return holds_several(data)


def _mail_document(data: bytes, display: str) -> Document:
    """An e-mail as a mail program shows it (`ingest.mail`), cited by paragraph: its lines
    are no lines of the file."""
    from ktcli.ingest.htmltext import html_to_text
    from ktcli.ingest.mail import MailError, mail_text

    try:
        text, left_out = mail_text(data, lambda markup: html_to_text(markup, title=False)[0])
    except MailError as e:
        raise RejectedInput(display, str(e)) from None
    doc = _text_document(normalize_text(text), display, "markdown", None)
    notes = tuple(Skipped(display, why, part=True) for why in left_out)
    return replace(doc, source_lines=paragraph_numbers(doc.text), unit=PARAGRAPH, left_out=doc.left_out + notes)


def _is_mbox(data: bytes, name: str, kind: str | None) -> bool:
    """A mailbox (Thunderbird's folders, a mail export, an mbox named .eml): by its name, or,
    where the name says nothing, a "From " line over a message's headers. Not `git
    format-patch` output (its "From <commit> Mon Sep 17 00:00:00 2001" lines): a diff."""
    from ktcli.ingest.mail import looks_like_mail

    suffix = PurePath(name).suffix.lower()
    if not data.startswith(b"From ") or _FORMAT_PATCH.match(data):
        return False
    if suffix in (".mbox", ".mbx") or (suffix == ".eml" and _several_mails(data)):
        return True
    return kind is None and looks_like_mail(data.split(b"\n", 1)[-1])


_FORMAT_PATCH = re.compile(rb"From [0-9a-f]{7,64} Mon Sep 17 00:00:00 2001\r?\n")


def _mbox_document(data: bytes, display: str) -> Document:
    """Each message of a mailbox as an e-mail is read (`ingest.mail`), one after the other,
    cited by paragraph. Read as text, its base64 bodies and attachments were most of its
    tokens (and a message in HTML alone was nothing but base64), a subject in another
    script was "=?utf-8?b?w4Vyc23DtnRlIOKAkw==?=" and a quoted-printable body "K=C3=A4llarsalen"."""
    from ktcli.ingest.htmltext import html_to_text
    from ktcli.ingest.mail import MailError, mail_text, mbox_messages

    texts, notes = [], []
    messages = mbox_messages(data)
    for number, message in enumerate(messages, start=1):
        try:
            text, left_out = mail_text(message, lambda markup: html_to_text(markup, title=False)[0])
        except MailError as e:
            notes.append(f"message {number}: {e}")
            continue
        texts.append(text.strip("\n"))
        notes += [f"message {number}: {why}" if len(messages) > 1 else why for why in left_out]
    if not texts:
        raise RejectedInput(display, "a mailbox without a message that can be read")
    doc = _text_document(normalize_text("\n\n".join(texts) + "\n"), display, "markdown", None)
    left = tuple(Skipped(display, why, part=True) for why in notes)
    return replace(doc, source_lines=paragraph_numbers(doc.text), unit=PARAGRAPH, left_out=doc.left_out + left)


def paragraph_numbers(text: str) -> tuple[int, ...]:
    """The paragraph (¶) of each line of `text`: blocks between blank lines, counted from 1
    (a blank line takes the number of the paragraph before it)."""
    numbers, n, in_block = [], 0, False
    for line in text.split("\n"):
        if line.strip():
            n += not in_block
            in_block = True
        else:
            in_block = False
        numbers.append(max(n, 1))
    return tuple(numbers)


def _rtf_document(data: bytes, display: str) -> Document:
    from ktcli.ingest.rtf import rtf_text

    try:
        found = rtf_text(data)
    except (ValueError, IndexError, RecursionError) as e:  # a reader's slip on an odd file: one line
        raise RejectedInput(display, f"unreadable RTF file ({type(e).__name__})") from None
    return _laid_out_document(found, display, "rtf", "RTF document")


# Microsoft's compound files (OLE): Office 97-2003 documents, and any Office file saved with
# a password (the encrypted .docx is a zip inside one). Their directory names their
# streams in UTF-16.
_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_OLE_KINDS = (
    ("EncryptedPackage", "an encrypted or legacy .doc/.docx (OLE) file: this one is encrypted (it has a password)",
     "open it, remove the password and save it as .docx or PDF"),
    ("WordDocument", "an encrypted or legacy .doc/.docx (OLE) file: this one is a Word 97-2003 .doc",
     "save it as .docx or PDF"),
    ("Workbook", "a legacy Excel .xls (OLE) file", "export it as CSV or PDF"),
    ("PowerPoint Document", "a legacy PowerPoint .ppt (OLE) file", "export it as PDF"),
)


# Other OLE files by their names (an Outlook message was called a legacy .doc).
_OLE_BY_SUFFIX = {".msg": ("an Outlook message (.msg, OLE)", "save it as text or PDF, or its attachments on their own"),
                  ".xls": ("a legacy Excel .xls (OLE) file", "export it as CSV or PDF"),
                  ".ppt": ("a legacy PowerPoint .ppt (OLE) file", "export it as PDF"),
                  ".pub": ("a Publisher file (OLE)", "export it as PDF"),
                  ".vsd": ("a Visio drawing (OLE)", "export it as PDF")}


def _ole_refusal(display: str, data: bytes) -> RejectedInput:
    for stream, what, hint in _OLE_KINDS:
        if stream.encode("utf-16-le") in data:
            return RejectedInput(display, what, hint)
    by_name = _OLE_BY_SUFFIX.get(PurePath(display).suffix.lower())
    if by_name is not None:
        return RejectedInput(display, *by_name)
    return RejectedInput(display, "an encrypted or legacy .doc/.docx (OLE) file", "save it as .docx or PDF")
