// Every CUDA row of the capability table, launched for real on the GPU through its row.fn,
// against its CPU twin on fresh random inputs at the edges of its legal dims (K at the block
// size, an odd multiple and a long one; rows and tokens not multiples of any tile), with
// outputs poisoned (NaN) before every launch.
//
// Tolerances (relative L2 error against the CPU row; for matmuls relative to ||(|W| |x|)||,
// the scale reordered sums err against, since one output's terms may cancel):
//   exact rows (cuda.matmul.*, embed, norm, rope, elementwise, add_norm,
//               per_layer_embed, per_layer_gate, gate_up for < kMmaMinTokens)   1e-5 (f32, another summation order)
//   cuda.matmul_mma.* and gate_up with >= kMmaMinTokens tokens (bf16 tiles)   3e-5, derived: the weights are
//       exact (scale x bf16-exact code + offset, f32 scale and offset) and x = x_hi + x_lo + e with
//       |e| <= 2^-16 |x| (two bf16 roundings), products exact, f32 accumulation; so each output
//       errs by <= 2^-16 sum |w x| (1.5e-5 of the scale) plus f32 summation (the exact rows' 1e-5).
//   cuda.matmul_q8.* and cuda.gate_up_q8.* (q8_1 activations)       1e-5 against the CPU row on q8_1(x)
//       (q8_1_values): the integer products are exact; f32 scales per sub-block and the f32 sums.
//   cuda.matmul_bf16.*, cuda.gate_up_bf16.*, cuda.qkv_bf16 from kGemmMinTokens tokens (dequantize +
//       cuBLAS) against the exact CPU row on bf16(W) and bf16(x) (bf16_weights, bf16_values):
//       1e-5 + ceil(K / 8) 2^-23, derived: products of two bf16 values are exact in f32, and the
//       tensor cores' f32 sums truncate (below), one ulp per mma step of at least 8 values of K.
//       Fewer tokens: the exact rows' launchers and their bounds.
//   attention (online softmax, f32 exp)                            1e-5
//   cuda.attention_mma's tensor-core prefill                       1e-5 + (2 ceil(span / 16) + head_dim / 8) 2^-23,
//       derived: the products are exact (f16 K/V, queries and weights split hi + lo: 2^-22), but
//       the tensor cores add each mma's products into the f32 accumulator with truncation, not
//       round-to-nearest (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor
//       cores", 2021), so each accumulation may err by one f32 ulp (2^-23) in the same direction:
//       an output takes 2 per 16 keys it sees (hi and lo weights), a score 2 per 16 dims.
//       Measured on the H200: 1.04e-5 at 16500 keys (head_dim 64), within 1e-5 below ~1100.
// Exit 77 (ctest: skipped) without CUDA in the build or without a device; the table and
// refusal checks that need no GPU are in test_cuda_kernels_host.
#include <cstdio>
#include <cstdlib>

#include "test_cuda_common.h"

#if !defined(KCAP_WITH_CUDA)
int main() {
    std::printf("SKIP: the CUDA backend is not compiled into this build\n");
    return 77;
}
#else

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/cuda_context.h"
#include "cuda/rope_table.h"

using namespace kcap_test;
using kcap::cuda::Context;
using kcap::cuda::StageData;

namespace {

constexpr double kExactTolerance = 1e-5;
constexpr double kMmaTolerance = 3e-5;  // split-bf16 tiles: 2^-16 + the exact rows' 1e-5 (header)
constexpr double kAttentionTolerance = 1e-5;

// The bf16 rows' GEMM against bf16(W) . bf16(x) (header): the products of two bf16 values are
// exact in f32, so only the f32 sums err: the exact rows' 1e-5, plus the tensor cores'
// truncating accumulation (one f32 ulp per mma step, all in one direction, as for the attention
// below), allowed one per 8 values of K (the shortest bf16 mma step).
double gemm_tolerance(int64_t k) { return kExactTolerance + double((k + 7) / 8) * std::ldexp(1.0, -23); }

// The bound of one attention call (header): the SIMT bodies' 1e-5, plus for the tensor-core
// prefill the truncating accumulations of its longest row (`span` keys).
double attention_tolerance(bool tensor_cores, int span, int head_dim) {
    if (!tensor_cores) return kAttentionTolerance;
    return kAttentionTolerance + (2.0 * ((span + 15) / 16) + head_dim / 8.0) * std::ldexp(1.0, -23);
}

void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
        std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(status));
        std::exit(1);
    }
}
#define CHECK(expr) check((expr), #expr)

// Device memory freed at scope end.
struct Arena {
    std::vector<void*> blocks;
    ~Arena() {
        for (void* p : blocks) cudaFree(p);
    }
    void* alloc(size_t bytes) {
        void* p = nullptr;
        CHECK(cudaMalloc(&p, bytes ? bytes : 16));
        CHECK(cudaMemset(p, 0xff, bytes ? bytes : 16));  // poison: 0xffffffff is a NaN
        blocks.push_back(p);
        return p;
    }
    template <class T>
    T* upload(const std::vector<T>& v) {
        T* p = static_cast<T*>(alloc(v.size() * sizeof(T)));
        CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
        return p;
    }
    void* upload_bytes(const void* data, size_t n) {
        void* p = alloc(n);
        CHECK(cudaMemcpy(p, data, n, cudaMemcpyHostToDevice));
        return p;
    }
};

