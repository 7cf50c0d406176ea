"""Wide steps in bf16 against fp32 on this CPU: what `KTCLI_PREFILL_DTYPE` buys and costs.

    python -m benchmarks.prefill_dtype --json

On a CPU with AMX, bf16/int8 weights prefill with bf16 GEMMs and bf16 flash attention by
default (`engine.device.resolve_prefill_dtype`); the baseline is the same weights with
fp32 wide steps (the default everywhere else), in the same process, taking turns for
`--rounds` rounds (each rate keeps its best round; this VM drifts minute to minute).

Per weight dtype (int8, the CPU default, and bf16):
- prefill tok/s at 512 and 4096 tokens in each prefill dtype, and their ratio;
- quality, against fp32 weights with the fp32 prefill (the exact configuration):
  perplexity and KL per token over the first `--ppl-tokens` tokens of the bundled Python
  tutorial (one prompt, so every position's logits come from a prefill), the largest
  relative L2 logit error over those positions, top-1 agreement; and the share of
  `--new-tokens` greedy tokens equal to fp32's after long prompts (tutorial sections
  and a question, each several prefill chunks long).

Where ktcli's AMX GEMM runs (`engine.amx_gemm`: the bf16 wide steps' default there, fp32
activations split into two bf16 parts, fp32 output), a third side `bf16-onepass` runs the
same bf16 wide steps on torch's bf16 GEMMs instead (activations and outputs rounded to
bf16: the default before it; `KTCLI_NO_AMX_GEMM=1`), so the split's cost and gain are
measured in the same run. A fourth, `bf16-fp32attn`, keeps the bf16 GEMMs and runs the
attention on `engine.amx_attention` (fp32-grade, operands split into two bf16 parts) instead
of torch's bf16 flash kernel. The quality reference runs its attention on torch's fp32
flash kernel (the bit-level fp32 path), not on that kernel.

Prints one JSON object and writes it to benchmarks/results/prefill_dtype.json (`--name`
for another file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from benchmarks.common import ROOT, machine, write_result

TEXT = ROOT / "sample_docs" / "python-tutorial-3.11.rst"
LENGTHS = (512, 4096)
QUESTIONS = (
    "What does this section explain? Answer in two sentences.",
    "Which Python statements are mentioned here?",
    "Summarize the example code in this text.",
    "What should a beginner remember from this part?",
)


def _load(folder, weights: str, prefill: str):
    """prefill: fp32, bf16 (the engine's bf16 wide steps), bf16-onepass (torch's bf16 GEMMs)
    or bf16-fp32attn (bf16 GEMMs, attention on engine.amx_attention)."""
    from ktcli.engine.native import NativeBackend

    os.environ["KTCLI_PREFILL_DTYPE"] = prefill.split("-")[0]
    backend = NativeBackend.load(folder, weights=weights, threads=2, kv_budget_bytes=256 << 20)
    assert backend.engine.model.prefill_dtype == prefill.split("-")[0]
    if prefill == "bf16-onepass":
        backend.engine.model._amx = False
    if prefill == "bf16-fp32attn":  # bf16 GEMMs, fp32-grade attention (engine.amx_attention)
        backend.engine.model.prefill_attn_dtype = None
    return backend


def _prefill_rate(backend, ids: list[int]) -> float:
    from ktcli.engine.backend import SamplingParams

    engine = backend.engine
    for _ in engine.generate([ids], SamplingParams(max_new_tokens=1), eos_ids=frozenset()):
        pass
    return len(ids) / engine.stats.prefill_s


def _text_ids(tokenizer, n: int) -> list[int]:
    return tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)[:n]


def _long_prompts(backend, n_prompts: int, tokens: int) -> list[list[int]]:
    """Chat prompts of a ~`tokens`-token tutorial section and a question."""
    words = TEXT.read_text(encoding="utf-8").split(" ")
    out = []
    for i in range(n_prompts):
        start = 3000 + i * 2500
        section = " ".join(words[start : start + int(tokens * 0.7)])
        out.append(backend.chat_ids([{"role": "user", "content": section + "\n\n" + QUESTIONS[i % len(QUESTIONS)]}]))
    return out


def _quality(ref, other, ids: list[int], prompts: list[list[int]], new_tokens: int) -> dict:
    from ktcli.engine.backend import SamplingParams

    target = torch.tensor(ids[1:])
    a, b = ref.prompt_logits(ids).float(), other.prompt_logits(ids).float()
    la, lb = torch.log_softmax(a[:-1], -1), torch.log_softmax(b[:-1], -1)
    ppl_a = float(torch.exp(torch.nn.functional.nll_loss(la, target)))
    ppl_b = float(torch.exp(torch.nn.functional.nll_loss(lb, target)))
    params = SamplingParams(max_new_tokens=new_tokens)
    same = total = 0
    for p in prompts:
        want, got = ref.generate_ids([p], params)[0], other.generate_ids([p], params)[0]
        same += sum(x == y for x, y in zip(want, got))
        total += len(want)
    return {
        "ppl": round(ppl_b, 4),
        "ppl_delta_pct": round(100 * (ppl_b / ppl_a - 1), 3),
        "kl_per_token": round(float((la.exp() * (la - lb)).sum(-1).mean()), 5),
        "max_rel_logit_l2": round(float(((b - a).norm(dim=-1) / a.norm(dim=-1)).max()), 4),
        "top1_agree": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 4),
        "greedy_match": round(same / max(total, 1), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object (it is always written)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ppl-tokens", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--name", default="prefill_dtype", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    from benchmarks.engine_vs_hf import _model_paths, _prompt_ids
    from ktcli.engine import amx_gemm, cpu_gemm
    from ktcli.engine.device import native_bf16_matmul

    _, folder = _model_paths()
    t0 = time.perf_counter()
    cpu = {name: bool(getattr(torch.cpu, f"_is_{name}_supported", lambda: False)()) for name in ("amx_tile", "avx512_bf16")}
    result = {"benchmark": "prefill_dtype", "machine": machine(), "cpu_flags": cpu,
              "bf16_prefill_by_default": native_bf16_matmul(), "fp32_gemm": "onednn" if cpu_gemm.available() else "mkl",
              "amx_gemm": amx_gemm.available(),
              "torch": torch.__version__, "baseline": "the same weights with fp32 wide steps", "weights": {}}
    exact = _load(folder, "fp32", "fp32")
    exact.engine.model.prefill_attn_dtype = torch.float32  # torch's fp32 flash kernel, not the AMX split
    ids = _text_ids(exact.tokenizer, args.ppl_tokens)
    prompts = _long_prompts(exact, args.prompts, args.prompt_tokens)
    result["quality_reference"] = "fp32 weights, fp32 prefill"
    for weights in ("int8", "bf16"):
        sides = ("fp32", "bf16", "bf16-onepass", "bf16-fp32attn") if amx_gemm.available() else ("fp32", "bf16")
        backends = {p: _load(folder, weights, p) for p in sides}
        rates: dict[str, dict[str, float]] = {p: {} for p in backends}
        with torch.inference_mode():
            for b in backends.values():
                _prefill_rate(b, _prompt_ids(64))  # warm-up
            for _ in range(args.rounds):
                for p, b in backends.items():
                    for n in LENGTHS:
                        r = _prefill_rate(b, _prompt_ids(n))
                        rates[p][str(n)] = max(rates[p].get(str(n), 0.0), r)
            print(f"{weights}: rates done", file=sys.stderr, flush=True)
            quality = {p: _quality(exact, b, ids, prompts, args.new_tokens) for p, b in backends.items()}
        result["weights"][weights] = {
            "prefill_tok_s": {p: {n: round(v, 1) for n, v in r.items()} for p, r in rates.items()},
            "bf16_over_fp32": {n: round(rates["bf16"][n] / rates["fp32"][n], 2) for n in rates["fp32"]},
            **({"bf16_over_onepass": {n: round(rates["bf16"][n] / rates["bf16-onepass"][n], 2) for n in rates["fp32"]}}
               if "bf16-onepass" in rates else {}),
            **({"fp32attn_over_bf16": {n: round(rates["bf16-fp32attn"][n] / rates["bf16"][n], 2) for n in rates["fp32"]}}
               if "bf16-fp32attn" in rates else {}),
            "quality": quality,
        }
        del backends
    result["ppl_tokens"], result["prompt_tokens"] = len(ids), [len(p) for p in prompts]
    result["seconds"] = round(time.perf_counter() - t0, 1)
    path = write_result(args.name, result)
    if args.json:
        print(json.dumps(result, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
