from __future__ import annotations

import numpy as np

from ktcli.retrieval.dense import DenseIndex


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_exact_top_k_by_cosine():
    rng = np.random.default_rng(0)
    vectors = _unit(rng.standard_normal((200, 32)))
    index = DenseIndex(vectors)
    query = vectors[17] + 0.01 * rng.standard_normal(32).astype(np.float32)
    hits = index.search(query, 5)
    assert hits[0][0] == 17
    expected = np.argsort(-(vectors @ query), kind="stable")[:5]
    assert [i for i, _ in hits] == list(expected)
    assert index.nbytes == 200 * 32 * 4


def test_ties_by_index_and_k_larger_than_index():
    vectors = _unit(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    hits = DenseIndex(vectors).search(np.array([1.0, 0.0], dtype=np.float32), 10)
    assert [i for i, _ in hits] == [0, 1, 2]


def test_empty_index():
    assert DenseIndex(np.zeros((0, 8), dtype=np.float32)).search(np.ones(8, dtype=np.float32), 3) == []
