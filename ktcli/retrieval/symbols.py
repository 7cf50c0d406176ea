"""Where code defines the names a question asks about.

"Which file defines class ProgressBar?" found neither click's `class ProgressBar:` nor its
file among the eight chunks retrieved: the name comes back in dozens of chunks that use it,
and BM25 and the embedder rank a use as high as the definition. A chunk that defines a
name the question spells as code is what such a question asks for, so the retriever
gives it a bonus (`retriever.DEFINITION_BONUS`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from ktcli.types import Chunk

# class / def / function / fn / func / struct ... NAME, as most languages write a definition
_DEFINED = re.compile(
    r"^[ \t]*(?:(?:export|default|pub(?:\([\w:]+\))?|public|private|protected|internal|static|abstract|final|"
    r"async|unsafe|extern|inline|virtual|sealed|data|open)\s+)*"
    r"(?:class|def|function|fn|func(?:\s*\([^)]*\))?|struct|enum|interface|trait|type|module|object|record|"
    r"macro_rules!|defmacro|defun|sub)\s+([A-Za-z_$][\w$]*)",
    re.MULTILINE,
)
# a constant assigned at the start of a line: TAX_RATE = 0.2, const MAX_SIZE: usize = 8
_CONSTANT = re.compile(r"^[ \t]*(?:(?:export|pub|const|let|var|static|final|readonly)\s+)*([A-Z][A-Z0-9_]{3,})\s*[:=]",
                       re.MULTILINE)
# a name as a question writes code: CamelCase, snake_case, or ending in ()
_CODE_NAME = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*[a-z0-9][A-Z][A-Za-z0-9_]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9_]*|"
                        r"[A-Z]{2,}[a-z][A-Za-z0-9_]*|"
                        r"[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+|[A-Za-z_]\w{2,}(?=\(\)))")
# A name defined in more chunks than this is a common one (`__init__`, `run`): no signal.
MAX_DEFINITIONS = 3


def code_names(question: str) -> set[str]:
    """The names in a question written as code identifiers."""
    return {m.group(1) for m in _CODE_NAME.finditer(question) if len(m.group(1)) >= 4}


class SymbolTable:
    """Name -> the chunks that define it, built on the first question that names code."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self._chunks = chunks
        self._defined: dict[str, list[int]] | None = None

    def defining(self, names: set[str]) -> set[int]:
        """Indices of the chunks defining any of `names` (those defined in at most
        MAX_DEFINITIONS chunks)."""
        if not names:
            return set()
        if self._defined is None:
            self._defined = _definitions(self._chunks)
        out: set[int] = set()
        for name in names:
            where = self._defined.get(name, [])
            if len(where) <= MAX_DEFINITIONS:
                out.update(where)
        return out


def _definitions(chunks: Sequence[Chunk]) -> dict[str, list[int]]:
    defined: dict[str, list[int]] = defaultdict(list)
    for i, chunk in enumerate(chunks):
        if "\n" not in chunk.text and len(chunk.text) > 2000:
            continue  # one long line: data or a bundle, not definitions
        for pattern in (_DEFINED, _CONSTANT):
            for m in pattern.finditer(chunk.text):
                if not defined[m.group(1)] or defined[m.group(1)][-1] != i:
                    defined[m.group(1)].append(i)
    return dict(defined)
