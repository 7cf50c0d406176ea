"""Evidence assembly: merge neighbouring chunks, keep source order, pack into windows."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from ktcli.errors import UsageError
from ktcli.pipeline import prompts
from ktcli.types import Chunk


def refuse_named_full(mode: str, prompt_tokens: int, window: int, answer_tokens: int) -> None:
    """--mode full asked for by name, and the exact count does not fit: not ours to swap for
    another mode (a summary read in parts where the user had asked for a whole read)."""
    if mode == "full":
        raise UsageError(
            f"--mode full: the input is {prompt_tokens:,} tokens but the model's window is {window:,} (with "
            f"{answer_tokens} kept for the answer); use --mode auto, retrieval or sparse"
        )


def source_order(chunks: list[Chunk], doc_rank: dict[str, int]) -> list[Chunk]:
    """Sort by document (in corpus order) then position inside it."""
    return sorted(chunks, key=lambda c: (doc_rank.get(c.doc_path, 1 << 30), c.ordinal))


# A line that holds a sentence's end: a stop, maybe closed by quotes or brackets, before a
# space or the line's end.
_SENTENCE_END = re.compile(r"[.!?。！？][\"'”’)\]]*(?:\s|$)")
_ENDS_SENTENCE = tuple(".!?:;\"'”’»)。！？")
_MAX_CARRIED_LINES = 3  # of a sentence's other half carried over a page break


def across_page_breaks(passages: list[Chunk], chunks: Sequence[Chunk], count: Callable[[str], int]) -> list[Chunk]:
    """`passages` (in source order), each PDF page's last chunk that stops mid-sentence
    with the next page's lines up to that sentence's end, and each page's first chunk that
    starts mid-sentence with the previous page's lines from its start (up to
    _MAX_CARRIED_LINES; none where the other half is not found so near). A PDF's chunks
    stay within a page, so a sentence over a page break was cut in two, and the model read
    "... the lease was signed by the" without "board on 3 March." Where the neighbouring
    chunk is retrieved too, both are read in a row and nothing is carried. The passage
    keeps its page (a citation names the page most of it is on)."""
    retrieved = {(c.doc_path, c.ordinal) for c in passages}
    by_key: dict[tuple[str, int], Chunk] | None = None
    out = []
    for chunk in passages:
        if chunk.span.page is None or chunk.span.unit or not _whole_lines(chunk):
            out.append(chunk)  # not a PDF's page (an EPUB's chapter, a Word file's ¶s)
            continue
        if by_key is None:
            by_key = {(c.doc_path, c.ordinal): c for c in chunks if c.span.page is not None}
        after = by_key.get((chunk.doc_path, chunk.ordinal + 1))
        before = by_key.get((chunk.doc_path, chunk.ordinal - 1))
        if after is not None and (chunk.doc_path, after.ordinal) not in retrieved and _continues(chunk, after):
            chunk = _with_lines_after(chunk, after, count)
        if before is not None and (chunk.doc_path, before.ordinal) not in retrieved and _continues(before, chunk):
            chunk = _with_lines_before(chunk, before, count)
        out.append(chunk)
    return out


def _with_lines_after(chunk: Chunk, after: Chunk, count: Callable[[str], int]) -> Chunk:
    """`chunk` with `after`'s first lines up to the one that ends a sentence (none where
    no line of the first _MAX_CARRIED_LINES does)."""
    lines = after.text.split("\n")
    carried = next((k + 1 for k, line in enumerate(lines[:_MAX_CARRIED_LINES]) if _SENTENCE_END.search(line)), 0)
    if not carried:
        return chunk
    text = chunk.text + "\n" + "\n".join(lines[:carried])
    return replace(chunk, text=text, n_tokens=count(text),
                   span=replace(chunk.span, line_end=chunk.span.line_end + carried))  # type: ignore[operator]


def _with_lines_before(chunk: Chunk, before: Chunk, count: Callable[[str], int]) -> Chunk:
    """`chunk` with `before`'s last lines from the sentence start they hold: after the last
    line that ends a sentence, or that line itself where a sentence starts within it
    (none where no line of the last _MAX_CARRIED_LINES ends one)."""
    tail = before.text.split("\n")[-_MAX_CARRIED_LINES:]
    ends = [k for k, line in enumerate(tail) if _SENTENCE_END.search(line)]
    if not ends:
        return chunk
    carried = tail[ends[-1] + 1 if tail[ends[-1]].rstrip().endswith(_ENDS_SENTENCE) else ends[-1]:]
    if not carried:
        return chunk
    text = "\n".join(carried) + "\n" + chunk.text
    return replace(chunk, text=text, n_tokens=count(text),
                   span=replace(chunk.span, line_start=chunk.span.line_start - len(carried)))  # type: ignore[operator]


def _continues(a: Chunk, b: Chunk) -> bool:
    """Whether `b`, the first chunk of the page after `a`'s, goes on with a sentence that
    `a`, the last of its page, leaves open: `a`'s last line ends without a stop (and is no
    table row), `b`'s first starts in lower case, and their lines follow each other."""
    if b.span.page != (a.span.page or 0) + 1 or not (_whole_lines(a) and _whole_lines(b)):
        return False
    if b.span.line_start != a.span.line_end + 1:  # type: ignore[operator]
        return False
    last, first = a.text.rstrip().rpartition("\n")[2].rstrip(), b.text.lstrip().partition("\n")[0]
    return bool(last) and not last.endswith(_ENDS_SENTENCE) and " | " not in last and first[:1].islower()


