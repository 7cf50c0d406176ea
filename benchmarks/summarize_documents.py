"""`ktcli summarize` of a few documents that fit the window together: each read alone and
summarized in turn, against all of them in one read.

    python -m benchmarks.summarize_documents --json

Baseline, in the same run, on the same inputs and loaded model: the one read of every
document together (`planner.PER_DOCUMENT_MAX` set to 1), as until 2026-12-05. Against it:
each document read alone (`pipeline.summarize._each_document`). Greedy decoding, the CLI's
default answer budget (384 tokens; shared out per document).

Measured per input set: how many documents the summary covers (one of the document's own
key terms, written outside the headings, where none of the other documents holds that
term), how many key terms it carries in all, its seconds and its tokens written. Key terms
are a crude, mechanical count of coverage, not a judgement: the summaries are kept in the
results, read them. Sets: four short unrelated notes (a restoration, a recipe, release
notes, a travel diary); the bundled minirepo's four source modules; the sample PDF with
two of the notes.
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
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.runner import Tally
from ktcli.pipeline.summarize import summarize
from ktcli.plan import planner

NOTES = {
    "restoration.md": ("# Harbor Light restoration\n\nThe Port Alder lighthouse was built in 1871 and lit by a paraffin "
                       "lamp until 1952. In 2023 the town council voted to restore the tower. The works replaced 340 "
                       "cracked granite blocks, rebuilt the iron gallery and cleaned the Fresnel lens, made in Paris "
                       "by Barbier & Fenestre.\n\nThe restoration cost 2.1 million euros, of which the national "
                       "heritage fund paid 60 percent. The tower reopened to visitors on 14 June 2024. About 18,000 "
                       "people climbed its 112 steps in the first summer. A small museum in the keeper's cottage "
                       "shows the logbooks of the last keeper, Ada Quill, who left in 1971.\n",
                       ["1871", "paraffin", "granite", "Fresnel", "heritage", "Quill", "112 steps", "2.1 million"]),
    "bread.md": ("# Rye sourdough\n\nThis recipe makes one loaf of dark rye bread. Feed the starter the evening before "
                 "with 50 g of rye flour and 50 g of water. In the morning mix 300 g of whole rye flour, 200 g of "
                 "bread flour, 380 g of warm water, 100 g of active starter and 11 g of salt.\n\nLet the dough rise "
                 "in a greased tin for three to four hours, until it has grown by a third. Bake at 240 degrees "
                 "Celsius for 15 minutes with steam, then at 210 degrees for another 45 minutes. Wait a full day "
                 "before cutting. Caraway seeds are the traditional addition in northern Germany.\n",
                 ["rye", "starter", "dough", "caraway", "240", "flour", "salt"]),
    "release.md": ("# Tidewatch 4.0 release notes\n\nTidewatch is an open-source tide prediction service. Version 4.0 "
                   "drops support for Python 3.8 and requires PostgreSQL 14 or newer. The prediction engine now "
                   "uses 68 harmonic constituents instead of 37, which cuts the average error at Brest from 11 cm "
                   "to 4 cm.\n\nThe REST API gains a /v2/extremes endpoint returning high and low waters for a date "
                   "range. The old /v1/tides endpoint is deprecated. Startup time fell from 9 seconds to 2 seconds "
                   "after the station catalogue moved to a memory-mapped file.\n",
                   ["Tidewatch", "PostgreSQL", "harmonic", "Brest", "extremes", "deprecated", "Python 3.8"]),
    "trip.md": ("# Ten days in Hokkaido\n\nWe landed in Sapporo on 3 February, in time for the snow festival, where "
                "the largest sculpture was a 15-metre copy of a castle. From there we took the train to Otaru for "
                "its glass workshops and canal, then on to Niseko for four days of skiing.\n\nThe highlight was the "
                "drift ice at Abashiri: the icebreaker Aurora took us out among floes, and we saw two Steller's sea "
                "eagles. The trip cost about 3,200 dollars each. Next time we would rent a car.\n",
                ["Sapporo", "Otaru", "Niseko", "Abashiri", "icebreaker", "eagles", "snow festival", "ski"]),
}
MINIREPO = ROOT / "sample_docs" / "minirepo" / "src" / "shelf"
MODULES = {"cli.py": ["build_parser", "argparse", "main", "command"],
           "models.py": ["InvalidBook", "Book", "title", "author"],
           "search.py": ["rank", "find", "query", "limit"],
           "storage.py": ["catalogue_path", "load", "save", "next_id", "json"]}
PDF = ROOT / "sample_docs" / "harbor-light-annual-report-2023.pdf"
PDF_TERMS = ["Okafor", "Beacon", "Halden", "dividend", "lantern", "revenue", "Harbor Light"]


def _sets(folder: Path) -> dict[str, list[tuple[Path, list[str]]]]:
    notes = []
    for name, (text, terms) in NOTES.items():
        (folder / name).write_text(text)
        notes.append((folder / name, terms))
    code = [(MINIREPO / name, terms) for name, terms in MODULES.items()]
    return {"four notes": notes, "four modules": code, "pdf and two notes": [(PDF, PDF_TERMS), notes[0], notes[2]]}


def _without_headings(summary: str) -> str:
    return "\n".join(line for line in summary.splitlines() if not line.startswith("## "))


def _mentions(text: str, term: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(term)}", text, re.IGNORECASE) is not None


def _own_terms(docs: list[tuple[Path, list[str]]]) -> list[list[str]]:
    """Each document's key terms that no other document of the set holds."""
    texts = [p.read_text(errors="replace") if p.suffix != ".pdf" else "" for p, _ in docs]
    return [[t for t in terms if not any(_mentions(other, t) for j, other in enumerate(texts) if j != i)]
            for i, (_, terms) in enumerate(docs)]


