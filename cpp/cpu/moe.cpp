// CPU rows of the mixture-of-experts stages: the reference the GPU rows are tested against.
//   cpu.moe_route         per token: the router's logits (any weight format) plus an optional
//                         F32 bias (operand 2), optionally times
//                         a scalar (expert_logit_scale), a softmax over every expert (or each
//                         expert's sigmoid, plus an F32 choice bias, operand 3, for the choice
//                         only), with group-limited routing only the experts of the best groups,
//                         the n_expert_used largest (the lower index first on a tie, as torch.topk
//                         over a stable sort), their weights optionally renormalized to sum 1,
//                         times the scale and, with an F32 per-expert scale vector (operand 1),
//                         times the chosen expert's entry; into the Routing buffer (the ids as
//                         floats, exact below 2^24, then the weights). The choice is made on the
//                         logits (the softmax keeps their order), as the GPU rows make it.
//   cpu.moe_experts       per token and chosen expert: act(gate_e x) * up_e x over the expert's
//                         FFN width, then down_e of it, weighted and summed over the chosen
//                         experts; each operand in any format (a Q4_K_M file may keep a Q6_K down),
//                         with optional F32 biases of gate, up and down (operands 3-5), and any
//                         gated activation (gpt-oss's clamped SwiGLU too).
//                         With expert_gate_up_merged, gate and up are one tensor (operands 0 and
//                         1 the same): expert e's gate rows 2e*ff.., its up rows (2e+1)*ff...
//   cpu.moe_experts_tiles the same for any number of tokens: where the CPU has AVX-512 or
//                         AVX2, each expert's rows decoded exactly once per call into the f32
//                         GEMM's tiles (cpu/matmul_f32_gemm.h) for all of its slots; elsewhere
//                         the slot loop.
//                         cpu.moe_experts itself takes one token.
//   cpu.moe_experts_q8    the same with q8_1 activations for one token (activations="q8_1", the
//                         experts' formats all in KCAP_Q8_WEIGHT_FORMATS): gate_e and up_e against
//                         q8_1(x), down_e against q8_1 of the slot's activations (each slot's ff
//                         values rounded on their own), integer products per 16 values
//                         (dot_row_q8_1) as the dense cpu.matvec_q8 rows and llama.cpp's CPU
//                         experts; biases, the weighted sum and the shared expert's output in f32
//                         as above.
//   cpu.moe_experts_q8_tiles  the same for any number of tokens: where the CPU has AVX-512 VNNI
//                         or AVX2, each expert's rows decoded once per call into the int8 GEMM's tiles
//                         (cpu/matmul_q8_gemm.h) for all of its slots; elsewhere the slot loop.
//   cpu.moe_shared_gate   out = in + sigmoid(w . x) * shared (w absent: gate 1).
// Every sum in f32, each expert's rows decoded exactly (dot_row), as the dense matmul rows do.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/cpu_state.h"
#include "cpu/matmul_f32_gemm.h"
#include "cpu/matmul_q8_pack.h"
#include "dispatch/stage.h"
#include "kernels/formats_list.h"

namespace kcap {

namespace {

// The Routing buffer's row of token t: n_used ids (as floats), then n_used weights.
struct RoutingRow {
    float* base;
    int n_used;
    int32_t id(int k) const { return int32_t(base[k]); }
    void set_id(int k, int32_t v) const { base[k] = float(v); }
    float& weight(int k) const { return base[n_used + k]; }
};

// Group-limited routing (kExpertGroups): marks allowed[e] for the experts of the
// n_groups_used best groups, each group scored from its experts' choice scores by the stage's
// rule (the larger index loses a tie).
void choose_groups(const StageParams& p, const std::vector<float>& choice, std::vector<char>& allowed) {
    const int groups = p.n_expert_groups, size = p.n_expert / groups;
    std::vector<float> group_score(static_cast<size_t>(groups));
    for (int g = 0; g < groups; ++g) {
        const float* c = &choice[size_t(g) * size];
        if (p.expert_group_score == ExpertGroupScore::Max) {
            group_score[size_t(g)] = *std::max_element(c, c + size);
        } else {  // the sum of the two largest
            float first = -INFINITY, second = -INFINITY;
            for (int i = 0; i < size; ++i) {
                if (c[i] > first) {
                    second = first;
                    first = c[i];
                } else if (c[i] > second) {
                    second = c[i];
                }
            }
            group_score[size_t(g)] = first + second;
        }
    }
    std::vector<int> order(static_cast<size_t>(groups));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return group_score[size_t(a)] > group_score[size_t(b)]; });
    std::fill(allowed.begin(), allowed.end(), char(0));
    for (int k = 0; k < p.n_expert_groups_used; ++k)
        std::fill_n(allowed.begin() + long(order[size_t(k)]) * size, size, char(1));
}

