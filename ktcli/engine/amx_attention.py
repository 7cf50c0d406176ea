"""fp32-grade causal prefill attention on AMX tiles (bf16 products over split operands).

Why: a long fp32 prefill on the 2-core Xeon spent half its time in attention (torch's
flash kernel: 4.4 of 8.9 s at 4,096 tokens of SmolLM2, ~130-160 GFLOPS), while AMX runs
bf16 tile products many times faster than the cores run fp32 FMAs. One bf16 pass would
round q, k, p and v to 8 bits of mantissa (what bf16 prefill does, ~3e-3 relative). Here
every fp32 operand x is split into hi = bf16(x) and lo = bf16(x - hi), which holds x to
~2^-17, and each product takes three tile passes, accumulating in fp32:

    q.k ~ qh.kh + qh.kl + ql.kh        p.v ~ ph.vh + pl.vh + ph.vl

(the dropped lo.lo term is ~2^-18 of the product). A score's absolute error becomes the
relative error of its softmax weight, and three passes leave it at ~2^-17 of
sum_d |q_d k_d|: fine for SmolLM2 (prompt logits 1.2e-5 from transformers', against
2.1e-6 through the flash kernel; the engine's bound is 1e-4), not for heads with large
scores (head-size-128 test models with a wide random init: 1.2-3.9e-4). So q and k are
split in three parts (hi, mid = bf16(x - hi), lo = bf16(x - hi - mid): x to ~2^-26), and
where `score_error` estimates the three-pass error above SIX_PASS_ABOVE the scores take six
passes (hi.hi, hi.mid, mid.hi, hi.lo, mid.mid, lo.hi; those models: 1-3e-5, as the flash
kernel). Measured (benchmarks.amx_attention, tests/engine/test_amx_attention.py): outputs
within ~1e-5 of float64 attention (three-pass scores; ~4e-6 with six), where torch's fp32
kernel is within ~1e-6 and one bf16 pass ~3e-3. This is fp32-grade, not bit-for-bit fp32:
KTCLI_NO_AMX_ATTENTION=1 gives the flash kernel back.

The kernel, per kv head and task of 4 x 16 query rows (the G query heads sharing the kv
head folded into the rows, position-major so a block spans few positions):

- K and V are split once per call: K as row-major bf16 (A tiles of 16 keys x 32 d), V^T
  as A tiles of 16 d x 32 keys; keys padded to 64 with zeros (the packed copy is 1.25x
  the fp32 K and V);
- it computes S^T = K Q^T rather than Q K^T, so a 16-lane vector holds one key for the 16
  query rows and the online softmax (base 2, q pre-scaled by scale * log2(e)) takes its
  maxima and sums down columns, with no horizontal reductions; P^T goes straight into B
  tiles (bf16 pairs of two keys), and O^T [D, 16] += V^T P^T;
- for each 64-key block up to the group's last position, each of the task's four row
  groups runs scores, softmax and the PV update; the block's K / V tiles come from L2
  for the first group and from L1 for the others (one group per task ran 1.4x slower);
- tasks run from the most expensive (latest rows) to the cheapest through an atomic
  counter, so the causal triangle splits evenly over the threads.

Where the compiler lacks AMX intrinsics, the CPU lacks AMX, Linux refuses the tile state
or the head size is not a multiple of 64 (up to 256), `available()` / `supports()` say so
and callers keep torch's flash kernel; KTCLI_NO_AMX_ATTENTION=1 does that on purpose.
"""

from __future__ import annotations

import math

import torch

from ktcli.engine import cpp_ext

