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
pages at virtual positions (`engine.page_groups.virtual_plan`): it gathers and dequantises
those pages in one pass, the same rows as `kernels.reference.gather_kv` (~20 small torch
ops a layer, each step), with the rows held exact copied in and the keys turned to their
virtual positions as they are written. `remapped_decode` is the decode step of those
policies in one pass: the same rows read page by page into a small buffer, scored against
the query rotated to its own column and folded into a running softmax, so nothing is
written out (`kivi::PageReader` serves both).

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

// Each kv head's items merged by their log-sum-exps -> out [H * G, D] (flash-decoding).
template <int D>
void merge_states(const std::vector<Range>& items, const std::vector<State<D>>& states, int64_t H, int G, float* op) {
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
}

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
    merge_states<D>(items, states, H, G, out.data_ptr<float>());
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

namespace kivi {

// Reads pages of one sequence's int8/int4 pool as attention over gathered rows sees them:
// a page's BS rows of one kv head as fp32 (sealed pages dequantised, the tail page from its
// fp32 staging slot, rows that do not exist zero with position -1), rows held by an exact
// span copied from it instead (the last span holding a row wins), keys optionally turned
// by a rotation per column (RoPE at virtual positions).
struct PageReader {
    const uint8_t *kp, *vp, *kbits;
    const float *lo_all, *hi_all, *stage_k, *stage_v, *rot;
    const at::Half *vz, *vs;
    const int32_t *table, *stage_of_block;
    int64_t NB, BS, H, D, DP, NG, per_group, n_table, n_stage, ctx, tail_page;
    int bits;
    float qmax;
    std::vector<const float*> exact_k, exact_v;
    std::vector<int64_t> exact_first, exact_n;

    PageReader(const torch::Tensor& k_pages, const torch::Tensor& v_pages, const torch::Tensor& k_min,
               const torch::Tensor& k_max, const torch::Tensor& k_bits, const torch::Tensor& v_zero,
               const torch::Tensor& v_scale, const torch::Tensor& stage_k_, const torch::Tensor& stage_v_,
               const torch::Tensor& stage_of_block_, const torch::Tensor& table_, int64_t ctx_, int64_t bits_,
               const std::vector<torch::Tensor>& ek, const std::vector<torch::Tensor>& ev,
               const std::vector<int64_t>& efirst, const torch::Tensor& rot_) {
        TORCH_CHECK(k_pages.dtype() == torch::kUInt8 && k_pages.is_contiguous() && v_pages.is_contiguous() &&
                    k_pages.dim() == 4 && v_pages.sizes() == k_pages.sizes(), "pages uint8 [NB, BS, H, Dp]");
        NB = k_pages.size(0); BS = k_pages.size(1); H = k_pages.size(2);
        D = k_min.size(-1); DP = k_pages.size(3); bits = int(bits_); ctx = ctx_;
        TORCH_CHECK(bits == 8 || bits == 4, "bits 8 or 4");
        TORCH_CHECK(DP == (bits == 8 ? D : D / 2) && D % 8 == 0 && D <= 256, "packed width, head_dim at most 256");
        TORCH_CHECK(k_min.dtype() == torch::kFloat32 && k_max.dtype() == torch::kFloat32 && k_min.is_contiguous() &&
                    k_max.is_contiguous() && k_min.numel() == NB * H * D && k_max.numel() == NB * H * D, "k_min, k_max");
        TORCH_CHECK(v_zero.dtype() == torch::kFloat16 && v_scale.dtype() == torch::kFloat16 && v_zero.is_contiguous() &&
                    v_scale.is_contiguous() && v_zero.dim() == 4 && v_zero.size(0) == NB && v_zero.size(1) == BS &&
                    v_zero.size(2) == H && v_scale.sizes() == v_zero.sizes() && D % v_zero.size(3) == 0, "v_zero, v_scale");
        TORCH_CHECK(stage_k_.dtype() == torch::kFloat32 && stage_v_.dtype() == torch::kFloat32 && stage_k_.is_contiguous() &&
                    stage_v_.is_contiguous() && stage_k_.dim() == 4 && stage_k_.size(1) == BS && stage_k_.size(2) == H &&
                    stage_k_.size(3) == D && stage_v_.sizes() == stage_k_.sizes(), "stage fp32 [NS, BS, H, D]");
        TORCH_CHECK(bits == 8 || (k_bits.dtype() == torch::kUInt8 && k_bits.is_contiguous() && k_bits.numel() == NB * H * D / 2),
                    "k_bits [NB, H, D / 2] uint8");
        TORCH_CHECK(stage_of_block_.dtype() == torch::kInt32 && stage_of_block_.numel() == NB &&
                    stage_of_block_.is_contiguous(), "stage_of_block");
        TORCH_CHECK(table_.dtype() == torch::kInt32 && table_.dim() == 1 && table_.is_contiguous(), "table [pages] int32");
        kp = k_pages.data_ptr<uint8_t>(); vp = v_pages.data_ptr<uint8_t>();
        kbits = bits == 4 ? k_bits.data_ptr<uint8_t>() : nullptr;
        lo_all = k_min.data_ptr<float>(); hi_all = k_max.data_ptr<float>();
        stage_k = stage_k_.data_ptr<float>(); stage_v = stage_v_.data_ptr<float>(); n_stage = stage_k_.size(0);
        vz = v_zero.data_ptr<at::Half>(); vs = v_scale.data_ptr<at::Half>();
        NG = v_zero.size(3); per_group = D / NG;
        table = table_.data_ptr<int32_t>(); n_table = table_.size(0);
        stage_of_block = stage_of_block_.data_ptr<int32_t>();
        tail_page = ctx % BS ? ctx / BS : -1;
        qmax = bits == 8 ? 255.f : 15.f;
        TORCH_CHECK(ek.size() == efirst.size() && ev.size() == efirst.size(), "one k, v, first per span");
        for (size_t s = 0; s < efirst.size(); ++s) {
            TORCH_CHECK(ek[s].dtype() == torch::kFloat32 && ek[s].is_contiguous() && ek[s].dim() == 3 &&
                        ek[s].size(1) == H && ek[s].size(2) == D && ev[s].sizes() == ek[s].sizes() &&
                        ev[s].dtype() == torch::kFloat32 && ev[s].is_contiguous() && efirst[s] >= 0,
                        "exact rows fp32 [n, H, D] contiguous");
            exact_k.push_back(ek[s].data_ptr<float>()); exact_v.push_back(ev[s].data_ptr<float>());
            exact_first.push_back(efirst[s]); exact_n.push_back(ek[s].size(0));
        }
        rot = rot_.numel() ? rot_.data_ptr<float>() : nullptr;
        TORCH_CHECK(!rot || (rot_.dtype() == torch::kFloat32 && rot_.is_contiguous() && rot_.dim() == 3 &&
                             rot_.size(1) == D / 2 && rot_.size(2) == 2), "rot fp32 [columns, D / 2, 2]");
        n_rot = rot ? rot_.size(0) : 0;
    }
    int64_t n_rot = 0;

