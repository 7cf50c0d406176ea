"""Jupyter notebooks read as their cells, not as JSON."""

from __future__ import annotations

import base64
import json

from ktcli.ingest import load_corpus

CELLS = [
    {"cell_type": "markdown", "id": "a", "metadata": {},
     "source": ["# Analysis of sales\n", "\n", "We load the data and plot it."]},
    {"cell_type": "code", "execution_count": 1, "id": "b", "metadata": {},
     "outputs": [
         {"name": "stdout", "output_type": "stream", "text": ["rows: 1200\n"]},
         {"data": {"image/png": base64.b64encode(b"x" * 60_000).decode(), "text/plain": ["<Figure size 640x480>"]},
          "metadata": {}, "output_type": "display_data"},
         {"ename": "KeyError", "evalue": "'region'", "output_type": "error", "traceback": ["..."]},
     ],
     "source": ["import pandas as pd\n", "df = pd.read_csv('sales.csv')\n", "print('rows:', len(df))"]},
]


def _notebook(tmp_path, indent=1, name="sales.ipynb"):
    path = tmp_path / name
    path.write_text(json.dumps({"cells": CELLS, "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                               indent=indent, sort_keys=True))
    return path


def test_cells_become_text_and_images_are_left_out_and_reported(tmp_path):
    path = _notebook(tmp_path)
    corpus = load_corpus([str(path)])
    (doc,) = corpus.documents
    assert doc.text.startswith("# Analysis of sales\n\nWe load the data and plot it.\n")
    assert "```python  # cell 2\nimport pandas as pd\n" in doc.text
    assert "rows: 1200" in doc.text and "KeyError: 'region'" in doc.text and "<Figure size" in doc.text
    assert "iVBOR" not in doc.text and "eHh4" not in doc.text and len(doc.text) < 1000  # no base64
    assert [(s.reason, s.part) for s in corpus.skipped] == [("1 image or other rich output of its cells left out", True)]


def test_each_line_maps_to_the_notebook_line_holding_it(tmp_path):
    path = _notebook(tmp_path)
    doc = load_corpus([str(path)]).documents[0]
    raw = path.read_text().split("\n")
    for text_line, file_line in zip(doc.text.split("\n"), doc.source_lines):
        if text_line and not text_line.startswith(("```", "Output:", "rows:", "<Figure", "KeyError")):
            assert json.dumps(text_line)[:-1] in raw[file_line - 1], (text_line, raw[file_line - 1])


def test_printed_output_maps_to_its_own_notebook_line(tmp_path):
    # A citation of a printed value opened on the cell's last code line. nbformat writes a
    # cell's "outputs" before its "source" (sorted keys); hand-written files may not.
    for sort_keys in (True, False):
        path = tmp_path / f"out{sort_keys}.ipynb"
        path.write_text(json.dumps({"cells": CELLS, "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                                   indent=1, sort_keys=sort_keys))
        doc = load_corpus([str(path)]).documents[0]
        raw = path.read_text().split("\n")
        text_lines = doc.text.split("\n")
        for printed in ("rows: 1200", "<Figure size 640x480>"):
            file_line = doc.source_lines[text_lines.index(printed)]
            assert json.dumps(printed)[:-1] in raw[file_line - 1], (sort_keys, printed, raw[file_line - 1])
        code_line = doc.source_lines[text_lines.index("import pandas as pd")]
        assert '"import pandas as pd\\n"' in raw[code_line - 1]


def test_a_notebook_on_one_line_maps_to_line_one_and_other_json_stays_json(tmp_path):
    doc = load_corpus([str(_notebook(tmp_path, indent=None))]).documents[0]
    assert set(doc.source_lines) == {1} and "import pandas as pd" in doc.text
    other = tmp_path / "data.ipynb"
    other.write_text('{"not": "a notebook"}\n')
    assert load_corpus([str(other)]).documents[0].text == '{"not": "a notebook"}\n'


def test_code_is_fenced_in_the_kernels_language_and_empty_cells_add_nothing(tmp_path):
    path = tmp_path / "r.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": []},
             {"cell_type": "code", "metadata": {}, "outputs": [], "source": ["x <- 1"]}]
    path.write_text(json.dumps({"cells": cells, "metadata": {"language_info": {"name": "R"}}, "nbformat": 4}))
    assert load_corpus([str(path)]).documents[0].text == "```R  # cell 2\nx <- 1\n```\n"


def test_one_string_sources_errors_and_attachments(tmp_path):
    # A source given as one string (valid nbformat, written by generators) mapped to the
    # previous cell's line; an error's "Name: value" to the previous output's; a markdown
    # cell's pasted image was dropped unreported.
    cells = [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["Intro.\n"],
         "attachments": {"map.png": {"image/png": base64.b64encode(b"x" * 100).decode()}}},
        {"cell_type": "code", "execution_count": 1, "id": "b", "metadata": {}, "source": "y = 1 / 0\nprint(y)",
         "outputs": [{"ename": "ZeroDivisionError", "evalue": "division by zero", "output_type": "error",
                      "traceback": ["..."]}]},
    ]
    path = tmp_path / "gen.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1,
                               sort_keys=True))
    corpus = load_corpus([str(path)])
    doc = corpus.documents[0]
    raw = path.read_text().split("\n")
    got = dict(zip(doc.text.split("\n"), doc.source_lines))
    assert '"source": "y = 1 / 0\\nprint(y)"' in raw[got["y = 1 / 0"] - 1] and got["print(y)"] == got["y = 1 / 0"]
    assert '"evalue": "division by zero"' in raw[got["ZeroDivisionError: division by zero"] - 1]
    assert [s.reason for s in corpus.skipped] == ["1 image or other rich output of its cells left out"]


def test_a_notebook_cut_short_is_read_as_text_and_said(tmp_path):
    """A .ipynb that is not notebook JSON (a copy cut short) was read as raw JSON, unannounced."""
    path = _notebook(tmp_path)
    raw = path.read_text()
    path.write_text(raw[: len(raw) // 2])
    corpus = load_corpus([str(path)])
    assert corpus.documents[0].text == raw[: len(raw) // 2]
    (note,) = corpus.skipped
    assert note.reason.startswith("not a Jupyter notebook (") and note.reason.endswith("read as its JSON text")


def test_a_notebook_piped_in_is_read_as_its_cells(tmp_path):
    """`cat a.ipynb | ktcli ask -` read the raw JSON, base64 images and all."""
    from ktcli.ingest.loaders import document_from_bytes

    data = _notebook(tmp_path).read_bytes()
    piped = document_from_bytes(data, "<stdin>", "", is_stdin=True)
    named = load_corpus([str(_notebook(tmp_path))]).documents[0]
    assert piped.text == named.text and "iVBOR" not in piped.text
    other = document_from_bytes(b'{"cells": "a spreadsheet export", "rows": 3}', "<stdin>", "", is_stdin=True)
    assert other.kind == "stdin" and '"cells"' in other.text  # other JSON stays JSON


def test_an_output_shown_only_in_html_is_read() -> None:
    """Found by a probe: a pandas Styler's table, and display(HTML(...)), were read as their
    text/plain, "<pandas.io.formats.style.Styler at 0x7f3a2c1b9d50>": the table was lost
    (said as a rich output left out). Where text/plain has the table, the HTML stays out."""
    import json

    from ktcli.ingest.notebook import notebook_text

    def output(html, plain):
        return {"output_type": "execute_result", "metadata": {}, "data": {"text/html": html, "text/plain": plain}}

    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "source": ["df.style"], "outputs": [output(
            ["<style>#T_1 { color: red; }</style>\n", "<table id=\"T_1\">\n",
             "<tr><th>region</th><th>revenue</th></tr>\n", "<tr><td>Alpine</td><td>4,210</td></tr>\n", "</table>\n"],
            ["<pandas.io.formats.style.Styler at 0x7f3a2c1b9d50>"])]},
        {"cell_type": "code", "metadata": {}, "source": ["display(HTML(x))"],
         "outputs": [output(["<b>Owner:</b> Dana"], ["<IPython.core.display.HTML object>"])]},
        {"cell_type": "code", "metadata": {}, "source": ["df"],
         "outputs": [output(["<table><tr><td>x</td></tr></table>"], ["  region\n", "0 Alpine"])]},
    ]}
    raw = json.dumps(nb, indent=1)
    text, lines, rich = notebook_text(raw)
    assert "Output:\nregion | revenue\nAlpine | 4,210\n" in text and "Output:\nOwner: Dana\n" in text
    assert "Styler at" not in text and "color: red" not in text and "0 Alpine" in text
    assert rich == 1  # the third output's HTML, its text read instead
    file_lines = raw.split("\n")
    row = text.split("\n").index("Alpine | 4,210")
    assert "Alpine" in file_lines[lines[row] - 1]
