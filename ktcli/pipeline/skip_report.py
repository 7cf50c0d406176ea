"""The lines on stderr that say which files a run left out or read inexactly, grouped so
that thousands of one reason are one line (`--json` lists every entry)."""

from __future__ import annotations

import re

from ktcli.ingest.loaders import EMPTY_FILE
from ktcli.ingest.walk import EXCLUDED_BY
from ktcli.pipeline.events import Reporter


# More entries than this of one reason are said in one line (`report_skipped`).
GROUP_OVER = 3


def report_skipped(skipped, reporter: Reporter) -> None:
    """One line per file left out or read inexactly, and one line for each reason shared
    by more than GROUP_OVER of them: a folder of 3,000 images printed 3,000 "binary"
    lines, which --quiet keeps (a file left out must not go unsaid). Empty files are one
    line from two on (a Python repo's empty `__init__.py` files buried the lines that
    matter), and what --exclude left out is one line however few (the user chose it), with
    where its patterns came from (a config file's, said so). `--json` lists every entry."""
    groups: dict[tuple[str, str], list] = {}
    for entry in skipped:
        groups.setdefault(_group_key(entry), []).append(entry)
    grouped = {key for key, entries in groups.items()
               if len(entries) > GROUP_OVER or _excluded(key) or (key[1] == EMPTY_FILE and len(entries) > 1)}
    for entry in skipped:
        if _group_key(entry) not in grouped:
            reporter.warn(f"{_verb(entry)} {entry.path}: {entry.reason}")
    # in the order of their first entries; the user's own choice last
    for key in sorted((k for k in groups if k in grouped), key=_excluded):
        entries = groups[key]
        paths = [e.path for e in entries]
        if _excluded(key):
            named = entries[0].reason.removeprefix(EXCLUDED_BY)
            reporter.warn(f"excluded {_what(paths)} matching {named}: {first_named(paths)}")
        elif key[1] == EMPTY_FILE:
            reporter.warn(f"skipped {_count(len(paths), 'empty file')}: {first_named(paths)}")
        else:
            reporter.warn(f"{key[0]} {_what(paths)} ({_shared_reason([e.reason for e in entries])}): "
                          f"{first_named(paths)}")


def _excluded(key: tuple[str, str]) -> bool:
    return key[0] == "skipped" and key[1].startswith(EXCLUDED_BY)


def _verb(entry) -> str:
    return "read" if entry.replaced or entry.part else "skipped"


def _group_key(entry) -> tuple[str, str]:
    """What entries are said together by: a file left out by its reason's kind ("too large
    (3.1 MB > 2.0 MB ...)" is "too large"), a note on a file read by its whole text (a
    guessed encoding is worth seeing per encoding)."""
    verb = _verb(entry)
    return verb, entry.reason.split(" (", 1)[0] if verb == "skipped" else entry.reason


def _shared_reason(reasons: list[str]) -> str:
    """The reason entries share: whole where it is one, else its kind and the advice all
    end with ("too large; --max-file-bytes raises it, or name the file")."""
    if len(set(reasons)) == 1:
        return reasons[0]
    kind = reasons[0].split(" (", 1)[0]
    advice = {r.rstrip(")").rpartition("; ")[2] if "; " in r else "" for r in reasons}
    return f"{kind}; {advice.pop()}" if len(advice) == 1 and "" not in advice else kind


_PDF_PAGE = re.compile(r" p\.\d+$")


def _what(paths: list[str]) -> str:
    """"3,000 files", "2 folders and 310 files", "12 pages" (a PDF's, named `doc.pdf p.N`)."""
    folders = sum(p.endswith("/") for p in paths)
    pages = sum(bool(_PDF_PAGE.search(p)) for p in paths)
    counts = ((folders, "folder"), (len(paths) - folders - pages, "file"), (pages, "page"))
    return " and ".join(_count(n, noun) for n, noun in counts if n)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def first_named(paths: list[str], n: int = 3) -> str:
    """The first `n` of `paths`, and how many more ("a, b, c and 2,997 more")."""
    return ", ".join(paths[:n]) + (f" and {len(paths) - n:,} more" if len(paths) > n else "")
