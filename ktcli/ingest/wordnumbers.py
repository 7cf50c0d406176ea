"""The numbers Word computes for numbered paragraphs (list items, numbered headings: "4.2",
"(a)", "iii."), from its numbering part (word/numbering.xml), as Word counts them.

- A paragraph names a numbering instance (`w:num`, by its numId) and a level (0..8); the
  instance names an abstract definition (`w:abstractNum`) whose levels say how to number:
  a start value, a format (decimal, letters, roman...), a text with placeholders ("%1.%2."
  is level 1's current value, a dot, level 2's, a dot), when a level restarts.
- Counters are kept per abstract definition, so that the instances of one definition go
  on from each other (as Word numbers them); an instance that overrides a level (Word's
  "restart numbering": `w:startOverride`, or a `w:lvl` of its own) counts on its own, and
  the instance it restarted goes on from where it was.
- A level counts up at each paragraph at that level; the deeper levels start again after
  it (or only after a shallower one, or never, as `w:lvlRestart` says).
- A definition that only points at a numbering style (`w:numStyleLink`) is that style's
  definition (the one whose `w:styleLink` names it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable
from xml.etree import ElementTree as ET

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
MC = "{http://schemas.openxmlformats.org/markup-compatibility/2006}"
LEVELS = 9
_MAX_LINKS = 8
_PLACEHOLDER = re.compile(r"%([1-9])")


@dataclass(frozen=True)
class _Level:
    start: int = 1
    fmt: str = "decimal"
    text: str = ""
    restart: int | None = None  # w:lvlRestart: None, restart after any shallower level; 0, never
    legal: bool = False  # w:isLgl: every level's number in decimal
    style: str | None = None  # the paragraph style numbered at this level (w:pStyle)


def _int(el: ET.Element | None, default: int | None) -> int | None:
    value = el.get(f"{W}val") if el is not None else None
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _level(lvl: ET.Element) -> _Level:
    fmt = lvl.find(f"{W}numFmt")
    if fmt is None:  # Word 2010's custom formats ("001, 002, ..."): their fallback
        fmt = lvl.find(f"{MC}AlternateContent/{MC}Fallback/{W}numFmt")
    text = lvl.find(f"{W}lvlText")
    legal = lvl.find(f"{W}isLgl")
    style = lvl.find(f"{W}pStyle")
    return _Level(start=_int(lvl.find(f"{W}start"), 1) or 0,
                  fmt=(fmt.get(f"{W}val") if fmt is not None else None) or "decimal",
                  text=(text.get(f"{W}val") if text is not None else None) or "",
                  restart=_int(lvl.find(f"{W}lvlRestart"), None),
                  legal=legal is not None and legal.get(f"{W}val") in (None, "1", "true", "on"),
                  style=style.get(f"{W}val") if style is not None else None)


def _levels(parent: ET.Element) -> dict[int, _Level]:
    out: dict[int, _Level] = {}
    for lvl in parent.findall(f"{W}lvl"):
        ilvl = _int_attr(lvl, "ilvl")
        if ilvl is not None and 0 <= ilvl < LEVELS:
            out[ilvl] = _level(lvl)
    return out


def _int_attr(el: ET.Element, name: str) -> int | None:
    value = el.get(f"{W}{name}")
    return int(value) if value is not None and value.lstrip("-").isdecimal() else None


@dataclass
class _Instance:
    abstract: str
    starts: dict[int, int]  # w:startOverride by level
    levels: dict[int, _Level]  # a level redefined whole by its w:lvlOverride


class Numbering:
    """`label(numId, ilvl, style)`, paragraph after paragraph in reading order. `style_num`:
    the numId a (numbering) style's paragraph properties name, for `w:numStyleLink`."""

    def __init__(self, root: ET.Element | None, style_num: Callable[[str], str | None]) -> None:
        self.abstracts: dict[str, dict[int, _Level]] = {}
        self.style_links: dict[str, str] = {}  # abstract id -> the numbering style it is the definition of
        self.num_style_links: dict[str, str] = {}  # abstract id -> the numbering style it stands for
        self.instances: dict[str, _Instance] = {}
        self.style_num = style_num
        self.counters: dict[str, list[int | None]] = {}
        for abstract in root.findall(f"{W}abstractNum") if root is not None else ():
            aid = abstract.get(f"{W}abstractNumId")
            if aid is None:
                continue
            self.abstracts[aid] = _levels(abstract)
            for tag, links in (("styleLink", self.style_links), ("numStyleLink", self.num_style_links)):
                link = abstract.find(f"{W}{tag}")
                if link is not None and link.get(f"{W}val"):
                    links[aid] = link.get(f"{W}val", "")
        for num in root.findall(f"{W}num") if root is not None else ():
            nid, abstract_id = num.get(f"{W}numId"), num.find(f"{W}abstractNumId")
            if nid is None or abstract_id is None or abstract_id.get(f"{W}val") is None:
                continue
            starts: dict[int, int] = {}
            levels: dict[int, _Level] = {}
            for override in num.findall(f"{W}lvlOverride"):
                ilvl = _int_attr(override, "ilvl")
                if ilvl is None or not 0 <= ilvl < LEVELS:
                    continue
                start = _int(override.find(f"{W}startOverride"), None)
                if start is not None:
                    starts[ilvl] = start
                lvl = override.find(f"{W}lvl")
                if lvl is not None:
                    levels[ilvl] = _level(lvl)
            self.instances[nid] = _Instance(abstract_id.get(f"{W}val", ""), starts, levels)

    def _definition(self, abstract: str) -> str | None:
        """The abstract definition that numbers, following numbering-style links."""
        for _ in range(_MAX_LINKS):
            style = self.num_style_links.get(abstract)
            if style is None:
                return abstract if abstract in self.abstracts else None
            nid = self.style_num(style)
            target = self.instances[nid].abstract if nid in self.instances else None
            if target is None or target == abstract:
                target = next((a for a, s in self.style_links.items() if s == style), None)
            if target is None or target == abstract:
                return None
            abstract = target
        return None

    def label(self, num_id: str, ilvl: int | None, style: str | None = None) -> str | None:
        """The number of the next paragraph numbered by instance `num_id` at level `ilvl`
        (None: the level whose paragraph style is `style`, else the first), counted: "1.2",
        "(a)"; "" for a bullet or a level without a number; None where the document defines
        no such numbering."""
        instance = self.instances.get(num_id)
        abstract = self._definition(instance.abstract) if instance is not None else None
        if instance is None or abstract is None:
            return None
        defined = self.abstracts[abstract]

        def level(n: int) -> _Level:
            return instance.levels.get(n) or defined.get(n) or _Level()

        def start(n: int) -> int:
            return instance.starts.get(n, level(n).start)

        if ilvl is None:
            ilvl = next((n for n in range(LEVELS) if style is not None and level(n).style == style), 0)
        ilvl = max(0, min(ilvl, LEVELS - 1))
        # An instance that overrides a level (a restart: w:startOverride, or a w:lvl of its own)
        # is a list of its own; the others go on from each other's numbers
        own = bool(instance.starts or instance.levels)
        counters = self.counters.setdefault(f"num {num_id}" if own else abstract, [None] * LEVELS)
        current = counters[ilvl]
        counters[ilvl] = start(ilvl) if current is None else current + 1
        for deeper in range(ilvl + 1, LEVELS):
            restart = level(deeper).restart
            if restart is None or restart > deeper or (restart != 0 and ilvl < restart):
                counters[deeper] = None
        this = level(ilvl)
        if this.fmt == "bullet":
            return ""

        def number(match: re.Match[str]) -> str:
            n = int(match.group(1)) - 1
            value = counters[n]
            fmt = level(n).fmt
            legal = this.legal and fmt not in ("none", "bullet")
            return formatted(value if value is not None else start(n), "decimal" if legal else fmt)

        return " ".join(_PLACEHOLDER.sub(number, this.text).split())


def formatted(value: int, fmt: str) -> str:
    if fmt in ("none", "bullet"):
        return ""
    if fmt in ("lowerLetter", "upperLetter") and value > 0:
        letters = chr(ord("a") + (value - 1) % 26) * ((value - 1) // 26 + 1)  # Word's z, aa, bb...
        return letters.upper() if fmt == "upperLetter" else letters
    if fmt in ("lowerRoman", "upperRoman") and 0 < value < 4000:
        return roman(value).upper() if fmt == "upperRoman" else roman(value)
    if fmt == "decimalZero":
        return f"{value:02d}"
    return str(value)  # decimal, and what is not read yet (ordinal words, other scripts)


def roman(n: int) -> str:
    """Lower-case roman numerals (Word's lowerRoman lists, and its endnotes' i, ii, iii)."""
    out = ""
    for value, letters in ((1000, "m"), (900, "cm"), (500, "d"), (400, "cd"), (100, "c"), (90, "xc"), (50, "l"),
                           (40, "xl"), (10, "x"), (9, "ix"), (5, "v"), (4, "iv"), (1, "i")):
        while n >= value:
            out, n = out + letters, n - value
    return out
