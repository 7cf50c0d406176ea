"""Where code defines the names a question asks about.

"Which file defines class ProgressBar?" found neither click's `class ProgressBar:` nor its
file among the eight chunks retrieved: the name comes back in dozens of chunks that use it,
and BM25 and the embedder rank a use as high as the definition. A chunk that defines a
name the question spells as code is what such a question asks for, so the retriever
gives it a bonus (`retriever.DEFINITION_BONUS`).

"What calls `set_cell_size`?" asks for the opposite: the chunks that use the name. BM25
ranked rich's call sites 3rd and 4th, but the embedder placed the question beside the
definition and its neighbours, and the fusion kept those; a question that asks about a
name's callers, uses or imports gives the chunks using the name a bonus too
(`retriever.USE_BONUS`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ktcli.types import DECLARATION_ATTRIBUTES, Chunk

# class / def / function / fn / func / struct ... NAME, as most languages write a definition
_DEFINED = re.compile(
    r"^[ \t]*(?:(?:export|default|pub(?:\([\w:]+\))?|public|private|protected|internal|static|abstract|final|"
    r"async|unsafe|extern|inline|virtual|sealed|data|open)\s+)*"
    r"(?:class|def|function|fn|func(?:\s*\([^)]*\))?|struct|enum(?:\s+(?:class|struct))?|interface|trait|type|module|object|record|"
    r"macro_rules!|defmacro|defun|sub)\s+" + DECLARATION_ATTRIBUTES + r"((?:[^\W\d]|\$)[\w$]*)",
    re.MULTILINE,
)
# a constant assigned at the start of a line: TAX_RATE = 0.2, const MAX_SIZE: usize = 8
_CONSTANT = re.compile(r"^[ \t]*(?:(?:export|pub|const|let|var|static|final|readonly)\s+)*([A-Z][A-Z0-9_]{3,})\s*[:=]",
                       re.MULTILINE)
# a name as a question writes code: CamelCase, snake_case, or ending in ()
_CODE_NAME = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*[a-z0-9][A-Z][A-Za-z0-9_]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9_]*|"
                        r"[A-Z]{2,}[a-z][A-Za-z0-9_]*|"
                        r"[^\W\d_][^\W_]*_\w+|[^\W\d]\w{2,}(?=\(\)))")  # snake_case and name() in any alphabet
# Other languages' definitions: C's and Java's `type name(params) {` (the brace may come
# on the next line), `#define NAME`, SQL's CREATE TABLE/VIEW/FUNCTION, a shell function
# `name() {`, a JS/TS class method `name(params): T {`, and a top-level `var`/`const`/`let`
# or Python assignment. (click's `echo`, a C `crc32_compute`, `CREATE TABLE orders` and
# Go's `var DefaultRetryPolicy` were never found as definitions.)
_NOT_NAMES = (r"(?!(?:if|for|while|switch|return|sizeof|catch|else|do|new|delete|throw|raise|case|typeof|await|yield|"
              r"with|elif|assert|not|and|or|in|is|import|from|lambda|print|puts|echo|local|export|go|defer|goto)\b)")
_C_FUNCTION = re.compile(
    r"^[ \t]*(?:(?:static|inline|extern|const|unsigned|signed|struct|enum|public|private|protected|final|abstract|"
    r"synchronized|virtual|override|async)\s+)*" + _NOT_NAMES + r"[A-Za-z_][\w:]*(?:<(?:[^<>;(){}\n]|<[^<>;(){}\n]*>)*>)?[ \t*&]+" +
    _NOT_NAMES + r"(?:[A-Za-z_]\w*::)*([A-Za-z_]\w*)\s*\((?:[^;{}()\n]|,[ \t]*\n|\([^;{}()\n]*\))*\)[ \t]*(?:const[ \t]*)?(?:\{|$)",
    re.MULTILINE,
)
_OTHER_DEFINITIONS = (
    _C_FUNCTION,
    re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.MULTILINE),
    re.compile(r"^[ \t]*create\s+(?:or\s+replace\s+)?(?:temp(?:orary)?\s+|unique\s+|materialized\s+)*"
               r"(?:table|view|function|procedure|index|type|trigger|sequence|schema)\s+(?:if\s+not\s+exists\s+)?"
               r"(?:[\w\"`]+\.)?[\"`]?([A-Za-z_]\w*)", re.MULTILINE | re.IGNORECASE),
    re.compile(r"^[ \t]*" + _NOT_NAMES + r"([A-Za-z_][\w-]*)\s*\(\)\s*\{", re.MULTILINE),
    re.compile(r"^[ \t]+(?:(?:public|private|protected|static|async|readonly|override|get|set)\s+)*" + _NOT_NAMES +
               r"((?:[^\W\d]|\$)[\w$]*)\s*(?:<[^>()]*>)?\s*\([^;()]*\)\s*(?::\s*[^={;()]+)?\{\s*$", re.MULTILINE),
    re.compile(r"^(?:export\s+)?(?:var|const|let)\s+((?:[^\W\d]|\$)[\w$]*)\s*(?::[^=\n]+)?=", re.MULTILINE),
    re.compile(r"^([a-z_][a-z0-9_]*)\s*(?::[^=\n]+)?=(?!=)", re.MULTILINE),
)
# Backticks: how developers write any name in a question (`echo`, `main`, `Text.from_markup`).
_BACKTICKED = re.compile(r"`((?:[^\W\d]|\$)[\w$]*(?:(?:\.|::)(?:[^\W\d]|\$)[\w$]*)*)(?:\(\))?`")
# A dotted name outside backticks, as developers write a method (`CliRunner.invoke`,
# `Context.invoke`): neither part is code by its shape, and "where is CliRunner.invoke
# defined?" found CliRunner's class but not `def invoke(`. A file name ("core.py",
# "README.md") is none.
_DOTTED = re.compile(r"(?<![\w.$`])((?:[^\W\d]|\$)[\w$]*(?:\.(?:[^\W\d]|\$)[\w$]*)+)(?![\w$`(])")
_FILE_SUFFIXES = frozenset({"py", "pyi", "js", "ts", "tsx", "jsx", "md", "rst", "txt", "json", "toml", "yaml", "yml",
                            "cfg", "ini", "html", "htm", "css", "pdf", "csv", "lock", "sh", "rs", "go", "java", "cpp",
                            "hpp", "c", "h", "rb", "php", "xml", "log", "ipynb", "docx", "com", "org", "net", "io"})
# A name after the keyword that defines it, in backticks or not (`class Segment`, "def
# render", "struct Config"), or before a kind's name ("the Console class", "the render
# function"): a plain word such as Segment or render is no code name by its shape, and
# "where is `class Segment` defined?" found no chunk of `class Segment(NamedTuple):`.
# After a keyword only where code writes it so ("which class handles colours" names none),
# and in backticks whatever the word before.
# A type's keyword takes a capitalised (or code-shaped) name in prose: "class Segment",
# not "class names" or "enum values"; a function's any name ("def render").
_KEYWORDS = r"class|def|fn|func|struct|enum|interface|trait"
_FUNCTION_KEYWORDS = frozenset({"def", "fn", "func"})
_KINDS = _KEYWORDS + r"|function|type|module|method|macro|constant"
_CALLABLE_KINDS = frozenset({"function", "method", "macro", "def", "fn", "func"})
_KEYWORD_NAME = re.compile(rf"(\w+\s+)?\b({_KEYWORDS})\s+((?:[^\W\d]|\$)[\w$]*)")
_BACKTICKED_DEFINITION = re.compile(rf"`(?:{_KEYWORDS}|function|const|let|var|type|module)\s+((?:[^\W\d]|\$)[\w$]*)")
_NAME_KIND = re.compile(rf"\b(?:the|a|an|its|our|this|that)\s+`?((?:[^\W\d]|\$)[\w$]*)(?:\(\))?`?\s+({_KINDS})\b",
                        re.IGNORECASE)
# A keyword after these is a noun of prose ("which class handles colours", "a class for").
_DETERMINERS = frozenset({"which", "what", "whose", "the", "a", "an", "this", "that", "these", "those", "each",
                          "every", "any", "some", "one", "another", "same", "other", "its", "their", "our", "my",
                          "your", "no"})
# Words that stand where a name would in prose ("which class", "a function", "the main
# type of"), never taken as one.
_PROSE = frozenset({"the", "a", "an", "this", "that", "these", "those", "which", "what", "whose", "each", "every",
                    "any", "some", "one", "its", "their", "my", "your", "our", "base", "parent", "child", "new",
                    "helper", "main", "same", "other", "another", "first", "last", "of", "for", "in", "is", "are",
                    "does", "do", "and", "or", "to", "with", "as", "by", "from", "on", "at", "be", "defined", "called",
                    "named", "where", "how", "why", "when", "who", "abstract", "data", "return", "python", "public",
                    "private", "static", "async", "given", "following", "above", "below", "inner", "outer", "wrapper",
                    "callback", "utility", "generic", "top", "level", "class", "def", "function", "method", "type",
                    "entire", "whole", "current", "previous", "next", "old", "original", "default", "custom",
                    "internal", "external", "global", "local", "specific", "particular", "corresponding", "relevant",
                    "actual", "underlying", "final", "single", "simple", "nested", "recursive", "anonymous"})
# Words that ask for a name's uses: "what calls X", "callers of X", "where is X used",
# "who imports X". "called" only where no name follows ("a function called X" names one).
_USE_CUES = re.compile(r"\b(?:calls?|callers?|calling|called(?=\s*(?:$|[?.!,;:)]|from\b|by\b|in\b|anywhere\b|"
                       r"elsewhere\b|outside\b))|uses|used|usages?|use\s+of|invoke[sd]?|invoking|invocations?|"
                       r"references?|referenced|referencing|imports?|imported|importing)\b", re.IGNORECASE)
_CODE_SPAN = re.compile(r"`[^`]*`")
# A name defined at more places than this is a common one (`__init__`, `open`, `flush`): no
# signal. Places, not chunks: chunks overlap, and rich's `class ProgressBar` in two of them
# counted twice, so its three definitions in a monorepo (rich's, click's and the copy of
# click vendored in typer) made four and none was retrieved. Monorepos vendor copies: in
# rich + click + typer's Python, 890 names are defined at one place, 265 at two, 40 at
# three, 53 at four to six (click's `getchar`, one per platform, and its copy in typer:
# six), and the names at more are mostly methods every class of a kind writes (`__rich__`,
# `open`, `name`: eight each). Six of the eight chunks `ask` reads leaves two for the rest.
MAX_DEFINITION_SITES = 6


def defined_name(line: str) -> str | None:
    """The name a line of code defines (`def format_filename(`, `pub struct Pool`), else None."""
    m = _DEFINED.match(line)
    return m.group(1) if m else None


def code_names(question: str) -> set[str]:
    """The names in a question written as code identifiers: CamelCase, snake_case,
    ALL_CAPS, `name()`, any name in backticks (each part of a dotted one), or a name
    beside the keyword or kind that defines it (`class Segment`, "the render function")."""
    names = {m.group(1) for m in _CODE_NAME.finditer(question) if len(m.group(1)) >= 4}
    for m in _BACKTICKED.finditer(question):
        names.update(part for part in re.split(r"\.|::", m.group(1)) if len(part) >= 3)
    for m in _dotted(question):
        names.update(part for part in m.group(1).split(".") if len(part) >= 3)
    found = [m.group(1) for m in _BACKTICKED_DEFINITION.finditer(question)]
    # "the render function": a lowercase name only before a callable's kind
    found += [m.group(1) for m in _NAME_KIND.finditer(question)
              if _shaped(m.group(1)) or m.group(2).lower() in _CALLABLE_KINDS]
    for m in _KEYWORD_NAME.finditer(question):
        before, keyword, name = (m.group(1) or "").strip().lower(), m.group(2), m.group(3)
        # C's types are lowercase ("struct inode", "struct sockaddr"); "enum values" is prose
        lowercase_ok = keyword in _FUNCTION_KEYWORDS or (keyword in ("struct", "enum") and not name.endswith("s"))
        if _shaped(name) or (lowercase_ok and before not in _DETERMINERS):
            found.append(name)
    names.update(name for name in found if len(name) >= 3 and name.lower() not in _PROSE)
    return names


def asked_definitions(question: str) -> set[str]:
    """The code names whose definitions a question asks for: `code_names`, a dotted name
    kept whole ("CliRunner.invoke": `def invoke(` in class CliRunner; its parts alone
    asked for `class CliRunner:` too, which the answer named more often, and was cited).
    `citations.attribute` matches a dotted name's definition by its last part."""
    dotted = {m.group(1) for m in _BACKTICKED.finditer(question)} | {m.group(1) for m in _dotted(question)}
    dotted = {name for name in dotted if len(split_dotted(name)) > 1}
    parts = {part for name in dotted for part in split_dotted(name)}
    return (code_names(question) - parts) | dotted


