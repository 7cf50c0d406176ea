"""How the pipeline tells the outside world what it is doing, without knowing about Rich.

The CLI passes an object with these methods (render's console reporter); tests pass a
recorder. Streamed answer text goes through `answer_text`, everything else is for stderr.
"""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def status(self, message: str) -> None:
        """A phase begins ("loading model", "embedding 1,204 chunks")."""

    def progress(self, phase: str, done: int, total: int) -> None:
        """Progress within a phase; `phase` names a bar (ingest, embed, prefill, decode)."""

    def warn(self, message: str) -> None:
        """Something the user should know that is not an error."""

    def answer_text(self, delta: str) -> None:
        """A piece of the final answer, as it is generated."""


class NullReporter:
    def status(self, message: str) -> None:
        pass

    def progress(self, phase: str, done: int, total: int) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def answer_text(self, delta: str) -> None:
        pass
