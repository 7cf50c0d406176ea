"""Whether a request's answer depends on the requests batched with it, and what keeping it
independent costs: the engine's rows by kernel (`Model._rows_by_kernel`) against the
kernel chosen by the step's total rows (KTCLI_NO_ROW_SPLIT=1, the behaviour before), same run.

    python -m benchmarks.batch_invariance --json

Bundled SmolLM2 on our engine, each mode in a process of its own:
- greedy: "What is 7 plus 8?" alone, then 2, 4 and 8 copies in one batch (16 tokens);
- seeded: a sampled request (temperature 0.9, seed 1003) alone and beside a 300-token prompt;
- cost: 8 different short prompts prefilled together (1 new token), median of 7.
A session probe (2026-12-05) found both answers changed by their company on the AMX Xeon:
a step past 128 rows put every prompt in it through one-pass bf16 products.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

from benchmarks.common import machine, report

_CHILD = """
import json, statistics, sys, time
from ktcli.config import load_settings
from ktcli.engine.backend import SamplingParams
from ktcli.engine.loading import load_backend
b = load_backend(load_settings({"model": "smollm2", "prompt_cache": False}), lambda s: None)
greedy = SamplingParams(max_new_tokens=16)
ask = [{"role": "user", "content": "What is 7 plus 8?"}]
alone = b.generate_chat_batch([ask], greedy)[0]
copies = {n: sum(o == alone for o in b.generate_chat_batch([ask] * n, greedy)) for n in (2, 4, 8)}
seeded = SamplingParams(max_new_tokens=20, temperature=0.9, seed=1003)
topic = [{"role": "user", "content": "Tell me about topic 3"}]
long = [{"role": "user", "content": "Describe the harbour in detail. " * 30}]
seeded_alone = b.generate_chat_batch([topic], seeded)[0]
seeded_beside = b.generate_chat_batch([topic, long], seeded)[0]
one = SamplingParams(max_new_tokens=1)
shorts = [[{"role": "user", "content": f"Question {i}: what is {i} plus {i + 7}? Explain your working in a few steps."}]
          for i in range(8)]
b.generate_chat_batch(shorts, one)
times = []
for _ in range(7):
    t = time.perf_counter()
    b.generate_chat_batch(shorts, one)
    times.append(time.perf_counter() - t)
print(json.dumps({"greedy_alone": alone, "greedy_copies_same": copies, "seeded_alone": seeded_alone,
                  "seeded_beside_long": seeded_beside, "seeded_same": seeded_alone == seeded_beside,
                  "prefill_8_short_s": statistics.median(times), "amx": b.engine.model._amx}))
"""


def run(no_split: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KTCLI_NO_ROW_SPLIT"}
    if no_split:
        env["KTCLI_NO_ROW_SPLIT"] = "1"
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    by_rows, by_step = run(no_split=False), run(no_split=True)
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "rows_by_kernel": by_rows,
        "kernel_by_step_total (KTCLI_NO_ROW_SPLIT=1, before)": by_step,
        "prefill_8_short_ratio": round(by_rows["prefill_8_short_s"] / by_step["prefill_8_short_s"], 3),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    for name, r in (("rows by kernel", by_rows), ("kernel by step total", by_step)):
        print(f"{name}: greedy copies matching alone {r['greedy_copies_same']}, seeded beside a long prompt "
              f"{'same' if r['seeded_same'] else 'changed'}, 8 short prompts prefilled in {r['prefill_8_short_s']:.3f} s")
    report("batch_invariance", result, args.json)


if __name__ == "__main__":
    main()
