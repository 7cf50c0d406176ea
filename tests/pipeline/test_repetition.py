"""Stopping an answer that has fallen into a verbatim loop, and nothing else."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ktcli.engine.backend import GenStats, SamplingParams
from ktcli.pipeline.repetition import RepetitionGuard
from ktcli.pipeline.runner import Tally, generate_text, stream_answer

TUTORIAL = Path(__file__).resolve().parents[2] / "sample_docs" / "python-tutorial-3.11.rst"
LOOP_LINE = "The :keyword:`*` syntax is used to accept a variable number of keyword arguments.\n\n"
OPENING = "Use the :keyword:`def` statement with ``name=value`` parameters.\n\n"


def _feed_in_pieces(guard: RepetitionGuard, text: str, seed: int = 0) -> int | None:
    """Stream `text` in random 1-6 character pieces; the character count at which the
    guard fired, or None."""
    rng, i = random.Random(seed), 0
    while i < len(text):
        step = rng.randint(1, 6)
        if guard.feed(text[i : i + step]):
            return i + step
        i += step
    return None


def test_a_repeated_sentence_is_caught_after_three_copies_and_kept_once():
    guard = RepetitionGuard()
    fired = _feed_in_pieces(guard, OPENING + LOOP_LINE * 20)
    assert fired is not None and fired <= len(OPENING) + 4 * len(LOOP_LINE)
    assert guard.kept().strip() == (OPENING + LOOP_LINE).strip()


def test_short_units_need_a_long_run():
    guard = RepetitionGuard()
    assert _feed_in_pieces(guard, "word " * 30) is None  # 150 characters: could be emphasis
    fired = _feed_in_pieces(RepetitionGuard(), "Answer: " + "word " * 100)
    assert fired is not None and fired <= len("Answer: ") + 250


@pytest.mark.parametrize(
    "text",
    [
        "| a | b |\n|---|---|\n| 1 | 2 |\n|---|---|\n| 3 | 4 |\n|---|---|\n",  # alike rows, not a loop
        "```python\n" + "    pass\n" * 6 + "```\n",  # a short repeated code line
        "".join(f"{i}. Install the package and run the tests.\n" for i in range(1, 12)),  # numbered alike items
        "\n" * 400,  # blank lines are not worth a stop
    ],
    ids=["table", "code", "numbered-list", "blank-lines"],
)
def test_ordinary_answers_are_not_stopped(text):
    assert _feed_in_pieces(RepetitionGuard(), text) is None


def test_real_prose_never_fires():
    text = TUTORIAL.read_text(encoding="utf-8")[:20000]
    for seed in range(3):
        assert _feed_in_pieces(RepetitionGuard(), text, seed) is None


class LoopingBackend:
    """Streams an opening line and then one sentence forever, as a small model does."""

    name = "looping"

    def __init__(self) -> None:
        self.closed = False
        self.streamed = 0
        self._stats = GenStats()

    @property
    def last_stats(self) -> GenStats:
        return self._stats

    def stream_chat(self, messages, params):
        try:
            yield OPENING
            while True:
                for word in LOOP_LINE.split(" "):
                    self.streamed += 1
                    yield word + " "
        finally:
            self.closed = True
            self._stats = GenStats(prompt_tokens=10, new_tokens=self.streamed, prefill_s=0.1, decode_s=0.1)


class Recorder:
    def __init__(self) -> None:
        self.shown, self.warnings = [], []

    def status(self, message):
        pass

    def progress(self, phase, done, total):
        pass

    def warn(self, message):
        self.warnings.append(message)

    def answer_text(self, delta):
        self.shown.append(delta)


def test_stream_answer_stops_the_backend_and_says_so():
    backend, reporter, tally = LoopingBackend(), Recorder(), Tally()
    text = stream_answer(backend, [{"role": "user", "content": "q"}], SamplingParams(), tally, reporter)
    assert backend.closed and backend.streamed < 60  # stopped, not run to the token limit
    assert tally.new_tokens == backend.streamed  # the backend's figures were recorded on close
    assert text.count("variable number of keyword arguments") == 1
    assert len(reporter.warnings) == 1 and "repeating" in reporter.warnings[0]
    assert tally.figures()["stopped_repeating"] == 1


def test_notes_keep_one_copy():
    backend, tally = LoopingBackend(), Tally()
    notes = generate_text(backend, [{"role": "user", "content": "q"}], SamplingParams(), tally, Recorder(), "notes")
    assert backend.closed
    assert notes.count("variable number of keyword arguments") == 1 and notes.startswith(OPENING.strip())
