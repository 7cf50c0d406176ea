"""End to end on a GPU: SmolLM2 through our engine on CUDA, each KV dtype and attention
policy, greedy tokens compared with CPU reference tokens.

    python -m benchmarks.engine_gpu --json                  # on a CUDA machine
    python -m benchmarks.engine_gpu --make-refs             # here, once: the CPU references (10-20 min)
    python -m benchmarks.engine_gpu --check-refs            # are the committed references current?
    python -m benchmarks.engine_gpu --smoke --json          # CPU: tiny random Llama, Triton interpreted

`kernels/bench.py` runs this as its end-to-end section (it lives here because it needs
the engine, and `kernels/` never imports ktcli at module level).

For every (KV dtype, policy) the engine runs on the device (weights `--weights`, default
fp32: then every page dtype meets its own CPU twin and a difference is the kernels', not
the weights'; pages of that dtype, staged at `--stage`), generates `--new-tokens` greedy
tokens after a `--prompt-tokens` chat prompt (EOS ignored, so every run yields the same
count), and is compared with the same settings on the CPU with fp32 weights (`kernels`
then take their torch reference path).

With the reference at hand (precomputed, below) the device is teacher forced: fed the
reference's tokens, its argmax is compared at every position in the same context, so a
near-tie flip at token 7 no longer hides the 25 positions after it (free-running greedy
tokens measure only "steps until the first flip"; `--free-run` goes back to that).
`match_same` is the share of positions whose device argmax equals the CPU's token with
the same page dtype, `prefix_same` the positions before the first difference (the same
as free running), `flips` each difference with the reference's top-1 margin (a flip at a
margin of 1e-4 is a tie broken by rounding; one at 2.0 is a bug) and the device's margin
over the reference's token, `max_dlogit` the largest |device - CPU| logit of the
reference's token. `match_fp32` is the CPU references' own same-kind against fp32 pages
(what quantization costs end to end); free running, the device's tokens against them.

The CPU references need no GPU, so they are computed beforehand (`--make-refs`) and
committed as `benchmarks/results/engine_gpu_cpu_refs.json` (the prompt's ids, 32 tokens
per kind and policy, and the int4 key-width weights the CPU measured: `key_calibration`
keeps them per process, and the device runs must use the same ones or their int4 widths
differ), and each position's top-two logits. The file is keyed by the model file's
sha256, the settings and a hash of each engine source file. A run refuses one made for
another model or settings (its rows then carry tokens but no match: `--rematch` compares
them later with fresh references), or with `--recompute-refs` computes the references
itself on the device machine's CPU after the device rows (fp32 pages first, while
`--budget-s` lasts: the old way, where 20 references did not fit 60 s on 16 cores).
Changed engine sources alone are reported on the device, not refused (`--strict-refs`
refuses them): `--check-refs`, which device_bench.sh runs before the calls, refuses them
where refreshing costs no device time. References are deterministic on one CPU (two runs
here matched in 25 of 25 cells); another CPU's matmul order can differ in the last bit,
as the GPU's does.

Kinds run int4 and int8 first (what the last GPU run left unchecked end to end), then the
fp32 anchor, bf16 (the bf16 tensor-core dots) and fp8 (whose pages differ from the CPU's
scale rounding too: read it as quality, not exactness). `--budget-s` covers the whole run,
model preparation (a GGUF's conversion, ~28 s) included; rows past it are marked skipped.

Policies: dense, window (1 sink + 4 local pages), topk (1 + 4 + top 8 of 64-token pages)
with true positions, so attention runs in the Triton kernels; window-remap and topk-remap
add the InfLLM-style remapped positions (torch attention over kernel-stored pages), which
is what `--attention window|topk` runs in the CLI.

--smoke (no GPU needed): a tiny random Llama; the "device" runs are CPU tensors forced
through the Triton kernels under TRITON_INTERPRET=1, the references take the torch path
(computed in the run unless `--refs` names a file).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("dense", "window", "topk", "window-remap", "topk-remap")
DEVICE_SHARE = 0.6  # of --budget-s for the device runs when the CPU references run here too
# int4 and int8 first: the rows the last GPU run's budget skipped (BENCHMARKS.md asks for
# them), then the fp32 anchor, bf16 (tensor-core bf16 dots) and fp8 (not exact: see above).
KINDS = ("int4", "int8", "fp32", "bf16", "fp8")
SAMPLE_TEXT = ROOT / "sample_docs" / "python-tutorial-3.11.rst"
REFS = ROOT / "benchmarks" / "results" / "engine_gpu_cpu_refs.json"
REFS_FORMAT = 2  # 2: each position's top-two logits beside the tokens (teacher forcing)
# The loads of both sides; part of the references' key.
LOAD = dict(prefill_chunk=512, kv_budget_bytes=512 << 20)
SMOKE_LOAD = dict(block_size=16, prefill_chunk=32, kv_budget_bytes=4 << 20)
# Where the CPU reference's tokens come from: a change here can change them.
CODE_GLOBS = ("kernels/*.py", "ktcli/engine/*.py", "ktcli/engine/data/*")
# The Triton side and the bench: no part of the CPU path.
CODE_EXCLUDE = ("kernels/bench.py", "kernels/compile_check.py", "kernels/_page_io.py", "kernels/kv_store_triton.py",
                "kernels/paged_attention.py", "kernels/prefill_attention.py", "kernels/sparse_attention.py")


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
    ap.add_argument("--weights", default="fp32",
                    help="device weight dtype for the non-fp32 kinds: fp32 (default: every page dtype is compared "
                         "with the same page dtype on the CPU, the kernels' exactness alone), bf16 (what users run: "
                         "then bf16 pages meet the CPU's fp32 pages) or fp16")
    ap.add_argument("--stage", choices=("auto", "fp32", "fp16"),
                    help="staging precision of quantized kinds on the device (default: fp32 with --weights fp32, "
                         "so the kernels' dots are fp32 like the CPU's; else auto, the engine's fp16 on CUDA)")
    ap.add_argument("--free-run", action="store_true",
                    help="each side generates from its own tokens (default with references at hand: the device "
                         "is fed the reference's tokens, teacher forcing, and its argmax compared at every position)")
    ap.add_argument("--triton-cpu", action="store_true",
                    help="the real model's 'device' runs on CPU tensors through the interpreted Triton kernels "
                         "(slow: a logic check of the GPU path without a GPU)")
    ap.add_argument("--budget-s", type=float, default=180.0,
                    help="wall-clock budget of the whole run, model preparation included; rows past it are skipped")
    ap.add_argument("--device", default="cuda", help="device of the engine runs; cpu checks this script's plumbing on the real model")
    ap.add_argument("--refs", help=f"precomputed CPU references (default {REFS.relative_to(ROOT)}; --smoke: none)")
    ap.add_argument("--recompute-refs", action="store_true",
                    help="references missing from --refs, or all when it is absent or stale: computed in this run "
                         "on this machine's CPU after the device rows")
    ap.add_argument("--refs-ignore-code", action="store_true",
                    help="accept references made by other engine sources without a word (the model, settings and "
                         "prompt must still match)")
    ap.add_argument("--strict-refs", action="store_true",
                    help="refuse references made by other engine sources (default: use them, and say which files "
                         "changed; --check-refs and device_bench.sh split refuse them)")
    ap.add_argument("--make-refs", action="store_true", help="compute the CPU references and write --refs (no device)")
    ap.add_argument("--check-refs", action="store_true", help="exit 0 when --refs is current, else 1 and why")
    ap.add_argument("--rematch", metavar="RESULT_JSON",
                    help="a device run's JSON: compare its tokens with --refs again, print the table")
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


def _sha256_files(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_sha256(path: Path) -> str:
    """The model's identity: a file's sha256 (the GGUF both sides convert), or a folder's
    weights, config and tokenizer files hashed in name order."""
    path = Path(path)
    if path.is_file():
        return _sha256_files([path])
    return _sha256_files(sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json")))


def model_source_sha256(spec: str) -> str:
    from ktcli.engine.model_store import resolve_model

    return model_sha256(resolve_model(spec).path)


def code_hashes() -> dict[str, str]:
    """sha256 (16 hex) of each source file the CPU reference path runs."""
    files = sorted({p for g in CODE_GLOBS for p in ROOT.glob(g) if p.is_file()})
    return {str(p.relative_to(ROOT)): _sha256_files([p])[:16] for p in files
            if str(p.relative_to(ROOT)) not in CODE_EXCLUDE and "__pycache__" not in p.parts}


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


def prompt_sha256(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def _policy(name: str):
    from ktcli.engine.longctx import make_policy

    kind = name.removesuffix("-remap")
    return make_policy(kind), name.endswith("-remap")


def _load(folder: Path, device: str, kind: str, policy_name: str, weights: str, smoke: bool, stage: str | None = None):
    from ktcli.engine.native import NativeBackend

    policy, remap = _policy(policy_name)
    kw = SMOKE_LOAD if smoke else LOAD
    return NativeBackend.load(folder, device=device, weights=weights, kv_dtype=kind, attention=policy,
                              position_remap=remap, stage_dtype=stage, **kw)


class _Trace:
    """The engine's sampler for one greedy sequence, recording at each position this side's
    argmax, its top two logits and (when forcing) its logit of the forced token; with
    `forced` tokens it returns those instead of its own (teacher forcing: every position
    then sees the reference's context, so one near-tie flip does not end the comparison)."""

    def __init__(self, forced: list[int] | None = None):
        self.forced = forced
        self.rows: list[list] = []

    def __call__(self, logits, params, generators):
        if logits.shape[0] != 1:
            raise RuntimeError("engine_gpu traces one sequence")
        row = logits[0].float()
        first = int(row.argmax())  # the first maximal index, as the engine's greedy choice
        top1 = float(row[first])
        second = int(row.clone().index_fill_(0, torch.tensor([first], device=row.device), -float("inf")).argmax())
        rec = [first, top1, second, float(row[second])]
        i = len(self.rows)
        if self.forced is not None and i < len(self.forced):
            rec.append(float(row[self.forced[i]]))
            token = self.forced[i]
        else:
            token = first
        self.rows.append(rec)
        return [token]


def _generate(backend, prompt: list[int], n_new: int, forced: list[int] | None = None) -> tuple[list[int], dict, list]:
    """This side's greedy token at each position (EOS ignored; with `forced`, the tokens fed
    are those), the engine's speed figures, and each position's record (`_Trace`)."""
    from ktcli.engine import runner
    from ktcli.engine.backend import SamplingParams

    trace = _Trace(forced)
    real, runner.sample = runner.sample, trace
    try:
        out = [tok for _, tok in backend.engine.generate([prompt], SamplingParams(max_new_tokens=n_new), frozenset())]
    finally:
        runner.sample = real
    if len(trace.rows) != len(out):
        raise RuntimeError(f"traced {len(trace.rows)} positions for {len(out)} tokens")
    st = backend.engine.stats
    figures = {
        "prefill_tok_s": st.prefill_tokens / st.prefill_s if st.prefill_s else None,
        "decode_tok_s": st.decode_tokens / st.decode_s if st.decode_s else None,
    }
    return [r[0] for r in trace.rows], figures, trace.rows


def ref_kind(kind: str, weights: str) -> str:
    """The CPU reference (fp32 weights) a device row meets: its own page kind, except bf16 /
    fp16 pages under 16-bit weights, which meet fp32 pages."""
    return kind if weights == "fp32" else "fp32" if kind in ("bf16", "fp16") else kind


def forcing_figures(trace: list[list], ref_logits: list[list] | None, ref_tokens: list[int]) -> dict:
    """What teacher forcing shows per position: where this side's argmax left the
    reference's token (`flips`: [position, the reference's top-1 margin, this side's
    margin over the reference's token]; a flip at a near-tie is noise, one at a wide margin
    a bug), and the largest |this side's - the reference's logit| of the reference's token."""
    flips, dl, margins = [], [], []
    for i, (rec, tok) in enumerate(zip(trace, ref_tokens)):
        ref = ref_logits[i] if ref_logits and i < len(ref_logits) else None  # [top1, id2, top2]
        at_tok = rec[4] if len(rec) > 4 else None
        if ref is not None:
            margins.append(ref[0] - ref[2])
            if at_tok is not None:
                dl.append(abs(at_tok - ref[0]))
        if rec[0] != tok:
            flips.append([i, None if ref is None else round(ref[0] - ref[2], 6),
                          None if at_tok is None else round(rec[1] - at_tok, 6)])
    return {"teacher_forced": True, "flips": flips, "max_dlogit": max(dl) if dl else None,
            "min_ref_margin": min(margins) if margins else None}


def _match(a: list[int] | None, b: list[int] | None) -> tuple[float | None, int | None]:
    if a is None or b is None:
        return None, None
    n = max(len(a), len(b), 1)
    same = sum(x == y for x, y in zip(a, b))
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same / n, prefix


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


# -- the CPU references -----------------------------------------------------------------


def _sizes(args) -> tuple[int, int]:
    return args.prompt_tokens or (45 if args.smoke else 1536), args.new_tokens or (4 if args.smoke else 32)


def refs_key(args, model_id: str) -> dict:
    """What the CPU reference tokens depend on besides the code: a reference file with
    another key is stale."""
    n_prompt, n_new = _sizes(args)
    load = SMOKE_LOAD if args.smoke else LOAD
    return {"format": REFS_FORMAT, "model_sha256": model_id, "prompt_tokens": n_prompt, "new_tokens": n_new,
            "weights": "fp32", "smoke": bool(args.smoke), "load": dict(load),
            "policies": {p: repr(_policy(p)) for p in POLICIES}}


def refs_path(args) -> Path | None:
    if args.refs:
        return Path(args.refs)
    return None if args.smoke else REFS


def check_refs(doc: dict | None, key: dict, ignore_code: bool = False) -> str | None:
    """None when the reference file `doc` was made for `key` and the current sources, else
    why not (one line)."""
    if doc is None:
        return "no reference file"
    old = doc.get("key") or {}
    diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
    if diff:
        return "made for another " + ", ".join(diff) + " (refresh: python -m benchmarks.engine_gpu --make-refs)"
    changed = [] if ignore_code else code_changed(doc)
    if changed:
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        return (f"engine sources changed since: {', '.join(changed[:4])}{more} (refresh: python -m "
                "benchmarks.engine_gpu --make-refs; or --refs-ignore-code if they cannot change the tokens)")
    return None


def code_changed(doc: dict) -> list[str]:
    """The engine source files that differ from those the references were made with."""
    now, then = code_hashes(), doc.get("code") or {}
    return sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f))


