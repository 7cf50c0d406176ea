"""Needle in a haystack through the real CLI: 8K, 100K and 1M tokens, several depths.

    python -m benchmarks.needle --json [--lengths 8000,100000,1000000] [--depths 0.1,0.5,0.9]

The haystack is a folder of ~10K-token files of shuffled paragraphs from the long sample
text; one sentence (the needle) is planted at each depth in turn. The first run at each
length starts from an empty cache (its indexing time is `index_s`); later depths move the
needle, so only the one or two files that changed are re-indexed.
Per length: found (share of answers containing the fact), recall_at_k (share whose
retrieved evidence holds the needle line), index_s, answer_s (median wall time of a run
on a warm index), peak_rss_mb (largest over the runs).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, machine, run_cli, write_result

NEEDLE = "The secret passphrase for the lighthouse archive is MARIGOLD-4417."
QUESTION = "What is the secret passphrase for the lighthouse archive?"
FACT = "MARIGOLD-4417"
FILE_TOKENS = 10_000
FILLER = ROOT / "sample_docs"


def filler_paragraphs() -> list[str]:
    texts = sorted(FILLER.glob("*.txt"), key=lambda p: p.stat().st_size, reverse=True)
    if not texts:
        sys.exit("no long .txt in sample_docs/ to build haystacks from")
    paragraphs = [p.strip() for p in texts[0].read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 40]
    return [p for p in paragraphs if FACT not in p]


def build_haystack(folder: Path, total_tokens: int, seed: int) -> list[Path]:
    from ktcli.ingest import count_tokens

    rng = random.Random(seed)
    paragraphs = filler_paragraphs()
    sizes = [count_tokens(p) for p in paragraphs]
    files: list[Path] = []
    remaining = total_tokens
    index = 0
    while remaining > 0:
        target = min(FILE_TOKENS, remaining)
        order = list(range(len(paragraphs)))
        rng.shuffle(order)
        chosen, used = [], 0
        for i in order * 4:
            if used >= target:
                break
            chosen.append(paragraphs[i])
            used += sizes[i]
        path = folder / f"part_{index:04d}.txt"
        path.write_text(f"Part {index}\n\n" + "\n\n".join(chosen) + "\n", encoding="utf-8")
        files.append(path)
        remaining -= used
        index += 1
    return files


def plant(files: list[Path], depth: float) -> tuple[Path, int, str]:
    """Insert the needle at `depth` of the haystack; return (file, line number, original)."""
    target = files[min(int(depth * len(files)), len(files) - 1)]
    original = target.read_text(encoding="utf-8")
    lines = original.split("\n")
    local = depth * len(files) - int(depth * len(files)) if len(files) > 1 else depth
    at = max(1, min(int(local * len(lines)), len(lines) - 1))
    while at < len(lines) - 1 and lines[at - 1].strip():
        at += 1  # start of a paragraph, so the needle stands as its own line
    lines.insert(at, NEEDLE)
    target.write_text("\n".join(lines), encoding="utf-8")
    return target, at + 1, original


def needle_retrieved(payload: dict, path: Path, line: int) -> bool:
    for ev in payload.get("figures", {}).get("evidence", []):
        if ev.get("path", "").endswith(path.name) and ev["line_start"] <= line <= ev["line_end"]:
            return True
    return False


def run_length(tokens: int, depths: list[float], extra_args: list[str]) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"ktcli-needle-{tokens}-"))
    try:
        hay = work / "haystack"
        hay.mkdir()
        files = build_haystack(hay, tokens, seed=tokens)
        env = {"KTCLI_CACHE_DIR": str(work / "cache"), "HF_HUB_OFFLINE": "1"}
        models = Path(_user_cache()) / "models"
        if models.is_dir():  # share the converted model, not the index
            (work / "cache").mkdir()
            (work / "cache" / "models").symlink_to(models)
        runs = []
        for i, depth in enumerate(depths):
            path, line, original = plant(files, depth)
            payload, wall, _, err = run_cli(["ask", str(hay), QUESTION, "--json", "--quiet", *extra_args], env)
            path.write_text(original, encoding="utf-8")
            if payload is None:
                runs.append({"depth": depth, "error": err.strip().splitlines()[-1:] or ["no output"]})
                continue
            fig = payload["figures"]
            runs.append({
                "depth": depth, "found": FACT.lower() in payload["answer"].lower(),
                "retrieved": needle_retrieved(payload, path, line), "mode": payload["plan"]["mode"],
                "index_s": fig.get("index_s", 0.0), "wall_s": round(wall, 2),
                "peak_rss_mb": fig.get("peak_rss_mb", 0.0), "answer": payload["answer"][:200],
                "embedded_now": fig.get("embedded_now"), "reused": fig.get("reused"), "cold": i == 0,
            })
        ok = [r for r in runs if "error" not in r]
        warm = [r["wall_s"] for r in ok if not r["cold"]] or [r["wall_s"] for r in ok]
        return {
            "tokens": tokens, "files": len(files),
            "found": round(sum(r["found"] for r in ok) / len(runs), 3),
            "recall_at_k": round(sum(r["retrieved"] for r in ok) / len(runs), 3),
            "index_s": ok[0]["index_s"] if ok else None,
            "answer_s": round(statistics.median(warm), 2) if warm else None,
            "peak_rss_mb": max((r["peak_rss_mb"] for r in ok), default=None),
            "runs": runs,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _user_cache() -> str:
    from ktcli.config import load_settings

    return str(load_settings().cache_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object")
    parser.add_argument("--lengths", default="8000,100000,1000000")
    parser.add_argument("--depths", default="0.1,0.5,0.9")
    parser.add_argument("--engine", default=None)
    args = parser.parse_args()
    extra = ["--engine", args.engine] if args.engine else []
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = [float(x) for x in args.depths.split(",")]
    result = {"benchmark": "needle", "machine": machine(), "question": QUESTION, "needle": NEEDLE,
              "depths": depths, "lengths": {}}
    for tokens in lengths:
        print(f"needle: {tokens:,} tokens...", file=sys.stderr, flush=True)
        result["lengths"][str(tokens)] = run_length(tokens, depths, extra)
    path = write_result("needle", result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
