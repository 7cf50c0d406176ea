"""Where a line sits in its document: the trail of headings (prose) or enclosing
definitions (code) above it, e.g. "Classes > A First Look at Classes > Class Definition
Syntax" or "class Shelf > def search".

A retrieval chunk is a few hundred tokens cut from the middle of a section; its own words
rarely say what the section is about. The trail is prepended to the text that is
embedded and indexed for BM25 (`retrieval.retriever.indexed_text`), the way a reader uses
a table of contents: a question about "defining a class" then finds the chunk under
"Class Definition Syntax" that never uses the word "define".

Prose: Markdown ATX headings (`#`..`######`, also what `htmltext` makes of <h1>..<h6>) and
reStructuredText section titles, whose levels follow the order in which each adornment
style (character, with or without an overline) first appears, as docutils assigns them.
Setext Markdown headings (a line underlined with === or ---) read as the latter. Code:
class, function and type declarations, nested by indentation. Tables (CSV, TSV): their
header row. PDFs: their bookmarks' or numbered headings' trails (`paged_trails`).
"""

from __future__ import annotations

import csv
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable

from ktcli.ingest.pdf_headings import numbered_headings
from ktcli.types import DECLARATION_ATTRIBUTES, SECTION_MAX_DEPTH, SECTION_SEPARATOR, TABLE_TRAIL

SEPARATOR = SECTION_SEPARATOR
MAX_DEPTH = SECTION_MAX_DEPTH
# A title longer than this is a sentence that happens to sit above an underline.
MAX_TITLE_CHARS = 120
# A code line longer than this was written for machines (minified, generated): it opens no
# scope that its own chunks could be named by. Hand-written declarations are far shorter.
MACHINE_LINE_CHARS = 1_000

ATX = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"\s*(```|~~~)")
ADORNMENT = re.compile(r"""([=\-~^"'`#*+_:.])\1{2,}\s*$""")
# A title's underline (or overline) as outlines, chunk breaks and file maps take it: ADORNMENT
# less ":" and "."
RST_UNDERLINE = re.compile(r"""([=\-~^"'`#*+_])\1{2,}\s*$""")
# rST inline markup in a title: :role:`!text` / :role:`text <target>` / ``literal`` / `text`.
_ROLE = re.compile(r":[\w:.+-]+:`!?([^`<]*?)\s*(?:<[^`]*>)?`")
_LITERAL = re.compile(r"`{1,2}([^`]*)`{1,2}_{0,2}")
# A declaration that opens a scope, after optional modifiers; group "name" is what it declares.
_DECLARATION = re.compile(
    r"\s*(?:@\S+\s+)*(?:(?:export|default|pub(?:\([\w:]+\))?|public|private|protected|internal|static|final|"
    r"abstract|async|unsafe|override|open|sealed|data|suspend|inline|virtual)\s+)*"
    r"(?P<kind>class|def|fn|func|function|struct|enum(?:\s+(?:class|struct))?|trait|impl|interface|module|namespace"
    r"|object|type|record)\s+" + DECLARATION_ATTRIBUTES +
    r"(?P<name>(?:[^\W\d]|\$)[\w$.:<>]*)"  # a name may start with any alphabet's letter
)


def document_trails(path: str, kind: str, lines: list[str], language: str | None = None) -> SectionIndex:
    """The trails of a document's lines: its headings or declarations; for a CSV or TSV
    table, its header row ("columns: id, name, city"), without which a chunk from its
    middle is rows of bare values that no question about a column matches."""
    if lines and lines[0].strip() and (path.lower().endswith(TABLE_SUFFIXES)
                                       or (kind in ("stdin", "text") and looks_like_a_table(lines))):
        # The row whole, as written: the model reads it above a chunk's rows
        # (`prompts.passages`), where a first column with no name (pandas' index: "\tname")
        # stripped of its tab shifted every name one column; a citation shows its start.
        return SectionIndex([(1, f"{TABLE_TRAIL}{lines[0].rstrip(chr(13))}")])  # from the first row under it
    if (kind in ("stdin", "text", "code") or path.lower().endswith((".diff", ".patch"))) and _is_diff(lines):
        return SectionIndex(_diff_marks(lines))
    code = kind == "code" or (kind == "stdin" and _piped_code(language, lines))
    trails = heading_trails(lines, code=code, markdown=kind == "markdown")
    if not len(trails) and kind in ("text", "stdin") and not code:
        # a plain-text contract or report numbers its headings ("7. TERMINATION", "3.2 Fees"),
        # underlines none: the chain of numbered headings a PDF's text is read by
        trails = SectionIndex(list(numbered_headings(["\n".join(lines)])[0].headings))
    return _with_table_headers(trails, lines) if kind in _ROW_KINDS else trails


