"""Token-aware, overlapping chunks that never cut a line and always know their source.

Each distinct line is tokenised once; chunk sizes then come from prefix sums, so a
4 MB document costs one pass of the tokenizer plus cheap arithmetic.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from ktcli.errors import UsageError
from ktcli.ingest.sections import RST_UNDERLINE, document_trails, paged_trails
from ktcli.ingest.tokens import encoding
from ktcli.types import TABLE_TRAIL, Chunk, Corpus, Document, Page, Span

# A chunk may end early at a nicer boundary, but must then hold at least this share of
# the budget: otherwise a heading every few lines would shred the text into crumbs.
_MIN_FILL = 0.5

_MARKDOWN_HEADING = re.compile(r"#{1,6}\s")
# Kinds whose "# " lines are headings for sure (Markdown's, and what the HTML, Word, ODT and
# EPUB readers write): in a text file or piped text they are a script's comments as often.
_HEADED_KINDS = frozenset({"markdown", "html", "docx", "odt", "epub"})
_TOP_LEVEL_DEF = re.compile(
    r"(@|(async\s+)?def\s|class\s|(pub(\(\w+\))?\s+)?(fn|struct|enum|trait|impl|mod)\b|impl\b|func\s|"
    r"function\s|(export\s+)?(default\s+)?(async\s+)?(function|class|interface|type|const)\s|"
    r"(public|private|protected|static)\s|package\s|import\s|from\s\S+\simport\s|#include\s|template\s*<)"
)


@dataclass(frozen=True)
class _Piece:
    """One chunk before it is numbered: lines [start, end) of a segment (0-based)."""

    start: int
    end: int
    text: str
    n_tokens: int
    char_start: int = 0  # a piece of a split long line: where in the line it starts


def chunk_corpus(corpus: Corpus, *, chunk_tokens: int = 256, overlap_tokens: int = 32) -> list[Chunk]:
    chunks: list[Chunk] = []
    # One count of each distinct line across the documents, not each: a repo's files share
    # most of their short lines ("        return None", "    }", docstring quotes), a fifth
    # of the lines the stdlib's 660 modules had tiktoken encode again, file after file.
    counter = LineTokens()
    for document in corpus.documents:
        chunks.extend(chunk_document(document, chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens,
                                     counter=counter))
    return chunks


def chunk_document(doc: Document, *, chunk_tokens: int = 256, overlap_tokens: int = 32,
                   counter: LineTokens | None = None) -> list[Chunk]:
    """Chunks of at most `chunk_tokens` (tiktoken estimate), each starting about
    `overlap_tokens` before the previous one ended. A line longer than the budget is
    split, at sentence ends where it can be (`_split_long_line`), into chunks whose span
    names that line and their characters in it. PDF chunks stay within one page;
    whitespace-only pages get none."""
    _check_budget(chunk_tokens, overlap_tokens)
    counter = counter if counter is not None else LineTokens()
    chunks: list[Chunk] = []
    # A PDF: the sections its bookmarks or numbered headings start on each page (no styles
    # in its text to tell a heading by). Other paged documents (Word's pages, an EPUB's
    # chapters) have their headings in their text. Either way a section runs on from one
    # page to the next: the trails of the whole text.
    lines_of_doc = _split_lines(doc.text)
    trails = (paged_trails(doc.pages, lines_of_doc) if doc.kind == "pdf"
              else document_trails(doc.path, doc.kind, lines_of_doc, doc.language))
    headed = doc.kind in _HEADED_KINDS
    for segment in _segments(doc):
        page, line_offset = segment.number, segment.line_offset
        lines = _split_lines(segment.text)
        code = doc.kind == "code"
        breaks = _break_scores(lines, code=code)
        records = _record_starts(lines) if segment.number is None and trails.at(1).startswith(TABLE_TRAIL) else None
        if records is not None:  # a CSV row is a paragraph, its quoted cells' line breaks inside it
            breaks = [2 if record else 0 for record in records]
        for k, _ in segment.headings:  # a PDF's headings (`pdf_headings`): where its sections start
            if k < len(breaks):
                breaks[k] = 3
        # (a page's last chunk filled out: one per page, a PDF has a short tail on most of them)
        fill_last = segment.number is not None and doc.kind == "pdf"
        new_from = 0  # the first line no chunk before held: where a chunk's own text starts
        for piece in _chunk_lines(lines, counter.counts(lines), breaks, chunk_tokens, overlap_tokens, fill_last,
                                  records):
            # a piece of a split long line: cited with its characters (`Span.chars`)
            piece_of_line = piece.char_start > 0 or (piece.end - piece.start == 1
                                                     and len(piece.text) < len(lines[piece.start]))
            chars = (piece.char_start, piece.char_start + len(piece.text)) if piece_of_line else None
            # (its printed page number too: the model reads the passage under "p.217", as the user's citation says)
            span = Span(doc.path, line_offset + piece.start + 1, line_offset + piece.end, page, doc.unit,
                        page_label=segment.label, chars=chars)
            # Code: the declaration holding most of the chunk's own text (its non-blank
            # lines after those it shares with the one before). A chunk that ended where a
            # class began left the next one to start 32 tokens back in the function before,
            # whose trail it took (111 of click's 521 chunks: HelpFormatter's __init__
            # indexed and shown as "def wrap_text"); one whose own text began with a
            # function's last 4 lines and went on with the next function's 14 was named
            # after the first ("def open_file" for click's format_filename). Prose keeps
            # its first line's: a table's header row in a chunk's overlap is read there,
            # not again as its "columns:" trail.
            if code:
                own_from = new_from if piece.start < new_from < piece.end else piece.start
                section = trails.most_of(line_offset + own_from, line_offset + piece.end,
                                         lambda k: 1 if lines[k - line_offset].strip() else 0)
            else:
                section = trails.at(line_offset + piece.start)
            new_from = max(new_from, piece.end)
            heading_only = headed and all(breaks[k] in (1, 3) for k in range(piece.start, piece.end))
            chunks.append(Chunk(doc.path, len(chunks), piece.text, span, piece.n_tokens, doc.sha256, section,
                                piece.char_start, heading_only))
    return chunks


def _check_budget(chunk_tokens: int, overlap_tokens: int) -> None:
    if chunk_tokens < 1:
        raise UsageError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    if not 0 <= overlap_tokens < chunk_tokens:
        raise UsageError(f"chunk_overlap must be between 0 and chunk_tokens - 1 ({chunk_tokens - 1}), not {overlap_tokens}")


def _segments(doc: Document) -> list[Page]:
    """The pages with text of a PDF (a paged document), else the whole text as one."""
    if doc.pages and any(p.number is not None for p in doc.pages):
        return [p for p in doc.pages if p.text.strip()]
    return [Page(None, doc.text)]


def _split_lines(text: str) -> list[str]:
    """Lines as Document.n_lines counts them: a final newline does not open a line."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


