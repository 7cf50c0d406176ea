"""The streamed answer on stdout."""

from __future__ import annotations

from ktcli.render.console import ConsoleReporter


def test_trailing_line_breaks_wait_for_more_text(capsys):
    reporter = ConsoleReporter(quiet=True)
    for piece in ["First line.\n", "\n", "Second", " line.\n", "\n"]:
        reporter.answer_text(piece)
    assert capsys.readouterr().out == "First line.\n\nSecond line."  # the sources block adds its own breaks


def test_a_warning_raised_mid_answer_comes_after_it_with_the_figures(capsys):
    reporter = ConsoleReporter()
    reporter.warn("before the answer")
    reporter.answer_text("An answer that stops mid-line")
    reporter.warn("stopped the answer")
    assert "stopped the answer" not in capsys.readouterr().err
    reporter.figures("mode full")
    err = capsys.readouterr().err
    assert err.index("stopped the answer") < err.index("mode full")
    # after the figures (the prompt cache's write, which comes last): printed, not held for ever
    reporter.warn("the prompt cache could not keep this prompt")
    assert "the prompt cache could not keep this prompt" in capsys.readouterr().err


def test_quiet_keeps_warnings_and_drops_the_figures(capsys):
    reporter = ConsoleReporter(quiet=True)
    reporter.status("reading the whole input")
    reporter.warn("skipped blob.bin: binary")
    reporter.answer_text("An answer")
    reporter.warn("stopped the answer")
    reporter.figures("mode full")
    err = capsys.readouterr().err
    assert err.splitlines() == ["! skipped blob.bin: binary", "! stopped the answer"]


def test_warnings_held_mid_answer_are_shown_when_the_answer_is_cut_short(capsys):
    """Held for the figures, which an error or Ctrl-C mid-answer never reaches: lost."""
    reporter = ConsoleReporter()
    reporter.answer_text("An answer cut")
    reporter.warn("read notes.txt: a guess")
    reporter.end_answer_line()
    captured = capsys.readouterr()
    assert captured.out == "An answer cut\n" and "! read notes.txt: a guess" in captured.err


def test_the_progress_rate_counts_from_the_first_report(monkeypatch):
    """A phase first reported with 16 done showed "16000000.0/s"."""
    import io

    from rich.console import Console

    from ktcli.render import console

    clock = iter([0.0, 2.0])
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    reporter = ConsoleReporter()
    reporter.err = Console(file=io.StringIO(), force_terminal=True)
    reporter.progress("embed", 16, 100)
    task = reporter._progress.tasks[0]
    assert task.fields["rate"] == ""  # nothing measured yet
    reporter.progress("embed", 48, 100)
    assert task.fields["rate"] == "16.0/s  0:02  ~0:03 left"  # (48 - 16) in 2 s, 52 to go
    reporter.lines([])  # stops the bars


def test_an_answer_cut_short_stops_the_progress_bars():
    """Ctrl-C while indexing left the terminal's cursor hidden: the bars were not stopped."""
    import io

    from rich.console import Console

    reporter = ConsoleReporter()
    reporter.err = Console(file=io.StringIO(), force_terminal=True)
    reporter.progress("embed", 1, 100)
    assert reporter._progress is not None
    reporter.end_answer_line()
    assert reporter._progress is None and "\x1b[?25h" in reporter.err.file.getvalue()  # the cursor shown again


def test_without_a_terminal_a_long_phase_logs_a_line_now_and_then(capsys, monkeypatch):
    """A log showed "indexing 5,199 chunks" and then 12 minutes of nothing."""
    from ktcli.render import console

    clock = iter([0.0, 10.0, 31.0, 40.0, 62.0])
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    reporter = ConsoleReporter()
    for done in (0, 100, 300, 400, 600):
        reporter.progress("embed", done, 1000)
    assert capsys.readouterr().err.splitlines() == ["· embed 300/1,000 (30%, ~1:12 left)",
                                                    "· embed 600/1,000 (60%, ~0:41 left)"]


