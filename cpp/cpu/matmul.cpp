// CPU matmul with quantized weights and f32 activations: y[m, n] = W[n, :] . x[m, :] (+ b).
//
// Exact: weights are dequantized exactly (bit-exact with gguf-py) and activations stay f32,
// so results match an f32 reference up to summation order. One row per weight format.
// Decode (one token) uses the fused dot of formats.h; a batch dequantizes each weight row
// once into a small tile and reuses it for every token.
#include <algorithm>
#include <cctype>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

// Weight rows dequantized together in a prefill tile: enough reuse of the activation
// block while the tile stays in L1/L2 (8 rows x 8192 floats = 256 KiB at the largest K).
constexpr int64_t kPrefillRowTile = 8;

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
    const int64_t n_tiles = (N + kPrefillRowTile - 1) / kPrefillRowTile;
    pool.parallel_for(n_tiles, [&](int64_t begin, int64_t end) {
        std::vector<float> tile(kPrefillRowTile * K);
        for (int64_t t = begin; t < end; ++t) {
            const int64_t n0 = t * kPrefillRowTile;
            const int64_t rows = std::min(kPrefillRowTile, N - n0);
            for (int64_t r = 0; r < rows; ++r)
                dequantize_row(w.format, w.data + (n0 + r) * row_stride, tile.data() + r * K, K);
            for (int64_t m = 0; m < M; ++m) {
                const float* x = call.in + m * K;
                float* y = call.out + m * N + n0;
                for (int64_t r = 0; r < rows; ++r) {
                    float v = dot_f32(tile.data() + r * K, x, K);
                    y[r] = bias ? v + bias[n0 + r] : v;
                }
            }
        }
    });
}

}  // namespace

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
}

}  // namespace kcap
