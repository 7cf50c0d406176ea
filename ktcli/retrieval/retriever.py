"""Hybrid retrieval: dense (embeddings + faiss) and lexical (BM25), fused by score.

Each ranking's candidates are scaled to [0, 1] by min-max over its own list (the best
candidate 1, the last 0; a chunk absent from a list scores 0 there), and the two are
added, BM25's at LEXICAL_WEIGHT, the dense one's at d (1, less where the embedder reads the
question or its nearest passages as letters, not words: `HybridIndex._dense_weight`):
    score = d * (cos - cos_min) / (cos_max - cos_min) + w * (bm25 - bm25_min) / (bm25_max - bm25_min)
A convex combination of normalised scores keeps how far apart the candidates are, which
reciprocal rank fusion (RRF, what this module used before) throws away: a chunk that
dense search finds clearly best is not outvoted by one that both lists place middling.
Bruch, Gai & Ingber ("An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS
2023) found it ahead of RRF; so did our gold questions (`benchmarks/retrieval_recall.py`,
figures in BENCHMARKS.md).
"""

from __future__ import annotations

import csv
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ktcli.config import EMBED_FOCUS_CHUNKS, EMBED_FOCUS_FROM
from ktcli.retrieval.dense import DenseIndex
from ktcli.retrieval.embedder import Embedder, TextEmbedder
from ktcli.retrieval.lexical import BM25Index
from ktcli.retrieval.lexical_cache import bm25_index
from ktcli.retrieval.options import OptionEntries, asked_options
from ktcli.retrieval.store import PART_CHUNKS, IndexStore, chunking_fingerprint, entry_key, text_sha256
from ktcli.retrieval.section_names import SectionTable, named_sections
from ktcli.retrieval.symbols import SymbolTable, code_names, used_names
from ktcli.types import TABLE_TRAIL, Chunk

# BM25's share. Dense leads because BM25 scores have a long tail: after min-max, a chunk
# that repeats the question's rare name (a street named like the pump asked about) would
# otherwise outweigh a clear dense winner (tests/retrieval/test_retriever.py). Weights 0.5
# to 1.0 scored within 0.015 MRR@8 of each other on the gold questions.
LEXICAL_WEIGHT = 0.6
MIN_CANDIDATES = 50  # each ranking contributes at least this many candidates to the fusion
# Added to a chunk that defines a name the query spells as code ("class ProgressBar"): as
# much as the best match of both rankings, so the definition comes first, its uses after.
DEFINITION_BONUS = 1.0 + LEXICAL_WEIGHT
# Added to a chunk that uses a name the query asks the callers or uses of ("what calls
# `make_str`?"): as much again, so the uses come before every chunk without one (the
# definition's neighbours, which the embedder ranked first), and a definition, which takes
# both bonuses, before them.
USE_BONUS = DEFINITION_BONUS
# Added to a chunk in (or opening) a section the query names by number ("what does
# section 3.2 say?", "clause 7.3"; `section_names`): as much as a definition's, so the
# section's chunks come first, ordered among themselves by the rankings.
SECTION_BONUS = DEFINITION_BONUS
# Dense search counts in full for a query whose letters the embedder's vocabulary holds as
# words (`Embedder.vocabulary_share`) at this share or more, and in proportion below it.
# all-MiniLM-L6-v2 knows English: an Arabic or Hebrew question's vector is noise, and
# min-max stretched that noise over BM25's clear winner (a question whose every word was
# in one passage got 8 chapter headings; BM25 ranked the passage first, dense 60th).
DENSE_FULL_SHARE = 0.8
READ_SAMPLE = 16  # the nearest passages whose share is weighed (their median)
# ... in full from this share of the passages' letters read as words: code with one-letter
# names is 0.55-0.9, the tutorial's prose 0.86-1.0, Arabic or Hebrew read as letters 0.
PASSAGES_FULL_SHARE = 0.5
BLIND_WEIGHT = 0.25  # under it, with no passage holding a word of the question, retrieval is a guess
COMMIT_EVERY = 256  # chunks embedded between store writes: the most a kill can waste
# A question about an input with more chunks than FOCUS_FROM not yet embedded embeds the
# FOCUS_CHUNKS that BM25 ranks best for it (and the chunks defining or using a name it
# asks about), not every one: embedding is ~99% of a cold question over a large folder
# (torch/_dynamo's 5,649 chunks: 527 of 531 CPU s on 2 cores). On torch/fx's 2,343 chunks
# 12 questions got the same first chunk and the same top 8 as with every chunk embedded,
# in 2.56x less time (`benchmarks/focused_index.py`). The dense ranking then orders what
# the words found; a later question embeds its own, and the cache fills.
FOCUS_FROM = EMBED_FOCUS_FROM
FOCUS_CHUNKS = EMBED_FOCUS_CHUNKS
# ... unless its words match fewer chunks than this: words the input hardly writes (another
# language, other terms) leave dense search the only way to its passages. Not FOCUS_CHUNKS:
# "What does `eliminate_dead_code` do?" matches ~700 of torch/fx's 2,343 chunks, and all
# 2,343 were embedded for it.
FOCUS_MIN_MATCHED = 100

