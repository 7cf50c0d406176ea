"""Build (or reuse from the cache) the hybrid index over a request's chunks."""

from __future__ import annotations

import functools

from ktcli.config import Settings
from ktcli.errors import Interrupted, interruption
from ktcli.pipeline.events import Reporter
from ktcli.pipeline.prepare import Prepared


def build_index(prep: Prepared, settings: Settings, reporter: Reporter, query: str | None = None):
    """The index of `prep`'s chunks. `query`: what it is searched for, which chooses the
    chunks embedded where many are not in the cache yet (--embed auto: `HybridIndex.build`)."""
    # Imported here: sentence-transformers costs seconds to import, and a question that
    # fits the window whole never needs it.
    from ktcli.retrieval.retriever import HybridIndex
    from ktcli.retrieval.store import IndexStore

    store = IndexStore(settings.cache_path)
    kept = [0, 0]  # chunks embedded and written to the store this run, of those to embed
    focused: list[int] = []  # chunks the question chose to embed, of those not embedded

    def on_progress(phase: str, done: int, total: int) -> None:
        if phase == "focus":
            focused[:] = [done, total]
        elif phase == "cached":  # said once the store was read: "indexing" alone misled when nothing was
            reporter.status(_index_status(done, total, *focused))
        elif phase == "kept":
            kept[:] = [done, total]
        else:
            reporter.progress(phase, done, total)

    try:
        index = HybridIndex.build(list(prep.chunks), embedder=embedder_for(settings), store=store,
                                  on_progress=on_progress, focus=query if settings.embed == "auto" else None)
    except KeyboardInterrupt:
        if not kept[0] or store.write_errors:
            raise
        # Said, as a summary's kept notes are: a user who stopped a 10-minute indexing
        # learns the next question does not start it over.
        raise Interrupted(f"{interruption()[0]} while indexing: the embeddings of {kept[0]:,} of {kept[1]:,} chunks "
                          "are kept, and the next question about this input starts from them") from None
    if index.stats.get("n_embedded_now"):
        store.prune(INDEX_MAX_BYTES)  # it only ever grew: every edit of a file kept its old vectors too
    if index.stats.get("store_write_errors"):  # said: the next question would embed it all again, unexplained
        reporter.warn(f"the index could not be kept in the cache ({store.write_errors[0]}): "
                      "the next question about this input embeds it again")
    return index


# The index cache's bound (least recently used entries go first): ~250M tokens of input.
INDEX_MAX_BYTES = 2 << 30


def _index_status(reused: int, total: int, focused: int | None = None, missing: int = 0) -> str:
    if focused is not None:
        # Said with what the rest costs: a user who wants every chunk ranked by meaning now
        # knows the flag, and that later questions fill the cache anyway.
        if not focused:
            # "indexing 0 of 5,649 chunks" where a question was asked again
            return (f"index reused from the cache: it holds the chunks the question's words point at "
                    f"({reused:,} of {_chunks(total)}; {missing:,} not embedded: --embed all embeds every one)")
        held = f", {reused:,} in the cache" if reused else ""
        return (f"indexing {focused:,} of {_chunks(total)} (those the question's words point at{held}; "
                f"{missing - focused:,} not embedded: --embed all embeds every one)")
    if reused == total:
        return f"index of {_chunks(total)} reused from the cache"
    if reused:
        return f"indexing {total - reused:,} new {_chunks(total - reused, number=False)} ({reused:,} reused from the cache)"
    return f"indexing {_chunks(total)}"


def _chunks(n: int, number: bool = True) -> str:
    word = "chunk" if n == 1 else "chunks"
    return f"{n:,} {word}" if number else word


def embedder_for(settings: Settings):
    """The embedder `settings` name, loaded on its first `embed`."""
    return _embedder(settings.embedder, settings.threads == 0)


@functools.lru_cache(maxsize=2)
def _embedder(spec: str, governed: bool):
    """One embedder per process: loading it costs seconds, and a process may index twice.
    `governed`: its thread count chosen by timing (no --threads given)."""
    from ktcli.retrieval.embedder import Embedder

    return Embedder(spec, govern_threads=governed)
