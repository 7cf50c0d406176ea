"""RTF files and single-file saved web pages (MHTML) read as their text: read raw, a
two-sentence contract with a picture was 108K tokens of control words and hex, a saved
page 37K of quoted-printable markup and base64."""

from pathlib import Path

from ktcli.ingest import load_corpus
from ktcli.types import PARAGRAPH

CONTRACT = rb"""{\rtf1\ansi\ansicpg1252\deff0{\fonttbl{\f0 Times;}{\f1 Arial;}}{\colortbl;\red0\green0\blue0;}
{\*\generator Riched20 10.0;}{\info{\author Bo Lund}}\viewkind4\uc1\pard\f0\fs24 Caf\'e9 Supplier Contract\par
The penalty for late\~delivery is 2 percent per week.\par
{\f1 \u1055?\u1088?\u1080?\u1074?\u1077?\u1090?} means hello.\par
{\pict\wmetafile8\picw100 """ + b"0a1b2c3d" * 4000 + rb"""}\par
{\field{\*\fldinst HYPERLINK "http://example.com"}{\fldrslt Terms online}}\par
\trowd\cellx1000\cellx2000 Item\cell Price\cell\row
\trowd\cellx1000\cellx2000 Bolt\cell 3\cell\row
{\header Harbor Light Co.\par}
Braces \{ and \} and a backslash \\ stay.\par
}"""


def test_an_rtf_file_reads_as_its_text_and_says_what_it_left_out(tmp_path: Path) -> None:
    (tmp_path / "supplier.rtf").write_bytes(CONTRACT)
    (doc,) = load_corpus([str(tmp_path / "supplier.rtf")]).documents
    assert (doc.kind, doc.unit) == ("rtf", PARAGRAPH)
    lines = [line for line in doc.text.split("\n") if line]
    assert lines == ["Café Supplier Contract", "The penalty for late\u00a0delivery is 2 percent per week.",
                     "Привет means hello.", "Terms online", "Item | Price", "Bolt | 3",
                     "Braces { and } and a backslash \\ stay."]
    assert "Times" not in doc.text and "Bo Lund" not in doc.text and "0a1b" not in doc.text
    (note,) = doc.left_out
    assert note.part and "1 image not read" in note.reason and "1 header, footer or note not read" in note.reason


def test_rtf_is_known_by_its_content_in_a_folder(tmp_path: Path) -> None:
    """WordPad saves .doc files as RTF; named .txt or piped in, it is RTF all the same."""
    (tmp_path / "letter.doc").write_bytes(CONTRACT)
    (tmp_path / "note.txt").write_bytes(b"{\\rtf1\\ansi Plain note.\\par}")
    corpus = load_corpus([str(tmp_path)])
    assert {Path(d.path).name: (d.kind, d.text) for d in corpus.documents}["note.txt"] == ("rtf", "Plain note.")
    assert "letter.doc" in {Path(d.path).name for d in corpus.documents}


def _mhtml(html: str, image: bytes) -> bytes:
    """A page saved by Chrome's "Save as single file": quoted-printable HTML, a base64 image."""
    import base64
    import quopri

    qp = quopri.encodestring(html.encode("utf-8")).decode("ascii")
    picture = base64.encodebytes(image).decode("ascii")
    return (f"From: <Saved by Blink>\nSubject: Expense Policy\nMIME-Version: 1.0\nContent-Type: multipart/related;\n"
            f'\ttype="text/html";\n\tboundary="----B----"\n\n------B----\nContent-Type: text/html\n'
            f"Content-Transfer-Encoding: quoted-printable\nContent-Location: https://intranet/policy\n\n{qp}\n"
            f"------B----\nContent-Type: image/png\nContent-Transfer-Encoding: base64\n\n{picture}\n------B------\n"
            ).replace("\n", "\r\n").encode("ascii")


