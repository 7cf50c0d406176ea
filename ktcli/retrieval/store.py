"""Persistent cache of chunk embeddings, keyed by content, safe against crashes and
concurrent runs.

Layout under <cache_dir>/index/:

    entries/<k[:2]>/<k>.json              manifest, written last: an entry exists only
                                          once its manifest does
    entries/<k[:2]>/<k>.<data16>.npy      the vectors; <data16> starts the file's sha256
    tmp/                                  files being written, renamed into place

An entry holds the embeddings of one document (a long document is split into parts of
at most PART_CHUNKS chunks, so a run killed inside a large PDF keeps the parts it
finished). An entry may hold some of its chunks' rows only (its manifest's "rows" names
them): a question about a large new folder embeds the chunks its words point at, not
every one (`retriever.focus`), and a later question adds its own. Its key hashes the embedder name, the document's sha256, the chunking
fingerprint (sha256 of the chunk texts' hashes, in order) and the part number. Paths
and spans are deliberately not part of the key: a renamed file with the same content
reuses its vectors, and spans always come from the current chunks.

Crash safety: every file is written to tmp/, fsynced, then os.replace()d into place,
and the manifest goes last, naming the data file by its checksum. A reader checks the
manifest, the chunk hashes, the data checksum and the array shape; anything off means
"not cached" and the entry is recomputed and overwritten, never an error.

Concurrency: two processes that build the same entry write separate temp files and
each renames its own complete file into place; since a manifest names its data file by
checksum, a reader never pairs one writer's manifest with the other's vectors. No lock
is taken, so no run can wait on another or deadlock; the cost is that simultaneous runs
may embed the same document twice, and of two runs adding rows to one entry at once the
entry keeps the rows of the one that wrote last (a later question embeds the others again).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import numpy as np

from ktcli.filemodes import file_mode

STORE_VERSION = 1
PART_CHUNKS = 256  # chunks per entry of a long document
_TEMP_MAX_AGE_S = 3600.0  # a live writer's temp file exists for milliseconds


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def chunking_fingerprint(chunk_hashes: Sequence[str]) -> str:
    """Identifies how a document was cut: same texts in the same order, same chunking."""
    return hashlib.sha256("\n".join(chunk_hashes).encode("ascii")).hexdigest()


def entry_key(embedder_name: str, doc_sha256: str, fingerprint: str, part: int) -> str:
    material = f"ktcli-index-v{STORE_VERSION}\0{embedder_name}\0{doc_sha256}\0{fingerprint}\0{part}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class IndexStore:
    """Embeddings on disk. `dtype` float16 halves the size; on unit vectors its rounding
    error (~5e-4 per component) moves cosine scores by ~1e-4, far below the gaps that
    decide a ranking (measured in tests/retrieval/test_store.py)."""

    def __init__(self, cache_dir: str | os.PathLike[str], *, dtype: str = "float16"):
        if dtype not in {"float16", "float32"}:
            raise ValueError(f"dtype must be float16 or float32, not {dtype!r}")
        self.root = Path(cache_dir) / "index"
        self.dtype = dtype
        self.write_errors: list[str] = []  # a full or read-only disk degrades to no cache
        self._swept = False

    # -- reading ---------------------------------------------------------------------

    def load(self, key: str, chunk_hashes: Sequence[str], dim: int | None = None) -> np.ndarray | None:
        """The float32 [len(chunk_hashes), dim] vectors of a complete, intact entry, or
        None when it is missing, holds some rows only, or is corrupt."""
        loaded = self.load_rows(key, chunk_hashes, dim)
        return _restore(loaded[0]) if loaded is not None and loaded[1].all() else None

    def load_rows(self, key: str, chunk_hashes: Sequence[str],
                  dim: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows an intact entry holds, as stored: float32 [len(chunk_hashes), dim] holding
        the stored values exactly (zero where a row is not held; `as_stored` makes them the
        unit vectors `load` returns, and `save` writes them back unchanged), and which rows
        are held (bool [len(chunk_hashes)]); None when it is missing or corrupt."""
        manifest = self._matching_manifest(key, chunk_hashes)
        rows = _held_rows(manifest, len(chunk_hashes)) if manifest is not None else None
        if rows is None:
            return None
        stored = self._read_vectors(key, manifest, expected_rows=len(rows), dim=dim)
        if stored is None:
            return None
        with suppress(OSError):
            os.utime(self._manifest_path(key))  # recency, for prune()
        vectors = np.zeros((len(chunk_hashes), stored.shape[1]), dtype=np.float32)
        vectors[rows] = stored
        held = np.zeros(len(chunk_hashes), dtype=bool)
        held[rows] = True
        return vectors, held

    def holds(self, key: str, chunk_hashes: Sequence[str]) -> bool:
        """Whether a complete entry for these chunks is there (`held`)."""
        return all(self.held(key, chunk_hashes))

    def held(self, key: str, chunk_hashes: Sequence[str]) -> list[bool]:
        """Which of the chunks' rows an entry holds, by its manifest and its data file's
        size (the planner's question: one stat; `load_rows` still verifies the vectors'
        sha256). By the manifest alone, an entry whose vectors were deleted, emptied or cut
        short was planned as reused and then embedded again by the run."""
        none = [False] * len(chunk_hashes)
        manifest = self._matching_manifest(key, chunk_hashes)
        rows = _held_rows(manifest, len(chunk_hashes)) if manifest is not None else None
        data_name = manifest.get("data") if manifest is not None else None
        if rows is None or not _is_data_name(key, data_name):
            return none
        try:
            size = (self._shard(key) / data_name).stat().st_size
        except OSError:
            return none
        expected = manifest.get("data_bytes")  # (absent from manifests written before it was kept)
        if not (size == expected if isinstance(expected, int) else size > 0):
            return none
        out = none
        for row in rows:
            out[row] = True
        return out

    def _matching_manifest(self, key: str, chunk_hashes: Sequence[str]) -> dict | None:
        manifest = self._read_manifest(key)
        return manifest if manifest is not None and manifest.get("chunk_sha256") == list(chunk_hashes) else None

    def _read_manifest(self, key: str) -> dict | None:
        try:
            manifest = json.loads(self._manifest_path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or manifest.get("version") != STORE_VERSION:
            return None
        if manifest.get("key") != key:
            return None
        return manifest

    def _read_vectors(self, key: str, manifest: dict, *, expected_rows: int, dim: int | None) -> np.ndarray | None:
        data_name = manifest.get("data")
        if not _is_data_name(key, data_name):
            return None
        try:
            raw = (self._shard(key) / data_name).read_bytes()
        except OSError:
            return None
        if hashlib.sha256(raw).hexdigest() != manifest.get("data_sha256"):
            return None
        try:
            array = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, OSError, EOFError):
            return None
        if array.ndim != 2 or array.shape[0] != expected_rows or (dim is not None and array.shape[1] != dim):
            return None
        if array.dtype not in (np.float16, np.float32):
            return None
        vectors = array.astype(np.float32)
        return vectors if np.isfinite(vectors).all() else None

    def as_stored(self, vectors: np.ndarray) -> np.ndarray:
        """The vectors exactly as a later load() will return them. A build uses these
        for what it has just embedded, so rankings do not depend on whether a vector
        came from the cache or from the model (float16 rounding can reorder near-ties)."""
        return _restore(np.ascontiguousarray(vectors, dtype=self.dtype))

    # -- writing ---------------------------------------------------------------------

    def save(self, key: str, chunk_hashes: Sequence[str], vectors: np.ndarray, meta: dict | None = None,
             rows: Sequence[int] | None = None) -> bool:
        """Write one entry: vectors first, manifest last. `rows`: the chunks (ascending
        indices into chunk_hashes) whose vectors these are, where the entry holds some only
        (None: all). It replaces what the entry held: a caller adding rows passes them all.
        False (and a note in write_errors) when the disk refuses; the caller keeps its
        in-memory vectors."""
        n_rows = len(chunk_hashes) if rows is None else len(rows)
        if vectors.ndim != 2 or vectors.shape[0] != n_rows:
            raise ValueError(f"{n_rows} rows but vectors of shape {vectors.shape}")
        if rows is not None and (list(rows) != sorted(set(rows)) or (rows and not 0 <= rows[0] <= rows[-1] < len(chunk_hashes))):
            raise ValueError("rows must be distinct ascending indices into chunk_hashes")
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(vectors, dtype=self.dtype), allow_pickle=False)
        data = buffer.getvalue()
        data_sha = hashlib.sha256(data).hexdigest()
        data_name = f"{key}.{data_sha[:16]}.npy"
        manifest = {
            **(meta or {}),
            "version": STORE_VERSION,
            "key": key,
            "n": int(vectors.shape[0]),
            "dim": int(vectors.shape[1]),
            "dtype": self.dtype,
            "data": data_name,
            "data_sha256": data_sha,
            "data_bytes": len(data),
            "chunk_sha256": list(chunk_hashes),
            "written_at": time.time(),
        }
        if rows is not None and n_rows < len(chunk_hashes):
            manifest["rows"] = [int(r) for r in rows]
        replaced = (self._read_manifest(key) or {}).get("data")
        try:
            self._sweep_temp_once()
            shard = self._shard(key)
            shard.mkdir(parents=True, exist_ok=True)
            self._atomic_write(shard / data_name, data)
            self._atomic_write(self._manifest_path(key), json.dumps(manifest).encode("utf-8"))
            _fsync_dir(shard)
        except OSError as e:
            self.write_errors.append(f"{self.root}: {e}")
            return False
        if replaced != data_name and _is_data_name(key, replaced):
            # The vectors the manifest named before: an entry that gains rows question by
            # question (`retriever._focus`) left one file behind each time, 64 of 149 in a
            # probe's store, until prune() passed its bound. A reader that took the old
            # manifest a moment ago finds them gone: not cached, embedded again.
            with suppress(OSError):
                (shard / replaced).unlink()
        return True

    def _atomic_write(self, path: Path, data: bytes) -> None:
        tmp_dir = self.root / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=tmp_dir, prefix=f"{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), file_mode())  # mkstemp's file is owner-only
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, path)  # atomic within one filesystem: all or nothing
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp_name)
            raise

    def _sweep_temp_once(self) -> None:
        """Delete temp files left by killed runs (old enough that no live writer owns them)."""
        if self._swept:
            return
        self._swept = True
        cutoff = time.time() - _TEMP_MAX_AGE_S
        with suppress(OSError):
            for path in (self.root / "tmp").iterdir():
                with suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()

    # -- housekeeping ----------------------------------------------------------------

    def size_bytes(self) -> int:
        """The disk the store takes: blocks allocated, as `du` counts them (a repo of small
        files keeps two small files per document, 64 MB on disk for 30 MB of bytes)."""
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                with suppress(OSError):
                    total += _disk_bytes(os.stat(os.path.join(dirpath, name)))
        return total

    def clear(self) -> None:
        """Remove every entry (other runs still working recompute what they miss)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def prune(self, max_bytes: int) -> int:
        """Delete least recently used entries until the store fits max_bytes, first the data
        files no manifest names (left by races or crashes). Returns bytes freed. Within its
        room it reads no manifest: every run that embedded anything read them all (0.75 s
        for 5,440 entries, a minute or more at the cap)."""
        before = self.size_bytes()
        if before <= max_bytes:
            return 0
        referenced = self._drop_orphans()
        size = self.size_bytes()
        for mtime, manifest_path, data_path in sorted(referenced):
            if size <= max_bytes:
                break
            for path in (manifest_path, data_path):  # manifest first: no half entry is visible
                with suppress(OSError):
                    size -= _disk_bytes(path.stat())
                    path.unlink()
        return before - self.size_bytes()

    def _drop_orphans(self) -> list[tuple[float, Path, Path]]:
        entries: list[tuple[float, Path, Path]] = []
        cutoff = time.time() - _TEMP_MAX_AGE_S
        for shard in sorted((self.root / "entries").glob("??")):
            named: set[str] = set()
            for manifest_path in shard.glob("*.json"):
                with suppress(OSError):
                    mtime = manifest_path.stat().st_mtime
                    data_name = _manifest_data(manifest_path)
                    if data_name is None:
                        # Damaged (valid JSON of another shape: a list, no "data"): no entry,
                        # gone first. It was a TypeError or KeyError out of the run.
                        entries.append((0.0, manifest_path, manifest_path))
                        continue
                    named.add(data_name)
                    entries.append((mtime, manifest_path, shard / data_name))
            for data_path in shard.glob("*.npy"):
                with suppress(OSError):
                    if data_path.name not in named and data_path.stat().st_mtime < cutoff:
                        data_path.unlink()
        return entries

    def _shard(self, key: str) -> Path:
        return self.root / "entries" / key[:2]

    def _manifest_path(self, key: str) -> Path:
        return self._shard(key) / f"{key}.json"


def _is_data_name(key: str, data_name: object) -> bool:
    """Whether a manifest's "data" names a data file of entry `key` in its own shard."""
    return isinstance(data_name, str) and data_name.startswith(key) and "/" not in data_name