SOURCE = r"""
#include <atomic>
#include <vector>
// A profiling build defines KT_PROF_MARK (cycles per phase: scores, softmax, PV) and may
// set KT_ATTN_NG; the library defines neither.
#ifndef KT_PROF_MARK
#define KT_PROF_MARK(phase)
#endif

namespace amx_attn {

#if KT_HAVE_AMX
constexpr int64_t KB = 64;     // keys per block: four 16-key score tiles
constexpr int64_t MAX_D = 256;
constexpr float LAZY = 8.f;   // see group_step
#ifndef KT_ATTN_NG
#define KT_ATTN_NG 4
#endif
constexpr int64_t NG = KT_ATTN_NG;      // 16-row groups per task: each K / V tile read from L2 serves 64 rows

// 2^x for x <= 0: 2^round(x) times a degree-5 fit of 2^f on [-1/2, 1/2] (2.4e-7 relative
// in fp32, well inside the 2^-17 of the hi / lo split that follows); below -200 (masked
// keys: -inf) it is 0.
KT_AMX inline __m512 exp2_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-200.f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(0.001327646506304928f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009675541279289473f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550713294934121f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402211972521328f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931469670516337f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000000716542612f));
    return _mm512_scalef_ps(p, n);
}

using amx::split16;  // 16 floats -> bf16 hi and lo = bf16(x - hi) (engine.amx_gemm)

// 16 floats -> three bf16 parts hi + mid + lo (x to ~2^-26): hi, then the remainder x - hi
// (exact in fp32) split again. For the scores, whose absolute error the softmax turns into
// relative error of every weight.
KT_AMX inline void split16x3(__m512 v, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), h);
    split16(_mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))), mid, lo);
}

// The kernel works on transposed blocks so that the softmax runs down 16-lane columns (one
// lane per query row) with no horizontal reductions: S^T = K Q^T ([64 keys, 16 rows]; K as
// A tiles, Q^T as B tiles) and O^T += V^T P^T ([D, 16 rows]; V^T as A tiles, P^T as B).
//
// K of one kv head -> row-major bf16 [padded keys, D], hi, mid and lo (an A tile is 16 keys x
// 32 d at row stride D): rows j0 .. j1 - 1, zeros past `keys`.
KT_AMX void pack_k_rows(const float* k, int64_t sk, int64_t keys, int64_t D, int64_t j0, int64_t j1, uint16_t* hi,
                        uint16_t* mid, uint16_t* lo) {
    for (int64_t j = j0; j < j1; ++j) {
        if (j >= keys) {
            std::memset(hi + j * D, 0, D * 2);
            std::memset(mid + j * D, 0, D * 2);
            std::memset(lo + j * D, 0, D * 2);
            continue;
        }
        for (int64_t d = 0; d < D; d += 16) split16x3(_mm512_loadu_ps(k + j * sk + d), hi + j * D + d, mid + j * D + d, lo + j * D + d);
    }
}

// V of one kv head, keys j0 .. j0 + 31 -> per 16-wide d group t one A tile of V^T (16 d rows x
// 32 keys), at ((j0 / 32) * (D / 16) + t) * 512, hi and lo.
KT_AMX void pack_vt_tile(const float* v, int64_t sv, int64_t keys, int64_t D, int64_t j0, uint16_t* hi, uint16_t* lo) {
    alignas(64) uint16_t rh[MAX_D], rl[MAX_D];
    uint16_t* th = hi + (j0 / 32) * (D / 16) * 512;
    uint16_t* tl = lo + (j0 / 32) * (D / 16) * 512;
    for (int64_t c = 0; c < 32; ++c) {
        const int64_t j = j0 + c;
        if (j < keys) {
            for (int64_t d = 0; d < D; d += 16) split16(_mm512_loadu_ps(v + j * sv + d), rh + d, rl + d);
        } else {
            std::memset(rh, 0, D * 2);
            std::memset(rl, 0, D * 2);
        }
        for (int64_t d = 0; d < D; ++d) {  // element (d, key c) of group d / 16
            th[(d / 16) * 512 + (d % 16) * 32 + c] = rh[d];
            tl[(d / 16) * 512 + (d % 16) * 32 + c] = rl[d];
        }
    }
}

// bf16 pairs of two 16-lane vectors: lane r = (bf16(a_r), bf16(b_r)) as one 32-bit unit (a B
// tile row), hi parts and lo parts.
KT_AMX inline void pair_split(__m512 a, __m512 b, uint32_t* hi, uint32_t* lo) {
    // cvtne2ps packs b's 16 bf16 above a's; the permutation interleaves them into pairs.
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i h = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));                               // bf16(a) as fp32
    const __m512 hb = _mm512_castsi512_ps(_mm512_and_si512(h, _mm512_set1_epi32(int32_t(0xFFFF0000u))));  // bf16(b)
    _mm512_store_si512(hi, h);
    const __m512i l = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
    _mm512_store_si512(lo, _mm512_permutexvar_epi16(pairs, l));
}

// C tile t += A B in three passes, A's hi / lo parts loaded into tiles 6 / 7 from a_hi /
// a_lo (row stride in bytes), B's hi / lo already in tiles 4 / 5: hi.hi + lo.hi + hi.lo.
#define KT_SPLIT3(t, a_hi, a_lo, stride) \
    _tile_loadd(6, a_hi, stride);        \
    _tile_loadd(7, a_lo, stride);        \
    _tile_dpbf16ps(t, 6, 4);             \
    _tile_dpbf16ps(t, 7, 4);             \
    _tile_dpbf16ps(t, 6, 5);

// Accumulator tiles 0-3 <-> four 16 x 16 fp32 blocks stored one after another.
KT_AMX inline void store4(float* p) {
    _tile_stored(0, p, 64); _tile_stored(1, p + 256, 64); _tile_stored(2, p + 512, 64); _tile_stored(3, p + 768, 64);
}
KT_AMX inline void load4(const float* p) {
    _tile_loadd(0, p, 64); _tile_loadd(1, p + 256, 64); _tile_loadd(2, p + 512, 64); _tile_loadd(3, p + 768, 64);
}

struct Problem {
    const float* q; int64_t sq_i, sq_h;          // q [n, HQ, D]
    const uint16_t *kh, *km, *kl, *vh, *vl;      // packed parts, `head` elements per kv head
    int64_t head;                                // padded keys x D
    float* out;                                  // [n, HQ, D] contiguous
    int64_t n, HQ, H, G, D, p;                   // query i sits at position p + i
    float qscale;                                // scale * log2(e)
    bool six;                                    // scores in six passes (see amx_prefill_attention)
};

// A task's working set: per 16-row group its Q^T B tiles (hi, mid, lo), O^T [D, 16] and softmax
// state; the block's S^T and P^T tiles are shared.
struct Scratch {
    std::vector<uint32_t> qh, qm, ql;  // [NG][D / 32 tiles of 256]
    std::vector<float> O;          // [NG][D * 16]
    alignas(64) float S[KB * 16];                              // S^T [64 keys, 16 rows]
    alignas(64) uint32_t ph[KB / 2 * 16], pl[KB / 2 * 16];     // P^T B tiles: 32 key pairs x 16 rows
    explicit Scratch(int64_t D) : qh(NG * D / 32 * 256), qm(NG * D / 32 * 256), ql(NG * D / 32 * 256), O(NG * D * 16) {}
};

// Row group gi of a task (16 rows from r0) against key block b: S^T, the online softmax
// (state m, l), O^T += V^T P^T. The block's K and V tiles were read by the task's first
// group and come from L1 for the others.
KT_AMX void group_step(const Problem& P, int64_t h, int64_t b, const uint32_t* qh, const uint32_t* qm, const uint32_t* ql, float* O,
                       __m512i pos, int64_t first, __m512& m, __m512& l, Scratch& w) {
    const int64_t D = P.D, DC = D / 32, DG = D / 16;
    const uint16_t* kh = P.kh + h * P.head;
    const uint16_t* km = P.km + h * P.head;
    const uint16_t* kl = P.kl + h * P.head;
    const uint16_t* vh = P.vh + h * P.head;
    const uint16_t* vl = P.vl + h * P.head;
    float* S = w.S;
    // S^T = K Q^T for keys b * 64 .. + 63 (rows j of S: key b * 64 + j).
    if (!P.six) {
        // Three passes over hi + mid (hi.hi, mid.hi, hi.mid): ~2^-17 of sum |q_d k_d| per score.
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t c = 0; c < DC; ++c) {
            _tile_loadd(4, qh + c * 256, 64);
            _tile_loadd(5, qm + c * 256, 64);
            const uint16_t* ah = kh + (b * KB) * D + c * 32;
            const uint16_t* am = km + (b * KB) * D + c * 32;
            KT_SPLIT3(0, ah, am, D * 2)
            KT_SPLIT3(1, ah + 16 * D, am + 16 * D, D * 2)
            KT_SPLIT3(2, ah + 32 * D, am + 32 * D, D * 2)
            KT_SPLIT3(3, ah + 48 * D, am + 48 * D, D * 2)
        }
        store4(S);
    } else {
        // Six passes (hi.hi, hi.mid, mid.hi, hi.lo, mid.mid, lo.hi): the scores to ~fp32's own
        // error. Three parts of Q^T and of K want six operand tiles, so the block runs as two
        // halves of 32 keys: scores in tiles 0-1, Q^T's parts in 2-4, K's in 5-7 (one slot each,
        // so no load waits for the products still reading a tile).
        for (int64_t half = 0; half < 2; ++half) {
            _tile_zero(0); _tile_zero(1);
            for (int64_t c = 0; c < DC; ++c) {
                _tile_loadd(2, qh + c * 256, 64);
                _tile_loadd(3, qm + c * 256, 64);
                _tile_loadd(4, ql + c * 256, 64);
                const int64_t at = (b * KB + half * 32) * D + c * 32;
#define KT_SCORE6(t)                                                 \
                _tile_loadd(5, kh + at + (t) * 16 * D, D * 2);           \
                _tile_loadd(6, km + at + (t) * 16 * D, D * 2);           \
                _tile_loadd(7, kl + at + (t) * 16 * D, D * 2);           \
                _tile_dpbf16ps(t, 5, 2);                                 \
                _tile_dpbf16ps(t, 5, 3);                                 \
                _tile_dpbf16ps(t, 6, 2);                                 \
                _tile_dpbf16ps(t, 5, 4);                                 \
                _tile_dpbf16ps(t, 6, 3);                                 \
                _tile_dpbf16ps(t, 7, 2);
                KT_SCORE6(0) KT_SCORE6(1)
#undef KT_SCORE6
            }
            _tile_stored(0, S + half * 512, 64);
            _tile_stored(1, S + half * 512 + 256, 64);
        }
    }
    KT_PROF_MARK(1);
    // Online softmax in base 2 down the columns; keys past a row's position masked.
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const bool masked = b * KB + KB - 1 > first;
    __m512 bm = neg_inf;
    for (int64_t j = 0; j < KB; ++j) {
        __m512 x = _mm512_load_ps(S + j * 16);
        if (masked) {
            x = _mm512_mask_blend_ps(_mm512_cmple_epi32_mask(_mm512_set1_epi32(int32_t(b * KB + j)), pos), neg_inf, x);
            _mm512_store_ps(S + j * 16, x);
        }
        bm = _mm512_max_ps(bm, x);
    }
    // A row's running max moves only when the block's exceeds it by more than LAZY (p up to
    // 2^LAZY meanwhile: harmless in fp32, and the hi / lo split is relative), so most blocks
    // keep alpha = 1 and skip rescaling O. The first block always sets it (m = -inf).
    const __mmask16 rise = _mm512_cmp_ps_mask(bm, _mm512_add_ps(m, _mm512_set1_ps(LAZY)), _CMP_GT_OQ);
    const __m512 mn = _mm512_mask_blend_ps(rise, m, bm);
    const __m512 alpha = rise ? exp2_neg(_mm512_sub_ps(m, mn)) : _mm512_set1_ps(1.f);  // 0 where m was -inf
    m = mn;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < KB; j += 2) {
        const __m512 e0 = exp2_neg(_mm512_sub_ps(_mm512_load_ps(S + j * 16), mn));
        const __m512 e1 = exp2_neg(_mm512_sub_ps(_mm512_load_ps(S + j * 16 + 16), mn));
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
        pair_split(e0, e1, w.ph + (j / 2) * 16, w.pl + (j / 2) * 16);
    }
    l = _mm512_fmadd_ps(l, alpha, sum);
    if (b > 0 && rise) {
        for (int64_t d = 0; d < D; ++d) _mm512_storeu_ps(O + d * 16, _mm512_mul_ps(_mm512_loadu_ps(O + d * 16), alpha));
    }
    KT_PROF_MARK(2);
    // O^T += V^T P^T, 64 d rows (four tiles) at a time; the block's keys are two halves of 32.
    for (int64_t g4 = 0; g4 < DG; g4 += 4) {
        float* o = O + g4 * 256;
        if (b > 0) {
            load4(o);
        } else {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        }
        for (int64_t half = 0; half < 2; ++half) {
            _tile_loadd(4, w.ph + half * 256, 64);
            _tile_loadd(5, w.pl + half * 256, 64);
            const uint16_t* th = vh + ((b * 2 + half) * DG + g4) * 512;
            const uint16_t* tl = vl + ((b * 2 + half) * DG + g4) * 512;
            KT_SPLIT3(0, th, tl, 64)
            KT_SPLIT3(1, th + 512, tl + 512, 64)
            KT_SPLIT3(2, th + 1024, tl + 1024, 64)
            KT_SPLIT3(3, th + 1536, tl + 1536, 64)
        }
        store4(o);
    }
}

// One task: kv head h, query rows r0 .. r0 + 16 * NG - 1 of the folded [n * G] rows
// (row = i * G + g), as NG groups of 16 that walk the key blocks together.
KT_AMX void run_task(const Problem& P, int64_t h, int64_t r0, Scratch& w) {
    const int64_t D = P.D, G = P.G, rows_total = P.n * G;
    const int64_t groups = std::min<int64_t>(NG, (rows_total - r0 + 15) / 16);
    alignas(64) int32_t posv[NG][16];
    alignas(64) uint16_t rh[MAX_D], rm[MAX_D], rl[MAX_D];
    __m512 m[NG], l[NG];
    __m512i pos[NG];
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t g0 = r0 + gi * 16, rows = std::min<int64_t>(16, rows_total - g0);
        uint32_t* qh = w.qh.data() + gi * (D / 32) * 256;
        uint32_t* qm = w.qm.data() + gi * (D / 32) * 256;
        uint32_t* ql = w.ql.data() + gi * (D / 32) * 256;
        for (int64_t r = 0; r < 16; ++r) {
            const int64_t row = g0 + std::min(r, rows - 1);  // padding rows repeat the last one
            const int64_t i = row / G, g = row % G;
            posv[gi][r] = int32_t(P.p + i);
            const float* src = P.q + i * P.sq_i + (h * G + g) * P.sq_h;
            const __m512 s = _mm512_set1_ps(P.qscale);
            for (int64_t d = 0; d < D; d += 16) split16x3(_mm512_mul_ps(_mm512_loadu_ps(src + d), s), rh + d, rm + d, rl + d);
            const uint32_t* h32 = reinterpret_cast<const uint32_t*>(rh);
            const uint32_t* m32 = reinterpret_cast<const uint32_t*>(rm);
            const uint32_t* l32 = reinterpret_cast<const uint32_t*>(rl);
            for (int64_t e = 0; e < D / 2; ++e) {  // d-pair e: tile e / 16, row e % 16, column r
                qh[(e / 16) * 256 + (e % 16) * 16 + r] = h32[e];
                qm[(e / 16) * 256 + (e % 16) * 16 + r] = m32[e];
                ql[(e / 16) * 256 + (e % 16) * 16 + r] = l32[e];
            }
        }
        pos[gi] = _mm512_load_si512(posv[gi]);
        m[gi] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        l[gi] = _mm512_setzero_ps();
    }
    const int64_t blocks = posv[groups - 1][15] / KB + 1;
    for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t gi = 0; gi < groups; ++gi) {
            if (posv[gi][15] < b * KB) continue;  // the group's rows see none of this block
            KT_PROF_MARK(0);
            const int64_t qt = gi * (D / 32) * 256;
            group_step(P, h, b, w.qh.data() + qt, w.qm.data() + qt, w.ql.data() + qt,
                       w.O.data() + gi * D * 16, pos[gi], posv[gi][0], m[gi], l[gi], w);
            KT_PROF_MARK(3);
        }
    }
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t g0 = r0 + gi * 16, rows = std::min<int64_t>(16, rows_total - g0);
        const float* O = w.O.data() + gi * D * 16;
        alignas(64) float inv[16];
        _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), l[gi]));
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t row = g0 + r, i = row / G, g = row % G;
            float* dst = P.out + (i * P.HQ + h * G + g) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] = O[d * 16 + r] * inv[r];
        }
    }
}

KT_AMX void run_tasks(const Problem& P, std::atomic<int64_t>* next, int64_t tasks, int64_t per_head) {
    amx::configure();
    Scratch w(P.D);
    for (int64_t t; (t = next->fetch_add(1)) < tasks;) {
        // The most expensive tasks (latest rows) first, heads interleaved.
        const int64_t h = t % P.H, blk = per_head - 1 - t / P.H;
        run_task(P, h, blk * 16 * NG, w);
    }
    _tile_release();
}

// task t: kv head t / kt, keys (t % kt) * 32 .. + 31 (K rows and one V^T tile column).
KT_AMX void pack_range(const float* k, const float* v, int64_t sk_j, int64_t sk_h, int64_t sv_j, int64_t sv_h,
                       int64_t keys, int64_t D, int64_t kt, uint16_t* kh, uint16_t* km, uint16_t* kl, uint16_t* vh, uint16_t* vl,
                       int64_t head, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t h = t / kt, j0 = (t % kt) * 32;
        pack_k_rows(k + h * sk_h, sk_j, keys, D, j0, j0 + 32, kh + h * head, km + h * head, kl + h * head);
        pack_vt_tile(v + h * sv_h, sv_j, keys, D, j0, vh + h * head, vl + h * head);
    }
}
#endif  // KT_HAVE_AMX

}  // namespace amx_attn

// q [n, HQ, D] fp32 at positions p .. p + n - 1; k, v [p + n, H, D] fp32 (rows may be
// strided, d contiguous). Query i sees keys 0 .. p + i. -> [n, HQ, D] fp32.
//
// six: the scores in six tile passes over three bf16 parts (hi.hi, hi.mid, mid.hi, hi.lo,
// mid.mid, lo.hi: fp32's own error) rather than three over two (error ~2^-17 of
// sum |q_d k_d|); the caller picks it where the scores are large enough for that to show.
torch::Tensor amx_prefill_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, bool six) {
#if KT_HAVE_AMX
    TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
                "amx_prefill_attention: fp32 q, k, v");
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "amx_prefill_attention: [rows, heads, D]");
    const int64_t n = q.size(0), HQ = q.size(1), D = q.size(2), keys = k.size(0), H = k.size(1);
    TORCH_CHECK(D % 64 == 0 && D <= amx_attn::MAX_D && k.size(2) == D && v.size(2) == D, "amx_prefill_attention: D a multiple of 64, <= 256");
    TORCH_CHECK(H > 0 && HQ % H == 0 && v.size(0) == keys && v.size(1) == H && keys >= n && n > 0, "amx_prefill_attention: shapes");
    if (q.stride(2) != 1) q = q.contiguous();
    if (k.stride(2) != 1) k = k.contiguous();
    if (v.stride(2) != 1) v = v.contiguous();
    const int64_t padded = (keys + amx_attn::KB - 1) / amx_attn::KB * amx_attn::KB;
    const int64_t head = padded * D;  // bf16 elements per kv head and part
    const auto u16 = torch::TensorOptions().dtype(torch::kInt16);
    auto packed = torch::empty({5, H * head}, u16);  // K hi, mid, lo; V^T hi, lo
    auto* base = reinterpret_cast<uint16_t*>(packed.data_ptr());
    uint16_t *kh = base, *km = base + H * head, *kl = base + 2 * H * head;
    uint16_t *vh = base + 3 * H * head, *vl = base + 4 * H * head;
    const int64_t kt = padded / 32;
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    const int64_t skj = k.stride(0), skh = k.stride(1), svj = v.stride(0), svh = v.stride(1);
    at::parallel_for(0, H * kt, 8, [&](int64_t t0, int64_t t1) {
        amx_attn::pack_range(kp, vp, skj, skh, svj, svh, keys, D, kt, kh, km, kl, vh, vl, head, t0, t1);
    });
    auto out = torch::empty({n, HQ, D}, q.options());
    amx_attn::Problem P{q.data_ptr<float>(), q.stride(0), q.stride(1), kh, km, kl, vh, vl, head,
                        out.data_ptr<float>(), n, HQ, H, HQ / H, D, keys - n, float(scale * 1.4426950408889634), six};
    const int64_t per_head = (n * P.G + 16 * amx_attn::NG - 1) / (16 * amx_attn::NG), tasks = per_head * H;
    std::atomic<int64_t> next{0};
    const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks);
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { amx_attn::run_tasks(P, &next, tasks, per_head); });
    return out;
#else
    TORCH_CHECK(false, "amx_prefill_attention: built without AMX intrinsics");
    return q;
#endif
}
"""

