"""8-bit weights for CPU decode: the packed format and y = x @ w.T for a few fp32 rows.

Why: decode on a CPU reads every weight once per token, so its speed is the weight bytes
over memory bandwidth: 9 bits a weight here against bf16's 16. torch's own int8 CPU product
(`_weight_int8pack_mm`) is slower than fp32 at batch 1 on AVX2, so the product is ours: it
widens each weight to fp32 in registers and keeps the activations and sums in fp32 (only
the weights are rounded, as with `engine.bf16_gemv`).

The format: blocks of 32 along K, each w = scale * code + minimum with uint8 codes and an
fp16 scale and minimum (an affine block, like GGUF's Q4_1 and Q8_1). Affine rather than
symmetric because a GGUF model's 4- or 8-bit blocks then land exactly on the code grid
(16 levels are codes 0, 17, ..., 255), so the bundled Q4_1 model loses nothing more; a
symmetric int8 per block (scale = max|w| / 127) measured 0.49 greedy-token agreement with
fp32 on SmolLM2, this 0.99 (bf16: 0.975).

Packed layout, one uint8 tensor per matrix so everything that holds weights (the layer
record, the fused decode's flat list, `ModelWeights.nbytes`) handles it like any other:
row n of a [N, K] matrix is its K / 32 fp16 scales, its K / 32 fp16 minima, then its K
codes, so the packed tensor is [N, K / 8 + K]. Parameters first: with them after the codes,
reading each row's end before its start broke the hardware prefetcher's stream: a
standalone copy of the kernel took 4.9 ms against 4.2 over a whole model's matrices.
"""

from __future__ import annotations

import torch

from ktcli.engine import cpp_ext

GROUP = 32