def test_a_saved_single_file_web_page_reads_as_its_page(tmp_path: Path) -> None:
    """Read raw, its quoted-printable markup ("Meals are reimbu=") and a base64 picture
    were 37K tokens."""
    html = ('<html><head><meta charset="utf-8"><title>Expense Policy</title></head><body><h1>Expense Policy</h1>'
            "<p>Meals are reimbursed up to 40 EUR a day, caf\u00e9 receipts included.</p><p>Taxis need a receipt.</p>"
            "</body></html>")
    (tmp_path / "policy.mhtml").write_bytes(_mhtml(html, b"\x89PNG\r\n\x1a\n" + bytes(30_000)))
    (doc,) = load_corpus([str(tmp_path)]).documents
    assert doc.text.split("\n") == ["# Expense Policy", "", "Meals are reimbursed up to 40 EUR a day, café receipts included.",
                                    "", "Taxis need a receipt."]
    assert doc.unit == PARAGRAPH and doc.source_lines == (1, 1, 2, 2, 3)
    (note,) = doc.left_out
    assert note.reason == "1 image of the page not read"


def test_rtf_edge_cases_found_by_review(tmp_path: Path) -> None:
    from ktcli.ingest.rtf import rtf_text

    def text(data: bytes) -> str:
        return rtf_text(data).texts[0]

    # a double-byte code page's lead byte escaped, its trail byte literal; raw 8-bit text in the code page
    assert text(rb"{\rtf1\ansi\ansicpg932 \'83e\'83X\'83g\par}") == "テスト"
    assert text(b"{\\rtf1\\ansi\\ansicpg1252 \x93Hi\x94\\par}") == "\u201cHi\u201d"
    # \binN's raw bytes are no braces and no text
    assert text(b"{\\rtf1\\ansi{\\pict\\pngblip\\bin6 \x00}{\xff\x01\x02}Hello world.\\par Second.\\par}") == "Hello world.\n\nSecond."
    # a cell's paragraphs stay in its row; a text box is read
    assert text(rb"{\rtf1\ansi\trowd\intbl Name\cell Line one\par Line two\cell\row\pard After.\par}") == \
        "Name | Line one / Line two\n\nAfter."
    assert "40 EUR" in text(rb"{\rtf1\ansi Body.\par{\shp{\*\shpinst{\sp{\sn fillColor}{\sv 255}}{\shptxt Fee: 40 EUR.\par}}}}")


def test_only_a_saved_page_is_read_as_mhtml(tmp_path: Path) -> None:
    """Code or notes quoting MIME headers were refused as pages without an HTML part, and
    an e-mail lost its headers (found by review)."""
    (tmp_path / "snap.py").write_text('HEADER = "MIME-Version: 1.0\\nContent-Type: multipart/related; boundary=x"\n')
    (tmp_path / "notes.md").write_text("Chrome writes MIME-Version: 1.0 and multipart/related at the top.\n")
    mail = ("From: ann@example.com\nTo: bob@example.com\nSubject: Budget\nMIME-Version: 1.0\n"
            'Content-Type: multipart/related; boundary="b"\n\n--b\nContent-Type: text/html\n\n<p>Approved.</p>\n--b--\n')
    (tmp_path / "approval.eml").write_text(mail)
    docs = {Path(d.path).name: d for d in load_corpus([str(tmp_path)]).documents}
    assert docs["snap.py"].kind == "code" and docs["notes.md"].kind == "markdown"
    assert docs["approval.eml"].text.startswith("# Subject: Budget\nFrom: ann@example.com")  # an e-mail, headers kept


def _message() -> bytes:
    from email.message import EmailMessage

    m = EmailMessage()
    m["From"], m["To"] = "Ana Ruiz <ana@example.com>", "Bo Lund <bo@example.com>"
    m["Subject"], m["Date"] = "Revised price for the harbour lamps", "Tue, 05 Mar 2024 10:00:00 +0100"
    m.set_content("Hello Bo,\n\nthe revised price is EUR 410,000 for all three lamps. " + "We keep the date. " * 6
                  + "\n\nBest,\nAna\n", cte="quoted-printable")
    m.add_alternative("<html><body><p>the revised price is <b>EUR 410,000</b></p></body></html>", subtype="html")
    m.add_attachment(b"%PDF-1.4 quote", maintype="application", subtype="pdf", filename="quote.pdf")
    m.add_attachment("Lamp 1: 140,000\nLamp 2: 135,000\n", filename="breakdown.txt")
    forwarded = EmailMessage()
    forwarded["From"], forwarded["Subject"] = "Cy <cy@example.com>", "Old quote"
    forwarded.set_content("The old price was EUR 450,000.\n")
    m.add_attachment(forwarded)
    return bytes(m)