    // Rows that exist in logical page lp (0 past the context, or for padding).
    int64_t rows_in(int64_t lp) const {
        if (lp < 0 || lp >= n_table || lp * BS >= ctx) return 0;
        return std::min(BS, ctx - lp * BS);
    }

    // Logical page lp of kv head h -> K, V [BS, D] and pos [BS]; its rows sit at columns
    // col0 .. col0 + BS - 1 (for the rotation).
    void read(int64_t h, int64_t lp, int64_t col0, float* K, float* V, int64_t* pos) const {
        const int64_t n = rows_in(lp);
        const int64_t b = n ? table[lp] : -1;
        TORCH_CHECK(!n || (0 <= b && b < NB), "block id");
        const bool sealed = n && lp != tail_page;
        // A sealed page's key decoding, per channel, shared by its rows: where the code sits
        // (int4: two bytes, a shift and a mask), the base and the step (base + code * step,
        // the reference's key_affine operation for operation).
        // int4: channel d's code is bits [shift, shift + w) of the 32-bit word at byte at[d]
        // (at most DP - 4, so the word stays in the row), read 8 channels at a time.
        alignas(32) int32_t at[256], shift[256], mask[256];
        alignas(32) float base[256], step[256];
        float zero[256], scale[256];
        uint8_t unpacked[256];
        if (sealed) {
            const float* lo = lo_all + (b * H + h) * D;
            const float* hi = hi_all + (b * H + h) * D;
            if (bits == 4) {  // bitstream keys (kernels.reference.unpack_bitstream, key_affine)
                const uint8_t* wb = kbits + (b * H + h) * (D / 2);
                int64_t o = 0;
                for (int64_t d = 0; d < D; ++d) {
                    const int w = (wb[d / 2] >> ((d % 2) * 4)) & 15;
                    at[d] = int32_t(std::min(o >> 3, DP - 4));  // o + w <= 8 * DP: the code fits the word
                    shift[d] = int32_t(o - 8 * int64_t(at[d]));
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
            float* kr = K + t * D;
            float* vr = V + t * D;
            if (t >= n) {
                std::memset(kr, 0, sizeof(float) * D);
                std::memset(vr, 0, sizeof(float) * D);
                pos[t] = -1;
                continue;
            }
            const int64_t p = lp * BS + t;
            pos[t] = p;
            bool exact = false;
            for (int64_t s = int64_t(exact_first.size()) - 1; s >= 0 && !exact; --s) {  // the last span wins
                const int64_t at = p - exact_first[s];
                if (at >= 0 && at < exact_n[s]) {
                    std::memcpy(kr, exact_k[s] + (at * H + h) * D, sizeof(float) * D);
                    std::memcpy(vr, exact_v[s] + (at * H + h) * D, sizeof(float) * D);
                    exact = true;
                }
            }
            if (!exact && !sealed) {  // the tail page: still staged at full precision
                const int64_t slot = stage_of_block[b];
                TORCH_CHECK(slot >= 0 && slot < n_stage, "staging slot of the tail page");
                std::memcpy(kr, stage_k + ((slot * BS + t) * H + h) * D, sizeof(float) * D);
                std::memcpy(vr, stage_v + ((slot * BS + t) * H + h) * D, sizeof(float) * D);
            } else if (!exact) {  // sealed: keys by the page's layout, values by their row's groups
                const uint8_t* kc = kp + ((b * BS + t) * H + h) * DP;
                const uint8_t* vc = vp + ((b * BS + t) * H + h) * DP;
                for (int64_t d = 0; d < D; d += 8) {  // key = base + code * step, 8 channels at a time
                    __m256 code;
                    if (bits == 4) {
                        const __m256i word = _mm256_i32gather_epi32(reinterpret_cast<const int*>(kc),
                                                                    _mm256_load_si256(reinterpret_cast<const __m256i*>(at + d)), 1);
                        code = _mm256_cvtepi32_ps(_mm256_and_si256(
                            _mm256_srlv_epi32(word, _mm256_load_si256(reinterpret_cast<const __m256i*>(shift + d))),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(mask + d))));
                    } else {
                        code = codes8<8>(kc, int(d));
                    }
                    _mm256_storeu_ps(kr + d, _mm256_fmadd_ps(code, _mm256_load_ps(step + d), _mm256_load_ps(base + d)));
                }
                // a zero and a scale per group of channels, widened once per row
                const int64_t row = ((b * BS + t) * H + h) * NG;
                for (int64_t g = 0; g < NG; ++g) { zero[g] = float(vz[row + g]); scale[g] = float(vs[row + g]); }
                if (per_group % 8 == 0) {
                    for (int64_t g = 0; g < NG; ++g) {
                        const __m256 z = _mm256_set1_ps(zero[g]), sc = _mm256_set1_ps(scale[g]);
                        for (int64_t d = g * per_group; d < (g + 1) * per_group; d += 8)
                            _mm256_storeu_ps(vr + d, _mm256_fmadd_ps(bits == 4 ? codes8<4>(vc, int(d)) : codes8<8>(vc, int(d)), sc, z));
                    }
                } else {
                    if (bits == 4) {
                        for (int64_t c = 0; c < DP; ++c) { unpacked[2 * c] = vc[c] & 15; unpacked[2 * c + 1] = vc[c] >> 4; }
                        vc = unpacked;
                    }
                    for (int64_t g = 0; g < NG; ++g)
                        for (int64_t d = g * per_group; d < (g + 1) * per_group; ++d) vr[d] = zero[g] + float(vc[d]) * scale[g];
                }
            }
            if (rot) {  // (a + ib)(c + is) for 4 pairs at a time: (ac - bs, bc + as) by addsub
                TORCH_CHECK(col0 + t < n_rot, "a rotation for every column");
                const float* r = rot + (col0 + t) * D;
                for (int64_t d = 0; d < D; d += 8) {
                    const __m256 x = _mm256_loadu_ps(kr + d), cs = _mm256_loadu_ps(r + d);
                    const __m256 swapped = _mm256_permute_ps(x, 0xB1);  // (b, a) per pair
                    _mm256_storeu_ps(kr + d, _mm256_addsub_ps(_mm256_mul_ps(x, _mm256_moveldup_ps(cs)),
                                                              _mm256_mul_ps(swapped, _mm256_movehdup_ps(cs))));
                }
            }
        }
    }
};

// Softmax attention of G query heads q [G, D] (rotated at their position, pre-scaled) over
// the rows of pages [p0, p1) of one kv head's list, into a running state.
template <int D>
void remapped_pages(const PageReader& rd, const float* q, int G, int64_t h, const int32_t* pages, int64_t p0,
                    int64_t p1, State<D>& st) {
    constexpr int NC = D / 8;
    const int64_t BS = rd.BS;
    std::vector<float> kbuf(BS * D), vbuf(BS * D);
    std::vector<int64_t> pos(BS);
    alignas(32) float s[MAXG][BLK];
    reset(st.m, st.l, G);
    for (int g = 0; g < G; ++g) std::memset(st.acc[g], 0, sizeof(float) * D);
    for (int64_t i = p0; i < p1; ++i) {
        const int64_t n = rd.rows_in(pages[i]);
        if (!n) continue;
        rd.read(h, pages[i], i * BS, kbuf.data(), vbuf.data(), pos.data());
        for (int g = 0; g < G; ++g)
            for (int64_t t = 0; t < n; ++t) {
                const float* row = kbuf.data() + t * D;
                __m256 a = _mm256_setzero_ps();
                for (int c = 0; c < NC; ++c)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + c * 8), _mm256_loadu_ps(row + c * 8), a);
                s[g][t] = lane_sum(a);
            }
        fold_scores<D>(st, s, G, int(n));
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < NC; ++c) {
                __m256 a = _mm256_load_ps(st.acc[g] + c * 8);
                for (int64_t t = 0; t < n; ++t)
                    a = _mm256_fmadd_ps(_mm256_set1_ps(s[g][t]), _mm256_loadu_ps(vbuf.data() + t * D + c * 8), a);
                _mm256_store_ps(st.acc[g] + c * 8, a);
            }
    }
}

