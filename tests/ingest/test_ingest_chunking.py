"""Chunking invariants: spans name exactly the text, every line is covered, chunks
overlap, long lines split, PDF chunks stay on one page, and it is fast."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ktcli.errors import UsageError
from ktcli.ingest import chunk_corpus, chunk_document, count_tokens, load_corpus
from ktcli.types import Chunk, Document, Page

REPO = Path(__file__).resolve().parents[2]


def doc_of(text: str, kind: str = "text", path: str = "doc.txt") -> Document:
    return Document(path=path, text=text, kind=kind, sha256=hashlib.sha256(text.encode()).hexdigest())


def lines_of(doc: Document) -> list[str]:
    return doc.text.split("\n")[: doc.n_lines]


def check_invariants(doc: Document, chunks: list[Chunk], chunk_tokens: int, overlap: int) -> None:
    lines = lines_of(doc)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    covered: set[int] = set()
    previous_start = 0
    for chunk in chunks:
        span = chunk.span
        assert chunk.doc_path == doc.path == span.path
        assert chunk.doc_sha256 == doc.sha256
        assert 1 <= span.line_start <= span.line_end <= len(lines)
        assert span.line_start >= previous_start, "chunks follow the document's order"
        previous_start = span.line_start
        assert chunk.n_tokens <= chunk_tokens
        source = "\n".join(lines[span.line_start - 1 : span.line_end])
        if span.line_start == span.line_end and chunk.text != source:
            assert chunk.text in source, "a split piece of a long line"
        else:
            assert chunk.text == source, "a chunk is exactly the lines its span names"
        covered.update(range(span.line_start, span.line_end + 1))
    assert covered == set(range(1, len(lines) + 1)), "every line is in some chunk"


# ---- basics ----------------------------------------------------------------------------


def test_count_tokens() -> None:
    assert count_tokens("") == 0
    assert count_tokens("hello world") == 2
    assert count_tokens("<|endoftext|>") > 1  # special tokens are plain text here


def test_small_document_is_one_chunk() -> None:
    doc = doc_of("one\ntwo\nthree\n")
    (chunk,) = chunk_document(doc)
    assert chunk.text == "one\ntwo\nthree"
    assert chunk.span.cite() == "doc.txt:1-3"
    assert chunk.chunk_id == f"{doc.sha256[:16]}:0"


def test_empty_document_has_no_chunks() -> None:
    assert chunk_document(doc_of("")) == []


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1), (10, 11)])
def test_bad_budgets(size: int, overlap: int) -> None:
    with pytest.raises(UsageError):
        chunk_document(doc_of("x\n"), chunk_tokens=size, overlap_tokens=overlap)


def test_chunks_overlap_by_about_the_overlap() -> None:
    text = "\n".join(f"line number {i} of the text" for i in range(400)) + "\n"
    doc = doc_of(text)
    chunks = chunk_document(doc, chunk_tokens=64, overlap_tokens=16)
    check_invariants(doc, chunks, 64, 16)
    for a, b in zip(chunks, chunks[1:]):
        shared = a.span.line_end - b.span.line_start + 1
        assert shared >= 1
        shared_text = "\n".join(lines_of(doc)[b.span.line_start - 1 : a.span.line_end])
        assert count_tokens(shared_text) <= 16 + 2


def test_no_overlap_when_zero() -> None:
    doc = doc_of("\n".join(f"row {i}" for i in range(300)))
    chunks = chunk_document(doc, chunk_tokens=40, overlap_tokens=0)
    check_invariants(doc, chunks, 40, 0)
    assert all(b.span.line_start == a.span.line_end + 1 for a, b in zip(chunks, chunks[1:]))


def test_long_line_is_split_but_names_its_line() -> None:
    minified = "var a=" + ",".join(f"x{i}:{i * 7}" for i in range(800)) + ";"
    doc = doc_of(f"// header\n{minified}\n// footer\n", kind="code")
    chunks = chunk_document(doc, chunk_tokens=100, overlap_tokens=10)
    check_invariants(doc, chunks, 100, 10)
    pieces = [c for c in chunks if c.span.line_start == c.span.line_end == 2]
    assert len(pieces) > 5
    # each names its line, and where in it it lies (a one-line file's passages were all ":1")
    assert all(c.span.cite() == f"doc.txt:2 (chars {c.char_start + 1:,}-{c.char_start + len(c.text):,})" for c in pieces)
    assert all(minified[c.span.chars[0]:c.span.chars[1]] == c.text for c in pieces)
    # consecutive pieces overlap and together rebuild the line
    rebuilt = pieces[0].text
    for piece in pieces[1:]:
        k = next(k for k in range(min(len(rebuilt), len(piece.text)), 0, -1) if rebuilt.endswith(piece.text[:k]))
        rebuilt += piece.text[k:]
    assert rebuilt == minified


def test_long_line_with_multibyte_characters() -> None:
    line = "数据" * 2000 + "é" * 500
    doc = doc_of(line)
    chunks = chunk_document(doc, chunk_tokens=50, overlap_tokens=0)
    assert "".join(c.text for c in chunks) == line


def test_prefers_blank_lines_and_headings() -> None:
    sections = []
    for s in range(12):
        body = " ".join(f"word{s}_{i}" for i in range(40))
        sections.append(f"# Section {s}\n\n{body}\n")
    doc = doc_of("\n".join(sections), kind="markdown")
    chunks = chunk_document(doc, chunk_tokens=300, overlap_tokens=0)
    check_invariants(doc, chunks, 300, 0)
    lines = lines_of(doc)
    for chunk in chunks[1:]:
        assert lines[chunk.span.line_start - 1].startswith("# Section"), chunk.span


def test_prefers_top_level_definitions_in_code() -> None:
    funcs = [f"def f{i}(x):\n" + "".join(f"    x = x + {j}\n" for j in range(12)) + "    return x\n" for i in range(20)]
    doc = doc_of("import os\n\n\n" + "\n\n".join(funcs), kind="code", path="m.py")
    chunks = chunk_document(doc, chunk_tokens=200, overlap_tokens=0)
    check_invariants(doc, chunks, 200, 0)
    lines = lines_of(doc)
    assert all(lines[c.span.line_start - 1].startswith("def ") for c in chunks[1:])


def test_a_chunk_is_named_by_the_section_of_its_own_text_not_its_overlap() -> None:
    """A chunk that ended where a definition began left the next one to start a few lines
    back in the function before, whose trail it took: 111 of click's 521 chunks, one
    holding HelpFormatter's __init__ indexed and shown as "def wrap_text"."""
    funcs = [f"def f{i}(x):\n" + "".join(f"    x = x + {j}\n" for j in range(12)) + "    return x\n" for i in range(20)]
    doc = doc_of("import os\n\n\n" + "\n\n".join(funcs), kind="code", path="m.py")
    chunks = chunk_document(doc, chunk_tokens=200, overlap_tokens=32)
    lines = lines_of(doc)
    overlapped = [c for c in chunks[1:] if not lines[c.span.line_start - 1].startswith("def ")]
    assert overlapped  # the overlap starts inside the function before
    for c in overlapped:
        first_def = next(line for line in c.text.split("\n") if line.startswith("def "))
        assert c.section == first_def.removesuffix(":").removesuffix("(x)"), (c.section, first_def)


