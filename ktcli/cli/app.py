"""The Typer app. Each command parses, calls one pipeline function, renders; nothing else.

Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 input error, 130 interrupted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

# Quiet the libraries before they are imported: no hub calls, no tqdm bars on our stderr.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ktcli.cli.common import Options, fail, run_guarded  # noqa: E402

app = typer.Typer(
    name="ktcli",
    help="Ask questions about, and summarize, documents and repos far longer than a model's window.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
)

Paths = Annotated[list[str], typer.Argument(help="Files, folders, or - for stdin.", show_default=False)]
Model = Annotated[Optional[str], typer.Option("--model", help="smollm2 (bundled), a .gguf file, a HF folder or cached repo id.")]
Engine = Annotated[Optional[str], typer.Option("--engine", help="ktcli (our engine) or hf (transformers).")]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", help="auto, full or retrieval.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (answer, citations, plan, figures, skipped).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or figures on stderr.")]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="Chunks retrieved for a question.")]
MaxNew = Annotated[Optional[int], typer.Option("--max-new-tokens", help="Longest answer, in tokens.")]
ChunkTokens = Annotated[Optional[int], typer.Option("--chunk-tokens", help="Chunk size for retrieval.")]
MaxFile = Annotated[Optional[int], typer.Option("--max-file-bytes", help="Folder walks skip larger files (reported).")]
CacheDir = Annotated[Optional[str], typer.Option("--cache-dir", help="Where converted models and indexes live.")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (0: default).")]
Weights = Annotated[Optional[str], typer.Option("--weights", help="Weight dtype: fp32 or bf16.")]
MaxMemory = Annotated[Optional[str], typer.Option("--max-memory", help="Memory budget, e.g. 4GB.")]
MaxSeconds = Annotated[Optional[float], typer.Option("--max-seconds", help="Latency budget the planner aims for.")]
Temperature = Annotated[Optional[float], typer.Option("--temperature", help="0 for greedy.")]


@app.command()
def ask(
    paths: Paths,
    question: Annotated[str, typer.Argument(help="The question.", show_default=False)],
    model: Model = None, engine: Engine = None, mode: ModeOpt = None, json: Json = False, quiet: Quiet = False,
    top_k: TopK = None, max_new_tokens: MaxNew = None, chunk_tokens: ChunkTokens = None,
    max_file_bytes: MaxFile = None, cache_dir: CacheDir = None, threads: Threads = None, weights: Weights = None,
    max_memory: MaxMemory = None, max_seconds: MaxSeconds = None, temperature: Temperature = None,
) -> None:
    """Answer QUESTION about PATHS, with citations."""
    opts = Options(locals())
    run_guarded(opts, lambda: opts.run_ask(paths, question))


@app.command()
def summarize(
    paths: Paths,
    model: Model = None, engine: Engine = None, mode: ModeOpt = None, json: Json = False, quiet: Quiet = False,
    max_new_tokens: MaxNew = None, chunk_tokens: ChunkTokens = None, max_file_bytes: MaxFile = None,
    cache_dir: CacheDir = None, threads: Threads = None, weights: Weights = None, max_memory: MaxMemory = None,
    max_seconds: MaxSeconds = None, temperature: Temperature = None,
) -> None:
    """Summarize PATHS (a document, a folder or a repo)."""
    opts = Options(locals())
    run_guarded(opts, lambda: opts.run_summarize(paths))


@app.command()
def plan(
    args: Annotated[list[str], typer.Argument(help="PATHS... [QUESTION]", show_default=False)],
    model: Model = None, engine: Engine = None, mode: ModeOpt = None, json: Json = False,
    top_k: TopK = None, max_new_tokens: MaxNew = None, chunk_tokens: ChunkTokens = None,
    max_file_bytes: MaxFile = None, cache_dir: CacheDir = None, max_memory: MaxMemory = None,
    max_seconds: MaxSeconds = None,
) -> None:
    """Dry run: show tokens, the chosen mode and its time and memory estimates. Runs no model."""
    opts = Options(locals())
    paths, question = split_plan_args(args)
    run_guarded(opts, lambda: opts.run_plan(paths, question))


def split_plan_args(args: list[str]) -> tuple[list[str], str]:
    """The last argument is the question when it is not an input (an existing path or -)."""
    if len(args) > 1 and args[-1] != "-" and not Path(args[-1]).exists():
        return args[:-1], args[-1]
    return args, ""


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        fail("interrupted", 130)


if __name__ == "__main__":
    main()
