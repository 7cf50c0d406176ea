"""The stderr figures line: what a user reads after every answer."""

import json
from dataclasses import replace

from ktcli.render.formats import answer_json, citations_text, figures_line, plan_lines
from ktcli.types import Answer, FileMap, Mode, Plan


def _answer(**stats) -> Answer:
    plan = Plan(mode=Mode("full"), task="ask", input_tokens=900, question_tokens=9, context_window=8192,
                answer_budget=256, evidence_budget=7000, n_documents=1, n_chunks=0, n_windows=1, top_k=0,
                est_seconds=3.0, est_memory_bytes=1 << 30)
    return Answer(text="x", citations=(), plan=plan, stats=stats)


def test_figures_line_names_a_bf16_prefill():
    base = dict(tokens_in=1200, tokens_out=40, ttft_s=1.5, prefill_tok_s=1150.4, decode_tok_s=60.2, total_s=2.2,
                peak_rss_mb=700)
    line = figures_line(_answer(**base, prefill_dtype="bf16"))
    assert "prefill 1150 tok/s (bf16)" in line and "mode full" in line and "decode 60.2 tok/s" in line
    assert "prefill 1150 tok/s ·" in figures_line(_answer(**base, prefill_dtype="fp32"))
    assert "(bf16)" not in figures_line(_answer(**base))  # other backends report no prefill dtype


def test_the_gpus_peak_is_named_in_mib_as_the_rss_is():
    """`peak_gpu_mb` is torch's peak allocation / 2**20, as `peak_rss_mb` is getrusage's KiB
    / 1024: the line said "peak RSS 700 MiB · peak GPU 1149 MB" for the same unit."""
    line = figures_line(_answer(tokens_in=10, tokens_out=2, peak_rss_mb=700, peak_gpu_mb=1148.9))
    assert "peak RSS 700 MiB" in line and "peak GPU 1149 MiB" in line


def test_no_prefill_rate_where_it_would_mislead():
    base = dict(tokens_in=2106, tokens_out=20, ttft_s=2.4, prefill_tok_s=18.0, decode_tok_s=77.5, total_s=2.6,
                peak_rss_mb=551)
    cached = figures_line(_answer(**base, reused_tokens=2077))
    assert "tokens in 2,106 (2,077 read from the prompt cache) / out 20" in cached and "prefill" not in cached
    assert "prefill" not in figures_line(_answer(**base, backend="openai"))
    assert "prefill 18 tok/s" in figures_line(_answer(**base))
    # a server that sent the answer in one piece: no decode time to divide by ("decode 88171.1 tok/s")
    assert "decode" not in figures_line(_answer(**base | {"decode_tok_s": 0.0}, backend="openai"))


def test_figures_name_the_windows_whose_notes_came_from_the_cache():
    base = dict(tokens_in=329, tokens_out=120, ttft_s=3.5, prefill_tok_s=1016.0, decode_tok_s=32.9, total_s=7.2,
                peak_rss_mb=517)
    assert figures_line(_answer(**base, notes_kept=8)).endswith(" · notes of 8 windows from the cache")
    assert "notes of 1 window from" in figures_line(_answer(**base, notes_kept=1))
    assert "notes" not in figures_line(_answer(**base, notes_kept=0))


def test_memory_units_match_and_a_server_plans_none_here():
    plan = _answer().plan
    assert "estimate    ~3 s, ~1.0 GiB memory" in plan_lines(plan)
    assert "peak RSS 700 MiB" in figures_line(_answer(tokens_in=1, tokens_out=1, peak_rss_mb=700))
    remote = replace(plan, est_memory_bytes=0)  # --backend openai reading whole: nothing loaded here
    assert "estimate    ~3 s, memory on the server" in plan_lines(remote)


def test_long_estimates_read_in_minutes_and_hours():
    from ktcli.render.formats import duration

    assert [duration(s) for s in (3, 599, 600, 5969, 5970, 27559)] == ["3 s", "599 s", "10 min", "99 min", "1.7 h",
                                                                       "7.7 h"]
    plan = replace(_answer().plan, est_seconds=30000.0, est_first_token_seconds=27559.0)
    assert "estimate    first token in ~7.7 h, ~8.3 h with all" in "\n".join(plan_lines(plan))  # was "~27559 s"


