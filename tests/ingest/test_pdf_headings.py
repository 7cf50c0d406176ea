"""Where a PDF's sections start: bookmarks placed at their titles' lines, numbered headings."""

from __future__ import annotations

from ktcli.ingest.pdf_headings import PageSections, numbered_headings, place_bookmarks

PAPER = [
    "Routing Experts for Speech\nAbstract\nWe route experts.\n1 Introduction\nSpeech is hard.\n1.1 Contributions\n"
    "We add two things.",
    "2 Related Work\nMany works exist.\nIn 2023 we saw this.\n3 Method\n3.1 Architecture\nLayers stack.",
    "3.2 Training Procedure\nWe train it.\n3.2.1 Load-balancing loss\nIt balances.\n4 Experiments\nWe test it.\n"
    "References\n[1] Smith, A. Speech. 2020.",
]


def test_a_chain_of_numbered_headings_is_the_outline():
    sections = numbered_headings(PAPER)
    assert sections[0] == PageSections("", ((1, "Abstract"), (3, "1 Introduction"),
                                            (5, "1 Introduction > 1.1 Contributions")))
    assert sections[1] == PageSections("1 Introduction > 1.1 Contributions", (
        (0, "2 Related Work"), (3, "3 Method"), (4, "3 Method > 3.1 Architecture")))
    assert sections[2] == PageSections("3 Method > 3.1 Architecture", (
        (0, "3 Method > 3.2 Training Procedure"),
        (2, "3 Method > 3.2 Training Procedure > 3.2.1 Load-balancing loss"),
        (4, "4 Experiments"), (6, "References")))


def test_lines_that_start_with_a_number_are_no_headings_out_of_the_chain():
    text = ["1 Introduction\n12 Participants took part.\n2 cups of flour\n7 January Was Cold\n2 Method\n3 Results",
            "25 Samples Were Taken\n4 Discussion"]
    headings = [t for s in numbered_headings(text) for _, t in s.headings]
    assert headings == ["1 Introduction", "2 Method", "3 Results", "4 Discussion"]
    # a numbered list, a sentence each, or two headings only: no outline
    assert numbered_headings(["1. Preheat the oven.\n2. Mix the flour.\n3. Bake it."])[0].headings == ()
    assert numbered_headings(["1 Introduction\ntext\n2 Method\ntext"])[0].headings == ()
    # a table's rows are never headings
    assert numbered_headings(["1 | Alpha | 3\n2 | Beta | 4\n3 | Gamma | 5"])[0].headings == ()


def test_bookmarks_start_at_the_lines_that_carry_their_titles():
    texts = ["Title\nSome text.", "Intro words end here.\n3.2 Data Augmentation\nWe augment.\nData Mining Of Very\n"
             "Long Titles\nMore.", "Nothing named here."]
    starts = [(0, ("1 Introduction",)), (1, ("3 Method", "3.2 Data Augmentation")),
              (1, ("3 Method", "3.3 Data Mining Of Very Long Titles")), (2, ("4 Experiments",))]
    sections = place_bookmarks(texts, starts)
    # a title found on no line: the page from its top, as before
    assert sections[0] == PageSections("1 Introduction") and sections[2] == PageSections("4 Experiments")
    assert sections[1] == PageSections("1 Introduction", (
        (1, "3 Method > 3.2 Data Augmentation"),
        (3, "3 Method > 3.3 Data Mining Of Very Long Titles")))  # numbers aside, its first line of two


def test_a_pdfs_chunks_and_citations_are_under_the_section_at_their_lines(tmp_path):
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import load_file
    from ktcli.pipeline.citations import with_sections
    from ktcli.types import Answer, Citation, Corpus, Span
    from tests.ingest.fixtures import make_bookmarked_pdf

    filler = [f"Filler sentence number {i} about the harbor and its many boats." for i in range(30)]
    pages = [["A Paper on Harbors", "1 Introduction", *filler],
             ["2 Tides", *filler, "3 Boats", "The keeper owns a rowing boat named Gull.", *filler[:8]]]
    path = tmp_path / "paper.pdf"
    path.write_bytes(make_bookmarked_pdf(pages, [("1 Introduction", 0), ("2 Tides", 1), ("3 Boats", 1)]))
    doc = load_file(path, "paper.pdf")
    chunks = chunk_document(doc, chunk_tokens=64, overlap_tokens=8)
    heading = doc.text.split("\n").index("3 Boats") + 1
    below = [c for c in chunks if c.span.line_start >= heading]
    assert below and all(c.section == "3 Boats" for c in below)
    # the page's last bookmark was everything on it; now its lines above that are in "2 Tides"
    assert {c.section for c in chunks if c.span.page == 2 and c.span.line_start < heading} == {"2 Tides"}
    gull = heading + 1
    cited = with_sections(Answer("Gull.", (Citation("x", Span(doc.path, gull, gull, 2), label=1),), None),
                          Corpus((doc,), ()))
    assert cited.citations[0].section == "3 Boats"


