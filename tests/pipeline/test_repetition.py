"""Stopping an answer that has fallen into a verbatim loop, and nothing else."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ktcli.engine.backend import GenStats, SamplingParams
from ktcli.pipeline.repetition import EchoedText, RepetitionGuard
from ktcli.pipeline.runner import Tally, generate_text, stream_answer

TUTORIAL = Path(__file__).resolve().parents[2] / "sample_docs" / "python-tutorial-3.11.rst"
# Numbered items that look alike but differ in a word: a list, not a loop.
SUITES = ["unit", "lint", "type", "fuzz", "smoke", "load", "soak", "chaos", "canary", "browser", "mobile"]
ALIKE_ITEMS = "".join(f"{i}. Install the package with pip and then run the {what} test suite.\n"
                      for i, what in enumerate(SUITES[:5], 1))
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
    assert _feed_in_pieces(guard, "NA, " * 30) is None  # 120 characters, no word: a row of data quoted
    fired = _feed_in_pieces(RepetitionGuard(), "Answer: " + "0, 1, " * 100)
    assert fired is not None and fired <= len("Answer: ") + 250


def test_a_word_said_eight_times_in_a_row_is_a_loop():
    """An answer about torch's autograd wrote "autograd." 27 times back to back before the
    span rule stopped it; emphasis says a word two or three times, not eight."""
    opening = "It is implemented in the `"
    guard = RepetitionGuard()
    fired = _feed_in_pieces(guard, opening + "autograd." * 40)
    assert fired is not None and fired <= len(opening) + 8 * len("autograd.") + 6
    assert guard.kept().startswith(opening + "autograd") and guard.kept().count("autograd") == 1
    assert _feed_in_pieces(RepetitionGuard(), "It is very, " * 2 + "very " * 5 + "old.") is None
    assert _feed_in_pieces(RepetitionGuard(), "```\n" + "self." * 40 + "x\n```\n") is None  # code is code


def test_a_short_line_said_five_times_is_a_loop_outside_code_only():
    """A summary listed "build/" on 29 lines before the guard stopped it (probe 94)."""
    guard = RepetitionGuard()
    text = "The repo holds:\n" + "build/\n" * 29
    fired = _feed_in_pieces(guard, text)
    assert fired is not None and fired <= len("The repo holds:\n") + 5 * len("build/\n") + 6  # (a piece past it)
    assert guard.kept() == "The repo holds:\nbuild/\n"
    assert _feed_in_pieces(RepetitionGuard(), "```\n" + "build/\n" * 29 + "```\n") is None  # code is code
    assert _feed_in_pieces(RepetitionGuard(), "Steps:\nbuild/\n" * 4) is None  # not back to back
    assert _feed_in_pieces(RepetitionGuard(), "ok\n" * 10) is None  # a word of 2 letters: too short to tell


def test_code_fences_alone_said_over_and_over_are_a_loop():
    """A notebook's answer streamed ~60 lines of ``` (empty code blocks, opened and
    closed) before the span rule stopped it (probe 98)."""
    for fence in ("```\n", "```python\n```\n"):
        guard = RepetitionGuard()
        fired = _feed_in_pieces(guard, "The cell failed:\n" + fence * 40)
        assert fired is not None and fired <= len("The cell failed:\n") + 6 * len(fence) + 6, fence  # (5 of a rotation)
    assert _feed_in_pieces(RepetitionGuard(), "Run:\n```\npip install x\n```\nthen:\n```\nx --help\n```\n") is None


def test_lines_that_only_count_up_are_a_loop_cut_to_their_first():
    """A summary of a 548 KB HTML manual wrote "The 1st note is: 1. 1." up to "The 23rd
    note is:" and the token limit (probe 115): each line unlike the last, no period."""
    suffix = {1: "st", 2: "nd", 3: "rd", 21: "st", 22: "nd", 23: "rd"}
    opening = "The summary notes are:\n\n"
    text = opening + "".join(f"The {i}{suffix.get(i, 'th')} note is: {i}. {i}.\n" for i in range(1, 24))
    guard = RepetitionGuard()
    fired = _feed_in_pieces(guard, text)
    assert fired is not None and fired < len(text) // 3
    assert guard.kept() == opening + "The 1st note is: 1. 1.\n"
    assert guard.said().startswith("it kept writing the same line with its numbers counting up (The 1st note is")
    # a table's rows change their figures otherwise; rows that differ in words are a list
    rows = "".join(f"| Q{q} | {r} | {m} |\n" for q, r, m in [(1, 5.21, 4.8), (2, 5.44, 4.9), (3, 5.87, 5.0),
                                                             (4, 5.83, 5.1), (5, 6.02, 5.2), (6, 6.1, 5.3)])
    assert _feed_in_pieces(RepetitionGuard(), rows) is None
    assert _feed_in_pieces(RepetitionGuard(), "".join(f"Chapter {i}: {w}\n" for i, w in enumerate(SUITES, 1))) is None
    # counting inside a code block is code, and code outside one too
    code = "".join(f"x{i} = load(part{i})\n" for i in range(9))
    assert _feed_in_pieces(RepetitionGuard(), "```\n" + code + "```\n") is None
    assert _feed_in_pieces(RepetitionGuard(), code) is None