# Compiled after bf16_gemv.SOURCE (engine.cpp_ext), whose hsum it uses.
SOURCE = r"""
namespace q8 {

// sum over 32 weight codes (widened to fp32) times 32 fp32 activations, as 8 lanes
static inline __m256 block_dot(const __m256 w[4], const float* x) {
    const __m256 a = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), _mm256_mul_ps(w[0], _mm256_loadu_ps(x)));
    const __m256 b = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), _mm256_mul_ps(w[2], _mm256_loadu_ps(x + 16)));
    return _mm256_add_ps(a, b);
}

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// y[r, n0:n1] for R rows of x: per block, scale * sum(code * x) + min * sum(x), the
// second from the block sums of x (xsum [R, K / 32]). R is a template argument so the
// accumulators live in registers: as a runtime-sized array they went through memory and
// the LM head's product took 2.6 ms instead of 1.4 (a store-to-load wait on every block).
template <int R>
static void rows(const float* x, const float* xsum, const uint8_t* w, float* y, int64_t n0, int64_t n1, int64_t N,
                 int64_t K, int64_t row) {
    const int64_t blocks = K / 32;
    for (int64_t n = n0; n < n1; ++n) {
        const uint16_t* scale = reinterpret_cast<const uint16_t*>(w + n * row);
        const uint16_t* minimum = scale + blocks;
        const uint8_t* q = w + n * row + K / 8;
        __m256 acc[R];
        float offset[R];
        for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); offset[r] = 0.f; }
        for (int64_t b = 0; b < blocks; ++b) {
            __m256 wv[4];
            for (int j = 0; j < 4; ++j)
                wv[j] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b * 32 + 8 * j))));
            const __m256 s = _mm256_set1_ps(half_to_float(scale[b]));
            const float m = half_to_float(minimum[b]);
            for (int r = 0; r < R; ++r) {
                acc[r] = _mm256_fmadd_ps(block_dot(wv, x + r * K + b * 32), s, acc[r]);
                offset[r] += m * xsum[r * blocks + b];
            }
        }
        for (int r = 0; r < R; ++r) y[r * N + n] = hsum(acc[r]) + offset[r];
    }
}

// Software prefetch distance of the AVX-512 bodies, in bytes of the weight stream. On the
// 2-core Xeon the hardware prefetcher alone streamed SmolLM2's int8 matrices at ~9 GB/s
// (59 tok/s of weight products); 2 KB ahead (one or two rows: the next rows' bytes follow
// contiguously) gave 82-95 tok/s, 1 KB 91, 4 KB 85, 512 B 67-80.
constexpr int64_t PREFETCH_BYTES = 2048;
// 16 codes at q, widened to fp32
__attribute__((target("avx512f,avx512bw")))
static inline __m512 codes16(const uint8_t* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

// block_dot with 16 lanes: 32 widened codes (u0, u1) times 32 activations at x
__attribute__((target("avx512f,fma")))
static inline __m512 block_dot512(__m512 u0, __m512 u1, const float* x) {
    return _mm512_fmadd_ps(u1, _mm512_loadu_ps(x + 16), _mm512_mul_ps(u0, _mm512_loadu_ps(x)));
}

// rows with 16 lanes: a block of 32 codes is two registers. Two blocks a step into two
// accumulators per row, and the minima's term (sum over blocks of min * xsum) as a vector
// dot product after the loop: with one accumulator and a scalar running offset, a single
// row waited on the FMA and add latencies every block (measured no faster than AVX2).
template <int R>
__attribute__((target("avx512f,avx512bw,fma,f16c")))
static void rows512(const float* x, const float* xsum, const uint8_t* w, float* y, int64_t n0, int64_t n1, int64_t N,
                    int64_t K, int64_t row) {
    const int64_t blocks = K / 32;
    for (int64_t n = n0; n < n1; ++n) {
        const uint16_t* scale = reinterpret_cast<const uint16_t*>(w + n * row);
        const uint16_t* minimum = scale + blocks;
        const uint8_t* q = w + n * row + K / 8;
        __m512 acc0[R], acc1[R];
        for (int r = 0; r < R; ++r) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); }
        int64_t b = 0;
        for (; b + 1 < blocks; b += 2) {
            _mm_prefetch(reinterpret_cast<const char*>(q + b * 32 + PREFETCH_BYTES), _MM_HINT_T0);
            const __m512 u0 = codes16(q + b * 32), u1 = codes16(q + b * 32 + 16), v0 = codes16(q + b * 32 + 32), v1 = codes16(q + b * 32 + 48);
            const __m512 su = _mm512_set1_ps(half_to_float(scale[b])), sv = _mm512_set1_ps(half_to_float(scale[b + 1]));
            for (int r = 0; r < R; ++r) {
                const float* xr = x + r * K + b * 32;
                acc0[r] = _mm512_fmadd_ps(block_dot512(u0, u1, xr), su, acc0[r]);
                acc1[r] = _mm512_fmadd_ps(block_dot512(v0, v1, xr + 32), sv, acc1[r]);
            }
        }
        if (b < blocks) {
            const __m512 u0 = codes16(q + b * 32), u1 = codes16(q + b * 32 + 16);
            const __m512 su = _mm512_set1_ps(half_to_float(scale[b]));
            for (int r = 0; r < R; ++r) acc0[r] = _mm512_fmadd_ps(block_dot512(u0, u1, x + r * K + b * 32), su, acc0[r]);
        }
        for (int r = 0; r < R; ++r) {
            const float* xs = xsum + r * blocks;
            __m512 off = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 16 <= blocks; i += 16)
                off = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(minimum + i))),
                                      _mm512_loadu_ps(xs + i), off);
            float tail = 0.f;
            for (; i < blocks; ++i) tail += half_to_float(minimum[i]) * xs[i];
            y[r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) + _mm512_reduce_add_ps(off) + tail;
        }
    }
}

}  // namespace q8

// x [R, K] fp32 rows (contiguous) times packed w [N, K / 8 + K] -> y [R, N] fp32 (contiguous):
// the core, writing into a buffer the caller owns (the fused decode loop reuses one per step)
void gemv_q8_into(const float* xp, int64_t R, int64_t K, const torch::Tensor& w, float* yp) {
    const int64_t N = w.size(0), row = w.size(1), blocks = K / 32;
    // per-block sums of x: the block minima's term of each dot product (one buffer per thread)
    thread_local std::vector<float> xsum;
    xsum.resize(R * blocks);
    for (int64_t i = 0; i < R * blocks; ++i) {
        float s = 0.f;
        for (int j = 0; j < 32; ++j) s += xp[i * 32 + j];
        xsum[i] = s;
    }
    const uint8_t* wp = w.data_ptr<uint8_t>();
    const bool wide = use_avx512();
    // up to 8 rows share each pass over the weights (their accumulators fill the registers)
    for (int64_t r0 = 0; r0 < R; r0 += 8) {
        const int64_t rg = std::min<int64_t>(8, R - r0);
        const float* xg = xp + r0 * K;
        const float* xs = xsum.data() + r0 * blocks;
        float* yg = yp + r0 * N;
        at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
            by_rows(rg, [&](auto rows) {
                constexpr int RG = decltype(rows)::value;
                if (wide) q8::rows512<RG>(xg, xs, wp, yg, n0, n1, N, K, row);
                else q8::rows<RG>(xg, xs, wp, yg, n0, n1, N, K, row);
            });
        });
    }
}

torch::Tensor gemv_q8(torch::Tensor x, torch::Tensor w) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kUInt8, "x fp32, w packed uint8");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.size(1) * 8 == x.size(1) * 9 && x.size(1) % 32 == 0,
                "x [R, K], w [N, K / 8 + K] (K a multiple of 32)");
    TORCH_CHECK(x.size(0) >= 1, "at least one row");
    x = x.contiguous();
    TORCH_CHECK(w.is_contiguous(), "w contiguous");
    auto y = torch::empty({x.size(0), w.size(0)}, x.options());
    gemv_q8_into(x.data_ptr<float>(), x.size(0), x.size(1), w, y.data_ptr<float>());
    return y;
}

// fp32 [N, K] -> packed [N, K / 8 + K] in one pass: `pack_reference` (the oracle) rounding
// for rounding (fp16 by round-to-nearest-even, codes by nearbyint: half to even as torch.round)
torch::Tensor pack_q8(torch::Tensor w) {
    TORCH_CHECK(w.dtype() == torch::kFloat32 && w.dim() == 2 && w.size(1) % 32 == 0, "w fp32 [N, K], K a multiple of 32");
    w = w.contiguous();
    const int64_t N = w.size(0), K = w.size(1), blocks = K / 32, row = K / 8 + K;
    auto out = torch::empty({N, row}, w.options().dtype(torch::kUInt8));
    const float* wp = w.data_ptr<float>();
    uint8_t* op = out.data_ptr<uint8_t>();
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
            uint16_t* scale = reinterpret_cast<uint16_t*>(op + n * row);
            uint8_t* codes = op + n * row + K / 8;
            for (int64_t b = 0; b < blocks; ++b) {
                const float* x = wp + n * K + b * 32;
                float low = x[0], high = x[0];
                for (int i = 1; i < 32; ++i) { low = std::min(low, x[i]); high = std::max(high, x[i]); }
                const uint16_t min16 = _cvtss_sh(low, _MM_FROUND_TO_NEAREST_INT);
                const float minimum = _cvtsh_ss(min16);
                uint16_t s16 = _cvtss_sh((high - minimum) / 255.f, _MM_FROUND_TO_NEAREST_INT);
                if (!(_cvtsh_ss(s16) > 0.f)) s16 = 0x3c00;  // a constant block: scale 1, codes 0
                const float s = _cvtsh_ss(s16);
                scale[b] = s16;
                scale[blocks + b] = min16;
                for (int i = 0; i < 32; ++i)
                    codes[b * 32 + i] = uint8_t(std::min(255.f, std::max(0.f, std::nearbyint((x[i] - minimum) / s))));
            }
        }
    });
    return out;
}

namespace q8 {

// 8 fp32 -> 8 bf16 bit patterns, round to nearest even (torch's .to(bfloat16) for
// finite values), with AVX2 integer ops: add 0x7fff plus the kept part's lowest bit,
// keep the top half.
static inline __m128i to_bf16(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i top = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    // [a0..a3 a0..a3 | a4..a7 a4..a7] as 16-bit -> qwords 0 and 2 -> a0..a7 in the low half
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08);
    return _mm256_castsi256_si128(packed);
}

// packed rows [n0, n1) -> fp32 (Bf16 false) or bf16 bits (Bf16 true), row-major [N, K]
template <bool Bf16>
static void unpack_rows(const uint8_t* wp, void* out, int64_t n0, int64_t n1, int64_t K, int64_t row) {
    const int64_t blocks = K / 32;
    for (int64_t n = n0; n < n1; ++n) {
        const uint16_t* scale = reinterpret_cast<const uint16_t*>(wp + n * row);
        const uint8_t* q = wp + n * row + K / 8;
        for (int64_t b = 0; b < blocks; ++b) {
            const __m256 s = _mm256_set1_ps(half_to_float(scale[b]));
            const __m256 m = _mm256_set1_ps(half_to_float(scale[blocks + b]));
            for (int j = 0; j < 4; ++j) {
                const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b * 32 + 8 * j))));
                const __m256 w = _mm256_fmadd_ps(c, s, m);
                const int64_t at = n * K + b * 32 + 8 * j;
                if constexpr (Bf16)
                    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + at), to_bf16(w));
                else
                    _mm256_storeu_ps(static_cast<float*>(out) + at, w);
            }
        }
    }
}

}  // namespace q8

// packed [N, K / 8 + K] -> [N, K] in one pass: fp32 (wide steps' fp32 GEMMs), or bf16
// (wide steps on a CPU with AMX run bf16 GEMMs over it: half the bytes written, and no
// second pass to round an fp32 copy)
torch::Tensor unpack_q8(torch::Tensor w, bool bf16) {
    TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 2 && w.size(1) % 36 == 0, "w packed uint8 [N, K / 8 + K]");
    w = w.contiguous();
    const int64_t N = w.size(0), row = w.size(1), K = row / 9 * 8;
    auto out = torch::empty({N, K}, w.options().dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
    const uint8_t* wp = w.data_ptr<uint8_t>();
    void* op = out.data_ptr();
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
        if (bf16) q8::unpack_rows<true>(wp, op, n0, n1, K, row);
        else q8::unpack_rows<false>(wp, op, n0, n1, K, row);
    });
    return out;
}
"""

