"""Section trails: the headings or enclosing definitions above a line."""

from __future__ import annotations

from pathlib import Path

from ktcli.ingest.chunking import chunk_document
from ktcli.ingest.loaders import document_from_bytes
from ktcli.ingest.sections import MAX_DEPTH, document_trails, heading_trails

ROOT = Path(__file__).resolve().parents[2]


def _trails(text: str, code: bool = False) -> list[str]:
    lines = text.split("\n")
    index = heading_trails(lines, code=code)
    return [index.at(k) for k in range(len(lines))]


def test_rst_levels_follow_first_use_of_each_adornment_style():
    text = "\n".join([
        "*******",        # 0  over- and underlined: level of its own
        "Classes",        # 1
        "*******",        # 2
        "",               # 3
        "intro",          # 4
        "",               # 5
        "A First Look",   # 6
        "============",   # 7
        "",               # 8
        "Syntax",         # 9
        "------",         # 10
        "body",           # 11
        "",               # 12
        "Objects",        # 13
        "-------",        # 14
        "more",           # 15
        "",               # 16
        "Inheritance",    # 17
        "===========",    # 18
        "text",           # 19
    ])
    t = _trails(text)
    assert t[4] == "Classes"
    assert t[11] == "Classes > A First Look > Syntax"
    assert t[15] == "Classes > A First Look > Objects"  # a sibling replaces, not nests
    assert t[19] == "Classes > Inheritance"  # back up two levels
    assert t[0] == "Classes"  # the trail starts on the overline, where the heading starts


def test_rst_roles_and_literals_are_stripped_from_titles():
    text = ":keyword:`!for` Statements\n==========================\nbody\n``range`` and `x`\n-----------------\nb"
    t = _trails(text)
    assert t[2] == "for Statements"
    assert t[5] == "for Statements > range and x"


def test_underline_shorter_than_title_or_indented_title_is_no_heading():
    assert _trails("some words here\n---\ntext")[2] == ""
    assert _trails("   quoted\n   ======\ntext")[2] == ""
    assert _trails("----------\n\ntext")[2] == ""  # a transition, not a title


def test_markdown_atx_nesting_and_fenced_code():
    text = "# Guide\n\n## Install\nstep\n```sh\n# not a heading\n```\n## Use\n### Flags\nx\n# Other\ny"
    t = _trails(text)
    assert t[3] == "Guide > Install"
    assert t[5] == "Guide > Install"  # the comment in the fence is not a heading
    assert t[9] == "Guide > Use > Flags"
    assert t[11] == "Other"


def test_deep_trails_keep_their_last_levels():
    text = "\n".join("#" * (k + 1) + f" L{k}" for k in range(6)) + "\nbody"
    assert _trails(text)[-1] == " > ".join(f"L{k}" for k in range(6 - MAX_DEPTH, 6))


def test_code_trails_nest_by_indentation_and_close_on_dedent():
    text = "\n".join([
        "import os",                    # 0
        "",                             # 1
        "@dataclass",                   # 2
        "class Shelf(Base):",           # 3
        "    # a comment",              # 4
        "    def add(self, book):",     # 5
        "        return book",          # 6
        "",                             # 7
        "    async def search(self):",  # 8
        "        pass",                 # 9
        "",                             # 10
        "RESULTS = 10",                 # 11
        "pub fn rank(xs: &[u8]) {",     # 12
        "    x",                        # 13
        "}",                            # 14
    ])
    t = _trails(text, code=True)
    assert t[0] == "" and t[1] == ""
    assert t[2] == "class Shelf"  # a declaration's decorators are its own lines
    assert t[4] == "class Shelf"
    assert t[6] == "class Shelf > def add"
    assert t[9] == "class Shelf > def search"
    assert t[11] == ""  # module level again
    assert t[13] == "fn rank"


def test_a_minified_line_names_no_scope_for_its_chunks():
    bundle = ";".join(f"function f{i}(a,b){{return a*{i}+b}}" for i in range(60))
    assert len(bundle) > 1_000
    doc = document_from_bytes(f"{bundle}\nfunction tail() {{\n  return 1\n}}\n".encode(), "app.min.js", "app.min.js")
    chunks = chunk_document(doc, chunk_tokens=64, overlap_tokens=8)
    on_the_line = [c for c in chunks if c.span.line_start == 1]
    assert len(on_the_line) > 3
    assert all(c.section == "" for c in on_the_line)  # not "function f0", every one
    assert _trails(f"{bundle}\nfunction tail() {{\n  return 1\n}}", code=True)[2] == "function tail"


