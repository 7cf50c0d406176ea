"""What a file is, from its name and its first bytes: binary or text, code or prose."""

from __future__ import annotations

import codecs
import re
from pathlib import PurePath

SNIFF_BYTES = 8192

# Extensions skipped in folder walks without reading a byte: they are never text.
BINARY_EXTENSIONS = frozenset(
    """
    png jpg jpeg gif bmp ico icns webp tif tiff psd heic avif
    zip gz tgz bz2 xz lzma tlz zst lz4 7z rar tar jar war ear whl egg apk deb rpm msi dmg iso
    exe dll so dylib a o obj lib bin elf class pyc pyo pyd wasm
    woff woff2 ttf otf eot
    mp3 mp4 m4a m4v wav flac ogg oga opus avi mov mkv webm
    sqlite sqlite3 db mdb parquet feather arrow npy npz pt pth ckpt safetensors gguf onnx
    h5 hdf5 pkl pickle joblib
    """.split()
)

_TEXT_CONTROLS = frozenset(b"\t\n\r\f\b\x1b\x0b")
_CONTROL_BYTES = bytes(b for b in range(32) if b not in _TEXT_CONTROLS) + b"\x7f"
_HIGH_BYTES = bytes(range(128, 256))
_UTF16_32_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # UTF-32 BOMs start with these

# Text editors write few control bytes; binaries are full of them (random or compressed
# data has about 10% bytes below 0x20 that are not whitespace).
MAX_CONTROL_RATIO = 0.05
_MAX_HIGH_RATIO = 0.30
_MAX_NUL_RATIO = 0.10


def control_ratio(data: bytes) -> float:
    """Share of bytes that are control characters never found in text (NUL included)."""
    if not data:
        return 0.0
    return (len(data) - len(data.translate(None, _CONTROL_BYTES))) / len(data)


def high_byte_ratio(data: bytes) -> float:
    if not data:
        return 0.0
    return (len(data) - len(data.translate(None, _HIGH_BYTES))) / len(data)


def has_binary_extension(name: str) -> bool:
    return PurePath(name).suffix.lower().lstrip(".") in BINARY_EXTENSIONS


def looks_binary(head: bytes) -> bool:
    """True for data that is not text, judged on the first SNIFF_BYTES: many control
    bytes, or NUL bytes in something that is not otherwise clean text. A stray NUL in
    a text file does not make it binary (normalisation drops it); UTF-16/32 text full
    of NULs is recognised by its byte-order mark."""
    head = head[:SNIFF_BYTES]
    if head.startswith(_UTF16_32_BOMS) or utf16_without_bom(head) is not None:
        return False
    rest = head.replace(b"\x00", b"")
    if control_ratio(rest) > MAX_CONTROL_RATIO:
        return True
    n_nul = len(head) - len(rest)
    if n_nul == 0:
        return False
    if n_nul > _MAX_NUL_RATIO * len(head):
        return True
    return not _utf8_prefix_ok(rest) and high_byte_ratio(rest) > _MAX_HIGH_RATIO


