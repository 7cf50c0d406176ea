"""Spot an answer that has fallen into a verbatim loop, so generation can stop there.

Small models decoding greedily often end an answer by repeating one sentence or line
until the token limit (the bundled 135M model does it on most long answers). Those
tokens cost the user seconds and carry nothing. The check is deliberately narrow: the
text must *end* in at least `min_copies` back-to-back copies of one unit of at least
`min_unit` characters, spanning at least `min_span` characters. A list whose items
merely look alike, a table's separator rows or a code block with a repeated short line
does not match; twenty identical words in a row does.
"""

from __future__ import annotations


class RepetitionGuard:
    def __init__(self, min_unit: int = 8, min_copies: int = 3, min_span: int = 240, max_unit: int = 600):
        self.min_unit, self.min_copies, self.min_span, self.max_unit = min_unit, min_copies, min_span, max_unit
        self.text = ""
        self.unit = ""  # the repeated unit, once found

    def feed(self, piece: str) -> bool:
        """Add streamed text; True once the text ends in a loop."""
        self.text += piece
        if not self.unit and piece:
            self.unit = self._loop_unit()
        return bool(self.unit)

    def _loop_unit(self) -> str:
        text = self.text
        n = len(text)
        # Only units ending where the text ends: a loop is caught on the piece that completes
        # its last copy. Units run from min_unit up to what fits min_copies times.
        for size in range(self.min_unit, min(self.max_unit, n // self.min_copies) + 1):
            copies = max(self.min_copies, -(-self.min_span // size))  # ceil(min_span / size)
            if copies * size > n:
                break
            if text[n - 1 - size] != text[n - 1]:
                continue  # not periodic with this size: skip building the copies
            unit = text[n - size :]
            if not unit.strip():
                continue  # runs of blank lines or spaces are not worth a stop
            if text.endswith(unit * copies):
                return unit
        return ""

    def kept(self) -> str:
        """The text with its closing loop cut down to one copy, cut at the natural break
        (a line break when the unit holds one, else a space) nearest to one full period."""
        if not self.unit:
            return self.text
        text, size = self.text, len(self.unit)
        start = len(text) - size
        while start > 0 and text[start - 1] == text[start - 1 + size]:
            start -= 1  # back to where the text first became periodic
        end = start + size  # one whole period from there
        mark = "\n" if "\n" in self.unit else " "
        breaks = [i + 1 for i in range(end - size // 2, min(end + size // 2, len(text))) if text[i] == mark]
        return text[: min(breaks, key=lambda c: abs(c - end))] if breaks else text[:end]


class EchoedLines:
    """Streamed text, held back while its current line is repeating an earlier line of the
    same answer word for word; once a whole line (of at least `min_line` characters,
    outside code fences) has repeated, the answer ends there and the repeat is never shown.

    `RepetitionGuard` needs three copies, so a small model's looping line reached the user
    twice or three times before it fired (the README's own question: 'The report also
    mentions a recordable incident...' three times). An answer has no use for a long line
    twice. The cost is a lag only while a line matches the start of an earlier one."""

    def __init__(self, min_line: int = 40):
        self.min_line = min_line
        self.seen: set[str] = set()  # earlier long lines, stripped
        self.line = ""  # the current line, not yet ended
        self.held_from = 0  # characters of `line` shown so far
        self.in_code = False
        self.repeated = ""  # the line that came back, once it has
        self.shown = ""  # everything released to the user

    def feed(self, piece: str) -> str:
        """Add streamed text; returns what can be shown now ('' while holding, and after a
        repeat)."""
        if self.repeated:
            return ""
        out = []
        self.line += piece
        while "\n" in self.line:
            line, self.line = self.line.split("\n", 1)
            key = line.strip()
            if self._counts(key) and key in self.seen:
                self.repeated, self.line = key, ""
                break
            out.append(line[self.held_from :] + "\n")
            self.held_from = 0
            if key.startswith("```"):
                self.in_code = not self.in_code
            elif self._counts(key):
                self.seen.add(key)
        if not self.repeated and not self._echoing():
            out.append(self.line[self.held_from :])
            self.held_from = len(self.line)
        return self._release("".join(out))

    def flush(self) -> str:
        """At the end of the stream: the held rest, unless it is itself a repeat."""
        if self.repeated or (self._counts(self.line.strip()) and self.line.strip() in self.seen):
            return ""
        rest, self.held_from = self.line[self.held_from :], len(self.line)
        return self._release(rest)

    def _release(self, text: str) -> str:
        self.shown += text
        return text

    def _counts(self, key: str) -> bool:
        return len(key) >= self.min_line and not self.in_code

    def _echoing(self) -> bool:
        start = self.line.lstrip()
        return bool(start) and not self.in_code and any(s.startswith(start) for s in self.seen)
