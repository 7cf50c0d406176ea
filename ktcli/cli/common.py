"""What every command shares: settings from flags, the guard that turns errors into one
line and an exit code, and the glue from pipeline results to render."""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace

from ktcli.config import Settings, load_settings, unknown_variables, unused_settings
from ktcli.errors import InterruptedAnswer, KtcliError, UsageError, interruption

SETTING_FLAGS = (
    "model", "engine", "mode", "top_k", "max_new_tokens", "chunk_tokens", "max_file_bytes", "cache_dir",
    "threads", "device", "weights", "max_memory", "max_seconds", "temperature",
    "backend", "base_url", "api_key", "context_window", "kv_dtype", "attention",
    "rope_scaling", "outline", "exclude", "embed",
)


# A plan this long is said as a warning before the run starts, not only in its status line.
LONG_RUN_S = 3600


def fail(message: str, code: int) -> None:
    from rich.markup import escape

    from ktcli.render.console import stderr_console

    stderr_console().print(f"[bold red]error:[/bold red] {escape(message)}")
    raise SystemExit(code)


# One word with a slash or a file extension ("notes/q3.md", "report.pdf"): a path.
_PATH_LIKE = re.compile(r"[^\s?]*/[^\s?]*|[\w.-]+\.[A-Za-z][A-Za-z0-9]{0,4}")


def _warn_if_path_like(question: str, reporter) -> None:
    """The last argument is the question: a mistyped last path (`ktcli ask a.txt
    typo/b.txt`) became the question, unsaid. (One that exists is refused: `split_ask_args`.)"""
    if _PATH_LIKE.fullmatch(question.strip()):
        reporter.warn(f"the question {question.strip()!r} looks like a path, and none is there: "
                      "the question comes last, after the paths")


