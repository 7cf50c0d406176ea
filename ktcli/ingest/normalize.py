"""Bytes to normalised text: one decoding policy and one line-ending policy for every loader."""

from __future__ import annotations

import codecs
import hashlib
import re
import unicodedata

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
    # UTF-16 whose code units all have bytes below 0x80 is valid UTF-8 as well, full of
    # NULs: read so, its NULs and its other bytes under 0x20 were then left out ("中大"
    # became "-N'Y", curly quotes spaces). UTF-8 text holds no NUL in its first bytes.
    utf16 = utf16_without_bom(data) if b"\x00" in data[:SNIFF_BYTES] else None
    if utf16 is None:
        try:
            return data.decode("utf-8"), None
        except UnicodeDecodeError as e:
            first_bad = e.start
        utf16 = utf16_without_bom(data)
    else:
        first_bad = 0
    if utf16 is not None:
        try:
            return data.decode(utf16), None
        except UnicodeDecodeError as e:
            if len(data) % 2:  # a byte past the last pair (`echo >> file`, a download cut short)
                try:
                    return data[:-1].decode(utf16), f"a last byte past its {utf16.upper()} pairs left out"
                except UnicodeDecodeError:
                    pass
            raise UndecodableError(f"looks like {utf16.upper()} without a byte-order mark, but is not valid") from e
    if first_bad and looks_binary(data[first_bad : first_bad + SNIFF_BYTES]):
        # A log with a crash dump after it: the whole file went to cp1252 mojibake (the
        # binary sniff reads only the first 8 KB), unreported. The dump may start with
        # bytes that are valid UTF-8 (control bytes): the text ends at the line before them.
        end, start = first_bad, data.rfind(b"\n", 0, first_bad) + 1
        while end and _CONTROL.search(data, start, end):  # a line of the dump's, not of text
            end, start = start, data.rfind(b"\n", 0, max(start - 1, 0)) + 1
        if end:
            return data[:end].decode("utf-8"), f"binary data after byte {end:,} left out ({len(data) - end:,} bytes)"
    if control_ratio(data) > MAX_CONTROL_RATIO:
        raise UndecodableError("not UTF-8 or UTF-16, and too many control bytes for text")
    # Lines of Windows-1252 among UTF-8 ones, before strays: under 64 bad bytes, "Müller" in a
    # Latin-1 line became "M\ufffdller" and no question found it.
    mixed = _utf8_and_western_lines(data)
    if mixed is not None:
        text, n_western, n_strays = mixed
        lines = "a line" if n_western == 1 else f"{n_western:,} lines"
        strayed = "" if not n_strays else ("; a byte in a line of both read as \ufffd" if n_strays == 1
                                           else f"; {n_strays} bytes in lines of both read as \ufffd")
        return text, f"{lines} not UTF-8: read as Windows-1252 (Western European), a guess; the rest is UTF-8{strayed}"
    strays = utf8_with_strays(data)
    if strays is not None:
        text, n = strays
        what = "a byte that is" if n == 1 else f"{n} bytes that are"
        return text, f"{what} not valid UTF-8, read as \ufffd (the rest is UTF-8)"
    western = _western(data) if high_byte_ratio(data) <= _MAX_LEGACY_HIGH_RATIO else None
    if western is not None and reads_as_western(western):
        return western, _guess_note("Windows-1252 (Western European)")
    detected = _detected(data)
    if detected is not None:
        return detected
    if western is None:
        raise UndecodableError("not UTF-8 or UTF-16, and no other encoding fits its bytes")
    return western, _guess_note("Windows-1252 (Western European)")


# Non-ASCII marks that do stand between letters in Western text: "l’été", "soft\xadhyphen".
_INSIDE_WORDS = frozenset("’‘´·\u00ad–—")
_OPENING_WORDS = frozenset("¿¡«»‘“„‚‹›")
# Share of a cp1252 reading's non-ASCII characters that may look like another script's
# before another encoding is looked for: Western text has ~0 (a name like "Ærøskøbing");
# Russian, Greek or Polish read this way has 30-95%.
_MAX_ODD_SHARE = 0.1


