"""A README of badges alone (libcbor's: seven lines of `[![...](...)](...)`) is said in
words, what its badges are about and where they point, with no model: the bundled model
wrote made-up prose of it, or copied the badge lines, which a summary leaves out."""

from __future__ import annotations

from ktcli.pipeline.badges import badge_summary, badges_line, badges_only
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.file_map import describe
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.runner import Tally
from ktcli.pipeline.summarize import summarize
from ktcli.render.formats import figures_line
from ktcli.types import Document

from .fake_backend import FakeBackend
from .test_qa_pipeline import Shown, settings_for

# as libcbor's README is (its badges, in its order)
BADGES = """\
[![CircleCI](https://circleci.com/gh/PJK/libcbor/tree/master.svg?style=svg)](https://circleci.com/gh/PJK/libcbor/tree/master)
[![Build status](https://ci.appveyor.com/api/projects/status/8kkmvmefelsxp5u2?svg=true)](https://ci.appveyor.com/project/PJK/libcbor)
[![Documentation Status](https://readthedocs.org/projects/libcbor/badge/?version=latest)](https://readthedocs.org/projects/libcbor/?badge=latest)
[![latest packaged version(s)](https://repology.org/badge/latest-versions/libcbor.svg)](https://repology.org/project/libcbor/versions)
[![codecov](https://codecov.io/gh/PJK/libcbor/branch/master/graph/badge.svg)](https://codecov.io/gh/PJK/libcbor)
[![Fuzzing Status](https://oss-fuzz-build-logs.storage.googleapis.com/badges/libcbor.svg)](https://bugs.chromium.org/p/oss-fuzz/issues/list?q=proj:libcbor)
[![License](https://img.shields.io/badge/License-MIT-blue.svg)](https://opensource.org/licenses/MIT)
"""
SAID = ("The file holds only 7 badges (linked images), no text of its own: CI, docs, packaged versions, coverage, "
        "fuzzing and license (MIT).")


def test_a_text_of_badges_alone_is_said_in_words():
    said = badge_summary(BADGES).split("\n")
    assert said[0] == SAID and len(said) == 8
    assert said[1] == "- CircleCI: https://circleci.com/gh/PJK/libcbor/tree/master"
    assert said[2] == "- Build status (CI): https://ci.appveyor.com/project/PJK/libcbor"
    assert said[5] == "- codecov (coverage): https://codecov.io/gh/PJK/libcbor"
    assert said[7] == "- License (MIT): https://opensource.org/licenses/MIT"
    assert badges_line(BADGES) == "7 badges alone: " + SAID.split("own: ")[1].rstrip(".")
    # an image with no link, badges on one line, blank lines between: badges still
    assert badges_only("![PyPI](https://img.shields.io/pypi/v/x.svg) | [![CI](a.svg)](b)\n\n") is not None
    # any text of its own is a README to summarize
    for text in ("# libcbor\n" + BADGES, BADGES + "libcbor is a C library.", "![a](b) and more", "", "[link](x)"):
        assert badge_summary(text) is None and badges_line(text) is None


def test_looking_for_badges_stays_linear_on_long_lines():
    for text in ("[![" * 6000, "![" + "](" * 9000, "![a](b) " * 2000 + "x", "[![" + "a" * 15000 + "](b)",
                 "[" + "x" * 1_000_000):
        assert badges_only(text) is None


def test_a_file_of_badges_alone_is_summarized_with_no_model(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(BADGES)
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(readme)], "", "summarize", settings, NullReporter())
    backend, shown = FakeBackend(), Shown()
    answer = summarize(prep, backend, settings, shown, Tally())
    assert backend.calls == [] and answer.text.startswith(SAID) and "".join(shown.shown) == answer.text
    assert {c.span.path for c in answer.citations} == {str(readme)} and shown.lines == []
    # and so planned: no model's load or prefill (it was ~35 s for a run of 0.8), no other mode to offer
    assert prep.plan.est_seconds == prep.plan.read_s and prep.plan.est_memory_bytes < 200 << 20
    assert prep.plan.reasons == ("the file holds badges alone: what they say is listed, no model is loaded",)
    assert prep.plan.alternatives == ()
    # and its figures line names no model's rates ("prefill 0 tok/s · decode 0.0 tok/s")
    assert figures_line(answer).startswith("no model run · total ")


def test_a_folder_lists_what_its_badges_readme_says(tmp_path):
    folder = tmp_path / "libcbor"
    folder.mkdir()
    (folder / "README.md").write_text(BADGES)
    (folder / "cbor.h").write_text("/* libcbor: a C library for parsing and generating CBOR. */\n"
                                   + "size_t cbor_serialize(const cbor_item_t *item, unsigned char *buffer);\n" * 3)
    (folder / "CHANGELOG.md").write_text("# Changelog\n\n0.10.2 fixed a test bug on x86 Linux.\n" * 3)
    settings = settings_for(tmp_path, mode="auto")
    prep = prepare([str(folder)], "", "summarize", settings, NullReporter())
    backend = FakeBackend()
    answer = summarize(prep, backend, settings, Shown(), Tally())
    assert dict(answer.parts)[str(folder / "README.md")].startswith(SAID)
    assert len(backend.calls) == 2 and not any("circleci" in m[-1]["content"] for m in backend.calls)
    # read with other files in one prompt (a larger folder): its line in the file map
    assert describe(Document(str(folder / "README.md"), BADGES, "markdown")) == (1, badges_line(BADGES))
