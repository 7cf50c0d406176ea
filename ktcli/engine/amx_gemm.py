"""bf16 weight GEMMs of wide CPU steps on AMX tiles, with fp32 activations and fp32 output.

Why: on a CPU with AMX, bf16 GEMMs run several times faster than fp32 ones, so wide steps
(prefill chunks) under bf16 or int8 weights compute in bf16 (`engine.device`). Through
torch (oneDNN) that rounds twice per product: the activations to bf16 on the way in
(~2^-9 relative each) and the result to bf16 on the way out. The weights themselves are
exact in bf16 (bf16 weights as stored; int8 weights unpack to it), so those two roundings
are all that parts such a prefill from an fp32 one, and they are what moved greedy answers
(benchmarks.engine_vs_hf `greedy_match_bf16`: 0.64 of fp32's tokens kept on the Xeon, 0.975
with fp32 wide steps).

Here each activation row is split into two bf16 parts, hi = bf16(x) and lo = bf16(x - hi),
so hi + lo holds x to ~2^-17, and the tile products accumulate in fp32 and are written in
fp32: x @ W^T = hi @ W^T + lo @ W^T to about fp32's own error (~2.5e-6 relative against
float64 on SmolLM2's shapes; one-pass bf16 activations 2e-3, torch's bf16 GEMM 3e-3).

Where it pays, measured on the 2-core Xeon (benchmarks.amx_gemm, benchmarks.prefill_dtype,
benchmarks.engine_vs_hf): the two passes cost 1.3-1.8x torch's one-pass bf16 GEMM (still
1.3-2.7x MKL's fp32 one), so a long prefill runs at 0.65-0.79x the one-pass speed, and
buys little there: after 1.5K-token prompts greedy answers part from fp32's as often as
before (bf16 prefill attention, which rounds q, k and v, dominates; KL per token halves).
On short steps the cost is tens of milliseconds and the gain is the whole answer: on short
chat prompts greedy tokens kept 0.64 -> 0.975 of fp32's (bf16 weights), 0.83 -> 0.99
(int8). So the engine takes this kernel for steps of up to EXACT_MAX_ROWS rows (a chat
turn, a question, a prompt's last partial chunk) and torch's one-pass bf16 GEMMs above.

The kernel: the weights are repacked per call into AMX's pair-interleaved tiles (16 k-pairs
x 16 columns, a 32-bit transpose; int8 weights widened on the way), output blocks of
256 x 128 are the parallel tasks, K runs in slices of 256 so a step's operands stay in L1,
and each 32 x 32 step holds four fp32 accumulator tiles that read every loaded tile twice.
Where the compiler lacks AMX intrinsics, the CPU lacks AMX or Linux refuses the tile state,
`available()` is False and callers keep torch's bf16 GEMM (KTCLI_NO_AMX_GEMM=1 does that
on purpose, for A/B).
"""

from __future__ import annotations

import torch

from ktcli.engine import cpp_ext

