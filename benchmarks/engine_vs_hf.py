"""ktcli's engine against transformers (and llama.cpp when installed) on SmolLM2.

    python -m benchmarks.engine_vs_hf --json

Each engine runs in its own subprocess (so peak RSS is its own) on the same prompts:
512 and 4096 tokens, 128 new tokens, greedy, 2 threads; the engines take turns for
`--rounds` rounds (default 2) and every tok/s figure keeps its best round (the decode
ceiling too, independently of decode, so `decode_util` can only come out low, never high). Prints one JSON object and
writes it to benchmarks/results/engine_vs_hf.json. llama.cpp is optional
(`pip install .[bench-llamacpp]`); without it its figures are null.

Decode ceiling: one over the time of the model's own weight products (every layer's
fused matrices and the LM head, batch 1, run as decode runs them: fp32 BLAS, or the bf16
or int8 kernel on fp32 activations) measured in the worker,
so `decode_util` says how close decode gets to reading the weights once per token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (512, 4096)
NEW_TOKENS = 128
THREADS = 2
MATCH_PROMPTS = (
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet.",
)
MATCH_TOKENS = 64


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    # Same for every engine, and what the ktcli CLI sets: idle OpenMP threads spin for a
    # bounded count, then sleep (libgomp's GOMP_SPINCOUNT; see ktcli/cli/app.py).
    env.setdefault("GOMP_SPINCOUNT", "100000")
    env["OMP_NUM_THREADS"] = str(THREADS)
    return env


def _model_paths() -> tuple[Path, Path]:
    import platformdirs

    from ktcli.engine.model_store import ensure_hf_dir, resolve_model

    source = resolve_model("smollm2")
    return source.path, ensure_hf_dir(source, Path(platformdirs.user_cache_dir("ktcli")))


def _prompt_ids(n: int) -> list[int]:
    """n ids of real English text (the same for every engine), no special tokens."""
    from ktcli.engine.tokenizer import ChatTokenizer

    _, folder = _model_paths()
    tok = ChatTokenizer(folder)
    para = (
        "The history of the printing press begins in the fifteenth century, when movable type "
        "changed how knowledge travelled between cities, universities and merchants. "
    )
    ids: list[int] = []
    i = 0
    while len(ids) < n:
        ids += tok.encode(f"Section {i}. " + para)
        i += 1
    return ids[:n]


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- workers (one engine each, in a fresh process) -------------------------------------


def worker_ktcli(weights: str, kv_dtype: str | None = None, prefill: str = "auto") -> dict:
    """`prefill`: KTCLI_PREFILL_DTYPE (auto: bf16 wide steps under bf16/int8 weights on a
    CPU with AMX, engine.device.resolve_prefill_dtype)."""
    os.environ["KTCLI_PREFILL_DTYPE"] = prefill
    import torch

    from kernels.layout import TORCH_DTYPES
    from ktcli.engine import int8_gemv
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.native import NativeBackend

    _, folder = _model_paths()
    t0 = time.perf_counter()
    kv = {"kv_dtype": kv_dtype} if kv_dtype else {}
    backend = NativeBackend.load(folder, weights=weights, threads=THREADS, **kv)
    load_s = time.perf_counter() - t0
    engine = backend.engine
    model = engine.model

    # The weight products alone, batch 1, as decode runs them (fp32 BLAS, or our bf16 or
    # int8 kernel on fp32 activations): what reading the weights once per token costs.
    mats = [m for lw in model.w.layers for m in (lw.qkv, lw.o, lw.gate_up, lw.down)] + [model.w.lm_head]
    xs = [torch.randn(1, int8_gemv.logical_width(m) if int8_gemv.is_packed(m) else m.shape[1]) for m in mats]

    def products() -> float:
        t = time.perf_counter()
        for m, x in zip(mats, xs):
            model._linear(x, m, None, 1)
        return time.perf_counter() - t

    pages = next(name for name, dt in TORCH_DTYPES.items() if dt == backend.kv.dtype)
    out = {"engine": "ktcli", "weights": weights, "kv_dtype": pages, "prefill_dtype": model.prefill_dtype,
           "warm_load_s": load_s, "lengths": {}}
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS)
    with torch.inference_mode():
        for n in LENGTHS:
            ids = _prompt_ids(n)
            for _ in engine.generate([ids[:64]], SamplingParams(max_new_tokens=4), eos_ids=frozenset()):
                pass  # warm-up
            toks = [t for _, t in engine.generate([ids], greedy, eos_ids=frozenset())]
            st = engine.stats
            products()
            ceiling_s = sorted(products() for _ in range(7))[3]  # median of 7 passes
            out["lengths"][str(n)] = {
                "prefill_tok_s": n / st.prefill_s,
                "decode_tok_s": st.decode_tokens / st.decode_s,
                "new_tokens": len(toks),
                "decode_ceiling_tok_s": 1.0 / ceiling_s,
                "kv_pages_peak": st.peak_pages,
                "kv_bytes_peak": st.peak_pages * backend.kv.bytes_per_block,
            }
    out["greedy_tokens"] = _greedy_tokens(backend)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def _greedy_tokens(backend) -> list[list[int]]:
    """MATCH_TOKENS greedy tokens for each of MATCH_PROMPTS."""
    import torch

    from ktcli.engine.backend import SamplingParams

    params = SamplingParams(max_new_tokens=MATCH_TOKENS)
    with torch.inference_mode():
        return [[t for _, t in backend.engine.generate([backend.chat_ids([{"role": "user", "content": q}])], params,
                                                       eos_ids=frozenset())] for q in MATCH_PROMPTS]


def worker_greedy(weights: str, kv_dtype: str) -> dict:
    """Greedy tokens only (not timed): separates what the weights change from what the pages do."""
    from ktcli.engine.native import NativeBackend

    _, folder = _model_paths()
    return {"greedy_tokens": _greedy_tokens(NativeBackend.load(folder, weights=weights, kv_dtype=kv_dtype, threads=THREADS))}


def worker_hf(weights: str = "fp32") -> dict:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(THREADS)
    _, folder = _model_paths()
    t0 = time.perf_counter()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[weights]
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
    load_s = time.perf_counter() - t0
    out = {"engine": "transformers", "weights": weights, "load_s": load_s, "lengths": {}}
    with torch.inference_mode():
        model(torch.tensor([_prompt_ids(64)]))  # warm-up
        for n in LENGTHS:
            ids = torch.tensor([_prompt_ids(n)])
            cache = DynamicCache(config=model.config)
            t = time.perf_counter()
            logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            prefill_s = time.perf_counter() - t
            tok = logits[:, -1].argmax(-1, keepdim=True)
            t = time.perf_counter()
            for _ in range(NEW_TOKENS - 1):
                logits = model(tok, past_key_values=cache, use_cache=True).logits
                tok = logits[:, -1].argmax(-1, keepdim=True)
            decode_s = time.perf_counter() - t
            out["lengths"][str(n)] = {"prefill_tok_s": n / prefill_s, "decode_tok_s": (NEW_TOKENS - 1) / decode_s}
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def worker_hf_gguf() -> dict:
    """transformers' own GGUF load (dequantize + build the model): what a warm start of
    ours replaces."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    gguf, _ = _model_paths()
    t0 = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return {"engine": "transformers-gguf", "load_s": time.perf_counter() - t0}


