"""Build (once) and load the engine's small AVX2 C++ kernels with torch's extension loader.

Each kernel module hands its source here; the compiled library is cached in
TORCH_EXTENSIONS_DIR, so only the first start after a change of source compiles (a few
tens of seconds). Where that cannot work (no compiler or headers, a CPU without AVX2,
or KTCLI_NO_CPP_KERNELS / the kernel's own switch set) `load` returns None and the
caller keeps its torch path.
"""

from __future__ import annotations

import os
import threading

import torch

_lock = threading.Lock()
_modules: dict[str, object] = {}

CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]


def load(name: str, source: str, functions: list[str], disable_env: str | None = None):
    """The compiled module `name` exposing `functions`, or None where it cannot be built."""
    if name in _modules:  # every call after the first: no lock
        return _modules[name]
    with _lock:
        if name in _modules:
            return _modules[name]
        module = None
        disabled = os.environ.get("KTCLI_NO_CPP_KERNELS") or (disable_env and os.environ.get(disable_env))
        if not disabled and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
            try:
                from torch.utils.cpp_extension import load_inline

                module = load_inline(
                    name, cpp_sources=source, functions=functions,
                    extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], verbose=False,
                )
            except Exception:  # no compiler or headers: the caller's torch path
                module = None
        _modules[name] = module
        return module
