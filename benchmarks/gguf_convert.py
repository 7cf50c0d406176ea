"""A GGUF's conversion into the model folder the engine loads, on a model's first use:
ktcli's own converter (`engine.gguf_convert`) against transformers' GGUF loader and
`save_pretrained` (`model_store._convert_with_transformers`, the baseline: ktcli's only path
until 2026-12-06, now its fallback), on the bundled SmolLM2 GGUF.

    python -m benchmarks.gguf_convert --json

Each conversion runs in a fresh Python process, as a user's first `ktcli ask` pays it
(imports included), into an empty folder; REPEATS rounds, the two alternating; medians and
their ratio are reported. Since 2026-12-06 (evening) ours writes no weights: they are read
from the GGUF, dequantized, as the engine loads them (`engine.gguf_weights`), so its time is
the config's and the tokenizer's (`python -m benchmarks.gguf_weights` times the first load
that reads them against the float32 copy written before). The two folders are then
compared: every tensor bit for bit (ours as read), the tokenizer.json as parsed JSON, the
chat template as text, and their sizes on disk.
Peak RSS of each process is recorded too (the baseline holds the whole model as float32
while saving it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, arg_parser, machine, report

REPEATS = 3

_SCRIPT = """
import resource, sys
from pathlib import Path
from ktcli.engine import gguf_convert, gguf_weights, model_store
from ktcli.engine.gguf_header import read_header
path, out, which = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
if which == "ours":
    gguf_convert.convert(header, out)
    gguf_weights.record_source(out, path)
else:
    model_store._convert_with_transformers(path, header, out)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _convert(which: str, path: Path, out: Path) -> tuple[float, int]:
    out.mkdir()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(out), which], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                                               "TQDM_DISABLE": "1"}, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{which} conversion failed:\n{proc.stderr[-2000:]}")
    return seconds, int(proc.stdout.split()[-1]) // 1024  # ru_maxrss: KiB on Linux


def _same(ours: Path, theirs: Path) -> dict:
    from safetensors.numpy import load_file

    from ktcli.engine.weights import TensorReader

    with TensorReader.of_folder(ours) as reader:
        a = {name: reader.get(name).numpy() for name in reader.names()}
    b = load_file(str(theirs / "model.safetensors"))
    equal = sorted(a) == sorted(b) and all(
        a[k].shape == b[k].shape and np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in b)
    return {
        "tensors": len(b), "tensors_bit_identical": equal,
        "tokenizer_json_equal": json.loads((ours / "tokenizer.json").read_text())
        == json.loads((theirs / "tokenizer.json").read_text()),
        "chat_template_equal": (ours / "chat_template.jinja").read_text() == (theirs / "chat_template.jinja").read_text(),
        "folder_mb": {"ours": _folder_mb(ours), "transformers": _folder_mb(theirs)},
    }


def _folder_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.iterdir()) / 2**20, 1)


def main(argv=None) -> dict:
    args = arg_parser("gguf_convert", __doc__, "gguf_convert").parse_args(argv)
    from ktcli.engine.model_store import resolve_model

    path = resolve_model("smollm2").path
    times: dict[str, list[float]] = {"ours": [], "transformers": []}
    rss: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(REPEATS):
            for which in ("ours", "transformers"):
                seconds, peak = _convert(which, path, Path(tmp) / f"{which}-{r}")
                times[which].append(seconds)
                rss[which] = max(rss.get(which, 0), peak)
                print(f"round {r + 1}: {which} {seconds:.1f} s, peak RSS {peak} MiB", flush=True)
        checks = _same(Path(tmp) / "ours-0", Path(tmp) / "transformers-0")
    ours, theirs = statistics.median(times["ours"]), statistics.median(times["transformers"])
    result = {
        "machine": machine(), "file": path.name, "file_mb": round(path.stat().st_size / 2**20, 1),
        "repeats": REPEATS, "ours_s": [round(t, 2) for t in times["ours"]],
        "transformers_s": [round(t, 2) for t in times["transformers"]],
        "ours_median_s": round(ours, 2), "transformers_median_s": round(theirs, 2),
        "speedup": round(theirs / ours, 1), "peak_rss_mib": rss, **checks,
    }
    print(f"{path.name}: ours {ours:.1f} s, transformers {theirs:.1f} s ({theirs / ours:.1f}x); {checks}")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
