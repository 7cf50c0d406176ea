"""Decode attention on the CPU: our kernel against torch's SDPA on the same pages.

    python -m benchmarks.cpu_attention --json [--lengths 512,4096,16384] [--reps 7]

One decode step of SmolLM2's attention (9 query heads over 3 kv heads, head_dim 64) for
30 layers, each layer with its own cache (as in a real step, nothing stays in the CPU
caches between layers), fp32 and fp16 pages, 2 threads:

* `kernel_ms`: `engine.cpu_attention` (what a decode step runs);
* `sdpa_ms`: `torch.nn.functional.scaled_dot_product_attention(enable_gqa=True)` over
  strided views of the same pages, the engine's torch path (the baseline);
* `floor_ms`: the bytes of K and V read once, at the bandwidth of a plain tensor copy
  measured in the same run (bytes read plus written per second), so `bandwidth_util` =
  floor / kernel says how close the kernel gets to streaming the pages once.

Every figure is the best of `--reps` runs; the two sides alternate within each run so
drift hits both. On a CPU with AVX-512 the kernel runs its 16-lane body; the same command
then also times the AVX2 body (a child process with KTCLI_NO_AVX512=1, right after) and
reports `avx2_kernel_ms` and `speedup_vs_avx2` per row. Writes
benchmarks/results/cpu_attention.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import machine, write_result

LAYERS, HQ, H, D, BS = 30, 9, 3, 64, 16
SCALE = D**-0.5


def copy_gbps(reps: int) -> float:
    """Read + write bandwidth of a plain 256 MB copy (bytes read and written per second)."""
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(reps))
    return 2 * src.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(ctx: int, dtype: torch.dtype, reps: int, gbps: float) -> dict:
    from ktcli.engine import cpu_attention

    n_blocks = -(-ctx // BS)
    gen = torch.Generator().manual_seed(ctx)
    ks = [torch.randn(n_blocks * BS, H, D, generator=gen).to(dtype) for _ in range(LAYERS)]
    vs = [torch.randn(n_blocks * BS, H, D, generator=gen).to(dtype) for _ in range(LAYERS)]
    q = torch.randn(1, HQ, D, generator=gen)
    # Pages in order: torch reads plain strided views, no gather (the baseline's best case).
    tables = torch.arange(n_blocks, dtype=torch.int32)[None]
    ctx_t, lo = torch.tensor([ctx]), torch.zeros(1, dtype=torch.int64)
    empty, slots = torch.empty(0), torch.zeros(1, dtype=torch.int64)
    kernel = cpu_attention._load()

    def ours():
        for k, v in zip(ks, vs):
            kernel.decode(q, empty, empty, slots, k, v, tables, BS, ctx_t, lo, SCALE)

    qs = q.to(dtype).transpose(0, 1)[None]  # [1, HQ, 1, D]

    def sdpa():
        for k, v in zip(ks, vs):
            F.scaled_dot_product_attention(qs, k[:ctx].transpose(0, 1)[None], v[:ctx].transpose(0, 1)[None],
                                           scale=SCALE, enable_gqa=True)

    # Same answer first (one layer): the timing compares two ways of one computation.
    ref = F.scaled_dot_product_attention(q.transpose(0, 1)[None], ks[0][:ctx].float().transpose(0, 1)[None],
                                         vs[0][:ctx].float().transpose(0, 1)[None], scale=SCALE, enable_gqa=True)
    got = kernel.decode(q, empty, empty, slots, ks[0], vs[0], tables, BS, ctx_t, lo, SCALE)
    err = float((got - ref[0].transpose(0, 1)).abs().max())
    ours(), sdpa()  # warm-up
    t_ours, t_sdpa = [], []
    for _ in range(reps):
        t_ours.append(_timed(ours))
        t_sdpa.append(_timed(sdpa))
    kv_bytes = 2 * LAYERS * ctx * H * D * ks[0].element_size()
    floor = kv_bytes / (gbps * 1e9)  # a copy's read+write traffic rate, taken as the read rate
    best_ours, best_sdpa = min(t_ours), min(t_sdpa)
    return {"ctx": ctx, "pages": str(dtype).replace("torch.", ""), "kernel_ms": round(best_ours * 1e3, 2),
            "sdpa_ms": round(best_sdpa * 1e3, 2), "speedup_vs_sdpa": round(best_sdpa / best_ours, 2),
            "kv_mb": round(kv_bytes / 1e6, 1), "floor_ms": round(floor * 1e3, 2),
            "bandwidth_util": round(floor / best_ours, 2), "max_abs_err_vs_fp32_sdpa": err}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--lengths", default="512,4096,16384")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows-only", action="store_true", help="print the rows as JSON, write nothing (the AVX2 child)")
    parser.add_argument("--name", default="cpu_attention", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ktcli.engine import cpu_attention

    if not cpu_attention.available():
        print("ktcli's C++ kernels are not built here (no compiler or no AVX2)", file=sys.stderr)
        raise SystemExit(1)
    gbps = copy_gbps(args.reps)
    rows = []
    for ctx in [int(x) for x in args.lengths.split(",")]:
        for dtype in (torch.float32, torch.float16):
            rows.append(run(ctx, dtype, args.reps, gbps))
            print(f"cpu_attention: {rows[-1]}", file=sys.stderr, flush=True)
    if args.rows_only:
        print(json.dumps(rows))
        return
    body = "avx512" if cpu_attention._load().avx512_bodies() else "avx2"
    if body == "avx512":
        _add_avx2_rows(rows, args)
    result = {"benchmark": "cpu_attention", "machine": machine(), "threads": args.threads,
              "shape": {"layers": LAYERS, "q_heads": HQ, "kv_heads": H, "head_dim": D, "block_size": BS},
              "baseline": "torch SDPA (enable_gqa) over strided views of the same pages",
              "kernel_body": body, "copy_gbps": round(gbps, 1), "rows": rows}
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


def _add_avx2_rows(rows: list[dict], args) -> None:
    """The AVX2 body on the same shapes, in a child (the body is chosen once per process)."""
    cmd = [sys.executable, "-m", "benchmarks.cpu_attention", "--rows-only", "--lengths", args.lengths,
           "--reps", str(args.reps), "--threads", str(args.threads)]
    out = subprocess.run(cmd, env={**os.environ, "KTCLI_NO_AVX512": "1"}, capture_output=True, text=True, check=True)
    for row, avx2 in zip(rows, json.loads(out.stdout.splitlines()[-1])):
        row["avx2_kernel_ms"] = avx2["kernel_ms"]
        row["speedup_vs_avx2"] = round(avx2["kernel_ms"] / row["kernel_ms"], 2)
        print(f"cpu_attention avx2 body: {avx2}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