template <class T>
std::vector<T> download(const T* p, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// A device context like the backend's, sized for one test.
struct TestContext {
    Arena arena;
    Context ctx;
    TestContext() {
        CHECK(cudaStreamCreate(&ctx.stream));
        cudaDeviceProp props;
        CHECK(cudaGetDeviceProperties(&props, 0));
        ctx.sm_count = props.multiProcessorCount;
        ctx.pdl = props.major >= 9;
        ctx.step = static_cast<int32_t*>(arena.alloc(8));
        ctx.tokens = static_cast<int32_t*>(arena.alloc(4 * 4096));
        ctx.history = static_cast<int32_t*>(arena.alloc(4 * 4096));
        ctx.argmax_result = static_cast<int32_t*>(arena.alloc(4));
        ctx.argmax_partials = 1024;
        ctx.argmax_partial_value = static_cast<float*>(arena.alloc(4 * 1024));
        ctx.argmax_partial_index = static_cast<int32_t*>(arena.alloc(4 * 1024));
        // The q8_1 rows' batch activations: up to 256 tokens of 16384 values (the widest case).
        ctx.q8_rows_capacity = size_t(cuda_rows::q8_rows_bytes(256, 16384));
        ctx.q8_rows = arena.alloc(ctx.q8_rows_capacity);
    }
    ~TestContext() {
        kcap::cuda::gemm_destroy(ctx.gemm);
        cudaStreamDestroy(ctx.stream);
    }
    // The bf16 rows' GEMM (cuBLAS): a weight scratch of weight_values (fewer values than a
    // matrix has make it go in chunks of rows) and inputs of up to 256 x 16384 values.
    void use_gemm(size_t weight_values = size_t(1) << 22) {
        ctx.gemm = kcap::cuda::gemm_create(ctx.stream, weight_values, size_t(256) * 16384);
    }
    void set_step(int pos, int generated = 0) {
        const int32_t step[2] = {pos, generated};
        CHECK(cudaMemcpy(ctx.step, step, 8, cudaMemcpyHostToDevice));
    }
    void run(const Row& row, const Stage& stage, KernelCall call, const StageData& data) {
        call.backend_state = &ctx;
        call.stage_state = &data;
        row.fn(stage, call);
        CHECK(cudaStreamSynchronize(ctx.stream));
        CHECK(cudaGetLastError());
    }
};

int g_cases = 0;

void test_matmul(std::mt19937& rng, CpuState& cpu) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::MatMul) continue;
        const Format f = row_format(row);
        // q8_1 rows have tensor-core tiles too; they are held to the exact rows' bound on q8_1(x).
        const bool q8 = row.input_encoding == Encoding::Q8_1;
        // bf16 rows: below kGemmMinTokens the tensor-core row's launcher (its bound), from there
        // the GEMM, against the exact CPU row on bf16(W) and bf16(x).
        const bool bf16 = row.input_encoding == Encoding::BF16;
        // The reference below the GEMM (a bf16 row's: its format's exact row); the GEMM's is the
        // exact F32 row on bf16(W) and bf16(x).
        const Row& twin = bf16 ? cpu_matmul_row(f) : cpu_twin(row);
        const bool mma = q8 || ((bf16 || row.kernel.rfind("cuda.matmul_mma.", 0) == 0) && cuda_rows::mma_format(f));
        std::vector<int64_t> ks = k_edges(row, 14336);
        // Five multiples: with 32-element blocks an odd number of 64-element raw chunks, the last
        // of one block (the tiles' staging, cuda/mma_tiles.h), with 256-element blocks five chunks.
        ks.push_back(5 * row.dims.k_multiple);
        for (int64_t k : ks)
            for (int64_t n : {1, 7, 130})
                for (int m : {1, 2, 17, 67, 130})
                    // variant: the tensor-core tiles with weights staged in shared memory (1) or not (0);
                    // the q8_1 matvec with x quantized once (1) or by its groups (0);
                    // the bf16 GEMM with the whole matrix in its scratch (0) or in chunks of 64 rows (1)
                    for (int variant : {0, 1})
                    // the decode matvec with 1 or 2 rows per team (a wide matrix's: matvec_rows_for)
                    for (int team_rows : {1, 2})
                    for (bool with_bias : {false, true})
                    // the int8 tiles' tokens per group (q8_1 rows; 17, 67 or 130 tokens: one
                    // partial 128-token group, or a full one and two tokens)
                    for (int q8_tokens : {64, 128}) {
                        if (with_bias && n == 7) continue;
                        const bool gemm = bf16 && m >= cuda_rows::kGemmMinTokens;
                        const bool tiles = mma && !gemm && m >= cuda_rows::kMmaMinTokens;
                        if (variant && !tiles && !q8 && !gemm) continue;
                        if (team_rows == 2 && (tiles || (m > 1 && !q8) || with_bias)) continue;
                        if (q8_tokens == 128 && !(q8 && tiles)) continue;
                        TestContext t;
                        t.ctx.mma_q8_tokens = q8_tokens;
                        if (tiles) t.ctx.mma_staged = variant;
                        else t.ctx.q8_prequantize = variant;
                        t.ctx.matvec_rows = team_rows;
                        if (gemm) t.use_gemm(variant ? size_t(64 * k) : size_t(1) << 22);
                        auto w = random_weights(rng, f, k, n);
                        auto bias = float_vector(random_floats(rng, static_cast<size_t>(n)), "bias");
                        Stage stage = matmul_stage(&w->ref, with_bias ? &bias->ref : nullptr, k, n);
                        stage.input_encoding = row.input_encoding;
                        KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses K=%lld", row.kernel.c_str(),
                                    (long long)k);
                        const std::vector<float> x = random_floats(rng, static_cast<size_t>(m * k));
                        // What the row multiplies.
                        const std::vector<float> xr = q8 ? q8_1_values(x) : gemm ? bf16_values(x) : x;
                        const auto wr = gemm ? bf16_weights(w->ref, k, n) : nullptr;
                        const TensorRef& w_ref = gemm ? wr->ref : w->ref;
                        std::vector<float> ref(static_cast<size_t>(m * n));
                        KernelCall call;
                        call.n_tokens = m;
                        call.in = gemm ? xr.data() : x.data();  // a q8_1 row's twin (cpu.matmul_q8.*) rounds it itself
                        call.out = ref.data();
                        Stage ref_stage = stage;
                        if (bf16) ref_stage.operands[0] = &w_ref, ref_stage.input_encoding = Encoding::F32;
                        run_cpu(gemm ? cpu_matmul_row(Format::F32) : twin, ref_stage, call, cpu);
                        StageData data;
                        data.operands[0] = t.arena.upload_bytes(w->ref.data, w->ref.nbytes);
                        data.operands[1] = with_bias ? t.arena.upload_bytes(bias->ref.data, bias->ref.nbytes) : nullptr;
                        float* y = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                        call.in = t.arena.upload(x);
                        call.out = y;
                        t.run(row, stage, call, data);
                        const double err = matmul_error(download(y, ref.size()), ref, w_ref, xr.data(), k, n, m);
                        const double tolerance = gemm ? gemm_tolerance(k)
                                                 : !q8 && mma && m >= cuda_rows::kMmaMinTokens ? kMmaTolerance
                                                                                               : kExactTolerance;
                        KCAP_EXPECT(err <= tolerance,
                                    "%s K=%lld N=%lld M=%d bias=%d %s=%d rows=%d q8_tokens=%d: error %.3g > %.2g",
                                    row.kernel.c_str(), (long long)k, (long long)n, m, int(with_bias),
                                    gemm ? "chunked" : tiles ? "staged" : "prequantized", variant, team_rows, q8_tokens,
                                    err, tolerance);
                        ++g_cases;
                    }
    }
}

void test_embed(std::mt19937& rng, CpuState& cpu) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::Embed) continue;
        const Format f = row_format(row);
        std::vector<int64_t> widths = {row.dims.k_multiple, row.dims.k_multiple * 5};
        if (row.dims.k_multiple < 32) widths.push_back(row.dims.k_multiple * 25);  // runs and a tail
        for (int64_t width : widths)
            for (int positions : {0, 1, 2}) {  // none, f32, f16 learned position embedding
                TestContext t;
                const int64_t vocab = 37, n_pos = 64, pos0 = 40;
                auto table = random_weights(rng, f, width, vocab);
                auto pos_table = random_weights(rng, positions == 2 ? Format::F16 : Format::F32, width, n_pos, "pos");
                Stage stage;
                stage.op = Op::Embed;
                stage.operands = {&table->ref};
                if (positions) stage.operands.push_back(&pos_table->ref);
                stage.k = stage.n = width;
                stage.params.scale = 1.7f;
                stage.features = kEmbedScale | (positions ? kPositionEmbedding : 0u);
                KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses width %lld", row.kernel.c_str(),
                            (long long)width);
                const std::vector<int32_t> tokens = {36, 0, 5, 36, 17};
                std::vector<float> ref(tokens.size() * static_cast<size_t>(width));
                KernelCall call;
                call.n_tokens = int(tokens.size());
                call.pos0 = int(pos0);
                call.tokens = tokens.data();
                call.out = ref.data();
                run_cpu(cpu_twin(row), stage, call, cpu);
                CHECK(cudaMemcpy(t.ctx.tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
                t.set_step(int(pos0));
                StageData data;
                data.operands[0] = t.arena.upload_bytes(table->ref.data, table->ref.nbytes);
                if (positions) data.operands[1] = t.arena.upload_bytes(pos_table->ref.data, pos_table->ref.nbytes);
                float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                call.tokens = nullptr;
                call.out = out;
                t.run(row, stage, call, data);
                const double err = relative_error(download(out, ref.size()), ref);
                KCAP_EXPECT(err <= kExactTolerance, "%s width=%lld positions=%d: error %.3g", row.kernel.c_str(),
                            (long long)width, positions, err);
                ++g_cases;
            }
    }
}

