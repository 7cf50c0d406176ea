"""`.gitignore` rules as git applies them: each file's patterns are relative to its own
folder, deeper files override shallower ones, and the last matching pattern wins."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pathspec


@dataclass(frozen=True)
class IgnoreFile:
    spec: pathspec.GitIgnoreSpec
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
        return self.spec.check_file(rel + "/" if is_dir else rel).include


IgnoreChain = tuple[IgnoreFile, ...]


def read_ignore_file(path: Path, base: str = "", prefix: str = "") -> IgnoreFile | None:
    try:
        # utf-8-sig: an editor's byte-order mark is not part of the first pattern (git skips it too)
        lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    except OSError:
        return None  # an unreadable .gitignore ignores nothing, as with git
    return IgnoreFile(pathspec.GitIgnoreSpec.from_lines([_inside_only(line) for line in lines]), base, prefix)


def _inside_only(line: str) -> str:
    """`X/**` (and `X/**/`, folders only) as git reads it: everything inside X, not X
    itself. pathspec also matches the folder X, so `logs/**` with `!logs/**/` and
    `!logs/**/important.log` dropped all of logs/ where git keeps important.log, and a
    deeper `!logs/**/` re-included a logs/ that a shallower rule ignores. `X/**/*` (`X/**/*/`)
    says the same without matching X."""
    pattern = line.rstrip(" ")  # trailing spaces are not part of a pattern (unless escaped)
    if pattern.endswith("/**"):
        return pattern + "/*"
    if pattern.endswith("/**/"):
        return pattern + "*/"
    return line


def is_ignored(chain: IgnoreChain, rel: str, is_dir: bool) -> bool:
    """The deepest rule file with a matching pattern decides."""
    for rules in reversed(chain):
        verdict = rules.verdict(rel, is_dir)
        if verdict is not None:
            return verdict
    return False


def _has_git(folder: Path) -> bool:
    try:
        return (folder / ".git").exists()
    except OSError:  # a folder we may not look into (the walk reports it as unreadable)
        return False


def enclosing_rules(real_root: Path) -> IgnoreChain:
    """When the folder given lies inside a git work tree, the .gitignore files of its
    ancestors (up to the repository root) and .git/info/exclude apply too, as in git.
    They are dropped when they ignore the folder itself: the user asked for it."""
    repo_root = next((p for p in (real_root, *real_root.parents) if _has_git(p)), None)
    if repo_root is None:
        return ()
    chain: list[IgnoreFile] = []
    exclude = read_ignore_file(repo_root / ".git" / "info" / "exclude", prefix=_prefix(repo_root, real_root))
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
        return ()
    return outer


def _prefix(folder: Path, real_root: Path) -> str:
    rel = real_root.relative_to(folder).as_posix()
    return "" if rel == "." else rel


def _root_is_ignored(chain: IgnoreChain) -> bool:
    """Is the root (or any folder between it and the repository root) ignored?"""
    for rules in chain:
        parts = rules.prefix.split("/") if rules.prefix else []
        for depth in range(1, len(parts) + 1):
            if rules.spec.check_file("/".join(parts[:depth]) + "/").include:
                return True
    return False
