"""stderr whose reader may go away.

Progress, the plan and the figures go to stderr, the answer to stdout. When stderr's
reader goes (`ktcli ask doc q 2>&1 >answer.txt | head -3`), a progress line raised
BrokenPipeError, which was taken for stdout's reader being done: the answer was never
written and the exit code was 0, even for a missing input. Now such a stderr goes quiet
(fd 2 is pointed at /dev/null, so nothing later fails on it either) and the run goes on:
the answer still reaches stdout and the exit code is the run's own.
"""

from __future__ import annotations

import errno
import os
import sys

# EPIPE: the reader went away; EBADF: fd 2 was open for reading only (`2</dev/null`);
# ENOSPC: it is a file on a full disk (`2>/dev/full`), which failed the run with exit 1.
_GONE = (errno.EPIPE, errno.EBADF, errno.ENOSPC)


class QuietWhenGone:
    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            self._quiet_if_gone(e)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._quiet_if_gone(e)

    def _quiet_if_gone(self, error: OSError) -> None:
        if error.errno not in _GONE:
            raise error
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass
        try:
            self._stream.flush()  # what was buffered goes to /dev/null now, not to a later failure
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._stream, name)


def guard_stderr() -> None:
    if not isinstance(sys.stderr, QuietWhenGone) and sys.stderr is not None:
        sys.stderr = QuietWhenGone(sys.stderr)
