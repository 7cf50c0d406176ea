"""Decode attention on the CPU: one query token per sequence over the paged KV cache,
read in place, in one call for every sequence of a step.

Why a kernel of our own: BLAS batched products over the cache need the keys of each kv
head as a [D, keys] operand, which the [slots, H, D] layout only gives as a strided view
that gets copied every layer (the copy, not the product, dominated decode at 4096
tokens), and torch's SDPA reads the keys once per *query* head. This kernel walks each
sequence's block table, loads every key and value row once for all G query heads that
share its kv head (GQA), and splits long contexts into key ranges so both cores stream
from memory, each range keeping a running softmax (flash-decoding) that a final merge
combines. Pages may be fp32, fp16 (widened with F16C) or bf16; scores, softmax and the
output stay fp32. The step's new K/V rows are written into their slots by the same call.
The library is built for AVX2; on CPUs with AVX-512 a 16-lane body with software prefetch
runs instead (KTCLI_NO_AVX512=1 keeps the AVX2 one).

Built once by `engine.cpp_ext`; where that fails `available()` is False and attention
keeps its torch path (`engine.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ktcli.engine import cpp_ext

SOURCE = r"""
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int MAXG = 16;   // query heads per kv head
constexpr int BLK = 64;    // keys per softmax block (their K and V rows stay in L1/L2)
constexpr int64_t MIN_RANGE = 256;  // fewest keys worth a work item of their own
constexpr int GT = 3;      // query heads per register tile (3 x 4 accumulators + loads fit 16 ymm)
constexpr int CT = 4;      // output chunks of 8 per register tile in the value pass

