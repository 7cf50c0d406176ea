from __future__ import annotations

import numpy as np

from ktcli.retrieval.retriever import RRF_K, HybridIndex, _fuse
from tests.retrieval.fakes import HashEmbedder, make_corpus, make_doc_chunks

NEEDLE = "Ops log: Halvorsen pump, bay 7: serviced every Thursday at 06:30 by the night crew."
QUESTION = "When does the Halvorsen pump get its maintenance?"

# Distractors of two kinds: some share the question's words but not its meaning (they
# fool BM25), others share its meaning but not its rare words (they tempt embeddings).
LEXICAL_TRAPS = [
    "Halvorsen, Halvorsen and Pump LLP: attorneys; see the maintenance of the Halvorsen trust.",
    "Halvorsen Street: when does the council fix its potholes? Halvorsen residents ask.",
]
DENSE_TRAPS = [
    "The coolant pump is overhauled every Monday morning.",
    "Boiler-room water pumps are serviced monthly by facilities.",
    "Pumps at the plant receive upkeep on the first Tuesday of each quarter.",
]
FILLER = [
    "The quarterly report shows revenue up 12% on strong subscription sales.",
    "Python's garbage collector frees reference cycles in generations.",
    "The museum's new wing opens to visitors in the spring.",
    "Rust's borrow checker enforces aliasing rules at compile time.",
    "The committee approved the budget after a short debate.",
    "A binary search halves the interval at every step.",
]


def test_hybrid_finds_the_needle_that_lexical_alone_misses(real_embedder):
    texts = LEXICAL_TRAPS + DENSE_TRAPS + FILLER
    texts.insert(4, NEEDLE)
    chunks = make_doc_chunks("ops/log.md", texts)
    index = HybridIndex.build(chunks, embedder=real_embedder, store=None)
    hits = index.search(QUESTION, 3)
    top = hits[0]
    assert top.chunk.text == NEEDLE, [(h.chunk.text[:40], h.dense_rank, h.lexical_rank) for h in hits]
    assert top.lexical_rank is not None and top.lexical_rank > 1  # the traps beat it on words
    assert top.chunk.span.cite() == "ops/log.md:5"


def test_hybrid_finds_a_config_identifier(real_embedder):
    needle = "jitter_ceiling_ms = 250  # upper bound added to each reconnect pause"
    texts = [
        "retry_delay_seconds = 5  # how long to wait between retries",
        "backoff_factor = 2.0  # multiply the wait after each failed attempt",
        "max_retries = 8  # give up after this many attempts",
        "This setting controls what the connection does when the server goes away.",
        "timeout_ms = 3000  # abort a request that takes longer than this",
        needle,
        *FILLER,
    ]
    index = HybridIndex.build(make_doc_chunks("conf.py", texts), embedder=real_embedder, store=None)
    assert index.search("What does jitterCeilingMs control?", 1)[0].chunk.text == needle


def test_fusion_formula_and_deterministic_ties():
    chunks = make_doc_chunks("a.txt", ["a", "b", "c", "d"])
    dense = [(0, 0.9), (1, 0.8), (2, 0.7)]
    lexical = [(2, 5.0), (3, 4.0)]
    hits = _fuse(chunks, dense, lexical, 4)
    assert hits[0].chunk.text == "c"  # ranks 3 and 1
    assert abs(hits[0].score - (1 / (RRF_K + 3) + 1 / (RRF_K + 1))) < 1e-12
    # a (dense 1) and d (lexical 2)... a: 1/61, b: 1/62, d: 1/62 -> b and d tie on score
    # and on best rank (2); the earlier chunk wins
    assert [h.chunk.text for h in hits] == ["c", "a", "b", "d"]
    assert (hits[2].dense_rank, hits[2].lexical_rank) == (2, None)
    assert (hits[3].dense_rank, hits[3].lexical_rank) == (None, 2)


def test_search_is_deterministic_and_bounded():
    chunks = make_corpus(6, 5)
    index = HybridIndex.build(chunks, embedder=HashEmbedder(), store=None)
    first = index.search("compute value topic alpha", 7)
    assert len(first) == 7
    assert first == index.search("compute value topic alpha", 7)
    assert [h.score for h in first] == sorted((h.score for h in first), reverse=True)
    assert index.search("anything", 0) == []
    assert len(index.search("anything", 1000)) <= len(chunks)


def test_empty_corpus():
    index = HybridIndex.build([], embedder=HashEmbedder(), store=None)
    assert index.search("question", 5) == []
    assert index.stats["n_chunks"] == 0


def test_identical_documents_embedded_once():
    texts = ["one shared line", "another shared line"]
    chunks = make_doc_chunks("a/copy.txt", texts) + make_doc_chunks("b/copy.txt", texts)
    embedder = HashEmbedder()
    index = HybridIndex.build(chunks, embedder=embedder, store=None)
    assert embedder.n_embedded == 2
    vectors = index.dense._index.reconstruct_n(0, 4)
    np.testing.assert_array_equal(vectors[:2], vectors[2:])
