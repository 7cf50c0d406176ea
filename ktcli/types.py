"""Immutable records handed from stage to stage: sources -> Corpus -> Plan -> Answer.

No stage reaches back: ingest builds Documents and Chunks, plan builds a Plan, the
pipeline builds an Answer, render prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Mode(str, Enum):
    FULL = "full"  # the whole input fits the window
    SPARSE = "sparse"  # whole input in the paged, quantized cache with sparse attention
    RETRIEVAL = "retrieval"  # chunks + hybrid retrieval + memory passing


# What a document's pages or lines are, where they are not a file's lines or a PDF's pages
# (`Document.unit`, `Span.unit`): an EPUB's "pages" are its chapters (`book.epub ch.3`),
# and the lines of a word processor's document that records no pages are cited by the
# paragraph (`notes.docx ¶12`): there is no file whose line 12 a reader could open.
CHAPTER = "chapter"
PARAGRAPH = "paragraph"


@dataclass(frozen=True)
class Span:
    """Where a piece of text comes from: 1-based inclusive lines, or a PDF page."""

    path: str
    line_start: int | None = None
    line_end: int | None = None
    page: int | None = None
    unit: str = ""  # "" (lines, or a page), CHAPTER (`page` is a chapter) or PARAGRAPH (lines are ¶s)
    page_label: str | None = None  # the page's printed number where it is not its index ("iv", "217")
    # A piece of one line too long for a chunk: its characters in the line, [start, end),
    # 0-based. A 31 KB Chinese text with no line break was cited ":1" by all 8 passages.
    chars: tuple[int, int] | None = None

    @property
    def kind(self) -> str | None:
        """What the numbers count, for --json readers: "page", "chapter", "paragraph" or
        "line"; None for a whole file (a chapter's number sat in `page`, a ¶ in the lines,
        with nothing to tell them apart)."""
        if self.page is not None:
            return CHAPTER if self.unit == CHAPTER else "page"
        if self.line_start is not None:
            return PARAGRAPH if self.unit == PARAGRAPH else "line"
        return None

    def cite(self) -> str:
        if self.page is not None:
            return f"{self.path} {'ch.' if self.unit == CHAPTER else 'p.'}{self.page}"
        if self.line_start is not None:
            at = f"{self.path} ¶" if self.unit == PARAGRAPH else f"{self.path}:"
            if self.line_end is None or self.line_end == self.line_start:
                piece = f" (chars {self.chars[0] + 1:,}-{self.chars[1]:,})" if self.chars else ""
                return f"{at}{self.line_start}{piece}"
            return f"{at}{self.line_start}-{self.line_end}"
        return self.path


@dataclass(frozen=True)
class Page:
    """One PDF page (or the whole text of a non-paged document as page None); a Word or
    OpenDocument page where the file records its layout, an EPUB's chapter."""

    number: int | None
    text: str
    line_offset: int = 0  # lines of the document before this page
    label: str | None = None  # the number printed on it, where the PDF says it is not `number` ("iv")
    section: str = ""  # a PDF's section trail at the page's top ("Part II > Tides")
    # a PDF's headings on this page: (its line in the page, 0-based; the trail it starts)
    headings: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class Document:
    """One loaded source. `text` is normalised (\\n line ends, no NULs). For PDFs the text
    is the pages joined by '\\n' and `pages` records where each starts."""

    path: str  # as shown to the user (relative to the folder given, or "<stdin>")
    text: str
    kind: str  # "text", "markdown", "code", "pdf", "html", "stdin", "docx", "odt", "epub"
    language: str | None = None  # for code: "python", "rust", ...
    pages: tuple[Page, ...] = ()
    sha256: str = ""  # of the normalised text; the cache key
    # Where `text` is drawn from a file with other lines (HTML): the file's line (1-based)
    # of each text line. Spans count text lines; citations are mapped to these at the end.
    source_lines: tuple[int, ...] = ()
    # Parts that could not be read (a PDF page whose content is damaged), reported with
    # the files a walk skipped.
    left_out: tuple["Skipped", ...] = ()
    # How its pages or lines are cited (Span.unit): CHAPTER, PARAGRAPH, or "" as they are.
    unit: str = ""

    @property
    def n_lines(self) -> int:
        return self.text.count("\n") + (0 if self.text.endswith("\n") or not self.text else 1)


