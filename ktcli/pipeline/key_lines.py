"""Key lines: the sentences or table rows of the sources that best match the question,
quoted again between the sources and the question.

Why: a small model answers from what it read last. Given the sample report whole, the
bundled 135M model answered "Q3 revenue" with Q4's figure from the sentence after it, and
20 of 58 questions right on three documents; with the two best-matching lines repeated
right before the question, 39 (37-40 over the five layouts tried) (`python -m
benchmarks.qa_accuracy --baseline key-lines`).
A table row is quoted with its header's names ("Quarter: Q3 2023, Revenue ($M): 5.87"):
as a bare "Q3 2023 | 5.87 | 39.6%" the model had to find which figure is which in a
header it read far above.

Lines are ranked much as the retriever ranks chunks: BM25's best MAX_DENSE_LINES get a
dense score (the bundled embedder) plus their lexical one, each scaled to [0, 1] over
them. BM25 alone put "per share" first for "what share of electricity came from
renewable sources?"."""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ktcli.pipeline.citations import YEAR
from ktcli.retrieval.options import (OPTION_HEAD, OPTIONS_AND_ARGUMENTS, asked_options, entry_of, is_entry,
                                     options_alone, writes_option)
from ktcli.ingest.sections import ADORNMENT, ATX, FENCE, MARKDOWN_RULE, looks_like_a_table, row_cells

if TYPE_CHECKING:
    from ktcli.retrieval.embedder import TextEmbedder

KEY_LINES = 2  # 3 scored 30/58, 2 scored 34/58 (the third line was mostly a distractor)
LEXICAL_WEIGHT = 0.5
# Lines the embedder scores at most, the best by BM25: the sample report's 66 took 0.27 s
# here, 1,024 of the tutorial's 1,660 took 3.8 s (and 180 MB); a sparse read of a book
# would have tens of thousands.
MAX_DENSE_LINES = 256
MIN_CHARS = 12  # "Total | 412" and shorter carry no fact a question finds
MAX_CHARS = 400  # a quote, not a page: a run-on paragraph with no full stop is cut at a word

# A sentence ends at . ! ? before a space and a capital, digit or quote ("e.g. the" and
# "$5.87 million" stay whole), but not after a common abbreviation ("vs. Q2", "Fig. 3"),
# and at a CJK stop, which no space follows.
_SENTENCE_END = re.compile(
    r"(?<=[.!?])" + "".join(rf"(?<!\b{re.escape(a)})" for a in (
        "vs.", "Vs.", "No.", "no.", "Fig.", "fig.", "Figs.", "Dr.", "Mr.", "Mrs.", "Ms.", "St.", "al.", "approx.",
        "e.g.", "i.e.", "cf.", "Eq.", "eq.", "p.", "pp.", "Inc.", "Ltd.", "Co.", "U.S.", "Sec.", "Art.", "ca.",
        "Prof.", "Jr.", "Sr.", "Mt.", "Dept.", "Corp.", "Gen.", "Gov.", "Rev.", "Vol.", "vol.", "Ch.", "ch.", "Jan.",
        "Feb.", "Mar.", "Apr.", "Jun.", "Jul.", "Aug.", "Sep.", "Sept.", "Oct.", "Nov.", "Dec."))
    # nor after an initial ("J. R. Smith") or a step's number ("1. Hold the button")
    + r"(?<!\b[A-Z]\.)(?<!^\d\.)(?<!^\d\d\.)\s+(?=[A-Z0-9\"'(“‘])|(?<=[。！？])")
_LIST_ITEM = re.compile(r"\s*(?:[-*•]|\d{1,3}[.)])\s+")
_BULLET = re.compile(r"^[-*•]\s+")
# a figure, not a column's name: "5.87", "61,200", "40.9%", "$4.6", "1.2 kg"; a year is a
# name ("2023")
_FIGURE = re.compile(r"[-+−]?[$£€¥]?\d[\d,.]*\s*(?:%|[^\W\d_]{1,5}\.?)?")
# reStructuredText: a directive (".. method:: list.append(x)") and its options (":noindex:";
# a role opening a sentence, ":keyword:`pass`", is prose)
_DIRECTIVE = re.compile(r"\.\. ([\w:-]+)::(.*)")
# directives whose body is code or an index, not prose (".. code-block:: bash")
_NO_PROSE_DIRECTIVES = frozenset({"code-block", "code", "sourcecode", "testcode", "testoutput", "doctest",
                                  "parsed-literal", "math", "productionlist", "literalinclude", "raw", "index",
                                  "toctree"})
