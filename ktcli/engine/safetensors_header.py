"""A safetensors file's header, read and checked against the file's size without torch
(the planner asks whether a converted model is usable; importing torch costs ~1.3 s); and
a file written one tensor at a time."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

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


def write_file(out: BinaryIO, entries: list[tuple[str, str, tuple[int, ...], int]], arrays: Iterable,
               metadata: dict[str, str] | None = None) -> None:
    """A safetensors file (an 8-byte header length, a JSON header of names, dtypes, shapes
    and byte ranges, then the data) written to `out` one tensor at a time: `entries` are
    (name, safetensors dtype such as "BF16", shape, bytes), and `arrays` yields their data
    in that order, each a contiguous numpy array of that many bytes, made when it is asked
    for. safetensors' own save_file (0.8) copies every GPU tensor to the host and keeps all
    of them until the file is written: the whole model in host memory (`benchmarks.pack_save`:
    on the CPU the two cost the same)."""
    head: dict = {"__metadata__": metadata} if metadata else {}
    at = 0
    for name, dtype, shape, size in entries:
        head[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + size]}
        at += size
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    out.write(struct.pack("<Q", len(raw)))
    out.write(raw)
    for (name, _, _, size), array in zip(entries, arrays, strict=True):  # (one missing: ValueError)
        if array.nbytes != size:
            raise ValueError(f"{name}: {array.nbytes:,} bytes given for {size:,}")
        array.tofile(out)  # (no bytes copy of it)
