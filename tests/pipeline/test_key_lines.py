"""Key lines: the sentences or table rows quoted again before the question."""

import re

import numpy as np
import pytest

from ktcli.config import Settings
from ktcli.pipeline import key_lines, prompts
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally

from .fake_backend import FakeBackend
from .test_qa_pipeline import haystack  # noqa: F401  (a fixture)

REPORT = """Financial Results by Quarter
Revenue grew in every quarter but the last. The third quarter was the strongest in the company's
history: Q3 revenue was $5.87 million, helped by the first full quarter of sales, e.g. the new lantern.
Fourth-quarter revenue of $5.83 million was slightly below the third quarter.
Quarter | Revenue ($M) | Gross margin | Units shipped
Q1 2023 | 4.60 | 40.9% | 61,200
Q3 2023 | 5.87 | 39.6% | 74,300
Full year | 21.40 | 39.8% | 275,200
Products
The Beacon 7 storm lantern remains our best seller.
"""


def test_prose_reads_as_sentences_across_its_line_breaks():
    units = key_lines.lines_of(REPORT)
    assert ("The third quarter was the strongest in the company's history: Q3 revenue was $5.87 million, helped by "
            "the first full quarter of sales, e.g. the new lantern.") in units
    assert "Fourth-quarter revenue of $5.83 million was slightly below the third quarter." in units


def test_a_table_row_reads_with_its_columns_names():
    units = key_lines.lines_of(REPORT)
    assert "Quarter: Q3 2023, Revenue ($M): 5.87, Gross margin: 39.6%, Units shipped: 74,300" in units
    assert not any(u.startswith("Quarter | Revenue") for u in units)  # the header is no line of its own


def test_a_markdown_table_skips_its_rule_and_keeps_its_header():
    text = "| District | Connections | Mains (km) |\n|---|---:|---|\n| Old Town | 4,310 | 38.4 |\n| Quarry End | 2,145 | 44.2 |\n"
    assert key_lines.lines_of(text) == ["District: Old Town, Connections: 4,310, Mains (km): 38.4",
                                        "District: Quarry End, Connections: 2,145, Mains (km): 44.2"]


def test_a_markdown_table_written_tight_reads_as_one():
    text = "|Plan|Price|\n|--|--|\n|Basic|5 EUR|\n|Pro|12 EUR|\n"
    assert key_lines.lines_of(text) == ["Plan: Basic, Price: 5 EUR", "Plan: Pro, Price: 12 EUR"]


def test_a_table_whose_first_row_holds_figures_has_no_header():
    text = "Weight | 1.2 kg | 3.4 lb\nBattery life | 14 hours | 30 hours\n"
    assert key_lines.lines_of(text) == ["Weight | 1.2 kg | 3.4 lb", "Battery life | 14 hours | 30 hours"]


def test_years_name_columns():
    text = "Item | 2023 | 2022\nNet income ($M) | 1.93 | 1.71\n"
    assert key_lines.lines_of(text) == ["Item: Net income ($M), 2023: 1.93, 2022: 1.71"]


def test_headings_and_list_items_end_a_sentence():
    text = "## Opening hours\nThe centre opens at nine\n- Dogs on leads are allowed on the bus\n- Children under 12 travel free\n"
    assert key_lines.lines_of(text) == ["The centre opens at nine", "Dogs on leads are allowed on the bus",
                                        "Children under 12 travel free"]


def test_a_line_without_a_full_stop_is_quoted_in_part():
    unit = key_lines.lines_of("Word " + "word " * 300)[0]
    assert len(unit) <= key_lines.MAX_CHARS + 4 and unit.endswith(" ...")


def test_words_alone_rank_the_row_the_question_names():
    picked = key_lines.pick("How many units were shipped in Q3 2023?", [(1, REPORT)], None, k=1)
    assert picked == [(1, "Quarter: Q3 2023, Revenue ($M): 5.87, Gross margin: 39.6%, Units shipped: 74,300")]


def test_no_word_of_the_question_no_lines():
    assert key_lines.pick("Wer ist zuständig?", [(1, REPORT)], None) == []


class _Topical:
    """An embedder that knows one synonym the words do not: 'electricity' is 'power'."""

    name = "topical"

    def embed(self, texts):
        return np.array([[1.0, 0.0] if ("power" in t or "electricity" in t) else [0.0, 1.0] for t in texts])

    embed_lines = embed

    def embed_query(self, text):
        return self.embed([text])[0]


