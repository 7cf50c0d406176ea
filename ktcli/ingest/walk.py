"""Folder and repository walks: which files become Documents, and why the rest do not."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from ktcli.ingest.compressed import UnpackedOverLimit
from ktcli.ingest.errors import RejectedInput, TextOverLimit
from ktcli.ingest.gitignore import (IgnoreChain, IgnoreFile, enclosing_rules, is_ignored, read_ignore_file,
                                    tracked_paths)
from ktcli.ingest.loaders import TarArchive, archive_by_name, document_from_bytes, read_file_bytes
from ktcli.ingest.sniff import has_binary_extension
from ktcli.types import Document, Skipped

# Version-control internals are never content and not worth reporting.
VCS_NAMES = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", "CVS", ".pijul", ".fossil"})
# Folders of installed dependencies and tool caches: reported, never read. A repo without
# a .gitignore would otherwise pour a whole virtualenv into the context.
CACHE_DIRS = frozenset(
    {"__pycache__", "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox",
     ".hypothesis", ".ipynb_checkpoints", ".gradle", ".idea", ".venv", ".eggs", ".cache", "site-packages"}
)


# The reason of an entry --exclude left out begins so, then names where the patterns came
# from (`excluded_by`); such entries are reported in one line (`pipeline.skip_report`).
EXCLUDED_BY = "excluded by "


def excluded_by(named: str = "--exclude") -> str:
    """The reason of an entry that patterns named so left out ("excluded by --exclude",
    "excluded by exclude in ~/.config/ktcli/config.toml")."""
    return EXCLUDED_BY + named


# Control characters as Python writes them in a string ("\\n", "\\x1b"): names only, read
# through the real entry.
# Shown escaped in paths: control characters, and the bytes of a name that is not UTF-8,
# which Python keeps as lone surrogates (U+DC80-U+DCFF) that no tokenizer or terminal
# takes: a file named b"caf\xe9.txt" failed every command on its folder.
# A backslash is doubled, as `ls -b` does, so that b"caf\xe9.txt" (shown caf\xe9.txt) and
# a file really named caf\xe9.txt stay two paths.
# Bidirectional controls and C1 controls are escaped too: a file named "\u202etxt.exe" showed
# reversed in a terminal, as "exe.txt" (the trick of spoofed attachments); and characters
# that show nothing (a zero-width space or word joiner, a BOM), or two names looked the same.
# Zero-width joiners and non-joiners stay: Persian words and emoji sequences hold them.
_ESCAPED = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)} | {
    0xDC00 + b: f"\\x{b:02x}" for b in range(0x80, 0x100)} | {ord("\\"): "\\\\"} | {
    c: f"\\u{c:04x}" for c in (*range(0x80, 0xA0), 0x061C, 0x200B, 0x200E, 0x200F, 0x2028, 0x2029,
                                 *range(0x202A, 0x202F), 0x2060, *range(0x2066, 0x206A), 0xFEFF)}


OWN_OUTPUT = "this run's own output (standard output is written to it)"


def is_standard_output(path: Path) -> bool:
    """Whether `path` is the file standard output is redirected to."""
    try:
        info = path.stat()
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == _standard_output()


def _standard_output() -> tuple[int, int] | None:
    """(device, inode) of the regular file standard output is redirected to with `>` (the
    shell emptied it), else None. Appended to (`>>`), it still holds what it held: read."""
    try:
        info = os.fstat(1)
        appended = fcntl.fcntl(1, fcntl.F_GETFL) & os.O_APPEND
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) and not appended else None


def printable(path: str) -> str:
    """`path` as reports and citations show it (see _ESCAPED)."""
    return path.translate(_ESCAPED)


@dataclass
class WalkResult:
    documents: list[Document] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    already_read: int = 0  # files an earlier path of the same call had loaded


def walk_folder(root_arg: str, *, max_file_bytes: int, seen: set[str] | None = None,
                exclude: IgnoreFile | None = None, exclude_named: str = "--exclude") -> WalkResult:
    """Every usable file under `root_arg` in sorted tree order; the rest as Skipped.

    `seen` holds real paths already loaded (shared across the paths of one call), so a
    file named twice is read once. Symlinks are never followed: one pointing outside
    the folder would leak files the user did not give, and one pointing inside names a
    file or folder the walk reaches at its own path anyway (and could form a loop).
    `exclude` (`gitignore.exclude_rules`) leaves out what matches a path relative to the
    folder, or as it is shown (`display`); `exclude_named` says where they came from."""
    root = Path(root_arg)
    real_root = root.resolve()
    seen = seen if seen is not None else set()
    walker = _Walker(root_arg, real_root, max_file_bytes, seen, earlier=frozenset(seen),
                     tracked=tracked_paths(real_root), exclude=exclude,
                     excluded_reason=excluded_by(exclude_named))
    rules, ignored = enclosing_rules(real_root)
    if ignored:
        walker.result.skipped.append(Skipped(printable(root_arg.rstrip("/") or root_arg) + "/",
                                             "its repository's git ignore rules leave it out (read, as it was named)",
                                             replaced=True))
    walker.walk(real_root, rules)
    return walker.result


@dataclass
class _Walker:
    root_arg: str
    real_root: Path
    max_file_bytes: int
    seen: set[str]
    result: WalkResult = field(default_factory=WalkResult)
    earlier: frozenset[str] = frozenset()  # `seen` as the walk began: the files of earlier paths
    tracked: frozenset[str] = frozenset()  # files git tracks and their folders (`tracked_paths`)
    # Ignored folders entered only for the tracked files inside: the rest of them is ignored.
    entered_for_tracked: set[str] = field(default_factory=set)
    exclude: IgnoreFile | None = None
    excluded_reason: str = excluded_by()
    # The file standard output is written to (`_standard_output`), looked up once a walk,
    # not once a file.
    own_output: tuple[int, int] | None = field(default_factory=_standard_output)

    def display(self, rel: str) -> str:
        """The folder as the user typed it, joined with the relative path, so a citation
        opens from the user's working directory. Control characters in a found name are
        shown escaped: a file called "skip\\nme.log" split its report and citations in two."""
        rel = printable(rel)
        if self.root_arg in (".", "./"):
            return rel
        root = printable(self.root_arg)
        return f"{root.rstrip('/')}/{rel}" if root.rstrip("/") else f"/{rel}"

    def skip(self, rel: str, reason: str, is_dir: bool = False) -> None:
        self.result.skipped.append(Skipped(self.display(rel) + ("/" if is_dir else ""), reason))

    def walk(self, real_root: Path, chain: IgnoreChain) -> None:
        """Depth first in sorted order, on a stack of folders rather than recursion: a
        tree 330 folders deep exhausted Python's recursion limit."""
        stack: list[tuple[Iterator[os.DirEntry[str]], str, IgnoreChain]] = []
        opened = self.open_dir(real_root, "", chain)
        if opened is not None:
            stack.append(opened)
        while stack:
            entries, rel, chain = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            entry_rel = f"{rel}/{entry.name}" if rel else entry.name
            if self.visit(entry, entry_rel, chain):
                opened = self.open_dir(Path(entry.path), entry_rel, chain)
                if opened is not None:
                    stack.append(opened)

    def open_dir(self, folder: Path, rel: str, chain: IgnoreChain):
        """The folder's entries in name order and the rules that apply inside it; None
        (reported) where it cannot be read."""
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except PermissionError:
            self.skip(rel or ".", "unreadable folder (permission denied)", is_dir=True)
            return None
        except OSError as e:
            self.skip(rel or ".", f"unreadable folder ({e.strerror or e})", is_dir=True)
            return None
        if any(e.name == ".gitignore" for e in entries):
            rules = read_ignore_file(folder / ".gitignore", base=rel)
            if rules is not None:
                chain = (*chain, rules)
        return iter(entries), rel, chain

    def visit(self, entry: os.DirEntry[str], rel: str, chain: IgnoreChain) -> bool:
        """Read or report one entry; True for a folder to walk into."""
        if entry.name in VCS_NAMES:
            return False
        try:
            is_link = entry.is_symlink()
        except OSError:
            is_link = False
        try:
            is_dir = entry.is_dir()  # follows links: "dir/" patterns match linked folders too
        except OSError:  # a loop of links (ELOOP): still reported as the link it is
            is_dir = False
        if self.excluded(rel, is_dir):
            if self.given_already(entry, is_dir):
                self.result.already_read += not is_dir
            else:
                self.skip(rel, self.excluded_reason, is_dir=is_dir)
            return False
        ignored = is_ignored(chain, rel, is_dir) or rel.rpartition("/")[0] in self.entered_for_tracked
        if ignored and rel in self.tracked:  # git's ignore rules do not apply to what it tracks
            ignored = False
            if is_dir:
                self.entered_for_tracked.add(rel)
        if ignored:
            if self.given_already(entry, is_dir):
                self.result.already_read += not is_dir
            else:
                self.skip(rel, "gitignored", is_dir=is_dir)
        elif is_link:
            self.skip(rel, self.symlink_reason(entry))
        elif is_dir:
            return self.enter_dir(entry, rel)
        elif entry.is_file(follow_symlinks=False):
            self.visit_file(entry, rel)
        else:
            self.skip(rel, "not a regular file")
        return False

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """Matched by --exclude, relative to the folder given or as the path is shown: a
        path copied from a report (`poly/tests/fixtures/big.csv`) works as well."""
        if self.exclude is None:
            return False
        # One verdict over both spellings, the last pattern matching either deciding: an
        # `!reports/2024/x.pdf` after `x.*` re-included the file relative to the folder, and
        # the shown path, which it did not match, excluded it all the same.
        shown = self.display(rel)
        return bool(self.exclude.match(rel, is_dir, *([shown] if shown != rel else [])))

    def given_already(self, entry: os.DirEntry[str], is_dir: bool) -> bool:
        """An ignored file (or folder) that the user also named, and that was read: not
        reported as left out (`ktcli ask repo/a.log repo` read a.log and said it skipped it)."""
        real = os.path.realpath(entry.path)
        if not is_dir:
            return real in self.seen
        # Only files read before this walk can lie in a folder it does not enter.
        return any(path.startswith(real + os.sep) for path in self.earlier)

    def symlink_reason(self, entry: os.DirEntry[str]) -> str:
        try:
            target = Path(entry.path).resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):  # its target, or a folder on the way, is not there
            return "broken symlink"
        except (OSError, RuntimeError) as e:  # RuntimeError: a loop, in Pythons before 3.13
            if isinstance(e, RuntimeError) or e.errno == errno.ELOOP:
                return "symlink loop (links that point at each other)"
            return f"unreadable symlink ({e.strerror or e})"
        if target != self.real_root and self.real_root not in target.parents:
            return "symlink outside the folder (not followed)"
        return "symlink inside the folder (not followed; its target is walked at its own path)"

    def enter_dir(self, entry: os.DirEntry[str], rel: str) -> bool:
        if entry.name in CACHE_DIRS:
            self.skip(rel, "dependency or cache folder", is_dir=True)
        elif os.path.isfile(os.path.join(entry.path, "pyvenv.cfg")):
            self.skip(rel, "virtual environment", is_dir=True)
        elif page := _saved_page_of(entry):
            # "Web page, complete" saves X.html beside X_files/ of scripts, styles and ad
            # frames: 25K tokens of them outweighed a 90-character article.
            self.skip(rel, f"a saved web page's scripts and styles (the page is {page})", is_dir=True)
        else:
            return True
        return False

    def visit_file(self, entry: os.DirEntry[str], rel: str) -> None:
        real = os.path.realpath(entry.path)
        if real in self.seen:
            self.result.already_read += 1
            return
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError as e:
            self.skip(rel, f"unreadable ({e.strerror or e})")
            return
        size = info.st_size
        if (info.st_dev, info.st_ino) == self.own_output:
            # `ktcli ask notes/ "q" > notes/answer.txt`: the first run read it empty, every
            # later one the answer before
            self.skip(rel, OWN_OUTPUT)
            return
        if entry.name in LOCKFILES:  # before binary and size: bun.lockb is binary, a lockfile often 2 MB+
            # Generated pins of every dependency: 96K tokens of a package-lock.json were
            # most of a 20-file repo's input, and no question is about them.
            self.skip(rel, "a lockfile (generated; name the file to read it)")
            return
        if _is_office_lock(entry.name, size):
            # Word's `~$port.docx` beside an open report.docx was warned about as "not a
            # Word document"; LibreOffice's `.~lock.memo.odt#` was read as a document.
            self.skip(rel, "an office program's lock file (its document is open there)")
            return
        # before the size: "too large ... raise the limit" helped no .so
        if (archive := archive_by_name(entry.name, self.display(rel))) is not None:
            # "binary" alone said nothing of what to do: what it is and what to do, as for a file named
            self.skip(rel, archive.reason_and_hint)
            return
        if has_binary_extension(entry.name) and not compressed_text(entry.name):
            self.skip(rel, "binary")
            return
        # A PDF's, a Word file's or a notebook's bytes are mostly pictures and fonts: a 6 MB
        # report of 40 KB of text was skipped as "too large". Their text is what the limit
        # weighs (below), and the file only past PACKED_FACTOR times it.
        # (a report.pdf.gz by the PDF it holds: weighed as its bytes, it was skipped where the PDF was read)
        packed = packs_more_than_text(PurePath(entry.name).stem if compressed_text(entry.name) else entry.name)
        if size > self.max_file_bytes * (PACKED_FACTOR if packed else 1):
            self.skip(rel, _too_large(size, self.max_file_bytes, packed))
            return
        if entry.name.lower().endswith(_MINIFIED):
            self.skip(rel, "minified or a source map (name the file to read it)")
            return
        if _may_hold_secrets(entry.name):
            # A folder's .env went into the prompt, and to a server with --backend openai.
            self.skip(rel, "may hold secrets (name the file to read it)")
            return
        display = self.display(rel)
        try:
            # A PDF stops being read once its text is over the limit (a 700-page one was read
            # to its end, 3.6 s, only to be skipped): its text is what the limit weighs.
            # A compressed file's text is weighed as a file's bytes are (a log rotated as .gz)
            document = document_from_bytes(read_file_bytes(Path(entry.path), display), display, entry.name,
                                           text_limit=self.max_file_bytes if packed else None,
                                           unpacked_limit=(self.max_file_bytes * (PACKED_FACTOR if packed else 1),
                                                           "--max-file-bytes raises the limit, or name the file"))
        except UnpackedOverLimit as e:  # its "; --max-file-bytes raises the limit" was left out
            self.skip(rel, f"too large ({e.compression}-compressed, over {format_size(e.limit)} decompressed; "
                           f"--max-file-bytes raises it, or name the file)")
            return
        except TarArchive as e:  # by its content (a "backup.gz" of a tar)
            self.skip(rel, e.reason_and_hint)
            return
        except RejectedInput as e:
            self.skip(rel, e.reason)
            return
        except TextOverLimit as e:
            if e.page == e.pages:  # read to its end all the same: its whole text's size
                self.skip(rel, _too_large(e.chars, self.max_file_bytes, packed, text=True))
            else:
                self.skip(rel, f"too large (its text over the {format_size(self.max_file_bytes)} limit by page "
                               f"{e.page:,} of {e.pages:,}; --max-file-bytes raises it, or name the file)")
            return
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, NotImplementedError, RecursionError) as e:
            # A reader's own failure on one odd file (a parser's edge case): that file is
            # reported, and the folder's others are still read, instead of a run that ends
            # on an internal error having read none of them.
            self.skip(rel, f"could not be read ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
            return
        if packed and (text_bytes := len(document.text.encode("utf-8", "surrogatepass"))) > self.max_file_bytes:
            self.skip(rel, _too_large(text_bytes, self.max_file_bytes, packed, text=True))
            return
        if _holds_private_key(document.text) and not (document.kind == "code" and _in_tests(rel)):
            # By content: a deploy key, a cloud service account's JSON, saved under any name
            # (a test's fixture key in its code is no secret: the module is read).
            self.skip(rel, "holds a private key (name the file to read it)")
            return
        if (width := _machine_width(document)) is not None:
            what = "minified" if document.language in _MINIFIED_LANGUAGES else "generated"
            self.skip(rel, f"{what} (lines of {width:,} characters on average; name the file to read it)")
            return
        if (share := _data_table_share(document)) is not None:
            self.skip(rel, f"a generated data table ({share:.0%} of its {document.n_lines:,} lines are literals; "
                           "name the file to read it)")
            return
        self.seen.add(real)
        self.result.documents.append(document)


# Package managers' lockfiles, by their exact names (a "yarn.lock" is one; "schedule.lock" may not be).
LOCKFILES = frozenset({
    "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lock", "bun.lockb", "deno.lock",
    "Cargo.lock", "poetry.lock", "Pipfile.lock", "uv.lock", "pdm.lock", "pixi.lock", "conda-lock.yml",
    "composer.lock", "Gemfile.lock", "go.sum", "go.work.sum", "mix.lock", "pubspec.lock", "Podfile.lock",
    "Package.resolved", "packages.lock.json", "paket.lock", "flake.lock", "gradle.lockfile",
    ".terraform.lock.hcl", "cabal.project.freeze", "stack.yaml.lock", "rebar.lock",
})

def _is_office_lock(name: str, size: int) -> bool:
    """Word's and Excel's owner file (`~$` and the document's name, 162 bytes) or
    LibreOffice's lock (`.~lock.NAME#`), written while the document is open."""
    return size <= 4096 and (name.startswith("~$") or (name.startswith(".~lock.") and name.endswith("#")))


# Kinds of file whose bytes say little of their text (pictures, fonts, zipped XML, a
# notebook's plots): judged by their text, and skipped unread only past this many times
# --max-file-bytes (50 MB by default).
PACKED_SUFFIXES = frozenset({".pdf", ".docx", ".docm", ".dotx", ".dotm", ".odt", ".ott", ".epub", ".ipynb",
                             # judged by content too: a .docx renamed .doc is read, a workbook
                             # or an old .doc said as what it is (all were "binary")
                             ".doc", ".xls", ".xlsx", ".xlsm", ".ppt", ".pptx", ".ods", ".odp", ".rtf", ".mhtml", ".mht"})
PACKED_FACTOR = 25


def compressed_text(name: str) -> bool:
    """Whether `name` is a file compressed whole whose own name is no binary's and no tar's
    ("NEWS.md.gz", "syslog.2.gz", "data.csv.xz"; not "site.tar.gz", "logo.png.gz"): read
    by its content (`ingest.compressed`)."""
    path = PurePath(name)
    if path.suffix.lower() not in (".gz", ".bz2", ".xz", ".lzma"):
        return False
    inner = path.stem
    return not has_binary_extension(inner) and PurePath(inner).suffix.lower() != ".tar"


def packs_more_than_text(name: str) -> bool:
    return PurePath(name).suffix.lower() in PACKED_SUFFIXES


def _too_large(size: int, max_file_bytes: int, packed: bool, text: bool = False) -> str:
    """The reason of a file over the limit: its size, or its text's (`text`), against it."""
    limit_bytes = max_file_bytes * (PACKED_FACTOR if packed and not text else 1)
    shown, limit = format_size(size), format_size(limit_bytes)
    if shown == limit:  # "2.0 MB > 2.0 MB": a file a few bytes over says its bytes
        shown, limit = f"{size:,} bytes", f"{limit_bytes:,}"
    what = f"its text {shown}" if text else shown
    of = f" ({PACKED_FACTOR} x the text's) for PDF, office and notebook files" if packed and not text else ""
    return f"too large ({what} > {limit} limit{of}; --max-file-bytes raises it, or name the file)"


_MINIFIED = (".min.js", ".min.css", ".min.mjs", ".js.map", ".css.map")
# Generated code by its shape, whatever its name: a 240 KB bundle.js of one line was
# indexed as 187K tokens of 671 chunks (`bundle.min.js` was skipped by name), and a
# one-line 200 KB longline.py (a data table written by a script) as 297K.
_MINIFIED_LANGUAGES = frozenset({"javascript", "typescript", "css", "json"})
_MINIFIED_MIN_BYTES = 20_000
_MINIFIED_LINE_CHARS = 1_000
# Code only: prose kinds (Markdown, .txt, .rst) are often written a paragraph to a line of
# 500-1,500 characters, and a CSV's rows are its data, so neither is judged by its width.
# LaTeX is code by name but prose by nature, written the same way.
_PROSE_LANGUAGES = frozenset({"latex"})


def _machine_width(document) -> int | None:
    """The average line length of a code file written for machines (a bundle, minified
    CSS, a generated one-line table), else None. No hand-written code averages 1,000
    characters a line over 20 KB."""
    if document.kind != "code" or document.language in _PROSE_LANGUAGES:
        return None
    text = document.text
    if len(text) < _MINIFIED_MIN_BYTES:
        return None
    width = len(text) // max(document.n_lines, 1)  # a one-line file's final newline starts no second line
    return width if width >= _MINIFIED_LINE_CHARS else None


# A code file that is a table of literals, one entry a line: rich's _emoji_codes.py (68K
# tokens, a tenth of a monorepo, 3 of 8 passages for "what does this change break?"),
# pypdf's adobe_glyphs.py (232K), Unicode width tables. A line of literals and punctuation
# only; no hand-written module of 20 KB+ is 90% such lines.
# Matched in steps that each take linear time (one pattern of nested repeats over a line of
# digits took minutes: `0.99998117528260110909f,` backtracked through every split of its
# digits): its strings out, then its keywords, then its comment; what is left is figures
# and punctuation only.
_STRING_LITERAL = re.compile(r"""[rbuf]?"(?:[^"\\]|\\.)*"|[rbuf]?'(?:[^'\\]|\\.)*'""")
_LITERAL_WORD = re.compile(r"\b(?:true|false|True|False|None|null|nil)\b")
_LINE_COMMENT = re.compile(r"(?:#|//).*$")
_FIGURES_AND_PUNCTUATION = re.compile(r"[\d\s.,:;=>()\[\]{}+\-_xXa-fA-F]*")
# Data formats are literals by nature: a JSON or YAML file of 20 KB+ is what its user asks about.
_DATA_LANGUAGES = frozenset({"json", "yaml", "toml", "xml", "ini", "csv"})
_DATA_TABLE_SHARE = 0.9


def _literal_line(line: str) -> bool:
    """Whether a line holds literals and punctuation only (a generated table's entry)."""
    rest = _LINE_COMMENT.sub("", _LITERAL_WORD.sub(" ", _STRING_LITERAL.sub(" ", line)))
    return _FIGURES_AND_PUNCTUATION.fullmatch(rest) is not None


def _data_table_share(document) -> float | None:
    """The share of a 20 KB+ code file's non-blank lines that are literals only, where it
    is a data table's (`_DATA_TABLE_SHARE`), else None."""
    if (document.kind != "code" or document.language in _PROSE_LANGUAGES or document.language in _DATA_LANGUAGES
            or len(document.text) < _MINIFIED_MIN_BYTES):
        return None
    lines = [line for line in document.text.split("\n") if line.strip()]
    if not lines:
        return None
    # (stopped once too many lines are not literals for the share to reach it: a module of
    # hand-written code is told in its first lines, not after a regex pass over every one)
    most = len(lines)  # the literal lines there can still be
    for line in lines:
        if not _literal_line(line):
            most -= 1
            if most / len(lines) < _DATA_TABLE_SHARE:
                return None
    share = most / len(lines)
    return share if share >= _DATA_TABLE_SHARE else None


_SECRET_NAMES = frozenset({".env", ".envrc", ".netrc", ".pgpass", ".pypirc", ".npmrc", ".git-credentials",
                           "credentials", "kubeconfig", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"})
_SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".keystore", ".jks", ".tfvars", ".tfstate")
_EXAMPLE_SUFFIXES = (".example", ".sample", ".template", ".dist")


# A PEM (or PGP) private key's header and the first line of its body: in a file of its
# own, JSON-escaped in a service account's JSON, or in a string literal of code (quotes,
# "+", "\n" between them); armour headers ("Version: GnuPG") may come first. A page that
# only names the header, as a TLS how-to does, is read. And PuTTY's key files.
_PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:\s|\\[nr]|[\"'`+(),])+"
                          r"(?:(?:Proc-Type|DEK-Info|Version|Comment|Hash):[^\n]*\n\s*)*"
                          r"(?:Proc-Type:|[A-Za-z0-9+/]{40,})")
_PUTTY_KEY = re.compile(r"^PuTTY-User-Key-File-\d+:.*^Private-Lines:", re.MULTILINE | re.DOTALL)
# Folders and names of tests (their fixture keys are no secrets).
_TEST_PARTS = frozenset({"test", "tests", "testing", "__tests__", "spec", "specs", "fixtures", "testdata", "test_data"})


def _holds_private_key(text: str) -> bool:
    return ("PRIVATE KEY" in text and _PRIVATE_KEY.search(text) is not None) or (
        text.startswith("PuTTY-User-Key-File-") and _PUTTY_KEY.search(text[:4096]) is not None)


def _in_tests(rel: str) -> bool:
    parts = rel.lower().split("/")
    stem = parts[-1].rsplit(".", 1)[0]
    return bool(_TEST_PARTS.intersection(parts[:-1])) or stem.startswith("test_") or stem.endswith(("_test", ".test",
                                                                                                 "_spec", ".spec"))


def _may_hold_secrets(name: str) -> bool:
    """Environment files, keys and credential stores (not their committed examples)."""
    lower = name.lower()
    if lower.endswith(_EXAMPLE_SUFFIXES):
        return False
    return lower in _SECRET_NAMES or lower.startswith(".env.") or lower.endswith(_SECRET_SUFFIXES)


# The folder a browser saves a page's resources in, by the browser's language ("X_files";
# Firefox's German "X-Dateien", French "X_fichiers"...): read as code, its scripts were
# most of a folder's tokens.
_SAVED_PAGE_FOLDER = re.compile(r"(.+)[_-](?:files|Dateien|fichiers|archivos|arquivos|file|bestanden|filer|pliki|"
                                r"soubory|tiedostot|dosyalar|файлы)$")


def _saved_page_of(entry: os.DirEntry[str]) -> str | None:
    """The page a browser saved beside folder `entry` ("X_files" beside "X.html"), if any."""
    m = _SAVED_PAGE_FOLDER.match(entry.name)
    if m is None:
        return None
    stem = m[1]
    folder = os.path.dirname(entry.path)
    return next((stem + ext for ext in (".html", ".htm", ".xhtml", ".shtml")
                 if os.path.isfile(os.path.join(folder, stem + ext))), None)


def format_size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"
