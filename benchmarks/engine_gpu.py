"""End to end on a GPU: SmolLM2 through our engine on CUDA, each KV dtype and attention
policy, greedy tokens compared with the CPU reference path.

    python -m benchmarks.engine_gpu --json                  # on a CUDA machine
    python -m benchmarks.engine_gpu --smoke --json          # CPU: tiny random Llama, Triton interpreted

`kernels/bench.py` runs this as its end-to-end section (it lives here because it needs
the engine, and `kernels/` never imports ktcli at module level).

For every (KV dtype, policy) the engine runs on the device (weights bf16, pages of that
dtype; for the "fp32" kind weights and pages both fp32, the exactness anchor), generates
`--new-tokens` greedy tokens after a `--prompt-tokens` chat prompt (EOS ignored, so every
run yields the same count), and is compared with the same settings on the CPU with fp32
weights (`kernels` then take their torch reference path): `match_same` is the share of
positions whose token equals the CPU run with the same page dtype, `prefix_same` the
tokens before the first difference; `match_fp32` compares with the CPU's fp32 pages under
the same policy (what quantization costs end to end). CPU references run after all device
runs, fp32 pages first, while `--budget-s` lasts; a skipped one leaves its figure None.

Policies: dense, window (1 sink + 4 local pages), topk (1 + 4 + top 8 of 64-token pages)
with true positions, so attention runs in the Triton kernels; window-remap and topk-remap
add the InfLLM-style remapped positions (torch attention over kernel-stored pages), which
is what `--attention window|topk` runs in the CLI.

--smoke (no GPU needed): a tiny random Llama; the "device" runs are CPU tensors forced
through the Triton kernels under TRITON_INTERPRET=1, the references take the torch path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

POLICIES = ("dense", "window", "topk", "window-remap", "topk-remap")
DEVICE_SHARE = 0.6  # of --budget-s for the device runs; the CPU references get the rest
KINDS = ("fp32", "bf16", "fp8", "int8", "int4")
SAMPLE_TEXT = Path(__file__).resolve().parent.parent / "sample_docs" / "python-tutorial-3.11.rst"


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine_gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--smoke", action="store_true", help="tiny random model on the CPU, Triton interpreted")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--kinds", help=f"KV dtypes (default {','.join(KINDS)}; --smoke: fp32,int8)")
    ap.add_argument("--policies", help=f"(default {','.join(POLICIES)}; --smoke: dense,topk)")
    ap.add_argument("--prompt-tokens", type=int, help="prompt length (default 1536; --smoke 45)")
    ap.add_argument("--new-tokens", type=int, help="greedy tokens (default 32; --smoke 4)")
    ap.add_argument("--weights", default="bf16",
                    help="device weight dtype for the non-fp32 kinds: bf16, fp16, or fp32 (then every page dtype is "
                         "compared with the same page dtype on the CPU: the kernels' exactness alone)")
    ap.add_argument("--triton-cpu", action="store_true",
                    help="the real model's 'device' runs on CPU tensors through the interpreted Triton kernels "
                         "(slow: a logic check of the GPU path without a GPU)")
    ap.add_argument("--budget-s", type=float, default=150.0, help="wall-clock budget; CPU references stop when it is spent")
    ap.add_argument("--device", default="cuda", help="device of the engine runs; cpu checks this script's plumbing on the real model")
    return ap.parse_args(argv)


# -- setup ----------------------------------------------------------------------------


def tiny_llama(folder: Path) -> Path:
    """A random-weight Llama small enough for the Triton interpreter (head_dim 16)."""
    import transformers as tf

    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, initializer_range=0.2)
    torch.manual_seed(1234)
    tf.LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    return folder


def model_folder(spec: str) -> Path:
    import platformdirs

    from ktcli.engine.model_store import ensure_hf_dir, resolve_model

    cache = Path(os.environ.get("KTCLI_CACHE_DIR") or platformdirs.user_cache_dir("ktcli"))
    return ensure_hf_dir(resolve_model(spec), cache)


def make_prompt(backend, n_tokens: int, smoke: bool) -> list[int]:
    """A chat prompt of about n_tokens: the start of the Python tutorial, then a question."""
    if smoke or backend.tokenizer is None:
        g = torch.Generator().manual_seed(11)
        return torch.randint(0, backend.cfg.vocab_size, (n_tokens,), generator=g).tolist()
    text = SAMPLE_TEXT.read_text(encoding="utf-8") if SAMPLE_TEXT.is_file() else "The quick brown fox. " * 4000
    tok = backend.tokenizer
    body = tok.decode(tok.encode(text, add_special_tokens=False)[: max(16, n_tokens - 40)])
    ask = "\n\nWhat is this text about? Answer in three sentences."
    return backend.chat_ids([{"role": "user", "content": body + ask}])


def _policy(name: str):
    from ktcli.engine.longctx import make_policy

    kind = name.removesuffix("-remap")
    return make_policy(kind), name.endswith("-remap")


def _load(folder: Path, device: str, kind: str, policy_name: str, weights: str, smoke: bool):
    from ktcli.engine.native import NativeBackend

    policy, remap = _policy(policy_name)
    kw = dict(block_size=16, prefill_chunk=32) if smoke else dict(prefill_chunk=512)
    return NativeBackend.load(folder, device=device, weights=weights, kv_dtype=kind, attention=policy,
                              position_remap=remap, kv_budget_bytes=(4 << 20) if smoke else (512 << 20), **kw)


def _generate(backend, prompt: list[int], n_new: int) -> tuple[list[int], dict]:
    """Greedy tokens (EOS ignored) and the engine's speed figures."""
    from ktcli.engine.backend import SamplingParams

    out = [tok for _, tok in backend.engine.generate([prompt], SamplingParams(max_new_tokens=n_new), frozenset())]
    st = backend.engine.stats
    figures = {
        "prefill_tok_s": st.prefill_tokens / st.prefill_s if st.prefill_s else None,
        "decode_tok_s": st.decode_tokens / st.decode_s if st.decode_s else None,
    }
    return out, figures