def _detected(data: bytes) -> tuple[str, str] | None:
    """(text, note) in the legacy encoding charset-normalizer finds most coherent (Russian
    in cp1251 or KOI8-R, Japanese in Shift-JIS, Chinese in GBK, Greek, Polish...); None
    where none fits (it gives up on bytes that read as noise in every one)."""
    from charset_normalizer import from_bytes  # ~0.1 s, and only files that are not UTF-8 need it

    for match in from_bytes(data):  # most coherent first
        if match.chaos > _MAX_CHAOS or match.encoding.startswith(("utf_16", "utf_32")):
            continue  # (UTF-16 without a byte-order mark is told apart earlier, by its own rule)
        try:
            text = data.decode(match.encoding)
        except (LookupError, UnicodeDecodeError):
            continue  # it judged from samples of a large file: another part does not decode
        # Short texts fit several code pages: Greek of one line came first as ISO-8859-5
        # Cyrillic, with a "§" inside its words.
        if _odd_share(text, latin=False) <= _MAX_ODD_SHARE:
            return text, _guess_note(f"{_ENCODING_NAMES.get(match.encoding, match.encoding)} (detected)")
    return None


# Readings charset-normalizer may still pick with this much of its "mess" in them are
# noise (its own default threshold is 0.2).
_MAX_CHAOS = 0.2
_ENCODING_NAMES = {
    "cp1250": "Windows-1250", "cp1251": "Windows-1251", "cp1252": "Windows-1252", "cp1253": "Windows-1253",
    "cp1254": "Windows-1254", "cp1255": "Windows-1255", "cp1256": "Windows-1256", "cp1257": "Windows-1257",
    "koi8_r": "KOI8-R", "koi8_u": "KOI8-U", "cp932": "Shift-JIS (cp932)", "shift_jis": "Shift-JIS",
    "euc_jp": "EUC-JP", "euc_jis_2004": "EUC-JP (JIS X 0213)", "euc_jisx0213": "EUC-JP (JIS X 0213)",
    "shift_jis_2004": "Shift-JIS (JIS X 0213)", "shift_jisx0213": "Shift-JIS (JIS X 0213)",
    "iso2022_jp": "ISO-2022-JP", "cp1258": "Windows-1258", "gb18030": "GB18030", "gb2312": "GB2312", "gbk": "GBK", "big5": "Big5",
    "cp949": "EUC-KR (cp949)", "euc_kr": "EUC-KR", "mac_cyrillic": "Mac Cyrillic", "cp874": "Windows-874 (Thai)",
    "tis_620": "TIS-620 (Thai)",
}


def _guess_note(what: str) -> str:
    # Said, because it is a guess: a wrong one turns every non-ASCII letter into mojibake.
    return f"not UTF-8: read as {what}, a guess; convert it to UTF-8 if that is wrong"


def _western(data: bytes) -> str:
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # cannot fail: every byte maps (cp1252 has 5 holes)


def reads_as_western(text: str) -> bool:
    """Whether a cp1252 reading looks like Western European text. Its accented letters
    stand alone or in pairs inside ASCII words ("Größe", "ações"); another 8-bit script
    read this way gives whole words of them ("Ïîäêëþ÷åíèå", Russian in cp1251) or symbols
    inside words ("Za¿ó³æ", Polish in cp1250)."""
    return _odd_share(text, latin=True) <= _MAX_ODD_SHARE


def _odd_share(text: str, latin: bool) -> float:
    """Share of the non-ASCII characters that no script writes where they stand: symbols
    inside or opening words, and (`latin`) a third accented letter in a row."""
    odd = total = run = 0
    for i, ch in enumerate(text):
        if ch < "\x80":
            run = 0
            continue
        total += 1
        if ch.isalpha():
            run += 1
            if latin:
                odd += 3 if run == 3 else run > 3  # a third letter in a row counts all three
        else:
            run = 0
            if not latin and unicodedata.category(ch)[0] in "PZM":
                # "、。「」，" stand between CJK letters in any Japanese or Chinese text, and
                # combining marks inside the words of Thai, pointed Hebrew or vowelled Arabic
                continue
            before = text[i - 1] if i else " "
            after = text[i + 1] if i + 1 < len(text) else " "
            if before.isalpha() and after.isalpha():
                odd += ch not in _INSIDE_WORDS
            elif before.isspace() and after.islower():  # starts a word: Czech "žluť" as "¾lu»"
                odd += ch not in _OPENING_WORDS
    return odd / total if total else 0.0


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


