"""Folder walks: .gitignore (nested), VCS and cache folders, binaries, size limits,
symlinks, display paths, order, and the one-line error when nothing is left."""

from __future__ import annotations

import os
import subprocess
import shutil
from pathlib import Path

import pytest

from tests.ingest.fixtures import PNG_BYTES, make_image_only_pdf, make_text_pdf
from ktcli.errors import InputError
from ktcli.ingest import load_corpus
from ktcli.types import Corpus

REPO = Path(__file__).resolve().parents[2]


def walk(folder: Path, **kwargs: object) -> Corpus:
    return load_corpus([str(folder)], **kwargs)  # type: ignore[arg-type]


def rels(corpus: Corpus, folder: Path) -> list[str]:
    prefix = str(folder).rstrip("/") + "/"
    return [d.path.removeprefix(prefix) for d in corpus.documents]


def reasons(corpus: Corpus, folder: Path) -> dict[str, str]:
    prefix = str(folder).rstrip("/") + "/"
    return {s.path.removeprefix(prefix): s.reason for s in corpus.skipped}


def test_sorted_tree_order_and_display_paths(write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rel in ["b.txt", "a/z.py", "a/b/c.md", "A.txt", "a.txt"]:
        write(f"proj/{rel}", f"content of {rel}\n")
    corpus = walk(tmp_path / "proj")
    assert rels(corpus, tmp_path / "proj") == ["A.txt", "a/b/c.md", "a/z.py", "a.txt", "b.txt"]
    monkeypatch.chdir(tmp_path)
    assert load_corpus(["proj/"]).documents[1].path == "proj/a/b/c.md"
    assert load_corpus(["proj"]).documents[1].path == "proj/a/b/c.md"
    monkeypatch.chdir(tmp_path / "proj")
    assert load_corpus(["."]).documents[1].path == "a/b/c.md"
    assert load_corpus(["./"]).documents[1].path == "a/b/c.md"


def test_nested_gitignore_relative_to_its_folder(write, tmp_path: Path) -> None:
    write("r/.gitignore", "*.log\nbuild/\n/top-only.txt\n")
    write("r/keep.txt", "keep\n")
    write("r/run.log", "log\n")
    write("r/top-only.txt", "ignored at the top\n")
    write("r/build/out.txt", "built\n")
    write("r/sub/top-only.txt", "kept: the / anchors to r/\n")
    write("r/sub/.gitignore", "secret*.md\n!important.log\n")
    write("r/sub/secret-plan.md", "x\n")
    write("r/sub/important.log", "re-included\n")
    write("r/secret-outside.md", "not matched: sub/.gitignore applies to sub/ only\n")
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == [
        ".gitignore", "keep.txt", "secret-outside.md", "sub/.gitignore", "sub/important.log", "sub/top-only.txt",
    ]
    assert reasons(corpus, tmp_path / "r") == {
        "build/": "gitignored", "run.log": "gitignored", "top-only.txt": "gitignored",
        "sub/secret-plan.md": "gitignored",
    }


def test_double_star_at_the_end_matches_inside_the_folder_only(write, tmp_path: Path) -> None:
    # git: `logs/**` is everything inside logs/, not logs/ itself, so `!logs/**/` and a
    # deeper `!` re-include files in it. (Checked against `git ls-files -co
    # --exclude-standard` on 500 random trees of such rules.)
    write("r/.gitignore", "\ufeff*.tmp\nlogs/**\n!logs/**/\n!logs/**/important.log\nnotes/*\n")  # with a BOM
    write("r/x.tmp", "the BOM is not part of the first pattern\n")
    write("r/logs/run.log", "ignored\n")
    write("r/logs/2024/important.log", "re-included\n")
    write("r/logs/2024/other.log", "ignored\n")
    # notes/old is ignored by the shallower `notes/*`: a deeper `!old/**/` re-includes only
    # folders inside it, which git cannot reach.
    write("r/notes/.gitignore", "!old/**/\n")
    write("r/notes/old/a.txt", "ignored\n")
    write("r/notes/old/deeper/b.txt", "ignored\n")
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == [".gitignore", "logs/2024/important.log"]
    assert set(reasons(corpus, tmp_path / "r")) == {"x.tmp", "logs/run.log", "logs/2024/other.log", "notes/.gitignore",
                                                   "notes/old/"}


def test_a_very_deep_tree_is_walked_without_recursion(tmp_path: Path) -> None:
    folder = tmp_path / "deep"
    folder.mkdir()
    os.chdir(folder)  # relative steps: the absolute path would pass PATH_MAX first
    try:
        for _ in range(400):  # three Python frames a level used to exhaust the recursion limit at ~330
            os.mkdir("d")
            os.chdir("d")
        Path("bottom.txt").write_text("The deepest note.\n")
    finally:
        os.chdir(tmp_path)
    corpus = walk(folder)
    assert rels(corpus, folder) == ["d/" * 400 + "bottom.txt"]


def test_an_ignored_file_also_named_is_read_and_not_reported(write, tmp_path: Path) -> None:
    write("r/.gitignore", "*.log\nbuild/\n")
    log = write("r/run.log", "the log the user asked for\n")
    write("r/build/out.txt", "built\n")
    write("r/main.py", "print(1)\n")
    corpus = load_corpus([str(log), str(tmp_path / "r" / "build"), str(tmp_path / "r")])
    assert [Path(d.path).name for d in corpus.documents] == ["run.log", "out.txt", ".gitignore", "main.py"]
    assert corpus.skipped == ()  # both were read: neither is "skipped: gitignored"


def test_control_characters_in_found_names_are_escaped(write, tmp_path: Path) -> None:
    write("r/two\nlines.txt", "a file whose name has a line break\n")
    write("r/.gitignore", "*.log\n")
    write("r/skip\nme.log", "ignored\n")
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == [".gitignore", "two\\nlines.txt"]
    assert reasons(corpus, tmp_path / "r") == {"skip\\nme.log": "gitignored"}


def test_names_with_bidirectional_controls_are_shown_escaped(tmp_path: Path) -> None:
    """"invoice\u202efdp.txt" showed in a terminal as "invoicetxt.pdf", reversed."""
    root = tmp_path / "r"
    root.mkdir()
    (root / "invoice\u202efdp.txt").write_text("pay now\n")
    (root / "café \u2067x\u2069.md").write_text("menu\n")
    (root / "al\u061cma.txt").write_text("arabic letter mark\n")
    (root / "گزارش\u200cها.txt").write_text("a Persian word holds a zero-width non-joiner\n")  # kept as it is
    assert rels(walk(root), root) == ["al\\u061cma.txt", "café \\u2067x\\u2069.md", "invoice\\u202efdp.txt",
                                      "گزارش\u200cها.txt"]


def test_names_that_are_not_utf8_are_shown_escaped(tmp_path: Path) -> None:
    """Python keeps such a name's bytes as lone surrogates, which the tokenizer refused:
    one file named b"caf\\xe9.txt" failed every command on its folder."""
    root = tmp_path / "r"
    root.mkdir()
    (root / os.fsdecode(b"caf\xe9.txt")).write_text("owner: Ada\n")
    corpus = walk(root)
    assert rels(corpus, root) == ["caf\\xe9.txt"]
    assert corpus.documents[0].path.isprintable() and corpus.documents[0].text == "owner: Ada\n"
    direct = load_corpus([str(root / os.fsdecode(b"caf\xe9.txt"))])
    assert direct.documents[0].path == str(root) + "/caf\\xe9.txt"
    # a file really named caf\xe9.txt is another path (its backslash doubled, as `ls -b`)
    (root / "caf\\xe9.txt").write_text("owner: Bo\n")
    assert sorted(rels(walk(root), root)) == ["caf\\\\xe9.txt", "caf\\xe9.txt"]


def test_vcs_and_cache_folders(write, tmp_path: Path) -> None:
    write("r/.git/HEAD", "ref: refs/heads/main\n")
    write("r/.hg/store", "x\n")
    write("r/node_modules/lib/index.js", "module.exports = 1\n")
    write("r/__pycache__/a.cpython-311.pyc", b"\x00\x01")
    write("r/env/pyvenv.cfg", "home = /usr/bin\n")
    write("r/env/lib/site.py", "x = 1\n")
    write("r/main.py", "print(1)\n")
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == ["main.py"]
    assert reasons(corpus, tmp_path / "r") == {
        "__pycache__/": "dependency or cache folder",
        "env/": "virtual environment",
        "node_modules/": "dependency or cache folder",
    }


def test_binary_large_undecodable_and_bad_pdfs_are_listed(write, tmp_path: Path) -> None:
    write("r/logo.png", PNG_BYTES)
    write("r/blob.dat", bytes(range(256)) * 8)
    write("r/big.txt", "x" * 5000)
    write("r/noise.txt", bytes(range(160, 256)) * 8)  # high bytes no encoding reads as text
    write("r/scan.pdf", make_image_only_pdf(1))
    write("r/empty.txt", "")
    write("r/report.pdf", make_text_pdf([["page one"], ["page two"]]))
    write("r/ok.txt", "fine\n")
    corpus = walk(tmp_path / "r", max_file_bytes=4000)
    assert rels(corpus, tmp_path / "r") == ["ok.txt", "report.pdf"]
    got = reasons(corpus, tmp_path / "r")
    assert got["logo.png"] == "binary" and got["blob.dat"] == "binary"
    assert got["big.txt"] == "too large (5.0 KB > 4.0 KB limit; --max-file-bytes raises it, or name the file)"
    nearly = walk(tmp_path / "r", max_file_bytes=4990)  # a few bytes over: "5.0 KB > 5.0 KB" said nothing
    assert reasons(nearly, tmp_path / "r")["big.txt"].startswith("too large (5,000 bytes > 4,990 limit;")
    assert got["noise.txt"].startswith("undecodable")
    assert got["scan.pdf"].startswith("no text layer")
    assert got["empty.txt"] == "empty file"


def test_pdfs_and_office_files_are_weighed_by_their_text(write, tmp_path: Path) -> None:
    """A 6 MB report of 40 KB of text was skipped as "too large": a PDF's bytes are mostly
    pictures and fonts. Its text is held to the limit, the file to 25 times it."""
    write("r/short.pdf", make_text_pdf([["page one"], ["page two"]]))
    write("r/a.txt", "fine\n")
    write("r/long.pdf", make_text_pdf([[f"line {i} of a long report on harbour lamps" for i in range(30)]]))
    size = (tmp_path / "r" / "short.pdf").stat().st_size
    limit = 400
    assert limit < size < limit * 25  # bigger than the limit, its text far smaller
    corpus = walk(tmp_path / "r", max_file_bytes=limit)
    assert rels(corpus, tmp_path / "r") == ["a.txt", "short.pdf"]
    assert reasons(corpus, tmp_path / "r")["long.pdf"].startswith("too large (its text 1.2 KB > 400 B limit;")
    # reading stops at the page its text passes the limit (a 700-page PDF was read to its end)
    many = make_text_pdf([[f"line {i} of page {n} on harbour lamps" for i in range(3)] for n in range(40)])
    write("r/many.pdf", many)
    stopped = reasons(walk(tmp_path / "r", max_file_bytes=limit * 3), tmp_path / "r")["many.pdf"]
    assert stopped.startswith("too large (its text over the 1.2 KB limit by page 1") and "of 40;" in stopped
    (tmp_path / "r" / "many.pdf").unlink()
    tiny = reasons(walk(tmp_path / "r", max_file_bytes=size // 30), tmp_path / "r")["short.pdf"]
    assert "limit (25 x the text's) for PDF, office and notebook files; --max-file-bytes raises it" in tiny


def test_symlinks_outside_inside_broken_and_loops(write, tmp_path: Path) -> None:
    write("outside/secret.txt", "must not leak\n")
    write("r/real/a.txt", "inside\n")
    root = tmp_path / "r"
    (root / "leak.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (root / "leakdir").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "alias.txt").symlink_to(root / "real" / "a.txt")
    (root / "real" / "loop").symlink_to(root, target_is_directory=True)
    (root / "dangling").symlink_to(tmp_path / "missing")
    corpus = walk(root)
    assert rels(corpus, root) == ["real/a.txt"]
    assert "must not leak" not in "".join(d.text for d in corpus.documents)
    got = reasons(corpus, root)
    assert got["leak.txt"].startswith("symlink outside")
    assert got["leakdir"].startswith("symlink outside")
    assert got["alias.txt"].startswith("symlink inside")
    assert got["real/loop"].startswith("symlink inside")
    assert got["dangling"] == "broken symlink"


def test_folder_given_as_symlink_is_walked(write, tmp_path: Path) -> None:
    write("real/a.txt", "x\n")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    corpus = walk(tmp_path / "link")
    assert [d.path for d in corpus.documents] == [f"{tmp_path}/link/a.txt"]


def test_nothing_left_is_one_clear_line(write, tmp_path: Path) -> None:
    write("r/.gitignore", "*.log\n")  # .gitignore itself is text: ignore it too
    write("r/.gitignore", "*.log\n.gitignore\n")
    write("r/a.log", "x\n")
    write("r/b.log", "x\n")
    write("r/pic.png", PNG_BYTES)
    with pytest.raises(InputError) as info:
        walk(tmp_path / "r")
    message = str(info.value)
    assert "\n" not in message
    assert "nothing left to read" in message and "4 entries were skipped" in message
    assert "3 gitignored" in message and "1 binary" in message


def test_nothing_left_counts_in_plurals(write, tmp_path: Path) -> None:
    """It said "2 symlink inside the folder"."""
    write("r/sub/.gitignore", "*\n")  # the targets, left out themselves
    write("r/sub/a.txt", "x\n")
    for name in ("one", "two"):
        (tmp_path / "r" / name).symlink_to(tmp_path / "r" / "sub" / "a.txt")
    with pytest.raises(InputError) as info:
        walk(tmp_path / "r")
    assert "2 symlinks inside the folder" in str(info.value)
    assert "2 gitignored" in str(info.value)  # an adjective, as it was


def test_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no files"):
        walk(tmp_path / "empty")


def test_unreadable_subfolder_is_listed(write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write("r/ok.txt", "x\n")
    write("r/locked/a.txt", "x\n")
    real_scandir = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr("ktcli.ingest.walk.os.scandir", scandir)
    corpus = walk(tmp_path / "r")
    assert reasons(corpus, tmp_path / "r") == {"locked/": "unreadable folder (permission denied)"}


def test_ancestor_gitignore_applies_inside_a_repo(write, tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    write("repo/.gitignore", "*.tmp\n")
    write("repo/src/a.py", "x = 1\n")
    write("repo/src/scratch.tmp", "junk\n")
    corpus = walk(tmp_path / "repo" / "src")
    assert rels(corpus, tmp_path / "repo" / "src") == ["a.py"]
    assert reasons(corpus, tmp_path / "repo" / "src") == {"scratch.tmp": "gitignored"}


def test_folder_ignored_by_its_ancestors_is_still_read_when_named(write, tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    write("repo/.gitignore", "build/\n")
    write("repo/build/out.txt", "asked for explicitly\n")
    result = walk(tmp_path / "repo" / "build")
    assert rels(result, tmp_path / "repo" / "build") == ["out.txt"]
    # and said: a repository's build/ named was read with nothing on stderr (probe 101)
    assert [(s.path, s.replaced) for s in result.skipped] == [(f"{tmp_path}/repo/build/", True)]
    assert "git ignore rules" in result.skipped[0].reason


def test_several_paths_and_duplicates(write, tmp_path: Path) -> None:
    write("r/a.txt", "a\n")
    write("r/b.txt", "b\n")
    corpus = load_corpus([str(tmp_path / "r" / "b.txt"), str(tmp_path / "r")])
    assert [Path(d.path).name for d in corpus.documents] == ["b.txt", "a.txt"]


def test_deterministic(write, tmp_path: Path) -> None:
    for i in range(30):
        write(f"r/d{i % 4}/f{i}.txt", f"file {i}\n")
    first, second = walk(tmp_path / "r"), walk(tmp_path / "r")
    assert first == second


def test_minirepo_sample(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A copy outside ktcli's own checkout, which tracks the ignored files (force-added so
    # that they exist in a clone): git's rules do not apply to tracked files.
    shutil.copytree(REPO / "sample_docs" / "minirepo", tmp_path / "sample_docs" / "minirepo")
    monkeypatch.chdir(tmp_path)
    corpus = load_corpus(["sample_docs/minirepo/"])
    paths = [d.path for d in corpus.documents]
    assert "sample_docs/minirepo/src/shelf/search.py" in paths
    assert paths == sorted(paths, key=lambda p: p.split("/"))
    skipped = {s.path: s.reason for s in corpus.skipped}
    assert skipped == {
        "sample_docs/minirepo/assets/logo.png": "binary",
        "sample_docs/minirepo/build.log": "gitignored",
        "sample_docs/minirepo/docs/notes/draft-ideas.md": "gitignored",
    }
    release = next(d for d in corpus.documents if d.path.endswith("scripts/release"))
    assert (release.kind, release.language) == ("code", "shell")
    for doc in corpus.documents:
        assert Path(doc.path).is_file()  # a citation opens from the working directory


def test_minirepo_ignored_files_are_committed() -> None:
    """The fixture only works if git has the ignored files (they were force-added)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "sample_docs/minirepo/build.log", "sample_docs/minirepo/docs/notes/draft-ideas.md"],
        cwd=REPO, capture_output=True, text=True, check=False,
    ).stdout.split()
    assert len(out) == 2


def test_a_folder_given_twice_or_inside_another_is_read_once(write, tmp_path: Path) -> None:
    write("tree/a/x.txt", "inner")
    write("tree/y.txt", "outer")
    write("tree/.gitignore", "ign.txt\n")
    write("tree/ign.txt", "ignored")
    tree, inner = str(tmp_path / "tree"), str(tmp_path / "tree" / "a")
    for paths in ([tree, tree], [tree, inner], [inner, tree], [tree, tree + "/"], [tree, tree + "/./a/.."]):
        corpus = load_corpus(paths)
        assert sorted(Path(d.path).name for d in corpus.documents) == [".gitignore", "x.txt", "y.txt"], paths
        assert [s.reason for s in corpus.skipped] == ["gitignored"], paths


def test_a_folder_spelled_two_ways_from_the_working_folder_reports_its_skips_once(write, tmp_path, monkeypatch) -> None:
    write("tree/.gitignore", "ign.txt\n")
    write("tree/ign.txt", "ignored")
    monkeypatch.chdir(tmp_path)
    corpus = load_corpus(["./tree", "tree/"])
    assert [(s.path, s.reason) for s in corpus.skipped] == [("tree/ign.txt", "gitignored")]


def test_a_file_is_shown_and_prompted_the_same_however_spelled(write, tmp_path, monkeypatch) -> None:
    """The path goes into the prompt: "./notes.md" and "notes.md" were two prompts, two
    prefills and two entries of the prompt cache."""
    write("docs/notes.md", "# Notes\n")
    monkeypatch.chdir(tmp_path)
    for spelled in ("./docs/notes.md", "docs//notes.md", "docs/./notes.md"):
        assert load_corpus([spelled]).documents[0].path == "docs/notes.md"
    assert load_corpus(["./docs/"]).documents[0].path == "docs/notes.md"


def test_a_folder_that_cannot_be_looked_into_is_reported_not_an_internal_error(write, tmp_path, monkeypatch) -> None:
    """Looking for an enclosing .git raised EACCES in a folder without read and execute
    rights (`chmod 000`): "internal error: PermissionError". Root reads everything, so the
    denial is simulated."""
    write("locked/a.txt", "x\n")
    real_exists = Path.exists

    def exists(self, *args, **kwargs):
        if self.name == ".git" and self.parent.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    assert load_corpus([str(tmp_path / "locked")]).documents[0].text == "x\n"
    monkeypatch.setattr(Path, "is_dir", lambda self: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(InputError, match="unreadable"):
        load_corpus([str(tmp_path / "locked" / "a.txt")])


def test_a_readers_own_failure_on_one_file_skips_that_file_only(tmp_path, monkeypatch) -> None:
    """One file a parser trips over (its edge case, not the user's error) is reported;
    the folder's other files are read."""
    from ktcli.ingest import loaders

    (tmp_path / "odd.md").write_text("# odd\n")
    (tmp_path / "fine.txt").write_text("a readable note\n")
    real = loaders._typed_document

    def trips(text, display, name, kind, is_stdin, path=None):
        if name == "odd.md":
            raise IndexError("list index out of range")
        return real(text, display, name, kind, is_stdin, path)

    monkeypatch.setattr(loaders, "_typed_document", trips)
    corpus = load_corpus([str(tmp_path)])
    assert [Path(d.path).name for d in corpus.documents] == ["fine.txt"]
    (skipped,) = corpus.skipped
    assert skipped.path.endswith("odd.md") and "could not be read (IndexError: list index out of range)" in skipped.reason


def test_a_saved_web_pages_assets_and_minified_files_are_reported_not_read(tmp_path) -> None:
    (tmp_path / "Article.html").write_text("<html><body><p>The article itself.</p></body></html>")
    assets = tmp_path / "Article_files"
    assets.mkdir()
    (assets / "app.js").write_text("var x = 1;\n" * 100)
    (tmp_path / "notes_files").mkdir()  # no notes.html beside it: an ordinary folder
    (tmp_path / "notes_files" / "a.txt").write_text("kept\n")
    (tmp_path / "lib.min.js").write_text("!function(){var a=1}();\n")
    corpus = load_corpus([str(tmp_path)])
    assert sorted(Path(d.path).name for d in corpus.documents) == ["Article.html", "a.txt"]
    reasons = {Path(s.path).name: s.reason for s in corpus.skipped}
    assert "saved web page" in reasons["Article_files"] and "Article.html" in reasons["Article_files"]
    assert "minified" in reasons["lib.min.js"]
    assert load_corpus([str(tmp_path / "lib.min.js")]).documents  # named: read
    # a browser in another language names the folder its way (Firefox in German)
    (tmp_path / "Other.html").write_text("<html><body><p>Another page.</p></body></html>")
    (tmp_path / "Other-Dateien").mkdir()
    (tmp_path / "Other-Dateien" / "app.js").write_text("var y = 2;\n" * 100)
    reasons = {Path(s.path).name: s.reason for s in load_corpus([str(tmp_path)]).skipped}
    assert "saved web page" in reasons["Other-Dateien"]


def test_a_loop_of_links_is_reported_as_one(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("text\n")
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    reasons = {Path(s.path).name: s.reason for s in load_corpus([str(tmp_path)]).skipped}
    loop = "symlink loop (links that point at each other)"  # not "broken symlink": no target is missing
    assert reasons == {"loop1": loop, "loop2": loop}
    (tmp_path / "loop1").unlink()
    (tmp_path / "loop2").unlink()
    os.symlink(tmp_path / "a.txt" / "inside", tmp_path / "through")  # through a file: no such target
    assert {Path(s.path).name: s.reason for s in load_corpus([str(tmp_path)]).skipped} == {"through": "broken symlink"}


def test_files_that_may_hold_secrets_are_reported_not_read(tmp_path) -> None:
    for name in (".env", ".env.local", "server.pem", "id_ed25519"):
        (tmp_path / name).write_text("api_key = abc123\n")
    (tmp_path / ".env.example").write_text("api_key = <yours>\n")
    (tmp_path / "app.py").write_text("print(1)\n")
    corpus = load_corpus([str(tmp_path)])
    assert sorted(Path(d.path).name for d in corpus.documents) == [".env.example", "app.py"]
    assert sorted(Path(s.path).name for s in corpus.skipped if "secrets" in s.reason) == [
        ".env", ".env.local", "id_ed25519", "server.pem"]
    assert load_corpus([str(tmp_path / ".env")]).documents  # named: read


def test_a_private_key_under_any_name_is_reported_not_read(tmp_path) -> None:
    """A deploy key and a service account's JSON were read (and sent to a server with
    --backend openai): only their names were judged."""
    import json

    body = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
    key = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n{body}\n-----END RSA PRIVATE KEY-----\n"
    (tmp_path / "deploy_key").write_text(key)
    (tmp_path / "service-account.json").write_text(json.dumps({"type": "service_account", "private_key": key}))
    (tmp_path / "tls.md").write_text("A key file starts with -----BEGIN PRIVATE KEY----- and ends with its END line.\n")
    corpus = load_corpus([str(tmp_path)])
    assert [Path(d.path).name for d in corpus.documents] == ["tls.md"]
    assert {Path(s.path).name: s.reason for s in corpus.skipped} == {
        "deploy_key": "holds a private key (name the file to read it)",
        "service-account.json": "holds a private key (name the file to read it)"}
    assert load_corpus([str(tmp_path / "deploy_key")]).documents  # named: read
    # a PGP key with armour headers, a key split over string literals, PuTTY's; a test's
    # fixture key in its code is read (found by review: a whole test module was dropped)
    (tmp_path / "secring.asc").write_text(f"-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\n{body}\n")
    (tmp_path / "split.py").write_text(f'KEY = ("-----BEGIN RSA PRIVATE KEY-----\\n"\n       "{body}\\n")\n')
    (tmp_path / "deploy.ppk").write_text("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPublic-Lines: 1\n"
                                         "AAAA\nPrivate-Lines: 1\nAAAA\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_jwt.py").write_text(f'KEY = """-----BEGIN RSA PRIVATE KEY-----\n{body}\n"""\n')
    corpus = load_corpus([str(tmp_path)])
    assert sorted(Path(d.path).name for d in corpus.documents) == ["test_jwt.py", "tls.md"]
    assert {Path(s.path).name for s in corpus.skipped} == {"deploy_key", "service-account.json", "secring.asc",
                                                           "split.py", "deploy.ppk"}


@pytest.mark.parametrize("rules,kept", [
    ("*\n!*/\n!*.py\n", ["a.py", "src/c.py", "src/deep/e.py"]),  # a whitelist: every folder, .py files
    ("*\n!src/\n!*.py\n", ["a.py", "src/c.py"]),  # src/ re-included, src/deep/ not (`*` matches it)
])
def test_a_whitelist_gitignore_keeps_what_git_keeps(write, tmp_path: Path, rules, kept) -> None:
    """pathspec's GitIgnoreSpec let `*` beat `!src/` for src/ itself: whole source trees
    were skipped as "gitignored" where git keeps them."""
    write("r/.gitignore", rules)
    for name in ("a.py", "b.txt", "src/c.py", "src/d.md", "src/deep/e.py", "other/f.json"):
        write(f"r/{name}", f"text of {name}\n")
    (tmp_path / "r" / ".git").mkdir()
    assert [r for r in rels(walk(tmp_path / "r"), tmp_path / "r") if r != ".gitignore"] == kept


_NAMES = ["a", "b", "src", "logs", "deep", "x.py", "y.md", "keep", "#x", "ab", "1", "]", "d", "z.txt", "foo", "c5", "B"]
_RULES = ["*", "!*/", "!*.py", "src/", "!src/", "/a", "a/**", "!a/**/", "**/b", "*.md", "!x.py", "logs/*",
          "!logs/keep", "a/**/y.md", "[ab]", "?.py", "\\#x", "deep/", "!deep/", "/src/*", "!/src/keep", "**/deep/**",
          "*/", "!*", "b/", "a*", "!a*/", "x.py/", "**", "src/**/x.py", "!src/**/",
          # bracket expressions, repeated **, empty names: a review found each disagreeing with git
          "[]a]", "[!]a]", "[[:digit:]]", "[\\d]", "**/**", "**/**/z.txt", "foo//", "//foo", "[a-c]*", "[!a-c]",
          "c[0-9]", "[[:upper:]]", "!**/**/"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to compare with")
def test_random_trees_and_rules_keep_exactly_what_git_keeps(tmp_path: Path) -> None:
    """`git ls-files -co --exclude-standard` is the oracle (1,000 trees checked once by
    hand with this generator; 60 here)."""
    import random

    rng = random.Random(7)
    for i in range(60):
        root = tmp_path / f"t{i}"
        root.mkdir()
        made = []
        for f in sorted({"/".join(rng.choice(_NAMES) for _ in range(rng.randint(1, 4))) for _ in range(10)}):
            try:
                (root / f).parent.mkdir(parents=True, exist_ok=True)
                if not (root / f).exists():
                    (root / f).write_text(f"text of {f}\n")
                    made.append(f)
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                continue  # a name taken by a folder, or a folder by a file
        folders = sorted({str(Path(f).parent) for f in made} - {"."}) + [""]
        for d in rng.sample(folders, k=min(len(folders), 2)):
            (root / d / ".gitignore").write_text("\n".join(rng.sample(_RULES, rng.randint(1, 4))) + "\n")
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard"], capture_output=True,
                                text=True, check=True).stdout.split("\n")
        want = sorted(p.strip('"') for p in listed if p and not p.endswith(".gitignore"))
        try:
            got = sorted(r for r in rels(walk(root), root) if not r.endswith(".gitignore"))
        except InputError:  # every entry ignored: nothing left to read
            got = []
        assert got == want, [p.read_text() for p in root.rglob(".gitignore")]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_files_git_tracks_are_read_whatever_the_ignore_rules(write, tmp_path: Path) -> None:
    """Ignore rules do not apply to tracked files: a committed build/generated.py was
    skipped as "gitignored". Untracked files beside it in the ignored folder stay out."""
    write("r/.gitignore", "build/\n/src/shipping.go\n")
    for name in ("build/generated.py", "build/other.py", "build/sub/x.py", "src/shipping.go", "src/main.go"):
        write(f"r/{name}", f"text of {name}\n")
    git = ["git", "-C", str(tmp_path / "r")]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-f", ".gitignore", "build/generated.py", "src/shipping.go", "src/main.go"], check=True)
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == [".gitignore", "build/generated.py", "src/main.go", "src/shipping.go"]
    assert reasons(corpus, tmp_path / "r") == {"build/other.py": "gitignored", "build/sub/": "gitignored"}


def test_a_bundle_is_known_by_its_shape_whatever_its_name(write, tmp_path: Path) -> None:
    """A 240 KB bundle.js of one line was indexed as 187K tokens (bundle.min.js was skipped
    by its name); a named one is still read."""
    write("r/bundle.js", "var a=function(b){return b+1};" * 2000)
    write("r/app.js", "function add(a, b) {\n  return a + b;\n}\n" * 600)  # as long, in lines
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == ["app.js"]
    assert reasons(corpus, tmp_path / "r")["bundle.js"].startswith("minified (lines of 60,000 characters")
    assert [d.path for d in load_corpus([str(tmp_path / "r" / "bundle.js")]).documents]


def test_a_large_binary_is_reported_as_binary_not_as_too_large(write, tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "lib.so").write_bytes(b"\x7fELF" + bytes(3_000_000))
    write("r/a.txt", "text\n")
    assert reasons(walk(tmp_path / "r"), tmp_path / "r") == {"lib.so": "binary"}


def test_lockfiles_are_reported_not_read_unless_named(write, tmp_path: Path) -> None:
    """A package-lock.json was 96K tokens of a 20-file repo's 1.4M; no question is about it."""
    for name in ("package-lock.json", "yarn.lock", "Cargo.lock", "poetry.lock", "go.sum", "sub/uv.lock"):
        write(f"r/{name}", '{"lockfileVersion": 3, "packages": {"a": {"version": "1.0.0"}}}\n')
    (tmp_path / "r" / "bun.lockb").write_bytes(b"#!/usr/bin/env bun\n\x00\x01\x02" * 100)
    write("r/app.py", "TAX_RATE = 0.2\n")
    write("r/notes.lock.md", "not a lockfile\n")
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == ["app.py", "notes.lock.md"]
    assert set(reasons(corpus, tmp_path / "r").values()) == {"a lockfile (generated; name the file to read it)"}
    assert len(corpus.skipped) == 7
    assert load_corpus([str(tmp_path / "r" / "package-lock.json")]).documents  # named: read


def test_generated_code_of_any_language_is_known_by_its_shape_but_prose_is_not(write, tmp_path: Path) -> None:
    """A one-line 200 KB longline.py (a table a script wrote) was 297K tokens of a 20-file
    repo. Prose written a paragraph to a line, as long on average, is what a user asks about."""
    write("r/longline.py", "TABLE = [" + ", ".join(str(i * 7) for i in range(40_000)) + "]\n")
    write("r/app.py", "def tax(amount):\n    return amount * 0.2\n" * 600)
    paragraph = ("The committee met again to weigh the proposal, and after long discussion of its costs, "
                 "its risks and the views of those it would affect, it agreed to revisit the matter. ") * 8
    write("r/notes.md", "\n".join(f"{paragraph}({i})" for i in range(40)))  # ~1,400 characters a line
    write("r/transcript.txt", paragraph * 150)  # one line of ~200 KB
    write("r/paper.tex", "\\section{Results}\n" + "\n".join(paragraph for _ in range(40)))
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == ["app.py", "notes.md", "paper.tex", "transcript.txt"]
    assert reasons(corpus, tmp_path / "r") == {
        "longline.py": "generated (lines of 304,134 characters on average; name the file to read it)"}
    assert load_corpus([str(tmp_path / "r" / "longline.py")]).documents  # named: read


def test_a_generated_data_table_is_reported_not_read(write, tmp_path: Path) -> None:
    """rich's _emoji_codes.py, 68K tokens of one entry a line, was a tenth of a monorepo and
    3 of the 8 passages read for a question about a diff."""
    write("r/_emoji_codes.py", "EMOJI = {\n" + "".join(f'    "emoji_{i}": "\\u{i:04x}",\n' for i in range(1500)) + "}\n")
    write("r/widths.py", "TABLE = [\n" + "".join(f"    ({i}, {i + 5}, -1),  # block {i}\n" for i in range(1200)) + "]\n")
    # a module of many short lines of code is no table, however regular
    write("r/app.py", "".join(f"def tax_{i}(amount):\n    return amount * 0.{i % 9 + 1}\n\n" for i in range(900)))
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == ["app.py"]
    assert reasons(corpus, tmp_path / "r") == {
        "_emoji_codes.py": "a generated data table (100% of its 1,502 lines are literals; name the file to read it)",
        "widths.py": "a generated data table (100% of its 1,202 lines are literals; name the file to read it)"}
    assert load_corpus([str(tmp_path / "r" / "widths.py")]).documents  # named: read
    # data formats are literals by nature: a 20 KB+ OpenAPI spec is read
    write("s/openapi.json", "{\n" + "".join(f'  "path_{i}": {{"rate": {i}}},\n' for i in range(1200)) + '  "end": 0\n}\n')
    assert rels(walk(tmp_path / "s"), tmp_path / "s") == ["openapi.json"]


def test_a_data_tables_share_is_counted_whole_wherever_its_code_lines_stand(write, tmp_path: Path) -> None:
    """The share said is that of every line, and a file with too many code lines is read,
    whether they come first (the count stops early there) or last."""
    rows = [f"    ({i}, {i + 5}, -1),\n" for i in range(1200)]
    code = [f"    total_{i} = amount * rate_{i}\n" for i in range(160)]
    write("t/app.py", "".join(code))
    write("t/first.py", "".join(code[:60] + rows))  # 1,200 of 1,260: 95%
    write("t/last.py", "".join(rows + code[:60]))
    write("u/first.py", "".join(code + rows))  # 1,200 of 1,360: 88%, under the 90% of a table
    write("u/last.py", "".join(rows + code))
    assert reasons(walk(tmp_path / "t"), tmp_path / "t") == {
        name: "a generated data table (95% of its 1,260 lines are literals; name the file to read it)"
        for name in ("first.py", "last.py")}
    assert rels(walk(tmp_path / "u"), tmp_path / "u") == ["first.py", "last.py"]


def test_a_line_of_digits_is_judged_in_linear_time() -> None:
    """A C table's `0.99998117528260110909f,` took 1.5 s a line, one of 24 digits 18 s:
    a folder walk hung on it."""
    import time

    from ktcli.ingest.walk import _literal_line

    started = time.perf_counter()
    assert not _literal_line("    " + "7" * 400 + " ident,")
    assert _literal_line("    0.99998117528260110909f,") and not _literal_line("    return amount * 0.2")
    assert time.perf_counter() - started < 0.1


def test_exclude_leaves_out_what_its_patterns_match_but_never_a_file_named(write, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A 984K-token tests/fixtures/big_orders.csv was most of a 20-file repo's input."""
    for name in ("src/tax.py", "tests/test_tax.py", "tests/fixtures/big_orders.csv", "tests/fixtures/deep/x.json",
                 "data/rates.csv", "data/keep.csv", "build/out.py"):
        write(f"poly/{name}", f"text of {name}\n")
    root = tmp_path / "poly"
    corpus = load_corpus([str(root)], exclude=("tests/fixtures/**", "*.csv", "!keep.csv", "build/"))
    assert rels(corpus, root) == ["data/keep.csv", "src/tax.py", "tests/test_tax.py"]
    assert reasons(corpus, root) == {"build/": "excluded by --exclude", "data/rates.csv": "excluded by --exclude",
                                     "tests/fixtures/big_orders.csv": "excluded by --exclude",
                                     "tests/fixtures/deep/": "excluded by --exclude"}
    # a path as the report shows it works too; a file named is read whatever --exclude says
    monkeypatch.chdir(tmp_path)
    corpus = load_corpus(["poly", "poly/data/rates.csv"], exclude=("poly/data/*.csv",))
    assert [d.path for d in corpus.documents] == [
        "poly/build/out.py", "poly/src/tax.py", "poly/tests/fixtures/big_orders.csv",
        "poly/tests/fixtures/deep/x.json", "poly/tests/test_tax.py", "poly/data/rates.csv"]
    assert [s.path for s in corpus.skipped] == ["poly/data/keep.csv"]  # rates.csv: read, so not reported
    # an anchored negation re-includes, in either spelling (the shown path, which it did not
    # match, excluded the file all the same)
    for keep in ("!data/rates.csv", "!poly/data/rates.csv"):
        corpus = load_corpus(["poly"], exclude=("*.csv", keep))
        assert [d.path for d in corpus.documents if d.path.endswith(".csv")] == ["poly/data/rates.csv"], keep


def test_exclude_that_leaves_nothing_or_matches_nothing_is_said_in_one_line(write, tmp_path: Path) -> None:
    from ktcli.errors import UsageError

    write("r/a.csv", "x\n")
    with pytest.raises(InputError, match=r"nothing left to read; the entry was skipped \(1 excluded by --exclude\)"):
        load_corpus([str(tmp_path / "r")], exclude=("*.csv",))
    with pytest.raises(UsageError, match=r"--exclude 'a//b': matches nothing"):
        load_corpus([str(tmp_path / "r")], exclude=("a//b",))


def test_exclude_of_a_dot_slash_path_means_the_folder_givens_own(write, tmp_path: Path) -> None:
    """`--exclude ./server.py` left out nothing (git matches nothing with "./")."""
    for name in ("server.py", "guide.md", "sub/server.py"):
        write(f"m/{name}", f"text of {name}\n")
    root = tmp_path / "m"
    assert rels(load_corpus([str(root)], exclude=("./server.py",)), root) == ["guide.md", "sub/server.py"]
    assert rels(load_corpus([str(root)], exclude=("*.py", "!./sub/server.py")), root) == ["guide.md", "sub/server.py"]


def test_a_folder_of_binaries_is_said_as_such_once(write, tmp_path: Path) -> None:
    """"(1 binary, 1 binary: an executable)" was said of an executable and a data file."""
    write("b/tool", b"\x7fELF\x02\x01\x01" + bytes(200))
    write("b/data.bin", bytes(range(256)) * 4)
    with pytest.raises(InputError, match=r"all 2 entries were skipped \(2 binary\)$"):
        load_corpus([str(tmp_path / "b")])


def test_counts_of_entries_are_plural_where_the_noun_is_the_entries_own():
    from ktcli.ingest.corpus import _counted

    assert _counted(2, "symlink inside the folder") == "2 symlinks inside the folder"
    assert _counted(3, "a lockfile") == "3 lockfiles"
    assert _counted(2, "not a regular file") == "2 not a regular file"  # was "2 not a regular files"
    assert _counted(1, "unreadable folder") == "1 unreadable folder"


def test_office_lock_files_are_said_as_such(write, tmp_path: Path) -> None:
    """Word's owner file beside an open report was warned about as "not a Word document";
    LibreOffice's lock was read as a document of its own."""
    write("r/report.txt", "The lamp burns all night.\n")
    write("r/~$port.docx", b"\x05alice" + bytes(48) + "alice".encode("utf-16-le"))
    write("r/.~lock.memo.odt#", "Alice,host,alice,05.12.2026 16:00,file:///home/alice/.config/libreoffice/4;\n")
    corpus = walk(tmp_path / "r", max_file_bytes=2_000_000)
    assert rels(corpus, tmp_path / "r") == ["report.txt"]
    assert set(reasons(corpus, tmp_path / "r").values()) == {"an office program's lock file (its document is open there)"}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_users_own_git_excludes_apply_as_in_git(write, tmp_path: Path, monkeypatch) -> None:
    """`git status` left out a `*.glob` of core.excludesFile, and ktcli read it."""
    write("r/a.py", "print(1)\n")
    write("r/g.glob", "generated\n")
    write("r/n.note", "a note\n")
    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True)
    write("xdg/git/ignore", "*.note\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(write("gitconfig", "")))
    assert rels(walk(tmp_path / "r"), tmp_path / "r") == ["a.py", "g.glob"]  # the default place
    write("gitconfig", f"[core]\n\texcludesFile = {tmp_path / 'mine.ignore'}\n")
    write("mine.ignore", "*.glob\n")
    corpus = walk(tmp_path / "r")
    assert rels(corpus, tmp_path / "r") == ["a.py", "n.note"]
    assert reasons(corpus, tmp_path / "r") == {"g.glob": "gitignored"}
    listed = subprocess.run(["git", "-C", str(tmp_path / "r"), "ls-files", "-co", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(listed) == ["a.py", "n.note"]  # as git has it
    write("gitconfig", "[core]\n\texcludesFile =\n")  # set to nothing: none, not the default place (review)
    assert rels(walk(tmp_path / "r"), tmp_path / "r") == ["a.py", "g.glob", "n.note"]


def test_a_file_that_standard_output_is_written_to_is_not_read(tmp_path: Path) -> None:
    """`ktcli ask notes/ "q" > notes/answer.txt` read its own answer file: empty the first
    time, the answer before on every later run."""
    import subprocess
    import sys

    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.txt").write_text("owner: Ada\n")
    script = ("import sys; from ktcli.ingest.walk import walk_folder\n"
              "r = walk_folder(sys.argv[1], max_file_bytes=10**6)\n"
              "print([d.path for d in r.documents], [(s.path, s.reason) for s in r.skipped], file=sys.stderr)")
    with open(root / "answer.txt", "w") as out:
        done = subprocess.run([sys.executable, "-c", script, str(root)], stdout=out, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a.txt" in done.stderr and "this run's own output (standard output is written to it)" in done.stderr
    # named, as a glob names it: left out too (the shell has emptied it: "empty file" ended the run)
    script = ("import sys; from ktcli.ingest import load_corpus\n"
              "c = load_corpus(sys.argv[1:])\n"
              "print([d.path for d in c.documents], [(s.path, s.reason) for s in c.skipped], file=sys.stderr)\n"
              "try:\n    load_corpus(sys.argv[2:])\nexcept Exception as e:\n    print('alone:', e, file=sys.stderr)")
    with open(root / "answer.txt", "w") as out:
        done = subprocess.run([sys.executable, "-c", script, str(root / "a.txt"), str(root / "answer.txt")], stdout=out,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "this run's own output" in done.stderr.splitlines()[0] and "a.txt" in done.stderr.splitlines()[0]
    assert "alone:" in done.stderr and "nothing else to read" in done.stderr
    # appended to (>>), it holds what it held: read as any file (found by review)
    (root / "answer.txt").write_text("The answer of an earlier run.\n")
    with open(root / "answer.txt", "a") as out:
        done = subprocess.run([sys.executable, "-c", script, str(root / "a.txt"), str(root / "answer.txt")], stdout=out,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert "own output" not in done.stderr and "answer.txt" in done.stderr.splitlines()[0]


def test_a_document_saved_twice_is_read_once_and_said(tmp_path: Path) -> None:
    """A report in two folders took two of the passages retrieved, and a whole read twice."""
    text = "".join(f"Line {i} of the annual report: revenue grew in quarter {i % 4 + 1}.\n" for i in range(20))
    for folder in ("inbox", "reports/2023"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "annual-report.txt").write_text(text)
        (tmp_path / folder / "__init__.py").write_text("")  # short ones repeat by nature: not said
        (tmp_path / folder / "version.txt").write_text("1.0\n")
    corpus = load_corpus([str(tmp_path)])
    assert rels(corpus, tmp_path) == ["inbox/annual-report.txt", "inbox/version.txt", "reports/2023/version.txt"]
    assert reasons(corpus, tmp_path)["reports/2023/annual-report.txt"] == \
        f"the same text as {tmp_path}/inbox/annual-report.txt: read once"


def test_a_folder_left_empty_by_the_size_limit_says_how_to_read_it(tmp_path):
    from ktcli.ingest.corpus import load_corpus

    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "huge.py").write_text("x = 1\n" * 1000)
    with pytest.raises(InputError, match=r"\(1 too large\); --max-file-bytes raises the limit, or name the file"):
        load_corpus([str(tmp_path / "big")], max_file_bytes=100)


def test_a_tar_archive_in_a_folder_is_named_with_the_command_that_unpacks_it(tmp_path: Path) -> None:
    """A .tar.gz, .tgz or .tar in a folder was skipped as "binary", with no hint; by its name
    (unread), or by its content where the name does not say (a "backup.gz" of a tar)."""
    import gzip
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("a.txt")
        member.size = 3
        archive.addfile(member, io.BytesIO(b"hi\n"))
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "notes.txt").write_text("a note\n")
    for name in ("site.tar.gz", "site.tgz", "backup.gz", "logs.tar.bz2"):
        (folder / name).write_bytes(gzip.compress(buffer.getvalue()))
    (folder / "plain.tar").write_bytes(buffer.getvalue())
    skipped = {s.path.rsplit("/", 1)[-1]: s.reason for s in load_corpus([str(folder)]).skipped}
    unpack = "(unpack it and give the folder: `mkdir unpacked && tar xf {} -C unpacked`)"
    assert skipped["site.tar.gz"] == f"binary: a gzip-compressed tar archive {unpack.format(folder / 'site.tar.gz')}"
    assert skipped["site.tgz"] == f"binary: a gzip-compressed tar archive {unpack.format(folder / 'site.tgz')}"
    assert skipped["backup.gz"] == f"binary: a gzip-compressed tar archive {unpack.format(folder / 'backup.gz')}"
    assert skipped["logs.tar.bz2"].startswith("binary: a bzip2-compressed tar archive (unpack it")  # by its name
    assert skipped["plain.tar"] == f"binary: a tar archive {unpack.format(folder / 'plain.tar')}"
    # other archives and compressions ktcli does not read, said as a file named alone is
    (folder / "photos.zip").write_bytes(b"PK\x03\x04" + bytes(100))
    (folder / "dump.sql.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(100))
    skipped = {s.path.rsplit("/", 1)[-1]: s.reason for s in load_corpus([str(folder)]).skipped}
    assert skipped["photos.zip"].startswith("binary: a zip archive (unpack it and give the folder")
    assert skipped["dump.sql.zst"] == (f"binary: zstd-compressed data (decompress it first: "
                                       f"`zstd -dc {folder / 'dump.sql.zst'} | ktcli ask - \"question\"`)")
