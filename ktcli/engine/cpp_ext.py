"""Build (once) and load the engine's AVX2 C++ kernels with torch's extension loader.

All kernels (`bf16_gemv`, `int8_gemv`, `cpu_attention`, `cpu_decode`, `cpu_kivi_attention`, the prefill
softmax of `prefill_attention`, the SwiGLU step of `cpu_mlp`, the AMX GEMM of `amx_gemm`, the AMX
prefill attention of `amx_attention`) are one library, built from three units that torch's
loader compiles side by side (`UNITS`, and the bindings). Each unit includes only the torch
headers it needs (`PRELUDE`): torch/extension.h alone took ~27 s of a unit's compile. The
library is cached (ktcli's cache folder, or TORCH_EXTENSIONS_DIR, one subfolder per
virtualenv), so only the first start after a change of source compiles; `scripts/setup.sh`
does that first build (`python -m ktcli.engine.cpp_ext`) so a user's first question does
not wait for it.

Where that cannot work (no compiler or headers, a CPU without AVX2) `load` returns None and
callers keep their torch path; KTCLI_NO_CPP_KERNELS, or a kernel's own switch, does the
same on purpose.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
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
            started = time.perf_counter()
            try:
                from torch.utils.cpp_extension import load as load_sources

                folder = _build_dir()
                files = _library_files()
                stamp = _source_stamp(files)
                module = _built_for(folder, stamp) if not os.access(folder, os.W_OK) else None
                if module is None:
                    with _folder_lock(folder):
                        paths = [_write_if_changed(folder / name, text) for name, text in files.items()]
                        module = load_sources(
                            NAME, sources=[str(p) for p in paths if p.suffix == ".cpp"],
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


# The library's translation units. The modules of a unit call one another's helpers (the
# fused decode loop calls the GEMVs and the attention, the KIVI kernels cpu_attention's
# online softmax), so each unit is concatenated in this order; the AMX kernels stand alone.
# The bindings are a unit of their own: pybind's templates cost as much to compile as the
# first unit, and torch's loader builds the three side by side (ninja).
UNITS = (
    ("bf16_gemv", "int8_gemv", "cpu_attention", "cpu_mlp", "cpu_decode", "cpu_kivi_attention", "prefill_attention"),
    ("amx_gemm", "amx_attention"),
)
# What the kernels use of torch, in place of torch/extension.h: that header parses in ~27 s
# of CPU (all of torch's C++ API, autograd and pybind), these in ~6 s. The kernels are
# written against torch's names (torch::Tensor, torch::kFloat32): `torch` here is ATen
# under torch's aliases, as torch/types.h makes it.
PRELUDE_NAME = "ktcli_torch.h"
PRELUDE = """#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
namespace torch {
using namespace at;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kBFloat16 = at::kBFloat16;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kUInt8 = at::kByte;
}  // namespace torch
"""
# The bindings: pybind with torch's tensor casters, and torch's error translation
# (`wrap_pybind_function`: a failed TORCH_CHECK raises the same Python error it did when
# load_inline wrote the bindings).
BINDINGS_HEADERS = ("torch/csrc/Exceptions.h", "torch/csrc/utils/pybind.h")


def _library_files() -> dict[str, str]:
    """File name -> text, for every file the library is built from: the prelude, a
    `kernels_<i>.cpp` per unit and `bindings.cpp`."""
    import importlib

    files = {PRELUDE_NAME: PRELUDE}
    declarations, names = [], []
    for i, unit in enumerate(UNITS):
        modules = [importlib.import_module(f"ktcli.engine.{name}") for name in unit]
        files[f"kernels_{i}.cpp"] = f'#include "{PRELUDE_NAME}"\n' + "".join(m.SOURCE for m in modules)
        for module in modules:
            declarations += [_declaration(module.SOURCE, name) for name in module.FUNCTIONS]
            names += module.FUNCTIONS
    includes = "".join(f"#include <{h}>\n" for h in BINDINGS_HEADERS) + f'#include "{PRELUDE_NAME}"\n'
    defs = "".join(f'    m.def("{n}", torch::wrap_pybind_function({n}), "{n}");\n' for n in names)
    files["bindings.cpp"] = (includes + "\n" + "\n".join(declarations)
                             + f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n")
    return files


def _declaration(source: str, name: str) -> str:
    """The declaration of the function `name` defined at the start of a line in `source`:
    its return type, name and parameters up to the closing parenthesis."""
    hits = list(re.finditer(rf"^[A-Za-z_][\w:<>, ]*[\s*&]{name}\(", source, re.M))
    if len(hits) != 1:
        raise ValueError(f"{name}: {len(hits)} definitions at the start of a line, not 1")
    depth = 0
    for end in range(hits[0].end() - 1, len(source)):
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        if depth == 0:
            return source[hits[0].start():end + 1] + ";"
    raise ValueError(f"{name}: its parameters are not closed")


def _write_if_changed(path: Path, text: str) -> Path:
    """Write `text` to `path` unless it holds it already: ninja rebuilds a unit whose file
    is newer than its object, so an unchanged unit keeps its object."""
    try:
        if path.read_text() == text:
            return path
    except OSError:
        pass
    path.write_text(text)
    return path


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


def _source_stamp(files: dict[str, str]) -> str:
    parts = [f"{name}\n{text}" for name, text in files.items()]
    return hashlib.sha256("\n".join([*parts, *CFLAGS, _torch_version()]).encode()).hexdigest()


def _write_stamp(folder: Path, stamp: str) -> None:
    """The sources' stamp, then the files' (`_files_stamp`, for a plan that imports no torch)."""
    tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
    try:
        tmp.write_text(f"{stamp}\n{_files_stamp(folder)}\n")
        os.replace(tmp, folder / STAMP)  # a reader sees the whole stamp or the one before
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _files_stamp(folder: Path) -> str:
    """What a build came from, told without importing torch (the planner does not): the
    kernel modules' files and this one's, the flags, torch's version and the build folder.
    A copied build folder rebuilds (torch's build file names the old one's paths), and so
    does one of other sources (an upgrade): a first run compiled for 260 s after a plan
    that said 42."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("cpp_ext", *(m for unit in UNITS for m in unit)):
        try:
            h.update((here / f"{name}.py").read_bytes())
        except OSError:
            h.update(name.encode())
    h.update("\n".join([*CFLAGS, _torch_version(), str(folder)]).encode())
    return h.hexdigest()


