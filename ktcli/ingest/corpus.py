"""load_corpus: the paths a user gave (files, folders, `-`) to one Corpus."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ktcli.config import EXCLUDE_MATCHES_NOTHING
from ktcli.errors import InputError, UsageError
from ktcli.ingest.gitignore import exclude_rules
from ktcli.ingest.loaders import load_file, load_stdin
from ktcli.ingest.walk import OWN_OUTPUT, is_standard_output, printable, walk_folder
from ktcli.types import Corpus, Document, Skipped

STDIN_ARG = "-"


def load_corpus(paths: list[str], *, max_file_bytes: int = 2_000_000, stdin_text: str | None = None,
                exclude: tuple[str, ...] = (), exclude_named: str = "--exclude") -> Corpus:
    """Documents in the order given (a folder's files in sorted tree order) and every
    file left out of a folder walk with its reason. Raises InputError with one line for
    anything unusable that the user named, or a folder that yields nothing.

    `exclude`: gitignore-style patterns that folder walks leave out (reported). A file
    named here is read whatever they say, as it is whatever its size or kind: the user
    asked for it by name. `exclude_named`: where they came from, as reasons say it
    ("--exclude", "exclude in ~/.config/ktcli/config.toml")."""
    if not paths:
        raise InputError("no input: name a file, a folder, or `-` for standard input")
    if list(paths).count(STDIN_ARG) > 1:
        raise UsageError("`-` (standard input) given more than once")
    documents: list[Document] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    skipped_at: set[str] = set()  # absolute paths of skipped entries: `./tree` and `tree/` name one folder
    try:
        rules = exclude_rules(tuple(exclude))
    except ValueError as e:
        raise UsageError(f"{exclude_named} {str(e)!r}: {EXCLUDE_MATCHES_NOTHING}") from None
    for arg in paths:
        # Path("") is ".": an unset shell variable must not read the current folder (a file
        # named " " is still read)
        if not arg.strip() and not (arg and os.path.lexists(arg)):
            raise InputError("an input path is empty (an unset shell variable?): name a file, a folder, or `-`")
        if arg == STDIN_ARG:
            documents.append(load_stdin(stdin_text))
            continue
        path = Path(arg)
        try:
            is_dir = path.is_dir()
        except PermissionError:  # a folder above it may not be entered
            raise InputError(f"{_short(arg)}: unreadable (permission denied on a folder of its path)") from None
        except OSError as e:  # a name too long for the file system, most often a misplaced question
            raise InputError(f"{_short(arg)}: no such file or folder ({e.strerror or e})") from None
        if is_dir:
            result = walk_folder(_tidy(arg), max_file_bytes=max_file_bytes, seen=seen, exclude=rules,
                                 exclude_named=exclude_named)
            if not result.documents and not result.already_read:
                raise InputError(_nothing_left(arg, result.skipped))
            documents.extend(result.documents)
            # A folder given twice (however spelled), or inside another one given: its files
            # are read once and its skipped entries reported once.
            for entry in result.skipped:
                where = os.path.abspath(entry.path)
                if where not in skipped_at:
                    skipped_at.add(where)
                    skipped.append(entry)
            continue
        real = os.path.realpath(arg)
        if real in seen:
            continue
        if is_standard_output(path):  # `ktcli ask notes/*.md "q" > notes/answer.md`: the shell emptied it
            skipped.append(Skipped(printable(_tidy(arg)), OWN_OUTPUT))
            continue
        documents.append(load_file(path, printable(_tidy(arg))))
        seen.add(real)
    # A file a walk left out and a later path named (`ktcli ask repo repo/a.log`) was read:
    # not reported as left out. (Named before the walk, the walk knew: `walk.given_already`.)
    skipped = [s for s in skipped if s.path.endswith("/") or _real_entry(s.path) not in seen]
    documents, copies = _without_copies(documents)
    skipped.extend(copies)
    skipped.extend(part for d in documents for part in d.left_out)
    if not documents:  # every path named was the file the answer is written to
        raise InputError(f"{skipped[0].path}: {OWN_OUTPUT}; nothing else to read")
    return Corpus(tuple(documents), tuple(skipped))


# A document this long (characters of text) that another one holds whole is read once: a
# report saved in two folders took two of the 4 passages retrieved, and a whole read twice
# the window. Short ones repeat by nature (empty `__init__.py`, licence stubs) and cost little.
MIN_COPY_CHARS = 200


def _without_copies(documents: list[Document]) -> tuple[list[Document], list[Skipped]]:
    """The documents less those whose text an earlier one has, and a note for each of them."""
    first: dict[str, str] = {}
    kept: list[Document] = []
    copies: list[Skipped] = []
    for doc in documents:
        if len(doc.text) >= MIN_COPY_CHARS and doc.sha256 in first:
            copies.append(Skipped(doc.path, f"the same text as {first[doc.sha256]}: read once"))
            continue
        first.setdefault(doc.sha256, doc.path)
        kept.append(doc)
    return kept, copies


def _real_entry(path: str) -> str:
    """The real path of the entry itself: its folders resolved, not a link it may be (a
    link to a file that was read is still a link left out)."""
    folder, name = os.path.split(path)
    return os.path.join(os.path.realpath(folder or "."), name)


def _tidy(arg: str) -> str:
    """A path as typed, less what says nothing: "./notes.md" is "notes.md", "docs//a" is
    "docs/a". The path is written into the prompt the model reads, so the same file named
    two ways was prefilled twice and kept twice by the prompt cache. Left alone where it
    holds "..", whose meaning depends on links."""
    if ".." in Path(arg).parts:
        return arg
    return os.path.normpath(arg)


def _short(arg: str, limit: int = 80) -> str:
    return arg if len(arg) <= limit else arg[: limit - 3] + "..."


def _nothing_left(arg: str, skipped: list[Skipped]) -> str:
    if not skipped:
        return f"{arg}: the folder holds no files to read"
    reasons = Counter(_reason_kind(s.reason) for s in skipped)
    summary = ", ".join(_counted(n, reason) for reason, n in reasons.most_common(4))
    if len(reasons) > 4:
        summary += ", ..."
    entries = "entry was" if len(skipped) == 1 else f"{len(skipped)} entries were"
    # the way past the limit, as each "too large" skip says it (the error alone left it out)
    hint = "; --max-file-bytes raises the limit, or name the file" if "too large" in reasons else ""
    return f"{arg}: nothing left to read; {'the' if len(skipped) == 1 else 'all'} {entries} skipped ({summary}){hint}"


# The nouns reasons name their entries by, made plural by a count ("2 symlink inside the
# folder" was said); a reason that is an adjective ("binary", "gitignored") reads as it is.
_PLURALS = {"symlink": "symlinks", "folder": "folders", "file": "files", "lockfile": "lockfiles",
            "environment": "environments"}


def _counted(n: int, kind: str) -> str:
    """"2 symlinks inside the folder", "1 unreadable folder", "3 lockfiles" (of "a lockfile")."""
    words = kind.split(" ")
    if len(words) > 1 and words[0] in ("a", "an"):
        words = words[1:]
    if n != 1:
        # the first noun that is the entries' own ("not a regular file" stays as it is)
        for i, word in enumerate(words):
            if word in _PLURALS and not {"a", "an", "not"} & set(words[:i]):
                words[i] = _PLURALS[word]
                break
    return f"{n:,} {' '.join(words)}"


def _reason_kind(reason: str) -> str:
    """"too large (3.1 MB > 2.0 MB limit)" -> "too large", "binary: an executable (ELF)" ->
    "binary": groups reasons for a summary ("1 binary, 1 binary: an executable" was said)."""
    return reason.split(" (", 1)[0].split(": ", 1)[0]
