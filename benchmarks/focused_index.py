"""A question about a large folder not yet embedded: the index built for it (--embed auto,
`retriever._focus`: BM25's best 1,000 chunks for the question and the chunks its names
define or use) against the index of every chunk (--embed all, the baseline), in one run.

    HF_HUB_OFFLINE=1 python -m benchmarks.focused_index --json     # ~7 min here

The corpus is torch/fx as installed beside ktcli (torch 2.13.0, ~2,300 chunks as the CLI
cuts them), and 12 questions about it written for this benchmark. Measured:
* time: the baseline's embedding of every chunk, against cold focused builds (fresh store,
  the real embedder) for the first --timed questions: the seconds a first question waits;
* agreement: for every question, the focused index's top 8 against the baseline's (what
  `ktcli ask` reads): the same first chunk, and how many of the 8 both hold. The focused
  builds of this part take their vectors from the baseline's (recorded: the embedder gives
  a text the same vector in any batch, up to float rounding), so all 12 cost no embedding;
  everything else is the real build and search. There is no gold here: the baseline's
  ranking is the reference, good or bad;
* other focus sizes (--sizes): the same agreement with FOCUS_CHUNKS set to each, to see
  how far it could shrink (the cold time is about proportional to it);
* later questions: the 12 asked in turn of one store (recorded vectors again), the chunks
  each embeds beside what the ones before it kept: the cost moved from the first question
  to the next ones.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common

QUESTIONS = [
    "How does symbolic tracing record the operations of a module into a graph?",
    "What does the Interpreter class do?",
    "How are nodes removed from a graph?",
    "How does GraphModule generate Python code from its graph?",
    "What is a Proxy object used for?",
    "How does subgraph rewriting replace a pattern with a replacement?",
    "How does the shape propagation pass work?",
    "How is a graph split into submodules?",
    "What does `eliminate_dead_code` do?",
    "How does the Transformer class differ from the Interpreter?",
    "How is a node's list of users kept up to date?",
    "Where is the stack trace of a node kept?",
]
TOP_K = 8


class RecordedEmbedder:
    """The baseline's vectors, looked up by text: a focused build over them embeds nothing."""

    def __init__(self, real, texts: list[str], vectors: np.ndarray) -> None:
        self.name, self.dim = real.name, real.dim
        self._real = real
        self._by_text = {t: v for t, v in zip(texts, vectors)}
        self.n_embedded = 0

    def embed(self, texts, *, on_progress=None):
        self.n_embedded += len(texts)
        return np.stack([self._by_text[t] for t in texts])

    def embed_query(self, text):
        return self._real.embed_query(text)

    def vocabulary_share(self, text):
        return self._real.vocabulary_share(text)


def corpus_chunks():
    import torch

    from ktcli.ingest.chunking import chunk_corpus
    from ktcli.ingest.corpus import load_corpus

    folder = Path(torch.__file__).parent / "fx"
    return folder, chunk_corpus(load_corpus([str(folder)]), chunk_tokens=256, overlap_tokens=32)