template <int D>
torch::Tensor remapped_decode(const PageReader& rd, const torch::Tensor& q, const torch::Tensor& pages, double scale) {
    const int64_t HQ = q.size(0), H = rd.H, P = pages.size(1), BS = rd.BS;
    const int G = int(HQ / H);
    const int32_t* pp = pages.data_ptr<int32_t>();
    // Each head's keys are a prefix of its columns; the query sits at the last one.
    std::vector<float> qrot(HQ * D);
    const float* qp = q.data_ptr<float>();
    for (int64_t h = 0; h < H; ++h) {
        int64_t n_keys = 0;
        for (int64_t i = 0; i < P; ++i) n_keys += rd.rows_in(pp[h * P + i]);
        TORCH_CHECK(n_keys > 0 && n_keys <= rd.n_rot, "a rotation for the query's column");
        const float* r = rd.rot + (n_keys - 1) * D;
        for (int g = 0; g < G; ++g) {
            const float* x = qp + (h * G + g) * D;
            float* y = qrot.data() + (h * G + g) * D;
            for (int64_t j = 0; j < D / 2; ++j) {
                const float a = x[2 * j], bb = x[2 * j + 1], c = r[2 * j], sn = r[2 * j + 1];
                y[2 * j] = float((a * c - bb * sn) * scale);
                y[2 * j + 1] = float((a * sn + bb * c) * scale);
            }
        }
    }
    // Items: (kv head, range of its pages), about 2 per thread, merged per head below.
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(P, (2 * at::get_num_threads() + H - 1) / H));
    std::vector<Range> items;
    for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < parts; ++i) items.push_back({h, P * i / parts, P * (i + 1) / parts, false});
    std::vector<State<D>> states(items.size());
    at::parallel_for(0, int64_t(items.size()), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
            remapped_pages<D>(rd, qrot.data() + items[i].h * G * D, G, items[i].h, pp + items[i].h * P, items[i].p0,
                              items[i].p1, states[i]);
    });
    auto out = torch::empty({HQ, D}, q.options());
    merge_states<D>(items, states, H, G, out.data_ptr<float>());
    return out;
}

}  // namespace kivi

