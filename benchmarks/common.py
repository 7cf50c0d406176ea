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


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


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
