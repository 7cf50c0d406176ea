"""A summary's streamed text less what is no summary: lines of HTML markup alone, code
blocks that are not in the source the summary is of, and lines that write ktcli's own
instructions back.

Why: summarizing small repos file by file, the bundled 135M model opened sections with
`<p>` or `<pre><code>`, filled one with `<span class="language-python">` eight times, and
wrote "summaries" of code files that were code of its own: a three-line `posix/_core.py`
became a made-up `def main(): ...` script, `exceptions.py` a reworded copy of its class
under an invented file name. A line of tags alone says nothing; a code block whose lines
are not the source's is made up. A code block mostly copied from the source stays (it is
the source's own text, which a summary may quote).

Prose streams as it comes; a line that opens with a tag or a fence is held until it ends,
and a code block until it closes (or the text ends), then kept or left out whole. A line
that starts as one of the instructions' sentences is held while it still may be one
(`_ECHO_CHARS`): a summary of a 36-page PDF printed "Write the final summary from these
notes: what it is, how it is organised, and the key facts, ..." to stdout (probe 115).
"""

from __future__ import annotations

import functools
import re

from ktcli.pipeline import prompts
from ktcli.pipeline.citations import MARKUP_TAG
from ktcli.retrieval.symbols import defined_name

_FENCE = re.compile(r"\s*(```|~~~)")
# reStructuredText's code directive ("  .. code-block:: python"): its block is the indented
# lines after it
_DIRECTIVE = re.compile(r"\s*\.\. (?:code-block|code|sourcecode)::")
# (a <script> or <style> element is code too, kept only where the source holds it: man-db's
# summary was four copies of `<script type="text/javascript">` / document.write(` / `</script>`)
_PRE_OPEN = re.compile(r"<(?:pre|script|style)\b[^>]*>", re.IGNORECASE)
_PRE_CLOSE = re.compile(r"</(?:pre|script|style)\s*>", re.IGNORECASE)
# A code line this short may be in any source ("}", "return x"): found or not, it says
# little about where the block came from.
_MIN_CODE_CHARS = 8
# A line that repeats this many characters of an instruction's sentence is the instruction
# written back (shorter, it may be a summary's own start: "Summarize" alone is held, then shown).
_ECHO_CHARS = 24
_LIST_MARK = re.compile(r"^[-*#>\s]+")


@functools.lru_cache(maxsize=1)
def _sentences_of_instructions() -> tuple[str, ...]:
    """The sentences of the instructions a summary's prompts hold, folded (`_folded`)."""
    written = " ".join((prompts.SUMMARY_INSTRUCTION, prompts.SUMMARY_NOTES_INSTRUCTION,
                        prompts.SUMMARY_REDUCE_INSTRUCTION, prompts.SYSTEM))
    return tuple(_folded(s) for s in re.split(r"(?<=\.)\s+", written) if s.strip())


def _folded(text: str) -> str:
    """Lowercase, list marks and heading marks off the start, spaces collapsed."""
    return " ".join(_LIST_MARK.sub("", text).lower().split())


# Lead-ins the bundled model writes from the notes instruction, a line of their own: ninja's
# manual was summed up under "The main points of this part are:" (probe 117). Left out only
# as a whole line: "The main points: the build graph ..." goes on with the input's words.
_LEAD_INS = tuple(f"{start}{what}{of}{verb}:" for start in ("", "the ", "here are the ", "these are the ")
                  for what in ("main points", "summary notes", "notes", "final summary", "summary")
                  for of in ("", " of this part", " of the input", " of the content", " so far")
                  for verb in ("", " are", " is"))


def _echo(text: str, ends: bool = False) -> bool | None:
    """Whether a line starting `text` writes an instruction back: True where it repeats
    `_ECHO_CHARS` of one, or is one of `_LEAD_INS` whole (`ends`: the line ends there), None
    while it still may (a prefix of one, shorter), else False."""
    said = _folded(text)
    if said in _LEAD_INS:
        return True if ends else None
    if not ends and any(lead.startswith(said) for lead in _LEAD_INS):
        return None
    for sentence in _sentences_of_instructions():
        if said.startswith(sentence[:_ECHO_CHARS]) and len(sentence) >= _ECHO_CHARS:
            return True
        if sentence.startswith(said):
            return None
    return False