def test_an_email_reads_as_a_mail_program_shows_it(tmp_path: Path) -> None:
    """Read as text, its quoted-printable body broke figures at soft line breaks and its
    base64 parts were most of its passages."""
    from ktcli.ingest.loaders import document_from_bytes

    (tmp_path / "thread.eml").write_bytes(_message())
    corpus = load_corpus([str(tmp_path / "thread.eml")])
    doc = corpus.documents[0]
    lines = doc.text.split("\n")
    assert lines[:4] == ["# Subject: Revised price for the harbour lamps", "From: Ana Ruiz <ana@example.com>",
                         "To: Bo Lund <bo@example.com>", "Date: Tue, 05 Mar 2024 10:00:00 +0100"]
    assert "the revised price is EUR 410,000 for all three lamps." in doc.text and "<b>" not in doc.text  # the plain body
    assert "## Attachment: breakdown.txt\n\nLamp 1: 140,000" in doc.text
    assert "## Subject: Old quote\nFrom: Cy <cy@example.com>\n\nThe old price was EUR 450,000." in doc.text
    assert "base64" not in doc.text.lower() and "=\n" not in doc.text
    assert doc.unit == PARAGRAPH
    assert [s.reason for s in corpus.skipped] == [
        "attachment quote.pdf (application/pdf) not read: save it and name it to read it"]
    # piped in, known by its header block
    piped = document_from_bytes(_message(), "<stdin>", "", is_stdin=True)
    assert piped.text == doc.text
    # notes that merely start with "From:" are no message
    notes = document_from_bytes(b"From: the harbour master\nTo do: paint the lamps\n", "<stdin>", "", is_stdin=True)
    assert notes.text.startswith("From: the harbour master")