struct LoadF32 {
    using T = float;
    static inline __m256 load(const float* p) { return _mm256_loadu_ps(p); }
    __attribute__((target("avx512f"))) static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
    static inline T from_float(float x) { return x; }
};
struct LoadF16 {
    using T = at::Half;
    static inline __m256 load(const at::Half* p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    __attribute__((target("avx512f"))) static inline __m512 load16(const at::Half* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    static inline T from_float(float x) { return at::Half(x); }
};
struct LoadBF16 {
    using T = at::BFloat16;
    static inline __m256 load(const at::BFloat16* p) {
        __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    __attribute__((target("avx512f"))) static inline __m512 load16(const at::BFloat16* p) {
        __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static inline T from_float(float x) { return at::BFloat16(x); }
};

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Four partial-sum vectors -> their four full sums.
inline __m128 reduce4(const __m256* a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
    __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 u = _mm256_hadd_ps(t0, t1);  // a0 a1 a2 a3 (low-half sums) | same (high halves)
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// e^x for x <= 0: range reduction by ln 2 (split in two parts for precision), a degree-6
// polynomial on |r| <= ln2/2, then 2^n put into the exponent bits. Relative error ~1e-7.
inline __m256 exp_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // keeps 2^n a normal float
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// The running softmax state of G query heads over a range of keys.
template <int D>
struct State {
    float m[MAXG], l[MAXG];
    alignas(32) float acc[MAXG][D];
};

// Scores of NG query heads q [NG, D] (pre-scaled) against keys krow[0 .. nb8): four keys
// x NG heads of accumulators per pass, so each key row is loaded (and, for half-precision
// pages, widened) once per NG heads rather than once per head.
template <class L, int D, int NG>
inline void score_tile(const float* q, const typename L::T* const* krow, int nb8, float (*s)[BLK]) {
    constexpr int NC = D / 8;
    for (int j0 = 0; j0 < nb8; j0 += 4) {
        __m256 a[NG][4];
        for (int g = 0; g < NG; ++g)
            for (int u = 0; u < 4; ++u) a[g][u] = _mm256_setzero_ps();
        for (int c = 0; c < NC; ++c)
            for (int u = 0; u < 4; ++u) {
                const __m256 kc = L::load(krow[j0 + u] + c * 8);
                for (int g = 0; g < NG; ++g) a[g][u] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(q + g * D + c * 8), a[g][u]);
            }
        for (int g = 0; g < NG; ++g) _mm_store_ps(s[g] + j0, reduce4(a[g]));
    }
}

// acc[g] += p[g][j] * v[j] for NG heads over value rows vrow[0 .. nb): CT chunks of 8
// output dims x NG heads held in registers, each value chunk loaded once per NG heads.
template <class L, int D, int NG>
inline void value_tile(const float (*p)[BLK], const typename L::T* const* vrow, int nb, float (*acc)[D]) {
    constexpr int NC = D / 8;
    constexpr int W = NC < CT ? NC : CT;
    for (int c0 = 0; c0 < NC; c0 += W) {
        __m256 o[NG][W];
        for (int g = 0; g < NG; ++g)
            for (int c = 0; c < W; ++c) o[g][c] = _mm256_load_ps(acc[g] + (c0 + c) * 8);
        for (int j = 0; j < nb; ++j) {
            const typename L::T* vr = vrow[j] + c0 * 8;
            __m256 pg[NG];
            for (int g = 0; g < NG; ++g) pg[g] = _mm256_set1_ps(p[g][j]);
            for (int c = 0; c < W; ++c) {
                const __m256 vc = L::load(vr + c * 8);
                for (int g = 0; g < NG; ++g) o[g][c] = _mm256_fmadd_ps(pg[g], vc, o[g][c]);
            }
        }
        for (int g = 0; g < NG; ++g)
            for (int c = 0; c < W; ++c) _mm256_store_ps(acc[g] + (c0 + c) * 8, o[g][c]);
    }
}

// Row pointers of the nb keys from (page, off) on through the block table, which
// advance past them; rows nb .. nb8 repeat the last real one (padding, masked later).
template <class T>
inline void fill_rows(const T* kbase, const T* vbase, int64_t row_stride, const int32_t* table, int64_t bs,
                      int64_t& page, int64_t& off, int nb, const T** krow, const T** vrow) {
    for (int j = 0; j < nb; ++j) {
        const int64_t slot = int64_t(table[page]) * bs + off;
        krow[j] = kbase + slot * row_stride;
        vrow[j] = vbase + slot * row_stride;
        if (++off == bs) { off = 0; ++page; }
    }
    const int nb8 = (nb + 7) & ~7;
    for (int j = nb; j < nb8; ++j) krow[j] = krow[nb - 1];
}

template <int D>
inline void reset(State<D>& st, int G) {
    for (int g = 0; g < G; ++g) {
        st.m[g] = -std::numeric_limits<float>::infinity();
        st.l[g] = 0.f;
        std::memset(st.acc[g], 0, sizeof(float) * D);
    }
}

// The running softmax over one block: scores s[g][0 .. nb8) become p = e^(s - m) in place
// (padding lanes past nb zeroed; their scores equal a real key's, so the max is unaffected),
// and each head's accumulator is rescaled when its max grows.
template <int D>
inline void softmax_block(float (*s)[BLK], int G, int nb, State<D>& st) {
    constexpr int NC = D / 8;
    const int nb8 = (nb + 7) & ~7;
    for (int g = 0; g < G; ++g) {
        __m256 mx = _mm256_load_ps(s[g]);
        for (int j0 = 8; j0 < nb8; j0 += 8) mx = _mm256_max_ps(mx, _mm256_load_ps(s[g] + j0));
        const float m_new = std::max(st.m[g], hmax(mx));
        if (m_new > st.m[g]) {
            const float corr = std::exp(st.m[g] - m_new);  // 0 on the first block
            st.l[g] *= corr;
            const __m256 cv = _mm256_set1_ps(corr);
            for (int c = 0; c < NC; ++c)
                _mm256_store_ps(st.acc[g] + c * 8, _mm256_mul_ps(_mm256_load_ps(st.acc[g] + c * 8), cv));
            st.m[g] = m_new;
        }
        const __m256 mv = _mm256_set1_ps(m_new);
        __m256 sum = _mm256_setzero_ps();
        for (int j0 = 0; j0 < nb8; j0 += 8) {
            __m256 p = exp_neg(_mm256_sub_ps(_mm256_load_ps(s[g] + j0), mv));
            if (j0 + 8 > nb) {  // zero the padding lanes
                const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb - j0), idx);
                p = _mm256_and_ps(p, _mm256_castsi256_ps(keep));
            }
            _mm256_store_ps(s[g] + j0, p);
            sum = _mm256_add_ps(sum, p);
        }
        st.l[g] += hsum(sum);
    }
}

// Keys [t0, t1) of one kv head for its G (pre-scaled) query heads q [G, D].
template <class L, int D>
void attend_range(const float* q, int G, const typename L::T* kbase, const typename L::T* vbase,
                  int64_t row_stride, const int32_t* table, int64_t bs, int64_t t0, int64_t t1,
                  State<D>& st) {
    using T = typename L::T;
    alignas(32) float s[MAXG][BLK];
    const T* krow[BLK];
    const T* vrow[BLK];
    reset(st, G);
    int64_t page = t0 / bs, off = t0 % bs;
    for (int64_t tb = t0; tb < t1; tb += BLK) {
        const int nb = int(std::min<int64_t>(BLK, t1 - tb));
        fill_rows(kbase, vbase, row_stride, table, bs, page, off, nb, krow, vrow);
        const int nb8 = (nb + 7) & ~7;
        // scores: four keys x up to GT query heads per pass (score_tile)
        for (int g0 = 0; g0 < G; g0 += GT) {
            switch (std::min(GT, G - g0)) {
                case 3: score_tile<L, D, 3>(q + g0 * D, krow, nb8, s + g0); break;
                case 2: score_tile<L, D, 2>(q + g0 * D, krow, nb8, s + g0); break;
                default: score_tile<L, D, 1>(q + g0 * D, krow, nb8, s + g0);
            }
        }
        softmax_block(s, G, nb, st);
        // values: acc[g] += p[g][j] * v[j] (value_tile)
        for (int g0 = 0; g0 < G; g0 += GT) {
            switch (std::min(GT, G - g0)) {
                case 3: value_tile<L, D, 3>(s + g0, vrow, nb, st.acc + g0); break;
                case 2: value_tile<L, D, 2>(s + g0, vrow, nb, st.acc + g0); break;
                default: value_tile<L, D, 1>(s + g0, vrow, nb, st.acc + g0);
            }
        }
    }
}

// -- the same with 16 lanes (AVX-512 F), chosen at run time by use_avx512() --------------
// Half the FMAs and widening instructions of the AVX2 body per key, and software prefetch:
// the value rows of a block while its scores are computed, the next block's key rows while
// its values are summed (a 4K-token context of SmolLM2 is 94 MB of fp16 pages a token,
// read from DRAM where the last-level cache is smaller).

__attribute__((target("avx512f"))) inline __m128 reduce4_512(const __m512* a) {
    __m256 h[4];
    for (int u = 0; u < 4; ++u)
        h[u] = _mm256_add_ps(_mm512_castps512_ps256(a[u]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[u]), 1)));
    return reduce4(h);
}

