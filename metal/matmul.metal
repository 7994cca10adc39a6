// Metal entry points of the exact matmul rows (metal.matmul.<format>) and the fused gate_up
// rows (metal.gate_up.<format>): the bodies cuda.matmul.* / cuda.gate_up.* run, one
// instantiation per format of KCAP_WEIGHT_FORMATS under the names metal/rows.cpp declares.
// One token: kcap_matvec_staged (kernels/matvec.h), x staged in threadgroup memory whose
// length the host sets (metal_rows::matvec_shared_floats; split and chunk chosen by the host,
// metal_rows::matvec_split); plain (y = W x + bias) or gate_up (act(W_gate x) * (W_up x)).
// More tokens: the few-token walk (each decoded run of weights reused for kTokensPerPass tokens).
#include "kernels/matmul.h"
#include "kernels/matvec.h"
#include "metal/rows.h"

using namespace kcap::metal_rows;

static_assert(kSimdWidth == KCAP_SIMD_WIDTH, "the host checks pipelines against metal_rows::kSimdWidth");
static_assert(kMatvecRunStride == KCAP_MATVEC_RUN_STRIDE, "the host sizes threadgroup memory with kMatvecRunStride");

// Grid: x = ceil(n / ((kMatvecSimds / split) * kMatvecRows)), y = 1; kMatvecSimds * 32 threads;
// threadgroup memory 0: matvec_shared_floats(k) floats. MODE KCAP_MATVEC_PLAIN reads w0 and
// bias (w1 is bound to w0, unread); KCAP_MATVEC_GATE_UP reads w0 = gate, w1 = up (bias unread).
template <class F, int MODE>
kernel void kcap_matvec_staged_entry(constant KcapMatmulParams& p [[buffer(0)]],
                                     constant KcapMetalMatvecArgs& a [[buffer(1)]],
                                     device const kcap_u8* w0 [[buffer(2)]], device const kcap_u8* w1 [[buffer(3)]],
                                     device const float* x [[buffer(4)]], device const float* bias [[buffer(5)]],
                                     device float* y [[buffer(6)]],
                                     threadgroup float* shared KCAP_METAL_THREADGROUP_INDEX(0), KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_matvec_staged<F, kMatvecRows, MODE, false>(t, p, kcap_matvec_parts(a.split), a.chunk_runs, w0, w1, x, bias, a.activation, y, shared);
}

// Grid: x = ceil(n / (kTokensSimds * kTokensRows)), y = ceil(m / kTokensPerPass); kTokensSimds * 32 threads.
template <class F>
kernel void kcap_matmul_tokens_entry(constant KcapMatmulParams& p [[buffer(0)]], device const kcap_u8* w [[buffer(1)]],
                                     device const float* x [[buffer(2)]], device const float* bias [[buffer(3)]],
                                     device float* y [[buffer(4)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_matmul_tokens<F, kTokensRows, kTokensPerPass>(t, p, w, x, bias, y);
}

typedef decltype(kcap_matvec_staged_entry<KcapF32, KCAP_MATVEC_PLAIN>) kcap_matvec_staged_entry_t;
typedef decltype(kcap_matmul_tokens_entry<KcapF32>) kcap_matmul_tokens_entry_t;

#define KCAP_METAL_MATMUL_ENTRIES(NAME, DECODER)                                                            \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(matvec, NAME))]] kernel kcap_matvec_staged_entry_t          \
        kcap_matvec_staged_entry<DECODER, KCAP_MATVEC_PLAIN>;                                                \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(gate_up, NAME))]] kernel kcap_matvec_staged_entry_t         \
        kcap_matvec_staged_entry<DECODER, KCAP_MATVEC_GATE_UP>;                                              \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(matmul_tokens, NAME))]] kernel kcap_matmul_tokens_entry_t   \
        kcap_matmul_tokens_entry<DECODER>;
KCAP_WEIGHT_FORMATS(KCAP_METAL_MATMUL_ENTRIES)
#undef KCAP_METAL_MATMUL_ENTRIES
