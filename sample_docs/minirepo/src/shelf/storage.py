"""Loading and saving the catalogue: one JSON file, replaced atomically."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from shelf.models import Book

DEFAULT_FILE = Path.home() / ".shelf" / "books.json"


def catalogue_path() -> Path:
    """SHELF_FILE wins over the default, so tests and second libraries stay apart."""
    env = os.environ.get("SHELF_FILE")
    return Path(env) if env else DEFAULT_FILE


def load(path: Path | None = None) -> list[Book]:
    path = path or catalogue_path()
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return [Book(**record) for record in json.load(handle)]


def save(books: list[Book], path: Path | None = None) -> None:
    """Write to a temporary file in the same folder and rename it over the old one:
    a crash mid-write never leaves a half-written catalogue."""
    path = path or catalogue_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump([asdict(b) for b in books], handle, indent=2, ensure_ascii=False)
    os.replace(tmp, path)


def next_id(books: list[Book]) -> int:
    return max((b.id for b in books), default=0) + 1
