"""A PDF's running heads and feet: out of the text but once, and their page numbers as labels."""

from __future__ import annotations

from ktcli.ingest.running_lines import strip_running_lines


_WORDS = ["tides", "lanterns", "fog", "keepers", "ships", "bells", "charts", "gulls", "reefs", "storms"]


def _body(i: int) -> list[str]:
    """A page's text, its sentence running on to the next page (as a report's does)."""
    return [f"A paragraph about {_WORDS[i]}, {i * i} of them.",
            f"The second line on {_WORDS[i]} says {i * 7}, and its sentence runs on to the next page where"]


def _pages(n: int, head: str | None, foot: str | None, first: int = 1) -> list[str]:
    out = []
    for i in range(n):
        lines = [head.format(i + first)] if head else []
        lines += _body(i)
        lines += [foot.format(i + first)] if foot else []
        out.append("\n".join(lines))
    return out


def test_a_head_is_kept_on_its_first_page_only_and_a_bare_page_number_nowhere():
    texts, labels = strip_running_lines(_pages(5, "Journal of Tides, Vol. 12 (2023)", "- {} -"))
    assert texts[0] == "\n".join(["Journal of Tides, Vol. 12 (2023)"] + _body(0))
    for i, text in enumerate(texts[1:], start=1):
        assert text == "\n".join(_body(i))
    assert labels == [None] * 5  # the feet count from 1: each page's own number


def test_a_page_number_that_is_not_the_pages_index_becomes_its_label():
    texts, labels = strip_running_lines(_pages(6, "Proceedings of the Harbor Society", "Page {} of 360", first=345))
    assert labels == [str(n) for n in range(345, 351)]  # "of 360" stays put: not the counting number
    assert texts[1] == "\n".join(_body(1))
    assert texts[0].startswith("Proceedings of the Harbor Society\n")  # kept where it first stands
    assert "Page 345" not in texts[0]  # counts the pages: gone everywhere


def test_a_chapter_opening_page_without_a_number_counts_on_between_its_neighbours():
    pages = _pages(6, None, "{}", first=11)
    pages[2] = "Chapter 3\nTides come in twice a day.\nEvery page of the chapter says so."  # no foot
    _, labels = strip_running_lines(pages)
    assert labels == ["11", "12", "13", "14", "15", "16"]


def test_lines_of_the_text_and_short_documents_are_left_alone():
    # two pages are too few to tell a head from a repeated line
    assert strip_running_lines(_pages(2, "Report", "{}"))[0] == _pages(2, "Report", "{}")
    # a line that recurs on fewer than 40% of the pages is the text's own
    pages = _pages(10, None, None)
    for i in (0, 4, 8):
        pages[i] = "Summary of results\n" + pages[i]
    assert strip_running_lines(pages)[0] == pages
    # a line whose figures change from page to page is the page's own, however alike it looks
    slips = [f"Pay period: month {m}\n" + "\n".join(_body(m)) + f"\nNet pay: {2810 + 37 * m * m}.00" for m in range(6)]
    assert strip_running_lines(slips) == (slips, [None] * 6)  # "month 3" counts on, but is no page number
    invoices = [f"Invoice {1001 + i}\n" + "\n".join(_body(i)) for i in range(5)]
    assert strip_running_lines(invoices) == (invoices, [None] * 5)
    # a table's rows (cells joined by " | ") are never furniture, header rows included
    table = ["Quarter | Revenue | Units\n" + p for p in _pages(5, None, None)]
    assert strip_running_lines(table)[0] == table


def test_only_the_outermost_lines_go_up_to_the_pages_own_text():
    pages = [f"Harbor Report\nIntroduction\nand on {_WORDS[i]},\n{i + 1}" for i in range(4)]  # (text running on)
    pages[1] = "Harbor Report\nand on lanterns,\nIntroduction\n2"  # "Introduction" here is the page's own, not at its edge
    texts, _ = strip_running_lines(pages)
    assert texts[0] == "Harbor Report\nIntroduction\nand on tides,"
    assert texts[1] == "and on lanterns,\nIntroduction"
    assert texts[2] == "and on fog,"