def merge_neighbours(chunks: list[Chunk], max_tokens: int, count: Callable[[str], int]) -> list[Chunk]:
    """Join chunks that follow each other in one document, dropping the overlapping lines,
    so the model does not read the same lines twice. Input must be in source order."""
    out: list[Chunk] = []
    last: list[int] = []  # the ordinal of the last chunk merged into each passage
    for chunk in chunks:
        prev = out[-1] if out else None
        if prev is not None and (text := _pieces_joined(prev, last[-1], chunk)) is not None:
            n = count(text)
            if n <= max_tokens:
                chars = (prev.span.chars[0], chunk.span.chars[1]) if prev.span.chars and chunk.span.chars else None
                out[-1] = replace(prev, text=text, n_tokens=n, span=replace(prev.span, chars=chars))
                last[-1] = chunk.ordinal
                continue
        if prev is not None and _adjacent(prev, last[-1], chunk) and _whole_lines(prev):
            extra = _lines_after(chunk, prev.span.line_end)  # type: ignore[arg-type]
            if extra is not None:
                # Line k of the passage stays line k of its span: the text is joined as it
                # is. Stripping the first chunk's trailing blank lines (the chunker likes to
                # end before a heading) moved every later line up, in what the model read
                # and in the lines its citations were matched to.
                text = prev.text + "\n" + extra
                n = count(text)
                if n <= max_tokens:
                    span = replace(prev.span, line_end=chunk.span.line_end, chars=None)  # whole lines now
                    out[-1] = replace(prev, text=text, span=span, n_tokens=n)
                    last[-1] = chunk.ordinal  # a third neighbour joins too, not read twice
                    continue
        out.append(chunk)
        last.append(chunk.ordinal)
    return out


def _pieces_joined(a: Chunk, a_last_ordinal: int, b: Chunk) -> str | None:
    """Two pieces of one long line in a row (`ingest.chunking` splits a line past the chunk
    size into pieces that share an eighth), joined without the text they share, by where
    each starts in the line; None for anything else. A summary of a 593K-character one-line
    file read 14% of it twice."""
    one_line = a.span.line_start == a.span.line_end == b.span.line_start == b.span.line_end
    if not (one_line and a.doc_path == b.doc_path and b.ordinal == a_last_ordinal + 1 and a.span.page == b.span.page):
        return None
    shared = a.char_start + len(a.text) - b.char_start  # `a` may be pieces joined already: it starts at the first
    if not 0 <= shared <= len(b.text) or b.char_start <= a.char_start:
        return None
    return a.text + b.text[shared:]


def _adjacent(a: Chunk, a_last_ordinal: int, b: Chunk) -> bool:
    return (
        a.doc_path == b.doc_path
        and b.ordinal == a_last_ordinal + 1
        and a.span.page == b.span.page
        and a.span.line_end is not None
        and b.span.line_start is not None
        and b.span.line_start <= a.span.line_end + 1
        and b.span.line_end > a.span.line_end  # type: ignore[operator]
    )


def _whole_lines(chunk: Chunk) -> bool:
    """Whether `chunk`'s text is its span's lines, one for one (not a piece of a split
    long line, whose text and line numbers differ)."""
    return len(chunk.text.split("\n")) == chunk.span.line_end - chunk.span.line_start + 1  # type: ignore[operator]


def _lines_after(chunk: Chunk, last_line: int) -> str | None:
    """The part of `chunk` after document line `last_line`; None if lines don't line up."""
    if not _whole_lines(chunk):
        return None
    return "\n".join(chunk.text.split("\n")[last_line - chunk.span.line_start + 1:])


def as_read(passages: list[Chunk]) -> str:
    """`passages` as the model reads them, in their source tags, numbered with the widest
    label a window takes: what packing and the exact window checks count."""
    return prompts.passages(passages, 999)


def pack(passages: list[Chunk], budget: int, count: Callable[[str], int]) -> list[list[Chunk]]:
    """Greedy packing in order; each window's passages total at most `budget` tokens as
    the model reads them, in their source tags (a passage larger than the budget gets a
    window of its own)."""
    windows: list[list[Chunk]] = []
    current: list[Chunk] = []
    used = 0
    for p in passages:
        # The tag with its path is 20-50 tokens, not the 12 once assumed: a summary of 400
        # small files packed 8.9-9.4K-token prompts into an 8K window.
        n = count(as_read([p])) + 1  # + the blank line between blocks
        if current and used + n > budget:
            windows.append(current)
            current, used = [], 0
        current.append(p)
        used += n
    if current:
        windows.append(current)
    return windows


def refit(windows: list[list[Chunk]], fits: Callable[[list[Chunk]], bool]) -> list[list[Chunk]]:
    """`windows`, each checked whole with the exact count of its prompt (`fits`): one that
    is over is cut after the most passages that fit, the rest becoming the next window.
    Packing counts passages one by one and the prompt's other parts by a fixed
    allowance, so this is what keeps a window's prompt inside the model's window."""
    out: list[list[Chunk]] = []
    queue = list(windows)
    while queue:
        window = queue.pop(0)
        keep = len(window)
        while keep > 1 and not fits(window[:keep]):
            keep -= 1
        if keep == 1 and not fits(window[:1]):  # no cut helps: the engine would fail with its cache full
            raise UsageError(f"a passage of the input ({window[0].span.cite()}) does not fit the model's window beside "
                             "the prompt and the answer: give a smaller --chunk-tokens or --max-new-tokens")
        out.append(window[:keep])
        if keep < len(window):
            queue.insert(0, window[keep:])
    return out
