"""The fp32 products of our CPU engine against torch's defaults, on SmolLM2's shapes.

    python -m benchmarks.cpu_gemm --json [--reps 5]

Three comparisons, each against its baseline in the same process, 2 threads, best of
`--reps` runs, the two sides alternating:

* `gemm`: wide-step GEMMs (a prefill chunk of 64-4,096 rows through the qkv, gate_up
  and down shapes): `engine.cpu_gemm.linear` on oneDNN against `F.linear` (MKL's
  sgemm), GFLOPS and the ratio;
* `gemv`: decode-sized products (1-32 rows) over the 30 gate_up matrices (212 MB, so read
  from memory, not cache): `engine.bf16_gemv.gemv` on fp32 weights against `F.linear`;
* `prefill_attention`: a prefill chunk's attention after cached tokens (9 query heads
  over 3 kv heads, head_dim 64): `prefill_attention.attend_prefix` with the blocked
  oneDNN products against the flash-kernel split.

The oneDNN sides run on oneDNN whatever the engine's default on this CPU (off on Intel
CPUs: `cpu_gemm.available()`, recorded as `engine_uses_onednn`): these ratios are what
decides that default, so rerun this on a new machine kind. Writes benchmarks/results/cpu_gemm.json (`--name` for
another file).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import kernel_bench_args, machine, write_result

HIDDEN, INTER, QKV = 576, 1536, 960


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _pair(ours, base, reps: int) -> tuple[float, float]:
    """Best times of two functions after a warm-up, alternating so drift hits both."""
    ours(), base()
    t_ours, t_base = float("inf"), float("inf")
    for _ in range(reps):
        t_ours = min(t_ours, _timed(ours))
        t_base = min(t_base, _timed(base))
    return t_ours, t_base


def gemm_rows(reps: int) -> list[dict]:
    from ktcli.engine import cpu_gemm

    rows = []
    g = torch.Generator().manual_seed(0)
    for name, n_out, k in (("qkv", QKV, HIDDEN), ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER)):
        w = torch.randn(n_out, k, generator=g)
        for m in (64, 512, 2048, 4096):
            x = torch.randn(m, k, generator=g)
            with _onednn(True):
                t_ours, t_base = _pair(lambda: cpu_gemm.linear(x, w), lambda: F.linear(x, w), reps)
            flops = 2 * m * n_out * k
            rows.append({"shape": name, "rows": m, "ours_gflops": round(flops / t_ours / 1e9, 1),
                         "torch_gflops": round(flops / t_base / 1e9, 1), "speedup": round(t_base / t_ours, 2)})
            print(f"cpu_gemm gemm: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def gemv_rows(reps: int) -> list[dict]:
    from ktcli.engine import bf16_gemv

    g = torch.Generator().manual_seed(1)
    mats = [torch.randn(2 * INTER, HIDDEN, generator=g) for _ in range(30)]
    mb = sum(m.numel() * 4 for m in mats) / 1e6
    rows = []
    for r in (1, 2, 8, 32):
        x = torch.randn(r, HIDDEN, generator=g)
        t_ours, t_base = _pair(lambda: [bf16_gemv.gemv(x, m) for m in mats], lambda: [F.linear(x, m) for m in mats], reps)
        rows.append({"rows": r, "weights_mb": round(mb, 1), "ours_ms": round(t_ours * 1e3, 2),
                     "torch_ms": round(t_base * 1e3, 2), "ours_gb_s": round(mb / t_ours / 1e3, 1),
                     "torch_gb_s": round(mb / t_base / 1e3, 1), "speedup": round(t_base / t_ours, 2)})
        print(f"cpu_gemm gemv: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def attention_rows(reps: int) -> list[dict]:
    from ktcli.engine import cpu_gemm, prefill_attention

    if not cpu_gemm.usable() or prefill_attention._kernel() is None:
        return []
    rows = []
    g = torch.Generator().manual_seed(2)
    for n, past in ((512, 0), (2048, 0), (512, 3584), (2048, 2048), (2048, 6144)):
        q = torch.randn(n, 9, 64, generator=g)
        k, v = torch.randn(past + n, 3, 64, generator=g), torch.randn(past + n, 3, 64, generator=g)

        def ours():
            with _onednn(True):
                return prefill_attention.attend_prefix(q, k, v, 0.125)

        def flash():
            with _onednn(False):
                prefill_attention.attend_prefix(q, k, v, 0.125)

        err = float((ours() - prefill_attention._masked_sdpa(q, k, v, 0.125)).abs().max())
        t_ours, t_base = _pair(ours, flash, reps)
        flops = 4 * 9 * 64 * n * (past + (n + 1) / 2)  # causal: query i sees past + i + 1 keys
        rows.append({"queries": n, "cached": past, "ours_ms": round(t_ours * 1e3, 1),
                     "flash_ms": round(t_base * 1e3, 1), "ours_gflops": round(flops / t_ours / 1e9, 1),
                     "flash_gflops": round(flops / t_base / 1e9, 1), "speedup": round(t_base / t_ours, 2),
                     "max_abs_err_vs_masked_sdpa": err})
        print(f"cpu_gemm attention: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


class _onednn:
    """The engine's products with oneDNN on (where usable) or off, whatever this CPU's default."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        from ktcli.engine import cpu_gemm

        self.mod, self.saved = cpu_gemm, cpu_gemm.available
        on = self.on and cpu_gemm.usable()
        cpu_gemm.available = lambda: on

    def __exit__(self, *exc):
        self.mod.available = self.saved


def main(argv: list[str] | None = None) -> int:
    args = kernel_bench_args(__doc__, "cpu_gemm", argv)
    torch.set_num_threads(2)
    from ktcli.engine import bf16_gemv, cpu_gemm

    if not bf16_gemv.available():
        print("ktcli's C++ kernels are not built here (no compiler or no AVX2)", file=sys.stderr)
        return 1
    result = {"benchmark": "cpu_gemm", "machine": machine(), "threads": 2, "torch": torch.__version__,
              "cpu_vendor": cpu_gemm.cpu_vendor(), "onednn_usable": cpu_gemm.usable(),
              "engine_uses_onednn": cpu_gemm.available(),
              "baselines": {"gemm": "F.linear (MKL sgemm)", "gemv": "F.linear on 1-32 rows",
                            "prefill_attention": "the flash-kernel split (torch SDPA flash for CPU)"},
              "gemm": gemm_rows(args.reps), "gemv": gemv_rows(args.reps), "prefill_attention": attention_rows(args.reps)}
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
