"""A Jupyter notebook (.ipynb) as the text a reader sees: its cells in order, markdown as
written, code in fenced blocks, and the text its code printed.

Read as raw JSON, a notebook is mostly escaping, metadata and base64: an 80 KB notebook
with one plot counted ~72K tokens and pushed a question about it to retrieval over
chunks of PNG bytes. Images, HTML and other rich outputs are left out and reported (HTML
is read where it is all an output shows: a styled table's text is an object's name); each
text line keeps the line of the .ipynb file it came from (`Document.source_lines`), so
citations name lines the user can open. nbformat writes one JSON string per source line,
each on a line of its own; a notebook saved on one line maps every text line to line 1.
"""

from __future__ import annotations

import json
import re

TEXT_OUTPUTS = ("text/plain",)  # the rich outputs a reader can use as text


class NotANotebook(ValueError):
    """The JSON is not nbformat 4 (the caller reads the file as plain JSON instead)."""


def notebook_text(raw: str) -> tuple[str, tuple[int, ...], int]:
    """(text, the .ipynb line of each text line, rich outputs left out)."""
    try:
        nb = json.loads(raw)
    except ValueError as e:
        raise NotANotebook(str(e)) from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise NotANotebook("no cells")
    info = nb.get("metadata", {}).get("language_info", {}) if isinstance(nb.get("metadata"), dict) else {}
    language = str(info.get("name") or "python") if isinstance(info, dict) else "python"
    finder = _LineFinder(raw.split("\n"))
    lines: list[str] = []
    where: list[int] = []
    left_out = 0

    def add(text_lines: list[str], at: list[int]) -> None:
        lines.extend(text_lines)
        where.extend(at)

    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict):
            continue
        kind = cell.get("cell_type", "")
        source = _joined(cell.get("source"))
        cell_start = finder.next
        body, at = _source_lines(cell.get("source"), finder)
        start = at[0] if at else finder.last
        if kind != "code" and not source.strip():
            continue  # an empty text cell
        if lines:
            add([""], [start])
        if kind == "code":
            add([f"```{language}  # cell {number}"], [start])
            add(body, at)
            add(["```"], [at[-1] if at else start])
            after_source = finder.next
            finder.next = cell_start  # nbformat sorts a cell's keys: its "outputs" come before its "source"
            for output in cell.get("outputs") or []:
                text, rich = _output_text(output)
                left_out += rich
                if isinstance(output, dict) and output.get("output_type") == "error":
                    # "Name: value" is not a string of the file: cite the line of its value
                    line = finder.line_of(str(output.get("evalue") or output.get("ename") or "Error"))
                    add(["Output:", str(text)], [line, line])
                elif _shown_html(output) is not None:
                    # A table shown only in HTML (a pandas Styler, display(HTML(...))): its
                    # text lines, each at the .ipynb line of the markup line it starts on.
                    markup = _shown_html(output)
                    _, markup_at = _source_lines(markup, finder)
                    shown, starts = _html_text(_joined(markup))
                    if shown.strip():
                        out_lines = shown.split("\n")
                        out_at = [markup_at[min(k, len(markup_at)) - 1] if markup_at else finder.last for k in starts]
                        add(["Output:", *out_lines], [out_at[0], *out_at])
                elif _joined(text).strip():
                    # Each printed line keeps the .ipynb line of its own JSON string (a
                    # citation of a printed value opened on the cell's last code line).
                    out_lines, out_at = _source_lines(text, finder)
                    add(["Output:", *out_lines], [out_at[0] if out_at else finder.last, *out_at])
            finder.next = max(finder.next, after_source)
        else:
            add(body, at)
        if isinstance(cell.get("attachments"), dict):  # images pasted into a markdown cell
            left_out += len(cell["attachments"])
    return "\n".join(lines) + "\n", tuple(where), left_out


def _joined(source) -> str:
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _source_lines(source, finder: _LineFinder) -> tuple[list[str], list[int]]:
    """The cell's lines and, for each, the file line holding its JSON string."""
    pieces = source if isinstance(source, list) else [source] if isinstance(source, str) else []
    out: list[str] = []
    at: list[int] = []
    for piece in pieces:
        if not isinstance(piece, str):
            continue
        line = finder.line_of(piece)
        for part in piece.rstrip("\n").split("\n"):  # a one-string source holds many lines
            out.append(part)
            at.append(line)
    return out, at


def _output_text(output) -> tuple[list[str] | str, int]:
    """(the output's text as nbformat holds it: a list of line strings or one string, 1
    when it held a rich output that is left out)."""
    if not isinstance(output, dict):
        return "", 0
    if output.get("output_type") == "stream":
        return output.get("text") or "", 0
    if output.get("output_type") == "error":
        return f"{output.get('ename', 'Error')}: {output.get('evalue', '')}", 0
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    text = next((data[k] for k in TEXT_OUTPUTS if k in data), "")
    html = _shown_html(output) is not None
    rich = any(k not in TEXT_OUTPUTS and not (html and k == "text/html") for k in data)
    return text, int(rich)


# What a notebook's front end shows where an object has no text of its own: a pandas
# Styler's "<pandas.io.formats.style.Styler at 0x7f3a...>", display(HTML(...))'s
# "<IPython.core.display.HTML object>". Its table is in the output's HTML alone.
_OBJECT_REPR = re.compile(r"<[\w.]+(?: object)?(?: at 0x[0-9a-fA-F]+)?>")


def _shown_html(output):
    """An output's HTML where it is what the notebook shows and its text/plain says nothing
    (missing, or an object's repr); else None."""
    data = output.get("data") if isinstance(output, dict) and isinstance(output.get("data"), dict) else {}
    html = data.get("text/html")
    if not _joined(html).strip():
        return None
    plain = _joined(data.get("text/plain")).strip()
    return html if not plain or _OBJECT_REPR.fullmatch(plain) else None


def _html_text(markup: str) -> tuple[str, tuple[int, ...]]:
    from ktcli.ingest.htmltext import html_to_text

    try:
        return html_to_text(markup, title=False)
    except ValueError:  # nested past the walk's limit
        return "", ()


_KEYED = re.compile(r'^"[A-Za-z_]+":\s*')


class _LineFinder:
    """File lines of JSON strings, found in order: nbformat writes each source string on a
    line of its own, so the next line that decodes to the string is where it is."""

    def __init__(self, raw_lines: list[str]) -> None:
        self.raw = raw_lines
        self.next = 0  # search from here (0-based)
        self.last = 1  # the last line found (1-based)

    def line_of(self, text: str) -> int:
        """The next line holding `text` as a list item or as a key's value (a source given
        as one string: `"source": "line 1\\nline 2"`)."""
        wanted = {json.dumps(text, ensure_ascii=False), json.dumps(text)}  # as written, or \u-escaped
        for k in range(self.next, len(self.raw)):
            item = self.raw[k].strip().rstrip(",")
            if item in wanted or _KEYED.sub("", item, count=1) in wanted:
                self.next, self.last = k + 1, k + 1
                return k + 1
        return self.last
