"""The query weights that int4 pages share their key bits by (engine.key_calibration)."""

from __future__ import annotations

import torch

import kernels
from ktcli.engine import key_calibration
from ktcli.engine.native import NativeBackend


def test_query_square_sums_add_up_each_kv_heads_group():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(7, 6, 8, generator=g)  # 6 query heads over 2 kv heads
    got = key_calibration.query_square_sums(q, 2)
    want = torch.stack([sum(q[t, h * 3 + j].square() for t in range(7) for j in range(3)) for h in range(2)])
    torch.testing.assert_close(got, want)


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


def test_the_weights_do_not_depend_on_the_loads_attention_policy(smollm2_dir):
    weights = []
    for attention in ("dense", "topk"):
        key_calibration._memo.clear()
        b = NativeBackend.load(smollm2_dir, weights="fp32", kv_dtype="int4", attention=attention, threads=2,
                               kv_budget_bytes=256 << 20)
        weights.append(torch.stack([layer.k_weight for layer in b.kv.layers]))
        assert b.kv.policy.kind == attention and b.kv.options.position_remap == (attention == "topk")
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-5, atol=1e-6)


def test_a_model_with_a_short_window_calibrates_within_its_pages(smollm2_dir, tmp_path):
    """The 1,024-token measurement filled the pages of a 512-token window: every
    --kv-dtype int4 run of such a model failed "KV cache full" at load."""
    import shutil

    from ktcli.engine.backend import SamplingParams
    from tests.engine.conftest import build_tiny

    key_calibration._memo.clear()
    folder = build_tiny("llama", tmp_path / "short", vocab_size=49152, max_position_embeddings=512)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, folder / name)
    b = NativeBackend.load(folder, weights="fp32", kv_dtype="int4", context_window=512, kv_windows=1)
    assert torch.stack([layer.k_weight for layer in b.kv.layers]).mean(-1).allclose(torch.ones(2, 2))
    assert "".join(b.stream_chat([{"role": "user", "content": "hello"}], SamplingParams(max_new_tokens=4)))
    key_calibration._memo.clear()


def test_a_kept_file_changed_in_place_is_measured_afresh(tmp_path):
    """Bytes flipped inside the tensor's record loaded as other finite weights (torch.load
    checks no checksum), and int4 pages shared their key bits by them: the CRC32 kept beside
    them is checked on reading."""
    w = torch.rand(30, 3, 64) + 0.5
    path = tmp_path / "m-key.keyweights.pt"
    key_calibration._write(path, w)
    assert torch.equal(key_calibration._read(path, (30, 3, 64)), w)
    assert key_calibration._read(path, (30, 3, 32)) is None  # another model's shape
    raw = path.read_bytes()
    at = raw.index(w.numpy().tobytes()[:64]) + 1000  # inside the tensor's bytes
    damaged = bytearray(raw)
    damaged[at:at + 4] = bytes(b ^ 0x40 for b in damaged[at:at + 4])
    path.write_bytes(bytes(damaged))
    assert key_calibration._read(path, (30, 3, 64)) is None and key_calibration._read(path) is None
    for other in (raw[: len(raw) // 2], b"", b"not a tensor"):
        path.write_bytes(other)
        assert key_calibration._read(path) is None
    torch.save(w, path)  # an older FORMAT's bare tensor, with no CRC
    assert key_calibration._read(path) is None


def test_is_kept_says_no_for_a_damaged_file(tmp_path, monkeypatch):
    key_calibration._memo.clear()
    path = tmp_path / "m-key.keyweights.pt"
    monkeypatch.setattr(key_calibration, "_kept_at", lambda model_dir, root: ("m-key", path))
    key_calibration._write(path, torch.ones(2, 2, 4))
    assert key_calibration.is_kept(tmp_path, tmp_path)
    path.write_bytes(path.read_bytes()[:-40])
    assert not key_calibration.is_kept(tmp_path, tmp_path)
