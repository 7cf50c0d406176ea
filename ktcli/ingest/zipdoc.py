"""Documents that are zips of XML: Word (.docx), OpenDocument text (.odt) and EPUB. Which
of them a zip is (by its content, so that stdin and a misnamed file are read too), and its
members read with their decompressed total bounded and their XML parsed without entity
expansion. What the format readers (`docx`, `odt`, `epub`) find is a `ZippedText`."""

from __future__ import annotations

import io
import posixpath
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from urllib.parse import unquote
from xml.etree import ElementTree as ET

from ktcli.ingest.errors import RejectedInput

ZIP_MAGIC = b"PK\x03\x04"

_ODF_TEXT = ("application/vnd.oasis.opendocument.text", "application/vnd.oasis.opendocument.text-template")
_EPUB = "application/epub+zip"
# A Word main part's content types: document, macro-enabled, and their templates.
_WORD_MAIN = re.compile(rb"wordprocessingml\.(?:document|template)\.main\+xml|ms-word\.(?:document|template)\.macroEnabled",
                        re.IGNORECASE)


class DamagedDocument(ValueError):
    """A member missing or unreadable, or XML that does not parse: the reader's caller
    refuses the file in one line, naming its format."""


@dataclass
class ZippedText:
    """A zipped document's text as its reader found it, for `loaders` to make a Document of.

    `texts`: its pages (or chapters) where `paged`, else one text. `source_lines`: for an
    unpaged text, the paragraph (¶) of each of its lines. `left_out`: what was not read, in
    words, said in one line. `images`: how many pictures it holds (a file of only those
    is refused as a scan would be)."""

    texts: list[str]
    paged: bool = False
    unit: str = ""
    source_lines: tuple[int, ...] = ()
    left_out: list[str] = field(default_factory=list)
    images: int = 0


# Office files ktcli does not read, by what their zip holds: (member or mimetype, what it
# is, what to do). A workbook was refused as "a zip archive; unpack it", which read its
# XML parts as code.
_UNREAD_OFFICE = (
    ("xl/workbook.xml", "an Excel workbook (.xlsx)", "export its sheets as CSV (File > Save As > CSV)"),
    ("xl/workbook.bin", "an Excel binary workbook (.xlsb)", "export its sheets as CSV"),
    ("ppt/presentation.xml", "a PowerPoint presentation (.pptx)", "export it as PDF"),
    ("application/vnd.oasis.opendocument.spreadsheet", "an OpenDocument spreadsheet (.ods)", "export its sheets as CSV"),
    ("application/vnd.oasis.opendocument.presentation", "an OpenDocument presentation (.odp)", "export it as PDF"),
    ("application/vnd.oasis.opendocument.graphics", "an OpenDocument drawing (.odg)", "export it as PDF"),
    ("index/document.iwa", "an Apple Pages, Numbers or Keynote file", "export it as PDF, .docx or CSV"),
)


def unread_office(data: bytes) -> tuple[str, str] | None:
    """(what it is, what to do) for a zip that is an office file ktcli does not read (a
    spreadsheet, a presentation); None for anything else."""
    if not data.startswith(ZIP_MAGIC):
        return None
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = {name.lower() for name in archive.namelist()}
        mimetype = ""
        if "mimetype" in names:
            with archive.open("mimetype") as member:
                mimetype = member.read(100).strip().decode("ascii", "replace")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, OSError, EOFError, ValueError, RuntimeError,
            NotImplementedError, zlib.error):
        return None
    return next(((what, hint) for key, what, hint in _UNREAD_OFFICE if key in names or key == mimetype), None)


def zip_format(data: bytes) -> str | None:
    """"docx", "odt" or "epub" for a zip holding one, by what is inside it; None for any
    other zip (a spreadsheet, a presentation, an archive) or bytes that are none."""
    if not data.startswith(ZIP_MAGIC):
        return None
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = {name.lower(): name for name in archive.namelist()}
        if "mimetype" in names:
            # bounded: a "mimetype" of gigabytes of spaces, a few MB zipped, was read whole
            with archive.open(names["mimetype"]) as member:
                mimetype = member.read(100).strip().decode("ascii", "replace")
            if mimetype in _ODF_TEXT:
                return "odt"
            if mimetype == _EPUB:
                return "epub"
        if "[content_types].xml" in names:
            # the content types are a few KB; bounded all the same (a crafted one)
            with archive.open(names["[content_types].xml"]) as types:
                if _WORD_MAIN.search(types.read(1 << 20)):
                    return "docx"
        if "word/document.xml" in names:
            return "docx"
        if "meta-inf/container.xml" in names and any(n.endswith(".opf") for n in names):
            return "epub"  # an EPUB that lost its mimetype member, as some tools write them
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError,
            NotImplementedError, zlib.error):
        return _format_from_first_member(data)
    return None