def worker_logits() -> dict:
    """Largest relative logit error of ours (fp32) against transformers, several lengths."""
    import torch
    from transformers import AutoModelForCausalLM

    from ktcli.engine.native import NativeBackend

    _, folder = _model_paths()
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours = NativeBackend.load(folder, weights="fp32", threads=THREADS)
    worst = 0.0
    with torch.inference_mode():
        for n in (7, 100, 512, 1500):
            ids = _prompt_ids(n)
            expected = ref(torch.tensor([ids])).logits[0]
            got = ours.prompt_logits(ids)
            worst = max(worst, ((got - expected).abs().max() / expected.abs().max()).item())
    return {"max_rel_logit_err": worst}


def worker_llamacpp() -> dict:
    try:
        from llama_cpp import Llama
    except ImportError:
        return {"engine": "llama.cpp", "available": False}
    import numpy as np

    gguf, _ = _model_paths()
    t0 = time.perf_counter()
    llm = Llama(model_path=str(gguf), n_ctx=max(LENGTHS) + NEW_TOKENS + 64, n_threads=THREADS,
                n_threads_batch=THREADS, n_batch=512, verbose=False)
    out = {"engine": "llama.cpp", "available": True, "weights": "q4_1", "load_s": time.perf_counter() - t0, "lengths": {}}
    llm.eval(_prompt_ids(64))  # warm-up

    def last_logits():
        # Without logits_all, llama-cpp-python's eval no longer copies logits into
        # llm.scores; the context still holds the last position's row.
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    for n in LENGTHS:
        ids = _prompt_ids(n)
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        prefill_s = time.perf_counter() - t
        tok = int(np.argmax(last_logits()))
        t = time.perf_counter()
        for _ in range(NEW_TOKENS - 1):
            llm.eval([tok])
            tok = int(np.argmax(last_logits()))
        decode_s = time.perf_counter() - t
        out["lengths"][str(n)] = {"prefill_tok_s": n / prefill_s, "decode_tok_s": (NEW_TOKENS - 1) / decode_s}
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


