"""Okapi BM25 over chunk texts, with a tokenizer that understands code identifiers.

`parseHttpResponse` and `parse_http_response` both index as the whole identifier plus
its parts (parse, http, response), so a question in words finds code and a question
naming the identifier ranks the exact match highest (it matches more terms).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

import numpy as np

# Numbers keep their decimal point / thousands separators ("3.14", "1,000", "2.0.1");
# everything else splits on non-word characters. \w is Unicode-aware, but holds no
# combining marks: a Hindi word's vowel signs, Thai's, a Devanagari nukta are letters of
# the word here (`_token_pattern`), or "नमस्ते" indexed as "नमस" and "त".
# A comma joins digits as a thousands separator ("1,000,000") or a decimal comma ("3,5",
# "7,77": one or two digits, and no list going on), not otherwise: "2023,3,7.77" is a CSV
# row's year, quarter and figure, and as one term no question found any of them.
_NUMBER_OR_WORD = (r"\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?(?!\d)|(?<![\d,])\d+,\d{{1,2}}(?![\d,.])|\d+(?:\.\d+)+"
                   r"|(?:\w|[{marks}])+")

# Characters that show nothing: a soft hyphen, zero-width spaces and joiners, a BOM inside
# text. "Kranken\xadhaus" is the word "Krankenhaus", not two.
_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"))
# Marks that are accents on Latin, Greek and Cyrillic letters, Hebrew points and Arabic
# vowel signs: optional in writing, so folded away ("résumé" finds "resume", vowelled
# Arabic its plain spelling, "ΓΕΦΥΡΑ" "γέφυρα"). Other scripts' marks are kept: kana's
# voicing marks (か is not が) and Indic vowel signs make different words.
# Only the combining marks (Mn) of those blocks: Hebrew's maqaf (its hyphen), paseq and sof
# pasuq and Arabic's end-of-ayah sign lie among them and are no marks ("בית־ספר" is two words).
_FOLDED_MARKS = re.compile("[" + "".join(
    chr(c) for a, b in ((0x300, 0x36F), (0x483, 0x489), (0x591, 0x5C7), (0x610, 0x61A), (0x64B, 0x65F),
                        (0x670, 0x670), (0x6D6, 0x6ED))
    for c in range(a, b + 1) if unicodedata.category(chr(c)) in ("Mn", "Me")) + "]")


# A line break between Chinese or Japanese characters: where a PDF or a hard-wrapped file
# wrapped the line, inside a word as often as not ("医\n疗"), since the text has no spaces.
_HAN_KANA = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
CJK_LETTERS = _HAN_KANA + "\uac00-\ud7af"  # ... and Hangul: the inside of a character class
_CJK_WRAP = re.compile(f"(?<=[{_HAN_KANA}])[ \t]*\r?\n[ \t]*(?=[{_HAN_KANA}])")


def fold(text: str) -> str:
    """The text as it is matched: compatibility forms unified (full-width "ＡＢＣ－１２" is
    "ABC-12", "ﬁ" is "fi", NFD is NFC), invisible characters dropped, accents folded, and
    Chinese and Japanese lines joined where they wrap."""
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKD", text.translate(_INVISIBLE))
    return _CJK_WRAP.sub("", unicodedata.normalize("NFC", _FOLDED_MARKS.sub("", text)))


@functools.cache
def combining_marks() -> str:
    """The Basic Multilingual Plane's combining marks as the inside of a regex character
    class (built once: 65K lookups, ~15 ms)."""
    ranges: list[list[int]] = []
    for code in range(0x300, 0x10000):
        if unicodedata.category(chr(code)) in ("Mn", "Mc", "Me"):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)


@functools.cache
def _token_pattern() -> re.Pattern[str]:
    return re.compile(_NUMBER_OR_WORD.format(marks=combining_marks()))


# Pieces of an identifier: acronyms before a capitalised word (HTTPServer -> HTTP, Server),
# capitalised or lower words, remaining capitals, digit runs.
_PIECE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_THOUSANDS = re.compile(r"^\d{1,3}(?:,\d{3})+$")


# Han, kana and Hangul: written without spaces, so \w+ takes a whole clause as one token
# and no question would ever share it. Such runs are indexed as overlapping character
# pairs, the usual unit for CJK search (a one-character run as itself).
# Thai, Lao, Khmer and Myanmar are written without spaces between words too (a Thai clause
# was one term: no question matched any, and retrieval fell back to the embedder's noise);
# their vowel signs and tone marks lie in their own blocks, so a pair may be a letter and
# its mark.
_CJK_RUN = re.compile(f"[{CJK_LETTERS}\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]+")


def cjk_terms(raw: str) -> list[str] | None:
    """The terms of a token holding CJK characters: each run's character pairs, and the
    lowercased text between runs; None for a token without CJK."""
    if raw.isascii() or not _CJK_RUN.search(raw):
        return None
    out: list[str] = []
    at = 0
    for m in _CJK_RUN.finditer(raw):
        if m.start() > at:
            out.append(raw[at:m.start()].lower())
        run = m.group(0)
        out.extend([run] if len(run) == 1 else [run[i:i + 2] for i in range(len(run) - 1)])
        at = m.end()
    if at < len(raw):
        out.append(raw[at:].lower())
    return [t for t in out if t.strip("_")]


def _expand(raw: str) -> tuple[str, ...]:
    """One raw token -> the lowercase terms it is indexed under."""
    cjk = cjk_terms(raw)
    if cjk is not None:
        return tuple(cjk)
    if "." in raw or "," in raw:
        # only the number alternative of _NUMBER_OR_WORD keeps separators; "1,000" means "1000"
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
        for raw in _token_pattern().findall(fold(text)):
            expanded = cache.get(raw)
            if expanded is None:
                expanded = cache[raw] = _expand(raw)
            terms.extend(expanded)
        return terms


def tokenize(text: str) -> list[str]:
    return Tokenizer()(text)


class BM25Index:
    """Okapi BM25 over an inverted index in CSR form: for term id t, its postings are
    docs[offsets[t]:offsets[t + 1]] with term frequencies tfs[...] (numpy arrays; the
    counting is one np.unique, not a Python loop per posting).

    idf = ln(1 + (N - df + 0.5) / (df + 0.5)) (the Lucene form: never negative, so a term
    in most documents still counts a little instead of penalising its matches).
    """

    def __init__(self, texts: Iterable[str], *, k1: float = 1.2, b: float = 0.75):
        self.k1 = k1
        self.b = b
        self._tokenizer = Tokenizer()
        self._vocab: dict[str, int] = {}
        flat, lengths = self._term_ids(texts)
        self.n_docs = len(lengths)
        self.doc_len = np.asarray(lengths, dtype=np.float32)
        self._build_postings(flat, lengths)
        self._normalise()

    def _normalise(self) -> None:
        self.avg_len = float(self.doc_len.mean()) if self.n_docs and self.doc_len.sum() > 0 else 1.0
        # k1 * (1 - b + b * |d| / avgdl), the per-document part of the BM25 denominator
        self._norm = (self.k1 * (1.0 - self.b + self.b * self.doc_len / self.avg_len)).astype(np.float32)

    @classmethod
    def from_arrays(cls, vocab: dict[str, int], docs: np.ndarray, tfs: np.ndarray, offsets: np.ndarray,
                    doc_len: np.ndarray, *, k1: float = 1.2, b: float = 0.75) -> BM25Index:
        """The index whose term ids, postings and document lengths these are (one a
        build made: `retrieval.lexical_cache` keeps them)."""
        index = cls.__new__(cls)
        index.k1, index.b = k1, b
        index._tokenizer = Tokenizer()
        index._vocab = vocab
        index.n_docs = len(doc_len)
        index.doc_len = doc_len
        index._docs, index._tfs, index._offsets = docs, tfs, offsets
        index._normalise()
        return index

    def _term_ids(self, texts: Iterable[str]) -> tuple[np.ndarray, list[int]]:
        """Every token of every text as term ids, concatenated, and the per-text counts."""
        vocab = self._vocab
        by_raw: dict[str, list[int]] = {}  # raw token -> its term ids (a corpus repeats tokens)
        flat: list[int] = []
        lengths: list[int] = []
        for text in texts:
            before = len(flat)
            for raw in _token_pattern().findall(fold(text)):
                ids = by_raw.get(raw)
                if ids is None:
                    ids = by_raw[raw] = [vocab.setdefault(t, len(vocab)) for t in _expand(raw)]
                flat.extend(ids)
            lengths.append(len(flat) - before)
        return np.asarray(flat, dtype=np.int64), lengths

    def _build_postings(self, flat: np.ndarray, lengths: list[int]) -> None:
        n_docs, n_terms = max(self.n_docs, 1), len(self._vocab)
        doc_of_token = np.repeat(np.arange(self.n_docs, dtype=np.int64), lengths)  # [n_tokens]
        # one key per (term, doc) occurrence; unique() sorts by term, then doc, and counts tf
        keys, tf = np.unique(flat * n_docs + doc_of_token, return_counts=True)
        self._docs = (keys % n_docs).astype(np.int32)
        self._tfs = tf.astype(np.float32)
        self._offsets = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys // n_docs, minlength=n_terms), out=self._offsets[1:])

    def __len__(self) -> int:
        return self.n_docs

    @property
    def nbytes(self) -> int:
        arrays = self._docs.nbytes + self._tfs.nbytes + self._offsets.nbytes
        return int(arrays + self.doc_len.nbytes + self._norm.nbytes)

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        t = self._vocab.get(term)
        if t is None:
            return None
        lo, hi = self._offsets[t], self._offsets[t + 1]
        return self._docs[lo:hi], self._tfs[lo:hi]

    def idf(self, term: str) -> float:
        posting = self._postings(term)
        df = 0 if posting is None else len(posting[0])
        return math.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document, float32 [n_docs]. A repeated query term counts
        once per occurrence, as in the original formulation."""
        scores = np.zeros(self.n_docs, dtype=np.float32)
        for term, q_tf in Counter(self._tokenizer(query)).items():
            posting = self._postings(term)
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
