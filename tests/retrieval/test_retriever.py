from __future__ import annotations

import numpy as np

from ktcli.retrieval.retriever import LEXICAL_WEIGHT, HybridIndex, _fuse
from ktcli.types import Chunk, Span
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
    chunks = make_doc_chunks("a.txt", ["a", "b", "c", "d", "e"])
    dense = [(0, 0.9), (1, 0.8), (2, 0.5), (4, 0.5)]  # scaled: a 1, b 0.75, c 0, e 0
    lexical = [(2, 9.0), (3, 5.0), (4, 9.0), (0, 1.0)]  # scaled: c 1, d 0.5, e 1, a 0
    hits = _fuse(chunks, dense, lexical, 5)
    w = LEXICAL_WEIGHT
    assert [h.chunk.text for h in hits] == ["a", "b", "c", "e", "d"]
    assert [round(h.score, 12) for h in hits] == [1.0, 0.75, round(w, 12), round(w, 12), round(w / 2, 12)]
    # c and e tie on score; c's best rank (1, lexical) beats e's (3)
    assert (hits[2].dense_rank, hits[2].lexical_rank) == (3, 1)
    assert (hits[4].dense_rank, hits[4].lexical_rank) == (None, 2)


def test_fusion_keeps_a_clear_dense_winner_that_rank_fusion_outvoted():
    # Dense is sure of "a" (0.9 against ~0.3 for the rest); "b" is second in both lists by
    # a hair. Reciprocal ranks would put b first (1/62 + 1/62 > 1/61); scores keep a.
    chunks = make_doc_chunks("a.txt", ["a", "b", "c", "d"])
    dense = [(0, 0.90), (1, 0.31), (2, 0.30), (3, 0.29)]
    lexical = [(3, 4.0), (1, 3.9), (2, 1.0)]
    assert _fuse(chunks, dense, lexical, 1)[0].chunk.text == "a"


def test_fusion_of_single_candidate_lists():
    chunks = make_doc_chunks("a.txt", ["a", "b"])
    hits = _fuse(chunks, [(1, 0.2)], [], 2)
    assert [(h.chunk.text, h.score) for h in hits] == [("b", 1.0)]


def test_section_trail_is_indexed_and_keys_the_cached_vectors():
    from dataclasses import replace

    from ktcli.retrieval.retriever import _plan_parts, indexed_text

    chunk = make_doc_chunks("a.rst", ["body"])[0]
    titled = replace(chunk, section="Classes > Inheritance")
    assert indexed_text(chunk) == "body"
    assert indexed_text(titled).startswith("Classes > Inheritance") and indexed_text(titled).endswith("body")
    # vectors embedded without the trail are not reused for the chunk with it
    assert _plan_parts([chunk], "e")[0].key != _plan_parts([titled], "e")[0].key
    index = HybridIndex.build([titled, *make_doc_chunks("b.txt", ["other words"])], embedder=HashEmbedder(), store=None)
    assert index.lexical.search("inheritance", 5)[0][0] == 0


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


def test_cached_chunks_reads_manifests_only(tmp_path):
    from ktcli.retrieval.retriever import cached_chunks
    from ktcli.retrieval.store import IndexStore

    store = IndexStore(tmp_path)
    old = make_doc_chunks("old.txt", ["alpha beta", "gamma delta"])
    new = make_doc_chunks("new.txt", ["epsilon zeta"])
    assert cached_chunks(old + new, "hash-test", store) == [False, False, False]
    HybridIndex.build(old, embedder=HashEmbedder(), store=store)
    assert cached_chunks(old + new, "hash-test", store) == [True, True, False]
    assert cached_chunks(old, "another-embedder", store) == [False, False]


def _chapters(heading: str, filler: str, fact: str, at: int) -> str:
    return "\n\n".join(f"## {heading} {i}\n\n" + filler * 6 + (fact if i == at else "") for i in range(1, 31)) + "\n"


