"""Calls into a Backend that add up their figures across the windows of one request."""

from __future__ import annotations

import re
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ktcli.engine.backend import Backend, Message, SamplingParams
from ktcli.errors import InterruptedAnswer, interruption
from ktcli.pipeline.citations import Relabel
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.notes_memo import NotesMemo
from ktcli.pipeline.prompts import InlineSourceTags, LeadingEcho, LeadingSourceTag
from ktcli.pipeline.repetition import EchoedText, RepetitionGuard
from ktcli.pipeline.summary_lines import SummaryLines
from ktcli.types import Answer


@dataclass
class Tally:
    started: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    model_calls: int = 0
    ttft_s: float = 0.0  # from the request's start to the first streamed answer token (0: none yet)
    reused_tokens: int = 0  # prompt tokens read from the engine's prefix store, not prefilled
    reuse_s: float = 0.0  # reading them (counted in prefill_s too)
    notes_calls: int = 0  # steps that wrote notes for the next window (`generate_text`)
    notes_tokens: int = 0  # the tokens they wrote: what the plan expects a step to write
    notes_kept: int = 0  # steps whose notes were read back from an earlier run (`notes_memo`)
    # For rates without context (`plan.estimates.rates_without_context`): per call, the
    # prompt's tokens squared less those read back squared, and new tokens x their mean context.
    prompt_square: float = 0.0
    decode_context: float = 0.0
    extra: dict = field(default_factory=dict)

    def add(self, backend: Backend) -> None:
        s = backend.last_stats
        self.prompt_tokens += s.prompt_tokens
        self.new_tokens += s.new_tokens
        self.prefill_s += s.prefill_s
        self.decode_s += s.decode_s
        self.model_calls += 1
        reused = int(s.extra.get("reused_tokens", 0))
        self.reused_tokens += reused
        self.prompt_square += s.prompt_tokens ** 2 - reused ** 2
        self.decode_context += s.new_tokens * (s.prompt_tokens + s.new_tokens / 2)
        self.reuse_s += float(s.extra.get("reuse_s", 0.0))
        self.extra.update(s.extra)

    def figures(self) -> dict:
        # The last call's own figures first, the run's totals over them: the engine's
        # extras carry that call's prefill and decode rates, which replaced the run's.
        return {
            **{k: v for k, v in self.extra.items() if isinstance(v, (int, float, str))},
            "tokens_in": self.prompt_tokens,
            "tokens_out": self.new_tokens,
            "model_calls": self.model_calls,
            # null, not 0.0, where no answer text came: a run interrupted before its first
            # token (a summary's notes kept) said "ttft_s": 0.0 after minutes of reading
            "ttft_s": round(self.ttft_s, 3) if self.ttft_s else None,
            "prefill_tok_s": self._prefill_rate(),
            "decode_tok_s": round(self.new_tokens / self.decode_s, 1) if self.decode_s else 0.0,
            "total_s": round(time.perf_counter() - self.started, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "reused_tokens": self.reused_tokens,
            "notes_kept": self.notes_kept,
        }

    def first_shown(self) -> None:
        """The answer's first text is shown now (a streamed token, or a file a summary
        quotes whole), unless it was before."""
        if not self.ttft_s:
            self.ttft_s = time.perf_counter() - self.started

    def _prefill_rate(self) -> float:
        """Tokens prefilled per second of prefilling, the prompt cache's reads left out of
        both (930 of 931 tokens read back gave "3.5 tok/s"); 0 (not measured) under
        MIN_RATE_TOKENS computed."""
        computed, seconds = self.prompt_tokens - self.reused_tokens, self.prefill_s - self.reuse_s
        return round(computed / seconds, 1) if computed >= MIN_RATE_TOKENS and seconds > 0 else 0.0


MIN_RATE_TOKENS = 64


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


@contextmanager
def _prefill_shown(backend: Backend, reporter: Reporter):
    """A bar (a line every half minute in a log) while the backend reads a long prompt,
    where it tells how far it is (our engine): a 30K-token summary read for a minute with
    nothing said after its plan."""
    if not hasattr(backend, "on_prefill"):
        yield
        return
    backend.on_prefill = lambda done, total: reporter.progress(PREFILL_PHASE, done, total)
    try:
        yield
    finally:
        backend.on_prefill = None


PREFILL_PHASE = "reading the prompt (tokens)"


def generate_text(backend: Backend, messages: list[Message], params: SamplingParams, tally: Tally,
                  reporter: Reporter, phase: str) -> str:
    """A non-final step (notes): collect the text, show it as progress only."""
    guard, echo, lead = RepetitionGuard(), EchoedText(), LeadingSourceTag()
    before = backend.last_stats
    pieces = backend.stream_chat(messages, params)
    with _prefill_shown(backend, reporter):
        try:
            for piece in map(lead.feed, pieces):
                looping = guard.feed(piece)
                echo.feed(piece)
                reporter.progress(phase, len(guard.text), 0)
                if looping or echo.repeated:
                    break
        except Exception:
            _count_failed_call(backend, before, tally)
            raise
        finally:
            pieces.close()  # a loop stops the backend here: no more tokens are generated
    tally.add(backend)
    tally.notes_calls += 1
    tally.notes_tokens += backend.last_stats.new_tokens
    if guard.unit or echo.repeated:
        tally.extra["stopped_repeating"] = tally.extra.get("stopped_repeating", 0) + 1
    # notes carry one copy of a repeated line, not twenty
    return guard.kept().strip() if guard.unit else (echo.shown + echo.flush()).strip()


def _count_failed_call(backend: Backend, before, tally: Tally) -> None:
    """A call that failed after the backend recorded its figures (a stream a server cut
    off: its prompt was sent, its text received) counted in the run's: --json's figures of
    a cut run said model_calls and tokens_in without it."""
    if backend.last_stats is not before:
        tally.add(backend)


def take_notes(backend: Backend, messages: list[Message], params: SamplingParams, tally: Tally,
               reporter: Reporter, memo: NotesMemo | None, doing: str) -> str:
    """A step writing notes for the next window, said as `doing`: read back where `memo`
    holds this step's notes from an earlier run, else generated (and kept there)."""
    kept = memo.get(messages) if memo is not None else None
    if kept is not None:
        tally.notes_kept += 1
        reporter.status(f"{doing} (its notes kept from an earlier run)")
        return kept
    reporter.status(doing)
    new = generate_text(backend, messages, params, tally, reporter, "notes")
    if memo is not None:
        memo.put(messages, new)
    return new


def first_ones(noun: str, read: int) -> str:
    """The `noun`s 1 to `read` as said: "part 1" alone, not "parts 1-1" (probe 108); else
    "parts 1-3" (parts, windows, documents read before an interruption)."""
    return f"{noun} 1" if read == 1 else f"{noun}s 1-{read}"


class AnswerInterrupted(KeyboardInterrupt):
    """Ctrl-C while an answer streamed, with the text shown so far: a caller that can cite
    it does (`pipeline.qa`); to any other it is the KeyboardInterrupt it was. `doing`: what
    was going on, as the error says it after "interrupted" (default: the answer streaming)."""

    def __init__(self, shown: str, doing: str = "") -> None:
        super().__init__()
        self.shown = shown
        self.doing = doing


STREAMING = "while the answer streamed"


class Streamed:
    """An answer's text, whole or as far as Ctrl-C let it stream (`cited_if_interrupted`)."""

    def __init__(self) -> None:
        self.text = ""
        self.interrupted = False
        self.doing = STREAMING

    def finish(self, answer_of: Callable[[str], Answer]) -> Answer:
        answer = answer_of(self.text)
        if self.interrupted:  # the part shown keeps the Sources it can be traced to (exit 130)
            raise InterruptedAnswer(f"{interruption()[0]} {self.doing}", answer)
        return answer


@contextmanager
def cited_if_interrupted():
    """Around a `stream_answer` whose caller builds an Answer from its text: Ctrl-C mid-answer
    leaves the text shown in the yielded `Streamed`, and its `finish` raises that Answer as
    an InterruptedAnswer (the CLI keeps it: Sources, or --json's "incomplete": true)."""
    streamed = Streamed()
    try:
        yield streamed
    except AnswerInterrupted as e:
        streamed.text, streamed.interrupted = e.shown.strip(), True
        streamed.doing = e.doing or STREAMING


_LABEL = re.compile(r"\[\d{1,3}\]")
# What may stand around the labels of an answer that is labels alone: punctuation, a
# label not yet closed ("[1] [2"), and words that only point at one ("The answer is: [1].",
# "See [1]."; not "Yes [1].", which answers).
_LABEL_OPENED = re.compile(r"\[\d{0,3}$")
_POINTING = frozenset("the answer answers is are source sources see according to here".split())
_WORD_RUN = re.compile(r"\w+")
_BETWEEN_LABELS = re.compile(r"[\s.,;:!]*")


def _labels_alone_so_far(text: str) -> bool:
    """Whether `text`, the start of an answer, is so far labels and pointing words alone
    (its last word may be cut: a start of one of them counts). One linear pass each."""
    rest = _LABEL_OPENED.sub("", _LABEL.sub(" ", text))
    words = _WORD_RUN.findall(rest)
    if not _BETWEEN_LABELS.fullmatch(_WORD_RUN.sub(" ", rest)):
        return False
    if words and rest[-1:].isalnum():  # still being written
        last = words.pop().lower()
        if not any(w.startswith(last) for w in _POINTING):
            return False
    return all(w.lower() in _POINTING for w in words)


class LabelsFirst:
    """Holds an answer's start back while it is source labels alone: the bundled model
    answered questions the input could not ("What is the capital of France?", "Who wrote
    Hamlet?" of the sample repo) with "[1]" or "The answer is: [1]." and stopped, shown as
    the answer with `.gitignore` under Sources. The first other word releases what was
    held; at the end, `labels` is what an answer of labels alone wrote ("" where it wrote
    words, or nothing)."""

    def __init__(self) -> None:
        self.held = ""
        self.released = False

    def feed(self, text: str) -> str:
        if self.released or not text:
            return text
        self.held += text
        if _labels_alone_so_far(self.held):
            return ""
        self.released = True
        out, self.held = self.held, ""
        return out

    def flush(self) -> str:
        """At the end: what was held, unless it is labels alone ("The answer is" is shown)."""
        if self.released or self.labels:
            return ""
        self.released = True
        out, self.held = self.held, ""
        return out

    @property
    def labels(self) -> str:
        return "" if self.released else " ".join(_LABEL.findall(self.held))


def labels_only(text: str) -> str:
    """The labels of `text` where it is source labels alone ("[1]", "[1] [2]."), else ""."""
    held = LabelsFirst()
    held.feed(text)
    return held.labels


def _answer_pieces(pieces: Iterator[str]) -> Iterator[str]:
    """`pieces` less a "Question: ..." / "Answer:" start (`prompts.LeadingEcho`), with the
    source tags written inside its text as their labels (`prompts.InlineSourceTags`), and
    what either still holds when they end (a one-letter answer)."""
    strip, tags = LeadingEcho(), InlineSourceTags()
    for piece in pieces:
        yield tags.feed(strip.feed(piece))
    yield tags.feed(strip.flush()) + tags.flush()


def stream_answer(backend: Backend, messages: list[Message], params: SamplingParams, tally: Tally,
                  reporter: Reporter, budget: str = "--max-new-tokens", subject: str = "the answer",
                  longer: str = "", source: str | None = None, cut: list[str] | None = None,
                  labels: Relabel | None = None, under_heading: bool = False) -> str:
    """The final step: every piece goes to the user as soon as it exists, except a line
    that is repeating an earlier one (held until it differs). An answer that falls into a
    verbatim loop (`pipeline.repetition`) is stopped there, with a warning. `budget`: what
    set params.max_new_tokens, and `subject` what is written, as the warning of an answer
    cut there names them; `longer`, how to get a longer one (raise --max-new-tokens).
    `source`: the text a summary is of, whose lines of tags alone and made-up code blocks
    are left out (`summary_lines`), a line at a time. `cut`: where an answer cut at the
    budget is noted (its subject added) instead of warned of, for a caller that says
    several in one line. `labels`: moves each source label the answer writes to the
    passage that backs its sentence (`citations.Relabel`). `under_heading`: a summary's
    section under ktcli's `## path` heading, whose own headings go a level down."""
    guard, echo, lead, first = RepetitionGuard(), EchoedText(), LeadingSourceTag(), LabelsFirst()
    lines = SummaryLines(source, under_heading) if source is not None else None
    before = backend.last_stats
    pieces = backend.stream_chat(messages, params)
    with _prefill_shown(backend, reporter):
        try:
            for raw in _answer_pieces(map(lead.feed, pieces)):
                piece = lines.feed(raw) if lines is not None else raw
                piece = labels.feed(piece) if labels is not None else piece
                if piece:  # the first answer's (a summary's parts stream one by one)
                    tally.first_shown()
                shown = first.feed(echo.feed(piece))
                if shown:
                    reporter.answer_text(shown)
                if guard.feed(raw) or echo.repeated:
                    break
        except KeyboardInterrupt:
            if not echo.shown.strip() or not first.released:
                raise  # still reading the prompt (or labels alone): nothing of an answer to keep
            pieces.close()  # (a backend records the call's figures as its stream closes)
            if backend.last_stats is not before:
                # the part streamed is counted: --json after Ctrl-C said tokens_in 0, model_calls 0
                tally.add(backend)
            raise AnswerInterrupted(echo.shown) from None
        except Exception:
            _count_failed_call(backend, before, tally)
            raise
        finally:
            pieces.close()
    # Nothing streamed: every line held (tags alone, a made-up code block) until a loop was
    # stopped, or no text at all. A summary of rich/ said "ttft 0.0s" after 875 s.
    tally.first_shown()
    if not guard.unit:
        last = lines.flush() if lines is not None else ""
        last = labels.feed(last) + labels.flush() if labels is not None else last
        rest = first.feed(echo.feed(last) + echo.flush()) + first.flush()
        if rest:
            reporter.answer_text(rest)
    if lines is not None and (left_out := lines.said(subject)):
        reporter.warn(left_out)
    tally.add(backend)
    if guard.unit or echo.repeated:
        tally.extra["stopped_repeating"] = tally.extra.get("stopped_repeating", 0) + 1
    elif backend.last_stats.new_tokens >= params.max_new_tokens:
        # No end-of-answer token came within the budget: the answer may stop mid-sentence.
        tally.extra["hit_max_new_tokens"] = params.max_new_tokens
        longer = longer or ("raise it" if budget == "--max-new-tokens" else "raise --max-new-tokens")
        if cut is not None:
            cut.append(subject)
        else:
            reporter.warn(f"{subject} reached {budget} ({params.max_new_tokens:,} tokens) and may be cut "
                          f"short; {longer} for a longer one")
    if guard.unit:
        reporter.warn(f"stopped {subject}: {guard.said()}")
        kept = guard.kept()
        if lines is not None:  # the loop's one copy, as shown: less tags alone and made-up code
            again = SummaryLines(source or "", under_heading)
            kept = again.feed(kept) + again.flush()
            if not lines.dropped_any and (left_out := again.said(subject)):
                reporter.warn(left_out)  # (held until the loop was cut: a block never closed)
            lines = again
        if labels is not None:  # as shown: the raw copy kept the model's "[1]" (probe 118)
            kept = labels.rewritten(kept)
        if written := labels_only(kept):  # "[1]" over and over: no answer either
            _wrote_labels_only(reporter, subject, written, tally)
            return ""
        if not kept.strip():
            # all of it held and left out (a `<pre><code>` block never closed, looping inside):
            # said, not a blank line and exit 0 (procps' bugs.md, probe 117)
            _gave_none(reporter, subject, backend, lines)
        return kept.strip()
    if echo.repeated:
        # Quoted as written: the compared form's labels read "[0]", a label no answer has.
        said = echo.repeated_as_written or echo.repeated
        reporter.warn(f"stopped {subject}: it started repeating an earlier line or sentence word for word "
                      f"({said[:40] + '...' if len(said) > 40 else said})")
    text = echo.shown.strip()
    if first.labels:
        # "[1]" and nothing else (a question about two documents at once, or one the input
        # cannot answer): no answer, and nothing to cite, though "[1]" names a source
        _wrote_labels_only(reporter, subject, first.labels, tally)
        return ""
    if not text:
        # Said, not left as a blank line and exit 0: the model wrote only markup (a source
        # tag it opened and closed) or stopped at once.
        _gave_none(reporter, subject, backend, lines)
    return text


def _wrote_labels_only(reporter: Reporter, subject: str, written: str, tally: Tally) -> None:
    """Said of a text of source labels alone (`written`, as "[1]"), which is shown as none,
    and kept in the figures (`labels_only`) for the stdout notice and --json."""
    tally.extra["labels_only"] = written
    what = subject.removeprefix("the ")
    reword = "rewording the question, asking one thing at a time, or " if subject == "the answer" else ""
    reporter.warn(f"the model wrote only a source label ({written}), no {what}: nothing is shown or cited; "
                  f"try {reword}a larger --model")


def _gave_none(reporter: Reporter, subject: str, backend: Backend, lines: SummaryLines | None) -> None:
    what = subject.removeprefix("the ")  # "answer", "summary", "summary of notes/trip.md"
    reword = "rewording the question, " if subject == "the answer" else ""
    # (lines left out, said above: "none of them text" was untrue of an echoed instruction)
    kind = "all of them left out" if lines is not None and lines.dropped_any else "none of them text"
    reporter.warn(f"the model gave no {what} ({backend.last_stats.new_tokens:,} tokens, {kind}); "
                  f"try {reword}another --mode, or a larger --model")
