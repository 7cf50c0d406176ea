"""Kernel tests run on the CPU: Triton kernels go through its interpreter, which must be
switched on before triton is first imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

try:  # noqa: E402
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover
    HAVE_TRITON = False


def pytest_collection_modifyitems(config, items):
    if HAVE_TRITON:
        return
    skip = pytest.mark.skip(reason="triton is not installed")
    for item in items:
        if "triton" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "triton: needs triton (run under TRITON_INTERPRET=1 on CPU)")
