// Mixture-of-experts bodies with q8_1 activations (the cuda.moe_experts_q8.<format> rows; the
// plan's activations = "q8_1"), kernels/moe.h's slot matvecs on kernels/matvec_q8.h's dp4a walk:
//   kcap_moe_gate_up_q8  act(gate_e q8_1(x)) * up_e q8_1(x) of one (token, chosen expert) slot per
//                        grid row, each group rounding the token's x as it stages it
//   kcap_moe_down_q8     down_e q8_1(act) of the slot, each group rounding the slot's ff
//                        activations as it stages them
// The weighted sum is kcap_moe_combine's. The twin on the CPU is cpu.moe_experts_q8 (the same
// roundings: x per token, the activations per slot, both round_q8_1).
#pragma once

#include "kernels/matvec_q8.h"
#include "kernels/moe.h"

// kcap_matvec_q8 moves x and y by group_y (one grid row per token); here grid row group_y is a
// slot, whose x and output the callers find themselves.
KCAP_FN KcapThread kcap_moe_q8_row(const KcapThread t) {
    KcapThread row = t;
    row.group_y = 0;
    return row;
}

// Grid: x = the matvec's row groups over ff, y = n_tokens * n_used slots. p: the gate matvec (k =
// moe.k, n = moe.ff, the gate's and up's row bytes). act: [slots][ff]. gate_bias, up_bias
// ([n_expert][ff], or null): the experts' biases (gpt-oss). shared: matvec_q8_shared_words.
template <class F, int ROWS, bool TEAMS>
KCAP_FN void kcap_moe_gate_up_q8(const KcapThread t, const KcapMoeParams moe, const KcapMatmulParams p, const KcapMatvecTeams teams,
                                 int chunk_runs, const KCAP_GLOBAL kcap_u8* gate, const KCAP_GLOBAL kcap_u8* up,
                                 const KCAP_GLOBAL float* routing, const KCAP_GLOBAL float* x, int activation,
                                 KCAP_GLOBAL float* act, KCAP_SHARED kcap_i32* shared,
                                 const KCAP_GLOBAL float* gate_bias = nullptr, const KCAP_GLOBAL float* up_bias = nullptr) {
    const KcapMoeGateUpRows r = kcap_moe_gate_up_rows(moe, p, routing, int(t.group_y));
    // The expert's rows are known only from the Routing buffer: asked for before x is staged.
    kcap_matvec_split_prefetch<ROWS, TEAMS>(t, p, teams, gate + r.gate);
    kcap_matvec_split_prefetch<ROWS, TEAMS>(t, p, teams, up + r.up);
    kcap_matvec_q8<F, ROWS, KCAP_MATVEC_GATE_UP, TEAMS>(
        kcap_moe_q8_row(t), p, teams, chunk_runs, gate + r.gate, up + r.up, x + kcap_u64(r.token) * kcap_u64(moe.k),
        nullptr, nullptr, nullptr, gate_bias ? gate_bias + r.bias : nullptr, activation,
        act + kcap_u64(t.group_y) * kcap_u64(moe.ff), shared, up_bias ? up_bias + r.bias : nullptr, moe.swiglu_alpha,
        moe.swiglu_limit);
}

// Grid: x = the matvec's row groups over n, y = slots. p: the down matvec (k = moe.ff, n = moe.n,
// the down matrix's row bytes; has_bias with down_bias). down_out: [slots][n]. down_bias
// ([n_expert][n], or null): the experts' down biases, added before the combine weighs the slot.
template <class F, int ROWS, bool TEAMS>
KCAP_FN void kcap_moe_down_q8(const KcapThread t, const KcapMoeParams moe, const KcapMatmulParams p, const KcapMatvecTeams teams,
                              int chunk_runs, const KCAP_GLOBAL kcap_u8* down, const KCAP_GLOBAL float* routing,
                              const KCAP_GLOBAL float* act, KCAP_GLOBAL float* down_out, KCAP_SHARED kcap_i32* shared,
                              const KCAP_GLOBAL float* down_bias = nullptr) {
    const KcapMoeSlot s = kcap_moe_slot(moe, routing, int(t.group_y));
    const kcap_u64 expert = kcap_u64(s.expert) * kcap_u64(moe.n) * p.row_bytes;
    kcap_matvec_split_prefetch<ROWS, TEAMS>(t, p, teams, down + expert);
    kcap_matvec_q8<F, ROWS, KCAP_MATVEC_PLAIN, TEAMS>(kcap_moe_q8_row(t), p, teams, chunk_runs, down + expert, down + expert,
                                               act + kcap_u64(t.group_y) * kcap_u64(moe.ff), nullptr, nullptr, nullptr,
                                               down_bias ? down_bias + kcap_u64(s.expert) * kcap_u64(moe.n) : nullptr,
                                               0, down_out + kcap_u64(t.group_y) * kcap_u64(moe.n), shared);
}
