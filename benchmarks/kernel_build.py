"""The first build of the engine's C++ kernels, as `scripts/setup.sh` (or a first question
without it) pays it: the library as `engine.cpp_ext` builds it now (two kernel units and the
bindings, each with the few torch headers it needs, compiled side by side) against the
baseline, the same kernel sources built the way ktcli did until 2026-12-06 (one unit under
torch/extension.h, bindings written by torch's `load_inline`).

    python -m benchmarks.kernel_build --json

Each build runs in a fresh Python process into an empty folder; REPEATS rounds, the two
alternating; medians of wall time and their ratio are reported, with the compilers' CPU
time (children's user + system), which other load on the machine disturbs less. Each
built library is then loaded and one kernel called, and a failed check in it must raise
the same RuntimeError, so neither side is timed failing.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, arg_parser, machine, report

REPEATS = 2

# Run after each build: one kernel against torch, and a failed check's error.
_CHECK = """
x = torch.randn(64)
assert torch.allclose(lib.silu_mul(torch.cat([x, x]).view(1, -1), False), torch.nn.functional.silu(x) * x, atol=1e-5)
try:
    lib.silu_mul(x, False)  # a failed TORCH_CHECK: a RuntimeError saying which
    raise SystemExit("no error for a 1-d input")
except RuntimeError as e:
    assert "gu [T, 2 * inter]" in str(e), e
"""

_BASELINE = """
import sys, torch
from torch.utils.cpp_extension import load_inline
from ktcli.engine import cpp_ext
modules = [__import__(f"ktcli.engine.{m}", fromlist=["SOURCE"]) for unit in cpp_ext.UNITS for m in unit]
lib = load_inline(cpp_ext.NAME, cpp_sources="".join(m.SOURCE for m in modules),
                  functions=[f for m in modules for f in m.FUNCTIONS], extra_cflags=cpp_ext.CFLAGS,
                  extra_ldflags=["-fopenmp"], build_directory=sys.argv[1])
"""

_OURS = """
import os, sys, torch
os.environ["TORCH_EXTENSIONS_DIR"] = sys.argv[1]
from ktcli.engine import cpp_ext
lib = cpp_ext.load()
assert lib is not None, cpp_ext.unavailable
"""


def _build(which: str, folder: Path) -> tuple[float, float]:
    """(wall seconds, compiler CPU seconds) of one build into the empty `folder`."""
    folder.mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    script = (_OURS if which == "ours" else _BASELINE) + _CHECK
    proc = subprocess.run([sys.executable, "-c", script, str(folder)], cwd=ROOT,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "KTCLI_NO_CPP_KERNELS": ""})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{which} build failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv=None) -> dict:
    args = arg_parser("kernel_build", __doc__, "kernel_build").parse_args(argv)
    wall: dict[str, list[float]] = {"ours": [], "baseline": []}
    cpu: dict[str, list[float]] = {"ours": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(REPEATS):
            order = ("ours", "baseline") if r % 2 == 0 else ("baseline", "ours")
            for which in order:
                seconds, cpu_s = _build(which, Path(tmp) / f"{which}-{r}")
                wall[which].append(seconds)
                cpu[which].append(cpu_s)
                print(f"round {r + 1}: {which} {seconds:.1f} s wall, {cpu_s:.1f} s CPU", flush=True)
    ours, base = statistics.median(wall["ours"]), statistics.median(wall["baseline"])
    result = {
        "machine": machine(), "load_average_at_end": list(os.getloadavg()), "repeats": REPEATS,
        "ours_wall_s": [round(t, 1) for t in wall["ours"]], "baseline_wall_s": [round(t, 1) for t in wall["baseline"]],
        "ours_cpu_s": [round(t, 1) for t in cpu["ours"]], "baseline_cpu_s": [round(t, 1) for t in cpu["baseline"]],
        "ours_median_wall_s": round(ours, 1), "baseline_median_wall_s": round(base, 1),
        "speedup_wall": round(base / ours, 2),
        "cpu_ratio": round(statistics.median(cpu["ours"]) / statistics.median(cpu["baseline"]), 2),
    }
    print(f"kernel build: ours {ours:.0f} s, baseline {base:.0f} s wall ({base / ours:.2f}x); "
          f"CPU {result['cpu_ratio']}x the baseline's")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