// kernels.reference.gather_kv for one sequence of int8/int4 pages: logical pages [H, P]
// int32 (-1: padding) of table [pages] int32, first ctx tokens -> k, v [H, P * BS, D] fp32
// and pos [H, P * BS] int64, as kivi::PageReader reads them (exact spans: exact_k[s],
// exact_v[s] fp32 [n, H, D] at positions exact_first[s] ..; rot, unless empty: fp32
// [>= P * BS, D / 2, 2], key column c turned by rot[c]).
std::vector<torch::Tensor> gather_kivi(torch::Tensor k_pages, torch::Tensor v_pages, torch::Tensor k_min,
                                       torch::Tensor k_max, torch::Tensor k_bits, torch::Tensor v_zero, torch::Tensor v_scale,
                                       torch::Tensor stage_k, torch::Tensor stage_v, torch::Tensor stage_of_block,
                                       torch::Tensor table, torch::Tensor pages, int64_t ctx, int64_t bits,
                                       std::vector<torch::Tensor> exact_k, std::vector<torch::Tensor> exact_v,
                                       std::vector<int64_t> exact_first, torch::Tensor rot) {
    const kivi::PageReader rd(k_pages, v_pages, k_min, k_max, k_bits, v_zero, v_scale, stage_k, stage_v, stage_of_block,
                              table, ctx, bits, exact_k, exact_v, exact_first, rot);
    TORCH_CHECK(pages.dtype() == torch::kInt32 && pages.dim() == 2 && pages.size(0) == rd.H && pages.is_contiguous(),
                "pages [H, P] int32");
    const int64_t H = rd.H, P = pages.size(1), BS = rd.BS, D = rd.D;
    auto k = torch::empty({H, P * BS, D}, k_min.options());
    auto v = torch::empty({H, P * BS, D}, k_min.options());
    auto pos = torch::empty({H, P * BS}, k_min.options().dtype(torch::kInt64));
    const int32_t* pp = pages.data_ptr<int32_t>();
    float* ko = k.data_ptr<float>();
    float* vo = v.data_ptr<float>();
    int64_t* po = pos.data_ptr<int64_t>();
    at::parallel_for(0, H * P, 4, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
            rd.read(i / P, pp[i], (i % P) * BS, ko + i * BS * D, vo + i * BS * D, po + i * BS);
    });
    return {k, v, pos};
}