# Rows up to which the kernel (one pass over the weights per 8 rows) beats unpacking to
# fp32 for a GEMM; measured on 30 gate_up matrices: 16 rows 23 ms against 115, 32 rows 45
# against 54 (the unpack alone writes 4 bytes a weight).
MAX_ROWS = 32
FUNCTIONS = ["gemv_q8", "pack_q8", "unpack_q8"]


def _load():
    return cpp_ext.load("KTCLI_NO_INT8_KERNEL")


def available() -> bool:
    return _load() is not None


def supports(k: int) -> bool:
    """Whether a matrix with rows of `k` values can be packed (whole blocks only)."""
    return k % GROUP == 0


def misfit_width(cfg) -> int | None:
    """The first of a model's matrix widths (a ModelConfig's hidden, q and MLP sizes) that
    does not pack into whole blocks, or None when every one does."""
    return next((k for k in (cfg.hidden_size, cfg.q_size, cfg.intermediate_size) if not supports(k)), None)


def is_packed(w: torch.Tensor) -> bool:
    return w.dtype == torch.uint8


def logical_width(packed: torch.Tensor) -> int:
    """K of the [N, K] matrix a packed [N, K / 8 + K] tensor holds."""
    return packed.shape[-1] * 8 // 9


def pack(w: torch.Tensor) -> torch.Tensor:
    """[N, K] float (K a multiple of 32) -> packed uint8 [N, K / 8 + K] on the same device."""
    if w.shape[-1] % GROUP:
        raise ValueError(f"int8 weights need rows of a multiple of {GROUP} values, not {w.shape[-1]}")
    kernels = _load() if w.device.type == "cpu" else None
    if kernels is not None:  # one pass, ~20x the torch expression below (load time)
        return kernels.pack_q8(w.float())
    return pack_reference(w)


