import pytest

from ktcli.errors import UsageError
from ktcli.pipeline.prompts import evidence_block
from ktcli.pipeline.windows import merge_neighbours, pack, refit, source_order
from ktcli.types import Chunk, Span


def count(text):
    return len(text.split())


def make(path, ordinal, start, lines):
    return Chunk(path, ordinal, "\n".join(lines), Span(path, start, start + len(lines) - 1), len(lines), "s" * 64)


def test_source_order_follows_corpus_then_position():
    a1, a0, b0 = make("a", 1, 5, ["x"]), make("a", 0, 1, ["y"]), make("b", 0, 1, ["z"])
    assert source_order([b0, a1, a0], {"a": 0, "b": 1}) == [a0, a1, b0]


def test_neighbours_merge_without_repeating_overlap():
    first = make("doc", 0, 1, ["l1", "l2", "l3"])
    second = make("doc", 1, 3, ["l3", "l4", "l5"])  # overlaps on line 3
    merged = merge_neighbours([first, second], 100, count)
    assert len(merged) == 1
    assert merged[0].text == "l1\nl2\nl3\nl4\nl5"
    assert (merged[0].span.line_start, merged[0].span.line_end) == (1, 5)


def test_a_merged_passage_keeps_every_line_at_its_number():
    # The chunker ends chunks at blank lines before a heading; the merge stripped them and
    # every later line moved up (citations two lines above their text). Three neighbours
    # make one passage (the third was kept apart, its first line read twice).
    doc = ["## A", "a1", "a2", "", "", "## B", "b1", "b2", "", "## C", "c1", ""]
    chunks = [make("doc", 0, 1, doc[0:5]), make("doc", 1, 5, doc[4:9]), make("doc", 2, 9, doc[8:12])]
    (merged,) = merge_neighbours(chunks, 100, count)
    assert (merged.span.line_start, merged.span.line_end) == (1, 12)
    assert merged.text.split("\n") == doc


def test_gaps_and_other_documents_do_not_merge():
    a = make("doc", 0, 1, ["l1"])
    gap = make("doc", 2, 10, ["l10"])
    other = make("other", 1, 2, ["x"])
    assert len(merge_neighbours([a, gap, other], 100, count)) == 3


def test_merge_respects_budget():
    first = make("doc", 0, 1, ["a b c"])
    second = make("doc", 1, 2, ["d e f"])
    assert len(merge_neighbours([first, second], 4, count)) == 2


def test_pack_keeps_order_and_budget():
    chunks = [make("d", i, i * 10 + 1, ["w " * 5]) for i in range(5)]
    windows = pack(chunks, 40, count)
    assert [c for w in windows for c in w] == chunks
    assert all(sum(_sent(c) for c in w) <= 40 for w in windows if len(w) > 1)


def _sent(c):
    return count(evidence_block([(999, c.span.cite(), c.text)])) + 1


def test_pack_counts_each_passage_in_its_tag():
    """Tags were counted as 12 tokens: with deep paths and short files they are most of a
    window, and a summary of 400 small files sent 9K-token prompts into an 8K window."""
    path = "src/project_package/handlers/request_handler_module_{:03d}.py"
    chunks = [make(path.format(i), 0, 1, ["x = 1"]) for i in range(40)]
    windows = pack(chunks, 100, count)
    whole = [evidence_block([(i + 1, c.span.cite(), c.text) for i, c in enumerate(w)]) for w in windows]
    assert all(count(text) <= 100 for text in whole)
    assert len(windows) > 40 * 5 // 100  # the text alone (5 words a passage) would fit five windows


def test_refit_cuts_a_window_whose_prompt_is_over():
    chunks = [make("d", i, i + 1, [f"line {i}"]) for i in range(7)]
    windows = refit([chunks[:5], chunks[5:]], lambda w: len(w) <= 2)
    assert windows == [chunks[0:2], chunks[2:4], chunks[4:5], chunks[5:7]]
    # One passage that does not fit alone is refused, not sent (the engine failed "KV cache
    # full" after the model had loaded and the index been built).
    with pytest.raises(UsageError, match=r"a passage of the input \(d:1\) does not fit .* --chunk-tokens"):
        refit([chunks[:1]], lambda w: False)
    with pytest.raises(UsageError):
        refit([chunks[:3]], lambda w: False)