// Decode attention of one query q [HQ, D] fp32 (unrotated) over the pages [H, P] int32 of
// a remapped policy (ascending, -1 padded; the layout of gather_kivi's arguments), at
// virtual positions: key column c at position c (rot[c], as gather_kivi turns it), the
// query at its head's last key column. -> [HQ, D] fp32. The same function as gathering
// and then attending (engine.page_groups.virtual_plan, attend_columns) without writing the
// gathered rows out.
torch::Tensor remapped_decode_kivi(torch::Tensor q, torch::Tensor k_pages, torch::Tensor v_pages, torch::Tensor k_min,
                                   torch::Tensor k_max, torch::Tensor k_bits, torch::Tensor v_zero, torch::Tensor v_scale,
                                   torch::Tensor stage_k, torch::Tensor stage_v, torch::Tensor stage_of_block,
                                   torch::Tensor table, torch::Tensor pages, int64_t ctx, int64_t bits,
                                   std::vector<torch::Tensor> exact_k, std::vector<torch::Tensor> exact_v,
                                   std::vector<int64_t> exact_first, torch::Tensor rot, double scale) {
    const kivi::PageReader rd(k_pages, v_pages, k_min, k_max, k_bits, v_zero, v_scale, stage_k, stage_v, stage_of_block,
                              table, ctx, bits, exact_k, exact_v, exact_first, rot);
    TORCH_CHECK(pages.dtype() == torch::kInt32 && pages.dim() == 2 && pages.size(0) == rd.H && pages.is_contiguous(),
                "pages [H, P] int32");
    TORCH_CHECK(rd.rot != nullptr, "a rotation per column");
    TORCH_CHECK(q.dtype() == torch::kFloat32 && q.dim() == 2 && q.is_contiguous() && q.size(1) == rd.D &&
                q.size(0) % rd.H == 0 && q.size(0) / rd.H <= MAXG && rd.BS <= BLK, "q [HQ, D] fp32; shapes");
    switch (rd.D) {
        case 64: return kivi::remapped_decode<64>(rd, q, pages, scale);
        case 128: return kivi::remapped_decode<128>(rd, q, pages, scale);
        default: TORCH_CHECK(false, "head_dim 64 or 128");
    }
}

