// CPU matmul with quantized weights and f32 activations: y[m, n] = W[n, :] . x[m, :] (+ b).
//
// Exact: weights are dequantized exactly (bit-exact with gguf-py) and activations stay f32,
// so results match an f32 reference up to summation order. One row per weight format.
// Decode (one token) uses the fused dot of formats.h; a batch dequantizes each weight row
// once into a small tile and reuses it for every token.
#include <algorithm>
#include <cctype>

#include "core/formats_dot_paths.h"
#include "cpu/cpu_state.h"
#include "cpu/matmul_f32_gemm.h"
#include "cpu/matmul_q8_pack.h"
#include "dispatch/gpu_rows.h"
#include "dispatch/stage.h"
#include "kernels/formats_list.h"

namespace kcap {

namespace {

// Prefill blocking: a tile of weight rows is dequantized once, then multiplied with the
// tokens a block at a time so that the tile and the token block both stay in L2
// (32 rows and 16 tokens of K = 2048 floats are 256 KiB and 128 KiB).
constexpr int64_t kPrefillRowTile = 32;
constexpr int64_t kPrefillTokenBlock = 16;
// Register block of the prefill micro-kernel: 4 weight rows x 2 tokens = 8 vector
// accumulators, which with the 6 operand vectors fits the 16 AVX registers.
constexpr int kMicroRows = 4;
constexpr int kMicroTokens = 2;
constexpr int kVectorFloats = 8;
typedef float Vec8 __attribute__((vector_size(kVectorFloats * sizeof(float)), aligned(4)));

inline float horizontal_sum(Vec8 v) {
    float s = 0.0f;
    for (int i = 0; i < kVectorFloats; ++i) s += v[i];
    return s;
}

// y[t * y_stride + r] = dot(w[r], x[t]) for r < kMicroRows, t < kMicroTokens.
inline void micro_kernel(const float* w, const float* x, int64_t K, float* y, int64_t y_stride) {
    Vec8 acc[kMicroRows][kMicroTokens] = {};
    int64_t k = 0;
    for (; k + kVectorFloats <= K; k += kVectorFloats) {
        Vec8 xv[kMicroTokens];
        for (int t = 0; t < kMicroTokens; ++t) xv[t] = *reinterpret_cast<const Vec8*>(x + t * K + k);
        for (int r = 0; r < kMicroRows; ++r) {
            const Vec8 wv = *reinterpret_cast<const Vec8*>(w + r * K + k);
            for (int t = 0; t < kMicroTokens; ++t) acc[r][t] += wv * xv[t];
        }
    }
    for (int r = 0; r < kMicroRows; ++r)
        for (int t = 0; t < kMicroTokens; ++t) {
            float sum = horizontal_sum(acc[r][t]);
            for (int64_t kk = k; kk < K; ++kk) sum += w[r * K + kk] * x[t * K + kk];
            y[t * y_stride + r] = sum;
        }
}

// out[m * N + r] = dot(tile[r], x[m]) for r < rows, m < M (tile rows are contiguous, K long).
void tile_times_token_block(const float* tile, int64_t rows, const float* x, int64_t M, int64_t K, float* out,
                            int64_t N) {
    int64_t r = 0;
    for (; r + kMicroRows <= rows; r += kMicroRows) {
        int64_t m = 0;
        for (; m + kMicroTokens <= M; m += kMicroTokens)
            micro_kernel(tile + r * K, x + m * K, K, out + m * N + r, N);
        for (; m < M; ++m)
            for (int64_t rr = r; rr < r + kMicroRows; ++rr) out[m * N + rr] = dot_f32(tile + rr * K, x + m * K, K);
    }
    for (; r < rows; ++r)
        for (int64_t m = 0; m < M; ++m) out[m * N + r] = dot_f32(tile + r * K, x + m * K, K);
}

KCAP_HOT_LOOP void tile_times_tokens(const float* tile, int64_t rows, const float* x, int64_t M, int64_t K,
                                     float* out, int64_t N) {
    for (int64_t m0 = 0; m0 < M; m0 += kPrefillTokenBlock)
        tile_times_token_block(tile, rows, x + m0 * K, std::min(kPrefillTokenBlock, M - m0), K, out + m0 * N, N);
}

void matmul_kernel(const Stage& stage, const KernelCall& call) {
    const TensorRef& w = *stage.operands[0];
    const float* bias = stage.operands.size() > 1 && stage.operands[1]
                            ? reinterpret_cast<const float*>(stage.operands[1]->data)
                            : nullptr;
    const int64_t K = stage.k, N = stage.n, M = call.n_tokens;
    const size_t row_stride = row_bytes(w.format, K);
    ThreadPool& pool = cpu_state(call.backend_state).pool;
    if (M == 1) {
        pool.parallel_for(N, [&](int64_t begin, int64_t end) {
            for (int64_t n = begin; n < end; ++n) {
                float y = dot_row(w.format, w.data + n * row_stride, call.in, K);
                call.out[n] = bias ? y + bias[n] : y;
            }
        });
        return;
    }
    if (f32_gemm::runs()) {
        pool.parallel_for(f32_gemm::tiles(N), [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const int64_t n0 = i * f32_gemm::kTileRows;
                f32_gemm::multiply_tile(w.format, w.data + n0 * row_stride, std::min(f32_gemm::kTileRows, N - n0), K,
                                        call.in, K, M, bias ? bias + n0 : nullptr, call.out + n0, N);
            }
        });
        return;
    }
    const int64_t n_tiles = (N + kPrefillRowTile - 1) / kPrefillRowTile;
    pool.parallel_for(n_tiles, [&](int64_t begin, int64_t end) {
        std::vector<float> tile(kPrefillRowTile * K);
        for (int64_t t = begin; t < end; ++t) {
            const int64_t n0 = t * kPrefillRowTile;
            const int64_t rows = std::min(kPrefillRowTile, N - n0);
            for (int64_t r = 0; r < rows; ++r)
                dequantize_row(w.format, w.data + (n0 + r) * row_stride, tile.data() + r * K, K);
            tile_times_tokens(tile.data(), rows, call.in, M, K, call.out + n0, N);
            if (bias)
                for (int64_t m = 0; m < M; ++m)
                    for (int64_t r = 0; r < rows; ++r) call.out[m * N + n0 + r] += bias[n0 + r];
        }
    });
}

// q8_1 activations (EngineOptions::activations = "q8_1"): W . q8_1(x), what the GPU rows that
// round their input the same way compute (cuda.matvec_q8.*, cuda.matmul_q8_mma.* and the fused
// rows built on them), so a CPU plan with activations="q8_1" is their reference.
// cpu.matvec_q8 (one token): integer products per 16 values (dot_row_q8_1, maddubs on AVX2), as
// llama.cpp's CPU decode does. cpu.matmul_q8 (any tokens): where the CPU has AVX-512 VNNI or AVX2, the
// int8 GEMM of cpu/matmul_q8_gemm.h (each weight row decoded once to integer codes for all the
// tokens); elsewhere the exact matmul of round_q8_1(x). Both are W . q8_1(x) up to the f32
// rounding of their sums.
void matvec_q8_kernel(const Stage& stage, const KernelCall& call) {
    {
        const TensorRef& w = *stage.operands[0];
        const float* bias = stage.operands.size() > 1 && stage.operands[1]
                                ? reinterpret_cast<const float*>(stage.operands[1]->data)
                                : nullptr;
        const int64_t K = stage.k;
        thread_local std::vector<int8_t> q;  // reused token after token: no allocation per matmul
        thread_local std::vector<float> d;
        thread_local std::vector<int32_t> sum16;
        q.resize(size_t(K)), d.resize(size_t(K / 32)), sum16.resize(size_t(K / 16));
        quantize_q8_1(call.in, K, q.data(), d.data(), sum16.data());
        const Q8View x{q.data(), d.data(), sum16.data()};
        const size_t row_stride = row_bytes(w.format, K);
        cpu_state(call.backend_state).pool.parallel_for(stage.n, [&](int64_t begin, int64_t end) {
            for (int64_t n = begin; n < end; ++n) {
                const float y = dot_row_q8_1(w.format, w.data + n * row_stride, x, K);
                call.out[n] = bias ? y + bias[n] : y;
            }
        });
    }
}

void matmul_q8_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t K = stage.k;
    const TensorRef& w = *stage.operands[0];
    ThreadPool& pool = cpu_state(call.backend_state).pool;
    if (q8_gemm::runs(w.format)) {
        const float* bias = stage.operands.size() > 1 && stage.operands[1]
                                ? reinterpret_cast<const float*>(stage.operands[1]->data)
                                : nullptr;
        q8_gemm::Tokens x;
        x.pack(call.in, call.n_tokens, K, pool);
        q8_gemm::multiply(w.format, w.data, stage.n, K, x, 0, call.n_tokens, bias, call.out, stage.n, pool);
        return;
    }
    std::vector<float> rounded(size_t(call.n_tokens) * size_t(K));
    pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
        round_q8_1(call.in + begin * K, (end - begin) * K, rounded.data() + begin * K);
    });
    KernelCall exact = call;
    exact.in = rounded.data();
    matmul_kernel(stage, exact);
}

}  // namespace

