"""A file that is README badges alone, said in words instead of summarized by the model.

Why: libcbor's README is seven lines of `[![CircleCI](...svg)](...)` and nothing else. The
bundled model wrote a summary of made-up prose ("PJK is a project that focuses on ... the C++
standard library", libcbor being C), or copied the badge lines, which a summary leaves out
(`summary_lines`), so the summary was empty. What the badges say is in their alt texts and
links: what is checked (CI, docs, coverage, fuzzing) and where, and the license. They are
listed as such, with no model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

# A Markdown image, maybe a link: `![alt](image)` or `[![alt](image)](link)`. Matched only
# where the last one ended (never searched for), its parts bounded: a line of "[![" over
# and over costs one pass, not one a position.
_BADGE = re.compile(r"(?:\[\s{0,8})?!\[(?P<alt>[^\]\n]{0,200})\]\((?P<image>[^)\s]{0,2000})(?:\s+\"[^\"\n]{0,200}\")?\)"
                    r"(?:\s{0,8}\]\((?P<link>[^)\s]{0,2000})\))?")
_BETWEEN = re.compile(r"[\s,|]*")
MAX_LISTED = 20  # badges listed at most; the rest are counted

# What a badge is about, by the words of its alt text first, then by its links' hosts and
# paths. In this order: "Documentation Status" is docs, "Build status" CI, "Fuzzing Status"
# fuzzing, a CI badge's link may hold "docs".
_KINDS = (
    ("license", re.compile(r"(?i)licen[cs]e|opensource\.org/licenses")),
    ("coverage", re.compile(r"(?i)codecov|coveralls|coverage")),
    ("fuzzing", re.compile(r"(?i)fuzz")),
    ("docs", re.compile(r"(?i)readthedocs|\bdocs?\b|documentation|docs\.rs|godoc|pkg\.go\.dev")),
    ("CI", re.compile(
        r"(?i)circleci|travis|appveyor|cirrus|jenkins|azure|buildkite|drone|github\.com/[^\s)]*/actions|/workflows/"
        r"|pipelines?\b|\bbuild\b|\bci\b|\btests?\b")),
    ("packaged versions", re.compile(
        r"(?i)repology|pypi|crates\.io|npmjs|conda|packagist|rubygems|nuget|maven|\bversions?\b|\brelease")),
    ("downloads", re.compile(r"(?i)download")),
    ("code quality", re.compile(r"(?i)codacy|codeclimate|sonar|lgtm|scrutinizer|codefactor|quality")),
    ("chat", re.compile(r"(?i)gitter|discord|slack|zulip|matrix\.to")),
)
# shields.io's static badge: /badge/<label>-<message>-<colour> ("License-MIT-blue" is MIT)
_SHIELD = re.compile(r"/badge/(?P<label>(?:[^-/]|--)+)-(?P<message>(?:[^-/]|--)+)-[^-/]+?(?:\.svg|\.png)?$")


@dataclass(frozen=True)
class Badge:
    alt: str
    image: str
    link: str

    @property
    def kind(self) -> str:
        """What it is about ("" where neither its words nor its links say)."""
        for texts in ((self.alt,), (self.image, self.link)):
            for kind, pattern in _KINDS:
                if any(pattern.search(t) for t in texts):
                    return kind
        return ""

    @property
    def says(self) -> str:
        """A static shields.io badge's message ("MIT"), else ""."""
        m = _SHIELD.search(urlsplit(self.image).path) if "shields.io" in self.image else None
        if not m:
            return ""
        return unquote(m["message"]).replace("--", "-").replace("__", "\0").replace("_", " ").replace("\0", "_")


MAX_CHARS = 20_000  # a README of badges alone is short: longer texts are not looked through


def badges_only(text: str) -> list[Badge] | None:
    """The badges of a text that is lines of badges alone (blank lines between), else None.
    Cheap on any other text: a folder's every file is asked (`prepare.shown_whole`)."""
    if len(text) > MAX_CHARS or not text.lstrip().startswith(("![", "[")):
        return None
    found: list[Badge] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        at = _BETWEEN.match(line).end()
        while at < len(line):
            m = _BADGE.match(line, at)
            if m is None:
                return None
            found.append(Badge(m["alt"].strip(), m["image"], m["link"] or ""))
            at = _BETWEEN.match(line, m.end()).end()
    return found or None


def badge_summary(text: str) -> str | None:
    """What a text of badges alone says, in a sentence and a list of its badges (alt text,
    what it is about, where it points); None for any other text."""
    found = badges_only(text)
    if found is None:
        return None
    kinds = _kinds(found)
    about = f": {kinds}" if kinds else ""
    rows = []
    for b in found[:MAX_LISTED]:
        name = b.alt or "(no alt text)"
        if b.says and b.says.lower() not in name.lower():
            name += f" ({b.says})"
        named = any(word in name.lower() for word in b.kind.lower().split() if len(word) > 3)
        note = f" ({b.kind})" if b.kind and b.kind.lower() not in name.lower() and not named else ""
        rows.append(f"- {name}{note}: {b.link or b.image}")
    if len(found) > MAX_LISTED:
        rows.append(f"- ... and {len(found) - MAX_LISTED} more")
    n = len(found)
    return (f"The file holds only {n} badge{'s' if n > 1 else ''} (linked images), no text of its own{about}.\n"
            + "\n".join(rows))


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _kinds(found: list[Badge]) -> str:
    """What the badges are about, each kind once, in their order ("" where none says)."""
    kinds: list[str] = []
    for b in found:
        kind = b.kind + (f" ({b.says})" if b.kind == "license" and b.says else "")
        if b.kind and kind not in kinds:
            kinds.append(kind)
    return _listed(kinds) if kinds else ""


def badges_line(text: str) -> str | None:
    """A folder's file map's line for a text of badges alone (`file_map`): what they are
    about; None for any other text."""
    found = badges_only(text)
    if found is None:
        return None
    kinds = _kinds(found)
    return f"{len(found)} badge{'s' if len(found) > 1 else ''} alone" + (f": {kinds}" if kinds else "")
