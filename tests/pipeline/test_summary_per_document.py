"""A summary of a few documents that fit the window together: each read alone, in turn."""

from __future__ import annotations

import re

import pytest

from ktcli.errors import InterruptedAnswer
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.runner import Tally
from ktcli.pipeline.summarize import summarize
from ktcli.plan.planner import PER_DOCUMENT_MAX, per_document_tokens
from ktcli.types import Mode

from .fake_backend import FakeBackend
from .test_qa_pipeline import Shown, settings_for

TOPICS = {"lighthouse.md": "The Port Alder lighthouse was built in 1871 and restored in 2023.",
          "bread.md": "This rye bread is baked at 240 degrees for fifteen minutes, then at 210.",
          "release.md": "Tidewatch 4.0 predicts tides with 68 harmonic constituents instead of 37."}


class FirstLine(FakeBackend):
    """Summarizes by repeating the first line of text in the prompt's first source."""

    def _reply(self, messages) -> str:
        content = messages[-1]["content"]
        if "<source" not in content:  # a summary's last step, from notes
            return "Notes."
        body = content.split("<source", 1)[1].split("\n")[1:]
        # past the title, "# bread.md" in the file, "bread.md" as a summary reads it (`prompts.plain_headings`)
        return next(line for line in body if line.strip() and not line.lstrip("# ").endswith(".md"))


@pytest.fixture
def folder(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, fact in TOPICS.items():
        # (longer than a file shown whole instead of summarized: prepare.QUOTED_MAX_CHARS)
        (docs / name).write_text(f"# {name}\n\n{fact}\n" + "More words about it follow here. " * 5 + "\n")
    return docs


def test_each_document_is_summarized_alone_under_its_path(folder, tmp_path):
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    assert prep.plan.mode is Mode.FULL and prep.plan.n_windows == 3
    assert any("a summary of 3 documents: each read alone" in r for r in prep.plan.reasons)
    backend, reporter = FirstLine(), Shown()
    answer = summarize(prep, backend, settings, reporter, Tally())
    assert len(backend.calls) == 3
    for call, name in zip(backend.calls, sorted(TOPICS)):  # one document a call, in input order
        prompt = call[-1]["content"]
        assert prompt.count("<source ") == 1 and TOPICS[name] in prompt
        assert not any(TOPICS[other] in prompt for other in TOPICS if other != name)
    expected = "\n\n".join(f"## {folder / name}\n{TOPICS[name]}" for name in sorted(TOPICS))
    assert answer.text == expected
    assert re.sub(r" +\n", "\n", "".join(reporter.shown)).strip() == expected  # as it streamed
    # each part traced to its own document, labelled by the document's place
    assert {(c.label, c.span.path) for c in answer.citations} == {
        (i + 1, str(folder / name)) for i, name in enumerate(sorted(TOPICS))}
    assert answer.stats["windows"] == 3
    # --json gives each document's summary apart (the text's "## path" headings were all it had)
    import json

    from ktcli.render.formats import answer_json

    assert json.loads(answer_json(answer))["documents"] == [
        {"path": str(folder / name), "summary": TOPICS[name]} for name in sorted(TOPICS)]


def test_each_part_writes_its_share_of_the_answer_budget():
    assert per_document_tokens(2, 384) == 192
    assert per_document_tokens(8, 384) == 128  # no fewer than 128
    assert per_document_tokens(3, 64) == 64  # nor more than the whole budget


def test_more_documents_than_the_limit_are_read_together(tmp_path):
    docs = tmp_path / "many"
    docs.mkdir()
    for i in range(PER_DOCUMENT_MAX + 1):
        (docs / f"note{i}.txt").write_text(f"Note {i} says the tide turned at {i} o'clock.\n")
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(docs)], "", "summarize", settings, NullReporter())
    assert prep.plan.mode is Mode.FULL and prep.plan.n_windows == 1
    backend = FakeBackend()
    summarize(prep, backend, settings, NullReporter(), Tally())
    assert len(backend.calls) == 1