template <class T, int D>
inline void prefetch_rows(const T* const* rows, int n) {
    for (int j = 0; j < n; ++j)
        for (int b = 0; b < int(D * sizeof(T)); b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(rows[j]) + b, _MM_HINT_T0);
}

template <class L, int D, int NG>
__attribute__((target("avx512f,fma,f16c")))
inline void score_tile512(const float* q, const typename L::T* const* krow, int nb8, float (*s)[BLK]) {
    constexpr int NC = D / 16;
    for (int j0 = 0; j0 < nb8; j0 += 4) {
        __m512 a[NG][4];
        for (int g = 0; g < NG; ++g)
            for (int u = 0; u < 4; ++u) a[g][u] = _mm512_setzero_ps();
        for (int c = 0; c < NC; ++c)
            for (int u = 0; u < 4; ++u) {
                const __m512 kc = L::load16(krow[j0 + u] + c * 16);
                for (int g = 0; g < NG; ++g) a[g][u] = _mm512_fmadd_ps(kc, _mm512_loadu_ps(q + g * D + c * 16), a[g][u]);
            }
        for (int g = 0; g < NG; ++g) _mm_store_ps(s[g] + j0, reduce4_512(a[g]));
    }
}

template <class L, int D, int NG>
__attribute__((target("avx512f,fma,f16c")))
inline void value_tile512(const float (*p)[BLK], const typename L::T* const* vrow, int nb, float (*acc)[D]) {
    constexpr int NC = D / 16;
    constexpr int W = NC < CT ? NC : CT;
    for (int c0 = 0; c0 < NC; c0 += W) {
        __m512 o[NG][W];
        for (int g = 0; g < NG; ++g)
            for (int c = 0; c < W; ++c) o[g][c] = _mm512_loadu_ps(acc[g] + (c0 + c) * 16);
        for (int j = 0; j < nb; ++j) {
            const typename L::T* vr = vrow[j] + c0 * 16;
            __m512 pg[NG];
            for (int g = 0; g < NG; ++g) pg[g] = _mm512_set1_ps(p[g][j]);
            for (int c = 0; c < W; ++c) {
                const __m512 vc = L::load16(vr + c * 16);
                for (int g = 0; g < NG; ++g) o[g][c] = _mm512_fmadd_ps(pg[g], vc, o[g][c]);
            }
        }
        for (int g = 0; g < NG; ++g)
            for (int c = 0; c < W; ++c) _mm512_storeu_ps(acc[g] + (c0 + c) * 16, o[g][c]);
    }
}