void moe_route_kernel(const Stage& stage, const KernelCall& call) {
    const TensorRef& w = *stage.operands[0];
    const auto f32_operand = [&](size_t i) {
        return stage.operands.size() > i && stage.operands[i] ? reinterpret_cast<const float*>(stage.operands[i]->data)
                                                               : nullptr;
    };
    const float* expert_scale = f32_operand(1);
    const float* bias = f32_operand(2);
    const float* choice_bias = f32_operand(3);
    const int64_t K = stage.k;
    const StageParams& p = stage.params;
    const int n_expert = p.n_expert, n_used = p.n_expert_used;
    const bool renormalize = (stage.features & kExpertWeightsNorm) != 0;
    const bool sigmoid = (stage.features & kExpertSigmoid) != 0;
    const bool grouped = (stage.features & kExpertGroups) != 0;
    const float logit_scale = (stage.features & kExpertLogitScale) ? p.expert_logit_scale : 1.0f;
    const size_t row_stride = row_bytes(w.format, K);
    cpu_state(call.backend_state).pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
        std::vector<float> logits(static_cast<size_t>(n_expert)), probs(static_cast<size_t>(n_expert)),
            choice(static_cast<size_t>(n_expert));
        std::vector<char> allowed(static_cast<size_t>(n_expert), char(1));
        std::vector<int> order;
        for (int64_t t = begin; t < end; ++t) {
            const float* x = call.in + t * K;
            float top = -INFINITY;
            for (int e = 0; e < n_expert; ++e) {
                logits[size_t(e)] =
                    (dot_row(w.format, w.data + size_t(e) * row_stride, x, K) + (bias ? bias[e] : 0.0f)) * logit_scale;
                top = std::max(top, logits[size_t(e)]);
            }
            if (sigmoid) {
                // Each expert's own score; the choice adds the choice bias, the weights do not.
                for (int e = 0; e < n_expert; ++e) {
                    probs[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[size_t(e)]));
                    choice[size_t(e)] = probs[size_t(e)] + (choice_bias ? choice_bias[e] : 0.0f);
                }
            } else {
                float sum = 0.0f;
                for (int e = 0; e < n_expert; ++e) sum += (probs[size_t(e)] = std::exp(logits[size_t(e)] - top));
                for (float& q : probs) q /= sum;
                choice = logits;  // the softmax keeps the logits' order
            }
            if (grouped) choose_groups(p, choice, allowed);
            order.clear();
            for (int e = 0; e < n_expert; ++e)
                if (allowed[size_t(e)]) order.push_back(e);
            std::stable_sort(order.begin(), order.end(),
                             [&](int a, int b) { return choice[size_t(a)] > choice[size_t(b)]; });
            const RoutingRow out{call.out + t * 2 * n_used, n_used};
            float chosen = 0.0f;
            for (int k = 0; k < n_used; ++k) chosen += probs[size_t(order[size_t(k)])];
            for (int k = 0; k < n_used; ++k) {
                const float q = probs[size_t(order[size_t(k)])];
                out.set_id(k, order[size_t(k)]);
                out.weight(k) = (renormalize ? q / chosen : q) * p.expert_weights_scale *
                                (expert_scale ? expert_scale[order[size_t(k)]] : 1.0f);
            }
        }
    });
}

