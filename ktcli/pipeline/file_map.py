"""What each file of a summarized folder says it is, in its own words: a module's docstring,
a README's title and first sentence, a package's `description`, a document's first line.

Why: the bundled 135M model sums a repository up in a sentence or two, and often in no
words of it: click's 17 modules came back as "The code is well-structured and
well-documented", the sample repo as one line of its design notes twice. A summary of
several files now ends with this map, quoted from the files, not written by the model,
each line with the place it quotes (path:line), so that it cites itself.
"""

from __future__ import annotations

import ast
import re

from ktcli.ingest.sections import ATX, RST_UNDERLINE
from ktcli.pipeline.badges import badges_line
from ktcli.pipeline.prompts import shared_folder
from ktcli.types import Document, FileMap

MAX_FILES = 40  # listed at most; the rest are counted
MAX_CHARS = 110  # a line of the map, cut at a word
# (not after an initial or "e.g.": pygments' paraiso_dark.py was "Paraíso (Dark) by Jan T.")
_SENTENCE_END = re.compile(r"(?<=[.!?])(?<![\s(][A-Z]\.)(?<!^[A-Z]\.)(?<!e\.g\.)(?<!i\.e\.)\s+(?=[A-Z0-9\"'(`])"
                           r"|(?<=[。！？])")
_COMMENT_MARK = re.compile(r"^\s*(?:#!.*|#+|//+|/\*+|\*+/?|--+|;+|%+|<!--|-->)\s?")
_NOT_A_DESCRIPTION = re.compile(
    r"(?i)^(?:copyright|\(c\)|©|spdx-license|licensed under|use of this source code is governed|"
    r"all rights reserved|-\*-|(?:en)?coding[:=]|vim?:|"
    r"eslint|prettier|pylint|mypy:|pyright:|flake8[:=]|ruff:|isort:|fmt:|noqa|type: ?ignore|@ts-|@flow|@jsx|#include)"
    # a licence header in a sentence of its own: packaging's six modules were each "This file
    # is dual licensed under the terms of the Apache License, Version 2.0, and the BSD License."
    r"|(?i:^(?:this|the) (?:file|code|module|program|library|software|project|package)\b.{0,40}"
    r"\b(?:licen[cs]ed|distributed|released|available|covered) under\b)")
# A licence line whose sentence goes on below: its continuation lines are the licence too
# ("2.0, and the BSD License. See the LICENSE file ..." was quoted as packaging's description).
_CONTINUED = re.compile(r"^[a-z0-9(]")
# A C preprocessor line is code, not a "#" comment: "#include <Python.h>" read as "include <Python.h>"
_PREPROCESSOR = re.compile(r"^\s*#\s*(?:include|define|undef|if|ifdef|ifndef|elif|else|endif|pragma|error|import)\b")
_DESCRIPTION_FIELD = re.compile(r'^\s*"?description"?\s*[=:]\s*"((?:[^"\\]|\\.){3,})"')
_PROSE_KINDS = ("markdown", "text", "stdin")
# Files whose first words say nothing of a project: licences, logs, tables of data.
_NOT_DESCRIBED = re.compile(
    r"(?i)(?:licen[cs]e|copying|^notice|^authors|^contributors|^copyright$|\.(?:log|csv|tsv|lock)$)")
_TIMESTAMP = re.compile(r"\s*\[?\d{2,4}[-/.:]\d{2}")
_MAX_NAMES = 6
_DOCUMENT_KINDS = ("pdf", "docx", "odt", "epub", "html", "rtf")


def file_map(documents: tuple[Document, ...] | list[Document]) -> FileMap | None:
    """What up to `MAX_FILES` documents say they are, in input order; None for a single
    document or where none says anything."""
    if len(documents) < 2:
        return None
    top = shared_folder([doc.path for doc in documents])
    found = [(doc.path, *said) for doc in documents
             if not _in_dot_folder(doc.path[len(top):].lstrip("/\\")) and (said := describe(doc)) is not None]
    if not found:
        return None
    # Past MAX_FILES, the ones nearest the top and outside tests, benchmarks and examples,
    # listed in input order: ktcli's own first 40 in tree order were its benchmarks.
    folder = shared_folder([path for path, _, _ in found])
    ranked = sorted(range(len(found)), key=lambda i: _rank(found[i][0][len(folder):]))[:MAX_FILES]
    listed = tuple(found[i] for i in sorted(ranked))
    return FileMap(listed, folder, len(found) - len(listed))


_ASIDE = re.compile(r"(?i)(?:^|/)(?:tests?|testing|benchmarks?|examples?|samples?|fixtures|docs?|scripts|tools|vendor)/")


def _rank(path: str) -> tuple[bool, bool, int]:
    """Outside tests and examples first, then public before private (`_loop.py`, `_impl/`:
    rich's 40 listed were its `_fileno.py` and `_pick.py` while `table.py`, `text.py` and
    `progress.py` were counted among the 53 more), then nearest the top."""
    path = path.lstrip("/")
    private = any(part.startswith("_") and not (part.startswith("__") and part.endswith(("__", "__.py")))
                  for part in path.split("/"))
    return bool(_ASIDE.search(path)), private, path.count("/")


