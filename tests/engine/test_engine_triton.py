"""The engine through the Triton kernels, on the CPU: under TRITON_INTERPRET=1 with the
kernels backend forced to "triton", a tiny random Llama prefills and decodes through the
very kernels a CUDA device runs (kv_store, paged / sparse decode, page scores, chunked
prefill) inside the engine's step loop; tokens and logits must equal the reference path's
on the same loaded engine."""

from __future__ import annotations

import os

# Before any kernel module is imported: triton picks the interpreter at decoration.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels import AttentionPolicy  # noqa: E402
from ktcli.engine.backend import SamplingParams  # noqa: E402
from ktcli.engine.native import NativeBackend  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not kernels.HAS_TRITON, reason="triton is not installed"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 (CPU tensors)"),
]

BS = 16  # the smallest page the kernels take (tl.dot tiles)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(11)
    # 45 tokens: two prefill chunks of 32, a partial last page (staged for quantized kinds).
    return [torch.randint(0, 256, (45,), generator=g).tolist(), torch.randint(0, 256, (21,), generator=g).tolist()]


@pytest.fixture
def count_triton(monkeypatch):
    """Calls of each Triton launcher the engine made (proof the kernels ran)."""
    import kernels.kv_store_triton as ks
    import kernels.paged_attention as pa
    import kernels.prefill_attention as pf
    import kernels.sparse_attention as sa

    calls: dict[str, int] = {}

    def counted(module, name):
        fn = getattr(module, name)

        def wrapper(*a, **kw):
            calls[name] = calls.get(name, 0) + 1
            return fn(*a, **kw)

        monkeypatch.setattr(module, name, wrapper)

    for module, name in ((ks, "kv_store_planned_triton"), (pa, "paged_attention_decode_triton"),
                         (pf, "paged_prefill_attention_triton"), (sa, "score_pages_triton"),
                         (sa, "select_pages_triton"), (sa, "sparse_attention_decode_triton")):
        counted(module, name)
    yield calls
    kernels.set_backend("auto")


CASES = [
    ("int8", AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=1)),
    ("int4", AttentionPolicy()),
    ("fp32", AttentionPolicy("window", n_sink_pages=1, n_local_pages=1)),
]


@pytest.mark.parametrize("kv_dtype,policy", CASES, ids=[f"{k}-{p.kind}" for k, p in CASES])
def test_engine_through_triton_equals_reference(tiny_models, prompts, count_triton, kv_dtype, policy, monkeypatch):
    # fp32 wide steps: on a CPU with AMX the reference path's dense prefill attention would
    # otherwise run in bf16 (engine.device.resolve_prefill_dtype), the Triton kernel in fp32.
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "fp32")
    b = NativeBackend.load(tiny_models["llama"], block_size=BS, kv_budget_bytes=2 << 20, prefill_chunk=32,
                           kv_dtype=kv_dtype, attention=policy, position_remap=False)
    params = SamplingParams(max_new_tokens=4)

    def run():
        return b.prompt_logits(prompts[0]), b.generate_ids(prompts, params)

    # The Triton run attends over the same stored rows as the reference run: each layer
    # gets the q, k, v the reference run computed there. Otherwise the ~1e-6 between the
    # paths' attention sums reaches the next layer's K/V, and where a value row sits at a
    # rounding tie of its quantisation grid one path's code lands a step from the other's:
    # for int4 (per-channel key widths) at 45 tokens that moved 1/3 of the logits by up to
    # 0.05, a divergence of two correct computations that says nothing about the kernels.
    inputs, real_attend = [], b.kv.attend_layer

    def record(li, q, k, v, step):
        inputs.append((q.clone(), k.clone(), v.clone()))
        return real_attend(li, q, k, v, step)

    def replay(li, q, k, v, step):
        rq, rk, rv = inputs.pop(0)
        assert rq.shape == q.shape and (rq - q).abs().max() < 1e-3  # the same computation
        return real_attend(li, rq, rk, rv, step)

    kernels.set_backend("reference")
    monkeypatch.setattr(b.kv, "attend_layer", record)
    want_logits, want_ids = run()
    assert not count_triton
    kernels.set_backend("triton")
    monkeypatch.setattr(b.kv, "attend_layer", replay)
    got_logits, got_ids = run()
    assert not inputs

    assert count_triton.get("kv_store_planned_triton") and count_triton.get("paged_prefill_attention_triton")
    decode = "paged_attention_decode_triton" if policy.kind == "dense" else "sparse_attention_decode_triton"
    assert count_triton.get(decode), count_triton
    if policy.kind != "dense":
        assert count_triton.get("select_pages_triton"), count_triton
    if policy.kind == "topk":
        assert count_triton.get("score_pages_triton")
    # Both paths compute in fp32 over the same pages: a wrong kernel moves logits by far more.
    torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=1e-4)
    assert got_ids == want_ids


@pytest.mark.slow  # ~15-30 s here: builds a model with transformers, runs the interpreter twice
def test_gpu_benchmark_smoke_compares_with_the_reference():
    """benchmarks/engine_gpu.py (kernels/bench.py's end-to-end part) on its CPU plumbing
    path: interpreted Triton runs against the torch reference, one JSON row per config."""
    from benchmarks import engine_gpu

    try:
        result = engine_gpu.run(engine_gpu._parse(["--smoke", "--kinds", "int4", "--policies", "dense"]))
    finally:
        kernels.set_backend("auto")
    assert "error" not in result, result
    assert [(r["kind"], r["policy"]) for r in result["rows"]] == [("int4", "dense")]
    for r in result["rows"]:
        assert "error" not in r and len(r["tokens"]) == result["new_tokens"]
        assert r["match_same"] == 1.0 and r["prefix_same"] == result["new_tokens"]
        assert r["match_fp32"] is not None