template <class L, int D>
__attribute__((target("avx512f,fma,f16c")))
void attend_range512(const float* q, int G, const typename L::T* kbase, const typename L::T* vbase,
                     int64_t row_stride, const int32_t* table, int64_t bs, int64_t t0, int64_t t1,
                     State<D>& st) {
    using T = typename L::T;
    alignas(32) float s[MAXG][BLK];
    const T* krow[2][BLK];  // this block's rows and the next one's (being prefetched)
    const T* vrow[2][BLK];
    reset(st, G);
    int64_t page = t0 / bs, off = t0 % bs;
    int cur = 0;
    fill_rows(kbase, vbase, row_stride, table, bs, page, off, int(std::min<int64_t>(BLK, t1 - t0)), krow[0], vrow[0]);
    for (int64_t tb = t0; tb < t1; tb += BLK) {
        const int nb = int(std::min<int64_t>(BLK, t1 - tb));
        const int nb8 = (nb + 7) & ~7;
        prefetch_rows<T, D>(vrow[cur], nb);
        for (int g0 = 0; g0 < G; g0 += GT) {
            switch (std::min(GT, G - g0)) {
                case 3: score_tile512<L, D, 3>(q + g0 * D, krow[cur], nb8, s + g0); break;
                case 2: score_tile512<L, D, 2>(q + g0 * D, krow[cur], nb8, s + g0); break;
                default: score_tile512<L, D, 1>(q + g0 * D, krow[cur], nb8, s + g0);
            }
        }
        const int64_t next = tb + BLK;
        if (next < t1) {
            const int nn = int(std::min<int64_t>(BLK, t1 - next));
            fill_rows(kbase, vbase, row_stride, table, bs, page, off, nn, krow[cur ^ 1], vrow[cur ^ 1]);
            prefetch_rows<T, D>(krow[cur ^ 1], nn);
        }
        softmax_block(s, G, nb, st);
        for (int g0 = 0; g0 < G; g0 += GT) {
            switch (std::min(GT, G - g0)) {
                case 3: value_tile512<L, D, 3>(s + g0, vrow[cur], nb, st.acc + g0); break;
                case 2: value_tile512<L, D, 2>(s + g0, vrow[cur], nb, st.acc + g0); break;
                default: value_tile512<L, D, 1>(s + g0, vrow[cur], nb, st.acc + g0);
            }
        }
        cur ^= 1;
    }
}

