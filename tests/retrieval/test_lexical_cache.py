"""A BM25 index kept by the texts it indexes (`retrieval.lexical_cache`): read back, it is
the index a build makes; any change of the texts builds it again; a damaged entry is none."""

from __future__ import annotations

import numpy as np
import pytest

from ktcli.retrieval import lexical_cache
from ktcli.retrieval.lexical import BM25Index
from ktcli.retrieval.lexical_cache import bm25_index

TEXTS = ["The lighthouse keeper trims the lamp at dusk.", "def parse_config(path):\n    return load(path)",
         "Quarterly revenue grew 5.87% in Q3.", "", "naïve café — 東京 tower", "parseConfig reads the config file"]
QUERIES = ["lamp dusk", "parse config", "revenue Q3", "東京", "nothing-here", "config"]


def _same(a: BM25Index, b: BM25Index) -> None:
    assert a._vocab == b._vocab and a.n_docs == b.n_docs and a.avg_len == b.avg_len
    for name in ("_docs", "_tfs", "_offsets", "doc_len", "_norm"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for q in QUERIES:
        assert a.search(q, 10) == b.search(q, 10)


def _no_build(monkeypatch):
    # a build fails: only from_arrays is left
    monkeypatch.setattr(lexical_cache, "BM25Index", type("NoBuild", (), {
        "from_arrays": staticmethod(BM25Index.from_arrays),
        "__new__": lambda *a, **k: pytest.fail("built again")}))


def test_a_kept_index_is_the_one_a_build_makes(tmp_path, monkeypatch):
    fresh = BM25Index(TEXTS)
    _same(bm25_index(TEXTS, tmp_path), fresh)
    _no_build(monkeypatch)
    _same(bm25_index(TEXTS, tmp_path), fresh)


def test_a_changed_text_or_order_is_built_again(tmp_path):
    bm25_index(TEXTS, tmp_path)
    edited = [*TEXTS[:2], "Quarterly revenue fell in Q3.", *TEXTS[3:]]
    _same(bm25_index(edited, tmp_path), BM25Index(edited))
    reordered = TEXTS[::-1]
    _same(bm25_index(reordered, tmp_path), BM25Index(reordered))
    _same(bm25_index(TEXTS, tmp_path, k1=1.5), BM25Index(TEXTS, k1=1.5))
    assert len(list((tmp_path / lexical_cache.FOLDER).glob("*.npz"))) == 4


@pytest.mark.parametrize("damage", ["cut", "garbage", "shape"])
def test_a_damaged_entry_is_built_again(tmp_path, damage):
    bm25_index(TEXTS, tmp_path)
    (entry,) = (tmp_path / lexical_cache.FOLDER).glob("*.npz")
    if damage == "cut":
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    elif damage == "garbage":
        entry.write_bytes(b"not a zip")
    else:  # readable, but postings past the documents
        with np.load(entry) as data:
            arrays = dict(data)
        arrays["docs"] = arrays["docs"] + 100
        with entry.open("wb") as f:
            np.savez(f, **arrays)
    _same(bm25_index(TEXTS, tmp_path), BM25Index(TEXTS))
    assert lexical_cache._load(entry, len(TEXTS), 1.2, 0.75) is not None  # written again


def test_no_folder_keeps_nothing_and_the_oldest_go(tmp_path, monkeypatch):
    _same(bm25_index(TEXTS, None), BM25Index(TEXTS))
    monkeypatch.setattr(lexical_cache, "MAX_ENTRIES", 2)
    for k in range(4):
        bm25_index(TEXTS[k:], tmp_path)
    assert len(list((tmp_path / lexical_cache.FOLDER).glob("*.npz"))) == 2
    monkeypatch.setattr(lexical_cache, "MAX_BYTES", 1)  # past its bytes: all but the newest go
    bm25_index(TEXTS[1:], tmp_path)
    assert len(list((tmp_path / lexical_cache.FOLDER).glob("*.npz"))) == 1
