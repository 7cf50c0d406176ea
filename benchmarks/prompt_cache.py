"""Time to first answer token of a second question about the same input, with the prompt
K/V store (`engine.prefix_store`) against without it, through the real CLI.

    python -m benchmarks.prompt_cache --json

Inputs read whole: the sample PDF (~2.1K tokens) and the first part of the Python tutorial
(~6.5K tokens, near the bundled model's 8K window) in the model's window (`--mode full`);
a longer part of the tutorial (~16K tokens) past it (`--mode sparse`, whose int8 pages the
store keeps in whole prefill chunks); and, only when named with `--cases`, the whole
tutorial (~79K tokens, sparse; each cold read takes minutes). Per repetition and input,
interleaved so drift on a noisy machine hits both sides alike:
  - baseline: `KTCLI_PROMPT_CACHE=0`, the first and the second question;
  - store: an empty `prompts/`, the first question (it computes and writes the prompt's
    K/V: "cold") then the second (it reads them back: "warm").
"ttft_s" is wall time from starting the process to the first byte on stdout; under --json,
which this script runs, that is the JSON object, printed once the answer is done (and, on a
cold run, its entry written): the time to the whole answer, model load included. The
pipeline's own time to the first answer token is "engine_ttft_s". Also recorded: whether
the warm answer equals the
baseline's answer to the same question, the tokens read back, and the entry's size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import platformdirs

from benchmarks.common import ROOT, machine, report, run_cli

PDF = "sample_docs/harbor-light-annual-report-2023.pdf"
TUTORIAL = ROOT / "sample_docs" / "python-tutorial-3.11.rst"
TUTORIAL_QUESTIONS = ["How do you start the interpreter?", "What does the pass statement do?"]
# name: (input: a path, or the tutorial's first N lines; --mode; the first and second question)
CASES = {
    "pdf": (PDF, "full", ["What was net income for the year?", "Who is the chair of the board?"]),
    # ~6.5K tokens of the bundled model: the whole prompt fits its 8K window
    "tutorial-6k": (560, "full", TUTORIAL_QUESTIONS),
    "tutorial-sparse-16k": (1450, "sparse", TUTORIAL_QUESTIONS),
    "tutorial-sparse-79k": (None, "sparse", TUTORIAL_QUESTIONS),
}
DEFAULT_CASES = "pdf,tutorial-6k,tutorial-sparse-16k"


def shared_cache(base: Path) -> Path:
    """A fresh cache that borrows the user cache's converted model and packed weights."""
    cache = base / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    user = Path(os.environ.get("KTCLI_CACHE_DIR") or platformdirs.user_cache_dir("ktcli"))
    for name in ("models", "packed"):
        (user / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(user / name)
    return cache


def ask(path: str, mode: str, question: str, cache: Path, store: bool) -> dict:
    env = {"KTCLI_CACHE_DIR": str(cache), "KTCLI_PROMPT_CACHE": "1" if store else "0", "HF_HUB_OFFLINE": "1"}
    payload, wall, ttft, err = run_cli(["ask", path, question, "--mode", mode, "--json", "--max-new-tokens", "48"], env)
    if payload is None:
        raise SystemExit(f"ktcli failed: {err[-2000:]}")
    f = payload["figures"]
    return {"ttft_s": round(ttft, 3), "wall_s": round(wall, 3), "answer": payload["answer"],
            "tokens_in": f.get("tokens_in"), "reused_tokens": f.get("reused_tokens", 0),
            "kept_tokens": f.get("kept_tokens", 0), "engine_ttft_s": f.get("ttft_s")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="also print the result object")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default="prompt_cache")
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of: {', '.join(CASES)}")
    args = parser.parse_args(argv)
    cases = {name: CASES[name] for name in args.cases.split(",")}

    runs: dict[str, list[dict]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = shared_cache(tmp)
        for rep in range(args.reps):
            for name, (source, mode, (first, second)) in cases.items():
                path = source if isinstance(source, str) else str(TUTORIAL)
                if isinstance(source, int):  # the tutorial's first lines
                    path = str(tmp / f"tutorial-{source}-lines.rst")
                    lines = TUTORIAL.read_text(encoding="utf-8").split("\n")[:source]
                    Path(path).write_text("\n".join(lines), encoding="utf-8")
                shutil.rmtree(cache / "prompts", ignore_errors=True)
                row = {"baseline_first": ask(path, mode, first, cache, store=False),
                       "baseline_second": ask(path, mode, second, cache, store=False),
                       "store_cold": ask(path, mode, first, cache, store=True),
                       "store_warm": ask(path, mode, second, cache, store=True)}
                row["entry_bytes"] = sum(p.stat().st_size for p in (cache / "prompts").rglob("*.kv"))
                runs[name].append(row)
                print(f"rep {rep + 1} {name}: second question TTFT {row['baseline_second']['ttft_s']:.2f} s without "
                      f"the store, {row['store_warm']['ttft_s']:.2f} s with it ({row['store_warm']['reused_tokens']:,} "
                      f"of {row['store_warm']['tokens_in']:,} tokens read back); first question "
                      f"{row['baseline_first']['ttft_s']:.2f} s -> {row['store_cold']['ttft_s']:.2f} s", flush=True)

    summary = {}
    for name, rows in runs.items():
        def med(side: str, key: str = "ttft_s") -> float:
            return round(statistics.median(r[side][key] for r in rows), 3)

        summary[name] = {
            "mode": cases[name][1],
            "tokens_in": rows[0]["store_warm"]["tokens_in"],
            "reused_tokens": rows[0]["store_warm"]["reused_tokens"],
            "entry_bytes": rows[0]["entry_bytes"],
            "second_ttft_baseline_s": med("baseline_second"), "second_ttft_store_s": med("store_warm"),
            "second_ttft_speedup": round(med("baseline_second") / med("store_warm"), 2),
            "first_ttft_baseline_s": med("baseline_first"), "first_ttft_store_s": med("store_cold"),
            "first_ttft_cost": round(med("store_cold") / med("baseline_first"), 3),
            "second_first_token_baseline_s": med("baseline_second", "engine_ttft_s"),
            "second_first_token_store_s": med("store_warm", "engine_ttft_s"),
            "same_answers": sum(r["store_warm"]["answer"] == r["baseline_second"]["answer"] for r in rows),
            "reps": len(rows),
        }
        s = summary[name]
        print(f"{name}: second question TTFT {s['second_ttft_baseline_s']} s -> {s['second_ttft_store_s']} s "
              f"({s['second_ttft_speedup']}x); first question {s['first_ttft_baseline_s']} s -> "
              f"{s['first_ttft_store_s']} s ({s['first_ttft_cost']}x, writing the entry); same answer "
              f"{s['same_answers']}/{s['reps']}; entry {s['entry_bytes'] / 2**20:.0f} MiB")
    report(args.name, {"benchmark": "prompt_cache", "machine": machine(), "summary": summary, "runs": runs}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