def test_the_embedder_finds_what_the_words_miss():
    text = "The board proposes a dividend of $0.42 per share. Solar power made up 61 percent of use."
    question = "What share of electricity came from renewable sources?"
    assert key_lines.pick(question, [(1, text)], None, k=1)[0][1].startswith("The board proposes")
    assert key_lines.pick(question, [(1, text)], _Topical(), k=1)[0][1].startswith("Solar power")


def test_each_line_keeps_its_sources_label():
    picked = key_lines.pick("When does the museum open?", [(1, "The gardens close at dusk."),
                                                            (2, "The museum opens at nine every day.")], None, k=1)
    assert key_lines.block(picked) == "The museum opens at nine every day. [2]"


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "report.txt"
    path.write_text(REPORT)
    return path


def _whole_read_prompt(path, tmp_path, **kw):
    settings = Settings(cache_dir=str(tmp_path / "cache"), mode="full", **kw)
    prep = prepare([str(path)], "What was revenue in the third quarter?", "ask", settings, NullReporter())
    backend = FakeBackend()
    answer_question(prep, backend, settings, NullReporter(), Tally())
    return backend.calls[-1][-1]["content"]


def test_a_whole_read_quotes_the_key_lines_between_the_sources_and_the_question(report, tmp_path):
    prompt = _whole_read_prompt(report, tmp_path)
    quoted = prompt.split(prompts.KEY_LINES_HEADER + "\n", 1)[1].split("\n\nQuestion:", 1)[0].split("\n")
    assert len(quoted) == 2 and all(line.endswith(" [1]") for line in quoted)
    assert prompt.index("</source>") < prompt.index(prompts.KEY_LINES_HEADER) < prompt.index("Question:")
    assert any("$5.87" in line for line in quoted)


def test_no_key_lines_when_set_to_none(report, tmp_path):
    assert prompts.KEY_LINES_HEADER not in _whole_read_prompt(report, tmp_path, key_lines=0)


def test_code_is_not_quoted(tmp_path):
    path = tmp_path / "revenue.py"
    path.write_text("def third_quarter_revenue():\n    # the third quarter revenue in millions\n    return 5.87\n")
    assert prompts.KEY_LINES_HEADER not in _whole_read_prompt(path, tmp_path)


def test_key_lines_that_would_not_fit_the_window_are_left_out(report, tmp_path, monkeypatch):
    settings = Settings(cache_dir=str(tmp_path / "cache"), mode="full", max_new_tokens=64)
    prep = prepare([str(report)], "What was revenue in the third quarter?", "ask", settings, NullReporter())
    plain = FakeBackend().prompt_tokens(prompts.ask_messages(prep.question, prompts.whole_input(prep.corpus.documents)))
    backend = FakeBackend(context_window=plain + 64)  # the plain prompt and answer fill it exactly
    answer_question(prep, backend, settings, NullReporter(), Tally())
    assert prompts.KEY_LINES_HEADER not in backend.calls[-1][-1]["content"]


def test_a_retrieval_answer_quotes_lines_of_its_passages(haystack, tmp_path):
    settings = Settings(cache_dir=str(tmp_path / "cache"), mode="retrieval")
    prep = prepare([str(haystack)], "What is the vault combination?", "ask", settings, NullReporter())
    backend = FakeBackend()
    answer_question(prep, backend, settings, NullReporter(), Tally())
    prompt = backend.calls[-1][-1]["content"]
    quoted = prompt.split(prompts.KEY_LINES_HEADER + "\n", 1)[1].split("\n\nQuestion:", 1)[0].split("\n")
    label = next(n for n, text in re.findall(r'<source id="(\d+)" ref="[^"]+">\n(.*?)</source>', prompt, re.S)
                 if "31-07-1999" in text)
    assert quoted[-1] == f"The vault combination is 31-07-1999 and only the curator knows it. [{label}]"


def test_code_blocks_and_doctests_are_no_lines():
    text = ("The built-in function len() also applies to lists::\n\n   >>> letters = ['a', 'b', 'c', 'd']\n"
            "   >>> len(letters)\n   4\n\nIt can also be nested.\n```\nprint('not a sentence at all')\n```\n")
    units = key_lines.lines_of(text)
    assert units[0] == "The built-in function len() also applies to lists:"
    assert not any("letters" in u or "print" in u for u in units)