def test_a_pdf_tables_rows_are_under_its_header_row_across_a_page_break(tmp_path):
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes
    from tests.ingest.fixtures import make_table_pdf

    rows = [["Node", "Depth (m)", "Drift (mS/cm)"]] + [[f"M-{i}", f"{i}.4", f"0.{i:02d}"] for i in range(1, 40)]
    doc = document_from_bytes(make_table_pdf(["Appendix table"], rows, ["End."]), "t.pdf", "t.pdf")
    chunks = chunk_document(doc, chunk_tokens=64, overlap_tokens=8)
    middle = next(c for c in chunks if "M-31 |" in c.text)
    assert middle.section.endswith("columns: Node | Depth (m) | Drift (mS/cm)")


def test_a_contracts_clauses_win_over_the_numbered_list_inside_its_first():
    """The definitions listed 2., 3., 4. under clause 1 made the chain, and clause 3's lines
    sat under "4. Effective Date means..."."""
    text = ["1. Definitions\n1. Agreement means this document\n2. Affiliate means a group company\n"
            "3. Business Day means a weekday\n2. Term\nIt runs two years.\n3. Fees and Payment\nFees are due.\n"
            "4. Confidentiality\nKeep it secret.\n5. Termination\nEither party may end it."]
    titles = [t for _, t in numbered_headings(text)[0].headings]
    assert titles == ["1. Definitions", "2. Term", "3. Fees and Payment", "4. Confidentiality", "5. Termination"]


def test_rows_of_figures_and_numbered_lines_are_no_headings_and_cost_little():
    """A 1,000-page transcript numbers its 25 lines on every page: 86 s to load, and every
    page's trail was "25 MR SMITH: ..."; an invoice's item rows chained across invoices."""
    import time

    transcript = ["\n".join(f"{k} THE WITNESS: Question about the harbor record" for k in range(1, 26))] * 1000
    started = time.perf_counter()
    assert all(s.headings == () for s in numbered_headings(transcript))
    assert time.perf_counter() - started < 5
    invoices = ["1 Widget A 2 10.00 20.00\n2 Gadget B 1 5.00 5.00\n3 Cable C 4 1.00 4.00", "4 Bracket D 2 3.00 6.00"]
    assert all(s.headings == () for s in numbered_headings(invoices))


def test_a_regulations_articles_schedules_and_annexes_are_its_sections():
    text = ["Article 1 - Scope\nThese rules apply.\nArticle 2 - Definitions\nWords mean things.\n"
            "Section 3 applies to every firm.\nARTICLE 3\nRecords are kept.\nSCHEDULE 1\nForms.\nAnnex A: Retention periods\n"
            "Seven years."]
    titles = [t for _, t in numbered_headings(text)[0].headings]
    assert titles == ["Article 1 - Scope", "Article 2 - Definitions", "ARTICLE 3", "SCHEDULE 1", "Annex A: Retention periods"]


def test_a_heading_near_a_pages_foot_keeps_a_chunk_of_its_own(tmp_path):
    """A page's last chunk, filled out, moved back past "3 Boats": no chunk was filed under it."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.types import Document, Page

    filler = [f"Filler sentence number {i} about the harbor and its many boats." for i in range(20)]
    text = "\n".join(["2 Tides", *filler, "3 Boats", "The keeper owns a rowing boat named Gull."])
    page = Page(1, text, headings=((0, "2 Tides"), (21, "3 Boats")))
    doc = Document(path="p.pdf", text=text, kind="pdf", pages=(page,), sha256="0" * 64)
    chunks = chunk_document(doc, chunk_tokens=64, overlap_tokens=8)
    assert chunks[-1].span.line_start == 22 and chunks[-1].section == "3 Boats"


def test_an_agenda_is_no_outline_and_a_short_policys_numbered_sections_are():
    """A meeting's agenda labelled every line after it "3. Launch timeline"; a two-page
    policy's 15 numbered headings were refused as too many for its lines."""
    notes = ("Agenda\n1. Budget review\n2. Vendor selection\n3. Launch timeline\n\nItem 1: Budget review\n"
             "Marco reported that spending is 412,000 NOK.\n")
    assert numbered_headings([notes])[0].headings == ()
    policy = "".join(f"{n}. Part {n}\n\n{n}.1 First rule\nA rule.\n{n}.2 Second rule\nAnother rule.\n\n"
                     for n in range(1, 6))
    titles = [t for _, t in numbered_headings([policy])[0].headings]
    assert len(titles) == 15 and titles[1] == "1. Part 1 > 1.1 First rule"