class Options:
    """The parsed flags of one command and the commands' bodies."""

    def __init__(self, values: dict) -> None:
        self.json = bool(values.get("json", False))
        self.quiet = bool(values.get("quiet", False))
        self.flags = {k: values.get(k) for k in SETTING_FLAGS if k in values}
        self._reporter = None

    def settings(self, serving: bool = False) -> Settings:
        settings = load_settings(self.flags)
        if not serving and self.flags.get("api_key") is not None and settings.backend == "local":
            # given as a flag and silently unused, as --base-url is refused (`config.validate`);
            # `serve`'s --api-key is the key its clients send, and is its own
            raise UsageError("--api-key is the key of an OpenAI-compatible server, which needs --backend openai "
                             "(and --base-url) as well; the local model takes no key")
        for message in unknown_variables() + unused_settings(settings):
            self.reporter().warn(message)
        return settings

    def reporter(self):
        if self._reporter is not None:
            return self._reporter
        from ktcli.render.console import ConsoleReporter

        reporter = ConsoleReporter(quiet=self.quiet, stream_answer=not self.json)
        if not os.environ.get("KTCLI_DEBUG"):  # which keeps Python's file:line format
            # A Python warning (kernels falling back from a GPU kernel, say) is one of the
            # reporter's: one `! ...` line, held while the answer streams.
            warnings.showwarning = lambda message, *_args, **_kw: reporter.warn(str(message))
        self._reporter = reporter
        return reporter

    def stop_progress(self) -> None:
        """Before an error: a live bar left the cursor hidden and the error line glued on."""
        if self._reporter is not None:
            self._reporter.close()

    def interrupted(self) -> None:
        if self._reporter is not None:
            self._reporter.end_answer_line()

    def run_ask(self, paths: list[str], question: str) -> None:
        from ktcli.pipeline.api import ask

        settings, reporter = self.settings(), self.reporter()
        _warn_if_path_like(question, reporter)
        self._answer(lambda shown: ask(paths, question, settings, reporter, None, self._show_plan(reporter), shown),
                     reporter)

    def run_summarize(self, paths: list[str]) -> None:
        from ktcli.pipeline.api import summarize_paths

        _refuse_a_question(paths)
        settings, reporter = self.settings(), self.reporter()
        self._answer(lambda shown: summarize_paths(paths, settings, reporter, None, self._show_plan(reporter), shown),
                     reporter)

    def run_plan(self, paths: list[str], question: str) -> None:
        from ktcli.pipeline.api import plan_only
        from ktcli.render.formats import plan_json, plan_lines

        settings, reporter = self.settings(), self.reporter()
        _warn_if_path_like(question, reporter)
        # plan takes every option of ask and summarize; one the planned command ignores is said
        if not question and self.flags.get("top_k") is not None:
            reporter.warn("--top-k is for a question: a summary reads every chunk")
        if not question and self.flags.get("embed") is not None:
            reporter.warn("--embed is for a question: a summary embeds nothing")
        if question and self.flags.get("outline") is not None:
            reporter.warn("--outline is for a summary: a question reads the retrieved chunks as they are")
        prep, extra = plan_only(paths, question, settings, reporter, None)
        documents = _document_sizes(prep)
        largest = sorted(documents, key=lambda d: -d["tokens"])[:5]
        if self.json:
            # every file the run would read, not only a count: which of a repo's files count
            print(plan_json(prep.plan, prep.corpus.skipped, extra | {"question": question, "largest": largest,
                                                                    "documents": documents,
                                                                    "overhead_tokens": overhead_tokens(prep),
                                                                    "warnings": list(reporter.warnings)}))
        else:
            lines = plan_lines(prep.plan)
            lines.insert(0, f"model       {extra['model']['name']} ({extra['engine']} engine)")
            if assumed := extra["model"].get("assumed"):
                lines.insert(1, f"assumed     {assumed}")
            if len(largest) > 1 and prep.plan.input_tokens > prep.plan.context_window:
                # What makes a repo expensive: 3.4 MB of benchmark JSON was most of ktcli's own 2.3M tokens.
                shown = ", ".join(f"{d['path']} (~{d['tokens']:,})" for d in largest[:3])
                lines.insert(4, f"largest     {shown}")
            if question:  # shown: a mistyped last path is taken for the question
                shown = question if len(question) <= 200 else f"{question[:150]}... ({len(question):,} characters)"
                lines.insert(3, f"question    {shown!r}")
            print("\n".join(lines))

    def run_serve(self, host: str, port: int, max_batch: int, batch_wait_ms: float, verbose: bool,
                  cors_origins: list[str]) -> None:
        from ktcli.serve.run import serve
        from ktcli.serve.server import ServeOptions, check_origins

        origins = check_origins(cors_origins)
        settings, reporter = self.settings(serving=True), self.reporter()
        # A config file's backend settings are a client's, of a remote server: its model
        # became the one served ("not in the local Hugging Face cache"), its key the one
        # clients had to send.
        came_from = dict(settings.origins)
        remote = settings.backend == "openai"
        if remote and came_from.get("model", "").startswith("model in "):
            raise UsageError(f"ktcli serve serves a local model, and {came_from['model']} names the remote backend's "
                             f"({settings.model!r}): give --model (smollm2 is bundled)")
        if remote and came_from.get("api_key", "").startswith("api_key in "):
            reporter.warn(f"{came_from['api_key']} is the key of a remote backend, not the one clients must send here: "
                          "that is --api-key or KTCLI_API_KEY")
            settings = replace(settings, api_key="")
        options = ServeOptions(host=host, port=port, api_key=settings.api_key,
                               default_max_tokens=settings.max_new_tokens, gather_ms=batch_wait_ms,
                               max_batch=max_batch, verbose=verbose, cors_origins=origins)
        if "*" in origins and not settings.api_key:
            reporter.warn("--cors-origin '*' without --api-key: any web page open in a browser on this machine can "
                          "use the server")
        from ktcli.serve.run import Terminated

        try:
            serve(settings, options, reporter.status, on_warn=reporter.warn)
        except (KeyboardInterrupt, Terminated) as e:
            # how a server is meant to stop: said as a status, not as an error, with the
            # exit code of the signal (130, 143)
            reporter.status(f"stopped serving ({'SIGTERM' if isinstance(e, Terminated) else 'Ctrl-C'})")
            raise SystemExit(Terminated.exit_code if isinstance(e, Terminated) else 130) from None

    def _show_plan(self, reporter) -> Callable:
        def show(prep) -> None:
            from ktcli.plan.planner import BUDGET_MISS
            from ktcli.render.formats import duration

            p = prep.plan
            if p.mode.value != "retrieval":
                what = "whole input" if p.n_windows < 2 else f"whole input, {p.n_windows} documents one by one"
            elif p.task == "ask":
                what = f"top {p.top_k} of {p.n_chunks:,} chunks, ~{p.n_windows} window(s)"  # (the run packs them)
            elif p.outline_files and p.read_tokens:
                # the outlines' tokens, not the planner's 256-token count of them: the run reads
                # them in ~1,024-token pieces ("47 chunks" of the tutorial's outline, probe 117)
                what = f"~{p.read_tokens:,} of them read in ~{p.n_windows} window(s)"
            else:  # a summary reads every chunk, in about this many windows
                what = f"{p.n_chunks:,} chunks in ~{p.n_windows} window(s)"
            if p.outline_files:
                what += f", {p.outline_files} file(s) as outlines"
            wait = f"first token ~{duration(p.est_first_token_seconds)}, " if p.est_first_token_seconds else ""
            mode = f"{p.mode.value} (in parts)" if p.mode.value == "retrieval" and p.task == "summarize" else p.mode.value
            reporter.status(f"plan: {mode} · ~{p.input_tokens:,} tokens · {what} · "
                            f"est {wait}≤{duration(p.est_seconds)}")
            for reason in p.reasons:
                if reason.startswith(BUDGET_MISS):
                    reporter.warn(reason)
            if p.est_seconds >= LONG_RUN_S:  # a run of hours started without a word (probe 108)
                reporter.warn(f"this run is planned to take ~{duration(p.est_seconds)} on this machine "
                              "(`ktcli plan` says why); Ctrl-C stops it")
        return show

    def _answer(self, run: Callable, reporter) -> None:
        """`run(on_answer)` a pipeline call. Text: the sources as soon as the answer has
        them (before the prompt cache's write). --json: one object after the whole run,
        with every figure."""
        if self.json:
            whole: list = []
            try:
                answer = run(whole.append)
            except KeyboardInterrupt:
                if not whole:
                    raise
                # Ctrl-C or SIGTERM after the answer, while the prompt cache was written
                # (a second or more for a long input): the object had nothing but the error,
                # where text output had shown the whole answer and its sources.
                raise InterruptedAnswer(f"{interruption()[0]} after the answer, while the prompt cache was "
                                        "written (not kept)", whole[-1], whole=True) from None
            self._finish(answer, reporter)
        else:
            run(lambda answer: self._finish(answer, reporter))

    def _finish(self, answer, reporter) -> None:
        from ktcli.render.formats import answer_json, citations_text, figures_line

        if self.json:
            print(answer_json(answer, reporter.warnings))
        else:
            after = citations_text(answer)
            if after or answer.text.strip():  # (no answer and nothing after it: not a blank line)
                sys.stdout.write(after + "\n")
                sys.stdout.flush()
        reporter.figures(figures_line(answer))