def test_a_sentence_opening_with_a_pronoun_comes_with_the_one_before():
    units = key_lines.lines_of("The pass statement does nothing. It can be used when a statement is required.\n")
    assert units == ["The pass statement does nothing.",
                     "The pass statement does nothing. It can be used when a statement is required."]


def test_a_directives_body_reads_under_what_it_names():
    text = (".. method:: list.append(x)\n   :noindex:\n\n   Add an item to the end of the list.\n\n\n"
            "Titles\n======\n\nThe next paragraph stands alone.\n")
    assert key_lines.lines_of(text) == ["list.append(x): Add an item to the end of the list.",
                                        "The next paragraph stands alone."]


def test_a_two_column_table_of_words_reads_as_written():
    assert key_lines.lines_of("Capital | Paris\nCurrency | Euro\n") == ["Capital | Paris", "Currency | Euro"]


def test_a_row_without_its_empty_last_cells_fills_the_first_columns():
    text = "Name | Role | Office | Phone\nBob | Manager\nCarol King | Designer | Bergen | 5501\n"
    assert key_lines.lines_of(text) == ["Name: Bob, Role: Manager",
                                        "Name: Carol King, Role: Designer, Office: Bergen, Phone: 5501"]


def test_a_csvs_rows_read_under_its_header():
    text = "id,value,label\n" + "".join(f"R{i},{i * 1.5},item {i}\n" for i in range(1, 40))
    units = key_lines.lines_of(text)
    assert len(units) == 39 and units[-1] == "id: R39, value: 58.5, label: item 39"
    assert key_lines.pick("What is the value of R17?", [(1, text)], None, k=1) == [(1, "id: R17, value: 25.5, label: item 17")]


def test_abbreviations_end_no_sentence():
    assert key_lines.lines_of("Revenue rose 5% vs. Q2 in the quarter. See Fig. 3 for the detail.") == [
        "Revenue rose 5% vs. Q2 in the quarter.", "See Fig. 3 for the detail."]


def test_a_pdfs_plain_heading_is_no_part_of_a_sentence():
    text = ("The board proposes a dividend of $0.42 per share.\nFinancial Results by Quarter\n"
            "Revenue grew in every quarter but the last.\n")
    assert key_lines.lines_of(text) == ["The board proposes a dividend of $0.42 per share.",
                                        "Revenue grew in every quarter but the last."]


def test_a_passage_that_starts_mid_sentence_loses_that_part():
    text = "was $3.2 million after investing in Halden. Net income rose to $1.93 million."
    assert key_lines.lines_of(text, passage=True) == ["Net income rose to $1.93 million."]


def test_a_whole_text_that_starts_in_lower_case_keeps_its_first_sentence():
    text = "quillstore is released under the Apache License 2.0.\n\nIt needs Python 3.9 or newer to run.\n"
    assert key_lines.lines_of(text) == ["quillstore is released under the Apache License 2.0.",
                                        "It needs Python 3.9 or newer to run."]


def test_a_memos_fields_are_lines_of_their_own():
    text = ("Steering committee\nDate: Tuesday, 14 May 2024\nOwner: Tomas Berg\nBudget: 600,000 NOK\n"
            "Apologies: Lena Vogel\nVersion 4.2, effective 1 March 2024\n\nThe committee met at nine.\n")
    assert key_lines.lines_of(text) == ["Date: Tuesday, 14 May 2024", "Owner: Tomas Berg", "Budget: 600,000 NOK",
                                        "Apologies: Lena Vogel", "Version 4.2, effective 1 March 2024",
                                        "The committee met at nine."]


def test_initials_and_month_abbreviations_end_no_sentence():
    assert key_lines.lines_of("The report was written by J. R. Smith and reviewed by Prof. Alan Ng on Sept. 12 "
                              "2023. It was approved.") == [
        "The report was written by J. R. Smith and reviewed by Prof. Alan Ng on Sept. 12 2023.",
        "The report was written by J. R. Smith and reviewed by Prof. Alan Ng on Sept. 12 2023. It was approved."]


