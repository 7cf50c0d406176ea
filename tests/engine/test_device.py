"""The --device option: resolution, the defaults that follow from it, and the runner's
one-copy move of a step's tensors (exercised on the CPU; the CUDA run is kernels/bench.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ktcli.config import load_settings
from ktcli.engine import int8_gemv
from ktcli.engine.backend import SamplingParams
from ktcli.engine.config import load_config
from ktcli.engine import device as device_mod
from ktcli.engine.device import device_kind, resolve_device, resolve_kv_dtype, resolve_prefill_dtype, resolve_weights
from ktcli.engine.native import NativeBackend
from ktcli.engine.sequence import Sequence
from ktcli.errors import UsageError
from tests.test_config import use_config

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_resolution_and_defaults(tiny_models):
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UsageError):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA"):
            resolve_device("cuda")
        # named where it was set: KTCLI_DEVICE=cuda was said as "--device cuda"
        with pytest.raises(UsageError, match=r"^KTCLI_DEVICE = cuda: .*\(set it to cpu\)"):
            device_kind("cuda", "KTCLI_DEVICE")
        assert device_kind("auto") == "cpu"
    assert device_kind("cpu") == "cpu"
    # CPU: int8 weights where the kernels run and the widths pack into 32-value blocks, else
    # fp32 (no model config: no width to check); fp16 pages, fp32 under fp32 weights. CUDA
    # runs bf16 with pages of the weights' dtype.
    cfg = load_config(tiny_models["llama"])
    assert resolve_weights("auto", CPU, cfg) == ("int8" if int8_gemv.available() else "fp32")
    assert resolve_weights("auto", CPU, dataclasses.replace(cfg, intermediate_size=100)) == "fp32"
    assert resolve_weights("auto", CPU) == "fp32" and resolve_weights("auto", CUDA, cfg) == "bf16"
    assert resolve_weights("fp16", CUDA) == "fp16"
    with pytest.raises(UsageError):  # a flag value this device cannot take: exit code 2
        resolve_weights("int8", CUDA)
    assert resolve_kv_dtype("auto", "bf16", CPU) == "fp16"
    assert resolve_kv_dtype("auto", "int8", CPU) == "fp16"
    assert resolve_kv_dtype("auto", "fp32", CPU) == "fp32"
    assert resolve_kv_dtype("bf16", "int8", CPU) == "bf16"
    assert resolve_kv_dtype("auto", "bf16", CUDA) == "bf16"
    assert resolve_kv_dtype("model", "fp16", CUDA) == "fp16"
    assert resolve_kv_dtype("int4", "bf16", CUDA) == "int4"


def test_prefill_dtype_follows_amx_and_the_weights(monkeypatch):
    """bf16 wide steps only under bf16/int8 weights, by default only where AMX makes them
    fast; fp32 weights always prefill in fp32 (the configuration exact against transformers)."""
    monkeypatch.delenv("KTCLI_PREFILL_DTYPE", raising=False)
    for amx in (True, False):
        monkeypatch.setattr(device_mod, "native_bf16_matmul", lambda amx=amx: amx)
        assert resolve_prefill_dtype("int8", "cpu") == ("bf16" if amx else "fp32")
        assert resolve_prefill_dtype("bf16", "cpu") == ("bf16" if amx else "fp32")
        assert resolve_prefill_dtype("fp32", "cpu") == "fp32"
        assert resolve_prefill_dtype("bf16", "cuda") == "bf16"
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "bf16")  # forced, without AMX
    assert resolve_prefill_dtype("int8", "cpu") == "bf16" and resolve_prefill_dtype("fp32", "cpu") == "fp32"
    monkeypatch.setattr(device_mod, "native_bf16_matmul", lambda: True)
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "fp32")
    assert resolve_prefill_dtype("int8", "cpu") == "fp32"
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "fp8")
    with pytest.raises(UsageError, match="KTCLI_PREFILL_DTYPE"):
        resolve_prefill_dtype("int8", "cpu")


def test_setting_from_flag_and_environment(monkeypatch, tmp_path):
    use_config(tmp_path, monkeypatch, "")
    assert load_settings().device == "auto" and load_settings().weights == "auto"
    monkeypatch.setenv("KTCLI_DEVICE", "cpu")
    assert load_settings().device == "cpu"
    assert load_settings({"device": "cuda"}).device == "cuda"


def test_half_pages_on_the_sdpa_path(tiny_models):
    """bf16 pages under fp32 weights (the CUDA dense layout, here on the CPU): K/V rows are
    cast into the pages and attention output back to fp32 for the next GEMM."""
    ids = list(range(1, 40))
    p = SamplingParams(max_new_tokens=6)
    fp32 = NativeBackend.load(tiny_models["llama"], device="cpu", weights="fp32", kv_budget_bytes=4 << 20).generate_ids([ids], p)
    b = NativeBackend.load(tiny_models["llama"], device="cpu", weights="fp32", kv_dtype="bf16", kv_budget_bytes=4 << 20)
    assert b.kv.dtype == torch.bfloat16 and b.device == CPU
    assert b.generate_ids([ids], p) == fp32
    assert "peak_rss_mb" in b.last_stats.extra and "peak_gpu_mb" not in b.last_stats.extra


def test_step_tensors_move_in_one_packed_copy(tiny_models):
    b = NativeBackend.load(tiny_models["llama"], device="cpu", weights="fp32", kv_budget_bytes=4 << 20, block_size=16)
    eng = b.engine
    # Two sequences, the second on pages that are not consecutive (a gathered slot index).
    s1 = Sequence(900, list(range(1, 20)), 19, 1)
    s2 = Sequence(901, list(range(3, 40)), 37, 1)
    eng.blocks.grow(s1.block_table, 19)
    spare = []
    eng.blocks.grow(spare, 16)
    eng.blocks.grow(s2.block_table, 37)
    s2.block_table[1], spare[0] = spare[0], s2.block_table[1]
    try:
        step, ids = eng._build_step([(s1, 19), (s2, 37)])
        assert step.seqs[1].slots is not None
        want = [ids, step.positions, step.slot_mapping, step.logit_rows, step.seqs[1].slots.clone()]
        got = eng._to_device(ids, step.positions, step.slot_mapping, step.logit_rows, step.seqs)
        for a, w in zip([*got, step.seqs[1].slots], want):
            assert torch.equal(a, w)
        assert ids.tolist() == s1.token_ids + s2.token_ids
    finally:
        for t in (s1.block_table, s2.block_table, spare):
            eng.blocks.free(t)



def test_the_engine_pages_are_sized_to_the_plan_window():
    # A whole read with a remapped policy sized its pages for 32K tokens without this
    # (272 MB of int4 pages for the README's 2.6K-token question).
    from ktcli.config import Settings
    from ktcli.engine.loading import _long_context
    from ktcli.types import Mode, Plan

    plan = Plan(Mode.FULL, "ask", 2500, 10, 8192, 384, 2500, 1, 0, 1, 0, 10.0, 1, kv_dtype="int4", attention="topk:4")
    out = _long_context(Settings(), plan)
    assert out["context_window"] == 8192 and out["kv_dtype"] == "int4" and out["attention"] == "topk:4"


def test_a_read_in_parts_sizes_its_kernel_pages_to_what_one_read_holds():
    # Retrieval under --rope-scaling yarn:8 held pages for the 65K-token window (1,486 MiB)
    # for reads of 2,200 tokens.
    from ktcli.config import Settings
    from ktcli.engine.loading import _long_context
    from ktcli.types import Mode, Plan

    plan = Plan(Mode.RETRIEVAL, "ask", 52000, 10, 65536, 384, 3072, 1, 270, 1, 8, 10.0, 1, kv_window=4522)
    out = _long_context(Settings(rope_scaling="yarn:8"), plan)
    assert out["context_window"] == 4522 and out["rope_scaling"] == "yarn:8"
