"""Chunks that define a name the question writes as code come first (`retrieval.symbols`)."""

from ktcli.retrieval.retriever import DEFINITION_BONUS, USE_BONUS, HybridIndex, _fuse
from ktcli.retrieval.symbols import MAX_DEFINITION_SITES, SymbolTable, code_names, python_string_lines, used_names
from ktcli.types import Chunk, Span
from tests.retrieval.fakes import HashEmbedder


def chunk(i: int, text: str) -> Chunk:
    return Chunk(doc_path=f"f{i}.py", ordinal=i, text=text, span=Span(f"f{i}.py", 1, text.count("\n") + 1),
                 n_tokens=len(text.split()))


def test_names_written_as_code_are_picked_from_a_question():
    assert code_names("which file defines class ProgressBar?") == {"ProgressBar"}
    assert code_names("what does frobnicate_widget_count() return, and where is TAX_RATE set?") == {
        "frobnicate_widget_count", "TAX_RATE"}
    assert code_names("Where is the HTTPServer made, and what does parse() do?") == {"HTTPServer", "parse"}
    assert code_names("How do exceptions work in Python?") == set()


def test_a_dotted_name_outside_backticks_is_code():
    """"where is CliRunner.invoke defined?" named CliRunner alone, and click's
    `def invoke(` in testing.py was in none of the 8 chunks read (in backticks it was)."""
    assert code_names("where is CliRunner.invoke defined?") == {"CliRunner", "invoke"}
    assert code_names("what calls Context.invoke?") == {"Context", "invoke"}
    assert used_names("what calls Context.invoke?") == {"invoke"}
    # file names, abbreviations and version numbers are no code names
    for question in ("what does core.py do?", "see README.md, e.g. the docs", "what changed in 1.2.3?",
                     "is pyproject.toml read?"):
        assert code_names(question) == set(), question


def test_a_plain_word_beside_its_keyword_or_kind_is_a_name():
    """`class Segment` in backticks named nothing (a space inside), nor did "def render" or
    "the Console class": one plain word has no code shape, and rich's
    `class Segment(NamedTuple):` was in none of the 8 chunks read."""
    assert code_names("where is `class Segment` defined?") == {"Segment"}
    assert code_names("where is class Segment defined?") == {"Segment"}
    assert code_names("what does `def render` return?") == {"render"}
    assert code_names("Where is the Console class, and what does the echo function do?") == {"Console", "echo"}
    assert code_names("where is struct Config defined") == {"Config"}
    # prose around a kind's name names nothing
    for question in ("which class handles colors?", "what class of problems does it solve", "Is there a class for tables?",
                     "Which function of the module prints?", "is there a helper function for this?",
                     "Where is the function that parses arguments?", "What kind of type is returned?",
                     "List all enum values", "How are class names resolved?", "Explain class inheritance here",
                     "Summarize the entire module"):
        assert code_names(question) == set(), question
    # found by review: a kind's name after the name, a determiner before the keyword
    assert code_names("How is the Segment class used?") == {"Segment"}
    assert code_names("What does the class Segment do?") == {"Segment"}
    assert code_names("where is struct inode defined?") == {"inode"}  # C's lowercase types (review)
    assert code_names("what fields does struct sockaddr have?") == {"sockaddr"}


def test_definitions_in_several_languages_are_found_and_common_names_ignored():
    texts = ["class ProgressBar(t.Generic[V]):\n    pass\n", "bar = ProgressBar(items)\nbar.update(1)\n",
             "pub fn parse_args() -> Args {}\n", "func (r *Repo) SaveAll(x int) error {\n", "TAX_RATE = 0.2\n",
             "export default function AppShell() {}\n"]
    table = SymbolTable([chunk(i, t) for i, t in enumerate(texts)])
    assert table.defining({"ProgressBar"}) == {0}  # the use in chunk 1 is no definition
    assert table.defining({"parse_args", "SaveAll", "TAX_RATE", "AppShell"}) == {2, 3, 4, 5}
    common = SymbolTable([chunk(i, "def run_all(self):\n    pass\n") for i in range(MAX_DEFINITION_SITES + 1)])
    assert common.defining({"run_all"}) == set()