# A line of Markdown images alone, each maybe a link: a README's badges. The bundled model
# summed libcbor's README up as seven lines of `[![codecov](https://codecov.io/...)](...)`,
# its URLs half made up, and nothing else (probe 135). An image says nothing in a terminal.
_IMAGE = r"(?:\[\s*)?!\[[^\]\n]*\]\([^)\n]*\)(?:\s*\]\([^)\n]*\))?"
_IMAGES_ONLY = re.compile(rf"{_IMAGE}(?:[\s,|]*{_IMAGE})*")
_IMAGES_CUT = re.compile(rf"(?:{_IMAGE}[\s,|]*)*(?:\[\s*)?!\[.*")


# How a line of code outside a fence starts: a preprocessor line, a definition, an import,
# a C declaration, a brace, a decorator, a prompt. Lowercase keywords: a summary's prose
# starts with a capital. The bundled model summed alloca.h up as `#define _ALLOCA_H` and
# `#define _ALLOCA_H_` (a name of its own), shown as two headings (probe 135).
_CODE_KEYWORDS = ("#include", "#define", "#undef", "#if", "#else", "#elif", "#endif", "#pragma", "def ", "async def ",
                  "class ", "import ", "from ", "return ", "int ", "void ", "char ", "static ", "const ", "struct ",
                  "typedef ", "extern ", "unsigned ", "@", "{", "}", "$ ", ">>> ")
# The whole line, once it has ended: code, not prose that starts with such a word.
_CODE_LINE = re.compile(
    r"#\s*(?:include|define|undef|ifn?def|if|else|elif|endif|pragma)\b.*"
    r"|(?:async\s+)?def\s+\w+\s*\(.*"
    r"|class\s+\w+\s*(?:\(.*\))?\s*[:{]?"
    r"|import\s+[\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*\s*;?"
    r"|from\s+[\w.]+\s+import\s+[\w*, ()]+"
    r"|return(?:\s+[^.]*)?;?"
    r"|(?:(?:static|const|extern|unsigned|struct|typedef|int|void|char)\s+)+[\w*\s,()\[\]]*[;{)]"
    r"|@\w[\w.]*(?:\(.*\))?"
    r"|[{}][\s;{}]*"
    r"|(?:\$|>>>)\s+\S.*"
    # an indented line of code: a call or an assignment, ending as code does
    r"|[a-z_][\w.]*(?:\(.*\)\s*[;:{]?|\s*=\s*[^=\s].*)")


def _code_start(start: str) -> bool | None:
    """Whether a line starting `start` (its indent off) starts as code: True, None while it
    still may (a prefix of one of `_CODE_KEYWORDS`), else False."""
    if start.startswith(_CODE_KEYWORDS):
        return True
    return None if any(key.startswith(start) for key in _CODE_KEYWORDS) else False


def _may_be_images(start: str) -> bool:
    """Whether a line starting `start` may be Markdown images alone (held to its end)."""
    said = start.strip()
    return said.startswith(("![", "[![", "[ ![")) or said in ("!", "[", "[!", "[ ")


