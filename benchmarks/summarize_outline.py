"""`ktcli summarize` of a code folder: code files read as outlines against every line.

    python -m benchmarks.summarize_outline --json [--corpora kernels,ktcli]

Baseline, in the same run, on the same copy of each folder: `--outline never` (every
line read, windows mapped with running notes, then reduced). Against it: `--outline
always` (code files read as outlines, `ingest.outline`; what `auto` picks when reading
every line would exceed the time budget). One fresh `ktcli summarize --json` process per
case, the bundled model with the CLI's defaults, cases one after another.

Figures per case: wall seconds (ratio against the baseline), tokens the model read,
windows, and the plan's estimate (so the planner's time estimate is checked too). The
summaries are kept in the results. Their quality is the bundled 135M model's; as a crude,
mechanical measure of coverage the script counts the corpus's names (modules, classes,
functions: every name an outline shows) that each summary mentions. It is a count of
names, not a judgement of the summary: read the texts.

Corpora are copies of this repository's own folders (`kernels/`, ~48K tiktoken tokens in
12 files; `ktcli/`, ~227K in 89), taken at the commit the results record.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, machine, report, run_cli

CORPORA = {"kernels": "kernels", "ktcli": "ktcli"}
SIDES = {"every line (baseline)": "never", "outlines": "always"}
NAME = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)", re.M)


def corpus_names(folder: Path) -> set[str]:
    """Module stems and class/function names of the folder's Python files (private ones
    too: a summary that names them saw them)."""
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        if path.stem != "__init__":
            names.add(path.stem)
        names.update(n for n in NAME.findall(path.read_text(encoding="utf-8")) if len(n) > 3)
    return names


def named(summary: str, names: set[str]) -> list[str]:
    return sorted(n for n in names if re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", summary))


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def run_case(folder: Path, outline: str, names: set[str]) -> dict:
    payload, wall, _, err = run_cli(["summarize", str(folder), "--json", "--outline", outline], env={})
    if payload is None:
        return {"error": err.strip().splitlines()[-1] if err.strip() else "no output", "wall_s": round(wall, 1)}
    plan, figures = payload["plan"], payload["figures"]
    hits = named(payload["answer"], names)
    return {
        "wall_s": round(wall, 1),
        "est_seconds": plan["est_seconds"],
        "mode": plan["mode"],
        "input_tokens": plan["input_tokens"],
        "read_tokens": plan["read_tokens"] or plan["input_tokens"],
        "outline_files": plan["outline_files"],
        "windows": figures.get("windows"),
        "tokens_in": figures.get("tokens_in"),
        "tokens_out": figures.get("tokens_out"),
        "names_mentioned": len(hits),
        "names": hits,
        "summary": payload["answer"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object (it is always written)")
    parser.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated, of {', '.join(CORPORA)}")
    parser.add_argument("--name", default="summarize_outline", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args(argv)

    result: dict = {"machine": machine(), "commit": commit(), "baseline": "--outline never (every line read)",
                    "corpora": {}}
    with tempfile.TemporaryDirectory(prefix="ktcli-sumbench-") as tmp:
        for name in args.corpora.split(","):
            folder = Path(tmp) / name
            shutil.copytree(ROOT / CORPORA[name], folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            names = corpus_names(folder)
            cases = {}
            for side, outline in SIDES.items():
                cases[side] = run_case(folder, outline, names)
                print(f"{name:8s} {side:22s} {json.dumps({k: v for k, v in cases[side].items() if k not in ('summary', 'names')})}",
                      flush=True)
            base, out = cases["every line (baseline)"], cases["outlines"]
            if "error" not in base and "error" not in out:
                cases["speedup"] = round(base["wall_s"] / out["wall_s"], 2)
            result["corpora"][name] = {"names_in_corpus": len(names), "cases": cases}
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