def paged_trails(pages, lines: list[str]) -> SectionIndex:
    """The trails of a PDF's lines (`lines`: its whole text's): each page's trail at its
    top and at the headings on it (`Page.headings`, from its bookmarks or numbered
    headings: `ingest.pdf_headings`), its tables' rows under their header rows, as a
    Word file's are (" | " rows: `pdftext` joins a table's cells so)."""
    marks: list[tuple[int, str]] = []
    for page in pages:
        if page.number is None:
            continue
        if not marks or marks[-1][1] != page.section:
            marks.append((page.line_offset, page.section))
        marks.extend((page.line_offset + k, trail) for k, trail in page.headings)
    return _with_table_headers(SectionIndex(marks), lines)


# Kinds whose tables are rows of cells between " | " (the Word, ODT, EPUB, HTML and RTF
# readers write them so; Markdown's own pipe tables too).
_ROW_KINDS = frozenset({"docx", "odt", "epub", "html", "rtf", "markdown"})
_MIN_TABLE_ROWS = 6  # a header and 5 rows: a smaller table sits in one chunk with its header as a rule
MARKDOWN_RULE = re.compile(r"\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*"
                           # between pipes a dash will do ("|--|--|", "|-|:-:|")
                           r"|\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)+\|?\s*")


def _with_table_headers(trails: SectionIndex, lines: list[str]) -> SectionIndex:
    """`trails` with each table's rows after its header under "<section> > columns: <header
    row>": a chunk from the middle of an 80-row rate table reached the model as bare rows
    ("Prague - Lyon | 246 | 4"), nothing saying which figure was the rate and which the days.
    A table: at least _MIN_TABLE_ROWS row lines in a row, outside code fences; its header,
    the first of them."""
    runs = _table_runs(lines)
    if not runs:
        return trails
    starts, marks = trails._starts, list(zip(trails._starts, trails._trails))
    for first, end in runs:
        body = first + 2 if first + 1 < end and MARKDOWN_RULE.fullmatch(lines[first + 1]) else first + 1
        if bisect_left(starts, end) > bisect_left(starts, body):
            continue  # a heading inside a table's rows: none in practice
        above = trails.at(first)
        # the header's cells as the readers join them: a Markdown header padded to its column
        # widths named the section "| Status     | Notes                 |"
        header = " | ".join(row_cells(lines[first]))
        marks.append((body, f"{above}{SECTION_SEPARATOR if above else ''}{TABLE_TRAIL}{header}"))
        after = bisect_left(starts, end)
        if end < len(lines) and (after == len(starts) or starts[after] != end):  # the section goes on after it
            marks.append((end, trails.at(end)))
    marks.sort(key=lambda mark: mark[0])
    return SectionIndex(marks)


def _table_runs(lines: list[str]) -> list[tuple[int, int]]:
    """[first, end) of each block of table rows (2+ cells, any number: Word and HTML drop or
    keep empty cells at a row's end) and Markdown rules, outside code fences. A block is
    never cut where its cell count changes: the rows after the cut took a row of figures
    for their header."""
    runs: list[tuple[int, int]] = []
    fenced = False
    k = 0
    while k < len(lines):
        if FENCE.match(lines[k]):
            fenced = not fenced
        if fenced or _cells(lines[k]) < 2:
            k += 1
            continue
        end = k + 1
        while end < len(lines) and (_cells(lines[end]) >= 2 or MARKDOWN_RULE.fullmatch(lines[end])):
            end += 1
        if end - k >= _MIN_TABLE_ROWS:
            runs.append((k, end))
        k = end
    return runs


def _cells(line: str) -> int:
    return len(row_cells(line))


def row_cells(line: str) -> list[str]:
    """The cells of a table row as the readers write it ("a | b | c"; Markdown's "| a | b |", "|a|b|"),
    [] for a line that is none."""
    stripped = line.strip()
    if " | " in stripped:
        return [cell.strip() for cell in stripped.strip("|").split(" | ")]
    if len(stripped) > 2 and stripped[0] == stripped[-1] == "|" and stripped.count("|") >= 3:
        return [cell.strip() for cell in stripped[1:-1].split("|")]  # written tight: "|Plan|Price|"
    return []