def test_a_chunk_is_named_by_the_declaration_holding_most_of_its_own_text() -> None:
    """A chunk whose own text began with a function's last lines and went on with the next
    function's body was named after the first: click's format_filename indexed and cited
    as "def open_file"."""
    tail = "def opener(x):\n" + "".join(f"    x = x + {j}\n" for j in range(30)) + "    return x\n"
    body = "def formatter(name):\n" + "".join(f"    name = name.replace('{j}', '-')\n" for j in range(14)) + "    return name\n"
    doc = doc_of(tail + "\n\n" + body, kind="code", path="m.py")
    chunks = chunk_document(doc, chunk_tokens=220, overlap_tokens=0)
    holding = [c for c in chunks if "def formatter" in c.text]
    assert len(holding) == 1 and holding[0].text.count("\n    x = x +") >= 1  # it starts in opener's body
    assert holding[0].section == "def formatter"
    assert chunks[0].section == "def opener"


def test_token_budget_beats_nice_breaks() -> None:
    doc = doc_of("\n".join(f"sentence {i} without any blank line" for i in range(500)))
    chunks = chunk_document(doc, chunk_tokens=80, overlap_tokens=8)
    check_invariants(doc, chunks, 80, 8)
    assert max(c.n_tokens for c in chunks) <= 80


