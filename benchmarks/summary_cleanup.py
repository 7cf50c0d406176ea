"""What a user sees in `ktcli summarize` of small repos, file by file: lines of HTML tags
alone, code blocks that are not in the file summarized (made up by the model), sections that
hold no word of their file; and the model calls and seconds it took.

    python -m benchmarks.summary_cleanup --json

Repos: the bundled minirepo and six small packages of this virtualenv, each laid out as a
repo (its PyPI description as README.md, its package under src/; certifi's 290 KB
cacert.pem left out); a package not installed is skipped. Each is summarized twice in the
same run with the same loaded model, greedy: the baseline as ktcli did until 2026-12-06
(every document summarized, its streamed text shown as written), and now (files of at most
160 characters and 6 lines shown whole; lines of tags alone and code blocks not in the
source left out as they stream: `pipeline.summary_lines`).

The counts are mechanical (a tag line: a line that is only HTML tags; a made-up block: a
fenced, <pre> or code-block directive block fewer than half of whose code lines of 8+
characters are in the file; "no word of its file": `citations.says_nothing_of`). They are
the same rules the filter applies, so the "now" side is zero on the first two by
construction: the figures say how much of that the baseline showed, and what it cost to
leave it out. The summaries are kept in the results file: read them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import ROOT, arg_parser, machine, report
from ktcli.config import Settings
from ktcli.engine.loading import load_backend
from ktcli.pipeline import citations, runner, summarize as summarize_module
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.runner import Tally
from ktcli.pipeline.summarize import summarize
from ktcli.pipeline.summary_lines import SummaryLines

PACKAGES = ("certifi", "shellingham", "iniconfig", "markupsafe", "mdurl", "annotated_types")
LEFT_OUT = ("cacert.pem",)  # data, not source: 290 KB of certificates


def _repos(folder: Path) -> dict[str, Path]:
    repos = {"minirepo": ROOT / "sample_docs" / "minirepo"}
    for name in PACKAGES:
        try:
            dist = importlib.metadata.distribution(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            continue
        package = Path(str(dist.locate_file(name)))
        if not package.is_dir():
            continue
        repo = folder / name
        shutil.copytree(package, repo / "src" / name, ignore=shutil.ignore_patterns("__pycache__", *LEFT_OUT))
        (repo / "README.md").write_text(dist.metadata.get_payload() or dist.metadata.get("Summary", name))
        repos[name] = repo
    return repos


class _AsWritten:
    """The baseline's stream: every piece shown as the model wrote it."""

    def __init__(self, source: str) -> None:
        self.dropped_markup = self.dropped_blocks = 0

    def feed(self, piece: str) -> str:
        return piece

    def flush(self) -> str:
        return ""

    def said(self, subject: str) -> str:
        return ""


@contextlib.contextmanager
def _as_before():
    lines, quoted = runner.SummaryLines, summarize_module._quoted
    runner.SummaryLines, summarize_module._quoted = _AsWritten, lambda doc: False
    try:
        yield
    finally:
        runner.SummaryLines, summarize_module._quoted = lines, quoted


def _counts(answer, prep) -> dict:
    """Over each document's section, or the one summary of them all (a whole read of more
    documents than are summarized one by one, as the minirepo's)."""
    texts = {d.path: d.text for d in prep.corpus.documents}
    parts = answer.parts or (("", answer.text),)
    texts[""] = "\n".join(texts.values())
    tag_lines = made_up = no_word = empty = 0
    for path, text in parts:
        if text == summarize_module.NO_SUMMARY:  # said so in place of what was left out
            empty += 1
            continue
        tag_lines += sum(bool(line.strip()) and not citations.MARKUP_TAG.sub("", line).strip()
                         for line in text.splitlines())
        judge = SummaryLines(texts[path])
        judge.feed(text + "\n")
        judge.flush()
        made_up += judge.dropped_blocks
        no_word += bool(text.strip()) and citations.says_nothing_of(text, texts[path])
    return {"sections": len(answer.parts), "tag_lines": tag_lines, "made_up_code_blocks": made_up,
            "sections_with_no_word_of_their_file": no_word, "sections_left_empty": empty}


def run_case(repo: Path, backend, settings: Settings, before: bool) -> dict:
    with _as_before() if before else contextlib.nullcontext():
        prep = prepare([str(repo)], "", "summarize", settings, NullReporter())
        tally = Tally()
        started = time.perf_counter()
        answer = summarize(prep, backend, settings, NullReporter(), tally)
        seconds = time.perf_counter() - started
    quoted = sum(text.startswith("The whole file:") for _, text in answer.parts)
    return {"documents": len(prep.corpus.documents), **_counts(answer, prep), "shown_whole": quoted,
            "model_calls": tally.model_calls,
            "tokens_out": tally.new_tokens, "seconds": round(seconds, 1), "summary": answer.text}


def main(argv: list[str] | None = None) -> dict:
    args = arg_parser("summary_cleanup", __doc__, "summary_cleanup").parse_args(argv)
    settings = Settings()
    result: dict = {"machine": machine(), "baseline": "every document summarized, its text shown as written "
                    "(as until 2026-12-06)", "repos": {}}
    totals: dict[str, dict[str, float]] = {"baseline": {}, "now": {}}
    with tempfile.TemporaryDirectory(prefix="ktcli-cleanup-") as tmp:
        repos = _repos(Path(tmp))
        first = next(iter(repos.values()))
        backend = load_backend(settings, None, prepare([str(first)], "", "summarize", settings, NullReporter()).plan)
        for name, repo in repos.items():
            cases = {}
            for side, before in (("baseline", True), ("now", False)):
                cases[side] = run_case(repo, backend, replace(settings), before)
                shown = {k: v for k, v in cases[side].items() if k != "summary"}
                print(f"{name:16s} {side:9s} {shown}", flush=True)
                for key, value in shown.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        totals[side][key] = round(totals[side].get(key, 0) + value, 1)
            result["repos"][name] = cases
    result["totals"] = totals
    print(f"totals: {totals}")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
