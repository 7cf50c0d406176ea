"""Decode attention on the CPU straight from KIVI int8 / int4 pages (`kernels`' layout).

Why: with quantized pages and dense attention, the torch path dequantises a sequence's
whole context to fp32 for every layer of every decode step (`kernels.reference.context_kv`,
then two batched products): 2-3 tokens/s at 8K tokens on SmolLM2. The quantisation is
affine, so neither score nor value needs the dequantised rows:

    score(q, k_t) = q . (k_min + code_t * s) = q . k_min + (q * s) . code_t
    sum_t p_t v_t = sum_t p_t (zero_t + scale_t * code_t)
                  = sum_t p_t zero_t + sum_t (p_t scale_t) code_t

with s the page's per-channel key step and (zero_t, scale_t) a token's value group
parameters. (int4 keys have a width per channel, `kernels.reference.key_widths`: s and
the base k_min follow it, and each row's codes come out of its bitstream by one 8-lane
gather, shift and mask per 8 channels.) So each page costs one (q * s) and q . k_min per
query head, then one pass over its uint8 codes (widened in registers), a running softmax
per page (flash-decoding), and the value codes weighted by p_t scale_t. The partial last
page is still in its fp32 staging slot and is read as such. Work items are (kv head,
range of pages), split over the cores and merged at the end, as in
`engine.cpu_attention` (whose exp, sums and softmax state this reuses: same translation
unit).

`gather` serves the window and topk policies, whose steps attend over a few selected
pages at virtual positions (`engine.longctx.virtual_plan`): it gathers and dequantises
those pages in one pass, the same rows as `kernels.reference.gather_kv` (~20 small torch
ops a layer, each step).

Built once by `engine.cpp_ext`; where that fails `available()` is False and
`engine.longctx` keeps its torch path.
"""

from __future__ import annotations

import torch

from ktcli.engine import cpp_ext

