"""Loading the engine's C++ kernels: a stale lock from a killed build never blocks a run."""

from __future__ import annotations

import fcntl
import importlib
import os
import threading
import time

import pytest
import torch

from ktcli.engine import cpp_ext


def test_a_lock_left_by_a_killed_build_is_cleared_under_ours(tmp_path):
    """torch's lock file (`<build folder>/lock`) has no owner: a run killed during the first
    build left it, and every later run waited on "loading model" for ever. Under our
    flock, which dies with its process, such a file is stale and goes."""
    (tmp_path / "lock").write_text("")
    with cpp_ext._folder_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_the_folder_lock_makes_a_second_loader_wait_for_the_first(tmp_path):
    order = []

    def second():
        with cpp_ext._folder_lock(tmp_path):
            order.append("second")

    with cpp_ext._folder_lock(tmp_path):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.2)
        order.append("first")
    t.join(5)
    assert order == ["first", "second"]
    with open(tmp_path / "ktcli.flock") as handle:  # released: free to take again
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_no_build_is_announced_where_none_can_happen(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty build folder
    monkeypatch.setattr(cpp_ext, "_built", [])
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert not cpp_ext.needs_build()  # a CPU without AVX2 runs the torch path: no compile to wait for
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert cpp_ext.needs_build()


def test_the_plan_knows_a_first_runs_compile_without_importing_torch(monkeypatch, tmp_path):
    """A first run compiled the kernels for 113 s after a plan that said 13 s: `ktcli plan`
    imports no torch, so it asks the folder torch's loader would build in, by torch's
    package version, and the CPU's flags."""
    monkeypatch.setattr(cpp_ext, "_built", [])
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "fresh"))
    avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    assert cpp_ext.compile_pending() == avx2 == cpp_ext.needs_build()
    assert cpp_ext._build_dir(make=False) == cpp_ext._build_dir()  # the loader's folder, by either version
    (cpp_ext._build_dir() / f"{cpp_ext.NAME}.so").write_bytes(b"")
    assert cpp_ext.compile_pending() == avx2  # a library of unknown sources (no stamp): rebuilt
    cpp_ext._write_stamp(cpp_ext._build_dir(), "sources")  # built here, from these files
    assert not cpp_ext.compile_pending() and not cpp_ext.needs_build()
    # A build folder copied to another path (torch's build file names the old paths), or
    # kernel sources changed since (an upgrade): the next load compiles, and the plan says
    # so (a first run compiled for 260 s after a plan of 42).
    (cpp_ext._build_dir() / cpp_ext.STAMP).write_text("sources\nanother build\n")
    assert cpp_ext.compile_pending() == avx2 == cpp_ext.needs_build()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "failed"))
    cpp_ext._mark_failed()  # no compiler here: a build that failed is not planned again and again
    assert not cpp_ext.compile_pending() and not cpp_ext.needs_build()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("KTCLI_NO_CPP_KERNELS", "1")  # the torch path on purpose: nothing compiles
    assert not cpp_ext.compile_pending()
    # and it imports no torch: `ktcli plan` never does (this module's own import of torch hid that)
    import subprocess
    import sys

    probe = ("import sys; from ktcli.engine import cpp_ext; cpp_ext.compile_pending(); "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_compile_no_file_foretold_is_said_once_it_takes_long(monkeypatch):
    """A stale build folder (another path) rebuilt the kernels for ~40 s under a silent
    "loading model"; that one-time work is kept out of the load time plans learn."""
    from ktcli.engine import loading

    said = []
    monkeypatch.setattr(loading, "ANNOUNCE_AFTER_S", 0.05)
    monkeypatch.setattr(loading, "one_time_s", 0.0)  # restored after the test
    monkeypatch.setattr(cpp_ext, "needs_build", lambda: False)
    monkeypatch.setattr(cpp_ext, "load", lambda *a: time.sleep(0.3))
    loading.one_time_s = 0.0
    loading._build_kernels(said.append)
    assert said == ["compiling the engine's C++ kernels (once: about a minute, more on a busy machine)"] and loading.one_time_s >= 0.3
    said.clear()
    loading.one_time_s = 0.0
    monkeypatch.setattr(cpp_ext, "load", lambda *a: None)  # the library as built: nothing to say or count
    loading._build_kernels(said.append)
    assert said == [] and loading.one_time_s == 0.0


def test_a_slow_ordinary_load_is_neither_announced_as_one_time_work_nor_left_unlearned(monkeypatch, tmp_path):
    """Any load over 3 s said "measuring ... int4 keys" and was kept out of the load times."""
    from types import SimpleNamespace

    from ktcli.config import Settings
    from ktcli.engine import loading, native, threads

    said = []
    monkeypatch.setattr(loading, "ANNOUNCE_AFTER_S", 0.05)
    monkeypatch.setattr(loading, "one_time_s", 0.0)
    monkeypatch.setattr(loading, "resolve_model", lambda *a: SimpleNamespace())
    monkeypatch.setattr(loading, "ensure_hf_dir", lambda *a: tmp_path)
    monkeypatch.setattr(loading, "_build_kernels", lambda on_status: None)
    monkeypatch.setattr(threads, "govern", lambda *a: None)
    slow = SimpleNamespace(engine=None, context_window=8192)
    monkeypatch.setattr(native.NativeBackend, "load", classmethod(lambda cls, *a, **kw: time.sleep(0.3) or slow))
    assert loading.load_backend(Settings(cache_dir=str(tmp_path)), said.append) is slow
    assert said == [] and loading.one_time_s == 0.0


def test_a_build_that_fails_at_once_leaves_the_mark_and_a_success_clears_it(monkeypatch, tmp_path):
    """No compiler: the build fails at once, and plans stop adding its minute; a build that
    works (a compiler installed since) clears the mark."""
    import torch.utils.cpp_extension as extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("KTCLI_NO_CPP_KERNELS", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(cpp_ext, "unavailable", [])

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error checking compiler version for c++")

    monkeypatch.setattr(extension, "load", no_compiler)
    monkeypatch.setattr(cpp_ext, "_built", [])
    assert cpp_ext._build() is None and (cpp_ext._build_dir() / cpp_ext.FAILED_MARK).exists()
    assert not cpp_ext.compile_pending()
    monkeypatch.setattr(extension, "load", lambda *args, **kwargs: "module")
    monkeypatch.setattr(cpp_ext, "_built", [])
    assert cpp_ext._build() == "module" and not (cpp_ext._build_dir() / cpp_ext.FAILED_MARK).exists()


def test_a_build_folder_that_cannot_be_written_still_loads_its_library(monkeypatch, tmp_path):
    """A cache warmed by another user: torch's loader takes a lock file in the folder even
    when nothing is to be built, so the kernels were off (decode ~25% slower). A library the
    stamp says was built from these sources loads without it; another never does."""
    import torch.utils.cpp_extension as extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("KTCLI_NO_CPP_KERNELS", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(extension, "load", lambda *args, **kwargs: "built")
    monkeypatch.setattr(cpp_ext, "_built", [])
    assert cpp_ext._build() == "built"
    folder = cpp_ext._build_dir()
    (folder / f"{cpp_ext.NAME}.so").touch()
    stamp = (folder / cpp_ext.STAMP).read_text().strip()
    loaded = []
    monkeypatch.setattr(extension, "_import_module_from_library", lambda *a: loaded.append(a) or "imported")
    monkeypatch.setattr(extension, "load", lambda *args, **kwargs: (_ for _ in ()).throw(PermissionError("lock")))
    monkeypatch.setattr(cpp_ext.os, "access", lambda path, mode: False)  # (root writes anywhere)
    monkeypatch.setattr(cpp_ext, "_built", [])
    assert cpp_ext._build() == "imported" and loaded[0][:2] == (cpp_ext.NAME, str(folder))
    (folder / cpp_ext.STAMP).write_text("another source\n")  # a library of other sources: not loaded
    monkeypatch.setattr(cpp_ext, "_built", [])
    assert cpp_ext._build() is None and len(loaded) == 1 and stamp


def test_the_bindings_declare_every_kernel_function_as_its_source_defines_it():
    """The library is built from units that compile side by side; the bindings' unit sees
    the kernels only through declarations taken from their sources."""
    files = cpp_ext._library_files()
    bindings = files["bindings.cpp"]
    assert "torch/extension.h" not in "".join(files.values())  # ~27 s of parsing per unit
    for name in [n for unit in cpp_ext.UNITS for m in unit for n in importlib.import_module(f"ktcli.engine.{m}").FUNCTIONS]:
        assert f'm.def("{name}", torch::wrap_pybind_function({name})' in bindings
    source = "static int helper(int a) { return a; }\ntorch::Tensor f(torch::Tensor x,\n    std::vector<int64_t> s) {\n  return x;\n}\n"
    assert cpp_ext._declaration(source, "f") == "torch::Tensor f(torch::Tensor x,\n    std::vector<int64_t> s);"
    with pytest.raises(ValueError, match="0 definitions"):
        cpp_ext._declaration(source, "g")
    with pytest.raises(ValueError, match="2 definitions"):
        cpp_ext._declaration(source + source, "f")


def test_a_unit_whose_text_is_unchanged_is_not_rewritten(tmp_path):
    """ninja rebuilds a unit whose file is newer than its object: a rewrite of the same text
    would recompile it on every load."""
    path = cpp_ext._write_if_changed(tmp_path / "kernels_0.cpp", "int a;\n")
    os.utime(path, (1, 1))
    cpp_ext._write_if_changed(path, "int a;\n")
    assert path.stat().st_mtime == 1
    cpp_ext._write_if_changed(path, "int b;\n")
    assert path.read_text() == "int b;\n" and path.stat().st_mtime > 1