struct Item { int64_t b, h, t0, t1; };

template <class L, int D>
void run(const torch::Tensor& q, torch::Tensor& out, const torch::Tensor& kc, const torch::Tensor& vc,
         const torch::Tensor& tables, int64_t bs, const int64_t* ctx, const int64_t* lo, double scale) {
    using T = typename L::T;
    const int64_t B = q.size(0), HQ = q.size(1), H = kc.size(1);
    const int G = int(HQ / H);
    const int64_t row_stride = H * D;
    const T* kp = kc.data_ptr<T>();
    const T* vp = vc.data_ptr<T>();
    const int32_t* tp = tables.data_ptr<int32_t>();
    const int64_t tstride = tables.stride(0);
    const float* qp = q.data_ptr<float>();
    const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
    float* op = out.data_ptr<float>();

    // Work items: key ranges of (sequence, kv head), about 8 per thread in all.
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) total += (ctx[b] - lo[b]) * H;
    const int64_t per_item = std::max<int64_t>(MIN_RANGE, (total + 8 * at::get_num_threads() - 1) / (8 * at::get_num_threads()));
    std::vector<Item> items;
    std::vector<int64_t> first(B * H + 1);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            first[b * H + h] = int64_t(items.size());
            const int64_t len = ctx[b] - lo[b];
            const int64_t parts = std::max<int64_t>(1, (len + per_item - 1) / per_item);
            for (int64_t i = 0; i < parts; ++i)
                items.push_back({b, h, lo[b] + len * i / parts, lo[b] + len * (i + 1) / parts});
        }
    first[B * H] = int64_t(items.size());
    std::vector<State<D>> states(items.size());

    const bool wide = use_avx512();
    at::parallel_for(0, int64_t(items.size()), 1, [&](int64_t i0, int64_t i1) {
        alignas(32) float qg[MAXG * D];
        for (int64_t i = i0; i < i1; ++i) {
            const Item& it = items[i];
            for (int g = 0; g < G; ++g) {
                const float* src = qp + it.b * qs0 + (it.h * G + g) * qs1;
                for (int d = 0; d < D; ++d) qg[g * D + d] = float(src[d] * scale);
            }
            if (wide)
                attend_range512<L, D>(qg, G, kp + it.h * D, vp + it.h * D, row_stride, tp + it.b * tstride, bs,
                                      it.t0, it.t1, states[i]);
            else
                attend_range<L, D>(qg, G, kp + it.h * D, vp + it.h * D, row_stride, tp + it.b * tstride, bs,
                                   it.t0, it.t1, states[i]);
        }
    });

    // merge the ranges of each (sequence, kv head): rescale to the common max
    for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        for (int g = 0; g < G; ++g) {
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t i = first[bh]; i < first[bh + 1]; ++i) m = std::max(m, states[i].m[g]);
            float l = 0.f;
            alignas(32) float acc[D] = {0};
            for (int64_t i = first[bh]; i < first[bh + 1]; ++i) {
                const float w = states[i].l[g] > 0.f ? std::exp(states[i].m[g] - m) : 0.f;
                l += states[i].l[g] * w;
                for (int d = 0; d < D; ++d) acc[d] += states[i].acc[g][d] * w;
            }
            float* dst = op + (b * HQ + h * G + g) * D;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            for (int d = 0; d < D; ++d) dst[d] = acc[d] * inv;
        }
    }
}