def looks_like_a_table(lines: list[str]) -> bool:
    """A CSV or TSV by its shape, whatever its name (piped in, an export named .txt): its
    first lines hold the same number of tabs (one or more), or of commas (two or more). A
    CSV on stdin lost its header trail, so its chunks were bare rows."""
    head = [line for line in lines[:12] if line.strip()][:6]
    if len(head) < 3 or head[0].lstrip().startswith(("{", "[")):  # JSON lines: no header row
        return False
    for sep, least in (("\t", 1), (",", 2)):
        # separators outside quotes: a quoted "91,450" or "Brume, Ignatius" is one field
        # (counted raw, one such row among the first made a CSV prose, and its key line
        # the first 400 characters of the file)
        rows = _fields(head, sep)
        counts = {len(row) - 1 for row in rows}
        names = rows[0] if rows else []
        # a header row: the same count of separators, and short names, not all figures
        if len(counts) == 1 and counts.pop() >= least and all(len(n.strip()) <= 40 for n in names) \
                and not all(n.strip().replace(".", "").isdigit() for n in names):
            return True
    return False


def _fields(lines: list[str], sep: str) -> list[list[str]]:
    """`lines` as a CSV's rows (a quoted field may hold the separator, or a line break)."""
    try:
        return list(csv.reader(lines, delimiter=sep))
    except csv.Error:
        return [line.split(sep) for line in lines]


def _piped_code(language: str | None, lines: list[str]) -> bool:
    """Code piped in (its language known by its content): trails of its declarations, not
    headings (`cat progress_bar.py | ktcli ask -` cited its lines under a `# comment`). A
    Markdown text quoting code stays prose: in ``` fences, or indented (then no line of
    code starts at the margin)."""
    head = lines[:5000]
    return (language is not None and not any(line.lstrip().startswith(("```", "~~~")) for line in head)
            and any(_MARGIN_CODE.match(line) for line in head))


# A line of code at the margin: a declaration, an import, a shebang, a preprocessor line, a
# call or an assignment. Case matters ("Use it like this:", "From version 2 on" are prose);
# SQL's keywords in capitals.
_MARGIN_CODE = re.compile(r"(?:#!|#include\b|#define\b|(?:export\s+|pub\s+|public\s+|async\s+)*"
                          r"(?:def|class|function|fn|func|package|module|struct|enum|interface|impl|const|let|var)\s+\w"
                          r"|import\s+[\w.{*]|from\s+[\w.]+\s+import\b|use\s+[\w:]+;|(?:SELECT|CREATE|INSERT)\b"
                          r"|[A-Za-z_][\w.]*\(.*\)\s*[{;]?\s*$|[A-Za-z_]\w*\s*=[^=])")


def _is_diff(lines: list[str]) -> bool:
    head = lines[:400]
    return any(line.startswith("diff --git ") for line in head) or any(
        a.startswith("--- ") and b.startswith("+++ ") and c.startswith("@@ ") for a, b, c in zip(head, head[1:], head[2:]))


_COMMIT = re.compile(r"^commit ([0-9a-f]{7,64})\b")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def _diff_marks(lines: list[str]) -> list[tuple[int, str]]:
    """A unified diff (`git diff | ktcli ask -`): each line's place in the file it changes,
    "src/app.py:120" (new numbering; "src/app.py:118, removed" for a removed line), so a
    citation of the diff's lines names the file and line to open, not only "<stdin>:288"."""
    marks: list[tuple[int, str]] = []
    path, old, new = "", 0, 0
    in_hunk = False
    for k, line in enumerate(lines):
        if (c := _COMMIT.match(line)) is not None:
            # `git log -p`: a commit's header and message belong to no file (they were cited
            # under the file of the commit before's last hunk)
            in_hunk, path = False, f"commit {c.group(1)[:12]}"
        elif line.startswith("diff --git "):
            in_hunk, path = False, line.rsplit(" b/", 1)[-1] if " b/" in line else path
        elif not in_hunk and line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null" and (line.startswith("+++ ") or not path):
                path = name[2:] if name.startswith(("a/", "b/")) else name
        elif (m := _HUNK.match(line)) is not None:
            in_hunk, old, new = True, int(m.group(1)), int(m.group(2))
            marks.append((k, f"{path}:{new}"))
            continue
        elif in_hunk and (line == "" or line[0] in " +"):
            marks.append((k, f"{path}:{new}"))
            old, new = old + (not line.startswith("+")), new + 1
            continue
        elif in_hunk and line.startswith("-"):
            marks.append((k, f"{path}:{old}, removed"))
            old += 1
            continue
        elif in_hunk and line.startswith("\\"):  # "\ No newline at end of file"
            continue
        else:
            in_hunk = False
        marks.append((k, path))
    return marks