def test_chunks_carry_the_trail_at_their_first_line():
    body = "\n".join(f"Sentence number {k} about namespaces and scopes." for k in range(60))
    text = f"Classes\n=======\n\nScopes\n------\n{body}\n"
    doc = document_from_bytes(text.encode(), "guide.rst", "guide.rst")
    chunks = chunk_document(doc, chunk_tokens=64, overlap_tokens=8)
    assert len(chunks) > 3
    assert chunks[0].section == "Classes"
    assert all(c.section == "Classes > Scopes" for c in chunks[1:])


def test_a_pdf_without_bookmarks_or_numbered_headings_has_no_trail():
    from ktcli.ingest.loaders import load_file

    pdf = ROOT / "sample_docs" / "harbor-light-annual-report-2023.pdf"
    doc = load_file(pdf, "report.pdf")
    # (its quarterly table's rows are in one chunk with their header row: no trail needed;
    # tests/ingest/test_pdf_headings.py has a table's rows under their header)
    assert {c.section for c in chunk_document(doc)} == {""}


def test_decorators_belong_to_the_declaration_below_them():
    """`@torch.no_grad()` above `def forward` was cited under the function before it."""
    text = "\n".join([
        "class Rope:",                  # 0
        "    def scale(self):",         # 1
        "        return 2",             # 2
        "",                             # 3
        "    @torch.no_grad()",         # 4
        "    @staticmethod",            # 5
        "    def forward(x):",          # 6
        "        return x",             # 7
    ])
    t = _trails(text, code=True)
    assert t[2] == "class Rope > def scale"
    assert t[4] == t[5] == t[6] == "class Rope > def forward"


def test_a_decorator_over_several_lines_belongs_to_its_declaration():
    text = "\n".join([
        "class A:",                          # 0
        "    def m(self):",                  # 1
        "        pass",                      # 2
        "    @pytest.mark.parametrize(",     # 3
        "        'x',",                      # 4
        "        [1, 2],",                   # 5
        "    )",                             # 6
        "    def view(self, x):",            # 7
        "        return x",                  # 8
    ])
    t = _trails(text, code=True)
    assert t[2] == "class A > def m"
    assert t[3] == t[4] == t[6] == t[8] == "class A > def view"


def test_a_tables_chunks_carry_its_header_row() -> None:
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    rows = "id,name,city\n" + "".join(f"{i},Name{i},City{i % 9}\n" for i in range(400))
    doc = document_from_bytes(rows.encode(), "data.csv", "data.csv")
    chunks = chunk_document(doc, chunk_tokens=128, overlap_tokens=16)
    assert len(chunks) > 3 and all(c.section == "columns: id,name,city" for c in chunks[1:])
    # The model reads every chunk's rows under the header row (a chunk from the middle was
    # bare values), the first chunk's header once.
    from ktcli.pipeline.prompts import passages

    block = passages(chunks[:2])
    assert block.count("id,name,city\n") == 2 and chunks[1].text.split("\n")[0] not in ("id,name,city",)
    assert f'ref="{chunks[1].span.cite()}">\nid,name,city\n{chunks[1].text.split(chr(10))[0]}' in block
    # pandas' index column has no name: the header starts with its separator, kept, or
    # every name moves one column left; and a wide header reaches the model whole.
    wide = "\t" + "\t".join(f"column_{i}" for i in range(40))
    rows = wide + "\n" + "".join("\t".join([str(i)] + ["v"] * 40) + "\n" for i in range(300))
    doc = document_from_bytes(rows.encode(), "data.tsv", "data.tsv")
    later = chunk_document(doc, chunk_tokens=128, overlap_tokens=16)[2]
    assert passages([later]).split("\n")[1] == wide
    # A CSV piped in is known by its shape: its chunks reach the model under the header too.
    piped = "id,name,city\n" + "".join(f"{i},Name{i},City{i % 9}\n" for i in range(400))
    doc = document_from_bytes(piped.encode(), "<stdin>", "", is_stdin=True)
    middle = chunk_document(doc, chunk_tokens=128, overlap_tokens=16)[3]
    assert passages([middle]).split("\n")[1:3] == ["id,name,city", middle.text.split("\n")[0]]