_OPTION = re.compile(r":[\w-]+:(?:\s|$)")
# a sentence that leans on the one before it
_ANAPHOR = re.compile(r"(?:It|Its|This|These|They|Their|That|Those|Such|He|She|His|Her|Both|Each)\b")
# A PDF's headings are lines like any other: a short line in title case, with no stop at
# its end, before a line that starts a sentence ("Financial Results by Quarter"), is one.
_TITLE_MAX_CHARS = 40
_TITLE_WORD = re.compile(r"[^\W\d_]{4,}")
_SECTION_NUMBER = re.compile(r"(?:\d{1,3}(?:\.\d{1,3})*[.)]?|[A-Z][.)])\s+")  # "2.1 ", "3. ", "B) "
# A line that is a field and its value ("Owner: Tomas Berg", "Date: Tuesday, 14 May 2024"),
# as in a memo's or a form's head: a fact of its own, neither a heading nor part of the
# sentence on the next line.
_FIELD = re.compile(r"[^\W\d_][\w'’&/().-]*(?: [\w'’&/().-]+){0,3}: \S")
_FIELD_MAX_CHARS = 120
# A prose unit of at most this many words, no figure and no stop at its end is a heading or
# a label ("Vendor selection", "Meals and Per Diem"), not a statement a question's answer is in.
_LABEL_MAX_WORDS = 4
_STOPS = (".", "!", "?", "。", "！", "？", '."', ".”", ".)")


def quotes(kind: str) -> bool:
    """Whether a document of this kind gives key lines: code does not (a line of code out of
    its function answers little, and no benchmark here measured it)."""
    return kind != "code"