template <class L>
void dispatch_d(int64_t D, const torch::Tensor& q, torch::Tensor& out, const torch::Tensor& kc,
                const torch::Tensor& vc, const torch::Tensor& tables, int64_t bs, const int64_t* ctx,
                const int64_t* lo, double scale) {
    switch (D) {
        case 16: return run<L, 16>(q, out, kc, vc, tables, bs, ctx, lo, scale);
        case 32: return run<L, 32>(q, out, kc, vc, tables, bs, ctx, lo, scale);
        case 64: return run<L, 64>(q, out, kc, vc, tables, bs, ctx, lo, scale);
        case 128: return run<L, 128>(q, out, kc, vc, tables, bs, ctx, lo, scale);
        case 256: return run<L, 256>(q, out, kc, vc, tables, bs, ctx, lo, scale);
        default: TORCH_CHECK(false, "head_dim must be 16, 32, 64, 128 or 256");
    }
}

// A value as a page element; fp16 saturates at its largest finite value (65504) rather
// than becoming inf, which would turn every score it touches into NaN.
template <class T>
inline T to_page(float x) { return T(x); }
template <>
inline at::Half to_page<at::Half>(float x) { return at::Half(std::min(std::max(x, -65504.f), 65504.f)); }

template <class T>
void store(torch::Tensor& cache, const torch::Tensor& rows, const int64_t* slots) {
    // rows [B, H, D] fp32 (any strides with unit last stride) -> cache[slots[b]]
    const int64_t B = rows.size(0), H = rows.size(1), D = rows.size(2);
    T* cp = cache.data_ptr<T>();
    const float* rp = rows.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const float* src = rp + b * rows.stride(0) + h * rows.stride(1);
            T* dst = cp + (slots[b] * H + h) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] = to_page<T>(src[d]);
        }
}

}  // namespace

bool supported(int64_t head_dim, int64_t group) {
    return group >= 1 && group <= MAXG &&
           (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256);
}

