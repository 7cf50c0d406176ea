"""Sections a question names by number: their chunks first."""

from __future__ import annotations

from dataclasses import replace

from ktcli.retrieval.retriever import HybridIndex
from ktcli.retrieval.section_names import SectionTable, named_sections
from tests.retrieval.fakes import HashEmbedder, make_doc_chunks


def test_the_numbers_a_question_names():
    assert named_sections("What does section 3.2 say?") == {"3.2"}
    assert named_sections("Compare clause 4.2(b) with Article IV, § 12 and subsection 7.1.3 of appendix B") == {
        "4.2", "IV", "12", "7.1.3", "appendi:B"}  # (an appendix is numbered apart from the clauses)
    # no kind of section before it: a table, a figure, a year, a version
    assert named_sections("What is in Table 3 for 2023, and in version 3.2?") == set()
    assert named_sections("the section on taxes") == set()


def test_a_chunk_is_in_the_section_of_its_trail_or_that_it_opens_early():
    texts = ["Intro words about harbors.", "More about the method.\n3.2 Data Augmentation\nWe add data.\nAnd more.",
             "Back-translated questions.", "Unrelated words.", "Ending of 3.3.\nLast line.\n4 Experiments"]
    chunks = make_doc_chunks("paper.pdf", texts)
    trails = ["1 Introduction", "3 Method > 3.1 Setup", "3 Method > 3.2 Data Augmentation > 3.2.1 Back-translation",
              "3 Method > 3.3 Mining", "3 Method > 3.3 Mining"]
    chunks = [replace(c, section=t) for c, t in zip(chunks, trails)]
    table = SectionTable(chunks)
    assert table.naming({"3.2"}) == {1, 2}  # opens 3.2 in its first half; under 3.2.1
    assert table.naming({"3"}) == {1, 2, 3, 4}
    assert table.naming({"4"}) == set()  # its heading ends the chunk: the chunk is 3.3's
    assert table.naming(set()) == set()


def test_numbered_clauses_in_a_contracts_text_and_lines_that_are_no_headings():
    texts = ["7.3 Either party may terminate this Agreement on 30 days' notice.",
             "Clause 9 Notices\nNotices go by post.",
             "1.5 million people visited in 2023.\n12 participants took part.\n3.2 | 4.5 | 6.1",
             "A Study of Tides\nI think so."]
    table = SectionTable(make_doc_chunks("msa.txt", texts))
    assert table.naming({"7.3"}) == {0} and table.naming({"9"}) == {1}
    assert table.naming({"1.5"}) == table.naming({"12"}) == table.naming({"3.2"}) == table.naming({"A"}) == set()


def test_a_named_sections_chunks_come_first():
    """'What does section 3.2 say?': BM25 found the sentence citing "Section 3.2" and the
    chunk under the heading ranked 18th."""
    texts = ["As described in Section 3.2, the silver data say so; section after section.",
             "Because labelled data is scarce, we translate questions back and forth.",
             "The model has twelve layers and a small adapter.",
             "We evaluate on three datasets in nine languages."]
    chunks = make_doc_chunks("paper.pdf", texts)
    chunks = [replace(c, section=t) for c, t in zip(chunks, ["4 Experiments > 4.1 Datasets", "3 Method > 3.2 Data Augmentation",
                                                           "3 Method > 3.1 Architecture", "4 Experiments > 4.1 Datasets"])]
    index = HybridIndex.build(chunks, embedder=HashEmbedder(), store=None)
    assert index.search("What does section 3.2 say?", 2)[0].chunk.ordinal == 1
    assert index.search("What does section 7 say?", 1)[0].chunk.ordinal == 0  # no such section: the rankings as ever


def test_words_after_a_kind_of_section_are_no_numbers():
    assert named_sections("In this section I show what part of the deal is in chapter a.") == set()
    assert named_sections("SECTION 4 and Chapter II") == {"4", "II"}


def test_a_wrapped_cross_reference_opens_no_section():
    table = SectionTable(make_doc_chunks("r.pdf", ["The tide rose, as\nsection 2.2 shows. The board met.\nMore."]))
    assert table.naming({"2.2"}) == set()


def test_a_clause_is_not_a_schedule_of_the_same_number():
    """"clause 2" was given the chunks of "SCHEDULE 2 - SERVICE LEVELS"."""
    texts = ["2. Services\nThe supplier serves.", "SCHEDULE 2 - SERVICE LEVELS\nAvailability 99.9%."]
    table = SectionTable(make_doc_chunks("msa.txt", texts))
    assert table.naming(named_sections("What does clause 2 say?")) == {0}
    assert table.naming(named_sections("What does Schedule 2 set?")) == {1}
    assert named_sections("Article 12 and Annex A") == {"12", "annex:A"}