def split_dotted(name: str) -> list[str]:
    """`a.b.c` and `a::b` into their parts."""
    return re.split(r"\.|::", name)


def used_names(question: str) -> set[str]:
    """The code names (`code_names`) of a question that asks who calls, uses or imports
    them; none where it asks nothing of the kind. A dotted name's last part: the uses of
    `Console.print` are calls of `.print(`, not every chunk naming Console."""
    # words in backticks are code (`call_later` asks for no caller), yet a name all the same
    # ("the function called `make_str`" names one)
    if not _USE_CUES.search(_CODE_SPAN.sub(" name ", question)):
        return set()
    question = _BACKTICKED.sub(lambda m: "`" + re.split(r"\.|::", m.group(1))[-1] + "`", question)
    for m in reversed(list(_dotted(question))):
        question = question[:m.start(1)] + "`" + m.group(1).split(".")[-1] + "`" + question[m.end(1):]
    return code_names(question)


def _dotted(question: str) -> list[re.Match[str]]:
    """The dotted names a question writes outside backticks, file names and a sentence's
    end aside."""
    return [m for m in _DOTTED.finditer(_CODE_SPAN.sub(lambda c: " " * len(c.group(0)), question))
            if m.group(1).rsplit(".", 1)[-1].lower() not in _FILE_SUFFIXES]