def describe(doc: Document) -> tuple[int, str] | None:
    """(line, text): the line (1-based, as citations count) where `doc` says what it is,
    and that much of it; for Python that says nothing, the classes and functions it
    defines; None for the rest (a log, data, a licence, a dotfile)."""
    name = doc.path.replace("\\", "/").rsplit("/", 1)[-1]
    if name.startswith(".") or _NOT_DESCRIBED.search(name):
        return None
    lines = doc.text.split("\n")
    if doc.kind == "code":
        said = _python_docstring(doc.text) if doc.language == "python" else None
        said = said or _description_field(lines) or _leading_comment(lines)
        said = said or (_python_definitions(doc.text) if doc.language == "python" else None)
    elif doc.kind == "markdown" and (badges := badges_line(doc.text)):
        said = 0, badges  # (no prose to quote: libcbor's README, probe 139)
    elif doc.kind in _PROSE_KINDS and lines and _TIMESTAMP.match(lines[0]):
        said = None  # a log
    elif doc.kind == "markdown" or (doc.kind in _PROSE_KINDS and _rst_title(lines)):
        said = _titled(lines)
    elif doc.kind in _PROSE_KINDS:
        said = _first_paragraph(lines, 0)
    elif doc.kind in _DOCUMENT_KINDS:
        said = _first_line(lines)
    else:
        said = None
    if said is None:
        return None
    index, text = said
    text = _short(" ".join(text.split()))
    if len(text) < 3:
        return None
    line = doc.source_lines[index] if index < len(doc.source_lines) else index + 1
    return line, text


def _in_dot_folder(rel: str) -> bool:
    """`rel` (below the folder summarized) lies in a folder whose name starts with a dot
    (`.github/`, `.agents/`): tooling, not the project (typer's map began with its
    `.agents/skills/typer/SKILL.md`). The folder given may itself be under one (`.venv/`)."""
    return any(part.startswith(".") and part not in (".", "..") for part in rel.replace("\\", "/").split("/")[:-1])


def _python_docstring(text: str) -> tuple[int, str] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    docstring = ast.get_docstring(tree, clean=True)
    if not docstring or not tree.body:
        return None
    # A reST directive (".. testsetup::") and its indented body say nothing of the module:
    # packaging's `specifiers.py` and `version.py` were described as ".. testsetup::".
    paragraphs = [p for p in docstring.split("\n\n")
                  if p.strip() and not p.lstrip().startswith("..") and not p.startswith((" ", "\t"))]
    if not paragraphs:
        return None
    first = paragraphs[0].split("\n")
    if len(paragraphs) > 1 and len(first) == 2 and RST_UNDERLINE.match(first[1]):
        paragraphs = paragraphs[1:]  # a title, underlined ("flask.app" / "~~~~~~~~~"), names the module only
    # cited at its text's line: a docstring whose quotes stand on a line of their own starts below them
    raw = tree.body[0].value.value  # type: ignore[attr-defined]
    opening = raw[: len(raw) - len(raw.lstrip())].count("\n")
    line = tree.body[0].lineno - 1 + opening + docstring[: docstring.find(paragraphs[0])].count("\n")
    # where the source writes it: a docstring opened `"""\` continues its first line below
    # the quotes, and the count above is one short (`fm/b.py:1` for its line 2)
    words = paragraphs[0].split("\n")[0].strip()[:40]
    source = text.split("\n")
    end = getattr(tree.body[0], "end_lineno", None) or len(source)
    line = next((i for i in range(line, min(end, len(source))) if words and words in source[i]), line)
    return line, _first_sentence(paragraphs[0])


def _python_definitions(text: str) -> tuple[int, str] | None:
    """"defines A, B, ..." for a module that says nothing of itself: its public classes and
    functions, classes first (click's `core.py`: Context, Command, Group, ...)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    defined = [node for node in tree.body if isinstance(node, kinds) and not node.name.startswith("_")]
    if not defined:
        return None
    defined.sort(key=lambda node: not isinstance(node, ast.ClassDef))  # (stable: in file order)
    names = list(dict.fromkeys(node.name for node in defined))  # a typing.overload's name once
    more = f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else ""
    return defined[0].lineno - 1, f"defines {', '.join(names[:_MAX_NAMES])}{more}"


def _description_field(lines: list[str]) -> tuple[int, str] | None:
    """A package manifest's own description (pyproject.toml, package.json, Cargo.toml)."""
    for i, line in enumerate(lines[:200]):
        if m := _DESCRIPTION_FIELD.match(line):
            return i, m.group(1).replace('\\"', '"')
        if m := _DESCRIPTION_BLOCK.match(line):  # TOML's multi-line string: its first sentence
            text, at = m.group(1), i
            for j in range(i + 1, min(len(lines), i + 40)):
                if '"""' in text:
                    break
                text += " " + lines[j].strip()
            text = text.split('"""', 1)[0].strip().rstrip("\\").strip()
            if not text:
                return None
            if not m.group(1).strip():  # the text starts on a line of its own below
                at = next((j for j in range(i + 1, min(len(lines), i + 40)) if lines[j].strip()), i)
            return at, _first_sentence(text)
    return None


