"""Prompt K/V kept on disk, so that a later prompt starting with the same tokens skips
their prefill.

Why: a user asks several questions about one document. Read whole, every prompt is the
same system prompt and document followed by a different question; on the 2-core CPU the
README's 2.1K-token PDF costs ~4.5 s of prefill per question, an 8K-token input ~20 s.
The K/V rows of a token depend only on the tokens up to it, so the rows computed for the
first question's prompt serve every later prompt up to where the two differ. Past the
window (`--mode sparse`) the gain is larger: its prefill runs ~400 tokens/s, so a 16K-token
input costs ~40 s a question and the whole 79K-token tutorial minutes, while its int8
pages read back in about a second. There a row also depends on the chunks its prompt was
prefilled in, so what is kept are whole chunks (`KernelKVCache.reusable_prefix`).

An entry is one prompt: its token ids and its K/V rows for every layer, in one file of
ours (below) written and read one layer at a time, so keeping or reading a 6K-token
prompt's 130 MB of rows never holds more than one layer's 4 MB beside the KV pages. A
lookup reads only the ids of each entry (a few KB) and takes the longest common prefix;
the rows are then read for that prefix only. Entries belong to one model, weight dtype,
page dtype, prefill dtype, position encoding, device and, for the kernels' pages, every
long-context option (`store_key`): rows computed any other way are never read. The store keeps MAX_BYTES across all its key folders; the least
recently used entries go first. Anything unexpected in a file (a short read, a shape that does not fit) counts as
no entry, and a folder that cannot be written is skipped: the store only ever saves work.

File: MAGIC, a JSON header line, the ids as int32 [P], then for each layer, for each
array the header lists, its items: `{"tokens": P, "layers": L, "unit": U, "arrays": [{"name",
"dtype", "shape", "items", "per_unit"}]}`. The dense paged cache keeps arrays k and v of
one row [H, D] per token (U = 1). The quantized pages of the long-context path keep whole
pages (U = the page size): codes, scales and summaries per page, and the sink rows kept
exact beside them, which are not per page (`per_unit` false: read whole). Last, a CRC-32
of each layer's each array (uint32 [L, arrays]): bytes damaged in place (a disk's, a
crash's) made a sparse read answer nothing, question after question, until checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where rows are read or written: `ktcli plan` reads
    import torch   # only ids here (`stored_prefix`), and torch's import is ~1.2 s of its run

FORMAT = 3  # 3: a CRC-32 per layer and array (2: named arrays per layer; 1: k and v only)
# Prompts shorter than this prefill in about a second on a 2-core CPU: not worth a file.
MIN_TOKENS = 512
# Reuse only a prefix at least this long: every prompt shares the system prompt and chat
# template (~60 tokens), a start not worth opening a file for.
MIN_REUSE = 128
# A sparse read's int8 pages of the 79K-token tutorial are 0.95 GB (int4: 0.52).
MAX_BYTES = 4 << 30
# A new entry is written only where it leaves this much of the disk free.
FREE_DISK_KEPT = 256 << 20
_SUFFIX = ".kv"
MAGIC = f"KTCLI-PROMPT-KV {FORMAT}\n".encode()


@dataclass(frozen=True)
class Match:
    path: Path
    n_tokens: int  # leading tokens the entry shares with the prompt


def store_key(*parts: object) -> str:
    """A folder name for rows computed one way (model key, dtypes, rope, device...)."""
    return hashlib.sha1("|".join(map(str, (f"format={FORMAT}",) + parts)).encode()).hexdigest()[:20]


_DESCRIPTION = "key.json"  # in each key folder: what its rows were computed with, for the planner


class PrefixStore:
    def __init__(self, root: Path, key: str, max_bytes: int = MAX_BYTES, min_tokens: int = MIN_TOKENS,
                 min_reuse: int = MIN_REUSE, described: dict[str, str] | None = None):
        """`described`: the settings the key stands for, in words the planner can match
        (`stored_prefix`; the key itself is a hash of them and of resolved engine state)."""
        self.folder = Path(root) / key
        self.max_bytes, self.min_tokens, self.min_reuse = max_bytes, min_tokens, min_reuse
        self.described = described
        self.last_error: str | None = None  # why the last save kept nothing, where the disk refused

    def longest(self, ids: list[int]) -> Match | None:
        """The entry sharing the most leading tokens with `ids` (at least min_reuse)."""
        try:
            if len(ids) < self.min_reuse or not self.folder.is_dir():
                return None
        except OSError:  # a folder we may not look into (EACCES was an internal error)
            return None
        want = np.asarray(ids, dtype=np.int64)
        best: Match | None = None
        for path in self._entries():
            try:
                with open(path, "rb") as f:
                    have = _read_header_and_ids(f)[1]
            except (OSError, ValueError):  # a damaged or vanished entry is no entry
                continue
            n = min(len(have), len(want))
            differ = np.flatnonzero(have[:n] != want[:n])
            shared = int(differ[0]) if differ.size else n
            if shared >= self.min_reuse and (best is None or shared > best.n_tokens):
                best = Match(path, shared)
        return best

    def layers(self, match: Match, n_units: int) -> Iterator[dict[str, torch.Tensor]]:
        """The arrays of `match` layer by layer, each per-unit array cut to its first
        `n_units` items (token rows, or pages), the others whole. Raises ValueError where
        the file does not hold what its header says."""
        import torch

        with open(match.path, "rb") as f:
            head, _ = _read_header_and_ids(f)
            units = head["tokens"] // head["unit"]
            if n_units > units:
                raise ValueError("prefix longer than the entry")
            arrays = head["arrays"]
            item_bytes = [_item_bytes(a) for a in arrays]
            start = f.tell()
            f.seek(-4 * head["layers"] * len(arrays), os.SEEK_END)
            crcs = np.frombuffer(f.read(4 * head["layers"] * len(arrays)), dtype=np.uint32)
            f.seek(start)
            try:
                os.utime(match.path)  # used: the last to go when the store is trimmed
                self._describe()
            except OSError:
                pass  # a read-only cache is still read
            for layer in range(head["layers"]):
                out = {}
                for k, (a, size) in enumerate(zip(arrays, item_bytes)):
                    # Read whole, to check it; the prefix is most of it in the common case.
                    t = torch.empty(a["items"], *a["shape"], dtype=getattr(torch, a["dtype"]))
                    raw = t.view(torch.uint8).numpy().reshape(-1)
                    if f.readinto(raw) != a["items"] * size:
                        raise ValueError("short read")
                    if zlib.crc32(raw) != int(crcs[layer * len(arrays) + k]):
                        _remove(match.path)  # damaged for good: the next run writes it afresh
                        raise ValueError(f"layer {layer}: {a['name']} does not match its checksum")
                    out[a["name"]] = t[:n_units] if a["per_unit"] else t
                yield out

    def save(self, ids: list[int], layer_arrays: Callable[[int], dict[str, torch.Tensor] | None], n_layers: int,
             unit: int = 1, fixed: frozenset[str] = frozenset()) -> bool:
        """Keep prompt `ids` with its arrays, asked for one layer at a time
        (`layer_arrays(i)`: name -> tensor whose first dimension counts units of `unit`
        tokens, except the `fixed` ones; None: the layer cannot be kept, nor the entry).
        False where nothing was kept; `last_error` then says why where the disk refused
        (a full disk, a folder that cannot be written). Then trim the store."""
        import torch

        self.last_error = None
        if len(ids) % unit or not ids:  # nothing a read could use
            return False
        name = hashlib.sha1(np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()[:24]
        path = self.folder / f"{name}{_SUFFIX}"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            first = layer_arrays(0)
            if first is None:
                return False
            self.folder.mkdir(parents=True, exist_ok=True)
            arrays = [{"name": k, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape[1:]),
                       "items": t.shape[0], "per_unit": k not in fixed} for k, t in first.items()]
            head = {"tokens": len(ids), "layers": n_layers, "unit": unit, "arrays": arrays}
            size = 4 * len(ids) + n_layers * sum(a["items"] * _item_bytes(a) + 4 for a in arrays)
            if not self._make_room(size):
                return False
            with open(tmp, "wb") as f:
                f.write(MAGIC + json.dumps(head).encode() + b"\n")
                f.write(np.asarray(ids, dtype=np.int32).tobytes())
                crcs = []
                for layer in range(n_layers):
                    got = first if layer == 0 else layer_arrays(layer)
                    if got is None:
                        raise _NotKept
                    for a in arrays:
                        t = got[a["name"]]
                        if t.dtype != first[a["name"]].dtype or list(t.shape) != [a["items"], *a["shape"]]:
                            raise ValueError(f"layer {layer}: {a['name']} of another shape")
                        raw = t.contiguous().cpu().view(torch.uint8).numpy().reshape(-1)
                        crcs.append(zlib.crc32(raw))
                        f.write(raw)
                f.write(np.asarray(crcs, dtype=np.uint32).tobytes())
                f.flush()
                os.fsync(f.fileno())  # on disk before it has its name: a crash left rows of zeros, read as K/V
            os.replace(tmp, path)  # readers see the whole file or none
            self._describe()
        except (OSError, _NotKept) as e:
            if isinstance(e, OSError):
                self.last_error = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
            _remove(tmp)
            return False
        except BaseException:  # Ctrl-C while writing: no temp file left for the next run to sweep
            _remove(tmp)
            raise
        self._trim(keep=path)
        return True

    def _make_room(self, size: int) -> bool:
        """Whether an entry of `size` bytes can be written and leave FREE_DISK_KEPT free on
        the disk, after the least recently used entries make way: before, a nearly full
        disk kept nothing new (the store trimmed only after a write that succeeded)."""
        def free() -> int:
            try:
                return shutil.disk_usage(self.folder).free
            except OSError:
                return size + FREE_DISK_KEPT  # unknown: the write says
        need = size + FREE_DISK_KEPT
        if free() >= need:
            return True
        sized = self._sized_entries()
        if free() + sum(size for _, size, _ in sized) >= need:  # else evicting all would not do: keep them
            self._evict(lambda _total: free() >= need, sized=sized)
            if free() >= need:
                return True
        self.last_error = (f"{size / 2**20:,.0f} MiB to write but {free() / 2**20:,.0f} MiB free on the disk of "
                           f"{self.folder.parent} (the store leaves {FREE_DISK_KEPT >> 20} MiB free)")
        return False

    def _describe(self) -> None:
        """Write the folder's description once (also for a folder kept before they were),
        and again where it is damaged: one cut short (a crash's, or two runs writing it at
        once, as it was written in place) kept the plan from counting the folder's rows for
        good, a question read back in 6 s planned at 20 (probe 104)."""
        path = self.folder / _DESCRIPTION
        if self.described is None or _description(path) is not None:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.described))
            os.replace(tmp, path)  # readers see the whole description or none
        except BaseException:
            _remove(tmp)
            raise

    def _entries(self) -> list[Path]:
        return _entry_files(self.folder)

    def _all_entries(self) -> list[Path]:
        """Entries of every key folder under the store's root: MAX_BYTES bounds them all
        (per key, each weight and page dtype tried kept a GiB of its own)."""
        return [p for folder in self._key_folders() for p in _entry_files(folder)]

    def _trim(self, keep: Path) -> None:
        from ktcli.engine.model_store import sweep_stale

        # A run killed while it wrote an entry, in any key folder: MAX_BYTES counts entries,
        # not these, and a folder no later run writes to (another model, dtype or cache
        # path) kept its killed runs' files (up to a sparse read's ~1 GB each) for good.
        for folder in {self.folder, *self._key_folders()}:
            sweep_stale(folder, f"*{_SUFFIX}.*.tmp")
        self._evict(lambda total: total <= self.max_bytes, keep)

    def _key_folders(self) -> list[Path]:
        try:
            return [p for p in self.folder.parent.iterdir() if p.is_dir()]
        except OSError:
            return []

    def _sized_entries(self) -> list[tuple[float, int, Path]]:
        """(last used, bytes, path) of every entry under the store's root."""
        sized = []
        for p in self._all_entries():
            try:
                st = p.stat()
            except OSError:
                continue
            sized.append((st.st_mtime, st.st_size, p))
        return sized

    def _evict(self, enough: Callable[[int], bool], keep: Path | None = None,
               sized: list[tuple[float, int, Path]] | None = None) -> None:
        """Remove entries (but `keep`), least recently used first, until `enough(bytes
        the store's entries take)`; `sized`: `_sized_entries()` where the caller has it."""
        sized = self._sized_entries() if sized is None else sized
        total = sum(size for _, size, _ in sized)
        for _, size, p in sorted(sized):  # least recently used first
            if enough(total):
                break
            if p == keep:
                continue
            try:
                p.unlink()
                total -= size
            except OSError:
                pass


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass  # a read-only cache: it stays, and each read of it fails its check


