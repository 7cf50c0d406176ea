"""Single inputs: every kind we read, the normalisation rules, and every bad input."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from tests.ingest.fixtures import (
    damage_page,
    PNG_BYTES,
    encrypt_pdf,
    make_form_pdf,
    make_image_only_pdf,
    make_pdf_with_a_scanned_page,
    make_stamped_scan_pdf,
    make_table_pdf,
    make_text_pdf,
    make_two_column_pdf,
    make_two_column_pdf_drawn_across,
    make_word_by_word_pdf,
    make_wrapped_table_pdf,
)
from ktcli.errors import InputError, UsageError
from ktcli.ingest import load_corpus
from ktcli.ingest.errors import RejectedInput
from ktcli.ingest.loaders import load_stdin
from ktcli.types import Document


def load_one(path: Path) -> Document:
    corpus = load_corpus([str(path)])
    assert len(corpus.documents) == 1
    return corpus.documents[0]


def input_error(path: Path | str, **kwargs: object) -> str:
    with pytest.raises(InputError) as info:
        load_corpus([str(path)], **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message, "the user sees exactly one line"
    return message


# ---- kinds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "kind", "language"),
    [
        ("notes.txt", "plain text\n", "text", None),
        ("guide.md", "# Title\n\nBody\n", "markdown", None),
        ("guide.rst", "Title\n=====\n\nBody\n", "text", None),
        ("app.py", "def f():\n    return 1\n", "code", "python"),
        ("lib.rs", "fn main() {}\n", "code", "rust"),
        ("Makefile", "all:\n\techo hi\n", "code", "make"),
        ("Dockerfile", "FROM python:3.11\n", "code", "dockerfile"),
        ("deploy", "#!/usr/bin/env bash\necho deploy\n", "code", "shell"),
        ("tool", "#!/usr/bin/python3.11 -u\nprint(1)\n", "code", "python"),
        ("server", "#!/usr/bin/env node\nconsole.log(1)\n", "code", "javascript"),
        ("script.unknown", "import os\nimport sys\n\ndef main():\n    return 0\n", "code", "python"),
        ("patch.weird", "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "code", "diff"),
        ("LICENSE", "Permission is hereby granted, free of charge, to any person\n", "text", None),
        ("data.xyz", "just some words\nimport this is prose\n", "text", None),
    ],
)
def test_kind_and_language(write, name: str, content: str, kind: str, language: str | None) -> None:
    doc = load_one(write(name, content))
    assert (doc.kind, doc.language) == (kind, language)
    assert doc.text == content
    assert doc.sha256 == hashlib.sha256(content.encode()).hexdigest()


def test_explicit_path_shown_as_given(write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write("sub/a.txt", "hello\n")
    monkeypatch.chdir(tmp_path)
    assert load_corpus(["sub/a.txt"]).documents[0].path == "sub/a.txt"


def test_html_keeps_visible_text_as_lines(write) -> None:
    html = """<!DOCTYPE html><html><head><title>Hidden title</title>
    <style>body { color: red }</style><script>var secret = 1;</script></head>
    <body><h1>Release   notes</h1><p>First <b>bold</b>
    paragraph.</p><ul><li>one</li><li>two</li></ul>
    <table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table><img src="x.png" alt="A map of  the bay">
    <pre>def f():
    return 1</pre><noscript>enable js</noscript><!-- a comment --></body></html>"""
    doc = load_one(write("page.html", html))
    assert doc.kind == "html"
    assert doc.text.split("\n") == [
        "Title: Hidden title", "",  # the tab's name: put first (the rest of <head> is not content)
        "# Release notes", "", "First bold", "paragraph.", "", "- one", "- two", "",
        "k | v", "a | 1", "", "[image: A map of the bay]", "def f():", "    return 1",
    ]
    for hidden in ("secret", "color", "enable js", "comment"):
        assert hidden not in doc.text
    same = load_one(write("same.html", "<title>Release notes</title><h1>Release notes</h1><p>x</p>"))
    assert same.text.split("\n")[0] == "# Release notes"  # a title the first heading repeats is not said twice


def test_a_saved_pages_navigation_menus_are_left_out_and_said(write) -> None:
    """A documentation page's sidebar listed the whole site: read, it took the window and
    retrieval's top places. Left out where the page has words of its own, and said."""
    prose = " ".join(f"The harbour logs tide {i} in the ledger at the north pier." for i in range(8))
    menu = "".join(f'<li><a href="/p{i}">Tide tables part {i}</a></li>' for i in range(30))
    html = (f"<html><body>\n<nav><ul>{menu}</ul>\n</nav>\n<div role=\"navigation\"><nav>Previous | Next</nav></div>\n"
            f"<main><h1>Tides</h1>\n<p>{prose}</p></main>\n<footer>Kept: the page's own footer.</footer></body></html>")
    doc = load_one(write("tides.html", html))
    assert "Tide tables" not in doc.text and "Previous" not in doc.text
    assert "# Tides" in doc.text and "tide 7 in the ledger" in doc.text and "Kept: the page's own footer." in doc.text
    assert [n.reason for n in doc.left_out] == ["2 navigation menus (123 words of site links) left out"]
    lines = doc.text.split("\n")
    assert doc.source_lines[lines.index("# Tides")] == 5  # lines still those of the file
    # a page that is all menu (a site map) keeps it, and says nothing
    sitemap = load_one(write("map.html", f"<html><body><h1>Site map</h1><nav><ul>{menu}</ul></nav></body></html>"))
    assert "Tide tables part 29" in sitemap.text and sitemap.left_out == ()
    # an empty menu (one a script fills: underscore.js's docs) leaves nothing out, and is not said
    empty = load_one(write("empty.html", f'<html><body><label for="menu" role="navigation"></label><p>{prose}</p></body></html>'))
    assert empty.left_out == () and "tide 7 in the ledger" in empty.text


def test_html_lines_know_the_file_lines_they_come_from(write) -> None:
    # Citations must name lines of the file the user has, not of the extracted text.
    html = "\n".join([
        "<!doctype html>", "<html><head><title>T</title>", "<style>", "p { color: red }", "</style></head>",
        "<body>", "<h1>The Lighthouse</h1>", "<p>The keeper is", "<b>Ada Quill</b>, who", "lives on the rock.</p>",
        '<p style="display: none">Hidden draft</p><div hidden>Also hidden</div>',
        "<ul>", "  <li>One</li>", "  <li>Two</li>", "</ul>", "<script>", "var x = 1;", "</script><p>After",
        "the script.</p>", "<table><tr><td>Q3</td><td>5.87</td></tr>", "<tr><td>Q4</td>", "<td>5.83</td></tr></table>",
        "<pre>", "code line 1", "code line 2", "</pre>", "<p>End.</p>", "</body></html>",
    ])
    doc = load_one(write("page.html", html))
    source = html.split("\n")
    lines = doc.text.split("\n")
    assert len(doc.source_lines) == len(lines)
    for text, number in zip(lines, doc.source_lines):
        if text:  # each line's words are on the file line it names (a row's start there)
            words = text.removeprefix("Title: ").lstrip("#- ").split(" | ")[0].split()
            assert all(w.strip(",.") in source[number - 1] for w in words), (text, number)
    got = dict(zip(lines, doc.source_lines))
    # A wrapped paragraph keeps its line breaks, so a quote from its end cites its own line.
    assert (got["The keeper is"], got["Ada Quill, who"], got["lives on the rock."]) == (8, 9, 10)
    assert got["Q4 | 5.83"] == 21  # a row written over two lines is still one line of text
    assert (got["After"], got["the script."], got["code line 2"], got["End."]) == (18, 19, 25, 27)
    assert "Hidden draft" not in doc.text and "Also hidden" not in doc.text


def test_code_blocks_side_by_side_in_one_pre_keep_their_own_lines(write) -> None:
    """Node's docs put an example's ESM and CommonJS forms in one <pre>, <code> after <code>:
    the first's last line and the second's first were read as one ("});const http2 = ...")."""
    html = "\n".join([
        "<html><body><p>Example:</p>",
        '<pre><code class="mjs">import http2 from "node:http2";',
        'req.on("end", () => {});</code><code class="cjs">const http2 = require("node:http2");',
        'req.on("end", () => {});</code></pre>',
        "<p>End.</p></body></html>",
    ])
    doc = load_one(write("http2.html", html))
    lines = doc.text.split("\n")
    assert 'req.on("end", () => {});' in lines and 'const http2 = require("node:http2");' in lines
    got = dict(zip(lines, doc.source_lines))
    assert (got['import http2 from "node:http2";'], got['const http2 = require("node:http2");'], got["End."]) == (2, 3, 5)


def test_html_fast_paths_read_as_bs4_does(write) -> None:
    """The walk's own stand-ins for bs4's slow calls (`str(pre)` to count its lines,
    find_parent, the parser's list of void tags it closed) give what bs4's would: a <pre>
    with a value over lines in a tag, a stray `</br>` after `<br>`s, a table in a table."""
    from bs4 import BeautifulSoup

    from ktcli.ingest.htmltext import _newlines_of, _parse

    html = "\n".join([
        "<html><body><p>One<br>two<br>three</br>four<img src=a.png></img></p>",
        '<pre class="x\ny">a <span title="t', 'u">b</span>', "c<!-- note", "--></pre>",
        "<table><tr><td><table><tr><td>In</td><td>ner</td></tr></table></td><td>Out</td></tr></table>",
        "<p>After.</p></body></html>",
    ])
    soup = _parse(html)
    assert soup.decode() == BeautifulSoup(html, "html.parser").decode()
    pre = soup.find("pre")
    assert _newlines_of(pre) == str(pre).count("\n") == 3  # its title's, text's and comment's (not its class's)
    doc = load_one(write("fast.html", html))
    assert doc.text.split("\n") == ["One", "two", "threefour", "", "a b", "c", "", "In | ner", "", "Out", "", "After."]
    assert doc.source_lines[-1] == 8


def test_html_without_its_head_end_tag_keeps_the_body(write) -> None:
    # HTML lets a page leave out </head> and <body>; html.parser then nests the body in
    # <head>, which was dropped whole: the text was only "Title: Fern care".
    page = ("<!DOCTYPE html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n<title>Fern care</title>\n"
            "<link rel=stylesheet href=s.css>\n<h1>Ferns</h1>\n<p>Mist them every 3 days in winter.\n</html>\n")
    doc = load_one(write("omitted.html", page))
    assert doc.text.split("\n") == ["Title: Fern care", "", "# Ferns", "", "Mist them every 3 days in winter."]
    assert doc.source_lines[2:] == (7, 8, 8)
    untitled = load_one(write("untitled.html", "<html><head><meta charset=utf-8>\n<body><p>Prune roses in March.</p>"))
    assert untitled.text == "Prune roses in March."


def test_html_lines_after_start_tags_over_several_lines(write) -> None:
    # prettier writes one attribute a line: the text after such a tag was cited 1-3
    # lines early (at the tag's first line), and after a skipped one too.
    html = "\n".join([
        "<main", '  id="content"', ">", "<h1", '  class="title"', ">", "Seed Library", "</h1>",
        "<p", '  class="lead"', ">", "The library lends 340 varieties.", "</p>",
        "<div><script", '  src="/a.js"', "  defer></script>", "Text after a script.",
        "<img", '  src="a.png"', '  alt="A map">', "Text after an image.",
        '<p title="x', 'y">After a value over two lines.</p>',
        "<svg", '  viewBox="0 0 9 9"><path', '  d="M0"/></svg>', "Text after a drawing.</div></main>",
    ])
    doc = load_one(write("prettier.html", html))
    source = html.split("\n")
    got = dict(zip(doc.text.split("\n"), doc.source_lines))
    for text in ("Seed Library", "The library lends 340 varieties.", "Text after a script.", "Text after an image.",
                 "After a value over two lines.", "Text after a drawing."):
        assert text in source[got.get(text, got.get(f"# {text}", 0)) - 1], (text, got)
    assert got["[image: A map]"] == 20


def test_html_table_rows_keep_their_columns(write) -> None:
    page = ("<table><tr><th></th><th>Spring</th><th>Autumn</th></tr>"
            "<tr><th>Rain (mm)</th><td>80</td><td>140</td></tr>"
            "<tr><td></td><td>Shade</td><td>7</td></tr><tr><td></td><td> </td></tr>"
            "<tr><td><p>Monstera</p></td><td><p>13</p><p>(indoors)</p></td><td>Line one<br>Line two</td></tr></table>")
    assert load_one(write("t.html", page)).text.split("\n") == [
        "| Spring | Autumn",  # an empty corner cell keeps "Autumn" over the autumn figure
        "Rain (mm) | 80 | 140",
        "| Shade | 7",  # an empty first cell is a column, not nothing
        "Monstera | 13 (indoors) | Line one Line two",  # a cell's paragraphs stay in its row
    ]
    # A merged cell (colspan) leaves its columns empty: the cells after it stay under their
    # headers; nothing is owed after a row's last cell.
    merged = ("<table><tr><th>Region</th><th>Q1</th><th>Q2</th><th>Q3</th></tr>"
              "<tr><td>North</td><td colspan=2>5.1 (both)</td><td>7.2</td></tr>"
              "<tr><td colspan='4'>All regions</td></tr><tr><td>South</td><td colspan=x>1</td><td>2</td></tr></table>")
    assert load_one(write("m.html", merged)).text.split("\n") == [
        "Region | Q1 | Q2 | Q3", "North | 5.1 (both) | | 7.2", "All regions", "South | 1 | 2"]
    # a digit int() cannot read ("²".isdigit() is true) is no span, nor a heading level
    odd = "<h²>Title</h²><table><tr><td colspan='²'>a</td><td>b</td></tr></table>"
    assert load_one(write("o.html", odd)).text.split("\n")[-1] == "a | b"


