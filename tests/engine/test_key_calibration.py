"""The query weights that int4 pages share their key bits by (engine.key_calibration)."""

from __future__ import annotations

import math

import torch

import kernels
from ktcli.engine import key_calibration
from ktcli.engine.native import NativeBackend


def test_pair_mean_square_is_the_same_before_and_after_rope():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(7, 6, 8, generator=g)  # 6 query heads over 2 kv heads, 4 RoPE pairs
    angle = torch.rand(7, 1, 4, generator=g) * 2 * math.pi  # any rotation per token and pair
    x, y = q[..., 0::2], q[..., 1::2]
    rotated = torch.stack((x * angle.cos() - y * angle.sin(), x * angle.sin() + y * angle.cos()), -1).flatten(-2)
    a, b = key_calibration.pair_mean_square(q, 2), key_calibration.pair_mean_square(rotated, 2)
    torch.testing.assert_close(a, b)
    want = q.square().view(7, 2, 3, 4, 2).sum((0, 2)).mean(-1)  # [2 kv heads, 4 pairs]
    torch.testing.assert_close(a[:, 0::2], want)
    assert torch.equal(a[:, 0::2], a[:, 1::2])


def test_int4_loads_calibrate_once_and_keep_the_weights(smollm2_dir, tmp_path, monkeypatch):
    key_calibration._memo.clear()
    measured = []
    real = key_calibration.measure
    monkeypatch.setattr(key_calibration, "measure", lambda b: measured.append(1) or real(b))
    b = NativeBackend.load(smollm2_dir, weights="int8", kv_dtype="int4", threads=2, pack_cache=tmp_path)
    w = torch.stack([layer.k_weight for layer in b.kv.layers])  # [L, H, D]
    assert measured == [1] and w.shape == (30, 3, 64)
    torch.testing.assert_close(w.mean(-1), torch.ones(30, 3))  # normalised per layer and head
    assert w.max() > 5 * w.min()  # the queries favour some channels: widths will differ
    assert len(list(tmp_path.glob("*.keyweights.pt"))) == 1

    # A fresh process (no memo) reads the cached file instead of measuring again.
    key_calibration._memo.clear()
    b2 = NativeBackend.load(smollm2_dir, weights="int8", kv_dtype="int4", threads=2, pack_cache=tmp_path)
    assert measured == [1]
    assert torch.equal(torch.stack([layer.k_weight for layer in b2.kv.layers]), w)

    # The pages a prompt seals share their key bits by these weights.
    b2.prompt_logits(list(range(1000, 1200)))  # three sealed pages per layer
    layer = b2.kv.layers[10]
    widths = kernels.reference.unpack_int4(layer.k_bits).long()  # [NB, H, D]
    sealed = (widths != 4).any(-1).any(-1).nonzero().flatten()  # never-sealed pages hold 4 everywhere
    assert sealed.numel() == 3
    span = layer.k_max[sealed] - layer.k_min[sealed]
    assert torch.equal(widths[sealed], kernels.reference.key_widths(span, layer.k_weight))
    assert not torch.equal(widths[sealed], kernels.reference.key_widths(span))
    assert widths[sealed].min() <= 2 and widths[sealed].max() >= 7

    # A damaged file is measured afresh.
    key_calibration._memo.clear()
    next(tmp_path.glob("*.keyweights.pt")).write_bytes(b"not a tensor")
    b3 = NativeBackend.load(smollm2_dir, weights="int8", kv_dtype="int4", threads=2, pack_cache=tmp_path)
    assert measured == [1, 1]
    torch.testing.assert_close(torch.stack([layer.k_weight for layer in b3.kv.layers]), w, rtol=1e-3, atol=1e-4)


def test_a_model_without_tokenizer_keeps_even_weights(tiny_models):
    b = NativeBackend.load(tiny_models["llama"], kv_dtype="int4", kv_budget_bytes=2 << 20, block_size=16)
    assert all(torch.equal(layer.k_weight, torch.ones_like(layer.k_weight)) for layer in b.kv.layers)
