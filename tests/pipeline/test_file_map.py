"""A summary's map of its files (`pipeline.file_map`): each file in its own words, quoted
from the line that says it, never made up; nothing for files that say nothing."""

from __future__ import annotations

import pytest

from ktcli.pipeline.file_map import MAX_FILES, describe, file_map
from ktcli.types import Document


def _doc(path: str, text: str, kind: str = "code", language: str | None = None, **kw) -> Document:
    return Document(path=path, text=text, kind=kind, language=language, **kw)


def test_a_python_module_is_described_by_its_docstring_first_sentence():
    text = '#!/usr/bin/env python\n"""Loading and saving the catalogue. It is one JSON file.\n\nMore here."""\nimport json\n'
    assert describe(_doc("storage.py", text, language="python")) == (2, "Loading and saving the catalogue.")


def test_a_docstring_continued_past_its_opening_quotes_is_cited_at_its_text():
    # Three quotes and a backslash, the text on the next line: cited at the quotes' line (probe 94).
    text = '"""\\\nLoading and saving the catalogue.\n"""\nimport json\n'
    assert describe(_doc("storage.py", text, language="python")) == (2, "Loading and saving the catalogue.")


def test_a_python_module_without_a_docstring_says_what_it_defines():
    text = ("import typing\n\n@typing.overload\ndef echo(x: int) -> None: ...\n@typing.overload\n"
            "def echo(x: str) -> None: ...\ndef echo(x): pass\ndef _private(): pass\n"
            "class Context:\n    pass\n")
    assert describe(_doc("core.py", text, language="python")) == (9, "defines Context, echo")
    many = "".join(f"def f{i}(): pass\n" for i in range(9))
    assert describe(_doc("m.py", many, language="python"))[1] == "defines f0, f1, f2, f3, f4, f5 and 3 more"


def test_other_code_by_its_opening_comment_past_licence_lines():
    text = ("// Copyright 2024 Example Corp.\n// SPDX-License-Identifier: MIT\n\n"
            "// Package router matches request paths to handlers,\n// longest prefix first. Routes are immutable.\n"
            "package router\n")
    assert describe(_doc("router.go", text, language="go")) == (
        4, "Package router matches request paths to handlers, longest prefix first.")
    assert describe(_doc("main.rs", "fn main() {}\n", language="rust")) is None


def test_a_jsdoc_comment_by_its_description_not_its_tags():
    """"@file renderer.js" was quoted as what the file says it is (probe 94)."""
    text = "/**\n * @file renderer.js\n * @author Ann\n * Renders the page to HTML.\n */\nexport function render() {}\n"
    assert describe(_doc("renderer.js", text, language="javascript")) == (4, "Renders the page to HTML.")
    tagged = "/** @fileoverview Renders the page to HTML. */\n"
    assert describe(_doc("renderer.js", tagged, language="javascript")) == (1, "Renders the page to HTML.")


def test_a_manifest_by_its_description():
    toml = '[project]\nname = "shelf"\nversion = "0.3.1"\ndescription = "A tiny catalogue"\n'
    assert describe(_doc("pyproject.toml", toml, language="toml")) == (4, "A tiny catalogue")
    package = '{\n  "name": "x",\n  "description": "Parses \\"quoted\\" flags"\n}\n'
    assert describe(_doc("package.json", package, language="json")) == (3, 'Parses "quoted" flags')


def test_a_manifest_by_its_multi_line_description():
    """Cargo.toml's `description = \"\"\"` block was not found (probe 94)."""
    text = '[package]\nname = "shelf"\ndescription = """\nA tiny library catalogue. It keeps books.\n"""\n'
    assert describe(_doc("Cargo.toml", text, language="toml")) == (4, "A tiny library catalogue.")


def test_prose_by_its_title_and_first_sentence():
    md = ("[![build](https://ci/badge.svg)](https://ci)\n\n# shelf\n\n![logo](logo.png)\n\n"
          "A tiny command-line catalogue for a home library. It keeps one file.\n\n## Install\n")
    assert describe(_doc("README.md", md, kind="markdown")) == (3, "shelf: A tiny command-line catalogue for a home library.")
    assert describe(_doc("empty.md", "# Notes\n\n## Later\n", kind="markdown")) == (1, "Notes")
    rst = ".. _tut:\n\n*****************\nThe Tutorial\n*****************\n\nPython is easy to learn. It is.\n"
    assert describe(_doc("tutorial.rst", rst, kind="text")) == (4, "The Tutorial: Python is easy to learn.")
    assert describe(_doc("notes.txt", "\nKeep the lamps lit. Always.\n", kind="text")) == (2, "Keep the lamps lit.")