def test_html_permalinks_after_headings_are_left_out(write) -> None:
    """Probe 108: a Sphinx page's headings read "Retry policies¶" (its hover-only permalink
    `<a class="headerlink">¶</a>`), and so did every citation's section trail."""
    page = "\n".join([
        '<h1>Retry policies<a class="headerlink" href="#retry" title="Permalink">¶</a></h1>',
        '<p>Tried 5 times.</p>',
        '<h2 id="s">Status codes<a href="#s">#</a></h2>',
        '<dl><dt id="C">class Client(url)<a class="reference" href="#C">¶</a></dt><dd>A client.</dd></dl>',
        '<h3><a href="#x">Back off</a></h3>',  # a heading's own words in a link stay
        '<p>See <a href="#s">¶</a> above.</p>',  # (outside a heading or a term, a link is read)
    ])
    lines = [line for line in load_one(write("retry.html", page)).text.split("\n") if line]
    assert lines == ["# Retry policies", "Tried 5 times.", "## Status codes", "class Client(url)", "A client.",
                     "### Back off", "See ¶ above."]


def test_html_code_beside_its_line_numbers_keeps_its_lines(write) -> None:
    """Probe 108: a Sphinx page's code block with line numbers (Pygments' table layout)
    read as one row, "1 2 3 | from tidepool import Client policy = ... client.get(...)"."""
    page = "\n".join([
        '<h1>Retry policies<a class="headerlink" href="#retry" title="Permalink">¶</a></h1>',
        '<table class="highlighttable"><tr><td class="linenos"><div class="linenodiv"><pre><span>1</span>',
        '<span>2</span>',
        '<span>3</span></pre></div></td><td class="code"><div class="highlight"><pre><span>from tidepool import Client</span>',
        '<span>policy</span> = RetryPolicy(max_attempts=7)',
        '    client = Client(retry=policy)',
        '</pre></div></td></tr></table>',
        '<h2 id="s">Status codes<a href="#s">#</a></h2>',
        '<dl><dt id="C">class Client(url)<a class="reference" href="#C">¶</a></dt><dd>A client.</dd></dl>',
        # a data table's row of numbers and one-line code stays a row; a heading's own link stays
        '<table><tr><td>429</td><td><pre>retry()</pre></td></tr></table>',
        '<h3><a href="#x">Back off</a></h3>',
    ])
    doc = load_one(write("retry.html", page))
    lines = [line for line in doc.text.split("\n") if line]
    assert lines == ["# Retry policies", "from tidepool import Client", "policy = RetryPolicy(max_attempts=7)",
                     "    client = Client(retry=policy)", "## Status codes", "class Client(url)", "A client.",
                     "429 | retry()", "### Back off"]
    source = page.split("\n")
    got = dict(zip(doc.text.split("\n"), doc.source_lines))
    for text in ("from tidepool import Client", "policy = RetryPolicy(max_attempts=7)", "    client = Client(retry=policy)"):
        assert text.strip().split()[0] in source[got[text] - 1], (text, got[text])
    # Rouge's (Jekyll) and Chroma's (Hugo) layouts: the same
    rouge = ('<table class="rouge-table"><tbody><tr><td class="rouge-gutter gl"><pre class="lineno">1\n2\n</pre></td>'
             '<td class="rouge-code"><pre>package main\nfunc main() {}\n</pre></td></tr></tbody></table>')
    assert load_one(write("rouge.html", rouge)).text.split("\n") == ["package main", "func main() {}"]


def test_html_rowspan_keeps_the_columns_of_the_rows_below(write) -> None:
    # A cell with rowspan holds its column in the rows below, which have no cell there: read
    # without one, "Varnholm Annex | 3 | 420" put the city under Depot (asked its city, the
    # answer was "3").
    page = ("<table><thead><tr><th>Depot</th><th>City</th><th>Forklifts</th></tr></thead><tbody>"
            "<tr><td rowspan='2'>East Hub</td><td>Varnholm</td><td>9</td></tr>"
            "<tr><td>Varnholm Annex</td><td>3</td></tr>"
            "<tr><td>South Pier</td><td>Kelbrook</td><td rowspan=2>4</td></tr>"
            "<tr><td>West Gate</td><td>Ostmere</td></tr></tbody></table>")
    assert load_one(write("r.html", page)).text.split("\n") == [
        "Depot | City | Forklifts", "East Hub | Varnholm | 9", "| Varnholm Annex | 3",
        "South Pier | Kelbrook | 4", "West Gate | Ostmere"]
    # two header rows: the spanned headers' columns, a span past its row group's end stops there
    headers = ("<table><thead><tr><th rowspan=2>Region</th><th colspan=2>Sales</th><th rowspan=5>Note</th></tr>"
               "<tr><th>Q1</th><th>Q2</th></tr></thead><tbody><tr><td>N</td><td>1</td><td>2</td><td>x</td></tr>"
               "</tbody></table>")
    assert load_one(write("h.html", headers)).text.split("\n") == ["Region | Sales | | Note", "| Q1 | Q2", "N | 1 | 2 | x"]


def test_html_ruby_readings_are_left_out(write) -> None:
    page = "<p><ruby>清水寺<rp>(</rp><rt>きよみずでら</rt><rp>)</rp></ruby>を訪れ、<ruby>太<rt>た</rt>郎<rt>ろう</rt></ruby>に会った。</p>"
    assert load_one(write("r.html", page)).text.strip() == "清水寺を訪れ、太郎に会った。"


def test_html_lists_formulas_drawings_and_fields(write) -> None:
    page = ("<ol start=3><li><p>Water the fern.</p></li><li>Mist it.</li><li></li></ol>"
            "<ul><li>Loose</li></ul>"
            "<p>The ratio is <math><mn>3</mn><mo>/</mo><mn>4</mn></math> of the total, photo&shy;synthesis.</p>"
            "<svg><title>Open menu</title><text>Bench 7 is north</text></svg>"
            "<form><label>Notes</label><textarea>Water on Mondays</textarea>"
            "<input type=hidden value=secret><input value='Prefilled 42'></form>")
    lines = load_one(write("l.html", page)).text.split("\n")
    assert [t for t in lines if t][:3] == ["3. Water the fern.", "4. Mist it.", "- Loose"]  # no lone "-", numbers kept
    assert "The ratio is 3 / 4 of the total, photosynthesis." in lines
    assert "Bench 7 is north" in lines and "Open menu" not in "\n".join(lines)
    assert "Notes" in lines and "Water on Mondays" in lines and "Prefilled 42" in lines
    assert "secret" not in "\n".join(lines)
    # A list in another's item is indented under it: flattened, a night shift's supervisor
    # read as an item of the list of shifts.
    nested = ("<ul><li>Day shift<ul><li>Supervisor: Ann</li></ul></li>"
              "<li>Night shift<ol><li>Supervisor: Bo<ul><li>Cover: Cy</li></ul></li></ol></li></ul>")
    assert [t for t in load_one(write("n.html", nested)).text.split("\n") if t] == [
        "- Day shift", "  - Supervisor: Ann", "- Night shift", "  1. Supervisor: Bo", "    - Cover: Cy"]
    # An icon's SVG <title> is not the page's title.
    assert not load_one(write("icon.html", "<svg><title>Open menu</title></svg><p>Rain</p>")).text.startswith("Title")


def test_html_sniffed_without_extension(write) -> None:
    doc = load_one(write("page", "<!doctype html><html><body><p>Hi</p></body></html>"))
    assert (doc.kind, doc.text) == ("html", "Hi")