def lines_chunk(path: str, ordinal: int, lines: list[str], first: int, last: int) -> Chunk:
    """The chunk of a file's lines first..last (1-based, inclusive), as chunking cuts them."""
    text = "\n".join(lines[first - 1:last])
    return Chunk(doc_path=path, ordinal=ordinal, text=text, span=Span(path, first, last), n_tokens=len(text.split()))


def test_definitions_are_counted_by_place_not_by_chunk():
    """A monorepo with rich, click and click's copy vendored in typer defines `ProgressBar`
    three times; chunks overlap, so rich's definition was in two chunks, the name counted as
    defined in four (more than the three allowed then), and none of the three was retrieved."""
    rich = ["from typing import Optional", "", "", "class ProgressBar(JupyterMixin):", '    """A bar."""',
            "    def __init__(self):", "        self.total = 100", "", "    def update(self, n):", "        pass"]
    chunks = [lines_chunk("rich/progress_bar.py", 0, rich, 1, 5), lines_chunk("rich/progress_bar.py", 1, rich, 4, 10),
              chunk(2, "class ProgressBar(t.Generic[V]):\n    pass\n"),
              chunk(3, "class ProgressBar(Generic[V]):\n    pass\n"), chunk(4, "bar = ProgressBar(items)\n")]
    # one chunk per place: of rich's two, the one holding more of the class's body
    assert SymbolTable(chunks).defining({"ProgressBar"}) == {1, 2, 3}
    vendored = [chunk(i, "def getchar(echo):\n    return read()\n") for i in range(MAX_DEFINITION_SITES)]
    assert SymbolTable(vendored).defining({"getchar"}) == set(range(MAX_DEFINITION_SITES))


def test_a_class_inside_a_python_string_is_no_definition():
    """rich's tree.py demo shows `class Segment(NamedTuple):` in a string it highlights: it
    took the definition bonus beside rich's real one in segment.py."""
    demo = ["def demo():", '    code = """\\', "class Segment(NamedTuple):", '    text: str = ""', '"""',
            "    print(code)"]
    real = ["class Segment(NamedTuple):", '    text: str = ""']
    table = SymbolTable([lines_chunk("rich/tree.py", 0, demo, 1, 6), lines_chunk("rich/segment.py", 0, real, 1, 2)])
    assert table.defining({"Segment"}) == {1}
    # a chunk that starts inside a docstring: the file is read from its first chunk on
    doc = ['"""Usage:', "", "class Config:", "    debug = True", '"""', "", "class Config:", "    name = 'x'"]
    table = SymbolTable([lines_chunk("app.py", 0, doc, 1, 3), lines_chunk("app.py", 1, doc, 3, 8)])
    assert table.defining({"Config"}) == {1}
    assert table._sites("Config") == {("app.py", 7): 1}
    # elsewhere a class in quotes is still read as one (a Markdown file's example)
    readme = Chunk(doc_path="README.md", ordinal=0, text='"""\nclass Config:\n"""\n', span=Span("README.md", 1, 3),
                   n_tokens=3)
    assert SymbolTable([readme]).defining({"Config"}) == {0}


def test_python_string_lines_steps_over_comments_and_one_line_strings():
    source = "\n".join([
        "x = '\"\"\"'  # a triple quote in a one-line string opens nothing",  # 1
        "# nor in a comment: '''",  # 2
        'y = """first', "inside", 'still \\""" inside', 'last"""',  # 3-6
        "z = r'''raw", "in'''",  # 7-8
        "w = 1",  # 9
    ])
    assert python_string_lines(source) == {4, 5, 6, 8}
    assert python_string_lines('s = """never closed\nclass A:\n') == {2, 3}


