"""Outlines of code files (ingest.outline): what a summary reads of a file when reading
every line would take too long. Each kept line must be the file's own, at its number."""

import textwrap

from ktcli.ingest.outline import outline_chunks, outline_lines, outline_text
from ktcli.types import Document

PYTHON = textwrap.dedent('''\
    """Ledger storage: accounts and their postings.

    A second paragraph of the module docstring that the outline leaves out.
    """

    import os

    MAX_ACCOUNTS = 500  # the bank's limit
    _cache = {}


    # Accounts are immutable; postings make new ones.
    @dataclass(frozen=True)
    class Account:
        """One customer account."""

        number: str
        balance: int = 0

        def deposit(self, amount: int,
                    memo: str = "") -> "Account":
            """A copy with `amount` added.

            Raises ValueError for negative amounts.
            """
            if amount < 0:
                raise ValueError("negative deposit")
            secret_body_marker = amount * 2
            return Account(self.number, self.balance + amount)


    def transfer(src, dst, amount):
        def helper():
            return inner_body_marker
        total = src.balance - amount
        return total


    if __name__ == "__main__":
        transfer(None, None, 0)
''')


def doc(text, language="python", kind="code", path="ledger.py"):
    return Document(path=path, text=text, kind=kind, language=language)


def kept_map(d):
    return dict(outline_lines(d))


def test_python_outline_keeps_signatures_docstrings_and_constants_at_their_lines():
    d = doc(PYTHON)
    kept = outline_lines(d)
    lines = PYTHON.split("\n")
    for number, text in kept:  # every kept line is the file's own, at its own number
        assert lines[number - 1] == text
    got = dict(kept)
    texts = list(got.values())
    assert texts[0] == '"""Ledger storage: accounts and their postings.'
    assert "A second paragraph" not in "\n".join(texts)  # the docstring's summary only
    assert "MAX_ACCOUNTS = 500  # the bank's limit" in texts
    assert "_cache = {}" not in texts  # a private module variable is body, not outline
    assert "# Accounts are immutable; postings make new ones." in texts  # the comment above the class
    assert "@dataclass(frozen=True)" in texts and "class Account:" in texts
    assert '    """One customer account."""' in texts
    assert "    number: str" in texts  # fields of a class
    # a two-line signature whole, and its docstring's first paragraph
    assert "    def deposit(self, amount: int," in texts
    assert '                memo: str = "") -> "Account":' in texts
    assert '        """A copy with `amount` added.' in texts
    assert not any("Raises ValueError" in t for t in texts)
    assert "def transfer(src, dst, amount):" in texts
    assert 'if __name__ == "__main__":' in texts
    body = "\n".join(texts)
    for marker in ("secret_body_marker", "inner_body_marker", "def helper", "total = ", "import os"):
        assert marker not in body


def test_outline_text_separates_top_level_items_and_is_shorter():
    d = doc(PYTHON)
    text = outline_text(outline_lines(d))
    assert "\n\ndef transfer(src, dst, amount):" in text
    assert len(text) < len(PYTHON) / 2


def test_python_that_does_not_parse_is_outlined_by_its_lines():
    source = "def broken(:\n    x = 1\n    return x\n\n\nclass Fine:\n    y = 2\n" + "z = 3\n" * 5
    got = kept_map(doc(source))
    assert "class Fine:" in got.values() and "def broken(:" in got.values()
    assert "    x = 1" not in got.values()


def test_other_languages_keep_declarations_with_their_doc_comments():
    rust = textwrap.dedent('''\
        //! Parsing of ledger files.

        use std::fs;

        /// One posting line.
        pub struct Posting {
            pub amount: i64,
        }

        impl Posting {
            /// Parse a line.
            pub fn parse(line: &str) -> Option<Posting> {
                let hidden_body = line.trim();
                None
            }
        }
    ''')
    got = kept_map(doc(rust, language="rust", path="lib.rs"))
    texts = list(got.values())
    assert texts[0] == "//! Parsing of ledger files."
    for line in ("/// One posting line.", "pub struct Posting {", "impl Posting {", "    /// Parse a line.",
                 "    pub fn parse(line: &str) -> Option<Posting> {"):
        assert line in texts
    assert not any("hidden_body" in t for t in texts)

    c = "#include <stdio.h>\n\n/* Adds two numbers. */\nstatic int add(int a, int b)\n{\n    return a + b;\n}\n" \
        "\nint main(void) {\n    if (add(1, 2)) {\n        printf(\"x\");\n    }\n    return 0;\n}\n"
    got = kept_map(doc(c, language="c", path="main.c"))
    assert "static int add(int a, int b)" in got.values() and "/* Adds two numbers. */" in got.values()
    assert "int main(void) {" in got.values()
    assert not any("printf" in t or "return" in t for t in got.values())


def test_data_files_show_their_head_and_prose_is_not_outlined():
    data = "\n".join(f'  "key{i}": {i},' for i in range(100))
    got = outline_lines(doc("{\n" + data + "\n}\n", language="json", path="big.json"))
    assert [n for n, _ in got] == list(range(1, 13))
    assert outline_lines(doc("# Title\n\nSome prose.\n" * 50, language=None, kind="markdown", path="a.md")) is None


