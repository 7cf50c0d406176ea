"""The Typer app. Each command parses, calls one pipeline function, renders; nothing else.

Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 input error, 130 interrupted,
143 terminated (SIGTERM).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional


def _ended_while_starting(signum, frame) -> None:
    """SIGTERM or Ctrl-C before `_main` puts its own handler in (the imports take ~0.3 s):
    nothing has started, so said as a later one is (a line on stderr, --json's object on
    stdout) and ended at once, exit 143 or 130. SIGTERM's default action ended the process
    with neither; a Ctrl-C printed the traceback of the import it landed in (probe 124)."""
    said, code = ("terminated (SIGTERM)", 143) if signum == signal.SIGTERM else ("interrupted", 130)
    args = sys.argv[1:]
    args = args[: args.index("--")] if "--" in args else args
    try:
        if "--json" in args:
            os.write(1, b'{"error": "%s", "exit_code": %d}\n' % (said.encode(), code))
        os.write(2, b"error: %s\n" % said.encode())
    except OSError:
        pass
    os._exit(code)


def _run_as_ktcli() -> bool:
    """Whether this process is the command (`ktcli`, `python -m ktcli`), not a program that
    imports it (a test runner, whose own Ctrl-C is Python's)."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    return spec_name.split(".")[0] == "ktcli" or os.path.basename(getattr(main, "__file__", "") or "") == "ktcli"


if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # (not where it came ignored, or a host's own)
    signal.signal(signal.SIGTERM, _ended_while_starting)
if signal.getsignal(signal.SIGINT) is signal.default_int_handler and _run_as_ktcli():  # (likewise)
    signal.signal(signal.SIGINT, _ended_while_starting)

import typer  # noqa: E402

# Quiet the libraries before they are imported: no hub calls, no tqdm bars on our stderr.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads spin briefly, then sleep. A decode step runs a few parallel regions
# per layer, tens of microseconds apart: with OMP_WAIT_POLICY=PASSIVE every one of them
# woke the workers from sleep, and bf16 decode of SmolLM2 ran at 37 tok/s (512 tokens)
# instead of 54-60 with a bounded spin (2 cores, libgomp, the pip torch). Never spinning
# at all (ACTIVE) gains nothing more and keeps idle workers busy on a shared machine.
os.environ.setdefault("GOMP_SPINCOUNT", "100000")

from ktcli.cli.common import Options, fail, json_error, run_guarded  # noqa: E402
from ktcli.cli.help_style import plain_type_column  # noqa: E402
from ktcli.cli.stderr_guard import guard_stderr  # noqa: E402
from ktcli.config import EMBED_FOCUS_CHUNKS, EMBED_FOCUS_FROM, Settings  # noqa: E402
from ktcli.errors import interruption, note_terminated  # noqa: E402

plain_type_column()

# Flags default to None so a config file or KTCLI_* variable can set them; the help shows
# the built-in default those override.
_D = Settings()

app = typer.Typer(
    name="ktcli",
    help="Ask questions about, and summarize, documents and repos far longer than a model's window.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"ktcli {version('ktcli')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("ktcli (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version, metavar="",
                                          is_eager=True)] = False,
) -> None:
    """Ask questions about, and summarize, documents and repos far longer than a model's window."""


Paths = Annotated[list[str], typer.Argument(help="Files, folders, or - for stdin.", show_default=False, metavar="PATHS...")]
Model = Annotated[Optional[str], typer.Option("--model", metavar="MODEL", help="smollm2 (bundled; the default), a .gguf file, a HF folder or cached repo id.")]
Engine = Annotated[Optional[str], typer.Option("--engine", metavar="ENGINE", help="ktcli (our engine; the default) or hf (transformers).")]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", metavar="MODE", help="auto (the default), full, sparse (whole input in a quantized, sparse KV cache) or retrieval.")]
# metavar="": a flag takes no value, which typer 0.29's help showed as "<bool>"
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (answer, citations, plan, figures, skipped, warnings).", metavar="")]
PlanJson = Annotated[bool, typer.Option("--json", help="Print one JSON object (plan, skipped, warnings, model, engine, documents, overhead_tokens, largest, chunks, question).", metavar="")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, plan or figures on stderr (warnings, skipped files among them, and errors still are).", metavar="")]
TopK = Annotated[Optional[int], typer.Option("--top-k", metavar="N", help=f"Chunks retrieved for a question (default {_D.top_k}).")]
MaxNew = Annotated[Optional[int], typer.Option("--max-new-tokens", metavar="N", help=f"Longest answer, in tokens (default {_D.max_new_tokens}).")]
ServeMaxNew = Annotated[Optional[int], typer.Option("--max-new-tokens", metavar="N", help=f"max_tokens of a request that gives none (default {_D.max_new_tokens}); a request may ask for more, up to the window.")]
ChunkTokens = Annotated[Optional[int], typer.Option("--chunk-tokens", metavar="N", help=f"Chunk size for retrieval, in tokens (default {_D.chunk_tokens}).")]
MaxFile = Annotated[Optional[str], typer.Option("--max-file-bytes", help=f"Folder walks skip larger files, reported (default {_D.max_file_bytes:,}); PDF, office and notebook files by their text; 2.5MB and 3MiB are sizes too.", metavar="SIZE")]
Exclude = Annotated[Optional[list[str]], typer.Option(
    "--exclude", metavar="GLOB", show_default=False,
    help="Folder walks leave out what matches this gitignore-style pattern, relative to the folder given "
         "(tests/fixtures/**, *.csv, build/; ! re-includes); repeat for more. Reported in one line; "
         "a file named on the command line is still read.")]
CacheDir = Annotated[Optional[str], typer.Option("--cache-dir", metavar="DIR", help=f"Where converted models, packed weights, prompt K/V and indexes live (default: KTCLI_CACHE_DIR, else {_D.cache_path}).")]
Threads = Annotated[Optional[int], typer.Option("--threads", metavar="N", help="CPU threads (0: default).")]
Weights = Annotated[Optional[str], typer.Option("--weights", metavar="DTYPE", help="Weight dtype: auto (int8 on CPU, bf16 on GPU), fp32, bf16, fp16 or int8 (CPU only).")]
Device = Annotated[Optional[str], typer.Option("--device", metavar="DEVICE", help="auto (cuda when a GPU is visible, else cpu), cpu or cuda (ktcli engine).")]
MaxMemory = Annotated[Optional[str], typer.Option("--max-memory", metavar="SIZE", help="Memory budget, e.g. 4GB (default: 80% of the memory free).")]
MaxSeconds = Annotated[Optional[float], typer.Option("--max-seconds", metavar="SECONDS", help="Latency budget the planner aims for; a target, not a deadline (default 600 s for reading a whole input, full or sparse, or every line of a summary; none otherwise).")]
Temperature = Annotated[Optional[float], typer.Option("--temperature", metavar="T", help=f"Sampling temperature; 0 is greedy (default {_D.temperature:g}).")]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", metavar="BACKEND", help="local (load --engine here) or openai (an OpenAI-compatible server).")]
BaseUrl = Annotated[Optional[str], typer.Option("--base-url", metavar="URL", help="The server for --backend openai, e.g. http://127.0.0.1:8000/v1.")]
ApiKey = Annotated[Optional[str], typer.Option("--api-key", metavar="KEY", help="The server's API key, with --backend openai (else KTCLI_API_KEY or OPENAI_API_KEY).")]
ServeKey = Annotated[Optional[str], typer.Option("--api-key", metavar="KEY", help="The key clients must send (Authorization: Bearer KEY); "
                                                 "required to listen beyond loopback (else KTCLI_API_KEY).")]
ContextWindow = Annotated[Optional[int], typer.Option("--context-window", metavar="N", help="Tokens; caps the window (0, the default: no cap), or sets it where an OpenAI-compatible server does not say.")]
KvDtype = Annotated[Optional[str], typer.Option("--kv-dtype", metavar="DTYPE", help="KV page dtype: fp32, bf16, fp16, fp8, int8 or int4 (default: the plan's).")]
AttentionOpt = Annotated[Optional[str], typer.Option("--attention", metavar="POLICY", help="dense, window (sinks + recent pages) or topk (sinks + recent + query-selected pages); topk:N / window:N set the page count (default topk:8, window:4; pages of 64 tokens).")]
OutlineOpt = Annotated[Optional[str], typer.Option("--outline", metavar="WHEN", help="Summaries: read code files (signatures, docstrings, comments) and long prose (headings, first paragraphs) as outlines: auto (when reading every line would exceed --max-seconds, default 600 s), always or never.")]
EmbedOpt = Annotated[Optional[str], typer.Option("--embed", metavar="WHICH", help=f"Questions: auto (the default: an input with over {EMBED_FOCUS_FROM:,} chunks not in the index cache embeds the {EMBED_FOCUS_CHUNKS:,} its words point at; later questions add theirs) or all (embed every chunk now).")]
RopeScaling = Annotated[Optional[str], typer.Option("--rope-scaling", metavar="SCALING", help="linear|dynamic|yarn|llama3[:factor], e.g. yarn:4 (default: the model config's).")]


@app.command()
def ask(
    args: Annotated[list[str], typer.Argument(help="PATHS... QUESTION: files, folders or - for stdin, then the question.",
                                              show_default=False, metavar="PATHS... QUESTION")],
    model: Model = None, engine: Engine = None, mode: ModeOpt = None, json: Json = False, quiet: Quiet = False,
    top_k: TopK = None, max_new_tokens: MaxNew = None, chunk_tokens: ChunkTokens = None,
    max_file_bytes: MaxFile = None, exclude: Exclude = None, cache_dir: CacheDir = None, threads: Threads = None,
    weights: Weights = None, device: Device = None,
    max_memory: MaxMemory = None, max_seconds: MaxSeconds = None, temperature: Temperature = None,
    backend: BackendOpt = None, base_url: BaseUrl = None, api_key: ApiKey = None, context_window: ContextWindow = None,
    kv_dtype: KvDtype = None, attention: AttentionOpt = None, rope_scaling: RopeScaling = None,
    embed: EmbedOpt = None,
) -> None:
    """Answer QUESTION about PATHS, with citations."""
    opts = Options(locals())
    run_guarded(opts, lambda: opts.run_ask(*split_ask_args(args)))


@app.command()
def summarize(
    paths: Paths,
    model: Model = None, engine: Engine = None, mode: ModeOpt = None, json: Json = False, quiet: Quiet = False,
    max_new_tokens: MaxNew = None, chunk_tokens: ChunkTokens = None, max_file_bytes: MaxFile = None,
    exclude: Exclude = None, cache_dir: CacheDir = None, threads: Threads = None, weights: Weights = None,
    device: Device = None,
    max_memory: MaxMemory = None, max_seconds: MaxSeconds = None, temperature: Temperature = None,
    backend: BackendOpt = None, base_url: BaseUrl = None, api_key: ApiKey = None, context_window: ContextWindow = None,
    kv_dtype: KvDtype = None, attention: AttentionOpt = None, rope_scaling: RopeScaling = None,
    outline: OutlineOpt = None,
) -> None:
    """Summarize PATHS (a document, a folder or a repo)."""
    opts = Options(locals())
    run_guarded(opts, lambda: opts.run_summarize(paths))


@app.command()
def plan(
    args: Annotated[list[str], typer.Argument(help="Files, folders or - for stdin, then the question if any.",
                                              show_default=False, metavar="PATHS... [QUESTION]")],
    model: Model = None, engine: Engine = None, mode: ModeOpt = None, json: PlanJson = False, quiet: Quiet = False,
    top_k: TopK = None, max_new_tokens: MaxNew = None, chunk_tokens: ChunkTokens = None,
    max_file_bytes: MaxFile = None, exclude: Exclude = None, cache_dir: CacheDir = None, max_memory: MaxMemory = None,
    max_seconds: MaxSeconds = None, device: Device = None, threads: Threads = None, weights: Weights = None,
    temperature: Temperature = None,
    backend: BackendOpt = None, base_url: BaseUrl = None, api_key: ApiKey = None, context_window: ContextWindow = None,
    kv_dtype: KvDtype = None, attention: AttentionOpt = None, rope_scaling: RopeScaling = None,
    outline: OutlineOpt = None, embed: EmbedOpt = None,
) -> None:
    """Dry run: show tokens, the chosen mode and its time and memory estimates. Runs no model.
    Takes every option ask and summarize take, so a command line can be planned as it is."""
    opts = Options(locals())
    run_guarded(opts, lambda: opts.run_plan(*split_plan_args(args)))


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", metavar="HOST", help="Address to listen on; anything but loopback needs --api-key.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="PORT", min=0, max=65535, help="TCP port (0: any free port, printed on start).")] = 8000,
    model: Model = None, engine: Engine = None, cache_dir: CacheDir = None, threads: Threads = None,
    weights: Weights = None, device: Device = None, api_key: ServeKey = None, max_new_tokens: ServeMaxNew = None,
    max_memory: Annotated[Optional[str], typer.Option("--max-memory", metavar="SIZE", help="Memory the server may hold, e.g. 2GB: the model, and KV pages in what is left (ktcli engine; default: pages for 4 windows, within 30% of the memory free).")] = None,
    kv_dtype: Annotated[Optional[str], typer.Option("--kv-dtype", metavar="DTYPE", help="KV cache page dtype (ktcli engine).")] = None,
    attention: Annotated[Optional[str], typer.Option("--attention", metavar="POLICY", help="Attention policy (ktcli engine).")] = None,
    max_batch: Annotated[int, typer.Option("--max-batch", metavar="N", min=1, help="Most requests run together in one batch.")] = 16,
    batch_wait_ms: Annotated[float, typer.Option("--batch-wait-ms", metavar="MS", min=0.0, help="How long a free engine waits for more requests to batch.")] = 30.0,
    verbose: Annotated[bool, typer.Option("--verbose", help="Log every request on stderr.", metavar="")] = False,
    cors_origin: Annotated[Optional[list[str]], typer.Option(
        "--cors-origin", metavar="ORIGIN", help="A web page's origin (http://localhost:3000) whose scripts may call the server from a "
                              "browser; repeat for more, '*' for any. Default: none.")] = None,
) -> None:
    """Serve the local engine behind an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)."""
    opts = Options(locals())
    run_guarded(opts, lambda: opts.run_serve(host, port, max_batch, batch_wait_ms, verbose, cors_origin or []))


