"""Subprocess body for the kill -9 and concurrency tests: build an index over a small
synthetic corpus with the slow fake embedder, print progress, then write the results.

    python -m tests.retrieval.build_worker CACHE_DIR OUT_JSON DELAY_S COMMIT_EVERY
"""

from __future__ import annotations

import hashlib
import json
import sys

from ktcli.retrieval.retriever import HybridIndex
from ktcli.retrieval.store import IndexStore
from tests.retrieval.fakes import HashEmbedder, make_corpus

N_DOCS, CHUNKS_PER_DOC = 12, 3
QUERIES = ["compute value topic alpha", "document 7 note", "gamma returns"]


def corpus():
    return make_corpus(N_DOCS, CHUNKS_PER_DOC)


def summary(index: HybridIndex) -> dict:
    vectors = index.dense._index.reconstruct_n(0, len(index))
    return {
        "stats": index.stats,
        "vectors_sha256": hashlib.sha256(vectors.round(3).tobytes()).hexdigest(),
        "hits": {q: [[h.chunk.chunk_id, round(h.score, 9)] for h in index.search(q, 5)] for q in QUERIES},
    }


def main(cache_dir: str, out_json: str, delay_s: str, commit_every: str) -> None:
    def progress(stage: str, done: int, total: int) -> None:
        print(f"{stage} {done} {total}", flush=True)

    index = HybridIndex.build(
        corpus(),
        embedder=HashEmbedder(delay_s=float(delay_s)),
        store=IndexStore(cache_dir),
        on_progress=progress,
        commit_every=int(commit_every),
    )
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(summary(index), f)


if __name__ == "__main__":
    main(*sys.argv[1:])