def test_numbered_steps_keep_their_numbers_and_headings_are_no_lines():
    text = ("NORTHWIND LOGISTICS LTD.\n\n1. Budget review\n\n1. Hold the power button for 10 seconds.\n"
            "2. Release it and wait.\n\nVendor selection\n- The committee chose KodeVerk as the vendor.\n")
    assert key_lines.lines_of(text) == ["1. Hold the power button for 10 seconds.", "2. Release it and wait.",
                                        "The committee chose KodeVerk as the vendor."]
    assert key_lines.lines_of("3.1 Air travel\nEconomy class must be booked for flights under 6 hours.\n") == [
        "Economy class must be booked for flights under 6 hours."]


def test_code_directives_and_indented_code_are_no_lines():
    text = (".. code-block:: bash\n\n   python -m pip install requests==2.6.0\n\nOpen the store like this:\n\n"
            "    import quillstore\n    db = quillstore.open(\"data.qs\")\n\nThe store keeps its data in one file.\n"
            "- A list item\n\n    whose second paragraph is indented and still prose.\n")
    assert key_lines.lines_of(text) == ["Open the store like this:", "The store keeps its data in one file.",
                                        "whose second paragraph is indented and still prose."]


def test_cjk_sentences_end_at_their_stops():
    assert key_lines.lines_of("会社は1987年に設立された。本社は港町にある。") == ["会社は1987年に設立された。", "本社は港町にある。"]


def test_a_sentence_and_the_same_with_the_one_before_are_one_pick():
    text = "The Halden factory opened on 14 September 2023. It covers 7,500 square metres of the Halden site."
    picked = key_lines.pick("When did the Halden factory open and how large is it?", [(1, text)], None, k=2)
    assert len(picked) == 1 or not any(a in b for (_, a) in picked for (_, b) in picked if a != b)


def test_an_embedder_that_will_not_load_ranks_by_words_and_says_so(report, tmp_path):
    warned = []

    class Said(NullReporter):
        def warn(self, text):
            warned.append(text)

    settings = Settings(cache_dir=str(tmp_path / "cache"), mode="full", embedder=str(tmp_path / "no-such-model"))
    prep = prepare([str(report)], "What was revenue in the third quarter?", "ask", settings, NullReporter())
    backend = FakeBackend()
    answer_question(prep, backend, settings, Said(), Tally())
    assert prompts.KEY_LINES_HEADER in backend.calls[-1][-1]["content"]
    assert len(warned) == 1 and warned[0].startswith("key lines ranked by their words alone")


def test_a_line_sharing_only_function_words_with_the_question_is_no_key_line():
    readme = "Shelf is a tiny library catalogue manager that stores books in a JSON file."
    assert key_lines.pick("What is the maximum late fee?", [(1, readme)], None) == []
    assert key_lines.pick("Where is late_fee defined?", [(1, readme)], None) == []
    assert key_lines.pick("Where are the books stored?", [(1, readme)], None) == [(1, readme)]


def test_a_question_about_named_code_quotes_only_lines_that_name_it():
    """"What does save_catalogue do?" quoted the README's "... library catalogue manager ...",
    which shares "catalogue" (probe 94); the model answered with it."""
    readme = "Shelf is a tiny library catalogue manager that stores books in a JSON file."
    usage = "Call save_catalogue(path) to write the catalogue back to its JSON file."
    assert key_lines.pick("What does save_catalogue do?", [(1, readme)], None) == []
    assert key_lines.pick("What does save_catalogue do?", [(1, readme + "\n\n" + usage)], None)[0] == (1, usage)
    assert key_lines.pick("What does the `Shelf` class store?", [(1, readme)], None) == [(1, readme)]


def test_a_csv_with_quoted_commas_is_read_row_by_row() -> None:
    """Found by a probe: one quoted "91,450" among a CSV's first rows gave that row one comma
    more, so the file was not taken for a table: it read as one paragraph of prose, and its
    only key line was the first 400 characters of the file."""
    from ktcli.ingest.sections import looks_like_a_table
    from ktcli.pipeline.key_lines import lines_of

    text = ('id,name,department,salary\n1,Ada Kowal,Finance,"40000"\n2,"Ruhr, Benedikt",Logistics,"40137"\n'
            '3,Ignatius Brume,Finance,"91,450"\n4,Cora Lind,Logistics,"40411"\n')
    assert looks_like_a_table(text.splitlines())
    assert "id: 3, name: Ignatius Brume, department: Finance, salary: 91,450" in lines_of(text)
    assert not looks_like_a_table(["It rained, then, at last, it cleared.", "We left, ate, slept, and woke.",
                                   "Then, sadly, it rained."])


