"""Footnote marks, exponents and subscripts in PDFs (`ktcli.ingest.pdf_marks`): read apart
from the word they touch, never glued into a different number."""

from __future__ import annotations

import io

import pypdf
import pytest

from ktcli.ingest.pdf_marks import page_text, unmarked
from ktcli.ingest.pdftext import extract_pages

pytest.importorskip("reportlab")


def _paragraph_pdf(*paragraphs: str) -> bytes:
    """reportlab paragraphs: <super> and <sub> are drawn smaller with a text rise (Ts)."""
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate

    buffer = io.BytesIO()
    styles = getSampleStyleSheet()
    SimpleDocTemplate(buffer, invariant=1).build([Paragraph(p, styles["BodyText"]) for p in paragraphs])
    return buffer.getvalue()


class _Canvas:
    """Lines drawn piece by piece, each mark a smaller string on a baseline of its own, as
    Word and LaTeX draw them."""

    def __init__(self) -> None:
        from reportlab.pdfgen import canvas

        self.buffer = io.BytesIO()
        self.pdf = canvas.Canvas(self.buffer, invariant=1)
        self.y = 760.0

    def line(self, *pieces: tuple[str, float, float], x: float = 72) -> None:
        """pieces: (text, font size, baseline shift in points); a piece starting with a tab
        is drawn at 300 points (a table's second column)."""
        for text, size, shift in pieces:
            if text.startswith("\t"):
                text, x = text[1:], 300
            self.pdf.setFont("Helvetica", size)
            self.pdf.drawString(x, self.y + shift, text)
            x += self.pdf.stringWidth(text, "Helvetica", size)
        self.y -= 16

    def data(self) -> bytes:
        self.pdf.save()
        return self.buffer.getvalue()


def _text(data: bytes) -> str:
    return page_text(pypdf.PdfReader(io.BytesIO(data)).pages[0])


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_raised_marks_drawn_with_a_rise_are_footnotes_or_exponents() -> None:
    text = _one_line(_text(_paragraph_pdf(
        "Net zero by 2025<super>2</super>, revenue of $5.87 million<super>1,4</super>; 12%<super>3</super> fewer. "
        "The site covers 4,500 m<super>2</super> and makes 10<super>6</super> units; a claim<super>*</super> stands.")))
    assert "Net zero by 2025[^2], revenue of $5.87 million[^1,4]; 12%[^3] fewer." in text
    assert "4,500 m^2 and makes 10^6 units; a claim* stands." in text
    assert "20252" not in text and "million1" not in text


def test_lowered_runs_are_glued_back_unmarked() -> None:
    text = _text(_paragraph_pdf("Emissions of CO<sub>2</sub> fell; H<sub>2</sub>O use dropped."))
    assert "Emissions of CO2 fell; H2O use dropped." in text


def test_a_mark_on_a_raised_baseline_no_longer_breaks_its_line() -> None:
    page = _Canvas()
    page.line(("Headcount grew to 412", 11, 0), ("4", 7, 4), (" employees in 2023.", 11, 0))
    page.line(("The target ends in 2025", 11, 0), ("3", 7, 4))
    page.line(("and the next line follows.", 11, 0))
    page.line(("Revenue", 11, 0), ("1", 7, 4), ("\t5.87", 11, 0))
    page.line(("Water is H", 11, 0), ("2", 7, -2), ("O.", 11, 0))
    page.line(("1", 7, 4), ("Unaudited figures.", 9, 0))
    lines = _text(page.data()).split("\n")
    assert lines[:5] == ["Headcount grew to 412[^4] employees in 2023.", "The target ends in 2025[^3]",
                         "and the next line follows.", "Revenue[^1] 5.87", "Water is H2O."]
    assert lines[5] == "[^1]: Unaudited figures."


def test_what_does_not_look_like_a_mark_is_read_as_before() -> None:
    page = _Canvas()
    page.line(("verskille tussen l", 11, 0), ("a", 7, 4), ("ers", 11, 0))  # an accent built from a small "a"
    page.line(("Version 2", 11, 0), ("0", 7, 4), ("beta", 11, 0))  # a raised run a word goes on after
    page.line(("Total 2025", 11, 0), ("2", 11, 4))  # raised but not smaller
    page.line(("Total 2026", 11, 0), ("2", 7, 14))  # smaller but a line of its own, above
    data = page.data()
    plain = pypdf.PdfReader(io.BytesIO(data)).pages[0].extract_text()
    assert _text(data) == plain


def test_numbers_set_apart_from_a_word_are_no_marks() -> None:
    """A table's small values centred beside a big label ("Employees" / "412") and a chart's
    labels sit raised and smaller beside a word too; they were read "Employees[^412]"."""
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Table, TableStyle

    big, small = ParagraphStyle("b", fontSize=16, leading=18), ParagraphStyle("s", fontSize=8, leading=9)
    table = Table([[Paragraph("Employees", big), Paragraph("412", small), Paragraph("7", small)]])
    table.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), "MIDDLE")]))
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, invariant=1).build([table])
    page = _Canvas()
    page.line(("Bar A", 12, 0), ("\t45", 8, 5))  # a bar's value far to its right
    page.line(("Left column line ends with word", 11, 0), ("\t10", 8, 3))  # a sidebar's number
    for data in (buffer.getvalue(), page.data()):
        assert _text(data) == pypdf.PdfReader(io.BytesIO(data)).pages[0].extract_text()
        assert "[^" not in _text(data)


def test_a_raised_number_before_a_word_is_no_footnote() -> None:
    text = _one_line(_text(_paragraph_pdf("The <super>14</super>C dating and the 2<super>nd</super> test.")))
    assert "[^" not in text and "The 14C dating" in text


def test_extracted_pages_keep_their_marks_and_tables_still_join() -> None:
    from tests.ingest.fixtures import make_table_pdf

    data = make_table_pdf(["Revenue grew by 2025<super>2</super> as planned."],
                          [["Quarter", "Revenue"], ["Q1", "4.10"], ["Q2", "4.75"], ["Q3", "5.87"]], ["After."])
    text = extract_pages(data, "t.pdf")[0][0]
    assert "Revenue grew by 2025[^2] as planned." in text
    assert "Q3 | 5.87" in text


@pytest.mark.parametrize("written, layout", [("Revenue[^1]", "Revenue1"), ("4,500 m^2", "4,500 m2"),
                                             ("a[^1,3] b", "a1,3 b"), ("no marks [1]", "no marks [1]")])
def test_unmarked_reads_a_line_as_the_layout_mode_does(written: str, layout: str) -> None:
    assert unmarked(written) == layout


def test_a_footnote_line_under_a_close_line_above_still_opens_with_its_mark():
    # reportlab's <super> at 10/12 pt leading: the mark sits 0.7 em below the line above it,
    # which read as that line's subscript and lost the "[^1]: "
    import io

    from pypdf import PdfReader
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate

    from ktcli.ingest.pdf_marks import page_text

    buf = io.BytesIO()
    style = getSampleStyleSheet()["Normal"]
    SimpleDocTemplate(buf).build([Paragraph("Net zero by 2025<super>1</super> it says.", style),
                                  Paragraph("<super>1</super> Source: annual report 2024.", style)])
    text = page_text(PdfReader(io.BytesIO(buf.getvalue())).pages[0])
    assert "2025[^1] it says." in text and "[^1]: Source: annual report 2024." in text
