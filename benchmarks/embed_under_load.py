"""Embedding with other processes busy: the thread count chosen by timing against fixed counts.

    python -m benchmarks.embed_under_load --json [--reps 2]

Cold indexes embed hundreds to thousands of chunks in batches of 16. Two inputs, chunked
as `ask` chunks them (256 tokens, 32 shared, section trails): the Python tutorial (341
chunks of ~256 tokens) and a 3,000-page PDF's worth of one-line pages ("label N": 3,000
chunks of a few tokens, the shape a helper's 5,000-page PDF had). A third, too short to be
timed batch by batch (since 2026-12-07 its count fits the cores the load leaves idle): the
sample report's sentences and rows, as every question read whole embeds them for its key
lines (`key_lines.pick`) and its not-found check. Each is embedded by the
bundled MiniLM in this process with 0 and 1 busy processes beside it (a pure-Python loop,
as in threads_under_load), under three configurations interleaved rep by rep:

- 2 threads fixed: torch's default, one per core here, what the embedder ran before
  2026-12-05: the baseline;
- 1 thread fixed;
- governed (the default now): `ktcli.threads.ThreadGovernor` times the batches and picks,
  starting from the load seen while the model loaded (each run as a fresh process has it).

Figures: seconds per embedding (median over `--reps`) and the ratio to the baseline's.
"""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.common import arg_parser, machine, report
from benchmarks.threads_under_load import busy

CONFIGS = ("2 threads (baseline)", "1 thread", "governed (default)")


def _inputs() -> dict[str, list[str]]:
    from ktcli.ingest.chunking import chunk_corpus
    from ktcli.ingest.corpus import load_corpus
    from ktcli.pipeline.key_lines import lines_of
    from ktcli.retrieval.retriever import indexed_text

    tutorial = chunk_corpus(load_corpus(["sample_docs/python-tutorial-3.11.rst"]), chunk_tokens=256, overlap_tokens=32)
    report = load_corpus(["sample_docs/harbor-light-annual-report-2023.pdf"]).documents
    return {"tutorial (341 chunks of ~256 tokens)": [indexed_text(c) for c in tutorial],
            "3,000 one-line pages": [f"label {i}" for i in range(1, 3001)],
            # too few to time batch by batch: the count is chosen once, from the load seen
            "the sample report's lines (the key lines' call)": list(dict.fromkeys(
                u for d in report for u in lines_of(d.text)))}


def _embed_once(embedder, texts: list[str], config: str) -> float:
    import torch

    from ktcli.threads import cpu_sample

    torch.set_num_threads(1 if config == "1 thread" else 2)
    embedder.govern_threads = config.startswith("governed")
    # As a fresh `ktcli ask` finds it: no governor yet, and the load seen over the model's
    # load (~0.3 s), which the governor starts from
    embedder._threads, embedder._load_started = None, cpu_sample()
    embedder._seen = embedder._others = None  # (a short call's look at the load: `_few_texts_threads`)
    time.sleep(0.3)
    t0 = time.perf_counter()
    embedder.embed(texts)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    parser = arg_parser("embed_under_load", __doc__, "embed_under_load")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--loads", default="0,1", help="busy processes beside each run, comma-separated")
    parser.add_argument("--inputs", default="", help="only the inputs whose name holds one of these words, "
                        "comma-separated (tutorial, pages, lines)")
    args = parser.parse_args(argv)

    from ktcli.retrieval.embedder import Embedder

    embedder = Embedder("minilm")
    embedder.embed(["warm up"])
    inputs = _inputs()
    if args.inputs:
        inputs = {name: texts for name, texts in inputs.items() if any(w in name for w in args.inputs.split(","))}
    result: dict = {"machine": machine(), "baseline": CONFIGS[0], "dtype": embedder._load().dtype, "loads": {}}
    for load in (int(x) for x in args.loads.split(",")):
        spinners = busy(load, 1200)  # (ended below; a crash leaves them 20 minutes at most)
        try:
            time.sleep(1.0 if load else 0.0)  # the spinners at full speed first
            per_input: dict = {}
            for name, texts in inputs.items():
                seconds: dict[str, list[float]] = {c: [] for c in CONFIGS}
                for _ in range(args.reps):
                    for config in CONFIGS:  # interleaved: a busy spell of the machine slows each
                        seconds[config].append(_embed_once(embedder, texts, config))
                base = statistics.median(seconds[CONFIGS[0]])
                per_input[name] = {c: {"median_s": round(statistics.median(s), 2), "runs_s": [round(x, 2) for x in s],
                                       "vs_baseline": round(base / statistics.median(s), 2)} for c, s in seconds.items()}
            result["loads"][str(load)] = per_input
        finally:
            for p in spinners:
                p.kill()
    for load, per_input in result["loads"].items():
        for name, row in per_input.items():
            cells = "  ".join(f"{c}: {v['median_s']:.2f}s ({v['vs_baseline']:.2f}x)" for c, v in row.items())
            print(f"{load} busy | {name:38} | {cells}")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
    sys.exit(0)