def test_a_diffs_lines_are_placed_in_the_files_they_change():
    """`git diff | ktcli ask -` was cited as "<stdin>:288-289", with no file to open."""
    diff = ("diff --git a/src/app.py b/src/app.py\nindex 1..2 100644\n--- a/src/app.py\n+++ b/src/app.py\n"
            "@@ -10,4 +10,5 @@ def main():\n     setup()\n-    run(1)\n+    run(2)\n+    log()\n     done()\n"
            "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n"
            "+first\n+second\n")
    lines = diff.split("\n")
    trails = document_trails("<stdin>", "stdin", lines)
    at = {line: trails.at(k) for k, line in enumerate(lines) if line}
    assert at["     setup()"] == "src/app.py:10"
    assert at["-    run(1)"] == "src/app.py:11, removed"
    assert (at["+    run(2)"], at["+    log()"], at["     done()"]) == ("src/app.py:11", "src/app.py:12", "src/app.py:13")
    assert (at["+first"], at["+second"]) == ("new.txt:1", "new.txt:2")
    assert document_trails("notes.txt", "text", ["--- a list", "+++ not a diff", "plain"]).at(2) == ""


def test_a_commits_header_in_git_log_p_is_no_files_line():
    """`git log -p | ktcli ask -` cited "commit 8cdc33c..." under the file of the commit
    before's last hunk."""
    log = ("commit 8cdc33c0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6\nAuthor: A <a@x>\nDate:   Fri Dec 4\n\n    Fix the cache\n\n"
           "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n-a\n+b\n c\n\n"
           "commit 1111111222222233333334444444555555566666\nAuthor: B <b@x>\n\n    Second\n")
    lines = log.split("\n")
    trails = document_trails("<stdin>", "stdin", lines)
    at = {line: trails.at(k) for k, line in enumerate(lines) if line}
    assert at["    Fix the cache"] == "commit 8cdc33c0a1b2" and at[" c"] == "app.py:2"
    assert at["commit 1111111222222233333334444444555555566666"] == "commit 111111122222"
    assert at["    Second"] == "commit 111111122222"


def test_code_piped_in_has_code_trails_and_markdown_stays_prose():
    """`cat progress_bar.py | ktcli ask -` cited its lines under a `# comment` read as a
    Markdown heading; named, the same file had `(class ProgressBar)`."""
    code = ["import os", "", "# Number of characters before the animation repeats", "PULSE = 20", "",
            "class ProgressBar:", "    def __init__(self, total=100):", "        self.total = total", "        pass"]
    assert document_trails("<stdin>", "stdin", code, "python").at(7) == "class ProgressBar > def __init__"
    assert document_trails("<stdin>", "stdin", code, None).at(7) == "Number of characters before the animation repeats"
    readme = ["# Install", "```python", "import os", "def f(x):", "    return x", "```", "## Use", "text"]
    assert document_trails("<stdin>", "stdin", readme, "python").at(7) == "Install > Use"
    indented = ["# Usage", "Write a handler:", "", "    class MyHandler(Handler):", "        def handle(self, event):",
                "            self.count += 1", "            return event", "", "## Configuration", "Set the level."]
    assert document_trails("<stdin>", "stdin", indented, "python").at(9) == "Usage > Configuration"
    for prose in ("Use it like this:", "From version 2 on, the level is read once.", "Let the server start first.",
                  "Example (Python):"):
        lines = indented[:2] + [prose] + indented[2:]
        assert document_trails("<stdin>", "stdin", lines, "python").at(10) == "Usage > Configuration", prose


def test_markdown_underlined_headings_rank_as_markdown_ranks_them():
    """A wiki page's `Runbook` underlined with === above a `## Deploy` was ranked below it
    (reStructuredText's rule: adornments after any # level), so Deploy was cited alone;
    and an underline shorter than its title was no heading."""
    page = "Runbook\n=======\n\nintro\n\nSet up the host\n---\n\ntext\n\n## Deploy\n\nbody".split("\n")
    trails = document_trails("Runbook.md", "markdown", page)
    assert [trails.at(k) for k in (3, 8, 12)] == ["Runbook", "Runbook > Set up the host", "Runbook > Deploy"]
    # front matter's closing --- and a list item above --- are no headings
    other = "---\ntitle: x\n---\n# Real\n- item\n---\ntext".split("\n")
    assert {document_trails("a.md", "markdown", other).at(k) for k in range(7)} == {"", "Real"}