def _match(a: list[int] | None, b: list[int] | None) -> tuple[float | None, int | None]:
    if a is None or b is None:
        return None, None
    n = max(len(a), len(b), 1)
    same = sum(x == y for x, y in zip(a, b))
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same / n, prefix


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


# -- the run ----------------------------------------------------------------------------


def run(args, on_progress=None) -> dict:
    """The rows; `on_progress(result so far)` after each device run (a run cut short by
    its time limit still leaves them)."""
    import kernels

    started = time.perf_counter()
    forced = args.smoke or args.triton_cpu  # CPU tensors forced through the interpreted kernels
    cuda = args.device == "cuda" and torch.cuda.is_available() and not forced
    if args.device == "cuda" and not cuda and not forced:
        return {"skipped": "no CUDA device (use --smoke for a CPU plumbing check)"}
    kinds = (args.kinds or ("fp32,int8" if args.smoke else ",".join(KINDS))).split(",")
    policies = (args.policies or ("dense,topk" if args.smoke else ",".join(POLICIES))).split(",")
    n_prompt = args.prompt_tokens or (45 if args.smoke else 1536)
    n_new = args.new_tokens or (4 if args.smoke else 32)
    device = "cuda" if cuda else "cpu"
    where = ("cpu (TRITON_INTERPRET, smoke)" if args.smoke else "cpu (TRITON_INTERPRET)" if args.triton_cpu
             else "cpu (reference kernels)")
    result: dict = {"device": torch.cuda.get_device_name() if cuda else where,
                    "model": "tiny random llama" if args.smoke else args.model, "smoke": args.smoke,
                    "prompt_tokens": None, "new_tokens": n_new, "weights": args.weights, "rows": []}
    t0 = time.perf_counter()
    tmp = None
    try:
        if args.smoke:
            tmp = tempfile.TemporaryDirectory()
            folder = tiny_llama(Path(tmp.name) / "llama")
        else:
            folder = model_folder(args.model)
    except Exception as e:  # noqa: BLE001 - the report says why, the caller goes on
        result["error"] = f"model: {_error(e)}"
        return result
    result["model_prepare_s"] = time.perf_counter() - t0
    deadline = started + args.budget_s + result["model_prepare_s"]  # a one-time conversion is not the bench's
    device_deadline = deadline - (1 - DEVICE_SHARE) * args.budget_s

    prompt = None
    rows: list[dict] = result["rows"]
    try:
        # Device runs: CUDA tensors dispatch to Triton; in smoke CPU tensors are forced there.
        kernels.set_backend("triton" if forced else "auto")
        for kind in kinds:
            for pol in policies:
                weights = "fp32" if kind == "fp32" or forced else args.weights
                row = {"kind": kind, "policy": pol, "weights": weights}
                rows.append(row)
                if time.perf_counter() > device_deadline:  # leave the CPU references their share
                    row["skipped"] = "time budget"
                    continue
                try:
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    b = _load(folder, device, kind, pol, weights, args.smoke)
                    if prompt is None:
                        prompt = make_prompt(b, n_prompt, args.smoke)
                        result["prompt_tokens"] = len(prompt)
                    t = time.perf_counter()
                    row["tokens"], figures = _generate(b, prompt, n_new)
                    row["run_s"] = time.perf_counter() - t
                    row.update(figures)
                    if cuda:
                        row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
                    del b
                except Exception as e:  # noqa: BLE001
                    row["error"] = _error(e)
                    if os.environ.get("KTCLI_DEBUG"):
                        traceback.print_exc()
                print(f"device {kind:5} {pol:12} " + (row.get("error") or f"{row['run_s']:.1f} s"), flush=True)
                if on_progress is not None:
                    on_progress(result)
        if cuda:
            try:
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001 - a kernel's fault poisons the context: its rows say so
                pass

        # CPU references (fp32 weights, kernels' torch path): fp32 pages first, they
        # anchor every float kind; then the quantized kinds, while the budget lasts.
        kernels.set_backend("reference")
        refs: dict[tuple[str, str], list[int] | str] = {}
        exact = args.weights == "fp32" or forced  # fp32 weights on both sides: each kind vs its own pages
        ref_kinds = ["fp32"] + [k for k in kinds if k != "fp32" and (exact or k not in ("bf16", "fp16"))]
        for kind in ref_kinds:
            for pol in policies:
                if prompt is None:
                    break
                if time.perf_counter() > deadline:
                    refs[(kind, pol)] = "skipped: time budget"
                    continue
                try:
                    b = _load(folder, "cpu", kind, pol, "fp32", args.smoke)
                    refs[(kind, pol)], _ = _generate(b, prompt, n_new)
                    del b
                except Exception as e:  # noqa: BLE001
                    refs[(kind, pol)] = f"error: {_error(e)}"
                print(f"cpu    {kind:5} {pol:12} " + ("done" if isinstance(refs[(kind, pol)], list)
                                                    else refs[(kind, pol)]), flush=True)
    finally:
        kernels.set_backend("auto")
        if tmp is not None:
            tmp.cleanup()

    for row in rows:
        same_kind = row["kind"] if row["weights"] == "fp32" else "fp32" if row["kind"] in ("bf16", "fp16") else row["kind"]
        for label, kind in (("same", same_kind), ("fp32", "fp32")):
            ref = refs.get((kind, row["policy"]))
            ok = isinstance(ref, list)
            row[f"match_{label}"], row[f"prefix_{label}"] = _match(row.get("tokens"), ref if ok else None)
            if not ok and ref is not None:
                row[f"ref_{label}"] = ref
    result["cpu_refs_run"] = sum(isinstance(r, list) for r in refs.values())
    result["wall_s"] = time.perf_counter() - started
    return result


