"""Gold questions for benchmarks/retrieval_recall.py: a question a user would ask, and the
lines that answer it. Written by hand after reading each source in full: questions are
paraphrased (not section titles), each has one answer location, and every range was checked."""

from __future__ import annotations

TUTORIAL = "sample_docs/python-tutorial-3.11.rst"
# (question, first line, last line): 1-based, inclusive; the lines that hold the answer
TUTORIAL_CASES = [
    # using the interpreter
    ("How do I get out of the interactive Python prompt?", 180, 183),
    ("What does sys.argv[0] contain when I run code with python -c or python -m?", 222, 232),
    ("My source file is saved as Windows-1252 rather than UTF-8; how do I tell Python?", 289, 306),
    # informal introduction
    ("How do I get the whole-number part of a division and its remainder?", 385, 397),
    ("How do I stop backslashes in a string such as a Windows path from being treated as "
     "escape sequences?", 495, 508),
    ("Why do I get a TypeError when I try to replace one character of a string by index?", 650, 667),
    # control flow
    ("My for loop has an else block after it; when does that block actually run?", 1041, 1073),
    ("Why does printing range(10) show range(0, 10) instead of the numbers?", 1010, 1018),
    ("Can a case in a match statement carry an extra if-condition?", 1231, 1239),
    # functions
    ("Why does my function remember items from earlier calls when its parameter defaults "
     "to an empty list?", 1455, 1481),
    ("My arguments are already in a list or a dict; how do I pass them to a function as "
     "separate arguments?", 1781, 1807),
    ("Where does Python store the type hints written on a function's parameters and "
     "return value?", 1907, 1924),
    # data structures
    ("Why do list methods like sort() or insert() show no result in the interpreter?", 2108, 2111),
    ("Why is a plain list a poor choice for a first-in, first-out queue, and what should "
     "I use instead?", 2158, 2165),
    ("How do I write a tuple that contains just one element?", 2401, 2414),
    # modules
    ("I changed my module's code but the running interpreter still uses the old version; "
     "how do I pick up the edits?", 2856, 2862),
    ("How can one .py file work both as an importable module and as a runnable program?", 2870, 2897),
    ("Do programs execute faster when they are loaded from .pyc files?", 2972, 2974),
    # input and output
    ("How can I print an expression together with its value in an f-string while debugging?", 3443, 3450),
    ("Why should I avoid text mode when reading an image or an executable file?", 3630, 3636),
    ("How do I jump to a given byte offset in an open file, for example counting from "
     "the end?", 3741, 3764),
    # errors and exceptions
    ("How do I raise a different exception inside an except block without the original "
     "one showing up in the traceback?", 4170, 4180),
    ("If both the try block and its finally block contain a return, which value does the "
     "function return?", 4250, 4265),
    ("How can I catch only the OSErrors inside an ExceptionGroup and let the other "
     "exceptions in it propagate?", 4367, 4399),
    ("How can I attach extra context to an exception I have caught before re-raising it?", 4421, 4440),
    # classes
    ("Why does appending to a list through one instance of my class show up in every "
     "other instance?", 4908, 4949),
    ("What happens to an attribute name like __spam written inside a class body?", 5167, 5174),
    ("Which special methods does my class need so that its instances can be looped over "
     "with for?", 5300, 5318),
    # standard library, part I
    ("Which built-in function gets hidden if I star-import the os module?", 5438, 5440),
    ("How can I measure which of two tiny code snippets runs faster?", 5675, 5687),
    ("How can I check automatically that the usage examples in my docstrings still give "
     "the output shown?", 5699, 5715),
    # standard library, part II
    ("My $-placeholder template throws KeyError when some values are missing; how can I "
     "leave those placeholders unfilled instead?", 5858, 5871),
    ("Why don't my logging.info() and logging.debug() messages show up anywhere?", 6004, 6009),
    ("Why can rounding a tax calculation to the nearest cent give a different answer with "
     "floats than with the decimal module?", 6140, 6154),
    # virtual environments and packages
    ("How do I switch my shell over to a virtual environment on Windows compared with "
     "Linux or macOS?", 6236, 6249),
    ("How can I record the exact versions of the packages I have installed so someone else "
     "can install the same set?", 6355, 6382),
    # floating point
    ("Rounding each float first still doesn't make .1 + .1 + .1 equal .3; how should "
     "round() be used to compare such results?", 6631, 6643),
    ("How can I add up many floats while losing less precision to rounding?", 6706, 6715),
    # interactive editing
    ("Where does the interpreter keep what I typed so it is available again in my next "
     "session?", 6489, 6492),
    # appendix
    ("How can I have some setup code run every time I launch the Python REPL?", 6883, 6895),
]
# (question, path relative to the repo root, first line, last line)
MINIREPO_CASES = [
    ("When adding a book from the command line, which options are mandatory and which "
     "are optional?", "sample_docs/minirepo/src/shelf/cli.py", 16, 20),
    ("What exit code does the tool return when a book breaks one of the rules?",
     "sample_docs/minirepo/src/shelf/cli.py", 55, 57),
    ("What happens if I try to lend a book id that doesn't exist?",
     "sample_docs/minirepo/src/shelf/cli.py", 48, 52),
    ("Does searching care about upper and lower case, and how is one book scored against "
     "a query?", "sample_docs/minirepo/src/shelf/search.py", 11, 25),
    ("Where do books that have no publication year end up among the search results?",
     "sample_docs/minirepo/src/shelf/search.py", 28, 32),
    ("Which function decides where the catalogue file lives on disk?",
     "sample_docs/minirepo/src/shelf/storage.py", 13, 19),
    ("What does loading return when the catalogue file does not exist yet?",
     "sample_docs/minirepo/src/shelf/storage.py", 22, 25),
    ("Which function writes the book list to disk, and with what JSON settings?",
     "sample_docs/minirepo/src/shelf/storage.py", 30, 38),
    ("Why can't a book's year be earlier than 1450?",
     "sample_docs/minirepo/src/shelf/models.py", 9, 9),
    ("What error is raised when someone tries to lend a book that is already out?",
     "sample_docs/minirepo/src/shelf/models.py", 34, 37),
    ("Which test checks that an exact title match is ranked above a title that only starts "
     "with the query?", "sample_docs/minirepo/tests/test_search.py", 5, 10),
    ("Can you show a few example shell commands for using the tool?",
     "sample_docs/minirepo/README.md", 7, 12),
    ("Why does the design note say the catalogue is kept in one JSON file rather than a "
     "database?", "sample_docs/minirepo/docs/notes/design.md", 3, 4),
    ("How is the installed shelf command connected to the Python code?",
     "sample_docs/minirepo/pyproject.toml", 7, 8),
    ("How does the release script pick the tag name, and what does it do if that tag "
     "already exists?", "sample_docs/minirepo/scripts/release", 2, 8),
]

