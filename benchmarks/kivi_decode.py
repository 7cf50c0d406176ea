"""Decode attention over int8 / int4 KV pages on the CPU: read in place against dequantised.

    python -m benchmarks.kivi_decode --json [--lengths 512,4096,16384] [--reps 5]

One decode step of SmolLM2's attention (9 query heads over 3 kv heads, head_dim 64, 64-token
pages) for 30 layers, each layer with its own cache, 2 threads:

* `kernel_ms`: `engine.cpu_kivi_attention`, the codes read in place;
* `torch_ms`: what the engine ran before, the baseline: `kernels.reference.context_kv`
  (the context dequantised to fp32) and two batched products (`engine.attention.decode_grouped`);
* `fp16_kernel_ms`: the same context in fp16 pages through `engine.cpu_attention`, the
  dense default's kernel, for scale (int8 pages hold about half its bytes, int4 a quarter).

Then the whole engine: SmolLM2 with int8 weights over int8 pages, a 4,096-token prompt,
32 greedy tokens, decode tokens/s as it runs now and as it ran before, in the same process
on the same prompt, alternating:

* dense attention: now this kernel, and decode rows staged by
  `engine.longctx.store_mid_page`; before the torch attention path and `kernels.kv_store`
  for every row (best of `--engine-reps`);
* topk attention (the `sparse` mode's default): now the selected pages gathered by
  `cpu_kivi_attention.gather` and the same staging; before `kernels.reference.gather_kv`
  and `kernels.kv_store` (one run each: its prompt takes longer).

Every other figure is the best of `--reps`.
Writes benchmarks/results/kivi_decode.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks.common import machine, write_result

LAYERS, HQ, H, D, BS = 30, 9, 3, 64, 64
SCALE = D**-0.5


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def attention_row(ctx: int, kind: str, reps: int) -> dict:
    import kernels
    from kernels.reference import context_kv
    from ktcli.engine import cpu_attention, cpu_kivi_attention
    from ktcli.engine.attention import decode_grouped

    gen = torch.Generator().manual_seed(ctx)
    spec = kernels.KVCacheSpec(H, D, BS, kind, stage_dtype="fp32")
    n_pages = -(-ctx // BS)
    table = torch.arange(n_pages, dtype=torch.int32)
    slots = torch.arange(ctx)
    layers, halves = [], []
    for _ in range(LAYERS):
        k, v = torch.randn(ctx, H, D, generator=gen), torch.randn(ctx, H, D, generator=gen)
        layer = kernels.allocate(spec, n_pages, "cpu", n_stage=2)
        kernels.kv_store(layer, k, v, slots)
        layers.append(layer)
        halves.append((k.half(), v.half()))
    q = torch.randn(1, HQ, D, generator=gen)

    def ours():
        for layer in layers:
            cpu_kivi_attention.decode(q, layer, table, ctx, SCALE)

    def torch_path():
        for layer in layers:
            k_all, v_all = context_kv(layer, table, ctx)
            decode_grouped(q, k_all, v_all, SCALE)

    fp16 = cpu_attention._load()
    empty, no_slot = torch.empty(0), torch.zeros(1, dtype=torch.int64)
    ctx_t, lo, tables16 = torch.tensor([ctx]), torch.zeros(1, dtype=torch.int64), torch.arange(n_pages, dtype=torch.int32)[None]

    def fp16_kernel():
        for k, v in halves:
            fp16.decode(q, empty, empty, no_slot, k, v, tables16, BS, ctx_t, lo, SCALE)

    # Same answer first (one layer): the timing compares two ways of one computation.
    k_all, v_all = context_kv(layers[0], table, ctx)
    err = float((cpu_kivi_attention.decode(q, layers[0], table, ctx, SCALE) - decode_grouped(q, k_all, v_all, SCALE)).abs().max())
    ours(), torch_path(), fp16_kernel()  # warm-up
    t_ours, t_torch, t_fp16 = [], [], []
    for _ in range(reps):  # alternate so drift hits every side
        t_ours.append(_best(ours, 1))
        t_torch.append(_best(torch_path, 1))
        t_fp16.append(_best(fp16_kernel, 1))
    page_mb = LAYERS * kernels.bytes_per_token(spec) * ctx / 1e6
    return {"ctx": ctx, "pages": kind, "kernel_ms": round(min(t_ours) * 1e3, 2), "torch_ms": round(min(t_torch) * 1e3, 2),
            "speedup_vs_torch": round(min(t_torch) / min(t_ours), 2), "fp16_kernel_ms": round(min(t_fp16) * 1e3, 2),
            "kv_mb": round(page_mb, 1), "fp16_kv_mb": round(2 * LAYERS * ctx * H * D * 2 / 1e6, 1),
            "max_abs_err_vs_torch": err}


def engine_row(reps: int, attention: str) -> dict:
    from benchmarks.longctx_quality import model_dir, needle_prompt
    from ktcli.engine import longctx
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.native import NativeBackend

    backend = NativeBackend.load(model_dir(), weights="int8", kv_dtype="int8", attention=attention, threads=2)
    prompt = needle_prompt(backend.tokenizer, 4096, 0.5)
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    rates = {True: [], False: []}
    tokens = {}
    gathers_here = longctx._gathers_here
    try:
        for _ in range(reps):
            for now in (True, False):
                backend.kv._kivi_decode = backend.kv._fast_store = now
                longctx._gathers_here = gathers_here if now else (lambda layer: False)
                tokens[now] = backend.generate_ids([prompt], params)[0]
                st = backend.last_stats
                rates[now].append(st.new_tokens / st.decode_s)
    finally:
        longctx._gathers_here = gathers_here
    return {"attention": attention, "prompt_tokens": len(prompt), "new_tokens": 32, "weights": "int8", "pages": "int8",
            "decode_tok_s_now": round(max(rates[True]), 2), "decode_tok_s_before": round(max(rates[False]), 2),
            "speedup": round(max(rates[True]) / max(rates[False]), 2), "same_tokens": tokens[True] == tokens[False]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--lengths", default="512,4096,16384")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--engine-reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from ktcli.engine import cpu_kivi_attention

    if not cpu_kivi_attention.available():
        print("ktcli's C++ kernels are not built here (no compiler or no AVX2)", file=sys.stderr)
        raise SystemExit(1)
    rows = []
    for ctx in [int(x) for x in args.lengths.split(",")]:
        for kind in ("int8", "int4"):
            rows.append(attention_row(ctx, kind, args.reps))
            print(f"kivi_decode: {rows[-1]}", file=sys.stderr, flush=True)
    engine = [engine_row(args.engine_reps, "dense"), engine_row(1, "topk")]
    print(f"kivi_decode: engine {engine}", file=sys.stderr, flush=True)
    result = {"benchmark": "kivi_decode", "machine": machine(), "threads": 2,
              "shape": {"layers": LAYERS, "q_heads": HQ, "kv_heads": H, "head_dim": D, "block_size": BS},
              "baseline": "kernels.reference.context_kv + engine.attention.decode_grouped (the torch path)",
              "rows": rows, "engine": engine}
    path = write_result("kivi_decode", result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