@dataclass(frozen=True)
class Skipped:
    """A file left out of a folder walk, and why (reported, never silent)."""

    path: str
    reason: str  # "gitignored", "binary", "too large (12.3 MB > 2 MB)", "symlink outside", ...
    replaced: bool = False  # the input was read, with what `reason` says (bytes replaced, an encoding guessed)
    part: bool = False  # the file was read; only what `reason` names was left out (a notebook's images)


@dataclass(frozen=True)
class Corpus:
    documents: tuple[Document, ...]
    skipped: tuple[Skipped, ...] = ()

    @property
    def text_chars(self) -> int:
        return sum(len(d.text) for d in self.documents)


SECTION_SEPARATOR = " > "  # between the levels of a section trail (Chunk.section, Citation.section)
# The deepest section trail kept: below that, titles say little the last ones do not.
SECTION_MAX_DEPTH = 4
# C++'s export macros and attributes between `class` / `struct` and the name, as a regex
# (`ingest.sections`' trails, `retrieval.symbols`' definitions): torch's `class TORCH_API
# Engine` was the section "class TORCH_API" of every class in its headers, and defined
# TORCH_API, not Engine.
DECLARATION_ATTRIBUTES = (r"(?:(?:[A-Z][A-Z0-9]*_[A-Z0-9_]*|[A-Z][A-Z0-9]*(?:API|EXPORT))\s+(?=[^\W\d])"
                          r"|(?:__declspec|alignas)\s*\([^()\n]*\)\s*|__attribute__\s*\(\([^()\n]*\)\)\s*"
                          r"|\[\[[^\]\n]*\]\]\s*)*")
TABLE_TRAIL = "columns: "  # a CSV's or TSV's trail: its header row after this