def test_without_a_terminal_each_parts_prompt_logs_its_first_line_a_little_way_in(capsys, monkeypatch):
    """A summary's part read its 6K-token prompt for ~60 s and its log said nothing until
    "6,267/6,267 (100%)" (probe 105): the first line was due 30 s after the first report,
    and the next parts' at their first step whatever their own time."""
    from ktcli.render import console

    phase = "reading the prompt (tokens)"
    # part 1: told at its start and after each 2,048-token step (20 s each); part 2 the same
    clock = iter([100.0, 120.0, 140.0, 160.0, 170.0, 175.0, 190.0])
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    reporter = ConsoleReporter()
    for done, total in ((0, 6144), (2048, 6144), (4096, 6144), (6144, 6144), (0, 5000), (2048, 5000), (4096, 5000)):
        reporter.progress(phase, done, total)
    assert capsys.readouterr().err.splitlines() == [
        f"· {phase} 2,048/6,144 (33%, ~0:40 left)",  # 20 s in, not at its end
        f"· {phase} 6,144/6,144 (100%)",  # 30 s on
        f"· {phase} 4,096/5,000 (81%, ~0:04 left)",  # part 2: 20 s into its own prompt, not at its first step
    ]


def test_a_phase_keeps_its_pace_when_its_bar_stops_and_starts_again(monkeypatch):
    """A summary's status line for each part stopped the bars: the map's elapsed time went
    back to 0:00 at each part and what was left was never known."""
    import io

    from rich.console import Console

    from ktcli.render import console

    clock = iter([0.0, 60.0, 120.0, 121.0])
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    reporter = ConsoleReporter()
    reporter.err = Console(file=io.StringIO(), force_terminal=True)
    reporter.progress("map", 0, 4)
    reporter.status("reading part 2/4")  # stops the bars
    reporter.progress("map", 1, 4)
    reporter.status("reading part 3/4")
    reporter.progress("map", 2, 4)
    assert reporter._progress.tasks[0].fields["rate"] == "60s each  2:00  ~2:00 left"
    reporter.progress("embed", 5, 10)  # another phase has its own start
    assert reporter._progress.tasks[1].fields["rate"] == ""
    reporter.lines([])


def test_a_phase_run_again_with_the_same_total_starts_again(monkeypatch):
    """Two parts' prefills of one size: the second's pace counted from the first's start."""
    from ktcli.render import console

    clock = iter([0.0, 10.0, 100.0, 101.0])
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    reporter = ConsoleReporter()
    assert reporter._pace("prefill", 0, 512, console.time.perf_counter()) == ""
    assert reporter._pace("prefill", 512, 512, console.time.perf_counter()).startswith("51.2/s")
    assert reporter._pace("prefill", 0, 512, console.time.perf_counter()) == ""  # the next part: from 0 again
    assert reporter._pace("prefill", 256, 512, console.time.perf_counter()).startswith("256.0/s  0:01")


def test_stdout_stays_the_answers_while_a_bar_is_up(capsys):
    """With --json, a prompt's bar still up when the object was printed took it to stderr
    (a live Rich bar redirects stdout onto its console): `| jq` got nothing."""
    import io

    from rich.console import Console

    reporter = ConsoleReporter(stream_answer=False)
    reporter.err = Console(file=io.StringIO(), force_terminal=True)
    reporter.progress("reading the prompt (tokens)", 2048, 8192)
    print('{"answer": "x"}')
    assert capsys.readouterr().out == '{"answer": "x"}\n'
    reporter.answer_text("x")  # the answer's first piece ends the prompt's bar, --json or not
    assert reporter._progress is None
    reporter.progress("embed", 1, 10)
    reporter.close()  # before an error line
    assert reporter._progress is None and "\x1b[?25h" in reporter.err.file.getvalue()