class SummaryLines:
    """Feed streamed pieces, get back the text to show; `flush` at the end."""

    def __init__(self, source: str, under_heading: bool = False) -> None:
        """`under_heading`: the text is a section under a `## path` heading of ktcli's, so
        the model's own headings go one level down (its "## Usage" read as a file of its own)."""
        self._under_heading = under_heading
        self._lines = {line.strip() for line in source.splitlines() if line.strip()}
        self._source = source
        self._defined: set[str] | None = None  # the names the source defines, found when a block needs them
        self._held = ""  # the line being written, while it may be markup or a fence
        self._passing = False  # the line being written is prose, passed on as it comes
        self._blank = False  # a blank line is due before the next one shown
        self._shown_any = False
        self._block: list[str] | None = None  # the code block being held, its lines
        self._closer: re.Pattern[str] = _FENCE
        self.dropped_markup = 0
        self.dropped_blocks = 0
        self.dropped_echoes = 0
        self.dropped_images = 0
        self.dropped_code_lines = 0
        self._collapsed: str | None = None  # the source, its runs of spaces one space
        self._echoing = False  # the line being written is an instruction written back: left out to its end

    def feed(self, piece: str) -> str:
        out = []
        while piece:
            end = piece.find("\n")
            part, piece = (piece, "") if end < 0 else (piece[:end + 1], piece[end + 1:])
            out.append(self._part(part))
        return "".join(out)

    def _part(self, part: str) -> str:
        """A piece of one line (with its line break where it ends the line)."""
        ends = part.endswith("\n")
        if self._passing:
            self._passing = not ends
            return part
        if self._echoing:
            self._echoing = not ends
            return ""
        self._held += part
        start = self._held.lstrip(" \t")
        if self._block is None and start.strip() and start[0] not in "<`~." and not self._held[:1].isspace() \
                and not _may_be_images(start):
            echo = _echo(start, ends)
            if echo:
                self._held, self._echoing = "", not ends
                self.dropped_echoes += 1
                return ""
            if echo is None and not ends:
                return ""  # held while it may still be one
            code = _code_start(start)
            if code is not False:
                # held to its end: a line of code outside any fence (`_line` keeps it where
                # it is the source's), or while it may still start as one ("de", "#")
                if not ends:
                    return ""
                line, self._held = self._held, ""
                return self._show(self._line(line))
            # prose: shown as it comes (only a line that opens with a tag, a fence, a
            # directive or an indent waits for its end)
            shown, self._held = self._held, ""
            self._passing = not ends
            if self._under_heading and shown.startswith("#"):
                shown = "#" + shown
            return self._show(shown)
        if not ends:
            return ""
        line, self._held = self._held, ""
        return self._show(self._line(line))

    def _show(self, text: str) -> str:
        """`text` with blank lines collapsed: one between what is shown, none at the start
        (a left-out line of tags leaves its blank lines behind)."""
        if not text.strip():
            self._blank = self._blank or (bool(text) and self._shown_any)
            return ""
        head = "\n" if self._blank else ""
        self._blank, self._shown_any = False, True
        return head + text

    def flush(self) -> str:
        held, self._held = self._held, ""
        if self._block is None and _IMAGES_CUT.fullmatch(held.strip()):
            # images cut off mid-link where the text ended (--max-new-tokens): a badge line still
            self.dropped_images += 1
            held = ""
        shown = self._show(self._line(held)) if held else ""
        if self._block is not None:
            shown += self._show(self._end_block())
        return shown

    def _line(self, line: str) -> str:
        if self._block is not None:
            if self._closer is _DIRECTIVE and line.strip() and not line[:1].isspace():
                return self._end_block() + self._line(line)  # the indented block ended before this line
            self._block.append(line)
            # (the bundled model opened blocks with <pre><code> and closed some with a fence)
            closes = self._closer is not _DIRECTIVE and (
                _FENCE.match(line) or (self._closer is _PRE_CLOSE and _PRE_CLOSE.search(line)))
            return self._end_block() if closes else ""
        fence = _FENCE.match(line)
        pre = _PRE_OPEN.search(line)
        if fence or _DIRECTIVE.match(line) or (pre and not _PRE_CLOSE.search(line, pre.end())):
            # an opening: what the line holds after it is the block's first line
            self._block, self._closer = [line], _FENCE if fence else _DIRECTIVE if _DIRECTIVE.match(line) else _PRE_CLOSE
            return ""
        if line.strip() and not MARKUP_TAG.sub("", line).strip():
            self.dropped_markup += 1
            return ""
        if _IMAGES_ONLY.fullmatch(line.strip()):
            self.dropped_images += 1
            return ""
        if _CODE_LINE.fullmatch(line.strip()) and not self._line_from_source(line):
            self.dropped_code_lines += 1
            return ""
        return line

    def _line_from_source(self, line: str) -> bool:
        """Whether a line of code outside a fence is the source's own (a whole run of its
        words, spaces aside) and defines no name the source does not."""
        said = " ".join(MARKUP_TAG.sub("", line).split())
        name = defined_name(said)
        if name and name not in self._names_defined():
            return False
        if self._collapsed is None:
            self._collapsed = " ".join(self._source.split())
        return re.search(rf"(?<!\w){re.escape(said)}(?!\w)", self._collapsed) is not None

    def _end_block(self) -> str:
        block, self._block = self._block or [], None
        if not self._from_source(block):
            self.dropped_blocks += 1
            return ""
        return "".join(block) if self._closer is not _PRE_CLOSE else _fenced(block)

    def _from_source(self, block: list[str]) -> bool:
        """Whether most of the block's code lines (tags, fences and blank lines aside) are
        the source's own."""
        code = [MARKUP_TAG.sub("", line).strip() for line in block]
        code = [c for c in code if c and not _FENCE.match(c) and not _DIRECTIVE.match(c)]
        code = [c.removeprefix("```").removeprefix("~~~") for c in code]
        telling = [c for c in code if len(c) >= _MIN_CODE_CHARS]
        if not telling:
            return False  # tags and fences only, or a line or two of nothing much
        # A block that defines a name the source never defines is made up however much of it
        # is copied: idna's compat.py came back as `def to_ascii(`, `def to_unicode(` (it
        # defines ToASCII and ToUnicode) around its own docstrings, ToUnicode's body turned
        # into `return encode(label)`, and half its lines being the source's kept it.
        if any(name not in self._names_defined() for c in code if (name := defined_name(c))):
            return False
        found = sum(c in self._lines or c in self._source for c in telling)
        return 2 * found >= len(telling)

    def _names_defined(self) -> set[str]:
        if self._defined is None:
            self._defined = {name for line in self._lines if (name := defined_name(line))}
        return self._defined

    @property
    def dropped_any(self) -> bool:
        return bool(self.dropped_blocks or self.dropped_markup or self.dropped_echoes or self.dropped_images
                    or self.dropped_code_lines)

    def said(self, subject: str) -> str:
        """What was left out, as one warning ("" for nothing)."""
        parts = []
        if self.dropped_blocks:
            parts.append(f"{self.dropped_blocks} code block(s) that are not in the input (made up by the model)")
        if self.dropped_code_lines:
            parts.append(f"{self.dropped_code_lines} line(s) of code outside a code block that are not in the input "
                         "(made up by the model)")
        if self.dropped_markup:
            parts.append(f"{self.dropped_markup} line(s) of HTML tags alone")
        if self.dropped_images:
            parts.append(f"{self.dropped_images} line(s) of Markdown images (badges) alone")
        if self.dropped_echoes:
            parts.append(f"{self.dropped_echoes} line(s) writing ktcli's instructions back")
        return f"left out of {subject}: {' and '.join(parts)}" if parts else ""


