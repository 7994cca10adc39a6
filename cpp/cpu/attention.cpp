// CPU attention: appends the new keys/values to the KV cache, then causal softmax attention
// for every new query over the keys it may see (all earlier positions, or the last
// `sliding_window` of them), with optional score softcap and attention sinks, for any GQA ratio.
// No span ceiling: scores live in a per-thread buffer sized to the span.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

// A causal query's work grows with its position, so contiguous halves of a prompt's query rows
// gave the thread with the later half three times the other's work. Item i of a call's
// n_tokens x per_token rows is the row of token slot i / per_token taken from alternate ends
// (tokens 0, n - 1, 1, n - 2, ...): contiguous chunks of items then hold equal work for two
// threads, and near-equal work for more.
int64_t balanced_row(int64_t i, int64_t n_tokens, int64_t per_token) {
    const int64_t slot = i / per_token;
    const int64_t token = slot % 2 == 0 ? slot / 2 : n_tokens - 1 - slot / 2;
    return token * per_token + i % per_token;
}

// The query rows of item i of a call (balanced_row): token m's query heads of KV head kvh at
// position pos, which see the keys [first, first + span) (all earlier, or a sliding window).
struct QueryRows {
    int64_t m, pos, first, span;
    int kvh;
};
QueryRows query_rows(const StageParams& p, const KernelCall& call, int64_t item) {
    const int64_t t = balanced_row(item, call.n_tokens, p.n_head_kv);
    QueryRows r;
    r.m = t / p.n_head_kv;
    r.kvh = int(t % p.n_head_kv);
    r.pos = call.pos0 + r.m;
    r.first = p.sliding_window > 0 ? std::max<int64_t>(0, r.pos - p.sliding_window + 1) : 0;
    r.span = r.pos - r.first + 1;
    return r;
}

// Each of `group` rows of span scores (row g at scores + g * span) made its softmax's weights.
// sinks (or null): row g's attention-sink logit, which joins the denominator and weighs no value.
[[gnu::always_inline]] inline void softmax_rows(float* scores, int64_t span, int group, const float* sinks) {
    for (int g = 0; g < group; ++g) {
        float* sc = scores + size_t(g) * size_t(span);
        const float sink = sinks ? sinks[g] : -std::numeric_limits<float>::infinity();
        float max_score = sink;
        for (int64_t j = 0; j < span; ++j) max_score = std::max(max_score, sc[j]);
        const double total = (sinks ? std::exp(double(sink - max_score)) : 0.0) + exp_shifted(sc, span, max_score);
        const float inv_total = float(1.0 / total);
        for (int64_t j = 0; j < span; ++j) sc[j] *= inv_total;
    }
}

// The query rows (token x KV head) of items [begin, end) of one call (query_rows) over the latent
// attention's cache (no values, so its keys are rows: KvLayer::keys_blocked): one KV head whose
// key is the whole cache row and whose value its first head_dim_v values. Scores, softmax
// (softmax_rows), the weighted values.
KCAP_HOT_LOOP void attend_latent(const StageParams& p, const KernelCall& call, const KvLayer& kv, int64_t begin,
                                 int64_t end) {
    const int group = p.n_head / p.n_head_kv;  // query heads per KV head
    std::vector<float> scores, key(size_t(p.head_dim)), value(size_t(p.head_dim_v));
    for (int64_t item = begin; item < end; ++item) {
        const QueryRows r = query_rows(p, call, item);
        const int64_t m = r.m, first = r.first, span = r.span;
        const int kvh = r.kvh;
        scores.assign(size_t(span) * group, 0.0f);
        for (int64_t j = 0; j < span; ++j) {
            const float* k_row = kv.k_span(first + j, 0, p.head_dim, key.data());
            for (int g = 0; g < group; ++g) {
                const float* q = call.in + (m * p.n_head + int64_t(kvh) * group + g) * p.head_dim;
                float s = dot_f32(q, k_row, p.head_dim) * p.scale;
                if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
                scores[size_t(g) * span + j] = s;
            }
        }
        softmax_rows(scores.data(), span, group, nullptr);
        for (int g = 0; g < group; ++g) {
            float* out = call.out + (m * p.n_head + int64_t(kvh) * group + g) * p.head_dim_v;
            std::fill(out, out + p.head_dim_v, 0.0f);
        }
        for (int64_t j = 0; j < span; ++j) {
            const float* v_row = kv.k_span(first + j, 0, p.head_dim_v, value.data());
            for (int g = 0; g < group; ++g) {
                const float w = scores[size_t(g) * span + j];
                add_scaled(call.out + (m * p.n_head + int64_t(kvh) * group + g) * p.head_dim_v, v_row, w, p.head_dim_v);
            }
        }
    }
}