def split_ask_args(args: list[str]) -> tuple[list[str], str]:
    """PATHS... QUESTION. One argument alone, or a last one that names a file, is a
    question forgotten, not a question to ask."""
    from ktcli.errors import UsageError

    if len(args) < 2:
        raise UsageError("give the paths, then the question: ktcli ask PATHS... QUESTION")
    question = _text_argument(args[-1])
    if question == "-":
        raise UsageError("the last argument is the question, but '-' means standard input: "
                         "put the question after the paths, e.g. ktcli ask - \"What does it do?\"")
    if question.strip() and _names_a_path(question):
        raise UsageError(f"the last argument is the question, but {question!r} is a file or folder: "
                         "put the question after the paths (a question that is a path's name needs another "
                         f"word, e.g. \"what is {question.strip()}?\")")
    if _OPTION_LIKE.fullmatch(question):
        # `ask f.txt -- "-5 degrees?" --json -q`: after `--` nothing is an option, and -q
        # was asked while --json and the question were read as paths
        raise UsageError(f"the last argument is the question, but {question!r} is an option: options go before "
                         "`--` (ktcli ask [OPTIONS] PATHS -- QUESTION)")
    return args[:-1], question


_OPTION_LIKE = re.compile(r"--?[A-Za-z][\w-]*(=\S*)?")


