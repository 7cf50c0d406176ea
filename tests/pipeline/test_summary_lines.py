"""A summary's stream less lines of tags alone and code blocks not in its source
(`pipeline.summary_lines`), fed in pieces as a model streams them."""

from __future__ import annotations

import pytest

from ktcli.pipeline.summary_lines import SummaryLines

SOURCE = '''import collections

Process = collections.namedtuple("Process", "args pid ppid")


def get_shell(pid=None, max_depth=10):
    """Return the shell the given process runs in."""
    return _get_shell(pid, max_depth)
'''


def _streamed(text: str, source: str = SOURCE, step: int = 3) -> tuple[str, SummaryLines, list[str]]:
    """`text` fed `step` characters at a time: what is shown, the filter, and each feed's output."""
    lines = SummaryLines(source)
    outs = [lines.feed(text[i:i + step]) for i in range(0, len(text), step)]
    outs.append(lines.flush())
    return "".join(outs), lines, outs


def test_prose_passes_as_it_streams():
    text = "This module finds the shell a process runs in.\nIt walks the process tree.\n"
    shown, lines, outs = _streamed(text)
    assert shown == text
    assert outs[0] == text[:3]  # not held to the line's end
    assert lines.said("the summary") == ""


@pytest.mark.parametrize("step", [1, 3, 200])
def test_a_line_writing_the_instructions_back_is_left_out(step):
    """A summary of a 36-page PDF printed ktcli's own instruction to stdout (probe 115)."""
    text = ("Asn1Parser parses ASN.1 definitions.\n\nWrite the final summary from these notes: what it is, how it is "
            "organised, and the key facts, in a few short paragraphs.\n\n- Keep the earlier notes, shortened if "
            "needed.\nIt also writes DER.\n")
    shown, lines, _ = _streamed(text, step=step)
    assert shown == "Asn1Parser parses ASN.1 definitions.\n\nIt also writes DER.\n"
    assert lines.said("the summary") == "left out of the summary: 2 line(s) writing ktcli's instructions back"
    # a line that starts as one and goes its own way is shown whole; a short start too
    for own in ("Write the final report of the year was good.\n", "Summarize: it parses DER.\n", "Keep\n"):
        assert _streamed(own, step=step)[0] == own


@pytest.mark.parametrize("junk", ["<p>\n", "<pre><code></code></pre>\n", '  <span class="language-python"></span>\n',
                                  "</p>\n"])
def test_a_line_of_tags_alone_is_left_out(junk):
    text = f"{junk}Certifi ships Mozilla's root certificates.\n{junk}"
    shown, lines, _ = _streamed(text)
    assert shown == "Certifi ships Mozilla's root certificates.\n"
    assert "line(s) of HTML tags alone" in lines.said("the summary of x")


def test_a_made_up_code_block_is_left_out_and_said():
    """shellingham's three-line posix/_core.py 'summarized' as a script of the model's own."""
    made_up = ("<pre><code>\nimport collections\n\ndef main():\n    args = 123\n    pid = 123\n"
               "    print(f\"Process {args} with pid {pid}\")\n\nmain()\n```\n\nThis script demonstrates things.\n")
    shown, lines, _ = _streamed(made_up)
    assert shown == "This script demonstrates things.\n"
    assert lines.said("the summary of posix/_core.py") == (
        "left out of the summary of posix/_core.py: 1 code block(s) that are not in the input (made up by the model)")


@pytest.mark.parametrize("fence", ["```python", "```", "~~~"])
def test_a_code_block_quoted_from_the_source_is_kept(fence):
    close = fence[:3]
    text = (f"It defines one function:\n{fence}\ndef get_shell(pid=None, max_depth=10):\n"
            f"    return _get_shell(pid, max_depth)\n{close}\nThat is all.\n")
    shown, lines, _ = _streamed(text)
    assert shown == text
    assert lines.dropped_blocks == 0


def test_a_block_that_defines_a_name_the_source_does_not_is_left_out():
    """idna's compat.py summarized as its own functions renamed (`to_ascii` for ToASCII),
    half the block's lines copied from the source."""
    source = ('def ToASCII(label: str) -> bytes:\n    """Compatibility shim for ToASCII.\n\n'
              '    :param label: The label or domain to encode.\n    """\n    return encode(label)\n')
    text = ('```python\ndef to_ascii(label: str) -> bytes:\n    """Compatibility shim for ToASCII.\n\n'
            '    :param label: The label or domain to encode.\n    """\n    return encode(label)\n```\nDone.\n')
    shown, lines, _ = _streamed(text, source)
    assert shown == "Done.\n" and lines.dropped_blocks == 1
    # the same block with the source's own name is the source's text, and stays
    shown, lines, _ = _streamed(text.replace("to_ascii", "ToASCII"), source)
    assert "def ToASCII(" in shown and lines.dropped_blocks == 0