def lines_of(text: str, *, passage: bool = False) -> list[str]:
    """`text` as the units a question's answer sits in: prose as sentences (a PDF's lines
    run on, so lines join up to a blank line, a list item, a heading or a table), table
    rows as "column: cell" pairs under their header row, a CSV's or TSV's rows so too, and
    a memo's "Field: value" lines each as one. Headings and labels are no unit ("Vendor
    selection"). Code is no unit: fenced or indented blocks, literal blocks (after a "::"
    line), code directives' bodies and doctest lines are passed over. Out of its context a
    sentence can mislead, so a sentence that opens with a pronoun ("It can be used when a
    statement is required syntactically") comes with the one before it, one in the body of
    a reStructuredText directive (".. method:: list.append(x)") under what the directive
    names. A `passage` (retrieved from a longer text) that starts mid-sentence loses that
    part sentence; a whole text that starts in lower case ("iPhone 15 ships ...") keeps it."""
    lines = text.splitlines()
    if looks_like_a_table(lines):
        return _delimited_rows(lines)
    out: list[str] = []
    prose: list[str] = []
    rows: list[list[str]] = []  # the table being read, a row of cells each
    ruled = False  # its header row is underlined (Markdown)
    literal: int | None = None  # the indentation of the line whose code block is being passed over
    fenced = False
    after_blank = True  # the line before was blank (or there was none)
    in_list = False  # the paragraph being read is a list item (its indented lines continue it)
    subject, directive_indent = "", None  # the directive whose body is being read (None: none)
    opened_mid_sentence = passage and bool(text.lstrip()[:1].islower())
    # the indentation of the last line read before this one (None: none yet), not a code block's
    last_indent: int | None = None
    prose_indent = 0  # the indentation of the paragraph's first line
    held: int | None = None  # the indentation of an option's line whose text comes after a blank line

    def end_paragraph() -> None:
        nonlocal opened_mid_sentence
        if prose:
            units = _sentences(" ".join(prose), subject)
            if opened_mid_sentence:
                units = units[1:]
            # (an option's short entry is no label: "-V, --version  output version information",
            # "--debug  annotate program execution" were dropped; probe 132)
            out.extend(u for u in units
                       if is_entry(u) or not _is_label(u.removeprefix(f"{subject}: ") if subject else u))
            prose.clear()
        opened_mid_sentence = False

    def end_table() -> None:
        nonlocal ruled
        if rows:
            out.extend(_table_rows(rows, ruled))
            rows.clear()
        ruled = False

    for k, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        was_after_blank, after_blank = after_blank, not stripped
        if FENCE.match(stripped):
            end_paragraph()
            end_table()
            fenced = not fenced
            continue
        if fenced:
            continue
        if literal is not None:
            if not stripped or indent > literal:
                continue
            literal = None
        if directive_indent is not None and stripped and indent <= directive_indent:
            end_paragraph()
            subject, directive_indent = "", None
        if (directive := _DIRECTIVE.match(stripped)) is not None:
            end_paragraph()
            end_table()
            if directive.group(1) in _NO_PROSE_DIRECTIVES:
                literal = indent
            else:
                subject, directive_indent = directive.group(2).strip(), indent
            continue
        continues_entry = False
        if held is not None and stripped:
            continues_entry = indent > held
            if not continues_entry:
                end_paragraph()
            held = None
        if last_indent is None and is_entry(line):
            # a passage of a man page that opens with an option's entry ("       -o, --output
            # <file>"): its margin
            last_indent = indent
        read_indent, last_indent = (last_indent or 0), (indent if stripped else last_indent)
        if (stripped and indent >= read_indent + 4 and was_after_blank and directive_indent is None and not in_list
                and not rows and not continues_entry):
            # A Markdown code block: indented four spaces after a blank line, deeper than the
            # text before it. A man page indents all its text seven (its option entries, over
            # their text at fourteen): `man rm | ktcli ask - "what does -f do?"` read all of
            # it as code, quoted nothing, and the bundled model answered from the page's
            # first lines (probe 132).
            end_paragraph()
            literal = indent - 1
            continue
        if rows and stripped[:1] in ("|", "-", ":") and MARKDOWN_RULE.fullmatch(stripped):
            ruled = ruled or len(rows) == 1
            continue
        cells = row_cells(stripped)
        if len(cells) >= 2:
            end_paragraph()
            rows.append(cells)
            continue
        end_table()
        if ADORNMENT.match(stripped):  # a reStructuredText title's underline
            if len(prose) == 1:
                prose.clear()  # a reStructuredText title: a heading, no sentence
            end_paragraph()
            continue
        if _is_field(stripped, prose, lines[k + 1].strip() if k + 1 < len(lines) else ""):
            end_paragraph()
            out.append(stripped)
            continue
        if not stripped and held is None and len(prose) == 1 and options_alone(prose[0]):
            # sed's "-i[SUFFIX], --in-place[=SUFFIX]", a blank line, then what it does, indented
            # deeper: that text is the entry's, not a code block (probe 132)
            held = prose_indent
            continue
        if not stripped or ATX.match(stripped) or _OPTION.match(stripped) or _is_title(stripped, lines, k):
            end_paragraph()
            continue
        if stripped.startswith((">>>", "... ")) or stripped == "...":
            end_paragraph()
            continue
        if _LIST_ITEM.match(stripped):
            end_paragraph()
            in_list = True
        elif prose and is_entry(line) and not (indent > prose_indent and indent == read_indent):
            # a --help text's next option ("  -v, --invert-match   select non-matching lines"),
            # its entries with no blank line between them: ls --help read as one paragraph,
            # quoted whole as the key fact of "what does -S do?" (probe 129). Not a line of an
            # entry's text, indented as the line before it, that a justified man page starts
            # with an option ("              -print  uses).   This allows": find's -print0's
            # entry was cut there; probe 132).
            end_paragraph()
        elif indent == 0 and was_after_blank:
            in_list = False
        if not prose:
            prose_indent = indent
        prose.append(_BULLET.sub("", stripped, count=1))  # a numbered step keeps its number
        if len(prose) == 1 and options_alone(line):
            # a man page's option line over what it does: two spaces part them, as a --help
            # text's column does ("-p port  Port to connect to"), so that `_as_said` can tell
            # the option's argument from its text
            prose[-1] += " "
        if stripped.endswith("::"):
            # "the list methods::" reads "the list methods:", "as follows. ::" "as follows."
            said = prose[-1][:-2].rstrip()
            prose[-1] = said if said.endswith((".", "!", "?")) else said + ":"
            end_paragraph()
            literal = indent
    end_paragraph()
    end_table()
    return [_short(u.strip()) for u in out if _width(u.strip()) >= MIN_CHARS]