def read_refs(path: Path | None) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _weights_to_json(w: torch.Tensor) -> dict:
    """float32 weights, exactly: little-endian bytes in base64."""
    raw = w.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4").tobytes()
    return {"shape": list(w.shape), "dtype": "float32", "base64": base64.b64encode(raw).decode(),
            "sha256": hashlib.sha256(raw).hexdigest()}


def _weights_from_json(d: dict) -> torch.Tensor:
    import numpy as np

    raw = base64.b64decode(d["base64"])
    if hashlib.sha256(raw).hexdigest() != d["sha256"]:
        raise ValueError("int4 key weights: sha256 mismatch")
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy()).view(*d["shape"])


def _key_weights_key(folder: Path) -> str:
    from ktcli.engine import key_calibration

    return key_calibration._kept_at(folder, None)[0]


def use_key_weights(folder: Path, doc: dict | None) -> bool:
    """Give this process's int4 loads the key weights the references were made with (a
    load measures its own otherwise: on another device, other weights, other widths)."""
    from ktcli.engine import key_calibration

    if not doc or not doc.get("int4_key_weights"):
        return False
    key_calibration._memo[_key_weights_key(folder)] = _weights_from_json(doc["int4_key_weights"])
    return True


def _cpu_ref(folder: Path, kind: str, pol: str, prompt: list[int], n_new: int, smoke: bool):
    """(tokens, [top-1 logit, top-2 id, top-2 logit] per position) on the CPU, fp32 weights."""
    import kernels

    kernels.set_backend("reference")
    try:
        b = _load(folder, "cpu", kind, pol, "fp32", smoke)
        toks, _, trace = _generate(b, prompt, n_new)
        del b
        return toks, [[round(r[1], 6), r[2], round(r[3], 6)] for r in trace]  # 1e-6: float32's own grain here
    finally:
        kernels.set_backend("auto")


