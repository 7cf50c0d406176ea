"""Chunks that define a name the question writes as code come first (`retrieval.symbols`)."""

from ktcli.retrieval.retriever import DEFINITION_BONUS, _fuse
from ktcli.retrieval.symbols import MAX_DEFINITIONS, SymbolTable, code_names
from ktcli.types import Chunk, Span


def chunk(i: int, text: str) -> Chunk:
    return Chunk(doc_path=f"f{i}.py", ordinal=i, text=text, span=Span(f"f{i}.py", 1, text.count("\n") + 1),
                 n_tokens=len(text.split()))


def test_names_written_as_code_are_picked_from_a_question():
    assert code_names("which file defines class ProgressBar?") == {"ProgressBar"}
    assert code_names("what does frobnicate_widget_count() return, and where is TAX_RATE set?") == {
        "frobnicate_widget_count", "TAX_RATE"}
    assert code_names("Where is the HTTPServer made, and what does parse() do?") == {"HTTPServer", "parse"}
    assert code_names("How do exceptions work in Python?") == set()


def test_definitions_in_several_languages_are_found_and_common_names_ignored():
    texts = ["class ProgressBar(t.Generic[V]):\n    pass\n", "bar = ProgressBar(items)\nbar.update(1)\n",
             "pub fn parse_args() -> Args {}\n", "func (r *Repo) SaveAll(x int) error {\n", "TAX_RATE = 0.2\n",
             "export default function AppShell() {}\n"]
    table = SymbolTable([chunk(i, t) for i, t in enumerate(texts)])
    assert table.defining({"ProgressBar"}) == {0}  # the use in chunk 1 is no definition
    assert table.defining({"parse_args", "SaveAll", "TAX_RATE", "AppShell"}) == {2, 3, 4, 5}
    common = SymbolTable([chunk(i, "def run_all(self):\n    pass\n") for i in range(MAX_DEFINITIONS + 1)])
    assert common.defining({"run_all"}) == set()


def test_a_definition_comes_first_and_one_no_ranking_found_is_still_retrieved():
    chunks = [chunk(i, f"use {i}") for i in range(6)]
    dense, lexical = [(1, 0.9), (2, 0.8), (3, 0.7)], [(1, 5.0), (3, 4.0), (4, 2.0), (0, 1.0)]
    assert [h.chunk.ordinal for h in _fuse(chunks, dense, lexical, 3)] == [1, 2, 3]
    assert [h.chunk.ordinal for h in _fuse(chunks, dense, lexical, 3, defining={4})] == [4, 1, 2]
    found = _fuse(chunks, dense, lexical, 3, defining={5})  # in neither ranking
    assert 5 in [h.chunk.ordinal for h in found] and found[1].score == DEFINITION_BONUS