@pytest.mark.parametrize(
    "text",
    [
        "| a | b |\n|---|---|\n| 1 | 2 |\n|---|---|\n| 3 | 4 |\n|---|---|\n",  # alike rows, not a loop
        "```python\n" + "    pass\n" * 6 + "```\n",  # a short repeated code line
        "".join(f"{i}. Install the package and run the {what} tests.\n" for i, what in enumerate(SUITES, 1)),  # alike items
        "\n" * 400,  # blank lines are not worth a stop
    ],
    ids=["table", "code", "numbered-list", "blank-lines"],
)
def test_ordinary_answers_are_not_stopped(text):
    assert _feed_in_pieces(RepetitionGuard(), text) is None


def test_real_prose_never_fires():
    # 12,000 characters, as long as the longest summaries: the guard rescans the text it
    # has at every piece, and the first 20,000 took ~12 s of the suite for three seeds
    text = TUTORIAL.read_text(encoding="utf-8")[:12000]
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
    assert "".join(reporter.shown).count("variable number of keyword arguments") == 1  # the user saw it once
    assert len(reporter.warnings) == 1 and "repeat" in reporter.warnings[0]
    assert tally.figures()["stopped_repeating"] == 1


def test_notes_keep_one_copy():
    backend, tally = LoopingBackend(), Tally()
    notes = generate_text(backend, [{"role": "user", "content": "q"}], SamplingParams(), tally, Recorder(), "notes")
    assert backend.closed
    assert notes.count("variable number of keyword arguments") == 1 and notes.startswith(OPENING.strip())


def _stream(echo: EchoedText, text: str, seed: int = 0) -> str:
    """`text` in random 1-6 character pieces; what the user would have seen."""
    rng, i, seen = random.Random(seed), 0, []
    while i < len(text) and not echo.repeated:
        step = rng.randint(1, 6)
        seen.append(echo.feed(text[i : i + step]))
        i += step
    return "".join(seen) + echo.flush()


README_LOOP = ("The revenue in the third quarter was $21.4 million.\n"
               "The report also mentions a recordable incident, a workplace injury that needs treatment.\n")


@pytest.mark.parametrize("seed", range(4))
def test_a_long_line_said_twice_is_never_shown_twice(seed):
    echo = EchoedText()
    extra = "The report also mentions a recordable incident, a workplace injury that needs treatment.\nAnd more."
    shown = _stream(echo, README_LOOP + extra, seed)
    assert shown == README_LOOP and echo.repeated.startswith("The report also mentions")