def test_n_tokens_is_close_to_exact_count() -> None:
    text = (REPO / "sample_docs" / "python-tutorial-3.11.rst").read_text(encoding="utf-8")[:60_000]
    for chunk in chunk_document(doc_of(text), chunk_tokens=256, overlap_tokens=32):
        exact = count_tokens(chunk.text)
        assert exact <= chunk.n_tokens <= exact + chunk.text.count("\n") + 1


# ---- PDFs ----------------------------------------------------------------------------


def pdf_doc(pages: list[str]) -> Document:
    built, offset = [], 0
    for number, text in enumerate(pages, start=1):
        built.append(Page(number, text, offset))
        offset += text.count("\n") + 1
    text = "\n".join(pages)
    return Document("r.pdf", text, "pdf", pages=tuple(built), sha256="f" * 64)


def test_pdf_chunks_never_cross_pages() -> None:
    pages = ["\n".join(f"page {p} line {i} some words here" for i in range(30 + p)) for p in range(1, 6)]
    pages.insert(2, "   ")  # a blank page gets no chunk
    doc = pdf_doc(pages)
    chunks = chunk_document(doc, chunk_tokens=60, overlap_tokens=10)
    lines = lines_of(doc)
    assert {c.span.page for c in chunks} == {1, 2, 4, 5, 6}
    for chunk in chunks:
        page = doc.pages[chunk.span.page - 1]
        first, last = page.line_offset + 1, page.line_offset + page.text.count("\n") + 1
        assert first <= chunk.span.line_start <= chunk.span.line_end <= last
        assert chunk.text == "\n".join(lines[chunk.span.line_start - 1 : chunk.span.line_end])
        assert chunk.span.cite() == f"r.pdf p.{chunk.span.page}"
    for page in doc.pages:
        if page.text.strip():
            page_lines = set(range(page.line_offset + 1, page.line_offset + page.text.count("\n") + 2))
            covered = {n for c in chunks if c.span.page == page.number for n in range(c.span.line_start, c.span.line_end + 1)}
            assert covered == page_lines


def test_sample_pdf_facts_on_their_pages() -> None:
    corpus = load_corpus([str(REPO / "sample_docs" / "harbor-light-annual-report-2023.pdf")])
    (doc,) = corpus.documents
    assert 5 <= len(doc.pages) <= 20
    assert all(p.text.strip() for p in doc.pages)
    chunks = chunk_document(doc, chunk_tokens=128, overlap_tokens=16)

    def pages_with(fact: str) -> set[int]:
        return {c.span.page for c in chunks if fact in c.text.replace("\n", " ")}

    assert pages_with("Q3 revenue was $5.87 million") == {3}
    assert pages_with("Q3 2023 | 5.87 | 39.6% | 74,300") == {3}  # a table row, whole
    assert pages_with("opened on 14 September 2023") == {5}
    assert pages_with("Beacon 7 storm lantern remains our best seller") == {4}


# ---- whole corpus, determinism, speed --------------------------------------------------


def test_a_corpus_chunks_as_its_documents_do_alone_though_its_line_counts_are_shared(monkeypatch) -> None:
    """chunk_corpus counts each distinct line once across its documents (and empties that
    cache past its bound): each document's chunks are still those it has alone."""
    from ktcli.ingest import chunking
    from ktcli.types import Corpus

    corpus = load_corpus([str(REPO / "sample_docs")])
    alone = [c for d in corpus.documents for c in chunk_document(d)]
    assert chunk_corpus(corpus) == alone
    monkeypatch.setattr(chunking.LineTokens, "MAX_LINES", 50)
    assert chunk_corpus(corpus) == alone
    shared = "\n".join(["    return None", "", "}", "x = 1"] * 40) + "\n"
    docs = (doc_of(shared, "code", "a.py"), doc_of("# top\n" + shared, "code", "b.py"))
    assert chunk_corpus(Corpus(docs)) == [*chunk_document(docs[0]), *chunk_document(docs[1])]


