"""fp32 prefill attention on AMX tiles against torch's flash kernel, on SmolLM2's heads.

    python -m benchmarks.amx_attention --json [--reps 5]

SmolLM2's attention (9 query heads over 3 kv heads, head size 64), causal, 2 threads,
best of `--reps`, all sides alternating in one process, for the chunks a prefill runs:
a first chunk of 512, 2,048 and 4,096 tokens, and a second chunk of 2,048 after 2,048
cached tokens (a 4K prompt in the engine's default 2,048-token chunks):

* `amx_split` (the engine's fp32 path on a CPU with AMX): `engine.amx_attention.attend`,
  every operand as bf16 hi + lo, three tile passes per product, fp32 softmax;
* `flash_fp32` (the baseline, what the engine ran before): `engine.prefill_attention`'s
  torch path (the flash kernel, split into earlier and own keys for a later chunk);
* `flash_bf16`: the same with q, k and v rounded to bf16 (the bf16 prefill's attention).

Each side's error is its deviation from float64 attention of the same fp32 inputs (norm
of the difference over norm of the output). GFLOPS count 4 * D flops per (query head,
visible key) pair. Needs a CPU with AMX (exits 1 elsewhere). Writes
benchmarks/results/amx_attention.json (`--name` for another file).
"""

from __future__ import annotations

import sys

import torch

from benchmarks.common import amx_kernel_bench, best_alternating, side_figures

HQ, H, D = 9, 3, 64
CHUNKS = [(512, 0), (2048, 0), (4096, 0), (2048, 2048)]  # (chunk rows, cached tokens before it)


def rows(reps: int) -> list[dict]:
    from ktcli.engine import amx_attention, prefill_attention

    def torch_path(q, k, v, dtype=None):
        supports = amx_attention.supports
        amx_attention.supports = lambda q: False  # attend_prefix's torch path, as before the kernel
        try:
            return prefill_attention.attend_prefix(q, k, v, D ** -0.5, dtype)
        finally:
            amx_attention.supports = supports

    out = []
    g = torch.Generator().manual_seed(0)
    for n, p in CHUNKS:
        q = torch.randn(n, HQ, D, generator=g)
        k = torch.randn(p + n, H, D, generator=g) * 1.5
        v = torch.randn(p + n, H, D, generator=g)
        sides = {
            "amx_split": lambda: amx_attention.attend(q, k, v, D ** -0.5),
            "flash_fp32": lambda: torch_path(q, k, v),
            "flash_bf16": lambda: torch_path(q, k, v, torch.bfloat16),
        }
        exact = amx_attention.attend_reference(q, k, v, D ** -0.5).double()
        err = {s: float((f().double() - exact).norm() / exact.norm()) for s, f in sides.items()}
        best = best_alternating(sides, reps)
        pairs = HQ * (n * p + n * (n + 1) / 2)  # (query head, visible key) pairs
        flops = 4 * D * pairs
        out.append({
            "rows": n, "cached": p,
            **side_figures(best, flops, err, "rel_err"),
            "split_vs_flash_fp32": round(best["flash_fp32"] / best["amx_split"], 3),
            "split_vs_flash_bf16": round(best["flash_bf16"] / best["amx_split"], 3),
        })
        print(f"{n} rows after {p}: " + ", ".join(f"{s} {t * 1e3:.1f} ms" for s, t in best.items()), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    from ktcli.engine import amx_attention

    return amx_kernel_bench(
        __doc__, "amx_attention", argv, amx_attention.available, rows,
        heads={"query": HQ, "kv": H, "head_size": D},
        baseline="flash_fp32: torch's flash kernel through engine.prefill_attention (the engine's fp32 path before)")


if __name__ == "__main__":
    raise SystemExit(main())