def test_a_block_the_text_ends_in_is_judged_at_the_end():
    shown, lines, _ = _streamed("See:\n```\nwhile True:\n    launch_rockets(count=3)\n")
    assert shown == "See:\n" and lines.dropped_blocks == 1


def test_inline_markup_and_code_in_prose_stay():
    text = "Use `get_shell()` to find it; `<br>` tags are not touched here.\n"
    shown, _, _ = _streamed(text)
    assert shown == text


def test_a_summary_of_html_keeps_lines_that_say_something():
    text = "<b>Falcon</b> is an HTTP server.\n"
    shown, _, _ = _streamed(text, source="<html><b>Falcon</b> is an HTTP server.</html>")
    assert shown == text


def test_a_made_up_restructuredtext_code_block_is_left_out():
    """shellingham's README 'summarized' as a code-block directive of invented comments."""
    text = (".. code-block:: python\n\n    # This is a simple shell-based tool that can detect the shell name.\n"
            "    # It raises a ShellDetectionFailure if the shell name is not available.\n\n"
            "Shellingham detects the shell.\n")
    shown, lines, _ = _streamed(text)
    assert shown == "Shellingham detects the shell.\n" and lines.dropped_blocks == 1


def test_blank_lines_left_behind_collapse():
    text = "<p>\n\nCertifi is portable.\n\n<p>\n\n\nIts main parts are:\n\n"
    shown, _, _ = _streamed(text)
    assert shown == "Certifi is portable.\n\nIts main parts are:\n"


def test_a_kept_html_code_block_is_shown_fenced_without_its_tags():
    text = ("It defines:\n<pre><code>\n<span>def get_shell(pid=None, max_depth=10):</span>\n"
            "    return _get_shell(pid, max_depth)\n</code></pre>\nDone.\n")
    shown, lines, _ = _streamed(text)
    assert shown == ("It defines:\n```\ndef get_shell(pid=None, max_depth=10):\n    return _get_shell(pid, max_depth)\n"
                     "```\nDone.\n")
    # closed with a fence, as the model did
    shown, _, _ = _streamed("<pre><code>\ndef get_shell(pid=None, max_depth=10):\n```\n")
    assert shown == "```\ndef get_shell(pid=None, max_depth=10):\n```\n"


def test_a_sections_own_headings_go_a_level_below_its_path_heading():
    """A file-by-file summary's "## Usage" stood level with the "## shelf/storage.py" above it
    (probe 94)."""
    text = "## Usage\nCall get_shell().\n\n### Notes\nIt walks the tree. # not a heading\n"
    for step in (1, 3, 50):
        lines = SummaryLines(SOURCE, under_heading=True)
        shown = "".join(lines.feed(text[i:i + step]) for i in range(0, len(text), step)) + lines.flush()
        assert shown == "### Usage\nCall get_shell().\n\n#### Notes\nIt walks the tree. # not a heading\n"
    assert _streamed(text)[0] == text  # a summary of its own keeps them


@pytest.mark.parametrize("step", [1, 3, 200])
def test_script_elements_not_in_the_source_are_left_out(step):
    """man-db's docs came back as "The following files are part of the manpage
    documentation." and four copies of `<script type="text/javascript">`, document.write(`
    and `</script>` lines, shown: `script` was no tag, its body no block (probe 117)."""
    loop = '<script type="text/javascript">\ndocument.write(`\n\n</script>\n</script>\n\n'
    text = "The following files are part of the manpage documentation.\n\n" + loop * 4 + "<title>\n<meta charset=utf-8>\n"
    shown, lines, _ = _streamed(text, step=step)
    assert shown == "The following files are part of the manpage documentation.\n"
    assert "4 code block(s) that are not in the input" in lines.said("the summary")
    # the source's own script is kept, as a <pre> block is: fenced, its tags gone
    source = '<script>\nwindow.onload = function () { start(); };\n</script>\n'
    shown, _, _ = _streamed("It starts on load.\n<script>\nwindow.onload = function () { start(); };\n</script>\n",
                            source=source, step=step)
    assert shown == "It starts on load.\n```\nwindow.onload = function () { start(); };\n```\n"


@pytest.mark.parametrize("step", [1, 3, 200])
def test_a_lead_in_from_the_notes_instruction_alone_on_its_line_is_left_out(step):
    """ninja's manual was summed up under "The main points of this part are:" (probe 117);
    a line that goes on past such words, or only starts like one, is shown."""
    text = ("The main points of this part are:\n\nThe build graph is a list of build statements.\n"
            "The main points: rules and builds.\nThe mainline build.\nSummary notes so far:\n")
    shown, lines, _ = _streamed(text, step=step)
    assert shown == ("The build graph is a list of build statements.\nThe main points: rules and builds.\n"
                     "The mainline build.\n")
    assert lines.said("the summary") == "left out of the summary: 2 line(s) writing ktcli's instructions back"


