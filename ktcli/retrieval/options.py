"""Command-line options a question names ("what does -S do?") and the lines that are their
entries ("-S  sort by file size", "-r, --reverse"). BM25 reads "-S" as the term "s", the
same as "-s" and every "'s", so neither ranking can tell an option's entry from the rest of
a man page or a --help text; these can, case and dashes kept."""

from __future__ import annotations

import functools
import re

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


def defining_chunks(texts, options: set[str]) -> set[int]:
    """The indexes of the texts with a line that is the entry of one of `options` (`_ENTRY`),
    starting a paragraph or the text, as an option list's entries do."""
    if not options:
        return set()
    found = set()
    for i, text in enumerate(texts):
        if not any(writes_option(text, o) for o in options):
            continue
        before = ""
        for line in text.splitlines():
            if not before.strip() and _ENTRY.match(line) and any(defines_option(line, o) for o in options):
                found.add(i)
                break
            before = line
    return found