def test_ctrl_c_keeps_the_summaries_written(folder, tmp_path):
    class CutInTheSecond(FirstLine):
        def stream_chat(self, messages, params):
            for i, piece in enumerate(super().stream_chat(messages, params)):
                if i == 3 and len(self.calls) == 2:
                    raise KeyboardInterrupt
                yield piece

    class CutBeforeTheThird(FirstLine):
        def stream_chat(self, messages, params):
            if len(self.calls) == 2:
                raise KeyboardInterrupt
            return super().stream_chat(messages, params)

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    first, second = (f"## {folder / name}\n{TOPICS[name]}" for name in sorted(TOPICS)[:2])
    with pytest.raises(InterruptedAnswer) as caught:
        summarize(prep, CutInTheSecond(), settings, NullReporter(), Tally())
    heading, text = second.split("\n", 1)
    assert caught.value.answer.text == first + "\n\n" + heading + "\n" + " ".join(text.split(" ")[:3])  # (cut at the 4th)
    # probe 121: --json's figures are of the documents read (the second cut short), as docs/json.md
    # says; they said windows 3, with the third document never reached among the evidence
    second_path = folder / sorted(TOPICS)[1]
    assert str(caught.value) == f"interrupted while the summary of {second_path} streamed (document 2 of 3)"
    stats = caught.value.answer.stats
    assert stats["windows"] == 2
    assert [e["path"] for e in stats["evidence"]] == [str(folder / n) for n in sorted(TOPICS)[:2]]
    with pytest.raises(InterruptedAnswer) as caught:
        summarize(prep, CutBeforeTheThird(), settings, NullReporter(), Tally())
    assert caught.value.answer.text == first + "\n\n" + second
    # probe 124: said "interrupted while the answer streamed" where none was streaming
    third_path = folder / sorted(TOPICS)[2]
    assert str(caught.value) == (f"interrupted while reading {third_path} (document 3 of 3): "
                                 "the summaries of documents 1-2 are kept")
    assert caught.value.answer.stats["windows"] == 2 and len(caught.value.answer.stats["evidence"]) == 2
    # each part traced to its own document; none to the document never reached
    assert {c.span.path for c in caught.value.answer.citations} == {str(folder / n) for n in sorted(TOPICS)[:2]}


def test_ctrl_c_between_two_documents_keeps_the_summaries_written(folder, tmp_path, monkeypatch):
    """Probe 124: a Ctrl-C that came while the second document's heading was written (or
    while a summary shown was checked) was outside the stream's guard: the first
    document's summary was lost, and --json's object was the error alone."""
    from ktcli.pipeline import summarize as summarize_module

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    first, second = (f"## {folder / name}\n{TOPICS[name]}" for name in sorted(TOPICS)[:2])
    names = sorted(TOPICS)

    class CutAtTheSecondHeading(Shown):
        def answer_text(self, delta):
            super().answer_text(delta)
            if names[1] in delta:
                raise KeyboardInterrupt

    with pytest.raises(InterruptedAnswer) as caught:
        summarize(prep, FirstLine(), settings, CutAtTheSecondHeading(), Tally())
    assert caught.value.answer.text == first
    assert str(caught.value) == (f"interrupted while reading {folder / names[1]} (document 2 of 3): "
                                 "the summaries of document 1 are kept")

    checked = []

    def cut_while_checking(text, source):
        checked.append(text)
        if len(checked) == 2:
            raise KeyboardInterrupt
        return False

    monkeypatch.setattr(summarize_module.citations, "says_nothing_of", cut_while_checking)
    with pytest.raises(InterruptedAnswer) as caught:
        summarize(prep, FirstLine(), settings, Shown(), Tally())
    assert caught.value.answer.text == first + "\n\n" + second  # the second, shown whole, kept
    assert str(caught.value) == (f"interrupted after the summary of {folder / names[1]} (document 2 of 3): "
                                 "the summaries of documents 1-2 are kept")