def test_a_question_in_a_script_the_embedder_cannot_read_is_ranked_by_its_words(real_embedder):
    """all-MiniLM-L6-v2 reads Arabic and Hebrew as single letters: its ranking is noise,
    and stretched to [0, 1] it buried the passage holding every word of the question (BM25's
    clear first) under 8 chapter headings."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    cases = [
        ("ar.md", _chapters("الفصل", "يصف هذا التقرير الوضع العام للإدارة البلدية ومهامها الرئيسية في العام الحالي. ",
                            "تم بناء جسر النيل عام 1902 على يد المهندس أحمد حسن بتكلفة 45000 جنيه.", 13),
         "من بنى جسر النيل؟", "أحمد حسن"),
        ("he.md", _chapters("פרק", "הדוח מתאר את המצב הכללי של העירייה ואת משימותיה העיקריות בשנה הנוכחית. ",
                            "גשר הירקון נבנה בשנת 1925 על ידי המהנדס דוד כהן בעלות של 7000 לירות.", 7),
         "מי בנה את גשר הירקון?", "דוד כהן"),
    ]
    for name, text, question, answer in cases:
        assert real_embedder.vocabulary_share(question) < 0.2
        chunks = chunk_document(document_from_bytes(text.encode(), name, name), chunk_tokens=256, overlap_tokens=32)
        hits = HybridIndex.build(chunks, embedder=real_embedder, store=None).search(question, 8)
        assert answer in hits[0].chunk.text, (name, [h.chunk.text[:30] for h in hits])
    # English is read as words, one-letter ones too: dense search counts in full
    assert real_embedder.vocabulary_share("What's the Q3 figure for Xiaoqing Zhuang?") > 0.9
    assert real_embedder.vocabulary_share("Is X a Y?") == real_embedder.vocabulary_share("C vs C++") == 1.0
    assert real_embedder.vocabulary_share("2023-10-01?") == 1.0


def test_a_heading_alone_comes_after_every_passage_with_text():
    """A heading whose paragraph was too long to share its chunk is a chunk of its own; it
    matched the question's words best (BM25 favours short texts) and gave the model nothing."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    long_paragraph = " ".join(f"Vessel {i} pays its harbour dues monthly at the north pier office." for i in range(40))
    text = f"## Harbour dues\n\n{long_paragraph}\n\n## Lamps\n\n" + "\n".join(FILLER) + "\n"
    chunks = chunk_document(document_from_bytes(text.encode(), "dues.md", "dues.md"), chunk_tokens=128, overlap_tokens=16)
    assert [c.heading_only for c in chunks][:2] == [True, False] and chunks[0].text.strip() == "## Harbour dues"
    hits = HybridIndex.build(chunks, embedder=HashEmbedder(), store=None).search("harbour dues", len(chunks))
    assert hits[-1].chunk.ordinal == 0 and len(hits) == len(chunks)
    # code's comment lines are no headings, nor a text file's or piped text's (a script's
    # comments as often); an outline of headings alone is still found
    comments = b"".join(b"# Usage note %d: the backup script copies /srv/data to the NAS at 02:%02d\n" % (i, i)
                        for i in range(30)) + b"rsync -a /srv/data nas:/backup\n" * 20
    for name in ("a.py", "notes.txt", "<stdin>"):
        doc = document_from_bytes(comments, name, "" if name == "<stdin>" else name, is_stdin=name == "<stdin>")
        assert not any(c.heading_only for c in chunk_document(doc, chunk_tokens=128, overlap_tokens=16)), name
    outline = chunk_document(document_from_bytes(b"# Dues\n\n# Moorings\n\n# Lamps\n", "o.md", "o.md"), chunk_tokens=4,
                             overlap_tokens=0)
    index = HybridIndex.build(outline, embedder=HashEmbedder(), store=None)
    assert all(c.heading_only for c in outline) and "# Moorings" in index.search("moorings", 1)[0].chunk.text


