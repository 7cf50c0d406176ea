"""A safetensors file's header, read and checked against the file's size without torch
(the planner asks whether a converted model is usable; importing torch costs ~1.3 s); and
a file written one tensor at a time."""

from __future__ import annotations

import json
import os
import struct
import zlib
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
        misfit = _misfit_tensor(header)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, MemoryError) as e:
        raise DamagedWeightsError(f"{path}: not a readable safetensors file ({type(e).__name__})") from None
    if misfit:
        # (safetensors' own reader refuses it too, after the plan: `--engine hf` said "internal
        # error: SafetensorError", and a shape of text was blamed on config.json)
        raise DamagedWeightsError(f"{path}: tensor {misfit}'s bytes do not match its shape and dtype (a damaged file)")
    if size < 8 + n + max(ends, default=0):
        raise DamagedWeightsError(f"{path}: cut short ({size:,} bytes of {8 + n + max(ends):,}; a damaged file)")
    return header, 8 + n


# Bytes per element of the dtypes safetensors names (others are not checked).
_ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                  "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _misfit_tensor(header: dict) -> str | None:
    """The first tensor whose byte range is not its shape times its dtype's width (a header
    damaged in place: a dtype or a shape changed), else None; raises on a shape or range
    that is not numbers."""
    import math

    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = (int(x) for x in info["data_offsets"])
        count = math.prod(int(d) for d in info["shape"])
        width = _ELEMENT_BYTES.get(info["dtype"])
        if begin < 0 or end < begin or (width is not None and count * width != end - begin):
            return name
    return None


def write_file(out: BinaryIO, entries: list[tuple[str, str, tuple[int, ...], int]], arrays: Iterable,
               metadata: dict[str, str] | None = None, checksums: bool = False) -> None:
    """A safetensors file (an 8-byte header length, a JSON header of names, dtypes, shapes
    and byte ranges, then the data) written to `out` one tensor at a time: `entries` are
    (name, safetensors dtype such as "BF16", shape, bytes), and `arrays` yields their data
    in that order, each a contiguous numpy array of that many bytes, made when it is asked
    for. safetensors' own save_file (0.8) copies every GPU tensor to the host and keeps all
    of them until the file is written: the whole model in host memory (`benchmarks.pack_save`:
    on the CPU the two cost the same).

    `checksums`: each tensor's CRC32, computed as it is written, goes into the metadata
    (CHECKSUM_KEY, read back by `checksums_of`); the header is written first with
    placeholders of the same width and rewritten in place at the end (`out` must seek)."""
    meta = dict(metadata or {})
    if checksums:
        meta[CHECKSUM_KEY] = _checksum_text({name: 0 for name, *_ in entries})
    head: dict = {"__metadata__": meta} if meta else {}
    at = 0
    for name, dtype, shape, size in entries:
        head[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + size]}
        at += size
    raw = _header_bytes(head)
    out.write(struct.pack("<Q", len(raw)))
    out.write(raw)
    sums = {}
    for (name, _, _, size), array in zip(entries, arrays, strict=True):  # (one missing: ValueError)
        if array.nbytes != size:
            raise ValueError(f"{name}: {array.nbytes:,} bytes given for {size:,}")
        if checksums:
            sums[name] = crc32(array)
        array.tofile(out)  # (no bytes copy of it)
    if checksums:
        meta[CHECKSUM_KEY] = _checksum_text(sums)
        final = _header_bytes(head)
        assert len(final) == len(raw)  # (fixed-width sums: the data stays where the header says)
        end = out.tell()
        out.seek(8)
        out.write(final)
        out.seek(end)


# The metadata key of `write_file(checksums=True)`'s sums: a JSON object, name to 8 hex digits.
CHECKSUM_KEY = "crc32"


def _checksum_text(sums: dict[str, int]) -> str:
    return json.dumps({name: f"{crc:08x}" for name, crc in sums.items()}, separators=(",", ":"))


def _header_bytes(head: dict) -> bytes:
    raw = json.dumps(head, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned


def checksums_of(metadata: dict[str, str]) -> dict[str, int] | None:
    """The CRC32 of each tensor `write_file(checksums=True)` recorded, None where the
    metadata holds none or they cannot be read."""
    try:
        sums = json.loads(metadata[CHECKSUM_KEY])
        return {str(name): int(crc, 16) for name, crc in sums.items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def verify_checksums(path: Path, chunk: int = 8 << 20) -> bool:
    """Whether every tensor of the file at `path` whose CRC32 `write_file(checksums=True)`
    recorded still has it (True for a file that records none: a model's own file). Read in
    chunks of `chunk` bytes: ~0.4 s for the bundled model's 538 MB float32 copy on the
    2-core Xeon, from the page cache. For readers that load the file themselves
    (transformers' loader); ours checks each tensor as it reads it (`weights.TensorReader`)."""
    header, base = read_header(path)
    sums = checksums_of(header.get("__metadata__") or {})
    if sums is None:
        return True
    with open(path, "rb") as fh:
        for name, info in header.items():
            if name == "__metadata__" or name not in sums:
                continue
            begin, end = (int(x) for x in info["data_offsets"])
            fh.seek(base + begin)
            crc, left = 0, end - begin
            while left > 0:
                block = fh.read(min(chunk, left))
                if not block:
                    return False
                crc = zlib.crc32(block, crc)
                left -= len(block)
            if crc != sums[name]:
                return False
    return True


def add_checksums(path: Path) -> None:
    """Rewrite the safetensors file at `path` (in place, through a temp file beside it) with
    each tensor's CRC32 in its metadata, as `write_file(checksums=True)` writes them: for a
    file another writer made (transformers' `save_pretrained`), one tensor in memory at a time."""
    import numpy as np

    header, base = read_header(path)
    meta = header.pop("__metadata__", None) or {}
    names = sorted(header, key=lambda n: int(header[n]["data_offsets"][0]))
    entries = [(n, header[n]["dtype"], tuple(header[n]["shape"]),
                int(header[n]["data_offsets"][1]) - int(header[n]["data_offsets"][0])) for n in names]
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(path, "rb") as src, open(tmp, "wb") as out:
            def arrays():
                for name, _, _, size in entries:
                    src.seek(base + int(header[name]["data_offsets"][0]))
                    yield np.fromfile(src, dtype=np.uint8, count=size)
            write_file(out, entries, arrays(), meta, checksums=True)
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def crc32(array) -> int:
    """The CRC32 of a contiguous array's bytes (zlib lets go of the GIL as it works: 151 MB
    of packed SmolLM2 in ~45 ms of CPU on the 2-core Xeon)."""
    return zlib.crc32(array.reshape(-1).view("uint8"))