# A file of UTF-8 lines and Windows-1252 ones (notes two editors appended to, a log of two
# tools): read whole as cp1252 its UTF-8 lines became mojibake ("Die GrÃ¶ÃŸe"), read as
# UTF-8 with strays its cp1252 letters became U+FFFD. A line with valid multi-byte UTF-8 is
# what Western text in cp1252 almost never holds; it takes this many to read line by line.
MIN_UTF8_LINES = 2  # one cp1252 line can be valid UTF-8 by chance ("Gruß…" is DF 85: an NKo letter)
_MULTIBYTE_UTF8 = re.compile(rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}")


def _utf8_and_western_lines(data: bytes) -> tuple[str, int, int] | None:
    """(text, lines read as cp1252, bytes read as U+FFFD): each line read as UTF-8 where it
    is valid; else as Western European cp1252 where it holds no UTF-8 character at all,
    and as UTF-8 with its bad bytes replaced where it holds both. None unless some line is
    cp1252 beside UTF-8 ones, and every cp1252 line reads as Western text."""
    lines = data.split(b"\n")
    utf8 = 0
    for line in lines:  # first the cheap count: most files that are no UTF-8 hold no such line
        if not line.isascii() and is_utf8(line):
            utf8 += 1
            if utf8 == MIN_UTF8_LINES:
                break
    else:
        return None
    out: list[str] = []
    western = strays = 0
    for line in lines:
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            if _MULTIBYTE_UTF8.search(line):  # both in one line: its UTF-8 kept, the rest replaced
                text = line.decode("utf-8", errors="replace")
                strays += text.count("\ufffd")
                out.append(text)
                continue
            text = _western(line)
            if not reads_as_western(text):
                return None
            out.append(text)
            western += 1
    return ("\n".join(out), western, strays) if western else None


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _bom_bytes(encoding: str) -> bytes:
    return next(bom for bom, name in _BOMS if name == encoding)


def normalize_text(text: str) -> str:
    """\\r\\n becomes \\n, NULs go, and a stray leading BOM character goes (a UTF-8 BOM
    inside text decoded some other way, or text handed to us as str). A lone \\r is a line
    break only in a file with no \\n at all (old Mac text); elsewhere it is a progress bar
    redrawing its line ("10%\\r50%\\r100%" in pip, tqdm and cargo logs) and becomes a space:
    grep, sed and editors count lines by \\n, and turning each \\r into a line break moved
    every later citation of a build log down, 58 lines by the end of a 329-line file.
    Terminal colour codes go too (`_TERMINAL_CODES`), and overstrikes (`_OVERSTRIKE`)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        text = text.replace("\r", " " if "\n" in text else "\n")
    if "\x00" in text:
        text = text.replace("\x00", "")
    if "\x1b" in text:
        text = _TERMINAL_CODES.sub("", text)
    if "\x08" in text:
        struck = _OVERSTRIKE.sub("", _UNDERSCORED.sub(r"\1", text))
        # a run of backspaces ("50%\b\b\b75%", a progress count in a log) backs over more
        # than one character: read as "5075%" and 2 control characters; written column by
        # column, as a terminal shows it
        text = _STRUCK_LINE.sub(_overwritten, text) if _OVERSTRIKE.search(struck) else struck
    return text


# A character struck over by the next, as nroff prints bold ("b\bbo\bol\bld") and
# underline ("_\bw"): the character written last is the text. Read with only the backspaces
# dropped, a man page's bold words came out doubled ("bboolldd").
_OVERSTRIKE = re.compile(r"[^\n\x08]\x08")
# Underline struck after its character ("b\b_o\b_x\b_", man-db's manual.txt.gz): the
# underscore is the line under it, not the text, which read "_____" for "|box|"
_UNDERSCORED = re.compile(r"([^\n\x08_ ])\x08_")
_STRUCK_LINE = re.compile(r"[^\n]*\x08[^\n]*")


def _overwritten(line: re.Match[str]) -> str:
    """The line as printed: each backspace moves back a column, and a character written
    there replaces the one before; one with nothing to back over stays (a control character)."""
    cells: list[str] = []
    stray: list[str] = []
    column = 0
    for char in line.group():
        if char == "\x08":
            if column:
                column -= 1
            else:
                stray.append(char)
        elif column < len(cells):
            if char != "_" or cells[column] in " _":  # (an underline keeps what it is under)
                cells[column] = char
            column += 1
        else:
            cells.append(char)
            column += 1
    return "".join(stray) + "".join(cells)


# Colours and cursor moves of captured terminal output (a CI or test log): "\x1b[32mOK" was
# indexed as the word "32mok", and a question about "OK" lines matched none.
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
