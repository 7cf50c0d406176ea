"""Inputs made at test time: PDFs (text, image-only, encrypted) and a tiny PNG."""

from __future__ import annotations

import io


def make_text_pdf(pages: list[list[str]]) -> bytes:
    """A PDF with a real text layer: one list of lines per page."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    for lines in pages:
        y = 800
        for line in lines:
            pdf.drawString(72, y, line)
            y -= 16
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_bookmarked_pdf(pages: list[list[str]], bookmarks: list[tuple[str, int]]) -> bytes:
    """`make_text_pdf(pages)` with bookmarks (title, 0-based page) in its outline."""
    from pypdf import PdfWriter

    writer = PdfWriter(clone_from=io.BytesIO(make_text_pdf(pages)))
    for title, page in bookmarks:
        writer.add_outline_item(title=title, page_number=page)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def damage_page(data: bytes, page: int) -> bytes:
    """`data` with page `page`'s (1-based) content stream replaced by bytes that claim to be
    deflated and are not: pypdf logs a warning and gives the page no text."""
    from pypdf import PdfWriter
    from pypdf.generic import NameObject, StreamObject

    writer = PdfWriter(clone_from=io.BytesIO(data))
    broken = StreamObject()
    broken._data = b"\x78\x9c not deflate data at all" * 3
    broken[NameObject("/Filter")] = NameObject("/FlateDecode")
    writer.pages[page - 1][NameObject("/Contents")] = writer._add_object(broken)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def make_table_pdf(before: list[str], rows: list[list[str]], after: list[str]) -> bytes:
    """One page: prose lines, a reportlab Table (each cell its own text object, as most
    PDF writers draw tables), more prose lines."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Table

    styles = getSampleStyleSheet()
    buffer = io.BytesIO()
    story = [Paragraph(line, styles["BodyText"]) for line in before]
    story.append(Table(rows, hAlign="LEFT"))
    story += [Paragraph(line, styles["BodyText"]) for line in after]
    SimpleDocTemplate(buffer, pagesize=A4, invariant=1).build(story)
    return buffer.getvalue()


