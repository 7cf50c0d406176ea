"""Every Triton kernel compiles to an sm_90 cubin (the H200 the bench runs on), here,
without a GPU: the interpreter tests check what the kernels compute, this checks that
Triton's real compiler and ptxas accept them. In a subprocess, because this test
session imported triton under TRITON_INTERPRET=1."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _jit_kernels() -> set[str]:
    """The names of the package's launchable kernels (``_..._kernel`` JIT functions)."""
    import kernels.kv_store_triton
    import kernels.paged_attention
    import kernels.prefill_attention
    import kernels.sparse_attention

    mods = (kernels.kv_store_triton, kernels.paged_attention, kernels.prefill_attention, kernels.sparse_attention)
    return {name for m in mods for name, obj in inspect.getmembers(m)
            if name.endswith("_kernel") and hasattr(obj, "fn") and inspect.getmodule(obj.fn) is m}


@pytest.mark.triton
def test_every_kernel_compiles_for_sm90(tmp_path):
    out = tmp_path / "compile.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_HOME"] = str(tmp_path)  # a private cache: nothing from earlier runs stands in
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "kernels.compile_check", "--quick", "--arch", "90",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    variants = report["variants"]
    assert variants and all(v["ok"] for v in variants) and not report["case_errors"]
    # Real cubins, read off ptxas: registers and shared memory within an H200 block's share.
    assert all(0 < v["registers"] <= 255 and 0 <= v["shared_bytes"] <= 232448 for v in variants)
    compiled = {v["kernel"] for v in variants}
    assert compiled == _jit_kernels(), "a kernel the compile check does not launch, or one it no longer finds"
    # Every page kind went through decode, sparse decode and prefill.
    kinds = {(v["kernel"], v["constexprs"].get("KIND"), v["constexprs"].get("SPARSE")) for v in variants}
    assert {("_decode_split_kernel", k, s) for k in range(4) for s in (False, True)} <= kinds
    assert {("_prefill_kernel", k, None) for k in range(4)} <= kinds


def test_compile_check_refuses_the_interpreter(capsys):
    from kernels import compile_check

    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by this folder's conftest
    assert compile_check.main(["--quick"]) == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().err


def test_spills_are_compared_per_kernel_shape_and_kind():
    from kernels.compile_check import Report, Variant, compare_spills

    def rep(warps, spills):
        r = Report(90, warps)
        r.variants = [Variant(k, case, {}, {}, spill_bytes=b) for k, case, b in spills]
        return r

    now = rep(8, [("_prefill_kernel", "smollm2 int4 bs16 q:float32", 20),
                  ("_prefill_kernel", "smollm2 int4 bs64 q:float32", 28),
                  ("_decode_split_kernel", "llama3-8b fp16 bs16 q:float16", 0),
                  ("_summary_kernel", "smollm2 int4 bs16", 4)])  # not an attention kernel: left out
    base = rep(4, [("_prefill_kernel", "smollm2 int4 bs16 q:float32", 436),
                   ("_prefill_kernel", "smollm2 int4 bs64 q:float32", 52)])
    rows = compare_spills(now, base)
    assert rows == [
        {"kernel": "_decode_split_kernel", "shape": "llama3-8b", "kind": "fp16", "spill_8w": 0, "spill_4w": None},
        {"kernel": "_prefill_kernel", "shape": "smollm2", "kind": "int4", "spill_8w": 28, "spill_4w": 436},
    ]
