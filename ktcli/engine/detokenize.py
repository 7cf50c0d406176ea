"""Token ids to text, incrementally, and stop strings over the streamed text.

A token may hold part of a UTF-8 character (byte-level BPE) or change how the previous
token renders (SentencePiece spaces), so text is emitted only once a short window of
recent tokens decodes to more than it did before and does not end in a replacement
character. The window starts with the prompt's last tokens so the first generated token
renders with its true leading space.
"""

from __future__ import annotations

from collections.abc import Callable

_CONTEXT = 6  # prompt tokens kept as left context


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], prompt_ids: list[int] | None = None):
        self._decode = decode
        self._ids = list(prompt_ids[-_CONTEXT:]) if prompt_ids else []
        self._prefix = 0  # window start
        self._read = len(self._ids)  # tokens already turned into text

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back, less an incomplete character at the very end (a
        token limit that cut a character's bytes: its U+FFFD is no text of the answer)."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :].rstrip("\ufffd") if len(after) > len(before) else ""


class StopStrings:
    """Cuts streamed text at the first stop string. Text that could be the start of a
    stop string is held back until the next delta decides it."""

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        if not self.stops:
            return delta
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held, self.stopped = "", True
            return text[:cut]
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:k]):
                    keep = k
                    break
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held
