"""Compile every Triton kernel for a GPU architecture, on a machine without a GPU.

    python -m kernels.compile_check                      # sm_90 (H100 / H200), the full matrix
    python -m kernels.compile_check --baseline-warps 4   # and again at 4 warps: spills compared
    python -m kernels.compile_check --arch 89 --quick    # L4 / RTX 4090, the bundled model's shape

The CPU tests run the kernels under ``TRITON_INTERPRET=1``, which checks what they
compute but never runs Triton's compiler: a kernel can pass all of them and still fail on
the first GPU (an op lowered differently, a layout conversion the backend rejects, a block
needing more shared memory than an SM has). This runs the real compiler down to a cubin
(with the ptxas that ships in the triton wheel) and launches nothing: each kernel wrapper
is called on CPU tensors while ``JITFunction.run`` compiles instead of launching, over the
page kinds, page sizes, loop-step widths, GQA shapes and query dtypes that the engine and
``kernels.bench`` launch (one process per CPU, cells in parallel). Per compiled variant
it reports compile time, registers, spill bytes and shared memory; it fails when a
variant does not compile or asks for more shared memory than the architecture gives one
block. ``--baseline-warps`` compiles the matrix again with the attention kernels at
another warp count, in the same run, and prints the worst spill of each side by kernel,
shape and page kind. Writes JSON with ``--out``.

Outputs of the "launches" are never written: the wrappers' results are garbage here, and
only their compilation is checked. Runs in a process without ``TRITON_INTERPRET=1``.
Registers and spills are what ptxas reports; how fast a variant runs only a GPU can say.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch

# Most shared memory one block may use (opt-in maximum), bytes, by compute capability.
MAX_SHARED = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}

# (query heads, kv heads, head_dim): what the engine and kernels.bench launch.
SHAPES = {
    "smollm2": (9, 3, 64),  # the bundled model (GQA 3): kernels.bench's end-to-end part
    "llama3-8b": (32, 8, 128),  # kernels.bench's timed layer
    "qwen2.5-0.5b": (14, 2, 64),  # GQA 7: a group that is not a power of two
}
KINDS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")


@dataclass
class Variant:
    """One compiled kernel specialization."""

    kernel: str
    case: str  # the matrix cell that first launched it
    signature: dict  # argument types, e.g. {"q_ptr": "*bf16"}
    constexprs: dict
    seconds: float = 0.0
    registers: int | None = None
    spill_bytes: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    error: str = ""
    ok: bool = True

    def key(self) -> str:
        """Identity across worker processes; a failure (no signature to tell it apart) is
        kept once per cell."""
        parts = [self.kernel, self.signature, self.constexprs, self.num_warps] + ([] if self.ok else [self.case])
        return json.dumps(parts, sort_keys=True, default=str)


@dataclass(frozen=True)
class Cell:
    """One point of the matrix: a shape, a page kind and size, a loop-step width, a query dtype."""

    shape: str  # a key of SHAPES
    kind: str
    block_size: int
    tile: int | None  # pages a loop step; None: the default (`tile_pages`)
    q_dtype: str  # "float32", "bfloat16", "float16"

    @property
    def name(self) -> str:
        tile = f" tile{self.tile}" if self.tile else ""
        return f"{self.shape} {self.kind} bs{self.block_size}{tile} q:{self.q_dtype}"


@dataclass
class Report:
    arch: int
    warps: int  # of the attention kernels
    variants: list[Variant] = field(default_factory=list)
    case_errors: list[dict] = field(default_factory=list)  # host code that failed before a launch


class _CompileOnlyDriver:
    """Just enough of a triton driver for the JIT to specialize and compile: a fixed
    target, device 0, stream 0. Never asked to load or launch anything."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores")


# Per process: kernels already reported. A variant compiled for an earlier cell comes back
# from the JIT's in-memory cache, without a new ptxas log, and is not reported again.
_REPORTED: set[int] = set()