def test_a_document_by_its_first_line_cited_where_the_file_has_it():
    html = _doc("guide.html", "Kestrel Router Guide\nSet up.", kind="html", source_lines=(14, 20))
    assert describe(html) == (14, "Kestrel Router Guide")
    assert describe(_doc("r.pdf", "12\nHarbor Light Annual Report", kind="pdf")) == (2, "Harbor Light Annual Report")


@pytest.mark.parametrize("path, text, kind", [
    ("build.log", "2024-03-02 12:00:01 INFO build started\n", "text"),
    ("server.txt", "[2024-03-02 12:00:01] GET /\n", "text"),
    ("LICENSE", "MIT License\n\nPermission is hereby granted.\n", "text"),
    ("python-tutorial.LICENSE.txt", "Copyright: Python\n", "text"),
    (".gitignore", "# build outputs are never part of the source\n*.log\n", "code"),
    ("data.csv", "name,age\nAda,36\n", "text"),
    ("broken.py", "def (:\n", "code"),
])
def test_files_that_say_nothing_of_themselves_are_left_out(path, text, kind):
    assert describe(_doc(path, text, kind=kind, language="python" if path.endswith(".py") else None)) is None


def test_the_map_lists_in_input_order_counts_the_rest_and_names_the_shared_folder():
    docs = [_doc(f"repo/src/m{i:02}.py", f'"""Module {i}."""\n', language="python") for i in range(MAX_FILES + 3)]
    docs.insert(1, _doc("repo/build.log", "2024-01-01 00:00 start\n", kind="text"))
    files = file_map(docs)
    assert files is not None and files.folder == "repo/src" and files.unlisted == 3
    assert files.entries[:2] == (("repo/src/m00.py", 1, "Module 0."), ("repo/src/m01.py", 1, "Module 1."))
    assert len(files.entries) == MAX_FILES
    assert file_map(docs[:1]) is None  # one document: its summary is about it alone
    assert file_map([_doc("a.log", "2024-01-01 x\n", kind="text"), _doc("b.log", "2024-01-02 y\n", kind="text")]) is None


def test_c_preprocessor_lines_tool_lines_and_licence_notices_are_not_descriptions():
    # markupsafe's _speedups.c read as "include <Python.h>", cffi's headers as "define _CFFI_"
    assert describe(_doc("_speedups.c", "#include <Python.h>\n\nstatic int x;\n", language="c")) is None
    header = "#ifndef WIDGET_H\n#define WIDGET_H\n/* Widget drawing. */\n#endif\n"
    assert describe(_doc("widget.h", header, language="c")) is None
    # bs4's builder/_lxml.py opens "# encoding: utf-8"; _html5lib.py with a licence notice
    text = "# encoding: utf-8\n# Use of this source code is governed by the MIT license.\n# Parses with lxml.\nx = 1\n"
    assert describe(_doc("_lxml.py", text, language="python")) == (3, "Parses with lxml.")


def test_a_docstring_is_quoted_from_its_sentence_not_its_title_or_quotes():
    pallets = '"""\n    flask.app\n    ~~~~~~~~~\n\n    This module implements the central WSGI application object.\n"""\n'
    assert describe(_doc("app.py", pallets, language="python")) == (
        5, "This module implements the central WSGI application object.")
    below = '"""\nRanges of integers, kept as pairs.\n"""\n'
    assert describe(_doc("intranges.py", below, language="python")) == (2, "Ranges of integers, kept as pairs.")


def test_a_pages_front_matter_is_not_its_description():
    page = '---\ntitle: "Guide"\nlayout: page\n---\n\n# Guide\n\nHow to set the lamp up. Then more.\n'
    assert describe(_doc("guide.md", page, kind="markdown")) == (6, "Guide: How to set the lamp up.")


def test_past_the_bound_the_files_nearest_the_top_and_outside_tests_are_listed():
    docs = [_doc(f"repo/benchmarks/b{i:02}.py", f'"""Benchmark {i}."""\n', language="python") for i in range(MAX_FILES)]
    docs += [_doc("repo/README.md", "# Repo\n\nA tool. It works.\n", kind="markdown"),
             _doc("repo/pkg/core.py", '"""The core."""\n', language="python"),
             _doc("repo/pkg/deep/inner.py", '"""Inner."""\n', language="python")]
    files = file_map(docs)
    listed = [path for path, _, _ in files.entries]
    assert listed[-3:] == ["repo/README.md", "repo/pkg/core.py", "repo/pkg/deep/inner.py"]  # in input order
    assert len(listed) == MAX_FILES and files.unlisted == 3  # three benchmarks left out