def test_sources_name_the_last_two_levels_of_a_section_and_json_the_whole_trail():
    import json
    from dataclasses import replace

    from ktcli.render.formats import answer_json, citations_text
    from ktcli.types import Citation, Span

    cites = (Citation("t.rst:9-12", Span("t.rst", 9, 12), section="Tutorial > Classes > Class Objects"),
             Citation("r.pdf p.2", Span("r.pdf", None, None, 2)))
    answer = replace(_answer(), citations=cites)
    assert citations_text(answer).splitlines()[-2:] == [
        "  [1] t.rst:9-12  (Classes > Class Objects)", "  [2] r.pdf p.2"]
    assert json.loads(answer_json(answer))["citations"][0]["section"] == "Tutorial > Classes > Class Objects"
    said = ["the model wrote nothing from the input in the notes of its 6 parts, so no summary is written from them"]
    assert json.loads(answer_json(answer))["warnings"] == [] and json.loads(answer_json(answer, said))["warnings"] == said
    # a TSV's header row is kept with its tabs for the model; a terminal shows its columns
    tsv = replace(answer, citations=(Citation("t.tsv:3-4", Span("t.tsv", 3, 4), section="columns: id\tname\tcity"),))
    assert citations_text(tsv).splitlines()[-1] == "  [1] t.tsv:3-4  (columns: id, name, city)"


def test_the_estimate_gives_the_first_token_and_the_whole_budget():
    """The total alone read as a prediction: ~11 s for an answer that took 2."""
    plan = replace(_answer().plan, est_seconds=23.4, est_first_token_seconds=1.84)
    assert "estimate    first token in ~1.8 s, ~23 s with all 256 tokens of the answer budget, ~1.0 GiB memory" in plan_lines(plan)
    assert "first token in ~42 s," in "\n".join(plan_lines(replace(plan, est_first_token_seconds=41.7)))


def test_sources_are_numbered_as_the_model_read_them():
    """The answer says "[3]": Sources were renumbered 1..n, so its [3] pointed at nothing
    or at another source."""
    import json

    from ktcli.render.formats import answer_json, citations_text
    from ktcli.types import Citation, Span

    cites = (Citation("big.txt:4923-4948", Span("big.txt", 4923, 4948), label=17),
             Citation("big.txt:19367", Span("big.txt", 19367, 19367), label=3),
             Citation("big.txt:19380", Span("big.txt", 19380, 19380), label=3))
    answer = replace(_answer(), citations=cites)
    assert citations_text(answer).splitlines()[-3:] == [  # in label order, as footnotes
        "  [3]  big.txt:19367", "       big.txt:19380", "  [17] big.txt:4923-4948"]
    assert [c["label"] for c in json.loads(answer_json(answer))["citations"]] == [17, 3, 3]


def test_an_answer_cut_inside_a_code_block_has_it_closed_before_the_sources():
    from ktcli.render.formats import citations_text
    from ktcli.types import Citation, Span

    cites = (Citation("a.py:1-3", Span("a.py", 1, 3)),)
    cut = replace(_answer(), text="Use this:\n```python\ndef f(x):\n    return", citations=cites)
    assert citations_text(cut).startswith("\n```\n\nSources:")
    whole = replace(cut, text="Use this:\n```python\nf(x)\n```\nDone.")
    assert citations_text(whole).startswith("\n\nSources:")
    assert citations_text(replace(cut, citations=())) == "\n```"


