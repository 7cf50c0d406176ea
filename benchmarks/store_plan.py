"""Cost of a step's K/V store over all layers: planned once per step and applied per layer
(what the engine does since 2026-12-03) against `kernels.kv_store` per layer (before),
in the same run, on this machine's CPU with the torch reference operations.

    python -m benchmarks.store_plan --json

SmolLM2-135M's shape: 30 layers, 3 kv heads, head_dim 64, 16-token pages. Each step
writes N rows per sequence, starting 3 rows into a page so that pages fill, seal and take
staging slots as in a real run: N=1 (a decode step), 16, 512 (a prefill chunk). The
pools are touched before timing (fresh pages are mapped lazily, and the first write
would pay for it). Both sides run interleaved, steps alternating, and each figure is the
median over steps.

On a CPU this measures only the Python and torch work that planning per layer repeats;
on a GPU each read of a value back (`tolist`, `nonzero`, `unique`, `bool`) also waits for
the device's queue to drain, which this cannot show (`python -m kernels.bench` times the
per-layer store on a GPU: columns store1 and apply1).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import kernels
from benchmarks.common import machine, write_result

N_LAYERS, N_KV_HEADS, HEAD_DIM, BLOCK = 30, 3, 64, 16


def _pool(spec: kernels.KVCacheSpec, n_blocks: int) -> list[kernels.PagedKVLayer]:
    layers = [kernels.allocate(spec, n_blocks, n_stage=64) for _ in range(N_LAYERS)]
    for layer in layers:  # map every page now, not on the first timed write
        for t in (layer.k_pages, layer.v_pages, layer.k_min, layer.k_max, layer.stage_k, layer.stage_v):
            if t is not None:
                t.view(-1)[:: max(1, 4096 // t.element_size())] = t.view(-1)[0]
    return layers


def measure(kind: str, n_rows: int, n_steps: int) -> dict:
    spec = kernels.KVCacheSpec(N_KV_HEADS, HEAD_DIM, BLOCK, kind)
    n_blocks = (3 + n_rows * n_steps) // BLOCK + 2
    sides = {"per_layer": _pool(spec, n_blocks), "planned": _pool(spec, n_blocks)}
    k, v = torch.randn(n_rows, N_KV_HEADS, HEAD_DIM), torch.randn(n_rows, N_KV_HEADS, HEAD_DIM)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for step in range(n_steps):
        slots = torch.arange(3 + step * n_rows, 3 + (step + 1) * n_rows)
        for name in (("per_layer", "planned") if step % 2 == 0 else ("planned", "per_layer")):
            layers = sides[name]
            started = time.perf_counter()
            if name == "per_layer":
                for layer in layers:
                    kernels.kv_store(layer, k, v, slots)
            else:
                plan = kernels.plan_store(layers[0], slots)
                for layer in layers:
                    kernels.kv_store_planned(layer, k, v, plan)
            times[name].append(time.perf_counter() - started)
    for a, b in zip(sides["per_layer"], sides["planned"]):  # the same writes: the same pools
        assert torch.equal(a.k_pages, b.k_pages) and torch.equal(a.k_min, b.k_min)
    per_layer, planned = (statistics.median(times[n]) for n in ("per_layer", "planned"))
    return {"kind": kind, "rows": n_rows, "steps": n_steps, "per_layer_ms": round(per_layer * 1e3, 3),
            "planned_ms": round(planned * 1e3, 3), "speedup": round(per_layer / planned, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="also write benchmarks/results/NAME.json")
    parser.add_argument("--name", default="store_plan")
    parser.add_argument("--kinds", default="fp32,int8,int4")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    print(f"{'kind':6} {'rows':>5} {'per layer ms':>13} {'planned ms':>11} {'speedup':>8}   (a step, all {N_LAYERS} layers)")
    for kind in args.kinds.split(","):
        for n_rows, n_steps in ((1, 400), (16, 60), (512, 12)):
            r = measure(kind, n_rows, n_steps)
            rows.append(r)
            print(f"{kind:6} {n_rows:>5} {r['per_layer_ms']:>13.2f} {r['planned_ms']:>11.2f} {r['speedup']:>7.2f}x",
                  flush=True)
    payload = {"benchmark": "store_plan", "machine": machine(), "layers": N_LAYERS, "kv_heads": N_KV_HEADS,
               "head_dim": HEAD_DIM, "block_size": BLOCK, "baseline": "kernels.kv_store per layer", "results": rows}
    if args.json:
        print(f"wrote {write_result(args.name, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