def run(args) -> dict:
    from ktcli.retrieval import retriever
    from ktcli.retrieval.embedder import Embedder
    from ktcli.retrieval.retriever import HybridIndex, indexed_text
    from ktcli.retrieval.store import IndexStore

    folder, chunks = corpus_chunks()
    embedder = Embedder("minilm")
    embedder.embed(["warm up"])  # the model's load is no build's
    scratch = Path(tempfile.mkdtemp(prefix="ktcli-focus-"))
    try:
        t0 = time.perf_counter()
        full = HybridIndex.build(chunks, embedder=embedder, store=IndexStore(scratch / "full"))
        full_s = time.perf_counter() - t0
        vectors = full.dense._index.reconstruct_n(0, len(full))
        recorded = RecordedEmbedder(embedder, [indexed_text(c) for c in chunks], vectors)
        rows, timed = [], []
        for n, question in enumerate(QUESTIONS):
            reference = full.search(question, TOP_K)
            focused = HybridIndex.build(chunks, embedder=recorded, store=IndexStore(scratch / f"q{n}"), focus=question)
            hits = focused.search(question, TOP_K)
            same = len({id(h.chunk) for h in hits} & {id(h.chunk) for h in reference})
            rows.append({"question": question, "embedded": focused.stats["n_embedded_now"],
                         "same_first": hits[0].chunk is reference[0].chunk, "shared_of_8": same,
                         "first": f"{hits[0].chunk.doc_path}:{hits[0].chunk.span.line_start}",
                         "baseline_first": f"{reference[0].chunk.doc_path}:{reference[0].chunk.span.line_start}"})
            print(f"{n + 1:2d} embedded {rows[-1]['embedded']:5,}  first {'same' if rows[-1]['same_first'] else 'DIFF'}"
                  f"  shared {same}/{TOP_K}  {question}", file=sys.stderr)
        by_size = {}
        for size in args.sizes:
            retriever.FOCUS_CHUNKS, kept_size = size, retriever.FOCUS_CHUNKS
            try:
                first = shared = 0
                for n, question in enumerate(QUESTIONS):
                    reference = full.search(question, TOP_K)
                    focused = HybridIndex.build(chunks, embedder=recorded, store=None, focus=question)
                    hits = focused.search(question, TOP_K)
                    first += hits[0].chunk is reference[0].chunk
                    shared += len({id(h.chunk) for h in hits} & {id(h.chunk) for h in reference})
            finally:
                retriever.FOCUS_CHUNKS = kept_size
            by_size[size] = {"same_first": first, "mean_shared_of_8": round(shared / len(QUESTIONS), 2)}
            print(f"focus of {size:,}: same first {first}/{len(QUESTIONS)}, shared {shared / len(QUESTIONS):.2f}/{TOP_K}",
                  file=sys.stderr)
        in_turn = []
        for question in QUESTIONS:
            asked = HybridIndex.build(chunks, embedder=recorded, store=IndexStore(scratch / "in-turn"), focus=question)
            in_turn.append(asked.stats["n_embedded_now"])
        print(f"asked in turn: {in_turn} chunks embedded, {sum(in_turn):,} of {len(chunks):,}", file=sys.stderr)
        for n, question in enumerate(QUESTIONS[: args.timed]):
            t0 = time.perf_counter()
            cold = HybridIndex.build(chunks, embedder=embedder, store=IndexStore(scratch / f"cold{n}"), focus=question)
            timed.append({"question": question, "seconds": round(time.perf_counter() - t0, 1),
                          "embedded": cold.stats["n_embedded_now"]})
            print(f"cold focused build {timed[-1]['seconds']} s ({timed[-1]['embedded']:,} chunks) vs "
                  f"{full_s:.1f} s for all {len(chunks):,}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    focused_s = sum(t["seconds"] for t in timed) / max(len(timed), 1)
    return {
        "machine": common.machine(),
        "corpus": f"torch/{folder.name} (torch {__import__('torch').__version__})",
        "n_chunks": len(chunks),
        "focus_from": retriever.FOCUS_FROM,
        "focus_chunks": retriever.FOCUS_CHUNKS,
        "baseline": "--embed all: every chunk embedded",
        "baseline_build_s": round(full_s, 1),
        "focused_builds": timed,
        "speedup": round(full_s / focused_s, 2) if timed else None,
        "same_first": sum(r["same_first"] for r in rows),
        "mean_shared_of_8": round(sum(r["shared_of_8"] for r in rows) / len(rows), 2),
        "n_questions": len(rows),
        "in_turn_embedded": in_turn,
        "by_focus_size": by_size,
        "questions": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = common.arg_parser("focused_index", __doc__, "focused_index")
    parser.add_argument("--timed", type=int, default=2, help="cold focused builds timed (each embeds ~1,000 chunks)")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x], default=[250, 500],
                        help="other FOCUS_CHUNKS whose agreement is measured (comma-separated)")
    args = parser.parse_args(argv)
    result = run(args)
    common.report(args.name, result, args.json)
    print(f"{result['n_chunks']:,} chunks: all embedded in {result['baseline_build_s']} s; a question's focused "
          f"build {result['speedup']}x faster; same first chunk {result['same_first']}/{result['n_questions']}, "
          f"top {TOP_K} shared {result['mean_shared_of_8']}/{TOP_K} on average")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