// Every cuda.per_layer_embed.<proj> row (projection and combine, tables in F32, F16 and the
// projection's format, 1, 5 and 70 tokens) and cuda.per_layer_gate, against the CPU rows.
void test_ple(std::mt19937& rng, CpuState& cpu) {
    const Row& cpu_row = find_row("cpu.per_layer_embed");
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::PerLayerEmbed) continue;
        const Format pf = row.operand_formats.at(1).at(0);
        for (Format tf : {Format::F32, Format::F16, pf})
            for (int64_t k : {row.dims.k_multiple * 3, row.dims.k_multiple < 32 ? int64_t(1540) : int64_t(1536)})
                for (int m : {1, 5, 70}) {
                    TestContext t;
                    const int64_t block = format_info(tf).block_elems;
                    const int n_layer = 5;
                    const int per = block >= 256 ? 256 : block == 32 && tf != Format::F32 && tf != Format::F16 ? 96 : 36;
                    const int64_t width = int64_t(n_layer) * per, vocab = 23;
                    auto table = random_weights(rng, tf, width, vocab, "ple_table");
                    auto proj = random_weights(rng, pf, k, width, "ple_proj");
                    auto norm = float_vector(random_floats(rng, size_t(per)), "ple_norm");
                    Stage stage;
                    stage.op = Op::PerLayerEmbed;
                    stage.operands = {&table->ref, &proj->ref, &norm->ref};
                    stage.k = k, stage.n = width, stage.groups = n_layer;
                    stage.params.eps = 1e-6f, stage.params.n_layer = n_layer;
                    stage.params.ple_token_scale = 1.7f, stage.params.ple_model_proj_scale = 0.3f;
                    stage.params.ple_combine_scale = 0.7f;
                    stage.features = kPerLayerEmbedding | kRmsNorm;
                    KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses table %s K=%lld", row.kernel.c_str(),
                                format_name(tf), (long long)k);
                    std::vector<int32_t> tokens(static_cast<size_t>(m));
                    for (int i = 0; i < m; ++i) tokens[size_t(i)] = int32_t((i * 7 + 3) % vocab);
                    const std::vector<float> e = random_floats(rng, size_t(m) * size_t(k));
                    std::vector<float> ref(size_t(m) * size_t(width));
                    KernelCall call;
                    call.n_tokens = m;
                    call.tokens = tokens.data();
                    call.in = e.data();
                    call.out = ref.data();
                    run_cpu(cpu_row, stage, call, cpu);
                    CHECK(cudaMemcpy(t.ctx.tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
                    StageData data;
                    data.operands[0] = t.arena.upload_bytes(table->ref.data, table->ref.nbytes);
                    data.operands[1] = t.arena.upload_bytes(proj->ref.data, proj->ref.nbytes);
                    data.operands[2] = t.arena.upload_bytes(norm->ref.data, norm->ref.nbytes);
                    float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                    call.tokens = nullptr;
                    call.in = t.arena.upload(e);
                    call.out = out;
                    t.run(row, stage, call, data);
                    const double err = relative_error(download(out, ref.size()), ref);
                    KCAP_EXPECT(err <= kExactTolerance, "%s table %s K=%lld M=%d: error %.3g", row.kernel.c_str(),
                                format_name(tf), (long long)k, m, err);
                    ++g_cases;
                }
    }
    const Row& gate_row = find_row("cuda.per_layer_gate");
    for (Activation act : {Activation::SiLU, Activation::GeluTanh, Activation::GeluErf, Activation::ReLU})
        for (int layer : {0, 4})
            for (int tokens : {1, 70}) {
                TestContext t;
                const int per = 36, n_layer = 5, stride = per * n_layer;
                Stage stage;
                stage.op = Op::PerLayerGate;
                stage.k = stride, stage.n = per, stage.groups = layer;
                stage.params.activation = act;
                stage.features = kPerLayerEmbedding;
                const std::vector<float> gate = random_floats(rng, size_t(tokens * per), 3.0f);
                const std::vector<float> ple = random_floats(rng, size_t(tokens * stride));
                std::vector<float> ref(gate.size());
                KernelCall call;
                call.n_tokens = tokens;
                call.in = gate.data(), call.in2 = ple.data(), call.out = ref.data();
                run_cpu(find_row("cpu.per_layer_gate"), stage, call, cpu);
                float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                call.in = t.arena.upload(gate), call.in2 = t.arena.upload(ple), call.out = out;
                t.run(gate_row, stage, call, StageData());
                const double err = relative_error(download(out, ref.size()), ref);
                KCAP_EXPECT(err <= kExactTolerance, "cuda.per_layer_gate %s layer %d tokens %d: error %.3g",
                            activation_name(act), layer, tokens, err);
                ++g_cases;
            }
}

void test_norm(std::mt19937& rng, CpuState& cpu) {
    const Row& row = find_row("cuda.norm");
    for (int64_t width : {64, 256, 640, 1000, 4096})
        for (int64_t groups : {1, 8})
            for (int tokens : {1, 3})
                for (bool layer : {false, true})
                    for (bool with_bias : {false, true}) {
                        TestContext t;
                        auto weight = float_vector(random_floats(rng, static_cast<size_t>(width)), "w");
                        auto bias = float_vector(random_floats(rng, static_cast<size_t>(width)), "b");
                        Stage stage;
                        stage.op = Op::Norm;
                        stage.operands = {&weight->ref, with_bias ? &bias->ref : nullptr};
                        stage.k = width;
                        stage.groups = groups;
                        stage.n = width * groups;
                        stage.params.eps = 1e-6f;
                        stage.features = (layer ? kLayerNorm : kRmsNorm) | (with_bias ? kBias : 0u);
                        const std::vector<float> x = random_floats(rng, static_cast<size_t>(tokens * width * groups), 5.0f);
                        std::vector<float> ref(x.size());
                        KernelCall call;
                        call.n_tokens = tokens;
                        call.in = x.data();
                        call.out = ref.data();
                        run_cpu(cpu_twin(row), stage, call, cpu);
                        StageData data;
                        data.operands[0] = t.arena.upload_bytes(weight->ref.data, weight->ref.nbytes);
                        data.operands[1] = with_bias ? t.arena.upload_bytes(bias->ref.data, bias->ref.nbytes) : nullptr;
                        float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                        call.in = t.arena.upload(x);
                        call.out = out;
                        t.run(row, stage, call, data);
                        const double err = relative_error(download(out, ref.size()), ref);
                        KCAP_EXPECT(err <= kExactTolerance, "cuda.norm width=%lld groups=%lld tokens=%d: error %.3g",
                                    (long long)width, (long long)groups, tokens, err);
                        ++g_cases;
                    }
}

void test_rope(std::mt19937& rng, CpuState& cpu) {
    const Row& row = find_row("cuda.rope");
    for (bool neox : {false, true})
        for (int head_dim : {64, 128, 256})
            for (bool partial : {false, true})
                for (bool with_factors : {false, true}) {
                    TestContext t;
                    const int tokens = 5, n_head = 8, n_head_kv = 2, pos0 = 4090;
                    const int rope_dim = partial ? head_dim / 2 : head_dim;
                    std::vector<float> factor_values = random_floats(rng, static_cast<size_t>(rope_dim / 2));
                    for (auto& f : factor_values) f = 1.0f + std::fabs(f);
                    auto factors = float_vector(factor_values, "rope_freqs");
                    Stage stage;
                    stage.op = Op::Rope;
                    stage.operands = {with_factors ? &factors->ref : nullptr};
                    stage.params.n_head = n_head, stage.params.n_head_kv = n_head_kv, stage.params.head_dim = head_dim;
                    stage.params.rope_dim = rope_dim, stage.params.rope_base = 500000.0f;
                    stage.features = (neox ? kRopeNeox : kRopeNormal) | (partial ? kPartialRotary : 0u) |
                                     (with_factors ? kRopeFreqFactors : 0u);
                    const std::vector<float> q0 = random_floats(rng, static_cast<size_t>(tokens * n_head * head_dim));
                    const std::vector<float> k0 = random_floats(rng, static_cast<size_t>(tokens * n_head_kv * head_dim));
                    std::vector<float> q_ref = q0, k_ref = k0;
                    KernelCall call;
                    call.n_tokens = tokens;
                    call.pos0 = pos0;
                    call.out = q_ref.data();
                    call.inout2 = k_ref.data();
                    run_cpu(cpu_twin(row), stage, call, cpu);
                    StageData data;
                    data.rope_table = t.arena.upload(rope_cos_sin_table(stage, pos0 + tokens));
                    float* q = t.arena.upload(q0);
                    float* k = t.arena.upload(k0);
                    t.set_step(pos0);
                    call.out = q;
                    call.inout2 = k;
                    t.run(row, stage, call, data);
                    const double err =
                        std::max(relative_error(download(q, q0.size()), q_ref), relative_error(download(k, k0.size()), k_ref));
                    KCAP_EXPECT(err <= kExactTolerance, "cuda.rope neox=%d head_dim=%d rope_dim=%d factors=%d: error %.3g",
                                int(neox), head_dim, rope_dim, int(with_factors), err);
                    ++g_cases;
                    // A shared-KV layer's rope: Q only (no K buffer).
                    std::vector<float> q_only_ref = q0;
                    call.out = q_only_ref.data();
                    call.inout2 = nullptr;
                    run_cpu(cpu_twin(row), stage, call, cpu);
                    float* q_only = t.arena.upload(q0);
                    call.out = q_only;
                    t.run(row, stage, call, data);
                    const double err_q = relative_error(download(q_only, q0.size()), q_only_ref);
                    KCAP_EXPECT(err_q <= kExactTolerance, "cuda.rope without K neox=%d head_dim=%d: error %.3g", int(neox),
                                head_dim, err_q);
                    ++g_cases;
                }
}

struct AttentionCase {
    int n_head, n_head_kv, head_dim, head_dim_v, window;
    float softcap;
    Format kv;
    int prefill, decode_steps, n_splits;
    int prefill2 = 0;  // a second prefill chunk (positions after the first), before the decode steps
};