@pytest.mark.parametrize("seed", range(3))
def test_a_line_that_starts_like_an_earlier_one_is_shown_once_it_differs(seed):
    text = ("The chief executive officer of the company is Miriam Okafor.\n"
            "The chief executive officer of the company joined in 2009, she says.\n")
    cut = "The chief executive officer of the company"  # the token limit, mid-repeat
    echo = EchoedText()
    assert _stream(echo, text + cut, seed) == text and not echo.repeated


@pytest.mark.parametrize(
    "text",
    [
        "```python\n" + "    print('the same long line of code, printed again and again')\n" * 3 + "```\n",
        "Short line.\nShort line.\nShort line.\n",
        ALIKE_ITEMS,
    ],
    ids=["code", "short-lines", "numbered-list"],
)
def test_repeats_that_are_not_loops_are_shown(text):
    echo = EchoedText()
    assert _stream(echo, text) == text and not echo.repeated


def test_a_repeat_as_the_last_unfinished_line_is_dropped():
    echo = EchoedText()
    assert _stream(echo, README_LOOP + README_LOOP.splitlines()[1]) == README_LOOP


WRAPPED_LOOP = ("The next section is about class objects.\n\n"
                "The example is a bit of a cheat, but it is actually a good example of how to create\n"
                "class instances.  The example is a bit of a cheat, but it is actually a good example\n"
                "of how to create class instances.  The example is a bit of a cheat, but it is actually\n"
                "a good example of how to create class instances.")


@pytest.mark.parametrize("seed", range(4))
def test_a_sentence_repeated_with_other_line_breaks_is_never_shown_twice(seed):
    # What the bundled model wrote for "How do I define a class?": one sentence five times,
    # each copy wrapped at other words, so no line ever repeated.
    echo = EchoedText()
    shown = _stream(echo, WRAPPED_LOOP, seed)
    assert shown.count("a bit of a cheat") == 1
    assert shown.rstrip().endswith("class instances.")
    assert echo.repeated.startswith("The example is a bit of a cheat")


@pytest.mark.parametrize(
    "text",
    [
        ALIKE_ITEMS,
        "a) Install the package with pip and then run the test suite. b) Install the package with pip "
        "and then run the test suite, then tag it.\n",
        "It is short. It is short. It is short. It is short.\n",
        "```text\nThe same long sentence written in a code block, twice. The same long sentence written "
        "in a code block, twice.\n```\n",
    ],
    ids=["numbered-items", "lettered-items", "short-sentences", "code"],
)
def test_sentences_that_are_not_loops_are_shown(text):
    echo = EchoedText()
    assert _stream(echo, text) == text and not echo.repeated


INGEST_SUMMARY = ("The code is written in Python. It is a part of the main.ktcli. It is a tool that helps to "
                  "clean and organize files. It is written in Python." + " It is written in Python." * 10)


@pytest.mark.parametrize("seed", range(4))
def test_a_short_sentence_repeated_back_to_back_is_shown_once(seed):
    # What the bundled model ended a summary of ktcli's ingest/ folder with.
    echo = EchoedText()
    shown = _stream(echo, INGEST_SUMMARY, seed)
    assert shown.count("It is written in Python.") == 1
    assert shown.startswith("The code is written in Python.") and echo.repeated == "It is written in Python."


@pytest.mark.parametrize("seed", range(3))
def test_a_short_line_repeated_back_to_back_is_shown_once(seed):
    text = "## Building\n\n# Build the Makefile\n# Build the Makefile\n# Build the Makefile\n"
    echo = EchoedText()
    assert _stream(echo, text, seed) == "## Building\n\n# Build the Makefile\n"


