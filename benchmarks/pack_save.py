"""Keeping packed weights in the cache (`pack_cache.save`) written one tensor at a time
(since 2026-12-06) against safetensors' own `save_file` (the baseline, what `save` called
before), on the bundled SmolLM2's weights.

    python -m benchmarks.pack_save --json

Each variant runs in a fresh Python process per dtype: it loads the weights as the engine
does on a first run (int8: packed, the CPU default; bf16: a GPU's, here on the CPU), then
saves them. Reported: the process's RSS just before the save, its peak RSS during the
save (the peak is reset through /proc/self/clear_refs first, so the load's is not counted),
the difference (what the save itself adds to a first run's peak), and the save's seconds
(both fsync the file).
REPEATS rounds, the variants alternating; medians and ratios. The two files are compared
tensor by tensor.

What it shows is that the streamed writer costs nothing on the CPU: safetensors 0.8's
`save_file` writes CPU tensors from their memory without a copy too. Its gain is on a GPU,
which this machine lacks: `save_file` copies every CUDA tensor to the host and keeps all of
them until it has written the file (the whole model, ~14 GB for a 7B in bf16), where
`save` holds one tensor at a time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, arg_parser, machine, report

REPEATS = 3

_SCRIPT = """
import json, os, sys, time
from pathlib import Path
import torch
from ktcli.engine import pack_cache
from ktcli.engine.config import load_config
from ktcli.engine.weights import load_weights
folder, out, variant, dtype = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
cfg = load_config(folder)
w = load_weights(folder, cfg, dtype)
def status_mib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here: the load's own is not the save's
before = status_mib("VmRSS")
start = time.perf_counter()
if variant == "streamed":
    assert pack_cache.save(out, w)
else:
    from safetensors.torch import save_file
    tensors = {"embed": w.embed, "norm": w.norm}
    for i, lw in enumerate(w.layers):
        for name in pack_cache._LAYER_FIELDS:
            t = getattr(lw, name)
            if t is not None:
                tensors[f"layers.{i}.{name}"] = t
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out),
              metadata={"format": str(pack_cache.FORMAT), "layers": str(len(w.layers)), "tied": "1"})
    with open(out, "rb") as f:
        os.fsync(f.fileno())  # as pack_cache.save did
seconds = time.perf_counter() - start
peak = status_mib("VmHWM")
print(json.dumps({"rss_before_mib": round(before, 1), "peak_mib": round(peak, 1),
                  "added_mib": round(peak - before, 1), "save_s": round(seconds, 3)}))
"""


def _run(folder: Path, out: Path, variant: str, dtype: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder), str(out), variant, dtype], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    if proc.returncode:
        raise SystemExit(f"{variant} {dtype} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _same_tensors(a: Path, b: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        return set(fa.keys()) == set(fb.keys()) and all(fa.get_tensor(k).equal(fb.get_tensor(k)) for k in fa.keys())


def main(argv=None) -> dict:
    args = arg_parser("pack_save", __doc__, "pack_save").parse_args(argv)
    from ktcli.config import Settings
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model

    folder = ensure_hf_dir(resolve_model("smollm2"), Settings().cache_path)
    runs: dict[str, dict[str, list[dict]]] = {d: {"streamed": [], "save_file": []} for d in ("int8", "bf16")}
    same = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in runs:
            for r in range(REPEATS):
                for variant in ("streamed", "save_file"):
                    got = _run(folder, Path(tmp) / f"{variant}-{dtype}-{r}.safetensors", variant, dtype)
                    runs[dtype][variant].append(got)
                    print(f"{dtype} round {r + 1}: {variant} RSS {got['rss_before_mib']} MiB before, peak "
                          f"{got['peak_mib']} (+{got['added_mib']}), {got['save_s']:.2f} s", flush=True)
            same[dtype] = _same_tensors(Path(tmp) / f"streamed-{dtype}-0.safetensors",
                                        Path(tmp) / f"save_file-{dtype}-0.safetensors")

    def median(dtype: str, variant: str, key: str) -> float:
        return round(statistics.median(run[key] for run in runs[dtype][variant]), 3)

    result = {"machine": machine(), "model": folder.name, "repeats": REPEATS, "runs": runs, "same_tensors": same,
              "median": {d: {v: {k: median(d, v, k) for k in ("rss_before_mib", "peak_mib", "added_mib", "save_s")}
                             for v in runs[d]} for d in runs}}
    for d in runs:
        result["median"][d]["added_ratio_save_file_over_streamed"] = round(
            median(d, "save_file", "added_mib") / max(median(d, "streamed", "added_mib"), 0.1), 2)
        result["median"][d]["save_s_ratio_save_file_over_streamed"] = round(
            median(d, "save_file", "save_s") / median(d, "streamed", "save_s"), 2)
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
