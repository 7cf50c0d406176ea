from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from ktcli.retrieval.retriever import HybridIndex
from ktcli.retrieval.store import IndexStore
from tests.retrieval.fakes import HashEmbedder, make_corpus, make_doc_chunks


def _build(chunks, cache_dir, embedder=None, **kw):
    embedder = embedder or HashEmbedder()
    return HybridIndex.build(chunks, embedder=embedder, store=IndexStore(cache_dir), **kw)


def _vectors(index: HybridIndex) -> np.ndarray:
    return index.dense._index.reconstruct_n(0, len(index))


def _entry_files(cache_dir, suffix):
    return sorted((cache_dir / "index" / "entries").rglob(f"*{suffix}"))


def test_second_build_embeds_nothing(tmp_path):
    chunks = make_corpus(4, 3)
    first = _build(chunks, tmp_path)
    assert (first.stats["n_embedded_now"], first.stats["n_reused"]) == (12, 0)
    embedder = HashEmbedder()
    second = _build(chunks, tmp_path, embedder)
    assert (second.stats["n_embedded_now"], second.stats["n_reused"]) == (0, 12)
    assert embedder.n_embedded == 0
    np.testing.assert_array_equal(_vectors(first), _vectors(second))  # cache state never changes results
    assert len(_entry_files(tmp_path, ".json")) == 4  # one entry per document
    assert IndexStore(tmp_path).size_bytes() > 0


def test_editing_one_document_reembeds_only_it(tmp_path):
    chunks = make_corpus(5, 3)
    _build(chunks, tmp_path)
    edited = [
        replace(c, text=c.text + " edited", doc_sha256="e" * 64) if c.doc_path == "src/mod_2.py" else c
        for c in chunks
    ]
    embedder = HashEmbedder()
    index = _build(edited, tmp_path, embedder)
    assert (index.stats["n_embedded_now"], index.stats["n_reused"]) == (3, 12)
    assert embedder.n_embedded == 3


def test_rechunking_a_document_reembeds_it(tmp_path):
    _build(make_doc_chunks("a.md", ["one two", "three four"]), tmp_path)
    same_doc_other_cut = make_doc_chunks("a.md", ["one two three four"])
    same_doc_other_cut = [replace(c, doc_sha256=make_doc_chunks("a.md", ["one two", "three four"])[0].doc_sha256)
                          for c in same_doc_other_cut]
    assert _build(same_doc_other_cut, tmp_path).stats["n_embedded_now"] == 1


def test_moved_file_reuses_vectors_but_reports_its_new_path(tmp_path):
    texts = ["alpha beta", "gamma delta", "epsilon zeta"]
    _build(make_doc_chunks("old/name.py", texts), tmp_path)
    moved = make_doc_chunks("new/place.py", texts)
    index = _build(moved, tmp_path)
    assert index.stats["n_embedded_now"] == 0
    hit = index.search("gamma delta", 1)[0]
    assert hit.chunk.span.cite() == "new/place.py:2"


def test_different_embedder_does_not_reuse(tmp_path):
    chunks = make_corpus(2, 2)
    _build(chunks, tmp_path)
    assert _build(chunks, tmp_path, HashEmbedder(name="other")).stats["n_embedded_now"] == 4


def _corrupt_truncate(path):
    path.write_bytes(path.read_bytes()[:40])


def _corrupt_garbage(path):
    path.write_bytes(os.urandom(path.stat().st_size))


def _corrupt_empty(path):
    path.write_bytes(b"")


def _corrupt_delete(path):
    path.unlink()


