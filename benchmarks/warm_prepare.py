"""A warm question's preparation of a large folder, with the chunk cache (`ingest.chunk_cache`)
and the BM25 cache (`retrieval.lexical_cache`) against cutting, counting and indexing it all
again (the baseline, same run): what every question after the first about an unchanged
folder does before its embeddings are read and the model starts.

    python -m benchmarks.warm_prepare --json
    python -m benchmarks.warm_prepare --json --folder ~/src/some-repo

The folder: Python's own standard library by default (its `test/`, `idlelib/`,
`site-packages/` and `__pycache__/` left out), as a repo of some 600 modules. Each round runs
`pipeline.prepare` for a question on it three ways, in turn: without the chunk cache (the
baseline), filling an empty one (a first question), and reading a full one (a warm
question); then builds the BM25 index of its chunks without and with its cache. CPU seconds
(`time.process_time`: the machine's other load does not count), the median of `--rounds`.
The chunks and plans of the three ways are compared (timings aside), as are the indexes'
scores for the question.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import arg_parser, machine, report
from ktcli.config import Settings
from ktcli.ingest import chunk_corpus, count_tokens
from ktcli.pipeline import prepare as prepare_module
from ktcli.pipeline.events import NullReporter
from ktcli.retrieval.lexical_cache import bm25_index
from ktcli.retrieval.retriever import lexical_text

QUESTION = "How does the pickle module handle recursive objects?"
STDLIB_LEFT_OUT = ("test/", "idlelib/", "site-packages/", "__pycache__/", "dist-packages/")


def _uncached(corpus, *, chunk_tokens, overlap_tokens, cache_dir=None):
    """`chunk_cache.chunked` as it was before the cache: every document cut and counted."""
    return (chunk_corpus(corpus, chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens),
            [count_tokens(d.text) for d in corpus.documents])


def _timed_prepare(folder: Path, cache: Path, exclude: tuple[str, ...], cached: bool):
    real = prepare_module.chunked
    prepare_module.chunked = real if cached else _uncached
    try:
        settings = Settings(cache_dir=str(cache), exclude=exclude)
        started = time.process_time()
        prep = prepare_module.prepare([str(folder)], QUESTION, "ask", settings, NullReporter())
        return time.process_time() - started, prep
    finally:
        prepare_module.chunked = real


def _plan_sans_timings(prep):
    """The plan, less what the measured read time moves (its own and its alternatives' times)."""
    alternatives = tuple({k: v for k, v in a.items() if k != "est_seconds"} for a in prep.plan.alternatives)
    return dataclasses.replace(prep.plan, read_s=0, est_seconds=0, est_first_token_seconds=0,
                               alternatives=alternatives)


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser("warm_prepare", __doc__, "warm_prepare")
    parser.add_argument("--folder", help="the folder to prepare (default: Python's standard library)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    folder = Path(args.folder or sysconfig.get_paths()["stdlib"]).expanduser()
    exclude = () if args.folder else STDLIB_LEFT_OUT
    work = Path(tempfile.mkdtemp(prefix="ktcli-warm-prepare-"))
    warm_cache = work / "warm"
    # fills the warm caches (and the imports)
    _, filled = _timed_prepare(folder, warm_cache, exclude, cached=True)
    bm25_index([lexical_text(c) for c in filled.chunks], warm_cache)
    times: dict[str, list[float]] = {"uncached": [], "first": [], "warm": [], "bm25_built": [], "bm25_read": []}
    same = True
    for round_ in range(args.rounds):
        base_s, base = _timed_prepare(folder, work / f"none-{round_}", exclude, cached=False)
        first_s, first = _timed_prepare(folder, work / f"first-{round_}", exclude, cached=True)
        warm_s, warm = _timed_prepare(folder, warm_cache, exclude, cached=True)
        times["uncached"].append(base_s)
        times["first"].append(first_s)
        times["warm"].append(warm_s)
        same = same and base.chunks == first.chunks == warm.chunks
        same = same and _plan_sans_timings(base) == _plan_sans_timings(first) == _plan_sans_timings(warm)
        texts = [lexical_text(c) for c in warm.chunks]
        started = time.process_time()
        built = bm25_index(texts, None)
        times["bm25_built"].append(time.process_time() - started)
        started = time.process_time()
        read = bm25_index(texts, warm_cache)
        times["bm25_read"].append(time.process_time() - started)
        same = same and np.array_equal(built.scores(QUESTION), read.scores(QUESTION))
    median = {k: round(statistics.median(v), 3) for k, v in times.items()}
    result = {
        "benchmark": "warm_prepare", "machine": machine(), "rounds": args.rounds, "folder": str(folder),
        "exclude": list(exclude), "documents": len(warm.corpus.documents), "chunks": len(warm.chunks),
        "cpu_s_median": median, "cpu_s_all": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "warm_speedup": round(median["uncached"] / max(median["warm"], 1e-6), 2),
        "first_run_cost": round(median["first"] / max(median["uncached"], 1e-6), 2),
        "bm25_speedup": round(median["bm25_built"] / max(median["bm25_read"], 1e-6), 1),
        "same_chunks_plans_and_scores": same,
    }
    print(f"{folder}: {result['documents']} documents, {result['chunks']} chunks; prepare CPU s (median of "
          f"{args.rounds}): uncached {median['uncached']}, first {median['first']}, warm {median['warm']} "
          f"({result['warm_speedup']}x); BM25 built {median['bm25_built']}, read {median['bm25_read']} "
          f"({result['bm25_speedup']}x); same: {same}", file=sys.stderr)
    report(args.name, result, args.json)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