def test_a_definition_comes_first_and_one_no_ranking_found_is_still_retrieved():
    chunks = [chunk(i, f"use {i}") for i in range(6)]
    dense, lexical = [(1, 0.9), (2, 0.8), (3, 0.7)], [(1, 5.0), (3, 4.0), (4, 2.0), (0, 1.0)]
    assert [h.chunk.ordinal for h in _fuse(chunks, dense, lexical, 3)] == [1, 2, 3]
    assert [h.chunk.ordinal for h in _fuse(chunks, dense, lexical, 3, defining={4})] == [4, 1, 2]
    found = _fuse(chunks, dense, lexical, 3, defining={5})  # in neither ranking
    assert 5 in [h.chunk.ordinal for h in found] and found[1].score == DEFINITION_BONUS


def test_any_name_in_backticks_is_code():
    """Developers write names in backticks: click's `echo` (no capital, no underscore, no
    parentheses) got no definition bonus and its `def echo(` chunk came 7th."""
    assert code_names("Where is `echo` defined?") == {"echo"}
    assert code_names("What does `Text.from_markup()` do, and `io::Read`?") == {"Text", "from_markup", "Read"}
    assert code_names("Is `x` or `a.b` used?") == set()  # too short to mean anything


def test_definitions_in_c_sql_shell_and_more():
    texts = ["uint32_t crc32_compute(const uint8_t *buf,\n                       size_t n)\n{\n",
             "#define CRC_POLY 0xEDB88320\n", "CREATE TABLE IF NOT EXISTS public.orders (\n  id int\n);\n",
             "rollback_release() {\n  git reset --hard\n}\n", "var DefaultRetryPolicy = RetryPolicy{Max: 3}\n",
             "class Cart {\n  addItem(item: Item): void {\n    this.items.push(item)\n  }\n}\n",
             "    public static Map<String, List<Integer>> splitWords(String s) {\n",
             "std::vector<int> Parser::parse_all(const std::string& s) const {\n", "default_timeout = 30\n"]
    table = SymbolTable([chunk(i, t) for i, t in enumerate(texts)])
    names = ["crc32_compute", "CRC_POLY", "orders", "rollback_release", "DefaultRetryPolicy", "addItem",
             "splitWords", "parse_all", "default_timeout"]
    assert [table.defining({n}) for n in names] == [{i} for i in range(len(texts))]
    # calls, control flow and prose are no definitions
    uses = ["    if (ready) {\n", "    return compute(x);\n", "    raise ValueError(x)\n", "  result = compute(a, b)\n",
            "continue\n            push(stack_node)\n", "    describe('cart', () => {\n"]
    table = SymbolTable([chunk(i, t) for i, t in enumerate(uses)])
    assert table.defining({"ready", "compute", "ValueError", "push", "describe", "result"}) == set()


def test_cpp_classes_behind_export_macros_are_defined_by_their_names():
    """torch's headers declare `class TORCH_API Engine`: "where is Engine defined?" found
    no definition (TORCH_API was defined, in every header)."""
    texts = ["class TORCH_API Engine {\n public:\n", "struct C10_API alignas(16) Storage final {\n",
             "enum class DeviceType : int8_t {\n", "class [[nodiscard]] Result {\n"]
    table = SymbolTable([chunk(i, t) for i, t in enumerate(texts)])
    assert [table.defining({n}) for n in ("Engine", "Storage", "DeviceType", "Result")] == [{i} for i in range(4)]
    assert table.defining({"TORCH_API"}) == table.defining({"C10_API"}) == set()


def test_prose_is_read_for_class_and_def_only():
    """`Install click (pip install click)` in a README read as C's `type name(...)`."""
    readme = Chunk(doc_path="README.md", ordinal=0, text="Install click (pip install click)\n\nclass Shelf: ...\n",
                   span=Span("README.md", 1, 3), n_tokens=8)
    table = SymbolTable([readme])
    assert table.defining({"click"}) == set() and table.defining({"Shelf"}) == {0}