@pytest.mark.parametrize("suffix", [".npy", ".json"])
@pytest.mark.parametrize("damage", [_corrupt_truncate, _corrupt_garbage, _corrupt_empty, _corrupt_delete])
def test_corrupt_entry_is_recomputed(tmp_path, suffix, damage):
    chunks = make_corpus(3, 2)
    reference = _vectors(_build(chunks, tmp_path))
    damage(_entry_files(tmp_path, suffix)[1])
    index = _build(chunks, tmp_path)
    assert (index.stats["n_embedded_now"], index.stats["n_reused"]) == (2, 4)
    np.testing.assert_array_equal(_vectors(index), reference)
    # the rewrite repaired the entry
    assert _build(chunks, tmp_path).stats["n_embedded_now"] == 0


def test_valid_npy_with_wrong_shape_is_rejected(tmp_path):
    chunks = make_corpus(1, 3)
    _build(chunks, tmp_path)
    [manifest] = _entry_files(tmp_path, ".json")
    [data] = _entry_files(tmp_path, ".npy")
    np.save(data, np.zeros((2, 64), dtype=np.float16))  # well-formed, wrong rows, bad checksum
    assert _build(chunks, tmp_path).stats["n_embedded_now"] == 3
    assert manifest.exists()


def test_leftover_temp_and_orphan_files_are_harmless(tmp_path):
    chunks = make_corpus(2, 2)
    store = IndexStore(tmp_path)
    tmp = store.root / "tmp"
    tmp.mkdir(parents=True)
    (tmp / "half-written.npy.abc.tmp").write_bytes(b"\x93NUMPY partial")
    old = 1_000_000_000
    os.utime(tmp / "half-written.npy.abc.tmp", (old, old))
    index = HybridIndex.build(chunks, embedder=HashEmbedder(), store=store)
    assert index.stats["n_embedded_now"] == 4
    assert not (tmp / "half-written.npy.abc.tmp").exists()  # swept: older than any live write


def test_unwritable_cache_degrades_to_no_cache(tmp_path):
    (tmp_path / "index").write_text("a file where the folder should be")
    index = _build(make_corpus(2, 2), tmp_path)
    assert index.stats["n_embedded_now"] == 4
    assert index.stats["store_write_errors"] == 2
    assert len(index.search("compute", 2)) == 2