TABLE_SUFFIXES = (".csv", ".tsv")


def heading_trails(lines: list[str], *, code: bool, markdown: bool = False) -> SectionIndex:
    """The trail at every line of `lines` (a document's, 0-based); `markdown`: underlined
    headings as Markdown ranks them (=== level 1, --- level 2), not as reStructuredText."""
    marks = _code_marks(lines) if code else _prose_marks(lines, markdown)
    return SectionIndex(marks)


class SectionIndex:
    """Trails by line: `at(k)` is the trail in force at line k (0-based), "" before any."""

    def __init__(self, marks: list[tuple[int, str]]) -> None:
        self._starts = [k for k, _ in marks]  # lines where the trail changes, ascending
        self._trails = [t for _, t in marks]

    def at(self, line: int) -> str:
        i = bisect_right(self._starts, line) - 1
        return self._trails[i] if i >= 0 else ""

    def most_of(self, start: int, end: int, counts: Callable[[int], int]) -> str:
        """The trail in force over most of lines start..end-1 (0-based), line k weighing
        `counts(k)`; of equals, the first."""
        weights: dict[str, int] = {}
        i = bisect_right(self._starts, start) - 1
        at = start
        while at < end:
            until = min(self._starts[i + 1], end) if i + 1 < len(self._starts) else end
            trail = self._trails[i] if i >= 0 else ""
            weights[trail] = weights.get(trail, 0) + sum(counts(k) for k in range(at, until))
            at, i = until, i + 1
        return max(weights, key=weights.__getitem__, default="")  # (max keeps the first of equals)

    def __len__(self) -> int:
        return len(self._starts)


def _prose_marks(lines: list[str], markdown: bool = False) -> list[tuple[int, str]]:
    """(line, trail) at each heading; the trail includes the heading itself."""
    styles: dict[tuple[str, bool], int] = {}  # rST adornment style -> level, in order of first use
    stack: list[tuple[int, str]] = []  # (level, title)
    marks: list[tuple[int, str]] = []
    in_fence = False
    k = _front_matter_end(lines) if markdown else 0
    while k < len(lines):
        line = lines[k]
        if FENCE.match(line):
            in_fence = not in_fence
            k += 1
            continue
        heading = None if in_fence else (_markdown_heading_at(lines, k) if markdown else _heading_at(lines, k, styles))
        if heading is None:
            k += 1
            continue
        level, title, first_line, next_k = heading
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        marks.append((first_line, SEPARATOR.join(t for _, t in stack[-MAX_DEPTH:])))
        k = next_k
    return marks


# Markdown's setext underline: = (level 1) or - (level 2), any length, up to 3 spaces in.
_SETEXT = re.compile(r" {0,3}(=+|-+)\s*$")
_NOT_A_PARAGRAPH = re.compile(r" {4}|\t| {0,3}(?:[-*+>]\s|\d+[.)]\s|[|`~<])")


def _markdown_heading_at(lines: list[str], k: int):
    """A Markdown heading at line k: `# Title`, or a paragraph's line underlined with `===`
    (level 1) or `---` (level 2) of any length, as CommonMark reads them (ranked as
    reStructuredText's adornments, below any `#` heading, a wiki page's `Runbook` over
    `## Deploy` was cited "(Deploy)")."""
    atx = ATX.match(lines[k])
    if atx:
        title = _clean(atx.group(2))
        return (len(atx.group(1)), title, k, k + 1) if title else None
    line = lines[k]
    if (not line.strip() or k + 1 >= len(lines) or _NOT_A_PARAGRAPH.match(line) or _SETEXT.match(line)
            or "|" in line or (k > 0 and lines[k - 1].strip())):
        # a one-line paragraph only: a table's row or a list item's lazy line above a
        # rule is no heading
        return None
    under = _SETEXT.match(lines[k + 1])
    title = _clean(line.strip()) if under else ""
    if not title or len(title) > MAX_TITLE_CHARS:
        return None
    return (1 if under.group(1)[0] == "=" else 2), title, k, k + 2


