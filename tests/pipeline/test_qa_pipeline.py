"""The QA and summary pipelines end to end on the real ingest and retrieval, with a fake
model, so that window packing and memory passing are checked exactly and quickly."""

import re
from dataclasses import replace

import pytest

from ktcli.config import Settings
from ktcli.engine.backend import SamplingParams
from ktcli.errors import UsageError
from ktcli.ingest import count_tokens
from ktcli.pipeline import prompts
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.pipeline.summarize import summarize
from ktcli.types import Mode

from .fake_backend import FakeBackend

NEEDLE = "The vault combination is 31-07-1999 and only the curator knows it."


@pytest.fixture
def haystack(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(6):
        lines = [f"Paragraph {i}-{j}: the museum opens at nine and the gardens close at dusk." for j in range(40)]
        if i == 4:
            lines.insert(27, NEEDLE)
        (folder / f"part{i}.txt").write_text("\n".join(lines) + "\n")
    return folder


def settings_for(tmp_path, **kw):
    kw.setdefault("mode", "retrieval")  # the haystack is small enough to fit a window
    return replace(Settings(), cache_dir=str(tmp_path / "cache"), **kw)


def test_retrieval_answer_cites_the_needle_line(haystack, tmp_path):
    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    assert prep.plan.mode is Mode.RETRIEVAL
    backend = FakeBackend()
    answer = answer_question(prep, backend, settings, NullReporter(), Tally())
    assert "31-07-1999" in answer.text
    needle_path = str(haystack / "part4.txt")
    assert any(c.span.path == needle_path and c.span.line_start <= 28 <= c.span.line_end for c in answer.citations)
    assert answer.stats["retrieved"] == settings.top_k
    # Each source reaches the model wrapped in tags that carry its label and reference
    # (prompts.evidence_block), the labels the answer cites.
    prompt = backend.calls[-1][-1]["content"]
    labels = re.findall(r'<source id="(\d+)" ref="([^"]+)">\n', prompt)
    assert [int(n) for n, _ in labels] == list(range(1, len(labels) + 1))
    assert prompt.count("</source>") == len(labels) > 0
    assert any(ref.startswith(needle_path + ":") for _, ref in labels)
    # each passage retrieved names the source the model read it in (merged ones share one)
    refs = dict(labels)
    for e in answer.stats["evidence"]:
        source = refs[str(e["label"])]
        path, lines = source.rsplit(":", 1)
        first, _, last = lines.partition("-")
        assert path == e["path"] and int(first) <= e["line_start"] <= e["line_end"] <= int(last or first)


def test_memory_passing_carries_a_fact_across_windows(haystack, tmp_path):
    # A tiny window forces several evidence windows; the fact must survive in the notes.
    settings = settings_for(tmp_path, top_k=12)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, evidence_budget=200))
    backend = FakeBackend()
    answer = answer_question(small, backend, settings, NullReporter(), Tally())
    assert answer.stats["windows"] > 1
    assert len(backend.calls) == answer.stats["windows"]
    assert "31-07-1999" in answer.text
    # the final call saw the notes, not only its own window
    assert "Notes gathered from earlier sources" in backend.calls[-1][-1]["content"] or NEEDLE in backend.calls[-1][-1]["content"]


def test_second_question_reuses_the_index(haystack, tmp_path):
    settings = settings_for(tmp_path)
    first = prepare([str(haystack)], "When do the gardens close?", "ask", settings, NullReporter())
    a1 = answer_question(first, FakeBackend(), settings, NullReporter(), Tally())
    second = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    said = StatusLog()
    a2 = answer_question(second, FakeBackend(), settings, said, Tally())
    assert a1.stats["embedded_now"] > 0
    assert a2.stats["embedded_now"] == 0
    # and says so, instead of "indexing N chunks" over work it does not do
    assert f"index of {a2.stats['reused']:,} chunks reused from the cache" in said.lines


class Warnings(NullReporter):
    def __init__(self):
        self.lines = []

    def warn(self, message):
        self.lines.append(message)


class Shown(Warnings):
    """The warnings, and the answer's text as it streams."""

    def __init__(self):
        super().__init__()
        self.shown = []

    def answer_text(self, delta):
        self.shown.append(delta)


class StatusLog(NullReporter):
    def __init__(self):
        self.lines = []

    def status(self, message):
        self.lines.append(message)


def test_summary_reads_every_window_and_reduces(haystack, tmp_path):
    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    backend = FakeBackend()
    answer = summarize(small, backend, settings, NullReporter(), Tally())
    n_windows = answer.stats["windows"]
    assert n_windows > 1
    assert len(backend.calls) == n_windows + 1  # every window mapped, then one reduce
    seen = "".join(m[-1]["content"] for m in backend.calls[:-1])
    assert NEEDLE in seen  # nothing was skipped on the way
    assert "Files:" in backend.calls[-1][-1]["content"]  # a folder's summary sees its listing


def test_a_summarys_sources_are_numbered_by_document(haystack, tmp_path):
    """As a question read whole numbers them: one by one, a single PDF's pages read as
    "[1] p.1, [2] p.2", two sources."""
    class Summarizing(FakeBackend):
        def _reply(self, messages):
            return "The vault combination is 31-07-1999. The museum opens at nine."

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    answer = summarize(prep, Summarizing(), settings, NullReporter(), Tally())
    order = {d.path: i + 1 for i, d in enumerate(prep.corpus.documents)}
    assert len(answer.citations) > 1 and all(c.label == order[c.span.path] for c in answer.citations)
    assert answer.citations[0].label == order[next(p for p in order if p.endswith("part4.txt"))]


def test_a_summary_no_sentence_of_which_traces_to_a_line_names_what_it_read(haystack, tmp_path):
    """A repo's summary of garbage came with no Sources, no Read block and no evidence in
    --json: nothing to check it against, where an answer names what it read."""
    from ktcli.render.formats import citations_text

    class Rambling(FakeBackend):
        def _reply(self, messages):
            return "Zebras quietly juggle purple xylophones."

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    answer = summarize(prep, Rambling(), settings, NullReporter(), Tally())
    assert not answer.citations
    assert [e["path"] for e in answer.stats["evidence"]] == [d.path for d in prep.corpus.documents]
    shown = citations_text(answer)
    assert "Read (no sentence of the answer matched a line of it):" in shown
    assert prep.corpus.documents[0].path in shown


def test_full_mode_reads_the_whole_input(tmp_path):
    doc = tmp_path / "short.txt"
    doc.write_text("Our office moved to 12 Harbour Street in March.\nThe cafe is on the ground floor.\n")
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(doc)], "Where did the office move?", "ask", settings, NullReporter())
    assert prep.plan.mode is Mode.FULL
    backend = FakeBackend()
    answer = answer_question(prep, backend, settings, NullReporter(), Tally())
    assert "Harbour Street" in answer.text
    assert answer.citations[0].ref == f"{doc}:1-2" or answer.citations[0].ref == f"{doc}:1"
    # each document read whole carries the label the model read it under (probe 103: none)
    prompt = backend.calls[-1][-1]["content"]
    assert [e["label"] for e in answer.stats["evidence"]] == [1] and '<source id="1" ref="short.txt">' in prompt