@pytest.mark.parametrize(
    "text",
    [
        "Returns: the parsed value.\nload(path)\nReturns: the parsed value.\n",  # recurs apart
        "Run the command below.\n```sh\nmake test\n```\nRun the command below.\n",  # code between
        "```python\nprint('one more line')\nprint('one more line')\n```\n",  # code is not checked
        "It is short. It is short. It is short.\n",  # under min_adjacent
    ],
    ids=["apart", "across-code", "in-code", "very-short"],
)
def test_short_repeats_that_are_not_back_to_back_loops_are_shown(text):
    echo = EchoedText()
    assert _stream(echo, text) == text and not echo.repeated


def test_a_repeated_last_sentence_without_a_break_after_it_is_dropped():
    text = "Classes bundle data and functionality together in Python. " * 2
    echo = EchoedText()
    assert _stream(echo, text.rstrip()).strip() == text.split(". ")[0] + "."


def test_a_repeated_line_with_trailing_spaces_is_shown_once():
    line = "The harbor lantern is lit every evening at dusk by Anna"
    echo = EchoedText()
    shown = "".join(echo.feed(p) for p in [line, "\n", line, "  ", "\n", "More text after."]) + echo.flush()
    assert shown == line + "\n" and echo.repeated


@pytest.mark.parametrize("seed", range(4))
def test_a_line_said_again_under_the_next_label_is_never_shown_twice(seed):
    line = "The tax rate is defined in `src/pkg/core.py`. [{}]\n"
    echo = EchoedText()
    shown = _stream(echo, "".join(line.format(i) for i in range(1, 6)), seed)
    assert shown == line.format(1) and echo.repeated


@pytest.mark.parametrize("seed", range(4))
def test_the_label_an_answer_ends_with_is_shown(seed):
    """"... in Q3. [1] Net income was 1.93 million. [2]" lost its [2]: held as the start of
    a sentence like the one before ("[0] Net income ..."), and dropped when the stream ended."""
    answer = "Revenue was 5.87 million in Q3. [1] Net income was 1.93 million. [2]"
    echo = EchoedText()
    assert _stream(echo, answer, seed) == answer and not echo.repeated


def test_a_loop_that_only_counts_its_citation_markers_up_is_stopped():
    """'The deploy script uses the [1] to [2] to [3] to ... [78' ran to the token limit."""
    guard = RepetitionGuard()
    text = "The deploy script uses the " + " to ".join(f"[{i}]" for i in range(1, 200))
    fired = next(i for i, ch in enumerate(text) if guard.feed(ch))
    assert fired < 400 and guard.kept().startswith("The deploy script uses the [1] to [2]")
    assert len(guard.kept()) < 120
    # Sources cited in turn are no loop: words between them differ.
    calm = RepetitionGuard()
    prose = " ".join(f"Point {w} is covered in [{i}]." for i, w in enumerate("abcdefghijklmnopqrstuvwxyz", 1))
    assert not any(calm.feed(ch) for ch in prose)


def test_a_loop_that_counts_up_inside_markup_is_stopped():
    """'<span id="1" class="c-1"></span>' ... 'id="7"': each line unlike the last, none stopped."""
    guard = RepetitionGuard()
    text = "<pre><code>\n" + "".join(f'<span id="{i}" class="c-{i}"></span>\n' for i in range(1, 200))
    fired = next(i for i, ch in enumerate(text) if guard.feed(ch))
    assert fired < 500 and guard.kept().count("<span") == 1
    # text that differs between the tags is no loop
    calm = RepetitionGuard()
    prose = "".join(f'<li id="{i}">Step {w} of the install.</li>\n' for i, w in enumerate("abcdefghijklmnop", 1))
    assert not any(calm.feed(ch) for ch in prose)


def test_code_that_counts_its_indices_is_no_citation_loop():
    guard = RepetitionGuard()
    code = "\n".join(f"buf[{i}] = 0;" for i in range(10, 80))
    assert not any(guard.feed(ch) for ch in code)