def test_a_csv_rows_figures_are_terms_of_their_own():
    """"Northwind PL,2023,3,7.77,5.55" was one term past its name: a question by year and
    quarter found rows of other years."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.retrieval.lexical import tokenize

    rows = ["entity,year,quarter,revenue_musd,opex_musd"]
    for year in range(2014, 2024):
        for entity in ("Northwind PL", "Contoso AG", "Fabrikam BV", "Tailspin SA"):
            rows += [f"{entity},{year},{q},{(year * q) % 97 / 10 + 1:.2f},{q + year % 7 / 10:.2f}" for q in (1, 2, 3, 4)]
    text = "\n".join(rows) + "\n"
    chunks = chunk_document(document_from_bytes(text.encode(), "ledger.csv", "ledger.csv"), chunk_tokens=128,
                            overlap_tokens=16)
    index = HybridIndex.build(chunks, embedder=HashEmbedder(), store=None)
    best = index.lexical.search("Northwind PL 2023 3", 1)[0][0]
    assert "Northwind PL,2023,3," in chunks[best].text
    assert tokenize("2023,100,250")[:1] == ["2023"] and tokenize("a 1,000,000 b") == ["a", "1000000", "b"]
    # a decimal comma stays one figure, in prose; a row's fields do not join as one
    assert tokenize("Umsatz 3,5 Mio, Preis 12,50 EUR") == ["umsatz", "3,5", "mio", "preis", "12,50", "eur"]
    assert tokenize("Q3,2023,12.4,1.5,245")[-4:] == ["2023", "12.4", "1.5", "245"]
    # a quoted field keeps its thousands; a TSV's commas are its text (found by review)
    from ktcli.retrieval.retriever import lexical_text

    quoted = Chunk("x.csv", 2, '"Q3 2010","11,250,000"', Span("x.csv", 5, 5), 6, section="columns: quarter,revenue")
    assert "11250000" in tokenize(lexical_text(quoted))
    tsv = Chunk("x.tsv", 2, "Austin\t10,500,000", Span("x.tsv", 5, 5), 6, section="columns: city, state\tpopulation")
    assert "10500000" in tokenize(lexical_text(tsv))


def test_a_question_about_documents_the_embedder_cannot_read_is_said_to_be_a_guess(real_embedder):
    """An English question about Arabic documents: both rankings blind, and the 8 passages
    came with scores of 0.8-1.0."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    text = _chapters("الفصل", "يصف هذا التقرير الوضع العام للإدارة البلدية ومهامها الرئيسية في العام الحالي. ",
                     "تم بناء جسر النيل عام 1902 على يد المهندس أحمد حسن بتكلفة 45000 جنيه.", 13)
    index = HybridIndex.build(chunk_document(document_from_bytes(text.encode(), "ar.md", "ar.md")),
                              embedder=real_embedder, store=None)
    index.search("Who built the Nile bridge?", 8)
    assert index.last_blind
    index.search("من بنى جسر النيل؟", 8)  # in the documents' language: BM25 finds it
    assert not index.last_blind
    english = HybridIndex.build(make_doc_chunks("ops/log.md", [NEEDLE, *FILLER]), embedder=real_embedder, store=None)
    english.search("Who services the pump in bay 7?", 3)
    assert not english.last_blind


def test_a_question_about_several_documents_reads_each_of_them():
    """'Compare the results of the two papers': 7 of 8 passages came from one paper."""
    from tests.retrieval.fakes import make_doc_chunks as chunks_of

    a = chunks_of("a.pdf", [f"Paper A results table {i}: accuracy rose on the benchmark." for i in range(10)])
    b = chunks_of("b.pdf", ["Zebra quokka wombat: figures of the other study."])
    index = HybridIndex.build(a + b, embedder=HashEmbedder(), store=None)
    plain = index.search("What are the results in paper A's table?", 4)
    assert {h.chunk.doc_path for h in plain} == {"a.pdf"}
    compared = index.search("Compare the results tables of the two papers.", 4)
    assert [h.chunk.doc_path for h in compared].count("b.pdf") == 1 and len(compared) == 4
    scores = [h.score for h in compared]
    assert scores == sorted(scores, reverse=True)  # still in rank order
    # a question of one document that says "both" asks nothing of the others
    assert {h.chunk.doc_path for h in index.search("Are both results tables in paper A?", 4)} == {"a.pdf"}


def test_a_passage_repeated_through_a_document_is_retrieved_once():
    """A clause printed on six pages of a 318-page PDF took 6 of a question's 8 places."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    clause = "The tide gauge drifted 4 mm a year according to Ingrid Solvang's survey."
    paragraphs = []
    for i in range(12):
        paragraphs.append(clause if i % 2 == 0 else " ".join(FILLER[i % len(FILLER):] + FILLER[: i % len(FILLER)]))
    text = "\n\n".join(paragraphs) + "\n"
    chunks = chunk_document(document_from_bytes(text.encode(), "t.md", "t.md"), chunk_tokens=24, overlap_tokens=0)
    assert sum(c.text.strip() == clause for c in chunks) == 6
    hits = HybridIndex.build(chunks, embedder=HashEmbedder(), store=None).search("How fast did the tide gauge drift?", 8)
    texts = [" ".join(h.chunk.text.split()) for h in hits]
    assert texts.count(clause) == 1 and texts[0] == clause and len(set(texts)) == len(texts)


def test_an_option_the_question_names_finds_its_entry(real_embedder):
    # BM25 reads "-S" as "s": tar's "-S, --sparse" entry was in none of the 8 passages (probe 125)
    entries = [
        "-s, --preserve-order\n    Sort names to extract to match archive.",
        "-S, --sparse\n    Handle sparse files efficiently.",
        "The file's size is stored in the member's header; it's read before the member's data.",
        "Use -s and -S with care: see the section on the archive's format.",
    ] + FILLER
    index = HybridIndex.build(make_doc_chunks("tar.1", entries), embedder=real_embedder, store=None)
    assert index.search("what does -S do?", 2)[0].chunk.text.startswith("-S, --sparse")
    assert index.search("what does -s do?", 2)[0].chunk.text.startswith("-s, --preserve-order")