def test_full_mode_asked_for_is_never_swapped_for_retrieval(haystack, tmp_path):
    """The estimate said the input fits, the exact count says it does not: auto goes on
    through retrieval, while --mode full is a usage error, as when the estimate says so."""
    from ktcli.errors import UsageError

    for mode in ("auto", "full"):
        settings = settings_for(tmp_path, mode=mode)
        prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
        assert prep.plan.mode is Mode.FULL
        small = FakeBackend(context_window=prep.plan.input_tokens // 2)
        if mode == "auto":
            plan = answer_question(prep, small, settings, NullReporter(), Tally()).plan
            assert plan.mode is Mode.RETRIEVAL
            assert len(plan.reasons) == 1 and "using retrieval" in plan.reasons[0]  # --json says why
        else:
            with pytest.raises(UsageError, match="--mode full: the input is"):
                answer_question(prep, small, settings, NullReporter(), Tally())


def test_an_answer_that_reaches_max_new_tokens_says_so(haystack, tmp_path):
    from ktcli.pipeline.runner import stream_answer

    backend = FakeBackend()
    for budget, cut in ((3, True), (400, False)):
        reporter, tally = Warnings(), Tally()
        stream_answer(backend, [{"role": "user", "content": "Say something long."}],
                      SamplingParams(max_new_tokens=budget), tally, reporter)
        assert (tally.extra.get("hit_max_new_tokens") == budget) is cut
        assert any("reached --max-new-tokens" in w for w in reporter.lines) is cut


def test_notes_that_only_echo_the_instructions_are_not_passed_on(haystack, tmp_path):
    # A window's notes of "The main points of this part are:" replaced the real notes
    # before them, and every later window (and the answer) saw only the echo.
    class EchoAfterFirst(FakeBackend):
        def _reply(self, messages):
            if len(self.calls) == 1:
                return "Volunteers count penguins in March."
            if "Notes gathered" in messages[-1]["content"] or "notes so far" in messages[-1]["content"]:
                return "The main points of this part are:"
            return super()._reply(messages)

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    backend = EchoAfterFirst()
    summarize(small, backend, settings, NullReporter(), Tally())
    assert len(backend.calls) > 3
    assert all("Volunteers count penguins in March." in m[-1]["content"] for m in backend.calls[1:])


def test_an_empty_answer_says_so(tmp_path):
    # The model opened a source tag and closed it: the tag is dropped, the close is a stop,
    # and the user saw a blank line, exit 0, and "ttft 0.0s".
    from ktcli.pipeline.runner import stream_answer

    class TagOnly(FakeBackend):
        def _reply(self, messages):
            return '<source id="7" ref="doc.rst:5-9">'

    reporter, tally = Warnings(), Tally()
    text = stream_answer(TagOnly(), [{"role": "user", "content": "Why?"}], SamplingParams(max_new_tokens=40),
                         tally, reporter)
    assert text == "" and any(w.startswith("the model gave no answer") for w in reporter.lines)
    assert tally.ttft_s > 0


def test_a_summary_stopped_in_a_loop_it_never_showed_has_a_first_token_time(tmp_path):
    # A summary of rich/ (875 s) looped in a made-up code block, every line of it held, and
    # its figures said "ttft 0.0s".
    from ktcli.pipeline.runner import stream_answer

    class LoopInCode(FakeBackend):
        def _reply(self, messages):
            return "```python\n" + "value = make_braces(default)\n" * 40

    reporter, tally = Warnings(), Tally()
    text = stream_answer(LoopInCode(), [{"role": "user", "content": "Summarize"}], SamplingParams(max_new_tokens=400),
                         tally, reporter, subject="the summary", source="def f():\n    pass\n")
    assert text == "" and any("kept repeating" in w for w in reporter.lines)
    assert tally.ttft_s > 0


@pytest.fixture
def code_repo(tmp_path):
    folder = tmp_path / "repo"
    (folder / "pkg").mkdir(parents=True)
    (folder / "README.md").write_text("# Ledger\n\nLedger keeps accounts and their postings.\n")
    for i in range(8):
        funcs = "\n\n".join(
            f'def op_{i}_{j}(x):\n    """Operation {i}.{j} on a ledger."""\n'
            + "\n".join(f"    body_marker_{i}_{j}_{k} = x + {k}" for k in range(12)) + "\n    return x"
            for j in range(6)
        )
        (folder / "pkg" / f"mod{i}.py").write_text(f'"""Module {i} of the ledger."""\n\n{funcs}\n')
    return folder


def test_every_summary_call_stops_at_a_source_tag(haystack, tmp_path):
    # Without stop strings a summary ran on into made-up <source id="12" ...> blocks.
    class Recording(FakeBackend):
        stops: list[tuple[str, ...]] = []

        def stream_chat(self, messages, params):
            self.stops.append(params.stop)
            return super().stream_chat(messages, params)

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    for plan in (prep.plan, replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600)):
        backend = Recording()
        backend.stops = []
        summarize(replace(prep, plan=plan), backend, settings, NullReporter(), Tally())
        assert backend.stops and all("\n<source" in s and "\n</source" in s for s in backend.stops), backend.stops


def test_summary_with_outlines_reads_signatures_not_bodies(code_repo, tmp_path):
    settings = settings_for(tmp_path, mode="auto", outline="always")
    prep = prepare([str(code_repo)], "", "summarize", settings, NullReporter())
    assert prep.plan.outline_files == 8 and set(prep.outlines) == {str(code_repo / "pkg" / f"mod{i}.py") for i in range(8)}
    assert prep.plan.read_tokens < prep.plan.input_tokens / 3
    # several windows, to check the map over outline pieces as well as the whole read
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=300))
    for p in (prep, small):
        backend, reporter = FakeBackend(), Warnings()
        answer = summarize(p, backend, settings, reporter, Tally())
        # which files, not only how many (the plan and stderr said "8 file(s) as outlines")
        (named,) = [m for m in reporter.lines if m.startswith("read as outlines")]
        assert "mod0.py" in named and "mod7.py" in named and "--outline never" in named
        assert sorted(answer.stats["outlined"]) == sorted(prep.outlines)
        read = "".join(m[-1]["content"] for m in backend.calls)
        assert "body_marker" not in read
        for i in range(8):
            assert f'"""Module {i} of the ledger."""' in read
            assert all(f"def op_{i}_{j}(x):" in read for j in range(6))
        assert "Ledger keeps accounts and their postings." in read  # prose is read whole
        assert "shown as outlines" in backend.calls[0][-1]["content"]
        assert answer.stats["outlined_files"] == 8
        # what it read says which it read as outlines, claiming none of their lines (review)
        outlined = [e for e in answer.stats["evidence"] if e.get("outlined")]
        assert sorted(e["path"] for e in outlined) == sorted(prep.outlines)
        assert all(e["line_start"] is None and e["ref"].endswith(" (outline)") for e in outlined)
    assert answer.stats["windows"] > 2


def test_summary_without_outlines_reads_every_line(code_repo, tmp_path):
    settings = settings_for(tmp_path, mode="auto", outline="never")
    prep = prepare([str(code_repo)], "", "summarize", settings, NullReporter())
    assert prep.plan.outline_files == 0 and prep.outlines == {}
    backend = FakeBackend()
    summarize(prep, backend, settings, NullReporter(), Tally())
    read = "".join(m[-1]["content"] for m in backend.calls)
    assert "body_marker_7_5_11" in read and "shown as outlines" not in read


def test_source_tags_inside_a_document_do_not_end_its_block():
    """A document quoting our tags (XML, ktcli's own prompts.py) must not close its block
    early, and a quote in a file name must not end the ref attribute."""
    text = 'before\n</source>\nafter <SOURCE id="9" ref="x">\n'
    block = prompts.evidence_block([(1, 'odd".txt', text), (2, "b.md", "plain")])
    assert block.count("</source>") == 2 and block.count("<source ") == 2
    assert block.startswith('<source id="1" ref="odd&quot;.txt">\n')
    assert "&lt;/source>" in block and '&lt;SOURCE id="9"' in block
    assert block.split("</source>")[0].endswith('&lt;SOURCE id="9" ref="x">\n')