def test_chunk_corpus_and_determinism() -> None:
    corpus = load_corpus([str(REPO / "sample_docs")])
    first = chunk_corpus(corpus)
    assert first == chunk_corpus(load_corpus([str(REPO / "sample_docs")]))
    by_doc: dict[str, list[Chunk]] = {}
    for chunk in first:
        by_doc.setdefault(chunk.doc_path, []).append(chunk)
    assert set(by_doc) == {d.path for d in corpus.documents}
    for doc in corpus.documents:
        if doc.kind != "pdf":
            check_invariants(doc, by_doc[doc.path], 256, 32)


def test_long_text_sample_is_over_50k_tokens() -> None:
    text = (REPO / "sample_docs" / "python-tutorial-3.11.rst").read_text(encoding="utf-8")
    assert count_tokens(text) > 50_000


def test_million_tokens_load_and_chunk_fast(tmp_path: Path) -> None:
    base = (REPO / "sample_docs" / "python-tutorial-3.11.rst").read_text(encoding="utf-8")
    # vary each copy so the per-line cache cannot make this look cheaper than real text
    text = "".join(base.replace("Python", f"Python{i}") for i in range(16))
    path = tmp_path / "big.rst"
    path.write_text(text, encoding="utf-8")
    start = time.perf_counter()
    corpus = load_corpus([str(path)])
    chunks = chunk_corpus(corpus)
    elapsed = time.perf_counter() - start
    assert count_tokens(text) > 1_000_000
    assert elapsed < 20, f"{elapsed:.1f}s for 1M tokens"
    assert chunks[-1].span.line_end == corpus.documents[0].n_lines


# ---- property test -------------------------------------------------------------------

_line = st.one_of(
    st.just(""),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"), max_size=60),
    st.from_regex(r"#{1,3} [A-Za-z ]{1,20}", fullmatch=True),
    st.from_regex(r"def [a-z]{1,8}\(\):", fullmatch=True),
    st.text(alphabet="abcdefghij ,;{}", min_size=150, max_size=600),  # long "minified" lines
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(_line, min_size=1, max_size=80),
    trailing_newline=st.booleans(),
    chunk_tokens=st.integers(min_value=4, max_value=120),
    overlap_fraction=st.floats(min_value=0, max_value=0.9),
    kind=st.sampled_from(["text", "markdown", "code"]),
)
def test_chunking_invariants_property(
    lines: list[str], trailing_newline: bool, chunk_tokens: int, overlap_fraction: float, kind: str
) -> None:
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    doc = doc_of(text, kind=kind)
    overlap = int(chunk_tokens * overlap_fraction)
    chunks = chunk_document(doc, chunk_tokens=chunk_tokens, overlap_tokens=overlap)
    if not text:
        assert chunks == []
        return
    check_invariants(doc, chunks, chunk_tokens, overlap)
    assert chunks == chunk_document(doc, chunk_tokens=chunk_tokens, overlap_tokens=overlap)