SOURCE = r"""
#include <sys/syscall.h>
#include <unistd.h>

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define KT_HAVE_AMX 1
#else
#define KT_HAVE_AMX 0
#endif

namespace amx {

#if KT_HAVE_AMX
#define KT_AMX __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

struct TileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Linux hands a process the AMX tile state only on request (arch_prctl, kernel >= 5.16).
inline bool request() {
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state == 1;
}

// Tiles 0-3: fp32 accumulators (16 x 16); 4-5: activations (16 rows x 32 bf16); 6-7:
// weights (16 k-pairs x 16 columns).
KT_AMX inline void configure() {
    TileConfig cfg = {};
    cfg.palette_id = 1;
    for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
}

KT_AMX inline uint16_t bf16_of(float v) {  // round to nearest even, as the vector path
    __m256bh b = _mm512_cvtneps_pbh(_mm512_set1_ps(v));
    return uint16_t(_mm256_extract_epi16((__m256i)b, 0));
}

// 16 floats -> bf16 hi = bf16(x) and, when lo is given, lo = bf16(x - hi) (hi + lo hold x
// to ~2^-17). engine.amx_attention splits its operands with it too.
KT_AMX inline void split16(__m512 v, uint16_t* hi, uint16_t* lo) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), h);
    if (lo) {
        const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
    }
}

// fp32 [M, K] -> bf16 hi = bf16(x) and, when lo is given, lo = bf16(x - hi), as [Mp, Kp]
// rows (the padding zero); rows m0 .. m1 - 1. (Lambdas do not inherit a target attribute,
// so each parallel body is a function of its own.)
KT_AMX void split_range(const float* x, int64_t M, int64_t K, int64_t Kp, uint16_t* hi, uint16_t* lo,
                        int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
        uint16_t* h = hi + m * Kp;
        uint16_t* l = lo ? lo + m * Kp : nullptr;
        if (m >= M) {
            std::memset(h, 0, Kp * 2);
            if (l) std::memset(l, 0, Kp * 2);
            continue;
        }
        const float* r = x + m * K;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) split16(_mm512_loadu_ps(r + k), h + k, l ? l + k : nullptr);
        for (; k < Kp; ++k) {
            const float v = k < K ? r[k] : 0.f;
            h[k] = bf16_of(v);
            if (l) {
                const uint32_t bits = uint32_t(h[k]) << 16;
                float back;
                std::memcpy(&back, &bits, 4);
                l[k] = bf16_of(v - back);
            }
        }
    }
}

void split_rows(const float* x, int64_t M, int64_t K, int64_t Mp, int64_t Kp, uint16_t* hi, uint16_t* lo) {
    at::parallel_for(0, Mp, 16, [&](int64_t m0, int64_t m1) { split_range(x, M, K, Kp, hi, lo, m0, m1); });
}

// w bf16 [N, K] -> tiles: tile (nb, kb) holds 16 rows (k pairs) x 16 columns (n) of bf16
// pairs, 1 KB, at (nb * KB + kb) * 512 elements; N padded to Np, K to Kp with zeros. A bf16
// pair is one 32-bit unit, so a full tile is a 16 x 16 transpose of 32-bit units.
inline void pack_weights(const uint16_t* w, int64_t N, int64_t K, int64_t Np, int64_t Kp, uint16_t* out) {
    const int64_t KB = Kp / 32;
    at::parallel_for(0, Np / 16, 4, [&](int64_t nb0, int64_t nb1) {
        for (int64_t nb = nb0; nb < nb1; ++nb) {
            for (int64_t kb = 0; kb < KB; ++kb) {
                uint32_t* t = reinterpret_cast<uint32_t*>(out + (nb * KB + kb) * 512);
                const bool full = nb * 16 + 16 <= N && kb * 32 + 32 <= K && K % 2 == 0;
                for (int64_t c = 0; c < 16; ++c) {
                    const int64_t n = nb * 16 + c;
                    if (full) {
                        uint32_t row[16];
                        std::memcpy(row, w + n * K + kb * 32, 64);
                        for (int64_t r = 0; r < 16; ++r) t[r * 16 + c] = row[r];
                        continue;
                    }
                    for (int64_t r = 0; r < 16; ++r) {
                        const int64_t k = kb * 32 + 2 * r;
                        const uint32_t a = n < N && k < K ? w[n * K + k] : 0;
                        const uint32_t b = n < N && k + 1 < K ? w[n * K + k + 1] : 0;
                        t[r * 16 + c] = a | (b << 16);
                    }
                }
            }
        }
    });
}

// The same tiles straight from int8 weights (engine.int8_gemv's packed rows: per 32-weight
// block an fp16 scale and minimum, then the codes): a tile's 32 k are one block, so each
// column is one block widened (scale * code + minimum in fp32, as unpack_q8) and rounded
// to bf16; no [N, K] bf16 copy is written and read back.
KT_AMX void pack_q8_range(const uint8_t* w, int64_t N, int64_t K, int64_t Kp, uint16_t* out, int64_t nb0, int64_t nb1) {
    const int64_t KB = Kp / 32, blocks = K / 32, row = K / 8 + K;
    for (int64_t nb = nb0; nb < nb1; ++nb) {
        for (int64_t kb = 0; kb < KB; ++kb) {
            uint32_t* t = reinterpret_cast<uint32_t*>(out + (nb * KB + kb) * 512);
            for (int64_t c = 0; c < 16; ++c) {
                const int64_t n = nb * 16 + c;
                uint32_t pairs[16];
                if (n < N && kb < blocks) {
                    const uint16_t* params = reinterpret_cast<const uint16_t*>(w + n * row);
                    const __m512 s = _mm512_set1_ps(_cvtsh_ss(params[kb]));
                    const __m512 m = _mm512_set1_ps(_cvtsh_ss(params[blocks + kb]));
                    const uint8_t* q = w + n * row + K / 8 + kb * 32;
                    const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q))), s, m);
                    const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + 16)))), s, m);
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs), (__m256i)_mm512_cvtneps_pbh(lo));
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + 8), (__m256i)_mm512_cvtneps_pbh(hi));
                } else {
                    std::memset(pairs, 0, sizeof(pairs));
                }
                for (int64_t r = 0; r < 16; ++r) t[r * 16 + c] = pairs[r];
            }
        }
    }
}

void pack_q8(const uint8_t* w, int64_t N, int64_t K, int64_t Np, int64_t Kp, uint16_t* out) {
    at::parallel_for(0, Np / 16, 4, [&](int64_t nb0, int64_t nb1) { pack_q8_range(w, N, K, Kp, out, nb0, nb1); });
}

// out [Mp, Np] (+)= hi (+ lo) @ W^T over whole 32 x 32 steps. Tasks are output blocks of
// MC x NC steps (256 rows x 128 columns). K runs in slices of KC k-steps (256 of K): for a
// slice, every step of the block loads its accumulators (0 or `add` for the first slice,
// the running sums in `out` after), runs the slice and stores them back, so a step's
// activation rows (32 x 256 bf16, twice when split) and weight columns (2 x 8 KB) come from
// L1 and a block's from L2, however long K is (the down projection's 1,536 read the whole
// panel from L2 on every step: 2x slower).
constexpr int64_t MC = 8, NC = 4, KC = 8;

KT_AMX void gemm_range(const uint16_t* hi, const uint16_t* lo, const uint16_t* wp, float* out, const float* add,
                       int64_t Mp, int64_t Np, int64_t Kp, int64_t t0, int64_t t1) {
    const int64_t KB = Kp / 32, MB = Mp / 32, NB = Np / 32;
    const int64_t nchunks = (NB + NC - 1) / NC;
    const int64_t stride = Kp * 2;  // bytes from one activation row to the next
    const size_t ld = Np * sizeof(float);
    configure();
    for (int64_t task = t0; task < t1; ++task) {
        const int64_t mc = task / nchunks, nc = task % nchunks;
        for (int64_t k0 = 0; k0 < KB; k0 += KC) {
            const int64_t k1 = std::min(KB, k0 + KC);
            for (int64_t nb = nc * NC; nb < std::min(NB, nc * NC + NC); ++nb) {
                const uint16_t* b0 = wp + (2 * nb) * KB * 512;
                const uint16_t* b1 = wp + (2 * nb + 1) * KB * 512;
                for (int64_t mb = mc * MC; mb < std::min(MB, mc * MC + MC); ++mb) {
                    const int64_t m0 = mb * 32, n0 = nb * 32;
                    float* o = out + m0 * Np + n0;
                    const float* from = k0 > 0 ? o : add ? add + m0 * Np + n0 : nullptr;
                    if (from) {
                        _tile_loadd(0, from, ld);
                        _tile_loadd(1, from + 16, ld);
                        _tile_loadd(2, from + 16 * Np, ld);
                        _tile_loadd(3, from + 16 * Np + 16, ld);
                    } else {
                        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    }
                    const uint16_t* a = hi + m0 * Kp;
                    const uint16_t* l = lo ? lo + m0 * Kp : nullptr;
                    for (int64_t kb = k0; kb < k1; ++kb) {
                        _tile_loadd(4, a + kb * 32, stride);
                        _tile_loadd(5, a + 16 * Kp + kb * 32, stride);
                        _tile_loadd(6, b0 + kb * 512, 64);
                        _tile_loadd(7, b1 + kb * 512, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                        if (l) {  // the same weight tiles against the low parts
                            _tile_loadd(4, l + kb * 32, stride);
                            _tile_loadd(5, l + 16 * Kp + kb * 32, stride);
                            _tile_dpbf16ps(0, 4, 6);
                            _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6);
                            _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    _tile_stored(0, o, ld);
                    _tile_stored(1, o + 16, ld);
                    _tile_stored(2, o + 16 * Np, ld);
                    _tile_stored(3, o + 16 * Np + 16, ld);
                }
            }
        }
    }
    _tile_release();
}

void gemm(const uint16_t* hi, const uint16_t* lo, const uint16_t* wp, float* out, const float* add,
          int64_t Mp, int64_t Np, int64_t Kp) {
    const int64_t tasks = ((Mp / 32 + MC - 1) / MC) * ((Np / 32 + NC - 1) / NC);
    at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) { gemm_range(hi, lo, wp, out, add, Mp, Np, Kp, t0, t1); });
}
#endif  // KT_HAVE_AMX

}  // namespace amx

bool amx_gemm_usable() {
#if KT_HAVE_AMX
    return amx::request();  // the caller checked the CPU (AMX implies AVX512-BF16)
#else
    return false;
#endif
}

// x fp32 [M, K] @ w^T (+ bias fp32 [N]) (+ add fp32 [M, N]) -> fp32 [M, N]; w bf16 [N, K],
// or int8_gemv's packed uint8 [N, K / 8 + K]. split: x as bf16 hi + lo (two passes,
// fp32-grade products); else x rounded to bf16.
torch::Tensor amx_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                         c10::optional<torch::Tensor> add, bool split) {
#if KT_HAVE_AMX
    const bool q8 = w.scalar_type() == at::kByte;
    TORCH_CHECK(x.scalar_type() == at::kFloat && (q8 || w.scalar_type() == at::kBFloat16),
                "amx_linear: fp32 x, bf16 or packed int8 w");
    TORCH_CHECK(!q8 || w.size(1) % 36 == 0, "amx_linear: packed int8 rows are K / 8 + K bytes");
    x = x.contiguous();
    w = w.contiguous();
    const int64_t M = x.size(0), K = q8 ? w.size(1) / 9 * 8 : w.size(1), N = w.size(0);
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == K, "amx_linear: x [M, K], w [N, K]");
    const int64_t Mp = (M + 31) / 32 * 32, Np = (N + 31) / 32 * 32, Kp = (K + 31) / 32 * 32;
    const auto u16 = torch::TensorOptions().dtype(torch::kInt16);
    auto hi = torch::empty({Mp * Kp}, u16);
    auto lo = split ? torch::empty({Mp * Kp}, u16) : torch::Tensor();
    auto wp = torch::empty({Np * Kp}, u16);
    // The kernel writes whole 32 x 32 steps: a ragged shape runs on padded rows / columns
    // (and a padded copy of `add`), cut afterwards.
    const bool padded = Mp != M || Np != N;
    auto out = torch::empty({Mp, Np}, x.options());
    torch::Tensor a;
    if (add && add->defined()) {
        a = add->to(at::kFloat);
        TORCH_CHECK(a.dim() == 2 && a.size(0) == M && a.size(1) == N, "amx_linear: add [M, N]");
        a = padded ? at::constant_pad_nd(a, {0, Np - N, 0, Mp - M}) : a.contiguous();
    }
    auto* h = reinterpret_cast<uint16_t*>(hi.data_ptr());
    auto* l = split ? reinterpret_cast<uint16_t*>(lo.data_ptr()) : nullptr;
    auto* p = reinterpret_cast<uint16_t*>(wp.data_ptr());
    amx::split_rows(x.data_ptr<float>(), M, K, Mp, Kp, h, l);
    if (q8) amx::pack_q8(w.data_ptr<uint8_t>(), N, K, Np, Kp, p);
    else amx::pack_weights(reinterpret_cast<const uint16_t*>(w.data_ptr()), N, K, Np, Kp, p);
    amx::gemm(h, l, p, out.data_ptr<float>(), a.defined() ? a.data_ptr<float>() : nullptr, Mp, Np, Kp);
    if (padded) out = out.narrow(0, 0, M).narrow(1, 0, N).contiguous();
    if (bias && bias->defined()) {
        TORCH_CHECK(bias->numel() == N, "amx_linear: bias [N]");
        out.add_(bias->to(at::kFloat));
    }
    return out;
#else
    TORCH_CHECK(false, "amx_linear: built without AMX intrinsics");
    return x;
#endif
}
"""