BuildProgress = Callable[[str, int, int], None]  # (stage, done, total); stages below


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float  # fused score, in [0, 1 + LEXICAL_WEIGHT], plus DEFINITION_BONUS for a definition, USE_BONUS for a use, SECTION_BONUS for a named section
    dense_rank: int | None  # 1-based rank among dense candidates; None if not among them
    lexical_rank: int | None  # 1-based rank among BM25 matches; None if no match


@dataclass
class _Part:
    """A run of chunks of one document stored as one cache entry."""

    key: str
    positions: list[int]  # indices into the build's chunk list
    hashes: list[str]
    doc_sha256: str
    doc_path: str
    part: int
    vectors: np.ndarray | None = None  # float32 [len(positions), dim], zero where not held
    held: np.ndarray | None = None  # bool [len(positions)]: the rows embedded


@dataclass
class HybridIndex:
    chunks: list[Chunk]
    dense: DenseIndex
    lexical: BM25Index
    embedder: TextEmbedder
    stats: dict = field(default_factory=dict)
    # The chunk each of `dense`'s vectors is (None: vector i is chunk i): a focused build
    # embeds some chunks only (FOCUS_FROM)
    dense_positions: np.ndarray | None = None
    tables: _NameTables | None = None
    last_blind: bool = field(default=False, init=False)  # the last search was a guess (`search`)

    def __post_init__(self) -> None:
        if self.tables is None:
            self.tables = _NameTables.of(self.chunks)

    @property
    def symbols(self) -> SymbolTable:
        return self.tables.symbols

    @property
    def options(self) -> OptionEntries:
        return self.tables.options

    @property
    def sections(self) -> SectionTable:
        return self.tables.sections

    @classmethod
    def build(
        cls,
        chunks: list[Chunk],
        *,
        embedder: TextEmbedder | Embedder,
        store: IndexStore | None,
        on_progress: BuildProgress | None = None,
        commit_every: int = COMMIT_EVERY,
        focus: str | None = None,
    ) -> HybridIndex:
        """Index chunks, reusing the store's vectors for every unchanged document.
        `focus`: the question the index is built for, where more than FOCUS_FROM chunks
        need embedding and only those it points at should be (`_focus`); None embeds all.

        Progress stages: ("lexical", 0, 1) and ("lexical", 1, 1) around the BM25 build,
        ("focus", chunks to embed, chunks not embedded) where the question chose them, then
        ("cached", chunks reused, chunks) once the store was read, then ("embed", chunks
        embedded, chunks to embed) after each batch, ("kept", chunks written to the store,
        chunks to embed) after each group is written."""
        chunks = list(chunks)
        parts = _plan_parts(chunks, embedder.name)
        n_reused = _load_cached(parts, store, embedder) if store is not None else _load_nothing(parts)
        if on_progress is not None:
            on_progress("lexical", 0, 1)
        t0 = time.perf_counter()
        # (kept beside the store's vectors: a question about an unchanged corpus reads it back)
        lexical = bm25_index([lexical_text(c) for c in chunks], store.root.parent if store is not None else None)
        lexical_s = time.perf_counter() - t0
        if on_progress is not None:
            on_progress("lexical", 1, 1)
        tables = _NameTables.of(chunks)
        missing = len(chunks) - n_reused
        wanted = _focus(focus, chunks, lexical, tables) if focus is not None and missing > FOCUS_FROM else None
        if wanted is not None and on_progress is not None:
            held = _held_mask(parts, len(chunks))
            on_progress("focus", sum(not held[pos] for pos in wanted), missing)
        if on_progress is not None:
            on_progress("cached", n_reused, len(chunks))
        embed_s, n_embedded, embedded_tokens = _embed_missing(parts, chunks, embedder, store, on_progress,
                                                              commit_every, wanted)

        vectors, positions = _assemble(parts, len(chunks), embedder, store)
        dense = DenseIndex(vectors)
        stats = {
            "n_chunks": len(chunks),
            "n_embedded_now": n_embedded,
            "n_reused": n_reused,
            "n_not_embedded": len(chunks) - len(dense),  # a focused build's left for later questions
            "index_bytes": dense.nbytes + lexical.nbytes,
            "embed_s": round(embed_s, 3),
            "embedded_tokens": embedded_tokens,  # the chunks' estimated tokens (ingest.count_tokens)
            "model_load_s": round(getattr(embedder, "load_s", 0.0), 3),
            "lexical_s": round(lexical_s, 3),
            "store_write_errors": len(store.write_errors) if store is not None else 0,
        }
        return cls(chunks=chunks, dense=dense, lexical=lexical, embedder=embedder, stats=stats,
                   dense_positions=positions, tables=tables)

    def __len__(self) -> int:
        return len(self.chunks)

    def search(self, query: str, k: int) -> list[Hit]:
        """The k best chunks for the query, best first. Equal fused scores are ordered by
        the better of the two ranks, then by position in the chunk list."""
        if k <= 0 or not self.chunks:
            return []
        depth = min(len(self.chunks), max(MIN_CANDIDATES, 4 * k))
        dense = self.dense.search(self.embedder.embed_query(query), depth)
        if self.dense_positions is not None:
            dense = [(int(self.dense_positions[i]), score) for i, score in dense]
        lexical = self.lexical.search(query, depth)
        dense_weight = self._dense_weight(query, dense)
        # an option's entry ("-S  sort by file size") is a definition of the option the
        # question names ("what does -S do?"), which BM25 reads as the letter "s" (probe 125)
        defining = self.symbols.defining(code_names(query)) | self.options.defining(asked_options(query))
        hits = _fuse(self.chunks, dense, lexical, len(self.chunks), defining, dense_weight,
                     self.symbols.using(used_names(query)), self.sections.naming(named_sections(query)))
        # A heading alone (left over where the paragraph under it was too long to share its
        # chunk) gives the model nothing to read; its words are in that paragraph's trail.
        # It comes last, not out: an outline's chunks may all be headings.
        hits = _distinct(sorted(hits, key=lambda hit: hit.chunk.heading_only))
        hits = _each_document(hits, k) if _COMPARES.search(query) else hits[:k]
        # Neither ranking could tell: no passage holds a word of the question, and the
        # embedder reads the question or the passages as letters (an English question about
        # Arabic documents). Said by the caller: the passages are a guess.
        self.last_blind = dense_weight < BLIND_WEIGHT and not any(hit.lexical_rank for hit in hits)
        return hits

    def _dense_weight(self, query: str, dense: list[tuple[int, float]]) -> float:
        """The dense ranking's share: by how much of the query the embedder reads as words,
        and of the passages it found nearest (their median), the lesser: a question it reads
        about documents it cannot ranks noise as surely as the other way round."""
        weight = min(1.0, self.embedder.vocabulary_share(query) / DENSE_FULL_SHARE)
        texts = [self.chunks[idx].text for idx, _ in dense[:READ_SAMPLE]]
        if texts and weight > 0:
            shares = sorted(self.embedder.vocabulary_share(text) for text in texts)
            weight = min(weight, shares[len(shares) // 2] / PASSAGES_FULL_SHARE)
        return min(1.0, weight)


def _distinct(hits: list[Hit]) -> list[Hit]:
    """The hits less those whose text (whitespace aside) a better one has: a passage a
    document repeats (a disclaimer on every page, a clause, a page printed twice) took 6 of
    a question's 8 places in a probe's 318-page PDF, the same words six times."""
    seen: set[str] = set()
    out = []
    for hit in hits:
        text = " ".join(hit.chunk.text.split())
        if text not in seen:
            seen.add(text)
            out.append(hit)
    return out


@dataclass(frozen=True)
class _NameTables:
    """What a query's names find without either ranking: definitions and uses of code
    names, option entries, numbered sections."""

    symbols: SymbolTable
    options: OptionEntries
    sections: SectionTable

    @classmethod
    def of(cls, chunks: list[Chunk]) -> _NameTables:
        return cls(SymbolTable(chunks), OptionEntries([c.text for c in chunks]), SectionTable(chunks))


def _focus(query: str, chunks: list[Chunk], lexical: BM25Index, tables: _NameTables) -> set[int] | None:
    """The chunks a question over a large, not yet embedded input embeds: BM25's best
    FOCUS_CHUNKS for it, and those its names find (what `search` adds bonuses to). None
    (embed them all) where its words match fewer than FOCUS_MIN_MATCHED chunks."""
    matched = lexical.search(query, FOCUS_CHUNKS)
    if len(matched) < FOCUS_MIN_MATCHED:
        return None
    wanted = {idx for idx, _ in matched}
    wanted |= tables.symbols.defining(code_names(query)) | tables.options.defining(asked_options(query))
    wanted |= tables.symbols.using(used_names(query)) | tables.sections.naming(named_sections(query))
    return wanted


def planned_embeddings(chunks: Sequence[Chunk], held: Sequence[bool], focus: str | None,
                       cache_dir: Path | None) -> list[int]:
    """The chunks `build(focus=focus)` embeds, of those `held` says are not: `_focus`'s own
    choice over the same BM25 index (kept under `cache_dir`, so the run reads it back). A
    count of FOCUS_CHUNKS planned ~1,000 of torch/fx's 2,343 chunks where the run embedded
    531 ("What does `eliminate_dead_code` do?") or all 2,343 (a question in German), and a
    question asked again over torch's 111,409 chunks at ~194 s for a run of 45 s."""
    missing = [pos for pos, is_held in enumerate(held) if not is_held]
    if focus is None or len(missing) <= FOCUS_FROM:
        return missing
    chunks = list(chunks)
    lexical = bm25_index([lexical_text(c) for c in chunks], cache_dir)
    wanted = _focus(focus, chunks, lexical, _NameTables.of(chunks))
    return missing if wanted is None else [pos for pos in missing if pos in wanted]


def cached_chunks(chunks: Sequence[Chunk], embedder_name: str, store: IndexStore) -> list[bool]:
    """For each chunk, whether the store holds its vector (the planner counts what is left
    to embed; nothing is read but the entries' manifests)."""
    held = [False] * len(chunks)
    for part in _plan_parts(list(chunks), embedder_name):
        for pos, is_held in zip(part.positions, store.held(part.key, part.hashes)):
            held[pos] = is_held
    return held


def lexical_text(chunk: Chunk) -> str:
    """What BM25 indexes for a chunk: `indexed_text`, a CSV's fields apart. Its commas part
    fields, not thousands: "2023,100,250" is a year and two figures, never 100,250; a quoted
    field ("11,250,000") stays whole, and a TSV's commas are its text."""
    text = indexed_text(chunk)
    header = chunk.section.removeprefix(TABLE_TRAIL) if chunk.section.startswith(TABLE_TRAIL) else ""
    if "," not in header or "\t" in header:
        return text
    return "\n".join(", ".join(fields) for fields in csv.reader(text.split("\n")))


def indexed_text(chunk: Chunk) -> str:
    """What is embedded and indexed for a chunk: its section trail (ingest.sections), then
    its text. The trail names what the section is about where the chunk's own words may
    not; the prompt still shows the text alone. A wide table's header row is cut to its
    first columns: whole, it would outweigh a chunk's own rows."""
    section = chunk.section
    at = section.find(TABLE_TRAIL)  # a CSV's trail, or a Word or HTML table's under its section
    if at >= 0 and len(section) > at + len(TABLE_TRAIL) + INDEXED_HEADER_CHARS:
        section = section[: at + len(TABLE_TRAIL) + INDEXED_HEADER_CHARS - 1] + "\u2026"
    return f"{section}\n\n{chunk.text}" if section else chunk.text


INDEXED_HEADER_CHARS = 120


def _fuse(
    chunks: Sequence[Chunk], dense: list[tuple[int, float]], lexical: list[tuple[int, float]], k: int,
    defining: set[int] = frozenset(), dense_weight: float = 1.0, using: set[int] = frozenset(),
    named: set[int] = frozenset(),
) -> list[Hit]:
    """`defining`: chunks that define a name the query writes as code (`symbols`), which
    get DEFINITION_BONUS, whether or not either ranking found them. `dense_weight`: the
    dense ranking's share, less than 1 where the embedder cannot read the query or the
    passages. `using`: chunks that use a name the query asks the uses of, which get
    USE_BONUS, found by a ranking or not. `named`: chunks in a section the query names by
    number, which get SECTION_BONUS."""
    dense_rank = {idx: r for r, (idx, _) in enumerate(dense, start=1)}
    lexical_rank = {idx: r for r, (idx, _) in enumerate(lexical, start=1)}
    dense_score, lexical_score = _min_max(dense), _min_max(lexical)
    fused: list[tuple[float, int, int]] = []
    for idx in dense_rank.keys() | lexical_rank.keys() | defining | using | named:
        ranks = [r for r in (dense_rank.get(idx), lexical_rank.get(idx)) if r is not None] or [len(chunks) + 1]
        score = dense_weight * dense_score.get(idx, 0.0) + LEXICAL_WEIGHT * lexical_score.get(idx, 0.0)
        score += DEFINITION_BONUS if idx in defining else 0.0
        score += USE_BONUS if idx in using else 0.0
        score += SECTION_BONUS if idx in named else 0.0
        fused.append((score, min(ranks), idx))
    fused.sort(key=lambda t: (-t[0], t[1], t[2]))
    return [
        Hit(chunk=chunks[idx], score=score, dense_rank=dense_rank.get(idx), lexical_rank=lexical_rank.get(idx))
        for score, _best, idx in fused[:k]
    ]


# A question about several documents at once ("compare the results of the two papers",
# "which of the reports..."): 7 of 8 passages came from one paper, the other's table 15th.
_COMPARES = re.compile(r"\b(?:compar(?:e|es|ed|ing|ison|isons)|contrast(?:s|ed|ing)?)\b|"
                       r"\b(?:both|all|each of the|which of the|none of the|two|three|four|five|six|seven|eight|these|those) "
                       r"(?:papers|documents|files|reports|articles|sources|contracts|agreements|books|studies)\b",
                       re.IGNORECASE)
# (not "both", "across", "which of" or "the documents" alone: "does the supplier pay both
# the fees and the expenses?" asks one document, and gave two of its places to others)


def _each_document(ranked: list[Hit], k: int) -> list[Hit]:
    """The k best, with a place for the best passage of each document among the candidates
    that has none there, where the documents are no more than k: it takes the place of the
    lowest-ranked passage of a document that has more than one. In rank order."""
    top = ranked[:k]
    docs = list(dict.fromkeys(h.chunk.doc_path for h in ranked))
    if not 2 <= len(docs) <= k:
        return top
    for doc in docs:
        if any(h.chunk.doc_path == doc for h in top):
            continue
        counts = {d: sum(h.chunk.doc_path == d for h in top) for d in docs}
        spare = next((i for i in range(len(top) - 1, -1, -1) if counts[top[i].chunk.doc_path] > 1), None)
        if spare is None:
            break
        top[spare] = next(h for h in ranked if h.chunk.doc_path == doc)
    order = {id(h): i for i, h in enumerate(ranked)}
    return sorted(top, key=lambda h: order[id(h)])


def _min_max(ranking: list[tuple[int, float]]) -> dict[int, float]:
    """Scores scaled to [0, 1] over the list (best 1, last 0); a list of equal scores,
    or of one candidate, scores 1 throughout: each is as good as the best."""
    if not ranking:
        return {}
    scores = [s for _, s in ranking]
    low, span = min(scores), max(scores) - min(scores)
    return {idx: (s - low) / span if span > 0 else 1.0 for idx, s in ranking}


def _plan_parts(chunks: list[Chunk], embedder_name: str) -> list[_Part]:
    """Group chunks by document (content and path), in ordinal order, and cut each
    document into cache parts."""
    docs: dict[tuple[str, str], list[int]] = {}
    for pos, chunk in enumerate(chunks):
        docs.setdefault((chunk.doc_sha256, chunk.doc_path), []).append(pos)
    hashes = [text_sha256(indexed_text(c)) for c in chunks]
    parts: list[_Part] = []
    for (doc_sha, doc_path), positions in docs.items():
        positions.sort(key=lambda p: (chunks[p].ordinal, p))
        doc_hashes = [hashes[p] for p in positions]
        fingerprint = chunking_fingerprint(doc_hashes)
        for part, start in enumerate(range(0, len(positions), PART_CHUNKS)):
            part_positions = positions[start : start + PART_CHUNKS]
            parts.append(
                _Part(
                    key=entry_key(embedder_name, doc_sha, fingerprint, part),
                    positions=part_positions,
                    hashes=[hashes[p] for p in part_positions],
                    doc_sha256=doc_sha,
                    doc_path=doc_path,
                    part=part,
                )
            )
    return parts


def _load_cached(parts: list[_Part], store: IndexStore, embedder: TextEmbedder) -> int:
    """Read each part's rows from the store; the number of chunks held."""
    dim = embedder.dim
    reused = 0
    for part in parts:
        loaded = store.load_rows(part.key, part.hashes, dim=dim)
        if loaded is None:
            part.vectors, part.held = None, np.zeros(len(part.positions), dtype=bool)
        else:
            part.vectors, part.held = loaded
            reused += int(part.held.sum())
    return reused


def _load_nothing(parts: list[_Part]) -> int:
    for part in parts:
        part.vectors, part.held = None, np.zeros(len(part.positions), dtype=bool)
    return 0


def _held_mask(parts: list[_Part], n_chunks: int) -> np.ndarray:
    """bool [n_chunks]: the chunks whose vectors the parts hold."""
    held = np.zeros(n_chunks, dtype=bool)
    for part in parts:
        held[part.positions] = part.held
    return held


def _embed_missing(
    parts: list[_Part],
    chunks: list[Chunk],
    embedder: TextEmbedder,
    store: IndexStore | None,
    on_progress: BuildProgress | None,
    commit_every: int,
    wanted: set[int] | None = None,
) -> tuple[float, int, int]:
    """Embed the rows the store lacked (of the chunks in `wanted` only, where given), a
    group of about commit_every chunks at a time, and write each group's parts back
    before starting the next, so a kill loses one group at most. Identical parts (the
    same file twice in a corpus) are embedded once. Returns the seconds spent embedding,
    the chunks and their estimated tokens."""
    by_key: dict[str, list[_Part]] = {}
    for part in parts:
        by_key.setdefault(part.key, []).append(part)
    todo: list[tuple[_Part, list[int]]] = []  # a part of each key, and its rows to embed
    for same in by_key.values():
        rows = [i for i in range(len(same[0].positions)) if not same[0].held[i]
                and (wanted is None or any(copy.positions[i] in wanted for copy in same))]
        if rows:
            todo.append((same[0], rows))
    total = sum(len(rows) for _, rows in todo)
    done = tokens = 0
    embed_s = 0.0
    for group in _groups(todo, commit_every):
        picked = [part.positions[i] for part, rows in group for i in rows]
        texts = [indexed_text(chunks[pos]) for pos in picked]
        tokens += sum(chunks[pos].n_tokens for pos in picked)
        offset = done

        def report(n: int, _total: int, offset: int = offset) -> None:
            if on_progress is not None:
                on_progress("embed", offset + n, total)

        load_before = getattr(embedder, "load_s", 0.0)
        t0 = time.perf_counter()
        embedded = embedder.embed(texts, on_progress=report)
        # a lazy model load inside the first embed() is not embedding time
        embed_s += time.perf_counter() - t0 - (getattr(embedder, "load_s", 0.0) - load_before)
        done += len(texts)
        start = 0
        for part, rows in group:
            new = embedded[start : start + len(rows)]
            start += len(rows)
            for copy in by_key[part.key]:
                if copy.vectors is None:
                    copy.vectors = np.zeros((len(copy.positions), new.shape[1]), dtype=np.float32)
                copy.vectors[rows] = new
                copy.held[rows] = True
            if store is not None:
                _save(store, part, chunks)
        if store is not None and on_progress is not None:
            on_progress("kept", done, total)
    return embed_s, total, tokens


def _save(store: IndexStore, part: _Part, chunks: list[Chunk]) -> None:
    """Write a part's rows, those read from the store beside those embedded now: whole, or
    the rows held where a focused build left some out."""
    if part.held.all():
        store.save(part.key, part.hashes, part.vectors, _meta(part, chunks))
    else:
        rows = np.flatnonzero(part.held)
        store.save(part.key, part.hashes, part.vectors[rows], _meta(part, chunks), rows=rows.tolist())


def _groups(todo: list[tuple[_Part, list[int]]], commit_every: int) -> list[list[tuple[_Part, list[int]]]]:
    groups: list[list[tuple[_Part, list[int]]]] = []
    current: list[tuple[_Part, list[int]]] = []
    size = 0
    for item in todo:
        current.append(item)
        size += len(item[1])
        if size >= commit_every:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def _meta(part: _Part, chunks: list[Chunk]) -> dict:
    """Chunk metadata kept beside the vectors, for inspection; spans are not relied on."""
    return {
        "doc_sha256": part.doc_sha256,
        "doc_path_seen": part.doc_path,
        "part": part.part,
        "ordinals": [chunks[p].ordinal for p in part.positions],
        "n_tokens": [chunks[p].n_tokens for p in part.positions],
    }


def _assemble(parts: list[_Part], n_chunks: int, embedder: TextEmbedder,
              store: IndexStore | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The vectors the dense index searches, as a later run will load them from the store
    (`IndexStore.as_stored`: float16 rounding can reorder near-ties, and a ranking must not
    depend on whether a vector came from the cache or the model), and the chunk each is
    (None: every chunk's, in order)."""
    dims = {p.vectors.shape[1] for p in parts if p.vectors is not None}
    dim = dims.pop() if len(dims) == 1 else embedder.dim
    out = np.zeros((n_chunks, dim), dtype=np.float32)  # [n_chunks, dim]
    for part in parts:
        if part.vectors is not None:
            out[part.positions] = part.vectors
    held = _held_mask(parts, n_chunks)  # (a part with no vectors holds no row)
    if store is not None:
        out = store.as_stored(out)
    if held.all():
        return out, None
    positions = np.flatnonzero(held)
    return out[positions], positions