namespace {
bool f32_gemm_avx512() { return f32_gemm::avx512::compiled() && avx512_kernels_in_use(); }
}  // namespace

bool f32_gemm::runs() { return f32_gemm_avx512() || (f32_gemm::avx2::compiled() && avx2_kernels_in_use()); }

void f32_gemm::multiply_tile(Format format, const uint8_t* w, int64_t n_rows, int64_t k, const float* x,
                             int64_t x_stride, int64_t n_tokens, const float* bias, float* y, int64_t y_stride) {
    // The rows decoded exactly; for a few tokens (kRowMajorMaxTokens) multiplied as they are,
    // else stored k-major (zero rows past n_rows), as the tile kernel reads them: a span of 256
    // values (whole blocks of every format) of 16 rows at a time, so that the decoded rows (16 KB)
    // stay in L1 until they are stored k-major.
    constexpr int64_t kSpan = 256, kHalf = 16;
    const bool wide = f32_gemm_avx512();
    const size_t row_stride = row_bytes(format, k);
    // A span of at most kSpan values into dst: the formats the builds decode with vector code by
    // decode_span, the others by dequantize_row (the same values bit for bit).
    const auto decode_span = wide ? avx512::decode_span : avx2::decode_span;
    const auto decode = [&](const uint8_t* src, int64_t span, float* dst) {
        if (!decode_span(format, src, span, dst)) dequantize_row(format, src, dst, span);
    };
    if (n_tokens <= kRowMajorMaxTokens && k % 16 == 0) {
        // Few tokens: the rows decoded one after the other, in address order (one stream for the
        // hardware prefetcher: a software hint 2 KB ahead here took a third of the gain back),
        // and multiplied as they are.
        thread_local CacheLineVector<float> decoded;
        decoded.resize(size_t(n_rows * k));
        const size_t span_bytes = row_bytes(format, kSpan);
        for (int64_t r = 0; r < n_rows; ++r)
            for (int64_t i = 0; i < k; i += kSpan)
                decode(w + r * row_stride + size_t(i / kSpan) * span_bytes, std::min(kSpan, k - i),
                       decoded.data() + r * k + i);
        (wide ? avx512::rows_times_tokens : avx2::rows_times_tokens)(decoded.data(), n_rows, k, x, x_stride, n_tokens,
                                                                     y, y_stride);
    } else {
        thread_local CacheLineVector<float> rows, tile, partial;
        rows.resize(size_t(kHalf * kSpan));
        tile.resize(size_t(kTileRows * k));
        const size_t span_bytes = row_bytes(format, kSpan);
        for (int64_t i = 0; i < k; i += kSpan) {
            const int64_t span = std::min(kSpan, k - i);
            const size_t offset = row_bytes(format, i);
            for (int64_t r0 = 0; r0 < kTileRows; r0 += kHalf) {
                const int64_t half_rows = std::max<int64_t>(0, std::min(kHalf, n_rows - r0));
                for (int64_t r = 0; r < half_rows; ++r) {
                    const uint8_t* src = w + (r0 + r) * row_stride + offset;
                    // The row's next span, read after this span of all 32 rows: 32 short streams,
                    // which the hardware prefetchers leave to miss.
                    if (i + kSpan < k)
                        for (size_t line = 0; line < span_bytes; line += 64) __builtin_prefetch(src + span_bytes + line);
                    decode(src, span, rows.data() + r * kSpan);
                }
                (wide ? avx512::store_k_major : avx2::store_k_major)(rows.data(), half_rows, span, kSpan,
                                                                     tile.data() + i * kTileRows + r0);
            }
        }
        const auto times_tokens = wide ? avx512::tile_times_tokens : avx2::tile_times_tokens;
        if (n_rows == kTileRows) {
            times_tokens(tile.data(), k, x, x_stride, n_tokens, y, y_stride);
        } else {
            partial.resize(size_t(n_tokens * kTileRows));
            times_tokens(tile.data(), k, x, x_stride, n_tokens, partial.data(), kTileRows);
            for (int64_t t = 0; t < n_tokens; ++t)
                std::copy(partial.data() + t * kTileRows, partial.data() + t * kTileRows + n_rows, y + t * y_stride);
        }
    }
    if (bias)
        for (int64_t t = 0; t < n_tokens; ++t)
            for (int64_t r = 0; r < n_rows; ++r) y[t * y_stride + r] += bias[r];
}