# The same sources, asked in their own vocabulary (names, keywords, identifiers), as a user
# who knows the terms asks: the counterweight to the paraphrased questions above.
TUTORIAL_TERMS_CASES = [
    # whetting your appetite
    ("Is Python named after the snake or after Monty Python's Flying Circus?", 131, 133),
    # using the interpreter
    ("How can I check whether GNU Readline command line editing is supported, for example by "
     "typing Control-P?", 185, 193),
    ("What does the `-i` option do when running a script?", 210, 212),
    # informal introduction
    ("What does the `_` variable hold in interactive mode?", 428, 443),
    ("How do I use the `end` keyword argument of `print()` to avoid the newline?", 851, 859),
    ("Why does `-3**2` evaluate to -9 instead of 9?", 864, 866),
    # control flow
    ("What does the `pass` statement do?", 1098, 1117),
    ("What does the `__match_args__` special attribute do for class patterns in a `match` "
     "statement?", 1198, 1207),
    # functions
    ("How do `/` and `*` in a function definition mark positional-only and keyword-only "
     "parameters?", 1593, 1625),
    ("What is a `lambda` expression and what is it restricted to?", 1815, 1830),
    ("What does PEP 8 recommend for indentation and line length?", 1940, 1954),
    # data structures
    ("How do I create an empty set: with `set()` or with `{}`?", 2439, 2441),
    ("What does `enumerate()` return when looping over a sequence?", 2564, 2572),
    ("What is `zip()` used for in looping techniques?", 2574, 2584),
    # modules
    ("What do the `-O` and `-OO` switches remove from compiled modules?", 2964, 2970),
    ("What is the `__init__.py` file for in a package?", 3160, 3165),
    ("How does `__all__` in a package's `__init__.py` control `from package import *`?",
     3221, 3234),
    # input and output
    ("What is the difference between `str()` and `repr()`?", 3366, 3373),
    ("What does `str.zfill()` do?", 3563, 3571),
    ("What does `f.readline()` return at the end of the file, and for a blank line?", 3697, 3709),
    # errors and exceptions
    ("What does the little arrow in a `SyntaxError` message point to?", 3863, 3868),
    ("What is the difference between `BaseException` and `Exception`?", 4017, 4023),
    ("When is the `else` clause of a try/except executed?", 4048, 4065),
    # classes
    ("What does the `nonlocal` statement do?", 4627, 4638),
    ("What do `isinstance()` and `issubclass()` check?", 5097, 5106),
    ("How do I use `@dataclass` from `dataclasses` to bundle named data items like a C "
     "struct?", 5220, 5238),
    # standard library, part I
    ("How does the `argparse` example parse `--lines` and `filenames`?", 5490, 5506),
    ("How do I write tests with `unittest.TestCase` and `assertRaises`?", 5717, 5733),
    # standard library, part II
    ("What do `struct.pack()` and `struct.unpack()` do, and what do the pack codes \"H\" and "
     "\"I\" mean?", 5906, 5912),
    ("How do `heapify`, `heappush` and `heappop` from the `heapq` module work?", 6110, 6120),
    # virtual environments and packages
    ("Why is `.venv` a common directory name for a virtual environment?", 6230, 6234),
    # what now
    ("Where can I post Python questions, comp.lang.python or python-list@python.org?", 6444, 6450),
    # interactive editing
    ("What are IPython and bpython?", 6507, 6511),
    # floating point
    ("What does `float.hex()` return, and why is it useful?", 6690, 6704),
    # appendix
    ("What are the `sitecustomize` and `usercustomize` modules?", 6916, 6931),
]
MINIREPO_TERMS_CASES = [
    ("What does the `find` command print for a book whose `year` is None?",
     "sample_docs/minirepo/src/shelf/cli.py", 41, 43),
    ("How does `shelf list --tag` filter the books it prints?",
     "sample_docs/minirepo/src/shelf/cli.py", 44, 47),
    ("Which fields does the `Book` dataclass have, and what are their defaults?",
     "sample_docs/minirepo/src/shelf/models.py", 16, 23),
    ("Which checks does `Book.validate()` make, and which `InvalidBook` messages can it raise?",
     "sample_docs/minirepo/src/shelf/models.py", 25, 32),
    ("How does `storage.load()` turn the JSON records back into `Book` objects?",
     "sample_docs/minirepo/src/shelf/storage.py", 26, 27),
    ("What does `next_id` return for an empty list of books?",
     "sample_docs/minirepo/src/shelf/storage.py", 41, 42),
    ("What are the rank constants `EXACT_TITLE`, `TITLE_PREFIX`, `TITLE_WORD`, `AUTHOR` and "
     "`TAG`, and which comes first?", "sample_docs/minirepo/src/shelf/search.py", 7, 8),
    ("What does `test_author_match` assert?",
     "sample_docs/minirepo/tests/test_search.py", 13, 14),
    ("How is shelf licensed?", "sample_docs/minirepo/README.md", 29, 29),
    ("Is `os.replace` atomic on POSIX and Windows?",
     "sample_docs/minirepo/docs/notes/design.md", 6, 7),
    ("Which Python version does `requires-python` in pyproject.toml ask for?",
     "sample_docs/minirepo/pyproject.toml", 5, 5),
    ("What does `scripts/release` run with `git tag -a`, and what does it print afterwards?",
     "sample_docs/minirepo/scripts/release", 9, 10),
]