// Eight floats as one vector (GCC/Clang vector extension, any alignment): a ymm register in the
// AVX2 copy of the hot loops, two xmm in the baseline one.
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float)), aligned(4)));
constexpr int kKeyBlock = KvLayer::kKeyBlock;
constexpr int kBlockVecs = kKeyBlock / 8;
static_assert(kKeyBlock % 8 == 0, "a key block is whole vectors");

// Scores of GC query heads (rows of head_dim at q, q_stride apart) against the kKeyBlock keys of
// one block (head_dim rows of kKeyBlock values, KvLayer's blocked keys): s[g][l] = q_g . key_l.
// The accumulators stay in registers (GC x kKeyBlock lanes, twice: the sums and a run's partial
// sums; two heads at most, so that the AVX2 copy's 16 registers hold them with the block's row
// and the query's values, and a dimension's loads and multiply-adds are one to one). Each sum
// runs over kScoreDims dimensions at a time, and those partial sums are added in order: a
// model of the roundings (random normal vectors) puts these sums' errors within 1.25x of a
// pairwise dot product's at 16 to 256 dimensions, where one run over all dimensions had 1.4x
// to 3x.
constexpr int kScoreDims = 8;
template <int GC>
[[gnu::always_inline]] inline void block_scores(const float* q, int64_t q_stride, const float* keys, int64_t head_dim,
                                                float* s) {
    Vec8 total[GC][kBlockVecs] = {};
    for (int64_t d0 = 0; d0 < head_dim; d0 += kScoreDims) {
        Vec8 acc[GC][kBlockVecs] = {};
        const int64_t d1 = std::min<int64_t>(head_dim, d0 + kScoreDims);
        for (int64_t d = d0; d < d1; ++d) {
            Vec8 row[kBlockVecs];
            for (int v = 0; v < kBlockVecs; ++v) row[v] = *reinterpret_cast<const Vec8*>(keys + d * kKeyBlock + 8 * v);
            for (int g = 0; g < GC; ++g) {
                const float qd = q[g * q_stride + d];
                for (int v = 0; v < kBlockVecs; ++v) acc[g][v] += qd * row[v];
            }
        }
        for (int g = 0; g < GC; ++g)
            for (int v = 0; v < kBlockVecs; ++v) total[g][v] += acc[g][v];
    }
    for (int g = 0; g < GC; ++g)
        for (int v = 0; v < kBlockVecs; ++v) *reinterpret_cast<Vec8*>(s + g * kKeyBlock + 8 * v) = total[g][v];
}

