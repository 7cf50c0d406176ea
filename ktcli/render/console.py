"""The stderr side: status, progress bars with rates, warnings and the closing figures.

stdout is left to the answer alone, so `ktcli ask ... | other-tool` stays clean. Rich
turns colour and live bars off by itself when stderr is not a terminal; NO_COLOR turns off
every style (Rich alone would keep bold and dim).
"""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn


def stderr_console() -> Console:
    plain = bool(os.environ.get("NO_COLOR"))
    return Console(stderr=True, highlight=False, soft_wrap=True, color_system=None if plain else "auto")


# Without a terminal, a long phase's progress as a line this often (seconds), the first
# once it has run LOG_FIRST_S.
LOG_EVERY_S = 30.0
LOG_FIRST_S = 15.0


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class ConsoleReporter:
    def __init__(self, *, quiet: bool = False, stream_answer: bool = True) -> None:
        self.err = stderr_console()
        self.quiet = quiet
        self.stream_answer = stream_answer
        self.warnings: list[str] = []  # every warning said, in order (--json's "warnings")
        self._progress: Progress | None = None
        self._tasks: dict[str, int] = {}
        # phase -> (time, done, total) at its first report and the last done; kept while bars stop and start
        # again (a summary's status line for each part), so that its rate, time and what
        # is left count from the phase's start, not from the last part's
        self._started: dict[str, tuple[float, int, int, int]] = {}
        self._logged: dict[str, tuple[float, float]] = {}  # no terminal: phase -> (began, last logged)
        self._answer_started = False
        self._held_space = ""
        self._deferred: list[str] = []  # warnings raised while the answer streams

    # -- Reporter -------------------------------------------------------------------
    def status(self, message: str) -> None:
        if self.quiet:
            return
        self._stop_bars()
        self.err.print(f"[dim]·[/dim] {escape(message)}")

    def progress(self, phase: str, done: int, total: int) -> None:
        if self.quiet or total <= 0:
            return
        if not self.err.is_terminal:
            self._log_progress(phase, done, total)
            return
        if self._progress is None:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                # stdout is the answer's alone: a live bar redirects what is printed to stdout
                # (the --json object) onto its own console, stderr, unless told not to.
                console=self.err, transient=True, redirect_stdout=False, redirect_stderr=False,
            )
            self._progress.start()
        if phase not in self._tasks:
            self._tasks[phase] = self._progress.add_task(phase, total=total, rate="")
        pace = self._pace(phase, done, total, time.perf_counter())
        self._progress.update(self._tasks[phase], completed=done, total=total, rate=pace)

    def _pace(self, phase: str, done: int, total: int, now: float) -> str:
        """'2.1/s  0:42  ~1:10 left': the rate, the time since the phase began and what is
        left at that rate (`_pace_parts`)."""
        pace, left = self._pace_parts(phase, done, total, now)
        return f"{pace}  {left}" if left else pace

    def _pace_parts(self, phase: str, done: int, total: int, now: float) -> tuple[str, str]:
        """('2.1/s  0:42', '~1:10 left'), each '' where not known. The rate counts from the
        first report: a first report of 16 done in no time showed "16000000.0/s"."""
        since, done_then, total_then, last = self._started.get(phase, (now, done, total, done))
        if total != total_then or done < last:  # another run of the phase (the count went back): it starts again
            since, done_then = now, done
        self._started[phase] = (since, done_then, total, done)
        if done <= done_then or now <= since:
            return "", ""
        speed = (done - done_then) / (now - since)
        # a summary's parts take a minute each: "60s each", not "0.0/s"
        pace = f"{speed:.1f}/s" if speed >= 1 else f"{1 / speed:.0f}s each"
        pace += f"  {_clock(now - since)}"
        return pace, (f"~{_clock((total - done) / speed)} left" if done < total else "")

    def _log_progress(self, phase: str, done: int, total: int) -> None:
        """Without a terminal (a log, CI): a line every LOG_EVERY_S seconds, so that 12
        minutes of indexing a 1M-token folder show signs of life; none for a short phase."""
        now = time.perf_counter()
        before = self._started.get(phase)
        _, left = self._pace_parts(phase, done, total, now)
        if before is None or self._started[phase][0] != before[0]:
            # the phase starts (again: a summary's next part's prompt): its first line
            # comes LOG_FIRST_S into it. Counted from the process's first prompt, the next
            # parts' came at their first step, and the first part's at its end (its first
            # report, a chunk in, was the start: 60 s of silence, then "100%").
            self._logged[phase] = (now, now - LOG_EVERY_S + LOG_FIRST_S)
        first, last = self._logged[phase]
        if now - first >= LOG_FIRST_S and now - last >= LOG_EVERY_S:
            self._logged[phase] = (first, now)
            left = f", {left}" if left else ""
            self.err.print(f"[dim]·[/dim] {escape(phase)} {done:,}/{total:,} ({100 * done // total}%{left})")

    def warn(self, message: str) -> None:
        # Also under --quiet: a skipped file or a cut answer is something the user must
        # not miss (quiet drops progress, the plan and the figures). Kept for --json too.
        self.warnings.append(message)
        if self._answer_started:
            # Mid-answer, stdout's line is still open: on a terminal the warning would land
            # inside the answer's text. It comes after the sources, with the figures.
            self._deferred.append(message)
            return
        self._stop_bars()
        self._print_warning(message)

    def _print_warning(self, message: str) -> None:
        self.err.print(f"[yellow]![/yellow] {escape(message)}")

    def answer_text(self, delta: str) -> None:
        if not self.stream_answer:
            self._stop_bars()  # the prompt's bar is done; --json prints its object later
            return
        if not self._answer_started:
            self._stop_bars()
            self._answer_started = True
        # Trailing line breaks wait for more text: an answer that ends in one would leave
        # a stray blank line above the sources.
        text = self._held_space + delta
        body = text.rstrip()
        self._held_space = text[len(body):]
        if body:
            sys.stdout.write(body)
            sys.stdout.flush()

    def end_answer_line(self) -> None:
        """An answer cut short (Ctrl-C, an error mid-stream) leaves stdout's line open:
        close it, so the error line that follows on a terminal does not land inside the
        answer, and show the warnings held while it streamed (they waited for the
        figures, which such a run never reaches)."""
        if self._answer_started and self.stream_answer:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._answer_started = False
        self._stop_bars()
        for message in self._deferred:
            self._print_warning(message)
        self._deferred.clear()

    # -- closing --------------------------------------------------------------------
    def figures(self, line: str) -> None:
        self._stop_bars()
        # The answer and its sources are out, their line closed: a warning after this (the
        # prompt cache's write failed) is printed at once, not held for ever.
        self._answer_started = False
        for message in self._deferred:
            self._print_warning(message)
        self._deferred.clear()
        if not self.quiet:
            self.err.print(f"[dim]{escape(line)}[/dim]")

    def lines(self, lines: list[str]) -> None:
        self._stop_bars()
        for line in lines:
            self.err.print(line, markup=False)

    def close(self) -> None:
        """Live bars end (before an error line, which a bar would have glued onto itself)."""
        self._stop_bars()

    def _stop_bars(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._tasks.clear()
