"""Time to first answer token of `ktcli ask` on a short sample doc, cold and warm.

    python -m benchmarks.startup --json

cold: an empty cache (the bundled GGUF is converted on this run); warm: the same command
again. TTFT is wall time from starting the process to the first byte of the answer on
stdout, as a user sees it. The baseline measured in the same run is the floor every
Python tool of this kind pays: importing torch and transformers in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, machine, run_cli, write_result

DOC = "sample_docs/minirepo/README.md"
QUESTION = "What does this project do?"


def import_floor_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, transformers"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--engine", default=None)
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()
    extra = ["--engine", args.engine] if args.engine else []
    cache = Path(tempfile.mkdtemp(prefix="ktcli-startup-"))
    env = {"KTCLI_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    cmd = ["ask", DOC, QUESTION, "--quiet", "--max-new-tokens", "32", *extra]
    try:
        floor = min(import_floor_s() for _ in range(2))
        _, cold_wall, cold_ttft, err = run_cli(cmd, env)
        warm = [run_cli(cmd, env)[:3] for _ in range(args.warm_runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    warm_ttft = sorted(w[2] for w in warm)[len(warm) // 2]
    result = {
        "benchmark": "startup", "machine": machine(), "doc": DOC, "engine": args.engine or "default",
        "cold_ttft_s": round(cold_ttft, 2), "cold_total_s": round(cold_wall, 2),
        "warm_ttft_s": round(warm_ttft, 2), "warm_ttft_runs_s": [round(w[2], 2) for w in warm],
        "warm_total_s": round(sorted(w[1] for w in warm)[len(warm) // 2], 2),
        "import_floor_s": round(floor, 2),
        "warm_over_import_floor": round(warm_ttft / floor, 2),
        "cold_over_warm": round(cold_ttft / warm_ttft, 2),
        "goal_warm_ttft_s": 5.0,
    }
    path = write_result("startup", result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