class LineTokens:
    """Token counts of lines (with their newline), each distinct line encoded once:
    blank lines, braces and repeated boilerplate are common."""

    # Lines kept at most: shared by a whole corpus's documents, the cache is emptied past
    # it rather than hold every distinct line of a large repo (~100 bytes each).
    MAX_LINES = 200_000

    def __init__(self) -> None:
        self.cache: dict[str, int] = {}
        self.encode = encoding().encode_ordinary

    def counts(self, lines: list[str]) -> list[int]:
        cache, encode = self.cache, self.encode
        if len(cache) > self.MAX_LINES:
            cache.clear()
        out = []
        for line in lines:
            n = cache.get(line)
            if n is None:
                n = cache[line] = len(encode(line + "\n"))
            out.append(n)
        return out


def _break_scores(lines: list[str], *, code: bool) -> list[int]:
    """How good a chunk start each line is: 3 heading or top-level definition after a
    blank line, 2 first line of a paragraph, 1 a blank line, 0 mid-paragraph."""
    scores = [0] * len(lines)
    previous_blank = True
    for k, line in enumerate(lines):
        blank = not line.strip()
        if blank:
            scores[k] = 1
        elif code:
            if previous_blank:
                scores[k] = 3 if _TOP_LEVEL_DEF.match(line) else 2
        elif _MARKDOWN_HEADING.match(line) or (
            k + 1 < len(lines) and RST_UNDERLINE.match(lines[k + 1]) and len(lines[k + 1].strip()) >= len(line.strip())
        ):
            scores[k] = 3
        elif previous_blank:
            scores[k] = 2
        previous_blank = blank
    return scores


