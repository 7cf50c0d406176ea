"""The bench's logic, on CPU: --smoke runs its checks and timings under the interpreter."""

import json

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