def _format_from_first_member(data: bytes) -> str | None:
    """A zip too damaged to open (cut short: no central directory) still starts with its
    first member, which ODF and EPUB write uncompressed: their mimetype."""
    name_length = int.from_bytes(data[26:28], "little")
    extra_length = int.from_bytes(data[28:30], "little")
    if data[30 : 30 + name_length] != b"mimetype":
        return "docx" if b"word/" in data[:4096] else None
    start = 30 + name_length + extra_length
    mimetype = data[start : start + 60]
    if mimetype.startswith(_EPUB.encode()):
        return "epub"
    return "odt" if any(mimetype.startswith(t.encode()) for t in _ODF_TEXT) else None


class ZipDocument:
    """A zipped document's members, read at most `limit` decompressed bytes in all.

    The limit is `loaders.read_bounded`'s, for the same reason: a .docx of 200 KB can hold
    gigabytes of XML (a zip bomb, or a crafted file), and reading it whole would take the
    machine's memory before anything could be said."""

    def __init__(self, data: bytes, display: str, what: str, limit: int) -> None:
        self.display, self.what, self.limit = display, what, limit
        self.read_bytes = 0
        try:
            self.archive = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
            raise DamagedDocument(f"not a readable zip ({_first_line(e)})") from None
        # Part names are case-insensitive in Office files (OPC), and written so by some tools.
        self._names = {info.filename.lower(): info for info in self.archive.infolist()}

    def has(self, name: str) -> bool:
        return name.lower() in self._names

    def names(self) -> list[str]:
        return [info.filename for info in self._names.values()]

    def read(self, name: str) -> bytes:
        """A member's bytes; DamagedDocument if it is missing or cannot be decompressed."""
        info = self._names.get(name.lower())
        if info is None:
            raise DamagedDocument(f"{name} is missing")
        if self.read_bytes + info.file_size > self.limit:  # said so by its header: not a byte read
            raise self.too_large()
        pieces = []
        try:
            with self.archive.open(info) as member:
                while piece := member.read(1 << 20):
                    self.read_bytes += len(piece)
                    if self.read_bytes > self.limit:
                        raise self.too_large()
                    pieces.append(piece)
        except RejectedInput:
            raise
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error, NotImplementedError, RuntimeError) as e:
            # RuntimeError: a member encrypted with a zip password
            raise DamagedDocument(f"{name} cannot be read ({_first_line(e)})") from None
        return b"".join(pieces)

    def xml(self, name: str, *, required: bool = True) -> ET.Element | None:
        """A member parsed as XML; None where it is missing and not `required`."""
        if not required and not self.has(name):
            return None
        return parse_xml(self.read(name), name)

    def too_large(self) -> RejectedInput:
        return RejectedInput(self.display, f"{self.what} that decompresses to over {self.limit / 2**20:,.0f} MiB, more "
                                           "than this machine's free memory can read (a zip bomb?)",
                             "save its text as a smaller file, or give the part the question is about")


_ENTITY_DECLARATIONS = (b"<!ENTITY", "<!ENTITY".encode("utf-16-le"), "<!ENTITY".encode("utf-16-be"))


def parse_xml(data: bytes, name: str) -> ET.Element:
    """`data` as an element tree. An entity declaration is refused before parsing: no
    Office, ODF or EPUB file needs one, and nested entities expand a few KB into gigabytes
    ("billion laughs"). External entities are never fetched by ElementTree."""
    if any(marker in data for marker in _ENTITY_DECLARATIONS):
        raise DamagedDocument(f"{name} declares XML entities, which no such document needs")
    try:
        return ET.fromstring(data)
    except ET.ParseError as e:
        raise DamagedDocument(f"{name} is not well-formed XML ({e})") from None


def resolve(base: str, target: str) -> str:
    """A relative reference (`media/image1.png`, `../Text/ch1.xhtml#p3`) from the member
    `base` as a member name: without its fragment, percent-decoded, `..` resolved."""
    target = unquote(target.split("#", 1)[0])
    if target.startswith("/"):
        return posixpath.normpath(target.lstrip("/"))
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), target))


def local(tag: object) -> str:
    """An element's name without its namespace: "p" for "{...wordprocessingml...}p"."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else type(error).__name__