// cuda.attention (SIMT bodies) and cuda.attention_mma (f16 caches, head dims 64/128/256:
// tensor-core prefill, the SIMT decode), each on every case its kv_formats and head dims admit;
// a case the row lacks must be refused by the row.
// A stage that quantizes its output for the next stage's q8_1 matmul (cuda.add_norm, cuda.attention
// at one token): it announced q8_rows_next = (out, m, k), and the q8_1 rows hold, bit for bit, the
// rounding of what it wrote (the caller poisoned them with NaN before the run).
void expect_q8_rows_of(TestContext& t, const float* out, const std::vector<float>& written, int m, int k,
                       const std::string& what) {
    const cuda::Context::Q8Source& next = t.ctx.q8_rows_next;
    KCAP_EXPECT(next.x == out && next.m == m && next.k == k, "%s m=%d k=%d: q8_1 rows not announced", what.c_str(), m, k);
    const cuda::Q8Rows rows = cuda::q8_rows_layout(t.ctx, m, k);
    const std::vector<uint32_t> codes = download(rows.codes, written.size() / 4);
    const std::vector<float> d = download(rows.d, written.size() / 32);
    const std::vector<int32_t> half_sums = download(rows.half_sums, written.size() / 16);
    const std::vector<float> want = q8_1_values(written);
    int bad = 0;
    for (size_t i = 0; i < written.size(); ++i) {
        const int q = int(int8_t(uint8_t(codes[i / 4] >> (8 * (i % 4)))));
        if (d[i / 32] * float(q) != want[i]) ++bad;
    }
    for (size_t h = 0; h < half_sums.size(); ++h) {
        int sum = 0;
        for (size_t i = 16 * h; i < 16 * h + 16; ++i) sum += int(int8_t(uint8_t(codes[i / 4] >> (8 * (i % 4)))));
        if (sum != half_sums[h]) ++bad;
    }
    KCAP_EXPECT(bad == 0, "%s m=%d k=%d: %d q8_1 values or half sums differ", what.c_str(), m, k, bad);
}

