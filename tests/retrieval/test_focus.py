"""A question about a large input not yet embedded embeds the chunks its words point at
(`retriever._focus`), keeps them as entries holding some rows, and later questions add
theirs: FOCUS_FROM and FOCUS_CHUNKS are made small here to see it on a few chunks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ktcli.retrieval import retriever
from ktcli.retrieval.retriever import HybridIndex, cached_chunks, planned_embeddings
from ktcli.retrieval.store import IndexStore
from tests.retrieval.fakes import HashEmbedder, make_corpus, make_doc_chunks


@pytest.fixture(autouse=True)
def small_focus(monkeypatch):
    monkeypatch.setattr(retriever, "FOCUS_FROM", 6)
    monkeypatch.setattr(retriever, "FOCUS_CHUNKS", 4)
    monkeypatch.setattr(retriever, "FOCUS_MIN_MATCHED", 3)


def _build(chunks, cache_dir, focus=None, embedder=None, **kw):
    embedder = embedder or HashEmbedder()
    return HybridIndex.build(chunks, embedder=embedder, store=IndexStore(cache_dir), focus=focus, **kw)


def _held_by_store(chunks, cache_dir):
    return cached_chunks(chunks, HashEmbedder().name, IndexStore(cache_dir))


def test_a_question_embeds_what_its_words_point_at(tmp_path):
    chunks = make_corpus(4, 4)  # 16 chunks; topics alpha..delta, 4 chunks each
    embedder = HashEmbedder()
    events = []
    index = _build(chunks, tmp_path, "which part is about topic gamma", embedder,
                   on_progress=lambda *e: events.append(e))
    # every chunk holds "part" and "topic": BM25 ranks all 16, the 4 gamma chunks first
    assert embedder.n_embedded == 4
    assert index.stats["n_embedded_now"] == 4 and index.stats["n_not_embedded"] == 12
    assert ("focus", 4, 16) in events
    gamma = {i for i, c in enumerate(chunks) if "gamma" in c.text}
    assert {i for i, held in enumerate(_held_by_store(chunks, tmp_path)) if held} == gamma
    hits = index.search("which part is about topic gamma", 8)
    assert {h.chunk.text for h in hits[:4]} == {chunks[i].text for i in gamma}
    # the dense ranking names chunks by their place in the corpus, not in the vectors held
    assert all(h.dense_rank is None for h in hits if "gamma" not in h.chunk.text)


def test_later_questions_add_theirs_and_a_full_build_completes_the_entries(tmp_path):
    chunks = make_corpus(4, 4)
    _build(chunks, tmp_path, "which part is about topic gamma")
    embedder = HashEmbedder()
    second = _build(chunks, tmp_path, "which part is about topic alpha", embedder)
    assert embedder.n_embedded == 4 and second.stats["n_reused"] == 4
    assert sum(_held_by_store(chunks, tmp_path)) == 8
    # a build for no question embeds the rest, and its vectors are those of one full build
    embedder = HashEmbedder()
    whole = _build(chunks, tmp_path, None, embedder)
    assert embedder.n_embedded == 8 and whole.dense_positions is None
    assert all(_held_by_store(chunks, tmp_path))
    assert all("rows" not in json.loads(p.read_text()) for p in (tmp_path / "index" / "entries").rglob("*.json"))
    fresh = _build(chunks, tmp_path / "fresh")
    np.testing.assert_array_equal(whole.dense._index.reconstruct_n(0, 16), fresh.dense._index.reconstruct_n(0, 16))


def test_few_unembedded_chunks_are_all_embedded(tmp_path):
    chunks = make_corpus(2, 3)  # 6 chunks: not more than FOCUS_FROM
    embedder = HashEmbedder()
    _build(chunks, tmp_path, "which part is about topic gamma", embedder)
    assert embedder.n_embedded == 6


def test_a_question_whose_words_match_few_chunks_embeds_them_all(tmp_path):
    # its words match 2 chunks, fewer than FOCUS_MIN_MATCHED: dense search is its only way to the rest
    texts = [f"chapter {i} tells of the river and the mill in spring" for i in range(10)]
    texts[3] += " and a zebra"
    texts[7] += " and the zebra again"
    embedder = HashEmbedder()
    index = _build(make_doc_chunks("mill.md", texts), tmp_path, "zebra?", embedder)
    assert embedder.n_embedded == 10 and index.dense_positions is None


class _RankedWords:
    """BM25 stand-in ranking the given chunks first, whatever the query."""

    def __init__(self, ranked: list[int]) -> None:
        self.ranked = ranked

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        return [(i, 1.0) for i in self.ranked[:k]]


def test_the_definition_a_question_names_is_embedded_beside_the_words():
    texts = [f"chapter {i} tells of the river and the mill in spring, part {i}" for i in range(11)]
    texts.insert(5, "def spin_wheel(speed):\n    return speed * 2")
    chunks = make_doc_chunks("mill.py", texts)
    tables = retriever._NameTables.of(chunks)
    wanted = retriever._focus("how does `spin_wheel` turn the mill", chunks, _RankedWords([0, 1, 2, 3, 4, 6]), tables)
    assert wanted == {0, 1, 2, 3, 5}  # BM25's best 4, and the definition search() adds a bonus to


def test_the_same_document_twice_is_embedded_once(tmp_path):
    once = make_corpus(4, 4)
    twice = once + [c.__class__(**{**c.__dict__, "doc_path": "copy/" + c.doc_path}) for c in once]
    embedder = HashEmbedder()
    index = _build(twice, tmp_path, "which part is about topic gamma", embedder)
    assert embedder.n_embedded <= 4
    assert index.stats["n_chunks"] - index.stats["n_not_embedded"] == 8  # both copies' gamma chunks


@pytest.mark.parametrize("question", [
    "which part is about topic gamma",  # BM25's best FOCUS_CHUNKS
    "what does `compute_2_3` return",  # ... and the definition its name finds, over FOCUS_CHUNKS
    "zebra?",  # no word matched: every chunk
    None,  # --embed all
])
def test_the_plan_counts_the_chunks_the_build_embeds(tmp_path, question):
    # planned as a count of FOCUS_CHUNKS, torch/fx's "What does `eliminate_dead_code` do?"
    # said ~1,000 and embedded 531; a question in German said ~1,000 and embedded 2,343
    chunks = make_corpus(4, 4)
    for step in (question, "which part is about topic alpha"):  # cold, then beside what it kept
        held = _held_by_store(chunks, tmp_path)
        planned = planned_embeddings(chunks, held, step, tmp_path)
        embedder = HashEmbedder()
        index = _build(chunks, tmp_path, step, embedder)
        assert len(planned) == embedder.n_embedded == index.stats["n_embedded_now"]
        now = {i for i, is_held in enumerate(_held_by_store(chunks, tmp_path)) if is_held and not held[i]}
        assert set(planned) == now
    held = _held_by_store(chunks, tmp_path)
    assert planned_embeddings(chunks, held, "which part is about topic alpha", tmp_path) == []  # asked again
    assert planned_embeddings(chunks, [False] * 16, None, tmp_path) == list(range(16))
    assert planned_embeddings(chunks[:6], [False] * 6, "topic gamma", tmp_path) == list(range(6))  # not over FOCUS_FROM


def test_store_entry_holding_some_rows(tmp_path):
    store = IndexStore(tmp_path)
    hashes = ["a", "b", "c", "d"]
    vectors = np.eye(4, 8, dtype=np.float32)
    assert store.save("k1", hashes, vectors[[1, 3]], rows=[1, 3])
    assert store.held("k1", hashes) == [False, True, False, True]
    assert not store.holds("k1", hashes) and store.load("k1", hashes) is None
    stored, held = store.load_rows("k1", hashes, dim=8)
    assert held.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(stored[[1, 3]], vectors[[1, 3]])
    assert not stored[[0, 2]].any()
    # rows that are not ascending indices below the chunk count are refused, written or read
    for rows in ([3, 1], [1, 1], [1, 4], [-1, 2]):
        with pytest.raises(ValueError):
            store.save("k2", hashes, vectors[:2], rows=rows)
    manifest = next((tmp_path / "index" / "entries").rglob("k1.json"))
    record = json.loads(manifest.read_text())
    for damaged in ([3, 1], [1, 9], "1,3", [1.0, 3.0]):
        manifest.write_text(json.dumps(record | {"rows": damaged}))
        assert store.load_rows("k1", hashes) is None and store.held("k1", hashes) == [False] * 4


def test_words_matching_fewer_chunks_than_the_focus_holds_embed_those(tmp_path):
    texts = [f"chapter {i} tells of the river and the mill in spring" for i in range(10)]
    for i in (1, 4, 8):
        texts[i] += " and a zebra"
    embedder = HashEmbedder()
    index = _build(make_doc_chunks("mill.md", texts), tmp_path, "zebra?", embedder)
    assert embedder.n_embedded == 3 and index.dense_positions.tolist() == [1, 4, 8]


def test_an_entry_that_gains_rows_leaves_no_old_vectors_behind(tmp_path):
    chunks = make_corpus(4, 4)
    for question in ("which part is about topic gamma", "which part is about topic alpha", None):
        _build(chunks, tmp_path, question)
    entries = tmp_path / "index" / "entries"
    manifests = sorted(entries.rglob("*.json"))
    assert len(manifests) == 4 and len(sorted(entries.rglob("*.npy"))) == 4  # one data file an entry, no leftovers
    assert all(_held_by_store(chunks, tmp_path))
