"""The plan of a retrieval question counts only the embedding its index still needs."""

from __future__ import annotations

import pytest

from ktcli.config import Settings
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import load_rates, prepare
from ktcli.retrieval.embedder import Embedder
from ktcli.retrieval.retriever import HybridIndex
from ktcli.retrieval.store import IndexStore
from tests.retrieval.fakes import HashEmbedder

QUESTION = "What does part 7 say?"


def _write(doc, parts: int) -> None:
    doc.write_text("\n\n".join(f"## Part {k}\n\nParagraph {k} says something about topic {k}." for k in range(parts)))


def test_a_cached_index_leaves_its_embedding_out_of_the_estimate(tmp_path):
    doc = tmp_path / "notes.md"
    _write(doc, 300)
    settings = Settings(cache_dir=str(tmp_path / "cache"), mode="retrieval")
    first = prepare([str(doc)], QUESTION, "ask", settings, NullReporter())
    embed_s = first.plan.input_tokens / load_rates(settings, first.facts).embed_tok_s
    # Vectors stored under the real embedder's name, as the first ask would leave them.
    fake = HashEmbedder(name=Embedder(settings.embedder).name)
    HybridIndex.build(list(first.chunks), embedder=fake, store=IndexStore(settings.cache_path))
    second = prepare([str(doc)], QUESTION, "ask", settings, NullReporter())
    # (each plan also counts its own measured reading time, read_s)
    saved = (first.plan.est_seconds - first.plan.read_s) - (second.plan.est_seconds - second.plan.read_s)
    assert saved == pytest.approx(embed_s, rel=1e-6)
    _write(doc, 600)  # twice as long: the index entry no longer matches the document
    grown = prepare([str(doc)], QUESTION, "ask", settings, NullReporter())
    # less each plan's measured reading time: the first read's (cold imports, a busy
    # machine) outweighed the embedding of 300 more parts now and then
    assert grown.plan.est_seconds - grown.plan.read_s > first.plan.est_seconds - first.plan.read_s


def test_many_small_files_count_their_source_tags(tmp_path):
    """Read whole, each file sits in a <source id ref> tag: ~25 tokens a file that a folder
    of small files must count, or the plan picks a whole read the window cannot hold."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(330):
        (folder / f"f{i}.txt").write_text(f"File number {i} holds the value {i * 7}.\n")
    settings = Settings(cache_dir=str(tmp_path / "cache"))
    prep = prepare([str(folder)], "What value does file 300 hold?", "ask", settings, NullReporter())
    body = sum(len(d.text.split()) for d in prep.corpus.documents)  # ~8 words a file
    assert prep.plan.input_tokens > 330 * 25 > 3 * body
    assert prep.plan.mode.value == "retrieval"  # 13K tokens with the tags: over the 8K window