def _held_rows(manifest: dict, n: int) -> list[int] | None:
    """The rows a manifest's vectors are (all n where it names none); None where its
    "rows" are not distinct ascending indices below n (a damaged entry: not held)."""
    rows = manifest.get("rows")
    if rows is None:
        return list(range(n))
    if (not isinstance(rows, list) or not all(type(r) is int for r in rows)
            or rows != sorted(set(rows)) or (rows and not 0 <= rows[0] <= rows[-1] < n)):
        return None
    return rows


def _manifest_data(path: Path) -> str | None:
    """The data file the manifest at `path` names; None where it is unreadable or names none."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    data_name = manifest.get("data") if isinstance(manifest, dict) else None
    return data_name if _is_data_name(path.stem, data_name) else None


def _disk_bytes(st: os.stat_result) -> int:
    """A file's blocks on disk, or its bytes where those are more (a compressing file
    system) or unknown."""
    return max(st.st_size, getattr(st, "st_blocks", 0) * 512)


def _restore(stored: np.ndarray) -> np.ndarray:
    """Stored rows -> float32 unit rows (float16 rounding leaves norms slightly off 1)."""
    vectors = stored.astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def _fsync_dir(path: Path) -> None:
    """Make the renames durable across power loss (best effort; not all filesystems allow it)."""
    with suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