def test_many_small_files_with_deep_paths_stay_inside_the_window(tmp_path):
    """Their source tags are most of each window: packed at 12 tokens a tag, a summary of
    400 such files sent 9K-token prompts into an 8K window ("KV cache full"); so did its
    map steps with --max-new-tokens 64, which write 384 tokens of notes. Every call is
    checked against the window by the fake backend."""
    root = tmp_path / "repo"
    deep = root / "src" / "project_package" / "handlers"
    deep.mkdir(parents=True)
    for i in range(120):
        (deep / f"request_handler_module_{i:03d}.py").write_text(f"def handle_{i}(request):\n    return {i}\n")
    for max_new in (384, 64):
        settings = settings_for(tmp_path, mode="auto", max_new_tokens=max_new, context_window=2048)
        prep = prepare([str(root)], "", "summarize", settings, NullReporter())
        backend = FakeBackend(context_window=2048, count=count_tokens)  # BPE: a deep path is ~20 tokens
        answer = summarize(prep, backend, settings, NullReporter(), Tally())
        seen = "".join(m[-1]["content"] for m in backend.calls[:-1])
        assert all(f"handle_{i}(" in seen for i in range(120))  # every file read
        assert answer.stats["windows"] == len(backend.calls) - 1
        asked = prepare([str(root)], "What does handle_7 return?", "ask", replace(settings, top_k=40),
                        NullReporter())
        answer_question(asked, FakeBackend(context_window=2048, count=count_tokens), settings, NullReporter(), Tally())


def test_empty_files_are_reported_in_one_line(tmp_path):
    """A Python repo's empty __init__.py files, one warning each, buried the ones that matter."""
    root = tmp_path / "pkg"
    for sub in ("a", "b", "c", "d"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "a" / "core.py").write_text("def f():\n    return 1\n")
    (root / "blob.bin").write_bytes(bytes(range(256)) * 8)

    reporter = Warnings()
    prep = prepare([str(root)], "", "summarize", settings_for(tmp_path, mode="auto"), reporter)
    assert len(prep.corpus.skipped) == 5  # every one still listed (--json)
    assert reporter.lines == [f"skipped {root}/blob.bin: binary",
                              f"skipped 4 empty files: {root}/a/__init__.py, {root}/b/__init__.py, "
                              f"{root}/c/__init__.py and 1 more"]


def test_a_reason_shared_by_many_files_is_one_line(tmp_path):
    """A folder of 3,000 images printed 3,017 "! skipped img/pN.png: binary" lines, also
    under -q. Each reason of more than three entries is one line; a few stay one each."""
    root = tmp_path / "repo"
    (root / "img").mkdir(parents=True)
    for i in range(3000):
        (root / "img" / f"p{i:04}.png").write_bytes(b"\x89PNG")
    for i, size in enumerate((3000, 4000, 5000, 6000)):
        (root / f"big{i}.txt").write_text("x" * size)
    for name in ("yarn.lock", "go.sum"):
        (root / name).write_text("pinned\n")
    (root / "main.py").write_text("TAX_RATE = 0.2\n")
    reporter = Warnings()
    prep = prepare([str(root)], "", "summarize", settings_for(tmp_path, mode="auto", max_file_bytes=2500), reporter)
    assert len(prep.corpus.skipped) == 3006  # every one still listed (--json)
    lock = "a lockfile (generated; name the file to read it)"
    assert reporter.lines == [
        f"skipped {root}/go.sum: {lock}",
        f"skipped {root}/yarn.lock: {lock}",
        f"skipped 4 files (too large; --max-file-bytes raises it, or name the file): {root}/big0.txt, "
        f"{root}/big1.txt, {root}/big2.txt and 1 more",
        f"skipped 3,000 files (binary): {root}/img/p0000.png, {root}/img/p0001.png, {root}/img/p0002.png "
        "and 2,997 more"]


def test_citations_carry_the_label_the_model_read_them_under(haystack, tmp_path):
    settings = settings_for(tmp_path, top_k=12)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    backend = FakeBackend()
    answer = answer_question(prep, backend, settings, NullReporter(), Tally())
    sent = "".join(m[-1]["content"] for m in backend.calls)
    needle_cite = next(c for c in answer.citations if c.span.path.endswith("part4.txt"))
    # the block the needle was shown in carries that label
    block = re.search(rf'<source id="{needle_cite.label}" ref="([^"]+)">', sent)
    assert block and block.group(1).split(":")[0].endswith("part4.txt") and NEEDLE in sent.split(block.group(0))[1]


def test_every_label_the_answer_writes_is_under_sources_the_backed_first(haystack, tmp_path):
    """"... arrives on Friday at gate Omega. [1] ... shelf 9. [2]" listed no [2]: the
    answer's [2] pointed at nothing. Now each label is moved to its sentence's passage
    (`Relabel`), or left out where its sentence shares no word with any ("The source of
    the information is: [1]" listed a page with nothing of it); every label left is listed."""
    class WrongLabels(FakeBackend):
        def _reply(self, messages):
            return "The vault combination is 31-07-1999. [2] Zebras yodel loudly. [3]"

    settings = settings_for(tmp_path, top_k=12)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    answer = answer_question(prep, WrongLabels(), settings, NullReporter(), Tally())
    labels = {c.label for c in answer.citations}
    assert answer.text.endswith("Zebras yodel loudly.")
    assert {int(k) for k in re.findall(r"\[(\d+)\]", answer.text)} <= labels
    assert answer.citations[0].span.path.endswith("part4.txt")  # where the combination is, whatever was written
    assert f"[{answer.citations[0].label}]" in answer.text  # ... under the label the answer now writes


def test_the_index_cache_is_kept_within_its_bound(haystack, tmp_path, monkeypatch):
    """It only ever grew: each edit of a file kept the old vectors beside the new."""
    from ktcli.pipeline import indexing
    from ktcli.retrieval.store import IndexStore

    settings = settings_for(tmp_path)
    first = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    answer_question(first, FakeBackend(), settings, NullReporter(), Tally())
    size = IndexStore(settings.cache_path).size_bytes()
    monkeypatch.setattr(indexing, "INDEX_MAX_BYTES", size)
    for i in range(3):  # edits: new vectors each time, the old ones least recently used
        (haystack / "part0.txt").write_text(f"Edited {i}: the vault is in the east wing.\n" * 30)
        again = prepare([str(haystack)], "Where is the vault?", "ask", settings, NullReporter())
        answer_question(again, FakeBackend(), settings, NullReporter(), Tally())
    assert IndexStore(settings.cache_path).size_bytes() <= size


def test_an_index_that_cannot_be_kept_is_said(haystack, tmp_path):
    """A read-only or full cache folder kept no index, silently: every question embedded
    the input again, unexplained."""
    from ktcli.pipeline.indexing import build_index

    settings = settings_for(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "index").write_text("a file where the index folder goes")
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())

    reporter = Warnings()
    build_index(prep, settings, reporter)
    assert any("the index could not be kept in the cache" in line for line in reporter.lines)


def test_the_answer_is_shown_before_the_backend_finishes_its_held_back_work(tmp_path, monkeypatch):
    """The engine's prompt-cache write (0.3-0.8 s for a big entry) comes after the sources;
    a write the disk refused is said; without `on_answer`, the answer has its figures."""
    from ktcli.pipeline import api

    doc = tmp_path / "short.txt"
    doc.write_text("Our office moved to 12 Harbour Street in March.\n")
    events = []

    class Holding(FakeBackend):
        def finish(self):
            events.append("finish")
            self._stats.extra["kept_tokens"] = 40
            return "the prompt cache could not keep this prompt for the next question: disk full"

    class Warnings(NullReporter):
        def warn(self, message):
            events.append(message)

    monkeypatch.setattr(api, "_load", lambda *a: Holding())
    settings = settings_for(tmp_path, mode="auto")
    answer = api.ask([str(doc)], "Where did the office move?", settings, Warnings(), None, None,
                     lambda a: events.append(("shown", a.text)))
    assert events == [("shown", answer.text), "finish",
                      "the prompt cache could not keep this prompt for the next question: disk full"]
    assert "Harbour Street" in answer.text and answer.stats["kept_tokens"] == 40


