// Rotary position embedding of Q and K in place. Normal style rotates adjacent pairs
// (x[2i], x[2i+1]); NeoX rotates halves (x[i], x[i + rope_dim/2]); dims past rope_dim stay.
// Angles are not computed here: cos/sin come from a table the host filled in double precision
// exactly as the CPU reference does ([n_ctx][rope_dim/2] of (cos, sin)), so every backend
// rotates by bit-identical factors. Positions are read from device memory (step[0] is the
// position of token 0) so one captured decode graph serves every position.
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

// One thread per (token, head, pair). Grid: x = ceil(total / threads), total = n_tokens *
// (n_head + n_head_kv) * rope_dim / 2.
KCAP_FN void kcap_rope(const KcapThread t, const KcapRopeParams p, const KCAP_GLOBAL kcap_i32* step,
                       const KCAP_GLOBAL float2* cos_sin, KCAP_GLOBAL float* q, KCAP_GLOBAL float* k) {
    const int pairs = p.rope_dim / 2;
    const int heads = p.n_head + p.n_head_kv;
    const kcap_u64 index = kcap_u64(t.group_x) * t.threads + t.index;
    if (index >= kcap_u64(p.n_tokens) * heads * pairs) return;
    const int i = int(index % pairs);
    const int h = int((index / pairs) % heads);
    const int m = int(index / (kcap_u64(pairs) * heads));
    KCAP_GLOBAL float* x = h < p.n_head ? q + (kcap_u64(m) * p.n_head + h) * p.head_dim
                                        : k + (kcap_u64(m) * p.n_head_kv + (h - p.n_head)) * p.head_dim;
    const float2 cs = cos_sin[kcap_u64(step[0] + m) * pairs + i];
    const int a = p.neox ? i : 2 * i;
    const int b = p.neox ? i + pairs : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs.x - x1 * cs.y;
    x[b] = x0 * cs.y + x1 * cs.x;
}