// The pages one query group reads under a sparse policy, for a group within one page (a
// decode step, or a chunk inside its last page): kernels.reference.chunk_scores then
// engine.page_groups._one_group_visits, and the extra pages. Per kv head (or one row for
// every head unless per_kv_head): the sinks [0, n_sink), the local pages [n_total -
// n_local, n_total), the extra pages below n_total and the top_k candidates between the
// two by Quest's bound: sum_d max(q_d k_min_d, q_d k_max_d) (non-finite summaries read as
// 0), the max over the head's query rows. q [N, HQ, D] fp32 (keys' frame: unrotated),
// k_min / k_max [NB, H, D] fp32, table [>= n_total] int32, extra [E] int32 -> [Hs, W]
// int32 ascending, -1 padded, W the most pages of a row. In torch that is ~20 small
// operations, ~0.5 ms a layer of every sparse decode step.
torch::Tensor decode_page_plan(torch::Tensor q, torch::Tensor k_min, torch::Tensor k_max, torch::Tensor table,
                               int64_t n_total, int64_t n_sink, int64_t n_local, int64_t top_k, bool per_kv_head,
                               torch::Tensor extra) {
    TORCH_CHECK(k_min.dtype() == torch::kFloat32 && k_max.dtype() == torch::kFloat32 && k_min.is_contiguous() &&
                k_max.is_contiguous() && k_min.dim() == 3 && k_max.sizes() == k_min.sizes(), "k_min, k_max fp32 [NB, H, D]");
    const int64_t NB = k_min.size(0), H = k_min.size(1), D = k_min.size(2);
    TORCH_CHECK(q.dtype() == torch::kFloat32 && q.is_contiguous() && q.dim() == 3 && q.size(2) == D &&
                q.size(1) % H == 0 && D % 8 == 0, "q fp32 [N, HQ, D]");
    TORCH_CHECK(table.dtype() == torch::kInt32 && table.dim() == 1 && table.is_contiguous() && table.size(0) >= n_total &&
                n_total >= 1, "table [>= n_total] int32");
    TORCH_CHECK(extra.dtype() == torch::kInt32 && extra.dim() == 1 && extra.is_contiguous(), "extra [E] int32");
    const int64_t N = q.size(0), HQ = q.size(1), G = HQ / H, Hs = per_kv_head && top_k > 0 ? H : 1;  // one row without a top-k
    const int64_t c0 = std::min(n_sink, n_total), c1 = std::max(c0, n_total - n_local);  // candidates [c0, c1)
    const int64_t n_cand = top_k > 0 ? c1 - c0 : 0;
    const int32_t* tb = table.data_ptr<int32_t>();
    std::vector<float> score(size_t(H * std::max<int64_t>(n_cand, 1)));
    if (n_cand > 0) {
        // Each query row split into its positive and negative parts: q+ . k_max + q- . k_min.
        std::vector<float> qp(size_t(N * HQ * D)), qn(size_t(N * HQ * D));
        const float* qd = q.data_ptr<float>();
        for (int64_t i = 0; i < N * HQ * D; ++i) { qp[i] = std::max(qd[i], 0.f); qn[i] = std::min(qd[i], 0.f); }
        const float* lo_all = k_min.data_ptr<float>();
        const float* hi_all = k_max.data_ptr<float>();
        const __m256 inf = _mm256_set1_ps(INFINITY), sign = _mm256_set1_ps(-0.f);
        at::parallel_for(c0, c1, 128, [&](int64_t p0, int64_t p1) {
            alignas(32) float lo[256], hi[256];
            for (int64_t p = p0; p < p1; ++p) {
                const int64_t b = tb[p];
                TORCH_CHECK(0 <= b && b < NB, "block id");
                for (int64_t h = 0; h < H; ++h) {
                    for (int64_t d = 0; d < D; d += 8) {  // +-inf (an empty summary) and NaN read as 0
                        const __m256 l = _mm256_loadu_ps(lo_all + (b * H + h) * D + d);
                        const __m256 u = _mm256_loadu_ps(hi_all + (b * H + h) * D + d);
                        _mm256_store_ps(lo + d, _mm256_and_ps(l, _mm256_cmp_ps(_mm256_andnot_ps(sign, l), inf, _CMP_LT_OQ)));
                        _mm256_store_ps(hi + d, _mm256_and_ps(u, _mm256_cmp_ps(_mm256_andnot_ps(sign, u), inf, _CMP_LT_OQ)));
                    }
                    float best = -INFINITY;
                    for (int64_t n = 0; n < N; ++n)
                        for (int64_t g = 0; g < G; ++g) {
                            const int64_t row = (n * HQ + h * G + g) * D;
                            __m256 acc = _mm256_setzero_ps();
                            for (int64_t d = 0; d < D; d += 8) {
                                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.data() + row + d), _mm256_load_ps(hi + d), acc);
                                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qn.data() + row + d), _mm256_load_ps(lo + d), acc);
                            }
                            best = std::max(best, kivi::lane_sum(acc));
                        }
                    score[h * n_cand + (p - c0)] = best;
                }
            }
        });
    }
    std::vector<std::vector<int32_t>> rows(Hs);
    std::vector<char> visit(n_total);
    std::vector<int64_t> order(n_cand);
    std::vector<float> key(n_cand);
    const int32_t* ex = extra.data_ptr<int32_t>();
    size_t width = 0;
    for (int64_t r = 0; r < Hs; ++r) {
        std::fill(visit.begin(), visit.end(), 0);
        for (int64_t p = 0; p < c0; ++p) visit[p] = 1;
        for (int64_t p = std::max<int64_t>(0, n_total - n_local); p < n_total; ++p) visit[p] = 1;
        for (int64_t e = 0; e < extra.size(0); ++e)
            if (ex[e] >= 0 && ex[e] < n_total) visit[ex[e]] = 1;
        if (n_cand > 0) {
            for (int64_t i = 0; i < n_cand; ++i) {
                float s = per_kv_head ? score[r * n_cand + i] : -INFINITY;
                if (!per_kv_head)
                    for (int64_t h = 0; h < H; ++h) s = std::max(s, score[h * n_cand + i]);
                // As select_pages: non-finite scores rank last but are still candidates.
                key[i] = std::isnan(s) ? -3e38f : std::isinf(s) ? (s > 0 ? 3e38f : -3e38f) : s;
                order[i] = i;
            }
            const int64_t k = std::min(top_k, n_cand);
            std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
                return key[a] > key[b] || (key[a] == key[b] && a < b);
            });
            for (int64_t i = 0; i < k; ++i) visit[c0 + order[i]] = 1;
        }
        for (int64_t p = 0; p < n_total; ++p)
            if (visit[p]) rows[r].push_back(int32_t(p));
        width = std::max(width, rows[r].size());
    }
    auto out = torch::full({Hs, int64_t(width)}, -1, table.options());
    int32_t* o = out.data_ptr<int32_t>();
    for (int64_t r = 0; r < Hs; ++r) std::copy(rows[r].begin(), rows[r].end(), o + r * int64_t(width));
    return out;
}