// The operands of an experts stage, as the experts rows read them.
struct ExpertOperands {
    const TensorRef &gate, &up, &down;
    int64_t K, ff, N;
    int n_used;
    int64_t expert_rows, up_offset;  // rows of one expert in the gate (and up) tensor; where its up rows start
    size_t gate_row, up_row, down_row;
    const float *gate_bias, *up_bias, *down_bias;  // operands 3-5 (F32), or null

    explicit ExpertOperands(const Stage& stage)
        : gate(*stage.operands[0]), up(*stage.operands[1]), down(*stage.operands[2]), K(stage.k), ff(stage.k2),
          N(stage.n), n_used(stage.params.n_expert_used) {
        // With expert_gate_up_merged, expert e's gate rows 2e*ff.., its up rows (2e+1)*ff...
        const bool merged = (stage.features & kExpertGateUpMerged) != 0;
        expert_rows = merged ? 2 * ff : ff;
        up_offset = merged ? ff : 0;
        gate_row = row_bytes(gate.format, K), up_row = row_bytes(up.format, K), down_row = row_bytes(down.format, ff);
        // Expert e's gate and up biases at e * ff, its down bias at e * N.
        const auto f32 = [&](size_t i) {
            return stage.operands.size() > i ? reinterpret_cast<const float*>(stage.operands[i]->data) : nullptr;
        };
        gate_bias = f32(3), up_bias = f32(4), down_bias = f32(5);
    }
};

// Rows of `len` values in q8_1 (quantize_q8_1's arrays), one after another.
struct Q8Rows {
    int64_t len;
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> sum16;
    Q8Rows(size_t rows, int64_t n) : len(n), q(rows * size_t(n)), d(rows * size_t(n / 32)), sum16(rows * size_t(n / 16)) {}
    void quantize(size_t row, const float* x) {
        quantize_q8_1(x, len, q.data() + row * size_t(len), d.data() + row * size_t(len / 32),
                      sum16.data() + row * size_t(len / 16));
    }
    Q8View view(size_t row) const {
        return {q.data() + row * size_t(len), d.data() + row * size_t(len / 32), sum16.data() + row * size_t(len / 16)};
    }
};

// The (token, chosen expert) slots of a call by expert: the experts that have slots (in index
// order), and each one's slots, in token order.
struct ExpertSlots {
    std::vector<int> experts;
    std::vector<std::vector<int64_t>> slots;  // of experts[i]
};
ExpertSlots slots_by_expert(const float* routing, int64_t n_tokens, int n_used, int n_expert) {
    std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(n_expert));
    for (int64_t s = 0; s < n_tokens * n_used; ++s)
        by_expert[size_t(RoutingRow{const_cast<float*>(routing) + (s / n_used) * 2 * n_used, n_used}.id(int(s % n_used)))]
            .push_back(s);
    ExpertSlots out;
    for (int e = 0; e < n_expert; ++e)
        if (!by_expert[size_t(e)].empty()) {
            out.experts.push_back(e);
            out.slots.push_back(std::move(by_expert[size_t(e)]));
        }
    return out;
}

// Per token, the weighted sum over its slots in routing order of each slot's down row (plus the
// shared expert's output with kSharedExpertSum).
template <class DownRow>
void weighted_sum(const Stage& stage, const KernelCall& call, const ExpertOperands& e, const DownRow& down_row) {
    const bool shared = (stage.features & kSharedExpertSum) != 0;
    cpu_state(call.backend_state).pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
        std::vector<const float*> rows(size_t(e.n_used));
        for (int64_t t = begin; t < end; ++t) {
            const RoutingRow routing{const_cast<float*>(call.in2) + t * 2 * e.n_used, e.n_used};
            for (int k = 0; k < e.n_used; ++k) rows[size_t(k)] = down_row(t * e.n_used + k);
            for (int64_t o = 0; o < e.N; ++o) {
                float sum = 0.0f;
                for (int k = 0; k < e.n_used; ++k) sum += routing.weight(k) * rows[size_t(k)][o];
                call.out[t * e.N + o] = shared ? sum + call.in3[t * e.N + o] : sum;
            }
        }
    });
}

