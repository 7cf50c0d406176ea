"""Evidence assembly: merge neighbouring chunks, keep source order, pack into windows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ktcli.types import Chunk, Span


def source_order(chunks: list[Chunk], doc_rank: dict[str, int]) -> list[Chunk]:
    """Sort by document (in corpus order) then position inside it."""
    return sorted(chunks, key=lambda c: (doc_rank.get(c.doc_path, 1 << 30), c.ordinal))


def merge_neighbours(chunks: list[Chunk], max_tokens: int, count: Callable[[str], int]) -> list[Chunk]:
    """Join chunks that follow each other in one document, dropping the overlapping lines,
    so the model does not read the same lines twice. Input must be in source order."""
    out: list[Chunk] = []
    for chunk in chunks:
        prev = out[-1] if out else None
        if prev is not None and _adjacent(prev, chunk):
            extra = _lines_after(chunk, prev.span.line_end)  # type: ignore[arg-type]
            if extra is not None:
                text = prev.text.rstrip("\n") + ("\n" + extra if extra else "")
                n = count(text)
                if n <= max_tokens:
                    span = Span(prev.span.path, prev.span.line_start, chunk.span.line_end, prev.span.page)
                    out[-1] = replace(prev, text=text, span=span, n_tokens=n)
                    continue
        out.append(chunk)
    return out


def _adjacent(a: Chunk, b: Chunk) -> bool:
    return (
        a.doc_path == b.doc_path
        and b.ordinal == a.ordinal + 1
        and a.span.page == b.span.page
        and a.span.line_end is not None
        and b.span.line_start is not None
        and b.span.line_start <= a.span.line_end + 1
        and b.span.line_end > a.span.line_end  # type: ignore[operator]
    )


def _lines_after(chunk: Chunk, last_line: int) -> str | None:
    """The part of `chunk` after document line `last_line`; None if lines don't line up."""
    lines = chunk.text.split("\n")
    start = chunk.span.line_start
    expected = chunk.span.line_end - start + 1  # type: ignore[operator]
    if len(lines) != expected:  # a split long line: text and line numbers differ
        return None
    return "\n".join(lines[last_line - start + 1:])


def pack(passages: list[Chunk], budget: int, count: Callable[[str], int]) -> list[list[Chunk]]:
    """Greedy packing in order; each window's passages total at most `budget` tokens
    (a passage larger than the budget gets a window of its own)."""
    windows: list[list[Chunk]] = []
    current: list[Chunk] = []
    used = 0
    for p in passages:
        n = count(p.text) + 12  # label and reference line
        if current and used + n > budget:
            windows.append(current)
            current, used = [], 0
        current.append(p)
        used += n
    if current:
        windows.append(current)
    return windows
