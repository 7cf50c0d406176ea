"""Word (.docx), OpenDocument text (.odt) and EPUB files: their text in reading order, their
sections, how they are cited (pages, chapters, paragraphs), how they are found (by name
and by content, stdin included), and every refusal in one line."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from ktcli.errors import InputError
from ktcli.ingest import load_corpus
from ktcli.ingest import loaders
from ktcli.ingest.chunking import chunk_document
from ktcli.ingest.loaders import load_stdin
from ktcli.ingest.sections import document_trails
from ktcli.pipeline import citations
from ktcli.types import CHAPTER, PARAGRAPH, Answer, Corpus, Document, Span
from tests.ingest.office_fixtures import (
    NUMBERING_REL,
    STYLES,
    drawing,
    level,
    make_docx,
    make_epub,
    make_odt,
    numbering_part,
    p,
    r,
    split_runs,
    table,
    xhtml,
)


def load_one(path: Path) -> Document:
    corpus = load_corpus([str(path)])
    assert len(corpus.documents) == 1
    return corpus.documents[0]


def refusal(path: Path | str) -> str:
    with pytest.raises(InputError) as info:
        load_corpus([str(path)])
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def cited(doc: Document, answer: str, chunk_tokens: int = 40) -> list[tuple[str, str]]:
    """(reference, section) of the citations of `answer` over `doc`, as `ktcli ask` makes them."""
    chunks = chunk_document(doc, chunk_tokens=chunk_tokens, overlap_tokens=4)
    corpus = Corpus((doc,))
    found = Answer(answer, tuple(citations.attribute(answer, chunks)), None)  # type: ignore[arg-type]
    found = citations.in_source_lines(citations.with_sections(found, corpus), corpus)
    folder = str(Path(doc.path).parent) + "/"
    return [(c.ref.removeprefix(folder), c.section) for c in found.citations]


def trail_of(doc: Document, words: str) -> str:
    lines = doc.text.split("\n")
    index = next(k for k, line in enumerate(lines) if words in line)
    return document_trails(doc.path, doc.kind, lines).at(index)


# ---- Word ------------------------------------------------------------------------------

CONTRACT = (
    p(r("Lamp Service Agreement"), style="Title")
    + p(r("1. Scope"), style="Heading1")
    + p(split_runs("The supplier maintains the lighthouse lamps", 31), r(" at Harbor Point."),
        '<w:r><w:footnoteReference w:id="2"/></w:r>')
    + p(r("Duties:"), r(extra="<w:tab/>"), r("daily"), r(extra="<w:br/>"), r("second line"))
    + p(r("Trim the wicks"), style="ListBullet")
    + p(r("Check the oil level"), style="ListParagraph", ppr='<w:numPr><w:ilvl w:val="1"/><w:numId w:val="3"/></w:numPr>')
    + p(r("Clean the lens"), style="ListBullet")
    + p(r("1.1 Exclusions"), style="berschrift3")  # a German Word's "Überschrift 3": named "heading 3"
    + p(r("Storm damage is "),
        '<w:del w:id="11" w:author="Bo Lund" w:date="2024-02-01T09:00:00Z"><w:r><w:delText>always </w:delText></w:r></w:del>',
        '<w:ins w:id="12" w:author="Bo Lund" w:date="2024-02-01T09:00:00Z"><w:r><w:t>never </w:t></w:r></w:ins>',
        r("covered."))
    + p(r("Internal: margin is 22 percent.", "<w:vanish/>"), r("Visible terms apply."))
    + p(r("Ask the "), r("keeper", '<w:rStyle w:val="SecretNote"/>'), r("office."))
    + p(r("1.2 Fees"), style="ClauseHeading")  # based on Heading 2: its outline level
    + table(["Item", "Monthly fee"], ["Lamp", "40 EUR"],
            ["Lens", p(r("inner")) + table(["a", "b"], ["c", "d"])])
    + p('<w:commentRangeStart w:id="7"/>', r("Payment is due in 30 days."), '<w:commentRangeEnd w:id="7"/>',
        r(extra='<w:commentReference w:id="7"/>', rpr='<w:rStyle w:val="CommentReference"/>'))
    + p(r("Rate card version "), r(extra='<w:fldChar w:fldCharType="begin"/>'),
        r(extra='<w:instrText xml:space="preserve"> DOCPROPERTY Version </w:instrText>'),
        r(extra='<w:fldChar w:fldCharType="separate"/>'), r("7B"), r(extra='<w:fldChar w:fldCharType="end"/>'),
        r(", page "), r(extra='<w:fldChar w:fldCharType="begin"/>'), r(extra='<w:instrText> PAGE </w:instrText>'),
        r(extra='<w:fldChar w:fldCharType="separate"/>'), r("3"), r(extra='<w:fldChar w:fldCharType="end"/>'), r("."))
    + p(drawing("Map of the harbor with the three lamps"), r(" Figure 1"), '<w:r><w:endnoteReference w:id="1"/></w:r>')
    + p('<w:r><mc:AlternateContent><mc:Choice Requires="wps"><w:drawing><wp:anchor><wp:docPr id="4" name="Text Box 4"/>'
        '<a:graphic><a:graphicData uri="http://schemas.microsoft.com/office/word/2010/wordprocessingShape"><wps:wsp>'
        '<wps:txbx><w:txbxContent><w:p><w:r><w:t>Sidebar: call the harbor master first.</w:t></w:r></w:p></w:txbxContent>'
        '</wps:txbx></wps:wsp></a:graphicData></a:graphic></wp:anchor></w:drawing></mc:Choice><mc:Fallback><w:pict>'
        '<v:shape><v:textbox><w:txbxContent><w:p><w:r><w:t>Sidebar: call the harbor master first.</w:t></w:r></w:p>'
        '</w:txbxContent></v:textbox></v:shape></w:pict></mc:Fallback></mc:AlternateContent></w:r>', r("See the sidebar."))
)


def contract_docx(**kwargs) -> bytes:
    return make_docx(CONTRACT, footnotes={2: "Harbor Point is the north pier."},
                     endnotes={1: "Drawn by the port authority."},
                     comments={7: ("Bo Lund", "Check against the tender.")},
                     header=p(r("CONFIDENTIAL")) + p(r("Page "), '<w:fldSimple w:instr=" PAGE "><w:r><w:t>1</w:t></w:r></w:fldSimple>'),
                     **kwargs)


def test_a_word_document_reads_as_its_reader_sees_it(write) -> None:
    doc = load_one(write("contract.docx", contract_docx()))
    assert doc.kind == "docx"
    lines = doc.text.split("\n")
    # runs split mid-word are one word; a tab stays a tab, a line break a line
    assert "The supplier maintains the lighthouse lamps at Harbor Point.[^1]" in lines
    assert "Duties:\tdaily" in lines and "second line" in lines
    # headings as Markdown, by style (also a localised one and one based on a heading), Title too
    for heading in ("# Lamp Service Agreement", "# 1. Scope", "### 1.1 Exclusions", "## 1.2 Fees"):
        assert heading in lines, heading
    # list items, a nested one indented; a blank line around the list, none inside it
    at = lines.index("- Trim the wicks")
    assert lines[at:at + 3] == ["- Trim the wicks", "  - Check the oil level", "- Clean the lens"]
    assert lines[at - 1] == "" and lines[at + 3] == ""
    # tables a row a line; a table in a cell flattened into it
    assert "Item | Monthly fee" in lines and "Lamp | 40 EUR" in lines
    assert "Lens | inner a / b; c / d" in lines
    # tracked changes accepted, hidden text (direct or by a character style) left out
    assert "Storm damage is never covered." in lines and "always" not in doc.text
    assert "Visible terms apply." in lines and "margin" not in doc.text
    assert "Ask the office." in lines and "keeper" not in doc.text
    # a field's result, not its code; the page counter's stale value neither
    assert "Rate card version 7B, page ." in lines and "DOCPROPERTY" not in doc.text
    # notes: a footnote after its paragraph, a comment with its anchor, an endnote at the end
    at = lines.index("The supplier maintains the lighthouse lamps at Harbor Point.[^1]")
    assert lines[at + 1] == "[footnote 1: Harbor Point is the north pier.]"
    at = lines.index("Payment is due in 30 days.")
    assert lines[at + 1] == '[comment by Bo Lund on "Payment is due in 30 days.": Check against the tender.]'
    assert lines[-1] == "[endnote i: Drawn by the port authority.]" and "Figure 1[^i]" in doc.text
    # a picture by its alt text; a text box read once (not also its VML fallback), after its paragraph
    assert "[image: Map of the harbor with the three lamps] Figure 1[^i]" in lines
    assert doc.text.count("Sidebar: call the harbor master first.") == 1
    assert lines.index("Sidebar: call the harbor master first.") == lines.index("See the sidebar.") + 2
    # the header once, first; the footer's page number is no text
    assert lines[0] == "[header: CONFIDENTIAL]" and "[header: Page" not in doc.text
    # what was not read, said
    (note,) = doc.left_out
    assert note.part and note.reason == ("1 image not read (the alt text of 1 read); tracked changes read as accepted "
                                         "(1 deletion left out); hidden text left out")


def test_a_word_documents_headings_are_its_sections(write) -> None:
    doc = load_one(write("contract.docx", contract_docx()))
    assert trail_of(doc, "Trim the wicks") == "1. Scope"
    assert trail_of(doc, "Storm damage") == "1. Scope > 1.1 Exclusions"
    assert trail_of(doc, "Lamp | 40 EUR") == "1. Scope > 1.2 Fees"
    # a citation names the paragraph (no page marks here) and the headings above it
    assert cited(doc, "Storm damage is never covered.") == [("contract.docx ¶9", "1. Scope > 1.1 Exclusions")]


PAGED = (
    p(r("Definitions"), style="Heading1")
    + p(r("The Keeper means the person who tends the light."))
    + p(r("The Lamp means the main lantern on the tower, which "), r("burns kerosene", extra="<w:lastRenderedPageBreak/>"),
        r(" from dusk to dawn."))
    + p(r("Obligations"), style="Heading1")
    + p(r("The Keeper logs every ship."), r(extra='<w:br w:type="page"/>'))
    + p(r("The gate code is 4471.", extra="<w:lastRenderedPageBreak/>"))  # Word's mark after a hard break: one page
    + table(["Duty", "When"], ["Wind the clock", "noon"], ["Polish the brass", p(r("Fridays", extra="<w:lastRenderedPageBreak/>"))])
    + p(r("Last page words."), '<w:r><w:footnoteReference w:id="1"/></w:r>')
)


def test_a_word_document_with_its_last_layout_is_cited_by_page(write) -> None:
    doc = load_one(write("contract.docx", make_docx(PAGED, footnotes={1: "Kerosene is stored in the shed."})))
    assert [page.number for page in doc.pages] == [1, 2, 3, 4]
    texts = [page.text for page in doc.pages]
    # a paragraph the page broke in: its words on the page they are on
    assert texts[0].endswith("The Lamp means the main lantern on the tower, which")
    assert texts[1].startswith("burns kerosene from dusk to dawn.")
    # a hard break, and the rendered one Word wrote after it, are one page break
    assert texts[2].startswith("The gate code is 4471.")
    # a table row goes to the page it is marked on
    assert texts[3].startswith("Polish the brass | Fridays")
    assert "[footnote 1: Kerosene is stored in the shed.]" in texts[3]
    assert doc.unit == "" and not doc.source_lines
    # cited by page, with the trail of the headings above the words (across pages)
    assert cited(doc, "The gate code is 4471.") == [("contract.docx p.3", "Obligations")]
    assert cited(doc, "It burns kerosene from dusk to dawn.") == [("contract.docx p.2", "Definitions")]


def test_a_word_document_without_page_marks_is_cited_by_paragraph(write) -> None:
    """python-docx, pandoc and converters record no layout: hard page breaks alone would
    number pages wrongly, and a line of the text ktcli made is nowhere in the file."""
    body = PAGED.replace("<w:lastRenderedPageBreak/>", "")
    doc = load_one(write("memo.docx", make_docx(body, footnotes={1: "Kerosene is stored in the shed."})))
    assert doc.pages == () and doc.unit == PARAGRAPH
    assert len(doc.source_lines) == doc.n_lines
    # paragraphs counted as a reader counts them: a heading, a paragraph, a table row each
    assert cited(doc, "The gate code is 4471.") == [("memo.docx ¶6", "Obligations")]
    assert cited(doc, "Polish the brass on Fridays.") == [("memo.docx ¶8-9", "Obligations")]  # with the row above
    # a footnote is cited at the paragraph that refers to it
    assert cited(doc, "Kerosene is stored in the shed.") == [("memo.docx ¶10", "Obligations")]
    assert Span("memo.docx", 3, 4, unit=PARAGRAPH).cite() == "memo.docx ¶3-4"
    # --json's evidence read whole says what its numbers count, as its citations do
    read = Answer("", (), None, {"evidence": [{"ref": doc.path, "path": doc.path, "line_start": 1,  # type: ignore[arg-type]
                                               "line_end": doc.n_lines, "page": None, "unit": "line", "score": None}]})
    (entry,) = citations.in_source_lines(read, Corpus((doc,))).stats["evidence"]
    assert entry["unit"] == PARAGRAPH and entry["line_start"] == 1 and entry["ref"].endswith("¶1-10")
    # a paged one's, its pages (it named no place at all)
    paged = load_one(write("contract.docx", make_docx(PAGED)))
    (whole,) = citations.in_source_lines(Answer("", (), None, {"evidence": citations.documents_read([paged])}),  # type: ignore[arg-type]
                                         Corpus((paged,))).stats["evidence"]
    assert (whole["ref"].rsplit("/", 1)[-1], whole["unit"], whole["pages"]) == ("contract.docx p.1-4", "page", [1, 4])


def test_a_table_of_contents_is_left_out_and_said(write) -> None:
    """A table of contents repeats the headings with their pages ("Obligations 3"): read as
    text, a question about obligations found it and was cited to its page. Its entries are
    left out, said, and still counted as paragraphs and pages."""
    gallery = ('<w:sdtPr><w:docPartObj><w:docPartGallery w:val="Table of Contents"/><w:docPartUnique/></w:docPartObj></w:sdtPr>')
    contents = (f"<w:sdt>{gallery}<w:sdtContent>" + p(r("Contents"))
                + p(r("Definitions"), r(extra="<w:tab/>"), r("2"), style="TOC1")
                + p(r("Obligations"), r(extra="<w:tab/>"), r("3", extra="<w:lastRenderedPageBreak/>"), style="TOC1")
                + "</w:sdtContent></w:sdt>")
    paged = load_one(write("contract.docx", make_docx(contents + PAGED)))
    assert "Contents" not in paged.text and "Obligations\t3" not in paged.text and "Obligations 3" not in paged.text
    assert [page.number for page in paged.pages] == [1, 2, 3, 4, 5]  # the contents' page still counts
    assert paged.pages[0].text == "" and paged.pages[1].text.startswith("# Definitions")
    assert "3 table-of-contents entries not read" in paged.left_out[0].reason
    # by its style alone (no content control), in a document cited by paragraph
    plain = load_one(write("memo.docx", make_docx(p(r("Obligations 3"), style="TOC1") + PAGED.replace("<w:lastRenderedPageBreak/>", ""))))
    assert "Obligations 3" not in plain.text
    assert cited(plain, "The gate code is 4471.") == [("memo.docx ¶7", "Obligations")]  # ¶6 before it, counted


def test_opendocument_list_items_are_numbered_as_libreoffice_shows_them(write) -> None:
    """odfpy's and LibreOffice's numbered lists read as "- item": a clause list lost the
    "3." a question or a reader refers to."""
    styles = ('<text:list-style style:name="L1">'
              '<text:list-level-style-number text:level="1" style:num-suffix="." style:num-format="1"/>'
              '<text:list-level-style-number text:level="2" style:num-suffix="." style:num-format="1" text:display-levels="2"/>'
              '<text:list-level-style-number text:level="3" style:num-prefix="(" style:num-suffix=")" style:num-format="a"/>'
              '</text:list-style><text:list-style style:name="L2">'
              '<text:list-level-style-bullet text:level="1" text:bullet-char="•"/></text:list-style>'
              '<text:list-style style:name="L3"><text:list-level-style-number text:level="1" style:num-suffix=")" '
              'style:num-format="I" text:start-value="4"/></text:list-style>')

    def items(*texts: str, nested: str = "", **attrs: str) -> str:
        extra = "".join(f' text:{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        body = "".join(f"<text:list-item><text:p>{t}</text:p>{nested if i == len(texts) - 1 else ''}</text:list-item>"
                       for i, t in enumerate(texts))
        return f"<text:list{extra}>{body}</text:list>"

    inner = items("Notice", nested=items("by post", "by mail"))
    body = (items("Scope", "Term", nested=inner, style_name="L1", id="list1")
            + "<text:p>Between the lists.</text:p>"
            + items("Fees", style_name="L1", continue_numbering="true")
            + items("Start again", style_name="L1")
            + items("Kerosene", "Wicks", style_name="L2")
            + items("Fourth", style_name="L3")
            + '<text:list text:style-name="L1"><text:list-item text:start-value="9"><text:p>Ninth</text:p></text:list-item>'
            "<text:list-item><text:p>Tenth</text:p></text:list-item></text:list>")
    lines = [line for line in load_one(write("terms.odt", make_odt(body, automatic_styles=styles))).text.split("\n") if line]
    assert lines == ["1. Scope", "2. Term", "  2.1. Notice", "    (a) by post", "    (b) by mail", "Between the lists.",
                     "3. Fees", "1. Start again", "- Kerosene", "- Wicks", "IV) Fourth", "9. Ninth", "10. Tenth"]


def test_word_merged_cells_keep_the_cells_after_them_under_their_headers(write) -> None:
    """A cell spanning two grid columns (gridSpan) and a row starting past the first
    (gridBefore) put "7.2" under Q2 and "3" under Region."""
    def cell(text: str, span: int = 1) -> str:
        props = f'<w:tcPr><w:gridSpan w:val="{span}"/></w:tcPr>' if span > 1 else ""
        return f"<w:tc>{props}{p(r(text))}</w:tc>"

    rows = ("<w:tr>" + "".join(cell(t) for t in ("Region", "Q1", "Q2", "Q3")) + "</w:tr>"
            + "<w:tr>" + cell("North") + cell("5.1 (both)", 2) + cell("7.2") + "</w:tr>"
            + "<w:tr>" + cell("All regions", 4) + "</w:tr>"
            + '<w:tr><w:trPr><w:gridBefore w:val="3"/></w:trPr>' + cell("3") + "</w:tr>"
            + '<w:tr><w:trPr><w:gridBefore w:val="\u00b2"/></w:trPr>' + cell("odd") + "</w:tr>")  # "²": no count
    body = f"<w:tbl><w:tblGrid>{'<w:gridCol/>' * 4}</w:tblGrid>{rows}</w:tbl>"
    lines = [line for line in load_one(write("grid.docx", make_docx(body))).text.split("\n") if line]
    assert lines == ["Region | Q1 | Q2 | Q3", "North | 5.1 (both) | | 7.2", "All regions", "| | | 3", "odd"]


def test_an_opendocument_page_break_inside_a_table_cell_starts_a_page(write) -> None:
    body = ('<text:p>Page one.</text:p><text:soft-page-break/><text:p>Page two starts.</text:p><table:table>'
            "<table:table-row><table:table-cell><text:p>Row on page two</text:p></table:table-cell></table:table-row>"
            "<table:table-row><table:table-cell><text:soft-page-break/><text:p>Row on page three</text:p>"
            "</table:table-cell></table:table-row></table:table><text:p>After the table.</text:p>")
    doc = load_one(write("pages.odt", make_odt(body)))
    assert [page.text.split("\n")[0] for page in doc.pages] == ["Page one.", "Page two starts.", "Row on page three"]


def test_an_opendocument_table_of_contents_is_left_out_and_said(write) -> None:
    body = ('<text:table-of-content text:name="Table of Contents1"><text:table-of-content-source text:outline-level="10"/>'
            "<text:index-body><text:index-title><text:p>Contents</text:p></text:index-title>"
            "<text:p>Log<text:tab/>1</text:p><text:p>Orders<text:tab/>2</text:p></text:index-body></text:table-of-content>"
            '<text:h text:outline-level="1">Log</text:h><text:p>Ship sighted at dawn.</text:p>'
            '<text:alphabetical-index><text:index-body><text:p>dawn, 1</text:p></text:index-body></text:alphabetical-index>'
            '<text:illustration-index><text:index-body><text:p>Figure 1: the tower<text:tab/>1</text:p>'
            "</text:index-body></text:illustration-index>")
    doc = load_one(write("log.odt", make_odt(body)))
    assert doc.text.startswith("# Log") and "Orders" not in doc.text and "dawn, 1" in doc.text
    assert "Figure 1" not in doc.text
    assert "3 table-of-contents entries and 1 list-of-figures entry not read" in doc.left_out[0].reason


def test_body_text_starting_with_a_hash_is_no_heading(write) -> None:
    """"# of units shipped: 500" and a table's "#" column were read as headings: the trail
    of everything after them, and headings to the model."""
    body = (p(r("Shipping report"), style="Heading1") + p(r("# of units shipped: 500"))
            + table(["#", "Item"], ["1", "Bolt"]) + p(r("Closing remarks.")))
    doc = load_one(write("ship.docx", make_docx(body)))
    lines = doc.text.split("\n")
    assert "\\# of units shipped: 500" in lines and "\\# | Item" in lines
    assert trail_of(doc, "Closing remarks") == "Shipping report"
    from ktcli.ingest.htmltext import html_to_text

    text, _ = html_to_text("<h2>Ship</h2><p># of units</p><table><tr><th>#</th><th>Item</th></tr></table>"
                           "<p>#include and #1 stay as written.</p>")
    assert text.split("\n") == ["## Ship", "", "\\# of units", "", "\\# | Item", "", "#include and #1 stay as written."]


def test_an_endnote_is_cited_at_the_paragraph_that_refers_to_it(write) -> None:
    """It was cited one paragraph early (its ¶ taken before its paragraph was counted), in
    Word and OpenDocument files alike."""
    body = (p(r("One.")) + p(r("Two.")) + p(r("Three."), '<w:r><w:endnoteReference w:id="1"/></w:r>') + p(r("Four.")))
    doc = load_one(write("notes.docx", make_docx(body, endnotes={1: "Kerosene is stored in the shed."})))
    assert cited(doc, "Kerosene is stored in the shed.") == [("notes.docx ¶3", "")]
    odt = ('<text:p>One.</text:p><text:p>Two.</text:p><text:p>Three.<text:note text:id="e1" text:note-class="endnote">'
           "<text:note-citation>i</text:note-citation><text:note-body><text:p>Kerosene is stored in the shed.</text:p>"
           "</text:note-body></text:note></text:p><text:p>Four.</text:p>")
    doc = load_one(write("notes.odt", make_odt(odt)))
    assert cited(doc, "Kerosene is stored in the shed.") == [("notes.odt ¶3", "")]
    # referred to in a table's first row: that row's ¶, not the table's last (review)
    rows = table(["Duty", "When"], ["Wind the clock", p(r("noon"), '<w:r><w:endnoteReference w:id="1"/></w:r>')],
                 ["Polish", "Fridays"], ["Sweep", "daily"])
    doc = load_one(write("rows.docx", make_docx(p(r("One.")) + rows, endnotes={1: "Kerosene is stored in the shed."})))
    assert cited(doc, "Kerosene is stored in the shed.") == [("rows.docx ¶3", "")]


def test_a_long_word_document_can_be_summarized_as_its_outline(write) -> None:
    """Summaries read Markdown with headings as their outlines, never a Word, OpenDocument
    or EPUB file, whose text has its headings as `#` lines too: a 121-page .docx was read
    in 9 windows where its Markdown copy took 3, and --outline always said nothing."""
    from ktcli.ingest.outline import outline_chunks, outline_lines

    body = "".join(p(r(f"Chapter {i}"), style="Heading1")
                   + p(r(f"Chapter {i} opens here.", extra="<w:lastRenderedPageBreak/>" if i else ""))
                   + "".join(p(r(f"Body sentence {j} of chapter {i}, about the harbour lamps and the keepers who tend them.")) for j in range(16))
                   for i in range(40))
    doc = load_one(write("long.docx", make_docx(body)))
    kept = outline_lines(doc)
    assert kept is not None and ("# Chapter 7" in [t for _, t in kept]) and not any("Body sentence" in t for _, t in kept)
    pieces = outline_chunks(doc, kept, 400)
    assert pieces[0].span.cite().endswith("long.docx p.1") and pieces[-1].span.page > 1  # named by page, as its chunks are


def test_a_word_document_is_known_by_its_content(write) -> None:
    data = contract_docx()
    piped = load_stdin(None, io.BytesIO(data))
    assert piped.kind == "docx" and "# 1. Scope" in piped.text and piped.path == "<stdin>"
    assert load_one(write("contract.bin", data)).kind == "docx"  # misnamed
    assert load_one(write("contract.txt", data)).kind == "docx"
    macro = make_docx(p(r("Macro-enabled text.")), macro=True, main="word/main.xml")
    assert load_one(write("tool.docm", macro)).text == "Macro-enabled text."


def test_a_folder_reads_word_opendocument_and_epub_files_and_still_skips_spreadsheets(tmp_path) -> None:
    (tmp_path / "a.docx").write_bytes(contract_docx())
    (tmp_path / "b.odt").write_bytes(make_odt("<text:p>Keeper notes.</text:p>"))
    (tmp_path / "c.epub").write_bytes(make_epub([("ch1.xhtml", xhtml("Book", "<p>A story.</p>"))]))
    (tmp_path / "d.xlsx").write_bytes(_zip({"xl/workbook.xml": "<workbook/>"}))
    corpus = load_corpus([str(tmp_path)])
    assert [(Path(d.path).name, d.kind) for d in corpus.documents] == [("a.docx", "docx"), ("b.odt", "odt"),
                                                                        ("c.epub", "epub")]
    reasons = {Path(s.path).name: s.reason for s in corpus.skipped}
    assert reasons["d.xlsx"] == "an Excel workbook (.xlsx): not read" and "1 image not read" in reasons["a.docx"]
    # judged by content, as a file named on the command line is: a .docx named .doc is read
    (tmp_path / "e.doc").write_bytes(make_docx(p(r("A memo saved by Word with the old name."))))
    (tmp_path / "f.doc").write_bytes(_ole("WordDocument", "1Table"))
    corpus = load_corpus([str(tmp_path)])
    assert ("e.doc", "docx") in [(Path(d.path).name, d.kind) for d in corpus.documents]
    assert "Word 97-2003 .doc" in {Path(s.path).name: s.reason for s in corpus.skipped}["f.doc"]


def _zip(members: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def _ole(*streams: str) -> bytes:
    """A compound file's header and a directory sector naming `streams` (UTF-16), as an
    encrypted .docx or a Word 97 .doc starts."""
    header = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(16) + b"\x3e\x00\x03\x00\xfe\xff\x09\x00"
    entries = b"".join(name.encode("utf-16-le").ljust(64, b"\x00") + bytes(64) for name in ("Root Entry", *streams))
    return header.ljust(512, b"\xff") + entries.ljust(512, b"\x00") + bytes(1024)


def test_word_files_that_cannot_be_read_are_refused_in_one_line(write, monkeypatch) -> None:
    data = contract_docx()
    message = refusal(write("cut.docx", data[: len(data) // 2]))
    assert "cut.docx: damaged Word document (.docx): not a readable zip" in message
    with pytest.raises(InputError, match="damaged Word document"):  # cut short and piped: still known as one
        load_stdin(None, io.BytesIO(data[: len(data) // 2]))
    broken = make_docx(p(r("Unclosed")).replace("</w:p>", ""))
    assert "word/document.xml is not well-formed XML" in refusal(write("broken.docx", broken))
    laughs = _rewrite(make_docx(p(r("x"))), "word/document.xml",
                      lambda xml: xml.replace('standalone="yes"?>', 'standalone="yes"?><!DOCTYPE d [<!ENTITY lol "lol">]>'))
    assert "declares XML entities" in refusal(write("laughs.docx", laughs))
    message = refusal(write("secret.docx", _ole("EncryptionInfo", "EncryptedPackage")))
    assert "an encrypted or legacy .doc/.docx (OLE) file" in message and "save it as .docx or PDF" in message
    assert "encrypted" in message.split(";")[0]
    message = refusal(write("old.doc", _ole("WordDocument", "1Table")))
    assert "Word 97-2003 .doc" in message and "save it as .docx or PDF" in message
    with pytest.raises(InputError, match=r"<stdin>: an encrypted or legacy \.doc/\.docx \(OLE\) file"):
        load_stdin(None, io.BytesIO(_ole("EncryptedPackage")))
    scanned = make_docx(p(drawing("")) + p(drawing("", name="Picture 2")))
    assert "no text, only 2 images (scanned pages pasted in?); save it as PDF and run OCR" in refusal(write("scan.docx", scanned))
    assert "Word document (.docx) without text" in refusal(write("blank.docx", make_docx(p(""))))
    # a zip bomb: refused at the limit a text read has, having read no more
    monkeypatch.setattr(loaders, "read_limit_bytes", lambda: 64 << 10)
    bomb = make_docx(p(r("lamp " * 40_000)))
    assert len(bomb) < 20_000
    assert "decompresses to over 0 MiB, more than this machine's free memory can read (a zip bomb?)" in refusal(
        write("bomb.docx", bomb))


def _rewrite(data: bytes, member: str, change) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    return _zip({name: (change(source.read(name).decode()) if name == member else source.read(name))
                 for name in source.namelist()})


def test_other_zips_keep_their_refusal_and_a_misnamed_word_file_is_said_to_be_one(write) -> None:
    # a workbook was told to be unpacked, which read its XML parts as code
    for name, members, said in (
            ("sheet.xlsx", {"[Content_Types].xml": "<Types/>", "xl/workbook.xml": "<workbook/>"},
             "an Excel workbook (.xlsx): not read; export its sheets as CSV"),
            ("slides.pptx", {"ppt/presentation.xml": "<p/>"}, "a PowerPoint presentation (.pptx): not read; export it as PDF"),
            ("calc.ods", {"mimetype": "application/vnd.oasis.opendocument.spreadsheet"},
             "an OpenDocument spreadsheet (.ods): not read"),
            ("notes.zip", {"notes.txt": "hello"}, "binary: a zip archive (or a .xlsx/.pptx/.ods, which are zips)")):
        message = refusal(write(name, _zip(members)))
        assert said in message, message
        assert ".docx" not in message and ".odt" not in message
    message = refusal(write("report.docx", _zip({"xl/workbook.xml": "<workbook/>"})))
    assert "not a Word document (.docx): a zip archive without one in it" in message
    message = refusal(write("page.docx", "<!DOCTYPE html><html><body>Sign in</body></html>"))
    assert "not a Word document (.docx): no zip header, it holds an HTML page" in message


def test_charts_and_embedded_objects_are_reported(write) -> None:
    body = (p(r("Yearly output:"), drawing("Bar chart of output by year", chart=True))
            + p(r("Sheet:"), '<w:r><w:object><v:shape id="_x0000_i1025"/><o:OLEObject ProgID="Excel.Sheet.12"/></w:object></w:r>'))
    doc = load_one(write("report.docx", make_docx(body)))
    assert "Yearly output: [chart: Bar chart of output by year]" in doc.text
    assert doc.left_out[0].reason == "1 chart or diagram and 1 embedded object not read (the alt text of 1 read)"


# ---- Word's numbering ------------------------------------------------------------------

def item(text: str, num: int, ilvl: int = 0, style: str = "ListParagraph") -> str:
    return p(r(text), style=style, ppr=f'<w:numPr><w:ilvl w:val="{ilvl}"/><w:numId w:val="{num}"/></w:numPr>')


def numbered_docx(body: str, abstracts: dict[int, str], nums: dict[int, tuple[int, str]], **kwargs) -> bytes:
    return make_docx(body, parts={**numbering_part(abstracts, nums), **kwargs.pop("parts", {})}, rels=NUMBERING_REL,
                     **kwargs)


# "1.", "1.1", "(a)": a contract's clauses
CLAUSES = {10: level(0, "%1.") + level(1, "%1.%2") + level(2, "(%3)", "lowerLetter")}
SERVICES = (p(r("The supplier shall:"))
            + item("Services", 1) + item("Lamps", 1, 1) + item("Lenses", 1, 1) + item("inside", 1, 2)
            + item("outside", 1, 2) + item("Fees", 1) + item("Monthly", 1, 1)
            + p(r("Signed at Harbor Point.")))


def test_word_numbered_list_items_read_with_their_numbers(write) -> None:
    doc = load_one(write("clauses.docx", numbered_docx(SERVICES, CLAUSES, {1: (10, "")})))
    lines = doc.text.split("\n")
    at = lines.index("1. Services")
    # the nesting as before, a number for the "- "; deeper levels start again after a shallower one
    assert lines[at:at + 7] == ["1. Services", "  1.1 Lamps", "  1.2 Lenses", "    (a) inside", "    (b) outside",
                                "2. Fees", "  2.1 Monthly"]
    assert lines[at - 1] == "" and lines[at + 7] == ""
    assert doc.source_lines[lines.index("  1.2 Lenses")] == 4  # a ¶ an item, as before


def test_word_numbering_formats_roman_letters_legal_and_bullets(write) -> None:
    abstracts = {
        11: level(0, "%1)", "lowerRoman") + level(1, "%2.", "upperLetter") + level(2, "%3", "decimalZero"),
        12: level(0, "Article %1", "upperRoman") + level(1, "%1.%2", extra="<w:isLgl/>"),  # Article IV, then 4.1
        13: level(0, "\uf0b7", "bullet") + level(1, "o", "bullet"),
        14: level(0, "%1.", "ordinalText"),  # not read yet: decimal
    }
    body = (item("one", 1) + item("two", 1) + item("three", 1) + item("sub", 1, 1) + item("zero-padded", 1, 2)
            + item("Scope", 2) + item("Term", 2) + item("Fees", 2) + item("Termination", 2) + item("Notice", 2, 1)
            + item("Trim the wicks", 3) + item("Check the oil", 3, 1) + item("first", 4))
    doc = load_one(write("formats.docx", numbered_docx(body, abstracts, {1: (11, ""), 2: (12, ""), 3: (13, ""), 4: (14, "")})))
    assert doc.text.split("\n") == ["i) one", "ii) two", "iii) three", "  A. sub", "    01 zero-padded",
                                    "Article I Scope", "Article II Term", "Article III Fees", "Article IV Termination",
                                    "  4.1 Notice", "- Trim the wicks", "  - Check the oil", "1. first"]


def test_a_level_that_never_restarts_goes_on_counting(write) -> None:
    abstracts = {15: level(0, "Part %1") + level(1, "Note %2", extra='<w:lvlRestart w:val="0"/>')}
    body = item("One", 1) + item("a", 1, 1) + item("Two", 1) + item("b", 1, 1)
    doc = load_one(write("notes.docx", numbered_docx(body, abstracts, {1: (15, "")})))
    assert doc.text.split("\n") == ["Part 1 One", "  Note 1 a", "Part 2 Two", "  Note 2 b"]


NUMBERED_HEADINGS = STYLES.replace(
    '<w:outlineLvl w:val="0"/></w:pPr>', '<w:numPr><w:numId w:val="5"/></w:numPr><w:outlineLvl w:val="0"/></w:pPr>').replace(
    '<w:pPr><w:outlineLvl w:val="1"/></w:pPr>', '<w:pPr><w:numPr><w:numId w:val="5"/></w:numPr><w:outlineLvl w:val="1"/></w:pPr>')


def test_word_headings_numbered_by_their_style_carry_their_numbers_into_the_section_trail(write) -> None:
    # Heading 1 and 2 linked to one list: its levels name their styles (the style says no level)
    abstracts = {20: level(0, "%1.", extra='<w:pStyle w:val="Heading1"/>') + level(1, "%1.%2", extra='<w:pStyle w:val="Heading2"/>')}
    body = "".join(p(r(title), style="Heading1") + p(r(f"About {title.lower()}.")) for title in ("Definitions", "Services", "Fees"))
    body += (p(r("Term"), style="Heading1") + p(r("Renewal"), style="Heading2") + p(r("It renews each year."))
             + p(r("Termination"), style="Heading2") + p(r("Either party may end this agreement on notice.")))
    doc = load_one(write("headings.docx", numbered_docx(body, abstracts, {5: (20, "")}, parts={"word/styles.xml": NUMBERED_HEADINGS})))
    lines = doc.text.split("\n")
    assert "# 1. Definitions" in lines and "# 4. Term" in lines and "## 4.1 Renewal" in lines
    assert "## 4.2 Termination" in lines
    assert trail_of(doc, "Either party may end") == "4. Term > 4.2 Termination"
    assert cited(doc, "Either party may end this agreement on notice.") == [
        ("headings.docx ¶11", "4. Term > 4.2 Termination")]


def test_word_numbering_restarts_by_a_start_override_and_goes_on_across_paragraphs(write) -> None:
    # numId 1 and 3 share the definition and its counters; numId 2 restarts it (Word's "Restart at 1")
    nums = {1: (10, ""), 2: (10, '<w:lvlOverride w:ilvl="0"><w:startOverride w:val="1"/></w:lvlOverride>'),
            3: (10, ""), 4: (10, '<w:lvlOverride w:ilvl="0"><w:startOverride w:val="5"/></w:lvlOverride>')}
    body = (item("Keep the log", 1) + p(r("The log is kept in the tower.")) + item("Sign the log", 1)
            + p(r("Second list:")) + item("Light the lamp", 2) + item("Trim it", 2)
            + p(r("Back to the log:")) + item("File the log", 3) + item("From five", 4) + item("Six", 4))
    doc = load_one(write("restart.docx", numbered_docx(body, CLAUSES, nums)))
    lines = [line for line in doc.text.split("\n") if line]
    assert lines == ["1. Keep the log", "The log is kept in the tower.", "2. Sign the log", "Second list:",
                     "1. Light the lamp", "2. Trim it", "Back to the log:", "3. File the log", "5. From five", "6. Six"]


def test_a_restarted_list_counts_on_its_own_and_the_first_goes_on(write) -> None:
    """Counters were shared with the restarted instance: 1. 2. 3. / 1. 2. / 3. where Word
    shows 4. (found by review)."""
    nums = {1: (10, ""), 2: (10, '<w:lvlOverride w:ilvl="0"><w:startOverride w:val="1"/></w:lvlOverride>')}
    body = (item("One", 1) + item("Two", 1) + item("Three", 1) + item("Restarted", 2) + item("Again", 2)
            + item("Four", 1))
    doc = load_one(write("restarted.docx", numbered_docx(body, CLAUSES, nums)))
    assert [line for line in doc.text.split("\n") if line] == [
        "1. One", "2. Two", "3. Three", "1. Restarted", "2. Again", "4. Four"]


def test_word_numbering_by_a_list_style_and_in_table_cells(write) -> None:
    # abstract 31 only points at the list style "Clauses", whose definition is abstract 30
    styles = STYLES.replace("</w:styles>", '<w:style w:type="numbering" w:styleId="Clauses"><w:name w:val="Clauses"/>'
                            '<w:pPr><w:numPr><w:numId w:val="6"/></w:numPr></w:pPr></w:style></w:styles>')
    abstracts = {30: '<w:styleLink w:val="Clauses"/>' + level(0, "Clause %1"),
                 31: '<w:numStyleLink w:val="Clauses"/>'}
    body = item("Scope", 7) + table(["Clause", "Fee"], [item("Lamps", 7), "40 EUR"])
    doc = load_one(write("linked.docx", numbered_docx(body, abstracts, {6: (30, ""), 7: (31, "")},
                                                      parts={"word/styles.xml": styles})))
    assert doc.text.split("\n") == ["Clause 1 Scope", "", "Clause | Fee", "Clause 2 Lamps | 40 EUR"]


def test_word_builtin_nested_list_styles_are_indented_by_their_depth(write) -> None:
    # python-docx's template and Word's: "List Bullet 2" numbers by a one-level list of its
    # own (level 0), set deeper only by its indentation; its paragraphs name the style alone
    def builtin(sid: str, name: str, num: int) -> str:
        return (f'<w:style w:type="paragraph" w:styleId="{sid}"><w:name w:val="{name}"/><w:basedOn w:val="Normal"/>'
                f'<w:pPr><w:numPr><w:numId w:val="{num}"/></w:numPr></w:pPr></w:style>')

    styles = STYLES.replace("</w:styles>", builtin("ListBullet2", "List Bullet 2", 2) + builtin("ListBullet3", "List Bullet 3", 3)
                            + builtin("ListNumber2", "List Number 2", 4) + "</w:styles>")
    bullet = {n: level(0, "\uf0b7", "bullet") for n in (20, 21, 22)}
    body = (p(r("Duties:")) + p(r("Lamps"), style="ListBullet") + p(r("Wicks"), style="ListBullet2")
            + p(r("Trimmed nightly"), style="ListBullet3") + p(r("Lenses"), style="ListBullet")
            + p(r("Polish"), style="ListNumber2") + p(r("Inspect"), style="ListNumber2"))
    doc = load_one(write("builtin.docx", numbered_docx(body, {**bullet, 23: level(0, "%1.")},
                                                       {1: (20, ""), 2: (21, ""), 3: (22, ""), 4: (23, "")},
                                                       parts={"word/styles.xml": styles})))
    assert doc.text.split("\n") == ["Duties:", "", "- Lamps", "  - Wicks", "    - Trimmed nightly", "- Lenses",
                                     "  1. Polish", "  2. Inspect"]


def test_a_word_document_without_numbering_reads_its_items_as_before(write) -> None:
    plain = load_one(write("plain.docx", make_docx(SERVICES)))
    numbered = load_one(write("numbered.docx", numbered_docx(SERVICES, CLAUSES, {1: (10, "")})))
    assert plain.text.split("\n")[2:9] == ["- Services", "  - Lamps", "  - Lenses", "    - inside", "    - outside",
                                           "- Fees", "  - Monthly"]
    assert numbered.text.split("\n")[2] == "1. Services"
    # the same paragraphs, the same ¶ for each line
    assert plain.source_lines == numbered.source_lines
    # a numbering part naming no such instance: as before
    assert load_one(write("other.docx", numbered_docx(SERVICES, CLAUSES, {9: (10, "")}))).text == plain.text


# ---- OpenDocument ------------------------------------------------------------------------

ODT_BODY = (
    '<text:tracked-changes><text:changed-region text:id="ct1"><text:deletion><office:change-info>'
    "<dc:creator>Bo Lund</dc:creator></office:change-info><text:p>Old clause text.</text:p></text:deletion>"
    "</text:changed-region></text:tracked-changes>"
    '<text:h text:style-name="P1" text:outline-level="1">Keeper duties</text:h>'
    '<text:p text:style-name="Standard">The keeper <text:span text:style-name="T1">tri</text:span>ms the wicks'
    '<text:note text:id="ftn1" text:note-class="footnote"><text:note-citation>1</text:note-citation>'
    "<text:note-body><text:p>Twice a night.</text:p></text:note-body></text:note> each\n    evening.<text:s text:c=\"2\"/>"
    "Then<text:tab/>rests.<text:change text:change-id=\"ct1\"/></text:p>"
    '<text:list text:style-name="L1"><text:list-item><text:p>Oil the <office:annotation office:name="c1">'
    "<dc:creator>Bo Lund</dc:creator><dc:date>2024-01-01T10:00:00</dc:date><text:p>Which oil?</text:p>"
    '</office:annotation>gears<office:annotation-end office:name="c1"/></text:p></text:list-item>'
    "<text:list-item><text:p>Clean the glass</text:p><text:list><text:list-item><text:p>inside first</text:p>"
    "</text:list-item></text:list></text:list-item></text:list>"
    '<text:h text:outline-level="2">Equipment<text:soft-page-break/></text:h>'
    '<table:table table:name="Tools"><table:table-column table:number-columns-repeated="3"/>'
    "<table:table-header-rows><table:table-row><table:table-cell><text:p>Tool</text:p></table:table-cell>"
    "<table:table-cell><text:p>Count</text:p></table:table-cell><table:table-cell/></table:table-row></table:table-header-rows>"
    "<table:table-row><table:table-cell><text:p>Wick trimmer</text:p></table:table-cell>"
    '<table:table-cell office:value-type="float"><text:p>3</text:p></table:table-cell>'
    '<table:table-cell table:number-columns-repeated="2"/></table:table-row></table:table>'
    '<text:p>Shown <text:span text:style-name="Hidden_20_Words">secret </text:span>words, page <text:page-number>2</text:page-number>.</text:p>'
    '<text:p><draw:frame draw:name="Image1" text:anchor-type="as-char"><draw:image xlink:href="Pictures/1.png"/>'
    "<svg:title>Coast</svg:title><svg:desc>A map of the coast</svg:desc></draw:frame> Map.</text:p>"
    '<text:p text:style-name="P9">The gate code is 4471.</text:p>'
)
ODT_STYLES = ('<style:style style:name="P9" style:family="paragraph" style:parent-style-name="Standard">'
              '<style:paragraph-properties fo:break-before="page"/></style:style>')
ODT_MASTER = ('<style:master-page style:name="Standard"><style:header><text:p>Harbor Light Co.</text:p></style:header>'
              "<style:footer><text:p>Page <text:page-number>1</text:page-number></text:p></style:footer></style:master-page>")


def test_an_opendocument_text_reads_as_its_reader_sees_it(write) -> None:
    doc = load_one(write("keeper.odt", make_odt(ODT_BODY, automatic_styles=ODT_STYLES, master=ODT_MASTER)))
    assert doc.kind == "odt"
    lines = doc.text.split("\n")
    assert lines[0] == "[header: Harbor Light Co.]" and "Page" not in doc.text
    assert "# Keeper duties" in lines and "## Equipment" in lines
    # white space as ODF has it: collapsed in the markup; a tab as written
    assert "The keeper trims the wicks[^1] each evening. Then\trests." in lines
    assert "[footnote 1: Twice a night.]" in lines
    at = lines.index("- Oil the gears")
    assert lines[at + 1] == '[comment by Bo Lund on "gears": Which oil?]'
    assert lines[at + 3:at + 5] == ["- Clean the glass", "  - inside first"]
    assert "Tool | Count" in lines and "Wick trimmer | 3" in lines
    assert "Shown words, page ." in lines and "Old clause" not in doc.text
    assert "[image: A map of the coast] Map." in lines
    assert trail_of(doc, "Wick trimmer") == "Keeper duties > Equipment"
    # soft page breaks (LibreOffice's last layout) and a paragraph's break-before: pages
    assert [p.number for p in doc.pages] == [1, 2, 3]
    assert doc.pages[2].text == "The gate code is 4471."
    assert cited(doc, "The gate code is 4471.") == [("keeper.odt p.3", "Keeper duties > Equipment")]
    assert doc.left_out[0].reason == ("1 image not read (the alt text of 1 read); tracked changes read as accepted "
                                      "(1 deletion left out); hidden text left out")


def test_an_opendocument_text_is_known_by_its_mimetype_and_cited_by_paragraph_without_pages(write) -> None:
    data = make_odt("<text:h>Log</text:h><text:p>Ship sighted at dawn.</text:p><text:p>The gate code is 4471.</text:p>")
    piped = load_stdin(None, io.BytesIO(data))
    assert piped.kind == "odt" and piped.unit == PARAGRAPH
    assert load_one(write("log.zip", data)).kind == "odt"
    assert cited(load_one(write("log.odt", data)), "The gate code is 4471.") == [("log.odt ¶3", "Log")]


# ---- EPUB ------------------------------------------------------------------------------

BOOK = [
    ("cover.xhtml", xhtml("The Lighthouse Keeper", '<div><img src="../Images/cover.jpg" alt=""/></div>')),
    ("part1.xhtml", xhtml("The Lighthouse Keeper", "<h1>Part One: The Tower</h1>")),
    ("ch01.xhtml", xhtml("The Lighthouse Keeper", "<h1>Loomings</h1><p>Call me Ada. I kept the light.</p>"
                                                  "<h2>The Lamp</h2><p>It burns kerosene.</p>")),
    ("ch01a.xhtml", xhtml("The Lighthouse Keeper", "<p>The wick is trimmed at noon.</p>")),  # a split file
    ("ch02.xhtml", xhtml("The Lighthouse Keeper", '<p>The storm came. <img src="../Images/wave.jpg" alt="A wave over the pier"/></p>'
                                                  "<p>The gate code is 4471.</p>")),
]
BOOK_TOC = [(1, "part1.xhtml", "Part One: The Tower"), (2, "ch01.xhtml", "1. Loomings"), (2, "ch02.xhtml", "2. The Storm")]


@pytest.mark.parametrize("ncx", [False, True], ids=["epub3-nav", "epub2-ncx"])
def test_an_epub_is_read_chapter_by_chapter_and_cited_by_chapter(write, ncx) -> None:
    doc = load_one(write("keeper.epub", make_epub(BOOK, toc=BOOK_TOC, ncx=ncx)))
    assert doc.kind == "epub" and doc.unit == CHAPTER
    assert doc.text.startswith("Title: The Lighthouse Keeper\nBy: Ada Quill\n\n# Part One: The Tower")
    assert "Contents" not in doc.text  # the navigation document is not a chapter
    # chapters in spine order: a file the table of contents does not list goes with the one before
    assert [p.number for p in doc.pages] == [1, 2, 3]
    assert "The wick is trimmed at noon." in doc.pages[1].text
    # headings under their place in the table of contents; a chapter without one gets its title
    assert "## Loomings" in doc.pages[1].text and "### The Lamp" in doc.pages[1].text
    assert doc.pages[2].text.startswith("## 2. The Storm")
    assert "[image: A wave over the pier]" in doc.pages[2].text
    assert cited(doc, "The gate code is 4471.") == [("keeper.epub ch.3", "Part One: The Tower > 2. The Storm")]
    assert cited(doc, "The wick is trimmed at noon.") == [("keeper.epub ch.2", "Part One: The Tower > Loomings > The Lamp")]
    assert doc.left_out[0].reason == "2 images not read (alt text kept where given)"


def test_an_epub_title_page_the_contents_do_not_list_is_read_with_the_first_chapter(write) -> None:
    """A cover with words counted as chapter 1, so "Chapter 2" was cited "ch.3"."""
    titled = [("title.xhtml", xhtml("Book", "<h1>The Lighthouse Keeper</h1><p>A novel by Ada Quill.</p>")), *PARTED]
    toc = [(1, "ch1.xhtml", "Chapter 1"), (1, "ch2.xhtml", "Chapter 2"), (1, "ch3.xhtml", "Chapter 3")]
    doc = load_one(write("titled.epub", make_epub(titled, toc=toc)))
    assert [p.number for p in doc.pages] == [1, 2, 3]
    assert "A novel by Ada Quill." in doc.pages[0].text and "Call me Ishmael." in doc.pages[0].text
    assert cited(doc, "I stuffed a shirt into my bag.")[0][0] == "titled.epub ch.2"
    assert cited(doc, "A novel by Ada Quill.")[0][0] == "titled.epub ch.1"
    # contents that list none of the files: one chapter, nothing lost
    lost = load_one(write("lost.epub", make_epub(titled, toc=[(1, "elsewhere.xhtml", "Nowhere")])))
    assert len(lost.pages) == 1 and "A novel by Ada Quill." in lost.text and "The inn was dark." in lost.text


def test_an_epub_is_known_by_its_content_and_a_drm_one_refused(write) -> None:
    data = make_epub([("a.xhtml", xhtml("A", "<p>Piped chapter.</p>"))], nav_in_spine=False)
    piped = load_stdin(None, io.BytesIO(data))
    assert piped.kind == "epub" and piped.pages[0].text.endswith("Piped chapter.")
    assert Span("<stdin>", 4, 4, page=1, unit=CHAPTER).cite() == "<stdin> ch.1"
    message = refusal(write("locked.epub", make_epub(BOOK, toc=BOOK_TOC, encrypted=True)))
    assert "locked.epub: EPUB with DRM: its chapters are encrypted" in message
    missing = make_epub(BOOK, toc=BOOK_TOC).replace(b"OEBPS/content.opf", b"OEBPS/missing.opf")
    assert "damaged EPUB book (.epub)" in refusal(write("bad.epub", missing))


def test_a_zips_mimetype_is_read_no_further_than_its_start() -> None:
    import tracemalloc

    from ktcli.ingest.zipdoc import zip_format

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", b"application/vnd.oasis.opendocument.text" + b" " * (64 << 20))
        z.writestr("content.xml", "<x/>")
    data = buffer.getvalue()
    assert len(data) < 1 << 20  # 64 MiB of spaces, zipped
    tracemalloc.start()
    try:
        assert zip_format(data) == "odt"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


PARTED = [("ch1.xhtml", xhtml("Book", "<h1>Loomings</h1><p>Call me Ishmael.</p>")),
          ("ch2.xhtml", xhtml("Book", "<h1>The Carpet-Bag</h1><p>I stuffed a shirt into my bag.</p>")),
          ("ch3.xhtml", xhtml("Book", "<h1>The Spouter-Inn</h1><p>The inn was dark.</p>"))]


@pytest.mark.parametrize("ncx", [False, True], ids=["epub3-nav-unlinked-part", "epub2-ncx-part-at-its-first-chapter"])
def test_a_part_without_a_file_of_its_own_heads_its_chapters_trail(write, ncx) -> None:
    # A part named without a link (EPUB 3: `<li><span>Part Two</span><ol>`), or linked to its
    # first chapter's file (ebooklib's NCX): its chapters were under the chapter before.
    toc = [(1, "ch1.xhtml", "Loomings"), (1, "ch2.xhtml", "Part Two"), (2, "ch2.xhtml", "The Carpet-Bag"),
           (2, "ch3.xhtml", "The Spouter-Inn")]
    data = make_epub(PARTED, toc=toc, ncx=ncx)
    if not ncx:
        data = _rewrite(data, "OEBPS/nav.xhtml",
                        lambda nav: nav.replace('<a href="Text/ch2.xhtml">Part Two</a>', "<span>Part Two</span>"))
    doc = load_one(write("moby.epub", data))
    assert [p.number for p in doc.pages] == [1, 2, 3]
    assert doc.pages[1].text.startswith("# Part Two\n\n## The Carpet-Bag")
    assert cited(doc, "The inn was dark.") == [("moby.epub ch.3", "Part Two > The Spouter-Inn")]
    assert cited(doc, "I stuffed a shirt into my bag.") == [("moby.epub ch.2", "Part Two > The Carpet-Bag")]


def test_a_word_documents_ruby_text_keeps_its_base(write) -> None:
    # Japanese with its reading above it (furigana): the base 漢 was left out, silently
    ruby = ('<w:r><w:ruby><w:rubyPr><w:rubyAlign w:val="distributeSpace"/></w:rubyPr><w:rt><w:r><w:t>かん</w:t></w:r></w:rt>'
            '<w:rubyBase><w:r><w:t>漢</w:t></w:r></w:rubyBase></w:ruby></w:r>')
    doc = load_one(write("kanji.docx", make_docx(p(r("賃料の"), ruby, r("字は二倍とする。")))))
    assert doc.text == "賃料の漢字は二倍とする。"


def test_a_word_document_whose_only_words_are_a_comment_or_an_endnote_is_read(write) -> None:
    # the end's notes on an empty page: refused as "unreadable (IndexError: list index out of range)"
    doc = load_one(write("comment.docx", make_docx(p(""), comments={1: ("Ann", "A lone comment")})))
    assert doc.text == "[comment by Ann: A lone comment]" and doc.source_lines == (1,)
    mark = p('<w:r><w:endnoteReference w:customMarkFollows="1" w:id="1"/></w:r>')
    doc = load_one(write("endnote.docx", make_docx(mark, endnotes={1: "The endnote text"})))
    assert doc.text == "[endnote: The endnote text]"


def test_a_page_counter_left_open_hides_no_more_than_its_paragraph(write) -> None:
    # a PAGE field whose end never comes (a converter's slip): the rest of the file was lost, silently
    counter = (r("Page "), r(extra='<w:fldChar w:fldCharType="begin"/>'), r(extra="<w:instrText> PAGE </w:instrText>"),
               r(extra='<w:fldChar w:fldCharType="separate"/>'), r("3"))
    doc = load_one(write("open.docx", make_docx(p(*counter) + p(r("The lamp is lit at dusk.")))))
    assert doc.text == "Page\n\nThe lamp is lit at dusk."


def test_soft_hyphens_are_not_read_into_words(write) -> None:
    # LibreOffice keeps a soft hyphen in the text: "co\xadoperate" was not the word "cooperate"
    doc = load_one(write("soft.odt", make_odt("<text:p>We co\u00adoperate.<text:note text:note-class=\"footnote\">"
                                              "<text:note-citation>1</text:note-citation><text:note-body>"
                                              "<text:p>Lamp\u00adlighters.</text:p></text:note-body></text:note></text:p>")))
    assert doc.text == "We cooperate.[^1]\n[footnote 1: Lamplighters.]"


def test_an_opendocument_headings_number_stands_apart_from_its_words(write) -> None:
    body = ('<text:list><text:list-item><text:h text:outline-level="2"><text:number>1.2</text:number>Scope</text:h>'
            "</text:list-item></text:list><text:p>The lamp is lit at dusk.</text:p>")
    doc = load_one(write("numbered.odt", make_odt(body)))
    assert doc.text.startswith("## 1.2 Scope\n")


def test_a_damaged_zip_named_as_a_document_is_said_to_be_damaged(write) -> None:
    # not "a zip archive without one in it (a spreadsheet, a presentation or another zip, renamed?)"
    assert "damaged.docx: damaged Word document (.docx): not a readable zip" in refusal(
        write("damaged.docx", b"PK\x03\x04" + bytes(range(256)) * 20))
    assert "damaged.epub: damaged EPUB book (.epub): not a readable zip" in refusal(
        write("damaged.epub", b"PK\x03\x04" + bytes(range(256)) * 20))


def test_html_superscript_marks_are_read_apart_from_their_word() -> None:
    """Found by a probe: "340<sup>1</sup> marks in 1998<sup>2</sup>" read "3401 marks in
    19982" (figures the page never gives), as did an EPUB's note reference. Read as the PDF
    reader reads raised marks: "[^1]", or "^2" for an exponent after a unit or a 10."""
    from ktcli.ingest.htmltext import html_to_text

    text, _ = html_to_text(
        '<p>The toll was 340<sup><a href="#fn1">1</a></sup> marks in 1998<sup>2</sup>.</p>'
        '<p>Area 5 m<sup>2</sup>, 10<sup>6</sup> units, H<sub>2</sub>O, the 2<sup>nd</sup> test, x<sup>n</sup>.</p>'
        '<p>Pandoc 12<a href="#fn2" class="footnote-ref" role="doc-noteref"><sup>2</sup></a>, '
        'Wiki<sup class="reference"><a href="#cite_note-3">[3]</a></sup>, linked m<sup><a href="#n">4</a></sup>.</p>'
        '<p><sup>5</sup> A note that starts its line.</p>')
    assert text.split("\n\n") == [
        "The toll was 340[^1] marks in 1998[^2].",
        "Area 5 m^2, 10^6 units, H2O, the 2nd test, xn.",
        "Pandoc 12[^2], Wiki[^3], linked m[^4].",
        "5 A note that starts its line."]