def _names_a_path(text: str) -> bool:
    """Whether an argument is an existing file or folder. A question is often no valid
    path at all: over 255 bytes (File name too long) or holding a NUL. An empty or blank
    one is none either (Path("") is "."): `plan doc ""` said "an input path is empty"."""
    if not text.strip():
        return False
    try:
        return Path(text).exists()
    except (OSError, ValueError):
        return False


def split_plan_args(args: list[str]) -> tuple[list[str], str]:
    """The last argument is the question when it is not an input (an existing path or -)."""
    if args and args[0] in ("ask", "summarize") and not _names_a_path(args[0]):
        # `ktcli plan summarize repo/` said "summarize: no such file or directory"
        from ktcli.errors import UsageError

        rest = shlex.join(args[1:]) or "PATHS..."
        raise UsageError(f"plan takes the paths and question without the command: `ktcli plan {rest}` "
                         f"({'plans that question' if args[0] == 'ask' else 'with no question, plans a summary'})")
    if len(args) > 1 and args[-1] != "-" and not _names_a_path(args[-1]):
        if not args[-1].strip():
            from ktcli.errors import UsageError

            raise UsageError("the question is empty (leave it out to plan a summary)")
        return args[:-1], _text_argument(args[-1])
    return args, ""


def _text_argument(text: str) -> str:
    """A question as text. Under a non-UTF-8 locale (LC_ALL=C with PYTHONUTF8=0) Python
    keeps an argument's non-ASCII bytes as lone surrogates, which the tokenizer refused
    (an internal error): they are read as the UTF-8 a terminal sends, else replaced."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        raw = text.encode(sys.getfilesystemencoding(), "surrogateescape")
        return raw.decode("utf-8", errors="replace")


def main() -> None:
    stdout_was_null = _is_devnull(1)
    guard_stderr()  # a BrokenPipeError below is then stdout's reader gone, not stderr's
    try:
        _main()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before the command's own handling began
        _parse_failed(*interruption())
    except BrokenPipeError:  # `ktcli --version | head -1`: the reader has what it wanted
        os._exit(0)
    except OSError as e:  # the help or version written to a full disk: one line, not a traceback
        fail(f"{e.strerror or e}", 1)
    except SystemExit as e:
        # The help is written by rich and the version by click, which end a broken pipe
        # themselves with SystemExit(1) (`ktcli --help | head -1` exited 1): rich points
        # stdout at /dev/null, click wraps it in its PacifyFlushWrapper.
        pacified = type(sys.stdout).__name__ == "PacifyFlushWrapper"
        if e.code == 1 and (pacified or (not stdout_was_null and _is_devnull(1))):
            os._exit(0)
        raise


def _is_devnull(fd: int) -> bool:
    try:
        st, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return (st.st_rdev, st.st_ino, st.st_dev) == (null.st_rdev, null.st_ino, null.st_dev)


def _main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)  # (`ktcli serve` puts its own in while it serves)
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _ended_while_starting):  # (not where it came ignored)
        signal.signal(signal.SIGINT, _on_sigint)
    if sys.stdout is None:  # started with standard output closed (`>&-`): nowhere to answer
        fail("standard output is closed: nothing could be written (redirect it instead, e.g. > answer.txt)", 2)
    _writable_text()
    usage_error, click_error, no_args_is_help = _parse_errors()
    if len(sys.argv) <= 1:
        # `ktcli` alone: the help, once, and exit 2. Left to typer, some versions print it
        # before raising NoArgsIsHelpError and some leave it to the caller (it came twice).
        app(["--help"], standalone_mode=False, prog_name="ktcli")
        raise SystemExit(2)
    try:
        # Not standalone: the parser's own errors (a bad --top-k, an unknown option, a
        # missing argument) come here to be said in one line, not typer's boxed block.
        code = app(standalone_mode=False, prog_name="ktcli")
        if code == 130 and (_INTERRUPTED_AT or interruption()[1] == 143):
            # typer (0.29) turns a KeyboardInterrupt while it parses into a returned 130,
            # unsaid: its first parse imports pydantic, 0.1-1 s in which a SIGTERM or
            # Ctrl-C ended ktcli with no line, no --json object and 130 for a SIGTERM
            _parse_failed(*interruption())
    except no_args_is_help as e:  # `ktcli` alone: typer has shown the help (on stdout) unless it left it to us
        if e.ctx is not None:
            print(e.ctx.get_help())
        raise SystemExit(2) from None
    except usage_error as e:
        command = e.ctx.command_path if e.ctx else "ktcli"
        if others := _commands_taking(e):
            # click offered the nearest spelling it knows: "No such option: --outline
            # (Possible options: --quiet)" for summarize's --outline given to ask
            _parse_failed(f"{command} takes no {e.option_name}: it is an option of "
                          f"{_listed([f'ktcli {name}' for name in others])} (see `{command} --help`)", 2)
        if _the_groups_own(e):
            # "No such option: --version (Possible options: --attention, --json)" for `ktcli ask --version`
            _parse_failed(f"{command} takes no {e.option_name}: it is ktcli's own, before the command "
                          f"(`ktcli {e.option_name}`)", 2)
        _parse_failed(f"{_one_line(e.format_message())} ({_usage_hint(e, command)})", 2)
    except click_error as e:
        _parse_failed(_one_line(e.format_message()), e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        _parse_failed(*interruption())  # (--json: its object, as a command's own interruption gives)
    code = code if isinstance(code, int) else 0
    hold_signals()  # (run_guarded held them already where the command ran in it)
    raise SystemExit(code)


def hold_signals() -> None:
    """The command has said all it will: a Ctrl-C or SIGTERM from here on,
    in the interpreter's exit (torch's finalizers, threads joined, C++ destructors: up to a
    second), is ignored, and the process exits with the command's own status.
    It raised a KeyboardInterrupt there, or (once Python's exit had put the default action
    back) killed the process: `ask --json` printed its whole answer object and then
    "Exception ignored in atexit callback ... KeyboardInterrupt" on stderr, or died by the
    signal, exit 130 after an object whose exit is 0 (probe 121). SIGKILL still ends it.
    Ignored, not blocked: a mask is the main thread's, and torch's threads took the signal;
    Python's exit puts back the default action of a handler of its own, not of SIG_IGN."""
    for sig, ours in ((signal.SIGINT, _on_sigint), (signal.SIGTERM, _on_sigterm)):
        if signal.getsignal(sig) is ours:  # (not one that came ignored, or a host's own)
            signal.signal(sig, signal.SIG_IGN)


