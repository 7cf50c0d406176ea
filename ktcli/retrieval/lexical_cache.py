"""A BM25 index kept on disk by the texts it indexes: the next question about an unchanged
folder reads its postings back instead of tokenising every chunk again.

Building BM25 over the Python standard library's 12,270 chunks took ~2 s of CPU on every
question. An entry is the index's arrays (postings, term frequencies, offsets, document
lengths) and its vocabulary, in one .npz (no pickles), under a key that hashes each
indexed text in order, k1 and b, and the source of `lexical` (its tokenizer): any change
of a chunk, its order, or the code builds it again. Only a corpus unchanged since a run
hits; an edit of one file rebuilds the whole index (and keeps it for the next question).

Entries are written whole (a temporary file renamed into place); one that cannot be read
back or does not hold together (its zip's checksums, the arrays' shapes and bounds) is
built again, never an error. Past MAX_ENTRIES or MAX_BYTES the least recently used go.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from ktcli.cache_files import mark_used, trim, write_whole
from ktcli.retrieval import lexical
from ktcli.retrieval.lexical import BM25Index

FOLDER = "lexical"
VERSION = 1
MAX_ENTRIES = 8  # a corpus each: the stdlib's is ~7 MB
MAX_BYTES = 512 << 20


def bm25_index(texts: Sequence[str], cache_dir: Path | None, *, k1: float = 1.2, b: float = 0.75) -> BM25Index:
    """`BM25Index(texts, k1=k1, b=b)`, read from the cache under `cache_dir` where it holds
    it (None: nothing kept)."""
    if cache_dir is None:
        return BM25Index(texts, k1=k1, b=b)
    folder = cache_dir / FOLDER
    path = folder / f"{entry_key(texts, k1, b)}.npz"
    index = _load(path, len(texts), k1, b)
    if index is None:
        index = BM25Index(texts, k1=k1, b=b)
        if _save(path, index):
            trim(folder, ".npz", MAX_ENTRIES, MAX_BYTES)
    return index


def entry_key(texts: Sequence[str], k1: float, b: float) -> str:
    digest = hashlib.sha256(f"ktcli-bm25-v{VERSION}\0{_code()}\0{k1!r}\0{b!r}\0{len(texts)}\0".encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
    return digest.hexdigest()[:40]


@lru_cache(maxsize=1)
def _code() -> str:
    """The tokenizer's fingerprint: `lexical`'s source and numpy's version."""
    return hashlib.sha256(np.__version__.encode() + b"\0" + Path(lexical.__file__).read_bytes()).hexdigest()


def _load(path: Path, n_texts: int, k1: float, b: float) -> BM25Index | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            docs, tfs, offsets, doc_len = data["docs"], data["tfs"], data["offsets"], data["doc_len"]
            terms = json.loads(data["vocab"].tobytes().decode("utf-8", "surrogatepass"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError):
        return None  # none kept, or a damaged entry: build it again
    if not (isinstance(terms, list) and all(isinstance(t, str) for t in terms) and len(set(terms)) == len(terms)):
        return None
    if not (docs.dtype == np.int32 and tfs.dtype == np.float32 and offsets.dtype == np.int64
            and doc_len.dtype == np.float32 and docs.ndim == tfs.ndim == offsets.ndim == doc_len.ndim == 1):
        return None
    if not (len(doc_len) == n_texts and len(offsets) == len(terms) + 1 and len(docs) == len(tfs)
            and (len(offsets) == 0 or (offsets[0] == 0 and offsets[-1] == len(docs)))
            and np.all(np.diff(offsets) >= 0) and (len(docs) == 0 or (docs.min() >= 0 and docs.max() < n_texts))):
        return None
    mark_used(path)
    return BM25Index.from_arrays({t: k for k, t in enumerate(terms)}, docs, tfs, offsets, doc_len, k1=k1, b=b)


def _save(path: Path, index: BM25Index) -> bool:
    """Keep it; a disk that refuses keeps nothing, quietly (this run has it)."""
    terms = [""] * len(index._vocab)
    for term, k in index._vocab.items():
        terms[k] = term
    vocab = np.frombuffer(json.dumps(terms, ensure_ascii=False).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, docs=index._docs, tfs=index._tfs, offsets=index._offsets, doc_len=index.doc_len, vocab=vocab)
    return write_whole(path, buffer.getvalue())