// engine.longctx.store_mid_page in one call: rows k, v [N, H, D] fp32 at slot_mapping [N]
// int64 go into their pages' fp32 staging slots, and the pages' key summaries widen to
// include them; only where every row lands strictly inside a page already being staged
// (neither its first row nor its last) and no two rows share a page. Returns false,
// having written nothing, otherwise.
bool stage_mid_page_rows(torch::Tensor stage_k, torch::Tensor stage_v, torch::Tensor k_min, torch::Tensor k_max,
                         torch::Tensor stage_of_block, torch::Tensor k, torch::Tensor v, torch::Tensor slot_mapping,
                         int64_t block_size) {
    TORCH_CHECK(stage_k.dtype() == torch::kFloat32 && stage_v.dtype() == torch::kFloat32 && stage_k.is_contiguous() &&
                stage_v.is_contiguous() && stage_k.dim() == 4 && stage_v.sizes() == stage_k.sizes(), "stage fp32 [NS, BS, H, D]");
    const int64_t NS = stage_k.size(0), BS = stage_k.size(1), H = stage_k.size(2), D = stage_k.size(3);
    TORCH_CHECK(BS == block_size && k_min.dtype() == torch::kFloat32 && k_max.dtype() == torch::kFloat32 &&
                k_min.is_contiguous() && k_max.is_contiguous() && k_min.dim() == 3 && k_min.size(1) == H &&
                k_min.size(2) == D && k_max.sizes() == k_min.sizes(), "k_min, k_max fp32 [NB, H, D]");
    TORCH_CHECK(k.dtype() == torch::kFloat32 && v.dtype() == torch::kFloat32 && k.is_contiguous() && v.is_contiguous() &&
                k.dim() == 3 && k.size(1) == H && k.size(2) == D && v.sizes() == k.sizes(), "k, v fp32 [N, H, D]");
    TORCH_CHECK(slot_mapping.dtype() == torch::kInt64 && slot_mapping.is_contiguous() && slot_mapping.numel() == k.size(0) &&
                stage_of_block.dtype() == torch::kInt32 && stage_of_block.is_contiguous(), "slot_mapping int64, stage_of_block int32");
    const int64_t N = k.size(0), NB = k_min.size(0);
    const int64_t* sm = slot_mapping.data_ptr<int64_t>();
    const int32_t* sob = stage_of_block.data_ptr<int32_t>();
    for (int64_t i = 0; i < N; ++i) {
        const int64_t b = sm[i] / BS, o = sm[i] % BS;
        if (sm[i] < 0 || b >= NB || o == 0 || o == BS - 1 || sob[b] < 0 || sob[b] >= NS) return false;
        for (int64_t j = 0; j < i; ++j)
            if (sm[j] / BS == b) return false;
    }
    float* sk = stage_k.data_ptr<float>();
    float* sv = stage_v.data_ptr<float>();
    float* lo = k_min.data_ptr<float>();
    float* hi = k_max.data_ptr<float>();
    const float* kd = k.data_ptr<float>();
    const float* vd = v.data_ptr<float>();
    for (int64_t i = 0; i < N; ++i) {
        const int64_t b = sm[i] / BS, o = sm[i] % BS, slot = sob[b];
        std::memcpy(sk + (slot * BS + o) * H * D, kd + i * H * D, sizeof(float) * H * D);
        std::memcpy(sv + (slot * BS + o) * H * D, vd + i * H * D, sizeof(float) * H * D);
        for (int64_t c = 0; c < H * D; ++c) {  // as torch.minimum / maximum: a NaN row makes a NaN bound
            const float x = kd[i * H * D + c];
            float& l = lo[b * H * D + c];
            float& u = hi[b * H * D + c];
            l = (x < l || std::isnan(x)) ? x : l;
            u = (x > u || std::isnan(x)) ? x : u;
        }
    }
    return true;
}
"""

FUNCTIONS = ["decode_kivi", "gather_kivi", "remapped_decode_kivi", "decode_page_plan", "stage_mid_page_rows"]
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


def gather(layer, table: torch.Tensor, pages: torch.Tensor, ctx: int, exact=(), rotation: torch.Tensor | None = None):
    """`kernels.reference.gather_kv` for one sequence: logical pages [H, P] (-1 padding) of
    `table`, its first `ctx` tokens -> k, v [H, P * BS, D] fp32, pos [H, P * BS] int64.
    `exact`: spans (first position, k, v [n, H, D]) whose rows are read instead of the
    pages (`engine.exact_sinks.ExactRows`; the last span holding a row wins, as in
    `swap_in_`). `rotation` complex64 [>= P * BS, D / 2]: key column c is multiplied by
    rotation[c] (interleaved channel pairs), RoPE at virtual positions as it is written."""
    return _load().gather_kivi(*_reader_args(layer, table, pages, ctx, exact, rotation))


def remapped_decode(q: torch.Tensor, layer, table: torch.Tensor, pages: torch.Tensor, ctx: int, exact,
                    rotation: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode query q [1, HQ, D] (unrotated) over logical pages [H, P] (ascending, -1
    padded) at virtual positions, `rotation` complex64 [>= P * BS, D / 2] giving column c's
    RoPE -> [HQ, D] fp32: `gather` with `exact` and `rotation`, then attention of the
    query at its head's last column, in one pass that writes no gathered rows."""
    return _load().remapped_decode_kivi(q.reshape(q.shape[-2], q.shape[-1]).float().contiguous(),
                                        *_reader_args(layer, table, pages, ctx, exact, rotation), scale)