# "Where is X defined?" about a repo that uses X far more often than it defines it: click,
# as installed beside ktcli. The gold lines are found in the installed version at run time
# (`definition_cases`): the definition's line and the three after it.
CLICK_DEFINITION_CASES = [
    ("Which file defines class ProgressBar?", "ProgressBar"),
    ("Where is the HelpFormatter class defined?", "HelpFormatter"),
    ("Where is BadParameter defined?", "BadParameter"),
    ("Where is get_app_dir() implemented?", "get_app_dir"),
    ("Which file defines echo_via_pager?", "echo_via_pager"),
    ("What does make_str() do?", "make_str"),
    ("Where is ParameterSource defined?", "ParameterSource"),
    ("Which module defines the CliRunner class?", "CliRunner"),
    ("Where is the ShellComplete class?", "ShellComplete"),
    ("What does format_filename() return?", "format_filename"),
]
# The same of names only backticks mark as code (no capital, underscore or parentheses),
# as developers write them: click's `echo` came 7th before 2026-12-05.
CLICK_BACKTICK_CASES = [
    ("Where is `echo` defined?", "echo"),
    ("Where is `secho` defined?", "secho"),
    ("What does `style` do?", "style"),
    ("Where is `confirm` implemented?", "confirm"),
    ("Which file defines `launch`?", "launch"),
    ("Where is `pause` defined?", "pause"),
    ("What does `clear` do?", "clear"),
    ("What does `unstyle` return?", "unstyle"),
    ("Where is `prompt` defined?", "prompt"),
    ("How does `getchar` work?", "getchar"),
]