@dataclass(frozen=True)
class Chunk:
    """A token-aware piece of one document that never cuts a line."""

    doc_path: str
    ordinal: int  # position of the chunk within its document
    text: str
    span: Span
    n_tokens: int  # tiktoken estimate
    doc_sha256: str = ""
    # Headings (prose) or enclosing definitions (code) above the chunk's first line,
    # "Classes > Class Objects"; "" where there are none (PDFs). See ingest.sections.
    section: str = ""
    # A piece of a line too long for one chunk: the character in that line it starts at
    # (pieces share an overlap; `pipeline.windows` joins them without it).
    char_start: int = 0
    # Headings and blank lines only (prose): what is left of a section whose first paragraph
    # is too long to share a chunk. Retrieval ranks it after every chunk with text.
    heading_only: bool = False

    @property
    def chunk_id(self) -> str:
        return f"{self.doc_sha256[:16]}:{self.ordinal}"


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know about a model, without loading it."""

    name: str
    context_window: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_params: int
    weight_bytes: int
    kv_dtype: str = "fp32"  # the dtype of the engine's dense KV pages for this model
    hidden_size: int = 0  # widths for the activations' memory (0: unknown, none counted)
    intermediate_size: int = 0
    host_bytes: int = 0  # the process around the model where the budget is RAM (plan.estimates)
    sliding_window: bool = False  # some layers attend to a window only: no paged (sparse/quantized) KV for it
    model_type: str = "llama"  # config.json's: the ktcli engine runs llama, mistral, qwen2 and qwen3
    quantized: str = ""  # config.json's quantization method (fp8, gptq, awq...): not for the ktcli engine
    max_position: int = 0  # the trained window, before the config's RoPE scaling (0: context_window)
    n_heads: int = 0  # query heads (0: unknown; hidden_size / head_dim then), for attention's share of a step
    vocab_size: int = 0  # (0: unknown) the embedding rows, which a prefill step does not multiply
    # The weight files' tensor bytes as a load reads them (a bf16 release's: 2 a parameter;
    # a converted GGUF's: 4; 0: unknown, fp32 taken) and their dtype ("fp32", "bf16",
    # "fp16"; "" unknown or mixed). A load in another dtype holds them mapped beside its
    # own copy through the cast.
    source_bytes: int = 0
    source_dtype: str = ""
    # A GGUF ktcli's own converter takes (`engine.gguf_convert`): its largest tensor's
    # parameters, which bound the conversion's memory (one tensor at a time); 0 for a model
    # that is no such GGUF (transformers' loader converts a GGUF it does not take, whole).
    convert_largest_params: int = 0


@dataclass(frozen=True)
class Plan:
    mode: Mode
    task: str  # "ask" | "summarize"
    input_tokens: int  # estimate over the whole corpus
    question_tokens: int
    context_window: int
    answer_budget: int  # tokens reserved for the answer
    evidence_budget: int  # tokens of evidence per window
    n_documents: int
    n_chunks: int  # 0 when mode is full
    n_windows: int  # model calls with evidence (1 when full)
    top_k: int  # chunks retrieved (retrieval mode)
    est_seconds: float  # load included, with every token of the answer budget: an answer that stops early takes less
    est_memory_bytes: int
    kv_dtype: str = "model"
    attention: str = "dense"
    reasons: tuple[str, ...] = ()  # why this mode, in words, for `ktcli plan`
    alternatives: tuple[dict, ...] = ()  # estimates for the modes/dtypes not chosen
    # A summary that reads files as outlines: the tokens it reads (of
    # input_tokens) and how many files are outlined; 0 when it reads every line.
    read_tokens: int = 0
    outline_files: int = 0
    # A whole read whose prompt the engine will mostly read back from the prompt cache
    # (`engine.prefix_store`): those tokens, left out of est_seconds' prefill.
    cached_tokens: int = 0
    # Until the answer's first token shows: the model's load, the reading and prefill,
    # everything but the answer's own decoding. 0: not estimated.
    est_first_token_seconds: float = 0.0
    # Of the estimates, the seconds already spent reading the input before the plan
    # (measured, not estimated: `PlanRequest.read_s`).
    read_s: float = 0.0
    # Tokens a read in parts puts in the window at most, where its kernels' pages (allocated
    # whole) are sized to that, not to the window; 0: to context_window.
    kv_window: int = 0


@dataclass(frozen=True)
class Citation:
    ref: str  # "src/app.py:12-40" or "paper.pdf p.3"
    span: Span
    score: float | None = None
    section: str = ""  # the headings or definitions above the cited lines (ingest.sections)
    # The number of the source block the model read these lines in, which the answer's
    # own "[3]" refers to (0: none, as in a summary, whose windows each start at 1).
    label: int = 0
    # The one line whose words matched the answer's sentence (attribution), in the span's
    # numbering; `span` is it and a line either side. None where the entry stands for a
    # label the answer wrote, or a whole passage or document.
    line: int | None = None


@dataclass(frozen=True)
class FileMap:
    """What each file of a summary's input says it is, quoted from it (`pipeline.file_map`)."""

    entries: tuple[tuple[str, int, str], ...]  # (path, line, text), in input order
    folder: str = ""  # the folders every path starts with: the text's refs leave them out
    unlisted: int = 0  # files past the listed ones that say something too


@dataclass(frozen=True)
class Answer:
    text: str
    citations: tuple[Citation, ...]
    plan: Plan
    stats: dict = field(default_factory=dict)  # tokens in/out, ttft, tok/s, peak rss, ...
    skipped: tuple[Skipped, ...] = ()
    # A summary written document by document: (path, its summary) each, as `text` joins
    # them under "## path" headings (which a model's own "## Overview" made ambiguous).
    parts: tuple[tuple[str, str], ...] = ()
    files: FileMap | None = None  # a summary of several files: what each says it is
    # A question's: whether the documents seem not to hold its answer (`pipeline.grounding`),
    # and the measures it was judged by (None: not judged: a summary, code, no embedder).
    not_in_documents: bool = False
    grounding: dict | None = None
