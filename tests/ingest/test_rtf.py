"""RTF files read as their text (`ingest.rtf`): read raw, a two-sentence contract with a
picture was 108K tokens of control words and hex."""

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
