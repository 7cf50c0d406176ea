"""The bf16 (and fp32) matrix-vector kernel (`engine.bf16_gemv`) against torch on the widened weights:
row counts within one pass (up to 8) and across several, widths with a tail past the
16-value vector loop."""

import pytest
import torch

from ktcli.engine import bf16_gemv

pytestmark = pytest.mark.skipif(not bf16_gemv.available(), reason="no C++ compiler / AVX2 here")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [40, 576])  # 40: a tail of 8 after the vector loop
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 32])  # 13, 32: several passes of 8
def test_gemv_matches_torch_on_widened_weights(k, rows, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + k)
    w = torch.randn(77, k, generator=g).to(dtype)
    x = torch.randn(rows, k, generator=g)
    want = x @ w.float().T
    got = bf16_gemv.gemv(x, w)
    assert got.shape == (rows, 77)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
