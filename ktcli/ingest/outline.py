"""A code file's outline: the lines that say what it holds, for summaries of inputs too
long to read line by line in the time there is.

A repository's summary is about its purpose, its parts and how they fit: a module's
docstring, its classes and functions with their signatures and the first paragraph of
their docstrings, its constants, the comments that head a file and its declarations. The
bodies are most of the tokens (86% of ktcli's own Python) and little of that. So
`ktcli summarize` may read files as outlines (`pipeline.summarize`; the planner decides,
and says so, see `plan.planner`).

Python is outlined from its syntax tree; other languages by line patterns (declarations
near the left margin and the comment block above each); data and config files by their
first lines. Long prose with headings (Markdown, reStructuredText, HTML, and PDFs by the sections
their bookmarks or numbered headings start: `ingest.pdf_headings`) keeps its headings and
each section's first paragraph (the Python tutorial: 13% of its tokens); shorter prose and
prose without headings are read whole. Every kept line keeps
its line number, so an outline still cites its source.
"""

from __future__ import annotations

import ast
import re

from ktcli.ingest.sections import RST_UNDERLINE
from ktcli.ingest.tokens import encoding
from ktcli.types import Chunk, Document, Span

# Lines kept from the head of a file with no declarations to show (JSON, YAML, CSS...).
HEAD_LINES = 12
# A comment block above a declaration is kept up to this many lines (its last ones).
DOC_COMMENT_LINES = 6
# A file's leading comment (licence banners, module notes) up to this many lines.
HEADER_LINES = 20
# Declarations indented further than this are inside a body, not part of the outline.
MAX_DECL_INDENT = 8
# Prose: a section's first paragraph is kept up to this many lines; prose with fewer
# headings than this is read whole.
LEAD_LINES = 8
MIN_HEADINGS = 3
# Prose shorter than this (about a window's worth of tokens) is never outlined.
PROSE_OUTLINE_CHARS = 32_000

# A declaration line in the C, Java, JS/TS, Go, Rust, Kotlin, Swift, Ruby, PHP, shell...
# families: a keyword that starts a type, function or module, after optional modifiers.
_DECLARATION = re.compile(
    r"(export\s+)?(default\s+)?(pub(\(\w+\))?\s+)?"
    r"((public|private|protected|internal|static|final|abstract|virtual|inline|extern|async|unsafe|const|"
    r"override|open|sealed|data|suspend)\s+)*"
    r"(fn|struct|enum|trait|impl|mod|union|func|type|interface|class|object|module|namespace|"
    r"function|def|record|protocol|extension|typedef|template|macro_rules!)\b"
)
# C-like function definitions: a return type and a name, then '(' with no ';' after it.
_C_FUNCTION = re.compile(r"[A-Za-z_][\w:<>,\s\*&]*\s[\*&]*[A-Za-z_][\w:~]*\s*\([^;]*$")
_C_KEYWORDS = re.compile(r"(if|for|while|switch|return|else|do|case|sizeof|catch)\b")
_COMMENT = re.compile(r"\s*(//|/\*|\*|#(?!include|define|if|else|endif|pragma)|--|;;|%)")
# Languages with declarations worth outlining; the rest show their head.
_CODE_LANGUAGES = {
    "javascript", "typescript", "rust", "go", "c", "cpp", "cuda", "java", "kotlin", "scala", "swift",
    "objective-c", "csharp", "fsharp", "ruby", "php", "perl", "lua", "julia", "dart", "elixir", "haskell",
    "ocaml", "zig", "nim", "shell", "powershell", "groovy", "r", "vue", "svelte", "protobuf", "graphql", "sql",
}


def outline_lines(doc: Document) -> list[tuple[int, str]] | None:
    """The outline of a document as (1-based line, text) in file order, or None for one
    that is read whole (short prose, prose without headings, or no shorter as an outline)."""
    if not doc.text.strip():
        return None
    lines = doc.text.split("\n")
    if doc.kind in ("markdown", "text", "html", "docx", "odt", "epub"):  # a word processor's headings are `#` lines
        if len(doc.text) < PROSE_OUTLINE_CHARS:
            return None  # a README or a short page is worth reading whole
        keep = _sections(lines)
        if keep is None:
            return None
    elif doc.kind == "pdf":
        if len(doc.text) < PROSE_OUTLINE_CHARS:
            return None
        keep = _pdf_sections(doc, lines)
        if keep is None:  # `--outline always` read a 60-page report whole though its headings were found
            return None
    elif doc.kind != "code":
        return None
    elif doc.language == "python":
        keep = _python(doc.text, lines)
        if keep is None:  # not parseable (Python 2, a template): by its lines instead
            keep = _by_patterns(lines)
    elif doc.language in _CODE_LANGUAGES:
        keep = _by_patterns(lines)
    else:
        keep = set()
    if not keep:
        keep = _head(lines)
    kept = [(i + 1, lines[i]) for i in sorted(keep) if i < len(lines)]
    if len(kept) >= sum(1 for line in lines if line.strip()):
        return None  # the outline would be the whole file
    return kept