def test_a_long_line_is_cut_after_sentences_and_between_words() -> None:
    """A CJK paragraph is one line past the chunk size as often as not: cut at token
    offsets, its pieces began mid-word (护等方面 of 环境保护) and names fell in halves."""
    zh = "本报告介绍了城市管理部门在本年度的总体情况和主要工作任务，包括交通、教育、医疗和环境保护等方面的内容。" * 12
    en = " ".join(f"Sentence {i} of the long paragraph says something about lighthouse number {i}." for i in range(60))
    for line, ends in ((zh, ("。",)), (en, (". ",))):
        doc = doc_of(f"# Heading\n\n{line}\n")
        chunks = chunk_document(doc, chunk_tokens=128, overlap_tokens=16)
        check_invariants(doc, chunks, 128, 16)
        pieces = [c for c in chunks if c.span.line_start == 3]
        assert len(pieces) > 3
        assert all(p.text.endswith(ends) for p in pieces[:-1]), [p.text[-12:] for p in pieces]
        assert all(line[p.char_start - 1] in "。、， " for p in pieces[1:]), "each piece starts a sentence or a word"
        ends_at = [p.char_start + len(p.text) for p in pieces]
        assert ends_at == sorted(ends_at) and pieces[-1].text.endswith(line[-10:])
        assert all(0 < b.char_start < a.char_start + len(a.text) for a, b in zip(pieces, pieces[1:])), "pieces overlap"


def test_a_long_lines_pieces_count_every_token_they_touch() -> None:
    """A CJK character is often two or three tokens, the first shared with the character
    before: counted by character offsets, a piece starting there left that token out (231
    counted, 232 there)."""
    from ktcli.ingest.chunking import _split_long_line
    from ktcli.ingest.tokens import encoding

    enc = encoding()
    for line in ("境外投资项目需要经过严格审批，相关部门应当加强监督管理。" * 40, "环境保护是一个重要的问题。" * 30,
                 "Emoji 😀 and 𝔘nicode " * 80):
        ids = enc.encode_ordinary(line)
        ends = [0]
        for piece in enc.decode_tokens_bytes(ids):
            ends.append(ends[-1] + len(piece))
        for budget, overlap in ((256, 32), (8, 7), (16, 0)):
            for p in _split_long_line(line, 0, budget, overlap):
                first = len(line[: p.char_start].encode())
                last = first + len(p.text.encode())
                touched = sum(1 for k in range(len(ids)) if ends[k] < last and ends[k + 1] > first)
                assert p.n_tokens == touched <= budget, (budget, overlap, p)


def test_a_last_chunk_holds_more_than_a_tail_of_a_few_lines():
    """A page's last chunk was the overlap and a line or two (51-63 tokens of 256), and
    BM25 ranked such tails over whole passages: 7 of 8 evidence slots."""
    words = ["tides", "lanterns", "fog", "keepers", "ships", "bells", "charts", "gulls", "reefs", "storms"]
    lines = [f"Line {i} says something about the {words[i % 10]} of the harbor today." for i in range(26)]
    text = "\n".join(lines)
    page = Document(path="p.pdf", text=text, kind="pdf", pages=(Page(1, text),), sha256="0" * 64)
    chunks = chunk_document(page, chunk_tokens=64, overlap_tokens=8)
    check_invariants(page, chunks, 64, 8)
    assert chunks[-1].span.line_end == 26 and chunks[-1].n_tokens >= 32
    assert all(c.n_tokens <= 64 for c in chunks)
    # a file's one tail is left as it was (filled out, a code file's repeated the chunk before it)
    plain = chunk_document(doc_of(text + "\n"), chunk_tokens=64, overlap_tokens=8)
    assert plain[-1].n_tokens < 32


def test_csv_rows_with_line_breaks_in_quoted_cells_are_not_cut() -> None:
    """A probe's tickets, each description three lines in a quoted cell: 85 of 86 chunks
    began inside a row ("Line B: ... error E006"), its ticket number in the chunk before."""
    rows = ["ticket,customer,description"] + [
        f'T{i:04d},Customer {i},"Line A of ticket {i}.\nLine B: error E{i:03d}.\nLine C: closed by ""Ava""."'
        for i in range(300)]
    doc = doc_of("\n".join(rows) + "\n", path="tickets.csv")
    chunks = chunk_document(doc, chunk_tokens=128, overlap_tokens=16)
    check_invariants(doc, chunks, 128, 16)
    assert len(chunks) > 10
    for chunk in chunks:
        assert chunk.text.startswith(("T0", "ticket,")), chunk.text[:40]
        assert chunk.text.endswith('""Ava""."'), chunk.text[-40:]
