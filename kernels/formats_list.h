// The weight formats the GPU rows decode, as one X-macro: X(kcap::Format enumerator, decoder
// struct in kernels/quant.h). Plain preprocessor text, so host code that only declares rows
// (cuda/rows.cpp) can expand it without pulling in any kernel code.
#pragma once

#define KCAP_WEIGHT_FORMATS(X) \
    X(F32, KcapF32)            \
    X(F16, KcapF16)            \
    X(BF16, KcapBF16)          \
    X(Q4_0, KcapQ4_0)          \
    X(Q4_1, KcapQ4_1)          \
    X(Q5_0, KcapQ5_0)          \
    X(Q5_1, KcapQ5_1)          \
    X(Q8_0, KcapQ8_0)          \
    X(Q2_K, KcapQ2_K)          \
    X(Q3_K, KcapQ3_K)          \
    X(Q4_K, KcapQ4_K)          \
    X(Q5_K, KcapQ5_K)          \
    X(Q6_K, KcapQ6_K)          \
    X(MXFP4, KcapMXFP4)

// The formats with q8_1-activation rows (cuda.matmul_q8.*, cuda.gate_up_q8.*): those whose
// weights are int8 codes (KcapCodes<F>::codes8 in kernels/quant_codes.h, which checks this list
// against itself: has_codes8); the float formats keep their f32 rows.
#define KCAP_Q8_WEIGHT_FORMATS(X) \
    X(Q4_0, KcapQ4_0)             \
    X(Q4_1, KcapQ4_1)             \
    X(Q5_0, KcapQ5_0)             \
    X(Q5_1, KcapQ5_1)             \
    X(Q8_0, KcapQ8_0)             \
    X(Q2_K, KcapQ2_K)             \
    X(Q3_K, KcapQ3_K)             \
    X(Q4_K, KcapQ4_K)             \
    X(Q5_K, KcapQ5_K)             \
    X(Q6_K, KcapQ6_K)             \
    X(MXFP4, KcapMXFP4)