def print_table(result: dict) -> None:
    print("\nend to end: device engine vs CPU reference (greedy tokens)")
    if "skipped" in result or "error" in result:
        print("  " + result.get("skipped", result.get("error", "")))
        return
    print(f"  {result['model']} on {result['device']}, prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new")
    print(f"{'kind':6} {'policy':12} {'weights':7} {'match':>6} {'prefix':>6} {'vs fp32':>7} {'decode/s':>9}  note")
    for r in result["rows"]:
        fmt = lambda x, f: format("-" if x is None else format(x, f), f">{f.split('.')[0].rstrip('d')}")  # noqa: E731
        note = r.get("error") or (f"skipped: {r['skipped']}" if "skipped" in r else "") or r.get("ref_same") or ""
        print(f"{r['kind']:6} {r['policy']:12} {r['weights']:7} {fmt(r.get('match_same'), '6.2f')} "
              f"{fmt(r.get('prefix_same'), '6d')} {fmt(r.get('match_fp32'), '7.2f')} "
              f"{fmt(r.get('decode_tok_s'), '9.1f')}  {note}")


def main(argv=None) -> int:
    args = _parse(argv)
    if args.smoke or args.triton_cpu or not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first kernel import
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    def save(result: dict) -> None:
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2))

    result = run(args, on_progress=save)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    save(result)
    return 1 if any("error" in r for r in result.get("rows", [])) or "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
