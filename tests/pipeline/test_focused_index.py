"""--embed auto: a question about an input with many chunks not in the index cache embeds
those its words point at, says so, and plans so; --embed all embeds every one. The
thresholds (`retriever.FOCUS_FROM`, `FOCUS_CHUNKS`) are made small to see it on a few
chunks, with the real embedder."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ktcli.config import Settings
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.retrieval import retriever

from .fake_backend import FakeBackend
from .test_qa_pipeline import NEEDLE, StatusLog, haystack  # noqa: F401 - a fixture

QUESTION = "What is the vault combination?"


@pytest.fixture(autouse=True)
def small_focus(monkeypatch):
    monkeypatch.setattr(retriever, "FOCUS_FROM", 5)
    monkeypatch.setattr(retriever, "FOCUS_CHUNKS", 6)
    monkeypatch.setattr(retriever, "FOCUS_MIN_MATCHED", 3)


def _settings(tmp_path, **kw):
    return replace(Settings(), cache_dir=str(tmp_path / "cache"), mode="retrieval", **kw)


def test_a_question_embeds_the_chunks_its_words_point_at(haystack, tmp_path):  # noqa: F811
    settings = _settings(tmp_path)
    prep = prepare([str(haystack)], QUESTION, "ask", settings, NullReporter())
    n_chunks = len(prep.chunks)
    assert n_chunks > 10
    # planned so: the reason says what is embedded, the estimate counts it
    said = next(r for r in prep.plan.reasons if "point at" in r)
    assert f"embed the ~6 chunks the question's words point at, of {n_chunks:,} not in the index cache" in said
    every = prepare([str(haystack)], QUESTION, "ask", replace(settings, embed="all"), NullReporter())
    assert not any("point at" in r for r in every.plan.reasons)
    assert every.plan.est_seconds - every.plan.read_s > prep.plan.est_seconds - prep.plan.read_s
    log = StatusLog()
    answer = answer_question(prep, FakeBackend(), settings, log, Tally())
    assert NEEDLE.split(" and ")[0].split("is ")[1] in answer.text  # 31-07-1999, found
    assert answer.stats["embedded_now"] == 6 and answer.stats["not_embedded"] == n_chunks - 6
    assert (f"indexing 6 of {n_chunks:,} chunks (those the question's words point at; "
            f"{n_chunks - 6:,} not embedded: --embed all embeds every one)") in log.lines
    # asked again, its plan finds the chunks it needs held (the BM25 index kept tells which)
    again = prepare([str(haystack)], QUESTION, "ask", settings, NullReporter())
    assert any(r.startswith("embed none: the chunks the question's words point at are in the index cache, "
                            f"and the {n_chunks - 6:,} others not needed") for r in again.plan.reasons)
    assert again.plan.est_seconds - again.plan.read_s < prep.plan.est_seconds - prep.plan.read_s
    # a second question adds what its words point at to what the first kept
    log = StatusLog()
    again = prepare([str(haystack)], "When do the gardens close?", "ask", settings, NullReporter())
    second = answer_question(again, FakeBackend(), settings, log, Tally())
    assert second.stats["reused"] == 6 and 0 < second.stats["embedded_now"] <= 6


def test_embed_all_embeds_every_chunk(haystack, tmp_path):  # noqa: F811
    settings = _settings(tmp_path, embed="all")
    prep = prepare([str(haystack)], QUESTION, "ask", settings, NullReporter())
    answer = answer_question(prep, FakeBackend(), settings, NullReporter(), Tally())
    assert answer.stats["embedded_now"] == len(prep.chunks)


def test_the_plan_says_what_the_run_embeds(haystack, tmp_path):  # noqa: F811
    # planned as a count of FOCUS_CHUNKS: a question whose words the input hardly writes was
    # planned at ~1,000 of torch/fx's chunks and embedded all 2,343 (its words match too few)
    settings = _settings(tmp_path)
    prep = prepare([str(haystack)], "Wie lautet die Zahlenkombination?", "ask", settings, NullReporter())
    assert not any("point at" in r for r in prep.plan.reasons)
    answer = answer_question(prep, FakeBackend(), settings, NullReporter(), Tally())
    assert answer.stats["embedded_now"] == len(prep.chunks)


def test_the_plan_counts_a_diffs_callers_as_the_run_embeds_them(tmp_path):
    # the run searches for the question and the callers of what a piped diff changes
    # (`prepare.search_query`): planned for the question alone, torch/fx with a diff of
    # shape_prop.py said ~895 chunks and the run embedded 1,000
    from .test_piped_beside_files import DIFF, http_client_repo

    repo = http_client_repo(tmp_path)
    for i in range(8):  # callers: none of the question's words, more than FOCUS_CHUNKS
        (repo / "svc" / f"caller{i}.py").write_text(
            f"from svc.http_client import fetch_with_retry\n\n\ndef charge_{i}(session, customer):\n"
            "    return fetch_with_retry(session, customer.invoice_url)\n")
    for i in range(12):  # distractors: the question's words, none of the names
        (repo / f"notes{i}.md").write_text(f"# Notes {i}\n\nThis change may break the build; what does it break?\n")
    settings = _settings(tmp_path, top_k=4)
    prep = prepare(["-", str(repo)], "What does this change break?", "ask", settings, NullReporter(), stdin_text=DIFF)
    said = next(r for r in prep.plan.reasons if "point at" in r)
    answer = answer_question(prep, FakeBackend(), settings, NullReporter(), Tally())
    assert f"embed the ~{answer.stats['embedded_now']} chunks" in said


def test_a_question_asked_again_says_its_chunks_are_reused(haystack, tmp_path):  # noqa: F811
    # more chunks than FOCUS_FROM still missing, and none the question points at: the status
    # said "indexing 0 of N chunks"
    settings = _settings(tmp_path)
    prep = prepare([str(haystack)], QUESTION, "ask", settings, NullReporter())
    answer_question(prep, FakeBackend(), settings, NullReporter(), Tally())
    n_chunks = len(prep.chunks)
    log = StatusLog()
    again = answer_question(prepare([str(haystack)], QUESTION, "ask", settings, NullReporter()), FakeBackend(),
                            settings, log, Tally())
    assert again.stats["embedded_now"] == 0 and again.stats["reused"] == 6
    assert not any(line.startswith("indexing 0 ") for line in log.lines)
    assert (f"index reused from the cache: it holds the chunks the question's words point at (6 of {n_chunks:,} "
            f"chunks; {n_chunks - 6:,} not embedded: --embed all embeds every one)") in log.lines