def test_a_document_past_the_window_alone_is_read_in_parts_with_the_others(folder, tmp_path):
    """The plan's estimate fit (the model's window); the backend's window is smaller than
    one document's own prompt: read as before, in parts, never sent past the window."""
    (folder / "bread.md").write_text("# Bread\n\n" + "Knead the dough until it is smooth. " * 200 + "\n")
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    assert prep.plan.mode is Mode.FULL and prep.plan.n_windows == 3
    backend, reporter = FirstLine(), Shown()
    backend.context_window = 1600
    summarize(prep, backend, settings, reporter, Tally())
    assert any("summarizing in parts" in w for w in reporter.lines)


def test_a_summarys_file_listing_counts_a_pdf_in_pages():
    """"paper.pdf (536 lines)" named no page a summary could cite."""
    from ktcli.pipeline.prompts import file_listing
    from ktcli.types import Document, Page

    pdf = Document(path="docs/paper.pdf", text="a\nb\nc", kind="pdf", pages=(Page(1, "a\nb"), Page(2, "c", 2)),
                   sha256="0" * 64)
    notes = Document(path="docs/notes.txt", text="x\ny\n", kind="text", sha256="1" * 64)
    assert file_listing([pdf, notes]) == "(all in docs/)\npaper.pdf (2 pages)\nnotes.txt (2 lines)"


def test_outline_always_says_which_files_have_no_outline(tmp_path):
    from .test_qa_pipeline import Warnings

    docs = tmp_path / "mixed"
    docs.mkdir()
    (docs / "app.py").write_text('"""The app."""\n\n\ndef main():\n    """Run it."""\n    return 0\n' * 40)
    (docs / "data.csv").write_text("id,name\n" + "".join(f"{i},n{i}\n" for i in range(200)))
    reporter = Warnings()
    prepare([str(docs)], "", "summarize", settings_for(tmp_path, mode="auto", outline="always"), reporter)
    assert [w for w in reporter.lines if "--outline always" in w] == [
        f"--outline always: {docs / 'data.csv'} has no outline (data, documents under 32,000 characters or without "
        "headings, code an outline would not shorten) "
        "and is read whole"]


def test_documents_past_the_window_together_are_each_summarized_alone_where_each_fits(tmp_path):
    """A folder 123 tokens over the window was read in two parts, and its summary was about
    the first document only."""
    docs = tmp_path / "big"
    docs.mkdir()
    for name, word in (("a.md", "tides"), ("b.md", "lanterns"), ("c.md", "fog")):
        (docs / name).write_text(f"# {word}\n\n" + f"The {word} of the harbor change with the season. " * 300)
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(docs)], "", "summarize", settings, NullReporter())
    assert prep.plan.input_tokens > prep.plan.context_window  # together, past the window
    assert prep.plan.mode is Mode.FULL and prep.plan.n_windows == 3
    assert any("each of its 3 documents fits it alone" in r for r in prep.plan.reasons)
    backend = FirstLine()
    answer = summarize(prep, backend, settings, NullReporter(), Tally())
    assert len(backend.calls) == 3 and answer.text.count("## ") == 3


def test_a_file_shorter_than_a_summary_is_shown_whole_not_summarized(folder, tmp_path):
    """mdurl's one-line `py.typed` took one of 8 places and was "summarized" as the
    instructions restated: "This is a summary of the content. It provides a brief overview"."""
    (folder / "py.typed").write_text("# Marker file for PEP 561\n")
    (folder / "setup.cfg").write_text("[flake8]\nmax-line-length = 100\n")
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    backend, reporter = FirstLine(), Shown()
    answer = summarize(prep, backend, settings, reporter, Tally())
    assert len(backend.calls) == 3  # the three notes only
    # probe 121: --json's figures said 2 model calls for 3 documents, one of them quoted
    assert (answer.stats["model_calls"], answer.stats["windows"]) == (3, 5)
    from tests.test_json_docs import _section

    assert "shows it whole" in _section("Figures")
    assert f"## {folder / 'py.typed'}\nThe whole file: `# Marker file for PEP 561`" in answer.text
    assert f"## {folder / 'setup.cfg'}\nThe whole file:\n```\n[flake8]\nmax-line-length = 100\n```" in answer.text
    assert "The whole file: `# Marker file for PEP 561`" in "".join(reporter.shown)