def test_a_table_piped_in_keeps_its_header_as_the_trail():
    """A CSV on stdin (or an export named .txt) lost its "columns:" trail: its chunks were
    bare rows no question about a column matched."""
    rows = "id,name,city,amount\n1,Ada,Oslo,10\n2,Bo,Rome,20\n3,Cy,Lima,30".split("\n")
    assert document_trails("<stdin>", "stdin", rows).at(2) == "columns: id,name,city,amount"
    tsv = "id\tname\n1\tAda\n2\tBo".split("\n")
    assert document_trails("export.txt", "text", tsv).at(1) == "columns: id\tname"
    prose = "Hello, world, again.\nIt was, as ever, fine.\nNo, no.".split("\n")
    assert document_trails("notes.txt", "text", prose).at(1) == ""


def test_markdown_rules_and_tables_are_no_underlined_headings():
    """Found by review: a pipe table's last row above a rule became a heading, and a file
    opening with a rule lost its headings to a "front matter" up to its next rule."""
    table = "## Prices\n\nItem | Price\n--- | ---\nTea | 3\nCoffee | 4\n---\n\nMore.".split("\n")
    assert document_trails("p.md", "markdown", table).at(8) == "Prices"
    ruled = "---\n\nIntro text.\n\n## Setup\n\nSteps.\n\n## Use\n\nMore.\n\n---".split("\n")
    assert document_trails("r.md", "markdown", ruled).at(10) == "Use"
    lazy = "- item one\ncontinued lazily\n---\ntext".split("\n")
    assert document_trails("l.md", "markdown", lazy).at(3) == ""
    jsonl = ['{"id": 1, "user": "ann", "event": "login"}'] * 3
    assert document_trails("<stdin>", "stdin", jsonl).at(1) == ""


def test_declarations_named_in_any_alphabet_head_their_lines():
    """`def überprüfe_größe` and `def 計算する` gave no trail; `class Größe` did."""
    from ktcli.ingest.sections import document_trails

    lines = ["def überprüfe_größe(x):", "    return x", "def 計算する(a):", "    pass"]
    trails = document_trails("s.py", "code", lines)
    assert (trails.at(1), trails.at(3)) == ("def überprüfe_größe", "def 計算する")