def test_an_answer_nothing_was_traced_to_names_what_was_read():
    """No sentence matched a line: the answer came with no sources at all, though the
    evidence it read (click's `def echo`) was right."""
    from ktcli.render.formats import citations_text

    evidence = [{"ref": f"click/utils.py:{i * 30 + 1}-{i * 30 + 30}"} for i in range(10)]
    text = citations_text(replace(_answer(evidence=evidence), text="It is defined in the utils module."))
    assert text.splitlines()[2:5] == ["Read (no sentence of the answer matched a line of it):",
                                      "  click/utils.py:1-30", "  click/utils.py:31-60"]
    assert text.splitlines()[-1] == "  ... and 2 more"
    # nothing said, nothing to check: no list of what was read, only that there is no answer
    assert citations_text(replace(_answer(evidence=evidence), text=" ")) == "No answer: the model wrote none."
    assert citations_text(_answer()) == ""  # no evidence figures (a summary)
    # a PDF page's passages share its ref: each place once, with how many came from it
    pages = [{"ref": "paper.pdf p.219 (page 3 of the file)"}] * 4 + [{"ref": "paper.pdf p.220 (page 4 of the file)"}]
    text = citations_text(replace(_answer(evidence=pages), text="It is on a page."))
    assert text.splitlines()[3:] == ["  paper.pdf p.219 (page 3 of the file)  (4 passages)",
                                     "  paper.pdf p.220 (page 4 of the file)"]


def test_a_place_cited_twice_is_listed_once():
    from ktcli.render.formats import citations_text
    from ktcli.types import Citation, Span

    twice = (Citation("churn.ipynb:1", Span("churn.ipynb", 1, 1), label=1),
             Citation("churn.ipynb:1", Span("churn.ipynb", 1, 1), label=1),
             Citation("notes.md:4", Span("notes.md", 4, 4), label=2))
    assert citations_text(replace(_answer(), citations=twice)).splitlines()[-2:] == [
        "  [1] churn.ipynb:1", "  [2] notes.md:4"]
    unlabelled = tuple(replace(c, label=0) for c in twice)  # a summary's, numbered in order
    assert citations_text(replace(_answer(), citations=unlabelled)).splitlines()[-2:] == [
        "  [1] churn.ipynb:1", "  [2] notes.md:4"]


def test_json_citations_say_what_their_numbers_count():
    """An EPUB chapter's number sat in `page` and a Word paragraph's in `line_start`, with
    nothing in --json to tell them from a PDF page or a text line."""
    import json

    from ktcli.render.formats import answer_json
    from ktcli.types import CHAPTER, PARAGRAPH, Citation, Span

    spans = (Span("r.pdf", None, None, 2), Span("b.epub", None, None, 3, CHAPTER), Span("m.docx", 12, 12, None, PARAGRAPH),
             Span("a.py", 4, 9), Span("<stdin>"))
    answer = replace(_answer(), citations=tuple(Citation(s.cite(), s) for s in spans))
    assert [c["unit"] for c in json.loads(answer_json(answer))["citations"]] == [
        "page", "chapter", "paragraph", "line", None]


def test_json_lists_each_citation_once_as_the_sources_do():
    """A heading and its paragraph from one HTML source line: --json listed it twice."""
    import json

    from ktcli.render.formats import answer_json, citations_text
    from ktcli.types import Citation, Span

    span = Span("minutes.html", 4, 4)
    answer = replace(_answer(), citations=(Citation("minutes.html:4", span, label=1),
                                           Citation("minutes.html:4", span, label=1), Citation("a.py:9", Span("a.py", 9, 9), label=2)))
    assert [c["ref"] for c in json.loads(answer_json(answer))["citations"]] == ["minutes.html:4", "a.py:9"]
    assert citations_text(answer).count("minutes.html:4") == 1


def test_a_summary_in_parts_is_said_to_read_every_chunk():
    """"mode retrieval" read as a summary of a few retrieved passages."""
    from ktcli.types import Mode

    plan = replace(_answer().plan, mode=Mode.RETRIEVAL, task="summarize")
    assert plan_lines(plan)[0] == ("mode        retrieval (a summary in parts: every chunk read, window by window, "
                                   "notes passed on, then the summary)")
    assert plan_lines(replace(plan, task="ask"))[0] == "mode        retrieval"
    answer = _answer()
    assert figures_line(replace(answer, plan=plan)).startswith("summary in parts · tokens in")  # the figures too
    assert figures_line(replace(answer, plan=replace(plan, task="ask"))).startswith("mode retrieval · ")


def test_a_sparse_policy_in_the_window_is_shown_in_the_plan():
    plan = _answer().plan
    assert not any(line.startswith("kv cache") for line in plan_lines(plan))  # dense, the model's pages
    assert "kv cache    the model's default pages, topk:8 attention" in plan_lines(replace(plan, attention="topk:8"))
    assert "kv cache    int4 pages, dense attention" in plan_lines(replace(plan, kv_dtype="int4"))