def make_refs(args) -> dict:
    """The CPU references for every (kind, policy) asked, written to `refs_path(args)`
    after each one (a run cut short keeps what it computed)."""
    os.environ.setdefault("KTCLI_NO_CPP_KERNELS", "1")  # the torch path, as on the device machine
    from ktcli.engine import key_calibration

    kinds = (args.kinds or ",".join(KINDS)).split(",")
    policies = (args.policies or ",".join(POLICIES)).split(",")
    n_prompt, n_new = _sizes(args)
    path = refs_path(args)
    tmp = None
    started = time.perf_counter()
    try:
        if args.smoke:
            tmp = tempfile.TemporaryDirectory()
            folder = tiny_llama(Path(tmp.name) / "llama")
            model_id = model_sha256(folder)
        else:
            folder = model_folder(args.model)
            model_id = model_source_sha256(args.model)
        doc = {"key": refs_key(args, model_id), "code": code_hashes(),
               "made": {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
                        "threads": torch.get_num_threads(), "python": platform.python_version(),
                        "cpu_path": "kernels.reference (KTCLI_NO_CPP_KERNELS=1)",
                        "when": time.strftime("%Y-%m-%d %H:%M:%S")},
               "prompt": None, "int4_key_weights": None, "refs": {}, "logits": {}, "seconds": {}}

        def save():
            doc["made"]["wall_s"] = round(time.perf_counter() - started, 1)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.with_suffix(".tmp").write_text(json.dumps(doc, indent=1) + "\n")
                os.replace(path.with_suffix(".tmp"), path)

        for kind in kinds:
            for pol in policies:
                t = time.perf_counter()
                if doc["prompt"] is None:
                    import kernels

                    kernels.set_backend("reference")
                    b = _load(folder, "cpu", "fp32", "dense", "fp32", args.smoke)  # for its tokenizer
                    doc["prompt"] = make_prompt(b, n_prompt, args.smoke)
                    kernels.set_backend("auto")
                    del b
                doc["refs"][f"{kind}/{pol}"], doc["logits"][f"{kind}/{pol}"] = _cpu_ref(
                    folder, kind, pol, doc["prompt"], n_new, args.smoke)
                doc["seconds"][f"{kind}/{pol}"] = round(time.perf_counter() - t, 1)
                if kind == "int4" and doc["int4_key_weights"] is None:
                    w = key_calibration._memo.get(_key_weights_key(folder))
                    doc["int4_key_weights"] = None if w is None else _weights_to_json(w)
                print(f"cpu ref {kind:5} {pol:12} {doc['seconds'][f'{kind}/{pol}']:6.1f} s", flush=True)
                save()
        save()
        return doc
    finally:
        if tmp is not None:
            tmp.cleanup()


