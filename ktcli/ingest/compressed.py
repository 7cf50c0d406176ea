"""A file compressed whole, read as what it decompresses to: a rotated log (`syslog.2.gz`),
a package's docs (`/usr/share/doc/*/NEWS.md.gz`), `data.csv.gz`. They were refused as
binary ("decompress it first"), and skipped unread in a folder walk: a docs folder's
summary left out its README and its changes. A tar inside (.tgz) is an archive, not a
file, and stays refused; zstd has no reader in Python's standard library. The legacy
LZMA-alone format (`.lzma`, what `lzma`/`xz --format=lzma` write) is read as xz is.
"""

from __future__ import annotations

import bz2
import lzma
import re
import zlib
from pathlib import PurePath

from ktcli.ingest.errors import RejectedInput

# (format, its file suffixes): gzip's own, bzip2's, xz's and LZMA-alone's
_SUFFIXES = {"gzip": (".gz", ".z"), "bzip2": (".bz2", ".bz"), "xz": (".xz",), "lzma": (".lzma",)}
# Read in pieces: the cap is checked between them, so a small bomb stops at it.
_PIECE = 1 << 20


class UnpackedOverLimit(RejectedInput):
    """What `decompress` unpacks passed its limit: a folder walk says which limit, and how
    to raise it, as it does for a file too large by its own size."""

    def __init__(self, display: str, reason: str, hint: str, *, compression: str, limit: int) -> None:
        super().__init__(display, reason, hint)
        self.compression = compression
        self.limit = limit


def format_of(data: bytes) -> str | None:
    """The compression `data` starts with ("gzip", "bzip2", "xz"), else None. bzip2's
    "BZh" is also how a line of text may start: its block header must follow."""
    if data.startswith(b"\x1f\x8b\x08"):
        return "gzip"
    if data.startswith(b"BZh") and data[3:4] in b"123456789" and data[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    if data.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if is_lzma_alone(data):
        return "lzma"
    return None


def is_lzma_alone(data: bytes) -> bool:
    """An LZMA-alone header, which has no magic: lc/lp/pb 3/0/2 as every encoder writes them
    (0x5d), a dictionary size of 2^n or 2^n + 2^(n-1) (4 KiB to 1.5 GiB), and an unpacked
    size that is unknown (all 0xff) or under 2^48: no text starts with "]\\0\\0"."""
    if len(data) < 13 or data[0] != 0x5D:
        return False
    dictionary = int.from_bytes(data[1:5], "little")
    size = data[5:13]
    shapes = (2**n for n in range(12, 31))
    return (any(dictionary in (d, d + d // 2) for d in shapes)
            and (size == b"\xff" * 8 or int.from_bytes(size, "little") < 1 << 48))


def inner_name(name: str, compression: str) -> str:
    """The file's name less its compression's suffix ("NEWS.md.gz" -> "NEWS.md"), so that
    what it holds is read by its own kind; "" for a name without one (stdin)."""
    path = PurePath(name)
    return path.stem if path.suffix.lower() in _SUFFIXES[compression] else name


def decompress(data: bytes, compression: str, display: str, limit: int, over_hint: str) -> tuple[bytes, int]:
    """All of `data` decompressed, each concatenated member or stream too (`cat a.gz b.gz`),
    or RejectedInput once past `limit` bytes (`over_hint`: what to do) or where it is
    damaged (cut short: what decompressed up to the cut is not read as the whole file).
    With it, how many bytes after the last member are none (trailing garbage: gzip reads
    past them with a warning; the whole log was refused as damaged)."""
    out: list[bytes] = []
    total = 0
    at = 0  # where the next member starts in `data`
    try:
        while (found := _NOT_NUL.search(data, at)) is not None:  # another member; a tape's NUL padding is none
            if found.start() and format_of(data[found.start() : found.start() + 16]) != compression:
                return b"".join(out), len(data) - found.start()
            stream = _pieces(_engine(compression), data, found.start())
            while True:
                try:
                    piece = next(stream)
                except StopIteration as end:
                    at = end.value
                    break
                total += len(piece)
                if total > limit:
                    size = f"{limit / 2**20:,.0f} MiB" if limit >= 2**20 else f"{limit:,} bytes"
                    raise UnpackedOverLimit(display, f"{compression}-compressed data that decompresses to over {size}",
                                            over_hint, compression=compression, limit=limit)
                out.append(piece)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as e:
        raise RejectedInput(display, f"damaged {compression}-compressed data ({str(e) or type(e).__name__})",
                            "it may be cut short: copy or download it again") from None
    return b"".join(out), 0


_CUT = "compressed data ended before its end-of-stream marker"
_NOT_NUL = re.compile(rb"[^\x00]")
# The compressed input is handed over this much at a time: zlib hands back what it did not
# use as a copy (`unconsumed_tail`), and bz2 and lzma one of what follows a member
# (`unused_data`); given the whole file, a 54 MB bomb took 60 s to reach its limit.
_INPUT = 1 << 16


def _engine(compression: str):  # type: ignore[no-untyped-def]
    if compression == "gzip":
        return zlib.decompressobj(wbits=31)
    if compression == "lzma":
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)
    return bz2.BZ2Decompressor() if compression == "bzip2" else lzma.LZMADecompressor()


def _pieces(engine, data: bytes, at: int):  # type: ignore[no-untyped-def]
    """One stream's (or member's) bytes from `data[at:]`, _PIECE at a time; EOFError where
    `data` ends first. Returns where in `data` what follows it starts."""
    view = memoryview(data)
    is_zlib = isinstance(engine, type(zlib.decompressobj()))
    pending = b""  # zlib's input not yet used
    while not engine.eof:
        if is_zlib:
            if not pending and at < len(data):
                pending, at = bytes(view[at : at + _INPUT]), at + _INPUT
            piece = engine.decompress(pending, _PIECE)
            pending = engine.unconsumed_tail
            if not piece and not pending and at >= len(data) and not engine.eof:  # (a member of nothing ends so)
                raise EOFError(_CUT)
        else:  # bz2 and lzma keep what they did not use, and ask for more
            if engine.needs_input:
                if at >= len(data):
                    raise EOFError(_CUT)
                chunk, at = bytes(view[at : at + _INPUT]), at + _INPUT
            else:
                chunk = b""
            piece = engine.decompress(chunk, _PIECE)
        if piece:
            yield piece
    # (what it was given past its end; zlib's `unconsumed_tail` may hold the same bytes again)
    return min(at, len(data)) - len(engine.unused_data)