@contextlib.contextmanager
def compile_only(report: Report, case: list[str]) -> Iterator[None]:
    """Within: every Triton launch compiles for ``report.arch`` and returns without
    running; each new variant is appended to ``report`` (a compile error too, and
    re-raised). ``case[0]`` names the cell being run."""
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("kernels.compile_check compiles for a GPU: run it without TRITON_INTERPRET=1")
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        name = self.fn.__name__
        log = io.StringIO()
        t = time.perf_counter()
        try:
            with contextlib.redirect_stdout(log):  # ptxas -v, printed by dump_ptxas_log
                kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as e:
            report.variants.append(Variant(name, case[0], {}, {}, time.perf_counter() - t, error=_first_line(e),
                                           ok=False))
            raise
        if id(kernel) not in _REPORTED:
            _REPORTED.add(id(kernel))
            report.variants.append(_variant(name, case[0], kernel, time.perf_counter() - t, log.getvalue(), report.arch))
        return kernel

    saved = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile, driver._active
    driver.set_active(_CompileOnlyDriver(report.arch))
    JITFunction.run = run
    knobs.nvidia.dump_ptxas_log = True
    knobs.compilation.always_compile = True  # a cubin from the disk cache would come back without its ptxas log
    try:
        yield
    finally:
        JITFunction.run = original
        # The driver goes back to None on a machine without a GPU: created on demand.
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile, driver._active = saved


def _variant(name: str, case: str, kernel, seconds: float, ptxas_log: str, arch: int) -> Variant:
    src, md = kernel.src, kernel.metadata
    regs, spill = _PTXAS_REGS.search(ptxas_log), _PTXAS_SPILL.search(ptxas_log)
    v = Variant(name, case, {k: str(t) for k, t in src.signature.items() if t != "constexpr"}, _constexprs(kernel),
                seconds, int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None,
                int(md.shared), int(md.num_warps))
    limit = MAX_SHARED.get(arch)
    if limit is not None and v.shared_bytes > limit:
        v.ok, v.error = False, f"needs {v.shared_bytes} bytes of shared memory; sm_{arch} gives a block {limit}"
    return v


def _constexprs(kernel) -> dict:
    """The variant's compile-time arguments by name (specialized ints, e.g. a stride of 1,
    included: they too make a distinct compilation)."""
    src = kernel.src
    names = src.fn.arg_names
    out = {}
    for path, v in src.constants.items():
        key = names[path[0]] if isinstance(path, tuple) and len(path) == 1 else str(path)
        out[key] = v if isinstance(v, (int, float, bool, str)) or v is None else str(v)
    return out


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # triton's CompilationError puts the source position first and the reason last.
    return (lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}")[:400]


def run_cell(kernels_mod, cell: Cell) -> None:
    """Call every kernel wrapper once on small CPU tensors of this cell, the way the
    engine and the bench call them: a prefill-sized store, a one-token store, dense and
    sparse decode, page scoring and selection, and chunked prefill (dense, window, topk)."""
    from kernels import reference as R
    from kernels.kv_store_triton import kv_store_triton
    from kernels.paged_attention import paged_attention_decode_triton
    from kernels.prefill_attention import paged_prefill_attention_triton
    from kernels.sparse_attention import score_pages_triton, select_pages_triton, sparse_attention_decode_triton

    hq, h, d = SHAPES[cell.shape]
    bs, kind, tile, q_dtype = cell.block_size, cell.kind, cell.tile, getattr(torch, cell.q_dtype)
    spec = kernels_mod.KVCacheSpec(h, d, bs, kind)
    n = 5 * bs + 3  # a partly filled last page (a staged tail for quantized kinds)
    layer = kernels_mod.allocate(spec, 8)
    kv = torch.randn(n + 1, h, d).to(q_dtype if not spec.quantized else torch.float16)
    kv_store_triton(layer, kv[:n], kv[:n], torch.arange(n))  # seals pages, stages the tail
    bt = torch.arange(8, dtype=torch.int32).view(1, -1)
    lens = torch.tensor([n], dtype=torch.int32)
    q = torch.randn(1, hq, d).to(q_dtype)
    scale = d**-0.5
    pol = kernels_mod.AttentionPolicy("topk", n_sink_pages=1, n_local_pages=1, top_k_pages=2)
    window = kernels_mod.AttentionPolicy("window", n_sink_pages=1, n_local_pages=2)
    paged_attention_decode_triton(q, layer, bt, lens, scale, tile=tile)
    # Selections as the engine's decode makes them (kernels.attention_decode): top-k per kv
    # head, top-k shared by all heads, window (no scores); the selected pages' values are
    # the reference's, as the launches here write nothing.
    for per_head in (True, False):
        score_pages_triton(q, layer, bt, lens, per_kv_head=per_head)
        scores = torch.randn(1, h if per_head else 1, 8)
        select_pages_triton(scores, lens, bs, pol, max_pages=8)
        sel, n_sel = R.select_pages(scores, lens, bs, pol, max_pages=8)
        sparse_attention_decode_triton(q, layer, bt, sel, n_sel, lens, scale, tile=tile)
    select_pages_triton(None, lens, bs, window, max_pages=8)
    for chunk in (bs + 5, 1):  # a prefill chunk (the widest row tile) and a one-row chunk (16)
        qc = torch.randn(chunk, hq, d).to(q_dtype)
        for p in (kernels_mod.AttentionPolicy(), window, pol):
            paged_prefill_attention_triton(qc, layer, bt[0], n - chunk, scale, p, tile=tile)
    kv_store_triton(layer, kv[n:], kv[n:], torch.tensor([n]))  # the decode token