def make_wrapped_table_pdf(before: list[str], rows: list[list[str]], after: list[str], widths: list[float],
                           valign: str = "TOP") -> bytes:
    """`make_table_pdf` with columns `widths` points wide and each cell a paragraph, so a
    long cell wraps over several lines, the row's cells aligned `valign` (TOP, MIDDLE or
    BOTTOM) in its height."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Table, TableStyle

    body = getSampleStyleSheet()["BodyText"]
    buffer = io.BytesIO()
    table = Table([[Paragraph(cell, body) for cell in row] for row in rows], colWidths=widths, hAlign="LEFT")
    table.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), valign)]))
    story = [Paragraph(line, body) for line in before] + [table] + [Paragraph(line, body) for line in after]
    SimpleDocTemplate(buffer, pagesize=A4, invariant=1).build(story)
    return buffer.getvalue()


def make_two_column_pdf(left: list[str], right: list[str]) -> bytes:
    """One page of two text columns side by side, the left one written first."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    for x, lines in ((72, left), (320, right)):
        for i, line in enumerate(lines):
            pdf.drawString(x, 800 - 16 * i, line)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_two_column_pdf_drawn_across(left: list[str], right: list[str]) -> bytes:
    """`make_two_column_pdf`, each row's left line drawn, then its right one: pypdf's plain
    text then reads the columns across, a line of each in turn."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    for i, (a, b) in enumerate(zip(left, right)):
        pdf.drawString(72, 800 - 16 * i, a)
        pdf.drawString(320, 800 - 16 * i, b)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_word_by_word_pdf(lines: list[str]) -> bytes:
    """One page whose every word is a text object of its own, placed by its own position:
    pypdf's plain text put each on a line of its own."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfbase.pdfmetrics import stringWidth
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    for i, line in enumerate(lines):
        x = 72.0
        for word in line.split():
            pdf.drawString(x, 800 - 16 * i, word)
            x += stringWidth(word + " ", "Helvetica", 12)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_image_only_pdf(n_pages: int = 2) -> bytes:
    """Pages with drawings but no text, as a scanner would produce (minus the bitmap)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    for i in range(n_pages):
        pdf.rect(72, 400 + i * 10, 300, 200, fill=1)
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_pdf_with_a_scanned_page(before: str, after: str) -> bytes:
    """Three pages: text, an image and no text (a scan), text."""
    from PIL import Image
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    pdf.drawString(72, 800, before)
    pdf.showPage()
    pdf.drawImage(ImageReader(Image.new("RGB", (8, 8), (200, 30, 30))), 72, 400, 300, 300)
    pdf.showPage()
    pdf.drawString(72, 800, after)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_stamped_scan_pdf(stamps: list[str], texts: dict[int, str] | None = None, in_form: bool = False,
                          image_share: float = 1.0, ocr_layer: bool = False) -> bytes:
    """Pages that are an image with a small text stamp each (Bates numbers on a scan), or
    with `texts[i]` of real text; `in_form`: the images drawn inside form XObjects, as
    pdfpages/pdfjam place scanned pages; `image_share`: of the page the image covers;
    `ocr_layer`: each "stamp" drawn invisible (text render mode 3), as OCR tools lay the
    words they read over a scan."""
    from PIL import Image
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    image = ImageReader(Image.new("RGB", (8, 8), (230, 230, 230)))
    for i, stamp in enumerate(stamps):
        w, h = 595 * image_share**0.5, 842 * image_share**0.5  # the image's share of the page
        if in_form:
            pdf.beginForm(f"scan{i}", lowerx=0, lowery=0, upperx=w, uppery=h)
            pdf.drawImage(image, 0, 0, w, h)
            pdf.endForm()
            pdf.doForm(f"scan{i}")
        else:
            pdf.drawImage(image, 0, 0, w, h)
        if ocr_layer:
            words = pdf.beginText(72, 700)
            words.setTextRenderMode(3)
            words.setFont("Helvetica", 11)
            words.textLine(stamp)
            pdf.drawText(words)
        else:
            pdf.setFont("Helvetica", 6)
            pdf.drawString(500, 20, stamp)
        if texts and i in texts:
            pdf.setFont("Helvetica", 11)
            pdf.drawString(72, 700, texts[i])
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_form_pdf(text: str, fields: dict[str, str], comment: str) -> bytes:
    """One page of `text` with filled-in text fields (reportlab's AcroForm: name ->
    value; the tooltip is "<name> label") and a sticky-note comment."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    pdf.drawString(72, 800, text)
    for i, (name, value) in enumerate(fields.items()):
        pdf.acroForm.textfield(name=name, tooltip=f"{name} label", value=value, x=72, y=760 - 30 * i, width=300,
                               height=20)
    pdf.drawString(72, 600, "See the note.")
    pdf.showPage()
    pdf.save()
    from pypdf import PdfReader, PdfWriter
    from pypdf.annotations import Text

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(buffer.getvalue())))
    writer.add_annotation(0, Text(rect=(72, 560, 92, 580), text=comment))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypt_pdf(data: bytes, user_password: str) -> bytes:
    """RC4-128, which pypdf reads without extra packages."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    writer.append(PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


PNG_BYTES = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"
    b"\x00\x00\x00\x0cIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82"
)


def with_page_labels(data: bytes, front_matter: int) -> bytes:
    """`data` with /PageLabels: the first `front_matter` pages numbered i, ii..., the rest
    1, 2... (a book's or a thesis's numbering)."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.set_page_label(0, front_matter - 1, style="/r")
    writer.set_page_label(front_matter, len(writer.pages) - 1, style="/D", start=1)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def make_pdf_with_a_drawn_page(first: str, last: str, shapes: int = 60) -> bytes:
    """Three pages: text, a page of filled curves and no text (words exported "as
    outlines", or a drawing), text; with `shapes=0` the middle page has one rule only."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    pdf.drawString(72, 800, first)
    pdf.showPage()
    for i in range(shapes):
        pdf.circle(80 + (i % 10) * 40, 700 - (i // 10) * 40, 8, stroke=0, fill=1)
    pdf.line(72, 400, 500, 400)
    pdf.showPage()
    pdf.drawString(72, 800, last)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def with_attachments(data: bytes, files: dict[str, bytes]) -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter(clone_from=io.BytesIO(data))
    for name, content in files.items():
        writer.add_attachment(name, content)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
