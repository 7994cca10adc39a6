// Greedy argmax over one row of logits, on the device, in two passes: each group of the first
// pass reduces a chunk to (value, index); one group reduces the partials. Ties go to the lower
// index (numpy's argmax). The second pass can feed the winner back as the next token and move
// the position on, so a captured decode graph replays token after token with no host work.
//
// Device state of the decode graph (step): step[0] position of the next token,
// step[1] number of tokens generated so far (the history index).
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

KCAP_FN void kcap_argmax_pick(KCAP_PRIVATE float* value, KCAP_PRIVATE int* index, float other_value, int other_index) {
    if (other_value > *value || (other_value == *value && other_index < *index)) {
        *value = other_value;
        *index = other_index;
    }
}

// Reduces (value, index) over the group; thread 0 gets the winner. scratch: 2 words per simd.
KCAP_FN void kcap_argmax_group(const KcapThread t, KCAP_PRIVATE float* value, KCAP_PRIVATE int* index,
                               KCAP_SHARED float* scratch_value, KCAP_SHARED int* scratch_index) {
    for (int offset = KCAP_SIMD_WIDTH / 2; offset > 0; offset >>= 1) {
        const float v = kcap_simd_shuffle_xor(*value, offset);
        const int i = kcap_simd_shuffle_xor(*index, offset);
        kcap_argmax_pick(value, index, v, i);
    }
    if (t.lane == 0) {
        scratch_value[t.simd] = *value;
        scratch_index[t.simd] = *index;
    }
    kcap_barrier();
    if (t.index == 0)
        for (unsigned s = 1; s < t.simds; ++s) kcap_argmax_pick(value, index, scratch_value[s], scratch_index[s]);
}

// First pass. Grid: x = n_partials.
KCAP_FN void kcap_argmax_partial(const KcapThread t, const KcapArgmaxParams p, const KCAP_GLOBAL float* logits,
                                 KCAP_GLOBAL float* partial_value, KCAP_GLOBAL kcap_i32* partial_index,
                                 KCAP_SHARED float* scratch_value, KCAP_SHARED int* scratch_index) {
    const int begin = int(t.group_x) * p.chunk;
    const int end = begin + p.chunk < p.count ? begin + p.chunk : p.count;
    float value = KCAP_NEG_INFINITY;
    int index = 2147483647;
    for (int i = begin + int(t.index); i < end; i += int(t.threads)) kcap_argmax_pick(&value, &index, logits[i], i);
    kcap_argmax_group(t, &value, &index, scratch_value, scratch_index);
    if (t.index == 0) {
        partial_value[t.group_x] = value;
        partial_index[t.group_x] = index;
    }
}

// Second pass. Grid: x = 1. Writes the winner to result[0]; with advance, also to
// tokens[0] (the next input), history[step[1]], and moves step on by one token.
KCAP_FN void kcap_argmax_final(const KcapThread t, const KcapArgmaxParams p, const KCAP_GLOBAL float* partial_value,
                               const KCAP_GLOBAL kcap_i32* partial_index, KCAP_GLOBAL kcap_i32* result,
                               KCAP_GLOBAL kcap_i32* tokens, KCAP_GLOBAL kcap_i32* step, KCAP_GLOBAL kcap_i32* history,
                               KCAP_SHARED float* scratch_value, KCAP_SHARED int* scratch_index) {
    float value = KCAP_NEG_INFINITY;
    int index = 2147483647;
    for (int i = int(t.index); i < p.n_partials; i += int(t.threads))
        kcap_argmax_pick(&value, &index, partial_value[i], partial_index[i]);
    kcap_argmax_group(t, &value, &index, scratch_value, scratch_index);
    if (t.index == 0) {
        // All logits NaN leaves no winner: report token 0 rather than an out-of-range id.
        const int winner = index == 2147483647 ? 0 : index;
        result[0] = winner;
        if (p.advance) {
            tokens[0] = winner;
            history[step[1]] = winner;
            step[0] += 1;
            step[1] += 1;
        }
    }
}
