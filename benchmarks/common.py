"""What every benchmark shares: machine facts, writing results, running the real CLI."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict:
    try:
        import psutil

        mem_gb = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # noqa: BLE001
        mem_gb = None
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "memory_gb": mem_gb, "python": platform.python_version(),
            "platform": platform.platform()}


def arg_parser(module: str, doc: str, name: str) -> "argparse.ArgumentParser":
    """The options every benchmark takes: --json, and --name for its results file."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc.strip().split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON too (it is always written)")
    parser.add_argument("--name", default=name, help="results file name (benchmarks/results/NAME.json)")
    return parser


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def report(name: str, result: dict, as_json: bool) -> dict:
    """Write the results file, say where, and print the object when --json asks."""
    path = write_result(name, result)
    print(f"wrote {path}")
    if as_json:
        print(json.dumps(result, indent=2))
    return result


def ktcli_cmd() -> list[str]:
    return [sys.executable, "-m", "ktcli.cli.app"]


def run_cli(args: list[str], env: dict[str, str], timeout: float = 3600) -> tuple[dict | None, float, float, str]:
    """Run ktcli with --json; returns (payload, wall seconds, seconds to first stdout byte, stderr)."""
    start = time.perf_counter()
    # unbuffered: a buffered read(1) would swallow bytes that communicate() then never sees
    proc = subprocess.Popen(ktcli_cmd() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                            env={**os.environ, **env}, cwd=ROOT)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    first_byte_s = time.perf_counter() - start
    rest, err = proc.communicate(timeout=timeout)
    wall = time.perf_counter() - start
    out = (first + rest).decode("utf-8", "replace")
    try:
        payload = json.loads(out) if "--json" in args else None
    except ValueError:
        payload = None
    return payload, wall, first_byte_s, err.decode("utf-8", "replace")


def kernel_bench_args(doc: str, name: str, argv: list[str] | None):
    """The options every kernel micro-benchmark takes: --json, --reps, --name."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object (it is always written)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default=name, help="results file name (benchmarks/results/NAME.json)")
    return parser.parse_args(argv)


def best_alternating(sides: dict, reps: int) -> dict[str, float]:
    """Each side's best wall time over `reps` rounds, the sides taking turns in every round
    (so the machine's drift reaches all of them)."""
    import time

    best = {s: float("inf") for s in sides}
    for _ in range(reps):
        for s, fn in sides.items():
            t = time.perf_counter()
            fn()
            best[s] = min(best[s], time.perf_counter() - t)
    return best


def side_figures(best: dict[str, float], flops: float, err: dict[str, float], err_name: str, digits: int = 2) -> dict:
    """A kernel table row's per-side figures: ms, GFLOPS and the error under `err_name`."""
    return {
        "ms": {s: round(t * 1e3, digits) for s, t in best.items()},
        "gflops": {s: round(flops / t / 1e9, 1) for s, t in best.items()},
        err_name: {s: float(f"{e:.2e}") for s, e in err.items()},
    }


def amx_kernel_bench(doc: str, name: str, argv: list[str] | None, available, rows, **fields) -> int:
    """main() of an AMX kernel micro-benchmark: options (kernel_bench_args), 2 threads, exit 1
    where `available()` is False, `rows(reps)` -> the table (each row with "ms" per side),
    written with the machine, torch version, `fields` and each side's total."""
    import torch

    args = kernel_bench_args(doc, name, argv)
    torch.set_num_threads(2)
    if not available():
        print("no AMX here (or ktcli's C++ kernels are not built): nothing to measure", file=sys.stderr)
        return 1
    table = rows(args.reps)
    result = {"benchmark": name, "machine": machine(), "threads": 2, "torch": torch.__version__, **fields,
              "rows": table,
              "total_ms": {s: round(sum(r["ms"][s] for r in table), 2) for s in table[0]["ms"]}}
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")
    return 0
