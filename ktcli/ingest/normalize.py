"""Bytes to normalised text: one decoding policy and one line-ending policy for every loader."""

from __future__ import annotations

import codecs
import hashlib
import re

from ktcli.ingest.sniff import (
    MAX_CONTROL_RATIO,
    SNIFF_BYTES,
    control_ratio,
    high_byte_ratio,
    looks_binary,
    utf16_without_bom,
)

# Longest BOMs first: the UTF-32 LE BOM starts with the UTF-16 LE one.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# Real Latin-1/cp1252 prose is mostly ASCII; beyond this share of high bytes the file is
# far more likely another legacy encoding (Shift-JIS, GBK, KOI8...) that a Latin
# decoding would silently turn into mojibake.
_MAX_LEGACY_HIGH_RATIO = 0.30


# Bytes text does not hold (tab, line and page breaks aside, and ESC: logs colour with it).
_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")


class UndecodableError(ValueError):
    """The bytes are not text in any encoding we accept."""


def bom_encoding(data: bytes) -> str | None:
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    return None


def decode_bytes(data: bytes) -> tuple[str, str | None]:
    """(text, note): UTF-8 (BOM or not), UTF-16/32 by BOM, UTF-16 of Latin-script text
    without one, UTF-8 with a few stray bytes (each read as U+FFFD), UTF-8 text followed by
    binary data (the text kept), else cp1252 (latin-1 for its 5 holes) when the bytes look
    like Western text. `note` says what the reader should know, for the caller to report
    (None: read exactly). Raises UndecodableError otherwise."""
    bom = bom_encoding(data)
    if bom is not None:
        try:
            return data[len(_bom_bytes(bom)) :].decode(bom), None
        except UnicodeDecodeError as e:
            raise UndecodableError(f"invalid {bom.upper()} despite its byte-order mark") from e
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        first_bad = e.start
    utf16 = utf16_without_bom(data)
    if utf16 is not None:
        try:
            return data.decode(utf16), None
        except UnicodeDecodeError as e:
            raise UndecodableError(f"looks like {utf16.upper()} without a byte-order mark, but is not valid") from e
    strays = utf8_with_strays(data)
    if strays is not None:
        text, n = strays
        what = "a byte that is" if n == 1 else f"{n} bytes that are"
        return text, f"{what} not valid UTF-8, read as \ufffd (the rest is UTF-8)"
    if first_bad and looks_binary(data[first_bad : first_bad + SNIFF_BYTES]):
        # A log with a crash dump after it: the whole file went to cp1252 mojibake (the
        # binary sniff reads only the first 8 KB), unreported. The dump may start with
        # bytes that are valid UTF-8 (control bytes): the text ends at the line before them.
        end, start = first_bad, data.rfind(b"\n", 0, first_bad) + 1
        while end and _CONTROL.search(data, start, end):  # a line of the dump's, not of text
            end, start = start, data.rfind(b"\n", 0, max(start - 1, 0)) + 1
        if end:
            return data[:end].decode("utf-8"), f"binary data after byte {end:,} left out ({len(data) - end:,} bytes)"
    if high_byte_ratio(data) > _MAX_LEGACY_HIGH_RATIO or control_ratio(data) > MAX_CONTROL_RATIO:
        raise UndecodableError("not UTF-8 or UTF-16, and too many non-ASCII bytes for Latin-1")
    # Said, because it is a guess: Russian comments in cp1251 come out as "Ïîäêëþ÷åíèå".
    note = "not UTF-8: read as Windows-1252 (Western European), a guess; convert it to UTF-8 if that is wrong"
    try:
        return data.decode("cp1252"), note
    except UnicodeDecodeError:
        return data.decode("latin-1"), note  # cannot fail: every byte maps


# UTF-8 with stray bytes: at most this many, and at least as many valid multi-byte
# characters as stray bytes. Why: one bad byte (a truncated copy, a Latin-1 "é" pasted
# into a UTF-8 file) sent a whole German text to cp1252, every "ü" read as "Ã¼" without a
# word; Latin-1 text, conversely, has almost no valid UTF-8 sequences (an "é" alone is an
# invalid byte), so it still goes to cp1252. (Three valid per stray, until 2026-12-04,
# still sent "Zürich and München" with one bad byte to cp1252.)
MAX_STRAY_BYTES = 64
MIN_VALID_PER_STRAY = 1


def utf8_with_strays(data: bytes) -> tuple[str, int] | None:
    """(text, stray bytes) where `data` is UTF-8 but for a few bytes, each read as U+FFFD;
    None where it does not look like UTF-8."""
    pieces: list[str] = []
    strays = 0
    at = 0
    while True:
        try:
            pieces.append(data[at:].decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            strays += 1
            if strays > MAX_STRAY_BYTES:
                return None
            pieces.append(data[at : at + e.start].decode("utf-8") + "\ufffd")
            at += e.end
    text = "".join(pieces)
    valid = sum(1 for ch in text if ord(ch) > 127) - text.count("\ufffd")
    return (text, strays) if valid >= MIN_VALID_PER_STRAY * strays else None


def _bom_bytes(encoding: str) -> bytes:
    return next(bom for bom, name in _BOMS if name == encoding)


def normalize_text(text: str) -> str:
    """\\r\\n becomes \\n, NULs go, and a stray leading BOM character goes (a UTF-8 BOM
    inside text decoded some other way, or text handed to us as str). A lone \\r is a line
    break only in a file with no \\n at all (old Mac text); elsewhere it is a progress bar
    redrawing its line ("10%\\r50%\\r100%" in pip, tqdm and cargo logs) and becomes a space:
    grep, sed and editors count lines by \\n, and turning each \\r into a line break moved
    every later citation of a build log down, 58 lines by the end of a 329-line file."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        text = text.replace("\r", " " if "\n" in text else "\n")
    if "\x00" in text:
        text = text.replace("\x00", "")
    return text


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