FUNCTIONS = ["amx_gemm_usable", "amx_linear"]

# Wide bf16 steps of up to this many rows take the kernel (see the module docstring): at
# 128 rows it costs ~40-50 ms a prefill over one-pass GEMMs on the 2-core Xeon.
EXACT_MAX_ROWS = 128

_state: list = []  # [module or None] once decided


def _module():
    if not _state:
        module = cpp_ext.load("KTCLI_NO_AMX_GEMM")
        ok = False
        if module is not None:
            from ktcli.engine.device import native_bf16_matmul

            ok = native_bf16_matmul() and bool(module.amx_gemm_usable())
        _state.append(module if ok else None)
    return _state[0]


def available() -> bool:
    """Whether wide bf16-weight GEMMs run here (AMX, built, allowed); decided once."""
    return _module() is not None


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, add: torch.Tensor | None = None,
           split: bool = True) -> torch.Tensor:
    """x [M, K] (any float dtype) @ w.T (+ bias) (+ add [M, N]) -> fp32 [M, N], w bf16 [N, K]
    or int8_gemv's packed uint8 rows; on AMX where `available()`, else the torch reference
    (same math, fp32)."""
    module = _module()
    if module is None:
        return linear_reference(x, w, bias, add, split)
    return module.amx_linear(x.float(), w, bias, add, split)


def linear_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                     add: torch.Tensor | None = None, split: bool = True) -> torch.Tensor:
    """The oracle: the activations as the kernel sees them (hi + lo, or bf16), fp32 products."""
    if w.dtype == torch.uint8:
        from ktcli.engine import int8_gemv

        w = int8_gemv.unpack_reference(w).to(torch.bfloat16)
    x = x.float()
    hi = x.to(torch.bfloat16).float()
    xs = hi + (x - hi).to(torch.bfloat16).float() if split else hi
    y = xs @ w.float().T
    if bias is not None:
        y = y + bias.float()
    return y if add is None else y + add.float()
