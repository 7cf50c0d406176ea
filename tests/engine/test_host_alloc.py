"""engine.host_alloc: with the engine loaded on the CPU (which raises glibc's thresholds),
a repeated 2K-token prefill of the bundled model reuses its tens-of-MB temporaries from the
heap instead of faulting them in again (glibc's defaults measured 110-130K minor faults for
a repeated 4K prefill); KTCLI_NO_MALLOPT=1 leaves the allocator as it is."""

import os
import platform
import subprocess
import sys

import pytest

_CHILD = """
import resource, sys, torch
from ktcli.engine import host_alloc
from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend
b = NativeBackend.load(sys.argv[1], weights="int8", threads=2, kv_budget_bytes=64 << 20)
ids = [(i * 7919) % 40000 + 100 for i in range(2048)]
with torch.inference_mode():
    faults = []
    for _ in range(int(sys.argv[2])):  # the first prefills grow the heap
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b.generate_ids([ids], SamplingParams(max_new_tokens=1))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(host_alloc.keep_freed_blocks(), min(faults[2:], default=0))
"""


def _child(folder, prefills: int, **env) -> tuple[bool, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "KTCLI_NO_MALLOPT"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(prefills)], env={**clean, **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    took, faults = out.stdout.split()[-2:]
    return took == "True", int(faults)


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0].startswith("glibc"),
                    reason="glibc's mallopt")
def test_repeated_prefill_reuses_its_temporaries(smollm2_dir):
    took, faults = _child(smollm2_dir, 3)
    assert took
    # the third prefill faults in fewer pages than one [2048, 3072] fp32 temporary
    # (25 MB) in all: measured 0-2,500 from the second prefill on; glibc's defaults 32-85K
    # every time
    assert faults < 6144
    took, _ = _child(smollm2_dir, 0, KTCLI_NO_MALLOPT="1")  # the load alone sets (or not) the thresholds
    assert not took


_TRIM_CHILD = """
from ktcli.engine import host_alloc
host_alloc.keep_freed_blocks()
first = host_alloc.release_idle_heap()  # the first run: where the process settled
blocks = [bytearray(4 << 20) for _ in range(40)]  # 160 MB of heap blocks (under the 32 MB mmap threshold)
for b in blocks:
    b[::4096] = b"x" * len(b[::4096])  # touched: resident
before = host_alloc._resident_bytes()
del blocks
trimmed = host_alloc.release_idle_heap()
after = host_alloc._resident_bytes()
print(first, trimmed, (before - after) >> 20, host_alloc.release_idle_heap())
"""


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0].startswith("glibc"),
                    reason="glibc's malloc_trim")
def test_the_free_heap_piled_up_between_runs_is_handed_back():
    """A summary's process grew ~15 MB a part: every prompt's temporaries, kept by the
    raised thresholds, stayed in pieces in the heap between runs. (In a process of its own:
    the suite's heap holds other tests' free blocks.)"""
    out = subprocess.run([sys.executable, "-c", _TRIM_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, trimmed, released_mb, again = out.stdout.split()
    assert (first, trimmed, again) == ("False", "True", "False")  # settled; past the margin; back under it
    assert int(released_mb) > 100


def test_the_margin_counts_from_what_stays_after_a_trim(monkeypatch):
    """Review: live growth past the margin trimmed after every run, each next run faulting
    its temporaries in again."""
    from ktcli.engine import host_alloc

    class Libc:
        trims = 0

        def malloc_trim(self, pad):
            Libc.trims += 1
            return 1

    sizes = iter([500, 520, 700, 690, 700])  # MB after runs: the first, under, over (690 after its trim), under
    monkeypatch.setattr(host_alloc, "_libc", [Libc()])
    monkeypatch.setattr(host_alloc, "_settled", [])
    monkeypatch.setattr(host_alloc, "_resident_bytes", lambda: next(sizes) << 20)
    assert [host_alloc.release_idle_heap() for _ in range(4)] == [False, False, True, False]
    assert Libc.trims == 1 and host_alloc._settled == [690 << 20]  # counted from what stayed


def test_onednn_caches_are_bounded_unless_the_user_sized_them(monkeypatch):
    """oneDNN's and ideep's caches keep a GEMM per shape, 1,024 by default: a prefill's
    last chunk takes a new shape with every prompt, and a long summary's process grew
    ~2.7 MB a part with no bound short of hundreds of MB."""
    from ktcli.engine import host_alloc

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "8")  # the user's own
    host_alloc.bound_kernel_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(host_alloc.KERNEL_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "8"