def test_names_in_other_alphabets_are_code_names_too():
    """Python, Java, Go and JavaScript take letters of any alphabet in names: `überprüfe_größe`
    and `計算する` were no names, so their definitions got no bonus."""
    assert code_names("Wo ist `überprüfe_größe` definiert?") == {"überprüfe_größe"}
    assert code_names("what does def 計算する return?") == {"計算する"}
    table = SymbolTable([chunk(0, "def überprüfe_größe(x):\n    return x\n"), chunk(1, "def 計算する(a):\n    pass\n"),
                         chunk(2, "y = überprüfe_größe(3)\n")])
    assert table.defining({"überprüfe_größe", "計算する"}) == {0, 1}
    assert code_names("`2fast` and `$el`") == {"$el"}  # a name starts with no digit
    assert code_names("Was macht überprüfe_größe?") == {"überprüfe_größe"}  # snake_case without backticks
    assert code_names("что делает проверить_размер()?") == {"проверить_размер"}


def test_a_question_about_a_names_callers_or_uses_is_told_apart():
    """"What calls `set_cell_size`?" got the definition and its neighbours: nothing asked
    for the chunks that call it."""
    assert used_names("What calls `set_cell_size`?") == {"set_cell_size"}
    assert used_names("Which functions call `make_str`?") == {"make_str"}
    assert used_names("Which functions call render_markup?") == {"render_markup"}
    assert used_names("Where is `make_str` called?") == {"make_str"}
    assert used_names("Who imports `ProgressBar`, and where is it used?") == {"ProgressBar"}
    assert used_names("What calls `Console.print`?") == {"print"}  # a method's calls, not every Console
    # a definition, a name that merely holds the cue, a name "called" so
    for question in ("Where is `make_str` defined?", "What does `call_later` do?",
                     "Where is the function called `make_str`?", "How do callers get help?"):
        assert used_names(question) == set(), question


def test_the_chunks_using_a_name_are_its_calls_and_imports_not_its_definition():
    texts = ["def make_str(value):\n    return str(value)\n", "    self.name = make_str(name)\n",
             "from .utils import make_str\n", "s = make_string(v)  # another name\n",
             "x = utils.make_str(v)\n", "def make_str(value):\n    pass\n"]
    table = SymbolTable([chunk(i, t) for i, t in enumerate(texts)])
    assert table.using({"make_str"}) == {1, 2, 4}
    # a chunk that defines the name and calls it too is a use
    recursive = SymbolTable([chunk(0, "def walk(node):\n    for child in node:\n        walk(child)\n")])
    assert recursive.using({"walk"}) == {0}


def test_the_uses_of_a_name_asked_about_come_after_its_definition_and_before_the_rest():
    """rich's call sites of set_cell_size were BM25's 3rd and 4th, but the fusion, led by the
    embedder, kept the definition's neighbours."""
    neighbours = [f"def set_cell_{what}(text, total):\n    # what calls set the cell size? set cell {what} calls\n"
                  f"    return size_of_cell(text, total)\n" for what in ("width", "height", "count", "span", "style")]
    texts = ["def set_cell_size(text, total):\n    # set the cell size\n    return text[:total]\n", *neighbours,
             "    for line in lines:\n        if len(line) > width:\n            line = set_cell_size(line, width)\n"
             "        new_lines.append(line)\n    return new_lines\n",
             "from .cells import cell_len, set_cell_size\nfrom .segment import Segment, Segments\nimport re\n"]
    chunks = [chunk(i, t) for i, t in enumerate(texts)]
    index = HybridIndex.build(chunks, embedder=HashEmbedder(), store=None)
    question = "What calls `set_cell_size`?"
    calls = {len(texts) - 2, len(texts) - 1}
    dense = index.dense.search(index.embedder.embed_query(question), len(chunks))
    lexical = index.lexical.search(question, len(chunks))
    before = [h.chunk.ordinal for h in _fuse(chunks, dense, lexical, 3, index.symbols.defining(code_names(question)))]
    assert before[0] == 0 and not calls <= set(before)  # (the fusion alone, for the record)
    hits = [h.chunk.ordinal for h in index.search(question, 3)]
    assert hits[0] == 0 and set(hits[1:]) == calls
    fused = _fuse(chunks, dense, lexical, len(chunks), {0}, using=calls | {0})
    assert fused[0].score >= DEFINITION_BONUS + USE_BONUS and fused[2].score >= USE_BONUS >= fused[3].score