def test_a_pdf_is_read_without_its_heads_and_cited_by_its_printed_numbers(tmp_path):
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.pipeline.citations import in_source_lines
    from ktcli.types import Answer, Citation, Corpus, Mode, Plan, Span
    from tests.ingest.fixtures import make_text_pdf

    body = [["The tide tables of Port Alder list two highs a day.", "Their readings were taken by the harbor"],
            ["master, who kept them for forty years.", "The keeper is Ada Quill."],
            ["Lanterns were lit at dusk.", "The fog bell rang every thirty seconds, from dusk until"],
            ["dawn; the last keeper left in 1971.", "The light is automatic now."]]
    pages = [["Annals of the Harbor Society, 1998"] + lines + [f"{101 + i}"] for i, lines in enumerate(body)]
    doc = document_from_bytes(make_text_pdf(pages), "annals.pdf", "annals.pdf")
    assert doc.text.count("Annals of the Harbor Society") == 1
    # a sentence that ran over a page break reads on, with no foot or head between its halves
    assert "taken by the harbor\nmaster, who kept them" in doc.text
    assert [p.label for p in doc.pages] == ["101", "102", "103", "104"]
    # the model reads a passage under the page's printed number, as the user's citation names it
    from ktcli.ingest.chunking import chunk_document
    from ktcli.pipeline.prompts import passages

    assert 'ref="annals.pdf p.102"' in passages([c for c in chunk_document(doc) if c.span.page == 2])
    plan = Plan(Mode.FULL, "ask", 10, 1, 8192, 384, 10, 1, 0, 1, 0, 1.0, 1)
    answer = in_source_lines(Answer("Ada.", (Citation("annals.pdf p.2", Span("annals.pdf", 2, 2, 2)),), plan, {}),
                             Corpus((doc,)))
    assert answer.citations[0].ref == "annals.pdf p.102 (page 2 of the file)"


def test_labels_the_pdf_declares_come_before_the_numbers_its_feet_print():
    from ktcli.ingest.loaders import document_from_bytes
    from tests.ingest.fixtures import make_text_pdf, with_page_labels

    pages = [["Tides and lanterns", "The keeper lit the lamp.", "Ships passed in the night.", f"{i + 40}"]
             for i in range(1, 6)]
    doc = document_from_bytes(with_page_labels(make_text_pdf(pages), 2), "book.pdf", "book.pdf")
    assert [p.label for p in doc.pages] == ["i", "ii", "1", "2", "3"]


def test_a_whole_pdf_read_is_named_by_its_printed_numbers_in_the_evidence():
    """--json's evidence of a whole read said "p.1-4" where its citations said "p.102"."""
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.pipeline.citations import documents_read
    from tests.ingest.fixtures import make_text_pdf

    pages = [[f"On {word}.", "The keeper lit the lamp.", f"Page {101 + i}"] for i, word in enumerate(_WORDS[:4])]
    (entry,) = documents_read([document_from_bytes(make_text_pdf(pages), "annals.pdf", "annals.pdf")])
    assert (entry["ref"], entry["pages"], entry["page_labels"]) == (
        "annals.pdf p.101-104 (pages 1-4 of the file)", [1, 4], ["101", "104"])
    plain = document_from_bytes(make_text_pdf([[f"On {w}."] for w in _WORDS[:3]]), "plain.pdf", "plain.pdf")
    (entry,) = documents_read([plain])
    assert entry["ref"] == "plain.pdf p.1-3" and "page_labels" not in entry


def test_a_foot_first_printed_after_the_front_matter_is_kept_nowhere():
    """A report's foot first printed on page 3 was kept there, between "tokeni-" and "zation"."""
    pages = ["Coastal Sensors\nA technical report", "Contents\n1 Introduction"]
    pages += ["\n".join(_body(i)) + ("\nWords on tokeni-" if i == 0 else "\nzation of it, then,")
              + "\nTechnical Report TR-7: Sensors" for i in range(5)]
    texts, _ = strip_running_lines(pages)
    assert texts[2].endswith("Words on tokeni-")
    # read once, above the first page's text (a cover without a legend lost it from the whole text)
    assert texts[0] == "Technical Report TR-7: Sensors\n" + pages[0] and texts[1] == pages[1]
    assert "".join(texts).count("Technical Report") == 1


def test_a_head_of_two_ends_and_a_foot_read_after_it_go_too():
    """A contract's head "CONFIDENTIAL - Master Services Agreement" left and "Ref: NW-17"
    right was joined as one row ("X | Y") and kept; its "Page N of 20", which pypdf read
    third from the top, was beyond the edge looked at: both split a sentence."""
    pages = ["CONFIDENTIAL - Master Services Agreement | Ref: NW-17\nPage " + str(i + 1) + " of 6\n"
             + "\n".join(_body(i)) for i in range(6)]
    texts, labels = strip_running_lines(pages)
    assert texts[0] == "CONFIDENTIAL - Master Services Agreement | Ref: NW-17\n" + "\n".join(_body(0))
    assert all(t == "\n".join(_body(i)) for i, t in enumerate(texts[1:], start=1))
    assert labels == [None] * 6


