// Internal to cpp/core: the per-format dispatch of an ISA build of dot_row and dot_row_q8_1,
// included by formats_dot_x86.h and formats_dot_neon.h inside their namespace (KCAP_DOT_NS),
// after their kernels: each build defines the same kernel names (dot_f32 ... dot_q6_k) for f32
// activations and for q8_1 runs, so the formats are listed once, here.
// KCAP_DOT_Q8_ONLY 1: a build with q8_1 kernels only (the SDOT build); no dot_row.
// No #pragma once: each ISA build includes it in its own namespace.

#if !defined(KCAP_DOT_Q8_ONLY) || !KCAP_DOT_Q8_ONLY
float dot_row(Format format, const void* src, const float* x, int64_t n_elems) {
    const auto* bytes = static_cast<const uint8_t*>(src);
    const int64_t n_qk = n_elems / kQK, n_qk_k = n_elems / kQK_K;
    switch (format) {
        case Format::F32: return dot_f32(bytes, x, n_elems);
        case Format::F16: return dot_f16(bytes, x, n_elems);
        case Format::BF16: return dot_bf16(bytes, x, n_elems);
        case Format::Q4_0: return dot_q4_0(static_cast<const BlockQ4_0*>(src), x, n_qk);
        case Format::Q4_1: return dot_q4_1(static_cast<const BlockQ4_1*>(src), x, n_qk);
        case Format::Q5_0: return dot_q5_0(static_cast<const BlockQ5_0*>(src), x, n_qk);
        case Format::Q5_1: return dot_q5_1(static_cast<const BlockQ5_1*>(src), x, n_qk);
        case Format::Q8_0: return dot_q8_0(static_cast<const BlockQ8_0*>(src), x, n_qk);
        case Format::MXFP4: return dot_mxfp4(static_cast<const BlockMXFP4*>(src), x, n_qk);
        case Format::Q2_K: return dot_q2_k(static_cast<const BlockQ2_K*>(src), x, n_qk_k);
        case Format::Q3_K: return dot_q3_k(static_cast<const BlockQ3_K*>(src), x, n_qk_k);
        case Format::Q4_K: return dot_k4<BlockQ4_K, false>(static_cast<const BlockQ4_K*>(src), x, n_qk_k);
        case Format::Q5_K: return dot_k4<BlockQ5_K, true>(static_cast<const BlockQ5_K*>(src), x, n_qk_k);
        case Format::Q6_K: return dot_q6_k(static_cast<const BlockQ6_K*>(src), x, n_qk_k);
    }
    return 0.0f;  // unreachable: the caller validated the format
}
#endif

float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems) {
    const Q8Run run{x};
    const int64_t n_qk = n_elems / kQK, n_qk_k = n_elems / kQK_K;
    switch (format) {
        case Format::Q4_0: return dot_q4_0(static_cast<const BlockQ4_0*>(src), run, n_qk);
        case Format::Q4_1: return dot_q4_1(static_cast<const BlockQ4_1*>(src), run, n_qk);
        case Format::Q5_0: return dot_q5_0(static_cast<const BlockQ5_0*>(src), run, n_qk);
        case Format::Q5_1: return dot_q5_1(static_cast<const BlockQ5_1*>(src), run, n_qk);
        case Format::Q8_0: return dot_q8_0(static_cast<const BlockQ8_0*>(src), run, n_qk);
        case Format::MXFP4: return dot_mxfp4(static_cast<const BlockMXFP4*>(src), run, n_qk);
        case Format::Q2_K: return dot_q2_k(static_cast<const BlockQ2_K*>(src), run, n_qk_k);
        case Format::Q3_K: return dot_q3_k(static_cast<const BlockQ3_K*>(src), run, n_qk_k);
        case Format::Q4_K: return dot_k4<BlockQ4_K, false>(static_cast<const BlockQ4_K*>(src), run, n_qk_k);
        case Format::Q5_K: return dot_k4<BlockQ5_K, true>(static_cast<const BlockQ5_K*>(src), run, n_qk_k);
        case Format::Q6_K: return dot_q6_k(static_cast<const BlockQ6_K*>(src), run, n_qk_k);
        default: break;
    }
    // Formats without a q8_1 path here take the portable one: no std::string or exception code
    // is emitted by these kernels, which are compiled for wider instructions than the baseline
    // (an inline copy of it could be the one the linker keeps for every file, on a CPU without
    // those instructions).
    return portable::dot_row_q8_1(format, src, x, n_elems);
}
