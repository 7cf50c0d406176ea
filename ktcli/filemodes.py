"""Modes of what ktcli writes to its cache: what the user's umask allows, as files made with
open() get. Temporary folders and files (mkdtemp, mkstemp) are made owner-only, and so are
safetensors' files: a cache warmed as one user (a Docker image built as root, a CI cache)
failed for every other with "Permission denied" on the converted model, its packed weights
and the retrieval index, while the prompt and notes files beside them were readable."""

from __future__ import annotations

import functools
import os
from pathlib import Path


@functools.cache
def _umask() -> int:
    """Read from /proc where Linux says it: setting it to read it (the only other way)
    changes it for the whole process for a moment, another thread's files included."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~_umask()


def folder_mode() -> int:
    return 0o777 & ~_umask()


def as_umask_allows(path: Path | str) -> None:
    """`path` (a file, or a folder and everything in it) given the modes open() and mkdir()
    would have given it. Best effort: a mode that cannot be set leaves it as it was."""
    path = Path(path)
    try:
        if path.is_dir():
            os.chmod(path, folder_mode())
            for child in path.rglob("*"):
                os.chmod(child, folder_mode() if child.is_dir() else file_mode())
        else:
            os.chmod(path, file_mode())
    except OSError:
        pass