def attach_matches(rows: list[dict], refs: dict) -> None:
    """match_/prefix_ fields of each row against references {"kind/policy": tokens or why not}.
    A teacher-forced row's tokens are its argmaxes in the same-kind reference's context, so
    its `match_fp32` is that reference's own against fp32 pages (what quantization costs,
    on the CPU): `match_fp32_of` says so."""
    for row in rows:
        same = ref_kind(row["kind"], row["weights"])
        for label, kind in (("same", same), ("fp32", "fp32")):
            ref = refs.get(f"{kind}/{row['policy']}")
            ok = isinstance(ref, list)
            mine = row.get("tokens")
            if label == "fp32" and row.get("teacher_forced"):
                mine = refs.get(f"{same}/{row['policy']}")
                mine = mine if isinstance(mine, list) else None
                row["match_fp32_of"] = "cpu references"
            row[f"match_{label}"], row[f"prefix_{label}"] = _match(mine, ref if ok else None)
            row.pop(f"ref_{label}", None)
            if not ok:
                row[f"ref_{label}"] = ref if ref is not None else "no reference"


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
    n_prompt, n_new = _sizes(args)
    device = "cuda" if cuda else "cpu"
    stage = args.stage or ("fp32" if args.weights == "fp32" else "auto")
    where = ("cpu (TRITON_INTERPRET, smoke)" if args.smoke else "cpu (TRITON_INTERPRET)" if args.triton_cpu
             else "cpu (reference kernels)")
    result: dict = {"device": torch.cuda.get_device_name() if cuda else where,
                    "model": "tiny random llama" if args.smoke else args.model, "smoke": args.smoke,
                    "prompt_tokens": None, "new_tokens": n_new, "weights": args.weights, "stage": stage,
                    "budget_s": args.budget_s, "rows": []}
    deadline = started + args.budget_s  # model preparation included: the caller's clock is the real one
    t0 = time.perf_counter()
    tmp = None
    try:
        if args.smoke:
            tmp = tempfile.TemporaryDirectory()
            folder = tiny_llama(Path(tmp.name) / "llama")
            model_id = model_sha256(folder)
        else:
            folder = model_folder(args.model)
            model_id = model_source_sha256(args.model)
    except Exception as e:  # noqa: BLE001 - the report says why, the caller goes on
        result["error"] = f"model: {_error(e)}"
        return result
    result["model_prepare_s"] = time.perf_counter() - t0
    result["model_sha256"] = model_id

    # The precomputed references, if current: then the device rows get the whole budget.
    path = refs_path(args)
    doc = read_refs(path)
    # On the device another engine source than the references' is said, not refused (unless
    # --strict-refs): device time must not be lost to a commit that cannot change the tokens
    # (an error message, the HTTP backend); `split` (device_bench.sh) refuses it beforehand,
    # where refreshing costs no device time, and --rematch compares later with fresh ones.
    stale = check_refs(doc, refs_key(args, model_id), ignore_code=args.refs_ignore_code or not args.strict_refs)
    stale = stale if path is not None else None  # no file asked for (smoke): computed below, nothing is stale
    refs: dict = dict(doc["refs"]) if doc and not stale else {}
    result["refs"] = {"path": str(path) if path else None, "stale": stale,
                      "made": doc.get("made") if doc else None, "computed_here": 0}
    if refs and not args.refs_ignore_code and code_changed(doc):
        result["refs"]["code_changed"] = code_changed(doc)
        print(f"engine_gpu: CPU references {path}: made with other engine sources ({', '.join(code_changed(doc))}); "
              "used anyway (--strict-refs refuses them)", file=sys.stderr, flush=True)
    if stale and path is not None:
        print(f"engine_gpu: CPU references {path}: {stale}" +
              ("; computing them here after the device rows" if args.recompute_refs else
               "; the rows keep their tokens (compare later: --rematch)"), file=sys.stderr, flush=True)
    if refs:
        use_key_weights(folder, doc)
    ref_logits = (doc.get("logits") or {}) if refs else {}
    teach = not args.free_run
    recompute = args.recompute_refs or path is None
    device_deadline = deadline - (1 - DEVICE_SHARE) * args.budget_s if recompute and not refs else deadline

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
                    b = _load(folder, device, kind, pol, weights, args.smoke, None if stage == "auto" else stage)
                    if prompt is None:
                        prompt = make_prompt(b, n_prompt, args.smoke)
                        result["prompt_tokens"] = len(prompt)
                        result["prompt_sha256"] = prompt_sha256(prompt)
                        if refs and doc.get("prompt") != prompt:  # another tokenizer, say
                            stale = result["refs"]["stale"] = "the prompt's token ids differ from the references'"
                            print(f"engine_gpu: CPU references: {stale}", file=sys.stderr, flush=True)
                            refs, ref_logits = {}, {}
                    ref = refs.get(f"{ref_kind(kind, weights)}/{pol}") if teach else None
                    ref = ref if isinstance(ref, list) else None
                    t = time.perf_counter()
                    row["tokens"], figures, trace = _generate(b, prompt, n_new, forced=ref)
                    row["run_s"] = time.perf_counter() - t
                    row.update(figures)
                    if ref is not None:
                        row.update(forcing_figures(trace, ref_logits.get(f"{ref_kind(kind, weights)}/{pol}"), ref))
                    if cuda:
                        row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
                    del b
                except Exception as e:  # noqa: BLE001
                    row["error"] = _error(e)
                    if os.environ.get("KTCLI_DEBUG"):
                        traceback.print_exc()
                attach_matches([row], refs)
                print(f"device {kind:5} {pol:12} " + (row.get("error") or f"{row['run_s']:.1f} s, match "
                                                      f"{_fmt(row.get('match_same'), '.2f')}"), flush=True)
                if on_progress is not None:
                    result["wall_s"] = time.perf_counter() - started
                    on_progress(result)
        if cuda:
            try:
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001 - a kernel's fault poisons the context: its rows say so
                pass

        # CPU references not precomputed (asked for, or in smoke): fp32 pages first, they
        # anchor every float kind; then the quantized kinds, while the budget lasts.
        if recompute and prompt is not None:
            exact = args.weights == "fp32" or forced  # fp32 weights on both sides: each kind vs its own pages
            ref_kinds = ["fp32"] + [k for k in kinds if k != "fp32" and (exact or k not in ("bf16", "fp16"))]
            for kind in ref_kinds:
                for pol in policies:
                    if f"{kind}/{pol}" in refs:
                        continue
                    if time.perf_counter() > deadline:
                        refs[f"{kind}/{pol}"] = "skipped: time budget"
                        continue
                    try:
                        refs[f"{kind}/{pol}"] = _cpu_ref(folder, kind, pol, prompt, n_new, args.smoke)[0]
                        result["refs"]["computed_here"] += 1
                    except Exception as e:  # noqa: BLE001
                        refs[f"{kind}/{pol}"] = f"error: {_error(e)}"
                    print(f"cpu    {kind:5} {pol:12} " + ("done" if isinstance(refs[f"{kind}/{pol}"], list)
                                                        else refs[f"{kind}/{pol}"]), flush=True)
    finally:
        kernels.set_backend("auto")
        if tmp is not None:
            tmp.cleanup()

    attach_matches(rows, refs)
    result["cpu_refs_run"] = result["refs"]["computed_here"]
    result["wall_s"] = time.perf_counter() - started
    return result


