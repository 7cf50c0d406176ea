"""The decoder's layer stack for a CPU decode step (a few rows, one token per sequence)
in one C++ call.

Why: a decode step on SmolLM2 is 30 layers x ~20 small torch ops (norms, RoPE, slicing,
SiLU, adds), each a few to tens of microseconds of Python and dispatch, several
milliseconds per token next to the weight reads. Here the glue between the weight
products runs as plain loops over the rows, the products are our matrix-vector kernels
(`engine.bf16_gemv` for bf16 and fp32 weights, `engine.int8_gemv`; steps of more rows than
they take run the model's torch loop), and attention is `engine.cpu_attention`. Same
function as `Model.forward`'s layer loop (the readable path and the test oracle):
rms_norm, fused qkv (+ bias), Qwen3 q/k norm, interleaved RoPE, store K/V and attend,
o (+ residual), rms_norm, gate/up, SiLU * up, down (+ residual).

Built once by `engine.cpp_ext` with the two kernels' sources (the loop below calls them); where
that fails `available()` is False and the model runs its torch loop.
"""

from __future__ import annotations

import torch

from ktcli.engine import cpp_ext, cpu_attention

_LOOP = r"""
namespace fused {

// y = x / rms(x) * w over n values (y may be x)
inline void rms_norm_row(const float* x, const float* w, float* y, int64_t n, double eps) {
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; ++u) part[u] += x[i + u] * x[i + u];
    float ss = 0.f;
    for (int u = 0; u < 8; ++u) ss += part[u];
    for (; i < n; ++i) ss += x[i] * x[i];
    const float inv = 1.f / std::sqrt(ss / float(n) + float(eps));
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] * inv * w[j];
}

// interleaved pairs (v[2i], v[2i+1]) times the complex rotation (rot[2i], rot[2i+1])
inline void rope_row(float* v, const float* rot, int64_t d) {
    for (int64_t i = 0; i < d; i += 2) {
        const float a = v[i], b = v[i + 1], c = rot[i], s = rot[i + 1];
        v[i] = a * c - b * s;
        v[i + 1] = a * s + b * c;
    }
}

// Steps reach this loop with at most the kernels' rows (Model._fused_rows), so every
// product is a matrix-vector kernel: int8, or bf16 / fp32 (bf16_gemv). a [T, K] contiguous
// rows -> y [T, N] (+ bias), into buffers the loop allocated once for the step: no tensor
// is made or dispatched per product (~1 us each, ~10 per layer).
inline void lin(const float* a, int64_t T, int64_t K, const torch::Tensor& w, const torch::Tensor& b, float* y) {
    const int64_t N = w.size(0);
    TORCH_CHECK(w.scalar_type() == at::kByte ? w.size(1) * 8 == K * 9 : w.size(1) == K, "weight width");
    if (w.scalar_type() == at::kByte) gemv_q8_into(a, T, K, w, y);
    else gemv_into(a, T, w, y);
    if (b.numel()) {
        const float* bp = b.data_ptr<float>();
        for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) y[t * N + n] += bp[n];
    }
}

// x [T, N] += a @ w.T (+ b), through the scratch rows y [T, N]
inline void lin_add(float* x, const float* a, int64_t T, int64_t K, const torch::Tensor& w, const torch::Tensor& b,
                    float* y) {
    lin(a, T, K, w, b, y);
    const int64_t n = T * w.size(0);
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace fused

constexpr int64_t PER_LAYER = 12;  // in_norm qkv qkv_bias o o_bias post_norm gate_up gate_up_bias down down_bias q_norm k_norm

// x [T, hidden] fp32 after the embedding; rot [T, D] fp32 (cos, sin pairs); weights: PER_LAYER
// tensors per layer, empty where absent; per-layer caches and first keys (window); the
// step's block tables, lengths and slots as `decode` takes them; the model's final norm
// weight (empty: none). Returns x after the last layer and the final norm.
torch::Tensor decode_layers(torch::Tensor x, torch::Tensor rot, std::vector<torch::Tensor> weights,
                            std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
                            std::vector<torch::Tensor> lo, torch::Tensor tables, int64_t block_size,
                            torch::Tensor ctx, torch::Tensor slots, int64_t n_heads, int64_t n_kv_heads, double eps,
                            double scale, torch::Tensor final_norm) {
    const int64_t n_layers = int64_t(k_caches.size());
    TORCH_CHECK(int64_t(weights.size()) == n_layers * PER_LAYER && int64_t(v_caches.size()) == n_layers &&
                int64_t(lo.size()) == n_layers, "one entry per layer");
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "x [T, hidden] fp32");
    x = x.clone(at::MemoryFormat::Contiguous);  // updated in place below
    rot = rot.contiguous();
    const int64_t T = x.size(0), hidden = x.size(1), D = k_caches[0].size(2);
    const int64_t q_size = n_heads * D, kv_size = n_kv_heads * D;
    TORCH_CHECK(rot.dtype() == torch::kFloat32 && rot.numel() == T * D, "rot [T, D] fp32");
    const float* rp = rot.data_ptr<float>();
    const int64_t N = q_size + 2 * kv_size;
    const int64_t inter = weights[6].size(0) / 2;  // gate_up [2 inter, hidden]
    // The step's buffers, once: products write into them layer after layer.
    auto h = torch::empty_like(x);                   // [T, hidden] normed rows
    auto qkv = torch::empty({T, N}, x.options());    // [T, q + 2 kv]
    auto gu = torch::empty({T, 2 * inter}, x.options());
    auto a = torch::empty({T, inter}, x.options());
    auto y = torch::empty({T, hidden}, x.options()); // scratch of the residual products
    auto q = qkv.narrow(1, 0, q_size).view({T, n_heads, D});
    auto k = qkv.narrow(1, q_size, kv_size).view({T, n_kv_heads, D});
    auto v = qkv.narrow(1, q_size + kv_size, kv_size).view({T, n_kv_heads, D});
    float* xp = x.data_ptr<float>();
    float* hp = h.data_ptr<float>();
    float* qp = qkv.data_ptr<float>();
    float* gp = gu.data_ptr<float>();
    float* ap = a.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t li = 0; li < n_layers; ++li) {
        const torch::Tensor* L = &weights[li * PER_LAYER];
        TORCH_CHECK(L[1].size(0) == N && L[6].size(0) == 2 * inter && L[3].size(0) == hidden && L[8].size(0) == hidden,
                    "layer widths");
        for (int64_t t = 0; t < T; ++t) fused::rms_norm_row(xp + t * hidden, L[0].data_ptr<float>(), hp + t * hidden, hidden, eps);
        fused::lin(hp, T, hidden, L[1], L[2], qp);  // [T, q + 2 kv]
        const bool qk_norm = L[10].numel() > 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t head = 0; head < n_heads + n_kv_heads; ++head) {
                float* row = qp + t * N + head * D;
                if (qk_norm) fused::rms_norm_row(row, (head < n_heads ? L[10] : L[11]).data_ptr<float>(), row, D, eps);
                fused::rope_row(row, rp + t * D, D);
            }
        auto o = decode(q, k, v, slots, k_caches[li], v_caches[li], tables, block_size, ctx, lo[li], scale);
        fused::lin_add(xp, o.data_ptr<float>(), T, q_size, L[3], L[4], yp);  // o [T, HQ, D]: contiguous rows
        for (int64_t t = 0; t < T; ++t) fused::rms_norm_row(xp + t * hidden, L[5].data_ptr<float>(), hp + t * hidden, hidden, eps);
        fused::lin(hp, T, hidden, L[6], L[7], gp);  // [T, 2 inter]: gate then up
        mlp::rows<LoadF32>(gp, ap, 0, T, inter);  // silu(gate) * up (engine.cpu_mlp)
        fused::lin_add(xp, ap, T, inter, L[8], L[9], yp);
    }
    if (final_norm.numel()) {
        TORCH_CHECK(final_norm.dtype() == torch::kFloat32 && final_norm.numel() == hidden, "final norm [hidden] fp32");
        for (int64_t t = 0; t < T; ++t) fused::rms_norm_row(xp + t * hidden, final_norm.data_ptr<float>(), xp + t * hidden, hidden, eps);
    }
    return x;
}
"""

