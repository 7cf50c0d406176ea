"""Which KV number formats keep the needle: fake-quantised pages on the exact fp32 engine.

    python -m benchmarks.kv_key_ablation --json [--variants fp32,int4,int4-hadamard,k8v4,k5v3] [--matrix-lengths 2048,4096,8192]

Issue #4's int4 pages lose early-depth needles that dense fp32 finds. This separates the
number format from the kernels: SmolLM2 runs with fp32 weights and fp32 pages, and each
complete 64-token page is replaced by its quantise-dequantise copy as it fills (the
engine's rule: the newest partial page stays exact), through a wrapper around the model's
`store_kv`. Keys are quantised per channel over the page (KIVI; the page's min/max are the
parameters, as in `kernels`), values per token over the head's 64 channels with fp16
parameters rounded outward, as in `kernels.reference`.

Variants (keys / values): `int4` (the shipped format), `int4-hadamard` (keys turned by a
64x64 Hadamard matrix before quantising, the rotation QuaRot uses against outlier
channels, and back after), `k8v4` (int8 keys, int4 values: 0.42x fp16 instead of 0.3x),
`k5v3` (5-bit keys and 3-bit values: int4's bytes spent on the keys), `int4-out1` /
`int4-out2` (KVQuant's dense-and-sparse keys: per channel and page the 1 or 2 smallest and
largest keys kept in fp16 beside the int4 codes, which then span a narrower range; ~3 / 6
extra bytes per token and head with a 6-bit token index, 0.31x / 0.32x fp16).
Bit allocation across key channels (per page and kv head, int4's 4 x head_dim bits in
all, each channel 0-8 bits, widths chosen to minimise the summed error model
weight x span^2 x 4^-bits; a 0-bit channel reads as its midpoint; the widths would cost
half a byte per token and head, still under 0.3x fp16): `int4-alloc` (weight 1: by the
page's ranges alone; `int4-alloc6` caps a channel at 6 bits), `int4-qalloc` (weight: the
sequence's running mean of q^2 per channel over the kv head's query heads, so bits go
where queries look), `int4-calalloc` (weight from queries over 1,024 tokens of another
text, the tutorial's licence: fixed per model, deterministic), `int4-walloc` (weight
predicted from W_q and the RMSNorm gains alone, no text), `k5v3-qalloc` (5-bit
allocated keys, 3-bit values).
Values, all with int4-calalloc's keys: per channel over the page like keys
(`int4-cal-vch`, `-vchalloc` with widths by span^2 x the o-projection's column norm^2),
per token with fixed channel widths from those norms (`int4-cal-vtokalloc`), or divided
per channel by a fixed scale before the per-token quantiser and multiplied back after
(`int4-cal-vsmooth`: the channel's RMS on the calibration text; `-half`: its square root;
`-alloc`: plus fixed widths). `*-sink`: the sequence's first page left unquantised.

Per variant, against `fp32` (the reference, always run first): perplexity and KL per
token on the first 2,048 tokens of the bundled Python tutorial, and the needle's
log-probability (teacher-forced " MARIGOLD-4417", as `benchmarks.longctx_quality`) at
2K and 4K tokens and 9 depths: a continuous figure where found / missed flips. With
`--matrix-lengths 2048,4096,8192` also the greedy needle matrix (5 depths) per variant.
Writes benchmarks/results/kv_key_ablation.json (`--name` for another file). ~2.5 minutes a
variant on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from benchmarks.common import ROOT, machine, write_result

PAGE = 64
DEPTHS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MATRIX_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)  # benchmarks.longctx_quality's greedy matrix
VARIANTS = {
    "fp32": dict(kbits=0, vbits=0),
    "int4": dict(kbits=4, vbits=4),
    "int4-hadamard": dict(kbits=4, vbits=4, rotate=True),
    "k8v4": dict(kbits=8, vbits=4),
    "k5v3": dict(kbits=5, vbits=3),
    "int4-out1": dict(kbits=4, vbits=4, outliers=1),
    "int4-out2": dict(kbits=4, vbits=4, outliers=2),
    "int4-alloc": dict(kbits=4, vbits=4, alloc=8),
    "int4-alloc6": dict(kbits=4, vbits=4, alloc=6),
    "int4-qalloc": dict(kbits=4, vbits=4, alloc=8, query_weighted=True),
    "int4-calalloc": dict(kbits=4, vbits=4, alloc=8, calibrated=True),
    "k5v3-qalloc": dict(kbits=5, vbits=3, alloc=8, query_weighted=True),
    "int4-walloc": dict(kbits=4, vbits=4, alloc=8, calibrated=True, from_weights=True),
    # Values per channel over the page (like keys) instead of per token, with the keys of
    # int4-calalloc: uniform 4 bits, or widths allocated by span^2 x the o-projection's
    # column norms^2 (how much an error in that value channel moves the layer's output).
    "int4-cal-vch": dict(kbits=4, vbits=4, alloc=8, calibrated=True, values="channel"),
    "int4-cal-vchalloc": dict(kbits=4, vbits=4, alloc=8, calibrated=True, values="channel-alloc"),
    # Values per token, channel widths fixed per layer and head by the o-projection's
    # column norms (the token's range is shared by every channel).
    "int4-cal-vtokalloc": dict(kbits=4, vbits=4, alloc=8, calibrated=True, values="token-alloc"),
    # Values divided per channel by a fixed scale before the per-token quantiser and
    # multiplied back after (SmoothQuant's migration, on the value cache): the channel's
    # RMS over the calibration text (`vsmooth`), or its square root (`vsmooth-half`), so
    # large channels stop setting every token's range. `vsmooth-alloc` adds fixed widths
    # by o-projection norm^2 x RMS^2.
    "int4-cal-vsmooth": dict(kbits=4, vbits=4, alloc=8, calibrated=True, smooth=1.0),
    "int4-cal-vsmooth-half": dict(kbits=4, vbits=4, alloc=8, calibrated=True, smooth=0.5),
    "int4-cal-vsmooth-alloc": dict(kbits=4, vbits=4, alloc=8, calibrated=True, smooth=1.0, values="token-alloc"),
    # The sequence's first page (the attention sink) left unquantised (IntactKV keeps the
    # sink tokens' KV lossless): one fp16 page per sequence and layer.
    "int4-calalloc-sink": dict(kbits=4, vbits=4, alloc=8, calibrated=True, fp_sink=True),
    "int4-cal-vsmooth-sink": dict(kbits=4, vbits=4, alloc=8, calibrated=True, smooth=1.0, fp_sink=True),
}
CALIBRATION = ROOT / "sample_docs" / "python-tutorial-3.11.LICENSE.txt"  # other prose than the tutorial
CALIBRATION_TOKENS = 1024


def hadamard(n: int) -> torch.Tensor:
    """Sylvester's n x n Hadamard matrix over sqrt(n): orthonormal, so q.k is unchanged."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def fake_keys(k: torch.Tensor, bits: int) -> torch.Tensor:
    """k [page, H, D] -> per-channel asymmetric codes over the page's tokens (the kernels'
    rounding, `kernels.reference.asym_codes`, at any width), dequantised."""
    from kernels.reference import asym_codes

    qmax = 2**bits - 1
    lo, hi = k.amin(0, keepdim=True), k.amax(0, keepdim=True)
    scale = (hi - lo) / qmax
    return lo + asym_codes(k, lo, scale, qmax).float() * scale