SOURCE = r"""
namespace kivi {

// The sum of 8 lanes (hsum exists twice in this translation unit, so it is not named here).
inline float lane_sum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// 8 codes of channels d .. d+7 of one row, widened to fp32. int4: channel 2c is the low
// nibble of byte c, 2c+1 the high one.
template <int BITS>
inline __m256 codes8(const uint8_t* row, int d) {
    if (BITS == 8)
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d))));
    uint32_t packed;
    std::memcpy(&packed, row + d / 2, 4);
    const __m128i b = _mm_cvtsi32_si128(int(packed));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

// int4 keys: channel c's w_c-bit code sits at bit o_c of its row's bitstream
// (kernels.reference.unpack_bitstream). Per page and head: the byte each code starts in,
// its shift and mask, as 8-lane vectors, and the affine (base, step) per channel.
template <int D>
struct KeyLayout {
    alignas(32) int32_t byte[D], shift[D], mask[D];
    alignas(32) float base[D], step[D];
    void load(const uint8_t* widths, const float* lo, const float* hi) {
        int32_t o = 0;
        for (int c = 0; c < D; ++c) {
            const int32_t w = (widths[c / 2] >> ((c % 2) * 4)) & 15;
            byte[c] = o >> 3;
            shift[c] = o & 7;
            mask[c] = (1 << w) - 1;
            o += w;
            // kernels.reference.key_affine, the same float operations
            const float span = hi[c] - lo[c];
            step[c] = w > 0 ? span / float((1 << w) - 1) : 0.f;
            base[c] = w > 0 ? lo[c] : lo[c] + span * 0.5f;
        }
    }
    // Codes of channels d .. d+7 of a row copied into a buffer with 4 spare bytes (the
    // gather reads 4 bytes from each code's first byte).
    inline __m256 codes8(const uint8_t* padded_row, int d) const {
        const __m256i at = _mm256_load_si256(reinterpret_cast<const __m256i*>(byte + d));
        const __m256i words = _mm256_i32gather_epi32(reinterpret_cast<const int*>(padded_row), at, 1);
        const __m256i sh = _mm256_load_si256(reinterpret_cast<const __m256i*>(shift + d));
        const __m256i mk = _mm256_load_si256(reinterpret_cast<const __m256i*>(mask + d));
        return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(words, sh), mk));
    }
};

// Fold a block of n scores s[g][0 .. n) (n <= BLK) into the running softmax of G query
// heads: rescale the state to the new max, turn s into e^(s - max) in place.
template <int D>
inline void fold_scores(State<D>& st, float (*s)[BLK], int G, int n) {
    for (int g = 0; g < G; ++g) {
        float m_new = st.m[g];
        for (int t = 0; t < n; ++t) m_new = std::max(m_new, s[g][t]);
        if (m_new > st.m[g]) {
            const float corr = std::exp(st.m[g] - m_new);  // 0 on the first block
            st.l[g] *= corr;
            for (int d = 0; d < D; ++d) st.acc[g][d] *= corr;
            st.m[g] = m_new;
        }
        float sum = 0.f;
        int t = 0;
        const __m256 mv = _mm256_set1_ps(m_new);
        __m256 vsum = _mm256_setzero_ps();
        for (; t + 8 <= n; t += 8) {
            const __m256 p = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s[g] + t), mv));
            _mm256_storeu_ps(s[g] + t, p);
            vsum = _mm256_add_ps(vsum, p);
        }
        for (; t < n; ++t) { s[g][t] = std::exp(s[g][t] - m_new); sum += s[g][t]; }
        st.l[g] += sum + lane_sum(vsum);
    }
}

inline void reset(float* m, float* l, int G) {
    for (int g = 0; g < G; ++g) { m[g] = -std::numeric_limits<float>::infinity(); l[g] = 0.f; }
}

// Sealed pages [p0, p1) of kv head h for its G query heads q [G, D] (pre-scaled).
template <int D, int BITS>
void sealed_pages(const float* q, int G, const uint8_t* kp, const uint8_t* vp, const float* kmin, const float* kmax,
                  const uint8_t* kbits, const at::Half* vzero, const at::Half* vscale, const int32_t* table,
                  int64_t p0, int64_t p1, int64_t BS, int64_t H, int64_t h, int64_t NG, State<D>& st) {
    constexpr int NC = D / 8;
    constexpr int64_t DP = BITS == 8 ? D : D / 2;
    constexpr float QMAX = BITS == 8 ? 255.f : 15.f;
    const int64_t per_group = D / NG;
    alignas(32) float qs[MAXG][D];
    alignas(32) float s[MAXG][BLK];
    float base[MAXG];
    float vz[BLK][8], vs[BLK][8];  // value group parameters of the page's tokens (NG <= 8)
    float offset[MAXG][8];
    KeyLayout<D> layout;  // int4 keys
    alignas(32) uint8_t padded[DP + 32] = {0};
    reset(st.m, st.l, G);
    for (int g = 0; g < G; ++g) std::memset(st.acc[g], 0, sizeof(float) * D);
    for (int64_t p = p0; p < p1; ++p) {
        const int64_t b = table[p];
        const float* lo = kmin + (b * H + h) * D;
        const float* hi = kmax + (b * H + h) * D;
        if (BITS == 4) {
            layout.load(kbits + (b * H + h) * (D / 2), lo, hi);
            lo = layout.base;
        }
        // q * step per channel, and q . base (k_min; int4 0-bit channels: the midpoint)
        for (int g = 0; g < G; ++g) {
            __m256 bsum = _mm256_setzero_ps();
            for (int c = 0; c < NC; ++c) {
                const __m256 l = _mm256_loadu_ps(lo + c * 8);
                const __m256 step = BITS == 4 ? _mm256_load_ps(layout.step + c * 8)
                    : _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(hi + c * 8), l), _mm256_set1_ps(QMAX));
                const __m256 qv = _mm256_loadu_ps(q + g * D + c * 8);
                _mm256_store_ps(qs[g] + c * 8, _mm256_mul_ps(qv, step));
                bsum = _mm256_fmadd_ps(qv, l, bsum);
            }
            base[g] = lane_sum(bsum);
        }
        // scores: each key row's codes widened once for up to 3 query heads
        const uint8_t* krows = kp + (b * BS * H + h) * DP;  // token t at krows + t * H * DP
        for (int g0 = 0; g0 < G; g0 += 3) {
            const int ng = std::min(3, G - g0);
            for (int64_t t = 0; t < BS; ++t) {
                const uint8_t* row = krows + t * H * DP;
                if (BITS == 4) std::memcpy(padded, row, DP);
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
                for (int c = 0; c < NC; ++c) {
                    const __m256 w = BITS == 4 ? layout.codes8(padded, c * 8) : codes8<8>(row, c * 8);
                    a0 = _mm256_fmadd_ps(_mm256_load_ps(qs[g0] + c * 8), w, a0);
                    if (ng > 1) a1 = _mm256_fmadd_ps(_mm256_load_ps(qs[g0 + 1] + c * 8), w, a1);
                    if (ng > 2) a2 = _mm256_fmadd_ps(_mm256_load_ps(qs[g0 + 2] + c * 8), w, a2);
                }
                s[g0][t] = base[g0] + lane_sum(a0);
                if (ng > 1) s[g0 + 1][t] = base[g0 + 1] + lane_sum(a1);
                if (ng > 2) s[g0 + 2][t] = base[g0 + 2] + lane_sum(a2);
            }
        }
        fold_scores<D>(st, s, G, int(BS));
        // values: sum_t p_t zero_t per group, then the codes weighted by p_t scale_t
        for (int64_t t = 0; t < BS; ++t)
            for (int64_t k = 0; k < NG; ++k) {
                const int64_t i = ((b * BS + t) * H + h) * NG + k;
                vz[t][k] = float(vzero[i]);
                vs[t][k] = float(vscale[i]);
            }
        for (int g = 0; g < G; ++g)
            for (int64_t k = 0; k < NG; ++k) {
                float o = 0.f;
                for (int64_t t = 0; t < BS; ++t) o += s[g][t] * vz[t][k];
                offset[g][k] = o;
            }
        const uint8_t* vrows = vp + (b * BS * H + h) * DP;
        for (int c = 0; c < NC; ++c) {
            const int64_t k = c * 8 / per_group;
            for (int g0 = 0; g0 < G; g0 += 3) {
                const int ng = std::min(3, G - g0);
                __m256 a0 = _mm256_load_ps(st.acc[g0] + c * 8);
                __m256 a1 = ng > 1 ? _mm256_load_ps(st.acc[g0 + 1] + c * 8) : a0;
                __m256 a2 = ng > 2 ? _mm256_load_ps(st.acc[g0 + 2] + c * 8) : a0;
                for (int64_t t = 0; t < BS; ++t) {
                    const __m256 w = codes8<BITS>(vrows + t * H * DP, c * 8);
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(s[g0][t] * vs[t][k]), w, a0);
                    if (ng > 1) a1 = _mm256_fmadd_ps(_mm256_set1_ps(s[g0 + 1][t] * vs[t][k]), w, a1);
                    if (ng > 2) a2 = _mm256_fmadd_ps(_mm256_set1_ps(s[g0 + 2][t] * vs[t][k]), w, a2);
                }
                _mm256_store_ps(st.acc[g0] + c * 8, _mm256_add_ps(a0, _mm256_set1_ps(offset[g0][k])));
                if (ng > 1) _mm256_store_ps(st.acc[g0 + 1] + c * 8, _mm256_add_ps(a1, _mm256_set1_ps(offset[g0 + 1][k])));
                if (ng > 2) _mm256_store_ps(st.acc[g0 + 2] + c * 8, _mm256_add_ps(a2, _mm256_set1_ps(offset[g0 + 2][k])));
            }
        }
    }
}

// The first n rows of a staging slot (fp32 [BS, H, D]) for kv head h.
template <int D>
void staged_rows(const float* q, int G, const float* sk, const float* sv, int64_t n, int64_t H, int64_t h,
                 State<D>& st) {
    constexpr int NC = D / 8;
    alignas(32) float s[MAXG][BLK];
    reset(st.m, st.l, G);
    for (int g = 0; g < G; ++g) std::memset(st.acc[g], 0, sizeof(float) * D);
    for (int64_t t0 = 0; t0 < n; t0 += BLK) {
        const int nb = int(std::min<int64_t>(BLK, n - t0));
        for (int g = 0; g < G; ++g)
            for (int t = 0; t < nb; ++t) {
                const float* row = sk + ((t0 + t) * H + h) * D;
                __m256 a = _mm256_setzero_ps();
                for (int c = 0; c < NC; ++c)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + c * 8), _mm256_loadu_ps(row + c * 8), a);
                s[g][t] = lane_sum(a);
            }
        fold_scores<D>(st, s, G, nb);
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < NC; ++c) {
                __m256 a = _mm256_load_ps(st.acc[g] + c * 8);
                for (int t = 0; t < nb; ++t)
                    a = _mm256_fmadd_ps(_mm256_set1_ps(s[g][t]), _mm256_loadu_ps(sv + ((t0 + t) * H + h) * D + c * 8), a);
                _mm256_store_ps(st.acc[g] + c * 8, a);
            }
    }
}

struct Range { int64_t h, p0, p1; bool staged; };

template <int D, int BITS>
torch::Tensor run(const torch::Tensor& q, const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                  const torch::Tensor& k_min, const torch::Tensor& k_max, const torch::Tensor& k_bits, const torch::Tensor& v_zero,
                  const torch::Tensor& v_scale, const torch::Tensor& table, int64_t ctx, const torch::Tensor& stage_k,
                  const torch::Tensor& stage_v, int64_t slot, double scale) {
    const int64_t HQ = q.size(0), BS = k_pages.size(1), H = k_pages.size(2), NG = v_zero.size(3);
    const int G = int(HQ / H);
    const int64_t full = ctx / BS, tail = ctx % BS;
    std::vector<float> qscaled(HQ * D);
    const float* qp = q.data_ptr<float>();
    for (int64_t i = 0; i < HQ * D; ++i) qscaled[i] = float(qp[i] * scale);
    // Items: (kv head, page range) about 4 per thread in all, plus each head's staged rows.
    const int64_t want = std::max<int64_t>(1, 4 * at::get_num_threads() / std::max<int64_t>(1, H));
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(want, full / 4));
    std::vector<Range> items;
    for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < parts && full > 0; ++i) items.push_back({h, full * i / parts, full * (i + 1) / parts, false});
        if (tail) items.push_back({h, 0, tail, true});
    }
    std::vector<State<D>> states(items.size());
    const uint8_t* kp = k_pages.data_ptr<uint8_t>();
    const uint8_t* vp = v_pages.data_ptr<uint8_t>();
    const int32_t* tp = table.data_ptr<int32_t>();
    at::parallel_for(0, int64_t(items.size()), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const Range& it = items[i];
            const float* qh = qscaled.data() + it.h * G * D;
            if (it.staged)
                staged_rows<D>(qh, G, stage_k.data_ptr<float>() + slot * BS * H * D,
                               stage_v.data_ptr<float>() + slot * BS * H * D, it.p1, H, it.h, states[i]);
            else
                sealed_pages<D, BITS>(qh, G, kp, vp, k_min.data_ptr<float>(), k_max.data_ptr<float>(),
                                      BITS == 4 ? k_bits.data_ptr<uint8_t>() : nullptr, v_zero.data_ptr<at::Half>(), v_scale.data_ptr<at::Half>(), tp, it.p0, it.p1,
                                      BS, H, it.h, NG, states[i]);
        }
    });
    auto out = torch::empty({HQ, D}, q.options());
    float* op = out.data_ptr<float>();
    for (int64_t h = 0; h < H; ++h)
        for (int g = 0; g < G; ++g) {
            float m = -std::numeric_limits<float>::infinity();
            for (size_t i = 0; i < items.size(); ++i)
                if (items[i].h == h) m = std::max(m, states[i].m[g]);
            float l = 0.f;
            alignas(32) float acc[D] = {0};
            for (size_t i = 0; i < items.size(); ++i) {
                if (items[i].h != h || !(states[i].l[g] > 0.f)) continue;
                const float w = std::exp(states[i].m[g] - m);
                l += states[i].l[g] * w;
                for (int d = 0; d < D; ++d) acc[d] += states[i].acc[g][d] * w;
            }
            const float inv = l > 0.f ? 1.f / l : 0.f;
            for (int d = 0; d < D; ++d) op[(h * G + g) * D + d] = acc[d] * inv;
        }
    return out;
}

}  // namespace kivi

// q [HQ, D] fp32 (RoPE applied) of one sequence's decode token; k_pages, v_pages [NB, BS, H,
// Dp] uint8 (int8: Dp = D; int4: D / 2); k_min, k_max [NB, H, D] fp32; v_zero, v_scale
// [NB, BS, H, NG] fp16; table [pages] int32 (logical -> physical); ctx: tokens to attend
// (the new one stored already); stage_k, stage_v [NS, BS, H, D] fp32 and slot: the staging
// slot of the partial last page (ignored when ctx % BS == 0). Returns [HQ, D] fp32.
torch::Tensor decode_kivi(torch::Tensor q, torch::Tensor k_pages, torch::Tensor v_pages, torch::Tensor k_min,
                          torch::Tensor k_max, torch::Tensor k_bits, torch::Tensor v_zero, torch::Tensor v_scale, torch::Tensor table,
                          int64_t ctx, torch::Tensor stage_k, torch::Tensor stage_v, int64_t slot, int64_t bits,
                          double scale) {
    TORCH_CHECK(q.dtype() == torch::kFloat32 && q.dim() == 2 && q.is_contiguous(), "q [HQ, D] fp32 contiguous");
    TORCH_CHECK(k_pages.dtype() == torch::kUInt8 && v_pages.dtype() == torch::kUInt8 && k_pages.dim() == 4 &&
                k_pages.is_contiguous() && v_pages.is_contiguous() && v_pages.sizes() == k_pages.sizes(), "pages uint8 [NB, BS, H, Dp]");
    const int64_t HQ = q.size(0), D = q.size(1), NB = k_pages.size(0), BS = k_pages.size(1), H = k_pages.size(2);
    TORCH_CHECK(bits == 8 || bits == 4, "bits 8 or 4");
    TORCH_CHECK(k_pages.size(3) == (bits == 8 ? D : D / 2), "packed width");
    TORCH_CHECK(HQ % H == 0 && HQ / H <= MAXG && BS <= BLK, "shapes");
    TORCH_CHECK(k_min.dtype() == torch::kFloat32 && k_max.dtype() == torch::kFloat32 && k_min.is_contiguous() &&
                k_max.is_contiguous() && k_min.numel() == NB * H * D && k_max.numel() == NB * H * D, "k_min, k_max [NB, H, D] fp32");
    TORCH_CHECK(v_zero.dtype() == torch::kFloat16 && v_scale.dtype() == torch::kFloat16 && v_zero.dim() == 4 &&
                v_zero.is_contiguous() && v_scale.is_contiguous() && v_zero.sizes() == v_scale.sizes() &&
                v_zero.size(0) == NB && v_zero.size(1) == BS && v_zero.size(2) == H, "v_zero, v_scale [NB, BS, H, NG] fp16");
    const int64_t NG = v_zero.size(3);
    TORCH_CHECK(bits == 8 || (k_bits.dtype() == torch::kUInt8 && k_bits.is_contiguous() && k_bits.numel() == NB * H * D / 2),
                "k_bits [NB, H, D / 2] uint8");
    TORCH_CHECK(NG >= 1 && NG <= 8 && D % NG == 0 && (D / NG) % 8 == 0, "value groups: 1-8 per row, 8-channel multiples");
    TORCH_CHECK(table.dtype() == torch::kInt32 && table.dim() == 1 && table.is_contiguous(), "table [pages] int32");
    TORCH_CHECK(0 < ctx && ctx <= table.size(0) * BS, "ctx within the table");
    const int32_t* tp = table.data_ptr<int32_t>();
    for (int64_t p = 0; p < (ctx + BS - 1) / BS; ++p) TORCH_CHECK(0 <= tp[p] && tp[p] < NB, "block id");
    if (ctx % BS) {
        TORCH_CHECK(stage_k.dtype() == torch::kFloat32 && stage_v.dtype() == torch::kFloat32 && stage_k.is_contiguous() &&
                    stage_v.is_contiguous() && stage_k.dim() == 4 && stage_k.sizes() == stage_v.sizes() &&
                    stage_k.size(1) == BS && stage_k.size(2) == H && stage_k.size(3) == D, "stage [NS, BS, H, D] fp32");
        TORCH_CHECK(0 <= slot && slot < stage_k.size(0), "staging slot");
    }
#define KIVI_CASE(DD)                                                                                        \
    case DD:                                                                                                 \
        return bits == 8 ? kivi::run<DD, 8>(q, k_pages, v_pages, k_min, k_max, k_bits, v_zero, v_scale, table, \
                                            ctx, stage_k, stage_v, slot, scale)                               \
                         : kivi::run<DD, 4>(q, k_pages, v_pages, k_min, k_max, k_bits, v_zero, v_scale, table, \
                                            ctx, stage_k, stage_v, slot, scale);
    switch (D) {
        KIVI_CASE(64)
        KIVI_CASE(128)
        default: TORCH_CHECK(false, "head_dim 64 or 128");
    }
#undef KIVI_CASE
}

// kernels.reference.gather_kv for one sequence of int8/int4 pages: logical pages [H, P]
// int32 (-1: padding) of table [pages] int32, first ctx tokens -> k, v [H, P * BS, D] fp32
// (sealed pages dequantised, the tail page read from its fp32 staging slot, rows that do
// not exist zero) and pos [H, P * BS] int64 (-1 where a row does not exist). Rows held by
// an exact span (exact_k[s], exact_v[s] fp32 [n, H, D] at positions exact_first[s] ..) are
// copied from it instead (engine.exact_sinks.swap_in_, without dequantising them first).
std::vector<torch::Tensor> gather_kivi(torch::Tensor k_pages, torch::Tensor v_pages, torch::Tensor k_min,
                                       torch::Tensor k_max, torch::Tensor k_bits, torch::Tensor v_zero, torch::Tensor v_scale,
                                       torch::Tensor stage_k, torch::Tensor stage_v, torch::Tensor stage_of_block,
                                       torch::Tensor table, torch::Tensor pages, int64_t ctx, int64_t bits,
                                       std::vector<torch::Tensor> exact_k, std::vector<torch::Tensor> exact_v,
                                       std::vector<int64_t> exact_first) {
    TORCH_CHECK(k_pages.dtype() == torch::kUInt8 && k_pages.is_contiguous() && v_pages.is_contiguous() &&
                k_pages.dim() == 4 && v_pages.sizes() == k_pages.sizes(), "pages uint8 [NB, BS, H, Dp]");
    const int64_t NB = k_pages.size(0), BS = k_pages.size(1), H = k_pages.size(2);
    const int64_t D = k_min.size(-1), DP = k_pages.size(3);
    TORCH_CHECK(bits == 8 || bits == 4, "bits 8 or 4");
    TORCH_CHECK(DP == (bits == 8 ? D : D / 2) && D % 8 == 0, "packed width");
    TORCH_CHECK(k_min.dtype() == torch::kFloat32 && k_max.dtype() == torch::kFloat32 && k_min.is_contiguous() &&
                k_max.is_contiguous() && k_min.numel() == NB * H * D && k_max.numel() == NB * H * D, "k_min, k_max");
    TORCH_CHECK(v_zero.dtype() == torch::kFloat16 && v_scale.dtype() == torch::kFloat16 && v_zero.is_contiguous() &&
                v_scale.is_contiguous() && v_zero.dim() == 4 && v_zero.size(0) == NB && v_zero.size(1) == BS &&
                v_zero.size(2) == H && v_scale.sizes() == v_zero.sizes() && D % v_zero.size(3) == 0, "v_zero, v_scale");
    TORCH_CHECK(stage_k.dtype() == torch::kFloat32 && stage_v.dtype() == torch::kFloat32 && stage_k.is_contiguous() &&
                stage_v.is_contiguous() && stage_k.dim() == 4 && stage_k.size(1) == BS && stage_k.size(2) == H &&
                stage_k.size(3) == D && stage_v.sizes() == stage_k.sizes(), "stage fp32 [NS, BS, H, D]");
    TORCH_CHECK(bits == 8 || (k_bits.dtype() == torch::kUInt8 && k_bits.is_contiguous() && k_bits.numel() == NB * H * D / 2),
                "k_bits [NB, H, D / 2] uint8");
    TORCH_CHECK(stage_of_block.dtype() == torch::kInt32 && stage_of_block.numel() == NB && stage_of_block.is_contiguous(), "stage_of_block");
    TORCH_CHECK(table.dtype() == torch::kInt32 && table.dim() == 1 && table.is_contiguous(), "table [pages] int32");
    TORCH_CHECK(pages.dtype() == torch::kInt32 && pages.dim() == 2 && pages.size(0) == H && pages.is_contiguous(), "pages [H, P] int32");
    const int64_t P = pages.size(1), NG = v_zero.size(3), per_group = D / NG;
    const float qmax = bits == 8 ? 255.f : 15.f;
    const int64_t n_spans = int64_t(exact_first.size());
    TORCH_CHECK(int64_t(exact_k.size()) == n_spans && int64_t(exact_v.size()) == n_spans, "one k, v, first per span");
    for (int64_t s = 0; s < n_spans; ++s)
        TORCH_CHECK(exact_k[s].dtype() == torch::kFloat32 && exact_k[s].is_contiguous() && exact_k[s].dim() == 3 &&
                    exact_k[s].size(1) == H && exact_k[s].size(2) == D && exact_v[s].sizes() == exact_k[s].sizes() &&
                    exact_v[s].dtype() == torch::kFloat32 && exact_v[s].is_contiguous() && exact_first[s] >= 0,
                    "exact rows fp32 [n, H, D] contiguous");
    auto k = torch::empty({H, P * BS, D}, k_min.options());
    auto v = torch::empty({H, P * BS, D}, k_min.options());
    auto pos = torch::empty({H, P * BS}, k_min.options().dtype(torch::kInt64));
    const uint8_t* kp = k_pages.data_ptr<uint8_t>();
    const uint8_t* vp = v_pages.data_ptr<uint8_t>();
    const float* lo_all = k_min.data_ptr<float>();
    const float* hi_all = k_max.data_ptr<float>();
    const at::Half* vz = v_zero.data_ptr<at::Half>();
    const at::Half* vs = v_scale.data_ptr<at::Half>();
    const int32_t* tp = table.data_ptr<int32_t>();
    const int32_t* pp = pages.data_ptr<int32_t>();
    const int32_t* sob = stage_of_block.data_ptr<int32_t>();
    float* ko = k.data_ptr<float>();
    float* vo = v.data_ptr<float>();
    int64_t* po = pos.data_ptr<int64_t>();
    const int64_t n_table = table.size(0), tail_page = ctx % BS ? ctx / BS : -1;
    TORCH_CHECK(D <= 256, "head_dim at most 256");
    at::parallel_for(0, H * P, 4, [&](int64_t i0, int64_t i1) {
        uint8_t unpacked[256];
        // A sealed page's key decoding, per channel, shared by its rows: where the code
        // sits (int4: two bytes, a shift and a mask), the base and the step
        // (base + code * step, the reference's key_affine operation for operation).
        int32_t at0[256], at1[256], shift[256], mask[256];
        float base[256], step[256], zero[256], scale[256];
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t h = i / P, lp = pp[i];
            float* kd = ko + i * BS * D;
            float* vd = vo + i * BS * D;
            int64_t* pd = po + i * BS;
            const bool real = lp >= 0 && lp < n_table && lp * BS < ctx;
            const int64_t b = real ? tp[lp] : -1;
            TORCH_CHECK(!real || (0 <= b && b < NB), "block id");
            const bool sealed = real && lp != tail_page;
            if (sealed) {
                const float* lo = lo_all + (b * H + h) * D;
                const float* hi = hi_all + (b * H + h) * D;
                if (bits == 4) {  // bitstream keys (kernels.reference.unpack_bitstream, key_affine)
                    const uint8_t* wb = k_bits.data_ptr<uint8_t>() + (b * H + h) * (D / 2);
                    int64_t o = 0;
                    for (int64_t d = 0; d < D; ++d) {
                        const int w = (wb[d / 2] >> ((d % 2) * 4)) & 15;
                        at0[d] = int32_t(std::min(o >> 3, DP - 1));
                        at1[d] = int32_t(std::min((o >> 3) + 1, DP - 1));
                        shift[d] = int32_t(o & 7);
                        mask[d] = (1 << w) - 1;
                        o += w;
                        const float span = hi[d] - lo[d];
                        base[d] = w > 0 ? lo[d] : lo[d] + span * 0.5f;  // w = 0: code and step 0
                        step[d] = w > 0 ? span / float((1 << w) - 1) : 0.f;
                    }
                } else {
                    for (int64_t d = 0; d < D; ++d) { base[d] = lo[d]; step[d] = (hi[d] - lo[d]) / qmax; }
                }
            }
            for (int64_t t = 0; t < BS; ++t) {
                const int64_t p = lp * BS + t;
                float* kr = kd + t * D;
                float* vr = vd + t * D;
                if (!real || p >= ctx) {
                    std::memset(kr, 0, sizeof(float) * D);
                    std::memset(vr, 0, sizeof(float) * D);
                    pd[t] = -1;
                    continue;
                }
                pd[t] = p;
                bool exact = false;
                for (int64_t s = n_spans - 1; s >= 0 && !exact; --s) {  // the last span holding it wins
                    const int64_t at = p - exact_first[s];
                    if (at >= 0 && at < exact_k[s].size(0)) {
                        std::memcpy(kr, exact_k[s].data_ptr<float>() + (at * H + h) * D, sizeof(float) * D);
                        std::memcpy(vr, exact_v[s].data_ptr<float>() + (at * H + h) * D, sizeof(float) * D);
                        exact = true;
                    }
                }
                if (exact) continue;
                if (!sealed) {  // the tail page: still staged at full precision
                    const int64_t slot = sob[b];
                    TORCH_CHECK(slot >= 0 && slot < stage_k.size(0), "staging slot of the tail page");
                    std::memcpy(kr, stage_k.data_ptr<float>() + ((slot * BS + t) * H + h) * D, sizeof(float) * D);
                    std::memcpy(vr, stage_v.data_ptr<float>() + ((slot * BS + t) * H + h) * D, sizeof(float) * D);
                    continue;
                }
                const uint8_t* kc = kp + ((b * BS + t) * H + h) * DP;
                const uint8_t* vc = vp + ((b * BS + t) * H + h) * DP;
                if (bits == 4) {
                    for (int64_t d = 0; d < D; ++d) {
                        const int two = kc[at0[d]] | (kc[at1[d]] << 8);
                        kr[d] = base[d] + float((two >> shift[d]) & mask[d]) * step[d];
                    }
                    for (int64_t c = 0; c < DP; ++c) { unpacked[2 * c] = vc[c] & 15; unpacked[2 * c + 1] = vc[c] >> 4; }
                    vc = unpacked;
                } else {
                    for (int64_t d = 0; d < D; ++d) kr[d] = base[d] + float(kc[d]) * step[d];
                }
                // Values: a zero and a scale per group of channels, widened once per row.
                const int64_t row = ((b * BS + t) * H + h) * NG;
                for (int64_t g = 0; g < NG; ++g) { zero[g] = float(vz[row + g]); scale[g] = float(vs[row + g]); }
                for (int64_t g = 0; g < NG; ++g)
                    for (int64_t d = g * per_group; d < (g + 1) * per_group; ++d) vr[d] = zero[g] + float(vc[d]) * scale[g];
            }
        }
    });
    return {k, v, pos};
}
"""