def test_the_figures_of_the_prompt_cache_and_the_answer_budget_are_always_there(tmp_path, monkeypatch):
    """`figures.kept_tokens`, `reuse_s` and `hit_max_new_tokens` were there only when the
    prompt cache was written or read, or the budget was reached: a script reading them met a
    KeyError on the next run (probe 104), as FIGURE_DEFAULTS says it must not."""
    from ktcli.pipeline import api

    doc = tmp_path / "short.txt"
    doc.write_text("Our office moved to 12 Harbour Street in March.\n")
    monkeypatch.setattr(api, "_load", lambda *a: FakeBackend())
    answer = api.ask([str(doc)], "Where did the office move?", settings_for(tmp_path, mode="auto"), NullReporter())
    assert {"kept_tokens": 0, "reuse_s": 0.0, "reused_tokens": 0, "hit_max_new_tokens": 0}.items() <= answer.stats.items()


def test_labels_moved_is_always_in_the_figures_of_an_answer_and_a_summary(tmp_path, monkeypatch):
    """`figures.labels_moved` was there only when a label had been moved (`qa._count_moved`):
    a script reading it met a KeyError on most answers and on every summary."""
    from ktcli.pipeline import api

    doc = tmp_path / "short.txt"
    doc.write_text("Our office moved to 12 Harbour Street in March.\n")
    monkeypatch.setattr(api, "_load", lambda *a: FakeBackend())
    settings = settings_for(tmp_path, mode="auto")
    answer = api.ask([str(doc)], "Where did the office move?", settings, NullReporter())
    summary = api.summarize_paths([str(doc)], settings, NullReporter())
    assert answer.stats["labels_moved"] == 0 and summary.stats["labels_moved"] == 0


def test_a_load_with_one_time_work_teaches_the_plans_no_load_time(tmp_path, monkeypatch):
    from ktcli.engine import loading
    from ktcli.pipeline import api

    doc = tmp_path / "short.txt"
    doc.write_text("Our office moved to 12 Harbour Street in March.\n")
    saved = []
    monkeypatch.setattr(loading, "one_time_s", 0.0)  # restored after the test

    def load(*a):
        loading.one_time_s = 41.0  # the kernels compiled
        backend = FakeBackend()
        return backend

    monkeypatch.setattr(api, "_load", load)
    monkeypatch.setattr(api, "save_rates", lambda *a, **kw: saved.append(kw.get("load_s", a[4] if len(a) > 4 else None)))
    api.ask([str(doc)], "Where did the office move?", settings_for(tmp_path, mode="auto"), NullReporter())
    assert saved == [0.0]


def test_a_summary_that_restates_the_instructions_cites_nothing_and_says_so(tmp_path):
    """'Write the final summary from these notes: what it is, how it is organised, and the
    key facts' was cited to five lines of real code."""
    code_repo = tmp_path / "repo"
    code_repo.mkdir()
    (code_repo / "report.py").write_text("def write_final(key_facts):\n    # the key facts, organised\n"
                                         "    return sorted(key_facts)\n")
    class Echo(FakeBackend):
        def _reply(self, messages):
            return "Write the final summary from these notes: what it is, how it is organised, and the key facts."

    class Warnings(NullReporter):
        said: list = []

        def warn(self, message):
            self.said.append(message)

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(code_repo)], "", "summarize", settings, NullReporter())
    reporter = Warnings()
    answer = summarize(prep, Echo(), settings, reporter, Tally())
    # left out as it streams (it was printed, then warned of), and said
    assert answer.citations == () and answer.text == ""
    assert reporter.said[0] == "left out of the summary: 1 line(s) writing ktcli's instructions back"
    assert "the model gave no summary (" in reporter.said[1] and "all of them left out" in reporter.said[1]


@pytest.mark.parametrize("mode", ["retrieval", "full"])
def test_an_answer_that_restates_the_instructions_cites_nothing_and_says_so(haystack, tmp_path, mode):
    """`ktcli ask papers/ "Which datasets..."` answered 'Answer the question in a few
    sentences, citing sources like [1].', with `[1] paper_a.pdf p.219` under Sources."""
    class Echo(FakeBackend):
        def _reply(self, messages):
            return prompts.ASK_INSTRUCTION

    settings = settings_for(tmp_path, mode=mode)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    reporter = Warnings()
    answer = answer_question(prep, Echo(), settings, reporter, Tally())
    assert answer.text == prompts.ASK_INSTRUCTION and answer.citations == ()
    assert reporter.lines == ["the answer only restates ktcli's instructions, so it cites nothing: try rewording the "
                              "question, or a larger --model"]


@pytest.mark.parametrize("mode", ["retrieval", "full"])
def test_an_answer_that_goes_on_with_the_system_prompt_says_so(haystack, tmp_path, mode):
    """A right first sentence, then "The source is a ktcli, a careful assistant that answers
    from the given sources only. Quotes names, ..." with no word on stderr (probe 95)."""
    class GoesOn(FakeBackend):
        def _reply(self, messages):
            return ("The vault combination is 31-07-1999 [1]. The source is a ktcli, a careful assistant that "
                    "answers from the given sources only. Quotes names, numbers and code identifiers exactly as "
                    "the sources write them.")

    settings = settings_for(tmp_path, mode=mode)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    reporter = Warnings()
    answer_question(prep, GoesOn(), settings, reporter, Tally())
    assert ("2 sentences of the answer are ktcli's own instructions written back, not the sources (\"The source is "
            "a ktcli, a careful assistant that answers from the given sources only.\")") in reporter.lines

    class SaysNotFound(FakeBackend):
        def _reply(self, messages):
            return "The sources do not contain the answer. They only say the museum opens at nine."

    reporter = Warnings()
    answer_question(prep, SaysNotFound(), settings, reporter, Tally())
    assert not any("instructions" in m for m in reporter.lines)


def test_ctrl_c_while_a_summary_reads_keeps_the_notes_so_far(haystack, tmp_path):
    """200 s of reading parts ended in an empty stdout: the notes were progress only."""
    from ktcli.errors import InterruptedWithNotes

    class InterruptedAtThird(FakeBackend):
        calls_made = 0

        def stream_chat(self, messages, params):
            InterruptedAtThird.calls_made += 1
            if InterruptedAtThird.calls_made == 3:
                raise KeyboardInterrupt
            return super().stream_chat(messages, params)

        def _reply(self, messages):
            return "The museum opens at nine [1]."

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    with pytest.raises(InterruptedWithNotes) as caught:
        summarize(small, InterruptedAtThird(), settings, NullReporter(), Tally())
    assert caught.value.exit_code == 130 and "parts 1-2 of" in caught.value.partial
    assert "The museum opens at nine [1]." in caught.value.partial
    # --json's object of it: the summary's plan, figures and skipped files, as an interrupted
    # answer's (it had only the notes and the error)
    kept = caught.value.answer
    assert kept.text == caught.value.partial and kept.citations == () and kept.plan.task == "summarize"
    assert kept.plan.n_windows > 2 and kept.stats["windows"] == 2 and kept.stats["model_calls"] == 2
    assert kept.stats["evidence"] and all(e["path"].startswith(str(haystack)) for e in kept.stats["evidence"])
    # no answer token came: its time to the first is null, not 0.0 (probe 124)
    assert kept.stats["ttft_s"] is None


def test_ctrl_c_while_the_summarys_prompt_is_read_keeps_every_parts_notes(haystack, tmp_path):
    """Probe 124: after every part was read, a SIGTERM while the summary's own prompt was
    read said "terminated (SIGTERM)" alone, and --json's object was the error alone."""
    from ktcli.errors import InterruptedWithNotes

    class InterruptedAtTheSummary(FakeBackend):
        def stream_chat(self, messages, params):
            if "<source" not in messages[-1]["content"]:  # the summary's step, from the notes
                raise KeyboardInterrupt
            return super().stream_chat(messages, params)

        def _reply(self, messages):
            return "The museum opens at nine [1]."

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    backend = InterruptedAtTheSummary()
    with pytest.raises(InterruptedWithNotes) as caught:
        summarize(small, backend, settings, NullReporter(), Tally())
    parts = len(backend.calls)
    assert parts > 2 and caught.value.exit_code == 130
    assert str(caught.value).startswith(f"interrupted while writing the summary from the notes: the notes of parts 1-{parts}"
                                        " are kept")
    assert caught.value.partial.startswith(f"Notes from parts 1-{parts} of {parts} (interrupted before the summary")
    assert "The museum opens at nine [1]." in caught.value.partial
    kept = caught.value.answer
    assert kept.text == caught.value.partial and kept.stats["windows"] == parts and kept.stats["ttft_s"] is None


