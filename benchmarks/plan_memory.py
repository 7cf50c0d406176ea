"""The planner's memory estimate against the real CLI's peak RSS, per mode.

    python -m benchmarks.plan_memory --json

The estimate is what `ktcli plan` shows and what the planner holds against `--max-memory`
(and, without it, against 80% of the free RAM); the baseline each figure is compared with
is that estimate, from the same run (`plan.est_memory_bytes` of `ktcli ask --json`).
The measure is the process's peak resident set (`figures.peak_rss_mb`, getrusage), one
fresh process per case, cases run one after another. Each row also gives the plan's time
to the first token and in all against the run's (`ttft_s`, `total_s`); those depend on
the machine's load, unlike the memory. `ratio` = peak / estimate: above 1
the planner promised less memory than the run took, which `--max-memory` users rely on.

Inputs: the sample PDF (the README's command), and prefixes of the Python tutorial
(sample_docs/python-tutorial-3.11.rst) cut at whole lines to about the token counts
named (ktcli's token estimate); `summary-parts-16k` summarizes a prefix in parts, with the
prompt cache and notes memo off so every part is read. Every case but `first-run-pdf` (an empty cache folder of
its own: the GGUF converted and its weights packed first) uses ktcli's cache folder as
set (the converted model, packed weights); the retrieval case reads the whole tutorial under a
first line of its own, so its index is built afresh (every chunk embedded) in each run.
Peak RSS does not depend on the machine's load, so unlike the speed benchmarks this one
tolerates company.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, machine, run_cli, write_result

PDF = ROOT / "sample_docs" / "harbor-light-annual-report-2023.pdf"
TUTORIAL = ROOT / "sample_docs" / "python-tutorial-3.11.rst"
QUESTION_PDF = "What was the revenue in the third quarter?"
QUESTION_TUTORIAL = "What does the tutorial say about list comprehensions?"

# name -> (input: "pdf" or a tutorial prefix in tokens, extra CLI options)
CASES = {
    "full-pdf": ("pdf", []),
    "full-6k": (6000, ["--mode", "full"]),
    "full-6k-int8-pages": (6000, ["--mode", "full", "--kv-dtype", "int8"]),
    "retrieval-whole": ("whole", ["--mode", "retrieval"]),
    "sparse-int4-16k": (16000, ["--mode", "sparse", "--kv-dtype", "int4", "--attention", "topk"]),
    "sparse-int8-16k": (16000, ["--mode", "sparse", "--kv-dtype", "int8", "--attention", "topk"]),
    "sparse-int4-32k": (32000, ["--mode", "sparse", "--kv-dtype", "int4", "--attention", "topk"]),
    # A cache folder of its own, empty: the run converts the GGUF and packs its weights first.
    "first-run-pdf": ("pdf", ["--cache-dir", "{fresh_cache}"]),
    # `ktcli summarize` read in parts (3 windows), every part's notes written (no notes memo)
    "summary-parts-16k": (16000, ["summarize"]),
}
# Runs with the prompt cache and notes memo off: each part is read, not read back.
_UNCACHED = {"summary-parts-16k"}


def tutorial_prefix(folder: Path, tokens: int) -> Path:
    """The tutorial's first lines up to about `tokens` estimated tokens, as a file."""
    from ktcli.ingest import count_tokens

    lines = TUTORIAL.read_text(encoding="utf-8").splitlines(keepends=True)
    lo, hi = 1, len(lines)
    while lo < hi:  # the fewest lines reaching the count (binary search: counting is not free)
        mid = (lo + hi) // 2
        if count_tokens("".join(lines[:mid])) >= tokens:
            hi = mid
        else:
            lo = mid + 1
    path = folder / f"tutorial-{tokens // 1000}k.rst"
    path.write_text("".join(lines[:lo]), encoding="utf-8")
    return path


def run_case(name: str, folder: Path, new_tokens: int) -> dict:
    source, options = CASES[name]
    if source == "pdf":
        path, question = PDF, QUESTION_PDF
    elif source == "whole":
        # A copy under a line of its own, so the index is cold: the run embeds every chunk.
        path, question = folder / "tutorial-whole.rst", QUESTION_TUTORIAL
        path.write_text(f".. plan_memory run {time.time_ns()}\n\n" + TUTORIAL.read_text(encoding="utf-8"), encoding="utf-8")
    else:
        path, question = tutorial_prefix(folder, int(source)), QUESTION_TUTORIAL
    options = [o.replace("{fresh_cache}", str(folder / f"cache-{time.time_ns()}")) for o in options]
    if options[:1] == ["summarize"]:
        args = ["summarize", str(path), "--json", "--max-new-tokens", str(new_tokens), *options[1:]]
    else:
        args = ["ask", str(path), question, "--json", "--max-new-tokens", str(new_tokens), *options]
    payload, wall, _first, err = run_cli(args, {"KTCLI_PROMPT_CACHE": "0"} if name in _UNCACHED else {})
    if payload is None:
        tail = err.strip().splitlines()[-1:] or ["no output"]
        return {"case": name, "error": tail[0][:300]}
    plan, figures = payload["plan"], payload["figures"]
    estimate_mb = plan["est_memory_bytes"] / 2**20
    peak_mb = figures["peak_rss_mb"]
    return {"case": name, "mode": plan["mode"], "kv_dtype": plan.get("kv_dtype"), "tokens_in": figures.get("tokens_in"),
            "estimate_mb": round(estimate_mb, 1), "peak_rss_mb": round(peak_mb, 1),
            "ratio": round(peak_mb / estimate_mb, 3) if estimate_mb else None,
            "kv_bytes_allocated_mb": round(figures.get("kv_bytes_allocated", 0) / 2**20, 1),
            "weight_mb": round(figures.get("weight_bytes", 0) / 2**20, 1), "wall_s": round(wall, 1),
            # The plan's times against the run's (noisy: other jobs slow a run, not its plan).
            "est_first_token_s": plan.get("est_first_token_seconds"), "ttft_s": figures.get("ttft_s"),
            "est_seconds": plan["est_seconds"], "total_s": figures.get("total_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--name", default="plan_memory")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            row = run_case(name, Path(tmp), args.new_tokens)
            rows.append(row)
            if "error" in row:
                print(f"{name:22s} error: {row['error']}")
            else:
                print(f"{name:22s} {row['mode']:9s} {row['tokens_in'] or 0:>7,} tokens  estimate {row['estimate_mb']:7.1f} MB"
                      f"  peak {row['peak_rss_mb']:7.1f} MB  peak/estimate {row['ratio']:.2f}"
                      f"  first token {row['ttft_s']:.1f} s (est {row['est_first_token_s']:.1f})"
                      f"  total {row['total_s']:.1f} s (est {row['est_seconds']:.1f})", flush=True)
    result = {"benchmark": "plan_memory", "machine": machine(), "new_tokens": args.new_tokens,
              "baseline": "the plan's est_memory_bytes of the same run", "rows": rows}
    path = write_result(args.name, result)
    if args.json:
        print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