void test_attention(std::mt19937& rng, CpuState& cpu, const char* kernel) {
    const Row& row = find_row(kernel);
    const AttentionCase cases[] = {
        {4, 1, 256, 256, 512, 0.0f, Format::F16, 517, 2, 8, 300},  // Gemma local layer: a second chunk past the window
        {32, 8, 128, 128, 0, 0.0f, Format::F16, 333, 1, 16, 179},  // Llama-3-8B heads, f16: two chunks, odd counts
        {16, 2, 128, 64, 40, 30.0f, Format::F32, 95, 1, 2, 61},    // GQA 8, dv < d, window and softcap
        {4, 1, 256, 256, 0, 0.0f, Format::F32, 700, 3, 11},    // Gemma global layer, 11 splits
        {4, 1, 256, 256, 512, 0.0f, Format::F16, 600, 3, 8},   // Gemma local layer past its window
        {9, 3, 64, 64, 0, 0.0f, Format::F16, 9, 3, 1},         // SmolLM2 heads, one split
        {32, 8, 128, 128, 0, 0.0f, Format::F32, 1100, 2, 64},  // Llama-3-8B heads, empty splits
        {8, 8, 128, 128, 0, 30.0f, Format::F32, 40, 2, 4},     // no GQA, softcap
        {10, 1, 32, 48, 7, 0.0f, Format::F16, 5, 9, 2},        // 10 query heads per KV head, dv != d, tiny window
        {8, 2, 64, 64, 20, 30.0f, Format::F16, 150, 1, 2, 77},  // f16: window inside key tiles, softcap, GQA 4
        {6, 6, 128, 128, 0, 0.0f, Format::F16, 70, 1, 2},      // f16, no GQA, a partial row tile
        {4, 1, 256, 256, 0, 0.0f, Format::F16, 1, 1, 1, 3},    // f16, a one-token chunk then three
        {2, 1, 64, 64, 0, 0.0f, Format::F16, 16500, 1, 300},   // 258 active splits: the combine's chunk loop
    };
    // The _rope rows own the rope (and QK-norm) of the stage before them: each case then takes
    // raw Q and K with a rope of its own (NeoX or normal, with or without QK-norm and frequency
    // factors, in turn); the reference rotates them on the CPU first. Every other such case
    // runs with the measurement switch off (a rope launch before a plain decode).
    const bool owns_rope = row.requires_any != 0;  // the _rope rows take only stages that own a rope
    int case_index = -1;
    for (const AttentionCase& c : cases) {
        ++case_index;
        TestContext t;
        const int n_ctx = c.prefill + c.prefill2 + c.decode_steps;
        Stage stage;
        stage.layer = 0;
        stage.op = Op::Attention;
        stage.params.n_head = c.n_head, stage.params.n_head_kv = c.n_head_kv;
        stage.params.head_dim = c.head_dim, stage.params.head_dim_v = c.head_dim_v;
        stage.params.sliding_window = c.window, stage.params.softcap = c.softcap;
        stage.params.scale = 1.0f / std::sqrt(float(c.head_dim));
        stage.kv_format = c.kv;
        stage.k = c.head_dim;
        stage.n = int64_t(c.n_head) * c.head_dim_v;
        const bool kv_taken = std::find(row.kv_formats.begin(), row.kv_formats.end(), c.kv) != row.kv_formats.end();
        const bool dims_taken = row.dims.head_dims.empty() ||
                                (c.head_dim == c.head_dim_v && std::find(row.dims.head_dims.begin(), row.dims.head_dims.end(),
                                                                         c.head_dim) != row.dims.head_dims.end());
        if (!kv_taken || !dims_taken) {
            KCAP_EXPECT(!rejection_reason(row, stage).empty(), "%s takes a %s cache at head_dim %d/%d", kernel,
                        format_name(c.kv), c.head_dim, c.head_dim_v);
            ++g_cases;
            continue;
        }
        // A _rope row takes this stage once it owns a rope (checked below, after the rope is added).
        if (!owns_rope)
            KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses heads %d/%d dim %d/%d kv %s: %s", kernel,
                        c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, format_name(c.kv),
                        rejection_reason(row, stage).c_str());
        cpu.kv.assign(1, KvLayer());
        cpu.kv[0].format = c.kv;
        cpu.kv[0].k_width = int64_t(c.n_head_kv) * c.head_dim;
        cpu.kv[0].v_width = int64_t(c.n_head_kv) * c.head_dim_v;
        const size_t elem = c.kv == Format::F16 ? 2 : 4;
        t.ctx.kv_format = c.kv;
        t.ctx.n_ctx = n_ctx;
        t.ctx.kv.resize(2);  // layer 1 shares layer 0's cache (kv_shared): no cache of its own
        t.ctx.kv[0].k = t.arena.alloc(size_t(n_ctx) * c.n_head_kv * c.head_dim * elem);
        t.ctx.kv[0].v = t.arena.alloc(size_t(n_ctx) * c.n_head_kv * c.head_dim_v * elem);
        t.ctx.attn_partial_o = static_cast<float*>(t.arena.alloc(size_t(c.n_head) * c.n_splits * c.head_dim_v * 4));
        t.ctx.attn_partial_ml = static_cast<float*>(t.arena.alloc(size_t(c.n_head) * c.n_splits * 2 * 4));
        StageData data;
        data.attn_splits = c.n_splits;
        std::vector<float> factor_values = random_floats(rng, size_t(c.head_dim / 2));
        for (auto& f : factor_values) f = 1.0f + std::fabs(f);
        const auto factors = float_vector(factor_values, "rope_freqs");
        const auto q_norm = float_vector(random_floats(rng, size_t(c.head_dim)), "q_norm");
        const auto k_norm = float_vector(random_floats(rng, size_t(c.head_dim)), "k_norm");
        if (owns_rope) {
            const bool neox = case_index % 2 == 0, qk_norm = case_index % 3 != 1, with_factors = case_index % 4 == 1;
            stage.operands = {qk_norm ? &q_norm->ref : nullptr, qk_norm ? &k_norm->ref : nullptr,
                              with_factors ? &factors->ref : nullptr};
            stage.params.rope_dim = c.head_dim, stage.params.rope_base = 10000.0f, stage.params.rope_freq_scale = 1.0f;
            stage.params.eps = 1e-6f;
            stage.features |= (neox ? kRopeNeox : kRopeNormal) | (qk_norm ? uint32_t(kRmsNorm) : 0u) |
                              (with_factors ? uint32_t(kRopeFreqFactors) : 0u);
            KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses its rope: %s", kernel,
                        rejection_reason(row, stage).c_str());
            if (qk_norm) {
                data.operands[0] = t.arena.upload(std::vector<float>(reinterpret_cast<const float*>(q_norm->ref.data),
                                                                     reinterpret_cast<const float*>(q_norm->ref.data) + c.head_dim));
                data.operands[1] = t.arena.upload(std::vector<float>(reinterpret_cast<const float*>(k_norm->ref.data),
                                                                     reinterpret_cast<const float*>(k_norm->ref.data) + c.head_dim));
            }
            data.rope_table = t.arena.upload(rope_cos_sin_table(stage, n_ctx));  // the factors are folded in
            t.ctx.attn_own_rope = case_index % 2 == 0 || case_index % 4 == 1;
        }
        const Stage plain = owns_rope ? without_rope(stage) : stage;
        int pos = 0;
        const int prefill_calls = c.prefill2 > 0 ? 2 : 1;
        for (int call_index = 0; call_index < prefill_calls + c.decode_steps; ++call_index) {
            const int m = call_index == 0 ? c.prefill : call_index < prefill_calls ? c.prefill2 : 1;
            const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * c.head_dim);
            const std::vector<float> k = random_floats(rng, size_t(m) * c.n_head_kv * c.head_dim);
            const std::vector<float> v = random_floats(rng, size_t(m) * c.n_head_kv * c.head_dim_v);
            std::vector<float> ref(size_t(m) * c.n_head * c.head_dim_v);
            std::vector<float> q_rot = q, k_rot = k;
            if (owns_rope) cpu_owned_rope(stage, m, pos, q_rot, k_rot, cpu);
            KernelCall call;
            call.n_tokens = m;
            call.pos0 = pos;
            call.in = q_rot.data(), call.in2 = k_rot.data(), call.in3 = v.data(), call.out = ref.data();
            run_cpu(cpu_twin(row), plain, call, cpu);
            float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
            call.in = t.arena.upload(q), call.in2 = t.arena.upload(k), call.in3 = t.arena.upload(v), call.out = out;
            t.set_step(pos);
            CHECK(cudaMemset(t.ctx.q8_rows, 0xff, t.ctx.q8_rows_capacity));  // poison: d = NaN
            t.ctx.q8_rows_next = {};
            t.run(row, stage, call, data);
            const std::vector<float> got = download(out, ref.size());
            const double err = relative_error(got, ref);
            if (owns_rope) {
                // The K rows this call appended were rotated on the device (and QK-normed, with
                // another order of the sum of squares): as the CPU rotated them, up to a few f32
                // ulps, which an f16 cache may round to the neighbouring half. Check that, then give
                // the CPU's cache the device's rows, so later calls compare the attention alone.
                const size_t row_elems = size_t(m) * cpu.kv[0].k_width;
                const size_t first = size_t(pos) * cpu.kv[0].k_width;
                std::vector<float> device_k(row_elems), cpu_k(row_elems);
                if (c.kv == Format::F16) {
                    const std::vector<uint16_t> h = download(static_cast<const uint16_t*>(t.ctx.kv[0].k) + first, row_elems);
                    for (size_t e = 0; e < row_elems; ++e) {
                        device_k[e] = f16_to_f32(h[e]);
                        cpu_k[e] = f16_to_f32(cpu.kv[0].k16[first + e]);
                        cpu.kv[0].k16[first + e] = h[e];
                    }
                } else {
                    device_k = download(static_cast<const float*>(t.ctx.kv[0].k) + first, row_elems);
                    std::copy(cpu.kv[0].k32.begin() + long(first), cpu.kv[0].k32.begin() + long(first + row_elems), cpu_k.begin());
                    std::copy(device_k.begin(), device_k.end(), cpu.kv[0].k32.begin() + long(first));
                }
                const double k_err = relative_error(device_k, cpu_k);
                KCAP_EXPECT(k_err <= (c.kv == Format::F16 ? 1e-3 : kExactTolerance),
                            "%s appended K rows at %d..%d differ from the CPU's rotation: %.3g", kernel, pos, pos + m - 1,
                            k_err);
            }
            // A decode token's output also comes as q8_1 for the output projection (one split:
            // the decode groups write it; several: the combine).
            if (m == 1 && c.head_dim_v % 32 == 0)
                expect_q8_rows_of(t, out, got, 1, c.n_head * c.head_dim_v,
                                  std::string(kernel) + " decode at " + std::to_string(pos));
            else  // runs would straddle heads (or a batch): nothing announced
                KCAP_EXPECT(t.ctx.q8_rows_next.x == nullptr, "%s %s of %d at %d, head_dim_v %d: q8_1 rows announced",
                            kernel, m == 1 ? "decode" : "prefill", m, pos, c.head_dim_v);
            const bool tensor_cores = std::string(kernel).rfind("cuda.attention_mma", 0) == 0 && m > 1 &&
                                      cuda_rows::attn_mma_dims(c.head_dim, c.head_dim_v);
            const int span = c.window > 0 ? std::min(c.window, pos + m) : pos + m;
            const double tolerance = attention_tolerance(tensor_cores, span, c.head_dim);
            KCAP_EXPECT(err <= tolerance,
                        "%s heads %d/%d dim %d/%d window %d softcap %g kv %s features %s own rope %d, %s of %d at %d "
                        "(splits %d): error %.3g > %.3g",
                        kernel, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window, double(c.softcap), format_name(c.kv),
                        feature_names(stage.features).c_str(), int(t.ctx.attn_own_rope), m == 1 ? "decode" : "prefill", m,
                        pos, c.n_splits, err, tolerance);
            ++g_cases;
            // A shared-KV layer at the same positions: other queries over the cache this call
            // filled, no K/V of its own; the cache must be left as it was. (The rope-owning rows
            // take no shared-KV stage: the planner leaves such a layer's rope stage apart.)
            if (owns_rope) {
                Stage shared = stage;
                shared.params.kv_layer = 0;
                shared.features |= kKvShared;
                KCAP_EXPECT(!rejection_reason(row, shared).empty(), "%s takes a shared-KV stage", kernel);
                ++g_cases;
            } else {
                Stage shared = stage;
                shared.layer = 1;
                shared.params.kv_layer = 0;
                shared.features = kKvShared;
                KCAP_EXPECT(rejection_reason(row, shared).empty(), "%s refuses kv_shared", kernel);
                const std::vector<float> q2 = random_floats(rng, size_t(m) * c.n_head * c.head_dim);
                std::vector<float> ref2(ref.size());
                KernelCall call2;
                call2.n_tokens = m;
                call2.pos0 = pos;
                call2.in = q2.data(), call2.out = ref2.data();
                run_cpu(cpu_twin(row), shared, call2, cpu);
                const size_t k_bytes = size_t(n_ctx) * c.n_head_kv * c.head_dim * elem;
                const std::vector<uint8_t> k_before = download(static_cast<const uint8_t*>(t.ctx.kv[0].k), k_bytes);
                float* out2 = static_cast<float*>(t.arena.alloc(ref2.size() * 4));
                call2.in = t.arena.upload(q2), call2.out = out2;
                t.run(row, shared, call2, data);
                const double err2 = relative_error(download(out2, ref2.size()), ref2);
                const bool untouched = download(static_cast<const uint8_t*>(t.ctx.kv[0].k), k_bytes) == k_before;
                KCAP_EXPECT(err2 <= tolerance && untouched,
                            "%s kv_shared heads %d/%d, %s of %d at %d: error %.3g, cache %s", kernel, c.n_head,
                            c.n_head_kv, m == 1 ? "decode" : "prefill", m, pos, err2, untouched ? "untouched" : "written");
                ++g_cases;
            }
            pos += m;
        }
    }
    if (owns_rope) {  // just outside what the rows' rope takes: refused, not computed
        Stage stage;
        stage.op = Op::Attention;
        stage.params.n_head = 4, stage.params.n_head_kv = 2, stage.params.head_dim = stage.params.head_dim_v = 128;
        stage.params.rope_dim = 64;
        stage.kv_format = Format::F16;
        stage.k = 128;
        stage.features = kRopeNormal | kPartialRotary | kGqa;
        KCAP_EXPECT(!rejection_reason(row, stage).empty(), "%s takes a partial rotary rope", kernel);
        stage.features = kRopeNormal | kGqa;  // the same without the flag: rope_dim is checked too
        KCAP_EXPECT(!rejection_reason(row, stage).empty(), "%s takes rope_dim 64 of head_dim 128", kernel);
        stage.params.rope_dim = 128;
        stage.features = kGqa;  // no rope to own: the plain rows' stage
        KCAP_EXPECT(!rejection_reason(row, stage).empty(), "%s takes a stage that owns no rope", kernel);
        stage.params.head_dim = stage.params.head_dim_v = stage.params.rope_dim = 96;
        stage.k = 96;
        stage.features = kRopeNeox | kGqa;
        const std::string why = rejection_reason(row, stage);
        KCAP_EXPECT(why.find("NeoX") != std::string::npos || !row.dims.head_dims.empty(),
                    "%s takes a NeoX rope at head_dim 96 (%s)", kernel, why.c_str());
        KCAP_EXPECT(!why.empty(), "%s takes a NeoX rope at head_dim 96", kernel);
        stage.features = kRopeNormal | kGqa;  // normal pairs lie in one lane's quad: any head_dim % 4
        KCAP_EXPECT(rejection_reason(row, stage).empty() == row.dims.head_dims.empty(),
                    "%s at head_dim 96 with a normal rope: %s", kernel, rejection_reason(row, stage).c_str());
        g_cases += 5;
    }
}