def _record_starts(lines: list[str]) -> list[bool] | None:
    """For a CSV or TSV table, whether each line starts a row: not inside a quoted cell
    that holds line breaks ("Line A\nLine B"). Chunked by lines, 85 of a probe's 86 chunks
    of tickets began inside a row, its ticket number in the chunk before. None where no
    cell holds a line break (every line a row)."""
    starts, inside = [], False
    for line in lines:
        starts.append(not inside)
        inside ^= line.count('"') % 2 == 1
    return None if all(starts) or inside else starts  # (a quote left open: not CSV quoting)


def _chunk_lines(
    lines: list[str], tokens: list[int], breaks: list[int], budget: int, overlap: int, fill_last: bool = False,
    records: list[bool] | None = None,
) -> list[_Piece]:
    """`records`: where a chunk may start (a table's rows), else anywhere."""
    n = len(lines)
    cum = [0, *accumulate(tokens)]  # cum[k] = tokens of lines [0, k)
    pieces: list[_Piece] = []
    start, prev_end = 0, 0
    while start < n:
        if tokens[start] > budget:
            pieces.extend(_split_long_line(lines[start], start, budget, overlap))
            start = prev_end = start + 1
            continue
        end = _fit(cum, tokens, start, budget)
        if end < n:
            end = _nicer_end(cum, breaks, start, max(end, prev_end + 1), prev_end + 1, budget)
        pieces.append(_Piece(start, end, "\n".join(lines[start:end]), cum[end] - cum[start]))
        prev_end = end
        start = _overlap_start(cum, tokens, start, end, budget, overlap) if end < n else n
        while records is not None and start < end and not records[start]:
            start += 1  # its overlap from the start of a row
        if fill_last and start < n:
            start = _last_start(cum, tokens, breaks, pieces[-1].start, start, budget)
    return pieces


def _last_start(cum: list[int], tokens: list[int], breaks: list[int], previous: int, start: int, budget: int) -> int:
    """Where a PDF page's next chunk starts: at `start`, unless it is the page's last and
    would hold under half a budget. Then earlier, as far back as a full chunk reaches: a
    page's tail of two lines and the overlap before them, ranked on its few words (BM25
    favours short texts), took 7 of 8 evidence slots from whole passages that named what
    they were about. Not back past a heading (`breaks` 3). (Not in other files, one tail
    each: filled out, a code file's last chunk repeated its previous one and the gold
    questions of minirepo ranked lower.)"""
    n = len(tokens)
    if _fit(cum, tokens, start, budget) < n or cum[n] - cum[start] >= budget // 2:
        return start
    s = start
    # (never back past a heading: the section it starts keeps a chunk of its own)
    while s - 1 > previous and cum[n] - cum[s - 1] <= budget and tokens[s - 1] <= budget and breaks[s] != 3:
        s -= 1
    return s


def _fit(cum: list[int], tokens: list[int], start: int, budget: int) -> int:
    """The furthest end such that lines [start, end) fit the budget, stopping before a
    line too long to share a chunk."""
    end = bisect_right(cum, cum[start] + budget, lo=start + 1) - 1
    for k in range(start + 1, end):
        if tokens[k] > budget:
            return k
    return end


def _nicer_end(cum: list[int], breaks: list[int], start: int, end: int, lowest: int, budget: int) -> int:
    """The best-scored boundary in (start, end] that still fills the chunk enough; the
    latest one among equals. `lowest` keeps the chunk past the previous chunk's end."""
    floor = cum[start] + _MIN_FILL * budget
    best, best_score = end, breaks[end] if end < len(breaks) else 0
    for k in range(end - 1, max(start, lowest - 1), -1):
        if cum[k] < floor:
            break
        if breaks[k] > best_score:
            best, best_score = k, breaks[k]
    return best


def _overlap_start(cum: list[int], tokens: list[int], start: int, end: int, budget: int, overlap: int) -> int:
    """Step back from `end` over whole lines worth at most `overlap` tokens, leaving room
    for line `end` itself so the next chunk always reaches past this one."""
    if end >= len(tokens) or tokens[end] > budget:
        return end  # the next line is split alone: nothing to share a chunk with
    allowed = min(overlap, budget - tokens[end])
    s = end
    while s - 1 > start and cum[end] - cum[s - 1] <= allowed:
        s -= 1
    return s