def test_a_word_tables_rows_carry_its_header_row_under_their_section():
    """An 80-row rate table of a .docx: chunks from its middle reached the model as bare rows
    ("Prague - Lyon | 246 | 4"), nothing saying which figure was the rate."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.pipeline.prompts import passages
    from ktcli.types import Document

    rows = [f"City {i} - Lyon | {200 + i} | {i % 5 + 1}" for i in range(80)]
    text = "\n".join(["# Rates", "", "Our rates for 2024.", "", "Lane | Rate (EUR per pallet) | Transit (days)", *rows,
                      "", "# Terms", "", "Payment in 30 days."]) + "\n"
    doc = Document(path="rates.docx", text=text, kind="docx", sha256="x")
    chunks = chunk_document(doc, chunk_tokens=96, overlap_tokens=8)
    middle = next(c for c in chunks if c.text.startswith("City 4"))
    assert middle.section == "Rates > columns: Lane | Rate (EUR per pallet) | Transit (days)"
    assert passages([middle]).split("\n")[1:3] == ["Lane | Rate (EUR per pallet) | Transit (days)",
                                                   middle.text.split("\n")[0]]
    lines = text.split("\n")
    trails = document_trails("rates.docx", "docx", lines)
    assert trails.at(lines.index("Payment in 30 days.")) == "Terms"  # after the table: its section again
    assert trails.at(lines.index("Lane | Rate (EUR per pallet) | Transit (days)")) == "Rates"  # the header: its section
    # Markdown's pipe tables, past their rule row; a text file's pipes are not read as tables
    md = "\n".join(["| Lane | Rate |", "|---|---|", *[f"| City {i} | {i} |" for i in range(6)]]) + "\n"
    trails = document_trails("t.md", "markdown", md.split("\n"))
    assert trails.at(1) == "" and trails.at(2) == "columns: Lane | Rate"
    padded = md.replace("| Lane | Rate |", "| Lane       | Rate     |")  # padded to its columns' width
    assert document_trails("t.md", "markdown", padded.split("\n")).at(2) == "columns: Lane | Rate"
    assert document_trails("t.txt", "text", md.split("\n")).at(3) == ""
    small = "\n".join(["Duty | When", "Wind the clock | noon", "Polish the brass | Fridays"])  # in one chunk with its header
    assert document_trails("m.docx", "docx", small.split("\n")).at(2) == ""


def test_a_tables_header_is_its_first_row_whatever_its_rows_cells():
    """Found by review: Word and HTML drop or keep empty cells at a row's end, and a table cut
    where its cell count changed took a row of figures for its header; a header holding
    " > " lost it; a fenced shell pipeline was a table."""
    from ktcli.pipeline.prompts import passages
    from ktcli.types import Chunk, Span

    rows = ["Route | Rate | Days | Note", *[f"Route {i} | {200 + i} | 2 | x" for i in range(5)],
            *[f"Route {i} | {200 + i} | 2" for i in range(5, 60)]]
    lines = ["# Rates", "", *rows, "", "After."]
    trails = document_trails("r.html", "html", lines)
    assert {trails.at(k) for k in range(3, 62)} == {"Rates > columns: Route | Rate | Days | Note"}
    assert trails.at(len(lines) - 1) == "Rates"
    chunk = Chunk("w.csv", 3, "12,4", Span("w.csv", 40, 40), 3, section="columns: size > 5 kg,rate")
    assert passages([chunk]).split("\n")[1] == "size > 5 kg,rate"
    fenced = ["# Usage", "", "```sh", *[f"cat f{i}.log | grep ERROR | wc -l" for i in range(8)], "```"]
    assert document_trails("u.md", "markdown", fenced).at(6) == "Usage"


def test_a_plain_text_contracts_numbered_headings_are_its_trail():
    """An EDGAR-style contract in a .txt ("7. TERMINATION") had no trail: "clause 7.3" was
    cited with no section."""
    from ktcli.ingest.sections import document_trails

    lines = ["MASTER SERVICES AGREEMENT", "", "1. DEFINITIONS", "Words mean things here.", "2. SERVICES",
             "The supplier serves.", "3. TERM", "Two years.", "4. TERMINATION", "4.3 Either party may end this on notice.",
             "5. NOTICES", "By post."]
    trails = document_trails("msa.txt", "text", lines)
    assert [trails.at(k) for k in (0, 3, 5, 7, 9, 11)] == ["", "1. DEFINITIONS", "2. SERVICES", "3. TERM",
                                                            "4. TERMINATION", "5. NOTICES"]
    # Markdown or reStructuredText headings, where it has them, are its trail as ever
    assert document_trails("n.txt", "text", ["Intro", "=====", "1. One", "2. Two", "3. Three"]).at(4) == "Intro"


def test_a_numbered_log_has_no_numbered_headings():
    from ktcli.ingest.sections import document_trails

    log = [f"{i} INFO Request served in {i % 7} ms" if i % 2 else f"{i} Worker started job" for i in range(1, 40)]
    trails = document_trails("run.log", "text", log)
    assert all(trails.at(k) == "" for k in range(len(log)))


def test_cpp_export_macros_and_attributes_are_not_the_name():
    """torch's headers declare `class TORCH_API Engine`: every class there was the section
    "class TORCH_API" (and defined TORCH_API: tests/retrieval/test_symbols.py)."""
    lines = ["namespace torch {", "class TORCH_API Engine {", " public:", "  void execute();", "};",
             "enum class Color { Red, Green };", "struct C10_API alignas(16) Foo final : Bar {", "  int x;", "};",
             "class __declspec(dllexport) Widget {", "};", "class [[nodiscard]] Result {", "};", "class HTTP_ERROR;", "}"]
    trails = document_trails("engine.h", "code", lines, "cpp")
    said = {lines[k]: trails.at(k) for k in range(len(lines))}
    assert said["  void execute();"].endswith("class Engine")
    assert said["enum class Color { Red, Green };"].endswith("enum class Color")
    assert said["  int x;"].endswith("struct Foo")
    assert said["class __declspec(dllexport) Widget {"].endswith("class Widget")
    assert said["class [[nodiscard]] Result {"].endswith("class Result")
    assert said["class HTTP_ERROR;"].endswith("class HTTP_ERROR")  # a name in capitals, alone, is the name