// cpu.moe_experts_tiles and cpu.moe_experts_q8_tiles where their GEMM runs (f32: AVX-512 or
// AVX2; int8: AVX-512 VNNI or AVX2): the slots in expert order, each expert's gate, up and down rows
// decoded once per call into tiles and multiplied with all of its slots. Exact (Q8 false): rows dequantized exactly, f32 activations,
// f32 FMA chains (cpu/matmul_f32_gemm.h). Q8: x and each slot's activations rounded to q8_1 as in
// moe_experts_kernel, the int8 GEMM (cpu/matmul_q8_pack.h). The same products as the slot loop
// up to the order and rounding of the sums; the weighted sum is the same loop.
template <bool Q8>
void moe_experts_tiles(const Stage& stage, const KernelCall& call, const ExpertOperands& e,
                       const ExpertSlots& by_expert, ThreadPool& pool) {
    const StageParams& p = stage.params;
    const int64_t n_slots = call.n_tokens * e.n_used, n_experts = int64_t(by_expert.experts.size());
    const int64_t tile_rows = Q8 ? q8_gemm::kTileRows : f32_gemm::kTileRows;
    // Position of each slot in expert order; expert i's slots are positions start[i] .. start[i + 1] - 1.
    std::vector<int64_t> start(static_cast<size_t>(n_experts) + 1, 0), pos_of_slot(static_cast<size_t>(n_slots));
    std::vector<int32_t> token_at(static_cast<size_t>(n_slots));
    int64_t pos = 0;
    for (int64_t i = 0; i < n_experts; ++i) {
        start[size_t(i)] = pos;
        for (const int64_t slot : by_expert.slots[size_t(i)]) {
            pos_of_slot[size_t(slot)] = pos;
            token_at[size_t(pos++)] = int32_t(slot / e.n_used);
        }
    }
    start[size_t(n_experts)] = pos;
    // The inputs by position: q8_1-packed (Q8), or the tokens' rows gathered (exact).
    q8_gemm::Tokens xq, aq;
    std::vector<float> xg(Q8 ? 0 : size_t(n_slots * e.K));
    if constexpr (Q8) {
        xq.pack_rows(call.in, token_at.data(), n_slots, e.K, pool);
        q8_gemm::check(e.gate.format, e.K, xq);
        q8_gemm::check(e.up.format, e.K, xq);
    } else {
        pool.parallel_for(n_slots, [&](int64_t begin, int64_t end) {
            for (int64_t s = begin; s < end; ++s)
                std::copy(call.in + token_at[size_t(s)] * e.K, call.in + (token_at[size_t(s)] + 1) * e.K,
                          xg.data() + s * e.K);
        });
    }
    // Rows of W (row_bytes apart from w) times expert i's positions: their inputs x (the exact
    // tiles; rows of k by position) or the packed ones (Q8: aq for down, else xq).
    const auto tile = [&](Format format, const uint8_t* w, int64_t rows, int64_t k, bool down, const float* x,
                          int64_t i, const float* bias, float* y, int64_t y_stride) {
        const int64_t s0 = start[size_t(i)], count = start[size_t(i) + 1] - s0;
        if constexpr (Q8)
            q8_gemm::multiply_tile(format, w, rows, k, down ? aq : xq, s0, count, bias, y + s0 * y_stride, y_stride);
        else
            f32_gemm::multiply_tile(format, w, rows, k, x + s0 * k, k, count, bias, y + s0 * y_stride, y_stride);
    };
    // gate and up [positions][ff]: work items (expert, tile of ff rows, gate or up).
    std::vector<float> gate(size_t(n_slots * e.ff)), up(size_t(n_slots * e.ff));
    const int64_t ff_tiles = (e.ff + tile_rows - 1) / tile_rows;
    pool.parallel_for(n_experts * ff_tiles * 2, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
            const int64_t i = item / (2 * ff_tiles), n0 = (item / 2 % ff_tiles) * tile_rows;
            const bool is_up = item % 2 == 1;
            const int64_t ex = by_expert.experts[size_t(i)], rows = std::min(tile_rows, e.ff - n0);
            const TensorRef& w = is_up ? e.up : e.gate;
            const int64_t row = ex * e.expert_rows + (is_up ? e.up_offset : 0) + n0;
            const float* bias = is_up ? e.up_bias : e.gate_bias;
            tile(w.format, w.data + size_t(row) * (is_up ? e.up_row : e.gate_row), rows, e.K, false, xg.data(), i,
                 bias ? bias + ex * e.ff + n0 : nullptr, (is_up ? up : gate).data() + n0, e.ff);
        }
    });
    pool.parallel_for(n_slots, [&](int64_t begin, int64_t end) {
        float* g = gate.data() + begin * e.ff;
        activate_span(p.activation, g, up.data() + begin * e.ff, g, (end - begin) * e.ff, p.swiglu_alpha, p.swiglu_limit);
    });
    if constexpr (Q8) {
        aq.pack(gate.data(), n_slots, e.ff, pool);
        q8_gemm::check(e.down.format, e.ff, aq);
    }
    // down [positions][N], its bias added: work items (expert, tile of N rows).
    std::vector<float> down(size_t(n_slots * e.N));
    const int64_t n_tiles = (e.N + tile_rows - 1) / tile_rows;
    pool.parallel_for(n_experts * n_tiles, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
            const int64_t i = item / n_tiles, n0 = (item % n_tiles) * tile_rows;
            const int64_t ex = by_expert.experts[size_t(i)], rows = std::min(tile_rows, e.N - n0);
            tile(e.down.format, e.down.data + size_t(ex * e.N + n0) * e.down_row, rows, e.ff, true, gate.data(), i,
                 e.down_bias ? e.down_bias + ex * e.N + n0 : nullptr, down.data() + n0, e.N);
        }
    });
    weighted_sum(stage, call, e, [&](int64_t slot) { return down.data() + pos_of_slot[size_t(slot)] * e.N; });
}