# Where a piece of a long line may end, best first: after a sentence (a full stop with the
# space after it, or a CJK one, which takes none), then after a clause's comma or a space.
# A paragraph of Chinese, Japanese or Korean is a line past the chunk size as often as not
# (a token a character): cut at token offsets, its pieces began mid-word ("护等方面" of
# 环境保护) and a name could fall in two halves.
_SENTENCE_STARTS = re.compile(r"[.!?\u2026\u061f\u06d4\u0964][\"'\u201d\u2019)\]]*\s+|"
                              r"[\u3002\uff01\uff1f\uff0e][\u300d\u300f\u201d\u2019\uff09]*\s*")
_WORD_STARTS = re.compile(r"\s+|[\u3001\uff0c\uff1b\uff1a][\u300d\u300f\u201d\u2019\uff09]*")


def _split_long_line(line: str, index: int, budget: int, overlap: int) -> list[_Piece]:
    """Pieces of at most `budget` tokens, each ending at the last sentence end in its
    second half, else the last space or clause comma there, else where its budget ends;
    each next piece starts about `overlap` tokens earlier, at a sentence's or word's start
    where one is there. A piece counts every token its text touches (more than the budget
    only where one character alone is more)."""
    enc = encoding()
    ids = enc.encode_ordinary(line)
    if len(ids) <= budget:
        return [_Piece(index, index + 1, line, len(ids))]
    places = _TokenPlaces(line, enc.decode_tokens_bytes(ids))
    sentences = [m.end() for m in _SENTENCE_STARTS.finditer(line)]
    words = sorted({*sentences, *(m.end() for m in _WORD_STARTS.finditer(line))})
    pieces: list[_Piece] = []
    lo = cut = 0  # the piece's first character; the piece before's end
    while True:
        a = places.holding(lo)
        b = a + budget
        if b >= len(ids):
            pieces.append(_Piece(index, index + 1, line[lo:], len(ids) - a, lo))
            return pieces
        # past the piece before's end too: with a large overlap, its second half may lie before it
        floor, hi = max(places.start(a + max(1, budget // 2)), cut), max(places.start(b), lo + 1)
        cut = _last_within(sentences, floor, hi) or _last_within(words, floor, hi) or hi
        shared = places.before(cut)
        pieces.append(_Piece(index, index + 1, line[lo:cut], shared - a, lo))
        if cut >= len(line):
            return pieces
        if overlap:
            # `overlap` tokens back, moved to the nearest sentence start, else word start,
            # up to twice as far back (a CJK sentence is longer than a 32-token overlap)
            back, far = places.start(max(a + 1, shared - overlap)), places.start(max(a + 1, shared - 2 * overlap))
            start = _nearest_within(sentences, back, far, cut) or _nearest_within(words, back, far, cut) or back
        else:
            start = cut
        lo = max(start, lo + 1)  # onward by a character at least


class _TokenPlaces:
    """Where a line's tokens lie, by byte: a token may hold part of a character (a CJK
    character is often two or three tokens, the first shared with the character before),
    and character offsets alone left a piece's first token uncounted."""

    def __init__(self, line: str, token_bytes: list[bytes]) -> None:
        data = np.frombuffer(line.encode(), dtype=np.uint8)
        self.char_byte = np.flatnonzero((data & 0xC0) != 0x80)  # each character's first byte
        self.n_bytes = len(data)
        self.token_byte = np.concatenate(([0], np.cumsum([len(t) for t in token_bytes[:-1]], dtype=np.int64)))

    def _byte(self, char: int) -> int:
        return int(self.char_byte[char]) if char < len(self.char_byte) else self.n_bytes

    def holding(self, char: int) -> int:
        """The token that holds the character's first byte."""
        return int(np.searchsorted(self.token_byte, self._byte(char), "right")) - 1

    def before(self, char: int) -> int:
        """How many tokens start before the character: those a piece ending there touches."""
        return int(np.searchsorted(self.token_byte, self._byte(char), "left"))

    def start(self, token: int) -> int:
        """The character the token starts in."""
        return int(np.searchsorted(self.char_byte, self.token_byte[token], "right")) - 1


def _last_within(starts: list[int], low: int, high: int) -> int | None:
    """The last position in sorted `starts` in (low, high]."""
    k = bisect_right(starts, high) - 1
    return starts[k] if k >= 0 and starts[k] > low else None


def _nearest_within(starts: list[int], target: int, low: int, high: int) -> int | None:
    """The position in sorted `starts` in [low, high) nearest to `target`."""
    lo_k, hi_k = bisect_left(starts, low), bisect_left(starts, high)
    return min(starts[lo_k:hi_k], key=lambda p: abs(p - target), default=None)
