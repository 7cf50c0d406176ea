"""A safetensors file's header, read and checked against the file's size without torch
(the planner asks whether a converted model is usable; importing torch costs ~1.3 s)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ktcli.errors import UsageError


class DamagedWeightsError(UsageError):
    """A safetensors file shorter than its header says, or otherwise unreadable: a copy or
    conversion cut short. Callers that made the file (the caches) make it again; one that
    reaches the user is the --model's, a usage error as its damaged config.json is."""


def read_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header and where its data starts, after checking the file
    holds every byte the header names: a truncated file (an interrupted copy of the cache)
    would otherwise load as whatever memory the tensors were given."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            n = int.from_bytes(fh.read(8), "little")
            if 8 + n > size:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(n))
        ends = [int(info["data_offsets"][1]) for key, info in header.items() if key != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, MemoryError) as e:
        raise DamagedWeightsError(f"{path}: not a readable safetensors file ({type(e).__name__})") from None
    if size < 8 + n + max(ends, default=0):
        raise DamagedWeightsError(f"{path}: cut short ({size:,} bytes of {8 + n + max(ends):,}; a damaged file)")
    return header, 8 + n


def is_complete(path: Path) -> bool:
    """Whether `path` is a safetensors file holding every byte its header names."""
    try:
        read_header(path)
    except (DamagedWeightsError, OSError):
        return False
    return True
