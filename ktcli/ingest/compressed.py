"""A file compressed whole, read as what it decompresses to: a rotated log (`syslog.2.gz`),
a package's docs (`/usr/share/doc/*/NEWS.md.gz`), `data.csv.gz`. They were refused as
binary ("decompress it first"), and skipped unread in a folder walk: a docs folder's
summary left out its README and its changes. A tar inside (.tgz) is an archive, not a
file, and stays refused; zstd has no reader in Python's standard library.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from pathlib import PurePath

from ktcli.ingest.errors import RejectedInput

# (format, its file suffixes): gzip's own, bzip2's and xz's
_SUFFIXES = {"gzip": (".gz", ".z"), "bzip2": (".bz2", ".bz"), "xz": (".xz",)}
# Read in pieces: the cap is checked between them, so a small bomb stops at it.
_PIECE = 1 << 20


def format_of(data: bytes) -> str | None:
    """The compression `data` starts with ("gzip", "bzip2", "xz"), else None. bzip2's
    "BZh" is also how a line of text may start: its block header must follow."""
    if data.startswith(b"\x1f\x8b\x08"):
        return "gzip"
    if data.startswith(b"BZh") and data[3:4] in b"123456789" and data[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    if data.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    return None


def inner_name(name: str, compression: str) -> str:
    """The file's name less its compression's suffix ("NEWS.md.gz" -> "NEWS.md"), so that
    what it holds is read by its own kind; "" for a name without one (stdin)."""
    path = PurePath(name)
    if path.suffix.lower() in _SUFFIXES[compression]:
        return path.stem
    return "" if not name else name


def decompress(data: bytes, compression: str, display: str, limit: int, over_hint: str) -> bytes:
    """All of `data` decompressed, each concatenated member or stream too (`cat a.gz b.gz`),
    or RejectedInput once past `limit` bytes (`over_hint`: what to do) or where it is
    damaged (cut short: what decompressed up to the cut is not read as the whole file)."""
    out: list[bytes] = []
    total = 0
    rest = data
    try:
        while rest:
            engine = _engine(compression)
            for piece in _pieces(engine, rest):
                total += len(piece)
                if total > limit:
                    size = f"{limit / 2**20:,.0f} MiB" if limit >= 2**20 else f"{limit:,} bytes"
                    raise RejectedInput(display, f"{compression}-compressed data that decompresses to over {size}",
                                        over_hint)
                out.append(piece)
            rest = engine.unused_data.lstrip(b"\x00")  # another member; a tape's NUL padding is none
    except RejectedInput:
        raise
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as e:
        raise RejectedInput(display, f"damaged {compression}-compressed data ({str(e) or type(e).__name__})",
                            "it may be cut short: copy or download it again") from None
    return b"".join(out)


_CUT = "compressed data ended before its end-of-stream marker"


def _engine(compression: str):  # type: ignore[no-untyped-def]
    if compression == "gzip":
        return zlib.decompressobj(wbits=31)
    return bz2.BZ2Decompressor() if compression == "bzip2" else lzma.LZMADecompressor()


def _pieces(engine, data: bytes):  # type: ignore[no-untyped-def]
    """One stream's (or member's) bytes, _PIECE at a time; EOFError where `data` ends first.
    zlib hands back the input it did not use (`unconsumed_tail`); bz2 and lzma keep it."""
    if isinstance(engine, type(zlib.decompressobj())):
        while not engine.eof:
            piece = engine.decompress(data, _PIECE)
            data = engine.unconsumed_tail
            if not piece and not data and not engine.eof:  # a member of nothing (`gzip < /dev/null`) ends so
                raise EOFError(_CUT)
            yield piece
        return
    yield engine.decompress(data, _PIECE)
    while not engine.eof:
        if engine.needs_input:
            raise EOFError(_CUT)
        yield engine.decompress(b"", _PIECE)
