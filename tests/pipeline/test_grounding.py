"""`pipeline.grounding`: "not in the documents" where the question matches nothing read and
the answer stands on nothing read; never where either holds."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from ktcli.config import Settings
from ktcli.pipeline import grounding
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.indexing import embedder_for
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.render.formats import NO_SUCH_YEAR, NOT_IN_DOCUMENTS, answer_json, citations_text

from .fake_backend import FakeBackend

REPORT = ("Harbor Light designs and manufactures storm lanterns.\n"
          "Q3 revenue was $5.87 million, the strongest quarter in the company's history.\n"
          "The Halden factory opened on 14 September 2023 and employs 96 people.\n")


class Cosine:
    """An embedder whose every line is the same distance from every question: `match`."""

    def __init__(self, match: float) -> None:
        self.query = np.array([match, (1 - match ** 2) ** 0.5], dtype=np.float32)

    def embed(self, texts):
        return np.tile(np.array([1.0, 0.0], dtype=np.float32), (len(texts), 1))

    embed_lines = embed

    def embed_query(self, text):
        return self.query


def test_a_question_that_matches_nothing_read_with_an_answer_from_nowhere_is_not_in_the_documents():
    judged = grounding.judge("Who won the 1998 World Cup?", [REPORT], "Brazil won it in Paris.", Cosine(0.2))
    assert judged.not_in_documents and judged.question_words_found == 0 and judged.answer_words_read == 0


def test_either_sign_alone_is_not_enough():
    # the answer stands on what was read (the bundled model copies a line): not judged absent
    copied = "Harbor Light designs and manufactures storm lanterns."
    assert not grounding.judge("Who won the storm lantern award?", [REPORT], copied, Cosine(0.2)).not_in_documents
    # the question matches a line well: the answer's words alone say nothing
    assert not grounding.judge("When did the Halden factory open?", [REPORT], "Brazil won.", Cosine(0.8)).not_in_documents
    # every content word of the question stands in what was read ("open" in "opened")
    assert not grounding.judge("When did the Halden factory open?", [REPORT], "Brazil won.", Cosine(0.2)).not_in_documents


def test_a_question_no_word_of_which_was_read_is_not_in_the_documents_whatever_the_answer_copies():
    # the bundled model, asked for a head of marketing the report never names: "The head of
    # marketing is Helena Brandt." (the chair), every word of it the report's
    copied = "Harbor Light designs and manufactures storm lanterns."
    assert grounding.judge("Who won the 1998 World Cup?", [REPORT], copied, Cosine(0.2)).not_in_documents
    assert not grounding.judge("Who won the cup?", [REPORT], copied, Cosine(0.6)).not_in_documents


def test_an_answer_that_says_the_input_lacks_it_counts_as_standing_on_nothing():
    said = "The winner of the 1998 World Cup is not mentioned in the report's revenue and lanterns."
    assert grounding.judge("Who won the 1998 World Cup?", [REPORT], said, Cosine(0.2)).not_in_documents


def test_a_year_asked_about_that_nothing_read_names_is_not_in_the_documents_however_well_the_question_matches():
    # held-out: "How many residents did the utility serve in 2020?" of a 2024 report,
    # question_match 0.77, answered with the 2024 line
    copied = "Q3 revenue was $5.87 million, the strongest quarter in the company's history."
    judged = grounding.judge("What was the Q3 revenue in 2019?", [REPORT], copied, Cosine(0.8))
    assert judged.not_in_documents and judged.year_unread and judged.as_dict()["year_unread"] is True
    # a year that was read, or a figure that is no year, says nothing
    opened = "The Halden factory opened on 14 September 2023."
    assert not grounding.judge("Which factory opened in 2023?", [REPORT], opened, Cosine(0.8)).not_in_documents
    assert not grounding.judge("Which factory employs 2500 people?", [REPORT], opened, Cosine(0.8)).year_unread
    # a fiscal year's second year is read: "2024" in "2023/24", "2023-24", "FY24"
    for said in ("In the fiscal year 2023/24 revenue was 5.2 million.", "Revenue 2023-24: 5.2 million.",
                 "FY24 revenue was 5.2 million."):
        assert not grounding.judge("What was the revenue in 2024?", [said], said, Cosine(0.8)).year_unread
    assert grounding.judge("What was the revenue in 2025?", ["Revenue 2023-24: 5.2 million."], "5.2",
                           Cosine(0.8)).year_unread
    # a date's month is no second year: "2024-03-12" does not read "2003"
    assert grounding.judge("What was the revenue in 2003?", ["Paid on 2024-03-12."], "5.2", Cosine(0.8)).year_unread
    # whole words: "2020" is not read in "20201"
    assert grounding.judge("What happened in 2020?", [REPORT + "Order 20201 shipped.\n"], opened,
                           Cosine(0.8)).year_unread
    # a year that bounds a span need not be read: a report of 2023 answers "since 2015"
    for question in ("How has revenue grown since 2015?", "What changed between 2010 and 2020?",
                     "Which lanterns were sold before 2019?", "What happened from the end of 2021?"):
        assert not grounding.judge(question, [REPORT], opened, Cosine(0.8)).year_unread, question
    assert grounding.judge("What was revenue in 2019, after the merger?", [REPORT], opened, Cosine(0.8)).year_unread


def test_a_name_or_code_asked_about_that_the_input_never_names_is_not_in_the_documents():
    # probe 135: "What was the revenue in Q5?" -> "The revenue in Q5 was $5.87 million" (Q3's),
    # "What was the revenue in Germany?" -> "21.4 million" (the year's): both matched the
    # report at 0.6, every other word of them the report's
    copied = "Q3 revenue was $5.87 million, the strongest quarter in the company's history."
    for question, named in (("What was the revenue in Q5?", ["Q5"]), ("What was the revenue in Germany?", ["Germany"]),
                            ("How many Halden staff work in Kessing?", ["Kessing"])):
        judged = grounding.judge(question, [REPORT], copied, Cosine(0.8))
        assert judged.not_in_documents and list(judged.names_unread) == named, question
        assert judged.as_dict()["names_unread"] == named
    # named in the input, in any case or form: not judged
    for question in ("When did the Halden factory open?", "What did HARBOR LIGHT make?", "What was Q3 revenue?",
                     "Who is the CEO?", "What was the revenue in September?", "What is Halden's headcount?"):
        assert not grounding.judge(question, [REPORT], copied, Cosine(0.8)).names_unread, question
    # a quarter or half the input writes out
    said = ["Revenue in the third quarter was 5.87 million; in the first half, 9.7 million."]
    for question in ("What was Q3 revenue?", "What was H1 revenue?"):
        assert not grounding.judge(question, said, copied, Cosine(0.8)).names_unread, question
    assert grounding.judge("What was Q4 revenue?", said, copied, Cosine(0.8)).names_unread == ("Q4",)
    # through retrieval: a name in the input but not in the passages read is the input's
    judged = grounding.judge("Where is the Kessing port?", [REPORT], copied, Cosine(0.8), passages=True,
                             whole=["The port of Kessing."])
    assert not judged.names_unread


def test_an_amount_read_only_in_lines_about_something_else_is_not_in_the_documents():
    # probe 135: "What is the price of the Keeper hurricane lamp?" -> "$89" (the Tidewater's),
    # "How much did the company spend on advertising?" -> "$1.93 million" (net income), cited
    report = [REPORT + "The Tidewater lantern sells at a price of $89. The Keeper lamp was discontinued.\n"
                       "Net income for the year was $1.93 million, compared with $1.71 million.\n"
                       "| Quarter | Complaints |\n|---|---|\n| Q3 | 131 |\n"]
    for question, answer, figures in (
            ("What is the price of the Keeper hurricane lamp?", "The Keeper lamp costs $89. [1]", ["89"]),
            ("How much did the company spend on advertising?", "It spent $1.93 million on advertising.", ["1.93"]),
            ("What was the marketing budget?", "The budget was 96 and 5.87 million.", ["96", "5.87"])):
        judged = grounding.judge(question, report, answer, Cosine(0.8))
        assert judged.not_in_documents and list(judged.figures_elsewhere) == figures, question
    # a figure read beside what was asked, anywhere: not judged
    for question, answer in (("What is the price of the Tidewater lantern?", "It costs $89."),
                             ("What was net income?", "Net income was $1.93 million."),
                             ("How many people does the Halden factory employ?", "It employs 96 people."),
                             ("How many complaints were received in Q3?", "131 complaints."),  # a table row
                             ("When did the Halden factory open?", "On 14 September 2023."),
                             ("What was the Tidewater's price?", "It was $89, or 96.")):  # 96 is Halden's: one is enough
        assert not grounding.judge(question, report, answer, Cosine(0.8)).figures_elsewhere, question
    # under a heading that names it: a table's row need not
    guide = ["# Huts\n\n## Curlew Hut\n\n| Bunks | Price |\n|---|---|\n| 14 | 12 |\n\nWren\n----\n\nSleeps 16.\n"]
    assert not grounding.judge("How many bunks does Curlew Hut have?", guide, "14 bunks.", Cosine(0.8)).figures_elsewhere
    assert not grounding.judge("What does a night at Wren cost?", guide, "12 a night, 16 beds.",
                               Cosine(0.8)).figures_elsewhere  # 16 under "Wren" (underlined)
    assert grounding.judge("What does a night at Wren cost?", guide, "12 a night.", Cosine(0.8)).figures_elsewhere
    # a made-up figure is `citations.invented_figures`'s; a "who" answer's figures are asides
    assert not grounding.judge("What was the Keeper's price?", report, "It was $77.", Cosine(0.8)).figures_elsewhere
    assert not grounding.judge("Who chairs the board?", report, "Anna, paid $89.", Cosine(0.8)).figures_elsewhere
    # "compared" is no "company": the words of a line are matched whole, less their endings
    assert not grounding._same_word("compan", "compar") and grounding._same_word("employ", "employee")


def test_through_retrieval_the_rest_of_the_input_is_read_only_where_it_names_the_subject():
    """Cut into units whole, an 11 MB folder cost 8.5 s of CPU a question: only the input's
    texts that write a word of what is asked are read beside the passages, and a name is
    looked for text by text. A figure beside the subject in a text not read still clears
    the answer; a plural of a name the input writes is that name."""
    passage = ["The Tidewater lantern sells at a price of $89."]
    others = ["Unrelated notes, 89 of them.", "The Keeper lamp's price is $89."]
    question = "What is the price of the Keeper lamp?"
    assert not grounding.figures_elsewhere(question, "It costs $89.", passage, passages=True, whole=others)
    assert grounding.figures_elsewhere(question, "It costs $89.", passage, passages=True, whole=others[:1]) == ["89"]
    assert grounding.unread_names("How many Keepers were sold?", ["The Keeper lamp sold well."]) == []
    assert grounding.unread_names("How many Beacons were sold?", ["The Keeper lamp sold well."]) == ["Beacons"]
    assert grounding.unread_names("What did the Keeper cost?", ["A gatekeeper's hut."]) == ["Keeper"]  # a word's start
    # a capitalised word of the question the input writes in another form: its start is enough
    for question in ("How does Searching work?", "What Exceptions can it raise?", "How is Installation done?"):
        assert grounding.unread_names(question, ["search() raises an exception; install it first"]) == [], question


def test_a_question_of_how_to_asks_no_amount():
    """"How do I define a function?" of the Python tutorial: an answer about scopes and "a
    feature of Python 3.10" was said to give another thing's figure (3.1)."""
    tutorial = ("Defining Functions\n\nThe keyword def introduces a function definition.\n\n"
                "Assignment expressions are new in Python 3.10, and the release notes list them.\n")
    answer = "Use def. Pattern matching is a feature of Python 3.10."
    assert grounding.figures_elsewhere("How do I define a function?", answer, [tutorial]) == []
    assert grounding.figures_elsewhere("How does a function get defined?", answer, [tutorial]) == []
    assert grounding.figures_elsewhere("How many functions are defined?", answer, [tutorial]) == ["3.1"]


