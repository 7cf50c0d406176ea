"""A document's chunks and its token count, kept on disk: the next question about the same
folder chunks only the files that changed.

Chunking is most of what a question about a large folder does before the model: the
Python standard library (663 files, 12,652 chunks) took ~2.8 s of CPU to cut (tiktoken
counting each line) and ~1.5 s more to count each document's tokens whole, on every
question, though nothing had changed.

An entry is one document's chunks (less what the document itself says: its path and
sha256) and `count_tokens(document.text)`, under a key that hashes everything
`chunk_document` reads of it (path, kind, language, unit, text, pages), the chunk
settings, and a fingerprint of the code that cut it (ktcli's ingest sources, its types,
tiktoken's version). The path is in the key: section trails depend on a file's name
(a `.csv`, a `.diff`), so a moved file is cut again rather than re-pathed.

Entries are written whole (a temporary file renamed into place) with a digest of their
payload and name (`checked_json`); a damaged or changed one is cut again, never an error.
Past MAX_ENTRIES or MAX_BYTES the least recently used go, swept once by a run that wrote any.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from ktcli.cache_files import mark_used, sources_fingerprint, trim, write_whole
from ktcli.checked_json import dumps, loads
from ktcli.ingest.chunking import LineTokens, chunk_document
from ktcli.ingest.loaders import STDIN_PATH
from ktcli.ingest.tokens import ENCODING_NAME, count_tokens
from ktcli.types import Chunk, Corpus, Document, Span

FOLDER = "chunks"
VERSION = 1
MAX_ENTRIES = 20_000  # a file each: the stdlib is 633 of them, 14 MB
MAX_BYTES = 512 << 20


def chunked(corpus: Corpus, *, chunk_tokens: int, overlap_tokens: int,
            cache_dir: Path | None = None) -> tuple[list[Chunk], list[int]]:
    """`chunk_corpus(corpus, ...)` and `count_tokens(d.text)` of each document, from the
    cache under `cache_dir` where it holds them (None: nothing kept)."""
    folder = cache_dir / FOLDER if cache_dir is not None else None
    chunks: list[Chunk] = []
    tokens: list[int] = []
    wrote = False
    counter = LineTokens()  # (the documents cut now share their lines' counts, as `chunk_corpus`'s do)
    for doc in corpus.documents:
        kept = None
        # (not what was piped in: read once, and its text need not sit in the cache)
        kept_at = folder is not None and doc.path != STDIN_PATH
        path = folder / f"{entry_key(doc, chunk_tokens, overlap_tokens)}.json" if kept_at else None
        if path is not None:
            kept = _load(path, doc)
        if kept is None:
            doc_chunks = chunk_document(doc, chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens,
                                        counter=counter)
            n = count_tokens(doc.text)
            if path is not None:
                wrote |= _save(path, doc_chunks, n)
        else:
            doc_chunks, n = kept
        chunks.extend(doc_chunks)
        tokens.append(n)
    if wrote and folder is not None:
        trim(folder, ".json", MAX_ENTRIES, MAX_BYTES)
    return chunks, tokens


def entry_key(doc: Document, chunk_tokens: int, overlap_tokens: int) -> str:
    digest = hashlib.sha256(f"ktcli-chunks-v{VERSION}\0{_code()}\0{chunk_tokens}\0{overlap_tokens}\0".encode())
    digest.update(repr((doc.path, doc.kind, doc.language, doc.unit, doc.sha256)).encode("utf-8", "surrogatepass"))
    digest.update(b"\0" + doc.text.encode("utf-8", "surrogatepass"))
    for page in doc.pages:
        digest.update(repr((page.number, page.line_offset, page.label, page.section, page.headings, len(page.text)))
                      .encode("utf-8", "surrogatepass"))
        digest.update(b"\0" + page.text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:40]


@lru_cache(maxsize=1)
def _code() -> str:
    """The chunker's fingerprint: the ingest package's sources, ktcli's types, tiktoken's
    version and encoding."""
    import tiktoken

    sources = [*sorted(Path(__file__).parent.glob("*.py")), Path(__file__).parent.parent / "types.py"]
    return sources_fingerprint(f"{getattr(tiktoken, '__version__', '?')}\0{ENCODING_NAME}\0", sources)


def _load(path: Path, doc: Document) -> tuple[list[Chunk], int] | None:
    try:
        entry = loads(path.name, path.read_text(encoding="utf-8", errors="surrogatepass"))
        if entry is None:
            return None  # damaged, or edited since it was written
        n = entry["tokens"]
        if not isinstance(n, int) or isinstance(n, bool) or not isinstance(entry["chunks"], list):
            return None
        chunks = [_chunk(doc, ordinal, row) for ordinal, row in enumerate(entry["chunks"])]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None  # none kept, or a damaged entry: cut the document again
    mark_used(path)
    return chunks, n


def _chunk(doc: Document, ordinal: int, row: list) -> Chunk:
    text, n_tokens, section, char_start, heading_only, line_start, line_end, page, page_label, chars = row
    if not (isinstance(text, str) and isinstance(section, str) and type(n_tokens) is int
            and type(char_start) is int and type(heading_only) is bool
            and all(v is None or type(v) is int for v in (line_start, line_end, page))
            and (page_label is None or isinstance(page_label, str))):
        raise TypeError("a malformed chunk")
    if chars is not None:
        start, end = chars
        if type(start) is not int or type(end) is not int:
            raise TypeError("a malformed chunk")
        chars = (start, end)
    span = Span(doc.path, line_start, line_end, page, doc.unit, page_label=page_label, chars=chars)
    return Chunk(doc.path, ordinal, text, span, n_tokens, doc.sha256, section, char_start, heading_only)


def _row(chunk: Chunk) -> list:
    s = chunk.span
    return [chunk.text, chunk.n_tokens, chunk.section, chunk.char_start, chunk.heading_only,
            s.line_start, s.line_end, s.page, s.page_label, list(s.chars) if s.chars is not None else None]


def _save(path: Path, chunks: list[Chunk], n_tokens: int) -> bool:
    """Keep them; a disk that refuses keeps nothing, quietly (this run has them)."""
    entry = {"tokens": n_tokens, "chunks": [_row(c) for c in chunks]}
    return write_whole(path, dumps(path.name, entry, ensure_ascii=False), errors="surrogatepass")