def _on_sigterm(signum, frame) -> None:
    """SIGTERM as Ctrl-C: the answer streamed so far keeps its Sources, a summary's notes are
    kept, --json still gets its object (the default action cut the output mid-line, with no
    word said and nothing for `| jq`); exit 143. A second one, while that is done, is
    ignored: the first is being answered (SIGKILL ends a process that hangs)."""
    if interruption()[1] != 143:
        note_terminated()
        raise KeyboardInterrupt


_INTERRUPTED_AT: list[float] = []
# A second SIGINT this soon after the first is the same one delivered twice: `timeout -s INT`
# signals the process and then its group, and the second landed in the exit's thread join
# ("Exception ignored in: <module 'threading'> ... KeyboardInterrupt" under "error:
# interrupted", intermittently).
SAME_INTERRUPT_S = 1.0


def _on_sigint(signum, frame) -> None:
    """Ctrl-C as Python's own (a KeyboardInterrupt), once: what streamed is kept with its
    Sources while the first is answered. A second one within SAME_INTERRUPT_S is ignored;
    a later one, asked for while the first is answered, ends the process at once, quietly."""
    import time

    if not _INTERRUPTED_AT:
        _INTERRUPTED_AT.append(time.monotonic())
        raise KeyboardInterrupt
    if time.monotonic() - _INTERRUPTED_AT[0] > SAME_INTERRUPT_S:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - leaving anyway
                pass
        os._exit(130)


