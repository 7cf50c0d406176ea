"""Bytes to normalised text: one decoding policy and one line-ending policy for every loader."""

from __future__ import annotations

import codecs
import hashlib

from ktcli.ingest.sniff import MAX_CONTROL_RATIO, control_ratio, high_byte_ratio, utf16_without_bom

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


class UndecodableError(ValueError):
    """The bytes are not text in any encoding we accept."""


def bom_encoding(data: bytes) -> str | None:
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    return None


def decode_bytes(data: bytes) -> str:
    """UTF-8 (BOM or not), UTF-16/32 by BOM, UTF-16 of Latin-script text without one,
    else cp1252 (latin-1 for its 5 holes) when the bytes look like Western text. Raises
    UndecodableError otherwise."""
    bom = bom_encoding(data)
    if bom is not None:
        try:
            return data[len(_bom_bytes(bom)) :].decode(bom)
        except UnicodeDecodeError as e:
            raise UndecodableError(f"invalid {bom.upper()} despite its byte-order mark") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    utf16 = utf16_without_bom(data)
    if utf16 is not None:
        try:
            return data.decode(utf16)
        except UnicodeDecodeError as e:
            raise UndecodableError(f"looks like {utf16.upper()} without a byte-order mark, but is not valid") from e
    if high_byte_ratio(data) > _MAX_LEGACY_HIGH_RATIO or control_ratio(data) > MAX_CONTROL_RATIO:
        raise UndecodableError("not UTF-8 or UTF-16, and too many non-ASCII bytes for Latin-1")
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # cannot fail: every byte maps


def _bom_bytes(encoding: str) -> bytes:
    return next(bom for bom, name in _BOMS if name == encoding)


def normalize_text(text: str) -> str:
    """\\r\\n and lone \\r become \\n, NULs go, and a stray leading BOM character goes
    (a UTF-8 BOM inside text decoded some other way, or text handed to us as str)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x00" in text:
        text = text.replace("\x00", "")
    return text


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