_QUESTION_WORDS = re.compile(r"(?i)(?:what|who|when|where|why|how|which|does|do|is|are|can|list|summari[sz]e|explain)\b")


def _refuse_a_question(paths: list[str]) -> None:
    """`ktcli summarize file.pdf "What is the notice period?"` was refused as a missing file
    named like the question: said as what it is."""
    last = paths[-1] if len(paths) > 1 else ""
    if last and " " in last.strip() and not os.path.lexists(last) \
            and (last.rstrip().endswith("?") or _QUESTION_WORDS.match(last.strip())):
        raise UsageError(f"summarize takes no question ({last!r} is no file): to ask it, "
                         f"ktcli ask {' '.join(paths[:-1])} {last!r}")


def _document_sizes(prep) -> list[dict]:
    """The input's documents in input order, each with its own tokens (`Prepared.
    document_tokens`: no source tag, no share of the file listing; `overhead_tokens`)."""
    return [{"path": d.path, "kind": d.kind, "tokens": prep.document_tokens.get(d.path, 0),
             "outlined": d.path in prep.outlines} for d in prep.corpus.documents]


def overhead_tokens(prep) -> int:
    """What plan.input_tokens holds beyond the documents' own tokens: each one's source tag
    and, for a summary, the list of its files."""
    return max(0, prep.plan.input_tokens - sum(prep.document_tokens.values()))


