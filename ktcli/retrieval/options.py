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
# The options a line opens with, its own entry: "-a, --all", "-S  sort by", "-p port Port",
# "--block-size=SIZE", "-F, --classify[=WHEN]".
OPTION_HEAD = re.compile(r"(?:--?[A-Za-z][\w-]*(?:\[?=[^\s,]*)?,?\s+)+")


def asked_options(question: str) -> set[str]:
    """The command-line options a question names, case kept ("-S" is not "-s")."""
    return set(_ASKED_OPTION.findall(question))


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
_ENTRY = re.compile(r"\s*--?[A-Za-z][\w-]*(?:\[?=\S*)?(?:,\s*--?[A-Za-z][\w-]*(?:\[?=\S*)?)*"
                    r"(?:\s+[^\s-]\S*)?\s*$|\s*--?[A-Za-z][^\n]*? {2,}\S")


def is_entry(line: str) -> bool:
    """Whether `line` is an option list's entry (`_ENTRY`, its options first): where a --help
    text's next entry starts, with no blank line before it."""
    return _ENTRY.match(line) is not None and OPTION_HEAD.match(line.lstrip() + " ") is not None


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