// cpu.moe_experts (Q8 false), cpu.moe_experts_q8 and, without the GEMM, cpu.moe_experts_q8_tiles: for each slot s = token * n_used + k, the
// chosen expert's activations act(gate_e x) * up_e x (ff values), then down_e of them plus its
// bias, and per token the weighted sum over its slots in routing order. With Q8 the tokens' x and
// then each slot's activations are rounded to q8_1 before their products. The work goes expert
// by expert, row by row, each row's products with every slot of that expert taken while the row
// is in cache (a prompt's experts are read once, not once per slot); every product is the same
// dot whatever the call's other tokens, so a prompt gives the values of its tokens one by one.
template <bool Q8, bool Tiles>
void moe_experts_kernel(const Stage& stage, const KernelCall& call) {
    const ExpertOperands e(stage);
    const StageParams& p = stage.params;
    ThreadPool& pool = cpu_state(call.backend_state).pool;
    const int64_t n_slots = call.n_tokens * e.n_used;
    const ExpertSlots by_expert = slots_by_expert(call.in2, call.n_tokens, e.n_used, p.n_expert);
    if constexpr (Tiles) {
        if constexpr (Q8) {
            if (q8_gemm::runs(e.gate.format) && q8_gemm::runs(e.up.format) && q8_gemm::runs(e.down.format))
                return moe_experts_tiles<true>(stage, call, e, by_expert, pool);
        } else if (f32_gemm::runs()) {
            return moe_experts_tiles<false>(stage, call, e, by_expert, pool);
        }
    }
    const int64_t n_experts = int64_t(by_expert.experts.size());
    Q8Rows xq(Q8 ? size_t(call.n_tokens) : 0, e.K), aq(Q8 ? size_t(n_slots) : 0, e.ff);
    if constexpr (Q8)
        pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
            for (int64_t t = begin; t < end; ++t) xq.quantize(size_t(t), call.in + t * e.K);
        });
    const auto gate_up_dot = [&](Format format, const uint8_t* row, int64_t slot) {
        const int64_t t = slot / e.n_used;
        if constexpr (Q8) return dot_row_q8_1(format, row, xq.view(size_t(t)), e.K);
        else return dot_row(format, row, call.in + t * e.K, e.K);
    };
    // act [slots][ff]: work items (expert with slots, row of ff).
    std::vector<float> act(size_t(n_slots) * size_t(e.ff));
    pool.parallel_for(n_experts * e.ff, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int ex = by_expert.experts[size_t(i / e.ff)];
            const int64_t r = i % e.ff, row = int64_t(ex) * e.expert_rows + r, bias_at = int64_t(ex) * e.ff + r;
            const uint8_t* gate_row = e.gate.data + size_t(row) * e.gate_row;
            const uint8_t* up_row = e.up.data + size_t(row + e.up_offset) * e.up_row;
            for (const int64_t slot : by_expert.slots[size_t(i / e.ff)]) {
                const float g = gate_up_dot(e.gate.format, gate_row, slot) + (e.gate_bias ? e.gate_bias[bias_at] : 0.0f);
                const float u = gate_up_dot(e.up.format, up_row, slot) + (e.up_bias ? e.up_bias[bias_at] : 0.0f);
                act[size_t(slot * e.ff + r)] = gated_activation(p.activation, g, u, p.swiglu_alpha, p.swiglu_limit);
            }
        }
    });
    if constexpr (Q8)
        pool.parallel_for(n_slots, [&](int64_t begin, int64_t end) {
            for (int64_t s = begin; s < end; ++s) aq.quantize(size_t(s), act.data() + s * e.ff);
        });
    // down [slots][N], its bias added: work items (expert with slots, row of N).
    std::vector<float> down(size_t(n_slots) * size_t(e.N));
    pool.parallel_for(n_experts * e.N, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int ex = by_expert.experts[size_t(i / e.N)];
            const int64_t o = i % e.N, row = int64_t(ex) * e.N + o;
            const uint8_t* down_row = e.down.data + size_t(row) * e.down_row;
            for (const int64_t slot : by_expert.slots[size_t(i / e.N)]) {
                float v;
                if constexpr (Q8) v = dot_row_q8_1(e.down.format, down_row, aq.view(size_t(slot)), e.ff);
                else v = dot_row(e.down.format, down_row, act.data() + slot * e.ff, e.ff);
                down[size_t(slot * e.N + o)] = v + (e.down_bias ? e.down_bias[row] : 0.0f);
            }
        }
    });
    weighted_sum(stage, call, e, [&](int64_t slot) { return down.data() + slot * e.N; });
}