def cells(quick: bool) -> list[Cell]:
    """The matrix. Float pages meet queries of their own dtype (bf16 weights give bf16
    queries); quantized pages meet fp32 queries (the bench) and bf16 ones (the engine on
    bf16 weights)."""
    shapes = ["smollm2"] if quick else list(SHAPES)
    pages = [(16, None)] if quick else [(16, None), (16, 1), (64, None)]
    out = []
    for shape in shapes:
        for bs, tile in pages:
            if tile == 1 and shape != "llama3-8b":  # the 1-page baseline: only the bench's timed layer runs it
                continue
            for kind in KINDS:
                own = {"fp32": ["float32"], "bf16": ["bfloat16"], "fp16": ["float16"]}
                for qd in own.get(kind, ["float32"] if quick else ["float32", "bfloat16"]):
                    out.append(Cell(shape, kind, bs, tile, qd))
    return out


def compile_cell(arch: int, warps: int, cell: Cell) -> Report:
    """Compile one cell (in a worker process): every variant it launches, or its error."""
    import kernels as kernels_mod
    from kernels import _page_io

    _page_io.ATTENTION_WARPS = warps
    report = Report(arch, warps)
    with compile_only(report, [cell.name]):
        try:
            run_cell(kernels_mod, cell)
        except Exception as e:  # noqa: BLE001 - record, go on with the next cell
            if all(v.ok for v in report.variants):  # not a compile error: the host code failed
                report.case_errors.append({"case": cell.name, "error": _first_line(e)})
    return report