def test_an_answer_a_server_cut_off_keeps_the_whole_json_object(tmp_path, monkeypatch):
    """Text kept past an error (`partial`: a server's answer cut off) gets the answer's plan,
    figures (every key) and skipped files, for --json, as an interrupted answer does."""
    from ktcli.engine.openai_http import StreamCutOffError
    from ktcli.pipeline import api
    from ktcli.pipeline.api import FIGURE_DEFAULTS

    class CutOff(FakeBackend):
        def stream_chat(self, messages, params):
            yield "Our office "
            raise StreamCutOffError("the server closed the stream", partial="Our office ")

    doc = tmp_path / "short.txt"
    doc.write_text("Our office moved to 12 Harbour Street in March.\n")
    monkeypatch.setattr(api, "_load", lambda *a: CutOff())
    with pytest.raises(StreamCutOffError) as caught:
        api.ask([str(doc)], "Where did the office move?", settings_for(tmp_path, mode="auto"), NullReporter())
    kept = caught.value.answer
    assert kept.text == "Our office " and kept.plan.task == "ask" and set(FIGURE_DEFAULTS) <= set(kept.stats)


def test_ctrl_c_before_any_note_is_a_plain_interrupt(haystack, tmp_path):
    class InterruptedAtOnce(FakeBackend):
        def stream_chat(self, messages, params):
            raise KeyboardInterrupt

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    with pytest.raises(KeyboardInterrupt):
        summarize(small, InterruptedAtOnce(), settings, NullReporter(), Tally())


def test_ctrl_c_while_indexing_says_the_embeddings_kept(haystack, tmp_path, monkeypatch):
    """Interrupting a long indexing said only "interrupted", though every group embedded
    was written: the next question starts from them."""
    from ktcli.errors import Interrupted
    from ktcli.pipeline.indexing import build_index
    from ktcli.retrieval import retriever
    from tests.retrieval.fakes import HashEmbedder

    class StoppedAtThird(HashEmbedder):
        calls = 0

        def embed(self, texts, *, on_progress=None):
            StoppedAtThird.calls += 1
            if StoppedAtThird.calls == 3:
                raise KeyboardInterrupt
            return super().embed(texts, on_progress=on_progress)

    monkeypatch.setattr(retriever, "_groups", lambda parts, _n: [[part] for part in parts])  # a write per file
    monkeypatch.setattr("ktcli.pipeline.indexing.embedder_for", lambda settings: StoppedAtThird())
    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    per_file = len(prep.chunks) // 6
    with pytest.raises(Interrupted) as caught:
        build_index(prep, settings, NullReporter())
    assert caught.value.exit_code == 130
    assert str(caught.value) == (f"interrupted while indexing: the embeddings of {2 * per_file} of {len(prep.chunks)} "
                                 "chunks are kept, and the next question about this input starts from them")
    monkeypatch.setattr("ktcli.pipeline.indexing.embedder_for", lambda settings: HashEmbedder())
    assert build_index(prep, settings, NullReporter()).stats["n_reused"] == 2 * per_file
    StoppedAtThird.calls = 2  # stopped before anything was written: a plain interrupt
    monkeypatch.setattr("ktcli.pipeline.indexing.embedder_for", lambda settings: StoppedAtThird())
    with pytest.raises(KeyboardInterrupt):
        build_index(prep, replace(settings, cache_dir=str(tmp_path / "other")), NullReporter())


def _deep_folder(tmp_path, n=55):
    folder = tmp_path / "home" / "alice" / "work" / "acme-billing-service" / "src" / "billing"
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"module_{i}.py").write_text(f'"""Invoice helper {i}."""\n\ndef total_{i}(items, rate=0.{i:02d}):\n'
                                               f'    return sum(items) * (1 + rate)\n')
    return folder


def test_a_summarys_plan_counts_the_prompt_it_sends(tmp_path, monkeypatch):
    """The plan scaled its count by the model's tokens for the source tags less the folders
    every path shares, the summary sent them whole: 55 files under a deep folder planned
    5.4K tokens "full" and ran in parts at 8.4K. Both now name files as the source refs do,
    the shared folder said once."""
    class Tokenizer:  # the model's own count (here tiktoken's), as where the model is converted
        def encode(self, text):
            return [0] * count_tokens(text)

    monkeypatch.setattr("ktcli.pipeline.prepare._model_tokenizer", lambda *a: Tokenizer())
    folder = _deep_folder(tmp_path)
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    backend = FakeBackend(count=count_tokens)
    summarize(prep, backend, settings, NullReporter(), Tally())
    assert prep.plan.mode is Mode.FULL and len(backend.calls) == 1  # read whole, as planned
    sent = backend.prompt_tokens(backend.calls[0])
    planned = prep.plan.input_tokens
    assert abs(sent - planned) <= 0.05 * sent, (sent, planned)
    prompt = backend.calls[0][-1]["content"]
    assert f"(all in {folder}/)\nmodule_0.py (4 lines)" in prompt and 'ref="module_0.py"' in prompt


def test_a_summary_asked_for_full_is_not_read_in_parts(tmp_path):
    folder = _deep_folder(tmp_path, 9)  # (8 or fewer are read one by one: tests/pipeline/test_summary_per_document.py)
    settings = settings_for(tmp_path, mode="full")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    small = FakeBackend()
    small.context_window = 400
    with pytest.raises(UsageError, match="--mode full: the input is"):
        summarize(prep, small, settings, NullReporter(), Tally())
    assert small.calls == []


def _summary_in_parts(haystack, tmp_path, backend):
    """The haystack summarized in windows of 600 tokens by `backend`: (answer, reporter)."""
    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    reporter = Shown()
    return summarize(small, backend, settings, reporter, Tally()), reporter


@pytest.mark.parametrize("reduced", ["The final summary is:", '<pre><code>\n<span class="varname">LlamaTokenizerFast'
                                     '</span>\n\nWrite the final summary from these notes: what it is, how it is '
                                     'organised, and the key facts.\n</code></pre>'])
def test_a_final_summary_that_says_nothing_is_followed_by_the_notes(haystack, tmp_path, reduced):
    """A summary of transformers' llama folder was "The final summary is:" after 44 s of
    reading (another time, markup around one class name and the instructions echoed): the
    notes gathered from its parts were thrown away."""
    class EmptyReduce(FakeBackend):
        def _reply(self, messages):
            if "Notes taken while reading the whole input" in messages[-1]["content"]:
                return reduced
            return "The vault combination is 31-07-1999 [1]."

    answer, reporter = _summary_in_parts(haystack, tmp_path, EmptyReduce())
    # (a block of markup around words that are not the input's is left out: `summary_lines`)
    shown = "" if reduced.startswith("<pre>") else reduced.rstrip()
    assert answer.text.startswith(shown + "\n\nNotes from the ") and "31-07-1999" in answer.text
    assert "31-07-1999" in "".join(reporter.shown)  # shown as the answer streams, not only in --json
    assert any("the notes taken from its parts follow" in m for m in reporter.lines)
    assert any(c.span.path.endswith("part4.txt") for c in answer.citations)


