"""Long-context quality: perplexity per KV dtype and attention policy, and a needle matrix.

    python -m benchmarks.longctx_quality --json [--ppl-tokens 2048] [--lengths 2048,4096,8192,16384,32768]
        [--depths 0.1,0.3,0.5,0.7,0.9] [--configs dense-fp32,dense-int8,dense-int4,window-int4,topk-int4]
        [--sparse-lengths 16384,32768]

Everything runs through the engine API (``NativeBackend.load``), not the CLI.

* Perplexity: SmolLM2 on the first ``--ppl-tokens`` tokens of
  sample_docs/python-tutorial-3.11.rst, each config against dense fp32 (the SDPA path),
  and the mean KL divergence of each next-token distribution from the reference's.
* Needle log-probability (``--logprob-configs``): how sure each config is of the needle,
  teacher-forced, per length and depth; a continuous figure where found/missed flips.
* Needle: a haystack of tutorial text cut to each length, one sentence planted at each
  depth, the question asked through the chat template, greedy answer; a cell's accuracy
  is 1 when the answer holds the fact. Per length, decode tokens/s of each config.

Writes benchmarks/results/longctx_quality.json and benchmarks/results/needle_heatmap.png.
The full matrix takes hours on a 2-core CPU; pass smaller --lengths/--depths/--configs and
the JSON records exactly what ran.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
import zlib
from pathlib import Path

import torch

from benchmarks.common import ROOT, machine, write_result

TEXT = ROOT / "sample_docs" / "python-tutorial-3.11.rst"
NEEDLE = "The secret passphrase for the lighthouse archive is MARIGOLD-4417."
QUESTION = "What is the secret passphrase for the lighthouse archive? Answer with the passphrase only."
FACT = "MARIGOL"  # 12 greedy tokens end at "MARIGOL"; the full fact is MARIGOLD-4417
CONFIGS = {
    "dense-fp32": dict(kv_dtype="fp32"),
    "dense-fp8": dict(kv_dtype="fp8"),
    "dense-int8": dict(kv_dtype="int8"),
    "dense-int4": dict(kv_dtype="int4"),
    # int4 keys quantised before RoPE (engine.longctx `unroped_keys`; in the results of
    # commit 455e564, where it was int4's default, this config was "dense-int4" and the
    # default one "dense-int4-roped")
    "dense-int4-prerope": dict(kv_dtype="int4", unroped_keys=True),
    "window-fp32": dict(kv_dtype="fp32", attention="window"),
    "window-int4": dict(kv_dtype="int4", attention="window"),
    "topk-fp32": dict(kv_dtype="fp32", attention="topk"),
    "topk-int8": dict(kv_dtype="int8", attention="topk"),
    "topk-int4": dict(kv_dtype="int4", attention="topk"),
    "topk-int4-dense2": dict(kv_dtype="int4", attention="topk", dense_layers=2),
    # Within the trained window positions need no remapping: true positions.
    "topk-int4-noremap": dict(kv_dtype="int4", attention="topk", position_remap=False),
    # the sink page read from its int4 copy, as before engine.exact_sinks (A/B)
    "topk-int4-quantsink": dict(kv_dtype="int4", attention="topk", exact_sinks=False),
}


def model_dir() -> Path:
    from ktcli.config import load_settings
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model

    return ensure_hf_dir(resolve_model("smollm2"), load_settings().cache_path)


# Tokens per prefill step of the configs' loads. Perplexity is scored on prompt logits,
# and under window/topk a chunk reads its own rows exact (`KernelKVCache._exact_rows`):
# with 512-token chunks most local pages are in the chunk, so quantized pages show less
# than they do to a decode step. --prefill-chunk 64 (one page) scores them as decode reads them.
PREFILL_CHUNK = 512


def load(name: str, max_tokens: int):
    from ktcli.engine.native import NativeBackend

    kw = dict(CONFIGS[name])
    # Budget: the longest prompt plus the answer, in this config's page bytes.
    per_token = _bytes_per_token(kw.get("kv_dtype", "fp32"))
    budget = int((max_tokens + 256) * per_token) + (256 << 20)  # + staging pool and exact sinks
    return NativeBackend.load(model_dir(), weights="fp32", prefill_chunk=PREFILL_CHUNK, kv_budget_bytes=budget, **kw)


def _bytes_per_token(kind: str) -> float:
    import kernels
    from ktcli.engine.config import load_config

    cfg = load_config(model_dir())
    return cfg.n_layers * kernels.bytes_per_token(kernels.KVCacheSpec(cfg.n_kv_heads, cfg.head_dim, 16, kind)) * 1.1


def perplexity(names: list[str], n_tokens: int) -> dict:
    from ktcli.engine.native import NativeBackend

    ref_backend = NativeBackend.load(model_dir(), weights="fp32", prefill_chunk=512, kv_budget_bytes=int((n_tokens + 64) * _bytes_per_token("fp32")))
    ids = ref_backend.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)[:n_tokens]
    target = torch.tensor(ids[1:])

    def ppl(backend) -> tuple[float, torch.Tensor, float]:
        t0 = time.perf_counter()
        logp = torch.log_softmax(backend.prompt_logits(ids)[:-1].float(), -1)
        nll = torch.nn.functional.nll_loss(logp, target)
        return float(torch.exp(nll)), logp, time.perf_counter() - t0

    ref, ref_logp, ref_s = ppl(ref_backend)
    del ref_backend
    out = {"tokens": len(ids), "reference": "dense fp32 (SDPA path)", "reference_ppl": round(ref, 4),
           "reference_s": round(ref_s, 1), "configs": {}}
    for name in names:
        print(f"ppl: {name}", file=sys.stderr, flush=True)
        value, logp, secs = ppl(load(name, n_tokens))
        # KL(reference || config) per token: how far each next-token distribution moved.
        # It averages over every position and vocabulary entry, so it separates configs
        # whose perplexity deltas sit inside one another's noise.
        kl = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
        out["configs"][name] = {"ppl": round(value, 4), "delta_pct": round(100 * (value / ref - 1), 3),
                                "kl_per_token": round(kl, 5), "seconds": round(secs, 1)}
        del logp
    return out


def needle_prompt(tokenizer, length: int, depth: float) -> list[int]:
    """Chat prompt of about `length` tokens: tutorial lines (repeated if need be) with the
    needle sentence as its own line at `depth`, then the question."""
    lines = TEXT.read_text(encoding="utf-8").splitlines(keepends=True)
    head = "Read the document, then answer.\n\n<document>\n"
    tail = f"</document>\n\n{QUESTION}"
    overhead = len(tokenizer.apply_chat_template([{"role": "user", "content": head + NEEDLE + "\n" + tail}],
                                                 add_generation_prompt=True))
    budget = length - overhead
    body, used, planted, i = [], 0, False, 0
    while True:
        if not planted and used >= depth * budget:
            body.append(NEEDLE + "\n")
            planted = True
        n = len(tokenizer.encode(lines[i % len(lines)], add_special_tokens=False))
        if used + n > budget:
            break
        body.append(lines[i % len(lines)])
        used += n
        i += 1
    if not planted:
        body.append(NEEDLE + "\n")
    content = head + "".join(body) + tail
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def needle_matrix(names: list[str], lengths: list[int], depths: list[float], new_tokens: int,
                  sparse_lengths: list[int] | None = None) -> dict:
    from ktcli.engine.backend import SamplingParams

    cells: dict = {}
    speed: dict = {}
    for name in names:
        backend = load(name, max(lengths) + 200)
        cells[name], speed[name] = {}, {}
        for length in lengths:
            row = []
            rates = []
            sparse = CONFIGS[name].get("attention", "dense") != "dense"
            for depth in depths:
                if sparse and sparse_lengths is not None and length not in sparse_lengths:
                    row.append({"depth": depth, "accuracy": None, "note": "not run (--sparse-lengths)"})
                    continue
                if not sparse and length > backend.context_window:
                    row.append({"depth": depth, "accuracy": None, "note": "beyond the trained window: dense cannot run"})
                    continue
                prompt = needle_prompt(backend.tokenizer, length, depth)
                t0 = time.perf_counter()
                try:
                    texts, _ = backend.generate_ids_batch([prompt], SamplingParams(max_new_tokens=new_tokens))
                except Exception as e:  # noqa: BLE001 - recorded, the matrix goes on
                    row.append({"depth": depth, "accuracy": None, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                extra = backend.last_stats.extra
                rates.append(extra.get("decode_tok_s", 0.0))
                row.append({"depth": depth, "accuracy": float(FACT.lower() in texts[0].lower()),
                            "answer": texts[0][:80], "prompt_tokens": len(prompt),
                            "prefill_tok_s": round(extra.get("prefill_tok_s", 0.0), 1),
                            "seconds": round(time.perf_counter() - t0, 1)})
                print(f"needle: {name} {length} {depth}: {row[-1]}", file=sys.stderr, flush=True)
            cells[name][str(length)] = row
            speed[name][str(length)] = round(sum(rates) / len(rates), 2) if rates else None
        del backend
    return {"lengths": lengths, "depths": depths, "new_tokens": new_tokens, "cells": cells, "decode_tok_s": speed}


ANSWER_STEM = "The secret passphrase for the lighthouse archive is"
ANSWER = " MARIGOLD-4417"


def needle_logprob(names: list[str], lengths: list[int], depths: list[float]) -> dict:
    """How sure each config is of the needle: the log-probability of the fact's tokens,
    teacher-forced after the needle prompt and the answer's first words. Greedy found /
    missed flips on a 135M model when the answer's margin is thin; this measures the
    margin itself, so configs compare on a continuous figure per cell. The first config
    is the reference for `mean_drop` (nats; positive = less sure than it). Dense configs
    score prompt + answer in one prefill; window / topk feed the answer as decode steps
    after the prompt (`answer_logits`), so their pages are chosen from the question, not
    from the answer they are asked to predict."""
    cells: dict = {}
    for name in names:
        backend = load(name, max(lengths) + 64)
        tok = backend.tokenizer
        stem = tok.encode(ANSWER_STEM, add_special_tokens=False)
        full = tok.encode(ANSWER_STEM + ANSWER, add_special_tokens=False)
        assert full[: len(stem)] == stem, "the answer stem must tokenize as a prefix"
        fact = full[len(stem):]
        cells[name] = {}
        sparse = CONFIGS[name].get("attention", "dense") != "dense"
        for length in lengths:
            row = []
            for depth in depths:
                prompt = needle_prompt(tok, length, depth)
                t0 = time.perf_counter()
                if sparse:
                    logits = backend.answer_logits(prompt, full)[-len(fact):]  # rows predicting the fact
                else:
                    logits = backend.prompt_logits(prompt + full)[-len(fact) - 1 : -1]
                lp = torch.log_softmax(logits.float(), -1)[torch.arange(len(fact)), torch.tensor(fact)].sum()
                row.append(round(float(lp), 4))
                print(f"logprob: {name} {length} {depth}: {row[-1]} ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
            cells[name][str(length)] = row
        del backend
    ref = names[0]
    drop = {
        name: {length: round(sum(a - b for a, b in zip(cells[ref][length], row)) / len(row), 4)
               for length, row in cells[name].items()}
        for name in names[1:]
    }
    return {"answer": ANSWER_STEM + ANSWER, "lengths": lengths, "depths": depths, "reference": ref,
            "logprob": cells, "mean_drop": drop}


# -- a PNG heat map with numpy + zlib (no matplotlib) ----------------------------------


def _png(path: Path, rgb) -> None:
    import numpy as np

    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + np.ascontiguousarray(rgb[y]).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def heatmap(matrix: dict, path: Path, cell: int = 24, gap: int = 2) -> None:
    """Rows: config x length; columns: depth. Green = found, red = missed, grey = not run."""
    import numpy as np

    names, lengths, depths = list(matrix["cells"]), matrix["lengths"], matrix["depths"]
    rows = [(n, str(length)) for n in names for length in lengths]
    img = np.full(((cell + gap) * len(rows) + gap, (cell + gap) * len(depths) + gap, 3), 255, dtype=np.uint8)
    for r, (name, length) in enumerate(rows):
        for c, entry in enumerate(matrix["cells"][name].get(length, [])):
            acc = entry.get("accuracy")
            color = (170, 170, 170) if acc is None else (int(220 * (1 - acc)), int(180 * acc + 40), 60)
            y, x = gap + r * (cell + gap), gap + c * (cell + gap)
            img[y : y + cell, x : x + cell] = color
    _png(path, img)


def main() -> None:
    global PREFILL_CHUNK  # noqa: PLW0603 - one setting for every load of this run
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ppl-tokens", type=int, default=2048)
    parser.add_argument("--ppl-configs", default="dense-fp8,dense-int8,dense-int4,window-fp32,topk-fp32,topk-int4")
    parser.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    parser.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    parser.add_argument("--configs", default="dense-fp32,dense-int8,dense-int4,window-int4,topk-int8,topk-int4")
    parser.add_argument("--sparse-lengths", default=None,
                        help="lengths for the window/topk configs (default: --lengths), e.g. 16384,32768")
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-ppl", action="store_true")
    parser.add_argument("--logprob-configs", default="",
                        help="configs for the needle log-probability table, reference first, "
                             "e.g. dense-fp32,dense-int8,dense-int4,dense-int4-prerope")
    parser.add_argument("--logprob-lengths", default="2048,4096")
    parser.add_argument("--logprob-depths", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    parser.add_argument("--name", default="longctx_quality",
                        help="results file stem: a partial rerun can go beside the full matrix, not over it")
    parser.add_argument("--prefill-chunk", type=int, default=512,
                        help="tokens per prefill step of the configs (the dense fp32 reference keeps 512)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    PREFILL_CHUNK = args.prefill_chunk
    started = time.perf_counter()
    result = {"benchmark": "longctx_quality", "machine": machine(), "model": "SmolLM2-135M-Instruct (fp32 weights)",
              "command": " ".join(sys.argv), "needle": NEEDLE, "question": QUESTION, "prefill_chunk": PREFILL_CHUNK}
    if not args.skip_ppl and args.ppl_configs:
        result["perplexity"] = perplexity(args.ppl_configs.split(","), args.ppl_tokens)
        write_result(args.name, result)
    if args.logprob_configs:
        result["needle_logprob"] = needle_logprob(args.logprob_configs.split(","),
                                                  [int(x) for x in args.logprob_lengths.split(",")],
                                                  [float(x) for x in args.logprob_depths.split(",")])
        write_result(args.name, result)
    if args.configs:
        matrix = needle_matrix(args.configs.split(","), [int(x) for x in args.lengths.split(",")],
                               [float(x) for x in args.depths.split(",")], args.new_tokens,
                               [int(x) for x in args.sparse_lengths.split(",")] if args.sparse_lengths else None)
        result["needle"] = matrix
        heat = "needle_heatmap" if args.name == "longctx_quality" else f"{args.name}_heatmap"
        heatmap(matrix, ROOT / "benchmarks" / "results" / f"{heat}.png")
    result["wall_s"] = round(time.perf_counter() - started, 1)
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