void add_cpu_matmul_rows(std::vector<Row>& rows) {
    for (const FormatInfo& info : all_formats()) {
        Row row;
        row.kernel = std::string("cpu.matmul.") + info.name;
        for (auto& c : row.kernel) c = char(std::tolower(c));
        row.op = Op::MatMul;
        row.backend = Backend::CPU;
        row.operand_formats = {{info.format}, {Format::F32}};
        row.features = kBias;
        row.dims.k_multiple = info.block_elems;  // a row never splits a block
        row.fn = matmul_kernel;
        rows.push_back(row);
    }
    // The formats the GPUs have q8_1 rows for (KCAP_Q8_WEIGHT_FORMATS): preferred where the plan
    // allows q8_1 activations, so both backends round the same matmul inputs.
    // cpu.matvec_q8 takes one token (priority over cpu.matmul_q8 there), cpu.matmul_q8 any.
#define KCAP_CPU_Q8_ROW(NAME, DECODER)                                          \
    for (const bool one_token : {true, false}) {                                \
        Row row;                                                                \
        row.kernel = (one_token ? "cpu.matvec_q8." : "cpu.matmul_q8.") + lowercase(#NAME); \
        row.op = Op::MatMul;                                                    \
        row.backend = Backend::CPU;                                             \
        row.operand_formats = {{Format::NAME}, {Format::F32}};                  \
        row.features = kBias;                                                   \
        row.dims.k_multiple = format_info(Format::NAME).block_elems;            \
        row.input_encoding = Encoding::Q8_1;                                    \
        row.tokens = {1, one_token ? 1 : 0};                                    \
        row.priority = one_token ? 2 : 1;                                       \
        row.fn = one_token ? matvec_q8_kernel : matmul_q8_kernel;               \
        rows.push_back(row);                                                    \
    }
    KCAP_Q8_WEIGHT_FORMATS(KCAP_CPU_Q8_ROW)
#undef KCAP_CPU_Q8_ROW
}

}  // namespace kcap