FUNCTIONS = ["amx_prefill_attention"]

_state: list = []  # [module or None] once decided


def _module():
    if not _state:
        from ktcli.engine import amx_gemm

        module = cpp_ext.load("KTCLI_NO_AMX_ATTENTION")
        _state.append(module if module is not None and amx_gemm.available() else None)
    return _state[0]


def available() -> bool:
    """Whether fp32 prefill attention runs on AMX here (decided once per process)."""
    return _module() is not None


def supports(q: torch.Tensor) -> bool:
    """Whether these queries suit the kernel (on the CPU, a head size that is a multiple of
    64 up to 256) and the kernel is available."""
    d = q.shape[-1]
    return q.device.type == "cpu" and q.is_floating_point() and d % 64 == 0 and d <= 256 and available()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, HQ, D] at positions p .. p+n-1; k, v [p + n, H, D]; query i sees keys 0 .. p+i.
    Returns [n, HQ, D] fp32. Callers check `supports(q)` first."""
    q, k = q.float(), k.float()
    return _module().amx_prefill_attention(q, k, v.float(), float(scale), score_error(q, k, scale) > SIX_PASS_ABOVE)


# Scores take six tile passes where `score_error` (an overestimate of the three-pass score
# error, nats) is above this. Measured: SmolLM2's layers 0.9-3.9e-4 (three passes: logits
# 1.4e-5 from transformers'); the head-size-128 test models with a wide init 0.9-1.8e-3
# (three passes: 1.2-3.9e-4, past the engine's 1e-4; six: 1-3e-5, as the flash kernel).
SIX_PASS_ABOVE = 4.5e-4


def score_error(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    """The three-pass scores' typical error: hi + mid hold each operand to ~2^-17, so a score
    q.k is off by about 2^-17 |q| |k| (root-mean-square norms of the rows)."""
    qn = q.square().sum(-1).mean().sqrt()
    kn = k.square().sum(-1).mean().sqrt()
    return float(qn * kn) * scale * 2.0**-17


def attend_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The oracle: causal attention of the same inputs in float64 (the kernel's target is
    fp32's own error against it)."""
    n, n_q, d = q.shape
    keys, n_kv = k.shape[0], k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(n_q // n_kv, dim=1), v.double().repeat_interleave(n_q // n_kv, dim=1)
    s = torch.einsum("ihd,jhd->hij", qd, kd) * scale
    pos = torch.arange(keys - n, keys)[:, None]
    s = s.masked_fill(torch.arange(keys)[None, :] > pos, -math.inf)
    return torch.einsum("hij,jhd->ihd", s.softmax(-1), vd).float()
