"""Option entries as man pages and --help texts write them (`retrieval.options`)."""

from ktcli.retrieval.options import OptionEntries, asked_options, entry_of, is_entry


def test_a_man_pages_entries_and_their_arguments():
    # an argument before a comma, another option after it (xargs), an argument in brackets
    # (curl), a digit alone (xargs's -0): each an entry of every option it names (probe 132)
    assert is_entry("       -d delim, --delimiter=delim") and entry_of("-d delim, --delimiter=delim", "--delimiter")
    assert is_entry("       -o, --output <file>") and entry_of("-o, --output <file>", "--output")
    assert is_entry("       -0, --null") and entry_of("-0, --null", "-0")
    assert is_entry("  -1                         list one file per line")
    # prose that a justified line opens with an option, and a figure, are no entries
    assert not is_entry("       -o, --output or -O, --remote-name options. If curl  is  given  multiple")
    assert not entry_of("-o, --output can be used several times in a command line", "-o")
    assert not is_entry("-5 degrees is the lowest reading")


def test_the_chunk_that_holds_a_digit_options_entry_is_found():
    chunks = ["The  GNU  find  -print0  option produces input suitable for -0.",
              "OPTIONS\n\n       -0, --null\n              Input items are terminated by a null character."]
    assert OptionEntries(chunks).defining(asked_options("what does -0 do?")) == {1}


def test_options_with_no_commas_between_them_are_an_entry():
    # gzip's "-d --decompress --uncompress" was no entry, so -d's was not found (probe 132)
    assert is_entry("       -d --decompress --uncompress") and entry_of("-d --decompress --uncompress", "--decompress")
    assert not is_entry("-m pip install --upgrade to upgrade it.")


def test_a_long_line_of_options_with_values_is_read_at_once():
    """`-a=b, -c=d, ...`: a value's `\\S*` could end before or after each comma, 2^n ways to
    fail, and a line of 25 such took 87 s in `is_entry` (a hang for longer ones)."""
    from ktcli.retrieval.options import is_entry, options_alone

    line = "-a=b, " * 40 + "x y"
    assert not is_entry(line) and not options_alone(line)
    assert options_alone("-a=b, " * 40 + "-c")