def test_a_notice_for_figures_read_elsewhere_says_so():
    from ktcli.render.formats import figures_elsewhere
    from ktcli.types import Answer

    misplaced = Answer("It costs $89.", (), None, not_in_documents=True,
                       grounding={"question_match": 0.6, "question_words_found": 1.0, "answer_words_read": 1.0,
                                  "year_unread": False, "names_unread": [], "figures_elsewhere": ["89"]})
    assert figures_elsewhere(["89"]) in citations_text(misplaced) and NOT_IN_DOCUMENTS not in citations_text(misplaced)


def test_a_notice_for_a_name_alone_names_it():
    from ktcli.render.formats import no_such_name
    from ktcli.types import Answer

    named = Answer("Revenue was 5.87 million.", (), None, not_in_documents=True,
                   grounding={"question_match": 0.6, "question_words_found": 0.75, "answer_words_read": 1.0,
                              "year_unread": False, "names_unread": ["Q5"]})
    assert no_such_name(["Q5"]) in citations_text(named) and NOT_IN_DOCUMENTS not in citations_text(named)
    assert "Q5 stands nowhere in the input" in citations_text(named)
    far = replace(named, grounding=named.grounding | {"question_match": 0.2})
    assert NOT_IN_DOCUMENTS in citations_text(far)


