"""Keep the C allocator's freed step temporaries for the next step instead of handing them
back to the kernel.

Why: a prefill chunk's activations are tensors of several to tens of MB ([2048, 3072] fp32
is 25 MB for SmolLM2), allocated and freed layer after layer. glibc serves blocks above its
mmap threshold with a fresh mmap each time (the threshold only adapts upwards to what was
last freed) and trims the heap top when much of it is free, so every such tensor is faulted
in again page by page, zeroed by the kernel: 110-130K minor faults per 4K-token prefill on
the 2-core Xeon, against ~100 once the threshold covers them (measured with
`resource.getrusage`, int8 weights, a repeated 4K prompt). That was 5-15% of the prefill
time there, noisy.

So blocks up to glibc's largest allowed threshold (32 MB on 64-bit) come from the heap, and
up to 256 MB of free heap stays mapped at its top: with 64 MB, a 2K-token prefill still
faulted ~16K pages in every third or so run (its temporaries peak above that and the top was
trimmed after each). Peak RSS is unchanged by what stays mapped (it was in use at the peak);
measured +25 MB in all (685 against 660 MB, 4K prefill, int8). Bigger blocks (weights, the
KV cache: allocated once) are mmapped as before. Elsewhere than glibc (musl, macOS) this
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: larger values are refused
TRIM_THRESHOLD = 8 * MMAP_THRESHOLD

_done: list[bool] = []
# The free heap is handed back once a run ends with the process this much above where the
# first run left it (`release_idle_heap`).
RELEASE_OVER = 64 << 20


_libc: list = []  # [CDLL or None] once looked up (`_glibc`)


def _glibc():
    """The C library where it is glibc (mallopt, malloc_trim), else None; looked up once."""
    if not _libc:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt, libc.malloc_trim  # noqa: B018 - AttributeError off glibc (musl, macOS)
        except (OSError, AttributeError):
            libc = None
        _libc.append(libc)
    return _libc[0]


def keep_freed_blocks() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True where that took.
    KTCLI_NO_MALLOPT=1 leaves the allocator as it is (A/B). Also bounds oneDNN's caches
    (`bound_kernel_caches`)."""
    bound_kernel_caches()
    if _done:
        return _done[0]
    libc = None if os.environ.get("KTCLI_NO_MALLOPT") else _glibc()
    ok = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _done.append(ok)
    return ok


# Entries oneDNN's primitive cache and ideep's (torch's mkldnn ops) keep, unless the user
# set their own: each holds a GEMM of one shape (~0.3-0.5 MB), and a prefill's last chunk
# and its attention take new shapes with every prompt, so their default 1,024 entries grew
# a process by ~2.7 MB a run, without bound for hundreds of runs (a bf16 GEMM over 480
# row counts: 126 MB held at 64 entries, 236 MB and growing at the default). A run's own
# shapes (4-5 GEMMs a chunk size) are far fewer than this.
KERNEL_CACHE_ENTRIES = 64


def bound_kernel_caches() -> None:
    """Set oneDNN's and ideep's cache sizes (ONEDNN_PRIMITIVE_CACHE_CAPACITY,
    LRU_CACHE_CAPACITY) to KERNEL_CACHE_ENTRIES where the environment sets none; read when
    their caches are first used, so this runs before the engine's first step."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(KERNEL_CACHE_ENTRIES))


def release_idle_heap() -> bool:
    """Hand the free heap back to the kernel once a run has ended with the process
    RELEASE_OVER above its size after the first run; True where it did. The thresholds
    above keep a prefill's temporaries for its next chunk and its next run, but kept
    between runs they piled up in pieces of every prompt's sizes: a summary's process grew
    ~15 MB a part (760 -> 972 MB over 15 parts of a 120-page PDF, past its plan). Handed
    back after every run, the next run's first chunk faulted its ~140 MB of temporaries in
    again (36K minor faults for a 4K prefill); so only past the margin, every few runs.
    glibc only (malloc_trim returns free pages inside the heap, not just its top)."""
    libc = _glibc()
    rss = _resident_bytes()
    if libc is None or rss is None:
        return False
    if not _settled:
        _settled.append(rss)
        return False
    if rss - _settled[0] < RELEASE_OVER:
        return False
    trimmed = bool(libc.malloc_trim(0))
    # what stays is live memory (a grown cache, the next prompt's pages): the margin counts
    # from there, or every run after would trim and fault its temporaries in again
    _settled[0] = max(_settled[0], _resident_bytes() or 0)
    return trimmed


_settled: list[int] = []  # [resident bytes after the first run]


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