// q [B, HQ, D] fp32 (unit last stride); k_new, v_new [B, H, D] fp32 or empty; slots [B] int64
// (where k_new/v_new go); k_cache, v_cache [S, H, D] contiguous fp32/fp16/bf16;
// tables [B, max_blocks] int32; ctx, lo [B] int64: sequence b attends keys lo[b] .. ctx[b]-1.
torch::Tensor decode(torch::Tensor q, torch::Tensor k_new, torch::Tensor v_new, torch::Tensor slots,
                     torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor tables, int64_t block_size,
                     torch::Tensor ctx, torch::Tensor lo, double scale) {
    TORCH_CHECK(q.dtype() == torch::kFloat32 && q.dim() == 3 && q.stride(2) == 1, "q [B, HQ, D] fp32");
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3, "caches [S, H, D] contiguous");
    TORCH_CHECK(k_cache.dtype() == v_cache.dtype(), "one cache dtype");
    TORCH_CHECK(tables.dtype() == torch::kInt32 && tables.dim() == 2 && tables.stride(1) == 1, "tables int32 [B, blocks]");
    TORCH_CHECK(ctx.dtype() == torch::kInt64 && lo.dtype() == torch::kInt64 && ctx.is_contiguous() && lo.is_contiguous(), "ctx, lo int64");
    const int64_t B = q.size(0), HQ = q.size(1), D = q.size(2), H = k_cache.size(1);
    TORCH_CHECK(k_cache.size(2) == D && HQ % H == 0 && supported(D, HQ / H), "shapes");
    TORCH_CHECK(tables.size(0) == B && ctx.size(0) == B && lo.size(0) == B, "one row per sequence");
    const int64_t* cp = ctx.data_ptr<int64_t>();
    const int64_t* lp = lo.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
        TORCH_CHECK(0 <= lp[b] && lp[b] < cp[b] && cp[b] <= tables.size(1) * block_size, "key range");
    if (k_new.numel()) {
        TORCH_CHECK(k_new.dtype() == torch::kFloat32 && v_new.dtype() == torch::kFloat32 && k_new.stride(2) == 1 &&
                    v_new.stride(2) == 1 && k_new.size(0) == B && v_new.size(0) == B && k_new.size(1) == H &&
                    k_new.size(2) == D && v_new.size(1) == H && v_new.size(2) == D, "k_new, v_new [B, H, D] fp32");
        TORCH_CHECK(slots.dtype() == torch::kInt64 && slots.is_contiguous() && slots.size(0) == B, "slots [B] int64");
        const int64_t* sp = slots.data_ptr<int64_t>();
        for (int64_t b = 0; b < B; ++b) TORCH_CHECK(0 <= sp[b] && sp[b] < k_cache.size(0), "slot");
        if (k_cache.dtype() == torch::kFloat32) { store<float>(k_cache, k_new, sp); store<float>(v_cache, v_new, sp); }
        else if (k_cache.dtype() == torch::kFloat16) { store<at::Half>(k_cache, k_new, sp); store<at::Half>(v_cache, v_new, sp); }
        else { store<at::BFloat16>(k_cache, k_new, sp); store<at::BFloat16>(v_cache, v_new, sp); }
    }
    auto out = torch::empty({B, HQ, D}, q.options());
    if (k_cache.dtype() == torch::kFloat32) dispatch_d<LoadF32>(D, q, out, k_cache, v_cache, tables, block_size, cp, lp, scale);
    else if (k_cache.dtype() == torch::kFloat16) dispatch_d<LoadF16>(D, q, out, k_cache, v_cache, tables, block_size, cp, lp, scale);
    else if (k_cache.dtype() == torch::kBFloat16) dispatch_d<LoadBF16>(D, q, out, k_cache, v_cache, tables, block_size, cp, lp, scale);
    else TORCH_CHECK(false, "cache dtype fp32, fp16 or bf16");
    return out;
}
"""

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_GROUP = 16
HEAD_DIMS = (16, 32, 64, 128, 256)


FUNCTIONS = ["decode", "supported"]


def _load():
    return cpp_ext.load("KTCLI_NO_ATTN_KERNEL")


def available() -> bool:
    return _load() is not None


def supports(head_dim: int, n_heads: int, n_kv_heads: int, cache_dtype: torch.dtype) -> bool:
    """Whether this model shape and page dtype can run here (else: torch's path)."""
    return (
        cache_dtype in CACHE_DTYPES
        and head_dim in HEAD_DIMS
        and n_heads % n_kv_heads == 0
        and n_heads // n_kv_heads <= MAX_GROUP
        and available()
    )


@dataclass
class DecodeBatch:
    """The pages of every sequence of a decode step, built once per step and shared by
    all layers: block tables [B, max_blocks] int32, lengths and per-window first keys."""

    tables: torch.Tensor
    block_size: int
    ctx: torch.Tensor  # [B] int64
    lo: dict  # window -> [B] int64 first key attended to
    slots: torch.Tensor  # [B] int64 slot of each sequence's new token

    @classmethod
    def from_seqs(cls, seqs, block_size: int, slot_mapping: torch.Tensor) -> "DecodeBatch":
        """From the runner's SeqAttn records (one token each)."""
        rows = [s.block_table(block_size) for s in seqs]
        if len(rows) == 1:
            tables = rows[0][None]  # one sequence (a CLI answer): no padded copy
        else:
            tables = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.int32)
            for i, r in enumerate(rows):
                tables[i, : len(r)] = r
        ctx = torch.tensor([s.ctx for s in seqs], dtype=torch.int64)
        lo = {w: torch.tensor([s.masks[w][0] for s in seqs], dtype=torch.int64) for w in seqs[0].masks}
        return cls(tables, block_size, ctx, lo, slot_mapping.to(torch.int64).contiguous())

    def attend(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, k_cache: torch.Tensor,
               v_cache: torch.Tensor, window, scale: float) -> torch.Tensor:
        """q [B, HQ, D] fp32 -> [B, HQ, D] fp32; k, v [B, H, D] (the step's new rows, stored
        first) or None when already stored."""
        if k is None:
            k = v = torch.empty(0)
        return _load().decode(q, k, v, self.slots, k_cache, v_cache, self.tables, self.block_size,
                              self.ctx, self.lo[window], scale)