def test_a_short_documents_own_wrapped_line_is_no_foot():
    """A 6-page regulation repeated a wrapped line of its wording at the foot of 3 pages,
    and it was dropped: "...including the persons / authority to verify compliance"."""
    line = "consulted, the conclusions reached and any actions arising, in a manner that allows the competent"
    pages = ["\n".join(_body(i)) + (f"\n{line}" if i in (1, 3, 4) else "") for i in range(6)]
    assert strip_running_lines(pages)[0] == pages


def test_a_batch_of_pages_each_its_own_keeps_what_they_share():
    """Invoices, forms and slides: each page ends where its text ends. Their shared lines
    ("Payment terms: Net 30 days", a form's answer, a slide's title) are each page's own:
    read as furniture, invoice 1004's terms were taken from page 1's invoice."""
    invoices = [f"Invoice {1001 + i}\nItem {_WORDS[i]}: {i + 2} units.\nTotal due: {100 + 37 * i} EUR.\n"
                f"Payment terms: Net 30 days.\nIBAN DE44 5001 0517 5407 3249 31" for i in range(5)]
    assert strip_running_lines(invoices)[0] == invoices
    forms = [f"Permit application {i}\nApplicant: {_WORDS[i]}\n[form field Safety inspection passed: Yes]\n"
             "[form field Mooring zone: B]" for i in range(5)]
    assert strip_running_lines(forms)[0] == forms
    slides = [f"Results by region\n{_WORDS[i].title()} rose by {i + 3}%." if i % 2 else f"Agenda item {i}\nWe met." for i in range(10)]
    assert "".join(strip_running_lines(slides)[0]).count("Results by region") == 5
    # a page number among them still goes, and names the pages
    numbered = [f"{t}\n- {i + 7} -" for i, t in enumerate(invoices)]
    texts, labels = strip_running_lines(numbered)
    assert texts == invoices and labels == [str(i + 7) for i in range(5)]


def test_a_reports_head_goes_though_every_page_ends_a_paragraph():
    """Pages of prose ending in full sentences kept "Acme Harbor Trust - Annual Report 2023"
    on every page."""
    prose = "The trust maintained its moorings and lights through the year, as the board reported."
    pages = [f"Acme Harbor Trust - Annual Report 2023\n" + "\n".join([f"{_WORDS[i].title()}: " + prose] * 14)
             + f"\nPage {i + 1} of 6" for i in range(6)]
    texts, _ = strip_running_lines(pages)
    assert "".join(texts).count("Acme Harbor Trust") == 1 and "Page " not in "".join(texts)


def test_a_reports_head_goes_though_each_short_page_is_a_section_of_its_own():
    """A report of a section a page (the sample annual report with its title printed at the
    top of each page): pages of 6 to 10 lines, each ending its section, kept the head on
    every page (the pages of prose had to hold 12 lines); a bare page number under a
    "Confidential" foot stayed too, joined to it."""
    from ktcli.ingest.loaders import document_from_bytes
    from tests.ingest.fixtures import make_text_pdf

    prose = "the harbor board kept its lights and moorings in order through the year."
    pages = [["Harbor Light Lantern Company - Annual Report 2023", f"{word.title()} and the year"]
             + [f"On {word}, line {n}: {prose}" for n in range(5 + i % 3)] + ["Confidential", f"{i + 1}"]
             for i, word in enumerate(_WORDS[:7])]
    doc = document_from_bytes(make_text_pdf(pages), "report.pdf", "report.pdf")
    assert doc.text.count("Harbor Light Lantern Company - Annual Report 2023") == 1
    assert doc.text.count("Confidential") == 1
    for word in _WORDS[:7]:  # each page's own heading stays, though it starts the page
        assert f"{word.title()} and the year" in doc.text
    # a batch of records keeps what they share: slides of long lines are still few of them
    slides = [f"Results by region\n{_WORDS[i].title()} rose by {i + 3}% over the year, as the survey of the fleet showed."
              for i in range(6)]
    assert strip_running_lines(slides)[0] == slides


