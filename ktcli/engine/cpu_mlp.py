"""SwiGLU's elementwise step, silu(gate) * up, for wide CPU steps (prefill chunks) in one
C++ pass over the gate_up product.

Why: in torch it is four passes over a [T, 2 * inter] tensor and two new [T, inter] ones:
widen the bf16 GEMM output to fp32 (under bf16 wide steps), silu of the gate half, the
product with the up half, and (bf16 wide steps) rounding the result to bf16 again for the
down GEMM. For a 2,048-token chunk of SmolLM2 that is ~6.8 ms a layer against the gate_up
GEMM's ~5-7 ms (measured on the 2-core Xeon with AMX); here it is one read of the product
and one write of the result. The fused decode loop (`engine.cpu_decode`) runs the same rows
on its fp32 products.

Same function as the torch path: the gate and up values are read as fp32 (bf16 widens
exactly), silu and the product are computed in fp32, and the result is rounded once: to
bf16 by round-to-nearest-even (as torch's `.to(torch.bfloat16)`) or kept in fp32. Only the
exponential differs from torch's (a polynomial to ~1 ulp of fp32), far below the bf16 step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ktcli.engine import cpp_ext

SOURCE = r"""
namespace mlp {

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(at::BFloat16* p, __m256 v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), q8::to_bf16(v)); }

// silu(g) * u with silu(g) = g * sigmoid(g), sigmoid from e^-|g| so nothing overflows
inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.f);
    const __m256 e = exp_neg(_mm256_or_ps(g, _mm256_set1_ps(-0.f)));  // e^-|g|
    const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sig = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), neg);  // g < 0: e / (1 + e)
    return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

// L: cpu_attention's loader of the product's dtype (LoadF32, or LoadBF16: exact, the bits shifted up)
template <class L, class Out>
void rows(const typename L::T* gu, Out* out, int64_t t0, int64_t t1, int64_t inter) {
    using In = typename L::T;
    alignas(32) float tail_in[2][8];
    alignas(32) float tail_out[8];
    for (int64_t t = t0; t < t1; ++t) {
        const In* g = gu + t * 2 * inter;
        const In* u = g + inter;
        Out* o = out + t * inter;
        int64_t j = 0;
        for (; j + 8 <= inter; j += 8) store8(o + j, silu_mul8(L::load(g + j), L::load(u + j)));
        if (j < inter) {  // the last < 8 values through a padded buffer, same arithmetic
            const int64_t n = inter - j;
            for (int64_t i = 0; i < 8; ++i) {
                tail_in[0][i] = i < n ? float(g[j + i]) : 0.f;
                tail_in[1][i] = i < n ? float(u[j + i]) : 0.f;
            }
            _mm256_store_ps(tail_out, silu_mul8(_mm256_load_ps(tail_in[0]), _mm256_load_ps(tail_in[1])));
            for (int64_t i = 0; i < n; ++i) o[j + i] = Out(tail_out[i]);
        }
    }
}

}  // namespace mlp

// gu [T, 2 * inter] fp32 or bf16 contiguous (gate, then up) -> [T, inter] silu(gate) * up,
// bf16 (rounded to nearest even) when bf16_out, else fp32
torch::Tensor silu_mul(torch::Tensor gu, bool bf16_out) {
    TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0, "gu [T, 2 * inter]");
    TORCH_CHECK(gu.dtype() == torch::kFloat32 || gu.dtype() == torch::kBFloat16, "gu fp32 or bf16");
    gu = gu.contiguous();
    const int64_t T = gu.size(0), inter = gu.size(1) / 2;
    auto out = torch::empty({T, inter}, gu.options().dtype(bf16_out ? torch::kBFloat16 : torch::kFloat32));
    at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
        if (gu.dtype() == torch::kFloat32) {
            if (bf16_out) mlp::rows<LoadF32>(gu.data_ptr<float>(), out.data_ptr<at::BFloat16>(), t0, t1, inter);
            else mlp::rows<LoadF32>(gu.data_ptr<float>(), out.data_ptr<float>(), t0, t1, inter);
        } else {
            if (bf16_out) mlp::rows<LoadBF16>(gu.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), t0, t1, inter);
            else mlp::rows<LoadBF16>(gu.data_ptr<at::BFloat16>(), out.data_ptr<float>(), t0, t1, inter);
        }
    });
    return out;
}
"""

FUNCTIONS = ["silu_mul"]


def _load():
    return cpp_ext.load("KTCLI_NO_CPU_MLP")


def available() -> bool:
    return _load() is not None


def silu_mul(gu: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """gu [T, 2 * inter] (gate, then up; fp32 or bf16, on the CPU) -> silu(gate) * up
    [T, inter] in `out_dtype` (bf16 or fp32; default gu's dtype), through the C++ pass where
    it is built, else torch."""
    out_dtype = out_dtype or gu.dtype
    module = _load()
    if module is not None and gu.dtype in (torch.float32, torch.bfloat16) and out_dtype in (torch.float32, torch.bfloat16):
        return module.silu_mul(gu, out_dtype == torch.bfloat16)
    return silu_mul_reference(gu).to(out_dtype)


def silu_mul_reference(gu: torch.Tensor) -> torch.Tensor:
    """The torch path (the oracle): fp32 silu(gate) * up."""
    inter = gu.shape[1] // 2
    gu = gu.float()
    return F.silu(gu[:, :inter]) * gu[:, inter:]