@contextlib.contextmanager
def _one_read():
    limit = planner.PER_DOCUMENT_MAX
    planner.PER_DOCUMENT_MAX = 1
    try:
        yield
    finally:
        planner.PER_DOCUMENT_MAX = limit


def run_case(docs, backend, settings, together: bool) -> dict:
    with _one_read() if together else contextlib.nullcontext():
        prep = prepare([str(p) for p, _ in docs], "", "summarize", settings, NullReporter())
        started = time.perf_counter()
        tally = Tally()
        answer = summarize(prep, backend, settings, NullReporter(), tally)
        seconds = time.perf_counter() - started
    said = _without_headings(answer.text)
    covered, terms = 0, 0
    for own in _own_terms(docs):
        hits = [t for t in own if _mentions(said, t)]
        covered += bool(hits)
        terms += len(hits)
    return {"model_calls": tally.model_calls, "documents_covered": covered, "documents": len(docs),
            "key_terms": terms, "seconds": round(seconds, 1), "tokens_out": tally.new_tokens,
            "plan_est_seconds": round(prep.plan.est_seconds, 1), "summary": answer.text}


def main(argv: list[str] | None = None) -> dict:
    args = arg_parser("summarize_documents", __doc__, "summarize_documents").parse_args(argv)
    settings = Settings()
    result: dict = {"machine": machine(), "baseline": "every document in one read (as until 2026-12-05)",
                    "max_new_tokens": settings.max_new_tokens, "sets": {}}
    with tempfile.TemporaryDirectory(prefix="ktcli-sumdocs-") as tmp:
        sets = _sets(Path(tmp))
        first = next(iter(sets.values()))
        backend = load_backend(settings, None, prepare([str(first[0][0])], "", "summarize", settings,
                                                       NullReporter()).plan)
        for name, docs in sets.items():
            cases = {}
            for side, together in (("one read (baseline)", True), ("each document alone", False)):
                cases[side] = run_case(docs, backend, replace(settings), together)
                shown = {k: v for k, v in cases[side].items() if k != "summary"}
                print(f"{name:18s} {side:22s} {shown}", flush=True)
            base, now = cases["one read (baseline)"], cases["each document alone"]
            cases["time_ratio"] = round(now["seconds"] / max(base["seconds"], 1e-9), 2)
            result["sets"][name] = cases
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