def pack_reference(w: torch.Tensor) -> torch.Tensor:
    """`pack` in torch ops: the test oracle, and the path without the C++ kernels."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // GROUP, GROUP)
    low, high = blocks.amin(dim=-1, keepdim=True), blocks.amax(dim=-1, keepdim=True)
    # fp16 scale and minimum (as GGUF stores them), the codes fitted to the rounded values.
    # Round to nearest: a value pushed past either end of the code range by the rounding
    # is clamped, off by at most the rounding itself (half an fp16 step of the minimum, or
    # 255 x half an fp16 step of the scale), the same bound as inside the range.
    minimum = low.half()
    scale = ((high - minimum.float()) / 255).half()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant block: codes 0
    codes = torch.round((blocks - minimum.float()) / scale.float()).clamp_(0, 255).to(torch.uint8).reshape(n, k)
    params = torch.cat([scale.reshape(n, -1), minimum.reshape(n, -1)], dim=1).contiguous().view(torch.uint8)
    return torch.cat([params, codes], dim=1).contiguous()


def unpack(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed [N, K / 8 + K] (or a selection of its rows) -> [N, K] in fp32, or in bf16
    (each weight computed in fp32, then rounded to nearest even)."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"int8 weights unpack to fp32 or bf16, not {dtype}")
    kernels = _load() if packed.device.type == "cpu" else None
    if kernels is not None:
        return kernels.unpack_q8(packed, dtype == torch.bfloat16)
    return unpack_reference(packed).to(dtype)


def unpack_reference(packed: torch.Tensor) -> torch.Tensor:
    """`unpack` in torch ops: the test oracle, and the path without the C++ kernels."""
    k = logical_width(packed)
    n, blocks = packed.shape[0], k // GROUP
    params = packed[:, : k // 8].contiguous().view(torch.float16).float()  # [N, 2 * blocks]: scales, then minima
    codes = packed[:, k // 8 :].float().view(n, blocks, GROUP)
    return torch.addcmul(params[:, blocks:].unsqueeze(-1), codes, params[:, :blocks].unsqueeze(-1)).view(n, k)


def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [R, K] fp32 (any R; worth it up to MAX_ROWS), w packed [N, K / 8 + K] contiguous
    -> [R, N] fp32."""
    return _load().gemv_q8(x, w)