def test_pieces_of_one_long_line_join_without_their_shared_text():
    """A line past the chunk size is cut into pieces sharing an eighth; read in a row they
    were each read whole (a summary of a one-line 593K-character file read 14% twice)."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    line = " ".join(f"w{i}" for i in range(3000))
    doc = document_from_bytes((line + "\nshort tail\n").encode(), "one.txt", "one.txt")
    chunks = list(chunk_document(doc, chunk_tokens=256, overlap_tokens=32))
    pieces = [c for c in chunks if c.span.line_start == c.span.line_end == 1]
    assert len(pieces) > 3 and sum(len(p.text) for p in pieces) > 1.1 * len(line)
    merged = merge_neighbours(chunks, 100_000, count)
    assert [m.text for m in merged] == [line + "\nshort tail"]  # and the next line joins as lines do
    assert (merged[0].span.line_start, merged[0].span.line_end) == (1, 2)
    # a budget stops the join where it would pass it, and the rest stays in order
    small = merge_neighbours(pieces, 600, count)
    assert len(small) > 1 and "".join(p.text for p in small).count("w2999") == 1
    # each joined passage names the characters it holds; the one joined to the next line, none
    assert all(line[p.span.chars[0]:p.span.chars[1]] == p.text for p in small)
    assert merged[0].span.chars is None and merged[0].span.cite() == "one.txt:1-2"


def test_pieces_of_a_line_that_repeats_lose_nothing_when_joined():
    """In "aaaa..." the shared text matches at every place: a join by searching for it
    dropped all of the next piece (300,000 characters read as 2,048), or read a tenth twice."""
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes

    for line in ("a" * 300_000, "ab" * 100_000, "0123456789 " * 20_000):
        doc = document_from_bytes((line + "\n").encode(), "r.txt", "r.txt")
        merged = merge_neighbours(chunk_document(doc), 10**9, count)
        assert [m.text for m in merged] == [line]  # neither lost nor read twice


def paged(ordinal, page, start, lines, unit=""):
    return Chunk("r.pdf", ordinal, "\n".join(lines), Span("r.pdf", start, start + len(lines) - 1, page, unit), len(lines))


def test_a_sentence_over_a_page_break_is_read_whole_from_either_half():
    """A PDF's chunks stay within a page: a sentence running on to the next was cut in two,
    and a passage read "... signed by the" without "board on 3 March."."""
    from ktcli.pipeline.windows import across_page_breaks

    p5 = paged(0, 5, 1, ["Rent is due monthly.", "The lease was signed by the"])
    p6 = paged(1, 6, 3, ["board on 3 March. It runs", "for ten years.", "Tenants may sublet."])
    p7 = paged(2, 7, 6, ["Parking is free."])
    chunks = [p5, p6, p7]
    (end,) = across_page_breaks([p5], chunks, count)
    assert end.text == "Rent is due monthly.\nThe lease was signed by the\nboard on 3 March. It runs"
    assert (end.span.page, end.span.line_start, end.span.line_end) == (5, 1, 3)  # its lines, on its page
    assert end.n_tokens == count(end.text)
    (start,) = across_page_breaks([p6], chunks, count)
    assert start.text == "The lease was signed by the\nboard on 3 March. It runs\nfor ten years.\nTenants may sublet."
    assert (start.span.page, start.span.line_start, start.span.line_end) == (6, 2, 5)
    assert across_page_breaks([p5, p6], chunks, count) == [p5, p6]  # both read, in a row: nothing carried
    assert across_page_breaks([p7], chunks, count) == [p7]  # "Tenants may sublet." ended its sentence
    # A next page in capitals (a heading, a new paragraph), a table row, a gap of pages,
    # a sentence not ended within three lines, an EPUB's chapters: left as they are.
    capital = paged(1, 6, 3, ["Board minutes follow."])
    assert across_page_breaks([p5], [p5, capital], count) == [p5]
    row = paged(0, 5, 1, ["Lamp | 40 EUR | in stock"])
    assert across_page_breaks([row], [row, p6], count) == [row]
    assert across_page_breaks([p5], [p5, paged(1, 7, 3, ["board on 3 March."])], count) == [p5]
    endless = paged(1, 6, 3, ["board", "on", "3", "March."])
    assert across_page_breaks([p5], [p5, endless], count) == [p5]
    chapters = [paged(0, 5, 1, ["signed by the"], "chapter"), paged(1, 6, 2, ["board on 3 March."], "chapter")]
    assert across_page_breaks(chapters[:1], chapters, count) == chapters[:1]
