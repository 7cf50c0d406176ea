"""The numbers LibreOffice shows before an OpenDocument list's items ("1.", "2.1", "(b)"),
computed from the list styles as it computes them: read as "- item", a numbered clause
list lost what a question about "clause 3" or a citation of "step 2.4" needs.

An item's label is its level style's prefix, the numbers of the `text:display-levels`
levels down to its own (each in its level's format, joined by "."), and its suffix. A list
restarts its numbers unless it says it continues: `text:continue-list` (the list with that
xml:id) or `text:continue-numbering="true"` (the last list of its style); an item's own
`text:start-value` sets its number. A level styled as a bullet (or with no number format)
keeps its "- ". Word files' numbers are `ingest.wordnumbers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

from ktcli.ingest.wordnumbers import formatted

_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
_STYLE = "{urn:oasis:names:tc:opendocument:xmlns:style:1.0}"
_XML_ID = "{http://www.w3.org/XML/1998/namespace}id"
_LEVELS = 10  # ODF's list levels
# ODF's style:num-format as Word's names, which `wordnumbers.formatted` writes.
_FORMATS = {"1": "decimal", "a": "lowerLetter", "A": "upperLetter", "i": "lowerRoman", "I": "upperRoman"}


@dataclass(frozen=True)
class _Level:
    fmt: str = "bullet"  # "decimal", "lowerLetter"... or "bullet" / "none": no number
    prefix: str = ""
    suffix: str = ""
    display: int = 1  # how many levels' numbers the label shows, its own the last
    start: int = 1


@dataclass
class _Counters:
    style: str | None
    values: list[int] = field(default_factory=lambda: [0] * _LEVELS)


class ListNumbers:
    """Labels of a document's list items, in reading order (`begin_list`, then `label` for
    each item, `end_list` after the list)."""

    def __init__(self, *roots: ET.Element | None) -> None:
        self.styles: dict[str, dict[int, _Level]] = {}
        for root in roots:
            for style in root.iter(f"{_TEXT}list-style") if root is not None else ():
                self.styles[style.get(f"{_STYLE}name", "")] = _levels(style)
        self._by_id: dict[str, _Counters] = {}
        self._last_of_style: dict[str | None, _Counters] = {}
        self._open: list[tuple[_Counters, str | None]] = []  # (counters, style) of the lists being read

    def begin_list(self, lst: ET.Element) -> None:
        """A text:list starts: nested in one being read, it counts with it (in its own style
        where it names one); at the top, it restarts or continues as it says."""
        style = lst.get(f"{_TEXT}style-name")
        if self._open:
            counters, outer_style = self._open[-1]
            self._open.append((counters, style or outer_style))
            return
        counters = None
        if (continued := lst.get(f"{_TEXT}continue-list")) is not None:
            counters = self._by_id.get(continued)
        elif lst.get(f"{_TEXT}continue-numbering") == "true":
            counters = self._last_of_style.get(style)
        if counters is None:
            counters = _Counters(style)
        if (own := lst.get(_XML_ID) or lst.get(f"{_TEXT}id")) is not None:
            self._by_id[own] = counters
        self._last_of_style[style] = counters
        self._open.append((counters, style))

    def end_list(self) -> None:
        if self._open:
            self._open.pop()

    def label(self, item: ET.Element, level: int) -> str | None:
        """The label of list item `item` at `level` (0 the outermost) of the list being
        read, counted; None for a bullet or an unnumbered level (the caller's "- ")."""
        if not self._open or not 0 <= level < _LEVELS:
            return None
        counters, style = self._open[-1]
        levels = self.styles.get(style or "", {})
        this = levels.get(level, _Level())
        values = counters.values
        start = item.get(f"{_TEXT}start-value")
        values[level] = int(start) if start and start.isdecimal() else (values[level] + 1 if values[level] else this.start)
        for deeper in range(level + 1, _LEVELS):
            values[deeper] = 0
        if this.fmt in ("bullet", "none"):
            return None
        shown = []
        for n in range(max(0, level - this.display + 1), level + 1):
            up = levels.get(n, _Level(fmt="decimal"))
            shown.append(formatted(values[n] or up.start, up.fmt if up.fmt not in ("bullet", "none") else "decimal"))
        label = f"{this.prefix}{'.'.join(shown)}{this.suffix}".strip()
        return label or None


def _levels(style: ET.Element) -> dict[int, _Level]:
    out: dict[int, _Level] = {}
    for el in style:
        try:
            level = int(el.get(f"{_TEXT}level", "1")) - 1
        except ValueError:
            continue
        if el.tag == f"{_TEXT}list-level-style-number":
            fmt = _FORMATS.get(el.get(f"{_STYLE}num-format", ""), "none")
            out[level] = _Level(fmt=fmt, prefix=el.get(f"{_STYLE}num-prefix", ""), suffix=el.get(f"{_STYLE}num-suffix", ""),
                                display=_positive(el.get(f"{_TEXT}display-levels"), 1),
                                start=_positive(el.get(f"{_TEXT}start-value"), 1))
        else:  # a bullet or a picture
            out[level] = _Level()
    return out


def _positive(value: str | None, default: int) -> int:
    return int(value) if value and value.isdecimal() and int(value) > 0 else default