def check(arch: int = 90, quick: bool = False, warps: int | None = None, jobs: int | None = None,
          progress=None) -> Report:
    """Compile the matrix for ``arch`` in ``jobs`` processes (default: one per CPU), the
    attention kernels at ``warps`` (default ATTENTION_WARPS). Variants that several cells
    launch are kept once."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing

    from kernels._page_io import ATTENTION_WARPS, attention_warps

    warps = attention_warps(warps if warps is not None else ATTENTION_WARPS)
    report, keys = Report(arch, warps), set()
    # spawn: a fresh interpreter per worker, whatever this process imported and under which flags
    with ProcessPoolExecutor(jobs or os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(compile_cell, arch, warps, c): c for c in cells(quick)}
        for fut in as_completed(futures):
            part = fut.result()
            new = [v for v in part.variants if v.key() not in keys]
            keys.update(v.key() for v in new)
            report.variants += new
            report.case_errors += part.case_errors
            if progress:
                progress(futures[fut].name, new, part.case_errors)
    return report


def summarize(report: Report) -> list[dict]:
    """Per kernel: variants, failures, those that spill, worst registers / spills /
    shared memory, compile seconds."""
    rows: dict[str, dict] = {}
    for v in report.variants:
        r = rows.setdefault(v.kernel, {"kernel": v.kernel, "variants": 0, "failed": 0, "spilling": 0,
                                       "max_registers": 0, "max_spill_bytes": 0, "max_shared_bytes": 0,
                                       "compile_s": 0.0})
        r["variants"] += 1
        r["failed"] += not v.ok
        r["spilling"] += bool(v.spill_bytes)
        r["max_registers"] = max(r["max_registers"], v.registers or 0)
        r["max_spill_bytes"] = max(r["max_spill_bytes"], v.spill_bytes or 0)
        r["max_shared_bytes"] = max(r["max_shared_bytes"], v.shared_bytes or 0)
        r["compile_s"] += v.seconds
    return sorted(rows.values(), key=lambda r: r["kernel"])


ATTENTION_KERNELS = ("_decode_split_kernel", "_prefill_kernel")


def compare_spills(report: Report, baseline: Report) -> list[dict]:
    """Per (attention kernel, shape, kind): the worst spill, in bytes a thread, at the
    report's warps and at the baseline's, over page sizes, step widths and query dtypes."""
    def worst(rep):
        out: dict[tuple, int] = {}
        for v in rep.variants:
            if v.kernel in ATTENTION_KERNELS and v.ok:
                shape, kind = v.case.split()[:2]
                k = (v.kernel, shape, kind)
                out[k] = max(out.get(k, 0), v.spill_bytes or 0)
        return out

    now, base = worst(report), worst(baseline)
    return [{"kernel": k[0], "shape": k[1], "kind": k[2], f"spill_{report.warps}w": now[k],
             f"spill_{baseline.warps}w": base.get(k)} for k in sorted(now)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.compile_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability as one number: 80, 89, 90 (default), 100")
    ap.add_argument("--quick", action="store_true", help="the bundled model's shape at 16-token pages only")
    ap.add_argument("--warps", type=int, help="warps of the attention kernels (default: kernels._page_io.ATTENTION_WARPS)")
    ap.add_argument("--baseline-warps", type=int,
                    help="compile the matrix again with the attention kernels at this many warps, and compare spills")
    ap.add_argument("--jobs", type=int, help="compiler processes (default: one per CPU)")
    ap.add_argument("--out", help="write the report as JSON here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernels.compile_check: unset TRITON_INTERPRET (it compiles for a GPU; the interpreter compiles nothing)",
              file=sys.stderr)
        return 2
    from kernels._page_io import attention_warps

    try:
        for w in (args.warps, args.baseline_warps):
            if w is not None:
                attention_warps(w)
    except ValueError as e:
        print(f"kernels.compile_check: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def progress(name, new, errors):
        bad = [v for v in new if not v.ok]
        note = f"  FAILED: {bad[0].kernel}: {bad[0].error}" if bad else (f"  ERROR: {errors[0]['error']}" if errors else "")
        print(f"  {name:<40} {len(new):3d} new variants{note}", file=sys.stderr, flush=True)

    report = check(args.arch, args.quick, args.warps, args.jobs, progress)
    rows = summarize(report)
    print(f"\nsm_{args.arch}, attention kernels at {report.warps} warps: {len(report.variants)} kernel variants "
          f"compiled to cubin in {time.perf_counter() - t0:.0f} s")
    print(f"{'kernel':<24}{'variants':>9}{'failed':>7}{'spilling':>9}{'max regs':>9}{'spill B':>8}{'shared B':>9}"
          f"{'compile s':>10}")
    for r in rows:
        print(f"{r['kernel']:<24}{r['variants']:>9}{r['failed']:>7}{r['spilling']:>9}{r['max_registers']:>9}"
              f"{r['max_spill_bytes']:>8}{r['max_shared_bytes']:>9}{r['compile_s']:>10.1f}")
    failed = [v for v in report.variants if not v.ok]
    for v in failed[:20]:
        print(f"FAILED {v.kernel} ({v.case}): {v.error}")
    for c in report.case_errors[:20]:
        print(f"ERROR in {c['case']} (host code, before a launch): {c['error']}")
    result = {"date": time.strftime("%Y-%m-%d"), "machine": _machine(), "arch": args.arch, "quick": args.quick,
              "attention_warps": report.warps, "kernels": rows, "variants": [asdict(v) for v in report.variants],
              "case_errors": report.case_errors}
    if args.baseline_warps is not None:
        baseline = check(args.arch, args.quick, args.baseline_warps, args.jobs)
        spills = compare_spills(report, baseline)
        a, b = f"spill_{report.warps}w", f"spill_{baseline.warps}w"
        print(f"\nworst register spill, bytes a thread: attention kernels at {report.warps} warps vs "
              f"{baseline.warps} (the baseline, compiled in the same run)")
        print(f"{'kernel':<22}{'shape':<14}{'kind':<6}{report.warps:>6}w{baseline.warps:>6}w")
        for r in spills:
            print(f"{r['kernel']:<22}{r['shape']:<14}{r['kind']:<6}{r[a]:>7}{r[b] if r[b] is not None else '-':>7}")
        result["baseline"] = {"attention_warps": baseline.warps, "kernels": summarize(baseline),
                              "variants": [asdict(v) for v in baseline.variants], "spills": spills}
        failed += [v for v in baseline.variants if not v.ok]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if failed or report.case_errors else 0


def _machine() -> dict:
    import triton

    cpu = next((ln.split(":", 1)[1].strip() for ln in _read_lines("/proc/cpuinfo") if ln.startswith("model name")),
               platform.machine())
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__}


def _read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
