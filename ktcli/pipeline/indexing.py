"""Build (or reuse from the cache) the hybrid index over a request's chunks."""

from __future__ import annotations

import functools

from ktcli.config import Settings
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.prepare import Prepared


def build_index(prep: Prepared, settings: Settings, reporter: Reporter):
    # Imported here: sentence-transformers costs seconds to import, and a question that
    # fits the window whole never needs it.
    from ktcli.retrieval.retriever import HybridIndex
    from ktcli.retrieval.store import IndexStore

    store = IndexStore(settings.cache_path)

    def on_progress(phase: str, done: int, total: int) -> None:
        if phase == "cached":  # said once the store was read: "indexing" alone misled when nothing was
            reporter.status(_index_status(done, total))
        else:
            reporter.progress(phase, done, total)

    return HybridIndex.build(list(prep.chunks), embedder=_embedder(settings.embedder), store=store,
                             on_progress=on_progress)


def _index_status(reused: int, total: int) -> str:
    if reused == total:
        return f"index of {total:,} chunks reused from the cache"
    if reused:
        return f"indexing {total - reused:,} new chunks ({reused:,} reused from the cache)"
    return f"indexing {total:,} chunks"


@functools.lru_cache(maxsize=2)
def _embedder(spec: str):
    """One embedder per process: loading it costs seconds, and a process may index twice."""
    from ktcli.retrieval.embedder import Embedder

    return Embedder(spec)
