"""A document's chunks and token count kept by its content (`ingest.chunk_cache`): a warm
run cuts only what changed, into chunks equal to a fresh cut, and never uses a damaged entry."""

from __future__ import annotations

import pytest

from ktcli.checked_json import dumps

from ktcli.ingest import chunk_cache, chunk_corpus, count_tokens, load_corpus
from ktcli.ingest.chunk_cache import chunked


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "notes.md").write_text("# Title\n\n" + "Some prose about lamps. " * 200 + "\n\n## Part\n\nMore.\n")
    (root / "code.py").write_text("import os\n\n\nclass A:\n    def f(self):\n        return 1\n" * 40)
    (root / "wide.txt").write_text("A sentence that goes on. " * 400)  # one line split in pieces (chars)
    (root / "rows.csv").write_text('a,b\n1,"x\ny"\n2,z\n')
    return root


def _cut(corpus, cache):
    return chunked(corpus, chunk_tokens=64, overlap_tokens=8, cache_dir=cache)


def _fresh(corpus):
    return (chunk_corpus(corpus, chunk_tokens=64, overlap_tokens=8), [count_tokens(d.text) for d in corpus.documents])


def _counting(monkeypatch):
    cut = []
    real = chunk_cache.chunk_document

    def counted(doc, **kw):
        cut.append(doc.path)
        return real(doc, **kw)

    monkeypatch.setattr(chunk_cache, "chunk_document", counted)
    return cut


def test_a_warm_run_cuts_nothing_and_equals_a_fresh_cut(folder, tmp_path, monkeypatch):
    corpus = load_corpus([str(folder)])
    cut = _counting(monkeypatch)
    cold = _cut(corpus, tmp_path / "cache")
    assert len(cut) == len(corpus.documents)
    cut.clear()
    warm = _cut(corpus, tmp_path / "cache")
    assert cut == []
    fresh = _fresh(corpus)
    assert cold == warm == fresh
    assert [repr(c) for c in warm[0]] == [repr(c) for c in fresh[0]]  # (types too: True, not 1)
    assert any(c.span.chars for c in warm[0])


def test_an_edited_file_is_cut_again_alone(folder, tmp_path, monkeypatch):
    _cut(load_corpus([str(folder)]), tmp_path / "cache")
    (folder / "notes.md").write_text("# Title\n\nOther prose.\n")
    corpus = load_corpus([str(folder)])
    cut = _counting(monkeypatch)
    assert _cut(corpus, tmp_path / "cache") == _fresh(corpus)
    assert cut == [d.path for d in corpus.documents if d.path.endswith("notes.md")]


def test_other_settings_or_another_path_are_another_entry(folder, tmp_path, monkeypatch):
    corpus = load_corpus([str(folder)])
    _cut(corpus, tmp_path / "cache")
    cut = _counting(monkeypatch)
    other = chunked(corpus, chunk_tokens=32, overlap_tokens=4, cache_dir=tmp_path / "cache")
    assert other == (chunk_corpus(corpus, chunk_tokens=32, overlap_tokens=4), _fresh(corpus)[1])
    assert len(cut) == len(corpus.documents)
    moved = tmp_path / "moved"
    folder.rename(moved)
    cut.clear()
    corpus = load_corpus([str(moved)])
    assert _cut(corpus, tmp_path / "cache") == _fresh(corpus)  # paths are in chunks: not another file's
    assert len(cut) == len(corpus.documents)


def test_a_damaged_entry_is_cut_again_and_rewritten(folder, tmp_path, monkeypatch):
    corpus = load_corpus([str(folder)])
    _cut(corpus, tmp_path / "cache")
    entries = sorted((tmp_path / "cache" / chunk_cache.FOLDER).glob("*.json"))
    assert len(entries) == len(corpus.documents)
    entries[0].write_text(entries[0].read_text().replace('"tokens": ', '"tokens": 1'))  # edited
    entries[1].write_bytes(entries[1].read_bytes()[:50])  # cut short
    entries[2].write_text(dumps(entries[2].name, {"tokens": 3, "chunks": [["x", 1]]}))  # its digest right, its shape not
    entries[3].write_text(dumps(entries[3].name, {"tokens": 3, "chunks": [["x", "1", "", 0, False, 1, 1, None, None, None]]}))
    cut = _counting(monkeypatch)
    assert _cut(corpus, tmp_path / "cache") == _fresh(corpus)
    assert len(cut) == 4
    cut.clear()
    assert _cut(corpus, tmp_path / "cache") == _fresh(corpus)
    assert cut == []


def test_no_cache_folder_keeps_nothing(folder, tmp_path):
    corpus = load_corpus([str(folder)])
    assert _cut(corpus, None) == _fresh(corpus)


def test_the_least_recently_used_go_past_the_limit(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_cache, "MAX_ENTRIES", 2)
    corpus = load_corpus([str(folder)])
    _cut(corpus, tmp_path / "cache")
    assert len(list((tmp_path / "cache" / chunk_cache.FOLDER).glob("*.json"))) == 2
    monkeypatch.setattr(chunk_cache, "MAX_BYTES", 1)  # past its bytes: all but the newest go
    (folder / "more.md").write_text("# More\n\nText.\n")
    _cut(load_corpus([str(folder)]), tmp_path / "cache")
    assert len(list((tmp_path / "cache" / chunk_cache.FOLDER).glob("*.json"))) == 1


def test_what_was_piped_in_is_cut_each_time_and_not_kept(folder, tmp_path, monkeypatch):
    corpus = load_corpus(["-", str(folder)], stdin_text="A piped note about lamps.\n" * 30)
    cut = _counting(monkeypatch)
    cache = tmp_path / "cache"
    assert _cut(corpus, cache) == _fresh(corpus)
    cut.clear()
    assert _cut(corpus, cache) == _fresh(corpus)
    assert cut == ["<stdin>"]
    assert not any("piped note" in p.read_text() for p in (cache / chunk_cache.FOLDER).iterdir())
