"""The user-facing error hierarchy. Only the CLI turns these into exit codes and one line."""

from __future__ import annotations


class KtcliError(Exception):
    """Base of every error the user may see. Its message is the one line printed."""

    exit_code = 1


class UsageError(KtcliError):
    """The command line itself is wrong (empty question, conflicting flags)."""

    exit_code = 2


class InputError(KtcliError):
    """The input cannot be used: missing path, empty file, encrypted PDF, binary file..."""

    exit_code = 3


class CacheError(KtcliError):
    """ktcli's cache folder cannot take what a run writes there (read-only, a full disk,
    /proc): the machine's state, not the input's or the command line's."""

    exit_code = 1


class ModelNotInstalledError(KtcliError):
    """A model is missing; the message says how to install it."""

    exit_code = 1


class OutOfMemoryError(KtcliError):
    """The request does not fit the memory budget (KV cache or host memory)."""

    exit_code = 1


class BackendError(KtcliError):
    """The generation backend failed at run time."""

    exit_code = 1


# Set once a SIGTERM arrived (`timeout`, a CI job's cancel, systemd, `docker stop`): the CLI
# turns it into the KeyboardInterrupt that Ctrl-C raises, so the same answer and notes are
# kept, and ends with the signal's own word and code.
_terminated: list[bool] = []


def note_terminated() -> None:
    _terminated.append(True)


def interruption() -> tuple[str, int]:
    """How an interrupted run is said and ends: ("interrupted", 130) after Ctrl-C,
    ("terminated (SIGTERM)", 143) after a SIGTERM."""
    return ("terminated (SIGTERM)", 143) if _terminated else ("interrupted", 130)


class InterruptedAnswer(KtcliError):
    """Ctrl-C (or SIGTERM) while an answer streamed: the part shown stays on stdout, and its
    `answer` (that text, with the sources it can be traced to) gives the Sources under it."""

    exit_code = 130

    def __init__(self, message: str, answer, whole: bool = False) -> None:
        """`whole`: the answer had ended (the run was stopped after it, while it kept the
        prompt's K/V): --json's object is then not marked incomplete."""
        super().__init__(message)
        self.answer = answer
        self.whole = whole
        self.exit_code = interruption()[1]


class InterruptedWithNotes(KtcliError):
    """Ctrl-C during a summary's reading: the notes gathered so far (`partial`), which were
    shown only as progress, are kept (200 s of reading ended in an empty stdout)."""

    exit_code = 130

    def __init__(self, message: str, partial: str, answer=None) -> None:
        """`answer`: the notes as an Answer (the plan, the figures so far, the skipped files),
        for --json's object, which had only the notes and the error."""
        super().__init__(message)
        self.partial = partial
        self.answer = answer
        self.unseen = True  # never shown as an answer: printed when kept
        self.exit_code = interruption()[1]


class NotesCutOff(BackendError):
    """A server cut off a step writing notes for the next window (a question's evidence
    window, a summary's part), before the answer: the text of that step is notes, not an
    answer, and is never shown as one. `partial`: "" (no answer to keep), or a summary's
    notes of the parts read before, headed as notes (as Ctrl-C keeps them); `answer`: the
    run's object for --json (its plan and figures), with that text."""

    def __init__(self, message: str, partial: str = "", answer=None) -> None:
        super().__init__(message)
        self.partial = partial
        self.answer = answer
        self.unseen = True  # notes were shown only as progress: printed (where any) when kept


class Interrupted(KtcliError):
    """Ctrl-C (or SIGTERM) where the work done so far is kept, which its message says."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.exit_code = interruption()[1]
