"""Command-line options a question names ("what does -S do?") and the lines that are their
entries ("-S  sort by file size", "-r, --reverse"). BM25 reads "-S" as the term "s", the
same as "-s" and every "'s", so neither ranking can tell an option's entry from the rest of
a man page or a --help text; these can, case and dashes kept."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

# A command-line option as a question writes it: "-S", "--sort", "--block-size" (a dash
# after a space, a quote, a backtick or a bracket and before a letter: not "e-mail", "-5",
# "well-known", "$-placeholder").
_ASKED_OPTION = re.compile(r"(?<![^\s\"'`(\[])(--?[A-Za-z][\w-]*)(?![\w-])")
# A digit alone is an option too ("what does xargs -0 do?", ls's -1), where the question
# asks what something does or means or names an option or flag: "Is -5 low?" asks of a
# figure. (Not read as one, "-0" was no option, and xargs's page quoted nothing.)
_ASKED_DIGIT = re.compile(r"(?<![^\s\"'`(\[])(-\d)(?![\w.,%-])")
_ASKS_OF_AN_OPTION = re.compile(r"\b(?:do|does|did|doing|mean|means|option|options|flag|flags|switch)\b", re.I)
# An option as an option list writes it: "-a", "--all", and a digit alone ("-0, --null",
# "-1  list one file per line") before a comma, two spaces or the line's end, not a figure
# ("-5 degrees").
_OPTION = r"(?:--?[A-Za-z][\w-]*|-\d(?=,|\s{2}|\s*$))"
# An option's value joined to it: "--block-size=SIZE", "-F, --classify[=WHEN]", sed's
# "-i[SUFFIX]" (to a comma or a space, not over it: `\S*` could end before or after each
# ", " of "-a=b, -c=d, ...", 2^n ways to fail, and a line of 25 such took 87 s in `_ALONE`)
_VALUE = r"(?:\[?=[^\s,]*|\[[^\s,=\]]*\])?"
# An option's argument as an entry writes it: "port" in "-p port", "<file>" in "-o, --output <file>"
_ARGUMENT = r"(?:<[^>\s]*>|[^\s,<-][^\s,]*)"
# The options a line opens with, its own entry: "-a, --all", "-S  sort by", "-p port Port",
# "--block-size=SIZE", "-F, --classify[=WHEN]".
# "-d delim, --delimiter=delim" (an argument before a comma, another option after it),
# "-i[SUFFIX], --in-place[=SUFFIX]" (sed's)
OPTION_HEAD = re.compile(rf"(?:{_OPTION}{_VALUE}(?:\s+{_ARGUMENT},)?,?\s+)+")
# An entry's options and their arguments, where two spaces or more part them from what the
# option does: "-p port  Port to connect to", "-o, --output <file>  Write output to <file>",
# "-d delim, --delimiter=delim  Input items are terminated by ..." (`key_lines.lines_of`
# joins a man page's option line to its indented text so).
_HEAD_AND_ARGUMENTS = (rf"{_OPTION}{_VALUE}(?: {_ARGUMENT})?"
                       rf"(?:,\s*{_OPTION}{_VALUE}(?: {_ARGUMENT})?)*")
OPTIONS_AND_ARGUMENTS = re.compile(rf"\s*({_HEAD_AND_ARGUMENTS}) {{2,}}(\S.*)", re.S)


def asked_options(question: str) -> set[str]:
    """The command-line options a question names, case kept ("-S" is not "-s")."""
    asked = set(_ASKED_OPTION.findall(question))
    if _ASKS_OF_AN_OPTION.search(question):
        asked |= set(_ASKED_DIGIT.findall(question))
    return asked


@functools.lru_cache(maxsize=64)
def _option_pattern(option: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-]){re.escape(option)}(?![\w-])")


def writes_option(line: str, option: str) -> bool:
    return _option_pattern(option).search(line) is not None


def defines_option(line: str, option: str) -> bool:
    """Whether `line` opens with `option` among the options it is the entry of."""
    head = OPTION_HEAD.match(line.lstrip() + " ")
    return head is not None and writes_option(head.group(), option)


# An option list's entry as a line: its options alone ("-a, --all"), with one argument
# ("-p port", "--block-size=SIZE"), or with what it does after two spaces or more ("-S  sort
# by file size", a --help text's "  -a, --all     do not ignore"); not a sentence that a
# line break left starting with a dash ("-m pip install --upgrade`` to upgrade ...").
# (gzip writes its options with no commas: "-d --decompress --uncompress")
_ALONE = (rf"\s*{_OPTION}{_VALUE}(?:\s+{_ARGUMENT}(?=,))?"
          rf"(?:(?:,\s*|\s+(?=-)){_OPTION}{_VALUE}"
          rf"(?:\s+{_ARGUMENT}(?=,))?)*(?:\s+[^\s-]\S*)?\s*$")
_OPTIONS_ALONE = re.compile(_ALONE)
# (the options and their arguments, then two spaces: a man page's justified line "-o,
# --output or -O, --remote-name options. If curl  is  given" is prose)
_ENTRY = re.compile(rf"{_ALONE}|\s*{_HEAD_AND_ARGUMENTS} {{2,}}\S")


def is_entry(line: str) -> bool:
    """Whether `line` is an option list's entry (`_ENTRY`, its options first): where a --help
    text's next entry starts, with no blank line before it."""
    return _ENTRY.match(line) is not None and OPTION_HEAD.match(line.lstrip() + " ") is not None


def entry_of(unit: str, option: str) -> bool:
    """Whether `unit` (a line, or `key_lines.lines_of`'s unit) is `option`'s own entry: an
    entry (`is_entry`) that opens with it. A sentence that opens with it is not: curl's
    "-o, --output can be used several times in a command line" was quoted as -o's entry
    (probe 132)."""
    return is_entry(unit) and defines_option(unit, option)


def options_alone(line: str) -> bool:
    """Whether `line` is an entry's options (and their arguments) with nothing said of them,
    as a man page writes them over the indented lines that say what they do ("-f, --force",
    "-p port", "-o, --output <file>")."""
    return _OPTIONS_ALONE.match(line) is not None and is_entry(line)


class OptionEntries:
    """Option -> the indexes of the chunks holding its entry (`_ENTRY`) where it starts a
    paragraph or the chunk, as an option list's entries do; each option's looked up once
    per index, as `symbols.SymbolTable` does a name (every chunk's text was scanned again
    on every question naming an option)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = texts
        self._found: dict[str, frozenset[int]] = {}

    def defining(self, options: set[str]) -> set[int]:
        out: set[int] = set()
        for option in options:
            if option not in self._found:
                self._found[option] = frozenset(i for i, text in enumerate(self._texts)
                                                if writes_option(text, option) and _opens_an_entry(text, option))
            out |= self._found[option]
        return out


def _opens_an_entry(text: str, option: str) -> bool:
    before = ""
    for line in text.splitlines():
        if not before.strip() and _ENTRY.match(line) and defines_option(line, option):
            return True
        before = line
    return False
