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