void test_elementwise(std::mt19937& rng, CpuState& cpu) {
    for (int tokens : {1, 7})
        for (Activation act : {Activation::SiLU, Activation::GeluTanh, Activation::GeluErf, Activation::ReLU})
            for (bool gated : {false, true}) {
                TestContext t;
                const int64_t n = 2000;
                Stage stage;
                stage.op = Op::FfnActivation;
                stage.k = stage.n = n;
                stage.params.activation = act;
                const std::vector<float> gate = random_floats(rng, size_t(tokens * n), 6.0f);
                const std::vector<float> up = random_floats(rng, size_t(tokens * n));
                std::vector<float> ref(gate.size());
                KernelCall call;
                call.n_tokens = tokens;
                call.in = gate.data(), call.in2 = gated ? up.data() : nullptr, call.out = ref.data();
                run_cpu(find_row("cpu.ffn_activation"), stage, call, cpu);
                float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                call.in = t.arena.upload(gate), call.in2 = gated ? t.arena.upload(up) : nullptr, call.out = out;
                t.run(find_row("cuda.ffn_activation"), stage, call, StageData());
                const double err = relative_error(download(out, ref.size()), ref);
                KCAP_EXPECT(err <= kExactTolerance, "cuda.ffn_activation %s gated=%d tokens=%d: error %.3g",
                            activation_name(act), int(gated), tokens, err);
                ++g_cases;
            }
    for (const char* kernel : {"add", "softcap", "scale"}) {
        TestContext t;
        const int tokens = 3;
        const int64_t n = 4099;
        Stage stage;
        stage.op = std::string(kernel) == "add" ? Op::Add : std::string(kernel) == "scale" ? Op::Scale : Op::Softcap;
        stage.k = stage.n = n;
        stage.params.softcap = 30.0f;
        stage.params.scale = 0.22f;  // the residual scale of add, the logit scale of scale
        const std::vector<float> a = random_floats(rng, size_t(tokens * n), 40.0f), b = random_floats(rng, size_t(tokens * n));
        std::vector<float> ref(a.size());
        KernelCall call;
        call.n_tokens = tokens;
        call.in = a.data(), call.in2 = b.data(), call.out = ref.data();
        run_cpu(find_row(std::string("cpu.") + kernel), stage, call, cpu);
        float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
        call.in = t.arena.upload(a), call.in2 = t.arena.upload(b), call.out = out;
        t.run(find_row(std::string("cuda.") + kernel), stage, call, StageData());
        const double err = relative_error(download(out, ref.size()), ref);
        KCAP_EXPECT(err <= kExactTolerance, "cuda.%s: error %.3g", kernel, err);
        ++g_cases;
    }
    {
        // A block's output scale (Gemma 4): the residual stream scaled in place.
        TestContext t;
        const int tokens = 5;
        const int64_t n = 1001;
        Stage stage;
        stage.op = Op::Scale;
        stage.k = stage.n = n;
        stage.params.scale = 0.37f;
        stage.features = kLayerOutputScale;
        KCAP_EXPECT(rejection_reason(find_row("cuda.scale"), stage).empty(), "cuda.scale refuses layer_output_scale");
        const std::vector<float> a = random_floats(rng, size_t(tokens * n));
        std::vector<float> ref = a;
        KernelCall call;
        call.n_tokens = tokens;
        call.in = ref.data(), call.out = ref.data();
        run_cpu(find_row("cpu.scale"), stage, call, cpu);
        float* x = t.arena.upload(a);
        call.in = x, call.out = x;
        t.run(find_row("cuda.scale"), stage, call, StageData());
        const double err = relative_error(download(x, ref.size()), ref);
        KCAP_EXPECT(err <= kExactTolerance, "cuda.scale in place (layer output scale): error %.3g", err);
        ++g_cases;
    }
}

// Fused rows against the CPU rows of the stages they replace.
void test_qk_norm_rope(std::mt19937& rng, CpuState& cpu) {
    const Row& row = find_row("cuda.qk_norm_rope");
    for (bool neox : {false, true})
        for (int head_dim : {64, 128, 256})
            for (bool partial : {false, true})
                for (bool with_factors : {false, true}) {
                    TestContext t;
                    const int tokens = 5, n_head = 8, n_head_kv = 2, pos0 = 4090;
                    const int rope_dim = partial ? head_dim / 2 : head_dim;
                    std::vector<float> factor_values = random_floats(rng, static_cast<size_t>(rope_dim / 2));
                    for (auto& f : factor_values) f = 1.0f + std::fabs(f);
                    auto factors = float_vector(factor_values, "rope_freqs");
                    auto qw = float_vector(random_floats(rng, size_t(head_dim)), "q_norm");
                    auto kw = float_vector(random_floats(rng, size_t(head_dim)), "k_norm");
                    Stage stage;
                    stage.op = Op::QkNormRope;
                    stage.operands = {&qw->ref, &kw->ref, with_factors ? &factors->ref : nullptr};
                    stage.params.n_head = n_head, stage.params.n_head_kv = n_head_kv, stage.params.head_dim = head_dim;
                    stage.params.rope_dim = rope_dim, stage.params.rope_base = 500000.0f, stage.params.eps = 1e-6f;
                    stage.features = kRmsNorm | (neox ? kRopeNeox : kRopeNormal) | (partial ? kPartialRotary : 0u) |
                                     (with_factors ? kRopeFreqFactors : 0u);
                    const std::vector<float> q0 = random_floats(rng, static_cast<size_t>(tokens * n_head * head_dim), 3.0f);
                    const std::vector<float> k0 = random_floats(rng, static_cast<size_t>(tokens * n_head_kv * head_dim), 3.0f);
                    std::vector<float> q_ref = q0, k_ref = k0;
                    cpu_qk_norm_rope(stage, tokens, pos0, q_ref, k_ref, cpu);
                    StageData data;
                    data.operands[0] = t.arena.upload_bytes(qw->ref.data, qw->ref.nbytes);
                    data.operands[1] = t.arena.upload_bytes(kw->ref.data, kw->ref.nbytes);
                    data.rope_table = t.arena.upload(rope_cos_sin_table(stage, pos0 + tokens));
                    float* q = t.arena.upload(q0);
                    float* k = t.arena.upload(k0);
                    t.set_step(pos0);
                    KernelCall call;
                    call.n_tokens = tokens;
                    call.out = q;
                    call.inout2 = k;
                    t.run(row, stage, call, data);
                    const double err =
                        std::max(relative_error(download(q, q0.size()), q_ref), relative_error(download(k, k0.size()), k_ref));
                    KCAP_EXPECT(err <= kExactTolerance, "cuda.qk_norm_rope neox=%d head_dim=%d rope_dim=%d factors=%d: error %.3g",
                                int(neox), head_dim, rope_dim, int(with_factors), err);
                    ++g_cases;
                }
}

