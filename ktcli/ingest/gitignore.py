"""`.gitignore` rules as git applies them: each file's patterns are relative to its own
folder, deeper files override shallower ones, and the last matching pattern wins."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pattern:
    """One line of a rule file, matched against one path at a time, as git does while it
    walks: a folder a rule ignores is not entered, so nothing inside it is asked about.
    (pathspec's GitIgnoreSpec also matched paths through their parents and gave a parent's
    match priority: with `*`, `!src/`, `!*.py` it ignored src/ where git keeps src/c.py.)"""

    regex: re.Pattern
    negated: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.fullmatch(rel) is not None


def parse_pattern(line: str) -> Pattern | None:
    """A .gitignore line as git reads it (gitignore(5)); None for a blank or comment line."""
    line = _strip_trailing_spaces(line)
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    line = line[:-1] if dir_only else line
    if not line or "//" in line or _ends_in_escape(line):
        return None  # an empty name ("foo//", "//foo") or a lone trailing "\\": git matches nothing
    # A slash at the start or in the middle anchors the pattern to the rule file's folder;
    # without one it matches a name at any depth.
    anchored = "/" in line
    body = _translate(line.lstrip("/") if anchored else line)
    try:
        regex = re.compile(body if anchored else f"(?:.*/)?{body}", re.DOTALL)
    except re.error:  # a bracket expression regex cannot take: git matches nothing with it either
        return None
    return Pattern(regex, negated, dir_only)


def _strip_trailing_spaces(line: str) -> str:
    """Trailing spaces are not part of a pattern unless the last one is escaped."""
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line) and not stripped.endswith("\\\\"):
        return stripped + " "
    return stripped


def _ends_in_escape(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _translate(pattern: str) -> str:
    """gitignore's glob as a regex over a path relative to the rule file's folder."""
    names = pattern.split("/")
    parts = [p for i, p in enumerate(names) if not (p == "**" and i and names[i - 1] == "**")]  # **/** is **
    out: list[str] = []
    sep = False  # a "/" is owed before the next name
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            if i == 0 and not last:
                out.append("(?:.*/)?")  # leading **/: in every folder
            elif last:
                out.append("/.+" if i else ".*")  # trailing /**: everything inside, not the folder
            else:
                out.append("/(?:.*/)?")  # /**/: zero or more folders
            sep = False
            continue
        out.append(("/" if sep else "") + _glob(part))
        sep = True
    return "".join(out)


def _glob(part: str) -> str:
    out, i, n = [], 0, len(part)
    while i < n:
        c = part[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(part[i + 1]))
            i += 2
            continue
        if c == "*":
            while i + 1 < n and part[i + 1] == "*":
                i += 1  # ** within a name is one *
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            bracket = _bracket(part, i)
            if bracket is None:
                out.append(re.escape(c))  # an unclosed [ is itself
            else:
                out.append(bracket[0])
                i = bracket[1]
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


_POSIX_CLASSES = {"alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
                  "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
                  "space": " \\t\\n\\r\\f\\v", "upper": "A-Z", "xdigit": "0-9A-Fa-f"}


def _bracket(part: str, start: int) -> tuple[str, int] | None:
    """The bracket expression opening at part[start] as a regex class and the index of its
    closing "]", as wildmatch reads it: "!" or "^" negates, a "]" first is literal,
    "\\x" is x, "[:digit:]" a POSIX class; None where it does not close."""
    i, n = start + 1, len(part)
    negate = i < n and part[i] in "!^"
    i += negate
    items: list[str] = []
    first = True
    while i < n:
        c = part[i]
        if c == "]" and not first:
            return f"[{'^/' if negate else ''}{''.join(items)}]", i
        first = False
        if c == "[" and part.startswith("[:", i):
            end = part.find(":]", i + 2)
            name = part[i + 2 : end] if end > 0 else ""
            if name in _POSIX_CLASSES:
                items.append(_POSIX_CLASSES[name])
                i = end + 2
                continue
        if c == "\\" and i + 1 < n:
            i += 1
            c = part[i]
        if c == "-" and items and i + 1 < n and part[i + 1] != "]":
            items.append("-")  # a range between the items around it
        else:
            items.append(re.escape(c))
        i += 1
    return None


@dataclass(frozen=True)
class IgnoreFile:
    patterns: tuple[Pattern, ...]
    base: str  # the rule file's folder relative to the walk root ("" at or above it)
    prefix: str  # the walk root relative to the rule file's folder ("" at or below it)

    def verdict(self, rel: str, is_dir: bool) -> bool | None:
        """True: ignored, False: re-included by a `!` pattern, None: no pattern matches."""
        if self.base:
            if not rel.startswith(self.base + "/"):
                return None
            rel = rel[len(self.base) + 1 :]
        if self.prefix:
            rel = f"{self.prefix}/{rel}"
        return self.match(rel, is_dir)

    def match(self, rel: str, is_dir: bool, *also: str) -> bool | None:
        """The last pattern matching `rel` (relative to the rule file's folder), or one of the
        other spellings of the same path in `also`, decides."""
        for pattern in reversed(self.patterns):
            if pattern.matches(rel, is_dir) or any(pattern.matches(other, is_dir) for other in also):
                return not pattern.negated
        return None


IgnoreChain = tuple[IgnoreFile, ...]


def read_ignore_file(path: Path, base: str = "", prefix: str = "") -> IgnoreFile | None:
    try:
        # utf-8-sig: an editor's byte-order mark is not part of the first pattern (git skips it too)
        lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    except OSError:
        return None  # an unreadable .gitignore ignores nothing, as with git
    patterns = tuple(p for p in map(parse_pattern, lines) if p is not None)
    return IgnoreFile(patterns, base, prefix)


def exclude_rules(patterns: tuple[str, ...]) -> IgnoreFile | None:
    """`--exclude` patterns as one rule file at the folder given (later ones win, `!`
    re-includes); None for none. ValueError names a pattern that could match nothing: git
    would drop it without a word, and a user who typed it would read every file unawares."""
    parsed = []
    for text in patterns:
        # "./build" is "/build": the folder given's own (git matches nothing with "./",
        # but a user who typed it on the command line meant the folder's entry)
        bang = "!" if text.startswith("!") else ""
        if text[len(bang):].startswith("./"):
            text = bang + text[len(bang) + 1:]
        pattern = parse_pattern(text)
        if pattern is None or text.startswith("#"):
            raise ValueError(text)
        parsed.append(pattern)
    return IgnoreFile(tuple(parsed), base="", prefix="") if parsed else None


def is_ignored(chain: IgnoreChain, rel: str, is_dir: bool) -> bool:
    """The deepest rule file with a matching pattern decides."""
    for rules in reversed(chain):
        verdict = rules.verdict(rel, is_dir)
        if verdict is not None:
            return verdict
    return False


def tracked_paths(real_root: Path) -> frozenset[str]:
    """Files git tracks under `real_root` (relative to it) and the folders that hold them:
    ignore rules do not apply to them, as in git (a committed build/generated.py was
    skipped as "gitignored"). Empty outside a work tree, or where git cannot say."""
    if not any(_has_git(p) for p in (real_root, *real_root.parents)):
        return frozenset()
    try:
        listed = subprocess.run(["git", "-C", str(real_root), "ls-files", "-z"], capture_output=True, timeout=30,
                                check=True).stdout
    except (OSError, subprocess.SubprocessError):  # no git installed, not a work tree after all, a slow disk
        return frozenset()
    paths = set()
    for raw in listed.split(b"\0"):
        rel = os.fsdecode(raw)
        while rel and rel not in paths:
            paths.add(rel)
            rel = rel.rpartition("/")[0]
    return frozenset(paths)


def _has_git(folder: Path) -> bool:
    try:
        return (folder / ".git").exists()
    except OSError:  # a folder we may not look into (the walk reports it as unreadable)
        return False


def enclosing_rules(real_root: Path) -> tuple[IgnoreChain, bool]:
    """When the folder given lies inside a git work tree, the .gitignore files of its
    ancestors (up to the repository root) and .git/info/exclude apply too, as in git; and
    whether they ignore the folder itself. Then they are dropped (the user asked for it),
    and the caller says so: a repository's `build/` named was read with nothing said."""
    repo_root = next((p for p in (real_root, *real_root.parents) if _has_git(p)), None)
    if repo_root is None:
        return (), False
    chain: list[IgnoreFile] = []
    # The user's own excludes file first (git weighs it below the repository's files),
    # then .git/info/exclude: a `*.glob` in core.excludesFile, which `git status` honoured,
    # was read.
    for path in (_global_excludes(repo_root), repo_root / ".git" / "info" / "exclude"):
        exclude = read_ignore_file(path, prefix=_prefix(repo_root, real_root)) if path is not None else None
        if exclude is not None:
            chain.append(exclude)
    # Top-down: repo root first, the root's parent last; the root's own file is the walk's.
    for folder in reversed(real_root.parents):
        if folder != repo_root and repo_root not in folder.parents:
            continue
        gitignore = folder / ".gitignore"
        if gitignore.is_file():
            rules = read_ignore_file(gitignore, prefix=_prefix(folder, real_root))
            if rules is not None:
                chain.append(rules)
    outer = tuple(chain)
    if real_root != repo_root and _root_is_ignored(outer):
        return (), True
    return outer, False


def _global_excludes(repo_root: Path) -> Path | None:
    """git's core.excludesFile as this repository sees it, else its default place
    ($XDG_CONFIG_HOME/git/ignore, ~/.config/git/ignore)."""
    try:
        got = subprocess.run(["git", "-C", str(repo_root), "config", "--path", "--get", "core.excludesFile"],
                             capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git installed: its default place still
        got = None
    if got is not None and got.returncode == 0:
        named = got.stdout.decode(errors="replace").strip()
        if not named:  # set to nothing: no excludes file, as git has it
            return None
        path = Path(named).expanduser()
        return path if path.is_absolute() else repo_root / path
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config_home) / "git" / "ignore"


def _prefix(folder: Path, real_root: Path) -> str:
    rel = real_root.relative_to(folder).as_posix()
    return "" if rel == "." else rel


def _root_is_ignored(chain: IgnoreChain) -> bool:
    """Is the root (or any folder between it and the repository root) ignored?"""
    for rules in chain:
        parts = rules.prefix.split("/") if rules.prefix else []
        for depth in range(1, len(parts) + 1):
            if rules.match("/".join(parts[:depth]), is_dir=True):
                return True
    return False