def rematch(result: dict, doc: dict | None) -> dict:
    """A device run's result compared again with a reference file (made after the run, say)."""
    if doc is None:
        raise SystemExit("engine_gpu --rematch: no reference file")
    if result.get("model_sha256") and result["model_sha256"] != doc["key"].get("model_sha256"):
        raise SystemExit("engine_gpu --rematch: the references are for another model file")
    if result.get("prompt_sha256") != prompt_sha256(doc.get("prompt") or []):
        raise SystemExit("engine_gpu --rematch: the references were made for another prompt")
    attach_matches(result.get("rows", []), doc["refs"])
    result.setdefault("refs", {})["rematched"] = doc.get("made")
    return result


def _fmt(x, f):
    return "-" if x is None else format(x, f)


def print_table(result: dict) -> None:
    print("\nend to end: device engine vs CPU reference (greedy tokens)")
    if "skipped" in result or "error" in result:
        print("  " + result.get("skipped", result.get("error", "")))
        return
    print(f"  {result['model']} on {result['device']}, prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new"
          f", stage {result.get('stage', '-')}")
    if (result.get("refs") or {}).get("stale"):
        print(f"  CPU references: {result['refs']['stale']}")
    if any(r.get("teacher_forced") for r in result["rows"]):
        print("  teacher forced: match = argmax agreement at each position in the reference's context; "
              "flips = [position, reference margin, device margin]; vs fp32 = the CPU references' own")
    print(f"{'kind':6} {'policy':12} {'weights':7} {'match':>6} {'prefix':>6} {'vs fp32':>7} {'max dlogit':>10} "
          f"{'decode/s':>9}  flips / note")
    for r in result["rows"]:
        fmt = lambda x, f: format("-" if x is None else format(x, f), f">{f.split('.')[0].rstrip('d')}")  # noqa: E731
        note = r.get("error") or (f"skipped: {r['skipped']}" if "skipped" in r else "") or r.get("ref_same") or ""
        if not note and r.get("flips"):
            note = " ".join(f"{p}:{m}/{g}" for p, m, g in r["flips"][:6]) + (" ..." if len(r["flips"]) > 6 else "")
        print(f"{r['kind']:6} {r['policy']:12} {r['weights']:7} {fmt(r.get('match_same'), '6.2f')} "
              f"{fmt(r.get('prefix_same'), '6d')} {fmt(r.get('match_fp32'), '7.2f')} {fmt(r.get('max_dlogit'), '10.2e')} "
              f"{fmt(r.get('decode_tok_s'), '9.1f')}  {note}")


def main(argv=None) -> int:
    args = _parse(argv)
    if args.smoke or args.triton_cpu or not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first kernel import
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.make_refs:
        doc = make_refs(args)
        print(f"wrote {refs_path(args)}: {len(doc['refs'])} references, {doc['made']['wall_s']} s")
        return 0
    if args.check_refs:
        model_id = model_source_sha256(args.model) if not args.smoke else None
        stale = check_refs(read_refs(refs_path(args)), refs_key(args, model_id), args.refs_ignore_code)
        print(f"{refs_path(args)}: {stale or 'current'}")
        return 1 if stale else 0
    if args.rematch:
        result = rematch(json.loads(Path(args.rematch).read_text()), read_refs(refs_path(args)))
        print(json.dumps(result)) if args.json else print_table(result)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))
        return 0

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
