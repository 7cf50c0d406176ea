"""A PDF's pages kept by its bytes (`ingest.extract_cache`): the next read is the same
document without reading the PDF again, and nothing stale or damaged is ever used."""

from __future__ import annotations

import json

import pytest

from ktcli.ingest import extract_cache, load_corpus, pdftext
from ktcli.ingest.errors import TextOverLimit
from ktcli.ingest.extract_cache import kept_under
from tests.ingest.fixtures import damage_page, make_text_pdf

pytest.importorskip("reportlab")


@pytest.fixture
def pdf(tmp_path):
    pages = [["Harbor Light Annual Report", "1. Overview", "Revenue grew."], ["2. Results", "Q3 revenue was 5.87."],
             ["3. Outlook", "More lamps."]]
    path = tmp_path / "report.pdf"
    path.write_bytes(damage_page(make_text_pdf(pages), 2))  # page 2 unreadable: kept as such
    return path


def _no_reading(monkeypatch):
    monkeypatch.setattr(pdftext, "extract_pages", lambda *a, **k: pytest.fail("read the PDF again"))


def test_a_pdf_read_again_is_the_same_document_without_reading_it(pdf, tmp_path, monkeypatch):
    with kept_under(tmp_path / "cache"):
        first = load_corpus([str(pdf)])
    assert first.documents[0].left_out  # the damaged page is said, and kept so
    _no_reading(monkeypatch)
    with kept_under(tmp_path / "cache"):
        again = load_corpus([str(pdf)])
        walked = load_corpus([str(tmp_path)])  # a folder walk reads it from the cache too
    assert again == first
    assert [d.text for d in walked.documents if d.kind == "pdf"] == [first.documents[0].text]


def test_nothing_is_kept_outside_a_run_and_a_new_reader_reads_again(pdf, tmp_path, monkeypatch):
    load_corpus([str(pdf)])
    assert not (tmp_path / "cache").exists()
    with kept_under(tmp_path / "cache"):
        load_corpus([str(pdf)])
    assert len(list((tmp_path / "cache" / extract_cache.FOLDER).glob("*.json"))) == 1
    monkeypatch.setattr(extract_cache, "_reader", lambda: "an upgraded reader")
    calls = []
    real = pdftext.extract_pages
    monkeypatch.setattr(pdftext, "extract_pages", lambda *a, **k: calls.append(1) or real(*a, **k))
    with kept_under(tmp_path / "cache"):
        load_corpus([str(pdf)])
    assert calls == [1]


def test_a_damaged_entry_is_read_again(pdf, tmp_path):
    with kept_under(tmp_path / "cache"):
        first = load_corpus([str(pdf)])
    damaged = [{"texts": ["x"], "unread": []},  # keys missing
               {"texts": "abc", "unread": [], "labels": "abc", "sections": "abc"},  # not lists
               {"texts": [], "unread": [], "labels": [], "sections": []}]  # no pages
    for bad in damaged:
        for entry in (tmp_path / "cache" / extract_cache.FOLDER).glob("*.json"):
            entry.write_text(json.dumps(bad))
        with kept_under(tmp_path / "cache"):
            assert load_corpus([str(pdf)]) == first, bad
            assert load_corpus([str(pdf)]) == first  # (and kept whole again)


def test_an_entry_edited_or_copied_under_another_name_is_read_again(pdf, tmp_path, monkeypatch):
    # Valid JSON of the right shape, changed since it was written: a page edited to say
    # "revenue was 99 dollars" was answered and cited on every later run.
    with kept_under(tmp_path / "cache"):
        first = load_corpus([str(pdf)])
    (entry,) = (tmp_path / "cache" / extract_cache.FOLDER).glob("*.json")
    kept = json.loads(entry.read_text())["payload"]
    assert "Revenue grew." in kept["texts"][0]
    edited = dict(kept, texts=[t.replace("Revenue grew.", "Revenue was 99 dollars.") for t in kept["texts"]])
    other = entry.with_name("0" * 40 + ".json")  # a whole entry of another file, under this one's name
    other.write_text(extract_cache.dumps(other.name, edited))
    written = entry.read_text()
    hand_edited = written.replace("Revenue grew.", "Revenue was 99 dollars.")  # the digest left as it was
    assert hand_edited != written
    for bad in (hand_edited, json.dumps(edited), other.read_text()):
        entry.write_text(bad)
        with kept_under(tmp_path / "cache"):
            again = load_corpus([str(pdf)])
        assert again == first and "99 dollars" not in again.documents[0].text
        _no_reading(monkeypatch)  # and kept whole again: read back
        with kept_under(tmp_path / "cache"):
            assert load_corpus([str(pdf)]) == first
        monkeypatch.undo()


def test_a_kept_pdf_is_held_to_a_walks_text_limit(pdf, tmp_path):
    data = pdf.read_bytes()
    with kept_under(tmp_path / "cache"):
        pages = extract_cache.pdf_pages(data, None, lambda: pdftext.extract_pages(data, "report.pdf"))
        with pytest.raises(TextOverLimit) as cached:
            extract_cache.pdf_pages(data, 60, lambda: pytest.fail("read the PDF again"))
    with pytest.raises(TextOverLimit) as read:
        pdftext.extract_pages(data, "report.pdf", 60)
    assert (cached.value.page, cached.value.pages) == (read.value.page, read.value.pages) == (3, len(pages[0]))


def test_the_least_recently_used_entries_go_past_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(extract_cache, "MAX_ENTRIES", 2)
    with kept_under(tmp_path / "cache"):
        for i in range(4):
            path = tmp_path / f"d{i}.pdf"
            path.write_bytes(make_text_pdf([[f"Document {i}"]]))
            load_corpus([str(path)])
    assert len(list((tmp_path / "cache" / extract_cache.FOLDER).glob("*.json"))) == 2
