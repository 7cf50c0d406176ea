"""engine.cpu_mlp: SwiGLU's silu(gate) * up in one C++ pass equals the torch path (the
oracle) for fp32 and bf16 products, in both output dtypes, at widths with and without a
tail of fewer than 8 values; bf16 results are torch's round-to-nearest-even of the fp32
value, except where the two fp32 values straddle a rounding boundary (one bf16 step)."""

import pytest
import torch

from ktcli.engine import cpu_mlp

pytestmark = pytest.mark.skipif(not cpu_mlp.available(), reason="C++ kernels not built here")


@pytest.mark.parametrize("rows,inter", [(1, 8), (7, 13), (33, 100), (300, 1536)])
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_silu_mul_equals_torch(rows, inter, src, out):
    g = torch.Generator().manual_seed(rows * inter)
    gu = (torch.randn(rows, 2 * inter, generator=g) * 4).to(src)  # gates well into both tails of silu
    gu[0, :2] = torch.tensor([-100.0, 100.0])  # e^-|g| past fp32's range: silu(-100) ~ -4e-42, silu(100) = 100
    want = cpu_mlp.silu_mul_reference(gu)
    got = cpu_mlp.silu_mul(gu, out)
    assert got.dtype == out and got.shape == (rows, inter)
    # silu(-100): ours clamps e^-|g| at e^-87, so it gives ~-2e-36 for torch's -4e-42: both nothing
    assert got[0, 0].abs().item() < 1e-30
    got, want = got.flatten()[1:], want.flatten()[1:]
    if out == torch.float32:
        assert ((got - want).abs() <= 1e-6 * want.abs() + 1e-30).all()
    else:
        exact = want.to(torch.bfloat16)
        off = got != exact
        assert off.float().mean().item() < 1e-3
        # where they differ, by one bf16 step of the value (2^-7 relative at most)
        assert ((got.float() - exact.float()).abs()[off] <= exact.float().abs()[off] * 2**-7).all()


def test_noncontiguous_input_is_read_as_its_values():
    gu = torch.randn(64, 40).t()  # [40, 64], strided
    assert not gu.is_contiguous()
    assert torch.allclose(cpu_mlp.silu_mul(gu, torch.float32), cpu_mlp.silu_mul_reference(gu), rtol=1e-6, atol=1e-7)
