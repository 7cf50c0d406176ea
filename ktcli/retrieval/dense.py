"""Exact nearest-neighbour search over unit vectors with faiss.

Inner product on L2-normalised vectors is cosine similarity. IndexFlatIP is exact and,
at 384 dimensions, scans 100K vectors in a few milliseconds, so an approximate index
would only add a training step and recall loss for the corpus sizes ktcli handles.
"""

from __future__ import annotations

import numpy as np


class DenseIndex:
    def __init__(self, vectors: np.ndarray):
        import faiss

        if vectors.ndim != 2:
            raise ValueError(f"vectors must be [n, dim], got shape {vectors.shape}")
        self.dim = int(vectors.shape[1])
        self._index = faiss.IndexFlatIP(self.dim)
        if len(vectors):
            self._index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def __len__(self) -> int:
        return int(self._index.ntotal)

    @property
    def nbytes(self) -> int:
        return len(self) * self.dim * 4  # IndexFlat keeps one float32 row per vector

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Top k (vector index, cosine), best first; equal scores by index so results
        do not depend on faiss's internal scan order."""
        k = min(k, len(self))
        if k <= 0:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, self.dim)  # [1, dim]
        scores, ids = self._index.search(q, k)  # [1, k] each
        pairs = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        pairs.sort(key=lambda p: (-p[1], p[0]))
        return pairs
