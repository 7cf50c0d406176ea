"""Prompt K/V kept on disk, so that a later prompt starting with the same tokens skips
their prefill.

Why: a user asks several questions about one document. Read whole, every prompt is the
same system prompt and document followed by a different question; on the 2-core CPU the
README's 2.1K-token PDF costs ~4.5 s of prefill per question, an 8K-token input ~20 s.
The K/V rows of a token depend only on the tokens up to it, so the rows computed for the
first question's prompt serve every later prompt up to where the two differ.

An entry is one prompt: its token ids and its K/V rows for every layer, [L, P, H, D] in
the cache's dtype, in one safetensors file. A lookup reads only the ids of each entry
(a few KB) and takes the longest common prefix; the rows are then read for that prefix
only (`safe_open` slices). Entries belong to one model, weight dtype, page dtype, prefill
dtype, position encoding and device (`store_key`): rows computed any other way are never
read. The store keeps MAX_BYTES; the least recently used entries go first. Anything
unexpected in a file (a short read, a shape that does not fit) counts as no entry, and a
folder that cannot be written is skipped: the store only ever saves work.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FORMAT = 1
# Prompts shorter than this prefill in about a second on a 2-core CPU: not worth a file.
MIN_TOKENS = 512
# Reuse only a prefix at least this long: below it the reads cost about what they save.
MIN_REUSE = 128
MAX_BYTES = 1 << 30
_SUFFIX = ".kv.safetensors"


@dataclass(frozen=True)
class Match:
    path: Path
    n_tokens: int  # leading tokens the entry shares with the prompt


def store_key(*parts: object) -> str:
    """A folder name for rows computed one way (model key, dtypes, rope, device...)."""
    return hashlib.sha1("|".join(map(str, (f"format={FORMAT}",) + parts)).encode()).hexdigest()[:20]


class PrefixStore:
    def __init__(self, root: Path, key: str, max_bytes: int = MAX_BYTES, min_tokens: int = MIN_TOKENS,
                 min_reuse: int = MIN_REUSE):
        self.folder = Path(root) / key
        self.max_bytes, self.min_tokens, self.min_reuse = max_bytes, min_tokens, min_reuse

    def longest(self, ids: list[int]) -> Match | None:
        """The entry sharing the most leading tokens with `ids` (at least min_reuse)."""
        if len(ids) < self.min_reuse or not self.folder.is_dir():
            return None
        want = np.asarray(ids, dtype=np.int64)
        best: Match | None = None
        for path in self._entries():
            have = _read_ids(path)
            if have is None:
                continue
            n = min(len(have), len(want))
            differ = np.flatnonzero(have[:n] != want[:n])
            shared = int(differ[0]) if differ.size else n
            if shared >= self.min_reuse and (best is None or shared > best.n_tokens):
                best = Match(path, shared)
        return best

    def load(self, match: Match, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The K and V rows [L, n_tokens, H, D] of `match`'s first tokens, or None where
        the file cannot be read as written."""
        from safetensors import safe_open

        try:
            with safe_open(str(match.path), framework="pt") as f:
                k = f.get_slice("k")[:, :n_tokens]
                v = f.get_slice("v")[:, :n_tokens]
            os.utime(match.path)  # used: the last to go when the store is trimmed
        except Exception:  # noqa: BLE001 - a damaged or vanished entry is no entry
            return None
        if k.shape != v.shape or k.dim() != 4 or k.shape[1] != n_tokens:
            return None
        return k, v

    def save(self, ids: list[int], k: torch.Tensor, v: torch.Tensor) -> bool:
        """Keep the rows [L, P, H, D] of prompt `ids` (P = len(ids)); False where the
        folder cannot be written. Then trim the store to max_bytes."""
        from safetensors.torch import save_file

        name = hashlib.sha1(np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()[:24]
        path = self.folder / f"{name}{_SUFFIX}"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tensors = {"ids": torch.tensor(ids, dtype=torch.int32), "k": k.contiguous(), "v": v.contiguous()}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp))
            os.replace(tmp, path)  # readers see the whole file or none
        except OSError:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            return False
        self._trim(keep=path)
        return True

    def _entries(self) -> list[Path]:
        try:
            return [p for p in self.folder.iterdir() if p.name.endswith(_SUFFIX)]
        except OSError:
            return []

    def _trim(self, keep: Path) -> None:
        sized = []
        for p in self._entries():
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


def _read_ids(path: Path) -> np.ndarray | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor("ids").numpy().astype(np.int64)
    except Exception:  # noqa: BLE001 - a damaged or vanished entry is no entry
        return None
