"""Test helpers: a fast deterministic embedder and chunk builders.

HashEmbedder stands in for the real model where a test is about the store or the
fusion, not embedding quality: hashed bag of words, so texts sharing words are close,
and identical texts give identical vectors in any process.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable

import numpy as np

from ktcli.types import Chunk, Span

_WORD = re.compile(r"\w+")


class HashEmbedder:
    def __init__(self, dim: int = 64, delay_s: float = 0.0, name: str = "hash-test") -> None:
        self.name = name
        self.dim = dim
        self.delay_s = delay_s  # per text: makes a build slow enough to kill midway
        self.n_embedded = 0

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        if not v.any():
            v[0] = 1.0
        return v / np.linalg.norm(v)

    def embed(self, texts: list[str], *, on_progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            if self.delay_s:
                time.sleep(self.delay_s)
            out[i] = self._vector(text)
            if on_progress is not None:
                on_progress(i + 1, len(texts))
        self.n_embedded += len(texts)
        return out

    def embed_lines(self, texts: list[str]) -> np.ndarray:
        return self.embed(texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self._vector(text)

    def vocabulary_share(self, text: str) -> float:
        return 1.0


def doc_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_doc_chunks(path: str, texts: list[str]) -> list[Chunk]:
    """Chunks of one document whose text is the chunk texts joined by newlines, one
    chunk per line (so spans are easy to check)."""
    sha = doc_sha("\n".join(texts))
    return [
        Chunk(doc_path=path, ordinal=i, text=t, span=Span(path, i + 1, i + 1), n_tokens=len(t.split()), doc_sha256=sha)
        for i, t in enumerate(texts)
    ]


def make_corpus(n_docs: int, chunks_per_doc: int, *, salt: str = "") -> list[Chunk]:
    """A small synthetic repo: distinct, word-rich chunk texts per document."""
    chunks: list[Chunk] = []
    for d in range(n_docs):
        texts = [
            f"document {d} part {c} {salt} function compute_{d}_{c} returns value {d * 100 + c} "
            f"topic {['alpha', 'beta', 'gamma', 'delta'][(d + c) % 4]} note {d}-{c}"
            for c in range(chunks_per_doc)
        ]
        chunks.extend(make_doc_chunks(f"src/mod_{d}.py", texts))
    return chunks