def _is_field(line: str, prose: list[str], after: str) -> bool:
    """A "Field: value" line of a memo's or form's head: not a sentence's next line, nor one
    that runs on into the next ("Note the last block: the ``_`` acts as a wildcard and"),
    nor a heading over its paragraph ("Item 1: Budget review" over "Marco reported that
    spending ...") or over its underline ("Intermezzo: Coding Style")."""
    if len(line) > _FIELD_MAX_CHARS or _FIELD.match(line) is None:
        return False
    if prose and not prose[-1].endswith(_STOPS + (":",)):
        return False
    if not after or (_FIELD.match(after) is not None and len(after) <= _FIELD_MAX_CHARS) or _LIST_ITEM.match(after):
        return True
    if ADORNMENT.match(after):
        return False
    if after[:1].islower():
        return line.endswith(_STOPS)
    return not (len(after) > _FIELD_MAX_CHARS or (len(after.split()) >= 6 and after.endswith(_STOPS)))


def _is_label(unit: str) -> bool:
    """A heading or a label left among the sentences: a few words with no figure and no
    stop at their end ("Vendor selection", "2. Meals and Per Diem"), or a short line in
    capitals ("NORTHWIND LOGISTICS LTD.")."""
    bare, _number = _numbered(unit)
    words = bare.split()
    if len(words) <= 6 and bare.upper() == bare and any(c.isupper() for c in bare):  # CJK has no capitals
        return True
    return (len(words) <= _LABEL_MAX_WORDS and _width(bare) <= _TITLE_MAX_CHARS and not bare.endswith(_STOPS)
            and not any(c.isdigit() for c in bare))


def _width(unit: str) -> int:
    """Characters, a CJK one counting two (as a line's length is counted elsewhere): "本社は港町にある。"
    holds as much as a dozen Latin letters."""
    return len(unit) + sum(ord(c) >= 0x2E80 for c in unit)


def _sentences(paragraph: str, subject: str) -> list[str]:
    said = _SENTENCE_END.split(paragraph)
    units = [f"{before} {sentence}" if k and _ANAPHOR.match(sentence) else sentence
             for k, (before, sentence) in enumerate(zip([""] + said, said))]
    return [f"{subject}: {unit}" for unit in units] if subject else units


def _numbered(line: str) -> tuple[str, str]:
    """`line` less the section or item number it opens with ("2.1 ", "3. ", "B) "), and that
    number ("" for none)."""
    number = _SECTION_NUMBER.match(line)
    return (line[number.end():], number.group()) if number else (line, "")


def _is_title(line: str, lines: list[str], k: int) -> bool:
    """A heading written as a plain line: short, in title case or under a section number
    ("3.1 Air travel"), no stop at its end, and the next line starts a sentence."""
    if len(line) > _TITLE_MAX_CHARS or line[-1] in ".!?:;,)":
        return False
    line, number = _numbered(line)
    # a figure ("Version 4.2, effective 1 March 2024") is a fact's; a field over a sentence
    # ("Item 1: Budget review") is a heading (`_is_field` took those over fields and blanks)
    if not line[:1].isupper() or re.search(r"\d[.,]\d|, \d", line):
        return False
    words = _TITLE_WORD.findall(line)
    # "2.1 Who is covered" is a heading in any case; "1. Open the settings", a step
    subsection = "." in number.strip().rstrip(".)")
    if not subsection and (not words or sum(w[0].isupper() for w in words) * 2 < len(words)):
        return False
    after = lines[k + 1].strip() if k + 1 < len(lines) else ""
    return not after or after[0].isupper() or after[0].isdigit() or _LIST_ITEM.match(after) is not None


def _table_rows(rows: list[list[str]], ruled: bool) -> list[str]:
    """A table's rows as units. Its first row names the columns where a rule underlines it,
    or where it holds no figure and a row below does ("Department | Employees" over
    "Glass studio | 118"); else ("Capital | Paris" over "Currency | Euro") every row is
    read as written. A row with fewer cells (a reader leaves empty cells at a row's end
    out) fills the first columns; one alone is prose with a bar in it."""
    if len(rows) == 1:
        return [" | ".join(rows[0])]
    header = rows[0] if ruled or (_is_header(rows[0]) and any(_has_figure(r) for r in rows[1:])) else None
    if header is None:
        return [" | ".join(r) for r in rows]
    return [_row(header, r) for r in rows[1:]]


def _has_figure(cells: list[str]) -> bool:
    return any(_FIGURE.fullmatch(c) for c in cells)