_DESCRIPTION_BLOCK = re.compile(r'^\s*description\s*=\s*"""\\?\s*(.*)$')


# A JSDoc (or Doxygen) tag: its description after it; a file's or module's name alone, or
# any other tag (@author, @license), says nothing ("@file renderer.js" was quoted).
_DOC_TAG = re.compile(r"[@\\](file(?:overview)?|overview|module|brief|desc(?:ription)?|summary)\b\s*|[@\\]\w+")


def _untagged(text: str) -> str:
    m = _DOC_TAG.match(text)
    if m is None:
        return text
    rest = text[m.end():].strip()
    if m.group(1) is None or (m.group(1) in ("file", "module") and " " not in rest):
        return ""
    return rest


def _leading_comment(lines: list[str]) -> tuple[int, str] | None:
    """The first sentence of the comment a file opens with, licence and tool lines left aside."""
    start, words, licence = None, [], False
    for i, line in enumerate(lines[:60]):
        if not line.strip():
            if words:
                break
            licence = False
            continue
        if not _COMMENT_MARK.match(line) or _PREPROCESSOR.match(line):
            break
        text = _untagged(_COMMENT_MARK.sub("", line, count=1).strip().rstrip("*/").strip())
        if licence and text and _CONTINUED.match(text):
            continue  # the licence's sentence goes on
        licence = bool(text) and _NOT_A_DESCRIPTION.match(text) is not None
        if not text or licence or not re.search(r"[^\W\d_]{2}", text):
            if words:
                break
            continue
        if start is None:
            start = i
        words.append(text)
        if _SENTENCE_END.search(" ".join(words) + " X") or text.endswith((".", "!", "?")):
            break
    return (start, _first_sentence(" ".join(words))) if start is not None else None


def _titled(lines: list[str]) -> tuple[int, str] | None:
    """A Markdown or reStructuredText title, with the first sentence under it; after the
    front matter of a static site's page (a `---` block: its title: and layout: fields)."""
    start = _after_front_matter(lines)
    for i, line in enumerate(lines[start : start + 80], start=start):
        if (m := ATX.match(line)) and m.group(2):
            title, below = m.group(2).strip(), i + 1
        elif i + 1 < len(lines) and line.strip() and RST_UNDERLINE.match(lines[i + 1]) \
                and len(lines[i + 1].strip()) >= len(line.strip()):
            title, below = line.strip(), i + 2
        else:
            continue
        after = _first_paragraph(lines, below, stop_at_heading=True)
        return i, f"{title}: {after[1]}" if after else title
    return _first_paragraph(lines, start)


def _after_front_matter(lines: list[str]) -> int:
    """The line after a leading `---` ... `---` (YAML) or `+++` ... `+++` (TOML) block, else 0."""
    if not lines or lines[0].strip() not in ("---", "+++"):
        return 0
    fence = lines[0].strip()
    end = next((i for i in range(1, min(len(lines), 200)) if lines[i].strip() in (fence, "...")), None)
    return end + 1 if end is not None else 0


def _rst_title(lines: list[str]) -> bool:
    return any(RST_UNDERLINE.match(line) and lines[i - 1].strip() for i, line in enumerate(lines[1:40], start=1))


def _first_paragraph(lines: list[str], start: int, stop_at_heading: bool = False) -> tuple[int, str] | None:
    """The first sentence of the first paragraph of prose from `start`: not a badge, a
    list, a table, a code block or markup."""
    at, words, fenced = None, [], False
    for i in range(start, min(len(lines), start + 80)):
        line = lines[i].strip()
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        if stop_at_heading and (ATX.match(line) or RST_UNDERLINE.match(line)) and words == []:
            return None
        if not line:
            if words:
                break
            continue
        if line.startswith(("![", "[![", "<", "|", "..", ":", ">", "-", "*", "+", "=")) or not re.search(r"[^\W\d_]{2}", line):
            if words:
                break
            continue
        at = i if at is None else at
        words.append(line)
        if _SENTENCE_END.search(" ".join(words)) or len(" ".join(words)) > MAX_CHARS:
            break
    return (at, _first_sentence(" ".join(words))) if at is not None else None


def _first_line(lines: list[str]) -> tuple[int, str] | None:
    """A document's title as it reads first: its first line with words."""
    for i, line in enumerate(lines[:40]):
        if re.search(r"[^\W\d_]{2}", line):
            return i, line.strip()
    return None


def _first_sentence(text: str) -> str:
    return _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0]


def _short(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    cut = text.rfind(" ", 0, MAX_CHARS - 3)
    return text[: cut if cut > MAX_CHARS // 2 else MAX_CHARS - 3].rstrip(" ,;:") + "..."
