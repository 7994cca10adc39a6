// Internal to cpp/cpu: the int8 GEMM of cpu/matmul_q8_gemm.h as the q8_1 matmul and experts rows
// call it: activations packed once per call, weight rows packed a tile at a time per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/matmul_q8_gemm.h"
#include "cpu/scratch.h"
#include "cpu/thread_pool.h"
#include "kcap/formats.h"

namespace kcap {
namespace q8_gemm {

// Whether the GEMM runs on this CPU for this weight format: compiled, the CPU has AVX-512 VNNI
// or AVX2 and kcap.cap_cpu_kernels allows it, and the format is one with integer codes (the formats of
// KCAP_Q8_WEIGHT_FORMATS). Checked per call, like dot_row's choice of instructions.
bool runs(Format weights);

// q8_1 activations of several tokens in the GEMM's layout.
class Tokens {
public:
    // Rounds rows x[t * k .. t * k + k - 1], t < tokens, to q8_1 (quantize_q8_1) and packs them.
    void pack(const float* x, int64_t tokens, int64_t k, ThreadPool& pool);
    // Rows row_of[i] of x instead, i < tokens (gathered, for the experts).
    void pack_rows(const float* x, const int32_t* row_of, int64_t tokens, int64_t k, ThreadPool& pool);
    PackedTokens view(int64_t t0, int64_t n) const;
    int64_t n_super() const { return n_super_; }

private:
    void resize(int64_t tokens, int64_t k);
    void pack_one(const float* x, int64_t t);
    int64_t k_ = 0, n_super_ = 0, tokens_ = 0;
    CacheLineVector<int8_t> codes_;
    CacheLineVector<float> d_;
    CacheLineVector<int32_t> sum_;
    CacheLineVector<float> offset_sum_;
};

// Weight rows per tile: a thread packs 16 rows (16 x 2048 code bytes for K = 2048, with their
// scales, inside L1 and L2) and multiplies them with every token of a token block.
constexpr int64_t kTileRows = 16;
static_assert(kTileRows % kRowBlock == 0, "a tile is whole micro-kernel row blocks");
inline int64_t tiles(int64_t n_rows) { return (n_rows + kTileRows - 1) / kTileRows; }

// Throws kcap::Error unless rows of k elements in `format` can be multiplied with x (checked on
// the calling thread before the pool's work, which must not throw).
void check(Format format, int64_t k, const Tokens& x);

// One tile on the calling thread (arguments as check() accepts them): y[t * y_stride + n] = W[n] . q8_1(x[t0 + t]) (+ bias[n]) for
// n < n_rows <= kTileRows, t < n_tokens; W is n_rows rows of k elements in `format` (row_bytes
// apart), x packed with the same k. Needs runs(format).
void multiply_tile(Format format, const uint8_t* w, int64_t n_rows, int64_t k, const Tokens& x, int64_t t0,
                   int64_t n_tokens, const float* bias, float* y, int64_t y_stride);

// The same for any n_rows, its tiles spread over the pool.
void multiply(Format format, const uint8_t* w, int64_t n_rows, int64_t k, const Tokens& x, int64_t t0,
              int64_t n_tokens, const float* bias, float* y, int64_t y_stride, ThreadPool& pool);

}  // namespace q8_gemm
}  // namespace kcap