def test_lines_of_markdown_badges_alone_are_left_out():
    # probe 135: libcbor's README summed up as seven badge lines, their URLs half made up
    source = "# libcbor\n\n[![Build](https://ci.example/b.svg)](https://ci.example)\n\nlibcbor parses CBOR.\n"
    lines = SummaryLines(source)
    streamed = ("[![codecov](https://codecov.io/gh/PJK/libcbor/branch/master)](https://codecov.io/gh/PJK)\n\n"
                "libcbor is a C library for CBOR.\n"
                "![logo](logo.png) ![ci](https://ci.example/b.svg)\n"
                "See [the docs](https://libcbor.readthedocs.io) for more.\n"
                "[1] A line that opens with a label is prose.\n")
    shown = "".join(lines.feed(c) for c in streamed) + lines.flush()
    assert shown == ("libcbor is a C library for CBOR.\nSee [the docs](https://libcbor.readthedocs.io) for more.\n"
                     "[1] A line that opens with a label is prose.\n")
    assert lines.dropped_images == 2 and "2 line(s) of Markdown images (badges) alone" in lines.said("the summary")
    # one cut off mid-link where the text ended (--max-new-tokens)
    shown, cut = _shown(source, "libcbor parses CBOR.\n[![Build Status](https://ci.appveyor.io/proj")
    assert shown == "libcbor parses CBOR.\n" and cut.dropped_images == 1


def _shown(source: str, streamed: str, under_heading: bool = False) -> tuple[str, SummaryLines]:
    lines = SummaryLines(source, under_heading)
    # token by token, as the model streams: a line's start arrives a few characters at a time
    pieces = [streamed[i:i + 3] for i in range(0, len(streamed), 3)]
    return "".join(lines.feed(p) for p in pieces) + lines.flush(), lines


ALLOCA = ("#ifndef\t_ALLOCA_H\n#define\t_ALLOCA_H\t1\n\n#include <features.h>\n\n"
          "/* Allocate a block that will be freed when the calling function exits.  */\n"
          "extern void *alloca (size_t __size) __THROW;\n")


def test_code_lines_outside_a_fence_that_are_not_the_sources_are_left_out():
    # probe 135: alloca.h summed up as "#define _ALLOCA_H" and "#define _ALLOCA_H_", shown as headings
    shown, lines = _shown(ALLOCA, "#define\t_ALLOCA_H_\nThe header declares alloca.\n#include <stdlib.h>\n",
                          under_heading=True)
    assert shown == "The header declares alloca.\n"
    assert lines.dropped_code_lines == 2 and "2 line(s) of code outside a code block that are not in the input" \
        in lines.said("the summary")
    # a made-up script, its body indented
    shown, lines = _shown("def parse(text):\n    return text.split()\n",
                          "It splits text.\ndef main():\n    print(parse('a b'))\n    result = main()\nimport os\n")
    assert shown == "It splits text.\n" and lines.dropped_code_lines == 4


def test_code_lines_outside_a_fence_that_are_the_sources_stay_and_prose_is_not_code():
    shown, lines = _shown(ALLOCA, "#define _ALLOCA_H\nextern void *alloca (size_t __size) __THROW;\n")
    assert shown == "#define _ALLOCA_H\nextern void *alloca (size_t __size) __THROW;\n" and not lines.dropped_any
    prose = ("# Summary\n## alloca.h\nfrom the header: alloca allocates on the stack.\n"
             "import is not what this does.\nclass of functions: memory.\n  see (the notes) below.\n"
             "int values are returned.\n- def lines are listed\n")
    shown, lines = _shown(ALLOCA, prose)
    assert shown == prose and not lines.dropped_any
    # a heading under ktcli's own `## path` goes a level down, as before
    shown, _ = _shown(ALLOCA, "# Usage\nCall alloca.\n", under_heading=True)
    assert shown == "## Usage\nCall alloca.\n"


def test_an_answers_script_block_not_in_the_input_is_counted_as_made_up():
    # probe 135: "What was employee turnover?" of the sample report was answered with a
    # <script> block of the model's own, and nothing said
    from ktcli.pipeline.summary_lines import made_up_blocks

    report = "Employee turnover was 7.4 percent.\n"
    assert made_up_blocks("<script>\ndocument.write(`<h1>Employee Turnover:</h1>`);\n</script>", [report]) == 1
    assert made_up_blocks("<pre>Employee turnover was 7.4 percent.</pre>", [report]) == 0  # the input's own
    assert made_up_blocks("Turnover was 7.4 percent. <b>Low</b>.", [report]) == 0
