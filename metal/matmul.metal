// Metal entry points of the exact matmul rows (metal.matmul.<format>): the kernels/matmul.h
// bodies that cuda.matmul.* runs, one instantiation per format of KCAP_WEIGHT_FORMATS under
// the names metal/rows.cpp declares for the row. One token: the decode matvec with the row's
// runs spread over `split` simd groups (metal_rows::matvec_split, chosen by the host); more
// tokens: the few-token walk (each decoded run of weights reused for kTokensPerPass tokens).
#include "kernels/matmul.h"
#include "metal/rows.h"

using namespace kcap::metal_rows;

static_assert(kSimdWidth == KCAP_SIMD_WIDTH, "the host checks pipelines against metal_rows::kSimdWidth");

// Grid: x = ceil(n / ((kMatvecSimds / split) * kMatvecRows)), y = 1; kMatvecSimds * 32 threads.
template <class F>
kernel void kcap_matvec_entry(constant KcapMatmulParams& p [[buffer(0)]], constant int& split [[buffer(1)]],
                              device const kcap_u8* w [[buffer(2)]], device const float* x [[buffer(3)]],
                              device const float* bias [[buffer(4)]], device float* y [[buffer(5)]],
                              KCAP_METAL_THREAD_ARGS) {
    threadgroup float partials[kMatvecSharedFloats];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_matvec_split<F, kMatvecRows>(t, p, split, w, x, bias, y, partials);
}

// Grid: x = ceil(n / (kTokensSimds * kTokensRows)), y = ceil(m / kTokensPerPass); kTokensSimds * 32 threads.
template <class F>
kernel void kcap_matmul_tokens_entry(constant KcapMatmulParams& p [[buffer(0)]], device const kcap_u8* w [[buffer(1)]],
                                     device const float* x [[buffer(2)]], device const float* bias [[buffer(3)]],
                                     device float* y [[buffer(4)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_matmul_tokens<F, kTokensRows, kTokensPerPass>(t, p, w, x, bias, y);
}

typedef decltype(kcap_matvec_entry<KcapF32>) kcap_matvec_entry_t;
typedef decltype(kcap_matmul_tokens_entry<KcapF32>) kcap_matmul_tokens_entry_t;

#define KCAP_METAL_MATMUL_ENTRIES(NAME, DECODER)                                                            \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(matvec, NAME))]] kernel kcap_matvec_entry_t                 \
        kcap_matvec_entry<DECODER>;                                                                          \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(matmul_tokens, NAME))]] kernel kcap_matmul_tokens_entry_t   \
        kcap_matmul_tokens_entry<DECODER>;
KCAP_WEIGHT_FORMATS(KCAP_METAL_MATMUL_ENTRIES)
#undef KCAP_METAL_MATMUL_ENTRIES
