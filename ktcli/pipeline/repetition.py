"""Spot an answer that has fallen into a verbatim loop, so generation can stop there.

Small models decoding greedily often end an answer by repeating one sentence or line
until the token limit (the bundled 135M model does it on most long answers). Those
tokens cost the user seconds and carry nothing. The check is deliberately narrow: the
text must *end* in at least `min_copies` back-to-back copies of one unit of at least
`min_unit` characters, spanning at least `min_span` characters. A list whose items
merely look alike, a table's separator rows or a code block with a repeated short line
does not match; twenty identical words in a row does. Citation markers count as one
another whatever their number: "[1] to [2] to [3] to ..." ran to the token limit; and so
do the numbers of a list's items ("3. See above." "4. See above." ...) and those inside HTML
tags (`<span id="1">`, `<span id="2">` ...). Lines that only count up ("The 1st note is:
1. 1." "The 2nd note is: 2. 2." ...) are a loop too, though their numbers grow wider and
no period holds (`_counting_lines`).
"""

from __future__ import annotations

import re
import unicodedata


class RepetitionGuard:
    def __init__(self, min_unit: int = 8, min_copies: int = 3, min_span: int = 240, max_unit: int = 600):
        self.min_unit, self.min_copies, self.min_span, self.max_unit = min_unit, min_copies, min_span, max_unit
        self.text = ""
        self.unit = ""  # the repeated unit, once found
        self._counted_from = -1  # where lines that only count up start, where that is the loop

    def feed(self, piece: str) -> bool:
        """Add streamed text; True once the text ends in a loop."""
        self.text += piece
        if not self.unit and piece:
            outside_code = self.text.count("```") % 2 == 0  # (once a feed, not once a candidate unit)
            self.unit = self._loop_unit(outside_code)
            if not self.unit and "\n" in piece and outside_code:
                self._counted_from = _counting_lines(self.text)
                if self._counted_from >= 0:
                    self.unit = self.text[self._counted_from:].split("\n", 1)[0] + "\n"
        return bool(self.unit)

    def said(self) -> str:
        """What the loop was, for the warning that it was stopped."""
        if self._counted_from >= 0:
            return f"it kept writing the same line with its numbers counting up ({self.unit.strip()[:40]}...)"
        return f"it kept repeating the same {len(self.unit)} characters"

    def _loop_unit(self, outside_code: bool) -> str:
        text = _shape(self.text)
        n = len(text)
        # Only units ending where the text ends: a loop is caught on the piece that completes
        # its last copy. Units run from min_unit up to what fits min_copies times.
        # Sizes and spans are widths (`width`): a CJK character counts two, so a loop of
        # Japanese stops after as much text as one of English, not after twice as much.
        for size in range(-(-self.min_unit // 2), min(self.max_unit, n // self.min_copies) + 1):
            if self.min_copies * size > n:
                break
            if text[n - 1 - size] != text[n - 1]:
                continue  # not periodic with this size: skip building the copies
            unit = text[n - size :]
            wide = width(unit)
            line = (wide >= MIN_LINE_UNIT and _one_line_of_words(unit) and outside_code) or _fences_only(unit)
            if (wide < self.min_unit and not line) or not unit.strip():
                continue  # too short to tell, or runs of blank lines or spaces: not worth a stop
            copies = max(self.min_copies, -(-self.min_span // wide))  # ceil(min_span / width)
            if line:
                copies = min(copies, LINE_COPIES)
            elif outside_code and _a_word(unit):
                copies = min(copies, WORD_COPIES)
            if copies * size <= n and text.endswith(unit * copies):
                return unit
        return ""

    def kept(self) -> str:
        """The text with its closing loop cut down to one copy, cut at the natural break
        (a line break when the unit holds one, else a space) nearest to one full period."""
        if not self.unit:
            return self.text
        if self._counted_from >= 0:  # the text before the counting, and its first line
            return self.text[: self._counted_from + len(self.unit)]
        text, size = _shape(self.text), len(self.unit)
        start = len(text) - size
        while start > 0 and text[start - 1] == text[start - 1 + size]:
            start -= 1  # back to where the text first became periodic
        end = start + size  # one whole period from there
        mark = "\n" if "\n" in self.unit else " "
        breaks = [i + 1 for i in range(end - size // 2, min(end + size // 2, len(text))) if text[i] == mark]
        return self.text[: min(breaks, key=lambda c: abs(c - end))] if breaks else self.text[:end]


# A whole line of words, outside a code block, said this many times back to back is a loop
# however short: a summary listed "build/" on 29 lines (7 characters a copy, so the
# span rule wanted 35) before the guard stopped it. (`EchoedText` stops lines from 16
# characters at their second copy.)
LINE_COPIES = 5
MIN_LINE_UNIT = 4
_LETTERS = re.compile(r"[^\W\d_]{2}")
# A word (a unit within a line holding a run of 4 letters) said this many times back to
# back is a loop: an answer about torch's autograd wrote "autograd." 27 times in a row (9
# characters a copy: the span rule wanted 27). Not a row of "NA," or "0, ": data quoted.
WORD_COPIES = 8
_A_WORD = re.compile(r"[^\W\d_]{4}")


def _a_word(unit: str) -> bool:
    return "\n" not in unit and bool(_A_WORD.search(unit))


_FENCE_LINE = re.compile(r"[ \t]*```[\w+-]*[ \t]*")

# Whole lines, the same but for numbers each equal to or one more than the line before's
# (one at least), this many back to back: counting, not saying. A summary of a 548 KB HTML
# manual wrote "The 1st note is: 1. 1." to "The 23rd note is:" and the token limit (probe
# 115). A table's rows ("Q1 | 5.2", "Q2 | 5.4") change their figures otherwise.
COUNTING_LINES = 5
_COUNTED = re.compile(r"\d+(?:st|nd|rd|th)?")
_WORDS = re.compile(r"[^\W\d_]{2,}")  # two words at least: a line that says something
_CODE_MARKS = re.compile(r"[=;{}()]")  # code unrolled by hand ("buf[12] = 0;") counts its indices


def _counting_lines(text: str) -> int:
    """Where the closing run of COUNTING_LINES whole lines that only count up starts (the
    offset of its first line in `text`), else -1."""
    lines = text.split("\n")[:-1]  # whole lines only: the last is still being written
    if len(lines) < COUNTING_LINES:
        return -1
    run = lines[-COUNTING_LINES:]
    shape = _COUNTED.sub("#", run[0]).strip()
    if "#" not in shape or len(_WORDS.findall(shape)) < 2 or _CODE_MARKS.search(shape) \
            or any(_COUNTED.sub("#", line).strip() != shape for line in run):
        return -1
    numbers = [[int(m.rstrip("stndrh")) for m in _COUNTED.findall(line)] for line in run]
    for before, after in zip(numbers, numbers[1:]):
        steps = [b - a for a, b in zip(before, after)]
        if len(before) != len(after) or any(d not in (0, 1) for d in steps) or 1 not in steps:
            return -1
    return len("\n".join(lines[:-COUNTING_LINES])) + (1 if len(lines) > COUNTING_LINES else 0)


def _fences_only(unit: str) -> bool:
    """A period of code fence lines alone (empty code blocks, opened and closed): a
    notebook's answer streamed ~60 lines of ``` before the span rule stopped it."""
    lines = unit.split("\n")
    return unit.count("\n") >= 1 and any(lines) and all(_FENCE_LINE.fullmatch(x) for x in lines if x)


def _one_line_of_words(unit: str) -> bool:
    """A period of one line with words (where the stream ends mid-line, a rotation of it),
    and blank lines: a summary of mv(1) wrote "MV(1)" and a blank line 35 times (7
    characters a copy: the span rule wanted 35) before the guard stopped it (probe 135)."""
    if "\n" not in unit:
        return False
    lines = unit.split("\n")
    lines = [lines[-1] + lines[0], *lines[1:-1]]  # a rotation's last piece is its first line's start
    return sum(1 for line in lines if line.strip()) == 1 and bool(_LETTERS.search(unit))


_MARKER = re.compile(r"(?<![\w\]\[])\[\d+\]")  # a citation, not an index: buf[10] is code
# the same, or the start of one still being written ("... core.py. [2")
_MARKER_SO_FAR = re.compile(r"(?<![\w\]\[])\[\d+(?:\]|$)")
_MARKERS_ONLY = re.compile(r"(?:\s*\[\d+\])+\s*")
# A list item's number at the start of a line ("17. ", "4) "). Not a letter's: a lettered
# list runs out at z.
_ITEM_DIGITS = re.compile(r"^([ \t]*)(\d+)(?=[.)]\s)", re.MULTILINE)


def _unmarked(text: str) -> str:
    """`text` with each citation marker's number, written or being written, as 0: a line
    said again under the next label ("... defined in core.py. [1]", "... core.py. [2]")
    is the same line."""
    return _MARKER_SO_FAR.sub(lambda m: "[0]" if m[0].endswith("]") else "[0", text) if "[" in text else text


# An HTML tag (`<span id="12" class="c-12">`): the model counted its attributes up line
# after line (`id="1"` ... `id="7"`), each line unlike the last, to the token limit.
_TAG = re.compile(r"<[^<>\n]{0,200}>")
_DIGIT = re.compile(r"\d")


def _shape(text: str) -> str:
    """The text with the digits of each citation marker, of each list item's number and of
    each HTML tag as zeros (same length, so positions hold): a loop that only counts its
    markers, its items or its tags' ids up is still a loop."""
    if "[" in text:
        text = _MARKER.sub(lambda m: "[" + "0" * (len(m[0]) - 2) + "]", text)
    if "<" in text:
        text = _TAG.sub(lambda m: _DIGIT.sub("0", m[0]), text)
    return _ITEM_DIGITS.sub(lambda m: m[1] + "0" * len(m[2]), text)


class EchoedText:
    """Streamed text, held back while it is repeating an earlier line or sentence of the
    same answer word for word; once a whole line or sentence (of at least `min_line`
    characters, outside code fences) has repeated, the answer ends there and the repeat is
    never shown.

    `RepetitionGuard` needs three copies, so a small model's looping line reached the user
    twice or three times before it fired (the README's own question: 'The report also
    mentions a recordable incident...' three times). An answer has no use for a long line
    twice. Sentences are compared with their whitespace collapsed: the bundled model wraps
    prose at ~80 columns the way its sources do, each copy of a looping sentence broken at
    another word, so no line repeated and five copies were shown ('The example is a bit of
    a cheat, but it is actually a good example of how to create class instances.'). The cost
    is a lag only while a line or sentence matches the start of an earlier one.

    A shorter line or sentence (from `min_adjacent` characters) counts only when it comes
    back right after itself: a summary of ktcli's own `ingest/` folder ended in 'It is
    written in Python.' eleven times in a row, 270 characters, all shown before
    `RepetitionGuard` fired. Short lines that recur apart ('Returns:', a heading per
    module) are ordinary.

    Citation markers are compared without their numbers: the bundled model wrote "The tax
    rate is defined in `src/pkg/core.py`. [1]" five times, "[1]" to "[5]", all shown, and
    the answer's markers past [1] had no source under it.

    A list item is compared without its number or letter ('4. ', 'b) '): asked for chapter
    13's recommendations, the bundled model wrote '3. Investigate and treat the Greyrock adit
    discharge...' and the same again under 4 to 19, to the token limit, each line unlike
    the last only in its number. Items that differ in a word are shown. Lines or sentences
    alike but for their ordinals ("the first part ...", "the second part ...") end the
    answer at the third (`ORDINAL_COPIES`)."""

    def __init__(self, min_line: int = 40, min_adjacent: int = 16):
        self.min_line, self.min_adjacent = min_line, min_adjacent
        self.text = ""  # everything fed
        self.shown = ""  # the part of it released to the user
        # earlier long lines (stripped) and sentences (whitespace collapsed), less their list
        # item's number, each with that number (None: no list item)
        self.lines: dict[str, int | None] = {}
        self.sentences: dict[str, int | None] = {}
        self.line_start = 0  # where the current (unfinished) line starts in `text`
        self.sentence_start = 0  # where the current sentence starts; in code, the line's start
        self.in_code = False
        self.last_line = ""  # the previous non-blank line outside code, stripped
        self.last_sentence = ""  # the previous sentence, whitespace collapsed
        # long lines and sentences as `_ordinal_free` writes them ("the # part ..."), each
        # with how many have come
        self.counted_lines: dict[str, int] = {}
        self.counted_sentences: dict[str, int] = {}
        self.repeated = ""  # the line or sentence that came back, once one has (as compared)
        self.repeated_as_written = ""  # the same as the model wrote it, labels and numbers kept
        # A line that is a paragraph of its own (`_lone_line`): the last non-blank line where
        # it stood after a blank one (or first), and how many such copies of it have come in
        # a row; and whether the line being written stands after a blank one.
        self.lone_line = ""
        self.lone_copies = 0
        self.after_blank = True

    def feed(self, piece: str) -> str:
        """Add streamed text; returns what can be shown now ('' while holding, and after a
        repeat)."""
        if self.repeated:
            return ""
        self.text += piece
        cut = self._scan()
        if cut is not None:
            self.text = self.text[:cut]  # the repeat is dropped, never shown
            return self._release(cut)
        return self._release(self._holding_from())

    def flush(self) -> str:
        """At the end of the stream: the held rest, unless it is repeating: text still held
        when the stream ends is the start of an earlier line or sentence, cut off by the
        token limit mid-repeat ('The break statement is used to exit a loop when')."""
        if self.repeated:
            return ""
        return self._release(self._holding_from(ended=True))

    def _scan(self) -> int | None:
        """Take in the lines and sentences the new text completed; where a repeat starts,
        if one did."""
        text = self.text
        while True:
            nl = text.find("\n", self.line_start)
            end = self._sentence_end(nl if nl >= 0 else len(text))
            if end is not None:  # a sentence ends before the line does
                raw = _unmarked(_collapse(text[self.sentence_start : end]))
                key, number = _item(raw), _item_number(raw)
                long = width(key) >= self.min_line
                if (long and (_repeats(key, number, self.sentences) or _counted(key, self.counted_sentences))) \
                        or self._adjacent(key, self.last_sentence):
                    self.repeated = key
                    self.repeated_as_written = _collapse(text[self.sentence_start : end]).strip()
                    return self.sentence_start
                if width(key) >= self.min_line:
                    self.sentences[key] = number
                self.last_sentence = key
                self.sentence_start = end
                continue
            if nl < 0:
                return None
            raw = _unmarked(text[self.line_start : nl].strip())
            key, number = _item(raw), _item_number(raw)
            again = self._counts(key) and (_repeats(key, number, self.lines) or _counted(key, self.counted_lines))
            if not self.in_code and (again or self._adjacent(key, self.last_line) or self._lone_again(raw)):
                self.repeated = key
                self.repeated_as_written = text[self.line_start : nl].strip()
                return self.line_start
            if key.startswith("```"):
                self.in_code = not self.in_code
                self.last_line = self.last_sentence = ""  # text on either side of code is not adjacent
            elif self._counts(key):
                self.lines[key] = number
            if key and not self.in_code and not key.startswith("```"):
                self.last_line = key
            self._take_lone(raw)
            self.line_start = nl + 1
            if self.in_code or key.startswith("```") or not key:
                self.sentence_start = self.line_start  # code, fences and blank lines end a sentence

    def _sentence_end(self, limit: int) -> int | None:
        """The end (after its first following whitespace) of the current sentence, if it
        ends before `limit`; list markers ('2. ') do not end one."""
        if self.in_code:
            return None
        for m in _SENTENCE_END.finditer(self.text, self.sentence_start, min(limit + 1, len(self.text))):
            if not _LIST_MARKER.fullmatch(self.text[self.line_start : m.start() + 1]):
                return m.end()
        return None

    def _holding_from(self, ended: bool = False) -> int:
        """Where the held text starts: at the current line or sentence while it matches the
        start of an earlier one, else nothing is held. Until the stream has `ended`, a line
        or sentence that is so far only what may be an item's number ('4', '4.') is held
        too: shown, it stayed on screen above the repeat it began."""
        hold = len(self.text)
        if self.in_code or (ended and _MARKERS_ONLY.fullmatch(self.text[len(self.shown):])):
            # a label the answer ends with ("... 1.93 million. [2]") repeats nothing, though
            # every sentence after "... Q3. [1]" starts alike ("[0] Net income ...")
            return hold
        # Stripped both ways, as the lines kept are: a repeat followed by spaces was no
        # longer a prefix of its earlier line and was shown before its line break.
        line = _unmarked(self.text[self.line_start :].strip())
        item = _item(line, so_far=not ended)
        if line and (any(s.startswith(item) for s in self.lines) or self._could_repeat(item, self.last_line)
                     or self._could_count(item, ended)):
            hold = self.line_start
        if line and self._could_be_lone_again(line):
            hold = min(hold, self.line_start)
        sentence = _unmarked(_collapse(self.text[self.sentence_start :]))
        item = _item(sentence, so_far=not ended)
        if sentence and (any(s.startswith(item) for s in self.sentences)
                         or self._could_repeat(item, self.last_sentence) or self._could_count(item, ended)):
            hold = min(hold, self.sentence_start)
        return hold

    def _release(self, upto: int) -> str:
        out = self.text[len(self.shown) : upto] if upto > len(self.shown) else ""
        self.shown += out
        return out

    def _counts(self, key: str) -> bool:
        return width(key) >= self.min_line and not self.in_code

    def _adjacent(self, key: str, previous: str) -> bool:
        """`key` repeats the line or sentence just before it, or what it said after a colon
        ("答案如下：X。X。" or "Answer: X. X."), and is long enough to tell."""
        return (key in (previous, *_after_colons(previous)) and width(key) >= self.min_adjacent
                and not self.in_code)

    def _could_count(self, start: str, ended: bool) -> bool:
        """`start` may be the copy that makes ORDINAL_COPIES alike but for their ordinals."""
        starts = (_ordinal_free(start), _ordinal_free(start, so_far=not ended))
        return any(n >= ORDINAL_COPIES - 1 and said.startswith(starts)
                   for table in (self.counted_lines, self.counted_sentences) for said, n in table.items())

    def _lone_again(self, line: str) -> bool:
        """`line` (whole, stripped) is a paragraph of its own repeating the one before it, as
        often as makes a loop (`_lone_copies_needed`)."""
        return (self.after_blank and line == self.lone_line and _lone_line(line)
                and self.lone_copies + 1 >= _lone_copies_needed(line))

    def _could_be_lone_again(self, start: str) -> bool:
        """The line being written (`start`, stripped) may yet be the copy `_lone_again` stops at."""
        return (self.after_blank and not self.in_code and bool(self.lone_line) and self.lone_line.startswith(start)
                and self.lone_copies + 1 >= _lone_copies_needed(self.lone_line))

    def _take_lone(self, line: str) -> None:
        """Count a whole line (stripped) in: a blank one, or the next one-line paragraph."""
        if not line:
            self.after_blank = True
            return
        if self.in_code or line.startswith("```"):
            self.lone_line, self.lone_copies, self.after_blank = "", 0, False
            return
        if not self.after_blank:
            self.lone_line, self.lone_copies = "", 0  # a paragraph's second line: the last was no paragraph alone
        elif line == self.lone_line:
            self.lone_copies += 1
        else:
            self.lone_line, self.lone_copies = line, 1
        self.after_blank = False

    def _could_repeat(self, start: str, previous: str) -> bool:
        return any(width(said) >= self.min_adjacent and said.startswith(start)
                   for said in (previous, *_after_colons(previous)))


# A short line that is a paragraph of its own, the same as the paragraph just before it:
# a summary of mv(1) wrote "MV(1)" and a blank line 35 times, five shown before
# `RepetitionGuard` stopped it (a line under `min_adjacent` characters counts there alone,
# from LINE_COPIES copies). A fragment (no sentence end: a title, a name, a path) said twice
# so is a loop; a sentence three times ("Yes." may answer two questions in a row). Not a
# list item or a table row: "- yes" may be every item's answer.
LONE_FRAGMENT_COPIES = 2
LONE_SENTENCE_COPIES = 3
_LIST_OR_ROW = re.compile(r"(?:[-*+\u2022]|\d+[.)]|[A-Za-z][.)])(?:\s|$)|\|")
_ENDS_SENTENCE = re.compile(r"""[.!?\u061f\u06d4\u0964\u3002\uff01\uff1f]["')\]\u201d\u2019\u300d\uff09]*$""")


def _lone_line(line: str) -> bool:
    """A whole line (stripped) that `EchoedText` counts as a one-line paragraph repeating:
    words, not a list item, a table row or a fence."""
    return bool(_LETTERS.search(line)) and not _LIST_OR_ROW.match(line) and not line.startswith("```")


def _lone_copies_needed(line: str) -> int:
    return LONE_SENTENCE_COPIES if _ENDS_SENTENCE.search(line) else LONE_FRAGMENT_COPIES


# Copies of a line or sentence that differ only in their ordinals that end an answer: the
# bundled model wrote "The first part of the report describes ..." and the same under
# "second" to "eighteenth", to the token limit (probe 102). Two are let through: "The first
# argument is a path. The second argument is a path." may be so.
ORDINAL_COPIES = 3
_ORDINAL_WORDS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
                  "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|fortieth|"
                  "fiftieth|sixtieth|seventieth|eightieth|ninetieth|hundredth")
_ORDINAL = re.compile(rf"\b(?:(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)[- ]?)?(?:{_ORDINAL_WORDS})\b"
                      r"|\b\d+(?:st|nd|rd|th)\b", re.IGNORECASE)
_ORDINAL_PREFIXES = frozenset(w[:i] for w in _ORDINAL_WORDS.split("|") for i in range(1, len(w)))
_LAST_WORD = re.compile(r"\b([A-Za-z]+|\d+[a-z]?)$")


def _counted(key: str, counts: dict[str, int]) -> bool:
    """Whether `key` makes ORDINAL_COPIES alike but for their ordinals in `counts`; counts it."""
    free = _ordinal_free(key)
    if free == key:
        return False
    counts[free] = counts.get(free, 0) + 1
    return counts[free] >= ORDINAL_COPIES


def _ordinal_free(text: str, so_far: bool = False) -> str:
    """`text` with each ordinal ("third", "twenty-first", "18th") as "#". `so_far`: a last
    word still being written that may become one ("sev", "12") is one already (it may as
    well be another word: callers try both)."""
    free = _ORDINAL.sub("#", text)
    if so_far and (m := _LAST_WORD.search(free)) and (m[1].lower() in _ORDINAL_PREFIXES or m[1][0].isdigit()):
        free = free[: m.start()] + "#"
    return free


def _after_colons(text: str) -> list[str]:
    return [text[m.end():] for m in _COLON.finditer(text)]


_COLON = re.compile(r"[:\uff1a]\s*")


def width(text: str) -> int:
    """Characters, a wide one (CJK, full-width forms) counting two: about what a Latin
    character says, as a token is 3-4 of those and one or two of these. Lengths in plain
    characters let a Japanese heading of 9 characters loop 14 times unstopped."""
    if text.isascii():
        return len(text)
    return len(text) + sum(unicodedata.east_asian_width(ch) in "WF" for ch in text)


# A sentence ends at . ! ? (Arabic's ؟ and ۔, Devanagari's ।) and any closing quotes or
# brackets before whitespace; at CJK's 。！？ with or without a space after.
_SENTENCE_END = re.compile(r"""[.!?\u061f\u06d4\u0964]["')\]\u201d\u2019]*\s|"""
                           r"""[\u3002\uff01\uff1f][\u300d\u300f\u201d\u2019\uff09]*\s?""")
# "2. " or "b) " at the start of a line numbers a list item; it ends no sentence.
_LIST_MARKER = re.compile(r"\s*(\d+|[A-Za-z])[.)]")
_ITEM_NUMBER = re.compile(r"(\d+|[A-Za-z])[.)]\s+")
_ITEM_NUMBER_SO_FAR = re.compile(r"(\d+|[A-Za-z])[.)]?")


def _item_number(key: str) -> int | None:
    """The number of the list item a line or sentence starts ("4. " -> 4, "b) " -> 2)."""
    m = _ITEM_NUMBER.match(key)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1).isdigit() else ord(m.group(1).lower()) - ord("a") + 1


def _repeats(key: str, number: int | None, earlier: dict[str, int | None]) -> bool:
    """Whether `key` repeats an earlier line or sentence: the same words, and not an item of
    a list that starts again (a step shared by "On Linux: 1. ... 2. Download the installer"
    and "On macOS: 1. Download the installer" is no loop; "3. X", "4. X" is)."""
    if key not in earlier:
        return False
    before = earlier[key]
    return number is None or before is None or number > before


def _item(key: str, so_far: bool = False) -> str:
    """A line or sentence (stripped) less the number or letter of the list item it starts
    with. `so_far`: it is still being written, and what may yet be a number is nothing yet."""
    if so_far and _ITEM_NUMBER_SO_FAR.fullmatch(key):
        return ""
    m = _ITEM_NUMBER.match(key)
    return key[m.end() :] if m else key


def _collapse(text: str) -> str:
    return " ".join(text.split())