def could_be_utf16(data: bytes) -> str | None:
    """'UTF-16LE' / 'UTF-16BE' where `data` (binary by `looks_binary`) decodes cleanly as
    UTF-16 with line breaks and no control characters: non-Latin text saved without a
    byte-order mark, which cannot be told from binary with certainty (random bytes decode
    to CJK too), so it is only named in the hint of the "binary" report."""
    head = data[: SNIFF_BYTES - SNIFF_BYTES % 2]
    for codec, name in (("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE")):
        try:
            text = head.decode(codec)
        except UnicodeDecodeError:
            continue
        controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r")
        if not controls and text.count("\n") >= max(1, len(text) // 400):
            return name
    return None


def utf16_without_bom(data: bytes) -> str | None:
    """'utf-16-le' / 'utf-16-be' for UTF-16 text written without a byte-order mark, judged
    on its first SNIFF_BYTES: Latin-script text then has a NUL in nearly every high (LE)
    or low (BE) byte of a pair and almost none in the other, and decodes to clean text.
    None otherwise (including UTF-16 of mostly non-Latin scripts, which has few NULs: it
    is not told apart from binary here)."""
    head = data[:SNIFF_BYTES]
    head = head[: len(head) // 2 * 2]
    if len(head) < 8:
        return None
    even, odd = head[0::2], head[1::2]
    for encoding, zeros, text in (("utf-16-le", odd, even), ("utf-16-be", even, odd)):
        if zeros.count(0) >= 0.9 * len(zeros) and text.count(0) <= 0.02 * len(text):
            decoded = _decoded(head, encoding)
            if decoded is not None and control_ratio(decoded.encode("utf-8")) <= MAX_CONTROL_RATIO:
                return encoding
    return None


def _decoded(head: bytes, encoding: str) -> str | None:
    """The sample decoded, allowing a surrogate pair cut at its end; None if invalid."""
    for cut in (head, head[:-2]):
        try:
            return cut.decode(encoding)
        except UnicodeDecodeError:
            continue
    return None


def _utf8_prefix_ok(data: bytes) -> bool:
    """Valid UTF-8, allowing a character cut off at the end of the sample."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


# ---- kinds and languages -------------------------------------------------------------

_MARKDOWN = {".md", ".markdown", ".mdown", ".mkd"}
_HTML = {".html", ".htm", ".xhtml"}
# Zips of XML that ktcli reads (`ingest.zipdoc`): Word with its macro and template kinds,
# OpenDocument text and its template, EPUB.
_ZIPPED = {".docx": "docx", ".docm": "docx", ".dotx": "docx", ".dotm": "docx", ".odt": "odt", ".ott": "odt",
           ".epub": "epub"}

LANGUAGE_BY_EXTENSION: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".rs": "rust", ".go": "go", ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
    ".cu": "cuda", ".cuh": "cuda", ".java": "java", ".kt": "kotlin", ".kts": "kotlin",
    ".scala": "scala", ".swift": "swift", ".m": "objective-c", ".mm": "objective-c",
    ".cs": "csharp", ".fs": "fsharp", ".vb": "vbnet", ".rb": "ruby", ".php": "php",
    ".pl": "perl", ".pm": "perl", ".lua": "lua", ".r": "r", ".jl": "julia", ".dart": "dart",
    ".ex": "elixir", ".exs": "elixir", ".erl": "erlang", ".hs": "haskell", ".ml": "ocaml",
    ".clj": "clojure", ".zig": "zig", ".nim": "nim", ".v": "verilog", ".sv": "verilog",
    ".vhd": "vhdl", ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".fish": "fish",
    ".ps1": "powershell", ".bat": "batch", ".cmd": "batch", ".sql": "sql",
    ".css": "css", ".scss": "scss", ".less": "less", ".vue": "vue", ".svelte": "svelte",
    ".json": "json", ".jsonc": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
    ".ini": "ini", ".cfg": "ini", ".xml": "xml", ".svg": "xml", ".proto": "protobuf",
    ".graphql": "graphql", ".tf": "terraform", ".cmake": "cmake", ".mk": "make",
    ".gradle": "groovy", ".groovy": "groovy", ".tex": "latex", ".diff": "diff",
    ".patch": "diff", ".ipynb": "json", ".triton": "python",
}

LANGUAGE_BY_FILENAME: dict[str, str] = {
    "makefile": "make", "gnumakefile": "make", "dockerfile": "dockerfile",
    "containerfile": "dockerfile", "cmakelists.txt": "cmake", "rakefile": "ruby",
    "gemfile": "ruby", "vagrantfile": "ruby", "justfile": "just", "build": "starlark",
    "build.bazel": "starlark", "workspace": "starlark", "jenkinsfile": "groovy",
    ".bashrc": "shell", ".zshrc": "shell", ".profile": "shell",
}

_SHEBANG_INTERPRETERS: tuple[tuple[str, str], ...] = (
    ("python", "python"), ("pypy", "python"), ("bash", "shell"), ("zsh", "shell"),
    ("dash", "shell"), ("ksh", "shell"), ("sh", "shell"), ("fish", "fish"),
    ("node", "javascript"), ("deno", "typescript"), ("ts-node", "typescript"),
    ("bun", "javascript"), ("ruby", "ruby"), ("perl", "perl"), ("php", "php"),
    ("lua", "lua"), ("rscript", "r"), ("julia", "julia"), ("awk", "awk"), ("gawk", "awk"),
    ("tclsh", "tcl"), ("pwsh", "powershell"), ("osascript", "applescript"),
)

# Line patterns typical of one language and rare in prose. A file needs hits from at
# least _MIN_SYNTAX_HITS distinct lines before we call it code, so a README that quotes
# one `import x` stays prose.
_SYNTAX: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (lang, re.compile(pattern))
    for lang, pattern in (
        ("diff", r"^(diff --git |@@ -\d+(,\d+)? \+\d+(,\d+)? @@|--- a/|\+\+\+ b/)"),
        ("python", r"^(from [\w.]+ import |import [\w.]+(, [\w.]+)*$|def \w+\(.*\).*:$|class \w+(\(.*\))?:$|if __name__ == ['\"]__main__['\"]:)"),
        ("python", r"^\s+(def \w+\(self|return\b|elif .*:$|self\.\w+ = )"),
        ("c", r"^#(include [<\"]|define \w+|ifn?def \w+|endif)"),
        ("rust", r"^\s*(pub )?(fn \w+|struct \w+|enum \w+|impl\b|use \w+::|mod \w+;|let mut )"),
        ("go", r"^(package \w+$|func (\(\w+ \*?\w+\) )?\w+\(|import \($)"),
        ("javascript", r"^\s*(const|let|var) \w+ = (require\(|\(|function|async|\{|\[)|^(export (default |const |function |class )|module\.exports\b|function \w+\()"),
        ("java", r"^(package [\w.]+;$|import [\w.]+(\.\*)?;$|public (final )?(class|interface|enum) \w+)"),
        ("shell", r"^(set -[euxo]+|export \w+=|\w+\(\) \{$|fi$|done$|esac$)"),
        ("sql", r"^(SELECT .* FROM |CREATE (TABLE|INDEX|VIEW) |INSERT INTO |ALTER TABLE )"),
    )
)
_MIN_SYNTAX_HITS = 3
_SNIFF_LINES = 200


def doc_kind_for_name(name: str) -> str | None:
    """"markdown", "text", "html", "pdf", "code", "docx", "odt", "epub", or None when the
    name says nothing."""
    path = PurePath(name)
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return "pdf"
    if suffix in _ZIPPED:
        return _ZIPPED[suffix]
    if suffix in _HTML:
        return "html"
    if suffix in _MARKDOWN:
        return "markdown"
    if path.name.lower() in LANGUAGE_BY_FILENAME or suffix in LANGUAGE_BY_EXTENSION:
        return "code"
    if suffix in {".txt", ".text", ".rst", ".adoc", ".asciidoc", ".org"}:
        return "text"
    return None


def language_for_name(name: str) -> str | None:
    path = PurePath(name)
    return LANGUAGE_BY_FILENAME.get(path.name.lower()) or LANGUAGE_BY_EXTENSION.get(path.suffix.lower())


def language_from_shebang(first_line: str) -> str | None:
    """`#!/usr/bin/env python3`, `#!/bin/bash -e`, `#!/usr/bin/env -S deno run` ..."""
    if not first_line.startswith("#!"):
        return None
    words = first_line[2:].strip().split()
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        program = rest[0].rsplit("/", 1)[-1] if rest else ""
    program = program.lower()
    for prefix, language in _SHEBANG_INTERPRETERS:
        # "python3.11", "perl5" and "sh" itself, but not "shellcheck"
        if program == prefix or (program.startswith(prefix) and re.fullmatch(r"[\d.]*", program[len(prefix):])):
            return language
    return None


def language_from_content(text: str) -> str | None:
    """A shebang, or enough lines of one language's typical syntax."""
    first_line = text[: text.find("\n")] if "\n" in text else text
    shebang = language_from_shebang(first_line)
    if shebang:
        return shebang
    hits: dict[str, int] = {}
    for line in text.split("\n", _SNIFF_LINES)[:_SNIFF_LINES]:
        for language, pattern in _SYNTAX:
            if pattern.search(line):
                hits[language] = hits.get(language, 0) + 1
                break
    if not hits:
        return None
    language, count = max(hits.items(), key=lambda kv: (kv[1], kv[0]))
    return language if count >= _MIN_SYNTAX_HITS else None