def test_past_the_bound_public_modules_come_before_private_ones():
    docs = [_doc(f"rich/_p{i:02}.py", f'"""Private {i}."""\n', language="python") for i in range(MAX_FILES)]
    docs += [_doc("rich/__init__.py", '"""Rich text."""\n', language="python"),
             _doc("rich/table.py", '"""Tables."""\n', language="python"),
             _doc("rich/_impl/x.py", '"""Impl."""\n', language="python")]
    files = file_map(docs)
    listed = [path for path, _, _ in files.entries]
    assert "rich/__init__.py" in listed and "rich/table.py" in listed and "rich/_impl/x.py" not in listed
    assert files.unlisted == 3


def test_a_licence_header_in_a_sentence_of_its_own_is_not_a_description():
    """packaging's six modules were each "This file is dual licensed under the terms of the
    Apache License, Version 2.0, and the BSD License." (probe 117); its continuation lines
    are the licence too, not the description."""
    text = ("# This file is dual licensed under the terms of the Apache License, Version\n"
            "# 2.0, and the BSD License. See the LICENSE file in the root of this repository\n"
            "# for complete details.\n\nfrom __future__ import annotations\n\nclass Marker:\n    pass\n")
    assert describe(_doc("markers.py", text, language="python")) == (7, "defines Marker")
    go = ("// This file is licensed under the MIT licence.\n// Router matches request paths to handlers.\n"
          "package router\n")
    assert describe(_doc("router.go", go, language="go")) == (2, "Router matches request paths to handlers.")


def test_a_type_checker_line_is_not_part_of_the_description():
    text = "# Adapted from pydantic 1.9.2\n# mypy: ignore-errors\n\nimport numbers\n"
    assert describe(_doc("_typing.py", text, language="python")) == (1, "Adapted from pydantic 1.9.2")


def test_a_docstring_of_a_rest_directive_alone_says_nothing():
    """packaging's `specifiers.py` was described as ".. testsetup::" (probe 117)."""
    text = ('"""\n.. testsetup::\n\n    from packaging.version import Version\n"""\n\n'
            "class Specifier:\n    pass\n")
    assert describe(_doc("specifiers.py", text, language="python")) == (7, "defines Specifier")
    text = '""".. note:: old.\n\nParsing of versions.\n"""\n'
    assert describe(_doc("version.py", text, language="python"))[1] == "Parsing of versions."


def test_debian_copyright_files_and_dot_folders_are_not_listed():
    """/usr/share/doc/systemd's map listed `copyright:1 Format: https://www.debian.org/...`,
    typer's began with its `.agents/skills/typer/SKILL.md` (probe 117). A folder summarized
    that itself lies under a dot folder (`.venv/`) is listed all the same."""
    docs = [_doc("/x/.venv/pkg/README.md", "# pkg\n\nParses things.\n", kind="markdown"),
            _doc("/x/.venv/pkg/copyright", "Format: https://www.debian.org/doc/copyright-format/1.0/\n",
                 kind="text"),
            _doc("/x/.venv/pkg/.agents/skills/SKILL.md", "# Skill\n\nWrite code with best practices.\n",
                 kind="markdown"),
            _doc("/x/.venv/pkg/core.py", '"""The core."""\n', language="python")]
    listed = file_map(docs)
    assert [path for path, _, _ in listed.entries] == ["/x/.venv/pkg/README.md", "/x/.venv/pkg/core.py"]


def test_a_first_sentence_is_not_cut_at_an_initial():
    """pygments' paraiso_dark.py was listed as "Paraíso (Dark) by Jan T." (probe 117)."""
    text = '"""\n    Paraíso (Dark) by Jan T. Sott\n\n    More.\n"""\n'
    assert describe(_doc("paraiso_dark.py", text, language="python"))[1] == "Paraíso (Dark) by Jan T. Sott"
    text = '"""Fast paths, e.g. Unicode ones. Slow paths too."""\n'
    assert describe(_doc("paths.py", text, language="python"))[1] == "Fast paths, e.g. Unicode ones."
    text = '"""Version 2. The rest."""\n'
    assert describe(_doc("v.py", text, language="python"))[1] == "Version 2."
