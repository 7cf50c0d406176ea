"""Prompt K/V kept on disk, so that a later prompt starting with the same tokens skips
their prefill.

Why: a user asks several questions about one document. Read whole, every prompt is the
same system prompt and document followed by a different question; on the 2-core CPU the
README's 2.1K-token PDF costs ~4.5 s of prefill per question, an 8K-token input ~20 s.
The K/V rows of a token depend only on the tokens up to it, so the rows computed for the
first question's prompt serve every later prompt up to where the two differ.

An entry is one prompt: its token ids and its K/V rows for every layer, in one file of
ours (below) written and read one layer at a time, so keeping or reading a 6K-token
prompt's 130 MB of rows never holds more than one layer's 4 MB beside the KV pages. A
lookup reads only the ids of each entry (a few KB) and takes the longest common prefix;
the rows are then read for that prefix only. Entries belong to one model, weight dtype,
page dtype, prefill dtype, position encoding and device (`store_key`): rows computed any
other way are never read. The store keeps MAX_BYTES across all its key folders; the least
recently used entries go first. Anything unexpected in a file (a short read, a shape that does not fit) counts as
no entry, and a folder that cannot be written is skipped: the store only ever saves work.

File: MAGIC, a JSON header line ({"tokens": P, "layers": L, "heads": H, "dim": D, "dtype"}),
the ids as int32 [P], then K as [L, P, H, D] and V as [L, P, H, D] in the rows' dtype, so
the first n tokens of a layer are one contiguous read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where rows are read or written: `ktcli plan` reads
    import torch   # only ids here (`stored_prefix`), and torch's import is ~1.2 s of its run

FORMAT = 1
# Prompts shorter than this prefill in about a second on a 2-core CPU: not worth a file.
MIN_TOKENS = 512
# Reuse only a prefix at least this long: every prompt shares the system prompt and chat
# template (~60 tokens), a start not worth opening a file for.
MIN_REUSE = 128
MAX_BYTES = 1 << 30
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

    def layers(self, match: Match, n_tokens: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The K and V rows [n_tokens, H, D] of `match`'s first tokens, layer by layer.
        Raises ValueError where the file does not hold what its header says."""
        import torch

        with open(match.path, "rb") as f:
            head, ids = _read_header_and_ids(f)
            total, n_layers = head["tokens"], head["layers"]
            if n_tokens > total:
                raise ValueError("prefix longer than the entry")
            dtype = getattr(torch, head["dtype"])
            row = head["heads"] * head["dim"] * torch.empty(0, dtype=dtype).element_size()
            start = f.tell()
            try:
                os.utime(match.path)  # used: the last to go when the store is trimmed
                self._describe()
            except OSError:
                pass  # a read-only cache is still read
            for layer in range(n_layers):
                pair = []
                for kind in range(2):
                    f.seek(start + ((kind * n_layers + layer) * total) * row)
                    out = torch.empty(n_tokens, head["heads"], head["dim"], dtype=dtype)
                    if f.readinto(out.view(torch.uint8).numpy().reshape(-1)) != n_tokens * row:
                        raise ValueError("short read")
                    pair.append(out)
                yield pair[0], pair[1]

    def save(self, ids: list[int], k_layers: Callable[[int], torch.Tensor], v_layers: Callable[[int], torch.Tensor],
             n_layers: int) -> bool:
        """Keep prompt `ids` with its rows, asked for one layer at a time (`k_layers(i)`:
        [P, H, D]); False where the folder cannot be written. Then trim the store."""
        import torch

        name = hashlib.sha1(np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()[:24]
        path = self.folder / f"{name}{_SUFFIX}"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                first = k_layers(0)
                head = {"tokens": len(ids), "layers": n_layers, "heads": first.shape[1], "dim": first.shape[2],
                        "dtype": str(first.dtype).removeprefix("torch.")}
                f.write(MAGIC + json.dumps(head).encode() + b"\n")
                f.write(np.asarray(ids, dtype=np.int32).tobytes())
                for rows in (k_layers, v_layers):
                    for layer in range(n_layers):
                        t = first if rows is k_layers and layer == 0 else rows(layer)
                        f.write(t.contiguous().cpu().view(torch.uint8).numpy().reshape(-1))
                f.flush()
                os.fsync(f.fileno())  # on disk before it has its name: a crash left rows of zeros, read as K/V
            os.replace(tmp, path)  # readers see the whole file or none
            self._describe()
        except OSError:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            return False
        self._trim(keep=path)
        return True

    def _describe(self) -> None:
        """Write the folder's description once (also for a folder kept before they were)."""
        path = self.folder / _DESCRIPTION
        if self.described is not None and (not path.is_file() or path.stat().st_size == 0):  # empty: a crash's
            path.write_text(json.dumps(self.described))

    def _entries(self) -> list[Path]:
        return _entry_files(self.folder)

    def _all_entries(self) -> list[Path]:
        """Entries of every key folder under the store's root: MAX_BYTES bounds them all
        (per key, each weight and page dtype tried kept a GiB of its own)."""
        try:
            folders = [p for p in self.folder.parent.iterdir() if p.is_dir()]
        except OSError:
            return []
        return [p for folder in folders for p in _entry_files(folder)]

    def _trim(self, keep: Path) -> None:
        from ktcli.engine.model_store import sweep_stale

        sweep_stale(self.folder, f"*{_SUFFIX}.*.tmp")  # a run killed while it wrote an entry
        sized = []
        for p in self._all_entries():
            try:
                st = p.stat()
            except OSError:
                continue
            sized.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in sized)
        for _, size, p in sorted(sized):  # least recently used first
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            try:
                p.unlink()
                total -= size
            except OSError:
                pass