WORKERS = {
    "ktcli-fp32": lambda: worker_ktcli("fp32"),
    "ktcli-bf16": lambda: worker_ktcli("bf16"),
    # int8 weights with fp16 pages (each dtype's default pages: engine.device.auto_kv_dtype)
    # is the CPU default; the same weights over fp32 pages show what the page dtype buys.
    "ktcli-int8": lambda: worker_ktcli("int8"),
    "ktcli-int8-fp32kv": lambda: worker_ktcli("int8", "fp32"),
    # The default's wide steps in fp32, where the default is bf16 (a CPU with AMX): what
    # the bf16 prefill buys, in the same run.
    "ktcli-int8-fp32prefill": lambda: worker_ktcli("int8", prefill="fp32"),
    "greedy-bf16-fp32kv": lambda: worker_greedy("bf16", "fp32"),
    "hf": worker_hf,
    # transformers in bf16: on a CPU with AMX its GEMMs and attention use the tiles too, so
    # this is the like-for-like baseline of a bf16 prefill.
    "hf-bf16": lambda: worker_hf("bf16"),
    "hf-gguf": worker_hf_gguf,
    "logits": worker_logits,
    "llamacpp": worker_llamacpp,
}


TIMED = ("hf", "hf-bf16", "ktcli-fp32", "ktcli-bf16", "ktcli-int8", "ktcli-int8-fp32kv", "ktcli-int8-fp32prefill",
         "llamacpp")
RATES = ("prefill_tok_s", "decode_tok_s", "decode_ceiling_tok_s")


def best_of(earlier: dict | None, now: dict) -> dict:
    """`now`, with each tok/s figure raised to `earlier`'s where that round was faster
    (tokens, memory and load times stay the first round's)."""
    if earlier is None or not now.get("lengths"):
        return now
    out = dict(earlier)
    out["lengths"] = {
        n: {k: max(v, now["lengths"][n][k]) if k in RATES else v for k, v in figures.items()}
        for n, figures in earlier["lengths"].items()
    }
    return out