_OPTIONS_PAGE = """## DESCRIPTION

-k, --kibibytes
    default to 1024-byte blocks for file system usage; used only with -s and per directory totals

-s, --size
    print the allocated size of each file, in blocks

-S  sort by file size, largest first

--sort=WORD
    sort by WORD instead of name: none (-U), size (-S), time (-t)

-u, --update
    copy only when the SOURCE file is newer than the destination file

-v, --verbose
    explain what is being done
"""


def test_a_question_naming_an_option_quotes_that_options_entry_first():
    # BM25 reads "-S" as "s", as it reads "-s": ls's "-k ... only with -s" came first (probe 125)
    picked = key_lines.pick("what does -S do?", [(1, _OPTIONS_PAGE)], None, k=2)
    # its entry alone: "--sort=WORD ... size (-S)" names it too, and beside it the bundled
    # model answered "--sort=WORD sort by file size" (probe 129)
    assert picked == [(1, "-S  sort by file size, largest first")]
    assert key_lines.pick("what does -u do?", [(1, _OPTIONS_PAGE)], None, k=1)[0][1].startswith("-u, --update")
    assert key_lines.pick("What does --sort do?", [(1, _OPTIONS_PAGE)], None, k=1)[0][1].startswith("--sort=WORD")


def test_an_option_only_mentioned_is_quoted_where_no_entry_is():
    page = "Use -x with care.\n\nThe -x option extracts files, and -x is the default mode.\n"
    picked = key_lines.pick("what does -x do?", [(1, page)], None, k=2)
    assert {text for _, text in picked} == {"Use -x with care.", "The -x option extracts files, and -x is the default mode."}


def test_an_option_named_by_a_function_word_is_quoted():
    # "what does -a do?" is all function words ("a" among them): nothing was quoted (probe 129)
    page = _OPTIONS_PAGE + "\n-a, --all\n    do not ignore entries starting with .\n"
    assert key_lines.pick("what does -a do?", [(1, page)], None, k=2) == [
        (1, "-a, --all  do not ignore entries starting with .")]
    assert key_lines.pick("what does it do?", [(1, page)], None, k=2) == []


_HELP_TEXT = """Usage: ls [OPTION]... [FILE]...
List information about the FILEs (the current directory by default).

Mandatory arguments to long options are mandatory for short options too.
  -a, --all                  do not ignore entries starting with .
  -r, --reverse              reverse order while sorting
  -s, --size                 print the allocated size of each file, in blocks
  -S                         sort by file size, largest first
      --sort=WORD            sort by WORD instead of name: none (-U), size (-S),
                             time (-t), version (-v), extension (-X), width
  -t                         sort by time, newest first; see --time
"""


def test_a_help_texts_entries_are_lines_of_their_own():
    # read as one paragraph, ls --help's option list was the key fact of "what does -S do?"
    # whole, five entries in a line (probe 129)
    units = key_lines.lines_of(_HELP_TEXT)
    assert "-S                         sort by file size, largest first" in units
    assert ("--sort=WORD            sort by WORD instead of name: none (-U), size (-S), time (-t), version (-v), "
            "extension (-X), width") in units  # its next line is its own
    assert "Mandatory arguments to long options are mandatory for short options too." in units
    said = key_lines.block(key_lines.pick("what does -S do?", [(1, _HELP_TEXT)], None, k=2))
    assert said == "The option -S means: sort by file size, largest first [1]"


def test_a_line_that_opens_with_an_option_in_prose_stays_in_its_sentence():
    text = "Run the module as a script with python\n-m pip install --upgrade to upgrade it.\n"
    assert key_lines.lines_of(text) == ["Run the module as a script with python -m pip install --upgrade to upgrade it."]


def test_option_names_keep_their_case_and_dashes():
    assert key_lines.asked_options("what does -S do, and --block-size?") == {"-S", "--block-size"}
    assert key_lines.asked_options("Is e-mail well-known in 2023-24? Is -5 low?") == set()


def test_an_options_entry_is_quoted_as_a_sentence():
    # as "-r, --reverse reverse ..." the bundled model continued the option list (probe 125)
    said = key_lines.block([(1, "-S  sort by file size, largest first"), (2, "-r, --reverse reverse order")])
    assert said.splitlines() == ["The option -r, --reverse means: reverse order [2]",
                                 "The option -S means: sort by file size, largest first [1]"]
    # prose, a bare option with nothing said of it, and a negative figure stay as written
    for unit in ("Revenue rose 5% in Q3.", "--block-size=SIZE", "-5 degrees is the lowest reading."):
        assert key_lines.block([(1, unit)]) == f"{unit} [1]"