def _delimited_rows(lines: list[str]) -> list[str]:
    """A CSV's or TSV's rows as "column: value" pairs under its first row."""
    head = next(line for line in lines if line.strip())
    try:
        rows = list(csv.reader((line for line in lines if line.strip()), delimiter="\t" if "\t" in head else ","))
    except csv.Error:  # a field past the csv module's limit (128 KB): no rows to point at
        return []
    header = [name.strip() for name in rows[0]]
    return [_short(_row(header, [c.strip() for c in r])) for r in rows[1:] if any(c.strip() for c in r)]


def _is_header(cells: list[str]) -> bool:
    """A table's first row names its columns unless it holds figures (a headerless table of
    "Weight | 1.2 kg" rows); years name columns ("Item | 2023 | 2022")."""
    return not any(_FIGURE.fullmatch(c) and not YEAR.fullmatch(c) for c in cells)


def _row(header: list[str], cells: list[str]) -> str:
    if len(cells) > len(header):
        return " | ".join(cells)
    return ", ".join(f"{name}: {cell}" if name else cell for name, cell in zip(header, cells) if cell)


def _short(unit: str) -> str:
    if len(unit) <= MAX_CHARS:
        return unit
    cut = unit.rfind(" ", 0, MAX_CHARS)
    return unit[: cut if cut > MAX_CHARS // 2 else MAX_CHARS] + " ..."


def pick(question: str, sources: Sequence[tuple[int, str]], embedder: TextEmbedder | None,
         k: int = KEY_LINES, *, passages: bool = False) -> list[tuple[int, str]]:
    """The `k` lines of `sources` ((label, text) pairs) that best match `question`, best
    first, each with its source's label; ranked by BM25 alone where `embedder` is None.
    `passages`: the sources are passages retrieved from longer texts (`lines_of`)."""
    from ktcli.retrieval.lexical import BM25Index
    from ktcli.retrieval.symbols import code_names

    seen: set[str] = set()
    candidates: list[tuple[int, str]] = []
    for label, text in sources:
        for unit in lines_of(text, passage=passages):
            if unit not in seen:
                seen.add(unit)
                candidates.append((label, unit))
    names = {name.lower() for name in code_names(question)}
    if names:
        # A question about named code (`save_catalogue`, "the render function") is answered
        # where that name stands: a repo's README line sharing an everyday word of it
        # ("catalogue") was quoted before "What does save_catalogue do?" (probe 94).
        candidates = [c for c in candidates if any(name in c[1].lower() for name in names)]
    options = asked_options(question)
    naming: list[tuple[int, str]] = []
    if options:
        # "What does -S do?": BM25 reads "-S" as the letter "s", as it reads "-s" and every
        # "'s", and ls's "-k ... used only with -s" was quoted, not "-S  sort by file size"
        # (probe 125). The lines that write an asked option as written are the only ones
        # that can say what it does; those that open with it, its own entry, go first.
        naming = [c for c in candidates if any(writes_option(c[1], o) for o in options)]
        # Where the option's own entry is found, it alone is quoted: beside it, ls's
        # "--sort=WORD sort by WORD instead of name: none (-U), size (-S), time (-t)" was
        # quoted for "what does -S do?", and the bundled model answered "--sort=WORD sort by
        # file size" and "-S sort by file size, newest first" (probe 129).
        entries = [c for c in naming if any(entry_of(c[1], o) for o in options)]
        candidates = entries or naming or candidates
        asks_more = content_terms(_OPTION_WORDS.sub(" ", question))
        if entries and not asks_more:
            # "What does -print0 do?" says nothing but the option, and no ranking can tell its
            # entries apart: find's page has two, and "-print0, -fprint0  Always print the
            # exact filename" (under UNUSUAL FILENAMES) was ranked over its own in the option
            # list ("-print0  True; print the full file name ... followed by a null
            # character"; probe 132). The first the page gives is the option list's.
            # Its first alone: quoted after it, the later one came last, and the bundled model
            # answered "The option -print0, -fprint0," and stopped (probe 132).
            return entries[:1]
    if not candidates:
        return []
    index = BM25Index(u for _, u in candidates)
    lexical = index.scores(question)
    if not naming and (not lexical.max() > 0 or not index.scores(" ".join(content_terms(question))).max() > 0):
        # No word of the question anywhere (asked in another language than the text's), or
        # only its function words ("is", "the", "what"): nothing to point at. A repo's one
        # prose line (its README's first sentence) shares "is" with any question about its
        # code, and was quoted before "What is the maximum late fee?", "Where is late_fee
        # defined?": the bundled model answered with that sentence each time. (A line that
        # writes an asked option matches it whatever the words: "what does -a do?" is all
        # function words, "a" among them, and quoted nothing; probe 129.)
        return []
    shortlist = np.argsort(-lexical, kind="stable")[:MAX_DENSE_LINES]
    score = _scaled(lexical[shortlist])
    if embedder is not None:
        dense = embedder.embed_lines([candidates[i][1] for i in shortlist]) @ embedder.embed_query(question)
        score = _scaled(dense) + LEXICAL_WEIGHT * score
    picked: list[tuple[int, str]] = []
    for i in np.argsort(-score, kind="stable"):
        text = candidates[shortlist[i]][1]
        # a sentence and the same with the one before it (`_sentences`) say one thing
        if not any(text in other or other in text for _, other in picked):
            picked.append(candidates[shortlist[i]])
        if len(picked) == k:
            break
    return picked


_OPTION_WORDS = re.compile(r"(?<![\w-])--?[\w][\w-]*")

# English words that carry no topic of their own: a line sharing only these with the
# question matches it in nothing.
_FUNCTION_WORDS = frozenset("""
a an the is are was were be been being am do does did done has have had having of in on at to for from by
with without about as into onto over under than then and or but nor not no so if it its this that these those
there here what which who whom whose when where why how i you he she we they me him her us them my your our their
can could will would shall should may might must any some all each every also just only very more most
""".split())


def content_terms(question: str) -> list[str]:
    """The question's words that carry a topic (`_FUNCTION_WORDS` left out)."""
    from ktcli.retrieval.lexical import tokenize

    return [t for t in tokenize(question) if t not in _FUNCTION_WORDS]


def _scaled(scores: np.ndarray) -> np.ndarray:
    """Scores to [0, 1] over the candidates; all equal: all 1 (no ranking says more)."""
    low, high = float(scores.min()), float(scores.max())
    return (scores - low) / (high - low) if high > low else np.ones_like(scores)


def block(lines: Sequence[tuple[int, str]]) -> str:
    """The key lines as the prompt shows them, `lines` best first: one a line, ending with
    its source's label, the best last. Last, right before the question: the bundled model
    copies the figure it read most recently ("Q3 revenue was $5.83 million", Q4's, from the
    line after Q3's)."""
    return "\n".join(f"{_as_said(text)} [{label}]" for label, text in reversed(lines))


def _as_said(unit: str) -> str:
    """A command-line option's entry as a sentence: "The option -S means: sort by file size,
    largest first". Quoted as the page writes it, a line opening with "-S" or "-r,
    --reverse", the bundled model took the key facts for more of the option list: asked
    "what does -w do?" of ten man pages, it wrote "wc -l -max-line-length -w -l -l ...",
    "head - -n 1 -f -v ..." or "The GNU coreutils package provides ...": 6 of 22 questions
    right with the option's own entry among the key facts, 21 with it said so (16 in full,
    the rest in part; probe 125)."""
    parted = OPTIONS_AND_ARGUMENTS.match(unit)
    if parted is not None and OPTION_HEAD.match(unit + " ") is not None:
        # "The option -p port means: Port to connect to ...", not "The option -p means: port
        # Port to connect to ..." (the argument's name read as the text's first word; probe 132)
        # (a man page's justified text, "a null  character  instead", read as written)
        said = re.sub(r"\s{2,}", " ", parted.group(2).strip())
        return f"The option {parted.group(1)} means: {said}"
    head = OPTION_HEAD.match(unit + " ")
    if head is None or head.end() >= len(unit):
        return unit
    # "The option -S means: sort by ...", not "The option -S  sort by ...": on 32 questions
    # over man pages and --help texts the bundled model answered 29 right against 21, none
    # fewer (it copied what the option means; "-S: sort by" scored 7, "What -S does: sort
    # by" 22: the set it was chosen on); on 12 written after, 8 against 7 (2 more right, and
    # cat's -n answered with -b's entry; probe 129). A --help text pads its options to a
    # column: "-S                         sort by file size".
    options = unit[: head.end()].strip().rstrip(",")
    return f"The option {options} means: {re.sub(r' {3,}', '  ', unit[head.end():]).strip()}"
