"""The bench's logic, on CPU: --smoke runs its checks and timings under the interpreter."""

import json
import time

import pytest
import torch

import kernels
from kernels import bench


@pytest.mark.triton
def test_bench_smoke_writes_json(tmp_path, capsys):
    out = tmp_path / "k.json"
    try:
        rc = bench.main(["--smoke", "--kinds", "int4", "--contexts", "40", "--no-e2e", "--out", str(out)])
    finally:
        kernels.set_backend("auto")
    result = json.loads(out.read_text())
    assert rc == 0 and all(c["ok"] for c in result["checks"])
    assert {c["kernel"] for c in result["checks"]} >= {"kv_store", "decode", "score_pages", "sparse_decode",
                                                         "prefill_dense", "prefill_topk"}
    (row,) = result["timings"]
    assert row["context"] == 40 and row["kind"] == "int4" and row["decode_s"] > 0
    assert result["e2e"] == {"skipped": "--no-e2e"}
    assert "timings, ms" in capsys.readouterr().out


def test_bench_reports_a_failing_kind_and_goes_on(monkeypatch):
    def boom(kernels_mod, kind, *a):
        if kind == "int8":
            raise RuntimeError("CUDA out of memory")
        return [{"kind": kind, "kernel": "decode", "max_err": 0.0, "tol": 1e-2, "ok": True}]

    monkeypatch.setattr(bench, "_check_kind", boom)
    rows = bench.check_kernels(kernels, ["fp16", "int8", "int4"], bench.Shape(True), torch.device("cpu"), 16)
    assert [r["kind"] for r in rows] == ["fp16", "int8", "int4"]
    assert not rows[1]["ok"] and "out of memory" in rows[1]["error"]
    timed = bench.time_kernels(kernels, ["fp16"], [64, 128], bench.Shape(True), torch.device("cpu"), 16,
                               float("nan"), deadline=0.0)
    assert [r.get("skipped") for r in timed] == ["time budget", "time budget"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_without_cuda_exits_zero(capsys):
    assert bench.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_floor_counts_only_what_decode_reads():
    """Float and fp8 decode never reads the page summaries (kept for page selection);
    int8/int4 decode reads them as the keys' zero and scale. Bench shape, 16-token pages."""
    n = 4096
    per_token = {kind: bench.decode_read_bytes(kernels.KVCacheSpec(8, 128, 16, kind), n) / n
                 for kind in ("fp32", "bf16", "fp16", "fp8", "int8", "int4")}
    table = 4 / 16  # the block table's int32 a page
    assert per_token["fp16"] == per_token["bf16"] == 2 * 8 * 128 * 2 + table  # 4,096 B, not 4,608
    assert per_token["fp32"] == 2 * 8 * 128 * 4 + table
    assert per_token["fp8"] == 2 * 8 * 128 + 2 * 8 * 4 / 16 + table  # ~2,052 B, not 2,564
    for kind in ("int8", "int4"):  # everything of the footprint (its stage map entry: the table's size)
        spec = kernels.KVCacheSpec(8, 128, 16, kind)
        assert per_token[kind] == kernels.bytes_per_token(spec)
    for kind in ("fp16", "fp8"):
        assert per_token[kind] < kernels.bytes_per_token(kernels.KVCacheSpec(8, 128, 16, kind))


def test_bench_defaults_check_every_kind_and_compare_fp32_weights_end_to_end():
    args = bench._parse([])
    assert args.check_kinds.split(",") == ["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
    assert args.kinds.split(",") == ["fp16", "fp8", "int8", "int4"]
    assert args.e2e_weights == "fp32"
    argv = bench.e2e_argv(args, 100)
    assert argv[argv.index("--weights") + 1] == "fp32" and argv[argv.index("--budget-s") + 1] == "100"


@pytest.mark.triton
def test_timings_budget_starts_when_the_timings_do(monkeypatch, tmp_path):
    """The end-to-end part (here 1.5 s of sleep) must not eat the timings' own budget (1 s);
    the total budget still caps both."""
    spent = []

    def slow_e2e(args, budget_s):
        spent.append(budget_s)
        time.sleep(1.5)
        return {"skipped": "test"}

    monkeypatch.setattr(bench, "run_e2e", slow_e2e)
    out = tmp_path / "k.json"
    argv = ["--smoke", "--kinds", "fp16", "--contexts", "40", "--out", str(out), "--budget-s", "1"]
    try:
        assert bench.main(argv + ["--total-budget-s", "1000"]) == 0
        result = json.loads(out.read_text())
        assert spent == [100.0] and "decode_s" in result["timings"][0]  # timed, not skipped
        assert bench.main(argv + ["--total-budget-s", "0"]) == 0  # a total spent by the checks: nothing more
        result = json.loads(out.read_text())
        assert result["e2e"] == {"skipped": "total budget spent by the checks"} and len(spent) == 1
        assert result["timings"][0]["skipped"] == "time budget"
    finally:
        kernels.set_backend("auto")


@pytest.mark.triton
def test_store_checks_compare_with_a_cpu_oracle(monkeypatch):
    """The exact kv_store checks read the kernel's pool back on the CPU and compare it with
    the reference run on CPU copies of the inputs (never with torch on the device)."""
    seen = []
    real = bench.layer_to

    def spy(layer, device):
        seen.append(str(device))
        return real(layer, device)

    monkeypatch.setattr(bench, "layer_to", spy)
    layer = kernels.allocate(kernels.KVCacheSpec(2, 32, 16, "int8"), 3, device="cpu")
    copy = real(layer, "cpu")
    assert copy.k_pages.device.type == "cpu" and torch.equal(copy.k_pages, layer.k_pages)
    rows = bench._check_kind(kernels, "int8", bench.Shape(True), torch.device("cpu"), 16)
    assert seen and set(seen) == {"cpu"}
    store = [r for r in rows if r["kernel"].startswith("kv_store")]
    assert len(store) == 3 and all(r["ok"] for r in store), store
