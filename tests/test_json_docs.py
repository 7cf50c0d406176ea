"""docs/json.md names every key --json prints, in the table of its object: a key added to
the code and not to the doc fails here. Cheap: the records are built directly, and the
backends' and pipeline's dicts are read from their source (no model, no torch import)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from ktcli.types import Answer, Citation, FileMap, Mode, Plan, Skipped, Span

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "json.md"


def _section(title: str, sub: bool = True) -> str:
    """The doc's text under the heading that starts with `title`, up to the next heading of
    its level or above (`sub`: its subsections included; else up to the next heading)."""
    lines = DOC.read_text(encoding="utf-8").split("\n")
    start = next(i for i, line in enumerate(lines) if re.match(r"#+ ", line) and line.lstrip("#").strip().startswith(title))
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    out = []
    for line in lines[start + 1:]:
        heading = re.match(r"(#+) ", line)
        if heading and (len(heading.group(1)) <= level or not sub):
            break
        out.append(line)
    return "\n".join(out)


def _rows(text: str) -> set[str]:
    """The keys a table of `text` has a row for: the names in backticks in a row's first cell."""
    keys = set()
    for line in text.split("\n"):
        if line.startswith("| `"):
            keys.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def _function(path: str, name: str) -> ast.AST:
    """The function (or method, or nested function) `name` in ktcli's file `path`."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"{path}: no function {name} (moved? this test reads it)")


def _dict_keys(node: ast.AST) -> set[str]:
    """The string keys of every dict literal under `node`."""
    return {k.value for d in ast.walk(node) if isinstance(d, ast.Dict)
            for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _keyword_dict_keys(node: ast.AST, keyword: str) -> set[str]:
    """The string keys of the dicts passed as `keyword=` under `node` (GenStats' `extra=`)."""
    return {key for call in ast.walk(node) if isinstance(call, ast.Call)
            for kw in call.keywords if kw.arg == keyword for key in _dict_keys(kw.value)}


def _extra_subscripts(path: str) -> set[str]:
    """The keys a module writes as `something.extra["key"]` (`tally.extra`)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return {n.slice.value for n in ast.walk(tree) if isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "extra"
            and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)}


def _plan(mode: Mode = Mode.RETRIEVAL, **kw) -> Plan:
    return Plan(mode, "ask", 9000, 10, 8192, 384, 6000, 2, 40, 2, 8, 60.0, 10**9, **kw)


def _missing(keys: set[str], documented: set[str], what: str) -> None:
    missing = sorted(keys - documented)
    assert not missing, f"docs/json.md does not document {what}: {missing}"


def _answer_object() -> dict:
    from ktcli.render.formats import answer_json

    cite = Citation("a.md:3-4", Span("a.md", 3, 4, chars=(0, 9)), 1.5, "Intro", 1)
    answer = Answer("text [1]", (cite,), _plan(), {"windows": 1}, (Skipped("b.bin", "binary"),),
                    parts=(("a.md", "its summary"),), files=FileMap((("a.md", 1, "A title"),), "", 2))
    return json.loads(answer_json(answer, ["a warning"]))


def test_the_answer_objects_keys_are_documented():
    payload = _answer_object()
    _missing(set(payload), _rows(_section("Top-level keys")), "the answer object's top-level keys")
    section = _section("Top-level keys")
    _missing(set(payload["documents"][0]) | set(payload["files"][0]), set(re.findall(r"`([^`]+)`", section)),
             "the keys of `documents` and `files` entries")


def test_a_citations_keys_are_documented():
    _missing(set(_answer_object()["citations"][0]), _rows(_section("Citations")), "a citation's keys")


def test_every_plan_field_and_no_other_is_documented():
    from ktcli.plan.planner import _with
    from ktcli.render.formats import plan_dict

    documented = _rows(_section("Plan", sub=False))
    keys = set(plan_dict(_plan())) | {f.name for f in fields(Plan)}
    _missing(keys, documented, "the plan's keys")
    assert documented <= keys, f"docs/json.md documents plan keys there are not: {sorted(documented - keys)}"
    other = _plan(mode=Mode.FULL)
    sparse = [_plan(mode=Mode.SPARSE, kv_dtype="int8", attention="topk")]
    alternatives = _with(_plan(), (), other, sparse).alternatives
    _missing({k for alt in alternatives for k in alt}, _rows(_section("Plan")), "the keys of plan.alternatives")


def test_every_figure_is_documented():
    from ktcli.pipeline.api import FIGURE_DEFAULTS
    from ktcli.pipeline.runner import Tally

    documented = _rows(_section("Figures", sub=False))
    _missing(set(FIGURE_DEFAULTS), documented, "FIGURE_DEFAULTS' figures")
    _missing(set(Tally().figures()), documented, "the run's totals (Tally.figures)")
    native = _function("ktcli/engine/native.py", "_record")
    _missing(_keyword_dict_keys(native, "extra"), documented, "the ktcli engine's figures (NativeBackend._record)")
    _missing(_dict_keys(_function("ktcli/engine/device.py", "peak_memory_mb")), documented,
             "the engine's peak memory figures (device.peak_memory_mb)")
    for backend in ("openai_backend", "hf_backend"):  # (transformers' adds none yet)
        tree = ast.parse((ROOT / f"ktcli/engine/{backend}.py").read_text(encoding="utf-8"))
        _missing(_keyword_dict_keys(tree, "extra"), documented, f"the {backend} backend's figures")
    written = _extra_subscripts("ktcli/pipeline/runner.py") | _extra_subscripts("ktcli/pipeline/qa.py") \
        | _extra_subscripts("ktcli/pipeline/summarize.py")
    _missing(written, documented, "the figures the pipeline counts in tally.extra")


def test_the_pipelines_own_figures_and_evidence_keys_are_documented():
    from ktcli.pipeline.citations import evidence_entry

    evidence = _rows(_section("Evidence"))
    _missing(set(evidence_entry(Span("a.md", 1, 2), None)) | {"label"}, evidence, "an evidence entry's keys")
    _missing(_dict_keys(_function("ktcli/pipeline/citations.py", "documents_read")), evidence,
             "the keys of a document read whole's evidence entry")
    figures = _rows(_section("Figures", sub=False))
    for path, name in (("ktcli/pipeline/qa.py", "_answer_from_retrieval"), ("ktcli/pipeline/qa.py", "_whole_read_figures"),
                       ("ktcli/pipeline/summarize.py", "_answer"), ("ktcli/pipeline/summarize.py", "_notes_answer")):
        _missing(_dict_keys(_function(path, name)), figures | evidence, f"the figures of {path} {name}")


def test_a_skipped_entrys_keys_are_documented():
    from ktcli.render.formats import skipped_list

    _missing(set(skipped_list((Skipped("a", "binary"),))[0]), _rows(_section("Skipped")), "a skipped entry's keys")


def test_the_plan_commands_keys_are_documented():
    from ktcli.render.formats import plan_json

    section = _section("The plan object")
    extra = _dict_keys(_function("ktcli/pipeline/api.py", "plan_only"))  # the model's and the object's
    extra |= _dict_keys(_function("ktcli/cli/common.py", "run_plan"))
    top = set(json.loads(plan_json(_plan(), (), {k: None for k in extra})))
    _missing(top, _rows(section), "plan --json's keys and its model's")
    _missing(_dict_keys(_function("ktcli/cli/common.py", "_document_sizes")), set(re.findall(r"`([^`]+)`", section)),
             "the keys of plan --json's documents")


def test_the_error_object_and_every_exit_code_are_documented(capsys):
    import ktcli.engine.openai_http  # noqa: F401 - their errors, with their exit codes
    import ktcli.ingest.errors  # noqa: F401
    from ktcli.cli.common import json_error
    from ktcli.errors import KtcliError

    section = _section("The error object")
    json_error("x", 3)
    _missing(set(json.loads(capsys.readouterr().out)), _rows(section), "the error object's keys")

    def codes(cls) -> set[int]:
        return {cls.exit_code}.union(*(codes(sub) for sub in cls.__subclasses__()))

    documented = {int(k) for k in _rows(section) if k.isdigit()}
    _missing({str(c) for c in codes(KtcliError) | {0, 130, 143}}, {str(c) for c in documented}, "exit codes")


@pytest.mark.parametrize("name", ["_keep_interrupted_answer", "_keep_partial"])
def test_the_interrupted_objects_keys_are_documented(name):
    keys = _dict_keys(_function("ktcli/cli/common.py", name)) - {"answer"}
    _missing(keys, _rows(_section("Interrupted")), f"the keys {name} adds")


def test_a_page_citations_lines_are_the_files_lines_as_the_doc_says():
    """Probe 121: the citation table said `line_start` is "null for a page", while the
    doc's own example (and every PDF page citation) carries lines 25-27 on page 3: lines of
    the text extracted from the whole file, counted from its first page. The example's
    numbers are checked against the sample PDF, and the row says what they count."""
    from ktcli.ingest.corpus import load_corpus

    example = re.search(r'"line_start": (\d+), "line_end": (\d+), "page": (\d+)', DOC.read_text(encoding="utf-8"))
    start, end, page = map(int, example.groups())
    doc = load_corpus([str(ROOT / "sample_docs" / "harbor-light-annual-report-2023.pdf")]).documents[0]
    offsets = {p.number: p.line_offset for p in doc.pages}
    assert offsets[page] < start <= end <= offsets[page + 1]
    lines = doc.text.split("\n")
    assert any("Q3 revenue was $5.87 million" in line for line in lines[start - 1:end])
    row = next(line for line in _section("Citations").split("\n") if line.startswith("| `line_start`"))
    assert "null for a page or" not in row and "counted from its first page" in row


def test_a_page_passages_evidence_lines_and_score_are_as_the_doc_says():
    """Probe 121: `ask report.pdf ... --mode retrieval --json` gave evidence entries with
    `page` 6 and `line_start` 57 (the doc: "null for pages") and scores up to 1.48 (the
    doc said only "min-max scaled", which reads as 0-1)."""
    from ktcli.pipeline.citations import evidence_entry
    from ktcli.retrieval import retriever

    entry = evidence_entry(Span("r.pdf", 57, 70, page=6), 1.4826)
    assert (entry["line_start"], entry["line_end"], entry["page"], entry["unit"]) == (57, 70, 6, "page")
    section = _section("Evidence")
    lines_row = next(line for line in section.split("\n") if line.startswith("| `line_start`"))
    assert "null for pages" not in lines_row and "a passage on a page" in lines_row
    score_row = next(line for line in section.split("\n") if line.startswith("| `score`"))
    top = 1.0 + retriever.LEXICAL_WEIGHT
    assert f"BM25's at {retriever.LEXICAL_WEIGHT}" in score_row and f"0 to {top:g}" in score_row
    assert retriever.DEFINITION_BONUS == retriever.USE_BONUS == retriever.SECTION_BONUS == top
    assert f"plus {retriever.DEFINITION_BONUS:g}" in score_row


def test_a_summarys_citation_labels_are_said():
    """Probe 121: `summarize sample_docs/minirepo --json` cited design.md under label 5 (its
    place among the 14 files: `summarize._answer`'s `doc_label`), where the doc said a label
    is the number the model read, null where it read none, and a summary's reads none."""
    source = (ROOT / "ktcli" / "pipeline" / "summarize.py").read_text(encoding="utf-8")
    assert "doc_label = {d.path: i + 1 for i, d in enumerate(prep.corpus.documents)}" in source
    row = next(line for line in _section("Citations").split("\n") if line.startswith("| `label`"))
    assert "a summary's" in row and "place in the input" in row


def test_what_a_files_entry_quotes_is_said_as_the_code_takes_it():
    """Probe 121: `summarize sample_docs/minirepo --json` gave `files` entries quoting a
    script's leading comment (scripts/release) and a plain text's first paragraph, which
    the doc's list (docstring, README, manifest, names) left out; and its quotes' cut."""
    from ktcli.pipeline import file_map
    from ktcli.types import Document

    def says(path, kind, text, language=""):
        return file_map.describe(Document(path=path, text=text, kind=kind, language=language))

    assert says("scripts/release", "code", "#!/usr/bin/env bash\n# Tags a release.\nset -e\n", "shell") == (
        2, "Tags a release.")
    assert says("notes.txt", "text", "First line of a note\nand its second.\n\nMore.\n") == (
        1, "First line of a note and its second.")
    assert len(says("notes.txt", "text", "word " * 60)[1]) <= file_map.MAX_CHARS
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for said in ("a script's leading comment", "plain text's first paragraph",
                 f"at most {file_map.MAX_CHARS} characters"):
        assert said in text


def test_the_exit_code_under_timeout_is_said():
    """Probe 121: the doc's own example, `timeout -s TERM 110 ktcli summarize ... --json`,
    exits 124 (timeout's status) while the object says `"exit_code": 143`."""
    assert "timeout -s TERM" in DOC.read_text(encoding="utf-8")
    row = next(line for line in _section("The error object").split("\n") if line.startswith("| `143`"))
    assert "124" in row and "--preserve-status" in row