// out_g[d0 .. d0 + 16) += sum over keys j < n of w_g[j] * value_j[d0 .. d0 + 16) for GC query
// heads (weights w + g * w_stride, outputs out + g * out_stride), in key order; value_j at
// values + j * v_stride. The accumulators stay in registers (GC x 16 lanes) over the n keys.
constexpr int kValueChunk = 16;
constexpr int kValueKeys = 16;  // keys per pass over the value chunks: their rows stay in L1
template <int GC>
[[gnu::always_inline]] inline void chunk_values(const float* w, int64_t w_stride, int64_t n, const float* values,
                                                int64_t v_stride, int64_t d0, float* out, int64_t out_stride) {
    Vec8 acc[GC][2];
    for (int g = 0; g < GC; ++g) {
        acc[g][0] = *reinterpret_cast<const Vec8*>(out + g * out_stride + d0);
        acc[g][1] = *reinterpret_cast<const Vec8*>(out + g * out_stride + d0 + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
        const Vec8 v0 = *reinterpret_cast<const Vec8*>(values + j * v_stride + d0);
        const Vec8 v1 = *reinterpret_cast<const Vec8*>(values + j * v_stride + d0 + 8);
        for (int g = 0; g < GC; ++g) {
            const float wj = w[g * w_stride + j];
            acc[g][0] += wj * v0;
            acc[g][1] += wj * v1;
        }
    }
    for (int g = 0; g < GC; ++g) {
        *reinterpret_cast<Vec8*>(out + g * out_stride + d0) = acc[g][0];
        *reinterpret_cast<Vec8*>(out + g * out_stride + d0 + 8) = acc[g][1];
    }
}

// The query rows of items [begin, end) of one call (query_rows) over a cache whose keys are in
// blocks of positions (KvLayer::keys_blocked): the scores of a query row's GQA group a block of
// keys at a time (block_scores, two heads at a time), the softmax (softmax_rows; sinks: a logit
// per query head, or null), the weighted values 16 keys and 16 dimensions at a time
// (chunk_values, four heads at a time, then two, then one).
KCAP_HOT_LOOP void attend_blocked(const StageParams& p, const KernelCall& call, const KvLayer& kv, const float* sinks,
                                  int64_t begin, int64_t end) {
    const int group = p.n_head / p.n_head_kv;  // query heads per KV head
    const int64_t dk = p.head_dim, dv = p.head_dim_v;
    std::vector<float> scores, block_s(size_t(group) * kKeyBlock), key_scratch(size_t(dk) * kKeyBlock), values;
    for (int64_t item = begin; item < end; ++item) {
        const QueryRows r = query_rows(p, call, item);
        const int64_t m = r.m, pos = r.pos, first = r.first, span = r.span;
        const int kvh = r.kvh;
        const float* q = call.in + (m * p.n_head + int64_t(kvh) * group) * dk;
        scores.resize(size_t(span) * group);
        for (int64_t b = first / kKeyBlock; b <= pos / kKeyBlock; ++b) {
            const float* keys = kv.key_block(b, int64_t(kvh) * dk, dk, key_scratch.data());
            int g = 0;
            for (; g + 2 <= group; g += 2) block_scores<2>(q + g * dk, dk, keys, dk, block_s.data() + g * kKeyBlock);
            for (; g < group; ++g) block_scores<1>(q + g * dk, dk, keys, dk, block_s.data() + g * kKeyBlock);
            // The block's keys in [first, pos]: positions b * kKeyBlock + l.
            const int64_t l0 = std::max<int64_t>(0, first - b * kKeyBlock);
            const int64_t l1 = std::min<int64_t>(kKeyBlock, pos - b * kKeyBlock + 1);
            for (g = 0; g < group; ++g)
                for (int64_t l = l0; l < l1; ++l) {
                    float s = block_s[size_t(g) * kKeyBlock + size_t(l)] * p.scale;
                    if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
                    scores[size_t(g) * size_t(span) + size_t(b * kKeyBlock + l - first)] = s;
                }
        }
        softmax_rows(scores.data(), span, group, sinks ? sinks + int64_t(kvh) * group : nullptr);
        // The span's values of this KV head: rows of the cache (f32), or converted (f16).
        const float* v_rows;
        int64_t v_stride;
        if (kv.format == Format::F32) {
            v_rows = kv.v_span(first, int64_t(kvh) * dv, dv, nullptr);
            v_stride = kv.v_width;
        } else {
            values.resize(size_t(span * dv));
            for (int64_t j = 0; j < span; ++j) kv.v_span(first + j, int64_t(kvh) * dv, dv, values.data() + j * dv);
            v_rows = values.data();
            v_stride = dv;
        }
        float* out = call.out + (m * p.n_head + int64_t(kvh) * group) * dv;
        const float* w = scores.data();
        std::fill(out, out + group * dv, 0.0f);
        // kValueKeys keys at a time, each key's whole row used before the next keys (a decode
        // step reads them from memory once, in order), the dimensions 16 at a time within.
        for (int64_t j0 = 0; j0 < span; j0 += kValueKeys) {
            const int64_t n = std::min<int64_t>(kValueKeys, span - j0);
            const float* v = v_rows + j0 * v_stride;
            int64_t d0 = 0;
            for (; d0 + kValueChunk <= dv; d0 += kValueChunk) {
                int g = 0;
                for (; g + 4 <= group; g += 4) chunk_values<4>(w + g * span + j0, span, n, v, v_stride, d0, out + g * dv, dv);
                for (; g + 2 <= group; g += 2) chunk_values<2>(w + g * span + j0, span, n, v, v_stride, d0, out + g * dv, dv);
                for (; g < group; ++g) chunk_values<1>(w + g * span + j0, span, n, v, v_stride, d0, out + g * dv, dv);
            }
            for (int g = 0; g < group; ++g)  // dimensions past the last whole chunk
                for (int64_t d = d0; d < dv; ++d) {
                    float sum = out[g * dv + d];
                    for (int64_t j = 0; j < n; ++j) sum += w[g * span + j0 + j] * v[j * v_stride + d];
                    out[g * dv + d] = sum;
                }
        }
    }
}

void attention_kernel(const Stage& stage, const KernelCall& call) {
    const StageParams& p = stage.params;
    CpuState& state = cpu_state(call.backend_state);
    // A shared-KV layer (kv_shared) reads the cache its source layer filled earlier in this
    // same pass, and stores nothing.
    const bool shared = p.kv_layer >= 0;
    KvLayer& kv = state.kv.at(size_t(shared ? p.kv_layer : stage.layer));
    const int64_t k_width = int64_t(p.n_head_kv) * p.head_dim;
    const int64_t v_width = int64_t(p.n_head_kv) * p.head_dim_v;
    if (!shared) {
        kv.reserve_positions(call.pos0 + call.n_tokens);
        for (int m = 0; m < call.n_tokens; ++m)
            kv.store(call.pos0 + m, call.in2 + m * k_width, call.in3 + m * v_width);
    }
    const float* sinks = stage.operands.size() > 3 && stage.operands[3]
                             ? reinterpret_cast<const float*>(stage.operands[3]->data) : nullptr;
    state.pool.parallel_for(int64_t(call.n_tokens) * p.n_head_kv,
                            [&](int64_t begin, int64_t end) { attend_blocked(p, call, kv, sinks, begin, end); });
}

// Multi-head latent attention (Op::AttentionMla). Each new token's compressed row in K (the
// latent, kv_lora_rank values, then the rope key, rope_dim values) is RMS-normed (the latent, by
// operand 0) and rotated (the rope key) and appended to the cache as one key row. Head h's
// query (the non-rotated part q_n, then the rope part, rotated here) becomes an absorbed query
// [W_kb[h]^T q_n, rotated q_r] of the cache row's width; attention over the cache rows then
// treats them as one KV head whose values are the rows' latents, and head h's output is
// W_vb[h] times its weighted latent. W_kb[h] is W_k_b's matrix h ([kv_lora_rank] rows of
// head_dim - rope_dim) or, combined (kMlaKvBCombined), rows h * (nope + head_dim_v) .. + nope of
// W_kv_b ([nope] rows of kv_lora_rank, so the product is by its transpose); W_vb[h] is W_v_b's
// matrix h or the next head_dim_v rows of W_kv_b.
void attention_mla_kernel(const Stage& stage, const KernelCall& call) {
    const StageParams& p = stage.params;
    CpuState& state = cpu_state(call.backend_state);
    KvLayer& kv = state.kv.at(size_t(stage.layer));
    const int64_t lora = p.kv_lora_rank, rope = p.rope_dim, nope = p.head_dim - rope, dv = p.head_dim_v;
    const int64_t width = lora + rope;  // one cache row
    const int heads = p.n_head;
    const int half = int(rope / 2);
    const bool combined = (stage.features & kMlaKvBCombined) != 0;
    const bool neox = (stage.features & kRopeNeox) != 0;
    const float* norm = reinterpret_cast<const float*>(stage.operands[0]->data);
    const TensorRef& kb = *stage.operands[1];
    const TensorRef& vb = combined ? kb : *stage.operands[2];
    const TensorRef* factor_tensor = stage.operands.size() > 3 ? stage.operands[3] : nullptr;
    const std::vector<float> cos_sin = rope_cos_sin(p, factor_tensor ? reinterpret_cast<const float*>(factor_tensor->data) : nullptr,
                                                    call.pos0, call.n_tokens);
    const auto cos_of = [&](int m) { return &cos_sin[size_t(m) * 2 * half]; };
    const auto sin_of = [&](int m) { return &cos_sin[size_t(m) * 2 * half + half]; };

    // The new cache rows.
    kv.reserve_positions(call.pos0 + call.n_tokens);
    std::vector<float> row(static_cast<size_t>(width));
    for (int m = 0; m < call.n_tokens; ++m) {
        const float* src = call.in2 + m * width;
        double squares = 0.0;
        for (int64_t i = 0; i < lora; ++i) squares += double(src[i]) * src[i];
        const float inv = float(1.0 / std::sqrt(squares / double(lora) + double(p.eps)));
        for (int64_t i = 0; i < lora; ++i) row[size_t(i)] = src[i] * inv * norm[i];
        std::copy(src + lora, src + width, row.begin() + lora);
        rotate_pairs(row.data() + lora, cos_of(m), sin_of(m), int(rope), neox);
        kv.store(call.pos0 + m, row.data(), nullptr);
    }

    // Absorbed queries [token][head][width].
    const size_t kb_row = row_bytes(kb.format, kb.row_length()), vb_row = row_bytes(vb.format, vb.row_length());
    std::vector<float> absorbed(size_t(call.n_tokens) * heads * size_t(width));
    state.pool.parallel_for(int64_t(call.n_tokens) * heads, [&](int64_t begin, int64_t end) {
        std::vector<float> dequantized(combined ? size_t(lora) : 0);
        for (int64_t t = begin; t < end; ++t) {
            const int m = int(t / heads);
            const int64_t h = t % heads;
            const float* q = call.in + t * p.head_dim;
            float* out = &absorbed[size_t(t) * size_t(width)];
            if (combined) {
                std::fill(out, out + lora, 0.0f);
                for (int64_t i = 0; i < nope; ++i) {
                    dequantize_row(kb.format, kb.data + size_t(h * (nope + dv) + i) * kb_row, dequantized.data(), lora);
                    for (int64_t c = 0; c < lora; ++c) out[c] += q[i] * dequantized[size_t(c)];
                }
            } else {
                for (int64_t c = 0; c < lora; ++c) out[c] = dot_row(kb.format, kb.data + size_t(h * lora + c) * kb_row, q, nope);
            }
            std::copy(q + nope, q + p.head_dim, out + lora);
            rotate_pairs(out + lora, cos_of(m), sin_of(m), int(rope), neox);
        }
    });

    // Attention over the latent rows: one KV head of width lora + rope, its values the latents.
    StageParams latent = p;
    latent.n_head_kv = 1;
    latent.head_dim = int(width);
    latent.head_dim_v = int(lora);
    latent.sliding_window = 0;
    latent.softcap = 0.0f;
    std::vector<float> weighted(size_t(call.n_tokens) * heads * size_t(lora));
    KernelCall inner = call;
    inner.in = absorbed.data();
    inner.out = weighted.data();
    state.pool.parallel_for(int64_t(call.n_tokens) * heads, [&](int64_t begin, int64_t end) {
        // Each task: query heads of one token, as one KV head of group 1 reading the shared row.
        StageParams one = latent;
        one.n_head = 1;
        for (int64_t item = begin; item < end; ++item) {
            const int64_t t = balanced_row(item, call.n_tokens, heads);
            KernelCall head = inner;
            head.in = absorbed.data() + t * width;
            head.out = weighted.data() + t * lora;
            head.pos0 = call.pos0 + int(t / heads);
            head.n_tokens = 1;
            attend_latent(one, head, kv, 0, 1);
        }
    });

    // Each head's output: W_vb[h] times its weighted latent.
    const int64_t v_first = combined ? nope : 0, v_head_rows = combined ? nope + dv : dv;
    state.pool.parallel_for(int64_t(call.n_tokens) * heads, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const int64_t h = t % heads;
            for (int64_t j = 0; j < dv; ++j)
                call.out[t * dv + j] = dot_row(vb.format, vb.data + size_t(h * v_head_rows + v_first + j) * vb_row,
                                               &weighted[size_t(t) * size_t(lora)], lora);
        }
    });
}

}  // namespace

void add_cpu_attention_rows(std::vector<Row>& rows) {

    Row row;
    row.kernel = "cpu.attention";
    row.op = Op::Attention;
    row.backend = Backend::CPU;
    row.kv_formats = {Format::F32, Format::F16};
    row.operand_formats = {{}, {}, {}, {Format::F32}};  // operand 3: the sinks
    row.features = kSlidingWindow | kAttnSoftcap | kGqa | kKvShared | kSinks;
    row.fn = attention_kernel;
    rows.push_back(row);

    Row mla;
    mla.kernel = "cpu.attention_mla";
    mla.op = Op::AttentionMla;
    mla.backend = Backend::CPU;
    mla.kv_formats = {Format::F32, Format::F16};
    std::vector<Format> formats;
    for (const FormatInfo& info : all_formats()) formats.push_back(info.format);
    mla.operand_formats = {{Format::F32}, formats, formats, {Format::F32}};
    mla.features = kRopeNormal | kRopeNeox | kRopeFreqFactors | kRmsNorm | kMlaKvBCombined;
    mla.fn = attention_mla_kernel;
    rows.push_back(mla);
}

}  // namespace kcap