def test_stdin_text_and_bytes() -> None:
    corpus = load_corpus(["-"], stdin_text="line one\r\nline two\n")
    doc = corpus.documents[0]
    assert (doc.path, doc.kind, doc.text) == ("<stdin>", "stdin", "line one\nline two\n")
    diff = load_stdin(None, io.BytesIO(b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"))
    assert (diff.kind, diff.language) == ("stdin", "diff")
    pdf = load_stdin(None, io.BytesIO(make_text_pdf([["piped page"]])))
    assert pdf.kind == "pdf" and "piped page" in pdf.text


def test_stdin_among_files(write) -> None:
    path = write("a.txt", "file\n")
    corpus = load_corpus([str(path), "-"], stdin_text="piped\n")
    assert [d.path for d in corpus.documents] == [str(path), "<stdin>"]


# ---- normalisation -------------------------------------------------------------------


def test_utf8_bom_crlf_cr_and_nul(write) -> None:
    doc = load_one(write("a.txt", b"\xef\xbb\xbfone\r\ntwo\rthree\x00\n"))
    assert doc.text == "one\ntwo three\n"  # a lone \r beside \n line breaks redraws its line
    assert doc.sha256 == hashlib.sha256(b"one\ntwo three\n").hexdigest()
    assert load_one(write("mac.txt", b"one\rtwo\rthree\r")).text == "one\ntwo\nthree\n"  # old Mac text


def test_progress_bars_do_not_move_the_line_numbers(write) -> None:
    # A build log: tqdm-style lines redraw themselves with \r. Line N must be what
    # `sed -n Np` shows, or every citation after the first bar points below its text.
    raw = b"".join((b"progress 10%\rprogress 50%\rprogress 100%\n" if i % 10 == 0 else b"")
                   + f"step {i}: loaded module mod{i}\n".encode() for i in range(1, 300))
    doc = load_one(write("build.log", raw))
    lines = doc.text.split("\n")
    want = raw.split(b"\n")
    assert len(lines) == len(want)
    at = next(i for i, line in enumerate(want) if line.startswith(b"step 250:"))
    assert lines[at] == "step 250: loaded module mod250"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_by_bom(write, encoding: str) -> None:
    text = "Grüße, 世界\r\nzweite Zeile\r\n"
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    assert load_one(write("wide.txt", data)).text == "Grüße, 世界\nzweite Zeile\n"


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_bom(write, encoding: str) -> None:
    # Reported as binary before: a NUL in every other byte, and no mark to say why
    text = "Notes on the harbour light.\r\nThe keeper is Ada Quill (Grüße).\r\n" * 20
    assert load_one(write("wide.txt", text.encode(encoding))).text == text.replace("\r\n", "\n")
    # a binary with NULs in every other byte but control bytes between stays binary
    assert "binary" in input_error(write("blob.dat", bytes(b for i in range(400) for b in (i % 7 + 1, 0))))


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_bom_whose_bytes_are_all_valid_utf8(write, encoding: str) -> None:
    """Code units whose bytes are all below 0x80 (中 is 2D 4E, ’ is 19 20) made valid UTF-8:
    read so, its NULs and control bytes were left out and "中大" became "-N'Y"."""
    text = "The project code name is 中大 (zhong da). It’s “big” \u2014 and old.\nThe lead is Wang.\n"
    corpus = load_corpus([str(write("wide.txt", text.encode(encoding)))])
    assert corpus.documents[0].text == text and not corpus.skipped
    # a byte past the last pair (`echo >> file`): read, and said (it was refused as not UTF-16)
    corpus = load_corpus([str(write("wide.txt", text.encode(encoding) + b"\n"))])
    assert corpus.documents[0].text == text and "last byte past its UTF-16" in corpus.skipped[0].reason


def test_latin1_and_cp1252_fallback(write) -> None:
    assert load_one(write("l1.txt", "café déjà vu\n".encode("latin-1"))).text == "café déjà vu\n"
    assert load_one(write("w.txt", "“quoted” – dash €5\n".encode("cp1252"))).text == "“quoted” – dash €5\n"


def test_text_with_a_binary_tail_keeps_the_text_and_says_what_was_left_out(write) -> None:
    # The binary sniff reads the first 8 KB: a log with a dump after it went whole to
    # cp1252 mojibake, unannounced.
    text = "".join(f"2026-12-04 10:{i % 60:02d} worker {i} finished\n" for i in range(400))
    dump = bytes(range(256)) * 12
    corpus = load_corpus([str(write("run.log", text.encode() + dump))])
    assert corpus.documents[0].text == text
    assert corpus.skipped[0].reason == f"binary data after byte {len(text.encode()):,} left out ({len(dump):,} bytes)"


def test_utf8_with_a_stray_byte_stays_utf8_and_says_so(write) -> None:
    """One Latin-1 byte in a UTF-8 file used to send the whole file to cp1252 ("MÃ¼ller")."""
    text = "Der Bürgermeister von Zürich heißt Müller.\nGrüße aus Köln.\n"
    data = text.encode("utf-8").replace(b"K\xc3\xb6ln", b"K\xf6ln")  # a Latin-1 "ö"
    path = write("mixed.txt", data)
    corpus = load_corpus([str(path)])
    assert corpus.documents[0].text == text.replace("Köln", "K\ufffdln")
    (note,) = corpus.skipped
    assert note.path == str(path) and note.reason.startswith("a byte that is not valid UTF-8")
    assert note.replaced  # reported as read, with a byte replaced: not as skipped
    # Latin-1 text has (almost) no valid UTF-8 sequences: still cp1252, said to be a guess
    # (Russian comments in cp1251 came out as "Ïîäêëþ÷åíèå", unannounced)
    latin = load_corpus([str(write("latin.txt", text.encode("latin-1")))])
    assert latin.documents[0].text == text and "read as Windows-1252 (Western European), a guess" in latin.skipped[0].reason
    # two valid characters and one stray byte: UTF-8 still
    few = load_corpus([str(write("few.txt", "Zürich and München. A broken byte: ".encode() + b"\xff end.\n"))])
    assert few.documents[0].text.startswith("Zürich and München.") and few.skipped[0].replaced


def test_a_file_of_utf8_lines_and_cp1252_lines_reads_each_line_right(write) -> None:
    """Too many Latin-1 bytes for strays, and read whole as cp1252 the UTF-8 half became
    "Die GrÃ¶ÃŸe der BrÃ¼cke"."""
    utf8 = "".join(f"Die Größe der Brücke {i} über die Mühlenstraße.\n" for i in range(5))
    latin = "".join(f"Le café numéro {i} est à côté de l'église.\n" for i in range(40))
    corpus = load_corpus([str(write("notes.txt", utf8.encode() + latin.encode("cp1252")))])
    assert corpus.documents[0].text == utf8 + latin
    assert corpus.skipped[0].reason.startswith("40 lines not UTF-8: read as Windows-1252 (Western European), a guess")
    # a few Latin-1 lines, under the 64 stray bytes UTF-8 takes: their letters, not U+FFFD
    few = "".join(f"Zeile {i}: Größe über alles\r\n" for i in range(20)).encode()
    few += "Zeile 3: Müller Straße\r\n".encode("latin-1") + "Größe ".encode() + "und Köln\r\n".encode("latin-1")
    corpus = load_corpus([str(write("few.txt", few))])
    assert "Zeile 3: Müller Straße\n" in corpus.documents[0].text
    assert "Größe und K\ufffdln" in corpus.documents[0].text  # both in one line: its UTF-8 kept
    assert corpus.skipped[0].reason.startswith("a line not UTF-8: read as Windows-1252")
    assert corpus.skipped[0].reason.endswith("; a byte in a line of both read as \ufffd")
    # Russian in cp1251 between UTF-8 lines is no Western text: not read line by line
    russian = load_corpus([str(write("ru.txt", utf8.encode() + ("Привет, мир. " * 30 + "\n").encode("cp1251") * 20))])
    assert "lines not UTF-8" not in " ".join(s.reason for s in russian.skipped)


# ---- bad input -----------------------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    message = input_error(tmp_path / "nope.txt")
    assert message.endswith("nope.txt: no such file or directory")


def test_no_paths() -> None:
    with pytest.raises(InputError, match="no input"):
        load_corpus([])


@pytest.mark.parametrize("content", [b"", b"  \n\t\r\n"])
def test_empty_file_given_explicitly(write, content: bytes) -> None:
    assert "empty file" in input_error(write("empty.txt", content))


def test_empty_stdin() -> None:
    with pytest.raises(InputError, match="<stdin>: empty input"):
        load_corpus(["-"], stdin_text="")
    # piped bytes: what may have printed nothing (`git diff | ktcli ask - ...` with no changes)
    with pytest.raises(InputError, match="command before `|` printed nothing"):
        load_stdin(None, io.BytesIO(b""))
    with pytest.raises(UsageError, match="more than once"):  # the command line, not the input, is wrong
        load_corpus(["-", "-"], stdin_text="x")


@pytest.mark.parametrize(
    "data",
    [PNG_BYTES, bytes(range(256)) * 4, b"\x7fELF\x02\x01\x01" + b"\x00" * 100, bytes(range(1, 256)) * 4],
)
def test_binary_given_explicitly(write, data: bytes) -> None:
    message = input_error(write("thing.dat", data))
    assert "binary" in message and "thing.dat" in message


def test_binary_despite_text_extension(write) -> None:
    assert "binary" in input_error(write("fake.txt", PNG_BYTES))


def test_undecodable_text(write) -> None:
    # high bytes that no encoding reads as text
    assert "undecodable" in input_error(write("noise.txt", bytes(range(160, 256)) * 20))
    # a UTF-16 BOM followed by an unpaired surrogate
    assert "undecodable" in input_error(write("bad16.txt", b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8A\x00"))


def test_unreadable_file(write, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write("secret.txt", "x\n")
    real_open = open

    def deny(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    assert input_error(path).endswith("secret.txt: unreadable (permission denied)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_by_mode(write) -> None:
    path = write("secret.txt", "x\n")
    path.chmod(0)
    assert "permission denied" in input_error(path)


def test_explicit_file_never_skipped_for_size(write) -> None:
    path = write("big.txt", "word " * 1000 + "\n")
    doc = load_corpus([str(path)], max_file_bytes=100).documents[0]
    assert doc.text.count("word") == 1000


def test_same_file_twice_read_once(write) -> None:
    path = write("a.txt", "x\n")
    assert len(load_corpus([str(path), str(path)]).documents) == 1


# ---- PDFs ----------------------------------------------------------------------------


def test_pdf_pages_and_line_offsets(write) -> None:
    pages = [["Alpha page one", "second line"], ["Beta page two"], ["Gamma page three", "x", "y"]]
    doc = load_one(write("r.pdf", make_text_pdf(pages)))
    assert doc.kind == "pdf"
    assert [p.number for p in doc.pages] == [1, 2, 3]
    lines = doc.text.split("\n")
    for page, expected in zip(doc.pages, pages):
        page_lines = page.text.split("\n")
        assert lines[page.line_offset : page.line_offset + len(page_lines)] == page_lines
        assert page_lines == expected


def test_an_unreadable_pdf_page_is_reported_not_dropped(write) -> None:
    pages = [["Alpha page one"], ["The code word is HERON."], ["Gamma page three"]]
    path = write("r.pdf", damage_page(make_text_pdf(pages), 2))
    corpus = load_corpus([str(path)])
    (doc,) = corpus.documents
    assert [p.text for p in doc.pages] == ["Alpha page one", "", "Gamma page three"]
    (skipped,) = corpus.skipped
    assert skipped.path == f"{path} p.2" and skipped.reason.startswith("page could not be read (")


def test_right_to_left_words_run_together_are_told_apart_from_words() -> None:
    """pypdf reads LibreOffice's Arabic lines as letters run together, every space moved to
    the line's start: nothing a question can match; said."""
    from ktcli.ingest.pdftext import _page_list, _rtl_words_run_together

    words = "يصف هذا التقرير الوضع العام للإدارة البلدية ومهامها الرئيسية في العام الحالي. "
    assert not _rtl_words_run_together(words * 8)
    assert _rtl_words_run_together("     .            " + (words * 8).replace(" ", "").replace(".", ""))
    assert not _rtl_words_run_together("يصفهذاالتقريرالوضع")  # too little to tell
    assert not _rtl_words_run_together("גשר הירקון נבנה בשנת 1925 על ידי המהנדס דוד כהן. " * 10)
    assert (_page_list([4]), _page_list([5, 6]), _page_list([2, 5, 6, 7])) == ("p.4", "pages 5-6", "pages 2, 5-7")


def test_a_scanned_page_among_text_pages_is_reported(write) -> None:
    path = write("mixed.pdf", make_pdf_with_a_scanned_page("Alpha page one", "Gamma page three"))
    corpus = load_corpus([str(path)])
    assert [p.text for p in corpus.documents[0].pages] == ["Alpha page one", "", "Gamma page three"]
    (skipped,) = corpus.skipped
    assert skipped.path == f"{path} p.2" and skipped.reason.startswith("no text layer, only images")
    # every page a scan: the whole file is refused, with the OCR hint
    scans = make_pdf_with_a_scanned_page("", "")
    assert "no text layer on any of its 3 pages" in input_error(write("scans.pdf", scans))
    # a page that is blank (no text, no image) is not news
    assert not load_corpus([str(write("blank.pdf", make_text_pdf([["one"], [], ["three"]])))]).skipped


def test_scans_with_a_stamp_are_reported_in_one_line_per_file(write) -> None:
    """A scan with a Bates number or fax header has a few characters of text: it was read
    as those characters, the page's words lost without a word."""
    corpus = load_corpus([str(write("bates.pdf", make_stamped_scan_pdf(["ACME000001", "ACME000002", "ACME000003"])))])
    assert corpus.documents[0].text.split() == ["ACME000001", "ACME000002", "ACME000003"]  # read, and said:
    (note,) = corpus.skipped
    assert note.path.endswith("bates.pdf") and "only 30 characters of text on its 3 pages" in note.reason
    assert "ocrmypdf" in note.reason
    long = "The lease runs for five years from the first of March, at a rent agreed by both parties, reviewed each spring."
    for in_form in (False, True):  # also a scan placed inside a form XObject
        path = write("mixed.pdf", make_stamped_scan_pdf(["A1", "A2", "A3"], {0: long, 2: long}, in_form=in_form))
        corpus = load_corpus([str(path)])
        assert [s.path for s in corpus.skipped] == [f"{path} p.2"]
        assert "only 2 characters of text on a page-sized image" in corpus.skipped[0].reason
        assert corpus.skipped[0].part  # its words were read: said "read ... p.2", not "skipped"


def test_a_scan_with_a_short_ocr_layer_is_not_told_to_run_ocr(write) -> None:
    """A scanned page already OCR'd whose words are few (a chapter title, a signature
    page) was reported as a stamp over unread words, with the advice to run OCR again."""
    for in_form in (False, True):
        data = make_stamped_scan_pdf(["Chapter Two", "Signed in Port Alder"], in_form=in_form, ocr_layer=True)
        corpus = load_corpus([str(write("ocred.pdf", data))])
        assert not corpus.skipped, corpus.skipped
        assert corpus.documents[0].text.split() == ["Chapter", "Two", "Signed", "in", "Port", "Alder"]


def test_slides_with_a_picture_and_a_title_are_not_scans(write) -> None:
    """A picture beside a slide's title is not a scan: such decks were refused."""
    data = make_stamped_scan_pdf(["Quarterly results", "Our team", "Thank you"], image_share=0.4)
    corpus = load_corpus([str(write("deck.pdf", data))])
    assert not corpus.skipped and "Quarterly results" in corpus.documents[0].text


def test_pdf_ligatures_and_words_broken_at_line_ends_are_mended() -> None:
    from ktcli.ingest.pdftext import _mend_words

    text = "The \ufb01nal \ufb01gures show e\ufb03cient o\ufb03ce work\ufb02ow after the reorgan-\nization of the\ndocu-\nmentation team.\nPart-\nTime staff: 12-\n14 people."
    assert _mend_words(text) == ("The final figures show efficient office workflow after the reorganization of the\n"
                                 "documentation team.\nPart-\nTime staff: 12-\n14 people.")
    assert _mend_words("pre-\nand post-war") == "pre-\nand post-war"  # a suspended compound


def test_a_compound_broken_at_a_line_end_keeps_its_hyphen() -> None:
    """"well-" / "known" became "wellknown", which matches nothing a user types."""
    from ktcli.ingest.pdftext import _mend_words, mend_pages

    assert _mend_words("a well-\nknown fact, a long-\nterm plan, some-\nthing") == \
        "a well-known fact, a long-term plan, something"
    # The document's own spelling decides: a compound it writes whole elsewhere, a word
    # it writes joined elsewhere.
    assert mend_pages(["The data-set is small.", "each data-\nset"]) == ["The data-set is small.", "each data-set"]
    assert mend_pages(["Any sunflower.", "a sun-\nflower"]) == ["Any sunflower.", "a sunflower"]
    assert mend_pages(["a sun-\nflower"]) == ["a sun-flower"]  # two whole words, no evidence: a compound
    # a centred line's indent, and a name broken before a capital the document writes whole
    assert mend_pages(["Speech Reco-\n   gnition", "on Libri-\nSpeech and LibriSpeech", "Jean-\nPierre"]) == [
        "Speech Recognition", "on LibriSpeech and LibriSpeech", "Jean-\nPierre"]


def test_pdf_table_rows_stay_on_one_line(write) -> None:
    rows = [["Quarter", "Revenue ($M)", "Units"], ["Q1 2023", "4.60", "61,200"], ["Q2 2023", "5.10", "66,900"],
            ["Full year", "9.70", "128,100"]]
    before = ["Results by quarter, in the table below."]
    after = ["The second quarter was the stronger one."]
    text = load_one(write("t.pdf", make_table_pdf(before, rows, after))).text
    assert text.split("\n") == [
        *before,
        "Quarter | Revenue ($M) | Units",
        "Q1 2023 | 4.60 | 61,200",
        "Q2 2023 | 5.10 | 66,900",
        "Full year | 9.70 | 128,100",
        *after,
    ]


def test_pdf_table_row_with_an_empty_cell_keeps_its_columns(write) -> None:
    """A probe's budget table: a row whose 2022 cell is empty read "Depots | 9.3", the 2023
    figure under 2022. The empty cell is a column of its own, as in the HTML and Word readers."""
    rows = [["Item", "2022 (EUR m)", "2023 (EUR m)", "Note"], ["Track renewal", "41.2", "47.9", "on plan"],
            ["Depots", "", "9.3", ""], ["New line", "", "", "from 2024"], ["Total", "41.2", "57.2", ""]]
    text = load_one(write("t.pdf", make_table_pdf(["Budget by item."], rows, ["Figures are rounded."]))).text
    assert text.split("\n") == ["Budget by item.", "Item | 2022 (EUR m) | 2023 (EUR m) | Note",
                                "Track renewal | 41.2 | 47.9 | on plan", "Depots | | 9.3", "New line | | | from 2024",
                                "Total | 41.2 | 57.2", "Figures are rounded."]


def test_pdf_columns_are_not_interleaved(write) -> None:
    """Two columns of short lines (what a table check looks at): each column still reads
    top to bottom, as the plain extraction gives it; no line pairs left with right."""
    left = ["Left one", "Left two", "Left three", "Left four"]
    right = ["Right one", "Right two", "Right three", "Right four"]
    text = load_one(write("cols.pdf", make_two_column_pdf(left, right))).text
    assert text.split("\n") == left + right


COLUMN_PROSE = (["The harbour master Ingrid Solvang recorded", "that the north breakwater at Port Alder was",
                 "extended by exactly 340 metres in the spring", "of 1987, after the great storm had destroyed",
                 "the old wooden pier and two fishing boats.", "The work was paid for by the county."],
                ["Meanwhile the lighthouse on Skarv Island was", "automated in 1992, when the last keeper, Olav",
                 "Brekke, retired to the mainland. The lamp was", "converted from kerosene to electricity and",
                 "its range grew from 14 to 19 nautical miles,", "according to the coastal administration."])


def test_two_columns_drawn_a_line_of_each_in_turn_are_read_one_after_the_other(write) -> None:
    """A probe's PDF: the plain text read the columns across, and the answer mixed them
    ("the north breakwater was extended to 1992, when the last keeper...")."""
    left, right = COLUMN_PROSE
    assert load_one(write("across.pdf", make_two_column_pdf_drawn_across(left, right))).text.split("\n") == left + right


def test_two_columns_drawn_across_under_a_page_number_drawn_first_are_read_one_after_the_other(write) -> None:
    """A page number drawn before the text (reportlab's page templates do) was the plain
    text's first line and the layout's last: every line compared one off, and the columns
    stayed mixed."""
    import io

    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    left, right = COLUMN_PROSE
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    pdf.drawString(520, 30, "7")
    for i, (a, b) in enumerate(zip(left, right)):
        pdf.drawString(72, 800 - 16 * i, a)
        pdf.drawString(320, 800 - 16 * i, b)
    pdf.showPage()
    pdf.save()
    assert load_one(write("foot.pdf", buffer.getvalue())).text.split("\n") == left + right + ["7"]


def test_words_drawn_one_by_one_are_read_as_lines(write) -> None:
    """A word a line: four short lines cost 373 tokens, and citations worked on fragments."""
    lines = [f"Line {n}: the harbour master Ingrid Solvang recorded the breakwater works." for n in
             ("one", "two", "three", "four")]
    assert load_one(write("words.pdf", make_word_by_word_pdf(lines))).text.split("\n") == lines


def test_a_list_of_single_words_stays_a_list(write) -> None:
    words = ["apples", "pears", "plums", "cherries", "quinces", "medlars", "figs", "dates"]
    assert load_one(write("list.pdf", make_text_pdf([words]))).text.split("\n") == words


WRAPPED_ROWS = [["Quarter", "Channel", "Revenue ($M)"],
                ["Q1 2023", "Online shop", "4.60"],
                ["Q2 2023", "Lanterns sold to fishing co-operatives on the west coast", "5.10"],
                ["Q3 2023", "Lanterns sold through hardware chains in the north region", "5.87"]]


@pytest.mark.parametrize("valign", ["TOP", "MIDDLE", "BOTTOM"])
def test_pdf_table_rows_with_wrapped_cells_stay_on_one_line(write, valign) -> None:
    """A long cell wraps over three lines: the plain text had a line per fragment and the
    row's other cells apart; the layout spreads the row over three lines, its key on the
    first, middle or last as the cells are aligned (in MIDDLE, the line between Q2 and Q3
    ends the one and begins the other)."""
    before = ["Sales by quarter and channel."]
    after = ["The third quarter was the strongest."]
    data = make_wrapped_table_pdf(before, WRAPPED_ROWS, after, widths=[70, 150, 80], valign=valign)
    assert load_one(write("t.pdf", data)).text.split("\n") == [
        *before,
        "Quarter | Channel | Revenue ($M)",
        "Q1 2023 | Online shop | 4.60",
        "Q2 2023 | Lanterns sold to fishing co-operatives on the west coast | 5.10",
        "Q3 2023 | Lanterns sold through hardware chains in the north region | 5.87",
        *after,
    ]


def test_pdf_table_row_whose_key_wraps_stays_on_one_line(write) -> None:
    rows = [["Property", "Value", "Notes"],
            ["Operating temperature range", "-20 to 60 C", "tested for 1,000 hours in the salt-spray chamber"],
            ["Weight", "1.2 kg", "without the glass chimney"]]
    data = make_wrapped_table_pdf([], rows, ["Figures from the 2023 catalogue."], widths=[80, 90, 120])
    assert load_one(write("t.pdf", data)).text.split("\n") == [
        "Property | Value | Notes",
        "Operating temperature range | -20 to 60 C | tested for 1,000 hours in the salt-spray chamber",
        "Weight | 1.2 kg | without the glass chimney",
        "Figures from the 2023 catalogue.",
    ]


def test_pdf_table_of_long_wrapped_cells_is_found(write) -> None:
    """Fragments longer than a cell looks: no three short lines in a row, only the pairs
    where a row ends and the next begins; the page is still read for its table."""
    long = "Lanterns sold through the hardware chains of the north region and the coastal towns"
    rows = [["Q1", long, "4.60"], ["Q2", long, "5.10"], ["Q3", long, "5.87"], ["Q4", long, "5.83"]]
    data = make_wrapped_table_pdf(["Revenue by quarter, $M."], rows, [], widths=[40, 250, 60])
    assert load_one(write("t.pdf", data)).text.split("\n") == [
        "Revenue by quarter, $M.", *(f"{q} | {long} | {v}" for q, _, v in rows)]


@pytest.mark.parametrize("left, right", [
    (["Left one", "Left two", "Left three", "Left four", "Left five", "Left six"],
     ["Right one", "Right two", "Right three", "Right four"]),
    (["Left one", "Left two"], ["Right one", "Right two", "Right three", "Right four"]),
    (["Summary"], ["The harbour light was lit", "every night of the year", "but one, in the storm", "of March."]),
    (["The harbour light was lit", "every night of the year", "but one, in the storm", "of March."], ["See p. 4"]),
])
def test_pdf_columns_of_unequal_length_are_not_read_as_a_wrapped_row(write, left, right) -> None:
    """Two columns of prose side by side, one longer: the lines past the shorter one have
    text in one column only, as a wrapped cell's do. Each column still reads top to
    bottom on lines of its own; no line joins text of the two, not even a heading beside a
    paragraph or a note in the margin beside a column."""
    text = load_one(write("cols.pdf", make_two_column_pdf(left, right))).text
    assert text.split("\n") == left + right


def test_pdf_list_of_short_lines_is_not_a_table(write) -> None:
    lines = ["Packing list", "Brass lantern", "Spare wick", "Glass chimney, wrapped", "Lamp oil, 1 litre"]
    assert load_one(write("list.pdf", make_text_pdf([lines]))).text.split("\n") == lines


def test_may_hold_table_passes_over_prose_with_headings() -> None:
    """Layout extraction costs half again a page's reading: a page of prose with a heading
    or two (a paragraph's short last line, then the heading) is not a table's."""
    from ktcli.ingest.pdftext import _may_hold_table

    line = "The harbour light was lit every night of the year but one, in the storm of March."
    page = ["Results", line, line, "of the year.", "Outlook", line, "in spring.", "Risks", line, line]
    assert not _may_hold_table("\n".join(page))
    assert _may_hold_table("\n".join(["Q1", line, line, "4.60", "Q2", line, "5.10", "Q3", line, "5.87", "Q4"]))


def test_wrapped_rows_are_joined_only_where_the_plain_text_reads_them_cell_by_cell() -> None:
    from ktcli.ingest.pdftext import _rejoin_rows

    layout = ("Table 3: Sales\n"
              " Quarter      Channel                  Units\n"
              " Q1 2023      Lanterns sold through    120\n"
              "              hardware chains in the\n"
              "              north-\n"
              "              east\n"
              " Q2 2023      Online shop              80\n")
    cell_by_cell = "Table 3: Sales\nQuarter\nChannel\nUnits\nQ1 2023\nLanterns sold through\nhardware chains in the\n" \
                   "north-\neast\n120\nQ2 2023\nOnline shop\n80"
    assert _rejoin_rows(cell_by_cell, layout).split("\n") == [
        "Table 3: Sales",  # a caption over the key column is not a key wrapped upwards
        "Quarter | Channel | Units",
        "Q1 2023 | Lanterns sold through hardware chains in the north-east | 120",  # a word broken at the cell's edge
        "Q2 2023 | Online shop | 80",
    ]
    # Drawn line by line across the row, not cell by cell: the wrapped lines are not taken
    # (a note right under a table reads the same), only the first line is a row, as before.
    line_by_line = "Q1 2023\nLanterns sold through\n120\nhardware chains in the\nnorth-\neast"
    assert _rejoin_rows(line_by_line, layout).split("\n") == [
        "Q1 2023 | Lanterns sold through | 120", "hardware chains in the", "north-", "east"]


def test_pdf_with_empty_user_password_opens(write) -> None:
    data = encrypt_pdf(make_text_pdf([["Open sesame"]]), user_password="")
    assert "Open sesame" in load_one(write("locked-lightly.pdf", data)).text


def test_encrypted_pdf_needs_password(write) -> None:
    data = encrypt_pdf(make_text_pdf([["Top secret"]]), user_password="hunter2")
    message = input_error(write("locked.pdf", data))
    assert "encrypted PDF that needs a password" in message and "locked.pdf" in message


def test_image_only_pdf(write) -> None:
    message = input_error(write("scan.pdf", make_image_only_pdf(3)))
    assert "no text layer on any of its 3 pages" in message and "OCR" in message


@pytest.mark.parametrize(
    "data",
    [
        b"%PDF-1.4\n" + bytes(range(256)) * 8,
        b"%PDF-1.7\n%%EOF\n",
        b"not a pdf at all, just text",
    ],
)
def test_corrupt_pdf(write, data: bytes) -> None:
    message = input_error(write("broken.pdf", data))
    assert "broken.pdf" in message and ("corrupt" in message or "PDF" in message)


def test_text_and_code_that_mention_the_pdf_header_are_read_as_what_they_are(write) -> None:
    """A PDF writer in Python and notes about the format hold "%PDF-" in their first KB:
    they were refused as corrupt PDFs, and a folder of them lost them."""
    code = load_one(write("pdfwriter.py", b'"""Write minimal PDFs."""\nMAGIC = b"%PDF-1.4"\n\ndef header():\n    return MAGIC\n'))
    assert code.kind == "code" and 'MAGIC = b"%PDF-1.4"' in code.text
    notes = load_one(write("format.md", b"# PDF\n\nEvery PDF file starts with `%PDF-1.7`.\n"))
    assert notes.kind == "markdown" and "%PDF-1.7" in notes.text
    # named as text yet starting like a PDF that is not one: read as text
    odd = load_one(write("odd.txt", b"%PDF- is how a PDF starts; this is a note about it.\n"))
    assert odd.kind == "text" and odd.text.startswith("%PDF-")
    # a real PDF under a text name is still a PDF
    assert load_one(write("report.txt", make_text_pdf([["page one text"]]))).kind == "pdf"
    # piped in, or without an extension: "%PDF-" past the start is text too
    diff = b"diff --git a/w.py b/w.py\n+MAGIC = b\"%PDF-1.4\"\n"
    assert "%PDF-1.4" in load_stdin(None, io.BytesIO(diff)).text
    assert "%PDF-1.4" in load_one(write("CHANGES", diff)).text


def test_a_pdf_locked_by_a_certificate_handler_is_one_line(write) -> None:
    """pypdf raises NotImplementedError for handlers other than /Standard: that was an
    internal error, which also stopped a folder's other files being read."""
    data = encrypt_pdf(make_text_pdf([["Open sesame"]]), user_password="").replace(b"/Standard", b"/PubSec01")
    message = input_error(write("locked.pdf", data))
    assert "locked.pdf: PDF that cannot be opened" in message and "security handler" in message
    write("fine.txt", b"a readable note\n")
    corpus = load_corpus([str(Path(write("locked.pdf", data)).parent)])
    assert [d.path.endswith("fine.txt") for d in corpus.documents] == [True]
    assert any("locked.pdf" in s.path for s in corpus.skipped)


def test_deeply_nested_html_is_read(write) -> None:
    """Markup that never closes its <font> tags nests a level per line: 1,500 lines were an
    internal error (RecursionError)."""
    markup = "<html><body>" + "".join(f"<font color=red>line {i}<br>\n" for i in range(3000)) + "</body></html>"
    doc = load_one(write("deep.html", markup.encode()))
    assert doc.text.split("\n")[0] == "line 0" and "line 2999" in doc.text


def test_non_latin_utf16_without_a_bom_is_named_in_the_binary_report(write) -> None:
    # It cannot be told from binary for sure (random bytes decode to CJK too), but the hint
    # said "ktcli reads text" to a user who had given text.
    text = "".join(f"{i}行目: 東京の天気は晴れです。私は毎朝コーヒーを飲みます。\n" for i in range(60))
    message = input_error(write("ja.txt", text.encode("utf-16-le")))
    assert "binary (or UTF-16LE text without a byte-order mark?)" in message and "iconv -f UTF-16LE" in message
    assert "byte-order mark" not in input_error(write("noise.bin.txt", bytes(range(256)) * 40))


def test_a_pdf_name_without_a_pdf_inside_says_what_it_holds(write) -> None:
    # pypdf's own words were "corrupt or unreadable PDF (Stream has ended unexpectedly)"
    message = input_error(write("paper.pdf", b"<!DOCTYPE html><html><body>404 Not Found</body></html>"))
    assert "not a PDF: no %PDF- header, it holds an HTML page" in message and "pipe it in" in message
    assert "it holds text" in input_error(write("notes.pdf", b"just some notes\n"))


def test_truncated_pdf_is_an_input_error_or_partial(write) -> None:
    data = make_text_pdf([["page one text"], ["page two text"]])
    path = write("cut.pdf", data[: len(data) // 2])
    try:
        doc = load_one(path)
    except InputError as e:
        assert "\n" not in str(e)
    else:
        assert doc.kind == "pdf"


def test_a_pdf_cut_short_says_so(write) -> None:
    """A download that stopped: pypdf's "Stream has ended unexpectedly" told the user
    nothing they could act on (probe 116)."""
    import io

    from pypdf import PdfWriter

    data = make_text_pdf([["page one text"], ["page two text"]])
    message = input_error(write("cut.pdf", data[:200]))  # before its page tree: nothing to read
    assert "seems cut short" in message and "no %%EOF" in message and "\n" not in message
    whole_but_broken = b"%PDF-1.4\n" + bytes(range(256)) * 4 + b"\n%%EOF\n"
    assert "cut short" not in input_error(write("broken.pdf", whole_but_broken))
    empty = io.BytesIO()
    PdfWriter().write(empty)
    message = input_error(write("empty.pdf", empty.getvalue()))
    assert "PDF with no pages" in message and "corrupt" not in message and "cut short" not in message
    assert "cut short" in input_error(write("empty-cut.pdf", empty.getvalue()[:-40]))


def test_a_pdf_cut_short_gives_the_pages_before_the_cut_and_names_the_rest(write) -> None:
    """A download that stopped at page 3 of 5 was refused whole: pypdf cannot open a file
    without its cross-reference table, though the first pages are all there."""
    import re

    data = make_text_pdf([[f"page {n} text about the harbor"] for n in ("one", "two", "three", "four", "five")])
    # ReportLab writes the page tree first and the pages' content streams last, in order
    streams = [m.start() for m in re.finditer(rb"\d+ 0 obj\s*<<\s*/Filter", data)]
    assert len(streams) == 5
    doc = load_one(write("cut.pdf", data[:streams[2] + 40]))  # inside page three's stream
    assert "page one text" in doc.text and "page two text" in doc.text and "three" not in doc.text
    assert len(doc.pages) == 5 and doc.pages[1].text == "page two text about the harbor"
    [note] = doc.left_out
    assert note.path.endswith("cut.pdf") and note.part
    assert note.reason.startswith("pages 3-5 of 5 not in the file: it stops short (")
    assert "no %%EOF at its end" in note.reason and "copy or download it again" in note.reason
    # cut after the last page's content, in the table that ends the file: all of it is there
    whole = load_one(write("cut-late.pdf", data[:len(data) - 60]))
    assert "page five text" in whole.text and whole.left_out == ()
    # cut before any page's content: no text at all, refused and said why
    message = input_error(write("cut-early.pdf", data[:streams[0] + 40]))
    assert "none of its 5 pages' text is in the file" in message and "seems cut short" in message


def _pypdf_copy(data: bytes, *, bookmarks: bool = False) -> bytes:
    """The pages as pypdf's writer lays them out: the page tree first, then each page's
    object, its content and (after the first page's content) the fonts."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for page in PdfReader(io.BytesIO(data)).pages:
        writer.add_page(page)
    if bookmarks:
        for number in range(len(writer.pages)):
            writer.add_outline_item(title=f"Part {number + 1}", page_number=number)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_pdf_cut_short_before_its_last_pages_objects_names_them(write) -> None:
    """pypdf's writer puts each page's object beside its content: cut before page 4's
    object, pypdf listed 3 pages, and pages 4-5 went unannounced (the file "had 3 pages")."""
    import re

    data = _pypdf_copy(make_text_pdf([[f"page {n} text about the harbor"] for n in ("one", "two", "three", "four", "five")]))
    page_objects = [m.start() for m in re.finditer(rb"\d+ 0 obj\s*<<\s*/Contents", data)]
    assert len(page_objects) == 5
    doc = load_one(write("cut.pdf", data[:page_objects[3] - 1]))
    assert len(doc.pages) == 5 and "page three text" in doc.text and "four" not in doc.text
    [note] = doc.left_out
    assert note.reason.startswith("pages 4-5 of 5 not in the file: it stops short (")


def test_a_pdf_cut_short_between_a_page_and_its_fonts_does_not_read_it_as_replacement_characters(write) -> None:
    """pypdf's writer puts the fonts after the first page's content: cut between them, the
    page read as a line of U+FFFD ("����") and was given to the model as its text."""
    import re

    data = _pypdf_copy(make_text_pdf([["page one text about the harbor"], ["page two text about the harbor"]]))
    fonts = re.search(rb"\d+ 0 obj\s*<<\s*/F1 ", data)  # the fonts of the page\'s /Resources
    assert fonts is not None
    message = input_error(write("cut.pdf", data[:fonts.start() - 1]))
    assert "none of its 2 pages' text is in the file" in message and "seems cut short" in message
    assert "\ufffd" not in message


def test_a_bookmarked_pdf_cut_short_keeps_pypdfs_log_off_stderr(write, capfd) -> None:
    """Its bookmarks are read after its pages: pypdf's "Object 32 0 not defined." reached
    the user's stderr, above the line that says what the file lacks."""
    import re

    data = _pypdf_copy(make_text_pdf([[f"page {n} text"] for n in range(1, 6)]), bookmarks=True)
    second = [m.start() for m in re.finditer(rb"\d+ 0 obj\s*<<\s*/Contents", data)][1]
    doc = load_one(write("cut.pdf", data[:second - 1]))
    assert "page 1 text" in doc.text and doc.left_out[0].reason.startswith("pages 2-5 of 5 not in the file")
    captured = capfd.readouterr()
    assert "not defined" not in captured.err + captured.out


def test_an_encrypted_pdf_cut_short_is_refused_as_cut_short(write) -> None:
    """Its key needs the trailer's /ID, at the end: read without it, every page failed and
    the refusal ("no page could be read") did not say the file was cut short."""
    data = encrypt_pdf(make_text_pdf([["page one text"], ["page two text"], ["page three text"]]), "")
    for cut in (len(data) - 40, len(data) * 9 // 10, len(data) // 2):
        message = input_error(write("cut.pdf", data[:cut]))
        assert "seems cut short" in message, (cut, message)


def test_a_pdf_about_pdfs_cut_inside_a_page_mentioning_endobj(write) -> None:
    """The text "endobj" inside a page's content, the cut after it: the object was taken as
    whole, and the page said "page could not be read (Detected loop with self reference
    ...)" on a line of its own beside the pages the file lacks."""
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pageCompression=0)
    for page in range(1, 5):
        for line in range(12):
            pdf.drawString(72, 780 - 16 * line, f"Page {page} line {line}: an object ends with the word endobj here.")
        pdf.showPage()
    pdf.save()
    data = buffer.getvalue()
    cut = [m.end() for m in __import__("re").finditer(rb"endobj here", data)][12 * 2 + 5]  # inside page 3's
    doc = load_one(write("cut.pdf", data[:cut]))
    [note] = doc.left_out
    assert note.reason.startswith("pages 3-4 of 4 not in the file"), note.reason
    assert "Page 2 line 11" in doc.text and "Page 3" not in doc.text


def test_a_pdf_cut_short_in_a_change_saved_to_it_later(write) -> None:
    """A page added and page 1 rewritten in an incremental update, the download stopped in
    its last bytes: pypdf found the first revision's %%EOF and read the file as it was
    before the change, with nothing said."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import DecodedStreamObject, NameObject

    base = make_text_pdf([["page one text about the harbor"], ["page two text about the harbor"]])
    writer = PdfWriter(io.BytesIO(base), incremental=True)
    writer.add_page(PdfReader(io.BytesIO(make_text_pdf([["an added page about the lighthouse"]]))).pages[0])
    revised = DecodedStreamObject()
    revised.set_data(b"BT /F1 12 Tf 72 700 Td (page one now revised about the pier) Tj ET")
    writer.pages[0][NameObject("/Contents")] = writer._add_object(revised)
    out = io.BytesIO()
    writer.write(out)
    data = out.getvalue()
    assert data.count(b"%%EOF") == 2
    doc = load_one(write("cut.pdf", data[:-30]))  # the update's objects all there, its table cut
    assert "page one now revised about the pier" in doc.text and "added page about the lighthouse" in doc.text
    assert "page one text" not in doc.text and len(doc.pages) == 3
    [note] = doc.left_out
    assert note.reason.startswith("it stops short in a change saved to it after it was first written")
    # the whole file: read as it is, nothing said
    whole = load_one(write("whole.pdf", data))
    assert "page one now revised" in whole.text and whole.left_out == ()


def test_a_pdf_cut_short_in_a_folder_is_skipped_as_cut_short(tmp_path) -> None:
    """A folder walk shows a refusal's reason alone: a PDF cut before its page tree was
    skipped as "corrupt or unreadable PDF (Stream has ended unexpectedly)", no word of the cut."""
    data = make_text_pdf([["page one text"], ["page two text"]])
    (tmp_path / "cut.pdf").write_bytes(data[:200])
    (tmp_path / "notes.md").write_text("the notes\n")
    corpus = load_corpus([str(tmp_path)])
    [skipped] = [s for s in corpus.skipped if s.path.endswith("cut.pdf")]
    assert "seems cut short (200 bytes, no %%EOF at its end)" in skipped.reason


def test_a_pdf_cut_short_before_a_pages_box_of_text_names_the_page_read_in_part(write) -> None:
    """pypdf's writer puts a page's form XObjects (a box of text drawn once, a letterhead)
    after its content: cut between them, the page was read without the box's words, and
    nothing said."""
    import re

    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    for page in (1, 2, 3):
        pdf.drawString(72, 780, f"Page {page} main text.")
        pdf.beginForm(f"box{page}")
        pdf.drawString(72, 300, f"Boxed note {page} says code {5000 + page}.")
        pdf.endForm()
        pdf.doForm(f"box{page}")
        pdf.showPage()
    pdf.save()
    data = _pypdf_copy(buffer.getvalue())
    forms = [m.start() for m in re.finditer(rb"\d+ 0 obj\s*<<\s*/BBox", data)]
    assert len(forms) == 3
    doc = load_one(write("cut.pdf", data[:forms[1] - 1]))  # page 2's content there, its box not
    assert "Boxed note 1" in doc.text and "Page 2 main text" in doc.text and "Boxed note 2" not in doc.text
    [note] = doc.left_out
    assert note.reason.startswith("p.3 of 3 not in the file, p.2 read in part (pictures or boxes of text"), note.reason


def test_pdf_form_values_and_comments_are_read(write) -> None:
    # pypdf's text leaves out what sits in annotations: a form's answers were dropped unannounced
    data = make_form_pdf("Application form.", {"applicant": "Margarethe Oyelaran-Smith", "berth": "B7"},
                         "Checked by the harbour office.")
    doc = load_one(write("form.pdf", data))
    assert doc.text.split("\n") == [
        "Application form.", "See the note.", "[form field applicant label: Margarethe Oyelaran-Smith]",
        "[form field berth label: B7]", "[comment: Checked by the harbour office.]",
    ]
    assert doc.pages[0].text == doc.text and doc.left_out == ()


def test_html_declared_charset(write) -> None:
    page = '<html><head><meta charset="shift_jis"></head><body><p>日本語のテキストです。これはテストです。</p></body></html>'
    doc = load_one(write("jp.html", page.encode("shift_jis")))
    assert doc.text == "日本語のテキストです。これはテストです。"
    # known as HTML by its content: piped in (`curl URL | ktcli ask - ...`) or with no extension
    page = '<!DOCTYPE html><html><head><meta charset="windows-1251"></head><body><p>Секретный код.</p></body></html>'
    assert load_stdin(None, io.BytesIO(page.encode("cp1251"))).text == "Секретный код."
    assert load_one(write("page", page.encode("cp1251"))).text == "Секретный код."


def test_html_declaring_latin1_is_read_as_browsers_read_it(write) -> None:
    """Declared iso-8859-1 with Windows-1252's quotes, dashes and euro sign (browsers read
    the label so): read literally, they were C1 control characters."""
    page = '<html><head><meta charset="iso-8859-1"></head><body><p>The \u201cbest\u201d price is 20\u20ac \u2014 caf\u00e9.</p></body></html>'
    data = page.encode("cp1252") + b"<!-- \x81 -->"  # and a byte Windows-1252 leaves unassigned
    assert load_one(write("shop.html", data)).text == "The \u201cbest\u201d price is 20\u20ac \u2014 caf\u00e9."


@pytest.mark.parametrize("start", ["<!-- saved from url=(0023)https://example.com/ -->\n",
                                   '<?xml version="1.0" encoding="utf-8"?>\n', "\ufeff", ""])
def test_html_known_by_its_content_past_a_prolog_or_comment(write, start) -> None:
    """Saved pages start with a comment, XHTML with an XML prolog, some with <head>: piped
    in or without an extension they were read as raw markup, scripts and all."""
    page = start + '<head><title>T</title><script>var leak = "SCRIPT";</script></head><body><p>Visible.</p></body>'
    assert "SCRIPT" not in load_stdin(None, io.BytesIO(page.encode())).text
    doc = load_one(write("saved", page.encode()))
    assert doc.kind == "html" and "Visible." in doc.text and "SCRIPT" not in doc.text


def test_nul_padding_in_a_log_is_left_out_and_said(write) -> None:
    """A log truncated in place while its writer kept its offset starts or goes on with
    thousands of NUL bytes: it was refused as binary."""
    line = b"2024-05-01 12:00:00 kernel: eth0 link up\n"
    corpus = load_corpus([str(write("nulpad.log", line * 100 + b"\x00" * 4096 + line * 1000))])
    (doc,) = corpus.documents
    assert doc.text.count("eth0 link up") == 1100 and "\x00" not in doc.text
    assert any("4,096 NUL bytes of padding left out" in s.reason for s in doc.left_out)
    assert load_corpus([str(write("head.log", b"\x00" * 8192 + line * 10))]).documents[0].text.count("link up") == 10


def test_archives_and_databases_with_nul_runs_stay_binary(write, tmp_path) -> None:
    """Their NUL runs are not padding: a tar was read as text once those were dropped."""
    import sqlite3
    import tarfile

    (tmp_path / "notes1.txt").write_text("some notes\n" * 20)
    with tarfile.open(tmp_path / "backup.tar", "w") as tar:
        tar.add(tmp_path / "notes1.txt", arcname="notes1.txt")
    db = sqlite3.connect(tmp_path / "app.db")
    db.execute("create table t (x text)")
    db.execute("insert into t values ('hello')")
    db.commit()
    db.close()
    for name in ("backup.tar", "app.db"):
        data = (tmp_path / name).read_bytes()
        message = input_error(write(name.replace(".", "-copy."), data))
        assert "binary" in message, message
        assert "binary" in input_error(write(name.split(".")[0], data))  # no extension either


def test_a_short_text_followed_by_binary_keeps_its_text(write) -> None:
    """Under 8 KB of text before binary data: the sniff of the first 8 KB said binary,
    where a longer text part was kept (the README's promise)."""
    import random

    text = b"".join(b"line %d of the service log, all fine\n" % i for i in range(60))  # ~2.3 KB
    rng = random.Random(0)
    noise = bytes(rng.randrange(256) for _ in range(6000))
    (doc,) = load_corpus([str(write("tail.log", text + noise))]).documents
    assert doc.text.startswith("line 0 of") and "line 59 of the service log" in doc.text
    assert any("binary data after byte" in s.reason for s in doc.left_out)


def test_pdf_needing_an_extra_package(write, monkeypatch: pytest.MonkeyPatch) -> None:
    """AES-encrypted PDFs need `cryptography`; without it the user is told so in one line."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError

    def missing(self, password):  # type: ignore[no-untyped-def]
        raise DependencyError("cryptography>=3.1 is required for AES algorithm")

    data = encrypt_pdf(make_text_pdf([["x"]]), user_password="")
    monkeypatch.setattr(PdfReader, "decrypt", missing)
    message = input_error(write("aes.pdf", data))
    assert "encrypted PDF" in message and "cryptography" in message


def test_fifo_as_given_by_process_substitution(tmp_path: Path) -> None:
    """`ktcli ask <(git diff) ...` names a FIFO: it is read like a file."""
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as handle:
            handle.write(b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    doc = load_corpus([str(fifo)]).documents[0]
    writer.join(timeout=5)
    assert (doc.kind, doc.language) == ("code", "diff")


@pytest.mark.parametrize(("text", "encoding", "named"), [
    ("Подключение к базе данных выполняется при старте сервиса.\n", "cp1251", "Windows-1251"),
    ("Подключение к базе данных выполняется при старте сервиса.\n", "koi8-r", "KOI8-R"),
    ("Zażółć gęślą jaźń. Połączenie z bazą danych jest nawiązywane.\n", "cp1250", "Windows-1250"),
    ("Η σύνδεση με τη βάση δεδομένων γίνεται κατά την εκκίνηση της υπηρεσίας.\n", "cp1253", "Windows-1253"),
    ("日本語のテキストです。これはテストです。\n", "shift_jis", "Shift-JIS"),
    ("数据库连接在服务启动时建立。如果连接丢失，服务会在五秒后重试。\n", "gbk", "GB18030"),
    # prose with its usual punctuation between letters (it was counted as mojibake: the
    # Japanese read as UTF-16, the Chinese refused)
    ("彼は「明日、行きます」と言った。しかし、彼は来なかった。なぜだろう？\n", "shift_jis", "Shift-JIS"),
    ("这是一个测试文件。北京是中国的首都，人口超过两千万。上海是最大的城市。\n", "gbk", "GB18030"),
    # combining marks inside words (Thai vowels and tones, Hebrew points, Arabic vowels)
    # were counted as mojibake: all three refused as undecodable
    ("ในปี 2566 บริษัทมีรายได้รวม 23.4 ล้านบาท เพิ่มขึ้นจากปีก่อนร้อยละ 12 ค่าจอดเรือต่อคืนคือ 450 บาท\n" * 3,
     "cp874", "Windows-874 (Thai)"),
    ("בְּרֵאשִׁית בָּרָא אֱלֹהִים אֵת הַשָּׁמַיִם וְאֵת הָאָרֶץ. דמי העגינה הם 12 אירו ללילה.\n" * 3, "cp1255", "Windows-1255"),
    ("مَرْحَبًا بِالعَالَمِ، هذه وثيقة عن رسوم الرسو في الميناء: 12 يورو لليلة.\n" * 3, "cp1256", "Windows-1256"),
])
def test_legacy_encodings_of_other_scripts_are_detected(write, text, encoding, named) -> None:
    """Russian in cp1251 came out as "Ïîäêëþ÷åíèå" (read as cp1252, only said to be a
    guess), Japanese in Shift-JIS was refused as undecodable."""
    corpus = load_corpus([str(write("legacy.txt", text.encode(encoding)))])
    assert corpus.documents[0].text == text
    (note,) = corpus.skipped
    assert f"read as {named}" in note.reason and "guess" in note.reason and note.replaced


@pytest.mark.parametrize("text", [
    "Die Größe der Datei wird geprüft. Zürich, München, Größenänderungsübersicht.\n",
    "Le café est très chaud, et l’été dernier était brûlant. Noël, œuvre, « guillemets ».\n",
    "¿Qué tal? ¡Muy bien! As ações não são válidas. Þjóðhátíð, Ærøskøbing.\n",
    "x = 5  # © 2020 Müller — 10 × 20 ± 3 °C, ½ cup\n",
])
def test_western_text_stays_cp1252(write, text) -> None:
    """The detector reads short Western text as other code pages (French as cp1250,
    "Größe: 12 kB" as cp1006): text that reads well as cp1252 never goes to it."""
    corpus = load_corpus([str(write("west.txt", text.encode("cp1252")))])
    assert corpus.documents[0].text == text
    assert "Windows-1252 (Western European)" in corpus.skipped[0].reason


def test_terminal_colour_codes_in_a_log_are_left_out(write) -> None:
    """"\x1b[32mOK" was indexed as the word "32mok"."""
    data = b"\x1b[1m\x1b[32mOK\x1b[0m test_a passed\n\x1b]0;title\x07\x1b[31mFAIL\x1b[0m test_b\n"
    doc = load_one(write("ci.log", data))
    assert doc.text == "OK test_a passed\nFAIL test_b\n"


def test_overstruck_man_page_text_reads_as_printed(write) -> None:
    """nroff's bold ("N\bNA\bAM\bME\bE") and underline ("_\bf"): with the backspaces alone
    dropped, a man page read "NNAAMMEE" and was said to have 229 control characters."""
    bold = "".join(f"{c}\b{c}" for c in "NAME")
    underline = "".join(f"_\b{c}" for c in "file")
    doc = load_one(write("man.txt", f"{bold}\n     man - read {underline} pages\n     +\bo a bullet\n".encode()))
    assert doc.text == "NAME\n     man - read file pages\n     o a bullet\n" and doc.left_out == ()
    # a run of backspaces backs over as many characters (a progress count in a log)
    doc = load_one(write("fetch.log", b"fetching 5%\b\b10%\b\b\b50%\b\b\b100% done\nab\b\bX\n"))
    assert doc.text == "fetching 100% done\nXb\n" and doc.left_out == ()
    # an underline struck after its character (man-db's manual.txt.gz) underlines it
    boxed = "".join(f"{c}\b_" for c in "|box|")
    doc = load_one(write("manual.txt", f"typed in a {boxed}, eg. _\bx\bx\b_ ab\b\b__\n".encode()))
    assert doc.text == "typed in a |box|, eg. x ab\n" and doc.left_out == ()


def test_control_characters_after_a_text_head_are_left_out_and_said() -> None:
    """Binary bytes after a text head were read into the text, unsaid."""
    from ktcli.ingest.loaders import document_from_bytes

    data = b"This is the readable head of the file. It has a fact: the code is 4417.\n" * 30
    doc = document_from_bytes(data + b"\x00\x01\x02binary tail" * 100, "weird.txt", "weird.txt")
    assert "\x01" not in doc.text and "\x00" not in doc.text and "the code is 4417" in doc.text
    assert [s.reason for s in doc.left_out] == ["300 control characters left out"]
    assert document_from_bytes(b"a\tb\x0cc\n", "ok.txt", "ok.txt").left_out == ()  # tab, form feed: text


def test_html_tags_html_parser_leaves_open_still_end_their_rows(write) -> None:
    # HTML closes <td>, <tr>, <li>, <dt>, <dd> by itself; html.parser nests the next one
    # inside instead, which joined whole tables and lists into one line.
    page = ("<table>\n<tr><td>a<td>b\n<tr><td>c<td>d\n</table>\n<ol><li>x<li>y<li>z</ol>\n"
            "<dl>\n<dt>Alpha\n<dd>First.\n<dt>Beta\n<dd>Second.\n</dl>\n<h5>Notes</h3>\n<p>One.</p>\n<p>Two.</p>\n"
            "<p>Start <span hidden title=don't>x</span>\ntail one</p>\n<table>\n<tr><td>\n</td>\n<td>\nWords</td></tr></table>")
    doc = load_one(write("old.html", page))
    lines = [(t, n) for t, n in zip(doc.text.split("\n"), doc.source_lines) if t]
    assert lines == [("a | b", 2), ("c | d", 3), ("1. x", 5), ("2. y", 5), ("3. z", 5), ("Alpha", 7), ("First.", 8),
                     ("Beta", 9), ("Second.", 10), ("##### Notes", 12), ("One.", 13), ("Two.", 14), ("Start", 15),
                     ("tail one", 16),  # an apostrophe in an unquoted value opens no quote
                     ("| Words", 21)]  # cited where its words are, not at the empty cell before them


PANDOC_FRAGMENT = """<h1 id="harbour-rules">Harbour rules</h1>
<p>Boats moor at the <em>north</em> quay between May and September;
the winter berths are on <a href="#south">the south quay</a>.</p>
<ul>
<li>Berth fee: 12 EUR a night</li>
<li>Showers: <code>B2</code></li>
</ul>
<script>var tracker = "SCRIPT";</script>
"""

README_WITH_HTML = """<p align="center">
  <img src="logo.png" alt="shelf logo" width="120">
</p>
<h1 align="center">shelf</h1>

A small library for shelving books.

## Install

```
pip install shelf
```

- fast
- [docs](https://example.com/docs)
"""


def test_html_fragments_piped_in_are_read_as_html() -> None:
    """pandoc's default output, an API's snippet: no <html> or <body>, piped in, they were
    read as raw markup (tags, attributes and scripts went to the model)."""
    doc = load_stdin(None, io.BytesIO(PANDOC_FRAGMENT.encode()))
    assert doc.kind == "html" and "SCRIPT" not in doc.text and "<em>" not in doc.text
    assert "Boats moor at the north quay" in doc.text and "Berth fee: 12 EUR a night" in doc.text
    # each line still maps back to the line piped in
    line = next(i for i, t in enumerate(doc.text.split("\n")) if "Berth fee" in t)
    assert doc.source_lines[line] == 5
    # a page quoting template code in <pre><code> is still a page
    quoting = '<h1>Templates</h1>\n<p>Write the name so:</p>\n<pre><code>name: {{ .Values.name }}</code></pre>\n<p>Done.</p>\n'
    doc = load_stdin(None, io.BytesIO(quoting.encode()))
    assert doc.kind == "html" and "{{ .Values.name }}" in doc.text


TEMPLATES = [
    '<div class="user">\n<?php if ($user->isAdmin()) { deleteAll($db); } ?>\n<p>Welcome <?= htmlspecialchars($name) ?></p>\n</div>\n<p>Footer</p>\n',
    '<ul>\n{% for item in items %}\n<li><a href="{{ item.url }}">{{ item.name }}</a></li>\n{% endfor %}\n</ul>\n<p>end</p>\n',
    '<div v-if="ready">\n<p :title="name">Hello</p>\n</div>\n<p>Footer</p>\n',
    '<div *ngFor="let x of xs">\n<p (click)="pick(x)">{{x}}</p>\n</div>\n<p>Footer</p>\n',
]


@pytest.mark.parametrize("text", [README_WITH_HTML, "<b>Note:</b> the berth fee is 12 EUR.\n\nPay at the office.\n", *TEMPLATES,
                                  "<div>one</div>\n", "<p>a</p>\n\nplain paragraph one\n\nplain paragraph two\n"])
def test_markdown_and_text_that_open_with_a_tag_stay_as_they_are(text) -> None:
    doc = load_stdin(None, io.BytesIO(text.encode()))
    assert doc.kind == "stdin" and doc.text.strip() == text.strip()


def test_a_page_of_drawn_shapes_and_no_text_is_reported(write) -> None:
    """Text exported as outlines (`gs -dNoOutputFonts`, "text to curves") read as a blank
    page: its fact vanished without a word, where a scanned page in its place is reported."""
    from tests.ingest.fixtures import make_pdf_with_a_drawn_page

    path = write("outlined.pdf", make_pdf_with_a_drawn_page("Alpha page one", "Gamma page three"))
    corpus = load_corpus([str(path)])
    (skipped,) = corpus.skipped
    assert skipped.path == f"{path} p.2" and skipped.reason.startswith("no text layer, only drawn shapes")
    # a page with a rule and no text is blank, not news
    ruled = write("ruled.pdf", make_pdf_with_a_drawn_page("Alpha page one", "Gamma page three", shapes=0))
    assert not load_corpus([str(ruled)]).skipped


def test_files_attached_to_a_pdf_are_reported(write) -> None:
    """A cover page saying "see the attached files": the attachments were passed over unsaid."""
    from tests.ingest.fixtures import with_attachments

    data = with_attachments(make_text_pdf([["See the attached files."]]), {"budget.txt": b"2.4 million", "audit.pdf": b"x"})
    path = write("attach.pdf", data)
    corpus = load_corpus([str(path)])
    (skipped,) = corpus.skipped
    assert skipped.path == str(path) and skipped.reason.startswith("2 attached files not read: audit.pdf, budget.txt")


def test_a_radio_groups_value_is_read_once(write) -> None:
    """Each button of a radio group carries the group's value: it was listed per button."""
    import io

    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    pdf.drawString(72, 800, "Season of the mooring.")
    for i, season in enumerate(("summer", "winter")):
        pdf.acroForm.radio(name="season", tooltip="Season", value=season, selected=season == "winter",
                           x=72 + 40 * i, y=760, size=16)
    pdf.showPage()
    pdf.save()
    doc = load_one(write("radio.pdf", buffer.getvalue()))
    assert doc.text.split("\n").count("[form field Season: winter]") == 1


def test_a_pdfs_bookmarks_are_its_pages_section_trails(write) -> None:
    """A PDF's headings are not told apart from its text, but its bookmarks name its
    chapters: a citation of p.217 said nothing of where in the book it was."""
    import io

    from pypdf import PdfWriter

    from ktcli.ingest.chunking import chunk_document

    pages = [["Preface text."], ["Tides rise twice a day."], ["Neap tides are small."], ["Ropes and knots."]]
    writer = PdfWriter(clone_from=io.BytesIO(make_text_pdf(pages)))
    part = writer.add_outline_item(title="Part I: The Sea", page_number=1)
    writer.add_outline_item(title="Tides", page_number=1, parent=part)
    writer.add_outline_item(title="Part II: The Boat", page_number=3)
    out = io.BytesIO()
    writer.write(out)
    doc = load_one(write("book.pdf", out.getvalue()))
    assert [p.section for p in doc.pages] == ["", "Part I: The Sea > Tides", "Part I: The Sea > Tides",
                                               "Part II: The Boat"]
    chunks = chunk_document(doc)
    assert [(c.span.page, c.section) for c in chunks] == [(1, ""), (2, "Part I: The Sea > Tides"),
                                                          (3, "Part I: The Sea > Tides"), (4, "Part II: The Boat")]
    # a child that starts before its parent is still under it
    writer = PdfWriter(clone_from=io.BytesIO(make_text_pdf(pages)))
    writer.add_outline_item(title="Part I", page_number=0)
    part2 = writer.add_outline_item(title="Part II", page_number=3)
    writer.add_outline_item(title="Intro to II", page_number=2, parent=part2)
    out2 = io.BytesIO()
    writer.write(out2)
    assert [p.section for p in load_one(write("book2.pdf", out2.getvalue())).pages] == [
        "Part I", "Part I", "Part II > Intro to II", "Part II"]
    # and a citation of a page read whole names them
    from ktcli.pipeline.citations import with_sections
    from ktcli.types import Answer, Citation, Corpus, Span

    answer = Answer("Neap tides are small [1].", (Citation("book.pdf p.3", Span(doc.path, page=3), label=1),), None)
    assert with_sections(answer, Corpus((doc,), ())).citations[0].section == "Part I: The Sea > Tides"


def test_a_source_past_what_memory_can_read_is_refused_in_pieces() -> None:
    """stdin was read whole at once: `ktcli plan - q < /dev/zero` took 24 GB, deaf to
    Ctrl-C, until the kernel killed it."""
    from ktcli.ingest.loaders import read_bounded, read_limit_bytes

    class Endless(io.RawIOBase):
        reads = 0

        def read(self, n: int = -1) -> bytes:
            assert 0 < n <= 8 << 20  # in pieces, never "all of it"
            self.reads += 1
            return b"x" * n

    stream = Endless()
    with pytest.raises(RejectedInput, match="over 32 MiB, more than this machine's free memory can read"):
        read_bounded(stream, "<stdin>", limit=32 << 20)
    assert stream.reads == 5
    assert read_bounded(io.BytesIO(b"abc" * 10), "<stdin>", limit=30) == b"abc" * 10
    assert read_limit_bytes() >= 256 << 20


def test_a_binary_file_is_named_by_its_format_and_a_file_of_nuls_as_such(write) -> None:
    """A zip renamed .txt was "binary; not text"; a file of NUL bytes "holds only
    whitespace". (A gzip renamed .txt is read: `test_a_file_compressed_whole_is_read_as_what_it_holds`.)"""
    import zipfile

    message = input_error(write("z.txt", b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 4))
    assert "binary: zstd-compressed data" in message and "zstd -dc " in message
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes.txt", "hello " * 100)
    assert "binary: a zip archive" in input_error(write("notes.txt", buffer.getvalue()))
    assert "it holds only NUL bytes" in input_error(write("nul.txt", b"\x00" * 4096))
    assert "it holds only whitespace" in input_error(write("blank.txt", b" \n\t\n"))


@pytest.mark.parametrize(("mode", "what"), [("w:gz", "a gzip-compressed tar archive"),
                                            ("w:bz2", "a bzip2-compressed tar archive"),
                                            ("w:xz", "an xz-compressed tar archive")])
def test_a_compressed_tar_is_told_to_be_unpacked_and_hints_name_the_file(write, mode, what) -> None:
    """A .tgz was told `gunzip -c FILE | ktcli ask -`, which met the tar refusal next; and
    every hint said FILE where the user's file has a name."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        data = b"The keeper is Ada Quill.\n" * 50
        member = tarfile.TarInfo("notes.txt")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    path = write("my notes.tgz", buffer.getvalue())
    message = input_error(path)
    assert f"binary: {what}; unpack it and give the folder: `mkdir unpacked && tar xf '{path}' -C unpacked`" \
        in message, message
    assert "tar xf FILE" in str(_stdin_refusal(buffer.getvalue()))  # stdin has no name to give


def test_a_file_compressed_whole_is_read_as_what_it_holds(write, tmp_path) -> None:
    """A rotated log, a package's NEWS.md.gz, a report.pdf.gz were refused ("decompress it
    first"), and skipped in a folder walk: a docs folder's summary left out its README."""
    import bz2
    import gzip
    import lzma

    text = b"# News\n\nThe keeper is Ada Quill.\n\n## Older\n\nThe lamp was lit in 1902.\n"
    for name, packed in (("NEWS.md.gz", gzip.compress(text)), ("NEWS.md.bz2", bz2.compress(text)),
                         ("NEWS.md.xz", lzma.compress(text)), ("rotated.gz", gzip.compress(text[:30]) + gzip.compress(text[30:]))):
        doc = load_one(write(name, packed))
        assert doc.text.startswith("# News") and "lit in 1902" in doc.text and doc.path.endswith(name), name
    assert load_one(write("NEWS.md.gz", gzip.compress(text))).kind == "markdown"  # by the name inside
    pdf = load_one(write("report.pdf.gz", gzip.compress(make_text_pdf([["page one text"], ["page two text"]]))))
    assert pdf.kind == "pdf" and len(pdf.pages) == 2
    piped = load_stdin(None, io.BytesIO(gzip.compress(text)))
    assert "Ada Quill" in piped.text
    # cut short, nested, a tar or PostScript inside: one line each
    message = input_error(write("manual.ps.gz", gzip.compress(b"%!PS-Adobe-3.0\n%%Pages: 3\n(Intro) show\n")))
    assert "PostScript" in message and "manual.ps.gz | ps2pdf - manual.pdf`" in message  # ps2pdf reads no gzip
    assert "manual.ps` and give the PDF" in input_error(write("manual.ps", b"%!PS-Adobe-3.0\n(Intro) show\n"))
    assert "damaged gzip-compressed data" in input_error(write("cut.gz", gzip.compress(text * 50)[:60]))
    # compress's own .Z (LZW) and lz4 are not read, and say how to be
    assert "compress'd (.Z) data; decompress it first: `zcat " in input_error(write("old.Z", b"\x1f\x9d\x90hi\x01\x02"))
    assert "`lz4 -dc " in input_error(write("a.txt.lz4", b"\x04\x22\x4d\x18\x64\x40\xa7\x05\x00"))
    assert "holds binary data (gzip-compressed): gzip-compressed data" in input_error(
        write("twice.gz", gzip.compress(gzip.compress(text))))
    # a folder reads them, its binaries and archives still skipped, its text weighed as unpacked
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "README.md.gz").write_bytes(gzip.compress(text))
    (folder / "logo.png.gz").write_bytes(gzip.compress(b"\x89PNG\r\n\x1a\n" + bytes(200)))
    (folder / "big.log.gz").write_bytes(gzip.compress(b"x" * 4096))
    corpus = load_corpus([str(folder)], max_file_bytes=1024)
    assert [d.path.rsplit("/", 1)[-1] for d in corpus.documents] == ["README.md.gz"]
    skipped = {s.path.rsplit("/", 1)[-1]: s.reason for s in corpus.skipped}
    # a PDF inside is weighed as a PDF is: by its text, its bytes up to 25 times the limit
    (folder / "report.pdf.gz").write_bytes(gzip.compress(make_text_pdf([["page one text"]]) + b"%" * 4096))
    assert [d.path.rsplit("/", 1)[-1] for d in load_corpus([str(folder)], max_file_bytes=1024).documents] == [
        "README.md.gz", "report.pdf.gz"]
    assert skipped["logo.png.gz"] == "binary" and skipped["big.log.gz"] == (
        "too large (gzip-compressed, over 1.0 KB decompressed; --max-file-bytes raises it, or name the file)")


def test_a_legacy_lzma_file_is_read_as_an_xz_one_is(write, tmp_path) -> None:
    """`.lzma` (LZMA-alone, `xz --format=lzma`) has no magic, and was refused as binary."""
    import lzma
    import tarfile

    text = b"# News\n\nThe keeper is Ada Quill.\n"
    doc = load_one(write("NEWS.md.lzma", lzma.compress(text, format=lzma.FORMAT_ALONE)))
    assert doc.kind == "markdown" and doc.text == text.decode()
    piped = load_stdin(None, io.BytesIO(lzma.compress(text, format=lzma.FORMAT_ALONE)))
    assert "Ada Quill" in piped.text
    assert "damaged lzma-compressed data" in input_error(write("cut.lzma", lzma.compress(text * 50, format=lzma.FORMAT_ALONE)[:40]))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("a.txt")
        member.size = 3
        archive.addfile(member, io.BytesIO(b"hi\n"))
    message = input_error(write("site.tar.lzma", lzma.compress(buffer.getvalue(), format=lzma.FORMAT_ALONE)))
    assert "binary: an lzma-compressed tar archive; unpack it" in message
    # a folder reads one as it reads a .xz
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "README.md.lzma").write_bytes(lzma.compress(text, format=lzma.FORMAT_ALONE))
    assert [d.text for d in load_corpus([str(folder)]).documents] == [text.decode()]


def test_binary_data_inside_a_compressed_file_says_it_was_inside(write, tmp_path) -> None:
    """`head -c 5000 /bin/ls | gzip > x.gz` was "binary: an executable (ELF)", as if x.gz
    itself were one: the line says the binary is what the compression held."""
    import bz2
    import gzip

    elf = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 8
    message = input_error(write("x.gz", gzip.compress(elf)))
    assert message.startswith(f"{tmp_path / 'x.gz'}: holds binary data (gzip-compressed): an executable (ELF); ")
    noise = bytes(range(256)) * 16
    assert "noise.bz2: holds binary data (bzip2-compressed); not text" in input_error(write("noise.bz2", bz2.compress(noise)))
    # UTF-16 without a byte-order mark, compressed: the command that converts it unpacks it first
    utf16 = "\n".join("Строка номер %d текста" % i for i in range(40)).encode("utf-16-le")
    message = input_error(write("notes.txt.gz", gzip.compress(utf16)))
    assert "holds binary data (gzip-compressed; or UTF-16LE text without a byte-order mark?)" in message
    assert "notes.txt.gz | iconv -f UTF-16LE -t UTF-8 > converted.txt`" in message and "gunzip -c " in message
    # in a folder, the skipped entry says so too
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "core.gz").write_bytes(gzip.compress(elf))
    (folder / "notes.txt").write_bytes(b"a note\n")
    corpus = load_corpus([str(folder)])
    assert [s.reason for s in corpus.skipped] == ["holds binary data (gzip-compressed): an executable (ELF)"]


def _stdin_refusal(data: bytes) -> InputError:
    with pytest.raises(InputError) as info:
        load_stdin(None, io.BytesIO(data))
    return info.value


@pytest.mark.parametrize("first", ["", '<meta charset="iso-8859-2">\n'])
def test_a_fragment_piped_in_is_read_in_the_charset_it_declares(first) -> None:
    """A fragment without <html>, <head> or <body> declaring iso-8859-2 was read as a
    Windows-1250 guess ("gę¶l± jaĽń"), and one opening with its <meta> as raw markup."""
    polish = "Zażółć gęślą jaźń. Łódź jest pięknym miastem."
    later = "" if first else '<meta charset="iso-8859-2">\n'
    fragment = f"{first}<p>{polish}</p>\n{later}<p>{polish}</p>\n"
    doc = load_stdin(None, io.BytesIO(fragment.encode("iso-8859-2")))
    assert doc.kind == "html" and doc.text.split("\n")[0] == polish and doc.left_out == ()


def test_a_bzip2_tar_is_known_past_its_first_block(write) -> None:
    """bzip2 gives nothing before its first block (up to 900 KB) is read whole: a 2 MB
    .tar.bz2 of random bytes was still told to `bunzip2 -c` (found by review)."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:bz2") as archive:
        data = os.urandom(1_500_000)
        member = tarfile.TarInfo("noise.bin")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    assert len(buffer.getvalue()) > 1_000_000
    assert "binary: a bzip2-compressed tar archive" in input_error(write("noise.tbz", buffer.getvalue()))


def test_a_blank_pdf_is_not_told_to_run_ocr(write) -> None:
    """Three empty pages were "a scanned or image-only PDF?; run OCR first": nothing to OCR."""
    import io

    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(3):
        writer.add_blank_page(595, 842)
    data = io.BytesIO()
    writer.write(data)
    with pytest.raises(InputError, match=r"blank PDF: nothing on its 3 pages \(no text, no pictures\)$"):
        load_corpus([str(write("blank.pdf", data.getvalue()))])
    # a drawing on any page, however far in, is no blank PDF (review: only 50 were looked at)
    from tests.ingest.fixtures import make_image_only_pdf

    from pypdf import PdfReader

    for _ in range(60):
        writer.add_blank_page(595, 842)
    writer.add_page(PdfReader(io.BytesIO(make_image_only_pdf(1))).pages[0])
    data = io.BytesIO()
    writer.write(data)
    with pytest.raises(InputError, match=r"no text layer on any of its 64 pages"):
        load_corpus([str(write("late.pdf", data.getvalue()))])


def test_a_word_hyphenated_across_a_page_break_is_joined(write) -> None:
    """"contami-" at the foot of a page and "nation" at the top of the next were quoted as
    "contami-\\nnation": a word broken within a page was joined, across pages not."""
    from tests.ingest.fixtures import make_text_pdf

    pdf = make_text_pdf([["The dose was changed after the contami-"], ["nation incident in March.", "Set at 250 mg."]])
    (doc,) = load_corpus([str(write("dose.pdf", pdf))]).documents
    assert [page.text for page in doc.pages] == ["The dose was changed after the contamination",
                                                 "incident in March.\nSet at 250 mg."]


def test_a_table_in_one_column_of_a_two_column_page_is_rejoined() -> None:
    """Found by a probe: a table in the right column of a two-column page came out a cell
    a line (the layout's rows had the left column's prose for a first cell, so none
    matched), and the answer took a footnote's "1" for the mill's output."""
    from ktcli.ingest.pdftext import _rejoin_rows

    left = ["The northern district discussed the", "library hours for the second time.",
            "The annual fair reviewed the library", "hours at the usual meeting. The",
            "committee mapped the school timetable", "with mixed feelings and no debate."]
    right = ["Mill output table", "Mill            Output (tons)   Year", "Zantaro Mills   48,210          2019",
             "Pellico Works   12,004          2020", "Ushan Forge     7,733           2021",
             "The survey of the piers found rust."]
    layout = "\n".join(f" {a:<44}{' ' * 10}{b}" for a, b in zip(left, right))
    cells = ["Mill output table", "Mill", "Output (tons)", "Year", "Zantaro Mills", "48,210", "2019",
             "Pellico Works", "12,004", "2020", "Ushan Forge", "7,733", "2021", "The survey of the piers found rust."]
    plain = "\n".join(left + cells)
    assert _rejoin_rows(plain, layout).split("\n") == left + [
        "Mill output table", "Mill | Output (tons) | Year", "Zantaro Mills | 48,210 | 2019",
        "Pellico Works | 12,004 | 2020", "Ushan Forge | 7,733 | 2021", "The survey of the piers found rust."]
    # prose in two columns with no table is left as it was
    prose = "\n".join(left + left)
    assert _rejoin_rows(prose, "\n".join(f" {a:<44}{' ' * 10}{a}" for a in left)) == prose


def test_a_page_wide_note_under_two_columns_is_not_cut_at_the_gap() -> None:
    """Found by a probe: a note under both columns that ends just past the gap was cut in
    its last word, "volume 12." read "volume 1" (and "2." went with the page numbers)."""
    from ktcli.ingest.pdf_columns import reread

    left, right = COLUMN_PROSE
    width = max(map(len, left)) + 6
    note = "* Figures: canal archive, volume 12."
    note = note[:2] + "x" * (width - 2 - len(note)) + note[2:]  # it ends 2 past the left column's widest line
    assert len(note) == width - 2
    layout = [f"{a:<{width}}{b}" for a, b in zip(left, right)] + [note]
    plain = [p for pair in zip(left, right) for p in pair] + [note]  # drawn across
    assert reread("\n".join(plain), "\n".join(layout)).split("\n") == left + [note] + right


def test_markdown_comments_are_left_out_where_code_fences_do_not_hold_them(tmp_path):
    """A rendered page shows no `<!-- ... -->`: a README's "<!-- TODO: prices from $9 -->"
    was read as its text (probe 98). Lines keep their numbers; a comment inside a code
    block is code, and kept."""
    path = tmp_path / "prices.md"
    path.write_text("# Prices\n<!-- TODO: prices\nfrom $9 -->\nThe basic plan costs $25. <!-- x -->\n"
                    "```html\n<!-- an example -->\n```\n")
    corpus = load_corpus([str(path)])
    doc = corpus.documents[0]
    assert "$9" not in doc.text and "TODO" not in doc.text and "<!-- an example -->" in doc.text
    assert doc.text.split("\n")[3] == "The basic plan costs $25. "  # line 4 where it was
    assert any("2 HTML comments left out" in s.reason for s in doc.left_out)


def test_markdown_comment_markers_in_inline_code_are_code(tmp_path):
    """Probe 126: "start a comment with `<!--`" and, sections later, "end it with `-->`"
    read as one comment: the Pricing section between was left out, said as "1 HTML comment".
    A code span is code, as CommonMark reads it; a real comment beside one still goes."""
    path = tmp_path / "comments.md"
    path.write_text("# Docs\n\nStart a comment with `<!--` in the source.\n\n## Pricing\n\n"
                    "The pro plan costs 40 dollars. <!-- TODO: raise to 45 -->\n\n"
                    "End it with ``-->`` to hide it.\n")
    doc = load_corpus([str(path)]).documents[0]
    assert "The pro plan costs 40 dollars." in doc.text and "## Pricing" in doc.text
    assert "`<!--`" in doc.text and "``-->``" in doc.text and "TODO" not in doc.text
    assert doc.text.count("\n") == path.read_text().count("\n")
    assert [s.reason for s in doc.left_out] == ["1 HTML comment left out (a rendered page shows none)"]


def test_markdown_comment_markers_in_indented_code_are_code(tmp_path):
    """Probe 126: an indented code block's `<!-- begin widget` ran as a comment to a later
    block's `end widget -->`, and the prose between went. A comment whose lines are indented
    after a blank line is still one comment."""
    path = tmp_path / "widget.md"
    path.write_text("# Embed\n\nPaste this:\n\n    <!-- begin widget\n    <div id=w></div>\n\n"
                    "The widget costs 5 dollars.\n\n## Remove\n\n    end widget -->\n\n"
                    "<!--\n\n    an indented note\n\n-->\nDone.\n")
    doc = load_corpus([str(path)]).documents[0]
    assert "The widget costs 5 dollars." in doc.text and "    <!-- begin widget" in doc.text
    assert "    end widget -->" in doc.text and "an indented note" not in doc.text and "Done." in doc.text
    assert doc.text.count("\n") == path.read_text().count("\n")
    assert [s.reason for s in doc.left_out] == ["1 HTML comment left out (a rendered page shows none)"]


def test_html_wiki_edit_links_are_left_out(write) -> None:
    """Probe 108: a saved Wikipedia page's headings read "## History[edit]", and so did the
    section trails of its citations; MediaWiki's newer layout puts the link after the <h2>."""
    edit = ('<span class="mw-editsection"><span class="mw-editsection-bracket">[</span>'
            '<a href="/w/index.php?action=edit&amp;section=1">edit</a><span class="mw-editsection-bracket">]</span></span>')
    page = (f'<h2><span class="mw-headline" id="History">History</span>{edit}</h2><p>Dammed in 1921.</p>'
            f'<div class="mw-heading mw-heading2"><h2 id="Ecology">Ecology</h2>{edit}</div><p>Trout.</p>')
    lines = [line for line in load_one(write("lake.html", page)).text.split("\n") if line]
    assert lines == ["## History", "Dammed in 1921.", "## Ecology", "Trout."]


def test_html_a_layout_table_is_read_as_the_blocks_it_holds(write) -> None:
    """Probe 108: a page laid out in a table (a sidebar cell beside the article's, an HTML
    mail's frame) read as one row: the whole article one line of 5,000 characters, its
    headings no section trail, every citation "page.html:3 (chars ...)"."""
    page = "\n".join([
        "<html><body><table width='100%'><tr>",
        "<td class='sidebar'><a href='a.html'>Home</a><br><a href='b.html'>Archive</a></td>",
        "<td>",
        "<h1>Harbour bulletin</h1>",
        "<p>Week 1: 7 arrivals.</p>",
        "<h2>Tides</h2>",
        "<p>High tide on Friday is at 06:42.</p>",
        "<table><tr><th>Day</th><th>Tide</th></tr><tr><td>Fri</td><td>06:42</td></tr></table>",
        "</td></tr></table></body></html>",
    ])
    doc = load_one(write("bulletin.html", page))
    lines = [line for line in doc.text.split("\n") if line]
    assert lines == ["Home", "Archive", "# Harbour bulletin", "Week 1: 7 arrivals.", "## Tides",
                     "High tide on Friday is at 06:42.", "Day | Tide", "Fri | 06:42"]
    got = dict(zip(doc.text.split("\n"), doc.source_lines))
    assert got["## Tides"] == 6 and got["High tide on Friday is at 06:42."] == 7
    # a mail's frame says it is one (role="presentation"); a data table stays rows
    mail = ("<table role='presentation'><tr><td><p>Hi Ann,</p><p>The invoice is attached.</p></td>"
            "<td><p>Sent from Kestrel Mail</p></td></tr></table>"
            "<table><tr><td><p>Monstera</p></td><td><p>13</p><p>(indoors)</p></td></tr></table>")
    assert [line for line in load_one(write("mail.html", mail)).text.split("\n") if line] == [
        "Hi Ann,", "The invoice is attached.", "Sent from Kestrel Mail", "Monstera | 13 (indoors)"]


def test_a_compressed_empty_file_is_empty_not_damaged(write) -> None:
    """`gzip < /dev/null` (a rotated log that stayed empty) was refused as damaged data "cut
    short", and a member of nothing after a log's own made the whole log unread."""
    import gzip

    assert "empty file" in input_error(write("syslog.4.gz", gzip.compress(b"")))
    both = gzip.compress(b"Nov 2 host sshd: Failed password for bob\n") + gzip.compress(b"")
    assert load_one(write("syslog.2.gz", both)).text == "Nov 2 host sshd: Failed password for bob\n"


@pytest.mark.parametrize("compression", ["gzip", "bzip2", "xz"])
def test_members_past_many_pieces_are_all_read(compression) -> None:
    """The input is handed over in slices (given whole, zlib copied what it had not used at
    each 1 MiB of output: a 54 MB bomb took 60 s to reach its limit); each member, its
    end inside a slice and its output over many pieces, is followed by the next."""
    import bz2
    import gzip
    import lzma
    import random

    from ktcli.ingest import compressed

    pack = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}[compression]
    noise = random.Random(7).randbytes(150_000)  # a member over several 64 KB slices of input
    members = [b"first line\n" * 300_000, noise, b"second\n", noise, b"third line\n" * 200_000, b""]
    blob = b"".join(pack(m) + b"\x00" * 4 for m in members)
    assert compressed.decompress(blob, compression, "x", 1 << 30, "") == (b"".join(members), 0)
    with pytest.raises(RejectedInput, match="decompresses to over 3 MiB"):
        compressed.decompress(blob, compression, "x", 3 << 20, "")


def test_trailing_garbage_after_a_compressed_file_is_left_out_and_said(write) -> None:
    """gzip reads a member followed by bytes that are none ("trailing garbage ignored");
    ktcli refused the whole log as damaged, "cut short"."""
    import gzip

    doc = load_one(write("syslog.5.gz", gzip.compress(b"Nov 5 host sshd: Failed password for bob\n") + b"GARBAGE"))
    assert doc.text == "Nov 5 host sshd: Failed password for bob\n"
    assert [s.reason for s in doc.left_out] == ["7 bytes after its gzip-compressed data left out (not gzip data)"]
    assert "damaged" in input_error(write("bad.gz", gzip.compress(b"one\n") + gzip.compress(b"two\n")[:12]))


def test_man_output_piped_in_has_its_hyphenated_words_whole() -> None:
    """`man bash | ktcli ask -`: groff breaks words at line ends with U+2010 ("brack‐" /
    "eted-paste"); they are joined, each line kept (its number cited), a source's own
    hyphen ("system-" / "dependent") and a page's overstrikes (MAN_KEEP_FORMATTING) too."""
    page = ("BASH(1)                  General Commands Manual                 BASH(1)\n\nNAME\n"
            "       The text inserted  by  brack\u2010\n       eted-paste  is shown; the default is system-\n"
            "       dependent, and B\x08Bo\x08ol\x08ld\x08d text is\n       re\u2010\n       peated.\n")
    doc = load_stdin(None, io.BytesIO(page.encode()))
    lines = doc.text.split("\n")
    assert lines[3:6] == ["       The text inserted  by", "       bracketed-paste  is shown; the default is system-",
                          "       dependent, and Bold text is"]
    assert lines[6:8] == ["       re\u2010", "       peated."]  # moved, "re" would leave its line empty
    prose = "Notes\n\nA line that ends in a typeset hyphen\u2010\nmade by hand.\n"
    assert "hyphen\u2010\nmade by hand." in load_stdin(None, io.BytesIO(prose.encode())).text  # no man page: as it is


def test_a_dvi_file_is_refused_as_one_with_how_to_convert_it(write) -> None:
    """TeX's DVI (a docs folder's refcard.dvi.gz) was "binary (gzip-compressed); not text":
    its refusal names it and how to convert it (dvipdf and dvi2tty read no gzip)."""
    import gzip

    dvi = b"\xf7\x02\x01\x83\x92\xc0\x1c\x3b\x00\x00\x00\x00\x03\xe8\x1b TeX output 2024.01.01:1200\x8b" + bytes(200)
    message = input_error(write("refcard.dvi", dvi))
    assert "binary: a TeX DVI file" in message and "`dvipdf " in message and "refcard.dvi` and give the PDF" in message
    packed = input_error(write("refcard.dvi.gz", gzip.compress(dvi)))
    assert "(gzip-compressed): a TeX DVI file" in packed
    assert "refcard.dvi.gz > refcard.dvi && dvipdf refcard.dvi`" in packed and "dvi2tty refcard.dvi" in packed


def test_a_large_html_page_read_again_is_the_same_document_without_parsing_it(write, tmp_path, monkeypatch) -> None:
    """Node's 8 MB all.html took ~20 s to parse at every question: a page past
    HTML_MIN_CHARS keeps its text in the run's cache, by its markup (a smaller one does not)."""
    from ktcli.ingest import extract_cache, htmltext
    from ktcli.ingest.extract_cache import kept_under

    monkeypatch.setattr(extract_cache, "HTML_MIN_CHARS", 200)
    nav = "<nav>" + " ".join(f'<a href="/p{i}">Page {i}</a>' for i in range(20)) + "</nav>"
    page = write("big.html", f"<html><head><title>Big</title></head><body>{nav}\n<h1>Tides</h1>\n"
                             + "<p>The tide turns at 7 in the ledger, twice a day, as the keepers wrote.</p>\n" * 5
                             + "</body></html>")
    small = write("small.html", "<html><body><p>Short page.</p></body></html>")
    with kept_under(tmp_path / "cache"):
        first = load_corpus([str(page), str(small)])
    assert first.documents[0].left_out and first.documents[0].source_lines  # its menus said, its lines kept
    calls = []
    real = htmltext.html_to_text
    monkeypatch.setattr(htmltext, "html_to_text", lambda *a, **k: calls.append(1) or real(*a, **k))
    with kept_under(tmp_path / "cache"):
        again = load_corpus([str(page), str(small)])
    assert again == first and calls == [1]  # the small page only
    entry = next((tmp_path / "cache" / extract_cache.FOLDER).glob("*.json"))
    entry.write_text(entry.read_text().replace("Tides", "Floods"))  # edited: read again, not believed
    with kept_under(tmp_path / "cache"):
        assert load_corpus([str(page)]).documents == first.documents[:1]
    assert calls == [1, 1]