def test_a_question_about_the_input_as_a_whole_is_not_judged():
    """`cat README.md | ktcli ask - "What does this project do?"` answered from the README's
    first lines and was said not to be in the documents: the README never says "project"."""
    readme = "# shelf\n\nA tiny command-line catalogue for a home library. It keeps books in one JSON file.\n"
    for question in ("What does this project do?", "What is this document about?", "How do I use this library?",
                     "Explain what this repo is for.", "What is the main point of the paper?", "Give me an overview."):
        assert grounding.judge(question, [readme], "It catalogues books.", Cosine(0.2)) is None, question
    # a word of its own is judged as before ("tags", "Germany")
    assert grounding.judge("What does this project say about Germany?", [readme], "It catalogues books.",
                           Cosine(0.2)).not_in_documents
    assert grounding.judge("Who is the author?", [readme], "Jane Doe.", Cosine(0.2)).not_in_documents


def test_code_is_not_judged():
    assert grounding.judge("What does parse do?", ["```\ndef parse(x):\n    return x\n```\n"], "It parses.",
                           Cosine(0.1)) is None


@pytest.mark.parametrize("question, absent", [("Who won the 1998 World Cup?", True),
                                              ("What was the Q3 revenue?", False)])
def test_the_bundled_embedder_tells_them_apart(question, absent):
    """Real embedder: an unanswerable question with a made-up answer is said absent; an
    answerable one with the same answer is not (its question matches a line)."""
    judged = grounding.judge(question, [REPORT], "Zebras quietly juggle purple xylophones.", embedder_for(Settings()))
    assert judged.not_in_documents is absent