@pytest.mark.parametrize("seed", range(3))
def test_loops_in_cjk_and_arabic_are_stopped_as_soon_as_english_ones(seed):
    """Lengths were in characters and sentences ended only at . ! ?: a 9-character
    Japanese heading looped 14 times to the token limit, a Chinese sentence 20 times."""
    heading = "## 社長は誰ですか？\n"
    # (a CJK sentence ends at its 。 or ？: the line break after it may not have come yet)
    assert _stream(EchoedText(), "社長は山田です。\n\n" + heading * 14, seed).rstrip() == "社長は山田です。\n\n" + heading.rstrip()
    zh = "长江大桥于一九五七年建成。"
    assert _stream(EchoedText(), "答案如下：" + zh * 20, seed) == "答案如下：" + zh  # what it said after the colon
    assert _stream(EchoedText(), "Answer: It is written in Python." + " It is written in Python." * 5, seed) == \
        "Answer: It is written in Python. "
    ar = "من بنى جسر النيل؟ "
    assert _stream(EchoedText(), ar * 6, seed) == ar
    # a loop of a short CJK phrase stops within ~240 characters' width, as an English one does
    guard = RepetitionGuard()
    fired = _feed_in_pieces(guard, "回答：" + "我不知道" * 100, seed)
    assert fired is not None and fired <= len("回答：") + 130 and guard.kept() == "回答：我不知道"


GREYROCK_ITEM = "Investigate and treat the Greyrock adit discharge before it reaches Tallow Beck."
GREYROCK = ("The recommendations in chapter 13 are:\n\n"
            "1. Replace the culvert under the haul road.\n"
            "2. Fence the open stope above the mill.\n"
            + "".join(f"{i}. {GREYROCK_ITEM}\n" for i in range(3, 20)))


@pytest.mark.parametrize("seed", range(4))
def test_a_numbered_item_said_again_under_the_next_number_is_never_shown_twice(seed):
    # What the bundled model wrote for "What are the recommendations in chapter 13?": one
    # sentence 17 times, only its number counting up, to the token limit.
    echo = EchoedText()
    shown = _stream(echo, GREYROCK, seed)
    assert shown == GREYROCK.split("4. ")[0] and echo.repeated == GREYROCK_ITEM
    # lettered the same; and one of 16+ characters right after itself, under either
    assert _stream(EchoedText(), f"a) {GREYROCK_ITEM}\nb) {GREYROCK_ITEM}\n", seed) == f"a) {GREYROCK_ITEM}\n"
    assert _stream(EchoedText(), "1. Plant more alders.\n2. Plant more alders.\n3. Plant", seed) == \
        "1. Plant more alders.\n"
    # without the full stop that ends a sentence: the line is the item
    looping = "".join(f"{i}) Monitor the beck below the adit\n" for i in range(1, 6))
    assert _stream(EchoedText(), looping, seed) == "1) Monitor the beck below the adit\n"


@pytest.mark.parametrize("seed", range(3))
def test_numbered_items_that_differ_in_a_word_are_shown_and_numbers_alone_are_not_held_back(seed):
    assert _stream(EchoedText(), ALIKE_ITEMS, seed) == ALIKE_ITEMS
    short = "1. Plant more alders.\n2. Plant more willows.\n3. Plant more alders.\n"  # 16+ but apart
    assert _stream(EchoedText(), short, seed) == short
    # an answer that ends in a number or a letter on a line of its own keeps it
    for last in ("42", "B", "7."):
        text = f"{GREYROCK_ITEM}\nThe answer is:\n{last}"
        assert _stream(EchoedText(), text, seed) == text


def test_a_numbered_list_that_loops_on_a_short_item_is_stopped_by_the_loop_guard():
    text = "Steps:\n" + "".join(f"{i}. See above.\n" for i in range(1, 60))
    guard = RepetitionGuard()
    fired = _feed_in_pieces(guard, text)
    # periodic from item 10 on (two digits), then 240 characters of copies
    assert fired is not None and fired < text.index("27. ")
    assert guard.kept().startswith("Steps:\n1. See above.\n") and guard.kept().count("See above.") <= 10
    guard = RepetitionGuard()
    assert _feed_in_pieces(guard, "Steps:\n" + "".join(f"{i}. See above.\n" for i in range(10, 60))) is not None
    assert guard.kept() == "Steps:\n10. See above.\n"