void moe_shared_gate_kernel(const Stage& stage, const KernelCall& call) {
    const TensorRef* w = stage.operands.empty() ? nullptr : stage.operands[0];
    const int64_t N = stage.n;
    cpu_state(call.backend_state).pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float g = w ? 1.0f / (1.0f + std::exp(-dot_row(w->format, w->data, call.in3 + t * stage.k, stage.k)))
                              : 1.0f;
            for (int64_t o = 0; o < N; ++o) call.out[t * N + o] = call.in[t * N + o] + g * call.in2[t * N + o];
        }
    });
}

std::vector<Format> every_format() {
    std::vector<Format> formats;
    for (const FormatInfo& info : all_formats()) formats.push_back(info.format);
    return formats;
}

int64_t block_multiple(Format format) { return format_info(format).block_elems; }

}  // namespace

void add_cpu_moe_rows(std::vector<Row>& rows) {
    const std::vector<Format> formats = every_format();
    Row route;
    route.kernel = "cpu.moe_route";
    route.op = Op::MoeRoute;
    route.backend = Backend::CPU;
    route.operand_formats = {formats, {Format::F32}, {Format::F32}, {Format::F32}};
    route.features = kExpertSoftmax | kExpertSigmoid | kExpertGroups | kExpertChoiceBias | kExpertWeightsNorm |
                     kExpertLogitScale | kPerExpertScale | kBias;
    route.dims.k_multiple_of = &block_multiple;
    route.launches = {"moe_route"};
    route.fn = moe_route_kernel;
    rows.push_back(route);
    Row experts;
    experts.kernel = "cpu.moe_experts";
    experts.op = Op::MoeExperts;
    experts.backend = Backend::CPU;
    experts.operand_formats = {formats, formats, formats, {Format::F32}, {Format::F32}, {Format::F32}};
    experts.features = kSilu | kGeluTanh | kGeluErf | kRelu | kSwigluOai | kGated | kExpertGateUpMerged | kBias |
                       kSharedExpertSum;
    experts.dims.k_multiple_of = &block_multiple;  // K (gate, up) and the FFN width (down)
    experts.launches = {"moe_experts"};
    // cpu.moe_experts takes one token (each chosen expert's rows against its one slot: dot_row),
    // cpu.moe_experts_tiles any count (each expert's rows decoded once into the f32 GEMM's tiles
    // for all of its slots where the CPU has AVX-512 or AVX2, else the same slot loop).
    for (const bool one_token : {true, false}) {
        Row row = experts;
        row.kernel = one_token ? "cpu.moe_experts" : "cpu.moe_experts_tiles";
        row.tokens = {1, one_token ? 1 : 0};
        row.priority = one_token ? 1 : 0;
        row.fn = one_token ? moe_experts_kernel<false, false> : moe_experts_kernel<false, true>;
        rows.push_back(row);
    }
    // q8_1 activations: preferred where the plan rounds activations to q8_1 and every expert
    // matrix is a format with integer products.
    std::vector<Format> q8;
#define KCAP_CPU_Q8_FORMAT(NAME, DECODER) q8.push_back(Format::NAME);
    KCAP_Q8_WEIGHT_FORMATS(KCAP_CPU_Q8_FORMAT)
#undef KCAP_CPU_Q8_FORMAT
    // cpu.moe_experts_q8 takes one token (each chosen expert's rows against its one slot, read as
    // they are decoded: dot_row_q8_1), cpu.moe_experts_q8_tiles any count (each expert's rows
    // decoded once for all its slots into the int8 GEMM's tiles where the CPU has AVX-512 VNNI
    // or AVX2, else the same slot products as the one-token row), as cpu.matvec_q8 and cpu.matmul_q8 do.
    for (const bool one_token : {true, false}) {
        Row experts_q8 = experts;
        experts_q8.kernel = one_token ? "cpu.moe_experts_q8" : "cpu.moe_experts_q8_tiles";
        experts_q8.operand_formats = {q8, q8, q8, {Format::F32}, {Format::F32}, {Format::F32}};
        experts_q8.input_encoding = Encoding::Q8_1;
        experts_q8.tokens = {1, one_token ? 1 : 0};
        experts_q8.priority = one_token ? 2 : 1;
        experts_q8.fn = one_token ? moe_experts_kernel<true, false> : moe_experts_kernel<true, true>;
        rows.push_back(experts_q8);
    }
    Row shared;
    shared.kernel = "cpu.moe_shared_gate";
    shared.op = Op::MoeSharedGate;
    shared.backend = Backend::CPU;
    shared.operand_formats = {formats};
    shared.features = kSharedExpertGate;
    shared.dims.k_multiple_of = &block_multiple;
    shared.launches = {"moe_shared_gate"};
    shared.fn = moe_shared_gate_kernel;
    rows.push_back(shared);
}

}  // namespace kcap
