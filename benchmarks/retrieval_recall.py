"""Retrieval recall: does the hybrid index put a chunk that answers the question in the
top k that `ktcli ask` reads?

    python -m benchmarks.retrieval_recall --json      # ~2 min here; results/retrieval_recall.json

Gold questions (benchmarks/retrieval_cases.py, and the PDF questions of qa_accuracy):
a question and the lines (tutorial, minirepo) or page (PDF) that answer it, in two
styles: paraphrased (the sources' words avoided) and in the sources' own terms. A hit is
a retrieved chunk whose span overlaps the gold lines (PDF: lies on the gold page).

Each corpus is chunked as the CLI chunks it (256 tokens, 32 shared) and indexed twice in
the same run, with the real embedder and no cache: the chunk text alone ("plain", what
the index held before) and with its section trail first ("sections",
`retriever.indexed_text`). Each question's dense and BM25 candidates (50 each, as
`HybridIndex.search` takes them) are then ranked four ways:
* rrf: reciprocal rank fusion, 1 / (60 + rank) summed (the fusion before: the baseline);
* score: `retriever._fuse`, min-max scaled scores added;
* defs: the same with `retriever.DEFINITION_BONUS` for the chunks that define a name the
  question writes as code (`retrieval.symbols`): what ask uses now;
* defs0: the same by the rules before 2026-12-05 (names in backticks were no code unless
  CamelCase, snake_case, ALL_CAPS or `name()`; definitions by class/def/fn... and constants
  only): the baseline of the "backticked" set;
* defs1: the same by the rules of 2026-12-05 before the evening (a name's definitions
  counted by chunk, not by place, and none taken past 3; no bonus for the chunks using a
  name whose callers or uses the question asks for): the baseline of the "callers" set;
* dense alone, bm25 alone.
Reported per question set: recall@1, @3, @8 (the default top_k) and MRR over the top 8;
and over all questions, the baseline (plain, rrf) against now (sections, defs). The click
corpus asks "where is X defined?" of click as installed (`retrieval_cases.definition_cases`),
and "what calls X?" (`retrieval_cases.caller_cases`: a hit is a chunk holding any line that
calls X; places@8, the share of those lines the 8 chunks hold, of as many as 8 can).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from benchmarks import common
from benchmarks.qa_accuracy import PDF, PDF_QUESTIONS
from benchmarks.retrieval_cases import (
    CLICK_BACKTICK_CASES,
    CLICK_CALLER_CASES,
    CLICK_DEFINITION_CASES,
    MINIREPO_CASES,
    MINIREPO_TERMS_CASES,
    TUTORIAL,
    TUTORIAL_CASES,
    TUTORIAL_TERMS_CASES,
    caller_cases,
    definition_cases,
)

K = (1, 3, 8)
MINIREPO = "sample_docs/minirepo"
CLICK = os.path.dirname(__import__("click").__file__)  # as installed beside ktcli (a typer dependency)
DEPTH = 50  # candidates per ranking: HybridIndex.search's for top_k 8
RRF_K = 60  # the baseline's constant (Cormack, Clarke & Buettcher, SIGIR 2009)
WAYS = ("rrf", "score", "defs0", "defs1", "defs", "dense", "bm25")


def _cases() -> dict[str, tuple[list[str], dict[str, list[tuple[str, list[tuple[str | None, int, int | None]]]]]]]:
    """corpus -> (input paths, {question set: [(question, [(gold path or None, first line
    or page, last line or None), ...])]}): a question answered at any of its places."""
    return {
        "tutorial": ([TUTORIAL], {
            "paraphrased": [(q, [(TUTORIAL, a, b)]) for q, a, b in TUTORIAL_CASES],
            "own terms": [(q, [(TUTORIAL, a, b)]) for q, a, b in TUTORIAL_TERMS_CASES],
        }),
        "minirepo": ([MINIREPO], {
            "paraphrased": [(q, [(path, a, b)]) for q, path, a, b in MINIREPO_CASES],
            "own terms": [(q, [(path, a, b)]) for q, path, a, b in MINIREPO_TERMS_CASES],
        }),
        "pdf": ([PDF], {"own terms": [(q, [(None, page, None)]) for q, _answers, page in PDF_QUESTIONS]}),
        "click": ([CLICK], {"definitions": [(q, [(path, a, b)]) for q, path, a, b in
                                            definition_cases(CLICK, CLICK_DEFINITION_CASES)],
                            "backticked": [(q, [(path, a, b)]) for q, path, a, b in
                                           definition_cases(CLICK, CLICK_BACKTICK_CASES)],
                            "callers": caller_cases(CLICK, CLICK_CALLER_CASES)}),
    }


def _is_hit(chunk, gold_path, first, last) -> bool:
    if last is None:  # a PDF page
        return chunk.span.page == first
    return chunk.doc_path == gold_path and chunk.span.line_start <= last and chunk.span.line_end >= first


def _rank(hits, places) -> int | None:
    return next((r for r, chunk in enumerate(hits, start=1) if any(_is_hit(chunk, *place) for place in places)), None)


def _places_found(hits, places) -> float:
    """The share of a question's places (a name's call sites) the hits hold, of as many as
    they could hold."""
    found = sum(any(_is_hit(chunk, *place) for chunk in hits) for place in places)
    return found / min(len(places), len(hits) or 1)


def _scores(ranks: list[int | None]) -> dict:
    n = len(ranks)
    out = {f"recall@{k}": round(sum(r is not None and r <= k for r in ranks) / n, 3) for k in K}
    out["mrr@8"] = round(sum(1 / r for r in ranks if r is not None and r <= 8) / n, 3)
    return out


def rrf_fuse(chunks, dense: list[tuple[int, float]], lexical: list[tuple[int, float]], k: int, *_rest) -> list:
    """The fusion before 2026-12-04, the baseline: reciprocal ranks summed, ties by best
    rank, then by position. Called as `retriever._fuse` is (what it takes after `k`, the
    bonuses and weights that came later, it leaves out: `qa_accuracy` failed on them)."""
    from ktcli.retrieval.retriever import Hit

    dense_rank = {idx: r for r, (idx, _) in enumerate(dense, start=1)}
    lexical_rank = {idx: r for r, (idx, _) in enumerate(lexical, start=1)}
    fused = []
    for idx in dense_rank.keys() | lexical_rank.keys():
        ranks = [r for r in (dense_rank.get(idx), lexical_rank.get(idx)) if r is not None]
        fused.append((sum(1 / (RRF_K + r) for r in ranks), min(ranks), idx))
    fused.sort(key=lambda t: (-t[0], t[1], t[2]))
    return [Hit(chunk=chunks[idx], score=score, dense_rank=dense_rank.get(idx), lexical_rank=lexical_rank.get(idx))
            for score, _best, idx in fused[:k]]


def _defining_before(chunks, question: str) -> set[int]:
    """The chunks `retrieval.symbols` gave the bonus to before 2026-12-05."""
    from ktcli.retrieval import symbols

    names = {m.group(1) for m in symbols._CODE_NAME.finditer(question) if len(m.group(1)) >= 4}
    found: set[int] = set()
    for name in names:
        where = [i for i, c in enumerate(chunks) if not ("\n" not in c.text and len(c.text) > 2000)
                 and any(m.group(1) == name for p in (symbols._DEFINED, symbols._CONSTANT) for m in p.finditer(c.text))]
        if len(where) <= 3:  # chunks, as MAX_DEFINITIONS counted them then
            found.update(where)
    return found


def _defining_by_chunk(chunks, question: str) -> set[int]:
    """The chunks `retrieval.symbols` gave the bonus to on 2026-12-05 before the evening:
    every chunk showing a definition, none for a name defined in more than 3 chunks."""
    from ktcli.retrieval import symbols

    found: set[int] = set()
    for name in symbols.code_names(question):
        where = [i for i, c in enumerate(chunks) if symbols._definitions(c, name)]
        if len(where) <= 3:
            found.update(where)
    return found


def _rankings(index, question: str) -> dict[str, list]:
    from ktcli.retrieval.retriever import _fuse
    from ktcli.retrieval.symbols import code_names, used_names

    chunks = index.chunks
    dense = index.dense.search(index.embedder.embed_query(question), DEPTH)
    lexical = index.lexical.search(question, DEPTH)
    return {
        "rrf": [h.chunk for h in rrf_fuse(chunks, dense, lexical, max(K))],
        "score": [h.chunk for h in _fuse(chunks, dense, lexical, max(K))],
        # what ask does now: a chunk defining a name the question writes as code comes first
        "defs0": [h.chunk for h in _fuse(chunks, dense, lexical, max(K), _defining_before(chunks, question))],
        "defs1": [h.chunk for h in _fuse(chunks, dense, lexical, max(K), _defining_by_chunk(chunks, question))],
        "defs": [h.chunk for h in _fuse(chunks, dense, lexical, max(K), index.symbols.defining(code_names(question)),
                                        using=index.symbols.using(used_names(question)))],
        "dense": [chunks[i] for i, _ in dense],
        "bm25": [chunks[i] for i, _ in lexical],
    }


def run(args) -> dict:
    from ktcli.ingest.chunking import chunk_corpus
    from ktcli.ingest.corpus import load_corpus
    from ktcli.retrieval.embedder import Embedder
    from ktcli.retrieval.retriever import HybridIndex

    embedder = Embedder("minilm")
    result: dict = {"machine": common.machine(), "k": list(K), "depth": DEPTH, "corpora": {}}
    pooled: dict[tuple[str, str], list[int | None]] = {}
    for name, (paths, sets) in _cases().items():
        if args.corpora and name not in args.corpora.split(","):
            continue
        chunks = chunk_corpus(load_corpus(paths), chunk_tokens=256, overlap_tokens=32)
        entry: dict = {"n_chunks": len(chunks), "with_section": sum(bool(c.section) for c in chunks), "sets": {}}
        for variant in ("plain", "sections"):
            used = chunks if variant == "sections" else [dataclasses.replace(c, section="") for c in chunks]
            t0 = time.perf_counter()
            index = HybridIndex.build(used, embedder=embedder, store=None)
            entry[f"build_s_{variant}"] = round(time.perf_counter() - t0, 1)
            for set_name, cases in sets.items():
                ranks: dict[str, list[int | None]] = {how: [] for how in WAYS}
                shares: dict[str, list[float]] = {how: [] for how in WAYS}
                for question, places in cases:
                    for how, hits in _rankings(index, question).items():
                        ranks[how].append(_rank(hits[: max(K)], places))
                        shares[how].append(_places_found(hits[: max(K)], places))
                out = entry["sets"].setdefault(set_name, {"n_questions": len(cases), "results": {}})
                for how, r in ranks.items():
                    out["results"][f"{variant}/{how}"] = {**_scores(r), "ranks": r}
                    if any(len(places) > 1 for _question, places in cases):  # e.g. a name's callers
                        out["results"][f"{variant}/{how}"]["places@8"] = round(sum(shares[how]) / len(cases), 3)
                    pooled.setdefault((variant, how), []).extend(r)
        result["corpora"][name] = entry
    result["all"] = {f"{v}/{h}": {**_scores(r), "n_questions": len(r)} for (v, h), r in pooled.items()}
    return result


def print_table(result: dict) -> None:
    head = " ".join(f"{'R@' + str(k):>5}" for k in K) + f" {'MRR@8':>6}"
    print(f"{'corpus':9} {'questions':12} {'n':>3} {'chunks':8} {'ranking':7} {head}")
    row = lambda s: " ".join(f"{s[f'recall@{k}']:5.2f}" for k in K) + f" {s['mrr@8']:6.3f}"  # noqa: E731
    for name, entry in result["corpora"].items():
        for set_name, out in entry["sets"].items():
            for key, s in out["results"].items():
                variant, how = key.split("/")
                print(f"{name:9} {set_name:12} {out['n_questions']:>3} {variant:8} {how:7} {row(s)}")
    print()
    labels = {"plain/rrf": "baseline: plain chunks, rrf", "plain/score": "plain chunks, score fusion",
              "sections/rrf": "section trails, rrf", "sections/score": "section trails, score fusion",
              "sections/defs": "now: trails, score fusion, definitions"}
    for key, label in labels.items():
        if key in result["all"]:
            s = result["all"][key]
            print(f"all {s['n_questions']} questions, {label:35} {row(s)}")


def main(argv=None) -> int:
    ap = common.arg_parser("retrieval_recall", __doc__, "retrieval_recall")
    ap.add_argument("--corpora", help="comma-separated subset of tutorial,minirepo,pdf,click")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args)
    print_table(result)
    common.report(args.name, result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