class NumberedLoopBackend(LoopingBackend):
    """Streams the Greyrock answer's list, one item again and again under a rising number."""

    def stream_chat(self, messages, params):
        try:
            yield GREYROCK.split("3. ")[0]
            for i in range(3, 40):  # to the token limit: 37 items of 12 words
                for word in f"{i}. {GREYROCK_ITEM}\n".split(" "):
                    self.streamed += 1
                    yield word + " "
        finally:
            self.closed = True
            self._stats = GenStats(prompt_tokens=10, new_tokens=self.streamed, prefill_s=0.1, decode_s=0.1)


def test_stream_answer_stops_a_numbered_loop_and_says_it_repeated_not_ran_out():
    backend, reporter, tally = NumberedLoopBackend(), Recorder(), Tally()
    params = SamplingParams(max_new_tokens=384)
    text = stream_answer(backend, [{"role": "user", "content": "q"}], params, tally, reporter)
    assert backend.closed and backend.streamed < 40
    assert text.count("Greyrock") == 1 and "".join(reporter.shown).count("Greyrock") == 1
    assert text.endswith(f"3. {GREYROCK_ITEM}")
    assert len(reporter.warnings) == 1 and "repeating an earlier line" in reporter.warnings[0]
    assert "hit_max_new_tokens" not in tally.figures() and tally.figures()["stopped_repeating"] == 1


def test_a_step_shared_by_two_lists_is_no_repeat():
    """"On Linux: ... 2. Download the installer" then "On macOS: 1. Download the installer":
    a list that starts again, not a loop; everything after it was held back."""
    from ktcli.pipeline.repetition import EchoedText

    text = ("On Linux:\n1. Open a terminal window on your machine.\n2. Download the installer from the official "
            "website.\n3. Run it with sudo.\n\nOn macOS:\n1. Download the installer from the official website.\n"
            "2. Double-click the package to install it.\n3. Restart the machine when it asks you to.\n")
    echo = EchoedText()
    shown = "".join(echo.feed(text[i:i + 3]) for i in range(0, len(text), 3)) + echo.flush()
    assert shown == text and not echo.repeated


@pytest.mark.parametrize("seed", range(3))
def test_the_repeat_is_quoted_as_the_model_wrote_it(seed):
    # The note on stderr quoted the compared form: "(The museum ticket cost 18 euros. [0]...)",
    # a label no answer has, and "[0] The Pro plan costs ..." for an answer's "[1] The Pro ...".
    echo = EchoedText()
    text = ("The museum ticket cost 18 euros, paid at the door. [1]\n"
            "The museum ticket cost 18 euros, paid at the door. [2]\nMore.")
    _stream(echo, text, seed)
    assert "[0]" in echo.repeated  # compared without the label's number
    assert echo.repeated_as_written == "The museum ticket cost 18 euros, paid at the door. [2]"


ORDINALS = "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split()


@pytest.mark.parametrize("seed", range(3))
def test_copies_that_count_up_in_ordinals_end_at_the_third(seed):
    # Probe 102: the bundled model wrote "The first part of the report describes ..." and the
    # same under "second" to "eighteenth", to the token limit, each sentence unlike the last.
    part = "part of the report describes the harbor light and its history."
    text = " ".join(f"The {o} {part}" for o in ORDINALS)
    echo = EchoedText()
    assert _stream(echo, text, seed) == f"The first {part} The second {part} "
    assert echo.repeated_as_written == f"The third {part}"
    lines = "".join(f"- The {o} chapter is about the harbor light and its keepers\n" for o in ORDINALS)
    assert _stream(EchoedText(), lines, seed) == "".join(lines.splitlines(keepends=True)[:2])
    steps = " ".join(f"The {i}th step of the process is to check the light and its lamp." for i in range(4, 12))
    assert _stream(EchoedText(), steps, seed).count("step of the process") == 2
    # two alike may be so, and a third that differs in a word is shown
    fine = (f"The first argument is the path to the file to read. The second argument is the path to the file "
            f"to read. The third argument is the mode to open it in.")
    assert _stream(EchoedText(), fine, seed) == fine