def test_a_two_column_tables_header_repeated_on_each_page_is_no_head():
    """A report's table of two columns over four pages repeats "Vessel | Tonnage" at the top
    of each: read as a head of two ends, it went from every page and stood once above the
    report's title, the rows on later pages without their columns' names."""
    import io

    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Table

    from ktcli.ingest.loaders import document_from_bytes

    styles = getSampleStyleSheet()
    prose = ("The harbour board met in the spring and again in the autumn, and at each meeting it reviewed "
             "the state of the moorings, the lights and the dredged channel, as its charter requires. ") * 3
    story = [Paragraph("Harbour Board Report", styles["Title"])]
    for part in range(6):
        if part == 3:
            rows = [["Vessel", "Tonnage"]] + [[f"MV {_WORDS[i % 10].title()} {i}", f"{1000 + 37 * i:,}"] for i in range(170)]
            story += [Paragraph("Fleet register", styles["Heading1"]), Table(rows, repeatRows=1, hAlign="LEFT"), PageBreak()]
        story += [Paragraph(f"Part {part + 1}", styles["Heading1"])] + [Paragraph(prose, styles["BodyText"])] * 6
        story.append(PageBreak())
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4, invariant=1).build(story)
    doc = document_from_bytes(buffer.getvalue(), "board.pdf", "board.pdf")
    assert doc.text.startswith("Harbour Board Report\n")
    table_pages = [page.text for page in doc.pages if "MV " in page.text]
    assert len(table_pages) >= 4
    for page in table_pages:
        assert "Vessel | Tonnage\nMV " in page
    # a head of two ends over prose still goes
    pages = ["CONFIDENTIAL - Harbour Board | Ref: HB-7\n" + "\n".join(_body(i)) for i in range(6)]
    assert "".join(strip_running_lines(pages)[0]).count("CONFIDENTIAL") == 1


def test_a_foot_joined_to_its_page_number_loses_the_number_where_the_foot_stays():
    """Pages read by the table reader joined "Confidential" and the page number at its
    right as one row, "Confidential | 4": in a batch of invoices, whose shared lines stay,
    the number stayed with it (it went where the two were lines of their own)."""
    invoices = [f"Invoice {1001 + i}\nItem {_WORDS[i]}: {i + 2} units.\nTotal due: {100 + 37 * i} EUR." for i in range(5)]
    texts, _ = strip_running_lines([f"{t}\nConfidential | {i + 1}" for i, t in enumerate(invoices)])
    assert texts == [f"{t}\nConfidential" for t in invoices]
    # an end that does not count the pages stays with it
    dated = [f"{t}\nStatement period | 2023" for t in invoices]
    assert strip_running_lines(dated)[0] == dated


def test_heads_that_end_in_the_page_number_under_changing_chapter_titles_go():
    """A GNU manual's heads, "Chapter 4: Function reference 9", each chapter's its own
    shape on too few pages and no page word before the number, were kept on every page
    (libtasn1.pdf: 26 of 36 pages), and the bare numbers atop its chapters' first pages too."""
    from ktcli.ingest.loaders import document_from_bytes
    from tests.ingest.fixtures import make_text_pdf

    prose = "the keeper wrote the readings of the tide into the harbor's book each day."
    chapters = ["Tides", "Lanterns and lamps", "Fog signals", "Keepers of the light"]
    pages = []
    for page in range(1, 13):
        chapter = (page - 1) // 3
        head = str(page) if page % 3 == 1 else f"Chapter {chapter + 1}: {chapters[chapter]} {page}"
        opening = [f"{chapter + 1} {chapters[chapter]}"] if page % 3 == 1 else []
        pages.append([head] + opening + [f"In part {page}, line {n}: {prose}" for n in range(6)])
    doc = document_from_bytes(make_text_pdf(pages), "manual.pdf", "manual.pdf")
    assert "Chapter " not in doc.text
    assert [p.text.split("\n")[0] for p in doc.pages][:4] == ["1 Tides", "In part 2, line 0: " + prose,
                                                             "In part 3, line 0: " + prose, "2 Lanterns and lamps"]
    # a heading of one word and its number that starts each page is the page's own
    steps = ["\n".join([f"Step {page}"] + [f"In part {page}, line {n}: {prose}" for n in range(6)]) for page in range(1, 9)]
    assert strip_running_lines(steps)[0] == steps
    # a batch of records whose line ends in a number counting with the pages keeps it
    slips = [f"Pay period: month {m}\nNet pay: {2810 + 37 * m}.00 EUR" for m in range(1, 7)]
    assert strip_running_lines(slips)[0] == slips
    # under the head, a line of the text that ends in the page's number stays
    pages = [f"Harbor Manual, Chapter 2: {_WORDS[i].title()} {i + 1}\nSee the chart of section {i + 1}\n" + "\n".join(_body(i))
             for i in range(6)]
    texts, _ = strip_running_lines(pages)
    assert [t.split("\n") for t in texts] == [[f"See the chart of section {i + 1}"] + _body(i) for i in range(6)]
    # their numbers name the pages where they are not the pages' own, chapter after chapter
    titles = ["Tides", "Lanterns and lamps", "Fog"]
    pages = [f"Chapter {i // 3 + 1}: {titles[i // 3]} {i + 11}\n" + "\n".join(_body(i)) for i in range(9)]
    texts, labels = strip_running_lines(pages)
    assert texts == ["\n".join(_body(i)) for i in range(9)] and labels == [str(i + 11) for i in range(9)]


