"""A converted GGUF that reads its weights from the GGUF (`engine.gguf_weights`, since
2026-12-06) against the same folder with the float32 copy of the weights the conversion
wrote before (the baseline), on the bundled SmolLM2 GGUF.

    python -m benchmarks.gguf_weights --json

Each variant runs in a fresh Python process, as a user's first `ktcli ask` pays it, and
does what that first run does with the model before its first prompt: convert the GGUF
into an empty folder (the baseline also writes model.safetensors, float32, as
`gguf_convert` did), then load the weights as the CPU engine packs them (`--weights
int8`, what `pack_cache` keeps). Then two loads in another dtype (bf16, what a GPU loads
on every run), through `pack_cache` as the engine loads: the first dequantizes the GGUF
and keeps the weights in bf16, the second reads them back (the baseline reads its float32
copy both times). REPEATS rounds,
the two variants alternating; medians and ratios are reported, with each folder's size on
disk and each process's peak RSS. The packed int8 weights of the two are compared bit for bit.
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
import hashlib, json, resource, sys, time
from pathlib import Path
start = time.perf_counter()
import torch
from ktcli.engine import gguf_convert, gguf_weights
from ktcli.engine.config import load_config
from ktcli.engine.gguf_header import read_header
from ktcli.engine.pack_cache import load_engine_weights
from ktcli.engine.weights import load_weights
imported = time.perf_counter()
path, out, variant = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
gguf_convert.convert(header, out)
gguf_weights.record_source(out, path)
if variant == "copy":
    gguf_convert.write_safetensors(header, out / "model.safetensors")
converted = time.perf_counter()
cfg = load_config(out)
w = load_weights(out, cfg, "int8")
packed = time.perf_counter()
digest = hashlib.sha256()
for t in [w.embed, w.norm] + [getattr(layer, f) for layer in w.layers for f in ("qkv", "o", "gate_up", "down")]:
    digest.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
del w
peak_first = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
again = time.perf_counter()
load_engine_weights(out, cfg, "bf16", "cpu", out.parent / (out.name + "-packed"))
bf16 = time.perf_counter()
load_engine_weights(out, cfg, "bf16", "cpu", out.parent / (out.name + "-packed"))
bf16_again = time.perf_counter()
print(json.dumps({"import_s": imported - start, "convert_s": converted - imported, "pack_s": packed - converted,
                  "bf16_load_s": bf16 - again, "bf16_again_s": bf16_again - bf16, "peak_rss_mib": peak_first,
                  "packed_sha256": digest.hexdigest()}))
"""


def _run(variant: str, path: Path, out: Path) -> dict:
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(out), variant], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    if proc.returncode:
        raise SystemExit(f"{variant} failed:\n{proc.stderr[-2000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    got["folder_mb"] = round(sum(f.stat().st_size for f in out.iterdir()) / 2**20, 1)
    return got


def main(argv=None) -> dict:
    args = arg_parser("gguf_weights", __doc__, "gguf_weights").parse_args(argv)
    from ktcli.engine.model_store import resolve_model

    path = resolve_model("smollm2").path
    runs: dict[str, list[dict]] = {"gguf": [], "copy": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(REPEATS):
            for variant in ("gguf", "copy"):
                got = _run(variant, path, Path(tmp) / f"{variant}-{r}")
                runs[variant].append(got)
                print(f"round {r + 1}: {variant} convert {got['convert_s']:.2f} s, pack {got['pack_s']:.2f} s, "
                      f"bf16 load {got['bf16_load_s']:.2f} s then {got['bf16_again_s']:.2f} s, "
                      f"peak RSS {got['peak_rss_mib']} MiB, "
                      f"folder {got['folder_mb']} MB", flush=True)

    def median(variant: str, key: str) -> float:
        return round(statistics.median(run[key] for run in runs[variant]), 2)

    first = {v: median(v, "convert_s") + median(v, "pack_s") for v in runs}
    result = {
        "machine": machine(), "file": path.name, "file_mb": round(path.stat().st_size / 2**20, 1), "repeats": REPEATS,
        "runs": runs,
        "median": {v: {k: median(v, k) for k in ("import_s", "convert_s", "pack_s", "bf16_load_s", "bf16_again_s",
                                                 "peak_rss_mib")}
                   for v in runs},
        "folder_mb": {v: runs[v][0]["folder_mb"] for v in runs},
        "first_use_s": {v: round(first[v], 2) for v in runs},
        "first_use_ratio_copy_over_gguf": round(first["copy"] / first["gguf"], 2),
        "bf16_first_load_ratio_copy_over_gguf": round(median("copy", "bf16_load_s") / median("gguf", "bf16_load_s"), 2),
        "bf16_later_load_ratio_copy_over_gguf": round(median("copy", "bf16_again_s") / median("gguf", "bf16_again_s"),
                                                      2),
        "packed_weights_identical": len({run["packed_sha256"] for v in runs for run in runs[v]}) == 1,
    }
    print(f"first use (convert + pack): {first['gguf']:.2f} s reading the GGUF vs {first['copy']:.2f} s with the "
          f"float32 copy; folder {result['folder_mb']['gguf']} vs {result['folder_mb']['copy']} MB; bf16 load "
          f"{median('gguf', 'bf16_load_s')} vs {median('copy', 'bf16_load_s')} s, later "
          f"{median('gguf', 'bf16_again_s')} vs {median('copy', 'bf16_again_s')} s; packed weights identical: "
          f"{result['packed_weights_identical']}")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
