"""y = x @ w.T for a few fp32 rows x [R, K] and a bf16 (or fp32) matrix w [N, K], fp32 out [R, N].

Why a kernel of our own: on CPUs without native bf16 (AVX2), torch's bf16 matrix-vector
product rounds the activations to bf16 (most of the greedy-token drift from fp32) and
is bound by its conversions, not by memory, so it barely beats fp32 although it reads
half the bytes. This one widens each weight row in registers (a bf16 is the top half
of an fp32), keeps x and the sums in fp32, and reads every weight byte once per call
for all R rows. Built once by `engine.cpp_ext`; where that fails (no compiler, no AVX2)
`available()` is False and the model falls back to torch's path.

fp32 weights take the same loop without the widening: MKL's matrix-vector product streams
fp32 weights at only 12.5 GB/s on the 2-core Zen 5 EPYC (its code path for AMD CPUs),
where this loop with software prefetch reads bf16 at 38 GB/s, so decode with fp32 weights
runs it too for steps of up to F32_MAX_ROWS rows.
"""

from __future__ import annotations

import torch

from ktcli.engine import cpp_ext

SOURCE = r"""
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstring>
#include <cstdlib>
#include <type_traits>

static inline __m256 load_bf16x8(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// How the row loops read a weight: bf16 widened by a shift (a bf16 is the top half of an
// fp32), or fp32 as is.
struct WeightBf16 {
    using T = uint16_t;
    static inline __m256 load8(const T* p) { return load_bf16x8(p); }
    __attribute__((target("avx512f,avx512bw"))) static inline __m512 load16(const T* p) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    }
    static inline float one(const T* p) {
        uint32_t bits = uint32_t(*p) << 16;
        float wf;
        std::memcpy(&wf, &bits, 4);
        return wf;
    }
};
struct WeightF32 {
    using T = float;
    static inline __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
    __attribute__((target("avx512f"))) static inline __m512 load16(const T* p) { return _mm512_loadu_ps(p); }
    static inline float one(const T* p) { return *p; }
};

// sum over k in [k0, K) of w[k] * x[k], one weight at a time: the tail a vector loop leaves
template <class W>
static inline float tail_dot(const typename W::T* w, const float* x, int64_t k0, int64_t K) {
    float s = 0.f;
    for (int64_t k = k0; k < K; ++k) s += W::one(w + k) * x[k];
    return s;
}

// Whether this CPU (and OS) runs AVX-512 F+BW. The library is compiled for AVX2; the
// matrix-vector kernels keep a second body with 16-lane registers (compiled per function
// with a target attribute) and pick it at run time. On the 2-core Xeon they were measured
// on, the AVX2 bodies are bound by their widening and FMAs, not by memory (the int8
// product streamed 20 GB/s from L3 where fp32 BLAS streamed 40). KTCLI_NO_AVX512=1 keeps
// the AVX2 bodies (A/B).
static inline bool use_avx512() {
    static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                            && !std::getenv("KTCLI_NO_AVX512");
    return yes;
}

// What the kernels run here (benchmarks record it).
bool avx512_bodies() { return use_avx512(); }

// f(std::integral_constant<int, R>{}) for R = min(rg, 8): the row count as a template
// argument, from one switch for every kernel.
template <typename F>
static inline void by_rows(int64_t rg, F&& f) {
    switch (rg) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        default: f(std::integral_constant<int, 8>{}); break;
    }
}

// weight_rows with 16 lanes: 32 weights a step.
template <class W, int R>
__attribute__((target("avx512f,avx512bw,fma")))
static void weight_rows512(const float* x, const typename W::T* w, float* y, int64_t n0, int64_t n1, int64_t N, int64_t K) {
    const int64_t K32 = K - K % 32;
    for (int64_t n = n0; n < n1; ++n) {
        const typename W::T* wr = w + n * K;
        __m512 a0[R], a1[R];
        for (int r = 0; r < R; ++r) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); }
        for (int64_t k = 0; k < K32; k += 32) {
            // 2 KB ahead in the weight stream (into later rows: the matrix is contiguous);
            // prefetches past its end are harmless. Measured on the Xeon over SmolLM2's
            // matrices: the hardware prefetcher alone left the stream at ~9-12 GB/s.
            // fp32 rows: a step is two cache lines, so the second one gets its own prefetch.
            _mm_prefetch(reinterpret_cast<const char*>(wr + k) + 2048, _MM_HINT_T0);
            if (sizeof(typename W::T) == 4) _mm_prefetch(reinterpret_cast<const char*>(wr + k) + 2048 + 64, _MM_HINT_T0);
            const __m512 w0 = W::load16(wr + k);
            const __m512 w1 = W::load16(wr + k + 16);
            for (int r = 0; r < R; ++r) {
                a0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * K + k), a0[r]);
                a1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * K + k + 16), a1[r]);
            }
        }
        for (int r = 0; r < R; ++r) {
            float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
            y[r * N + n] = s + tail_dot<W>(wr, x + r * K, K32, K);
        }
    }
}

// y[r, n0:n1] for R rows of x. R is a template argument so the accumulators live in
// registers: as a runtime-sized array they go through memory on every step.
template <class W, int R>
static void weight_rows(const float* x, const typename W::T* w, float* y, int64_t n0, int64_t n1, int64_t N, int64_t K) {
    const int64_t K16 = K - K % 16;
    for (int64_t n = n0; n < n1; ++n) {
        const typename W::T* wr = w + n * K;
        __m256 a0[R], a1[R];
        for (int r = 0; r < R; ++r) { a0[r] = _mm256_setzero_ps(); a1[r] = _mm256_setzero_ps(); }
        for (int64_t k = 0; k < K16; k += 16) {
            const __m256 w0 = W::load8(wr + k), w1 = W::load8(wr + k + 8);
            for (int r = 0; r < R; ++r) {
                a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k), a0[r]);
                a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * K + k + 8), a1[r]);
            }
        }
        for (int r = 0; r < R; ++r) {
            float s = hsum(_mm256_add_ps(a0[r], a1[r]));
            y[r * N + n] = s + tail_dot<W>(wr, x + r * K, K16, K);
        }
    }
}

template <class W>
static void gemv_rows(const float* x, const typename W::T* wp, float* y, int64_t R, int64_t N, int64_t K) {
    // up to 8 rows share each pass over the weights (their accumulators fill the registers)
    const bool wide = use_avx512();
    for (int64_t r0 = 0; r0 < R; r0 += 8) {
        const int64_t rg = std::min<int64_t>(8, R - r0);
        const float* xp = x + r0 * K;
        float* yp = y + r0 * N;
        at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
            by_rows(rg, [&](auto rows) {
                constexpr int RG = decltype(rows)::value;
                if (wide) weight_rows512<W, RG>(xp, wp, yp, n0, n1, N, K);
                else weight_rows<W, RG>(xp, wp, yp, n0, n1, N, K);
            });
        });
    }
}

// x [R, K] fp32 rows (contiguous) times w [N, K] bf16 or fp32 (contiguous) -> y [R, N] fp32:
// the core, writing into a buffer the caller owns (the fused decode loop reuses one per step)
void gemv_into(const float* x, int64_t R, const torch::Tensor& w, float* y) {
    const int64_t K = w.size(1), N = w.size(0);
    if (w.dtype() == torch::kBFloat16)
        gemv_rows<WeightBf16>(x, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), y, R, N, K);
    else
        gemv_rows<WeightF32>(x, w.data_ptr<float>(), y, R, N, K);
}

// x [R, K] fp32, w [N, K] bf16 or fp32 contiguous -> [R, N] fp32
torch::Tensor gemv(torch::Tensor x, torch::Tensor w) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && (w.dtype() == torch::kBFloat16 || w.dtype() == torch::kFloat32),
                "x fp32, w bf16 or fp32");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [R, K], w [N, K]");
    TORCH_CHECK(x.size(0) >= 1, "at least one row");
    x = x.contiguous();
    TORCH_CHECK(w.is_contiguous(), "w contiguous");
    auto y = torch::empty({x.size(0), w.size(0)}, x.options());
    gemv_into(x.data_ptr<float>(), x.size(0), w, y.data_ptr<float>());
    return y;
}
"""

# Rows up to which the kernel (one pass over the weights per 8 rows) beats widening the
# matrix to fp32 for a GEMM; measured on 30 gate_up matrices: 16 rows 29 ms against 147,
# 32 rows 47 against 142.
MAX_ROWS = 32
# The same for fp32 weights against MKL's GEMM, on 30 gate_up matrices on the Zen 5 EPYC:
# 1 row 5.4 ms against 16.4, 8 rows 7.5 against 19.0, 32 rows 20.2 against 34.4.
F32_MAX_ROWS = 32


FUNCTIONS = ["gemv", "avx512_bodies"]


def _load():
    return cpp_ext.load("KTCLI_NO_BF16_KERNEL")


def available() -> bool:
    return _load() is not None


def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [R, K] fp32 (any R; worth it up to MAX_ROWS, F32_MAX_ROWS for fp32 w), w [N, K] bf16
    or fp32 contiguous -> [R, N] fp32."""
    return _load().gemv(x, w)
