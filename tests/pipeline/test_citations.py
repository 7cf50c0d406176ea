import pytest

from ktcli.pipeline.citations import attribute, backed_labels, cited_labels, has_content, label_citations, merge
from ktcli.types import Chunk, Span


def chunk(path, start, lines, ordinal=0, page=None):
    text = "\n".join(lines)
    return Chunk(path, ordinal, text, Span(path, start, start + len(lines) - 1, page), len(text) // 4, "h" * 64)


def test_attribution_points_at_the_line_with_the_fact():
    c = chunk("notes.txt", 10, [
        "The weather was mild.",
        "The launch code for the vault is 7741-alpha.",
        "Lunch was served at noon.",
    ])
    other = chunk("other.txt", 1, ["Nothing about vaults here.", "Only tea and biscuits."])
    cites = attribute("The vault launch code is 7741-alpha.", [other, c])
    assert cites, "expected a citation"
    top = cites[0]
    assert top.span.path == "notes.txt"
    assert top.span.line_start <= 11 <= top.span.line_end
    assert top.ref.startswith("notes.txt:")


def test_pdf_citations_name_the_page():
    c = chunk("paper.pdf", 40, ["Revenue in Q3 was 4.2 million euros."], page=3)
    cites = attribute("Q3 revenue was 4.2 million euros", [c])
    assert cites[0].ref == "paper.pdf p.3"


def test_no_overlap_no_citation():
    c = chunk("a.txt", 1, ["alpha beta gamma"])
    assert attribute("I don't know.", [c]) == []


def test_a_sentence_with_a_figure_is_cited_to_a_line_that_holds_it():
    # probe 103: "The library was closed for 18 days during the year due to a fire." was
    # cited to the annual report's page about the fire, which has no 18
    report = chunk("report.pdf", 40, ["During the year a fire closed the library and the museum.",
                                      "The museum reopened in the spring."], page=5)
    notes = chunk("notes.txt", 3, ["Branch status:", "Library closed 18 days (repairs)."], 1)
    answer = "The library was closed for 18 days during the year due to a fire."
    cited = attribute(answer, [report, notes], context=0)
    assert (cited[0].span.path, cited[0].span.line_start) == ("notes.txt", 4)
    # without a figure, the words decide as before
    assert attribute("The library was closed during the year due to a fire.", [report, notes],
                     context=0)[0].span.path == "report.pdf"


def test_a_verdict_on_the_input_is_not_cited_but_a_fact_beside_it_is():
    c = chunk("src/storage.py", 1, ["def load(path):", "    # read the code of the shelf file as well as its notes",
                                    "    with open(path) as f:", "        return json.load(f)", "",
                                    "def save(path, books):", "    os.replace(path + '.tmp', path)"])
    for verdict in ("The code is well organized and easy to read.", "Overall the code is well structured."):
        assert attribute(verdict, [c]) == []
    cites = attribute("load(path) opens the path and returns json.load of it. The code is well written.", [c])
    assert cites and all(x.span.line_end <= 5 for x in cites)
    assert attribute("The shelf notes are read as well.", [c])  # "as well" judges nothing


def test_a_sentence_that_says_the_input_lacks_something_is_not_cited():
    # probe 103: an answer that repeats the question's words was cited by them, to a page
    # that says nothing of the answer's claim
    c = chunk("catalog.pdf", 1, ["The X200 ships with a steel case and a charger.",
                                 "Q3 revenue of the X200 line was 4.2 million euros."], page=2)
    for absent in ("The warranty period of the X200 is not mentioned.",
                   "The documents don't mention the X200's warranty period.",
                   "There is no information about the X200 warranty in the text."):
        assert attribute(absent, [c]) == [], absent
    # what it does say beside it is cited
    assert attribute("The X200's warranty is not stated, but it ships with a steel case and a charger.", [c])
    assert attribute("The X200 warranty is not stated. The X200 line made 4.2 million euros in Q3.", [c])
    assert attribute("Revenue of the X200 was not found in the text: 4.2 million euros is Q3's.", [c])


def test_a_heading_the_answer_writes_takes_no_citation():
    # probe 108: "## Release history", copied from the page, took one of the three
    # citations, and the table row that answered got none
    page = chunk("site/index.html", 10, ["Release history", "Version 3.0 was released on 2023-04-02.",
                                         "Version 2.0 was released on 2021-01-15.", "Contact the release team."])
    cited = attribute("## Release history\nVersion 3.0 was released on 2023-04-02.", [page], context=0)
    assert [c.span.line_start for c in cited] == [11]


def test_an_echo_of_the_prompt_is_not_cited():
    c = chunk("tutorial.rst", 1850, ["A docstring should give a short, concise summary of the object's purpose.",
                                     "Enriching Exceptions with Notes", "The main points of the loop statement."])
    echo = "The summary notes are:\n- The main points of this part are:\n- The following notes help."
    assert attribute(echo, [c]) == []
    # the map step's own instruction echoed back got four unrelated sources
    assert attribute("The summary notes are shortened to 1 short line each.", [c]) == []


def test_labels_the_model_wrote_are_kept_in_range():
    chunks = [chunk("a.txt", 1, ["x"]), chunk("b.txt", 5, ["y"])]
    assert cited_labels("see [2] and [1] and [9] and [2]", 2) == [2, 1]
    cites = label_citations([2], chunks)
    assert cites[0].ref == "b.txt:5"


def test_a_label_inside_an_echo_of_the_instructions_is_no_citation():
    """'Answer the question in a few sentences, citing sources like [1].' was the whole
    answer, and [1] its Sources."""
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.pipeline.citations import document_citations

    echo = "Answer the question in a few sentences, citing sources like [1]."
    assert cited_labels(echo, 3) == [] and cited_labels(echo.replace("[1]", "[12]"), 12) == []
    assert cited_labels(f"The vault code is 7741 [2]. {echo}", 3) == [2]
    assert cited_labels("See [3].\n" + echo, 3) == [3]
    docs = [document_from_bytes(b"alpha beta\n", "a.txt", "a.txt"), document_from_bytes(b"gamma\n", "b.txt", "b.txt")]
    assert document_citations(echo, docs, []) == []
    assert [c.ref for c in document_citations(f"{echo} Gamma is in [2].", docs, [])] == ["b.txt"]


def test_merge_drops_citations_inside_others():
    a = chunk("a.txt", 1, ["one", "two", "three"])
    wide = label_citations([1], [a])
    narrow = attribute("two", [a])
    merged = merge(wide, narrow)
    assert len(merged) == 1 and merged[0].ref == "a.txt:1-3"


def test_one_citation_per_pdf_page():
    c = chunk("r.pdf", 10, ["Q3 revenue 5.87 million", "filler", "Q3 revenue grew 5.87 percent"], page=3)
    cites = attribute("Q3 revenue was 5.87 million", [c], context=0)
    assert [x.ref for x in cites] == ["r.pdf p.3"]


def test_each_sentence_cites_its_own_line_first():
    # The second sentence has more rare words; scored as one bag of words, the answer
    # was cited to its page alone (the README's question did this).
    revenue = chunk("report.pdf", 30, ["Q3 revenue was $5.87 million, the strongest quarter."], page=3)
    safety = chunk("report.pdf", 90, ["A recordable incident is a workplace injury that needs treatment beyond first aid."],
                   page=9)
    answer = ("Revenue in Q3 was $5.87 million.\n"
              "The report also mentions a recordable incident, a workplace injury that needs treatment beyond first aid.")
    assert [c.ref for c in attribute(answer, [safety, revenue])] == ["report.pdf p.3", "report.pdf p.9"]
    assert [c.ref for c in attribute(answer, [safety, revenue], by_sentence=False)] == ["report.pdf p.9"]


def test_a_sentence_sharing_one_word_with_a_line_does_not_lead_the_citations():
    c = chunk("a.txt", 1, ["The kiln was relined in June.", "", "Tea is served at four."])
    # "Tea time." shares one word with line 3, and so does the whole answer: coincidence,
    # not a source (a nav bar's "Home" was cited for a summary that said "home").
    assert [c.ref for c in attribute("Tea time. The kiln was relined.", [c])] == ["a.txt:1"]
    nav = chunk("p.html", 1, ["Home | Shop | Care Guides", "", "Quiver trees grow in the Karoo desert."])
    assert [c.ref for c in attribute("The quiver tree's home is the Karoo.", [nav], context=0)] == ["p.html:3"]
    assert [c.ref for c in attribute("Shop quietly.", [nav], context=0)] == []
    assert [c.ref for c in attribute("Tea.", [c])] == ["a.txt:3"]  # a one-word answer: its one word is enough
    # One shared word that names something (a name, a code, a figure) is enough.
    staff = chunk("s.txt", 1, ["Opening hours: 9 to 5.", "Parking: level B2.", "Manager: Dana Whitfield"])
    assert [c.ref for c in attribute("It is Whitfield, per the staff page.", [staff], context=0)] == ["s.txt:3"]
    assert [c.ref for c in attribute("You can park on B2.", [staff], context=0)] == ["s.txt:2"]


def test_citations_of_html_name_the_file_lines():
    from ktcli.pipeline.citations import in_source_lines
    from ktcli.types import Answer, Citation, Corpus, Document, Mode, Plan

    page = Document("page.html", "# Title\n\nThe keeper is Ada.\nEnd.", "html", source_lines=(7, 8, 9, 12))
    text = Document("notes.txt", "a\nb\n", "text")
    plan = Plan(Mode.FULL, "ask", 10, 1, 8192, 384, 10, 2, 0, 1, 0, 1.0, 1)
    cites = (Citation("page.html:3-4", Span("page.html", 3, 4), line=3),
             Citation("notes.txt:2", Span("notes.txt", 2, 2), line=2))
    evidence = [{"ref": "page.html:3", "path": "page.html", "line_start": 3, "line_end": 3, "page": None, "score": 1.0}]
    answer = in_source_lines(Answer("Ada.", cites, plan, {"evidence": evidence}), Corpus((page, text)))
    assert [c.ref for c in answer.citations] == ["page.html:9-12", "notes.txt:2"]
    assert answer.citations[0].span == Span("page.html", 9, 12)
    assert [c.line for c in answer.citations] == [9, 2]  # the matched line, in the file's lines too
    assert answer.stats["evidence"][0]["ref"] == "page.html:9" and answer.stats["evidence"][0]["line_start"] == 9


def test_running_headers_are_not_cited():
    """A page header repeated on every page shares the answer's proper names, but the fact
    is on a line of its own; table rows that differ only in numbers stay citable."""
    pages = []
    for p in range(1, 6):
        body = [f"Northwind Ferry Company - Annual Report 2023 - page {p}"]
        body += [f"Filler text {p}-{k} about harbours and weather." for k in range(8)]
        if p == 4:
            body += ["Net income for the year was $1.93 million.", "Q3 2023 | 5.87 | 39.6%"]
        if p == 5:
            body += ["Q1 2023 | 4.60 | 40.9%", "Q2 2023 | 5.10 | 38.7%", "Q4 2023 | 5.83 | 40.1%"]
        pages.append(chunk("report.pdf", 1 + 20 * p, body, ordinal=p, page=p))
    cites = attribute("In 2023 Northwind Ferry Company made net income of $1.93 million.", pages, context=0)
    assert [c.span.line_start for c in cites] == [90]  # not also the headers of pages 1 and 2
    assert [c.span.line_start for c in attribute("Q3 revenue was 5.87.", pages, context=0)] == [91]


def test_a_line_repeated_with_numbers_of_its_own_on_each_page_stays_citable():
    """'Revenue in Q3 2023 was $5.87 million.' on each quarter's page is content, not a
    running line: its figures differ from page to page without following the page."""
    pages = [chunk("quarters.pdf", 1 + 10 * q, [f"Quarter {q} review", "The board met twice this quarter.",
                                                 f"Revenue in Q{q} 2023 was ${v} million."], ordinal=q, page=q)
             for q, v in zip(range(1, 5), ("4.12", "4.98", "5.87", "5.83"))]
    cites = attribute("Revenue in Q3 2023 was $5.87 million.", pages, context=0)
    assert cites and cites[0].span.page == 3
    # A footer whose number follows the page ('page 2 of 4') or stays is still running.
    footers = [chunk("r.pdf", 1 + 10 * p, ["Acme Lantern Works annual report, page %d of 4" % p, body],
                     ordinal=p, page=p)
               for p, body in zip(range(1, 5), ("Wicks were trimmed.", "Glass was cleaned.",
                                                "Lamp oil costs rose by 9 percent.", "Brass was polished."))]
    cites = attribute("Acme Lantern Works: lamp oil costs rose by 9 percent.", footers, context=0)
    assert [(c.span.page, c.span.line_start) for c in cites] == [(3, 32)]


def test_repeated_lines_of_a_text_file_stay_citable():
    log = chunk("app.log", 1, [f"2026-12-0{d} 12:00 ERROR pump controller lost its link" for d in range(1, 6)])
    assert attribute("The pump controller lost its link.", [log], context=0)


def test_citations_are_named_with_their_section_before_lines_move():
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.pipeline.citations import in_source_lines, with_sections
    from ktcli.types import Answer, Citation, Corpus, Mode, Plan

    md = document_from_bytes(b"# Guide\n\n## Install\n\nRun pip.\n\n## Use\n\nRun it.\n", "guide.md", "guide.md")
    code = document_from_bytes(b"class Shelf:\n    def add(self):\n        return 1\n", "shelf.py", "shelf.py")
    html = document_from_bytes(b"<html><body><h1>Intro</h1>\n\n\n<p>Hello there.</p></body></html>", "p.html", "p.html")
    cites = (
        Citation("guide.md:9", Span("guide.md", 9, 9)),
        Citation("shelf.py:3", Span("shelf.py", 3, 3)),
        Citation("r.pdf p.2", Span("r.pdf", None, None, 2)),
        Citation("p.html:3", Span("p.html", 3, 3)),  # text line 3 ("Hello there."), source line 4
    )
    plan = Plan(mode=Mode.FULL, task="ask", input_tokens=10, question_tokens=2, context_window=8192, answer_budget=64,
                evidence_budget=7000, n_documents=3, n_chunks=0, n_windows=1, top_k=0, est_seconds=1.0,
                est_memory_bytes=1 << 30)
    corpus = Corpus(documents=(md, code, html))
    named = in_source_lines(with_sections(Answer("a", cites, plan), corpus), corpus)
    assert [c.section for c in named.citations] == ["Guide > Use", "class Shelf > def add", "", "Intro"]
    assert named.citations[3].span.line_start == 4 and named.citations[3].section == "Intro"


def test_a_whole_read_answer_of_labels_cites_the_documents_it_names():
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.pipeline.citations import document_citations
    from ktcli.types import Citation

    docs = [document_from_bytes(b"alpha beta\n", "a.txt", "a.txt"), document_from_bytes(b"gamma\n", "b.txt", "b.txt")]
    assert [c.ref for c in document_citations("The [1] is a [2", docs, [])] == ["a.txt"]  # "[2" unclosed
    assert [c.ref for c in document_citations("The [2] is a [1].", docs, [])] == ["b.txt", "a.txt"]
    lined = [Citation("a.txt:1", Span("a.txt", 1, 1))]
    assert [c.ref for c in document_citations("See [1] and [2] and [9].", docs, lined)] == ["b.txt"]


def test_answers_and_notes_in_other_scripts_are_cited_and_kept():
    """Words were [A-Za-z] only: a Russian answer copied from its source had no Sources,
    Russian notes counted as empty (and were not passed on), "Größe" was "gr"."""
    assert has_content("Кошка сидит на окне [3]")
    filler = ["Погода была тёплой.", "Обед в полдень.", "Дождь шёл весь день.", "Поезд опоздал."]
    ru = chunk("ru.txt", 1, filler + ["Кошка сидит на окне и смотрит на улицу."] + filler)
    assert attribute("Кошка сидит на окне и смотрит на улицу.", [ru])[0].ref == "ru.txt:4-6"
    zh = chunk("zh.txt", 1, ["日志写入磁盘。", "天气很好。", "午饭在中午。", "如果连接丢失，服务会在五秒后重试。",
                             "火车晚点了。", "数据库连接在服务启动时建立。"])
    assert attribute("连接丢失时，服务会在五秒后重试。", [zh])[0].ref == "zh.txt:3-5"
    de = chunk("de.txt", 1, ["Die Größe der Datei wird geprüft."] + ["Gross ist nichts."] * 4)
    assert attribute("Die Größe wird geprüft.", [de])[0].ref == "de.txt:1-2"


def test_a_pdf_page_is_cited_by_its_printed_number_where_it_has_one():
    """A book's front matter in roman numerals: its printed page 2 was cited as p.4."""
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.pipeline.citations import in_source_lines
    from ktcli.types import Answer, Citation, Corpus, Mode, Plan
    from tests.ingest.fixtures import make_text_pdf, with_page_labels

    data = with_page_labels(make_text_pdf([["Preface"], ["Contents"], ["Tides"], ["The keeper is Ada Quill."]]), 2)
    doc = document_from_bytes(data, "book.pdf", "book.pdf")
    assert [p.label for p in doc.pages] == ["i", "ii", "1", "2"]
    plain = document_from_bytes(make_text_pdf([["one"], ["two"]]), "plain.pdf", "plain.pdf")
    assert [p.label for p in plain.pages] == [None, None]  # no labels declared: numbers as they are
    plan = Plan(Mode.FULL, "ask", 10, 1, 8192, 384, 10, 1, 0, 1, 0, 1.0, 1)
    cites = (Citation("book.pdf p.4", Span("book.pdf", 4, 4, 4)), Citation("book.pdf p.3", Span("book.pdf", 3, 3, 3)))
    answer = in_source_lines(Answer("Ada.", cites, plan, {}), Corpus((doc,)))
    assert [c.ref for c in answer.citations] == ["book.pdf p.2 (page 4 of the file)", "book.pdf p.1 (page 3 of the file)"]
    # --json says the printed number too: a script had to parse it out of `ref`
    import json

    from ktcli.render.formats import answer_json

    assert [(c["page"], c["page_label"]) for c in json.loads(answer_json(answer))["citations"]] == [(4, "2"), (3, "1")]


def test_each_item_of_a_list_answer_is_cited():
    """The echo filter joined the answer's sentences with spaces, and two list items with no
    closing stop became one sentence: the second item's line went uncited."""
    lines = ["# Report"] + [f"filler line number {i} about general operations and staff" for i in range(40)]
    lines[5] = ("Revenue for the third quarter reached 5.87 million dollars, driven by lantern exports to "
                "Norway, Chile and Japan.")
    lines[30] = "One recordable incident occurred."
    doc = chunk("r.md", 1, lines)
    answer = ("- Revenue third quarter reached 5.87 million dollars, from lantern exports to Norway, Chile and Japan\n"
              "- One recordable incident")
    spans = [(c.span.line_start, c.span.line_end) for c in attribute(answer, [doc])]
    assert any(a <= 6 <= b for a, b in spans) and any(a <= 31 <= b for a, b in spans), spans


@pytest.mark.parametrize(("summary", "nothing"), [
    ("The final summary is:", True),
    ('<pre><span class="varname">LlamaTokenizerFast</span>\nWrite the final summary from these notes: what it is, '
     'how it is organised, and the key facts.</pre>', True),
    ("The final summary: a Python tokenizer.", False),  # short, and its own
    ("Defines Vec<T> and HashMap<K, V>.", False),  # generics are no markup
    ("It parses <config> and <input> files.", False),
])
def test_a_summary_of_markup_and_echo_says_nothing_a_short_one_does(summary, nothing):
    from ktcli.pipeline.citations import markup_or_echo, says_nothing_new
    from ktcli.pipeline.summarize import SUMMARY_MIN_TERMS

    assert says_nothing_new(summary, SUMMARY_MIN_TERMS if markup_or_echo(summary) else 1) is nothing


def test_an_echo_of_the_instructions_with_a_word_of_its_own_is_no_note():
    """A 400-page summary's notes of 50 parts were "Update the summary notes with the main
    points of this part, one short line each, using the following format:", passed on
    and printed as the notes ('using' and 'format' counted as words of its own)."""
    from ktcli.pipeline.citations import has_content

    for echo in ("Update summary notes:", "Update the summary notes with the main points of this part, one short "
                 "line each, using the following format:\n\nUpdate summary notes:",
                 "The final summary is:\n\nThe final summary is a concise and clear summary of the input"):
        assert not has_content(echo), echo
    for note in ("Ada Quill", "The keeper is Ada Quill.", "Revenue: 5.87 million in Q3.",
                 "The part is about the tower and its lamp."):
        assert has_content(note), note


def test_indic_words_are_matched_whole():
    """Their vowel signs are combining marks, no \\w: "दुनिया" fell into single letters, dropped."""
    from ktcli.pipeline.citations import terms

    assert terms("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]


def test_thai_words_and_hindi_sentences_are_matched():
    """A Thai clause was one term, so a paraphrase shared none with any line; a Hindi answer
    of two facts was one sentence (the danda ended none), so one fact was cited."""
    from ktcli.pipeline.citations import _SENTENCE, terms

    assert set(terms("สมชาย ออกแบบสะพาน")) & set(terms("วิศวกรสมชาย ใจดี ออกแบบสะพานแขวน"))
    assert len([s for s in _SENTENCE.split("पहला तथ्य यहाँ है। दूसरा तथ्य वहाँ है।") if s.strip()]) == 2
    assert len([s for s in _SENTENCE.split("من بنى الجسر؟ أحمد بناه.") if s.strip()]) == 2


def test_a_plain_short_answer_keeps_its_label():
    """'The key is given on page 3 [1].' is all prompt words, and lost its citation."""
    from ktcli.pipeline.citations import cited_labels, only_echoes_instructions

    for answer in ("The key is given on page 3 [1].", "The input file has only one page [1].",
                   "The final page names the key facts [1]."):
        assert cited_labels(answer, 3) == [1] and not only_echoes_instructions(answer)
    echo = "Answer the question in a few sentences, citing sources like [1]."
    assert cited_labels(echo, 3) == [] and only_echoes_instructions(echo)


def test_a_label_whose_passage_does_not_back_its_sentence_is_dropped():
    cover = chunk("report.pdf", 1, ["Harbor Light Lantern Company: Annual Report 2023", "Founded in 1987."], page=1)
    factory = chunk("report.pdf", 40, ["The Halden factory opened on 14 September 2023."], page=5)
    # "[1]" copied from the instruction: the factory's passage is [2]; a label alone after
    # its sentence is judged by that sentence
    assert backed_labels("The Halden factory opened on 14 September 2023. [1]", [cover, factory]) == []
    assert backed_labels("The Halden factory opened on 14 September 2023. [2]", [cover, factory]) == [2]
    assert backed_labels("It was founded in 1987 [1] and the Halden factory opened in 2023 [2].",
                         [cover, factory]) == [1, 2]


PASSAGES = ["Harbor Light Lantern Company: Annual Report 2023. Founded in 1987.",
            "The Halden factory opened on 14 September 2023.",
            "The board voted 9 to 2 to postpone the Solvang intake project."]


def _streamed(relabel, pieces):
    return "".join(relabel.feed(p) for p in pieces) + relabel.flush()


def test_a_streamed_label_moves_to_the_passage_that_backs_its_sentence():
    from ktcli.pipeline.citations import Relabel

    relabel = Relabel(PASSAGES)
    # the label arrives in pieces: "[" is held until it is known to be one
    out = _streamed(relabel, ["The Halden factory opened", " on 14 September 2023. [", "1", "]", " The board voted",
                              " 9 to 2 [3]. It was founded in 1987 [1]."])
    assert out == ("The Halden factory opened on 14 September 2023. [2] The board voted 9 to 2 [3]. "
                   "It was founded in 1987 [1].")
    assert relabel.moved == 1
    assert backed_labels(out, [chunk("r.txt", 1, [p]) for p in PASSAGES]) == [2, 3, 1]


def test_labels_left_as_written():
    from ktcli.pipeline.citations import Relabel

    cases = {
        "Nothing here is in any passage. [1]": "Nothing here is in any passage. ",  # no passage holds a word of it
        "Answer the question in a few sentences, citing sources like [1].":
            "Answer the question in a few sentences, citing sources like [1].",
        "See [a], [1234] and x[": "See [a], [1234] and x[",  # no labels; a "[" at the end is given back
    }
    for written, shown in cases.items():
        assert _streamed(Relabel(PASSAGES), [written]) == shown
    # one passage: nothing to move to
    assert _streamed(Relabel(PASSAGES[:1]), ["The Halden factory opened. [1]"]) == "The Halden factory opened. [1]"
    # the token limit cut a label in half: "[1" names no source, and was shown as the answer's end
    assert _streamed(Relabel(PASSAGES), ["The Halden factory opened. [", "1"]) == "The Halden factory opened. "
    assert _streamed(Relabel(PASSAGES[:1]), ["The Halden factory opened. [1"]) == "The Halden factory opened. "
    assert _streamed(Relabel(PASSAGES), ["Use `prices[1"]) == "Use `prices[1"  # code: an index, kept


def test_a_moved_label_that_repeats_the_one_before_it_is_left_out():
    from ktcli.pipeline.citations import Relabel

    relabel = Relabel(PASSAGES)
    assert _streamed(relabel, ["The Halden factory opened on 14 September 2023. [2][1]"]) == (
        "The Halden factory opened on 14 September 2023. [2]")


def test_a_row_quoted_with_its_columns_names_is_cited_to_the_row_not_the_header():
    """An answer copying its key line "Item: Desk, Price: 210 EUR, Stock: 5" was cited to the
    header row, the one line that held "item", "price" and "stock"."""
    table = chunk("prices.md", 1, ["# Prices", "", "| Item | Price | Stock |", "|---|---:|---|",
                                   "| Lamp | 40 EUR | 3 |", "| Chair | 85 EUR | 0 |", "| Desk | 210 EUR | 5 |",
                                   "", "", "", "", "The chair is out of stock."])
    top = attribute("Item: Desk, Price: 210 EUR, Stock: 5", [table])[0]
    assert top.span.line_start <= 7 <= top.span.line_end and top.span.line_start > 4


def test_a_config_key_is_cited_for_the_words_it_joins():
    # A probe: "The database pool size is 25." about a JSON config was cited nowhere: its
    # line `"pool_size": 25,` shared only "25" with it (the index splits identifiers; this did not).
    config = chunk("billing.json", 1, ['{', '  "database": {', '    "host": "db-prod-7.internal",', '    "pool_size": 25,',
                                       '    "timeoutMs": 1500', '  }', '}'])
    assert [c.ref for c in attribute("The database pool size is 25.", [config], context=0)] == ["billing.json:4"]
    assert [c.ref for c in attribute("The timeout is 1500 ms.", [config], context=0)] == ["billing.json:5"]


def test_a_labels_whole_passage_gives_way_to_the_lines_attributed_in_it():
    """A probe's answer from line 13 of an HTML guide was cited `guide.html:1-36`: the
    retrieved chunks of the file read as one passage, the line itself dropped inside it."""
    from ktcli.pipeline.citations import narrowed
    from ktcli.types import Citation

    passage = Citation(ref="guide.html:1-36", span=Span("guide.html", 1, 36), label=1)
    line = Citation(ref="guide.html:12-14", span=Span("guide.html", 12, 14), label=1)
    elsewhere = Citation(ref="notes.txt:3", span=Span("notes.txt", 3, 3), label=2)
    assert narrowed([passage], [line, elsewhere]) == [line]
    assert narrowed([passage], [elsewhere]) == [passage]  # nothing found in it: the passage
    page = Citation(ref="r.pdf p.3", span=Span("r.pdf", 1, 30, page=3), label=1)
    assert narrowed([page], [Citation(ref="r.pdf p.3", span=Span("r.pdf", 5, 6, page=3), label=1)]) == [page]


def test_a_pdf_citation_names_the_page_most_of_its_lines_are_on():
    """A passage read with the next page's first lines (`windows.across_page_breaks`) kept its
    page: the name on page 5's first line was cited "p.4"."""
    from ktcli.pipeline.citations import on_their_pages
    from ktcli.types import Citation, Document, Page

    doc = Document(path="lease.pdf", text="\n".join(f"line {i}" for i in range(1, 21)), kind="pdf",
                   pages=(Page(4, "", 0), Page(5, "", 10, label="v")))
    carried = Citation(ref="lease.pdf p.4", span=Span("lease.pdf", 10, 12, page=4), label=2)
    passage = Citation(ref="lease.pdf p.4", span=Span("lease.pdf", 1, 12, page=4), label=2)
    other = Citation(ref="notes.txt:3", span=Span("notes.txt", 3, 3), label=1)
    moved, kept, same = on_their_pages([carried, passage, other], [doc])
    assert moved.span.page == 5 and moved.span.page_label == "v" and moved.ref == "lease.pdf p.5" and moved.label == 2
    assert kept == passage and same == other


def test_a_sentence_with_a_figure_no_passage_holds_is_not_cited():
    """Asked a salary no document gave, the bundled model answered "2.1 million kroners",
    cited to a line that shared "chief" and "2023"."""
    from ktcli.pipeline.citations import invented_figures

    pump = chunk("report.pdf", 70, ["In 2023 the chief engineer, Quintero, approved pump P-17's replacement."], page=7)
    revenue = chunk("report.pdf", 30, ["Revenue in Q3 2023 was $5.87 million; 38000 lanterns were sold."], page=3)
    made_up = "The chief executive officer's salary in 2023 was 2.1 million kroners."
    assert attribute(made_up, [pump, revenue]) == []
    assert invented_figures(made_up, [pump.text, revenue.text], "What was the salary in 2023?") == ["2.1"]
    # figures the passages hold, however written; single digits and list numbers are no figures
    fine = "1. Revenue in Q3 was 5.87 million [2] and 38,000 lanterns sold, 3 more than planned."
    assert invented_figures(fine, [pump.text, revenue.text]) == []
    assert [c.span.page for c in attribute(fine, [pump, revenue])] == [3]
    assert invented_figures("It rose 12.5% to 61,200 units in 1987.", [revenue.text], "units in 1987?") == ["12.5", "61200"]
    # written otherwise than in the source: the same figure; a date's or a time's parts are none
    same = [("1000", "1 000"), ("1 000", "1,000"), ("5.0", "5"), ("12.50", "12.5"), ("0.5", ".5"),
            ("$1.2 million", "$1,200,000"), ("2024-03-01", "1 March 2024"), ("14:30", "2:30 pm")]
    for answer, source in same:
        assert invented_figures(f"It was {answer} then.", [f"Then: {source}."]) == [], answer
    # a date or a time the source does not give is said, whole
    assert invented_figures("It opened on 1987-01-01.", ["Founded in 1987."]) == ["1987-01-01"]
    assert invented_figures("Disk full at 2024-03-01T05:56:12Z on kestrel-17.",
                            ["2024-03-01T06:24:21Z FATAL disk full on kestrel-17"]) == ["05:56:12"]
    assert invented_figures("The meeting is on March 1, 2024 at 10:00.", ["Meeting: 2024-03-01, 10 am"]) == []
    # a figure the passages hold still has its sentence cited, a year's aside
    assert [c.span.page for c in attribute("Q3 revenue was 5.87 million, up 7.4 percent.", [pump, revenue])] == [3]
    assert attribute("In 2023 the chief engineer earned 2.1 million.", [pump, revenue]) == []


def test_relabel_leaves_indexes_in_code_alone():
    from ktcli.pipeline.citations import Relabel
    passages = ["def first(items):\n    return items[0]", "The widget config lists items and their prices.",
                "Prices are in euros."]
    for answer in ("Use:\n```python\nfirst_price = prices[1]\n```\nDone.", "In Python, `prices[1]` is the second price."):
        relabel = Relabel(passages)
        out = "".join(relabel.feed(answer[i:i + 3]) for i in range(0, len(answer), 3)) + relabel.flush()
        assert out == answer and relabel.moved == 0


def test_an_index_in_code_is_no_label_the_answer_writes():
    answer = "Use `prices[1]` for the first price [2].\n```python\nfirst = prices[3]\n```\nThat is all [1]."
    assert cited_labels(answer, 5) == [2, 1]


def test_a_sentence_of_where_a_name_is_defined_is_cited_to_its_definition():
    # click: the call in exceptions.py held format_filename's words as often as its def
    # and came first in source order
    use = chunk("click/exceptions.py", 352, ["        super().__init__(hint)",
                                             "        self.ui_filename = format_filename(filename)"])
    definition = chunk("click/utils.py", 430, ["def format_filename(",
                                               "    filename: str,", "    shorten: bool = False,", ") -> str:"], 1)
    cited = attribute("The function format_filename is defined in click.utils.", [use, definition], context=0)
    assert cited[0].span.path == "click/utils.py" and cited[0].span.line_start == 430
    # without "defined", nothing changes
    cited = attribute("format_filename turns a filename into text.", [use, definition], context=0)
    assert cited[0].span.path == "click/exceptions.py"


def test_a_definition_of_another_name_gains_nothing_from_defined():
    other = chunk("typer/_click/utils.py", 378, ["class PacifyFlushWrapper:"])
    use = chunk("typer/main.py", 1756, ['        typer.launch("https://typer.tiangolo.com/")'], 1)
    cited = attribute("The typer class is defined in the launch function.", [other, use], context=0)
    assert [c.span.path for c in cited] == ["typer/main.py"]


def test_the_definition_of_the_name_asked_about_outranks_another_defined_name():
    # click: "where is `class Context` defined?" answered "... defined in the `__init__`
    # method of the `Context` class", cited to UsageError's `def __init__(` (its
    # `__init__` counted twice, as itself and as "init"), not to `class Context:` beside it
    context_class = chunk("click/core.py", 211, ["", "", "class Context:",
                                                 '    """The context is a special internal object."""'])
    usage_error = chunk("click/exceptions.py", 82, [
        "    def __init__(self, message: str, ctx: Context | None = None) -> None:",
        "        super().__init__(message)"], 1)
    answer = "The `class Context` is defined in the `__init__` method of the `Context` class."
    cited = attribute(answer, [context_class, usage_error], context=0, asked={"Context"})
    assert (cited[0].span.path, cited[0].span.line_start) == ("click/core.py", 213)


def test_a_dotted_name_asked_about_is_cited_to_its_members_definition():
    # probe 101: "Where is CliRunner.invoke defined?" was cited to `class CliRunner:` and
    # to lines in invoke's body, not to `def invoke(` at line 595
    from ktcli.retrieval.symbols import asked_definitions

    question = "Where is CliRunner.invoke defined?"
    assert asked_definitions(question) == {"CliRunner.invoke"}
    assert asked_definitions("Where is `shelf.Book::load` defined, and the `Reader` class?") == {"shelf.Book::load", "Reader"}
    from dataclasses import replace

    runner_class = replace(chunk("click/testing.py", 317, ["class CliRunner:", '    """The CLI runner provides '
                                                            'functionality to invoke"""']), section="class CliRunner")
    invoke = replace(chunk("click/testing.py", 595, ["    def invoke(", "        self,", "        cli: Command,"], 1),
                     section="class CliRunner > def invoke")
    other = replace(chunk("click/core.py", 853, ["    def invoke(", "        self,", "        callback,"], 2),
                    section="class Context > def invoke")  # another class's invoke: not the one asked
    answer = ("CliRunner.invoke is defined in the `CliRunner` module, which is a wrapper for the "
              "`click.testing.CliRunner` class.")
    for evidence in ([runner_class, invoke, other], [other, runner_class, invoke]):
        cited = attribute(answer, evidence, context=0, asked=asked_definitions(question))
        assert (cited[0].span.path, cited[0].span.line_start) == ("click/testing.py", 595)


def test_a_label_that_is_a_word_of_its_sentence_is_not_cut_out_of_it():
    from ktcli.pipeline.citations import Relabel

    # a diff piped beside a repo: "the tests for [1]" (the diff) came out "the tests for ."
    assert _streamed(Relabel(PASSAGES), ["This change breaks the tests for [1]."]) == \
        "This change breaks the tests for [1]."
    assert _streamed(Relabel(PASSAGES), ["Nothing here is in any passage. [1]"]) == "Nothing here is in any passage. "
    # after an article (minirepo: "The config parsed in the [1] section is the [2] config." read
    # "in the  section is the  config.")
    assert _streamed(Relabel(PASSAGES), ["Nothing is parsed in the [1] section of the [2] file."]) == \
        "Nothing is parsed in the [1] section of the [2] file."


def test_a_label_past_the_passages_read_names_the_one_that_backs_it_or_none() -> None:
    """Found by a probe: "The server srv-lynx in [2] is in [3]." with one file read whole,
    and "[3]" after a comparison of two files: Sources listed [1] (and [2]) only, so the
    answer's labels pointed at nothing."""
    from ktcli.pipeline.citations import Relabel

    cases = {
        "The Halden factory opened in 2023. [7]": "The Halden factory opened in 2023. [2]",  # the passage that backs it
        "Nothing here is in any passage. [7]": "Nothing here is in any passage. ",
        "It was founded in 1987 [1]. See [9].": "It was founded in 1987 [1]. See .",  # a word of its sentence, but no source
        "Answer the question in a few sentences, citing sources like [4].":
            "Answer the question in a few sentences, citing sources like .",
        "Use `prices[7]` here.": "Use `prices[7]` here.",  # code: no label
    }
    for written, shown in cases.items():
        assert _streamed(Relabel(PASSAGES), [written]) == shown, written
    one = [PASSAGES[1]]
    assert _streamed(Relabel(one), ["The Halden factory in [2] opened in [3]."]) == \
        "The Halden factory in [1] opened in [1]."
    assert _streamed(Relabel(one), ["This is a reference to the [2] and [3] sources."]) == \
        "This is a reference to the  and  sources."
    assert _streamed(Relabel(one), ["The Halden factory opened. [1]"]) == "The Halden factory opened. [1]"


def test_names_no_source_holds_are_said_and_names_it_does_are_not():
    """Asked the colour of an item in a JSON file, the bundled model answered "a rare
    mineral found in the Amazon rainforest ... named after the Greek goddess" (probe 98):
    no figure, so nothing was flagged."""
    from ktcli.pipeline.citations import invented_names, warn_of_invented

    passages = ['{"name": "Zephyrine", "colour": "teal"}']
    answer = "Zephyrine is a mineral found in the Amazon rainforest, named by the Greek goddess Zephyros [1]."
    assert invented_names(answer, passages, "What colour is Zephyrine?") == ["Amazon", "Greek", "Zephyros"]
    # a name the input holds elsewhere (not in the passages read) is not made up; nor one the question says
    assert invented_names(answer, passages, "Is it from the Amazon?", elsewhere=["The Greek shop. Zephyros"]) == []
    # sentence starts, months and languages, names in another case, short acronyms, short words: none
    assert invented_names("Tidewater sales rose in March. It is in English. The CEO said so. Ok.",
                          ["TIDEWATER sales"], "") == []
    # a code of letters and digits the CSV does not hold, anywhere in its sentence (probe 118)
    csv = ["container,destination,tonnes\nCMAU5550001,Gdansk,12.4\nMSKU7781234,Oslo,9.1"]
    numbered_on = "CMAU5550001 goes to Gdansk [1]. CMAU5550002 and cmau5550003 go there too, as does MSKU7781234."
    assert invented_names(numbered_on, csv, "") == ["CMAU5550002", "cmau5550003"]
    assert invented_names("Dates follow ISO8601 and part CMAU5550002.", ["ISO 8601 dates; CMAU 555000-2"], "") == []
    # a fiscal year or quarter in one word, a hash's name, a short code: not codes to look up
    assert invented_names("Sales in FY2023 and 2023Q3 rose; H1'24 too. It uses sha256 and B2 and A380s.",
                          ["Sales rose in fiscal 2023"], "") == []

    class Said:
        lines: list[str] = []

        def warn(self, text):
            self.lines.append(text)

    said = Said()
    warn_of_invented(answer, passages, "", said, elsewhere=["Zephyros"])
    assert said.lines == ["the answer's names Amazon, Greek stand in none of the input: check them in the sources"]


def test_a_diffs_file_header_lines_are_never_cited():
    """Probe 101: `git diff | ktcli ask - "what changed?"` was cited to the diff's
    `diff --git`, `index`, `---` and `+++` lines, which name the file and say nothing."""
    diff = ("diff --git a/packaging/version.py b/packaging/version.py\nindex 1a2b3c4d..5e6f7a8b 100644\n"
            "--- a/packaging/version.py\n+++ b/packaging/version.py\n@@ -470,6 +470,7 @@ class Version:\n"
            "-        self._version = parse_letter(letter)\n+        self._version = parse_letter(letter.lower())\n")
    chunk = Chunk("<stdin>", 0, diff, Span("<stdin>", 1, 7), len(diff.split()), "x")
    cited = attribute("The change in packaging/version.py lowers the letter passed to parse_letter in Version.",
                      [chunk])
    assert cited and all(c.span.line_start >= 5 for c in cited), cited


def test_a_figure_of_a_delimited_row_is_one_the_passages_hold():
    """Probe 103: asked who owns a budget line, the bundled model quoted the CSV row's
    88000 and was told the figure stood in none of the passages it read (the CSV it read),
    its sentence cited nowhere: no figure was read after a comma."""
    from ktcli.pipeline.citations import invented_figures

    csv = chunk("budget.csv", 1, ["department,line,amount_eur,owner", "Operations,Delivery vans,88000,Lena Fischer",
                                  "Marketing,Online ads,97500,Sofia Marin"])
    answer = "The delivery vans line is 88000 euros, owned by Lena Fischer."
    assert invented_figures(answer, [csv.text]) == []
    assert [c.span.line_start for c in attribute(answer, [csv])] == [1]
    assert invented_figures("Online ads get 97,500 euros.", [csv.text]) == []
    for row in ("a;1234;b", "a\t1234\tb", 'a,"1234",b', "a | 1234 | b"):
        assert invented_figures("It is 1234.", [row]) == [], row
    assert invented_figures("It is 4321.", [csv.text]) == ["4321"]


def test_a_made_up_name_after_a_line_break_inside_a_sentence_is_said():
    """Probe 103: the bundled model wraps its answers, and "... which will be sold to the
    new\\nTidal lantern." named no made-up Tidal: a line's first word read as a sentence's."""
    from ktcli.pipeline.citations import invented_names

    source = "The board approved a greenhouse for the garden."
    assert invented_names("The board approved a greenhouse, sold to the new\nTidal lantern.", [source]) == ["Tidal"]
    assert invented_names("The board approved it,\nTidal says.", [source]) == ["Tidal"]
    # a line after a sentence's end, a heading or a list item still opens a sentence
    opened = "The board approved it.\nTidal lanterns sold.\n## Booking\nHarvest\n- Harvest"
    assert invented_names(opened, [source]) == []


def test_an_answers_written_date_and_twelve_hour_time_are_read_whole():
    """Probe 103: an answer's "2:30 pm" was read as 02:30 and said to stand in none of a
    source's "14:30", and its made-up "14 July 2024" passed as a 14 and a 2024 that other
    lines held (the outage was on 18 July; a lamp runs 14 hours)."""
    from ktcli.pipeline.citations import invented_figures

    source = "On 18 July 2024 the checkout API failed from 14:12 to 14:59 UTC. The lamp runs 14 hours."
    assert invented_figures("It began at 2:12 pm on July 18, 2024.", [source]) == []
    assert invented_figures("It ended at 2:59 p.m.", [source]) == []
    assert invented_figures("It began at 2:13 pm.", [source]) == ["14:13"]
    assert invented_figures("The outage was on 14 July 2024.", [source]) == ["2024-07-14"]
    assert attribute("The checkout API failed on 14 July 2024.", [chunk("incident.txt", 1, [source])]) == []
    # a day and month the source gives without its year, the year elsewhere
    opened = "Halden opened on 14 September. Revenue in 2023 rose."
    assert invented_figures("Halden opened on 14 September 2023.", [opened]) == []
    assert invented_figures("Halden opened on 15 September 2023.", [opened]) == ["2023-09-15"]


def test_a_made_up_figure_beside_a_held_one_is_not_said_to_be_uncited():
    """Probe 108: "TAX_RATE is set to 0.21, ... the VAT of 2.1% ..." was cited to the line
    holding 0.21 (its other figure is held), while stderr said the made-up 2.1 was "(not
    cited)"; a sentence of made-up figures alone is still said to be cited nowhere."""
    from ktcli.pipeline.citations import warn_of_invented

    source = chunk("tax.py", 3, ["TAX_RATE = 0.21  # Dutch standard VAT"])

    class Said:
        def __init__(self):
            self.lines = []

        def warn(self, text):
            self.lines.append(text)

    mixed = "The TAX_RATE is set to 0.21, which is the average of the VAT of 2.1%."
    assert attribute(mixed, [source]) != []
    said = Said()
    warn_of_invented(mixed, [source.text], "What is TAX_RATE?", said)
    assert said.lines == ["the answer's figure 2.1 stands in none of the passages it read: check it in the sources"]
    alone = "TAX_RATE is 0.21. The Dutch VAT is 2.1% of the total."
    assert [c.span.line_start for c in attribute(alone, [source])] == [3]
    said = Said()
    warn_of_invented(alone, [source.text], "What is TAX_RATE?", said)
    assert said.lines == ["the answer's figure 2.1 stands in none of the passages it read (not cited): "
                          "check it in the sources"]


def test_a_year_alone_cites_nothing():
    """Probe 112: the junk answer `<script> document.write(`<h1>2023</h1>`); </script>` was
    cited to three pages of an annual report by "2023" alone, which every page holds. One
    shared name or figure still cites (a year beside other words does too)."""
    said = ["In 2023 the glass studio grew to twelve staff.", "Lantern sales in 2023 reached 9,800 units.",
            "The board met four times during 2023."]
    pages = [chunk("report.pdf", 1 + 10 * k, [text], page=k + 1) for k, text in enumerate(said)]
    assert attribute("<script> document.write(`<h1>2023</h1>`); </script>", pages) == []
    assert attribute("It reached 9,800.", pages)[0].ref == "report.pdf p.2"  # one figure
    assert attribute("The board met in 2023.", pages)[0].ref == "report.pdf p.3"
    # a year is one the same way in every check: a history's "1776" too, as grounding reads it
    history = [chunk("history.txt", 1 + 10 * k, [text]) for k, text in enumerate(
        ["The colony declared its independence in 1776.", "By 1776 the port shipped 4,100 barrels a year."])]
    assert attribute("<h1>1776</h1>", history) == []


def test_a_summarys_code_names_no_file_holds_are_said():
    """idna's summary said "use the `to_ascii()` function ... `to_unicode()`", names in none of
    its files, cited to cli.py and core.py with nothing said (probe 117)."""
    from ktcli.pipeline.citations import invented_code_names, warn_of_invented

    sources = ["def encode(s, uts46=False):\n    return alabel(s)\n", "print(encode(domain).decode('ascii'))\n"]
    summary = ("Use the `to_ascii()` function or `idna.to_unicode()`; `encode()` calls `alabel`, see `cli.py` "
               "and `pyproject.toml`.\n```\nto_bytes()\n```\n`to_ascii()` again.")
    assert invented_code_names(summary, sources) == ["`to_ascii()`", "`to_unicode()`"]
    # a name the rest of the input (or the question) holds is not made up; nor a word inside a longer one
    assert invented_code_names(summary, sources, elsewhere=["def to_ascii(x): ...\nto_unicode = 1"]) == []
    assert invented_code_names("It calls `code()`.", ["print(encode(x))"]) == ["`code()`"]
    assert invented_code_names("it returns `None` or `self`", ["x = 1"]) == []

    class Said:
        def __init__(self):
            self.lines: list[str] = []

        def warn(self, text):
            self.lines.append(text)

    said = Said()
    warn_of_invented(summary, sources, "", said, "summary")
    assert said.lines == ["the summary's code names `to_ascii()`, `to_unicode()` stand in none of the input: "
                          "check them in the sources"]
    said = Said()
    warn_of_invented(summary, sources, "", said)  # an answer's: not checked (a how-to may name calls of its own)
    assert said.lines == []
