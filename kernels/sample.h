// Top-k sampling of one row of logits on the device, in two passes, so a captured decode graph
// can sample token after token with no host work (as kernels/argmax.h does for greedy):
//   pass 1 (kcap_sample_partial): each group takes KCAP_SAMPLE_CHUNK logits and finds its k
//     largest, one group-wide argmax per round (ties to the lower index, as numpy and argmax.h);
//   pass 2 (kcap_sample_final): one group picks the k largest of all groups' candidates, then
//     thread 0 applies softmax -> top-p -> min-p -> temperature -> renormalize -> draw, the
//     stage order of kcap.sampling and llama.cpp's sampler chain (python/kcap/sampling.py,
//     after its top-k): top-p and min-p cut at temperature 1.
// The draw's uniform number is a counter-based hash of (seed, position), so a step replayed at
// the same position with the same seed draws the same token. Settings (temperature, top-k,
// top-p, min-p, seed) are read from device memory.
#pragma once

#include "kernels/argmax.h"
#include "kernels/sample_uniform.h"

// k rounds over the candidates the group's threads hold (value[j], index[j]): each round the
// group's largest goes to out_value/out_index[round] (threadgroup memory) and is taken out.
// Rounds past the last finite candidate give (-inf, 2147483647).
KCAP_FN void kcap_sample_select(const KcapThread t, int k, KCAP_PRIVATE float* value, KCAP_PRIVATE int* index,
                                KCAP_SHARED float* out_value, KCAP_SHARED int* out_index,
                                KCAP_SHARED float* scratch_value, KCAP_SHARED int* scratch_index) {
    for (int round = 0; round < k; ++round) {
        float best = KCAP_NEG_INFINITY;
        int best_index = 2147483647;
        KCAP_UNROLL for (int j = 0; j < KCAP_SAMPLE_PER_THREAD; ++j) kcap_argmax_pick(&best, &best_index, value[j], index[j]);
        kcap_argmax_group(t, &best, &best_index, scratch_value, scratch_index);
        if (t.index == 0) {
            out_value[round] = best;
            out_index[round] = best_index;
        }
        kcap_barrier();
        const int taken = out_index[round];
        KCAP_UNROLL for (int j = 0; j < KCAP_SAMPLE_PER_THREAD; ++j) {
            if (index[j] == taken) {
                value[j] = KCAP_NEG_INFINITY;
                index[j] = 2147483647;
            }
        }
        kcap_barrier();  // scratch is rewritten by the next round
    }
}

// Pass 1. Grid: x = n_partials; KCAP_SAMPLE_THREADS threads; shared: 2 * (KCAP_SAMPLE_MAX_TOP_K
// + 32) words. Writes group g's top k to partial_value/index[g * k ..].
KCAP_FN void kcap_sample_partial(const KcapThread t, const KcapSampleParams p, const KCAP_GLOBAL KcapSampleSettings* settings,
                                 const KCAP_GLOBAL float* logits, KCAP_GLOBAL float* partial_value,
                                 KCAP_GLOBAL kcap_i32* partial_index, KCAP_SHARED float* top_value,
                                 KCAP_SHARED int* top_index, KCAP_SHARED float* scratch_value,
                                 KCAP_SHARED int* scratch_index) {
    const int k = settings->top_k;
    const int begin = int(t.group_x) * KCAP_SAMPLE_CHUNK;
    float value[KCAP_SAMPLE_PER_THREAD];
    int index[KCAP_SAMPLE_PER_THREAD];
    KCAP_UNROLL for (int j = 0; j < KCAP_SAMPLE_PER_THREAD; ++j) {
        const int i = begin + j * int(t.threads) + int(t.index);
        const float v = i < p.count ? logits[i] : KCAP_NEG_INFINITY;
        const bool usable = v == v;  // NaN is never a candidate
        value[j] = usable ? v : KCAP_NEG_INFINITY;
        index[j] = usable && i < p.count ? i : 2147483647;
    }
    kcap_sample_select(t, k, value, index, top_value, top_index, scratch_value, scratch_index);
    for (int r = int(t.index); r < k; r += int(t.threads)) {
        partial_value[int(t.group_x) * k + r] = top_value[r];
        partial_index[int(t.group_x) * k + r] = top_index[r];
    }
}

// Pass 2. Grid: x = 1; as pass 1. The drawn token goes to result[0]; with advance, also to
// tokens[0] (the next input) and history[step[1]], and step moves on by one token.
KCAP_FN void kcap_sample_final(const KcapThread t, const KcapSampleParams p, const KCAP_GLOBAL KcapSampleSettings* settings,
                               const KCAP_GLOBAL float* partial_value, const KCAP_GLOBAL kcap_i32* partial_index,
                               KCAP_GLOBAL kcap_i32* result, KCAP_GLOBAL kcap_i32* tokens, KCAP_GLOBAL kcap_i32* step,
                               KCAP_GLOBAL kcap_i32* history, KCAP_SHARED float* top_value, KCAP_SHARED int* top_index,
                               KCAP_SHARED float* scratch_value, KCAP_SHARED int* scratch_index) {
    const int k = settings->top_k;
    const int candidates = p.n_partials * k;
    float value[KCAP_SAMPLE_PER_THREAD];
    int index[KCAP_SAMPLE_PER_THREAD];
    KCAP_UNROLL for (int j = 0; j < KCAP_SAMPLE_PER_THREAD; ++j) {
        const int i = j * int(t.threads) + int(t.index);
        value[j] = i < candidates ? partial_value[i] : KCAP_NEG_INFINITY;
        index[j] = i < candidates ? partial_index[i] : 2147483647;
    }
    kcap_sample_select(t, k, value, index, top_value, top_index, scratch_value, scratch_index);
    if (t.index != 0) return;
    // top_value[0 .. k) is sorted, largest first. Softmax at temperature 1 over the candidates
    // (absent ones, index 2147483647, weigh 0) for the top-p and min-p cuts.
    const float top = top_value[0];
    float total = 0.0f;
    for (int r = 0; r < k; ++r) total += top_index[r] == 2147483647 ? 0.0f : kcap_exp(top_value[r] - top);
    // top-p: the smallest prefix whose probability reaches top_p; min-p: p >= min_p * p_max.
    int kept = 0;
    float cumulative = 0.0f;
    for (int r = 0; r < k; ++r) {
        const float prob = (top_index[r] == 2147483647 ? 0.0f : kcap_exp(top_value[r] - top)) / total;
        if (prob <= 0.0f || (r > 0 && cumulative >= settings->top_p) || prob < settings->min_p * (kcap_exp(0.0f) / total)) break;
        cumulative += prob;
        kept = r + 1;
    }
    // The temperature shapes the draw among the kept candidates, kept in top_value as weights.
    const float inv_t = 1.0f / settings->temperature;
    float kept_total = 0.0f;
    for (int r = 0; r < kept; ++r) {
        top_value[r] = kcap_exp((top_value[r] - top) * inv_t);
        kept_total += top_value[r];
    }
    const int position = step[0];
    const float target = kcap_sample_uniform(settings->seed, position) * kept_total;
    int chosen = kept > 0 ? top_index[kept - 1] : 0;  // rounding: the last kept candidate
    float running = 0.0f;
    for (int r = 0; r < kept; ++r) {
        running += top_value[r];
        if (target < running) {
            chosen = top_index[r];
            break;
        }
    }
    result[0] = chosen;
    if (p.advance) {
        tokens[0] = chosen;
        history[step[1]] = chosen;
        step[0] += 1;
        step[1] += 1;
    }
}
