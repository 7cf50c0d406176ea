"""8-bit weights (`engine.int8_gemv`): the packed format's error bounds, exactness on
GGUF-style 4-bit blocks, the C++ product and unpack against torch over the unpacked
weights, and the engine with int8 weights against fp32."""

import dataclasses

import pytest
import torch

from ktcli.engine import int8_gemv
from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend
from ktcli.errors import UsageError


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] = 0.0  # an all-zero block
    w[1, 32:64] = 0.7  # a constant block
    return w


def test_pack_layout_and_error_bound():
    n, k = 7, 96
    w = _weights(n, k)
    p = int8_gemv.pack_reference(w)
    assert p.dtype == torch.uint8 and p.shape == (n, k + k // 8) and int8_gemv.logical_width(p) == k
    back = int8_gemv.unpack_reference(p)
    assert torch.equal(back[0, :32], w[0, :32]) and torch.allclose(back[1, 32:64], w[1, 32:64], rtol=1e-3)
    # every value within half a code step of its block, plus the fp16 rounding of the block's
    # minimum (2^-11 of it) and of its scale (255 codes x 2^-11 of a step)
    blocks = w.view(n, k // 32, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 255
    err = (back - w).abs().view(n, k // 32, 32).amax(-1)
    assert bool((err <= (0.5 + 255 * 2**-11) * step + blocks.amin(-1).abs() * 2**-11 + 1e-7).all())


def test_gguf_4bit_blocks_survive_exactly():
    """Q4_1-style blocks (fp16 scale d and minimum m, w = m + d * q, q in 0..15) land on the
    code grid (code = 17 q): only the fp16 rounding of d / 17 is left, at most 255 codes x
    half an fp16 step of d / 17, under 1% of d (bf16 rounds such weights by up to about 3%
    of d)."""
    g = torch.Generator().manual_seed(1)
    n, k = 5, 64
    d = (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(n, k // 32, 1, generator=g) * 0.1).half().float()
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # each block spans the whole 4-bit range
    w = (m + d * q).view(n, k)
    back = int8_gemv.unpack_reference(int8_gemv.pack_reference(w))
    assert ((back - w).abs().view(n, k // 32, 32) <= 0.01 * d).all()


def test_pack_rejects_partial_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        int8_gemv.pack(torch.randn(4, 40))


needs_kernel = pytest.mark.skipif(not int8_gemv.available(), reason="no C++ compiler / AVX2 here")


@needs_kernel
@pytest.mark.parametrize("k", [32, 96, 544, 576, 1536])  # 1, 3, 17, 18, 48 blocks: with and without a tail of 16
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 32])  # 13, 32: several passes of 8
def test_gemv_matches_torch_on_unpacked(k, rows):
    n = 131  # not a multiple of the kernel's row grain
    p = int8_gemv.pack(_weights(n, k, seed=k))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    want = x @ int8_gemv.unpack_reference(p).T
    got = int8_gemv.gemv(x, p)
    assert got.shape == (rows, n)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


@needs_kernel
def test_pack_kernel_equals_reference():
    w = _weights(67, 160)
    w[2, :32] = torch.linspace(-1, 1, 32)  # codes at both ends and ties at the half-code
    assert torch.equal(int8_gemv.pack(w), int8_gemv.pack_reference(w))


@needs_kernel
def test_unpack_kernel_equals_reference():
    p = int8_gemv.pack(_weights(67, 160))
    torch.testing.assert_close(int8_gemv.unpack(p), int8_gemv.unpack_reference(p), rtol=1e-6, atol=1e-7)
    rows = p.index_select(0, torch.tensor([5, 0, 66]))  # a gather, as the embedding lookup does
    torch.testing.assert_close(int8_gemv.unpack(rows), int8_gemv.unpack_reference(p)[[5, 0, 66]], rtol=1e-6, atol=1e-7)


@needs_kernel
def test_unpack_to_bf16_rounds_as_torch_does():
    """The bf16 unpack (wide steps on AMX CPUs) is the fp32 unpack rounded to nearest even,
    bit for bit, ties included."""
    w = _weights(67, 160)
    p = int8_gemv.pack(w)
    want = int8_gemv.unpack_reference(p).to(torch.bfloat16)
    got = int8_gemv.unpack(p, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16))
    # exact ties between two bf16 values (1 + 2^-8 + k 2^-7) must go to the even neighbour
    tie = (1 + 2.0**-8 + torch.arange(32) * 2.0**-7).repeat(3, 1)  # [3, 32]
    pt = int8_gemv.pack_reference(tie)
    fp32 = int8_gemv.unpack_reference(pt)
    assert torch.equal(int8_gemv.unpack(pt, torch.bfloat16).view(torch.int16), fp32.to(torch.bfloat16).view(torch.int16))
    with pytest.raises(ValueError, match="fp32 or bf16"):
        int8_gemv.unpack(p, torch.float16)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: qkv bias after the 8-bit product, tied head
def test_int8_weights_stay_close_to_fp32(tiny_models, kind):
    """Random Gaussian weights are the hard case (no 4-bit grid to land on): measured 2-4%
    RMS logit error here, about three times bf16's."""
    folder = tiny_models[kind]
    ids = list(range(3, 60))
    a = NativeBackend.load(folder, weights="fp32", prefill_chunk=16).prompt_logits(ids)
    b = NativeBackend.load(folder, weights="int8", prefill_chunk=16).prompt_logits(ids)
    assert (a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt() < 0.06
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.85


@needs_kernel
def test_smollm2_int8_keeps_greedy_tokens(smollm2, smollm2_dir, monkeypatch):
    """The bundled model's Q4_1 blocks land on the 8-bit grid: its greedy answer stays.
    (The prompt is a wide step: fp32 prefill pinned, so this tests the weights alone;
    bf16 prefill has its own tests in test_prefill_bf16.)"""
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "fp32")
    ids = smollm2.chat_ids([{"role": "user", "content": "Write a haiku about autumn leaves."}])
    int8 = NativeBackend.load(smollm2_dir, weights="int8", kv_budget_bytes=64 << 20)
    params = SamplingParams(max_new_tokens=24)
    want = smollm2.generate_ids([ids], params)[0]
    got = int8.generate_ids([ids], params)[0]
    assert sum(x == y for x, y in zip(want, got)) >= 0.9 * len(want)
    a, b = smollm2.prompt_logits(ids), int8.prompt_logits(ids)
    assert (a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt() < 0.01


def test_int8_weights_refuse_a_gpu_and_partial_blocks(tiny_models):
    from ktcli.engine.config import load_config
    from ktcli.engine.weights import load_weights

    folder = tiny_models["llama"]
    with pytest.raises(UsageError, match="CPU only"):
        load_weights(folder, load_config(folder), "int8", device="meta")
    narrow = dataclasses.replace(load_config(folder), intermediate_size=100)
    with pytest.raises(UsageError, match="multiples of 32 .this model has 100"):
        load_weights(folder, narrow, "int8")


@needs_kernel
def test_avx2_bodies_match_torch_where_avx512_would_run():
    """The kernels pick 16-lane bodies at run time on AVX-512 CPUs; KTCLI_NO_AVX512 keeps
    the AVX2 ones (read once per process, so they run in a child) and they must agree too."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from ktcli.engine import int8_gemv, bf16_gemv\n"
        "g = torch.Generator().manual_seed(3)\n"
        "w = torch.randn(131, 576, generator=g) * 0.05\n"
        "for rows in (1, 5, 13):\n"
        "    x = torch.randn(rows, 576, generator=g)\n"
        "    p = int8_gemv.pack(w)\n"
        "    want = x @ int8_gemv.unpack_reference(p).T\n"
        "    assert ((int8_gemv.gemv(x, p) - want).abs().max() / want.abs().max()).item() < 1e-5\n"
        "    wb = w.bfloat16()\n"
        "    want = x @ wb.float().T\n"
        "    assert ((bf16_gemv.gemv(x, wb) - want).abs().max() / want.abs().max()).item() < 1e-5\n"
        "    want = x @ w.T\n"
        "    assert ((bf16_gemv.gemv(x, w) - want).abs().max() / want.abs().max()).item() < 1e-5\n"
        "print('ok')\n"
    )
    env = {**os.environ, "KTCLI_NO_AVX512": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
