"""The streamed answer on stdout."""

from __future__ import annotations

from ktcli.render.console import ConsoleReporter


def test_trailing_line_breaks_wait_for_more_text(capsys):
    reporter = ConsoleReporter(quiet=True)
    for piece in ["First line.\n", "\n", "Second", " line.\n", "\n"]:
        reporter.answer_text(piece)
    assert capsys.readouterr().out == "First line.\n\nSecond line."  # the sources block adds its own breaks