def run_guarded(opts: Options, body: Callable[[], None]) -> None:
    """Run a command; user-facing errors become one line and their exit code (with --json,
    also one object on stdout: a `| jq` reader got nothing to parse)."""
    def failed(message: str, code: int, said: bool = False) -> None:
        opts.stop_progress()
        if opts.json and not said:
            json_error(message, code)
        fail(message, code)

    try:
        body()
    except InterruptedAnswer as e:
        _keep_interrupted_answer(opts, e)
        failed(str(e), e.exit_code, said=True)
    except KtcliError as e:
        partial = getattr(e, "partial", None)
        if partial is not None:
            _keep_partial(opts, partial, str(e), unseen=getattr(e, "unseen", False), exit_code=e.exit_code,
                          answer=getattr(e, "answer", None))
        failed(str(e), e.exit_code, said=partial is not None)
    except KeyboardInterrupt:
        opts.interrupted()
        failed(*interruption())
    except BrokenPipeError:
        # The reader of our stdout went away (e.g. `| head`): not an error worth a trace.
        os._exit(0)
    except MemoryError:
        failed("out of memory: try --mode retrieval, a smaller --top-k or --max-memory", 1)
    except OSError as e:
        # The system refused a read or write that no input check covers: a full disk
        # (`> /dev/full`), an I/O error. What and where, not "internal error".
        if os.environ.get("KTCLI_DEBUG"):
            raise
        failed(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), 1)
    except Exception as e:  # noqa: BLE001 - never a traceback for the user
        if os.environ.get("KTCLI_DEBUG"):
            raise
        failed(f"internal error: {type(e).__name__}: {e} (set KTCLI_DEBUG=1 for the traceback)", 1)
    else:  # done, its output whole: a signal now would only spoil it (`app.hold_signals`)
        from ktcli.cli.app import hold_signals

        hold_signals()


def json_error(message: str, code: int) -> None:
    import json

    try:
        print(json.dumps({"error": message, "exit_code": code}, ensure_ascii=False), flush=True)
    except OSError:  # stdout is what failed (a full disk): the line on stderr still says it
        pass


def _keep_interrupted_answer(opts: Options, e: InterruptedAnswer) -> None:
    """Ctrl-C while the answer streamed: the part shown keeps the Sources it can be traced
    to; with --json, stdout gets the answer object, marked incomplete."""
    import json

    from ktcli.render.formats import answer_json, citations_text

    if opts.json:
        payload = json.loads(answer_json(e.answer, opts.reporter().warnings)) | {
            "incomplete": not e.whole, "error": str(e), "exit_code": e.exit_code}
        print(json.dumps(payload, indent=2, ensure_ascii=False), flush=True)
    else:
        opts.interrupted()  # ends the answer's line
        sources = citations_text(e.answer)
        if sources.strip():
            sys.stdout.write("\n" + sources.lstrip("\n") + "\n")
            sys.stdout.flush()


def _keep_partial(opts: Options, partial: str, error: str, unseen: bool = False, exit_code: int = 1,
                  answer=None) -> None:
    """An answer cut off mid-stream is not thrown away: the text already streamed stays
    (marked by the backend), and text never shown (a summary's notes) is printed; with
    --json, stdout still gets one object, marked incomplete: `answer`'s (plan, figures,
    skipped... as an interrupted answer's), else the text and the error alone."""
    import json

    from ktcli.render.formats import answer_json

    if opts.json:
        payload = json.loads(answer_json(answer, opts.reporter().warnings)) if answer is not None else {}
        print(json.dumps(payload | {"answer": partial, "incomplete": True, "error": error, "exit_code": exit_code},
                         indent=2 if answer is not None else None, ensure_ascii=False), flush=True)
    else:
        opts.interrupted()
        if unseen and partial:  # (none: a server's cut before a summary's first notes, or a question's)
            print(partial, flush=True)