FUNCTIONS = ["decode_kivi", "gather_kivi"]
HEAD_DIMS = (64, 128)


def _load():
    return cpp_ext.load("KTCLI_NO_ATTN_KERNEL")


def available() -> bool:
    return _load() is not None


def reads(spec) -> bool:
    """Whether pages of this spec (kernels.KVCacheSpec) can be read here at all (`gather`):
    int8/int4 pages with fp32 staging."""
    return spec.kv_dtype in ("int8", "int4") and spec.stage_dtype == "fp32" and available()


def supports(spec, n_heads: int) -> bool:
    """Whether a layer of this spec decodes here (`decode`): pages `reads` takes, a
    supported head size and group."""
    if not reads(spec) or spec.head_dim not in HEAD_DIMS:
        return False
    n_groups = spec.head_dim // spec.group_size
    group = n_heads // spec.n_kv_heads
    return (n_heads % spec.n_kv_heads == 0 and group <= 16 and spec.block_size <= 64 and 1 <= n_groups <= 8
            and (spec.head_dim // n_groups) % 8 == 0)


def _k_bits(layer) -> torch.Tensor:
    """int4 key widths (`kernels.reference.key_widths`); an empty stand-in for int8."""
    return layer.k_bits if layer.k_bits is not None else torch.empty(0, dtype=torch.uint8)


def gather(layer, table: torch.Tensor, pages: torch.Tensor, ctx: int, exact=()):
    """`kernels.reference.gather_kv` for one sequence: logical pages [H, P] (-1 padding) of
    `table`, its first `ctx` tokens -> k, v [H, P * BS, D] fp32, pos [H, P * BS] int64.
    `exact`: spans (first position, k, v [n, H, D]) whose rows are read instead of the
    pages (`engine.exact_sinks.ExactRows`; the last span holding a row wins, as in
    `swap_in_`)."""
    spec = layer.spec
    # Views of contiguous [T, H, D] rows stay contiguous; .float() is a no-op on fp32.
    ek = [k.float().contiguous() for _, k, _ in exact]
    ev = [v.float().contiguous() for _, _, v in exact]
    return _load().gather_kivi(
        layer.k_pages, layer.v_pages, layer.k_min, layer.k_max, _k_bits(layer), layer.v_zero, layer.v_scale, layer.stage_k,
        layer.stage_v, layer.stage_of_block, table.to(torch.int32).contiguous(), pages.to(torch.int32).contiguous(),
        ctx, 8 if spec.kv_dtype == "int8" else 4, ek, ev, [int(first) for first, _, _ in exact],
    )


def decode(q: torch.Tensor, layer, table: torch.Tensor, ctx: int, scale: float) -> torch.Tensor:
    """q [1, HQ, D] (one decode token, RoPE applied) over a sequence's first `ctx` tokens in
    `layer` (a kernels.PagedKVLayer) -> [1, HQ, D] fp32. `table`: its logical -> physical
    blocks."""
    spec = layer.spec
    bs = spec.block_size
    slot = -1
    if ctx % bs:
        slot = int(layer.stage_of_block[int(table[ctx // bs])])
    out = _load().decode_kivi(
        q.reshape(q.shape[-2], q.shape[-1]).float().contiguous(), layer.k_pages, layer.v_pages, layer.k_min,
        layer.k_max, _k_bits(layer), layer.v_zero, layer.v_scale, table.to(torch.int32).contiguous(), ctx, layer.stage_k,
        layer.stage_v, slot, 8 if spec.kv_dtype == "int8" else 4, scale,
    )
    return out[None]