SOURCE = _LOOP  # compiled after bf16_gemv, int8_gemv, cpu_attention and cpu_mlp's SOURCE, whose code it calls
FUNCTIONS = ["decode_layers"]
_FIELDS = ("in_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "gate_up_bias", "down", "down_bias",
           "q_norm", "k_norm")


def _load():
    return cpp_ext.load("KTCLI_NO_FUSED_DECODE")


def available() -> bool:
    return _load() is not None


class FusedDecode:
    """The model's layers as the flat argument lists `decode_layers` takes, built once."""

    def __init__(self, layers, windows: list, n_heads: int, n_kv_heads: int, eps: float, scale: float,
                 final_norm: torch.Tensor | None = None):
        empty = torch.empty(0)  # an absent bias or norm
        self.weights = [t if t is not None else empty for lw in layers for t in (getattr(lw, f) for f in _FIELDS)]
        self.final_norm = final_norm if final_norm is not None else empty
        self.windows = windows  # per layer
        self.n_heads, self.n_kv_heads, self.eps, self.scale = n_heads, n_kv_heads, eps, scale

    @staticmethod
    def supports(layers, final_norm: torch.Tensor | None = None) -> bool:
        """fp32, bf16 or packed int8 weight matrices, fp32 norms and biases (what the loop reads)."""
        if final_norm is not None and (final_norm.dtype != torch.float32 or not final_norm.is_contiguous()):
            return False
        for lw in layers:
            for name in _FIELDS:
                t = getattr(lw, name)
                if t is None:
                    continue
                matrix = name in ("qkv", "o", "gate_up", "down")
                if t.dtype != torch.float32 and not (matrix and t.dtype in (torch.bfloat16, torch.uint8)):
                    return False
                if not t.is_contiguous():
                    return False
        return available()

    def forward(self, x: torch.Tensor, rot: torch.Tensor, batch: cpu_attention.DecodeBatch,
                k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> torch.Tensor:
        """x [T, hidden] fp32, rot [T, 1, D/2] complex64 -> x after the last layer and the
        final norm (when the model's was given)."""
        rot = torch.view_as_real(rot).reshape(rot.shape[0], -1)  # [T, 1, D/2] complex -> [T, D] (cos, sin) pairs
        lo = [batch.lo[w] for w in self.windows]
        return _load().decode_layers(x, rot, self.weights, k_caches, v_caches, lo, batch.tables,
                                     batch.block_size, batch.ctx, batch.slots, self.n_heads, self.n_kv_heads,
                                     self.eps, self.scale, self.final_norm)
