"""Word files through the real CLI: one piped in is planned as the document it is, with
what it leaves out said on stderr; an encrypted one is one line and exit code 3. `plan`
loads no model, so these are quick."""

import json

from tests.ingest.office_fixtures import drawing, make_docx, p, r

from .conftest import run_ktcli
from .test_bad_input import assert_one_line_error


def test_a_word_file_piped_in_is_read_and_an_encrypted_one_refused(cache, tmp_path):
    body = (p(r("Scope"), style="Heading1") + p(r("The gate code is 4471."))
            + p(r("Fees", extra="<w:lastRenderedPageBreak/>"), style="Heading1") + p(drawing("Harbor map")))
    proc = run_ktcli(["plan", "-", "What is the gate code?", "--json"], cache, stdin=make_docx(body))
    assert proc.returncode == 0, proc.stderr.decode()
    (document,) = json.loads(proc.stdout)["documents"]
    assert (document["path"], document["kind"]) == ("<stdin>", "docx")
    assert "! read <stdin>: 1 image not read (the alt text of 1 read)" in proc.stderr.decode()
    locked = tmp_path / "locked.docx"
    header = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(16) + b"\x3e\x00\x03\x00\xfe\xff\x09\x00"
    locked.write_bytes(header.ljust(512, b"\xff") + "EncryptedPackage".encode("utf-16-le").ljust(1536, b"\x00"))
    assert_one_line_error(run_ktcli(["ask", str(locked), "What is the gate code?"], cache), 3,
                          "locked.docx: an encrypted or legacy .doc/.docx (OLE) file")