def _stale(folder: Path) -> bool:
    """Whether the library in `folder` was built from other sources, flags, torch or
    folder than these (or its stamp is missing): the next load compiles."""
    try:
        lines = (folder / STAMP).read_text().split("\n")
    except OSError:
        return True
    return len(lines) < 2 or lines[1] != _files_stamp(folder)


def _built_for(folder: Path, stamp: str):
    """The library in a folder we cannot write, if it was built from these sources; else None."""
    try:
        if (folder / STAMP).read_text().partition("\n")[0] != stamp or not (folder / f"{NAME}.so").exists():
            return None
    except OSError:
        return None
    from torch.utils.cpp_extension import _import_module_from_library

    return _import_module_from_library(NAME, str(folder), True)


def needs_build() -> bool:
    """Whether loading the kernels compiles them first (no library in the build folder
    yet, or one of other sources: `_stale`): ~40 s on 2 cores, which the caller says
    before it starts."""
    import torch

    if _built or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False  # loaded already, or nothing to build here (the torch path)
    folder = _build_dir()
    return _no_library(folder) or _rebuilds(folder)


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
    folder = _build_dir(make=False)
    return avx2 and (_no_library(folder) or _rebuilds(folder))


def _rebuilds(folder: Path) -> bool:
    """A library is there, but the next load compiles it afresh (`_stale`); not where the
    last build failed (its mark: no compiler)."""
    try:
        failed = (folder / FAILED_MARK).exists()
    except OSError:
        return False
    return not failed and _stale(folder)


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