def test_files_shown_whole_have_a_first_token_time(tmp_path):
    """Probe 124: a summary of two one-line files, each shown whole, said "ttft_s": 0.0
    (and "ttft 0.0s") after 5 s: the first text shown is its first piece."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Alpha note: the pump runs at 5 l/s.\n")
    (docs / "b.txt").write_text("Beta note: the valve is shut.\n")
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(docs)], "", "summarize", settings, NullReporter())
    tally = Tally()
    answer = summarize(prep, FirstLine(), settings, Shown(), tally)
    assert answer.stats["model_calls"] == 0 and answer.stats["ttft_s"] is not None and tally.ttft_s > 0


def test_a_summary_of_markup_and_made_up_code_alone_is_said_to_be_none(folder, tmp_path):
    from .test_qa_pipeline import Warnings

    class MadeUp(FirstLine):
        def _reply(self, messages) -> str:
            return "<pre><code>\ndef launch_rockets(count):\n    return count * 3\n</code></pre>\n<p>\n"

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    reporter = Warnings()
    answer = summarize(prep, MadeUp(), settings, reporter, Tally())
    first = f"## {folder / sorted(TOPICS)[0]}\n(no summary: the model wrote nothing from this file)"
    assert answer.text.startswith(first)
    assert "launch_rockets" not in answer.text and "<p>" not in answer.text
    assert any("1 code block(s) that are not in the input (made up by the model) and 1 line(s) of HTML tags alone"
               in w for w in reporter.lines)


def test_a_summary_with_no_word_of_its_file_is_said(folder, tmp_path):
    from .test_qa_pipeline import Warnings

    class Generic(FirstLine):
        def _reply(self, messages) -> str:
            return "This is a summary of the content. It provides a brief overview of the content."

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    reporter = Warnings()
    summarize(prep, Generic(), settings, reporter, Tally())
    assert sum("holds no word of it" in w for w in reporter.lines) == 3


def test_summaries_cut_at_their_share_are_said_in_one_line(folder, tmp_path):
    """A summary of 8 files printed up to 7 lines "... reached its share of --max-new-tokens"."""
    from .test_qa_pipeline import Warnings

    class Long(FirstLine):
        def _reply(self, messages) -> str:
            return " ".join(f"w{i}" for i in range(400))  # no sentence twice: not stopped as a loop

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    reporter = Warnings()
    summarize(prep, Long(), settings, reporter, Tally())
    cut = [w for w in reporter.lines if "share of --max-new-tokens" in w]
    assert cut == [f"3 of 3 summaries reached their share of --max-new-tokens (128 tokens each) and may be cut short: "
                   f"{', '.join(str(folder / n) for n in sorted(TOPICS))}; --max-new-tokens 768 gives each "
                   "256"]


def test_each_summarys_figures_are_checked_against_its_own_document(folder, tmp_path):
    """Probe 103: eight summaries were checked as one text against the whole input, so a
    figure one document's summary took from another passed (its sentence, traced to its own
    document's lines only, was cited nowhere and nothing said), and a made-up one was said
    of "the summary" without naming which."""
    from .test_qa_pipeline import Warnings

    class Borrowing(FirstLine):
        def _reply(self, messages) -> str:
            prompt = messages[-1]["content"]
            if TOPICS["bread.md"] in prompt:  # 1871 is the lighthouse's
                return "The rye bread recipe dates from 1871 and bakes at 240 degrees."
            if TOPICS["release.md"] in prompt:
                return "Tidewatch 4.0 uses 9120 constituents."
            return super()._reply(messages)

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    reporter = Warnings()
    summarize(prep, Borrowing(), settings, reporter, Tally())
    bread, release = folder / "bread.md", folder / "release.md"
    assert any(f"the summary of {bread}'s figure 1871 stands in none of {bread}" in w for w in reporter.lines), \
        reporter.lines
    assert any(f"the summary of {release}'s figure 9120 stands in none of {release}" in w for w in reporter.lines)
    assert not any("lighthouse.md's" in w for w in reporter.lines)
    assert not any(w.startswith("the summary's") for w in reporter.lines)


def test_a_section_left_with_no_summary_is_not_said_to_be_cut_short(folder, tmp_path):
    """certifi's test file was "(no summary: ...)" and, on the next line, among the summaries
    that "may be cut short" at their share of --max-new-tokens (probe 117)."""
    from .test_qa_pipeline import Warnings

    first = sorted(TOPICS)[0]

    class LongAndMadeUp(FirstLine):
        def _reply(self, messages) -> str:
            if first in messages[-1]["content"]:  # all of it a made-up code block, to the budget
                return "```\n" + "\n".join(f"x{i} = {i}" for i in range(200)) + "\n```"
            return " ".join(f"w{i}" for i in range(400))

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    reporter = Warnings()
    answer = summarize(prep, LongAndMadeUp(), settings, reporter, Tally())
    assert answer.text.startswith(f"## {folder / first}\n(no summary: the model wrote nothing from this file)")
    cut = [w for w in reporter.lines if "share of --max-new-tokens" in w]
    assert len(cut) == 1 and cut[0].startswith("2 of 3 summaries reached their share") and str(folder / first) not in cut[0]


def test_one_blank_line_above_each_heading_whatever_the_part_before_ended_with(folder, tmp_path):
    """idna's summaries stopped at a repeat ended in the blank line before it, and the next
    "## path" stood under three blank lines (probe 117)."""
    class Ending(FirstLine):
        def _reply(self, messages) -> str:
            line = super()._reply(messages)
            if "bread" in messages[-1]["content"]:
                return line + "\n\n"  # the blank line before a repeat, shown
            return line + " " if "lighthouse" in messages[-1]["content"] else line

    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    reporter = Shown()
    summarize(prep, Ending(), settings, reporter, Tally())
    shown = "".join(reporter.shown)
    assert "\n\n\n" not in shown
    assert shown.count("\n\n## ") == 2, shown


def test_a_summary_of_files_all_shown_whole_loads_no_model(tmp_path, monkeypatch):
    """Two one-line files, each shown whole, took the model's load (seconds, ~300 MiB) all
    the same; a summary with one file to read loads it, once."""
    from ktcli.pipeline import api

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Alpha note: the pump runs at 5 l/s.\n")
    (docs / "b.md").write_text("# Beta\n\nThe valve is shut.\n")
    settings = settings_for(tmp_path, mode="auto")

    def never(*a):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(api, "_load", never)
    monkeypatch.setattr(api, "save_rates", lambda *a, **kw: None)
    answer = api.summarize_paths([str(docs)], settings, NullReporter())
    assert answer.text == (f"## {docs / 'a.txt'}\nThe whole file: `Alpha note: the pump runs at 5 l/s.`\n\n"
                           f"## {docs / 'b.md'}\nThe whole file:\n```\n# Beta\n\nThe valve is shut.\n```")
    assert answer.stats["model_calls"] == 0
    assert any("no model is loaded" in r for r in answer.plan.reasons)  # and so its plan said
    # each file shown whole cites all its lines (b.md was cited at line 3 alone; a file of
    # '# Title', '', 'Short note.' nowhere: its words matched no line)
    assert [(c.label, c.span.path, c.span.line_start, c.span.line_end) for c in answer.citations] == [
        (1, str(docs / "a.txt"), 1, 1), (2, str(docs / "b.md"), 1, 3)]

    (docs / "c.md").write_text(f"# c.md\n\n{TOPICS['bread.md']}\n" + "More words about it follow here. " * 5 + "\n")
    loads = []
    monkeypatch.setattr(api, "_load", lambda *a: loads.append(FirstLine()) or loads[-1])
    answer = api.summarize_paths([str(docs)], settings, NullReporter())
    assert len(loads) == 1 and len(loads[0].calls) == 1 and TOPICS["bread.md"] in answer.text
