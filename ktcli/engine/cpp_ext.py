"""Build (once) and load the engine's AVX2 C++ kernels with torch's extension loader.

All kernels (`bf16_gemv`, `int8_gemv`, `cpu_attention`, `cpu_decode`, `cpu_kivi_attention`, the prefill
softmax of `prefill_attention`, the SwiGLU step of `cpu_mlp`, the AMX GEMM of `amx_gemm`, the AMX prefill attention of `amx_attention`) are compiled as *one* library:
each translation unit pulls in torch's headers, which is most of the compile time, so one
library compiles about three times faster than three (the fused decode loop needs the
other two's code anyway). The library is cached (ktcli's cache folder, or
TORCH_EXTENSIONS_DIR, one subfolder per virtualenv), so only the first start after a change
of source compiles; `scripts/setup.sh` does that first build (`python -m
ktcli.engine.cpp_ext`) so a user's first question does not wait for it.

Where that cannot work (no compiler or headers, a CPU without AVX2) `load` returns None and
callers keep their torch path; KTCLI_NO_CPP_KERNELS, or a kernel's own switch, does the
same on purpose.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import threading
import time
from pathlib import Path

NAME = "ktcli_cpu_kernels"
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]

_lock = threading.Lock()
_built: list = []  # [module or None] once the build was tried
_loaded: dict[str | None, object] = {}  # disable switch -> module or None
unavailable: list[str] = []  # why the build failed, where it did (said by engine.loading)


def load(disable_env: str | None = None):
    """The compiled kernels module, or None where it cannot be built or the caller's
    switch (`disable_env`) or KTCLI_NO_CPP_KERNELS is set. Cheap after the first call."""
    if disable_env in _loaded:  # every call after the first: no lock, no environment read
        return _loaded[disable_env]
    disabled = os.environ.get("KTCLI_NO_CPP_KERNELS") or (disable_env and os.environ.get(disable_env))
    module = None if disabled else _build()
    _loaded[disable_env] = module
    return module


def _build():
    import torch

    with _lock:
        if _built:
            return _built[0]
        module = None
        if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
            # Imported here: those modules import this one for `load`.
            from ktcli.engine import (amx_attention, amx_gemm, bf16_gemv, cpu_attention, cpu_decode,
                                      cpu_kivi_attention, cpu_mlp, int8_gemv, prefill_attention)

            source = (bf16_gemv.SOURCE + int8_gemv.SOURCE + cpu_attention.SOURCE + cpu_mlp.SOURCE
                      + cpu_decode.SOURCE + cpu_kivi_attention.SOURCE + prefill_attention.SOURCE + amx_gemm.SOURCE
                      + amx_attention.SOURCE)
            functions = (bf16_gemv.FUNCTIONS + int8_gemv.FUNCTIONS + cpu_attention.FUNCTIONS + cpu_mlp.FUNCTIONS
                         + cpu_decode.FUNCTIONS + cpu_kivi_attention.FUNCTIONS + prefill_attention.FUNCTIONS
                         + amx_gemm.FUNCTIONS + amx_attention.FUNCTIONS)
            started = time.perf_counter()
            try:
                from torch.utils.cpp_extension import load_inline

                folder = _build_dir()
                stamp = _source_stamp(source, functions)
                module = _built_for(folder, stamp) if not os.access(folder, os.W_OK) else None
                if module is None:
                    with _folder_lock(folder):
                        module = load_inline(
                            NAME, cpp_sources=source, functions=functions,
                            extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], verbose=False,
                            build_directory=str(folder),
                        )
                        _write_stamp(folder, stamp)  # under the lock: the library beside it is this one
                    (folder / FAILED_MARK).unlink(missing_ok=True)
            except Exception as e:  # no compiler or headers, a folder we cannot write: the torch path
                module = None
                unavailable.append(f"{type(e).__name__}: {e}".splitlines()[0][:200])
                if time.perf_counter() - started < QUICK_FAILURE_S:
                    _mark_failed()
        else:
            unavailable.append(f"this CPU has no AVX2 ({torch.backends.cpu.get_cpu_capability()})")
        _built.append(module)
        return module


@contextlib.contextmanager
def _folder_lock(folder: Path):
    """Hold an flock on the build folder while torch loads or builds in it, and clear a
    lock file torch left there. torch's own lock (`<folder>/lock`, made with O_EXCL) has
    no owner and no timeout: a run killed while it held it (SIGTERM during the first
    build, ~1 minute) made every later run wait on "loading model" for ever. An flock
    dies with its process, so under ours any `lock` file is stale."""
    with open(folder / "ktcli.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Beside the library: the hash of the sources and flags it was built from. A build folder
# the user cannot write (a cache warmed by another user, a read-only image) cannot be
# loaded through torch's loader, which takes a lock file there even when nothing is to be
# built: the kernels were off and decode ran ~25% slower. The library is loaded directly
# where the stamp says it is this source's.
STAMP = "ktcli.source-sha256"


def _source_stamp(source: str, functions: list[str]) -> str:
    return hashlib.sha256("\n".join([source, *functions, *CFLAGS, _torch_version()]).encode()).hexdigest()


def _write_stamp(folder: Path, stamp: str) -> None:
    tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
    try:
        tmp.write_text(stamp + "\n")
        os.replace(tmp, folder / STAMP)  # a reader sees the whole stamp or the one before
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _built_for(folder: Path, stamp: str):
    """The library in a folder we cannot write, if it was built from these sources; else None."""
    try:
        if (folder / STAMP).read_text().strip() != stamp or not (folder / f"{NAME}.so").exists():
            return None
    except OSError:
        return None
    from torch.utils.cpp_extension import _import_module_from_library

    return _import_module_from_library(NAME, str(folder), True)


def needs_build() -> bool:
    """Whether loading the kernels compiles them first (no library in the build folder
    yet): a minute or so, which the caller says before it starts."""
    import torch

    if _built or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False  # loaded already, or nothing to build here (the torch path)
    return _no_library(_build_dir())


def compile_pending() -> bool:
    """`needs_build` for `ktcli plan`, which imports no torch (a second or two): the CPU's
    AVX2 from /proc/cpuinfo, torch's version from its package (`_torch_version`). A first
    run compiled for 113 s after a plan that said 13 (a pip install without
    scripts/setup.sh, or a fresh TORCH_EXTENSIONS_DIR)."""
    if _built or os.environ.get("KTCLI_NO_CPP_KERNELS"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            avx2 = any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False  # not Linux: not said rather than guessed
    return avx2 and _no_library(_build_dir(make=False))


def _no_library(folder: Path) -> bool:
    """No library in `folder`, and no build failed there: without a compiler every plan
    added a minute for a compile that never came."""
    try:
        return not any(folder.glob(f"{NAME}*.so")) and not (folder / FAILED_MARK).exists()
    except OSError:
        return False


# In the build folder: the last build failed at once (no compiler, no headers), so a plan
# adds no compile minute; a success removes it. A build that failed late (a compile error)
# leaves none: each run pays that minute again, and plans should say so.
FAILED_MARK = "build-failed"
QUICK_FAILURE_S = 10.0


def _mark_failed() -> None:
    try:
        (_build_dir() / FAILED_MARK).write_text("the last build failed; the engine runs its torch path\n")
    except OSError:
        pass


def _build_dir(make: bool = True) -> Path:
    """A build folder per interpreter and torch version. torch's default is one folder per
    name: two virtualenvs (a second checkout, CI beside a dev venv) compile with different
    include paths and would rebuild each other's library on every switch (~50 s each)."""
    import platformdirs

    key = hashlib.sha1(f"{sys.prefix}|{_torch_version()}".encode()).hexdigest()[:12]
    base = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path(platformdirs.user_cache_dir("ktcli")) / "cpp")
    folder = base / f"{NAME}-{key}"
    if make:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def _torch_version() -> str:
    """torch's version as its package names it (`torch.__version__`'s string, read without
    importing torch: the planner asks), else as the module says it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        import torch

        return torch.__version__


if __name__ == "__main__":  # scripts/setup.sh: compile now rather than on the first question
    started = time.perf_counter()
    ok = _build() is not None
    took = time.perf_counter() - started
    print(f"C++ kernels: {'ready' if ok else 'unavailable here, torch path used'} ({took:.0f} s)", file=sys.stderr)