class MadeUp(FakeBackend):
    def _reply(self, messages):
        return "Zebras quietly juggle purple xylophones. [1]"


def test_the_answer_says_so_after_its_text_and_in_json(tmp_path):
    doc = tmp_path / "report.txt"
    doc.write_text(REPORT)
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), mode="full")
    prep = prepare([str(doc)], "Who won the 1998 World Cup?", "ask", settings, NullReporter())
    answer = answer_question(prep, MadeUp(), settings, NullReporter(), Tally())
    assert answer.not_in_documents and NOT_IN_DOCUMENTS in citations_text(answer)
    payload = json.loads(answer_json(answer))
    assert payload["not_in_documents"] is True and payload["grounding"]["question_words_found"] == 0
    prep = prepare([str(doc)], "When did the Halden factory open?", "ask", settings, NullReporter())
    answer = answer_question(prep, FakeBackend(), settings, NullReporter(), Tally())
    assert not answer.not_in_documents and NOT_IN_DOCUMENTS not in citations_text(answer)
    assert json.loads(answer_json(answer))["not_in_documents"] is False


def test_a_notice_for_the_year_alone_says_so():
    """"nothing read matches the question" was said of a question that matched a line at
    0.67, the year its only sign ("revenue in fiscal year 2025" of a 2023/24 summary)."""
    from ktcli.types import Answer

    text = "Revenue was 5.2 million."
    year = Answer(text, (), None, not_in_documents=True,
                  grounding={"question_match": 0.67, "question_words_found": 0.75, "answer_words_read": 1.0,
                             "year_unread": True})
    assert NO_SUCH_YEAR in citations_text(year) and NOT_IN_DOCUMENTS not in citations_text(year)
    both = replace(year, grounding=year.grounding | {"question_match": 0.2})
    assert NOT_IN_DOCUMENTS in citations_text(both)