def outline_text(kept: list[tuple[int, str]]) -> str:
    """The kept lines, with a blank line where a skipped body ends before a line at the
    left margin, so top-level items read apart."""
    out: list[str] = []
    previous = None
    for number, text in kept:
        if previous is not None and number > previous + 1 and text[:1] not in ("", " ", "\t") and out[-1]:
            out.append("")
        out.append(text)
        previous = number
    return "\n".join(out)


def outline_chunks(doc: Document, kept: list[tuple[int, str]], max_tokens: int) -> list[Chunk]:
    """The outline as chunks of at most ~max_tokens (whole lines; a longer line alone),
    each citing the document lines from its first kept line to its last."""
    encode = encoding().encode_ordinary
    chunks: list[Chunk] = []
    piece: list[tuple[int, str]] = []
    used = 0
    for number, text in kept:
        n = len(encode(text + "\n"))
        if piece and used + n > max_tokens:
            chunks.append(_chunk(doc, len(chunks), piece, used))
            piece, used = [], 0
        piece.append((number, text))
        used += n
    if piece:
        chunks.append(_chunk(doc, len(chunks), piece, used))
    return chunks


def _chunk(doc: Document, ordinal: int, piece: list[tuple[int, str]], n_tokens: int) -> Chunk:
    """A piece of the outline, named (for the model) by the page or chapter its first line
    is on where the document has them (a Word file's, an EPUB's), else by its lines."""
    first = piece[0][0]
    page = next((p.number for p in reversed(doc.pages) if p.number is not None and p.line_offset < first), None)
    span = Span(doc.path, first, piece[-1][0], page, doc.unit)
    return Chunk(doc.path, ordinal, outline_text(piece), span, n_tokens, doc.sha256)


def _head(lines: list[str]) -> set[int]:
    out: set[int] = set()
    for i, line in enumerate(lines):
        if line.strip():
            out.add(i)
            if len(out) == HEAD_LINES:
                break
    return out


# ---- Python ------------------------------------------------------------------------


def _python(text: str, lines: list[str]) -> set[int] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    keep: set[int] = set()
    _docstring(tree, keep)
    _python_body(tree.body, lines, keep, top=True)
    return keep


def _python_body(body: list[ast.stmt], lines: list[str], keep: set[int], top: bool) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            _comment_above(lines, first - 1, keep)
            keep.update(range(first - 1, _header_end(node, lines)))
            _docstring(node, keep)
            if isinstance(node, ast.ClassDef):  # methods; a function's inner functions are its body
                _python_body(node.body, lines, keep, top=False)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            # Module constants and class fields (dataclasses): one line each, with their comment.
            if names and (not top or names[0].isupper() or names[0] == "__all__"):
                _comment_above(lines, node.lineno - 1, keep)
                keep.add(node.lineno - 1)
        elif top and isinstance(node, ast.If) and _is_main_guard(node):
            keep.add(node.lineno - 1)


def _header_end(node: ast.AST, lines: list[str]) -> int:
    """The 0-based line after a def/class header: up to the ':' that opens the body."""
    body_line = node.body[0].lineno - 1  # type: ignore[attr-defined]
    for i in range(node.lineno - 1, body_line + 1):  # type: ignore[attr-defined]
        if lines[i].rstrip().endswith(":") or i == body_line:
            return i + 1
    return body_line + 1


def _docstring(node: ast.AST, keep: set[int]) -> None:
    """The docstring's first paragraph (its summary), as source lines."""
    body = getattr(node, "body", None)
    if not body or not isinstance(body[0], ast.Expr):
        return
    value = body[0].value
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return
    whole = value.value.strip()
    paragraph = whole.split("\n\n")[0]
    start, end = value.lineno - 1, value.end_lineno  # 0-based [start, end)
    if paragraph == whole:  # one paragraph: all of it, closing quotes included
        keep.update(range(start, end))  # type: ignore[arg-type]
    else:
        keep.update(range(start, min(start + paragraph.count("\n") + 1, end)))  # type: ignore[arg-type]


