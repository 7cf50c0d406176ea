"""Time to first answer token of `ktcli ask`, cold and warm, on a short sample doc (the
whole doc in the prompt) and on the long tutorial (retrieval: the question is embedded).

    python -m benchmarks.startup --json

cold: an empty cache (the bundled GGUF is converted on this run; for the long doc, its
chunks are embedded); warm: the same command again. TTFT is wall time from starting the
process to the first byte of the answer on stdout, as a user sees it. Baselines measured
in the same run: the floor every Python tool of this kind pays (importing torch and
transformers in a fresh interpreter), and, for the question's embedding, the time
sentence-transformers takes in a fresh interpreter to give its first vector against ours.
`ktcli plan` (a dry run) on the long doc is timed against importing torch alone: the plan
imports no torch (the page format's byte figures live in `kernels.page_format`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, machine, run_cli, write_result

DOC = "sample_docs/minirepo/README.md"
QUESTION = "What does this project do?"
LONG_DOC = "sample_docs/python-tutorial-3.11.rst"
LONG_QUESTION = "How do you define a function with default argument values?"

OUR_FIRST_VECTOR = (
    "from ktcli.retrieval.embedder import Embedder; Embedder('minilm').embed_query('a question')"
)
ST_FIRST_VECTOR = (
    "from ktcli.retrieval.embedder import bundled_model_dir; "
    "from sentence_transformers import SentenceTransformer; "
    "SentenceTransformer(str(bundled_model_dir()), device='cpu', local_files_only=True).encode(['a question'])"
)


def fresh_python_s(code: str) -> float:
    """Wall time of `code` in a fresh interpreter, startup included."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--engine", default=None)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--name", default="startup", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    extra = ["--engine", args.engine] if args.engine else []
    cache = Path(tempfile.mkdtemp(prefix="ktcli-startup-"))
    env = {"KTCLI_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    cmd = ["ask", DOC, QUESTION, "--quiet", "--max-new-tokens", "32", *extra]
    long_cmd = ["ask", LONG_DOC, LONG_QUESTION, "--quiet", "--max-new-tokens", "32", *extra]
    try:
        floor = min(fresh_python_s("import torch, transformers") for _ in range(2))
        _, cold_wall, cold_ttft, err = run_cli(cmd, env)
        warm = [run_cli(cmd, env)[:3] for _ in range(args.warm_runs)]
        _, _, long_cold_ttft, _ = run_cli(long_cmd, env)
        long_warm = [run_cli(long_cmd, env)[2] for _ in range(args.warm_runs)]
        plan = [run_cli(["plan", LONG_DOC, LONG_QUESTION, *extra], env)[1] for _ in range(args.warm_runs)]
        torch_floor = min(fresh_python_s("import torch") for _ in range(2))
        ours = [fresh_python_s(OUR_FIRST_VECTOR) for _ in range(2)]
        theirs = [fresh_python_s(ST_FIRST_VECTOR) for _ in range(2)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    warm_ttft = median([w[2] for w in warm])
    result = {
        "benchmark": "startup", "machine": machine(), "doc": DOC, "engine": args.engine or "default",
        "cold_ttft_s": round(cold_ttft, 2), "cold_total_s": round(cold_wall, 2),
        "warm_ttft_s": round(warm_ttft, 2), "warm_ttft_runs_s": [round(w[2], 2) for w in warm],
        "warm_total_s": round(median([w[1] for w in warm]), 2),
        "import_floor_s": round(floor, 2),
        "warm_over_import_floor": round(warm_ttft / floor, 2),
        "cold_over_warm": round(cold_ttft / warm_ttft, 2),
        "goal_warm_ttft_s": 5.0,
        "long_doc": LONG_DOC,
        "long_cold_ttft_s": round(long_cold_ttft, 2),
        "long_warm_ttft_s": round(median(long_warm), 2),
        "long_warm_ttft_runs_s": [round(t, 2) for t in long_warm],
        "plan_long_doc_s": round(median(plan), 2), "plan_runs_s": [round(t, 2) for t in plan],
        "import_torch_s": round(torch_floor, 2), "plan_over_import_torch": round(median(plan) / torch_floor, 2),
        "first_vector_s": {"ktcli": round(min(ours), 2), "sentence_transformers": round(min(theirs), 2)},
        "first_vector_speedup": round(min(theirs) / min(ours), 2),
    }
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