def test_notes_that_say_as_little_as_the_summary_are_not_shown_as_its_substance(haystack, tmp_path):
    """A repo's summary printed "Notes from the 6 parts: ... 1. The main point is to provide
    a summary of the main points of this part." (probe 97)."""
    class Hollow(FakeBackend):
        def _reply(self, messages):
            if "Notes taken while reading the whole input" in messages[-1]["content"]:
                return "The final summary is:"
            return ("The main points of this part are:\n\n1. The main point is to provide a summary of the main "
                    "points of this part.\n2. The summary is in the format of a short line.")

    answer, reporter = _summary_in_parts(haystack, tmp_path, Hollow())
    assert "Notes from the" not in answer.text and "Notes from the" not in "".join(reporter.shown)
    assert any("nor do the notes taken from its parts" in m for m in reporter.lines)


def test_notes_of_markup_alone_are_not_passed_on_nor_shown_as_a_summary(haystack, tmp_path):
    """A CSV's summary was "The final summary is: ... Notes from the 3 parts: <pre><code>",
    exit 0: each part's notes were `<pre><code>`, counted as two words of content. And from
    no notes at all the model made one up ("The final summary is a concise and clear
    summary of the input"): none is asked for."""
    class Markup(FakeBackend):
        def _reply(self, messages):
            assert "Notes taken while reading the whole input" not in messages[-1]["content"]
            return "<pre><code>"

    answer, reporter = _summary_in_parts(haystack, tmp_path, Markup())
    assert answer.text == "" and "".join(reporter.shown) == ""
    assert any("the model wrote nothing from the input in the notes of its" in m for m in reporter.lines)


@pytest.mark.parametrize("mode", ["retrieval", "full"])
def test_ctrl_c_while_the_answer_streams_keeps_its_sources(haystack, tmp_path, mode):
    """The part of the answer shown stayed on stdout without the Sources it had come from."""
    from ktcli.errors import InterruptedAnswer

    class CutAfterThreeWords(FakeBackend):
        def stream_chat(self, messages, params):
            for i, piece in enumerate(super().stream_chat(messages, params)):
                if i == 5 and "Question:" in messages[-1]["content"]:
                    raise KeyboardInterrupt
                yield piece

    settings = settings_for(tmp_path, mode=mode)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    with pytest.raises(InterruptedAnswer) as caught:
        answer_question(prep, CutAfterThreeWords(), settings, NullReporter(), Tally())
    answer = caught.value.answer
    assert caught.value.exit_code == 130 and answer.text == "The vault combination is 31-07-1999"
    # the call streamed is counted (--json said tokens_in 0, model_calls 0: probe 97)
    assert answer.stats["tokens_in"] > 0 and answer.stats["model_calls"] >= 1
    assert any(c.span.path.endswith("part4.txt") for c in answer.citations)


def test_ctrl_c_during_a_notes_window_is_a_plain_interrupt(haystack, tmp_path):
    class CutInNotes(FakeBackend):
        def stream_chat(self, messages, params):
            if "Update the notes" in messages[-1]["content"]:
                raise KeyboardInterrupt
            return super().stream_chat(messages, params)

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, evidence_budget=300))
    # no answer kept (a notes step's text is none), said where it came (probe 124)
    from ktcli.errors import Interrupted

    with pytest.raises(Interrupted) as caught:
        answer_question(small, CutInNotes(), settings, NullReporter(), Tally())
    assert str(caught.value).startswith("interrupted while reading evidence window 1 of ")
    assert caught.value.exit_code == 130 and not hasattr(caught.value, "answer")


def test_ctrl_c_before_the_first_word_of_the_answer_is_a_plain_interrupt(haystack, tmp_path):
    """Said "interrupted while the answer streamed" while the prompt was still being read."""
    class CutInPrefill(FakeBackend):
        def stream_chat(self, messages, params):
            raise KeyboardInterrupt
            yield  # a generator, as the engine's stream is

    settings = settings_for(tmp_path, mode="full")
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    with pytest.raises(KeyboardInterrupt) as caught:
        answer_question(prep, CutInPrefill(), settings, NullReporter(), Tally())
    assert type(caught.value) is KeyboardInterrupt


def test_an_interrupted_answers_sources_are_placed_as_a_finished_ones(tmp_path, monkeypatch):
    """Its citations skipped the mapping to the user's lines: an HTML fact on line 12 under
    "Secrets" was cited as line 7 (a <p> tag), with no section."""
    from ktcli.errors import InterruptedAnswer
    from ktcli.pipeline import api

    page = tmp_path / "page.html"
    page.write_text("<html>\n<head>\n<title>T</title>\n</head>\n<body>\n<h1>Intro</h1>\n<p>\nWelcome here.\n</p>\n"
                    "<h1>Secrets</h1>\n<p>\nThe vault combination is 31-07-1999 and nobody knows it.\n</p>\n</body>\n</html>\n")

    class Cut(FakeBackend):
        def stream_chat(self, messages, params):
            for i, piece in enumerate(super().stream_chat(messages, params)):
                if i == 5:
                    raise KeyboardInterrupt
                yield piece

    monkeypatch.setattr(api, "_load", lambda *a: Cut())
    with pytest.raises(InterruptedAnswer) as caught:
        api.ask([str(page)], "What is the vault combination?", settings_for(tmp_path, mode="full"), NullReporter())
    (cite,) = [c for c in caught.value.answer.citations if c.span.line_start]
    assert (cite.span.line_start, cite.section) == (12, "Secrets")


class _CutSummary(FakeBackend):
    """A summary that streams a few words of its own, then Ctrl-C."""

    def _reply(self, messages):
        return "The museum opens at nine and the vault combination is 31-07-1999."

    def stream_chat(self, messages, params):
        summary = "Next part (" not in messages[-1]["content"]  # not the notes on one part
        for i, piece in enumerate(super().stream_chat(messages, params)):
            if summary and i == 5:
                raise KeyboardInterrupt
            yield piece


@pytest.mark.parametrize("mode", ["full", "retrieval"])
def test_ctrl_c_while_the_summary_streams_keeps_the_part_shown(haystack, tmp_path, mode):
    """`summarize --json` interrupted mid-summary printed only {"error": "interrupted"}: the
    part already streamed was lost, where `ask` keeps it (InterruptedAnswer)."""
    from ktcli.errors import InterruptedAnswer

    settings = settings_for(tmp_path, mode=mode)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    if mode == "retrieval":  # read in parts: the Ctrl-C comes in the reduce
        prep = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    try:
        summarize(prep, _CutSummary(), settings, NullReporter(), Tally())
    except InterruptedAnswer as e:
        caught = e
    except KeyboardInterrupt:  # a bare one would end pytest's session, not fail this test
        pytest.fail("the summary shown so far was dropped: a plain interrupt")
    else:
        pytest.fail("no interrupt")
    assert caught.exit_code == 130
    # (read whole, its 6 documents are summarized one by one, each under its path)
    assert caught.answer.text == (f"## {haystack / 'part0.txt'}\n" if mode == "full" else "") + "The museum opens at nine"
    assert caught.answer.citations  # its Sources, as a finished summary has


def test_a_passage_that_ends_its_pdf_page_mid_sentence_is_read_with_the_sentences_end(tmp_path):
    """A real PDF whose answer runs over a page break: the retrieved chunk of page 2 ends
    "... was set by the", and the model reads "curator on Monday." from page 3 with it."""
    from tests.ingest.fixtures import make_text_pdf

    filler = [[f"Hall {p}-{i} shows maps, clocks and lamps of the old harbour town." for i in range(40)] for p in range(4)]
    filler[1] += ["Late that week the vault combination was changed and set by the"]
    filler[2] = ["curator to 31-07-1999 on Monday evening.", *filler[2]]
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(make_text_pdf(filler))
    settings = settings_for(tmp_path, top_k=1)
    prep = prepare([str(pdf)], "Who changed and set the vault combination?", "ask", settings, NullReporter())
    backend = FakeBackend()
    answer_question(prep, backend, settings, NullReporter(), Tally())
    prompt = backend.calls[-1][-1]["content"]
    assert "set by the\ncurator to 31-07-1999 on Monday evening." in prompt
    assert 'ref="' + str(pdf) + ' p.2"' in prompt  # read as page 2's passage, where the sentence starts