# A unified diff's hunk header, its context after the second @@ (git names the enclosing
# function there), and its changed lines.
_HUNK = re.compile(r"^@@ [^@]* @@ ?(.*)$", re.MULTILINE)
_CHANGED = re.compile(r"^[+-](?![+-]{2} )(.*)$", re.MULTILINE)
_CONSTANT = re.compile(r"^\s*([A-Z][A-Z0-9_]{2,})\s*[:=]", re.MULTILINE)
MAX_CHANGED_NAMES = 6


def changed_names(diff: str) -> list[str]:
    """The names a unified diff changes: declared on its changed lines or named in its hunk
    headers (the function each hunk is in), and constants assigned there, in order, at most
    MAX_CHANGED_NAMES; none where the text is no diff. "What does this change break?"
    holds no word to retrieve by: the callers of what changed are its answer."""
    if not _HUNK.search(diff):
        return []
    names: list[str] = []
    # changed lines first: a hunk header names the last function line above the hunk,
    # not always the one it changes
    lines = [m.group(1) for m in _CHANGED.finditer(diff)] + [m.group(1) for m in _HUNK.finditer(diff)]
    for line in lines:
        for m in (*_DEFINED.finditer(line), *_CONSTANT.finditer(line)):
            if len(m.group(1)) >= 3 and m.group(1) not in names:
                names.append(m.group(1))
    return names[:MAX_CHANGED_NAMES]


