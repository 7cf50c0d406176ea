"""An answer the model opens with a source tag of its own keeps its text, without the tag."""

from __future__ import annotations

import random

import pytest

from ktcli.engine.backend import GenStats, SamplingParams
from ktcli.engine.detokenize import StopStrings
from ktcli.pipeline.prompts import ANSWER_STOPS, LeadingSourceTag
from ktcli.pipeline.runner import Tally, stream_answer
from tests.pipeline.test_repetition import Recorder

# What the bundled model wrote for "Which module provides access to the command line
# arguments?" over the tutorial: the answer inside a tag of its own. With "<source" as a
# stop string the answer was empty.
OPENED = ('<source id="7" ref="sample_docs/python-tutorial-3.11.rst:1012-1021">\n\n'
          "The :mod:`sys` module provides a higher level interface to process command line arguments.\n")


def _pieces(text: str, seed: int) -> list[str]:
    rng, i, out = random.Random(seed), 0, []
    while i < len(text):
        step = rng.randint(1, 6)
        out.append(text[i : i + step])
        i += step
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_leading_tag_is_dropped(seed):
    lead = LeadingSourceTag()
    assert "".join(lead.feed(p) for p in _pieces(OPENED, seed)) == OPENED.split("\n\n", 1)[1]


@pytest.mark.parametrize("text", ["The answer is 42.", "<some> markup first", "  <so what", "<", ""])
def test_other_starts_pass_unchanged(text):
    lead = LeadingSourceTag()
    shown = "".join(lead.feed(p) for p in _pieces(text, 0))
    assert shown == (text if not (text.strip() and "<source".startswith(text.strip())) else "")


def test_tags_after_the_answer_still_end_it():
    stops = StopStrings(ANSWER_STOPS)
    text = 'The sys module.\n<source id="2" ref="x">\nmore'
    assert stops.feed(text) + stops.flush() == "The sys module."
    stops = StopStrings(ANSWER_STOPS)
    assert stops.feed(OPENED) + stops.flush() == OPENED  # a leading tag is no stop


class OpeningTagBackend:
    name = "opening-tag"

    def __init__(self) -> None:
        self._stats = GenStats()

    @property
    def last_stats(self) -> GenStats:
        return self._stats

    def stream_chat(self, messages, params):
        stops = StopStrings(params.stop)
        for piece in _pieces(OPENED + '</source>\n<source id="8" ref="y">\nnot shown', 1):
            out = stops.feed(piece)
            if out:
                yield out
            if stops.stopped:
                break
        self._stats = GenStats(prompt_tokens=10, new_tokens=30, prefill_s=0.1, decode_s=0.1)


def test_stream_answer_shows_the_answer_inside_an_opening_tag():
    reporter = Recorder()
    params = SamplingParams(stop=ANSWER_STOPS)
    text = stream_answer(OpeningTagBackend(), [{"role": "user", "content": "q"}], params, Tally(), reporter)
    assert text == OPENED.split("\n\n", 1)[1].strip()
    assert "".join(reporter.shown).strip() == text


@pytest.mark.parametrize("seed", range(5))
def test_the_prompts_format_echoed_at_the_start_is_dropped(seed):
    """One answer in four about code opened "Question: <the question>" then "Answer:"."""
    from ktcli.pipeline.prompts import LeadingEcho

    def run(text: str) -> str:
        strip = LeadingEcho()
        return "".join(strip.feed(p) for p in _pieces(text, seed))

    said = "It is defined in ktcli/retrieval/retriever.py [1]."
    assert run(f"Question: Where is `DEFINITION_BONUS` defined?\nAnswer: {said}") == said
    assert run(f"  question: where?\n\nANSWER:  {said}") == said
    assert run(f"Answer: {said}") == said
    for kept in (said, "Questions like this one are answered in the FAQ [2].", "The answer: 42 [1]."):
        assert run(kept) == kept
    assert run("Question: only the echo, no line break") == ""
    assert run("Question: Is it A or B? Answer: B [1].") == "B [1]."  # on one line