def definition_cases(folder: str, cases: list[tuple[str, str]]) -> list[tuple[str, str, int, int]]:
    """(question, file, first line, last line) of each name's `class`/`def` line in `folder`."""
    import re
    from pathlib import Path

    out = []
    files = sorted(Path(folder).glob("*.py"))
    for question, name in cases:
        pattern = re.compile(rf"^[ \t]*(?:class|def) {re.escape(name)}\b", re.MULTILINE)
        for path in files:
            text = path.read_text(encoding="utf-8")
            m = pattern.search(text)
            if m:
                line = text.count("\n", 0, m.start()) + 1
                out.append((question, f"{folder}/{path.name}", line, line + 3))
                break
    return out


# "What calls X?" of click as installed: functions defined once and called from 2-7 places,
# most of them in other functions or files than the definition. The gold is every line that
# calls the name (`caller_cases`, found at run time); a hit is a chunk holding one of them.
CLICK_CALLER_CASES = [
    ("What calls `resolve_color_default`?", "resolve_color_default"),
    ("Which functions call `strip_ansi`?", "strip_ansi"),
    ("Where is `get_text_stderr` used?", "get_text_stderr"),
    ("Who calls open_stream()?", "open_stream"),
    ("Which code calls `_find_binary_writer`?", "_find_binary_writer"),
    ("Where is `augment_usage_errors` used?", "augment_usage_errors"),
    ("What calls iter_params_for_processing?", "iter_params_for_processing"),
    ("Which functions call `wrap_text`?", "wrap_text"),
    ("Where is `get_best_encoding` called?", "get_best_encoding"),
    ("What uses `_safecall`?", "_safecall"),
]


def caller_cases(folder: str, cases: list[tuple[str, str]]) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """(question, [(file, line, line), ...]) of each line in `folder` that calls the name
    (`name(` on a line that is no `def`)."""
    import re
    from pathlib import Path

    files = sorted(Path(folder).glob("*.py"))
    texts = {path: path.read_text(encoding="utf-8").split("\n") for path in files}
    out = []
    for question, name in cases:
        call = re.compile(rf"(?<![\w]){re.escape(name)}\(")
        places = [(f"{folder}/{path.name}", n, n) for path, lines in texts.items()
                  for n, line in enumerate(lines, start=1) if call.search(line) and not line.lstrip().startswith("def ")]
        out.append((question, places))
    return out