def fake_keys_outliers(k: torch.Tensor, bits: int, per_side: int) -> torch.Tensor:
    """KVQuant's dense-and-sparse keys: per channel, the `per_side` smallest and largest
    entries of the page are kept aside (fp16) and the rest quantised over their own,
    narrower range."""
    from kernels.reference import asym_codes

    qmax = 2**bits - 1
    ordered = k.sort(0).values
    lo, hi = ordered[per_side : per_side + 1], ordered[-1 - per_side : k.shape[0] - per_side]
    scale = (hi - lo) / qmax
    dense = lo + asym_codes(k.clamp(lo, hi), lo, scale, qmax).float() * scale
    sparse = (k < lo) | (k > hi)
    return torch.where(sparse, k.half().float(), dense)


def allocate_bits(span: torch.Tensor, mean_bits: int, max_bits: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """span [H, D] per-channel ranges -> integer widths [H, D] in 0..max_bits summing to
    mean_bits * D per head, minimising sum(span^2 4^-b) (the high-rate error model): the
    error is convex in b, so the best widths take the mean_bits * D largest marginal gains
    span^2 (3/4) 4^-(b-1), b = 1..max_bits, over all channels."""
    h, d = span.shape
    b = torch.arange(1, max_bits + 1, dtype=span.dtype)
    err = span.square() if weight is None else span.square() * weight
    gains = (err[..., None] * 0.75 * 4.0 ** -(b - 1)).reshape(h, -1)  # [H, D*max_bits]
    chosen = torch.zeros_like(gains, dtype=torch.bool)
    chosen.scatter_(1, gains.topk(mean_bits * d, dim=1).indices, True)
    return chosen.view(h, d, max_bits).sum(-1)


def fake_keys_alloc(k: torch.Tensor, bits: int, max_bits: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-channel keys whose widths follow the channel's range over the page (as many bits
    per page and head as `bits` everywhere): a 0-bit channel keeps its midpoint."""
    from kernels.reference import asym_codes

    lo, hi = k.amin(0), k.amax(0)
    widths = allocate_bits(hi - lo, bits, max_bits, weight)  # [H, D]
    out = (lo + hi) / 2 + torch.zeros_like(k)
    for w in widths.unique().tolist():
        if w == 0:
            continue
        qmax = 2**w - 1
        scale = (hi - lo) / qmax
        deq = lo + asym_codes(k, lo, scale, qmax).float() * scale
        out = torch.where(widths == w, deq, out)
    return out


def fake_values_alloc(v: torch.Tensor, bits: int, weight: torch.Tensor) -> torch.Tensor:
    """Per-token values whose channels have fixed widths (per kv head, from `weight` [H, D]
    alone: every channel shares the token's range, so only the weight tells them apart)."""
    from kernels.reference import fp16_floor

    widths = allocate_bits(torch.ones_like(weight), bits, 8, weight)  # [H, D]
    lo = fp16_floor(v.amin(-1, keepdim=True)).float()
    out = (lo + v.amax(-1, keepdim=True)) / 2 + torch.zeros_like(v)  # a 0-bit channel: the midpoint
    for w in widths.unique().tolist():
        if w:
            out = torch.where(widths == w, fake_values(v, w), out)
    return out


def output_weight(model) -> dict[int, torch.Tensor]:
    """||W_o[:, column]||^2 per layer, kv head and value channel, summed over the kv head's
    query heads: how far an error in that value channel moves the attention's output."""
    cfg = model.cfg
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    out = {}
    for lw, k_cache in zip(model.w.layers, model.kv.k):
        wo = lw.o.float()  # [hidden, Hq * D]
        out[id(k_cache)] = wo.square().sum(0).view(hkv, hq // hkv, d).sum(1)
    return out


def fake_values(v: torch.Tensor, bits: int) -> torch.Tensor:
    """v [page, H, D] -> per-token codes over the head's channels (fp16 parameters rounded
    outward, as kernels.reference.quantize_values, at any width), dequantised."""
    from kernels.reference import asym_codes, fp16_ceil, fp16_floor

    qmax = 2**bits - 1
    lo = fp16_floor(v.amin(-1, keepdim=True)).float()
    scale = fp16_ceil((v.amax(-1, keepdim=True) - lo) / qmax).float()
    return lo + asym_codes(v, lo, scale, qmax).float() * scale


class FakePages:
    """Wraps the model's `store_kv`: after each store, every page the step completed is
    replaced by its fake-quantised copy under the current variant."""

    def __init__(self, head_dim: int):
        self.variant = VARIANTS["fp32"]
        self.rotation = hadamard(head_dim)
        self.q_moments: dict[int, torch.Tensor] = {}  # layer cache id -> sum of q^2 [Hkv, D] this sequence
        self.pending: dict[int, list] = {}  # layer cache id -> pages waiting for this chunk's queries
        self.calibrating = False
        self.calibration: dict[int, torch.Tensor] = {}  # layer cache id -> sum of q^2 over the calibration text
        self.prior: dict[int, torch.Tensor] = {}  # layer cache id -> the weights' estimate of E[q^2]
        self.v_weight: dict[int, torch.Tensor] = {}  # layer cache id -> o-projection column norms^2 [Hkv, D]
        self.v_square: dict[int, torch.Tensor] = {}  # layer cache id -> sum of v^2 over the calibration text
        self.v_count: dict[int, int] = {}  # layer cache id -> rows in v_square
        self.v_rms: dict[int, torch.Tensor] = {}  # layer cache id -> value channel RMS [Hkv, D]
        self.sink_page: dict[int, int] = {}  # layer cache id -> the sequence's first page

    def page(self, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor | None = None,
             v_weight: torch.Tensor | None = None, v_rms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        kbits, vbits = self.variant["kbits"], self.variant["vbits"]
        if kbits:
            if self.variant.get("rotate"):
                k = fake_keys(k @ self.rotation, kbits) @ self.rotation.T
            elif self.variant.get("alloc"):
                k = fake_keys_alloc(k, kbits, self.variant["alloc"], weight)
            elif self.variant.get("outliers"):
                k = fake_keys_outliers(k, kbits, self.variant["outliers"])
            else:
                k = fake_keys(k, kbits)
        if vbits:
            mode = self.variant.get("values", "token")
            smooth = None
            if self.variant.get("smooth"):
                smooth = v_rms.pow(self.variant["smooth"]).clamp(min=1e-6)  # [H, D]
                v = v / smooth
                if v_weight is not None:
                    v_weight = v_weight * smooth.square()
            if mode == "channel":
                v = fake_keys(v, vbits)
            elif mode == "channel-alloc":
                v = fake_keys_alloc(v, vbits, 8, v_weight)
            elif mode == "token-alloc":
                v = fake_values_alloc(v, vbits, v_weight)
            else:
                v = fake_values(v, vbits)
            if smooth is not None:
                v = v * smooth
        return k, v

    def wrap(self, store):
        def store_kv(k_cache, v_cache, k, v, slot_mapping):
            store(k_cache, v_cache, k, v, slot_mapping)
            if self.calibrating:
                self.v_square[id(k_cache)] = v.float().square().sum(0) + self.v_square.get(id(k_cache), 0)
                self.v_count[id(k_cache)] = self.v_count.get(id(k_cache), 0) + v.shape[0]
            if not (self.variant["kbits"] or self.variant["vbits"]):
                return
            if id(k_cache) not in self.sink_page:  # the sequence's first store: its first page
                self.sink_page[id(k_cache)] = int(slot_mapping[0]) // PAGE
            for end in slot_mapping[slot_mapping % PAGE == PAGE - 1].tolist():  # pages this step filled
                rows = slice(end - PAGE + 1, end + 1)
                if self.variant.get("fp_sink") and end // PAGE == self.sink_page[id(k_cache)]:
                    continue
                if self.variant.get("query_weighted"):  # quantised once attend has seen this chunk's queries
                    self.pending.setdefault(id(k_cache), []).append(rows)
                elif self.variant.get("calibrated"):
                    weight = (self.prior if self.variant.get("from_weights") else self.calibration)[id(k_cache)]
                    k_cache[rows], v_cache[rows] = self.page(k_cache[rows].float(), v_cache[rows].float(), weight,
                                                             self.v_weight.get(id(k_cache)), self.v_rms.get(id(k_cache)))
                else:
                    k_cache[rows], v_cache[rows] = self.page(k_cache[rows].float(), v_cache[rows].float())
        return store_kv

    def new_sequence(self) -> None:
        """The query moments are per sequence: forget the last one's."""
        self.q_moments.clear()
        self.pending.clear()
        self.sink_page.clear()

    def wrap_attend(self, attend):
        """Query-weighted variants: keep each layer's running sum of q^2 per kv head (the
        group's query heads added), then quantise the pages this chunk filled with it."""
        def attend_q(q, k_cache, v_cache, seq, *args, **kwargs):
            key = id(k_cache)
            hkv = k_cache.shape[1]
            m = q.float().square().view(q.shape[0], hkv, -1, q.shape[-1]).sum((0, 2))
            if self.calibrating:
                self.calibration[key] = m + self.calibration.get(key, 0)
            if self.variant.get("query_weighted"):
                self.q_moments[key] = m + self.q_moments.get(key, 0)
                for rows in self.pending.pop(key, []):
                    k_cache[rows], v_cache[rows] = self.page(k_cache[rows].float(), v_cache[rows].float(), self.q_moments[key])
            return attend(q, k_cache, v_cache, seq, *args, **kwargs)
        return attend_q


def scores_row(backend, fake: FakePages, text: list[int], ref_logp, prompts: dict, fact: list[int]) -> tuple[dict, torch.Tensor]:
    """Perplexity and KL on `text`, and the needle's teacher-forced log-probability per
    (length, depth) prompt, under the current variant."""
    fake.new_sequence()
    logp = torch.log_softmax(backend.prompt_logits(text)[:-1].float(), -1)
    ref = logp if ref_logp is None else ref_logp
    row = {
        "ppl": round(float(torch.exp(torch.nn.functional.nll_loss(logp, torch.tensor(text[1:])))), 4),
        "kl_per_token": round(float((ref.exp() * (ref - logp)).sum(-1).mean()), 5),
        "needle_logprob": {},
    }
    for (n, _), prompt in prompts.items():
        fake.new_sequence()
        logits = backend.prompt_logits(prompt)[-len(fact) - 1 : -1]
        lp = torch.log_softmax(logits.float(), -1)[torch.arange(len(fact)), torch.tensor(fact)].sum()
        row["needle_logprob"].setdefault(str(n), {"cells": []})["cells"].append(round(float(lp), 3))
    for cell in row["needle_logprob"].values():
        cell["mean"] = round(sum(cell["cells"]) / len(cell["cells"]), 3)
    return row, logp


def greedy_row(backend, fake: FakePages, lengths: list[int], depths: list[float]) -> dict:
    """The needle matrix of `benchmarks.longctx_quality` (12 greedy tokens, found when the
    answer holds the fact) under the current variant: found / missed per length and depth."""
    import benchmarks.longctx_quality as lq
    from ktcli.engine.backend import SamplingParams

    found: dict = {}
    for n in lengths:
        cells = []
        for d in depths:
            fake.new_sequence()
            texts, _ = backend.generate_ids_batch([lq.needle_prompt(backend.tokenizer, n, d)], SamplingParams(max_new_tokens=12))
            cells.append(int(lq.FACT.lower() in texts[0].lower()))
        found[str(n)] = cells
    return found


def weight_prior(model) -> dict[int, torch.Tensor]:
    """E[q_c^2] per layer, kv head and channel as the weights alone predict it, for inputs
    with unit covariance after the layer's RMSNorm: the squared norm of W_q's row c times
    the norm's gains, summed over the kv head's query heads, averaged over the channel's
    RoPE pair (2i, 2i+1), which rotation mixes. No calibration text needed."""
    cfg = model.cfg
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    prior = {}
    for lw, k_cache in zip(model.w.layers, model.kv.k):
        wq = lw.qkv[: hq * d].float() * lw.in_norm.float()  # [Hq * D, hidden]
        e = wq.square().sum(-1).view(hkv, hq // hkv, d).sum(1)  # [Hkv, D]
        prior[id(k_cache)] = e.view(hkv, d // 2, 2).mean(-1, keepdim=True).expand(hkv, d // 2, 2).reshape(hkv, d)
    return prior


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object (it is always written)")
    parser.add_argument("--variants", default="fp32,int4,int4-hadamard,k8v4,k5v3")
    parser.add_argument("--lengths", default="2048,4096")
    parser.add_argument("--ppl-tokens", type=int, default=2048)
    parser.add_argument("--matrix-lengths", default="",
                        help="also run the greedy needle matrix at these lengths, e.g. 2048,4096,8192")
    parser.add_argument("--name", default="kv_key_ablation", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    import benchmarks.longctx_quality as lq
    import ktcli.engine.model as model_module

    names = ["fp32"] + [n for n in args.variants.split(",") if n and n != "fp32"]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}", file=sys.stderr)
        return 2
    lengths = [int(x) for x in args.lengths.split(",")]
    matrix_lengths = [int(x) for x in args.matrix_lengths.split(",") if x]
    backend = lq.load("dense-fp32", max(lengths + matrix_lengths) + 200)
    fake = FakePages(backend.cfg.head_dim)
    model_module.store_kv = fake.wrap(model_module.store_kv)
    model_module.attend = fake.wrap_attend(model_module.attend)
    tok = backend.tokenizer
    stem = tok.encode(lq.ANSWER_STEM, add_special_tokens=False)
    full = tok.encode(lq.ANSWER_STEM + lq.ANSWER, add_special_tokens=False)
    fact = full[len(stem):]
    text = tok.encode(lq.TEXT.read_text(encoding="utf-8"), add_special_tokens=False)[: args.ppl_tokens]
    if any(VARIANTS[n].get("calibrated") for n in names):
        fake.calibrating = True
        backend.prompt_logits(tok.encode(CALIBRATION.read_text(encoding="utf-8"), add_special_tokens=False)[:CALIBRATION_TOKENS])
        fake.calibrating = False
        fake.v_rms = {key: (sq / fake.v_count[key]).sqrt() for key, sq in fake.v_square.items()}
    fake.v_weight = output_weight(backend.engine.model)
    if any(VARIANTS[n].get("from_weights") for n in names):
        fake.prior = weight_prior(backend.engine.model)
    prompts = {(n, d): lq.needle_prompt(tok, n, d) + full for n in lengths for d in DEPTHS}
    ref_logp = None
    results: dict = {}
    for name in names:
        fake.variant = VARIANTS[name]
        t0 = time.perf_counter()
        row, logp = scores_row(backend, fake, text, ref_logp, prompts, fact)
        ref_logp = logp if ref_logp is None else ref_logp
        if matrix_lengths:
            row["needle_found"] = greedy_row(backend, fake, matrix_lengths, MATRIX_DEPTHS)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = row
        means = " ".join(f"{n}: {row['needle_logprob'][str(n)]['mean']}" for n in lengths)
        print(f"{name}: ppl {row['ppl']} KL {row['kl_per_token']} needle {means} found {row.get('needle_found')}",
              file=sys.stderr, flush=True)
    result = {"benchmark": "kv_key_ablation", "machine": machine(), "reference": "fp32 pages (exact)",
              "page_tokens": PAGE, "depths": list(DEPTHS), "lengths": lengths, "ppl_tokens": len(text),
              "matrix_lengths": matrix_lengths, "matrix_depths": list(MATRIX_DEPTHS) if matrix_lengths else [],
              "variants": {n: VARIANTS[n] | {"rotate": bool(VARIANTS[n].get("rotate")), "outliers": VARIANTS[n].get("outliers", 0)}
                           for n in names},
              "results": results}
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