def made_up_blocks(text: str, sources: list[str]) -> int:
    """How many fenced code blocks of an answer are not in `sources` (as a summary's are
    left out: `SummaryLines`). An answer's are shown as they stream, and a user may ask for
    code, so they are counted to be said, not dropped."""
    # (a <script> or <pre> block too: asked for employee turnover, the bundled model answered
    # `<script>document.write(`<h1>Employee Turnover:</h1>`);</script>` and nothing was said)
    if "```" not in text and "~~~" not in text and not _PRE_OPEN.search(text):
        return 0
    lines = SummaryLines("\n".join(sources))
    lines.feed(text)
    lines.flush()
    return lines.dropped_blocks


def _fenced(block: list[str]) -> str:
    """A <pre><code> block as a fenced one, its tags gone (a terminal shows them as text):
    its lines of tags alone (the opening and closing ones) dropped, tags inside lines taken
    out, a fence put at each end."""
    out = []
    for raw in block:
        bare = MARKUP_TAG.sub("", raw)
        if raw.strip() and not bare.strip():
            continue
        out.append(bare if bare.endswith("\n") else bare + "\n")
    if not (out and _FENCE.match(out[0])):
        out.insert(0, "```\n")
    if len(out) > 1 and _FENCE.match(out[-1]):
        out[-1] = "```\n"  # the model's own closing fence
    else:
        out.append("```\n")
    return "".join(out)
