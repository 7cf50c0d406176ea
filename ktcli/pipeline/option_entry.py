"""Whether an answer about a command-line option says what the option's own entry says.

The key lines quote the entry ("The option -f, --force ignore nonexistent files and
arguments, never prompt"), and the bundled model still answered with another option's
("-f, --force is used to remove directories and their contents recursively", -r's) or with
the page's first line ("-q ... prints the first 10 lines of each file"). Those words all
stand in the man page, so the check against what was read (`citations`, `grounding`) finds
nothing wrong; against the entry alone they stand out.

Measured on 32 option questions over man pages and --help texts (probe 129): on the 64
answers of the bundled model it was tuned on, an answer under ENTRY_WORDS_BELOW of whose own
words stand in the entry was wrong in 18 of the 20 flagged (the other 2 said "reverse", then
"sort files by their size"), and 12 of the 44 others were; on 64 answers written after the
key lines changed, 12 of 17 flagged and 8 of 45 others (2 not judged). A notice, then, not
a verdict: stdout quotes the entry after the answer for the reader to compare
(`render.formats.option_entry_notice`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ktcli.pipeline.key_lines import content_terms, lines_of
from ktcli.retrieval.options import asked_options, entry_of

ENTRY_WORDS_BELOW = 0.25
_OPTION_WORD = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*(?:\[?=\S*)?")
_MIN_OWN_WORDS = 3  # "Yes." or a bare label says too little to judge


@dataclass(frozen=True)
class EntryCheck:
    option: str
    entry: str  # the entry as lines_of reads it: "-S  sort by file size, largest first"
    share: float  # of the answer's own words, those that stand in the entry

    @property
    def unsaid(self) -> bool:
        return self.share < ENTRY_WORDS_BELOW


def _stem(word: str) -> str:
    """A word less its ending, the same for "file", "files" and "filed", "directory" and
    "directories": "files" read "fil" and "file" "file", "uses" "uses" and "use" "use", so
    "removes files" said none of "remove ... file" (probe 132)."""
    if len(word) > 3:
        word = re.sub(r"(?:ing|ed|es|s)$", "", word)
    return re.sub(r"(?<=..)[ey]$", lambda m: "i" if m.group() == "y" else "", word)


def _words(text: str) -> list[str]:
    return [_stem(w) for w in content_terms(_OPTION_WORD.sub(" ", text)) if len(w) > 2 and not w.isdigit()]


def check(question: str, answer: str, texts: Sequence[str]) -> EntryCheck | None:
    """The asked option's entry in `texts` and how much of the answer stands in it; None
    where the question names no one option, or no text holds its entry."""
    options = asked_options(question)
    if len(options) != 1:
        return None
    option = next(iter(options))
    entries = [u for t in texts if option in t for u in lines_of(t) if entry_of(u, option)]
    if not entries:
        return None
    asked = set(_words(question))
    own = [w for w in _words(answer) if w not in asked]
    if len(own) < _MIN_OWN_WORDS:
        return None
    said = {w for e in entries for w in _words(e)}
    # (quoted as one line: a man page's "-f, --force  ignore ..." is parted by two spaces)
    return EntryCheck(option, " ".join(entries[0].split()), sum(w in said for w in own) / len(own))
