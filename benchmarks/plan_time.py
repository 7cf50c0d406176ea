"""The planner's time formulas for prefill and decode at each length of a whole read
(`plan.estimates.prefill_seconds` / `decode_seconds`), against the real CLI's times: rates
kept without context and scaled by the read's length (`ContextCost`, the planner since
8bda0f5) versus the baseline, the rate measured at one length applied flat to every length
(as the planner before applied its one stored rate).

    python -m benchmarks.plan_time --json

Inputs: prefixes of the Python tutorial of about the token counts named, each read whole
(`ktcli ask --json --mode full`, the bundled model, CLI defaults, 64 new tokens at most,
the prompt cache off so every prompt is computed), one fresh process per run, the sizes
taking turns for `--rounds` rounds; each size keeps its best prefill and decode rate (the
machine's noise slows runs, it never speeds them). Both predictions start from the
shortest read's measured rates: the baseline keeps them as they are, the context model
turns them into rates without context and scales them back by each read's length, the
run's first prefill's setup (`FIRST_PREFILL_TOKENS`) kept apart; a second baseline, the
context model with that setup left in the rate, as it was until 2026-12-05. `ratio` =
predicted / measured seconds: 1 is right, under 1 the plan promised too little.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from benchmarks.common import arg_parser, machine, report, run_cli
from benchmarks.plan_memory import QUESTION_TUTORIAL, tutorial_prefix

SIZES = (512, 2000, 4000, 7000)
NEW_TOKENS = 64


def _facts():
    """SmolLM2 as the planner sees it run here (`prepare.planning_facts`)."""
    from ktcli.config import Settings
    from ktcli.pipeline.prepare import planning_facts

    return planning_facts(replace(Settings(), cache_dir=os.environ.get("KTCLI_CACHE_DIR", "")))


def main(argv: list[str] | None = None) -> dict:
    parser = arg_parser("plan_time", __doc__, "plan_time")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from ktcli.plan.estimates import NO_CONTEXT_COST, context_cost, decode_seconds, prefill_seconds, rates_without_context

    facts = _facts()
    cost = context_cost(facts, facts.kv_dtype)
    best: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="plan_time-") as tmp:
        folder = Path(tmp)
        paths = {n: tutorial_prefix(folder, n) for n in SIZES}
        env = {"KTCLI_PROMPT_CACHE": "0"}
        for _ in range(args.rounds):
            for n, path in paths.items():
                payload, _, _, err = run_cli(["ask", str(path), QUESTION_TUTORIAL, "--json", "--mode", "full",
                                              "--max-new-tokens", str(NEW_TOKENS)], env)
                if payload is None:
                    raise SystemExit(f"ktcli ask failed on {path.name}: {err[-500:]}")
                f = payload["figures"]
                row = best.setdefault(n, {"prompt_tokens": f["tokens_in"], "new_tokens": f["tokens_out"],
                                          "prefill_tok_s": 0.0, "decode_tok_s": 0.0})
                row["prefill_tok_s"] = max(row["prefill_tok_s"], f["prefill_tok_s"])
                row["decode_tok_s"] = max(row["decode_tok_s"], f["decode_tok_s"])
        shutil.rmtree(folder, ignore_errors=True)
    first = best[SIZES[0]]
    n0, k0 = first["prompt_tokens"], first["new_tokens"]
    r0p, r0d = rates_without_context(first["prefill_tok_s"], n0, n0 * n0, first["decode_tok_s"], k0,
                                     k0 * (n0 + k0 / 2), cost)
    # The context model before the first prefill's setup was kept apart (FIRST_PREFILL_TOKENS):
    # the shortest read's rate normalised by its context alone.
    r0p_setup_in_rate = first["prefill_tok_s"] * (n0 + cost.prefill * n0 * n0) / n0
    rows = []
    for n in SIZES:
        row = best[n]
        p, k = row["prompt_tokens"], row["new_tokens"]
        measured_prefill, measured_decode = p / row["prefill_tok_s"], k / row["decode_tok_s"]
        model_prefill, model_decode = prefill_seconds(p, r0p, cost), decode_seconds(p, k, r0d, cost)
        setup_in_rate = prefill_seconds(p, r0p_setup_in_rate, cost, first=False)
        flat_prefill = prefill_seconds(p, first["prefill_tok_s"], NO_CONTEXT_COST, first=False)
        flat_decode = decode_seconds(p, k, first["decode_tok_s"], NO_CONTEXT_COST)
        rows.append({**row, "size": n,
                     "prefill_ratio": {"context_model": round(model_prefill / measured_prefill, 3),
                                       "context_model_setup_in_rate": round(setup_in_rate / measured_prefill, 3),
                                       "baseline_flat": round(flat_prefill / measured_prefill, 3)},
                     "decode_ratio": {"context_model": round(model_decode / measured_decode, 3),
                                      "baseline_flat": round(flat_decode / measured_decode, 3)}})
    result = {"machine": machine(), "rounds": args.rounds, "new_tokens": NEW_TOKENS,
              "context_cost": {"prefill": cost.prefill, "decode": cost.decode}, "rows": rows}
    report(args.name, result, args.json)
    for r in rows:
        print(f"{r['prompt_tokens']:>6} tokens  prefill {r['prefill_tok_s']:7.0f} tok/s  ratio model "
              f"{r['prefill_ratio']['context_model']:.2f} (setup in the rate "
              f"{r['prefill_ratio']['context_model_setup_in_rate']:.2f}) flat {r['prefill_ratio']['baseline_flat']:.2f}   decode "
              f"{r['decode_tok_s']:6.1f} tok/s  ratio model {r['decode_ratio']['context_model']:.2f} flat "
              f"{r['decode_ratio']['baseline_flat']:.2f}")
    return result


if __name__ == "__main__":
    main()