def _parse_failed(message: str, code: int) -> None:
    """A command line the parser refused (`--top-k abc`, an unknown option), or a Ctrl-C or
    SIGTERM before a command's own handling began. With --json among the options a `| jq`
    reader still gets one object, as for errors after parsing."""
    options = sys.argv[1 : sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
    if "--json" in options:
        json_error(message, code)
    fail(message, code)


def _writable_text() -> None:
    """Under a locale that is not UTF-8 (LC_ALL=C with PYTHONUTF8=0, a Latin-1 terminal) an
    answer holding "ë" or "€" ended in an internal error after part of it was shown. A
    file or pipe gets UTF-8; a terminal its own encoding, with what it cannot show
    replaced."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding in ("utf8", "") or not hasattr(stream, "reconfigure"):
            continue
        try:
            if stream.isatty():
                stream.reconfigure(errors="replace")
            else:
                stream.reconfigure(encoding="utf-8", errors="surrogateescape")
        except (OSError, ValueError):
            pass


def _parse_errors() -> tuple[type, type, type]:
    """click's UsageError, ClickException and NoArgsIsHelpError, found through typer:
    typer 0.12-0.15 raises click's own, later versions a copy of click inside typer."""
    mro = typer.BadParameter.__mro__
    usage = next(c for c in mro if c.__name__ == "UsageError")
    base = next(c for c in mro if c.__name__ == "ClickException")
    no_args = getattr(sys.modules[usage.__module__], "NoArgsIsHelpError", None)
    return usage, base, no_args or type("NeverRaised", (Exception,), {})


def _commands_taking(error) -> list[str]:
    """The other ktcli commands that take the option `error` says this one does not."""
    token, ctx = getattr(error, "option_name", "") or "", getattr(error, "ctx", None)
    if not token.startswith("--") or ctx is None or ctx.parent is None:
        return []
    commands = getattr(ctx.parent.command, "commands", None) or {}
    return [name for name, cmd in commands.items()
            if name != ctx.info_name and any(token in p.opts for p in cmd.params)]


def _the_groups_own(error) -> bool:
    """Whether the option `error` says a command does not take is ktcli's own (`--version`)."""
    token, ctx = getattr(error, "option_name", "") or "", getattr(error, "ctx", None)
    if not token.startswith("--") or ctx is None or ctx.parent is None:
        return False
    return any(token in p.opts for p in ctx.parent.command.params)


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _usage_hint(error, command: str) -> str:
    """`ktcli ask f.txt "-5 degrees?"`: click takes a question that starts with "-" for an
    option ("No such option: -5"); `--` ends the options."""
    token = getattr(error, "option_name", "") or ""
    if token.startswith("-") and any(a.startswith(token) and re.search(r"[\s?]", a) for a in sys.argv[1:]):
        return f"a question that starts with '-' goes after `--`, options before it: {command} [OPTIONS] PATHS -- QUESTION"
    return f"see `{command} --help`"


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":
    main()
