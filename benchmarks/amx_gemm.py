"""The AMX GEMM of wide bf16/int8-weight steps against torch's products, on SmolLM2's shapes.

    python -m benchmarks.amx_gemm --json [--reps 5]

Per shape (qkv, gate_up, down) and prefill chunk (512 and 2,048 rows), int8 weights
(the CPU default; packed as `engine.int8_gemv`), 2 threads, best of `--reps`, all sides
alternating in one process:

* `amx_split`: `engine.amx_gemm.linear`, the engine's default on a CPU with AMX: fp32
  activations as two bf16 parts, fp32 output;
* `amx_one_pass`: the same kernel with the activations rounded to bf16 (what the split
  costs);
* `onednn_bf16` (the baseline): what the engine ran before, `F.linear` over the weights
  unpacked to bf16, activations rounded to bf16, bf16 output widened to fp32;
* `mkl_fp32`: `F.linear` over the weights unpacked to fp32 (the fp32 prefill's product).

Each side's error is its largest deviation from float64 products over the weights it
multiplies (bf16; fp32 for `mkl_fp32`), relative to the largest output. Needs a CPU with AMX (exits 1 elsewhere).
Writes benchmarks/results/amx_gemm.json (`--name` for another file).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from benchmarks.common import amx_kernel_bench, best_alternating, side_figures

HIDDEN, INTER, QKV = 576, 1536, 960


def rows(reps: int) -> list[dict]:
    from ktcli.engine import amx_gemm, int8_gemv

    out = []
    g = torch.Generator().manual_seed(0)
    for name, n, k in (("qkv", QKV, HIDDEN), ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER)):
        w = int8_gemv.pack(torch.randn(n, k, generator=g) * 0.05)
        wb = int8_gemv.unpack(w, torch.bfloat16)
        for m in (512, 2048):
            x = torch.randn(m, k, generator=g)
            sides = {
                "amx_split": lambda: amx_gemm.linear(x, w),
                "amx_one_pass": lambda: amx_gemm.linear(x, w, split=False),
                "onednn_bf16": lambda: F.linear(x.to(torch.bfloat16), int8_gemv.unpack(w, torch.bfloat16)).float(),
                "mkl_fp32": lambda: F.linear(x, int8_gemv.unpack(w)),
            }
            # Each side against float64 products over the weights it multiplies (bf16, or fp32 for MKL).
            exact = x.double() @ wb.double().T
            exact32 = x.double() @ int8_gemv.unpack(w).double().T
            err = {s: float((f().double() - (exact32 if s == "mkl_fp32" else exact)).abs().max() / exact.abs().max())
                   for s, f in sides.items()}
            best = best_alternating(sides, reps)
            flops = 2 * m * n * k
            out.append({
                "shape": name, "rows": m, "n": n, "k": k,
                **side_figures(best, flops, err, "max_rel_err", digits=3),
                "split_vs_onednn_bf16": round(best["onednn_bf16"] / best["amx_split"], 3),
                "split_vs_mkl_fp32": round(best["mkl_fp32"] / best["amx_split"], 3),
                "split_vs_one_pass": round(best["amx_one_pass"] / best["amx_split"], 3),
            })
            print(f"{name} {m} rows: " + ", ".join(f"{s} {t * 1e3:.2f} ms" for s, t in best.items()), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    from ktcli.engine import amx_gemm

    return amx_kernel_bench(
        __doc__, "amx_gemm", argv, amx_gemm.available, rows,
        weights="int8 (engine.int8_gemv packing), unpacked to bf16 inside the kernel",
        baseline="onednn_bf16: F.linear over bf16-unpacked weights, bf16 activations, output widened")


if __name__ == "__main__":
    raise SystemExit(main())