def test_what_is_no_single_message_is_not_read_as_one(tmp_path: Path) -> None:
    """Found by review: a part with no charset lost its 8-bit letters; an mbox read as its
    first message hid the rest; `git format-patch` piped in was taken for a message; a
    message nested thousands deep failed the run."""
    from ktcli.errors import InputError
    from ktcli.ingest.loaders import document_from_bytes

    plain = "From: a@example.com\nSubject: Maße\n\nDie Größe ist 5 m².\n# Kopie nachts\n".encode()
    text = document_from_bytes(plain, "m.eml", "m.eml").text
    assert "Die Größe ist 5 m²." in text and "\n\\# Kopie nachts" in text  # a body's "# " line is no heading
    mbox = (b"From alice@example.com Mon Jan  1 10:00:00 2024\nFrom: alice@example.com\nSubject: one\n\nfirst body\n\n"
            b"From bob@example.com Mon Jan  1 11:00:00 2024\nFrom: bob@example.com\nSubject: two\n\nsecond body\n")
    for name in ("inbox.eml", ""):
        doc = document_from_bytes(mbox, name or "<stdin>", name, is_stdin=not name)
        assert "first body" in doc.text and "second body" in doc.text, name
    patch = (b"From 8f3c1d2e4b5a69788f3c1d2e4b5a69788f3c1d2e Mon Sep 17 00:00:00 2001\nFrom: Ann <ann@example.com>\n"
             b"Date: Tue, 5 Mar 2024 10:00:00 +0100\nSubject: [PATCH] fix\nMIME-Version: 1.0\n\n---\n a.py | 2 +-\n"
             b"diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert document_from_bytes(patch, "<stdin>", "", is_stdin=True).unit != PARAGRAPH  # a diff, cited by line
    deep = b"From: a@example.com\nSubject: s\nMIME-Version: 1.0\n" + b"Content-Type: message/rfc822\n\n" * 3000 + b"body\n"
    try:
        document_from_bytes(deep, "deep.eml", "deep.eml")
    except InputError as e:
        assert "e-mail" in str(e)


def test_an_mbox_is_read_message_by_message(tmp_path: Path) -> None:
    """Found by a probe: an .mbox was read as raw text: a body in HTML alone was only base64,
    a subject "=?utf-8?b?...?=", a quoted-printable body "K=C3=A4llarsalen", an attached
    PDF hundreds of lines of base64."""
    from email.message import EmailMessage
    from email import policy

    from ktcli.ingest.loaders import document_from_bytes

    one = EmailMessage()
    one["From"], one["Date"], one["Subject"] = "Zoë <zoe@example.se>", "Wed, 10 Jan 2024 09:00:00 +0100", "Årsmöte – lokal"
    one.set_content("The meeting is in the Källarsalen room.\nFrom the desk of the board.\n", cte="quoted-printable")
    two = EmailMessage()
    two["From"], two["Subject"] = "Lars <lars@example.se>", "Re: Årsmöte"
    two.set_content("<p>The auditor is Britt-Marie Sjöholm.</p>", subtype="html", cte="base64")
    two.add_attachment(b"%PDF-1.4" + bytes(range(256)) * 8, maintype="application", subtype="pdf", filename="scan.pdf")
    data = b"".join(b"From MAILER-DAEMON Fri Jan 12 08:05:00 2024\n"
                    + m.as_bytes(policy=policy.default.clone(linesep="\n")).replace(b"\nFrom ", b"\n>From ") + b"\n"
                    for m in (one, two))
    for name in ("board.mbox", "board.eml", ""):
        doc = document_from_bytes(data, name or "<stdin>", name, is_stdin=not name)
        assert doc.unit == PARAGRAPH, name
        assert doc.text.startswith("# Subject: Årsmöte – lokal\nFrom: Zoë <zoe@example.se>\n"), name
        assert "Källarsalen room.\nFrom the desk of the board." in doc.text  # mboxrd's ">From " as written
        assert "# Subject: Re: Årsmöte\n" in doc.text and "The auditor is Britt-Marie Sjöholm." in doc.text
        assert "=?utf-8" not in doc.text and "base64" not in doc.text.lower()
        assert [s.reason for s in doc.left_out] == [
            "message 2: attachment scan.pdf (application/pdf) not read: save it and name it to read it"]


def test_rtf_footnotes_are_read_as_words_are() -> None:
    """Found by a probe: an RTF footnote was left out ("1 header, footer or note not read")
    where the Word reader reads them: the venue's caveat was in it."""
    from ktcli.ingest.rtf import rtf_text

    found = rtf_text(rb"""{\rtf1\ansi{\*\ftnsep \pard\plain {\chftnsep \par}}{\header \pard Board \par}
\pard The fee is EUR 40{\cs15\super \chftn {\footnote \pard\plain \s16 {\cs15\super \chftn } Paid \b yearly\b0 .\par Second.}} a year.\par
\trowd\cellx3000\cellx6000\intbl Item{\super\chftn{\footnote\pard{\super\chftn} Cell note.}}\cell 5\cell\row
\pard Closing{\footnote\ftnalt\pard An endnote.} words.\par
\pard Last.\par}""")
    assert found.texts == ["The fee is EUR 40[^1] a year.\n[footnote 1: Paid yearly. Second.]\n\n"
                           "Item[^2] | 5\n[footnote 2: Cell note.]\n\nClosing[^i] words.\n\nLast.\n\n[endnote i: An endnote.]"]
    assert found.left_out == ["1 header, footer or note not read"]  # the header


def test_rtf_hidden_text_is_left_out_as_words_is() -> None:
    """Found by a probe: RTF hidden text (\\v ... \\v0, or a {\\v ...} group) was read as
    the document's words, where the Word reader leaves w:vanish runs out: a hidden
    "opened in 1850" stood beside the shown "opened in 1921"."""
    from ktcli.ingest.rtf import rtf_text

    found = rtf_text(rb"""{\rtf1\ansi\ansicpg1252
\pard The caf\'e9 opened in 1921.{\v  Hidden: 1850 \u8364? \'e9\emdash .} Shown.\par
\pard A \v secret\v0  B \v more\plain  C.\par
\pard Plain.\par}""")
    assert found.texts == ["The caf\u00e9 opened in 1921. Shown.\n\nA B C.\n\nPlain."]
    assert found.left_out == ["hidden text left out"]
    assert rtf_text(rb"{\rtf1\ansi \pard Nothing hidden.\par}").left_out == []
