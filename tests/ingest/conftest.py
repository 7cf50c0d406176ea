"""The `write` fixture: files in tmp_path, folders created."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, bytes | str], Path]:
    """write("a/b.txt", content) -> the path, folders created; str content as UTF-8."""

    def _write(rel: str, content: bytes | str) -> Path:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_bytes(content.encode("utf-8"))
        else:
            path.write_bytes(content)
        return path

    return _write
