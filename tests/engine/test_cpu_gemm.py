"""engine.cpu_gemm: oneDNN's fp32 product where the probe passes (whatever the CPU's
vendor: the engine's choice is forced on here), F.linear's results to fp32 rounding either
way, with and without bias and residual add, on strided inputs."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ktcli.engine import cpu_gemm


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("rows", [1, 33, 300])
def test_linear_and_linear_add_match_torch(rows, onednn, monkeypatch):
    monkeypatch.setattr(cpu_gemm, "available", lambda: onednn and cpu_gemm.usable())
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(200, 576, generator=g), torch.randn(200, generator=g)
    x = torch.randn(rows, 1000, generator=g)[:, 100:676]  # a strided view, as a qkv slice is
    r = torch.randn(rows, 200, generator=g)
    want = F.linear(x, w, b)
    got = cpu_gemm.linear(x, w, b)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    want, before = r + F.linear(x, w), r.clone()
    got = cpu_gemm.linear_add(r, x, w)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    assert torch.equal(r, before)  # a new tensor: the residual input is not written


def _available_with(**env) -> str:
    code = "from ktcli.engine import cpu_gemm; print(cpu_gemm.available())"
    clean = {k: v for k, v in os.environ.items() if k not in ("KTCLI_ONEDNN", "KTCLI_NO_ONEDNN")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    return out.stdout.strip()


def test_oneDNN_is_used_off_Intel_where_torch_has_it_and_can_be_forced_or_switched_off():
    usable = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    assert cpu_gemm.usable() == usable
    # MKL's own fast paths on Intel match or beat it (benchmarks.cpu_gemm): the default there is MKL.
    assert _available_with() == str(usable and cpu_gemm.cpu_vendor() != "GenuineIntel")
    assert _available_with(KTCLI_ONEDNN="1") == str(usable)
    assert _available_with(KTCLI_NO_ONEDNN="1") == "False"
    assert _available_with(KTCLI_ONEDNN="1", KTCLI_NO_ONEDNN="1") == "False"


def test_cpu_vendor_is_read_from_cpuinfo():
    assert isinstance(cpu_gemm.cpu_vendor(), str)
    if os.path.exists("/proc/cpuinfo"):
        assert cpu_gemm.cpu_vendor()  # GenuineIntel, AuthenticAMD, ...