# `man rm | ktcli ask - ...` as man writes it to a pipe: all its text indented seven, an
# option's text fourteen under the option's line
_MAN_RM = """RM(1)                            User Commands                           RM(1)

NAME
       rm - remove files or directories

DESCRIPTION
       This  manual  page  documents  the  GNU version of rm.  rm removes each
       specified file.  By default, it does not remove directories.

       Mandatory  arguments  to  long  options are mandatory for short options
       too.

       -f, --force
              ignore nonexistent files and arguments, never prompt

       -i     prompt before every removal

       -r, -R, --recursive
              remove directories and their contents recursively

EXAMPLES
       Remove a directory tree:

           rm -r old/
"""


def test_a_man_pages_indented_text_is_read_not_passed_over_as_code():
    # read as a Markdown code block (indented four, after a blank line), the page's whole
    # option list was passed over: "what does -f do?" quoted nothing (probe 132)
    units = [" ".join(u.split()) for u in key_lines.lines_of(_MAN_RM)]  # (a justified page's spaces)
    assert "Mandatory arguments to long options are mandatory for short options too." in units
    assert "rm -r old/" not in units  # deeper than the text before it: still code
    said = key_lines.block(key_lines.pick("what does -f do?", [(1, _MAN_RM)], None, k=2))
    assert said == "The option -f, --force means: ignore nonexistent files and arguments, never prompt [1]"
    assert key_lines.block(key_lines.pick("what does -i do?", [(1, _MAN_RM)], None, k=1)) == (
        "The option -i means: prompt before every removal [1]")
    # a Markdown code block after text at the margin is still code
    assert key_lines.lines_of("Install it with pip.\n\n    pip install --upgrade ktcli-tool\n") == [
        "Install it with pip."]


def test_an_entrys_argument_stays_with_its_option():
    # "The option -p means: port Port to connect to" (probe 132)
    ssh = ("DESCRIPTION\n     The options are as follows:\n\n     -p port\n"
           "             Port to connect to on the remote host.  This can be specified on\n"
           "             a per-host basis in the configuration file.\n\n     -q      Quiet mode.\n")
    said = key_lines.block(key_lines.pick("what does -p do?", [(1, ssh)], None, k=1))
    assert said == "The option -p port means: Port to connect to on the remote host. [1]"
    curl = ("       -o, --output <file>\n              Write output to <file> instead of stdout. If you are using {} or\n"
            "              [] to fetch multiple documents, you should quote the URL.\n")
    said = key_lines.block(key_lines.pick("what does -o do?", [(1, curl)], None, k=1))
    assert said == "The option -o, --output <file> means: Write output to <file> instead of stdout. [1]"
    xargs = ("       -d delim, --delimiter=delim\n              Input  items  are terminated by the specified character.\n")
    said = key_lines.block(key_lines.pick("what does --delimiter do?", [(1, xargs)], None, k=1))
    assert said == ("The option -d delim, --delimiter=delim means: Input items are terminated by the specified "
                    "character. [1]")


def test_a_sentence_that_opens_with_an_option_is_not_its_entry():
    # curl's "-o, --output can be used several times" and a justified line of find's -print0
    # entry opening with "-print  uses)" were read as entries (probe 132)
    page = ("       -o, --output <file>\n              Write output to <file> instead of stdout.\n\n"
            "              -o, --output can be used several times in a command line\n")
    assert key_lines.pick("what does -o do?", [(1, page)], None, k=2) == [
        (1, "-o, --output <file>  Write output to <file> instead of stdout.")]
    find = ("       -print0\n              True;  print the full file name on the standard output, followed\n"
            "              by a null character  (instead  of  the  newline  character  that\n"
            "              -print  uses).   This allows file names that contain newlines to be read.\n")
    assert " ".join(key_lines.lines_of(find)[0].split()) == (
        "-print0 True; print the full file name on the standard output, followed by a null character (instead "
        "of the newline character that -print uses).")