def _is_main_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__")


# ---- prose: headings and the first paragraph under each ----------------------------

_MARKDOWN_HEADING = re.compile(r"#{1,6}\s+\S")
_RST_MARKUP = re.compile(r"\.\.\s")  # directives, labels, comments: not prose


def _sections(lines: list[str]) -> set[int] | None:
    """Markdown or reStructuredText headings (an HTML page's, converted, are markdown's),
    each with the first paragraph under it, and the text's opening paragraph; None for
    prose with fewer than MIN_HEADINGS headings, which has no outline to read."""
    keep: set[int] = set()
    headings = 0
    _lead(lines, 0, keep)
    i = 0
    while i < len(lines):
        line = lines[i]
        underlined = (i + 1 < len(lines) and line.strip() and not RST_UNDERLINE.match(line)
                      and RST_UNDERLINE.match(lines[i + 1]) and len(lines[i + 1].strip()) >= len(line.strip()))
        if underlined or _MARKDOWN_HEADING.match(line):
            headings += 1
            end = i + 2 if underlined else i + 1
            if underlined and i > 0 and RST_UNDERLINE.match(lines[i - 1]):
                keep.add(i - 1)  # an overline
            keep.update(range(i, end))
            i = _lead(lines, end, keep)
            continue
        i += 1
    return keep if headings >= MIN_HEADINGS else None


def _pdf_sections(doc: Document, lines: list[str]) -> set[int] | None:
    """A PDF's section headings (found by `pdf_headings` from its bookmarks or numbered
    headings: a PDF's text has no `#` lines to tell them by), each with the first paragraph
    under it, and the text's opening paragraph; None for fewer than MIN_HEADINGS."""
    starts = sorted({page.line_offset + k for page in doc.pages for k, _ in page.headings})
    if len(starts) < MIN_HEADINGS:
        return None
    keep: set[int] = set()
    stops = set(starts)
    _lead(lines, 0, keep, stops)
    for i in starts:
        if i < len(lines):
            keep.add(i)
            _lead(lines, i + 1, keep, stops)
    return keep


def _lead(lines: list[str], start: int, keep: set[int], stops: set[int] = frozenset()) -> int:
    """Keep the first paragraph at or after `start` (blank lines and markup skipped, at
    most LEAD_LINES lines, stopping at a heading or a line of `stops`); returns the line
    after it."""
    i = start
    while i < len(lines) and (not lines[i].strip() or _RST_MARKUP.match(lines[i])):
        i += 1
    taken = 0
    while i < len(lines) and lines[i].strip() and taken < LEAD_LINES and i not in stops \
            and not _MARKDOWN_HEADING.match(lines[i]) \
            and not (i + 1 < len(lines) and RST_UNDERLINE.match(lines[i + 1]) and not RST_UNDERLINE.match(lines[i])):
        keep.add(i)
        i += 1
        taken += 1
    return i


# ---- other languages, by their lines -----------------------------------------------


def _by_patterns(lines: list[str]) -> set[int]:
    keep = _header_comment(lines)
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if not stripped or indent > MAX_DECL_INDENT or _COMMENT.match(line):
            continue
        if _DECLARATION.match(stripped) or (indent == 0 and _C_FUNCTION.match(stripped)
                                            and not _C_KEYWORDS.match(stripped)):
            _comment_above(lines, i, keep)
            keep.add(i)
    return keep


def _header_comment(lines: list[str]) -> set[int]:
    """A file's opening comment block (after a shebang), up to HEADER_LINES lines."""
    out: set[int] = set()
    for i, line in enumerate(lines):
        if i == 0 and line.startswith("#!"):
            continue
        if not line.strip() and not out:
            continue
        if not _COMMENT.match(line) or len(out) >= HEADER_LINES:
            break
        out.add(i)
    return out


def _comment_above(lines: list[str], i: int, keep: set[int]) -> None:
    """The comment lines right above line i (no blank line between), at most the last
    DOC_COMMENT_LINES of them."""
    j = i - 1
    block: list[int] = []
    while j >= 0 and lines[j].strip() and _COMMENT.match(lines[j]):
        block.append(j)
        j -= 1
    keep.update(block[:DOC_COMMENT_LINES])
