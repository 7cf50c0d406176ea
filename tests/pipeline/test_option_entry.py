"""An answer about a command-line option, checked against the option's own entry."""

from ktcli.config import Settings
from ktcli.pipeline import option_entry
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.render.formats import citations_text, option_entry_notice

from .fake_backend import FakeBackend

RM = """# RM(1)

## DESCRIPTION

rm removes each specified file. By default, it does not remove directories.

-f, --force
    ignore nonexistent files and arguments, never prompt

-i  prompt before every removal

-r, -R, --recursive
    remove directories and their contents recursively

-v, --verbose
    explain what is being done
"""


def test_another_options_words_are_not_the_entrys():
    # the bundled model's answer to "what does -f do?" over rm's man page, -r's words (probe 129)
    wrong = "The option -f, --force, is used to remove directories and their contents recursively."
    found = option_entry.check("what does -f do?", wrong, [RM])
    assert found.unsaid and found.entry == "-f, --force ignore nonexistent files and arguments, never prompt"
    assert option_entry_notice(found.option, found.entry) == (
        "The input's own entry for -f, of which the answer above says little: "
        "\"-f, --force ignore nonexistent files and arguments, never prompt\"")


def test_the_entrys_words_in_other_forms_are_said():
    right = "The option -f, --force ignores nonexistent files and arguments and never prompts you. [1]"
    assert not option_entry.check("what does -f do?", right, [RM]).unsaid
    assert not option_entry.check("What does --force do?", "It ignores nonexistent files, never prompting.", [RM]).unsaid


def test_a_words_other_forms_are_the_same_word():
    # "files" read "fil" and "file" "file": an answer in the entry's words, its plurals
    # aside, was said to say little of it (probe 132)
    entry = "-S  sort by file size, largest first; remove the directory"
    right = "It sorts the files by their sizes, largest first, and removes directories."
    assert not option_entry.check("what does -S do?", right, [entry]).unsaid
    assert option_entry.check("what does -S do?", right, [entry]).share == 1.0


def test_no_one_option_no_entry_or_too_short_an_answer_is_not_judged():
    answer = "It is used to remove directories and their contents recursively."
    assert option_entry.check("What does rm do?", answer, [RM]) is None
    assert option_entry.check("what do -f and -i do?", answer, [RM]) is None
    assert option_entry.check("what does -x do?", answer, [RM]) is None  # no entry
    assert option_entry.check("what does -f do?", "[1]", [RM]) is None


def test_the_answer_is_followed_by_the_entry_on_stdout(tmp_path):
    page = tmp_path / "rm.md"
    # (its first sentence less "file", which -f's "nonexistent files" says too: a fourth of
    # the fake's answer would stand in the entry, not under a fourth)
    page.write_text(RM.replace("rm removes each specified file.", "rm removes each operand it is given."))
    settings = Settings(cache_dir=str(tmp_path / "cache"), mode="full", key_lines=0)
    # The fake model answers with the line that shares most words with the question:
    # "-f" is no word of it, and "removes ... directories" shares "remove"
    prep = prepare([str(page)], "what does -f remove?", "ask", settings, NullReporter())
    answer = answer_question(prep, FakeBackend(), settings, NullReporter(), Tally())
    entry = "-f, --force ignore nonexistent files and arguments, never prompt"
    assert answer.stats["option_entry"] == {"option": "-f", "entry": entry}
    assert f"The input's own entry for -f, of which the answer above says little: \"{entry}\"" in citations_text(answer)