def _reader_args(layer, table: torch.Tensor, pages: torch.Tensor, ctx: int, exact, rotation: torch.Tensor | None):
    """The arguments of `kivi::PageReader` and the pages, in the order both C++ readers take them."""
    # Views of contiguous [T, H, D] rows stay contiguous; .float() is a no-op on fp32.
    return (layer.k_pages, layer.v_pages, layer.k_min, layer.k_max, _k_bits(layer), layer.v_zero, layer.v_scale,
            layer.stage_k, layer.stage_v, layer.stage_of_block, table.to(torch.int32).contiguous(),
            pages.to(torch.int32).contiguous(), ctx, 8 if layer.spec.kv_dtype == "int8" else 4,
            [k.float().contiguous() for _, k, _ in exact], [v.float().contiguous() for _, _, v in exact],
            [int(first) for first, _, _ in exact],
            torch.view_as_real(rotation).contiguous() if rotation is not None else _NO_ROTATION)


_NO_ROTATION = torch.empty(0)


def page_plan(q: torch.Tensor, layer, table: torch.Tensor, n_total: int, policy, extra: torch.Tensor | None):
    """The pages of a query group q [N, HQ, D] (unrotated) within the last of `n_total`
    pages under a sparse `policy` (window or topk), with the `extra` pages: [Hs, W] int32
    ascending, -1 padded, as `engine.page_groups.group_page_plans` gives them for one
    group; None where the C++ kernels do not run (off the CPU, or not built)."""
    if q.device.type != "cpu" or layer.k_min.dtype != torch.float32 or _load() is None:
        return None
    top_k = policy.top_k_pages if policy.kind == "topk" else 0
    extra = extra.to(torch.int32).contiguous() if extra is not None else _NO_PAGES
    return _load().decode_page_plan(q.float().contiguous(), layer.k_min, layer.k_max, table.to(torch.int32).contiguous(),
                                    n_total, policy.n_sink_pages, policy.n_local_pages, top_k, policy.per_kv_head, extra)


_NO_PAGES = torch.empty(0, dtype=torch.int32)


def stage_mid_page_rows(layer, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> bool | None:
    """`engine.longctx.store_mid_page` in one C++ call: True (stored), False (not such
    rows: nothing written), None where it does not run (off the CPU, not fp32 staging, not
    built)."""
    if (k.device.type != "cpu" or layer.stage_k is None or layer.stage_k.dtype != torch.float32
            or layer.k_min.dtype != torch.float32 or _load() is None):
        return None
    return _load().stage_mid_page_rows(layer.stage_k, layer.stage_v, layer.k_min, layer.k_max, layer.stage_of_block,
                                       k.float().contiguous(), v.float().contiguous(),
                                       slot_mapping.to(torch.int64).contiguous(), layer.spec.block_size)


def decodes_remapped(layer, n_heads: int) -> bool:
    """Whether `remapped_decode` takes this layer's pages and head shapes."""
    spec = layer.spec
    return reads(spec) and spec.head_dim in HEAD_DIMS and n_heads // spec.n_kv_heads <= 16 and spec.block_size <= 64


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
