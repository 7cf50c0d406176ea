"""Option entries as man pages and --help texts write them (`retrieval.options`)."""

from ktcli.retrieval.options import entry_of, is_entry


def test_a_man_pages_entries_and_their_arguments():
    # an argument before a comma, another option after it (xargs), an argument in brackets
    # (curl): each an entry of every option it names (probe 132)
    assert is_entry("       -d delim, --delimiter=delim") and entry_of("-d delim, --delimiter=delim", "--delimiter")
    assert is_entry("       -o, --output <file>") and entry_of("-o, --output <file>", "--output")
    # prose that a justified line opens with an option, and a figure, are no entries
    assert not is_entry("       -o, --output or -O, --remote-name options. If curl  is  given  multiple")
    assert not entry_of("-o, --output can be used several times in a command line", "-o")
    assert not is_entry("-5 degrees is the lowest reading")