def _description(path: Path) -> dict | None:
    """A key folder's description, or None where it is missing, empty or damaged."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _entry_files(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.name.endswith(_SUFFIX)]
    except OSError:
        return []


def prompt_cache_description(model_dir: Path, weights: str, kv_dtype: str, device: str, attention: str = "dense",
                             chunk: int = 0, last_chunk: int = 0, rope: str = "") -> dict[str, str | int]:
    """What the planner can know of a key: the model folder and file stamps, the weight and
    page dtypes, the attention policy (as `config.canonical_attention` spells it), the RoPE
    scaling asked for and the device (not the prefill dtype or config details, which the
    engine resolves; the key covers those); for pages kept in whole chunks
    (`whole_chunks`), the chunk and the fewest tokens of a prompt's last chunk."""
    from ktcli.engine.model_store import model_key

    out: dict[str, str | int] = {"model": model_key(Path(model_dir), "prefix"), "weights": weights,
                                 "kv_dtype": kv_dtype, "attention": attention, "device": device, "rope": rope}
    if chunk:
        out.update(chunk=chunk, last_chunk=last_chunk)
    return out


def whole_chunks(shared: int, prompt_len: int, chunk: int, last_chunk: int) -> int:
    """Of `shared` leading tokens held as whole chunks, how many a prompt of `prompt_len`
    reads: whole chunks that its own prefill would neither end in nor cut short before its
    last (`Engine._chunk_len` keeps the last chunk at least `last_chunk` long)."""
    limit = min(shared, prompt_len - max(1, last_chunk))
    return max(0, limit // chunk * chunk)


def holds_chunked(root: Path) -> bool:
    """Whether any key folder under `root` keeps pages in whole chunks (a sparse read's)."""
    try:
        folders = [p for p in Path(root).iterdir() if p.is_dir()]
    except OSError:
        return False
    for folder in folders:
        try:
            if json.loads((folder / _DESCRIPTION).read_text()).get("chunk") and _entry_files(folder):
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def stored_prefixes(root: Path, ids: list[int], wanted: dict[str, str],
                    min_reuse: int = MIN_REUSE) -> dict[tuple[str, str], int]:
    """For the planner's estimates: per (page dtype, attention policy), the most leading
    tokens of prompt `ids` a run would read from entries whose key folder was described
    with every item of `wanted` (model, weights, device). Without that match a plan counted
    rows of other settings (or of a model converted before) as read, and the run prefilled
    them all."""
    try:
        folders = [p for p in Path(root).iterdir() if p.is_dir()]
    except OSError:
        return {}
    best: dict[tuple[str, str], int] = {}
    for folder in folders:
        try:
            d = json.loads((folder / _DESCRIPTION).read_text())
            if not isinstance(d, dict) or any(d.get(k) != v for k, v in wanted.items()):
                continue
            kind = (str(d["kv_dtype"]), str(d.get("attention", "dense")))
            chunk, last = int(d.get("chunk", 0)), int(d.get("last_chunk", 0))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # written before descriptions were kept, or damaged: not counted
        match = PrefixStore(folder.parent, folder.name, min_reuse=min_reuse).longest(ids)
        if match is None:
            continue
        n = whole_chunks(match.n_tokens, len(ids), chunk, last) if chunk > 0 else min(match.n_tokens, len(ids) - 1)
        if n >= min_reuse:
            best[kind] = max(best.get(kind, 0), n)
    return best


class _NotKept(Exception):
    """A layer's arrays could not be had: the entry is not written."""


# What entries hold: the dense pages' rows, and the quantized pages' codes (uint8), scales
# and summaries.
_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


def _item_bytes(array: dict) -> int:
    return _DTYPES[array["dtype"]] * int(np.prod(array["shape"], dtype=np.int64))


def _read_header_and_ids(f) -> tuple[dict, np.ndarray]:
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a prompt entry")
    try:
        head = json.loads(f.readline(1 << 16))
        for key in ("tokens", "layers", "unit"):
            head[key] = int(head[key])  # used as numbers from here: "12" or 1.5 would not do
            if head[key] < 0:
                raise ValueError(f"negative {key}")
        if head["unit"] < 1 or head["tokens"] % head["unit"]:
            raise ValueError(f"unit {head['unit']}")
        for a in head["arrays"]:
            a["name"], a["per_unit"] = str(a["name"]), bool(a["per_unit"])
            a["items"], a["shape"] = int(a["items"]), [int(x) for x in a["shape"]]
            if a["items"] < 0 or any(x < 0 for x in a["shape"]):
                raise ValueError(f"negative size in {a['name']}")
            if a["dtype"] not in _DTYPES:  # a flipped bit ("float36") was an internal error
                raise ValueError(f"dtype {a['dtype']!r}")
            if a["per_unit"] and a["items"] != head["tokens"] // head["unit"]:
                raise ValueError(f"{a['name']}: {a['items']} items for {head['tokens']} tokens")
        n = head["tokens"]
        # The file is exactly what the header says, so a count changed by a flipped bit
        # (300 tokens read as 100) reads nothing, not rows of other tokens.
        size = (f.tell() + 4 * n + head["layers"] * sum(a["items"] * _item_bytes(a) for a in head["arrays"])
                + 4 * head["layers"] * len(head["arrays"]))  # the checksums
    except (KeyError, TypeError, AttributeError, OverflowError) as e:
        raise ValueError(f"bad header: {e}") from None
    if os.fstat(f.fileno()).st_size != size:
        raise ValueError("the file's size is not its header's")
    ids = np.frombuffer(f.read(4 * n), dtype=np.int32)
    if len(ids) != n:
        raise ValueError("short read")
    return head, ids.astype(np.int64)