class _CopiesTheInstructionsLabel(FakeBackend):
    """Ends its answer with "[1]" whatever it read, as the bundled model copies "citing
    sources like [1]"; the label arrives split over two pieces."""

    def stream_chat(self, messages, params):
        for piece in super().stream_chat(messages, params):
            pass
        yield from ["The vault combination is 31-07-1999. [", "1]"]


def test_the_answers_label_names_the_passage_that_backs_it(haystack, tmp_path):
    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    tally = Tally()
    answer = answer_question(prep, _CopiesTheInstructionsLabel(), settings, NullReporter(), tally)
    label = int(re.search(r"\[(\d+)\]$", answer.text).group(1))
    assert label != 1 and answer.stats["labels_moved"] == 1
    listed = [c for c in answer.citations if c.label == label]
    needle_path = str(haystack / "part4.txt")
    assert listed and listed[0].span.path == needle_path and listed[0].span.line_start <= 28 <= listed[0].span.line_end
    assert not any(c.label == 1 for c in answer.citations)  # [1] is no longer written


def test_a_figure_no_passage_holds_is_said_and_not_cited(haystack, tmp_path):
    class MadeUp(FakeBackend):
        def _reply(self, messages):
            return "The vault combination is 4217 or 3000, says the curator. [1]"

    for mode in ("retrieval", "full"):
        settings = settings_for(tmp_path, mode=mode)
        prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
        said = Warnings()
        answer = answer_question(prep, MadeUp(), settings, said, Tally())
        assert any("figures 4217, 3000 stand in none of the passages it read" in line for line in said.lines), (mode, said.lines)
        assert not any(c.span.line_start is not None and c.score for c in answer.citations), mode  # no line attributed


def test_a_code_block_of_an_answer_that_is_not_the_inputs_is_said(tmp_path):
    """Probe 101: asked what calls `_parse_letter_version`, the model wrote a body of its own
    for it, cited to the real definition; a block copied from the input is not said."""
    source = tmp_path / "version.py"
    source.write_text("def _parse_letter_version(letter, number):\n    if letter:\n        return letter.lower(), int(number)\n"
                      "    return None\n\n\ndef parse(text):\n    return _parse_letter_version(text[0], text[1:])\n")

    class Answering(FakeBackend):
        def __init__(self, reply):
            super().__init__()
            self.reply = reply

        def _reply(self, messages):
            return self.reply

    made_up = ("It is called here:\n```python\ndef _parse_letter_version(letter):\n    \"\"\"Normalizes a string to its lower case form.\"\"\"\n"
               "    raise InvalidVersion(letter.upper())\n```\n")
    copied = "It is called by parse:\n```python\ndef parse(text):\n    return _parse_letter_version(text[0], text[1:])\n```\n"
    for mode in ("retrieval", "full"):
        settings = settings_for(tmp_path, mode=mode)
        prep = prepare([str(source)], "What calls _parse_letter_version?", "ask", settings, NullReporter())
        said = Warnings()
        answer_question(prep, Answering(made_up), settings, said, Tally())
        assert any("1 code block of the answer is not in the input" in line for line in said.lines), (mode, said.lines)
        said = Warnings()
        answer_question(prep, Answering(copied), settings, said, Tally())
        assert not any("code block" in line for line in said.lines), (mode, said.lines)


def test_a_summarys_made_up_figure_is_said(haystack, tmp_path):
    class MadeUp(FakeBackend):
        def _reply(self, messages):
            return "The museum holds 9120 paintings and opens at nine."

    settings = settings_for(tmp_path, mode="full")
    prep = prepare([str(haystack / "part4.txt")], "", "summarize", settings, NullReporter())
    said = Warnings()
    summarize(prep, MadeUp(), settings, said, Tally())
    assert any("the summary's figure 9120 stands in none of the input" in line for line in said.lines), said.lines


@pytest.mark.parametrize("mode", ["retrieval", "full"])
def test_an_answer_of_a_label_alone_is_no_answer_and_cites_nothing(haystack, tmp_path, mode):
    """`ktcli ask minirepo "What is the capital of France?"` printed "[1]" as the answer,
    with `.gitignore` under Sources: a label alone is held back as it streams, and the
    answer is none, citing nothing."""
    class LabelOnly(FakeBackend):
        def stream_chat(self, messages, params):
            list(super().stream_chat(messages, params))  # (its call and figures)
            yield from ["[", "1", "]", " ", "[2", "]."]

    settings = settings_for(tmp_path, mode=mode)
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    said = Shown()
    answer = answer_question(prep, LabelOnly(), settings, said, Tally())
    assert answer.text == "" and answer.citations == () and "".join(said.shown) == ""
    assert answer.stats["labels_only"] == "[1] [2]"
    assert any(line.startswith("the model wrote only a source label ([1] [2]), no answer: nothing is shown or cited")
               for line in said.lines), said.lines
    assert not any(line.startswith("the model gave no answer") for line in said.lines)


def test_labels_before_the_answers_words_are_shown_with_them(tmp_path):
    from ktcli.pipeline.runner import labels_only, stream_answer

    class LabelFirst(FakeBackend):
        def _reply(self, messages):
            return "[1] The vault combination is 31-07-1999."

    said, tally = Shown(), Tally()
    text = stream_answer(LabelFirst(), [{"role": "user", "content": "Why?"}], SamplingParams(max_new_tokens=40),
                         tally, said)
    assert text == "[1] The vault combination is 31-07-1999." == "".join(said.shown).strip()
    assert "labels_only" not in tally.extra and said.lines == []
    assert labels_only("[1]") == "[1]" and labels_only(" [1], [3].\n") == "[1] [3]"
    # a summary's part of a label alone: said of the summary
    said = Shown()
    assert stream_answer(type("Label", (FakeBackend,), {"_reply": lambda self, m: "[2]"})(),
                         [{"role": "user", "content": "Sum up."}], SamplingParams(max_new_tokens=40), Tally(), said,
                         subject="the summary of a.md", source="text") == ""
    assert said.lines == ["the model wrote only a source label ([2]), no summary of a.md: nothing is shown or cited; "
                          "try a larger --model"] and said.shown == []
    # words that only point at a label are none of an answer ("Who wrote Hamlet?" of the
    # sample repo: "The answer is: [1]."); "Yes [1]." answers
    assert labels_only("The answer is: [1].") == labels_only("See [1].") == "[1]"
    assert labels_only("[1] x") == labels_only("") == labels_only("[") == labels_only("Yes [1].") == ""
    assert labels_only("The answer is 42 [1].") == labels_only("It is in [2].") == ""
    for long in ("[1]" + " " * 100_000 + "x", "the " * 50_000 + "x[1]", "[1" * 50_000):
        assert labels_only(long) == ""  # (linear: no backtracking over a long run)
    # a start of pointing words with no label is shown at the end, as written
    said = Shown()
    assert stream_answer(type("Pointing", (FakeBackend,), {"_reply": lambda self, m: "The answer is"})(),
                         [{"role": "user", "content": "Why?"}], SamplingParams(max_new_tokens=40), Tally(),
                         said) == "The answer is" == "".join(said.shown).strip()