def test_a_short_line_between_blank_lines_is_a_loop_at_its_fifth_copy():
    # probe 135: `ktcli summarize mv.1.gz` wrote "MV(1)" and a blank line 35 times
    guard = RepetitionGuard()
    fed = 0
    while not guard.feed("MV(1)") and not guard.feed("\n\n"):
        fed += 1
        assert fed < 10
    assert fed == 4 and guard.kept().strip() == "MV(1)"
    # a list of short lines that differ is no loop
    other = RepetitionGuard()
    assert not any(other.feed(f"- item {c}\n\n") for c in "abcdefghij")


@pytest.mark.parametrize("seed", range(4))
def test_a_short_paragraph_said_again_after_a_blank_line_is_shown_once(seed):
    # `RepetitionGuard` alone showed "MV(1)" five times (probe 135); a fragment of its own
    # paragraph ends the answer at its second copy, a sentence at its third
    for loop, shown in (("MV(1)\n\n", "MV(1)\n\n"), ("## mv(1)\n\n", "## mv(1)\n\n"),
                        ("It is small.\n\n", "It is small.\n\nIt is small.\n\n")):
        echo = EchoedText()
        assert _stream(echo, "A summary of mv.\n\n" + loop * 30, seed) == "A summary of mv.\n\n" + shown
        assert echo.repeated == loop.strip()
    # as stream_answer shows it, from the model's own pieces
    class Pieces(LoopingBackend):
        def stream_chat(self, messages, params):
            try:
                for piece in ["MV", "(", "1", ")", "\n\n"] * 35:
                    self.streamed += 1
                    yield piece
            finally:
                self.closed = True

    backend, reporter = Pieces(), Recorder()
    text = stream_answer(backend, [{"role": "user", "content": "x"}], SamplingParams(max_new_tokens=400), Tally(),
                         reporter)
    assert text == "MV(1)" and "".join(reporter.shown) == "MV(1)\n\n" and backend.streamed == 10  # at the second copy's line break
    assert len(reporter.warnings) == 1 and "repeating an earlier line" in reporter.warnings[0] \
        and "(MV(1))" in reporter.warnings[0]


@pytest.mark.parametrize(
    "text",
    [
        "Answers:\n\n- yes\n\n- yes\n\n- yes\n\n- yes\n",  # a loose list: each item its answer
        "Answers:\n- yes\n- yes\n- yes\n",
        "| a | yes |\n\n| b | yes |\n\n| c | yes |\n",
        "Is it installed?\n\nYes.\n\nIs it running?\n\nYes.\n",  # apart
        "Yes.\n\nYes.\n",  # a sentence twice: two answers may be so
        "## Usage\n\nRun it.\n\n## Usage\n\nSee above.\n",  # headings apart
        "MV(1)\nNAME\n\nMV(1)\n",  # the first copy no paragraph of its own
        "```\nmain\n\nmain\n\nmain\n```\n",  # code is not checked
        "...\n\n...\n\n...\n",  # no words
    ],
    ids=["loose-list", "list", "table-rows", "apart", "sentence-twice", "headings", "not-alone", "code", "no-words"],
)
def test_short_paragraphs_that_are_not_loops_are_shown(text):
    for seed in range(3):
        echo = EchoedText()
        assert _stream(echo, text, seed) == text and not echo.repeated