def run_worker(name: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_vs_hf", "--worker", name],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=3600,
    )
    if proc.returncode != 0 and name == "llamacpp":
        # An optional engine: a build of llama-cpp-python that dies here (a native build
        # whose instructions this CPU or VM refuses: SIGILL, exit -4) is recorded, not fatal.
        return {"engine": "llama.cpp", "available": False, "error": f"worker exited {proc.returncode}"}
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(r: dict) -> dict:
    from benchmarks.common import machine

    ours32, ours16, ours8, hf, lcpp = r["ktcli-fp32"], r["ktcli-bf16"], r["ktcli-int8"], r["hf"], r["llamacpp"]
    full_kv, fp32_prefill, hf16 = r["ktcli-int8-fp32kv"], r["ktcli-int8-fp32prefill"], r["hf-bf16"]
    engines = {"ktcli-fp32": ours32, "ktcli-bf16": ours16, "ktcli-int8": ours8, "ktcli-int8-fp32kv": full_kv,
               "ktcli-int8-fp32prefill": fp32_prefill, "transformers-fp32": hf, "transformers-bf16": hf16}
    if lcpp.get("available"):
        engines["llama.cpp-q4_1"] = lcpp
    per_engine = {
        name: {
            "weights": e.get("weights"),
            **({"kv_dtype": e["kv_dtype"]} if "kv_dtype" in e else {}),
            **({"prefill_dtype": e["prefill_dtype"]} if "prefill_dtype" in e else {}),
            "lengths": {n: {k: round(v, 2) for k, v in e["lengths"][n].items()} for n in e["lengths"]},
            "peak_rss_mb": round(e["peak_rss_mb"], 1),
        }
        for name, e in engines.items()
    }
    ceiling = {
        "fp32": round(ours32["lengths"]["512"]["decode_ceiling_tok_s"], 2),
        "bf16": round(ours16["lengths"]["512"]["decode_ceiling_tok_s"], 2),
        "int8": round(ours8["lengths"]["512"]["decode_ceiling_tok_s"], 2),
    }
    util = {
        dt: {n: round(e["lengths"][n]["decode_tok_s"] / e["lengths"][n]["decode_ceiling_tok_s"], 3) for n in e["lengths"]}
        for dt, e in (("fp32", ours32), ("bf16", ours16), ("int8", ours8))
    }
    long = str(max(LENGTHS))
    best = max((ours32, ours16, ours8), key=lambda e: e["lengths"][long]["decode_tok_s"])
    vs_lcpp = None
    if lcpp.get("available"):
        vs_lcpp = {n: round(best["lengths"][n]["decode_tok_s"] / lcpp["lengths"][n]["decode_tok_s"], 3) for n in best["lengths"]}
    def greedy_match(other: dict) -> float | None:
        """Share of fp32's greedy tokens that `other` reproduces, position by position."""
        a, b = ours32["greedy_tokens"], other["greedy_tokens"]
        same = sum(x == y for ta, tb in zip(a, b) for x, y in zip(ta, tb))
        total = sum(len(ta) for ta in a)
        return round(same / total, 3) if total else None

    return {
        "benchmark": "engine_vs_hf",
        "machine": machine(),
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to fp32; llama.cpp reads the GGUF)",
        "settings": {"prompt_tokens": list(LENGTHS), "new_tokens": NEW_TOKENS, "greedy": True, "threads": THREADS,
                     "omp_wait_policy": _env().get("OMP_WAIT_POLICY", "unset"),
                     "gomp_spincount": _env()["GOMP_SPINCOUNT"]},
        "engines": per_engine,
        "decode_ceiling_tok_s": ceiling,
        "decode_util": util,
        "decode_ratio": round(ours32["lengths"][long]["decode_tok_s"] / hf["lengths"][long]["decode_tok_s"], 3),
        "prefill_ratio": round(ours32["lengths"][long]["prefill_tok_s"] / hf["lengths"][long]["prefill_tok_s"], 3),
        "bf16_decode_ratio": round(ours16["lengths"][long]["decode_tok_s"] / hf["lengths"][long]["decode_tok_s"], 3),
        # The CPU default (int8 weights; bf16 wide steps where AMX makes them fast) against
        # transformers in fp32 and in bf16, and against its own wide steps in fp32.
        "int8_prefill_ratio": round(ours8["lengths"][long]["prefill_tok_s"] / hf["lengths"][long]["prefill_tok_s"], 3),
        "int8_prefill_vs_hf_bf16": round(ours8["lengths"][long]["prefill_tok_s"] / hf16["lengths"][long]["prefill_tok_s"], 3),
        "int8_prefill_vs_fp32_prefill": {n: round(ours8["lengths"][n]["prefill_tok_s"] / fp32_prefill["lengths"][n]["prefill_tok_s"], 3)
                                         for n in ours8["lengths"]},
        "greedy_match_int8_fp32prefill": greedy_match(fp32_prefill),
        "best_dtype": best["weights"],
        "decode_vs_llamacpp": vs_lcpp,
        "llamacpp_status": "ran" if lcpp.get("available") else lcpp.get("error", "not installed"),
        "int8_decode_ratio": round(ours8["lengths"][long]["decode_tok_s"] / hf["lengths"][long]["decode_tok_s"], 3),
        "greedy_match_bf16": greedy_match(ours16),
        "greedy_match_int8": greedy_match(ours8),
        "int8_fp32kv_decode_ratio": round(full_kv["lengths"][long]["decode_tok_s"] / hf["lengths"][long]["decode_tok_s"], 3),
        "greedy_match_int8_fp32kv": greedy_match(full_kv),
        "greedy_match_bf16_fp32kv": greedy_match(r["greedy-bf16-fp32kv"]),
        "peak_rss_mb": {name: e["peak_rss_mb"] for name, e in per_engine.items()},
        "warm_load_s": {"fp32": round(ours32["warm_load_s"], 2), "bf16": round(ours16["warm_load_s"], 2),
                        "int8": round(ours8["warm_load_s"], 2)},
        "hf_gguf_load_s": round(r["hf-gguf"]["load_s"], 2),
        "hf_folder_load_s": round(hf["load_s"], 2),
        "max_rel_logit_err": r["logits"]["max_rel_logit_err"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each engine; each figure keeps its best")
    parser.add_argument("--name", default="engine_vs_hf", help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker]()))
        return 0
    _model_paths()  # convert once, outside every timing
    results = {}
    for name in ("logits", "hf-gguf", "greedy-bf16-fp32kv"):
        results[name] = run_worker(name)
    # The timed engines run in rounds (each engine once per round, in turn) and each figure
    # keeps its best round: this machine's speed drifts by tens of percent over minutes,
    # and drift only ever slows a run down, so best-of-rounds compares engines more fairly
    # than one pass in which one engine may draw a slow minute.
    for round_ in range(args.rounds):
        for name in TIMED:
            if not args.json:
                print(f"round {round_ + 1}/{args.rounds}: running {name} ...", file=sys.stderr)
            results[name] = best_of(results.get(name), run_worker(name))
    summary = summarize(results)
    summary["settings"]["rounds"] = args.rounds
    from benchmarks.common import write_result

    write_result(args.name, summary)
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