_FRONT_MATTER_KEY = re.compile(r"[A-Za-z_][\w-]*\s*:")


def _front_matter_end(lines: list[str]) -> int:
    """The line after a Markdown file's YAML front matter (`---` ... `---`), else 0: its
    closing `---` under `title: x` is no heading."""
    if len(lines) < 2 or lines[0].strip() != "---" or not _FRONT_MATTER_KEY.match(lines[1]):
        return 0  # (a file that opens with a rule, then prose: no front matter)
    return next((i + 1 for i in range(1, min(len(lines), 200)) if lines[i].strip() in ("---", "...")), 0)


def _heading_at(lines: list[str], k: int, styles: dict[tuple[str, bool], int]):
    """(level, title, first line, line after it) when a heading starts at line k."""
    line = lines[k]
    atx = ATX.match(line)
    if atx:
        title = _clean(atx.group(2))
        return (int(len(atx.group(1))), title, k, k + 1) if title else None
    if not line.strip():
        return None
    overline = ADORNMENT.match(line)
    if overline and k + 2 < len(lines) and lines[k + 2].strip() == line.strip() and lines[k + 1].strip():
        title, char, after = lines[k + 1].strip(), line.strip()[0], k + 3  # over- and underlined
    elif not overline and k + 1 < len(lines):
        under = ADORNMENT.match(lines[k + 1])
        if not under or len(lines[k + 1].rstrip()) < len(line.rstrip()) or line.startswith((" ", "\t")):
            return None
        title, char, after = line.strip(), lines[k + 1].strip()[0], k + 2
        overline = None
    else:
        return None
    title = _clean(title)
    if not title or len(title) > MAX_TITLE_CHARS:
        return None
    # Levels rank below any Markdown ATX level a file might mix in: 7, 8, ...
    level = styles.setdefault((char, overline is not None), 7 + len(styles))
    return level, title, k, after


def _clean(title: str) -> str:
    title = _ROLE.sub(r"\1", title)
    title = _LITERAL.sub(r"\1", title)
    return title.replace("\\", "").strip().strip("#").strip()


def _code_marks(lines: list[str]) -> list[tuple[int, str]]:
    """(line, trail) wherever the enclosing declarations change: at each declaration, and
    at the first line back at or left of an open declaration's indentation."""
    stack: list[tuple[int, str]] = []  # (indent, "kind name")
    marks: list[tuple[int, str]] = []
    decorated_from: int | None = None  # the first of the decorator lines right above a declaration
    open_brackets = 0  # inside a decorator's arguments, written over several lines
    for k, line in enumerate(lines):
        stripped = line.strip()
        if open_brackets > 0 or stripped.startswith("@"):
            if decorated_from is None:
                decorated_from = k
            open_brackets = max(0, open_brackets + sum(stripped.count(c) for c in "([{")
                                - sum(stripped.count(c) for c in ")]}"))
            continue  # decorators are the next declaration's lines, not a scope change
        if not stripped or stripped.startswith(("#", "//", "/*", "*", ")", "]", "}")):
            continue  # blank, comments and closers do not leave a scope
        indent = len(line) - len(line.lstrip())
        popped = False
        while stack and indent <= stack[-1][0]:
            stack.pop()
            popped = True
        # A minified file's line declares many functions: its first one named every chunk
        # of the line ("(function f0)" on all 51 chunks of a 30 KB bundle line).
        decl = _DECLARATION.match(line) if len(line) <= MACHINE_LINE_CHARS else None
        if decl:
            stack.append((indent, f"{decl.group('kind')} {decl.group('name').rstrip(':')}"))  # "class Shelf:"
        if decl or popped:
            # A declaration's decorators are its own lines: a citation of `@torch.no_grad()`
            # above `def forward` was named after the function before.
            start = decorated_from if decl and decorated_from is not None else k
            marks.append((start, SEPARATOR.join(t for _, t in stack[-MAX_DEPTH:])))
        decorated_from = None
    return marks
