"""Check and time every kernel on a CUDA GPU, in one command.

    python -m kernels.bench        # on a GPU: writes benchmarks/results/kernels_gpu.json
    python -m kernels.bench --smoke --out /tmp/k.json   # CPU: logic only, TRITON_INTERPRET=1

It first checks every Triton kernel against the torch reference on small shapes, for every
page kind (``--check-kinds``: fp32, bf16, fp16, fp8, int8, int4; pass/fail and max error;
the kv_store codes bit for bit against the reference run on the CPU), then, for the timed
kinds (``--kinds``), one Llama-3-8B-shaped layer (32 query heads, 8 kv heads, head_dim
128), one sequence and contexts from 4K to 1M tokens, times:

* decode (dense): against the memory floor (the bytes dense decode reads of the layer,
  ``decode_read_bytes``, at the GPU's measured copy bandwidth) and against torch SDPA on
  dense fp16 tensors of the same context;
* sparse decode (Quest): page scoring, selection (the Triton kernel, and torch's
  ``reference.select_pages`` as its baseline) and attention over 1/16 of the pages;
* chunked prefill: a 512-query chunk at the end of the context, against SDPA (no mask:
  the same work as the causal chunk to within 512 keys);
* where pages are smaller than a loop step's 64 rows (the default 16-token pages), the
  three attention kernels again reading one page a step (``*_1page_s``, ``dec_1pg``...):
  the same-run baseline of the wider step;
* decode and prefill again at 4 warps a program (``*_4warps_s``, ``dec_4w``, ``pf_4w``):
  the same-run baseline of ``ATTENTION_WARPS`` (8, chosen from ptxas's register spills);
* kv_store: one decode token, and a 4096-token prefill chunk; and the decode token's
  store as the engine runs it per layer (its plan made once per step, applied per layer).

End to end (``benchmarks/engine_gpu.py``, run from the repo root; ``--no-e2e`` skips it):
SmolLM2 through our engine on CUDA with each KV dtype (int4 and int8 first, then fp32, bf16,
fp8) and policy (dense, window, topk, and window and topk with remapped positions), 32
greedy tokens after a ~1.5K-token prompt, fp32 weights by default (``--e2e-weights``),
compared with CPU reference tokens precomputed on fp32 weights
(``benchmarks/results/engine_gpu_cpu_refs.json``), teacher forced: the device is fed the
reference's tokens and its argmax compared at every position, with the reference's margin
at each flip; in ``--smoke`` a tiny random Llama
whose "device" runs go through the interpreted Triton kernels.

Prints tables and writes everything as JSON to ``--out`` (on a GPU by default
``benchmarks/results/kernels_gpu.json``). A check or timing that fails is reported in its
row and the rest go on. Without CUDA (and without ``--smoke``) it says so and exits 0.

Budgets, so a run with everything stays under 5 minutes on one GPU (``--total-budget-s``
270 s from the start caps it; the call's setup, imports and a last row's overrun take the
remaining ~30 s):

* checks: no budget, they all run (cold Triton compiles, roughly 1-3 s a variant: ~30-60 s
  for the six kinds);
* end to end: ``--e2e-budget-s`` 100 s, model conversion (~28 s for the GGUF) included, cut
  so the timings keep at least 60 s of the total. The CPU references are precomputed, so
  all of it goes to device rows (~3-7 s each; int4 and int8 first, so a cut run loses
  fp8 and bf16, not them);
* timings: ``--budget-s`` 150 s counted from when the timings start (it used to start
  before the checks, and the end-to-end part then left only the 4K row), capped by the
  total: with the end-to-end part ~100-120 s remain, enough for 4K-256K and perhaps 1M;
  with ``--no-e2e`` all 150 s. Rows past the deadline are marked skipped.

The lent-GPU plan (``scripts/device_bench.sh``) runs the kernels (``--no-e2e``) in one call
and the end-to-end part in the next, each well inside 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import torch

GB = 1e9
# Checked on small shapes: every kind the engine pages, fp32 and bf16 included.
CHECK_KINDS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
# Of the total budget, what the end-to-end part leaves at least to the timings.
TIMINGS_RESERVE_S = 60.0
DEFAULT_GPU_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "benchmarks", "results", "kernels_gpu.json")


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write results as JSON here")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; on CPU runs the kernels under TRITON_INTERPRET=1")
    ap.add_argument("--contexts", help="comma-separated context lengths (default 4K..1M; --smoke: 64,200)")
    ap.add_argument("--kinds", default="fp16,fp8,int8,int4", help="page kinds to time")
    ap.add_argument("--check-kinds", default=",".join(CHECK_KINDS),
                    help="page kinds to check on small shapes (not timed): fp32 and bf16 too, so the compiled "
                         "bf16 tensor-core dot is compared with the reference somewhere (the interpreter swaps it)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--no-e2e", dest="e2e", action="store_false", help="skip the end-to-end engine check")
    ap.add_argument("--model", help="model of the end-to-end part (default: the bundled SmolLM2; a .gguf path)")
    ap.add_argument("--e2e-weights", default="fp32",
                    help="device weights of the end-to-end part: fp32 (default: every page dtype meets its own CPU "
                         "twin, the kernels' exactness alone) or bf16 (what users run; bf16 pages then meet fp32 ones)")
    ap.add_argument("--e2e-budget-s", type=float, default=100.0,
                    help="wall-clock budget of the end-to-end part, its model conversion included")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="budget of the timings, counted from their start: rows past it are marked skipped")
    ap.add_argument("--total-budget-s", type=float, default=270.0,
                    help="cap on the whole run from its start: the end-to-end part and the timings end by it")
    return ap.parse_args(argv)


class Shape:
    def __init__(self, smoke: bool):
        self.hq, self.h, self.d = (4, 2, 32) if smoke else (32, 8, 128)
        self.prefill_chunk = 24 if smoke else 512
        self.store_chunk = 40 if smoke else 4096


def _timer(device):
    """(fn) -> seconds per call: CUDA events via triton's do_bench on a GPU, one
    wall-clock run on the CPU (the interpreter is for logic, not speed)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=40) / 1e3

    def once(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return once


def _copy_bandwidth(device) -> float:
    """Achievable bytes/s of a device-to-device copy: the floor a memory-bound kernel
    can hope to reach (reads + writes counted)."""
    if device.type != "cuda":
        return float("nan")
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sec = do_bench(lambda: dst.copy_(src), warmup=5, rep=30) / 1e3
    del src, dst
    return 2 * (1 << 30) / sec


def _fill(kernels, spec, n_tokens, device, seed=0):
    """One sequence of n_tokens random K/V stored through kv_store, in big chunks."""
    g = torch.Generator(device=device).manual_seed(seed)
    bs = spec.block_size
    n_pages = math.ceil(n_tokens / bs)
    layer = kernels.allocate(spec, n_pages + 1, device=device, n_stage=256)
    bt = torch.arange(n_pages, dtype=torch.int32, device=device).view(1, -1)
    step = 1 << 16
    for a in range(0, n_tokens, step):
        b = min(n_tokens, a + step)
        k = torch.randn(b - a, spec.n_kv_heads, spec.head_dim, device=device, generator=g, dtype=torch.float16)
        v = torch.randn(b - a, spec.n_kv_heads, spec.head_dim, device=device, generator=g, dtype=torch.float16)
        kernels.kv_store(layer, k, v, torch.arange(a, b, device=device))
    return layer, bt, torch.tensor([n_tokens], dtype=torch.int32, device=device)


def _free_cached(device) -> None:
    """Give cached blocks back between rows. After a kernel's illegal access the CUDA
    context refuses every call, this one too: that must not end the run before its JSON."""
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - the rows already say what failed
            pass


def _max_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def check_kernels(kernels, kinds, shape, device, bs) -> list[dict]:
    """Every Triton kernel vs the reference on small shapes, per kind; a kind that fails
    to run reports one row with its error."""
    rows = []
    for kind in kinds:
        try:
            rows += _check_kind(kernels, kind, shape, device, bs)
        except Exception as e:  # noqa: BLE001 - report, go on with the other kinds
            rows.append({"kind": kind, "kernel": "all", "max_err": float("nan"), "tol": 0.0, "ok": False,
                         "error": _error(e)})
    return rows


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def layer_to(layer, device):
    """A copy of a PagedKVLayer with every tensor on `device`."""
    import dataclasses

    moved = {f.name: getattr(layer, f.name).to(device) for f in dataclasses.fields(layer)
             if isinstance(getattr(layer, f.name), torch.Tensor)}
    return dataclasses.replace(layer, **moved)


def check_tolerance(kind: str) -> float:
    """Max |Triton - reference| allowed: fp32 pages take exact FMA dots; bf16 pages bf16
    tensor-core dots (q and P rounded to bf16: 8 ulps of 2^-7, as the interpreter tests'
    dot_tolerance); every other kind fp16 dots."""
    return {"fp32": 2e-5, "bf16": 8 * 2.0**-7}.get(kind, 2e-2)


def _check_kind(kernels, kind, shape, device, bs) -> list[dict]:
    from kernels import reference as R
    from kernels.kv_store_triton import kv_store_triton
    from kernels.paged_attention import paged_attention_decode_triton
    from kernels.prefill_attention import paged_prefill_attention_triton
    from kernels.sparse_attention import score_pages_triton, select_pages_triton, sparse_attention_decode_triton

    rows = []
    spec = kernels.KVCacheSpec(shape.h, shape.d, bs, kind)
    n = 5 * bs + 3
    g = torch.Generator(device=device).manual_seed(1)
    k = torch.randn(n, shape.h, shape.d, device=device, generator=g)
    v = torch.randn(n, shape.h, shape.d, device=device, generator=g)
    la, lb = (kernels.allocate(spec, 8, device=device) for _ in range(2))
    # The store checks' oracle is the reference on the CPU (what the interpreter tests
    # matched bit for bit), on CPU copies of the same inputs: on a GPU, torch's own
    # elementwise paths are no oracle for the last bit (review H1: CUDA's x / number).
    oracle = kernels.allocate(spec, 8, device="cpu")
    for a, b in ((0, 2 * bs + 1), (2 * bs + 1, n)):  # a partial page then the rest
        slots = torch.arange(a, b, device=device)
        R.kv_store(la, k[a:b], v[a:b], slots)
        R.kv_store(oracle, k[a:b].cpu(), v[a:b].cpu(), slots.cpu())
    try:
        for a, b in ((0, 2 * bs + 1), (2 * bs + 1, n)):
            kv_store_triton(lb, k[a:b], v[a:b], torch.arange(a, b, device=device))
        stored = None
    except Exception as e:  # noqa: BLE001 - its rows say so; the others read the reference's pool
        stored = e
    bt = torch.arange(8, dtype=torch.int32, device=device).view(1, -1)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    q = torch.randn(1, shape.hq, shape.d, device=device, generator=g)
    scale = shape.d**-0.5
    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=2)
    # Each pair reads the same (reference-written) pool; the store check compares pools.
    sc = R.score_pages(q, la, bt, lens)
    sel, ns = R.select_pages(sc, lens, bs, pol, max_pages=8)
    qc = torch.randn(bs + 5, shape.hq, shape.d, device=device, generator=g)

    def stored_pair(pick: int | None):
        """The CPU reference's pool and the kernel's, moved to the CPU and read back there:
        summaries (None), or K (0) / V (1)."""
        if stored is not None:
            raise stored
        got = layer_to(lb, "cpu")
        if pick is None:
            return oracle.k_min, got.k_min
        bt_cpu = bt[0].cpu()
        return R.context_kv(oracle, bt_cpu, n)[pick], R.context_kv(got, bt_cpu, n)[pick]

    # Each check is run alone: one kernel failing must not hide the others' results.
    # kv_store: the summaries, then everything attention reads back (codes, scales,
    # staged tail) as the reference dequantises it; quantised kinds must agree bit for bit.
    pairs = {
        "kv_store": lambda: stored_pair(None),
        "kv_store_k": lambda: stored_pair(0),
        "kv_store_v": lambda: stored_pair(1),
        "decode": lambda: (R.paged_attention_decode(q, la, bt, lens, scale),
                           paged_attention_decode_triton(q, la, bt, lens, scale)),
        "score_pages": lambda: (sc, score_pages_triton(q, la, bt, lens)),
        "sparse_decode": lambda: (R.sparse_attention_decode(q, la, bt, sel, ns, lens, scale),
                                  sparse_attention_decode_triton(q, la, bt, sel, ns, lens, scale)),
    }
    # Selection over many pages: several of the kernel's 256-page blocks per pass.
    n_big = 600 if shape.d < 128 else 5000
    big = torch.randn(2, shape.h, n_big, device=device, generator=g)
    big_lens = torch.tensor([n_big * bs - 7, (n_big // 3) * bs], dtype=torch.int32, device=device)
    big_pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=4, top_k_pages=n_big // 16)

    def selections():
        want_sel = R.select_pages(big, big_lens, bs, big_pol, max_pages=n_big)
        got_sel = select_pages_triton(big, big_lens, bs, big_pol, max_pages=n_big)
        return (torch.cat([want_sel[0].flatten(), want_sel[1]]), torch.cat([got_sel[0].flatten(), got_sel[1]]))

    pairs["select_pages"] = selections
    for p in (kernels.AttentionPolicy(), pol):
        start = n - qc.shape[0]
        pairs[f"prefill_{p.kind}"] = lambda p=p, start=start: (
            R.paged_prefill_attention(qc, la, bt[0], start, scale, p),
            paged_prefill_attention_triton(qc, la, bt[0], start, scale, p))
    tol = check_tolerance(kind)
    exact = ("kv_store_k", "kv_store_v", "select_pages") if kind in ("fp8", "int8", "int4") else ("select_pages",)
    for name, pair in pairs.items():
        try:
            want, got = pair()
            if device.type == "cuda":
                torch.cuda.synchronize()  # an asynchronous fault is this kernel's, not the next one's
        except Exception as e:  # noqa: BLE001
            rows.append({"kind": kind, "kernel": name, "max_err": float("nan"), "tol": tol, "ok": False,
                         "error": _error(e)})
            print(f"check {kind:5} {name:16} FAILED: {_error(e)}", flush=True)
            continue
        err = _max_err(want.nan_to_num(), got.nan_to_num())
        if name in exact:  # codes and scales: a one-step flip is a real difference
            ok = bool(torch.equal(want, got))
            err = float((want != got).float().mean())  # here: the share of values that differ
        elif name in ("kv_store", "score_pages"):  # +-inf are legitimate here: empty pages
            ok = err <= tol and torch.equal(torch.isinf(want), torch.isinf(got))
        else:
            ok = bool(torch.isfinite(got).all()) and err <= tol
        print(f"check {kind:5} {name:16} {'ok' if ok else 'NO'} (err {err:.2e}, tol {tol:.0e})", flush=True)
        rows.append({"kind": kind, "kernel": name, "max_err": err, "tol": tol, "ok": ok})
    return rows


def time_kernels(kernels, kinds, contexts, shape, device, bs, copy_bw, deadline=float("inf"),
                 on_rows=None) -> list[dict]:
    """Timings per (context, kind); rows past the deadline are marked skipped and a row
    that fails (out of memory at 1M tokens, say) carries its error. `on_rows(rows so far)`
    after each context, so a run cut short still leaves what it measured."""
    rows = []
    for n in contexts:
        if time.perf_counter() > deadline:
            rows += [{"context": n, "kind": kind, "skipped": "time budget"} for kind in kinds]
            continue
        try:
            rows += _time_context(kernels, kinds, n, shape, device, bs, copy_bw, deadline)
        except Exception as e:  # noqa: BLE001 - the SDPA baseline itself failed
            rows += [{"context": n, "kind": kind, "error": _error(e)} for kind in kinds]
        _free_cached(device)
        if on_rows is not None:
            on_rows(rows)
    return rows


def _time_context(kernels, kinds, n, shape, device, bs, copy_bw, deadline) -> list[dict]:
    timer = _timer(device)
    rows = []
    q = torch.randn(1, shape.hq, shape.d, device=device, dtype=torch.float16)
    sdpa_decode = sdpa_prefill = None
    if device.type == "cuda":
        # torch SDPA on dense fp16 K/V of the same context (GQA via enable_gqa).
        kd = torch.randn(1, shape.h, n, shape.d, device=device, dtype=torch.float16)
        vd = torch.randn_like(kd)
        qd = q.view(1, shape.hq, 1, shape.d)
        qp = torch.randn(1, shape.hq, shape.prefill_chunk, shape.d, device=device, dtype=torch.float16)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        try:  # the dense baseline (8 GB of fp16 K/V at 1M tokens) failing is no kernel's row
            sdpa_decode = timer(lambda: sdpa(qd, kd, vd, enable_gqa=True))
            sdpa_prefill = timer(lambda: sdpa(qp, kd, vd, enable_gqa=True))
        except Exception as e:  # noqa: BLE001
            print(f"kernels.bench: SDPA baseline at {n:,} tokens: {_error(e)}", flush=True)
        del kd, vd
    for kind in kinds:
        if time.perf_counter() > deadline:
            rows.append({"context": n, "kind": kind, "skipped": "time budget"})
            continue
        try:
            rows.append(_time_kind(kernels, kind, n, q, shape, device, bs, copy_bw, sdpa_decode, sdpa_prefill))
        except Exception as e:  # noqa: BLE001 - out of memory at 1M tokens, say: report, go on
            rows.append({"context": n, "kind": kind, "error": _error(e)})
        r = rows[-1]
        print(f"timed {n:>9,} {kind:5} " + (f"decode {_fmt_ms(r['decode_s'])} ms, sparse {_fmt_ms(r.get('sparse_decode_s'))}"
                                           f" ms, prefill {_fmt_ms(r.get('prefill_s'))} ms"
                                           if "decode_s" in r else r["error"]), flush=True)
        _free_cached(device)
    return rows


def decode_read_bytes(spec, n_tokens: int) -> int:
    """Bytes dense decode reads for one sequence of n_tokens (one layer): its pages' K and
    V codes, what dequantizing them takes (fp8: two fp32 scales per page and head; int8 /
    int4: the fp16 value (zero, scale) pairs per token and group, and the fp32 k_min/k_max
    summaries, which are the keys' zero and scale; int4: its key widths, D/2 bytes per page
    and head) and the block table (int32 a page). Not the float and fp8 kinds' summaries:
    kept for page selection, never read by decode (counting them overstated the fp16 floor
    by 12.5% and fp8's by 25%: review M4). Whole pages: the timed contexts are multiples of
    the page size (a partial last page would be read from its staging slot instead)."""
    from kernels.layout import V_PARAM_BYTES

    bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
    pages = -(-n_tokens // bs)
    per_page = 2 * bs * h * spec.packed_dim * spec.page_bytes + 4  # K and V codes, block table entry
    if spec.kv_dtype == "fp8":
        per_page += 2 * h * 4
    elif spec.kv_dtype in ("int8", "int4"):
        per_page += 2 * bs * h * spec.n_groups * V_PARAM_BYTES + 2 * h * d * 4
    if spec.kv_dtype == "int4":
        per_page += h * d // 2
    return pages * per_page


def _time_kind(kernels, kind, n, q, shape, device, bs, copy_bw, sdpa_decode, sdpa_prefill) -> dict:
    from kernels import reference as R

    timer = _timer(device)
    scale = shape.d**-0.5
    spec = kernels.KVCacheSpec(shape.h, shape.d, bs, kind)
    layer, bt, lens = _fill(kernels, spec, n, device)
    kv_bytes = kernels.bytes_per_token(spec) * n  # the layer's footprint
    read_bytes = decode_read_bytes(spec, n)  # what dense decode reads of it: the floor's bytes
    row = {"context": n, "kind": kind, "kv_bytes": kv_bytes, "read_bytes": read_bytes}
    row["decode_s"] = timer(lambda: kernels.paged_attention_decode(q, layer, bt, lens, scale))
    row["floor_s"] = read_bytes / copy_bw if copy_bw == copy_bw else None  # copy_bw counts all bytes moved
    row["sdpa_decode_s"] = sdpa_decode
    n_pages = bt.shape[1]
    pol = kernels.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=4, top_k_pages=max(1, n_pages // 16))
    row["score_s"] = timer(lambda: kernels.score_pages(q, layer, bt, lens))
    scores = kernels.score_pages(q, layer, bt, lens)
    row["select_s"] = timer(lambda: kernels.select_pages(scores, lens, bs, pol, max_pages=n_pages))  # Triton on CUDA
    row["select_torch_s"] = timer(lambda: R.select_pages(scores, lens, bs, pol, max_pages=n_pages))  # baseline
    sel, ns = R.select_pages(scores, lens, bs, pol, max_pages=n_pages)
    row["sparse_decode_s"] = timer(lambda: kernels.sparse_attention_decode(q, layer, bt, sel, ns, lens, scale))
    chunk = min(shape.prefill_chunk, n)
    qc = torch.randn(chunk, shape.hq, shape.d, device=device, dtype=torch.float16)
    row["prefill_chunk"] = chunk
    row["prefill_s"] = timer(lambda: kernels.paged_prefill_attention(qc, layer, bt[0], n - chunk, scale))
    row["sdpa_prefill_s"] = sdpa_prefill
    from kernels._page_io import ATTENTION_WARPS, tile_pages
    from kernels.paged_attention import paged_attention_decode_triton
    from kernels.prefill_attention import paged_prefill_attention_triton
    from kernels.sparse_attention import sparse_attention_decode_triton

    row["tile_pages"], row["warps"] = tile_pages(bs), ATTENTION_WARPS
    if ATTENTION_WARPS != 4:
        # Baseline in the same run: 4 warps a program (until 2026-12-03, chosen before the
        # kernels had been compiled for a GPU at all; 8 is chosen from ptxas's spills).
        row["decode_4warps_s"] = timer(lambda: paged_attention_decode_triton(q, layer, bt, lens, scale, warps=4))
        row["prefill_4warps_s"] = timer(
            lambda: paged_prefill_attention_triton(qc, layer, bt[0], n - chunk, scale, warps=4))
    if row["tile_pages"] > 1:
        # Baseline in the same run: the same kernels reading one page a loop step (as
        # they did until 2026-12-03), so the wider step's gain is a ratio, not a memory.
        row["decode_1page_s"] = timer(lambda: paged_attention_decode_triton(q, layer, bt, lens, scale, tile=1))
        row["sparse_decode_1page_s"] = timer(
            lambda: sparse_attention_decode_triton(q, layer, bt, sel, ns, lens, scale, tile=1))
        row["prefill_1page_s"] = timer(
            lambda: paged_prefill_attention_triton(qc, layer, bt[0], n - chunk, scale, tile=1))
    del layer
    # kv_store on a fresh pool: a decode token, then a prefill chunk.
    fresh = kernels.allocate(spec, math.ceil(shape.store_chunk / bs) + 2, device=device, n_stage=512)
    one = torch.randn(1, shape.h, shape.d, device=device, dtype=torch.float16)
    many = torch.randn(shape.store_chunk, shape.h, shape.d, device=device, dtype=torch.float16)
    row["store_token_s"] = timer(lambda: kernels.kv_store(fresh, one, one, torch.tensor([3], device=device)))
    # What the engine pays per layer: the step's plan is made once (at the first layer),
    # then applied to each layer with no read back from the device.
    plan = kernels.plan_store(fresh, torch.tensor([3], device=device))

    def apply_token():
        fresh.store_version = plan.version  # the same write again, as the next layer would get it
        kernels.kv_store_planned(fresh, one, one, plan)

    row["store_token_planned_s"] = timer(apply_token)
    slots = torch.arange(shape.store_chunk, device=device)
    row["store_chunk_s"] = timer(lambda: kernels.kv_store(fresh, many, many, slots))
    row["store_chunk"] = shape.store_chunk
    del fresh
    return row


def _fmt_ms(x):
    return "-" if x is None else f"{x * 1e3:8.3f}"


def print_tables(checks, timings):
    print("\nkernel checks (Triton vs reference)")
    print(f"{'kind':6} {'kernel':16} {'max err':>10} {'tol':>8}  ok")
    for r in checks:
        note = f"  {r['error']}" if "error" in r else ""
        print(f"{r['kind']:6} {r['kernel']:16} {r['max_err']:10.2e} {r['tol']:8.0e}  {'yes' if r['ok'] else 'NO'}{note}")
    print("\ntimings, ms (one sequence, one layer)")
    head = ["context", "kind", "decode", "dec_1pg", "dec_4w", "floor", "sdpa", "score", "select", "sel_torch", "sparse",
            "spa_1pg", "prefill", "pf_1pg", "pf_4w", "sdpa_pf", "store1", "apply1", "storeN"]
    print(" ".join(f"{h:>9}" for h in head))
    for r in timings:
        if "decode_s" not in r:
            print(f"{r['context']:>9} {r['kind']:>9}  {r.get('error') or r.get('skipped')}")
            continue
        vals = [r["decode_s"], r.get("decode_1page_s"), r.get("decode_4warps_s"), r["floor_s"], r["sdpa_decode_s"],
                r["score_s"], r["select_s"], r.get("select_torch_s"), r["sparse_decode_s"], r.get("sparse_decode_1page_s"),
                r["prefill_s"], r.get("prefill_1page_s"), r.get("prefill_4warps_s"), r["sdpa_prefill_s"],
                r["store_token_s"], r.get("store_token_planned_s"), r["store_chunk_s"]]
        print(f"{r['context']:>9} {r['kind']:>9} " + " ".join(f"{_fmt_ms(v):>9}" for v in vals))


def main(argv=None) -> int:
    args = _parse(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("kernels.bench: no CUDA device, nothing to time (use --smoke for a CPU logic check).")
        return 0
    if not cuda:
        # Must precede the first @triton.jit: triton picks the interpreter at decoration.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import kernels

    if not kernels.HAS_TRITON:
        print("kernels.bench: triton is not installed, nothing to check.")
        return 0
    device = torch.device("cuda" if cuda else "cpu")
    shape = Shape(args.smoke)
    kinds = [k for k in args.kinds.split(",") if k]
    contexts = args.contexts or ("64,200" if args.smoke else "4096,16384,65536,262144,1048576")
    contexts = [int(c) for c in contexts.split(",")]
    check_kinds = [k for k in args.check_kinds.split(",") if k]
    if args.smoke:
        kinds = kinds if args.kinds != "fp16,fp8,int8,int4" else ["fp32", "fp16", "fp8", "int8", "int4"]
        # The interpreter is slow: check what is timed (the default list adds bf16, whose
        # interpreted dot is fp32 anyway).
        check_kinds = check_kinds if args.check_kinds != ",".join(CHECK_KINDS) else kinds
    if not cuda:
        kernels.set_backend("triton")  # CPU tensors through the (interpreted) kernels
    started = time.perf_counter()
    total_deadline = started + args.total_budget_s
    try:
        copy_bw = _copy_bandwidth(device)
    except Exception as e:  # noqa: BLE001 - timings go on without a floor
        print(f"kernels.bench: copy bandwidth not measured: {_error(e)}")
        copy_bw = float("nan")
    out = args.out or (DEFAULT_GPU_OUT if cuda and not args.smoke else None)
    result = {
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu (TRITON_INTERPRET) {platform.processor()}",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "shape": {"n_heads": shape.hq, "n_kv_heads": shape.h, "head_dim": shape.d, "block_size": args.block_size},
        "copy_bandwidth_GBps": copy_bw / GB if copy_bw == copy_bw else None,
        "smoke": args.smoke,
        "checks": [],
        "timings": [],
        "e2e": {"skipped": "not reached"},
        "finished": False,
        "wall_s": 0.0,
    }

    def save(**parts) -> None:
        """The JSON as it stands, rewritten after each part: a run killed at its time limit,
        or one a kernel's fault ended, still leaves what it measured."""
        result.update(parts, wall_s=time.perf_counter() - started)
        if out:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with open(out + ".tmp", "w") as fh:
                json.dump(result, fh, indent=2)
            os.replace(out + ".tmp", out)

    checks = check_kernels(kernels, check_kinds, shape, device, args.block_size)
    save(checks=checks)
    e2e = {"skipped": "--no-e2e"}
    if args.e2e:
        # Its own budget, cut so the timings keep TIMINGS_RESERVE_S of the total.
        e2e_budget = min(args.e2e_budget_s, total_deadline - time.perf_counter() - TIMINGS_RESERVE_S)
        e2e = run_e2e(args, e2e_budget) if e2e_budget > 10 else {"skipped": "total budget spent by the checks"}
    save(e2e=e2e)
    if not cuda:
        kernels.set_backend("triton")  # the end-to-end part resets the backend
    # The timings' budget starts now, not at the start: the checks and the end-to-end
    # part once took all of it (review H2: 16K-1M all "skipped: time budget").
    deadline = min(time.perf_counter() + args.budget_s, total_deadline)
    result["timings_budget_s"] = round(deadline - time.perf_counter(), 1)
    timings = time_kernels(kernels, kinds, contexts, shape, device, args.block_size, copy_bw, deadline,
                           on_rows=lambda rows: save(timings=rows))
    save(timings=timings, finished=True)
    print_tables(checks, timings)
    _print_e2e(e2e)
    e2e_errors = ("error" in e2e) + sum("error" in r for r in e2e.get("rows", []))
    timing_errors = sum("error" in r for r in timings)
    print(f"\n{len(checks)} checks, {sum(not r['ok'] for r in checks)} failed; {timing_errors} timing errors; "
          f"{e2e_errors} end-to-end errors; {result['wall_s']:.1f} s")
    if out:
        print(f"wrote {out}")
    return 0 if all(r["ok"] for r in checks) and not timing_errors and not e2e_errors else 1


def e2e_argv(args, budget_s: float) -> list[str]:
    """benchmarks.engine_gpu's arguments for this run."""
    argv = ["--budget-s", f"{budget_s:.0f}", "--weights", args.e2e_weights]
    argv += ["--model", args.model] if args.model else []
    if args.smoke and torch.cuda.is_available():  # compiled kernels: the real model, a short run
        # (other sizes than the precomputed references': computed here)
        argv += ["--kinds", "int8", "--policies", "dense,topk", "--prompt-tokens", "256", "--new-tokens", "8",
                 "--recompute-refs"]
    elif args.smoke:  # a tiny random model through the interpreted kernels
        argv += ["--smoke", "--kinds", "int8", "--policies", "dense,topk"]
    return argv


def run_e2e(args, budget_s: float) -> dict:
    """The engine end to end (benchmarks/engine_gpu.py); its failure is a report, not a crash."""
    try:
        from benchmarks import engine_gpu  # the engine: imported only here, never by the kernels
    except Exception as e:  # noqa: BLE001
        return {"error": f"benchmarks.engine_gpu not importable (run from the repo root): {_error(e)}"}
    argv = e2e_argv(args, budget_s)
    try:
        return engine_gpu.run(engine_gpu._parse(argv))
    except Exception as e:  # noqa: BLE001
        return {"error": _error(e)}


def _print_e2e(e2e: dict) -> None:
    try:
        from benchmarks import engine_gpu

        engine_gpu.print_table(e2e)
    except Exception:  # noqa: BLE001
        print(f"\nend to end: {e2e.get('error') or e2e.get('skipped') or 'see JSON'}")


if __name__ == "__main__":
    sys.exit(main())