def _shaped(name: str) -> bool:
    """Capitalised, or written as code (an underscore, a capital inside): a type's name."""
    return name[:1].isupper() or "_" in name or any(c.isupper() for c in name[1:])


class SymbolTable:
    """Name -> the places that define it and the chunk that shows each, looked up per name
    a question asks about: only the chunks whose text holds the name are matched against
    the definition patterns (a table of every name in a 1,415-chunk repo took 0.14 s; a
    20K-chunk one, seconds)."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self._chunks = chunks
        self._defined: dict[str, dict[tuple[str, int], int]] = {}
        self._used: dict[str, set[int]] = {}
        self._by_document: dict[str, list[Chunk]] | None = None
        self._in_strings: dict[str, frozenset[int]] = {}

    def defining(self, names: set[str]) -> set[int]:
        """Indices of the chunks defining any of `names`, one per place that defines it (of
        the chunks holding that line, the one with the most lines after it: the most of the
        definition's body), for names defined at MAX_DEFINITION_SITES places at most."""
        out: set[int] = set()
        for name in names:
            sites = self._sites(name)
            if len(sites) <= MAX_DEFINITION_SITES:
                out.update(sites.values())
        return out

    def using(self, names: set[str]) -> set[int]:
        """Indices of the chunks that hold any of `names` as a whole identifier on a line
        that does not define it: its calls, imports and mentions, however many."""
        out: set[int] = set()
        for name in names:
            if name not in self._used:
                sites = self._sites(name)
                whole = re.compile(rf"(?<![\w$]){re.escape(name)}(?![\w$])")
                self._used[name] = {
                    i for i, chunk in enumerate(self._chunks) if name in chunk.text
                    and any((chunk.doc_path, chunk.span.line_start + chunk.text.count("\n", 0, m.start())) not in sites
                            for m in whole.finditer(chunk.text))}
            out.update(self._used[name])
        return out

    def _sites(self, name: str) -> dict[tuple[str, int], int]:
        """(path, line) of each definition of `name` -> the chunk that shows it."""
        if name not in self._defined:
            best: dict[tuple[str, int], tuple[int, int]] = {}  # site -> (lines after it, chunk)
            for i, chunk in enumerate(self._chunks):
                for line in self._definition_lines(chunk, name):
                    after = chunk.span.line_end - line
                    site = (chunk.doc_path, line)
                    if site not in best or after > best[site][0]:
                        best[site] = (after, i)
            self._defined[name] = {site: i for site, (_after, i) in best.items()}
        return self._defined[name]

    def _definition_lines(self, chunk: Chunk, name: str) -> set[int]:
        """The lines of the chunk's document where the chunk shows a definition of `name`,
        less those inside a Python string (rich's tree.py demo holds `class Segment(...)` in
        one: no definition)."""
        lines = {chunk.span.line_start + chunk.text.count("\n", 0, m.start(1)) for m in _definitions(chunk, name)}
        if lines and chunk.doc_path.endswith(_PYTHON_SUFFIXES):
            lines -= self._string_lines(chunk.doc_path)
        return lines

    def _string_lines(self, doc_path: str) -> frozenset[int]:
        """The lines of a Python file that begin inside a triple-quoted string; none where
        the file cannot be put back together from its chunks (a line split into pieces)."""
        if doc_path not in self._in_strings:
            if self._by_document is None:
                self._by_document = {}
                for chunk in self._chunks:
                    self._by_document.setdefault(chunk.doc_path, []).append(chunk)
            lines: dict[int, str] = {}
            pieces = False
            for chunk in self._by_document[doc_path]:
                pieces = pieces or chunk.char_start > 0 or chunk.span.chars is not None
                for offset, text in enumerate(chunk.text.split("\n")):
                    lines.setdefault(chunk.span.line_start + offset, text)
            text = "\n".join(lines.get(n, "") for n in range(1, max(lines, default=0) + 1))
            self._in_strings[doc_path] = frozenset() if pieces else python_string_lines(text)
        return self._in_strings[doc_path]


_PYTHON_SUFFIXES = (".py", ".pyi", ".pyw")
# What opens a comment or a string in Python, or ends a line
_PYTHON_OPENER = re.compile(r"#[^\n]*|\"\"\"|'''|\"|'|\n")
# ... and what closes each string: its quote unescaped (a one-line string ends at its line)
_PYTHON_CLOSER = {
    '"""': re.compile(r'(?:[^\\"]|\\.|"(?!""))*"""', re.DOTALL),
    "'''": re.compile(r"(?:[^\\']|\\.|'(?!''))*'''", re.DOTALL),
    '"': re.compile(r'(?:[^\\"\n]|\\.)*"', re.DOTALL),
    "'": re.compile(r"(?:[^\\'\n]|\\.)*'", re.DOTALL),
}


def python_string_lines(text: str) -> frozenset[int]:
    """The 1-based lines of Python source that begin inside a triple-quoted string (a
    docstring's or a code sample's lines after its first). Comments and one-line strings
    are stepped over, so a quote inside them opens nothing; a string left open runs to the
    end of its line (one-line) or of the text (triple-quoted)."""
    inside: set[int] = set()
    line, pos = 1, 0
    while (m := _PYTHON_OPENER.search(text, pos)) is not None:
        token, pos = m.group(), m.end()
        if token == "\n":
            line += 1
        elif token[0] != "#":
            closed = _PYTHON_CLOSER[token].match(text, pos)
            if closed is not None:
                end = closed.end()
            elif len(token) == 3:
                end = len(text)
            else:
                end = text.find("\n", pos) if "\n" in text[pos:] else len(text)
            breaks = text.count("\n", pos, end)
            if len(token) == 3:
                inside.update(range(line + 1, line + breaks + 1))
            line, pos = line + breaks, end
    return frozenset(inside)


# Prose, where `_C_FUNCTION` and its kind read sentences as definitions ("Install click (pip
# install click)" defined `click`): only the class/def/fn forms and constants count there.
_PROSE_SUFFIXES = (".md", ".markdown", ".rst", ".txt", ".html", ".htm", ".xhtml", ".pdf", ".adoc", ".tex")


def _definitions(chunk: Chunk, name: str) -> list[re.Match[str]]:
    """The matches in the chunk's text that define `name` (the name their group 1)."""
    text = chunk.text
    if name not in text or ("\n" not in text and len(text) > 2000):
        return []  # (one long line: data or a bundle, not definitions)
    prose = chunk.doc_path.lower().endswith(_PROSE_SUFFIXES)
    patterns = (_DEFINED, _CONSTANT) if prose else (_DEFINED, _CONSTANT, *_OTHER_DEFINITIONS)
    return [m for pattern in patterns for m in pattern.finditer(text) if m.group(1) == name]
