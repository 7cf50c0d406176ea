"""engine.cpu_gemm: oneDNN's fp32 product where the probe passes, F.linear's results to
fp32 rounding either way, with and without bias and residual add, on strided inputs."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ktcli.engine import cpu_gemm


@pytest.mark.parametrize("rows", [1, 33, 300])
def test_linear_and_linear_add_match_torch(rows):
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


def test_oneDNN_is_used_where_torch_has_it_and_can_be_switched_off():
    assert cpu_gemm.available() == (torch.backends.mkldnn.is_available()
                                    and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    code = "from ktcli.engine import cpu_gemm; print(cpu_gemm.available())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KTCLI_NO_ONEDNN": "1"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-1000:]