@pytest.mark.parametrize("said", ["A", "Q", "Ans", "  A"])
def test_a_start_held_as_a_possible_mark_is_kept_when_the_stream_ends(said):
    """A one-letter answer ("A", of a multiple choice) was held as the start of "Answer:"
    and lost: the user got "the model gave no answer"."""
    class Says:
        name, last_stats = "says", GenStats(prompt_tokens=3, new_tokens=1)

        def stream_chat(self, messages, params):
            yield said

    reporter = Recorder()
    assert stream_answer(Says(), [], SamplingParams(max_new_tokens=5), Tally(), reporter) == said.strip()
    assert "".join(reporter.shown).strip() == said.strip() and not reporter.warnings


@pytest.mark.parametrize("seed", range(5))
def test_an_answer_opened_with_a_line_break_is_shown_without_it(seed):
    """`ktcli ask click "In HelpFormatter.__init__, ...?"` printed an empty line before the
    answer; a first line's indent (code) stays."""
    from ktcli.pipeline.prompts import LeadingEcho

    def run(text: str) -> str:
        strip = LeadingEcho()
        return "".join(strip.feed(p) for p in _pieces(text, seed)) + strip.flush()

    assert run("\nThe helpFormatter class is designed [1].") == "The helpFormatter class is designed [1]."
    assert run(" \n\n    return 80\nis the line [2].") == "    return 80\nis the line [2]."
    assert run("\nAnswer: 80 [1].") == "80 [1]."
    assert run("\n  A") == "  A"
    # the format's echo and nothing else: no answer, not "Answer:" (a PDF manual's question)
    assert run("Question: How do I parse a DER encoded certificate?\nAnswer:") == ""
    assert run("Answer:\n").strip() == ""


@pytest.mark.parametrize("seed", range(6))
def test_source_tags_inside_an_answer_read_as_their_labels(seed):
    """Probe 101: "defined in `<source id="4" ref="clickrepo/src/click/exceptions.py:107-183">`"
    was printed as it was, four tags in one answer; the stops end an answer only at a tag
    after a space or a line break."""
    from ktcli.pipeline.prompts import InlineSourceTags

    def run(text: str) -> str:
        tags = InlineSourceTags()
        return "".join(tags.feed(p) for p in _pieces(text, seed)) + tags.flush()

    assert run('BadParameter is defined in `<source id="4" ref="click/exceptions.py:107-183">` and'
               '(<source id="12" ref="a b.py:1-9">) too.</source>') == "BadParameter is defined in [4] and([12]) too."
    for kept in ("if a < b and b <= c: `x` ```py", "a <sourcery> tag, <s>struck</s>", "ends on a backtick `",
                 "an open <source id=\"3\" ref=\"x"):
        assert run(kept) == kept  # (what never became a tag is given back whole)


def test_the_question_said_again_on_a_line_of_its_own_ends_the_answer():
    # The bundled model answered, wrote the question again, and answered it anew or echoed
    # the instructions: "...\nWhat is the rocket named?\nCiting sources like", all shown.
    from ktcli.pipeline.prompts import answer_stops

    question = "What is the rocket named?"
    stops = StopStrings(answer_stops(question))
    text = "The rocket is named Kestrel. [5]\n\nWhat is the rocket named?\nCiting sources like [1]."
    assert stops.feed(text) + stops.flush() == "The rocket is named Kestrel. [5]\n"
    stops = StopStrings(answer_stops(question))
    opened = "What is the rocket named? It is Kestrel. [1]"  # an answer that opens with it is kept
    assert stops.feed(opened) + stops.flush() == opened
    assert answer_stops("Why?") == ANSWER_STOPS  # too short to tell from an answer's own line
    assert answer_stops("  What is the rocket named?  ")[-1] == "\n" + question


def test_the_prompts_headings_in_bold_end_the_answer():
    """Probe 108: over the tutorial the bundled model answered "The pass statement does
    nothing." and went on "**Key facts:**" and empty bullets, all shown as the answer."""
    text = "The pass statement does nothing.\n\n**Key facts:** \n* \n* \n*"
    stops = StopStrings(ANSWER_STOPS)
    assert stops.feed(text) + stops.flush() == "The pass statement does nothing.\n"
    for heading in ("**Key facts**:", "**Sources:**", "**Question:** What?"):
        stops = StopStrings(ANSWER_STOPS)
        assert stops.feed(f"It is 42. [1]\n{heading}\nmore") + stops.flush() == "It is 42. [1]", heading
    bold = "**The pass statement** does nothing. [1]"  # an answer's own bold is no stop
    stops = StopStrings(ANSWER_STOPS)
    assert stops.feed(bold) + stops.flush() == bold