def _entry_files(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.name.endswith(_SUFFIX)]
    except OSError:
        return []


def prompt_cache_description(model_dir: Path, weights: str, kv_dtype: str, device: str) -> dict[str, str]:
    """What the planner can know of a key: the model folder and file stamps, the weight and
    page dtypes and the device (not the prefill dtype or config details, which the engine
    resolves; the key covers those)."""
    from ktcli.engine.model_store import model_key

    return {"model": model_key(Path(model_dir), "prefix"), "weights": weights, "kv_dtype": kv_dtype, "device": device}


def stored_prefix(root: Path, ids: list[int], wanted: dict[str, str], min_reuse: int = MIN_REUSE) -> int:
    """For the planner's estimate: the most leading tokens of `ids` held by an entry whose
    key folder was described with every item of `wanted` (model, weights, page dtype,
    device); 0 below min_reuse. Without that match a plan counted rows of other settings
    (or of a model converted before) as read, and the run prefilled them all."""
    try:
        folders = [p for p in Path(root).iterdir() if p.is_dir()]
    except OSError:
        return 0
    best = 0
    for folder in folders:
        try:
            described = json.loads((folder / _DESCRIPTION).read_text())
        except (OSError, ValueError):
            continue  # written before descriptions were kept, or damaged: not counted
        if not isinstance(described, dict) or any(described.get(k) != v for k, v in wanted.items()):
            continue
        match = PrefixStore(folder.parent, folder.name, min_reuse=min_reuse).longest(ids)
        if match is not None:
            best = max(best, match.n_tokens)
    return best


_ROW_DTYPES = frozenset({"float32", "float16", "bfloat16"})  # what the dense pages hold


def _read_header_and_ids(f) -> tuple[dict, np.ndarray]:
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a prompt entry")
    try:
        head = json.loads(f.readline(4096))
        for key in ("tokens", "layers", "heads", "dim"):
            head[key] = int(head[key])  # used as numbers from here: "12" or 1.5 would not do
            if head[key] < 0:
                raise ValueError(f"negative {key}")
        if head["dtype"] not in _ROW_DTYPES:  # a flipped bit ("float36") was an internal error
            raise ValueError(f"dtype {head['dtype']!r}")
        n = head["tokens"]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"bad header: {e}") from None
    ids = np.frombuffer(f.read(4 * n), dtype=np.int32)
    if len(ids) != n:
        raise ValueError("short read")
    return head, ids.astype(np.int64)
