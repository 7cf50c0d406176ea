"""Embedding in bf16 against fp32: speed, how far the vectors move, and what retrieval finds.

    python -m benchmarks.embed_dtype --json      # ~3 min here; results/embed_dtype.json

The chunks of retrieval_recall's corpora (the tutorial, the minirepo, the sample PDF, click
as installed; 256 tokens, 32 shared, indexed with their section trails as `ask` indexes
them) are embedded by the bundled MiniLM through `retrieval.bert_encoder` twice in the
same run, alternately and `--rounds` times each: with fp32 matrix products (the baseline,
what every CPU without AMX runs) and with bf16 ones (autocast; what a CPU with AMX tiles
runs by default). Reported: chunks per second of each (best round), the cosine between the
two vectors of every chunk, and retrieval_recall's 140 gold questions ranked as `ask` ranks
them ("defs": fused scores, definitions first) over each set of vectors.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import numpy as np

from benchmarks import common
from benchmarks.retrieval_recall import K, _cases, _rank, _scores

DTYPES = ("fp32", "bf16")


def _chunks(paths: list[str]):
    from ktcli.ingest.chunking import chunk_corpus
    from ktcli.ingest.corpus import load_corpus

    return chunk_corpus(load_corpus(paths), chunk_tokens=256, overlap_tokens=32)


def run(args) -> dict:
    import torch

    from ktcli.hardware import native_bf16_matmul
    from ktcli.retrieval.embedder import Embedder
    from ktcli.retrieval.retriever import HybridIndex, _fuse, indexed_text
    from ktcli.retrieval.symbols import code_names, used_names

    embedders = {dtype: Embedder("minilm", dtype=dtype) for dtype in DTYPES}
    for e in embedders.values():
        e.embed(["warm up"])
    result: dict = {"machine": common.machine(), "amx": native_bf16_matmul(), "threads": torch.get_num_threads(),
                    "rounds": args.rounds, "corpora": {}}
    pooled: dict[str, list] = {dtype: [] for dtype in DTYPES}
    all_cos: list[np.ndarray] = []
    seconds = {dtype: 0.0 for dtype in DTYPES}
    n_total = 0
    for name, (paths, sets) in _cases().items():
        chunks = _chunks(paths)
        texts = [indexed_text(c) for c in chunks]
        best = {dtype: float("inf") for dtype in DTYPES}
        vectors = {}
        for _ in range(args.rounds):
            for dtype in DTYPES:  # alternately: a busy spell of the machine slows both
                t0 = time.perf_counter()
                vectors[dtype] = embedders[dtype].embed(texts)
                best[dtype] = min(best[dtype], time.perf_counter() - t0)
        cos = (vectors["fp32"] * vectors["bf16"]).sum(1)
        all_cos.append(cos)
        entry = {"n_chunks": len(chunks), "seconds": {d: round(best[d], 2) for d in DTYPES},
                 "chunks_per_s": {d: round(len(chunks) / best[d], 1) for d in DTYPES},
                 "speedup_bf16": round(best["fp32"] / best["bf16"], 2),
                 "cosine": {"min": float(cos.min()), "mean": float(cos.mean())}, "sets": {}}
        for d in DTYPES:
            seconds[d] += best[d]
        n_total += len(chunks)
        for dtype in DTYPES:
            index = HybridIndex.build(chunks, embedder=_Fixed(embedders[dtype], texts, vectors[dtype]), store=None)
            for set_name, cases in sets.items():
                ranks = []
                for question, places in cases:
                    dense = index.dense.search(embedders[dtype].embed_query(question), 50)
                    lexical = index.lexical.search(question, 50)
                    hits = _fuse(index.chunks, dense, lexical, max(K), index.symbols.defining(code_names(question)),
                                 using=index.symbols.using(used_names(question)))
                    ranks.append(_rank([h.chunk for h in hits][: max(K)], places))
                entry["sets"].setdefault(set_name, {})[dtype] = {**_scores(ranks), "ranks": ranks}
                pooled[dtype].extend(ranks)
        result["corpora"][name] = entry
    cos = np.concatenate(all_cos)
    result["all"] = {
        "n_chunks": n_total, "chunks_per_s": {d: round(n_total / seconds[d], 1) for d in DTYPES},
        "speedup_bf16": round(seconds["fp32"] / seconds["bf16"], 2),
        "cosine": {"min": float(cos.min()), "mean": float(cos.mean())},
        "recall": {d: {**_scores(pooled[d]), "n_questions": len(pooled[d])} for d in DTYPES},
        "questions_ranked_differently": sum(a != b for a, b in zip(pooled["fp32"], pooled["bf16"])),
    }
    return result


@dataclasses.dataclass
class _Fixed:
    """An embedder that gives back vectors already computed (the index is built over the
    vectors timed above, not embedded a third time)."""

    inner: object
    texts: list[str]
    vectors: np.ndarray

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    def __post_init__(self) -> None:
        self.row = {text: i for i, text in enumerate(self.texts)}

    def embed(self, texts: list[str], *, on_progress=None) -> np.ndarray:
        return self.vectors[[self.row[t] for t in texts]]  # the index asks for the texts timed above

    def embed_query(self, text: str) -> np.ndarray:
        return self.inner.embed_query(text)


def print_table(result: dict) -> None:
    print(f"{'corpus':9} {'chunks':>6} {'fp32 ch/s':>9} {'bf16 ch/s':>9} {'speedup':>7} {'cos min':>8}")
    for name, e in result["corpora"].items():
        print(f"{name:9} {e['n_chunks']:>6} {e['chunks_per_s']['fp32']:>9} {e['chunks_per_s']['bf16']:>9} "
              f"{e['speedup_bf16']:>6}x {e['cosine']['min']:>8.5f}")
    a = result["all"]
    print(f"all: {a['n_chunks']} chunks, bf16 {a['speedup_bf16']}x fp32's speed; cosine min {a['cosine']['min']:.5f}, "
          f"mean {a['cosine']['mean']:.6f}")
    for d in DTYPES:
        r = a["recall"][d]
        print(f"  {d}: {r['n_questions']} questions R@1 {r['recall@1']:.2f} R@3 {r['recall@3']:.2f} "
              f"R@8 {r['recall@8']:.2f} MRR@8 {r['mrr@8']:.3f}")
    print(f"  questions whose gold rank differs: {a['questions_ranked_differently']}")


def main(argv=None) -> int:
    ap = common.arg_parser("embed_dtype", __doc__, "embed_dtype")
    ap.add_argument("--rounds", type=int, default=2, help="timed embeddings of each corpus per dtype (best kept)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args)
    print_table(result)
    common.report(args.name, result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
