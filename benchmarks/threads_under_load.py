"""`ktcli ask` with other processes busy: threads chosen by measurement against fixed counts.

    python -m benchmarks.threads_under_load --json [--reps 2]

The README's question on the sample PDF, one fresh `ktcli ask --json` process per run,
with 0, 1 or 2 busy processes beside it (a pure-Python loop each, the kind of company a
laptop or a shared CI runner has). Configurations, interleaved run by run in the same
session:

- `--threads 2` fixed: the old default (torch's: one thread per core on this machine),
  the baseline;
- `--threads 1` fixed;
- the default now: `engine.threads.ThreadGovernor` times decode steps and picks the count.

Figures per run: wall seconds, time to first token, decode tok/s, the thread count the
run ended on; the table gives the median over `--reps` and the ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.common import ROOT, machine, report, run_cli

PDF = ROOT / "sample_docs" / "harbor-light-annual-report-2023.pdf"
QUESTION = "What was the revenue in the third quarter?"
CONFIGS = {"--threads 2 (baseline)": ["--threads", "2"], "--threads 1": ["--threads", "1"], "governor (default)": []}
SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def busy(n: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=seconds)]) for _ in range(n)]


def one_run(extra: list[str]) -> dict:
    payload, wall, _, err = run_cli(["ask", str(PDF), QUESTION, "--json", "--max-new-tokens", "96", *extra], env={},
                                    timeout=900)
    if payload is None:
        return {"error": err.strip().splitlines()[-1] if err.strip() else "no output"}
    f = payload["figures"]
    return {"wall_s": round(wall, 2), "ttft_s": f.get("ttft_s"), "decode_tok_s": f.get("decode_tok_s"),
            "tokens_out": f.get("tokens_out"), "threads_end": f.get("threads"), "switches": f.get("thread_switches")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object (it is always written)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--loads", default="0,1,2", help="busy processes beside each run, comma-separated")
    parser.add_argument("--name", default="threads_under_load", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args(argv)

    one_run([])  # warm the caches (converted model, packed weights) outside the figures
    result: dict = {"machine": machine(), "baseline": "--threads 2 (the old default: one thread per core)",
                    "question": QUESTION, "loads": {}}
    for load in (int(x) for x in args.loads.split(",")):
        runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        for _ in range(args.reps):
            for name, extra in CONFIGS.items():
                spinners = busy(load, 900)
                time.sleep(0.5 if load else 0)
                try:
                    runs[name].append(one_run(extra))
                finally:
                    for p in spinners:
                        p.kill()
                        p.wait()
                print(f"load {load} {name:24s} {json.dumps(runs[name][-1])}", flush=True)
        table = {}
        for name, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            if not ok:
                table[name] = {"error": rs[-1].get("error")}
                continue
            table[name] = {k: statistics.median(r[k] for r in ok) for k in ("wall_s", "ttft_s", "decode_tok_s")}
            table[name]["threads_end"] = [r["threads_end"] for r in ok]
        base = table.get("--threads 2 (baseline)", {})
        for name, row in table.items():
            if "wall_s" in row and "wall_s" in base:
                row["wall_speedup"] = round(base["wall_s"] / row["wall_s"], 2)
                row["decode_speedup"] = round(row["decode_tok_s"] / base["decode_tok_s"], 2) if base["decode_tok_s"] else None
        result["loads"][str(load)] = {"runs": runs, "median": table}
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
