"""Files of ktcli's small on-disk caches (a PDF's pages, a document's chunks, a BM25
index): written whole, marked used when read, and the least recently used swept away past
a cache's bounds. Shared by `ingest.extract_cache`, `ingest.chunk_cache` and
`retrieval.lexical_cache`, whose entries differ only in what they hold."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

# A temporary file this old is a killed run's: a live run's exists for milliseconds.
STALE_TEMP_S = 3600.0


def sources_fingerprint(head: str, sources: Iterable[Path]) -> str:
    """The fingerprint of the code that made a cache's entries: `head` (the versions of the
    libraries it used) and each source file's name and bytes, in order; an edit or an
    upgrade makes it anew."""
    digest = hashlib.sha256(head.encode())
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def write_whole(path: Path, data: bytes | str, errors: str = "strict") -> bool:
    """Write `data` (text as UTF-8) to `path` under a temporary name, then rename it: a
    reader sees the whole entry or none. False, and nothing left, where the disk refuses
    or the text cannot be encoded (a lone surrogate: not worth keeping)."""
    try:
        payload = data.encode("utf-8", errors) if isinstance(data, str) else data
    except UnicodeEncodeError:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # (a server reads on threads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(payload)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
    return True


def mark_used(path: Path) -> None:
    """An entry just read: the last to go when the cache is trimmed."""
    try:
        os.utime(path)
    except OSError:
        pass


def trim(folder: Path, suffix: str, max_entries: int, max_bytes: int | None = None) -> None:
    """Remove the least recently used `suffix` entries of `folder` past `max_entries` (and
    `max_bytes` in all, the newest kept however large), and the temporary files killed runs
    left."""
    now = time.time()
    entries = []
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return
    for e in listing:
        try:
            stat = e.stat()
            if e.name.endswith(".tmp") and now - stat.st_mtime > STALE_TEMP_S:
                os.unlink(e.path)
            elif e.name.endswith(suffix):
                entries.append((stat.st_mtime, stat.st_size, e.path))
        except OSError:
            continue
    count, size = len(entries), sum(n for _, n, _ in entries)
    for _, n, path in sorted(entries)[:-1]:
        if count <= max_entries and (max_bytes is None or size <= max_bytes):
            break
        try:
            os.unlink(path)
        except OSError:
            continue
        count, size = count - 1, size - n
