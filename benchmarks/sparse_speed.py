"""Prefill and decode speed of the sparse mode on the CPU against full attention, in the
same run.

    python -m benchmarks.sparse_speed --json

The sparse mode (`ktcli ask --mode sparse`, the planner's choice for documents past the
model's window) prefills through `KernelKVCache._remapped`: per page of queries, its own
page selection, a gather of the selected pages (dequantised), RoPE at virtual positions
and attention over them. The baseline is the full mode's prefill of the same prompt on
the same engine and weights: fp16 pages and the flash / blocked prefill attention over
every earlier key (`engine.prefill_attention`) and the C++ decode over fp16 pages. Each
call prefills the prompt and decodes `--new-tokens` tokens (end of sequence ignored); the
engine's own clocks split the two (prefill: every prompt step, the question's replay
included). Each figure is the best of `--rounds` calls, configurations interleaved within
a round; the ratios are sparse over full tok/s.

Prompts: the needle benchmark's haystack (the Python tutorial), `--lengths` tokens, the
same for every configuration. SmolLM2-135M, weights as the CLI loads them (`--weights
auto`: int8 on a CPU), 512-token prefill chunks (the engine's default).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import machine, write_result
from benchmarks.longctx_quality import model_dir, needle_prompt

# name -> NativeBackend.load options: the full mode's cache, then the sparse mode's.
CONFIGS = {
    "full-fp16": dict(kv_dtype="auto"),
    "topk-int4": dict(kv_dtype="int4", attention="topk"),  # --mode sparse's defaults
    "topk-int8": dict(kv_dtype="int8", attention="topk"),
    "window-int4": dict(kv_dtype="int4", attention="window"),
    # The rest of what `ktcli plan` offers (int8, int4, fp32 pages under topk and window):
    # their speeds against topk-int8's are the planner's per-kind factors (plan.estimates).
    "topk-fp32": dict(kv_dtype="fp32", attention="topk"),
    "window-int8": dict(kv_dtype="int8", attention="window"),
    "window-fp32": dict(kv_dtype="fp32", attention="window"),
    # Asked for by name (--kv-dtype): float pages of 8 and 16 bits.
    "topk-fp8": dict(kv_dtype="fp8", attention="topk"),
    "topk-bf16": dict(kv_dtype="bf16", attention="topk"),
    "topk-fp16": dict(kv_dtype="fp16", attention="topk"),
    "window-fp8": dict(kv_dtype="fp8", attention="window"),
    "window-bf16": dict(kv_dtype="bf16", attention="window"),
    "window-fp16": dict(kv_dtype="fp16", attention="window"),
    # The full mode over pages other than the model's own (--kv-dtype without --attention):
    # dense attention over every page, in the window; their speeds against full-fp16's are
    # the planner's factors for such reads (plan.estimates.DENSE_SPEED).
    "full-fp8": dict(kv_dtype="fp8"),
    "full-int8": dict(kv_dtype="int8"),
    "full-int4": dict(kv_dtype="int4"),
    "full-bf16": dict(kv_dtype="bf16"),
    "full-fp32": dict(kv_dtype="fp32"),
}
BASELINE = "full-fp16"


def load(name: str, weights: str, max_tokens: int):
    from ktcli.engine.native import NativeBackend

    # A budget for the longest prompt (SmolLM2's fp32 K and V bytes per token, 30 layers x
    # 3 kv heads x 64, bound every kind), not the default share of RAM: four caches live at once.
    budget = (max_tokens + 1024) * 30 * 3 * 64 * 2 * 4 + (256 << 20)
    return NativeBackend.load(model_dir(), weights=weights, kv_budget_bytes=budget, **CONFIGS[name])


def timed(backend, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode tok/s) of one call."""
    from ktcli.engine.backend import SamplingParams

    eos, backend.eos_ids = backend.eos_ids, frozenset()  # decode the same number of tokens in every run
    try:
        backend.generate_ids_batch([prompt], SamplingParams(max_new_tokens=new_tokens))
    finally:
        backend.eos_ids = eos
    stats = backend.last_stats
    return stats.prefill_s, stats.extra["decode_tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--configs", default="full-fp16,topk-int4,topk-int8,window-int4")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=33)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--name", default="sparse_speed")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lengths = [int(x) for x in args.lengths.split(",")]
    names = args.configs.split(",")
    if BASELINE not in names:
        names.insert(0, BASELINE)
    backends = {name: load(name, args.weights, max(lengths)) for name in names}
    tokenizer = backends[BASELINE].tokenizer
    warm = needle_prompt(tokenizer, 700, 0.5)
    for backend in backends.values():  # first-call costs (kernels, tables) out of the timings
        timed(backend, warm, 4)
    rows = []
    for length in lengths:
        prompt = needle_prompt(tokenizer, length, 0.5)
        prefill = {name: float("inf") for name in names}
        decode = {name: 0.0 for name in names}
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                seconds, tok_s = timed(backends[name], prompt, args.new_tokens)
                prefill[name], decode[name] = min(prefill[name], seconds), max(decode[name], tok_s)
        for name in names:
            tok_s = length / prefill[name]
            vs_full = tok_s / (length / prefill[BASELINE])
            # Past the model's window (8K) the full mode prefills but generates nothing.
            dec_vs = round(decode[name] / decode[BASELINE], 3) if decode[BASELINE] else None
            rows.append({"tokens": length, "config": name, "prefill_s": round(prefill[name], 2),
                         "prefill_tok_s": round(tok_s, 1), "prefill_vs_full": round(vs_full, 3),
                         "decode_tok_s": round(decode[name], 2), "decode_vs_full": dec_vs})
            print(f"{length:>6} {name:<12} prefill {prefill[name]:7.2f} s {tok_s:7.1f} tok/s x{vs_full:.2f} of full"
                  f"   decode {decode[name]:6.2f} tok/s" + (f" x{dec_vs:.2f}" if dec_vs else ""), flush=True)
    payload = {"machine": machine(), "weights": backends[BASELINE].weights_name, "rounds": args.rounds,
               "new_tokens": args.new_tokens, "baseline": BASELINE, "rows": rows}
    if args.json:
        print("wrote", write_result(args.name, payload))


if __name__ == "__main__":
    main()
