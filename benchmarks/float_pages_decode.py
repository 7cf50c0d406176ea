"""Decode over fp32/fp16/bf16 pages of the long-context cache on the CPU: the paged decode
kernel reading the pages in place (`longctx.float_pages_decode`, now) against the path
before 2026-12-06 (the baseline): gather and widen the whole context to fp32
(`kernels.reference.context_kv`), then two batched products (`attention.decode_grouped`).

    python -m benchmarks.float_pages_decode --json

That path is what a full read under `--rope-scaling` takes (dense attention over the
kernels' pages: fp16 by default), and a probe's 12K-token read decoded at 1.4 tok/s.

Two parts, each configuration interleaved within a round, best of `--rounds`:
* attention alone: one layer's decode call (SmolLM2's 3 kv heads, 9 query heads, head_dim
  64, 64-token pages) at `--contexts` tokens, per page kind; the outputs are compared too;
* the engine: SmolLM2 under `--rope-scaling yarn:2` with fp16 pages (what `ktcli ask
  --rope-scaling yarn:2` loads), a `--length`-token prompt, `--new-tokens` greedy tokens
  with the kernel and without (end of sequence ignored); decode tok/s from the engine's
  clocks, and whether both wrote the same tokens.
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import arg_parser, machine, report


def _layer(kind: str, ctx: int):
    import kernels

    torch.manual_seed(ctx)
    spec = kernels.KVCacheSpec(3, 64, 64, kind)
    n_pages = -(-ctx // 64)
    layer = kernels.allocate(spec, n_pages + 2, "cpu", n_stage=1)
    table = torch.randperm(n_pages + 2)[:n_pages].to(torch.int32)
    slots = table.long()[torch.arange(ctx) // 64] * 64 + torch.arange(ctx) % 64
    kernels.kv_store(layer, torch.randn(ctx, 3, 64), torch.randn(ctx, 3, 64), slots)
    return layer, table


def attention_rows(contexts: list[int], kinds: list[str], rounds: int, calls: int) -> list[dict]:
    from kernels.reference import context_kv
    from ktcli.engine.attention import decode_grouped
    from ktcli.engine.longctx import float_pages_decode

    scale = 64**-0.5
    sides = {
        "baseline": lambda q, layer, table, ctx: decode_grouped(q, *context_kv(layer, table, ctx), scale),
        "now": lambda q, layer, table, ctx: float_pages_decode(q, layer, table, ctx, scale),
    }
    rows = []
    for kind in kinds:
        for ctx in contexts:
            layer, table = _layer(kind, ctx)
            q = torch.randn(1, 9, 64)
            best = {name: float("inf") for name in sides}
            for side in sides.values():  # first-call costs (loading the kernels) out of the timings
                side(q, layer, table, ctx)
            for r in range(rounds):
                for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                    start = time.perf_counter()
                    for _ in range(calls):
                        sides[name](q, layer, table, ctx)
                    best[name] = min(best[name], (time.perf_counter() - start) / calls)
            err = (sides["now"](q, layer, table, ctx) - sides["baseline"](q, layer, table, ctx)).abs().max().item()
            rows.append({"kind": kind, "context": ctx, "baseline_ms": round(best["baseline"] * 1e3, 3),
                         "now_ms": round(best["now"] * 1e3, 3), "speedup": round(best["baseline"] / best["now"], 1),
                         "max_abs_diff": err})
            print(f"{kind:<5} {ctx:>6} tokens: baseline {best['baseline'] * 1e3:8.2f} ms, now {best['now'] * 1e3:7.2f} ms "
                  f"({best['baseline'] / best['now']:.1f}x), max |diff| {err:.1e}", flush=True)
    return rows


def engine_row(length: int, new_tokens: int) -> dict:
    from benchmarks.longctx_quality import model_dir, needle_prompt
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.native import NativeBackend

    backend = NativeBackend.load(model_dir(), weights="auto", rope_scaling="yarn:2")
    assert backend.kv._paged_decode, "the kernel does not take these pages here"
    prompt = needle_prompt(backend.tokenizer, length, 0.5)
    backend.eos_ids = frozenset()  # the same number of tokens on both sides
    out = {}
    for name, on in (("now", True), ("baseline", False)):
        backend.kv._paged_decode = on
        ids = backend.generate_ids_batch([prompt], SamplingParams(max_new_tokens=new_tokens))
        out[name] = (ids, backend.last_stats.extra["decode_tok_s"], backend.last_stats.prefill_s)
        print(f"engine, {length} tokens, yarn:2, fp16 pages, {name}: decode {out[name][1]:.2f} tok/s "
              f"(prefill {out[name][2]:.1f} s)", flush=True)
    return {"tokens": len(prompt), "rope_scaling": "yarn:2", "kv": "fp16 pages, dense", "new_tokens": new_tokens,
            "weights": backend.weights_name, "baseline_decode_tok_s": round(out["baseline"][1], 2),
            "now_decode_tok_s": round(out["now"][1], 2), "speedup": round(out["now"][1] / out["baseline"][1], 1),
            "same_tokens": out["now"][0] == out["baseline"][0]}


def main() -> None:
    ap = arg_parser("float_pages_decode", __doc__, "float_pages_decode")
    ap.add_argument("--contexts", default="4096,12288,32768")
    ap.add_argument("--kinds", default="fp16,bf16,fp32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--length", type=int, default=12288)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = attention_rows([int(c) for c in args.contexts.split(",")], args.kinds.split(","), args.rounds, args.calls)
    engine = engine_row(args.length, args.new_tokens) if args.length else None
    payload = {"machine": machine(), "baseline": "context_kv + decode_grouped", "attention": rows, "engine": engine}
    report(args.name, payload, args.json)


if __name__ == "__main__":
    main()