def test_a_file_that_is_all_outline_is_read_whole():
    assert outline_lines(doc('"""Tiny."""\nLIMIT = 3\n')) is None
    assert outline_lines(doc("")) is None


def test_outline_chunks_cover_every_kept_line_once_and_cite_their_span():
    source = "\n\n".join(f'def f{i}(x):\n    """Doubles x, number {i}."""\n    return 2 * x' for i in range(60))
    d = doc(source)
    kept = outline_lines(d)
    chunks = outline_chunks(d, kept, max_tokens=60)
    assert len(chunks) > 2
    assert all(c.n_tokens <= 60 for c in chunks)
    assert "\n".join(c.text for c in chunks).replace("\n\n", "\n") == "\n".join(t for _, t in kept)
    for c in chunks:
        first_line = c.text.split("\n")[0]
        assert source.split("\n")[c.span.line_start - 1] == first_line
        assert c.span.path == "ledger.py" and c.span.line_end >= c.span.line_start
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))


def test_long_prose_keeps_headings_and_first_paragraphs():
    sections = []
    for i in range(12):
        body = "\n".join(f"Body line {i}.{k} of the section, which the outline leaves out." for k in range(60))
        sections.append(f"Section {i}\n==========\n\n.. _label-{i}:\n\nLead {i} first line.\nLead {i} second line.\n\n{body}\n")
    text = "Opening paragraph of the guide.\n\n" + "\n".join(sections)
    d = doc(text, language=None, kind="text", path="guide.rst")
    kept = outline_lines(d)
    lines = text.split("\n")
    assert all(lines[n - 1] == t for n, t in kept)
    got = [t for _, t in kept]
    assert got[0] == "Opening paragraph of the guide."
    for i in range(12):
        assert f"Section {i}" in got and f"Lead {i} first line." in got and f"Lead {i} second line." in got
    assert not any(t.startswith(("Body line", ".. _label")) for t in got)
    markdown = "# Guide\n\nIntro.\n\n" + "\n".join(f"## Part {i}\n\nFirst of {i}.\n\n" + "More text.\n" * 800 for i in range(5))
    got = [t for _, t in outline_lines(doc(markdown, language=None, kind="markdown", path="g.md"))]
    assert got[:2] == ["# Guide", "Intro."] and "## Part 4" in got and "First of 4." in got and "More text." not in got


def test_short_prose_and_prose_without_headings_are_read_whole():
    assert outline_lines(doc("# A\n\nx\n\n## B\n\ny\n\n## C\n\nz\n", language=None, kind="markdown", path="r.md")) is None
    assert outline_lines(doc("Just words. " * 5000, language=None, kind="text", path="plain.txt")) is None
    assert outline_lines(doc("Page text " * 5000, language=None, kind="pdf", path="a.pdf")) is None


def test_a_long_pdf_is_outlined_by_the_sections_its_bookmarks_start(tmp_path, monkeypatch):
    """`--outline always` read a PDF whole though its headings were found: a PDF's text has
    no `#` lines, so its sections are those `pdf_headings` placed."""
    from ktcli.ingest.loaders import load_file
    from tests.ingest.fixtures import make_bookmarked_pdf

    def filler(topic):
        return [f"Sentence {i} of the part on {topic}, about the harbour, its lamps and keepers." for i in range(40)]

    titles = ["1 Tides", "2 Boats", "3 Lamps", "4 Keepers", "5 Storms"]
    pages = [["The Harbour Report", "An opening paragraph that says what the report is."]]
    pages += [[title, f"The lead of {title}.", *filler(title)] for title in titles]
    path = tmp_path / "report.pdf"
    path.write_bytes(make_bookmarked_pdf(pages, [(title, n) for n, title in enumerate(titles, start=1)]))
    doc = load_file(path, "report.pdf")
    assert len(doc.text) >= 10_000
    import ktcli.ingest.outline as outline

    assert outline_lines(doc) is None  # under PROSE_OUTLINE_CHARS: read whole
    monkeypatch.setattr(outline, "PROSE_OUTLINE_CHARS", 5_000)
    got = outline_lines(doc)
    lines = doc.text.split("\n")
    assert got is not None and all(lines[n - 1] == text for n, text in got)  # each at its line
    kept = {n - 1 for n, _ in got}
    texts = [text for _, text in got]
    for title in titles:
        assert title in texts and f"The lead of {title}." in texts
    assert texts[0] == "The Harbour Report"
    assert sum("Sentence" in t for t in texts) <= len(titles) * (outline.LEAD_LINES - 1)
    assert len(kept) < len(lines) / 3
    chunks = outline_chunks(doc, [(i + 1, lines[i]) for i in sorted(kept)], 200)
    assert chunks[0].span.page == 1 and chunks[-1].span.page == 6  # named by page, as a PDF's chunks are