def test_a_books_left_heads_that_start_with_the_page_number_go_too():
    """A LaTeX book's heads: "12 CHAPTER 2. LANTERNS" on left pages, "2.1. TIDES 13" on
    right ones; the left ones stayed. A numbered heading atop its page is on one page."""
    pages = ["\n".join([f"{i + 12} CHAPTER 2. LANTERNS" if i % 2 == 0 else f"2.{i // 2 + 1}. TIDES {i + 12}"] + _body(i) * 3)
             for i in range(10)]
    texts, labels = strip_running_lines(pages)
    assert texts == ["\n".join(_body(i) * 3) for i in range(10)] and labels == [str(i + 12) for i in range(10)]
    headings = ["\n".join([f"{i + 1} {word.title()} of the harbor"] + _body(i) * 3) for i, word in enumerate(_WORDS[:6])]
    assert strip_running_lines(headings)[0] == headings
    # a heading with its year atop a page a year is no head, though the years count on
    years = ["\n".join([f"Harbor traffic in {2015 + i}"] + _body(i) * 3) for i in range(8)]
    assert strip_running_lines(years)[0] == years


def test_a_two_column_newsletters_head_goes_though_each_page_ends_a_story():
    """Lines of a column (39 to 50 characters) were not long lines of prose, so a
    newsletter whose every page ended a story kept its head on each."""
    import io

    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.lib.units import cm
    from reportlab.platypus import BaseDocTemplate, Frame, PageBreak, PageTemplate, Paragraph

    from ktcli.ingest.loaders import document_from_bytes

    def furniture(canvas, doc) -> None:  # type: ignore[no-untyped-def]
        canvas.setFont("Helvetica", 8)
        canvas.drawString(2 * cm, A4[1] - 1.2 * cm, "Harbor Notes - Newsletter of the Port Alder Society")
        canvas.drawCentredString(A4[0] / 2, 1.2 * cm, str(doc.page))

    styles = getSampleStyleSheet()
    buffer = io.BytesIO()
    doc = BaseDocTemplate(buffer, pagesize=A4, invariant=1)
    width = (A4[0] - 5 * cm) / 2
    frames = [Frame(2 * cm, 2 * cm, width, A4[1] - 4 * cm), Frame(3 * cm + width, 2 * cm, width, A4[1] - 4 * cm)]
    doc.addPageTemplates([PageTemplate(id="columns", frames=frames, onPage=furniture)])
    story = []
    for page, word in enumerate(_WORDS[:6]):
        story.append(Paragraph(f"Story {page + 1}: the {word} report", styles["Heading2"]))
        story += [Paragraph(" ".join(_WORDS[(page + k * n) % 10] for n in range(60)).capitalize() + ".",
                            styles["BodyText"]) for k in range(1, 4)]
        story.append(PageBreak())
    doc.build(story)
    text = document_from_bytes(buffer.getvalue(), "notes.pdf", "notes.pdf").text
    assert text.count("Harbor Notes") == 1
    assert all(f"Story {n}: the" in text for n in range(1, 7))


def test_a_foot_that_starts_with_the_page_number_and_ends_in_a_year_goes():
    """The head's last number, a year, is no page's: its first one is."""
    prose = [[f"The {word} were counted at dawn by the keepers of the {place}, as every year." for word in _WORDS[:6]]
             for place in _WORDS[2:]]
    pages = ["\n".join(prose[i] + [f"{i + 3} Harbor Light Annual Report 2023"]) for i in range(8)]
    texts, labels = strip_running_lines(pages)
    assert texts == ["\n".join(prose[i]) for i in range(8)] and labels == [str(i + 3) for i in range(8)]


def test_a_lone_hash_sign_at_an_edge_is_no_page_number():
    """valgrind's manual (a PDF) has a shell prompt "#" at a page's foot where other pages
    have a bare page number: the two were one shape, and reading it ended in an IndexError."""
    pages = _pages(6, None, "{}")
    pages[3] = "\n".join(_body(3) + ["#"])
    texts, _ = strip_running_lines(pages)
    assert texts[3].endswith("\n#")