def test_a_summary_in_parts_is_written_from_every_parts_notes(haystack, tmp_path):
    """Asked to keep the earlier notes, the bundled model wrote of its own part only: the
    summary of a 24-page report, written from the last part's notes, was of its last
    chapter alone. The summary reads the notes of every part."""
    from ktcli.pipeline.summarize import every_parts_notes

    class OwnPartOnly(FakeBackend):
        def _reply(self, messages):
            content = messages[-1]["content"]
            if "Next part (" in content:  # notes: the first line of this part, nothing before
                part = content.split("Next part (", 1)[1]
                return next(line for line in part.splitlines() if line.startswith("Paragraph"))[:40]
            return "A summary."

    settings = settings_for(tmp_path)
    prep = prepare([str(haystack)], "", "summarize", settings, NullReporter())
    small = replace(prep, plan=replace(prep.plan, mode=Mode.RETRIEVAL, evidence_budget=600))
    backend = OwnPartOnly()
    summarize(small, backend, settings, NullReporter(), Tally())
    notes = [backend._reply(m) for m in backend.calls[:-1]]
    assert len(notes) > 2 and len(set(notes)) == len(notes)
    reduce = backend.calls[-1][-1]["content"]
    assert all(n.strip() in reduce for n in notes)  # the first part's too, not only the last's
    # where they do not all fit: each part's first lines, else the last part's notes
    taken = ["a1\na2\na3", "b1\nb2\na1", "c1\nc2"]
    assert every_parts_notes(taken, lambda t: True) == "a1\na2\na3\nb1\nb2\nc1\nc2"
    assert every_parts_notes(taken, lambda t: len(t.split()) <= 3) == "a1\nb1\nc1"
    assert every_parts_notes(taken, lambda t: False) == "c1\nc2"


def test_a_parts_notes_saying_the_prompts_part_header_back_lose_that_line():
    """The summary printed "The summary notes for the part of the part 4 of 4: millers.md
    lines 446-478:" (probe 97): a part's notes had said the prompt's header back."""
    from ktcli.pipeline.summarize import _without_position_echo

    notes = "The summary notes for the part of the part 4 of 4: millers.md lines 446-478:\nEliza lives in Ashcombe."
    assert _without_position_echo(notes) == "Eliza lives in Ashcombe."
    assert _without_position_echo("- part 2 of 6: report.pdf pages 3-9\n- roads") == "- roads"
    book = "Part 2 of 3: The Voyage\nThe ship sailed in part 1 of 2 of the race."
    assert _without_position_echo(book) == book  # a document's own parts, no place after them


@pytest.mark.parametrize("name, mode", [("notes.txt", "full"), ("notes.md", "full"), ("notes.txt", "retrieval"),
                                        ("notes.md", "retrieval")])
def test_a_citation_names_the_exact_line_that_holds_the_fact(tmp_path, monkeypatch, name, mode):
    """--json's `line_start`-`line_end` is the matched line and one either side; `line` is
    the one line whose words matched, for a script that opens the file at it."""
    import json

    from ktcli.pipeline import api
    from ktcli.render.formats import answer_json

    filler = [f"Item {k}: the gardens close at dusk and the cafe serves tea." for k in range(30)]
    body = filler[:16] + ["The vault combination is 31-07-1999 and only the curator knows it."] + filler[16:]
    if name.endswith(".md"):
        body = ["# Museum notes", "", "## Security", ""] + body  # the fact on line 21
    doc = tmp_path / name
    doc.write_text("\n".join(body) + "\n")
    fact_line = body.index(next(b for b in body if "vault" in b)) + 1
    monkeypatch.setattr(api, "_load", lambda *a: FakeBackend())
    answer = api.ask([str(doc)], "What is the vault combination?", settings_for(tmp_path, mode=mode), NullReporter())
    assert "31-07-1999" in answer.text
    cite = json.loads(answer_json(answer))["citations"][0]
    assert cite["line"] == fact_line
    assert cite["line_start"] <= fact_line <= cite["line_end"] and cite["line_end"] - cite["line_start"] == 2


def test_an_answer_stopped_for_repeating_keeps_the_labels_moved_as_shown(haystack, tmp_path):
    """The loop guard returned its copy of the raw stream, the labels as the model wrote
    them: stdout showed the vault sentence's "[5]", while the answer kept (--json's, and
    the one Sources are listed from) said "[1]", and Sources listed [1], a file that holds
    none of it, beside [5] (probe 118)."""

    class Loops(FakeBackend):
        def stream_chat(self, messages, params):
            for piece in super().stream_chat(messages, params):
                pass
            yield "The vault combination is 31-07-1999. [1]\n"
            for _ in range(12):
                yield "The museum opens at nine. [2]\n"
                yield "The gardens close at dusk. [3]\n"

    for mode in ("full", "retrieval"):
        settings = settings_for(tmp_path, mode=mode)
        prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
        said = Warnings()
        answer = answer_question(prep, Loops(), settings, said, Tally())
        assert any(line.startswith("stopped the answer") for line in said.lines), (mode, said.lines)
        label = int(re.search(r"31-07-1999\. \[(\d+)\]", answer.text).group(1))
        [needle] = [c for c in answer.citations if c.label == label]
        assert needle.span.path == str(haystack / "part4.txt"), (mode, answer.text)
        assert label != 1 and "[1]" not in answer.text, (mode, answer.text)


def test_parts_whose_notes_said_nothing_are_named_on_stderr(haystack, tmp_path):
    """The Python tutorial's summary in 2 parts was of its second half alone: part 1's notes
    were "The summary notes are shortened to 1 short line each.", dropped with nothing said
    (probe 117)."""
    class FirstHollow(FakeBackend):
        def _reply(self, messages):
            content = messages[-1]["content"]
            if "Notes taken while reading the whole input" in content:
                return "The vault combination is 31-07-1999."
            if "Next part (part 1 of" in content:
                return "The main points of this part are:\n\n1.  The summary notes are shortened to 1 short line each."
            return "The vault combination is 31-07-1999 [1]."

    answer, reporter = _summary_in_parts(haystack, tmp_path, FirstHollow())
    said = [m for m in reporter.lines if "said nothing from the input, so the summary is written without them" in m]
    assert len(said) == 1 and "part 1 (" in said[0] and "part 2 (" not in said[0]
    assert "31-07-1999" in answer.text


def test_parts_whose_notes_all_say_something_warn_of_nothing(haystack, tmp_path):
    answer, reporter = _summary_in_parts(haystack, tmp_path, FakeBackend())
    assert not any("said nothing from the input" in m for m in reporter.lines)


def test_a_summary_held_whole_until_its_loop_was_stopped_says_there_is_none(tmp_path):
    """procps' bugs.md: the model opened `<pre><code>` and looped inside it; the block was
    held, the loop stopped, the block left out, and stdout was a blank line, exit 0, with
    "stopped the summary" the only word on stderr (probe 117)."""
    from ktcli.pipeline.runner import stream_answer

    class LoopInPre(FakeBackend):
        def _reply(self, messages):
            item = "<li>The document is more useful for advanced users and the people that package it.\n</li>\n"
            return "<pre><code>\n<h1>Bugs and Issues</h1>\n<p>\n" + item * 8

    reporter, tally = Warnings(), Tally()
    text = stream_answer(LoopInPre(), [{"role": "user", "content": "Summarize"}], SamplingParams(max_new_tokens=400),
                         tally, reporter, subject="the summary", source="# Bugs\n\nReport them upstream.\n")
    assert text == ""
    assert reporter.lines[0].startswith("stopped the summary: it kept repeating")
    assert reporter.lines[1] == "left out of the summary: 1 code block(s) that are not in the input (made up by the model)"
    assert reporter.lines[2].startswith("the model gave no summary (") and "all of them left out" in reporter.lines[2]


def test_a_default_memory_budget_is_not_said_to_be_max_memorys(haystack, tmp_path, monkeypatch):
    """Probe 124: with no --max-memory, the budget (80% of the memory available) was named
    "the --max-memory budget" in the refusal."""
    from ktcli.errors import OutOfMemoryError
    from ktcli.pipeline import prepare as prepare_module

    monkeypatch.setattr(prepare_module, "memory_budget", lambda settings: 200 * 2**20)
    with pytest.raises(OutOfMemoryError) as caught:
        prepare([str(haystack)], "", "summarize", settings_for(tmp_path, mode="auto"), NullReporter())
    assert "over the default memory budget of 0.20 GiB (80% of the memory available now" in str(caught.value)
