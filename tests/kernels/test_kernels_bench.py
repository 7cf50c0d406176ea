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
        rc = bench.main(["--smoke", "--kinds", "int4", "--contexts", "40", "--out", str(out)])
    finally:
        kernels.set_backend("auto")
    result = json.loads(out.read_text())
    assert rc == 0 and all(c["ok"] for c in result["checks"])
    assert {c["kernel"] for c in result["checks"]} >= {"kv_store", "decode", "score_pages", "sparse_decode",
                                                         "prefill_dense", "prefill_topk"}
    (row,) = result["timings"]
    assert row["context"] == 40 and row["kind"] == "int4" and row["decode_s"] > 0
    assert "timings, ms" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_without_cuda_exits_zero(capsys):
    assert bench.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out