def test_a_digit_alone_is_an_option():
    # "what does -0 do?" of xargs's page named no option, and quoted "The GNU find -print0
    # option produces input suitable for this mode." (probe 132)
    assert key_lines.asked_options("what does -0 do?") == {"-0"}
    assert key_lines.asked_options("What is the -1 flag?") == {"-1"}
    assert key_lines.asked_options("Is -5 low? Is -0.5 low?") == set()
    xargs = ("OPTIONS\n       -0, --null\n              Input items are terminated by a null  character  instead  of  by\n"
             "              whitespace.\n\n       The  GNU  find  -print0  option produces input suitable for this mode.\n")
    said = key_lines.block(key_lines.pick("what does -0 do?", [(1, xargs)], None, k=2))
    assert said == "The option -0, --null means: Input items are terminated by a null character instead of by whitespace. [1]"
    assert key_lines.block([(1, "-5 degrees is the lowest reading.")]) == "-5 degrees is the lowest reading. [1]"


def test_an_option_with_two_entries_is_quoted_from_its_first_first():
    # find's page has -print0's entry in its option list, and "-print0, -fprint0" under
    # UNUSUAL FILENAMES: the second was ranked first, and so quoted last (probe 132)
    find = ("       -print0\n              True; print the full file name, followed by a null character.\n\n"
            "UNUSUAL FILENAMES\n       -print0, -fprint0\n              Always print the exact filename, unchanged.\n")
    # and it alone: the later one, quoted last, was answered "The option -print0, -fprint0,"
    assert [text for _, text in key_lines.pick("what does -print0 do?", [(1, find)], None, k=2)] == [
        "-print0  True; print the full file name, followed by a null character."]


def test_an_options_text_after_a_blank_line_is_its_entrys():
    # sed's page puts a blank line between an option's line and its text, indented deeper:
    # read as a code block, "what does -i do?" quoted nothing (probe 132)
    sed = ("SED(1)                           User Commands                          SED(1)\n\n"
           "DESCRIPTION\n       Sed  is a stream editor.\n\n"
           "       -n, --quiet, --silent\n\n              suppress automatic printing of pattern space\n\n"
           "       -i[SUFFIX], --in-place[=SUFFIX]\n\n              edit files in place (makes backup if SUFFIX supplied)\n\n"
           "       -l N, --line-length=N\n\n              specify the desired line-wrap length for the `l' command\n")
    said = key_lines.block(key_lines.pick("what does -i do?", [(1, sed)], None, k=2))
    assert said == ("The option -i[SUFFIX], --in-place[=SUFFIX] means: edit files in place (makes backup if SUFFIX "
                    "supplied) [1]")
    assert key_lines.pick("what does --quiet do?", [(1, sed)], None, k=2) == [
        (1, "-n, --quiet, --silent  suppress automatic printing of pattern space")]
    # an option alone before a blank line and text no deeper than it stays alone
    assert key_lines.lines_of("       --posix\n\n       Disables all GNU extensions, as POSIX asks.\n") == [
        "Disables all GNU extensions, as POSIX asks."]


def test_a_short_entry_is_no_label():
    # four words and no stop: read as a heading, "--debug  annotate program execution" and
    # "-V, --version  output version information" were dropped (probe 132)
    text = ("  -V, --version              output version information\n"
            "      --debug                annotate program execution\n")
    units = key_lines.lines_of(text)
    assert len(units) == 2 and units[1].startswith("--debug") and units[1].endswith("annotate program execution")
    assert key_lines.block(key_lines.pick("what does --debug do?", [(1, text)], None, k=2)) == (
        "The option --debug means: annotate program execution [1]")
    assert key_lines.lines_of("Vendor selection\n\nWe chose the vendor on price.\n") == ["We chose the vendor on price."]


def test_an_entry_and_the_same_with_its_next_sentence_are_one():
    # curl's --connect-to: its first sentence, and it with the next ("This option ...")
    # were both quoted (probe 132)
    curl = ("       --connect-to <HOST1:PORT1:HOST2:PORT2>\n"
            "              For a request to the given HOST1:PORT1 pair, connect to HOST2:PORT2 instead. This option is\n"
            "              suitable to direct requests at a specific server.\n")
    picked = key_lines.pick("what does --connect-to do?", [(1, curl)], None, k=2)
    assert picked == [(1, "--connect-to <HOST1:PORT1:HOST2:PORT2>  For a request to the given HOST1:PORT1 pair, "
                          "connect to HOST2:PORT2 instead.")]
