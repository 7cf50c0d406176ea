"""Okapi BM25 over chunk texts, with a tokenizer that understands code identifiers.

`parseHttpResponse` and `parse_http_response` both index as the whole identifier plus
its parts (parse, http, response), so a question in words finds code and a question
naming the identifier ranks the exact match highest (it matches more terms).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable

import numpy as np

# Numbers keep their decimal point / thousands separators ("3.14", "1,000", "2.0.1");
# everything else splits on non-word characters. \w is Unicode-aware.
_TOKEN = re.compile(r"\d+(?:[.,]\d+)+|\w+")
# Pieces of an identifier: acronyms before a capitalised word (HTTPServer -> HTTP, Server),
# capitalised or lower words, remaining capitals, digit runs.
_PIECE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_THOUSANDS = re.compile(r"^\d{1,3}(?:,\d{3})+$")


def _expand(raw: str) -> tuple[str, ...]:
    """One raw token -> the lowercase terms it is indexed under."""
    if "." in raw or "," in raw:
        # only the number alternative of _TOKEN keeps separators; "1,000" means "1000"
        return (raw.replace(",", "") if _THOUSANDS.match(raw) else raw,)
    whole = raw.lower()
    if raw.isascii():
        pieces = [p.lower() for part in raw.split("_") for p in _PIECE.findall(part)]
    else:
        # camelCase is an ASCII convention; splitting accented words at case changes
        # or non-ASCII letters would shred ordinary prose
        pieces = [part.lower() for part in raw.split("_") if part]
    terms = [whole] if whole.strip("_") else []
    terms.extend(p for p in pieces if p != whole)
    return tuple(terms)


class Tokenizer:
    """Text -> BM25 terms. Caches the expansion of each distinct raw token: a corpus has
    far fewer distinct tokens than tokens, which makes tokenising 1M tokens take well
    under a second."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, text: str) -> list[str]:
        cache = self._cache
        terms: list[str] = []
        for raw in _TOKEN.findall(text):
            expanded = cache.get(raw)
            if expanded is None:
                expanded = cache[raw] = _expand(raw)
            terms.extend(expanded)
        return terms


def tokenize(text: str) -> list[str]:
    return Tokenizer()(text)


class BM25Index:
    """Okapi BM25 with an inverted index of numpy posting arrays.

    idf = ln(1 + (N - df + 0.5) / (df + 0.5)) (the Lucene form: never negative, so a term
    in most documents still counts a little instead of penalising its matches).
    """

    def __init__(self, texts: Iterable[str], *, k1: float = 1.2, b: float = 0.75):
        self.k1 = k1
        self.b = b
        self._tokenizer = Tokenizer()
        postings: dict[str, tuple[list[int], list[int]]] = {}
        lengths: list[int] = []
        for doc_id, text in enumerate(texts):
            terms = self._tokenizer(text)
            lengths.append(len(terms))
            for term, tf in Counter(terms).items():
                ids, tfs = postings.setdefault(term, ([], []))
                ids.append(doc_id)
                tfs.append(tf)
        self.n_docs = len(lengths)
        self.doc_len = np.asarray(lengths, dtype=np.float32)
        self.avg_len = float(self.doc_len.mean()) if self.n_docs and self.doc_len.sum() > 0 else 1.0
        self._postings = {
            term: (np.asarray(ids, dtype=np.int32), np.asarray(tfs, dtype=np.float32))
            for term, (ids, tfs) in postings.items()
        }
        # k1 * (1 - b + b * |d| / avgdl), the per-document part of the BM25 denominator
        self._norm = (k1 * (1.0 - b + b * self.doc_len / self.avg_len)).astype(np.float32)

    def __len__(self) -> int:
        return self.n_docs

    @property
    def nbytes(self) -> int:
        arrays = sum(ids.nbytes + tfs.nbytes for ids, tfs in self._postings.values())
        return int(arrays + self.doc_len.nbytes + self._norm.nbytes)

    def idf(self, term: str) -> float:
        posting = self._postings.get(term)
        df = 0 if posting is None else len(posting[0])
        return math.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document, float32 [n_docs]. A repeated query term counts
        once per occurrence, as in the original formulation."""
        scores = np.zeros(self.n_docs, dtype=np.float32)
        for term, q_tf in Counter(self._tokenizer(query)).items():
            posting = self._postings.get(term)
            if posting is None:
                continue
            ids, tfs = posting
            weight = q_tf * self.idf(term) * (self.k1 + 1.0)
            # ids are unique within a posting list, so plain fancy-index add is exact
            scores[ids] += weight * tfs / (tfs + self._norm[ids])
        return scores

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top k (doc index, score) with score > 0, best first; equal scores by index."""
        if k <= 0 or self.n_docs == 0:
            return []
        scores = self.scores(query)
        matched = np.flatnonzero(scores > 0)
        if matched.size == 0:
            return []
        # lexsort's last key is primary: score descending, then index ascending
        order = matched[np.lexsort((matched, -scores[matched]))][:k]
        return [(int(i), float(scores[i])) for i in order]
