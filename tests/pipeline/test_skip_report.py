"""The lines that say which files a run left out."""

from dataclasses import replace

from ktcli.config import Settings
from ktcli.ingest.walk import excluded_by
from ktcli.pipeline.skip_report import report_skipped
from ktcli.types import Skipped

from .test_qa_pipeline import Shown


def test_exclusions_are_said_with_where_their_patterns_came_from():
    """Patterns from the config file were said as "matching --exclude", a flag never given."""
    from_file = replace(Settings(exclude=("*.csv",)), origins=(("exclude", "exclude in /home/u/ktcli.toml"),))
    shown = Shown()
    report_skipped([Skipped(f"ex/{name}", excluded_by(from_file.named("exclude"))) for name in ("a.csv", "b.csv")], shown)
    assert shown.lines == ["excluded 2 files matching exclude in /home/u/ktcli.toml: ex/a.csv, ex/b.csv"]
    flagged = Shown()
    named = Settings(exclude=("*.csv",)).named("exclude")
    report_skipped([Skipped(f"ex/{name}", excluded_by(named)) for name in ("a.csv", "b.csv")], flagged)
    assert flagged.lines[0].startswith("excluded 2 files matching --exclude: ")


def test_an_exclude_that_left_out_nothing_is_said(tmp_path):
    """`--exclude certifi/tests/` given the folder certifi itself read the tests unawares."""
    from dataclasses import replace

    from ktcli.config import Settings
    from ktcli.pipeline.prepare import prepare

    from .test_qa_pipeline import Warnings

    repo = tmp_path / "certifi"
    (repo / "tests").mkdir(parents=True)
    (repo / "core.py").write_text("def where():\n    return 'cacert.pem'\n")
    (repo / "tests" / "test_core.py").write_text("def test_where():\n    assert where()\n")
    for exclude, said in ((("certifi/tests/",), True), (("tests/",), False), (("!core.py",), False)):
        settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), exclude=exclude)
        reporter = Warnings()
        prepare([str(repo)], "q", "ask", settings, reporter)
        assert any("--exclude 'certifi/tests/' left out nothing of the folders read" in w
                   for w in reporter.lines) is said, exclude


def test_each_exclude_that_left_out_nothing_is_said(tmp_path):
    """`--exclude core.py --exclude tset/` said nothing of the mistyped second pattern: the
    first had left a file out."""
    from dataclasses import replace

    from ktcli.config import Settings
    from ktcli.pipeline.prepare import prepare

    from .test_qa_pipeline import Warnings

    repo = tmp_path / "pkg"
    (repo / "tests").mkdir(parents=True)
    (repo / "core.py").write_text("def where():\n    return 'cacert.pem'\n")
    (repo / "util.py").write_text("def helper():\n    return 1\n")
    (repo / "tests" / "test_core.py").write_text("def test_where():\n    assert where()\n")
    cases = ((("core.py", "tset/"), ["'tset/'"]), (("core.py", "tests/"), []), (("./core.py", "tests/**"), []),
             (("core.py", "pkg/zz.py", "*.md"), ["'pkg/zz.py', '*.md'"]))
    for exclude, unused in cases:
        settings = replace(Settings(), cache_dir=str(tmp_path / "cache"), exclude=exclude)
        reporter = Warnings()
        prepare([str(repo)], "q", "ask", settings, reporter)
        said = [w for w in reporter.lines if "left out nothing" in w]
        assert [w.split(" left out nothing")[0].removeprefix("--exclude ") for w in said] == unused, (exclude, said)