def test_clear_and_prune(tmp_path):
    chunks = make_corpus(6, 2)
    store = IndexStore(tmp_path)
    HybridIndex.build(chunks, embedder=HashEmbedder(), store=store)
    full = store.size_bytes()
    freed = store.prune(full // 2)
    assert freed > 0 and store.size_bytes() <= full // 2
    assert _build(chunks, tmp_path).stats["n_reused"] > 0  # survivors still valid
    store.clear()
    assert store.size_bytes() == 0
    assert _build(chunks, tmp_path).stats["n_embedded_now"] == 12


def test_long_document_is_stored_in_parts(tmp_path, monkeypatch):
    from ktcli.retrieval import retriever

    monkeypatch.setattr(retriever, "PART_CHUNKS", 4)
    chunks = make_doc_chunks("big.txt", [f"line {i} of a long document" for i in range(10)])
    _build(chunks, tmp_path, commit_every=4)
    assert len(_entry_files(tmp_path, ".json")) == 3
    # losing one part costs only that part
    _entry_files(tmp_path, ".json")[0].unlink()
    assert _build(chunks, tmp_path).stats["n_embedded_now"] in {2, 4}


def test_progress_reports_lexical_then_cache_then_embedding(tmp_path):
    events = []
    _build(make_corpus(3, 3), tmp_path, on_progress=lambda *e: events.append(e), commit_every=4)
    # BM25 first: a question's words choose what a large input embeds (`retriever._focus`)
    assert events[:3] == [("lexical", 0, 1), ("lexical", 1, 1), ("cached", 0, 9)]
    embed = [e for e in events if e[0] == "embed"]
    assert embed[-1] == ("embed", 9, 9)
    assert [d for _, d, _ in embed] == sorted(d for _, d, _ in embed)
    # each group of about 4 chunks said once written: a Ctrl-C then says what is kept
    assert [e for e in events if e[0] == "kept"] == [("kept", 6, 9), ("kept", 9, 9)]
    assert events.index(("kept", 6, 9)) > events.index(("embed", 6, 9))
    assert events[-1] == ("kept", 9, 9)
    # a second build finds every chunk stored and embeds nothing
    events.clear()
    _build(make_corpus(3, 3), tmp_path, on_progress=lambda *e: events.append(e))
    assert events == [("lexical", 0, 1), ("lexical", 1, 1), ("cached", 9, 9)]


def test_float16_storage_keeps_rankings(real_embedder, tmp_path):
    """float16 halves the store; measure that it does not change what is retrieved."""
    topics = ["revenue", "python decorators", "pump maintenance", "museum opening", "rust lifetimes",
              "tax filing", "garden soil", "train delays", "vaccine trial", "chess openings"]
    texts = [f"Note {i}: a remark about {topics[i % 10]} and {topics[(i * 7) % 10]}, item {i}." for i in range(120)]
    vectors32 = real_embedder.embed(texts)
    store = IndexStore(tmp_path)
    store.save("k" * 64, [str(i) for i in range(len(texts))], vectors32)
    vectors16 = store.load("k" * 64, [str(i) for i in range(len(texts))], dim=384)
    queries = real_embedder.embed([f"what about {t}?" for t in topics])
    overlaps = []
    for q in queries:
        top32 = set(np.argsort(-(vectors32 @ q), kind="stable")[:10])
        top16 = set(np.argsort(-(vectors16 @ q), kind="stable")[:10])
        overlaps.append(len(top32 & top16) / 10)
    assert np.mean(overlaps) >= 0.98, overlaps
    assert np.abs(vectors32 @ queries.T - vectors16 @ queries.T).max() < 2e-3


def test_prune_within_its_room_reads_no_manifest(tmp_path, monkeypatch):
    """Every run that embedded anything read every manifest (0.75 s for 5,440 entries)."""
    store = IndexStore(tmp_path)
    HybridIndex.build(make_corpus(3, 2), embedder=HashEmbedder(), store=store)
    full = store.size_bytes()
    monkeypatch.setattr(store, "_drop_orphans", lambda: (_ for _ in ()).throw(AssertionError("read manifests")))
    assert store.prune(full) == 0


@pytest.mark.parametrize("damage", [_corrupt_truncate, _corrupt_empty, _corrupt_delete])
def test_the_plan_does_not_count_an_entry_whose_vectors_are_damaged(tmp_path, damage):
    """`holds` (the plan's count of chunks to embed) read the manifest alone: an entry whose
    vectors were deleted or cut short was planned as reused and embedded again by the run."""
    chunks = make_corpus(3, 2)
    _build(chunks, tmp_path)
    key = _entry_files(tmp_path, ".json")[1].stem
    store = IndexStore(tmp_path)
    hashes = store._read_manifest(key)["chunk_sha256"]
    assert store.holds(key, hashes)
    damage(_entry_files(tmp_path, ".npy")[1])
    assert not store.holds(key, hashes)
    assert _build(chunks, tmp_path).stats["n_embedded_now"] == 2
    assert store.holds(key, hashes)


@pytest.mark.parametrize("manifest", ['[1, 2]', '"text"', '{"version": 1}', '{"data": 5}', '{"data": "../../x"}'])
def test_prune_takes_a_manifest_of_another_shape_as_damaged(tmp_path, manifest):
    """A manifest that is JSON but not an entry's (edited by hand) was a TypeError or
    KeyError out of `prune`, on every run that embedded anything over the cap."""
    chunks = make_corpus(3, 2)
    _build(chunks, tmp_path)
    damaged = _entry_files(tmp_path, ".json")[0]
    damaged.write_text(manifest)
    store = IndexStore(tmp_path)
    assert store.prune(store.size_bytes() - 1) > 0
    assert not damaged.exists()  # the damaged one goes first
    index = _build(chunks, tmp_path)
    assert (index.stats["n_embedded_now"], index.stats["n_reused"]) == (2, 4)