def test_a_summary_of_files_lists_what_each_says_before_its_sources():
    files = FileMap((("repo/README.md", 1, "shelf: A tiny catalogue."), ("repo/src/shelf/storage.py", 1, "Loading and saving.")),
                    folder="repo", unlisted=2)
    answer = replace(_answer(), files=files)
    text = citations_text(answer)
    assert text.split("\n")[2:6] == ["Files in repo/ (each in its own words, or what it defines):",
                                     "  README.md:1             shelf: A tiny catalogue.",
                                     "  src/shelf/storage.py:1  Loading and saving.",
                                     "  ... and 2 more"]
    data = json.loads(answer_json(answer))
    assert data["files"][1] == {"path": "repo/src/shelf/storage.py", "line": 1, "says": "Loading and saving."}
    assert data["files_unlisted"] == 2
    assert "files" not in json.loads(answer_json(_answer())) and "Files" not in citations_text(_answer())


def test_with_no_answer_what_follows_it_has_no_blank_lines_above():
    """man-db's docs, of which the model wrote nothing, printed two blank lines and then the
    summary's file map (probe 117)."""
    files = FileMap((("d/FAQ", 1, "Frequently Asked Questions."), ("d/TODO", 1, "In progress:")), folder="d", unlisted=0)
    summary = _answer()
    empty = replace(summary, text="", files=files, plan=replace(summary.plan, task="summarize"))
    assert citations_text(empty).startswith("Files in d/ (each in its own words")
    assert citations_text(replace(empty, text="It is a pager.")).startswith("\n\nFiles in d/")
    assert citations_text(replace(empty, files=None)) == ""


def test_a_run_with_no_answer_text_has_no_first_token_time():
    """Probe 124: interrupted before its first token, a run's figures said ttft 0.0."""
    from ktcli.pipeline.runner import Tally

    assert Tally().figures()["ttft_s"] is None
    assert "ttft" not in figures_line(_answer(tokens_in=10, tokens_out=0, ttft_s=None, total_s=1.0))
    assert "ttft 1.5s" in figures_line(_answer(tokens_in=10, tokens_out=2, ttft_s=1.5, total_s=2.0))


def test_the_figures_line_says_what_the_index_left_for_later_questions():
    base = dict(tokens_in=2106, tokens_out=20, peak_rss_mb=551, index_bytes=4 << 20, embedded_now=1000, reused=12)
    assert "(1,000 embedded now, 12 reused)" in figures_line(_answer(**base))
    assert "(1,000 embedded now, 12 reused, 1,331 left for later questions)" in figures_line(
        _answer(**base, not_embedded=1331))


def test_an_answer_of_labels_alone_is_said_to_be_none_and_cites_nothing():
    """`ktcli ask minirepo "What is the capital of France?"` printed "[1]", then the
    not-found notice and `.gitignore` under Sources: a label is no answer (the pipeline
    gives its text as "" and its labels in `labels_only`), and stdout says so."""
    from ktcli.types import Citation, Span

    gitignore = Citation(ref="minirepo/.gitignore", span=Span("minirepo/.gitignore"), label=1)
    none = replace(_answer(labels_only="[1]"), text="", citations=(gitignore,))
    assert citations_text(none) == "No answer: the model wrote only a source label ([1]), no words, so nothing is cited."
    unmatched = replace(none, not_in_documents=True, grounding={"question_match": 0.1})
    assert citations_text(unmatched).endswith("no words, so nothing is cited. Not found in the documents: nothing "
                                              "read matches the question well.")
    named = replace(unmatched, grounding={"question_match": 0.9, "names_unread": ["Germany"]})
    assert citations_text(named).endswith("Not found in the documents: Germany stands nowhere in the input.")
    assert "Sources" not in citations_text(unmatched) and ".gitignore" not in citations_text(unmatched)
    data = json.loads(answer_json(replace(unmatched, citations=())))
    assert data["answer"] == "" and data["citations"] == [] and data["figures"]["labels_only"] == "[1]"
