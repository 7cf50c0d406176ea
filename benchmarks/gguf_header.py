"""Reading a GGUF's metadata and tensor table for the planner: ktcli's own header reader
(`engine.gguf_header`) against gguf's `GGUFReader` (the baseline, which ktcli used before),
on the bundled SmolLM2 GGUF (98K tokenizer strings in its metadata).

    python -m benchmarks.gguf_header --json

Every plan made before the model's first conversion reads these facts (`ktcli plan` or
`ktcli ask` on a fresh cache, and any test planning with an empty cache). Each reader runs
REPEATS times in this process, alternating; medians and their ratio are reported, and both
readers' figures (layers, tensors, parameters, vocabulary) are checked to agree.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.common import arg_parser, machine, report

REPEATS = 5


def _ours(path):
    from ktcli.engine.gguf_header import read_header

    h = read_header(path)
    return (h.fields["llama.block_count"].contents(), len(h.tensors), sum(t.n_elements for t in h.tensors),
            h.fields["tokenizer.ggml.tokens"].length)


def _theirs(path):
    import gguf

    r = gguf.GGUFReader(str(path))
    return (int(r.fields["llama.block_count"].contents()), len(r.tensors), sum(int(t.n_elements) for t in r.tensors),
            len(r.fields["tokenizer.ggml.tokens"].data))


def main(argv=None) -> dict:
    args = arg_parser("gguf_header", __doc__, "gguf_header").parse_args(argv)
    from ktcli.engine.model_store import resolve_model

    path = resolve_model("smollm2").path
    times = {"ours": [], "gguf_reader": []}
    facts = {}
    for _ in range(REPEATS):
        for name, read in (("ours", _ours), ("gguf_reader", _theirs)):
            start = time.perf_counter()
            facts[name] = read(path)
            times[name].append(time.perf_counter() - start)
    assert facts["ours"] == facts["gguf_reader"], facts
    ours, theirs = statistics.median(times["ours"]), statistics.median(times["gguf_reader"])
    result = {
        "machine": machine(), "file": path.name, "file_mb": round(path.stat().st_size / 2**20, 1),
        "repeats": REPEATS, "facts": dict(zip(("layers", "tensors", "parameters", "vocabulary"), facts["ours"])),
        "ours_s": round(ours, 4), "gguf_reader_s": round(theirs, 3), "speedup": round(theirs / ours, 1),
    }
    print(f"{path.name}: ours {ours * 1000:.1f} ms, gguf's GGUFReader {theirs:.2f} s ({theirs / ours:.0f}x)")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