void test_add_norm(std::mt19937& rng, CpuState& cpu) {
    const Row& row = find_row("cuda.add_norm");
    // 1001: the row walk (not a multiple of 4); 8192: two float4 per thread in registers.
    for (int64_t width : {64, 640, 1000, 1001, 4096, 5120, 8192})
        for (int tokens : {1, 5})
            for (bool layer : {false, true})
                for (bool post : {false, true})
                for (bool vec : {false, true}) {  // rows in registers (kcap_add_norm_vec) or walked
                    if (vec && width % 4 != 0) continue;
                    TestContext t;
                    t.ctx.add_norm_vec = vec;
                    auto post_w = float_vector(random_floats(rng, size_t(width)), "pw");
                    auto post_b = float_vector(random_floats(rng, size_t(width)), "pb");
                    auto w = float_vector(random_floats(rng, size_t(width)), "w");
                    auto b = float_vector(random_floats(rng, size_t(width)), "b");
                    const bool post_bias = post && layer;  // a Layer post-norm with its bias
                    Stage stage;
                    stage.op = Op::AddNorm;
                    stage.operands = {post ? &post_w->ref : nullptr, post_bias ? &post_b->ref : nullptr, &w->ref,
                                      layer ? &b->ref : nullptr};
                    stage.k = stage.n = width;
                    stage.params.eps = 1e-6f;
                    stage.params.scale = layer ? 0.4f : 1.0f;
                    stage.features = (layer ? kLayerNorm | kBias | kResidualScale : kRmsNorm) | (post ? kPostNorm : 0u);
                    std::vector<float> residual = random_floats(rng, size_t(tokens * width), 8.0f);
                    const std::vector<float> branch = random_floats(rng, size_t(tokens * width), 3.0f);
                    float* d_residual = t.arena.upload(residual);
                    const std::vector<float> ref = cpu_add_norm(stage, tokens, residual, branch, cpu);
                    StageData data;
                    data.operands[0] = post ? t.arena.upload_bytes(post_w->ref.data, post_w->ref.nbytes) : nullptr;
                    data.operands[1] = post_bias ? t.arena.upload_bytes(post_b->ref.data, post_b->ref.nbytes) : nullptr;
                    data.operands[2] = t.arena.upload_bytes(w->ref.data, w->ref.nbytes);
                    data.operands[3] = layer ? t.arena.upload_bytes(b->ref.data, b->ref.nbytes) : nullptr;
                    float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                    KernelCall call;
                    call.n_tokens = tokens;
                    call.in = d_residual;
                    call.inout2 = d_residual;
                    call.in2 = t.arena.upload(branch);
                    call.out = out;
                    CHECK(cudaMemset(t.ctx.q8_rows, 0xff, t.ctx.q8_rows_capacity));  // poison: d = NaN
                    t.run(row, stage, call, data);
                    const std::vector<float> normed = download(out, ref.size());
                    const double err = std::max(relative_error(normed, ref),
                                                relative_error(download(d_residual, residual.size()), residual));
                    KCAP_EXPECT(err <= kExactTolerance, "cuda.add_norm width=%lld tokens=%d layer=%d post=%d vec=%d: error %.3g",
                                (long long)width, tokens, int(layer), int(post), int(vec), err);
                    // With q8_1 rows in the plan (TestContext has them), the normed rows' q8_1 for the
                    // next stage: bit for bit the rounding of what was written, and announced.
                    if (width % 32 == 0) expect_q8_rows_of(t, out, normed, tokens, int(width), "cuda.add_norm");
                    ++g_cases;
                }
}

void test_gate_up(std::mt19937& rng, CpuState& cpu) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::GateUp) continue;
        const Format f = row_format(row);
        const bool q8 = row.input_encoding == Encoding::Q8_1;
        const bool bf16 = row.input_encoding == Encoding::BF16;  // the GEMM from kGemmMinTokens on
        for (int64_t k : k_edges(row, 4096))
            for (int64_t n : {7, 130})
                for (int m : {1, 3, 17, 67})
                for (int pre : {0, 1})  // the q8_1 matvec's x quantized by its groups or once
                for (int team_rows : {1, 2}) {  // rows per team of the matvec (2: a wide matrix's)
                    if (pre && !(q8 && m < cuda_rows::kMmaMinTokens)) continue;
                    if (team_rows == 2 && !(m == 1 || (q8 && m < cuda_rows::kMmaMinTokens))) continue;
                    TestContext t;
                    t.ctx.q8_prequantize = pre;
                    t.ctx.matvec_rows = team_rows;
                    t.ctx.mma_group = n != 7 || m != 17;  // also a batch of one tile launch per matrix
                    t.ctx.mma_q8_tokens = m == 67 ? 128 : 64;  // the int8 tiles' tokens per group
                    const bool gemm = bf16 && m >= cuda_rows::kGemmMinTokens;
                    if (gemm) t.use_gemm(n == 7 ? size_t(1) << 22 : size_t(64 * k));  // n = 130: in chunks
                    auto gate = random_weights(rng, f, k, n);
                    auto up = random_weights(rng, f, k, n);
                    const std::vector<float> x = random_floats(rng, size_t(m * k));
                    // What the row multiplies.
                    const std::vector<float> xr = q8 ? q8_1_values(x) : gemm ? bf16_values(x) : x;
                    const auto gate_r = gemm ? bf16_weights(gate->ref, k, n) : nullptr;
                    const auto up_r = gemm ? bf16_weights(up->ref, k, n) : nullptr;
                    const TensorRef& gate_ref = gemm ? gate_r->ref : gate->ref;
                    const TensorRef& up_ref = gemm ? up_r->ref : up->ref;
                    const std::vector<float> ref = cpu_gate_up(cpu_matmul_row(gemm ? Format::F32 : f), gate_ref, up_ref,
                                                               xr, k, n, m, Activation::SiLU, cpu);
                    Stage stage;
                    stage.input_encoding = row.input_encoding;
                    stage.op = Op::GateUp;
                    stage.operands = {&gate->ref, &up->ref};
                    stage.k = k;
                    stage.n = n;
                    stage.params.activation = Activation::SiLU;
                    stage.features = kSilu | kGated;
                    StageData data;
                    data.operands[0] = t.arena.upload_bytes(gate->ref.data, gate->ref.nbytes);
                    data.operands[1] = t.arena.upload_bytes(up->ref.data, up->ref.nbytes);
                    float* out = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                    KernelCall call;
                    call.n_tokens = m;
                    call.in = t.arena.upload(x);
                    call.out = out;
                    call.inout2 = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                    call.inout3 = static_cast<float*>(t.arena.alloc(ref.size() * 4));
                    t.run(row, stage, call, data);
                    const double tolerance = gemm                                       ? gemm_tolerance(k)
                                             : !q8 && m >= cuda_rows::kMmaMinTokens ? kMmaTolerance
                                                                                    : kExactTolerance;
                    const double err =
                        gate_up_error(download(out, ref.size()), ref, gate_ref, up_ref, xr.data(), k, n, m, Activation::SiLU);
                    KCAP_EXPECT(err <= tolerance, "%s K=%lld N=%lld M=%d prequantized=%d rows=%d: error %.3g > %.2g",
                                row.kernel.c_str(), (long long)k, (long long)n, m, pre, team_rows, err, tolerance);
                    ++g_cases;
                }
    }
}

