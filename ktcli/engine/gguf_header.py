"""A GGUF file's metadata and tensor table, read without its tensors.

Why not gguf's `GGUFReader`: it builds numpy views of every element of every metadata
array, and a tokenizer's vocabulary and merges (~98K strings in SmolLM2's GGUF) took
2.9-4.5 s to read on the 2-core AMD test machine, paid by every plan made before the
model's first conversion (and by every test that plans with a fresh cache). This reader
walks the same layout (GGUF v2 and v3, little-endian) and keeps an array longer than
SHORT_ARRAY as its length alone: 14-17 ms for the same file, 215-265x less in the same run
(`python -m benchmarks.gguf_header`).

Layout (ggml's gguf.md): magic "GGUF", u32 version, u64 tensor count, u64 metadata count;
each metadata entry a string key, a u32 type and the value (an array: u32 element type,
u64 count, the elements); each tensor a string name, u32 dimension count, u64 dimensions,
u32 ggml type, u64 offset from the data section, which starts at the next multiple of
`general.alignment` (32 where unset) after the table.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Arrays up to this many elements keep their values (RoPE's, a stop-token list); longer
# ones (vocabularies, merges, scores) only their length, which is all ktcli reads of them.
SHORT_ARRAY = 64

_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class Field:
    """One metadata entry: `value` a number, a string, or a list (a short array); a long
    array has value None and its element count in `length`."""

    value: object
    length: int | None = None

    def contents(self):
        return self.value


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    tensor_type: int  # ggml's type number (gguf.GGMLQuantizationType)
    offset: int  # from the file's start
    path: Path

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.tensor_type)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {self.name}: ggml type {self.tensor_type}") from None
        return self.n_elements // block * size

    @property
    def data(self) -> np.ndarray:
        """The tensor's raw bytes (uint8), read from the file when asked for."""
        n_bytes = self.n_bytes
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            raw = f.read(n_bytes)
        if len(raw) != n_bytes:
            raise ValueError(f"tensor {self.name} is cut short")
        return np.frombuffer(raw, dtype=np.uint8)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    fields: dict[str, Field]
    tensors: list[Tensor]


def read_header(path: Path, whole: tuple[str, ...] = ()) -> GGUFHeader:
    """The metadata and tensor table of the GGUF at `path`; the arrays named in `whole`
    (a vocabulary, its merges) with all their values, however long. ValueError for a file
    that is not GGUF (v2/v3, little-endian) or is cut short; OSError where it cannot be read."""
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise ValueError("too short to be GGUF")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _Walk(buf, path, frozenset(whole)).header()
            except struct.error:
                raise ValueError("cut short") from None


class _Walk:
    """A cursor over the mapped file; every count is checked against the bytes left, so a
    damaged count is an error, not a loop over billions of elements."""

    def __init__(self, buf, path: Path, whole: frozenset[str] = frozenset()):
        self.buf, self.path, self.pos, self.whole = buf, path, 0, whole

    def header(self) -> GGUFHeader:
        if self.buf[:4] != b"GGUF":
            raise ValueError("no GGUF magic")
        self.pos = 4
        version = self.u32()
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (ktcli reads 2 and 3, little-endian)")
        n_tensors, n_fields = self.u64(), self.u64()
        self.fits(n_tensors, 24)  # the smallest entry of each kind, in bytes
        self.fits(n_fields, 12)
        fields = {}
        for _ in range(n_fields):
            key = self.string()
            kind = self.u32()
            fields[key] = self.array(whole=True) if kind == _ARRAY and key in self.whole else self.value(kind)
        table = []
        for _ in range(n_tensors):
            name = self.string()
            n_dims = self.u32()
            self.fits(n_dims, 8)
            shape = tuple(self.u64() for _ in range(n_dims))
            table.append((name, shape, self.u32(), self.u64()))
        align = fields.get("general.alignment", Field(32)).value
        if not isinstance(align, int) or align <= 0:
            raise ValueError(f"general.alignment {align!r}")
        data_start = -(-self.pos // align) * align
        tensors = [Tensor(n, s, t, data_start + o, self.path) for n, s, t, o in table]
        # A file cut inside its tensors: GGUFReader refused it on opening; so does this,
        # before a conversion that would fail after tens of seconds.
        for t in tensors:
            if t.offset + t.n_bytes > len(self.buf):
                raise ValueError(f"tensor {t.name} ends past the file's end (cut short)")
        return GGUFHeader(version, fields, tensors)

    def fits(self, count: int, least: int) -> bool:
        if count * least > len(self.buf) - self.pos:
            raise ValueError(f"a count of {count:,} past the file's end")
        return True

    def u32(self) -> int:
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        self.fits(n, 1)
        text = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Field:
        if kind == _STRING:
            return Field(self.string())
        if kind == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"metadata type {kind}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return Field(v)

    def array(self, whole: bool = False) -> Field:
        kind, count = self.u32(), self.u64()
        if whole and kind in _SCALARS:
            step = struct.calcsize(_SCALARS[kind])
            self.fits(count, step)
            values = np.frombuffer(self.buf, dtype=np.dtype(_SCALARS[kind]), count=count, offset=self.pos).tolist()
            self.pos += count * step
            return Field(values, count)
        if count <= SHORT_ARRAY or whole:
            self.fits(count, 1)
            return Field([self.value(kind).value for _ in range(count)], count)
        if kind == _STRING:  # each a u64 length and its bytes: stepped over
            self.fits(count, 8)
            buf, pos, end = self.buf, self.pos, len(self.buf)
            for _ in range(count):
                pos += 8 + _U64.unpack_from(buf, pos)[0]
                if pos > end:
                    raise ValueError("cut short")
            self.pos = pos
        elif kind in _SCALARS:
            step = struct.calcsize(_SCALARS[kind])
            self.fits(count, step)
            self.pos += count * step
        else:  # arrays of arrays: no GGUF ktcli reads has one long enough to matter
            for _ in range(count):
                self.value(kind)
        return Field(None, count)
