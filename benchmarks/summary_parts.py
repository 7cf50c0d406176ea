"""`ktcli summarize` of a document read in parts: the summary written from every part's
notes against the last part's notes alone.

    python -m benchmarks.summary_parts --json

The input is the Python tutorial's first 7 chapters (sample_docs, 3,839 lines, ~36K
estimated tokens), read by the bundled model in several windows with notes passed from
one to the next (`pipeline.summarize`); the reduce step then writes the summary from notes.
(A 9K-token synthetic report, tried first, fit 2 windows, and the model's notes of both
were of its last chapter: no measure of anything.)

Baseline, in the same run, on the same notes (the notes memo keeps each part's notes, so
both variants reduce the very same ones): the summary written from the last part's notes,
which the model is asked to write with the earlier notes kept (as until 2026-12-06).
Against it: from every part's notes in reading order (`summarize.every_parts_notes`).
Greedy decoding, the CLI's default budgets.

Measured: how many of the 7 chapters the summary names (one of a few terms of each, listed
below; crude: some are said in other chapters too) and their spread over the document's
first, middle and last thirds; seconds of each variant (the first reads every part). A crude, mechanical count of coverage: the summaries
are kept in the results, read them.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import ROOT, arg_parser, machine, report
from ktcli.config import Settings
from ktcli.engine.loading import load_backend
from ktcli.pipeline import summarize as summarize_module
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.runner import Tally

TUTORIAL = ROOT / "sample_docs" / "python-tutorial-3.11.rst"
LINES = 3839  # chapters 1-7, up to "Errors and Exceptions": ~36K estimated tokens
# (chapter, terms that name it; crude: "module" is said elsewhere too, read the summaries)
CHAPTERS = [
    ("Whetting Your Appetite", ["appetite", "automat", "scripting"]),
    ("Using the Python Interpreter", ["interpreter", "command line", "argv"]),
    ("An Informal Introduction to Python", ["calculator", "arithmetic", "fibonacci"]),
    ("More Control Flow Tools", ["control flow", "range", "loop", "match statement", "keyword argument", "lambda"]),
    ("Data Structures", ["comprehension", "tuple", "dictionar", "stack", "queue"]),
    ("Modules", ["module", "package", "__init__"]),
    ("Input and Output", ["format", "f-string", "file", "json"]),
]
THIRDS = [(0, 3), (3, 5), (5, 7)]


def review_text() -> str:
    return "".join(TUTORIAL.read_text(encoding="utf-8").splitlines(keepends=True)[:LINES])


def _named(summary: str) -> list[bool]:
    """Per chapter: whether the summary holds one of its key terms (outside the headings)."""
    body = "\n".join(line for line in summary.splitlines() if not line.lstrip().startswith("#")).lower()
    return [any(re.search(r"\b" + re.escape(term), body) for term in terms) for _, terms in CHAPTERS]


@contextlib.contextmanager
def _last_parts_notes():
    real = summarize_module.every_parts_notes
    summarize_module.every_parts_notes = lambda taken, fits: ""  # the summary from the last part's notes
    try:
        yield
    finally:
        summarize_module.every_parts_notes = real


def main(argv=None) -> dict:
    args = arg_parser("summary_parts", __doc__, "summary_parts").parse_args(argv)
    base = Settings()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "python-tutorial-chapters-1-7.rst"
        path.write_text(review_text())
        # a cache of its own: the notes memo starts empty, so the first variant reads every part
        settings = replace(base, cache_dir=str(Path(tmp) / "cache"))
        prep = prepare([str(path)], "", "summarize", settings, NullReporter())
        backend = load_backend(settings, None, prep.plan)
        runs = {}
        # now first: it reads every part and the memo keeps the notes; the baseline reduces the same notes
        for variant, patch in (("every_part", contextlib.nullcontext()), ("last_part", _last_parts_notes())):
            started = time.perf_counter()
            with patch:
                answer = summarize_module.summarize(prep, backend, settings, NullReporter(), Tally())
            named = _named(answer.text)
            thirds = [sum(named[a:b]) for a, b in THIRDS]
            runs[variant] = {"seconds": round(time.perf_counter() - started, 1), "chapters_named": sum(named),
                             "named": named, "by_third": thirds, "windows": answer.plan.n_windows,
                             "summary": answer.text}
            print(f"{variant}: {sum(named)}/{len(CHAPTERS)} chapters named (first/middle/last third {thirds}), "
                  f"{runs[variant]['seconds']} s", flush=True)
    result = {"machine": machine(), "model": base.model, "chapters": len(CHAPTERS), "runs": runs}
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