// cuda.qkv: three matrices of mixed formats against one x, each compared with its CPU
// matmul row (one token: the three-segment matvec; a batch: the tiles of each format in one
// launch, or of two formats in one (cuda.qkv_q8), else each format's batched row).
void test_qkv(std::mt19937& rng, CpuState& cpu) {
  for (const char* kernel : {"cuda.qkv", "cuda.qkv_q8", "cuda.qkv_bf16"}) {
    const Row& row = find_row(kernel);
    const bool q8 = row.input_encoding == Encoding::Q8_1;  // against the CPU rows on q8_1(x)
    const bool bf16 = row.input_encoding == Encoding::BF16;  // from kGemmMinTokens on: on bf16(W), bf16(x)
    struct Mix {
        Format q, k, v;
        int64_t width;
    };
    const Mix mixes[] = {
        {Format::Q5_0, Format::Q5_0, Format::Q8_0, 640},   // Gemma 3 270M
        {Format::Q4_K, Format::Q4_K, Format::Q6_K, 4096},  // Llama-3-8B Q4_K_M
        {Format::F16, Format::BF16, Format::F32, 100},     // float formats with a K tail
        {Format::Q4_0, Format::BF16, Format::Q4_1, 96},     // a float format next to block formats
        // A batch groups the matrices of one format into one launch (cuda/mma_tiles.h, MmaGroup):
        {Format::Q4_K, Format::Q4_K, Format::Q4_K, 512},   // all three in one grid
        {Format::Q8_0, Format::Q4_0, Format::Q8_0, 128},   // Q with V, K alone
        // Two formats in one launch (cuda.qkv_q8, matmul_q8.cu: KCAP_Q8_TILE_PAIRS), at 40 and
        // 100 tokens: the Q4_K / Q6_K mix above and this one (the pair in the other order; K
        // and V one group of two matrices).
        {Format::Q6_K, Format::Q5_K, Format::Q5_K, 256},
    };
    for (const Mix& mix : mixes)
        for (int m : {1, 3, 17, 40, 67, 100})
        // Fewer than kMmaMinTokens tokens (q8_1): the matvec's x quantized by its groups or once
        // (q8_prequantize); 100 tokens (two token tiles of 64, the second partial): the tiles'
        // weights read from global memory or staged (mma_staged).
        for (int pre : {0, 1}) {
            const Format formats[3] = {mix.q, mix.k, mix.v};
            if (q8 && (!cuda_rows::q8_format(mix.q) || !cuda_rows::q8_format(mix.k) || !cuda_rows::q8_format(mix.v)))
                continue;
            if (pre && !(q8 && m < cuda_rows::kMmaMinTokens) && m != 100) continue;
            if (bf16 && mix.width % 32 != 0) continue;  // whole runs only (the row refuses a tail: host test)
            const bool gemm = bf16 && m >= cuda_rows::kGemmMinTokens;
            if (gemm && pre) continue;
            TestContext t;
            if (gemm) t.use_gemm(m == 100 ? size_t(64 * mix.width) : size_t(1) << 22);  // 100 tokens: in chunks
            if (m == 100) t.ctx.mma_staged = pre;
            else t.ctx.q8_prequantize = pre;
            t.ctx.mma_group = m != 17;  // 17 tokens: the tiles one launch per matrix (KCAP_MMA_GROUP=0)
            t.ctx.mma_q8_tokens = m == 67 ? 128 : 64;  // the int8 tiles' tokens per group (40, 100: two-format pairs)
            const int64_t k = mix.width, rows[3] = {k * 2 + 7, k / 2 + 3, k / 2 + 3};
            const std::vector<float> x = random_floats(rng, size_t(m * k));
            const std::vector<float> xr = q8 ? q8_1_values(x) : gemm ? bf16_values(x) : x;  // what the row multiplies
            Stage stage;
            stage.op = Op::Qkv;
            stage.input_encoding = row.input_encoding;
            stage.k = k;
            stage.n = rows[0];
            StageData data;
            std::vector<std::unique_ptr<Weights>> weights, rounded;
            std::vector<std::vector<float>> refs;
            float* outs[3];
            for (int i = 0; i < 3; ++i) {
                weights.push_back(random_weights(rng, formats[i], k, rows[i]));
                stage.operands.push_back(&weights.back()->ref);
                data.operands[i] = t.arena.upload_bytes(weights.back()->ref.data, weights.back()->ref.nbytes);
                // The GEMM's reference: the exact F32 row on bf16(W) (and bf16(x): xr).
                rounded.push_back(gemm ? bf16_weights(weights.back()->ref, k, rows[i]) : nullptr);
                const TensorRef& w_ref = gemm ? rounded.back()->ref : weights.back()->ref;
                refs.emplace_back(size_t(m * rows[i]));
                KernelCall cpu_call;
                cpu_call.n_tokens = m;
                cpu_call.in = xr.data();
                cpu_call.out = refs.back().data();
                run_cpu(cpu_matmul_row(gemm ? Format::F32 : formats[i]), matmul_stage(&w_ref, nullptr, k, rows[i]), cpu_call, cpu);
                outs[i] = static_cast<float*>(t.arena.alloc(refs.back().size() * 4));
            }
            KernelCall call;
            call.n_tokens = m;
            call.in = t.arena.upload(x);
            call.out = outs[0];
            call.inout2 = outs[1];
            call.inout3 = outs[2];
            KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses its mix", kernel);
            t.run(row, stage, call, data);
            for (int i = 0; i < 3; ++i) {
                const bool mma = !q8 && m >= cuda_rows::kMmaMinTokens && cuda_rows::mma_format(formats[i]) && k % 32 == 0;
                const double tolerance = gemm ? gemm_tolerance(k) : mma ? kMmaTolerance : kExactTolerance;
                const double err = matmul_error(download(outs[i], refs[size_t(i)].size()), refs[size_t(i)],
                                                gemm ? rounded[size_t(i)]->ref : weights[size_t(i)]->ref, xr.data(), k,
                                                rows[i], m);
                KCAP_EXPECT(err <= tolerance, "%s %s/%s/%s K=%lld M=%d prequantized=%d matrix %d: error %.3g > %.2g",
                            kernel, format_name(mix.q), format_name(mix.k), format_name(mix.v), (long long)k, m, pre, i,
                            err, tolerance);
                ++g_cases;
            }
        }
  }
}

void test_argmax(std::mt19937& rng) {
    const Row& row = find_row("cuda.argmax");
    for (int count : {1, 4097, 262144})
        for (bool advance : {false, true}) {
            TestContext t;
            std::vector<float> logits = random_floats(rng, size_t(count));
            if (count > 10) {  // a tie: the lower index wins
                const float top = *std::max_element(logits.begin(), logits.end()) + 1.0f;
                logits[size_t(count / 2)] = top;
                logits[size_t(count - 1)] = top;
            }
            const int expected = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
            Stage stage;
            stage.op = Op::Argmax;
            stage.k = stage.n = count;
            t.set_step(41, 3);
            KernelCall call;
            call.n_tokens = 1;
            call.in = t.arena.upload(logits);
            call.out = reinterpret_cast<float*>(t.ctx.argmax_result);
            call.inout2 = advance ? reinterpret_cast<float*>(t.ctx.history) : nullptr;
            t.run(row, stage, call, StageData());
            const int result = download(t.ctx.argmax_result, 1)[0];
            const std::vector<int32_t> step = download(t.ctx.step, 2);
            KCAP_EXPECT(result == expected, "cuda.argmax of %d: %d, expected %d", count, result, expected);
            if (advance) {
                KCAP_EXPECT(download(t.ctx.tokens, 1)[0] == expected && download(t.ctx.history, 4)[3] == expected &&
                                step[0] == 42 && step[1] == 4,
                            "cuda.argmax advance: token/history/step not fed back");
            } else {
                KCAP_EXPECT(step[0] == 41 && step[1] == 3, "cuda.argmax without advance moved the step");
            }
            ++g_cases;
        }
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short by a time limit keeps what it printed
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("SKIP: no CUDA device\n");
        return 77;
    }
    // KCAP_TEST_SEED=N draws other random inputs (the default keeps runs comparable).
    const char* seed = std::getenv("KCAP_TEST_SEED");
    std::mt19937 rng(seed && *seed ? unsigned(std::strtoul(seed, nullptr, 10)) : 20251129u);
    CpuState cpu(16);
    // Every CUDA row must be compiled in and covered below.
    for (const Row& row : capability_table())
        if (row.backend == Backend::CUDA) KCAP_EXPECT(row.fn != nullptr, "%s has no kernel", row.kernel.c_str());
    // KCAP_TEST_ROWS=name,name runs only those groups (a short device call); unset, all of them.
    const char* only = std::getenv("KCAP_TEST_ROWS");
    const auto wanted = [&](const char* name) {
        if (!only || !*only) return true;
        const std::string list = std::string(",") + only + ",";
        return list.find(std::string(",") + name + ",") != std::string::npos;
    };
    if (wanted("matmul")) {
        test_matmul(rng, cpu);
        std::printf("matmul rows done (%d cases)\n", g_cases);
    }
    if (wanted("embed")) test_embed(rng, cpu);
    if (wanted("norm")) test_norm(rng, cpu);
    if (wanted("rope")) test_rope(rng, cpu);
    if (wanted("attention")) {
        test_attention(rng, cpu, "cuda.attention");
        test_attention(rng, cpu, "cuda.attention_mma");
        test_attention(rng, cpu, "cuda.attention_rope");
        test_attention(rng, cpu, "cuda.attention_mma_rope");
    }
    if (wanted("elementwise")) test_elementwise(rng, cpu);
    if (wanted("add_norm")) test_add_norm(rng, cpu);
    if (wanted("gate_up")) test_gate_up(rng, cpu);
    if (wanted("qkv")) test_qkv(rng, cpu);
    if (wanted("qk_norm_rope")) test_qk_norm_rope(rng, cpu);
    if (wanted("ple")) test_ple(rng, cpu);
    if (wanted("argmax")) test_argmax(rng);
    if (only && *only) std::printf("only %s (KCAP_TEST_ROWS)\n", only);
    std::printf("%d cases, %d failures\n", g_cases, failures());
    return failures() ? 1 : 0;
}

#endif
