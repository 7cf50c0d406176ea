"""Decode over the long-context cache's fp32/fp16/bf16 pages by the paged decode kernel,
against the gather-and-widen path (`context_kv` + `decode_grouped`) it replaced."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.reference import context_kv
from ktcli.engine import cpu_attention
from ktcli.engine.attention import decode_grouped
from ktcli.engine.longctx import float_pages_decode

pytestmark = pytest.mark.skipif(not cpu_attention.available(), reason="C++ kernels unavailable")


@pytest.mark.parametrize("kind", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("ctx", [1, 63, 64, 65, 700, 2048 + 17])
def test_matches_the_widened_context(kind, ctx):
    torch.manual_seed(ctx)
    n_kv, group, d = 3, 3, 64
    spec = kernels.KVCacheSpec(n_kv, d, 64, kind)
    n_pages = -(-ctx // 64)
    layer = kernels.allocate(spec, n_pages + 5, "cpu", n_stage=2)
    layer.k_pages.fill_(float("nan"))  # a row the kernel reads past the context poisons the output
    layer.v_pages.fill_(float("nan"))
    table = torch.randperm(n_pages + 5)[:n_pages].to(torch.int32)  # shuffled physical pages
    k, v = torch.randn(ctx, n_kv, d) + 0.5, torch.randn(ctx, n_kv, d)
    slots = table.long()[torch.arange(ctx) // 64] * 64 + torch.arange(ctx) % 64
    for start in range(0, ctx, 100):
        kernels.kv_store(layer, k[start : start + 100], v[start : start + 100], slots[start : start + 100])
    q = torch.randn(1, n_kv * group, d) * 2
    want = decode_grouped(q, *context_kv(layer, table, ctx), d**-0.5)
    got = float_pages_decode(q, layer, table, ctx, d**-0.5)
    assert got.shape == want.shape == (1, n_kv * group, d)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)


def test_engine_decode_under_rope_scaling_gives_the_gather_paths_tokens(smollm2_dir):
    """A full read under --rope-scaling runs dense attention over the kernels' fp16 pages:
    each decode step gathered and widened the whole context (1.4 tok/s at 12K tokens)."""
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.native import NativeBackend

    backend = NativeBackend.load(smollm2_dir, weights="fp32", rope_scaling="yarn:2", threads=2)
    assert backend.kv._paged_decode
    prompt = backend.chat_ids([{"role": "user", "content": "Name three colours of the rainbow and say why it forms."}])
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    ours = backend.generate_ids([prompt], params)
    backend.kv._paged_decode = False
    assert backend.generate_ids([prompt], params) == ours
