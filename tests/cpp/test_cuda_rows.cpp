// Every CUDA row of the capability table, launched for real on the GPU through its row.fn
// (a KernelCall with the row set, as the executor makes it), against the CPU reference row of
// the same op on fresh random inputs, with outputs poisoned (NaN) before every launch. Driven by
// the table: each CUDA row runs cases at the edges of its legal dims (K at its smallest legal
// value, an odd multiple and a long one; rows and tokens not multiples of any tile) and of its
// token range (row_tokens on this device: the first count, the next, a middle one and the last
// where bounded, a few past the tiles' sizes where not). Geometry that follows from the stage
// is reached through the stage's dims: the staged tensor-core tiles from K = kStagedMinK, the
// decode matvec's two rows per team from N = kMatvecWideN, add_norm's register path where the
// row fits kAddNormVecMax float4 per thread, the decode combine where a span takes several
// splits. A row that reads the q8_1 scratch (kQ8Input: the _in rows) gets q8_1(x) written
// there from the CPU (q8_1_scratch, the layout of kcap_q8_quantize_rows) and a NaN x, so it
// must read the scratch; a row that writes it (kQ8Output) must leave there, bit for bit, the
// q8_1 of what it wrote, and every other row must leave the poisoned scratch as it was.
//
// Tolerances (relative L2 error against the CPU row; for matmuls relative to ||(|W| |x|)||,
// the scale reordered sums err against, since one output's terms may cancel):
//   exact rows (cuda.matvec.*, cuda.matmul_tokens.*, cuda.gate_up[_tokens].*, cuda.qkv[_tokens],
//               embed, norm, rope, elementwise, add_norm, per_layer_embed, per_layer_gate)
//                                                                   1e-5 (f32, another summation order)
//   cuda.matmul_mma.*, cuda.gate_up_mma.*, cuda.qkv_mma (split-bf16 tiles)      3e-5, derived: the
//       weights are exact (scale x bf16-exact code + offset, f32 scale and offset) and
//       x = x_hi + x_lo + e with |e| <= 2^-16 |x| (two bf16 roundings), products exact, f32
//       accumulation; so each output errs by <= 2^-16 sum |w x| (1.5e-5 of the scale) plus f32
//       summation (the exact rows' 1e-5).
//   q8_1 rows (cuda.matvec_q8*, cuda.matmul_q8_mma*, cuda.gate_up_q8*, cuda.qkv_q8*)   1e-5 against
//       the exact CPU row on q8_1(x) (q8_1_values): the integer products are exact; f32 scales
//       per sub-block and the f32 sums.
//   cuda.matmul_bf16.*, cuda.gate_up_bf16.*, cuda.qkv_bf16 (dequantize + cuBLAS) against the exact
//       CPU row on bf16(W) and bf16(x) (bf16_weights, bf16_values): 1e-5 + ceil(K / 8) 2^-23,
//       derived: products of two bf16 values are exact in f32, and the tensor cores' f32 sums
//       truncate (below), one ulp per mma step of at least 8 values of K. The same bound for
//       cuda.moe_experts_bf16_mma.* (tiles of bf16(W) . bf16(x)), its activations against f64
//       sums of those values, its output against the down of its own activations
//       (moe_bf16_reference); it stores the activations in bf16, so the bound holds what lies
//       outside each one's rounding interval (bf16_excess_error).
//   attention (online softmax, f32 exp)                            1e-5
//   cuda.attention_mma*'s tensor-core prefill                      1e-5 + (2 ceil(span / 16) + head_dim / 8) 2^-23,
//       derived: the products are exact (f16 K/V, queries and weights split hi + lo: 2^-22), but
//       the tensor cores add each mma's products into the f32 accumulator with truncation, not
//       round-to-nearest (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor
//       cores", 2021), so each accumulation may err by one f32 ulp (2^-23) in the same direction:
//       an output takes 2 per 16 keys it sees (hi and lo weights), a score 2 per 16 dims.
//       Measured on the H200: 1.04e-5 at 16500 keys (head_dim 64), within 1e-5 below ~1100.
//
// KCAP_TEST_ROWS=group,... runs only those groups (matmul, gate_up, qkv, attention, attention_mla, add_norm,
// norm, rope, qk_norm_rope, embed, ple, elementwise, argmax); KCAP_TEST_SEED=N draws other
// random inputs. Each group prints its cases, rows and seconds. With every group selected, the
// test fails if a CUDA row of the table ran no case. KCAP_TEST_CASES_PER_ROW=N bounds the groups
// of many cases per row (matmul, gate_up, qkv, attention, attention_mla, moe) to each row's first N cases (the
// smallest K and token counts come first; the attention cases are then taken least work first,
// and count for a row only where it ran), so every row still runs: what a run under
// compute-sanitizer can afford (scripts/cuda_sanitize.sh).
// Exit 77 (ctest: skipped) without CUDA in the build or without a device; the table's legal and
// just-illegal stages and its routes are test_rows_table's (no GPU needed).
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
#include <cstring>
#include <chrono>
#include <functional>
#include <map>
#include <set>

#include "cuda/cuda_context.h"
#include "dispatch/rope_table.h"
#include "dispatch/planner.h"

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
    // n floats of NaN: the input of a row that must not read it.
    float* nan_floats(size_t n) { return static_cast<float*>(alloc(n * 4)); }
};

template <class T>
std::vector<T> download(const T* p, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// The device the rows' token ranges and legal dims are computed for (row_tokens,
// rejection_reason): this GPU, as the CUDA backend plans for its own.
DeviceInfo g_device;
std::set<const Row*> g_ran;  // the rows that ran a case
int g_cases = 0;
int g_case_cap = 0;                      // KCAP_TEST_CASES_PER_ROW; 0: every case
std::map<const Row*, int> g_row_begun;  // cases begun per row, under a cap

// True where the row has begun its KCAP_TEST_CASES_PER_ROW cases: the caller skips the case
// before building it. Counts the case otherwise (count = false: the caller counts it, where the
// row ran).
bool over_case_cap(const Row& row, bool count = true) {
    if (g_case_cap <= 0) return false;
    if (g_row_begun[&row] >= g_case_cap) return true;
    if (count) ++g_row_begun[&row];
    return false;
}

// The q8_1 scratch: up to 48M values (the widest case: 16416-value rows of 15 tokens, 530
// tokens of a 128-token tile row).
constexpr size_t kQ8ScratchBytes = size_t(cuda_rows::q8_rows_bytes(1, 48LL << 20));

// A device context like the backend's, sized for one test.
struct TestContext {
    Arena arena;
    Context ctx;
    TestContext() {
        CHECK(cudaStreamCreate(&ctx.stream));
        ctx.sm_count = g_device.sm_count;
        int major = 0;
        CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
        ctx.pdl = major >= 9;
        ctx.step = static_cast<int32_t*>(arena.alloc(8));
        ctx.tokens = static_cast<int32_t*>(arena.alloc(4 * 4096));
        ctx.history = static_cast<int32_t*>(arena.alloc(4 * 4096));
        ctx.argmax_result = static_cast<int32_t*>(arena.alloc(4));
        ctx.argmax_partials = 1024;
        ctx.argmax_partial_value = static_cast<float*>(arena.alloc(4 * 1024));
        ctx.argmax_partial_index = static_cast<int32_t*>(arena.alloc(4 * 1024));
        const size_t candidates = size_t(KCAP_SAMPLE_MAX_PARTIALS) * KCAP_SAMPLE_MAX_TOP_K;
        ctx.sample_settings = static_cast<KcapSampleSettings*>(arena.alloc(sizeof(KcapSampleSettings)));
        ctx.sample_partial_value = static_cast<float*>(arena.alloc(4 * candidates));
        ctx.sample_partial_index = static_cast<int32_t*>(arena.alloc(4 * candidates));
        ctx.q8_rows_capacity = kQ8ScratchBytes;
        ctx.q8_rows = arena.alloc(ctx.q8_rows_capacity);
    }
    ~TestContext() {
        kcap::cuda::gemm_destroy(ctx.gemm);
        cudaStreamDestroy(ctx.stream);
    }
    // The bf16 rows' GEMM (cuBLAS): a weight scratch of weight_values (fewer values than a
    // matrix has make it go in chunks of rows) and inputs of up to 530 x 16416 values.
    void use_gemm(size_t weight_values) {
        ctx.gemm = kcap::cuda::gemm_create(ctx.stream, weight_values, size_t(530) * 16416, "");
    }
    void set_step(int pos, int generated = 0) {
        const int32_t step[2] = {pos, generated};
        CHECK(cudaMemcpy(ctx.step, step, 8, cudaMemcpyHostToDevice));
    }
    // Writes q8_1 rows (q8_1_scratch) into the scratch, as the stage before an _in row would.
    void write_q8(const Q8Scratch& q8, int m, int k) {
        const cuda::Q8Rows rows = cuda::q8_rows_layout(ctx, m, k);
        CHECK(cudaMemcpy(rows.codes, q8.codes.data(), q8.codes.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(rows.d, q8.d.data(), q8.d.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(rows.half_sums, q8.half_sums.data(), q8.half_sums.size() * 4, cudaMemcpyHostToDevice));
    }
    // Runs the row as the executor does: call.row set, the call's buffers of buffer_rows rows
    // (the call's tokens unless set), the q8_1 scratch poisoned unless the row reads it. A call
    // the row does not take (tokens outside its range on this device, a stage it refuses) is a
    // bug of the test: reported, not run.
    bool run(const Row& row, const Stage& stage, KernelCall call, const StageData& data) {
        const std::string why = rejection_reason(row, stage, g_device);
        const TokenRange range = row_tokens(row, stage, g_device);
        KCAP_EXPECT(why.empty() && range.contains(call.n_tokens), "test bug: %s called with %d tokens (takes %d..%d): %s",
                    row.kernel.c_str(), call.n_tokens, range.min, range.max, why.c_str());
        if (!why.empty() || !range.contains(call.n_tokens)) return false;
        call.row = &row;
        if (!call.buffer_rows) call.buffer_rows = call.n_tokens;
        if (!(row.requires_all & kQ8Input)) CHECK(cudaMemset(ctx.q8_rows, 0xff, ctx.q8_rows_capacity));
        call.backend_state = &ctx;
        call.stage_state = &data;
        row.fn(stage, call);
        CHECK(cudaStreamSynchronize(ctx.stream));
        CHECK(cudaGetLastError());
        g_ran.insert(&row);
        return true;
    }
};

// A row that writes q8_1 for the stage after it (kQ8Output) left, bit for bit, the rounding of
// what it wrote (m rows of k) in the scratch; any other row left the scratch poisoned there.
void expect_q8_output(TestContext& t, const Row& row, const std::vector<float>& written, int m, int k,
                      const std::string& what) {
    const cuda::Q8Rows rows = cuda::q8_rows_layout(t.ctx, m, k);
    const size_t n = size_t(m) * size_t(k);
    const std::vector<uint32_t> codes = download(rows.codes, n / 4);
    const std::vector<float> d = download(rows.d, n / 32);
    const std::vector<int32_t> half_sums = download(rows.half_sums, n / 16);
    int bad = 0;
    if (row.requires_all & kQ8Output) {
        const Q8Scratch want = q8_1_scratch(written, m, k);
        for (size_t i = 0; i < codes.size(); ++i) bad += codes[i] != want.codes[i];
        for (size_t i = 0; i < d.size(); ++i) bad += std::memcmp(&d[i], &want.d[i], 4) != 0;
        for (size_t i = 0; i < half_sums.size(); ++i) bad += half_sums[i] != want.half_sums[i];
        KCAP_EXPECT(bad == 0, "%s %s: %d q8_1 codes, scales or half sums differ from q8_1 of the output", row.kernel.c_str(),
                    what.c_str(), bad);
    } else {
        for (uint32_t c : codes) bad += c != 0xffffffffu;
        KCAP_EXPECT(bad == 0, "%s %s: wrote %d words of q8_1 it does not declare (kQ8Output)", row.kernel.c_str(),
                    what.c_str(), bad);
    }
}

// The token counts a case of the row takes at the edges of its range for this stage on this
// device: the first, the next, a middle one and the last where bounded; where unbounded, the
// counts of `past` beyond the first two (tile sizes and their remainders).
std::vector<int> token_edges(const Row& row, const Stage& stage, std::vector<int> past) {
    const TokenRange r = row_tokens(row, stage, g_device);
    std::vector<int> ms = {r.min};
    if (r.max == 0 || r.min + 1 <= r.max) ms.push_back(r.min + 1);
    if (r.max) {
        const int mid = (r.min + r.max) / 2;
        if (mid > r.min + 1 && mid < r.max) ms.push_back(mid);
        if (r.max > r.min + 1) ms.push_back(r.max);
    } else {
        for (int m : past)
            if (m > r.min + 1) ms.push_back(m);
    }
    return ms;
}

bool is_tile_row(const Row& row) { return row.kernel.find("_mma") != std::string::npos; }

// The K of a matmul-type row's cases: its smallest legal K, two multiples more (an odd
// multiple), one past the chunk its body stages x or weights in (the largest legal one where
// the row is bounded below that), and for a float format's exact rows three runs and a tail.
std::vector<int64_t> matmul_k_edges(const Row& row, int64_t step) {
    const LegalDims& dims = row.dims;
    const int64_t k0 = std::max(step, (dims.k_min + step - 1) / step * step);
    std::vector<int64_t> ks = {k0, k0 + 2 * step};
    const bool q8 = row.input_encoding == Encoding::Q8_1;
    // The staged tensor-core tiles (K >= kStagedMinK: 4096) with a ragged last chunk; the q8_1
    // matvec's 512-run chunks (16384 values); the exact matvec's 128-run chunks (4096).
    int64_t chunk = is_tile_row(row) || row.input_encoding == Encoding::BF16 ? 4096 : q8 ? 16384 : 4096;
    int64_t long_k = chunk + (is_tile_row(row) ? step : 3 * step);
    if (dims.k_max) long_k = dims.k_max / step * step;  // the q8_1 rows that round x in their groups
    if (long_k > ks.back()) ks.push_back(long_k);
    if (step < 32) ks.push_back(25 * step);  // 100 for a multiple of 4: three runs and a tail
    return ks;
}

// What a matmul-type row multiplies, and its reference: x as is (exact rows), q8_1(x), or
// bf16(x) with bf16(W) for the GEMM rows.
struct MatmulInputs {
    std::vector<float> x, xr;
};

MatmulInputs matmul_inputs(std::mt19937& rng, const Row& row, int m, int64_t k) {
    MatmulInputs in;
    in.x = random_floats(rng, size_t(m) * size_t(k));
    in.xr = row.input_encoding == Encoding::Q8_1   ? q8_1_values(in.x)
            : row.input_encoding == Encoding::BF16 ? bf16_values(in.x)
                                                   : in.x;
    return in;
}

// The bound of a matmul-type row (header).
double matmul_tolerance(const Row& row, int64_t k, Format f) {
    if (row.input_encoding == Encoding::BF16) return gemm_tolerance(k);
    if (row.input_encoding == Encoding::F32 && is_tile_row(row) && cuda_rows::mma_format(f)) return kMmaTolerance;
    return kExactTolerance;
}

// The call's input x: uploaded, or for a row that reads the q8_1 scratch (kQ8Input), q8_1(x)
// written there and a NaN x in its place. tail: the stage runs on the last of `m` buffered
// rows only (an LM head), so the call takes one token from row m - 1.
void bind_matmul_input(TestContext& t, const Row& row, const std::vector<float>& x, int m, int64_t k, bool tail,
                       KernelCall& call) {
    call.n_tokens = tail ? 1 : m;
    call.buffer_rows = m;
    call.row_offset = tail ? m - 1 : 0;
    if (row.requires_all & kQ8Input) {
        t.write_q8(q8_1_scratch(x, m, int(k)), m, int(k));
        call.in = t.arena.nan_floats(size_t(m) * size_t(k)) + (tail ? (m - 1) * k : 0);
    } else {
        call.in = t.arena.upload(x) + (tail ? (m - 1) * k : 0);
    }
}

// One case of a MatMul or GateUp row: K, N, m tokens (tail: the last of m buffered rows).
void matmul_case(std::mt19937& rng, CpuState& cpu, const Row& row, int64_t k, int64_t n, int m, bool with_bias,
                 bool tail) {
    if (over_case_cap(row)) return;
    const Format f = row_format(row);
    const bool gate_up = row.op == Op::GateUp;
    const bool gemm = row.input_encoding == Encoding::BF16;
    TestContext t;
    // The GEMM rows: the whole matrix in the weight scratch, or (N = 130) in chunks of 64 rows.
    if (gemm) t.use_gemm(n == 130 ? size_t(64 * k) : size_t(1) << 22);
    auto w0 = random_weights(rng, f, k, n);
    auto w1 = random_weights(rng, f, k, n);
    auto bias = float_vector(random_floats(rng, size_t(n)), "bias");
    Stage stage;
    if (gate_up) {
        stage.op = Op::GateUp;
        stage.operands = {&w0->ref, &w1->ref};
        stage.k = k;
        stage.n = n;
        stage.params.activation = Activation::SiLU;
        stage.features = kSilu | kGated;
    } else {
        stage = matmul_stage(&w0->ref, with_bias ? &bias->ref : nullptr, k, n);
    }
    stage.input_encoding = row.input_encoding;
    stage.features |= row.requires_all;
    const MatmulInputs in = matmul_inputs(rng, row, m, k);
    const int tokens = tail ? 1 : m;
    const std::vector<float> x_used(in.xr.end() - long(size_t(tokens) * size_t(k)), in.xr.end());
    const auto w0_r = gemm ? bf16_weights(w0->ref, k, n) : nullptr;
    const auto w1_r = gemm ? bf16_weights(w1->ref, k, n) : nullptr;
    const TensorRef& w0_ref = gemm ? w0_r->ref : w0->ref;
    const TensorRef& w1_ref = gemm ? w1_r->ref : w1->ref;
    const Row& reference = cpu_matmul_row(gemm ? Format::F32 : f);
    std::vector<float> ref(size_t(tokens) * size_t(n));
    if (gate_up) {
        ref = cpu_gate_up(reference, w0_ref, w1_ref, x_used, k, n, tokens, Activation::SiLU, cpu);
    } else {
        KernelCall call;
        call.n_tokens = tokens;
        call.in = x_used.data();
        call.out = ref.data();
        run_cpu(reference, matmul_stage(&w0_ref, with_bias ? &bias->ref : nullptr, k, n), call, cpu);
    }
    StageData data;
    data.operands[0] = t.arena.upload_bytes(w0->ref.data, w0->ref.nbytes);
    data.operands[1] = gate_up ? t.arena.upload_bytes(w1->ref.data, w1->ref.nbytes)
                       : with_bias ? t.arena.upload_bytes(bias->ref.data, bias->ref.nbytes)
                                   : nullptr;
    KernelCall call;
    bind_matmul_input(t, row, in.x, m, k, tail, call);
    float* y = t.arena.nan_floats(ref.size());
    call.out = y;
    if (gate_up) {  // the batched rows' gate and up scratch
        call.inout2 = t.arena.nan_floats(ref.size());
        call.inout3 = t.arena.nan_floats(ref.size());
    }
    if (!t.run(row, stage, call, data)) return;
    const std::vector<float> got = download(y, ref.size());
    const double err = gate_up ? gate_up_error(got, ref, w0_ref, w1_ref, x_used.data(), k, n, tokens, Activation::SiLU)
                               : matmul_error(got, ref, w0_ref, x_used.data(), k, n, tokens);
    const double tolerance = matmul_tolerance(row, k, f);
    KCAP_EXPECT(err <= tolerance, "%s K=%lld N=%lld tokens=%d%s bias=%d: error %.3g > %.2g", row.kernel.c_str(),
                (long long)k, (long long)n, tokens, tail ? " (last of the buffer)" : "", int(with_bias), err, tolerance);
    ++g_cases;
}

// Every MatMul (gate_up: GateUp) row: K edges x token edges, N = 130 at the smallest K (with a
// bias where the row takes one) and 7 elsewhere; the matvec rows also at N = kMatvecWideN + 3
// (two rows per team); the rows that read the scratch also for the last row of a buffer; the
// 128-token int8 tiles at an N whose range starts within a few hundred tokens on this device.
void test_matmul_rows(std::mt19937& rng, CpuState& cpu, Op op) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != op) continue;
        const Format f = row_format(row);
        Weights probe;
        probe.ref.format = f;
        const bool takes_bias = (row.features & kBias) != 0;
        const std::vector<int64_t> ks = matmul_k_edges(row, row.dims.k_multiple);
        // The range this row takes for a stage of N rows.
        auto stage_of = [&](int64_t k, int64_t n) {
            Stage s = matmul_stage(&probe.ref, nullptr, k, n);
            s.op = op;
            return s;
        };
        if (row.tokens_min_of) {
            // N in whole row tiles until the 128-token tiles start within a few hundred tokens.
            int64_t n = 130;
            while (row_tokens(row, stage_of(ks[0], n), g_device).min > 400) n += cuda_rows::kMmaRows;
            // The first count only (a batch of several full groups and one token): any N and count
            // here make about 0.9 x 128 x 128 outputs per group slot of the device, each checked
            // against its |W| |x| over K, so one case per row; the 64-token tiles take the rest.
            const int first = row_tokens(row, stage_of(ks[0], n), g_device).min;
            matmul_case(rng, cpu, row, ks[0], n, first, takes_bias, false);
            continue;
        }
        for (int64_t k : ks) {
            const int64_t n = k == ks[0] ? 130 : 7;
            const std::vector<int> ms = token_edges(row, stage_of(k, n), is_tile_row(row) ? std::vector<int>{67, 130}
                                                                                         : std::vector<int>{9, 67});
            for (int m : ms) {
                // The GEMM's input scratch holds up to 530 x 16416 values.
                matmul_case(rng, cpu, row, k, n, m, takes_bias && n == 130 && m % 2 == 1, false);
            }
        }
        const TokenRange range = row.tokens;
        if (range.max != 0 && range.max < cuda_rows::kMmaMinTokens)  // a matvec: two rows per team
            matmul_case(rng, cpu, row, ks[0], cuda_rows::kMatvecWideN + 3, 1, takes_bias, false);
        if ((row.requires_all & kQ8Input) && row.tokens.contains(1))  // an LM head's call: the last of three rows
            matmul_case(rng, cpu, row, ks[0], 7, 3, takes_bias, true);
    }
}

// Qkv rows: three matrices of mixed formats against one x (or a latent attention's pair: two,
// no V), some with biases (operands 3..5), each compared with the exact CPU row of its format
// and bias (on q8_1(x), or on bf16(W) and bf16(x), as the row rounds). Every mix the row takes,
// at the token edges of its range.
void test_qkv(std::mt19937& rng, CpuState& cpu) {
    struct Mix {
        Format q, k, v;
        int64_t width;
        int matrices = 3;
        unsigned biases = 0;  // bit i: matrix i has a bias
    };
    const Mix mixes[] = {
        {Format::Q5_0, Format::Q5_0, Format::Q8_0, 640},   // Gemma 3 270M
        {Format::Q4_K, Format::Q4_K, Format::Q6_K, 4096},  // Llama-3-8B Q4_K_M (the tiles staged)
        {Format::F16, Format::BF16, Format::F32, 100},     // float formats with a K tail
        {Format::Q4_0, Format::BF16, Format::Q4_1, 96},    // a float format next to block formats
        {Format::Q4_K, Format::Q4_K, Format::Q4_K, 512},   // the tiles: all three in one grid
        {Format::Q8_0, Format::Q4_0, Format::Q8_0, 128},   // Q with V, K alone
        // Two formats in one launch of the int8 tiles (the pair in the other order; K and V one
        // group of two matrices).
        {Format::Q6_K, Format::Q5_K, Format::Q5_K, 256},
        // Both sides of kQ8QuantizeMinK: rows the groups round (K 2016) and the _quant rows (2048).
        {Format::Q8_0, Format::Q4_0, Format::Q8_0, 2016},
        {Format::Q8_0, Format::Q4_0, Format::Q8_0, 2048},
        // Pairs (the latent attention's query and compressed KV row): one format, then two.
        {Format::Q4_K, Format::Q4_K, Format::F32, 512, 2},
        {Format::Q8_0, Format::Q6_K, Format::F32, 256, 2},
        // Biases: on all three (gpt-oss's Q8_0 attention, Qwen 2), on Q and V only, on K alone of
        // a format mix.
        {Format::Q8_0, Format::Q8_0, Format::Q8_0, 1024, 3, 7u},
        {Format::Q4_K, Format::Q4_K, Format::Q6_K, 512, 3, 5u},
        {Format::F16, Format::BF16, Format::F32, 100, 3, 2u},
    };
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::Qkv) continue;
        const bool gemm = row.input_encoding == Encoding::BF16;
        for (const Mix& mix : mixes) {
            const Format formats[3] = {mix.q, mix.k, mix.v};
            const int64_t k = mix.width, rows[3] = {k * 2 + 7, k / 2 + 3, k / 2 + 3};
            const int matrices = mix.matrices;
            Weights probe[3];
            Stage stage;
            stage.op = Op::Qkv;
            stage.input_encoding = row.input_encoding;
            stage.features = row.requires_all;
            stage.k = k;
            stage.n = rows[0];
            for (int i = 0; i < matrices; ++i) {
                probe[i].ref.format = formats[i];
                stage.operands.push_back(&probe[i].ref);
            }
            Weights probe_bias;
            probe_bias.ref.format = Format::F32;
            if (mix.biases) {
                for (int i = 0; i < 3; ++i) stage.operands.push_back(mix.biases >> i & 1u ? &probe_bias.ref : nullptr);
                stage.features |= kBias;
            }
            if (!rejection_reason(row, stage, g_device).empty()) continue;  // refusals: test_rows_table
            std::vector<int> ms = token_edges(row, stage, {40, 100});
            // The long rows (2016 and more values): the first two counts only (a partial tile of
            // the batched rows), as the CPU reference of 8199 x 4096 weights per token is slow.
            if (k >= 2016 && ms.size() > 2) ms.resize(2);
            for (int m : ms) {
                if (over_case_cap(row)) continue;
                TestContext t;
                // 100 tokens: the GEMM's weight scratch in chunks of 64 rows.
                if (gemm) t.use_gemm(m == 100 ? size_t(64 * k) : size_t(1) << 22);
                const MatmulInputs in = matmul_inputs(rng, row, m, k);
                StageData data;
                std::vector<std::unique_ptr<Weights>> weights, rounded, biases;
                std::vector<std::vector<float>> refs;
                float* outs[3] = {nullptr, nullptr, nullptr};
                stage.operands.clear();
                for (int i = 0; i < matrices; ++i)
                    biases.push_back(mix.biases >> i & 1u ? float_vector(random_floats(rng, size_t(rows[i])), "bias")
                                                          : nullptr);
                for (int i = 0; i < matrices; ++i) {
                    weights.push_back(random_weights(rng, formats[i], k, rows[i]));
                    stage.operands.push_back(&weights.back()->ref);
                    data.operands[i] = t.arena.upload_bytes(weights.back()->ref.data, weights.back()->ref.nbytes);
                    rounded.push_back(gemm ? bf16_weights(weights.back()->ref, k, rows[i]) : nullptr);
                    const TensorRef& w_ref = gemm ? rounded.back()->ref : weights.back()->ref;
                    refs.emplace_back(size_t(m * rows[i]));
                    KernelCall cpu_call;
                    cpu_call.n_tokens = m;
                    cpu_call.in = in.xr.data();
                    cpu_call.out = refs.back().data();
                    const TensorRef* b_ref = biases[size_t(i)] ? &biases[size_t(i)]->ref : nullptr;
                    run_cpu(cpu_matmul_row(gemm ? Format::F32 : formats[i]), matmul_stage(&w_ref, b_ref, k, rows[i]),
                            cpu_call, cpu);
                    outs[i] = t.arena.nan_floats(refs.back().size());
                }
                if (mix.biases)
                    for (int i = 0; i < 3; ++i) {
                        const Weights* b = biases[size_t(i)].get();
                        stage.operands.push_back(b ? &b->ref : nullptr);
                        if (b) data.operands[3 + i] = t.arena.upload_bytes(b->ref.data, b->ref.nbytes);
                    }
                KernelCall call;
                bind_matmul_input(t, row, in.x, m, k, false, call);
                call.out = outs[0];
                call.inout2 = outs[1];
                call.inout3 = outs[2];
                if (!t.run(row, stage, call, data)) continue;
                for (int i = 0; i < matrices; ++i) {
                    const double tolerance = matmul_tolerance(row, k, formats[i]);
                    const double err = matmul_error(download(outs[i], refs[size_t(i)].size()), refs[size_t(i)],
                                                    gemm ? rounded[size_t(i)]->ref : weights[size_t(i)]->ref, in.xr.data(),
                                                    k, rows[i], m);
                    KCAP_EXPECT(err <= tolerance, "%s %s/%s/%s K=%lld tokens=%d matrix %d of %d biases %u: error %.3g > %.2g",
                                row.kernel.c_str(), format_name(mix.q), format_name(mix.k), format_name(mix.v),
                                (long long)k, m, i, matrices, mix.biases, err, tolerance);
                }
                ++g_cases;
            }
        }
    }
}

struct AttentionCase {
    int n_head, n_head_kv, head_dim, head_dim_v, window;
    float softcap;
    Format kv;
    int prefix;   // positions written into both caches directly before the calls (no attention)
    int prefill;  // a chunk after the prefix (0: none)
    int decode_steps, n_splits;
    int prefill2 = 0;  // a second chunk (positions after the first), before the decode steps
};

// The attention rows: each case is a sequence of calls (a prefix written into the caches, one
// or two chunks, decode steps); a call whose token count the row takes runs on the row and is
// compared with the CPU row on the same cache, every other call's K/V are written into both
// caches directly (so a decode row starts on a filled cache, and a chunk can start deep into
// one). Every case the row takes (KV type, head dims, the rope it owns): the rest are refusals,
// test_rows_table's.
void test_attention(std::mt19937& rng, CpuState& cpu) {
    const AttentionCase cases[] = {
        {4, 1, 256, 256, 512, 0.0f, Format::F16, 0, 517, 2, 8, 300},   // Gemma local layer: a second chunk past the window
        {32, 8, 128, 128, 0, 0.0f, Format::F16, 0, 333, 1, 16, 179},   // Llama-3-8B heads, f16: two chunks, odd counts
        {16, 2, 128, 64, 40, 30.0f, Format::F32, 0, 95, 1, 2, 61},     // GQA 8, dv < d, window and softcap
        {4, 1, 256, 256, 0, 0.0f, Format::F32, 600, 100, 3, 11},       // Gemma global layer, 11 splits
        {9, 3, 64, 64, 0, 0.0f, Format::F16, 0, 9, 3, 1},              // SmolLM2 heads, one split
        {32, 8, 128, 128, 0, 0.0f, Format::F32, 1000, 100, 2, 64},     // Llama-3-8B heads, empty splits
        {8, 8, 128, 128, 0, 30.0f, Format::F32, 0, 40, 2, 4},          // no GQA, softcap
        {10, 1, 32, 48, 7, 0.0f, Format::F16, 0, 5, 9, 2},             // 10 query heads per KV head, dv != d, tiny window
        {8, 2, 64, 64, 20, 30.0f, Format::F16, 0, 150, 1, 2, 77},      // f16: window inside key tiles, softcap, GQA 4
        {6, 6, 128, 128, 0, 0.0f, Format::F16, 0, 70, 1, 2},           // f16, no GQA, a partial row tile
        {4, 1, 256, 256, 0, 0.0f, Format::F16, 0, 1, 1, 1, 3},         // f16, a one-token chunk then three
        {8, 2, 64, 64, 0, 0.0f, Format::F16, 0, 2, 1, 1, 3},           // the prefill rows' first counts: 2 then 3
        {32, 4, 128, 128, 0, 0.0f, Format::F16, 300, 70, 3, 12},       // Qwen3-MoE heads: two decode groups per KV head
        {64, 8, 64, 64, 128, 0.0f, Format::F16, 200, 90, 2, 8},        // gpt-oss heads: two groups, a window
        {2, 1, 64, 64, 0, 0.0f, Format::F16, 16400, 100, 1, 300},      // 16500 keys: 258 active splits, the
                                                                       // combine's chunk loop; the tiles' longest sums
    };
    const Row& cpu_row = cpu_twin(find_row("cuda.attention_prefill"));
    // The order the cases run in: as listed, or under KCAP_TEST_CASES_PER_ROW the least work first
    // (queries x keys x heads x head_dim), so a row's capped cases are its cheapest.
    std::vector<int> order;
    for (int i = 0; i < int(sizeof(cases) / sizeof(cases[0])); ++i) order.push_back(i);
    if (g_case_cap > 0) {
        const auto work = [&](int i) {
            const AttentionCase& c = cases[i];
            const int64_t n = c.prefix + c.prefill + c.prefill2 + c.decode_steps;
            return int64_t(n - c.prefix) * n * c.n_head * c.head_dim;
        };
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work(a) < work(b); });
    }
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::Attention) continue;
        const bool owns_rope = row.requires_any != 0;  // the rope-owning rows take only stages that own one
        const bool tensor_core_row = row.kernel.rfind("cuda.attention_mma", 0) == 0;
        for (const int case_index : order) {
            const AttentionCase& c = cases[case_index];
            const int n_ctx = c.prefix + c.prefill + c.prefill2 + c.decode_steps;
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
            stage.features = row.requires_all & kQ8Output;
            std::vector<float> factor_values = random_floats(rng, size_t(c.head_dim / 2));
            for (auto& f : factor_values) f = 1.0f + std::fabs(f);
            const auto factors = float_vector(factor_values, "rope_freqs");
            const auto q_norm = float_vector(random_floats(rng, size_t(c.head_dim)), "q_norm");
            const auto k_norm = float_vector(random_floats(rng, size_t(c.head_dim)), "k_norm");
            bool qk_norm = false;
            if (owns_rope) {
                // NeoX or normal, with or without QK-norm (where the row has it as an option) and
                // frequency factors, in turn.
                const bool neox = case_index % 2 == 0, with_factors = case_index % 4 == 1;
                qk_norm = (row.requires_all & kRmsNorm) || ((row.features & kRmsNorm) && case_index % 3 != 1);
                stage.operands = {qk_norm ? &q_norm->ref : nullptr, qk_norm ? &k_norm->ref : nullptr,
                                  with_factors ? &factors->ref : nullptr};
                stage.params.rope_dim = c.head_dim, stage.params.rope_base = 10000.0f;
                stage.params.rope_freq_scale = 1.0f, stage.params.eps = 1e-6f;
                stage.features |= (neox ? kRopeNeox : kRopeNormal) | (qk_norm ? FeatureMask(kRmsNorm) : 0u) |
                                  (with_factors ? FeatureMask(kRopeFreqFactors) : 0u);
            }
            // Attention sinks (gpt-oss: a logit per head in the softmax denominator) in every other case.
            const auto sinks = float_vector(random_floats(rng, size_t(c.n_head), 2.0f), "sinks");
            const bool with_sinks = (row.features & kSinks) && case_index % 2 == 1;
            if (with_sinks) {
                stage.operands.resize(3);
                stage.operands.push_back(&sinks->ref);
                stage.features |= kSinks;
            }
            if (!rejection_reason(row, stage, g_device).empty()) continue;  // refusals: test_rows_table
            if (over_case_cap(row, false)) continue;
            const int cases_before = g_cases;
            TestContext t;
            cpu.kv.assign(1, KvLayer());
            KvLayer& cache = cpu.kv[0];
            cache.format = c.kv;
            cache.k_width = int64_t(c.n_head_kv) * c.head_dim;
            cache.v_width = int64_t(c.n_head_kv) * c.head_dim_v;
            cache.reserve_positions(n_ctx);
            const size_t elem = c.kv == Format::F16 ? 2 : 4;
            t.ctx.kv_format = c.kv;
            t.ctx.n_ctx = n_ctx;
            t.ctx.kv.resize(2);  // layer 1 shares layer 0's cache (kv_shared): no cache of its own
            t.ctx.kv[0].k = t.arena.alloc(size_t(n_ctx) * cache.k_width * elem);
            t.ctx.kv[0].v = t.arena.alloc(size_t(n_ctx) * cache.v_width * elem);
            t.ctx.attn_partial_o = t.arena.nan_floats(size_t(c.n_head) * c.n_splits * c.head_dim_v);
            t.ctx.attn_partial_ml = t.arena.nan_floats(size_t(c.n_head) * c.n_splits * 2);
            StageData data;
            data.attn_splits = c.n_splits;
            if (owns_rope) {
                if (qk_norm) {
                    data.operands[0] = t.arena.upload_bytes(q_norm->ref.data, q_norm->ref.nbytes);
                    data.operands[1] = t.arena.upload_bytes(k_norm->ref.data, k_norm->ref.nbytes);
                }
                data.rope_table = t.arena.upload(rope_cos_sin_table(stage, n_ctx));  // the factors are folded in
            }
            if (with_sinks) data.operands[3] = t.arena.upload_bytes(sinks->ref.data, sinks->ref.nbytes);
            // Positions [pos, pos + m) of both caches, directly: the CPU cache's rows, copied.
            const auto fill = [&](int pos, int m) {
                for (int i = 0; i < m; ++i) {
                    const std::vector<float> k = random_floats(rng, size_t(cache.k_width));
                    const std::vector<float> v = random_floats(rng, size_t(cache.v_width));
                    cache.store(pos + i, k.data(), v.data());
                }
                const size_t k0 = size_t(pos) * size_t(cache.k_width), kn = size_t(m) * size_t(cache.k_width);
                const size_t v0 = size_t(pos) * size_t(cache.v_width), vn = size_t(m) * size_t(cache.v_width);
                // The CPU cache's keys are in blocks of positions (KvLayer::key_index); the
                // device's in rows.
                std::vector<uint8_t> k_rows(kn * elem);
                for (int i = 0; i < m; ++i)
                    for (int64_t e = 0; e < cache.k_width; ++e) {
                        const size_t at = size_t(cache.key_index(pos + i, e)), to = (size_t(i) * size_t(cache.k_width) + size_t(e)) * elem;
                        std::memcpy(k_rows.data() + to, c.kv == Format::F16 ? static_cast<const void*>(&cache.k16[at]) : &cache.k32[at], elem);
                    }
                const void* v_src = c.kv == Format::F16 ? static_cast<const void*>(cache.v16.data() + v0) : cache.v32.data() + v0;
                CHECK(cudaMemcpy(static_cast<uint8_t*>(t.ctx.kv[0].k) + k0 * elem, k_rows.data(), kn * elem, cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(static_cast<uint8_t*>(t.ctx.kv[0].v) + v0 * elem, v_src, vn * elem, cudaMemcpyHostToDevice));
            };
            Stage plain = owns_rope ? without_rope(stage) : stage;
            if (with_sinks) plain.operands = {nullptr, nullptr, nullptr, &sinks->ref};
            std::vector<int> calls;
            if (c.prefill) calls.push_back(c.prefill);
            if (c.prefill2) calls.push_back(c.prefill2);
            for (int i = 0; i < c.decode_steps; ++i) calls.push_back(1);
            int pos = 0;
            if (c.prefix) fill(0, c.prefix), pos = c.prefix;
            for (const int m : calls) {
                if (!row_tokens(row, stage, g_device).contains(m)) {
                    fill(pos, m);
                    pos += m;
                    continue;
                }
                const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * c.head_dim);
                const std::vector<float> k = random_floats(rng, size_t(m) * c.n_head_kv * c.head_dim);
                const std::vector<float> v = random_floats(rng, size_t(m) * c.n_head_kv * c.head_dim_v);
                std::vector<float> ref(size_t(m) * c.n_head * c.head_dim_v);
                std::vector<float> q_rot = q, k_rot = k;
                if (owns_rope) cpu_owned_rope(stage, m, pos, q_rot, k_rot, cpu);
                // A decode step of a sliding-window layer reads only its window (its key splits
                // start at the window's first row): the device cache's rows before it are NaN
                // (all bits set, f16 or f32), so one read of them would reach the output. (A
                // prefill chunk's key tiles may start below a query's window and mask those rows.)
                if (m == 1 && c.window > 0 && pos - c.window + 1 > 0) {
                    const size_t rows = size_t(pos - c.window + 1);
                    CHECK(cudaMemset(t.ctx.kv[0].k, 0xff, rows * size_t(cache.k_width) * elem));
                    CHECK(cudaMemset(t.ctx.kv[0].v, 0xff, rows * size_t(cache.v_width) * elem));
                }
                // The device first: a rope-owning row appends the K rows it rotated itself.
                KernelCall call;
                call.n_tokens = m;
                call.pos0 = pos;
                float* out = t.arena.nan_floats(ref.size());
                call.in = t.arena.upload(q), call.in2 = t.arena.upload(k), call.in3 = t.arena.upload(v), call.out = out;
                t.set_step(pos);
                if (!t.run(row, stage, call, data)) break;
                const std::vector<float> got = download(out, ref.size());
                const std::string what = std::string(m == 1 ? "decode" : "prefill") + " of " + std::to_string(m) +
                                         " at " + std::to_string(pos);
                if (owns_rope) {
                    // The K rows this call appended were rotated on the device (and QK-normed, with
                    // another order of the sum of squares): as the CPU rotated them, up to a few f32
                    // ulps, which an f16 cache may round to the neighbouring half. Check that, then let
                    // the CPU reference append the device's rows (f16 values are exact in f32, so its
                    // cache holds the same halves), so the comparison is of the attention alone.
                    const size_t row_elems = size_t(m) * cache.k_width;
                    const size_t first = size_t(pos) * cache.k_width;
                    std::vector<float> device_k(row_elems), cpu_k(k_rot);
                    if (c.kv == Format::F16) {
                        const std::vector<uint16_t> h = download(static_cast<const uint16_t*>(t.ctx.kv[0].k) + first, row_elems);
                        for (size_t e = 0; e < row_elems; ++e) {
                            device_k[e] = f16_to_f32(h[e]);
                            cpu_k[e] = f16_to_f32(f32_to_f16(cpu_k[e]));
                        }
                    } else {
                        device_k = download(static_cast<const float*>(t.ctx.kv[0].k) + first, row_elems);
                    }
                    const double k_err = relative_error(device_k, cpu_k);
                    KCAP_EXPECT(k_err <= (c.kv == Format::F16 ? 1e-3 : kExactTolerance),
                                "%s appended K rows at %d..%d differ from the CPU's rotation: %.3g", row.kernel.c_str(),
                                pos, pos + m - 1, k_err);
                    k_rot = device_k;
                }
                KernelCall cpu_call;
                cpu_call.n_tokens = m;
                cpu_call.pos0 = pos;
                cpu_call.in = q_rot.data(), cpu_call.in2 = k_rot.data(), cpu_call.in3 = v.data(), cpu_call.out = ref.data();
                run_cpu(cpu_row, plain, cpu_call, cpu);
                const double err = relative_error(got, ref);
                // The q8_1 of the output for the output projection (the _q8 rows), else nothing.
                expect_q8_output(t, row, got, m, c.n_head * c.head_dim_v, what);
                const bool tensor_cores = tensor_core_row && m > 1;
                const int span = c.window > 0 ? std::min(c.window, pos + m) : pos + m;
                const double tolerance = attention_tolerance(tensor_cores, span, c.head_dim);
                KCAP_EXPECT(err <= tolerance,
                            "%s heads %d/%d dim %d/%d window %d softcap %g kv %s features %s, %s (splits %d): error %.3g > %.3g",
                            row.kernel.c_str(), c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window,
                            double(c.softcap), format_name(c.kv), feature_names(stage.features).c_str(), what.c_str(),
                            c.n_splits, err, tolerance);
                ++g_cases;
                // A shared-KV layer at the same positions: other queries over the cache this call
                // filled, no K/V of its own; the cache must be left as it was. (The rope-owning rows
                // take no shared-KV stage: the planner leaves such a layer's rope stage apart.)
                if (!owns_rope) {
                    Stage shared = stage;
                    shared.layer = 1;
                    shared.params.kv_layer = 0;
                    shared.features |= kKvShared;
                    const std::vector<float> q2 = random_floats(rng, size_t(m) * c.n_head * c.head_dim);
                    std::vector<float> ref2(ref.size());
                    KernelCall call2;
                    call2.n_tokens = m;
                    call2.pos0 = pos;
                    call2.in = q2.data(), call2.out = ref2.data();
                    run_cpu(cpu_row, shared, call2, cpu);
                    const size_t k_bytes = size_t(n_ctx) * c.n_head_kv * c.head_dim * elem;
                    const std::vector<uint8_t> k_before = download(static_cast<const uint8_t*>(t.ctx.kv[0].k), k_bytes);
                    float* out2 = t.arena.nan_floats(ref2.size());
                    call2.in = t.arena.upload(q2), call2.out = out2;
                    if (t.run(row, shared, call2, data)) {
                        const std::vector<float> got2 = download(out2, ref2.size());
                        const double err2 = relative_error(got2, ref2);
                        const bool untouched = download(static_cast<const uint8_t*>(t.ctx.kv[0].k), k_bytes) == k_before;
                        KCAP_EXPECT(err2 <= tolerance && untouched, "%s kv_shared heads %d/%d, %s: error %.3g, cache %s",
                                    row.kernel.c_str(), c.n_head, c.n_head_kv, what.c_str(), err2,
                                    untouched ? "untouched" : "written");
                        expect_q8_output(t, row, got2, m, c.n_head * c.head_dim_v, "kv_shared " + what);
                        ++g_cases;
                    }
                }
                pos += m;
            }
            if (g_case_cap > 0 && g_cases > cases_before) ++g_row_begun[&row];  // the row ran in this case
        }
    }
}

// Multi-head latent attention (cuda.attention_mla_decode, cuda.attention_mla,
// cuda.attention_mla_tiled) against cpu.attention_mla: each row at the calls its token range
// takes (a prefill chunk; decode steps in the key splits the backend would fix), the other calls
// run by the CPU and its appended cache rows copied to the device; W_k_b / W_v_b split or
// combined in several formats, f32 and f16 caches, partial head groups, DeepSeek-V2-Lite's dims,
// a long prefix in many splits, a prefill chunk after a prefix. Each call
// first checks the rows the device appended (normed latent, rotated rope key) against the CPU's.
// The f16 cases append rows that are exact in f16 on both sides (unit-RMS latents of +-1 under
// f16-exact norm weights with eps 0, zero rope keys), so both attend over the same cache; the
// f32 cases rotate real rope keys (their rows agree to f32 rounding).
void test_attention_mla(std::mt19937& rng, CpuState& cpu) {
    struct Case {
        int n_head, lora, nope, rope, dv;
        Format kb, vb, kv;
        bool combined;
        int prefix, prefill, decode_steps, n_splits;
    };
    const Case cases[] = {
        {4, 64, 32, 16, 32, Format::F32, Format::F32, Format::F32, false, 0, 70, 3, 4},
        {6, 64, 32, 16, 32, Format::Q8_0, Format::F16, Format::F16, false, 0, 20, 2, 3},          // partial head group
        {5, 96, 64, 8, 48, Format::Q5_0, Format::Q5_0, Format::F32, true, 0, 9, 2, 2},            // combined W_kv_b
        {5, 96, 64, 8, 64, Format::Q8_0, Format::Q4_0, Format::F32, true, 0, 9, 2, 2},            // a row per simd group (3 runs)
        {16, 512, 128, 64, 128, Format::Q5_0, Format::Q4_K, Format::F16, false, 0, 80, 2, 4},     // V2-Lite
        {16, 512, 128, 64, 128, Format::Q8_0, Format::Q6_K, Format::F32, false, 3000, 0, 2, 33},  // long span
        {3, 64, 96, 16, 32, Format::F16, Format::Q8_0, Format::F32, false, 0, 2, 1, 1},           // 2-token prefill
        // a prefill chunk after a long prefix (the tiled attend's rows see 700+ keys)
        {16, 512, 128, 64, 128, Format::Q8_0, Format::Q6_K, Format::F32, false, 700, 100, 1, 8},
    };
    const Row& cpu_row = find_row("cpu.attention_mla");
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::AttentionMla) continue;
        for (const Case& c : cases) {
            const int n_ctx = c.prefix + c.prefill + c.decode_steps, width = c.lora + c.rope;
            const bool exact_rows = c.kv == Format::F16;
            auto kb = c.combined ? random_weights(rng, c.kb, c.lora, int64_t(c.n_head) * (c.nope + c.dv), "kv_b")
                                 : random_weights(rng, c.kb, c.nope, int64_t(c.n_head) * c.lora, "k_b");
            auto vb = random_weights(rng, c.vb, c.lora, int64_t(c.n_head) * c.dv, "v_b");
            std::vector<float> norm_values = random_floats(rng, size_t(c.lora), 0.1f);
            for (float& v : norm_values) v = exact_rows ? f16_to_f32(f32_to_f16(1.0f + v)) : 1.0f + v;
            const auto norm = float_vector(norm_values, "kv_a_norm");
            Stage stage;
            stage.layer = 0;
            stage.op = Op::AttentionMla;
            stage.operands = {&norm->ref, &kb->ref, c.combined ? nullptr : &vb->ref, nullptr};
            stage.params.n_head = c.n_head, stage.params.n_head_kv = 1;
            stage.params.head_dim = c.nope + c.rope, stage.params.head_dim_v = c.dv;
            stage.params.kv_lora_rank = c.lora, stage.params.rope_dim = c.rope, stage.params.rope_base = 10000.0f;
            stage.params.eps = exact_rows ? 0.0f : 1e-6f;
            stage.params.scale = 1.0f / std::sqrt(float(c.nope + c.rope));
            stage.kv_format = c.kv;
            stage.max_span = n_ctx;
            stage.k = c.nope + c.rope, stage.n = int64_t(c.n_head) * c.dv;
            stage.features = kRopeNormal | kRmsNorm | (c.combined ? FeatureMask(kMlaKvBCombined) : FeatureMask(0));
            if (!rejection_reason(row, stage, g_device).empty()) continue;  // refusals: test_rows_table
            if (over_case_cap(row, false)) continue;
            const int cases_before = g_cases;
            const TokenRange range = row_tokens(row, stage, g_device);
            TestContext t;
            cpu.kv.assign(1, KvLayer());
            KvLayer& cache = cpu.kv[0];
            cache.format = c.kv, cache.k_width = width, cache.v_width = 0;
            cache.reserve_positions(n_ctx);
            const size_t elem = c.kv == Format::F16 ? 2 : 4;
            const int max_m = std::max(c.prefill, 1);
            t.ctx.kv_format = c.kv;
            t.ctx.n_ctx = n_ctx;
            t.ctx.kv.resize(1);
            t.ctx.kv[0].k = t.arena.alloc(size_t(n_ctx) * size_t(width) * elem);
            t.ctx.mla_absorbed = t.arena.nan_floats(size_t(max_m) * c.n_head * width);
            t.ctx.mla_latent = t.arena.nan_floats(size_t(max_m) * c.n_head * c.lora);
            const size_t slots = size_t(c.n_head) * size_t(std::max(c.n_splits, max_m));
            t.ctx.attn_partial_o = t.arena.nan_floats(slots * size_t(c.lora));
            t.ctx.attn_partial_ml = t.arena.nan_floats(slots * 2);
            StageData data;
            data.operands[0] = t.arena.upload_bytes(norm->ref.data, norm->ref.nbytes);
            data.operands[1] = t.arena.upload_bytes(kb->ref.data, kb->ref.nbytes);
            if (!c.combined) data.operands[2] = t.arena.upload_bytes(vb->ref.data, vb->ref.nbytes);
            data.rope_table = t.arena.upload(rope_cos_sin_table(stage, n_ctx));
            data.attn_splits = c.n_splits;
            // The CPU cache's rows [pos, pos + m) onto the device's.
            const auto copy_rows = [&](int pos, int m) {
                const size_t first = size_t(pos) * size_t(width), n = size_t(m) * size_t(width);
                const void* src = c.kv == Format::F16 ? static_cast<const void*>(cache.k16.data() + first)
                                                      : cache.k32.data() + first;
                CHECK(cudaMemcpy(static_cast<uint8_t*>(t.ctx.kv[0].k) + first * elem, src, n * elem, cudaMemcpyHostToDevice));
            };
            // New rows' inputs: random, or for exact rows +-1 latents and zero rope keys.
            const auto new_rows = [&](int m) {
                std::vector<float> kv_new = random_floats(rng, size_t(m) * width);
                if (exact_rows)
                    for (int i = 0; i < m; ++i)
                        for (int e = 0; e < width; ++e) {
                            float& v = kv_new[size_t(i) * width + e];
                            v = e < c.lora ? (v < 0 ? -1.0f : 1.0f) : 0.0f;
                        }
                return kv_new;
            };
            if (c.prefix) {
                for (int i = 0; i < c.prefix; ++i) {
                    std::vector<float> r = random_floats(rng, size_t(width));
                    cache.store(i, r.data(), nullptr);
                }
                copy_rows(0, c.prefix);
            }
            std::vector<int> calls;
            if (c.prefill) calls.push_back(c.prefill);
            for (int i = 0; i < c.decode_steps; ++i) calls.push_back(1);
            int pos = c.prefix;
            for (const int m : calls) {
                const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * (c.nope + c.rope));
                const std::vector<float> kv_new = new_rows(m);
                std::vector<float> ref(size_t(m) * c.n_head * c.dv);
                KernelCall cpu_call;
                cpu_call.n_tokens = m, cpu_call.pos0 = pos;
                cpu_call.in = q.data(), cpu_call.in2 = kv_new.data(), cpu_call.out = ref.data();
                run_cpu(cpu_row, stage, cpu_call, cpu);
                if (!range.contains(m)) {  // the other row's call: its rows come from the CPU
                    copy_rows(pos, m);
                    pos += m;
                    continue;
                }
                KernelCall call;
                call.n_tokens = m, call.pos0 = pos;
                float* out = t.arena.nan_floats(ref.size());
                call.in = t.arena.upload(q), call.in2 = t.arena.upload(kv_new), call.out = out;
                t.set_step(pos);
                if (!t.run(row, stage, call, data)) break;
                const std::string what = std::string(m == 1 ? "decode" : "prefill") + " of " + std::to_string(m) +
                                         " at " + std::to_string(pos);
                // The appended rows: bit for bit where they are exact, else to f32 rounding.
                const size_t first = size_t(pos) * size_t(width), n = size_t(m) * size_t(width);
                std::vector<float> device_rows(n), cpu_rows(n);
                if (c.kv == Format::F16) {
                    const std::vector<uint16_t> h = download(static_cast<const uint16_t*>(t.ctx.kv[0].k) + first, n);
                    for (size_t e = 0; e < n; ++e) device_rows[e] = f16_to_f32(h[e]), cpu_rows[e] = f16_to_f32(cache.k16[first + e]);
                } else {
                    device_rows = download(static_cast<const float*>(t.ctx.kv[0].k) + first, n);
                    cpu_rows.assign(cache.k32.begin() + long(first), cache.k32.begin() + long(first + n));
                }
                const double rows_err = relative_error(device_rows, cpu_rows);
                KCAP_EXPECT(exact_rows ? device_rows == cpu_rows : rows_err <= kExactTolerance,
                            "%s appended rows, kv %s, %s: error %.3g", row.kernel.c_str(), format_name(c.kv), what.c_str(),
                            rows_err);
                const std::vector<float> got = download(out, ref.size());
                // No q8_1 scratch written but by a row that declares it (kQ8Output).
                expect_q8_output(t, row, got, m, c.n_head * c.dv, what);
                const double err = relative_error(got, ref);
                KCAP_EXPECT(err <= kAttentionTolerance,
                            "%s heads %d lora %d nope %d rope %d dv %d W_k_b %s W_v_b %s%s kv %s, %s (splits %d): error %.3g",
                            row.kernel.c_str(), c.n_head, c.lora, c.nope, c.rope, c.dv, format_name(c.kb),
                            format_name(c.vb), c.combined ? " (combined)" : "", format_name(c.kv), what.c_str(),
                            m == 1 ? c.n_splits : 1, err);
                ++g_cases;
                pos += m;
            }
            if (g_case_cap > 0 && g_cases > cases_before) ++g_row_begun[&row];  // the row ran in this case
        }
    }
}

// add_norm rows (cuda.add_norm, cuda.add_norm_q8) against the CPU rows of the stages they
// replace. Widths on both sides of the register path (width % 4 == 0 and at most
// kAddNormVecMax float4 per thread of norm_threads(width)): 1001 and 12288 walk the row, 1000
// and 8192 (two float4 per thread) hold it in registers; the _q8 row takes whole 32-value runs.
void test_add_norm(std::mt19937& rng, CpuState& cpu) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::AddNorm) continue;
        for (int64_t width : {64, 640, 1000, 1001, 4096, 8192, 12288})
            for (int tokens : {1, 5})
                for (bool layer : {false, true})
                    for (bool post : {false, true}) {
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
                        stage.features = (layer ? kLayerNorm | kBias | kResidualScale : kRmsNorm) | (post ? kPostNorm : 0u) |
                                         row.requires_all;
                        if (!rejection_reason(row, stage, g_device).empty()) continue;  // refusals: test_rows_table
                        TestContext t;
                        std::vector<float> residual = random_floats(rng, size_t(tokens * width), 8.0f);
                        const std::vector<float> branch = random_floats(rng, size_t(tokens * width), 3.0f);
                        float* d_residual = t.arena.upload(residual);
                        const std::vector<float> ref = cpu_add_norm(stage, tokens, residual, branch, cpu);
                        StageData data;
                        data.operands[0] = post ? t.arena.upload_bytes(post_w->ref.data, post_w->ref.nbytes) : nullptr;
                        data.operands[1] = post_bias ? t.arena.upload_bytes(post_b->ref.data, post_b->ref.nbytes) : nullptr;
                        data.operands[2] = t.arena.upload_bytes(w->ref.data, w->ref.nbytes);
                        data.operands[3] = layer ? t.arena.upload_bytes(b->ref.data, b->ref.nbytes) : nullptr;
                        float* out = t.arena.nan_floats(ref.size());
                        KernelCall call;
                        call.n_tokens = tokens;
                        call.in = d_residual;
                        call.inout2 = d_residual;
                        call.in2 = t.arena.upload(branch);
                        call.out = out;
                        if (!t.run(row, stage, call, data)) continue;
                        const std::vector<float> normed = download(out, ref.size());
                        const double err = std::max(relative_error(normed, ref),
                                                    relative_error(download(d_residual, residual.size()), residual));
                        KCAP_EXPECT(err <= kExactTolerance, "%s width=%lld tokens=%d layer=%d post=%d: error %.3g",
                                    row.kernel.c_str(), (long long)width, tokens, int(layer), int(post), err);
                        // The normed rows' q8_1 for the q8_1 matmuls after it (the _q8 row), else nothing.
                        if (width % 32 == 0)
                            expect_q8_output(t, row, normed, tokens, int(width), "width " + std::to_string(width));
                        ++g_cases;
                    }
    }
}

void test_norm(std::mt19937& rng, CpuState& cpu) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::Norm) continue;
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
                            const std::vector<float> x =
                                random_floats(rng, static_cast<size_t>(tokens * width * groups), 5.0f);
                            std::vector<float> ref(x.size());
                            KernelCall call;
                            call.n_tokens = tokens;
                            call.in = x.data();
                            call.out = ref.data();
                            run_cpu(cpu_twin(row), stage, call, cpu);
                            StageData data;
                            data.operands[0] = t.arena.upload_bytes(weight->ref.data, weight->ref.nbytes);
                            data.operands[1] = with_bias ? t.arena.upload_bytes(bias->ref.data, bias->ref.nbytes) : nullptr;
                            float* out = t.arena.nan_floats(ref.size());
                            call.in = t.arena.upload(x);
                            call.out = out;
                            if (!t.run(row, stage, call, data)) continue;
                            const double err = relative_error(download(out, ref.size()), ref);
                            KCAP_EXPECT(err <= kExactTolerance, "%s width=%lld groups=%lld tokens=%d: error %.3g",
                                        row.kernel.c_str(), (long long)width, (long long)groups, tokens, err);
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

// cuda.sample where its draw is determined whatever the seed: top_k 1 (the first best logit),
// and the widest vocabulary the row takes (k_max) with top_k 64 and a min_p that keeps only a
// clear winner; both fed back (token, history, step) as the sampling decode graph does.
void test_sample(std::mt19937& rng) {
    const Row& row = find_row("cuda.sample");
    for (const int count : {7, int(row.dims.k_max)})
        for (const bool advance : {false, true}) {
            TestContext t;
            std::vector<float> logits = random_floats(rng, size_t(count));
            int expected = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
            KcapSampleSettings settings{};
            settings.temperature = 0.8f, settings.top_p = 1.0f, settings.seed = unsigned(rng());
            if (count == 7) {
                settings.top_k = 1, settings.min_p = 0.0f;
                logits[6] = logits[size_t(expected)];  // a tie: the lower index wins
            } else {
                // Every other logit at least 20 below the winner: weight e^-25 of it, under min_p.
                expected = count / 3;
                logits[size_t(expected)] = *std::max_element(logits.begin(), logits.end()) + 20.0f;
                settings.top_k = KCAP_SAMPLE_MAX_TOP_K, settings.min_p = 0.5f;
            }
            CHECK(cudaMemcpy(t.ctx.sample_settings, &settings, sizeof(settings), cudaMemcpyHostToDevice));
            Stage stage;
            stage.op = Op::Sample;
            stage.k = stage.n = count;
            t.set_step(41, 3);
            KernelCall call;
            call.n_tokens = 1;
            call.in = t.arena.upload(logits);
            call.out = reinterpret_cast<float*>(t.ctx.argmax_result);
            call.inout2 = advance ? reinterpret_cast<float*>(t.ctx.history) : nullptr;
            if (!t.run(row, stage, call, StageData())) continue;
            const int result = download(t.ctx.argmax_result, 1)[0];
            const std::vector<int32_t> step = download(t.ctx.step, 2);
            KCAP_EXPECT(result == expected, "cuda.sample of %d (top_k %d): %d, expected %d", count, settings.top_k, result,
                        expected);
            if (advance)
                KCAP_EXPECT(download(t.ctx.tokens, 1)[0] == expected && download(t.ctx.history, 4)[3] == expected &&
                                step[0] == 42 && step[1] == 4,
                            "cuda.sample advance: token/history/step not fed back");
            else
                KCAP_EXPECT(step[0] == 41 && step[1] == 3, "cuda.sample without advance moved the step");
            ++g_cases;
        }
}

// An experts stage as its references read it: widths, token count, the three matrices, where
// an expert's gate and up rows lie (one merged tensor: Gemma 4), the biases ([n_expert][rows],
// gpt-oss; else null), and each slot's expert and weight in the Routing buffer.
struct MoeReferenceStage {
    const Stage& stage;
    const std::vector<float>& routing;
    const int64_t k = stage.k, ff = stage.k2, n = stage.n;
    const int used = stage.params.n_expert_used;
    const int m;
    const TensorRef &gate = *stage.operands[0], &up = *stage.operands[1], &down = *stage.operands[2];
    const bool merged = (stage.features & kExpertGateUpMerged) != 0;
    const float *gate_bias = bias(3), *up_bias = bias(4), *down_bias = bias(5);

    MoeReferenceStage(const Stage& s, const std::vector<float>& x, const std::vector<float>& r)
        : stage(s), routing(r), m(int(x.size() / size_t(s.k))) {}
    const float* bias(size_t i) const {
        return stage.operands.size() > i ? reinterpret_cast<const float*>(stage.operands[i]->data) : nullptr;
    }
    int64_t expert(int t, int j) const { return int64_t(routing[size_t(t) * 2 * used + size_t(j)]); }
    float weight(int t, int j) const { return routing[size_t(t) * 2 * used + size_t(used + j)]; }
    int64_t gate_row(int64_t e, int64_t i) const { return e * (merged ? 2 * ff : ff) + i; }
    int64_t up_row(int64_t e, int64_t i) const { return merged ? gate_row(e, i) + ff : e * ff + i; }
};

// The q8_1 experts' (cuda.moe_experts_q8.*) two references, from the library's q8_1 rounding and
// integer dot products (formats.h): act, each slot's gated activation of gate and up times q8_1(x);
// out, the weighted sum of the down matvecs of q8_1 of the given activations (the row's own).
struct MoeQ8Reference {
    std::vector<float> act, out;
    // Per activation, how far two faithful f32 evaluations of it may differ beyond their relative
    // rounding: GELU's forms 0.5 g (1 + tanh(y)) and 0.5 g (1 + erf(z)) cancel where tanh or erf
    // nears -1, and there each evaluation keeps the absolute error of its tanh or erf, up to about
    // 2^-23 (the CPU's tanh_clamped measured 1.85 x 2^-24; CUDA's tanhf and erff are within 2 ulp):
    // 0.5 |g u| 2^-22 between the two. A run of 32 activations wholly in that tail (the random
    // K-quant weights here have a positive mean, so a token whose x sums far below 0 has every gate
    // far negative) has a step so small that this is many steps of it (126 in a Q5_K case).
    std::vector<double> tail;
};
// act_q8 (the grouped int8 row): each slot's activations as the row rounded them (slot -> its q8_1
// view), in place of q8_1 of row_act.
MoeQ8Reference moe_q8_reference(const Stage& stage, const std::vector<float>& x, const std::vector<float>& routing,
                                const std::vector<float>& row_act,
                                const std::function<Q8View(size_t)>& act_q8 = nullptr) {
    const MoeReferenceStage s(stage, x, routing);
    const int64_t k = s.k, ff = s.ff, n = s.n;
    const int used = s.used, m = s.m;
    const auto quantized = [](const float* v, int64_t len, std::vector<int8_t>& q, std::vector<float>& d,
                              std::vector<int32_t>& sums) {
        q.resize(size_t(len)), d.resize(size_t(len / 32)), sums.resize(size_t(len / 16));
        quantize_q8_1(v, len, q.data(), d.data(), sums.data());
        return Q8View{q.data(), d.data(), sums.data()};
    };
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> sums;
    MoeQ8Reference r;
    r.act.resize(size_t(m) * used * size_t(ff));
    r.tail.assign(r.act.size(), 0.0);
    const bool gelu = stage.params.activation == Activation::GeluTanh || stage.params.activation == Activation::GeluErf;
    r.out.assign(size_t(m) * size_t(n), 0.0f);
    for (int t = 0; t < m; ++t) {
        const Q8View xq = quantized(x.data() + size_t(t) * k, k, q, d, sums);
        for (int j = 0; j < used; ++j) {
            const int64_t e = s.expert(t, j);
            for (int64_t i = 0; i < ff; ++i) {
                const float g = dot_row_q8_1(s.gate.format, s.gate.row(s.gate_row(e, i)), xq, k) +
                                (s.gate_bias ? s.gate_bias[e * ff + i] : 0.0f);
                const float u = dot_row_q8_1(s.up.format, s.up.row(s.up_row(e, i)), xq, k) +
                                (s.up_bias ? s.up_bias[e * ff + i] : 0.0f);
                r.act[(size_t(t) * used + j) * ff + i] = gated_activation(stage.params.activation, g, u,
                                                                          stage.params.swiglu_alpha, stage.params.swiglu_limit);
                if (gelu) r.tail[(size_t(t) * used + j) * ff + i] = 0.5 * std::abs(double(g) * double(u)) * 0x1p-22;
            }
        }
        for (int j = 0; j < used; ++j) {
            const int64_t e = s.expert(t, j);
            const float weight = s.weight(t, j);
            const Q8View aq = act_q8 ? act_q8(size_t(t) * used + j)
                                     : quantized(row_act.data() + (size_t(t) * used + j) * ff, ff, q, d, sums);
            for (int64_t o = 0; o < n; ++o)
                r.out[size_t(t) * n + o] += weight * (dot_row_q8_1(s.down.format, s.down.row(e * n + o), aq, ff) +
                                                      (s.down_bias ? s.down_bias[e * n + o] : 0.0f));
        }
    }
    return r;
}

// The bf16 grouped experts' (cuda.moe_experts_bf16_mma.*) two references, in f64 sums of the
// values the row multiplies: act, each slot's gated activation of gate and up as bf16(W) .
// bf16(x); out, the weighted sum of the down of bf16(W_down) . bf16(the row's own activations of
// the slot: row_act).
struct MoeBf16Reference {
    std::vector<float> act, out;
};
MoeBf16Reference moe_bf16_reference(const Stage& stage, const std::vector<float>& x, const std::vector<float>& routing,
                                    const std::function<const float*(size_t)>& row_act) {
    const MoeReferenceStage s(stage, x, routing);
    const int64_t k = s.k, ff = s.ff, n = s.n;
    const int used = s.used, m = s.m;
    const auto rounded = [](const TensorRef& w, int64_t len) {  // bf16 of every row's dequantized values
        const int64_t rows = w.n_rows();
        std::vector<float> v(size_t(rows * len));
        for (int64_t j = 0; j < rows; ++j) dequantize_row(w.format, w.row(j), v.data() + j * len, len);
        return bf16_values(v);
    };
    const std::vector<float> wg = rounded(s.gate, k), wu = s.merged ? std::vector<float>() : rounded(s.up, k),
                             wd = rounded(s.down, ff);
    const std::vector<float>& wup = s.merged ? wg : wu;  // Gemma 4: the up rows in the gate tensor
    const auto dot = [](const float* a, const float* b, int64_t len) {
        double s = 0.0;
        for (int64_t i = 0; i < len; ++i) s += double(a[i]) * double(b[i]);
        return s;
    };
    MoeBf16Reference r;
    r.act.resize(size_t(m) * used * size_t(ff));
    r.out.assign(size_t(m) * size_t(n), 0.0f);
    for (int t = 0; t < m; ++t) {
        const std::vector<float> xb = bf16_values(std::vector<float>(x.begin() + t * k, x.begin() + (t + 1) * k));
        for (int j = 0; j < used; ++j) {
            const size_t slot = size_t(t) * used + size_t(j);
            const int64_t e = s.expert(t, j);
            for (int64_t i = 0; i < ff; ++i) {
                const float g = float(dot(wg.data() + s.gate_row(e, i) * k, xb.data(), k) +
                                      (s.gate_bias ? s.gate_bias[e * ff + i] : 0.0f));
                const float u = float(dot(wup.data() + s.up_row(e, i) * k, xb.data(), k) +
                                      (s.up_bias ? s.up_bias[e * ff + i] : 0.0f));
                r.act[slot * ff + i] = gated_activation(stage.params.activation, g, u, stage.params.swiglu_alpha,
                                                        stage.params.swiglu_limit);
            }
            const float weight = s.weight(t, j);
            const float* a = row_act(slot);
            const std::vector<float> ab = bf16_values(std::vector<float>(a, a + ff));
            for (int64_t o = 0; o < n; ++o)
                r.out[size_t(t) * n + o] += weight * float(dot(wd.data() + (e * n + o) * ff, ab.data(), ff) +
                                                           (s.down_bias ? s.down_bias[e * n + o] : 0.0f));
        }
    }
    return r;
}

// relative_error of values stored in bf16 (got) against the f32 sums they round: each value's
// distance from ref beyond half a bf16 step of it (the step 2^(e - 8) of a value m 2^e, m in
// [0.5, 1): the wider of the two around a power of two), so that a row whose f32 values erred
// by d from ref scores at most d, and the rounding itself scores nothing.
double bf16_excess_error(const std::vector<float>& got, const std::vector<float>& ref) {
    if (got.size() != ref.size()) return INFINITY;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        int e = 0;
        std::frexp(got[i], &e);
        const double half = got[i] == 0.0f ? 0.0 : std::ldexp(1.0, e - 9);
        const double d = std::max(0.0, std::fabs(double(got[i]) - double(ref[i])) - half);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Mixture-of-experts rows against the CPU rows: cuda.moe_route (the chosen experts exactly, their
// weights to 1e-5; the _add_norm and _norm rows on the CPU's add_norm of a residual and a branch,
// whose residual and normed rows they also write, to 1e-5), cuda.moe_experts.<format> (and its q8_1 form, moe_q8_reference) on the CPU's routing (gate and up of the row's
// format, down of another where the row allows: a Q4_K_M file's Q6_K down), cuda.moe_shared_gate.
// Tokens 1 (decode), 3 and 37 (the grouped rows: 37 and 300, so that an expert takes several
// tiles; a row from more tokens, its first count and 300); 8 experts (the router also 128), 2 or 3 chosen; K at the format's block and longer. Each router and experts case also runs with Gemma 4's features: the router's
// logit scale and per-expert scales, the experts' gate and up merged into one tensor.
void test_moe(std::mt19937& rng, CpuState& cpu) {
    const Row& cpu_route = find_row("cpu.moe_route");
    const Row& cpu_experts = find_row("cpu.moe_experts");
    const Row& cpu_shared = find_row("cpu.moe_shared_gate");
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA) continue;
        if (row.op != Op::MoeRoute && row.op != Op::MoeExperts && row.op != Op::MoeSharedGate) continue;
        for (const Format f : row.op == Op::MoeRoute ? std::vector<Format>{Format::F32, Format::F16, Format::Q8_0}
                                                     : std::vector<Format>{row_format(row)}) {
            const int64_t block = std::max<int64_t>(32, format_info(f).block_elems);
            // The bf16 grouped rows' tiles of 32-value formats stage their weights from K 4096 (a
            // case there too: 37 tokens, the plain experts).
            std::vector<int64_t> ks = {block, 3 * block};
            if (row.input_encoding == Encoding::BF16 && block == 32) ks.push_back(4096);
            for (const int64_t k : ks)
                for (const int used : {2, 3})
                    for (const int m : is_tile_row(row) || row.tokens.min > 37
                                           ? std::vector<int>{std::max(37, row.tokens.min), 300}
                                           : std::vector<int>{1, 3, 37})
                    for (const int variant : {0, 1, 2}) {
                        // 1: Gemma 4's experts (merged gate_up, gelu_tanh) and router (logit and
                        // per-expert scales); 2: gpt-oss's (biases everywhere, the clamped SwiGLU).
                        const bool gemma = variant == 1, oai = variant == 2;
                        if (variant && row.op == Op::MoeSharedGate) continue;
                        if (!row.tokens.contains(m)) continue;  // cuda.moe_route_cluster_norm: one token
                        if (k > 3 * block && (m != 37 || variant != 0)) continue;
                        if (over_case_cap(row)) continue;
                        TestContext t;
                        // The router also at 128 experts (Qwen3-MoE): each lane of its top-k scans several.
                        const int n_expert = row.op == Op::MoeRoute && k != block ? 128 : 8;
                        // The experts' FFN width (output = input width): two blocks, or, for an
                        // experts row whose fewest tokens follow the stage's shape (the slot
                        // starts: a gate/up launch of over a wave), the first doubling at which the
                        // row takes this case's tokens.
                        int64_t ff = block * 2;
                        const int64_t n = k;
                        if (row.op == Op::MoeExperts && row.tokens_min_of) {
                            Stage probe;
                            probe.k = k, probe.n = n, probe.params.n_expert_used = used;
                            for (probe.k2 = ff; row.tokens_min_of(probe, g_device) > m && probe.k2 < 65536;) probe.k2 *= 2;
                            ff = probe.k2;
                        }
                        const std::vector<float> x = random_floats(rng, size_t(m) * size_t(k));
                        Stage stage;
                        stage.layer = 0;
                        stage.name = "moe";
                        stage.op = row.op;
                        stage.k = k;
                        stage.params.n_expert = n_expert;
                        stage.params.n_expert_used = used;
                        stage.params.expert_weights_scale = used == 3 ? 2.5f : 1.0f;
                        StageData data;
                        KernelCall call;
                        call.n_tokens = m;
                        if (row.op == Op::MoeRoute) {
                            const auto w = random_weights(rng, f, k, n_expert, "router");
                            const auto expert_scale = float_vector(random_floats(rng, size_t(n_expert), 1.0f), "exps_scale");
                            const auto router_bias = float_vector(random_floats(rng, size_t(n_expert), 0.5f), "router_bias");
                            stage.operands = {&w->ref};
                            if (gemma) stage.operands.push_back(&expert_scale->ref);
                            if (oai) stage.operands = {&w->ref, nullptr, &router_bias->ref};
                            stage.n = 2 * used;
                            stage.features = kExpertSoftmax | (used == 2 ? FeatureMask(kExpertWeightsNorm) : 0u) |
                                             (gemma ? FeatureMask(kExpertLogitScale | kPerExpertScale) : 0u) |
                                             (oai ? FeatureMask(kBias) : 0u);
                            stage.params.expert_logit_scale = gemma ? 0.125f : 1.0f;
                            // A router with the add_norm before it (kAddNormInput rows): x is
                            // then rms_norm(residual + branch) * weight, and the row also writes
                            // the residual and the normed rows (checked against the CPU's add_norm).
                            const bool add_norm = (row.requires_all & kAddNormInput) != 0;
                            const auto norm_w = float_vector(random_floats(rng, size_t(k), 1.0f), "ffn_norm");
                            std::vector<float> residual = random_floats(rng, size_t(m) * size_t(k));
                            const std::vector<float> branch = random_floats(rng, size_t(m) * size_t(k));
                            const std::vector<float> residual_in = residual;
                            std::vector<float> x_used = x;
                            if (add_norm) {
                                Stage add;
                                add.op = Op::AddNorm;
                                add.operands = {nullptr, nullptr, &norm_w->ref, nullptr};
                                add.k = add.n = k;
                                add.params.eps = 1e-6f;
                                add.features = kRmsNorm;
                                x_used = cpu_add_norm(add, m, residual, branch, cpu);  // residual: the sum now
                                stage.operands.resize(4);
                                stage.operands.push_back(&norm_w->ref);
                                stage.params.eps = add.params.eps;
                                stage.features |= kAddNormInput;
                            }
                            std::vector<float> ref(size_t(m) * 2 * used);
                            call.in = x_used.data(), call.out = ref.data();
                            run_cpu(cpu_route, stage, call, cpu);
                            float* out = t.arena.nan_floats(ref.size());
                            t.ctx.moe_logits = t.arena.nan_floats(moe_scratch(stage, m, cuda_rows::kMmaTokens).logits *
                                                                   KCAP_MOE_TILE_MAX_SPLITS);
                            data.operands[0] = t.arena.upload_bytes(w->ref.data, w->ref.nbytes);
                            if (gemma)
                                data.operands[1] = t.arena.upload_bytes(expert_scale->ref.data, expert_scale->ref.nbytes);
                            if (oai)
                                data.operands[2] = t.arena.upload_bytes(router_bias->ref.data, router_bias->ref.nbytes);
                            call.in = t.arena.upload(x), call.out = out;
                            float* d_residual = nullptr;
                            float* d_normed = nullptr;
                            if (add_norm) {
                                data.operands[4] = t.arena.upload_bytes(norm_w->ref.data, norm_w->ref.nbytes);
                                d_residual = t.arena.upload(residual_in);
                                d_normed = t.arena.nan_floats(x_used.size());
                                call.in = call.inout2 = d_residual;
                                call.in2 = t.arena.upload(branch);
                                call.inout3 = d_normed;
                            }
                            if (!t.run(row, stage, call, data)) continue;
                            if (add_norm) {
                                const double residual_err = relative_error(download(d_residual, residual.size()), residual);
                                const double normed_err = relative_error(download(d_normed, x_used.size()), x_used);
                                KCAP_EXPECT(residual_err <= kExactTolerance && normed_err <= kExactTolerance,
                                            "%s K=%lld, %d tokens: residual error %.3g, normed error %.3g",
                                            row.kernel.c_str(), (long long)k, m, residual_err, normed_err);
                            }
                            const std::vector<float> got = download(out, ref.size());
                            const RoutingDiff diff = routing_diff(got, ref, m, used);
                            KCAP_EXPECT(diff.wrong_ids == 0 && diff.weights_error <= kExactTolerance,
                                        "%s %s K=%lld used %d, %d tokens%s%s: %d experts chosen differently, weights error %.3g",
                                        row.kernel.c_str(), format_name(f), (long long)k, used, m,
                                        gemma ? " (logit scale, per-expert scales)" : oai ? " (bias)" : "",
                                        add_norm ? " (add_norm first)" : "", diff.wrong_ids, diff.weights_error);
                            ++g_cases;
                            continue;
                        }
                        if (row.op == Op::MoeSharedGate) {
                            const auto gate = float_vector(random_floats(rng, size_t(k), 0.2f), "shexp_gate");
                            stage.operands = {&gate->ref};
                            stage.n = k;
                            stage.features = kSharedExpertGate;
                            const std::vector<float> in = random_floats(rng, size_t(m) * size_t(k));
                            const std::vector<float> shared = random_floats(rng, size_t(m) * size_t(k));
                            std::vector<float> ref(in.size());
                            call.in = in.data(), call.in2 = shared.data(), call.in3 = x.data(), call.out = ref.data();
                            run_cpu(cpu_shared, stage, call, cpu);
                            float* out = t.arena.nan_floats(ref.size());
                            data.operands[0] = t.arena.upload_bytes(gate->ref.data, gate->ref.nbytes);
                            call.in = t.arena.upload(in), call.in2 = t.arena.upload(shared), call.in3 = t.arena.upload(x);
                            call.out = out;
                            if (!t.run(row, stage, call, data)) continue;
                            const double err = relative_error(download(out, ref.size()), ref);
                            KCAP_EXPECT(err <= kExactTolerance, "%s K=%lld, %d tokens: error %.3g", row.kernel.c_str(),
                                        (long long)k, m, err);
                            ++g_cases;
                            continue;
                        }
                        // Experts: on a routing the CPU router chose (ids spread over the experts).
                        const auto router = random_weights(rng, Format::F32, k, n_expert, "router");
                        Stage route = stage;
                        route.op = Op::MoeRoute;
                        route.operands = {&router->ref};
                        route.n = 2 * used;
                        route.features = kExpertSoftmax | kExpertWeightsNorm;
                        std::vector<float> routing(size_t(m) * 2 * used);
                        call.in = x.data(), call.out = routing.data();
                        run_cpu(cpu_route, route, call, cpu);
                        // The down matrix in the row's format at the shorter K; at the longer, in another
                        // (Q6_K where K takes it, as in a Q4_K_M file, else Q8_0).
                        const Format down_format = k == block ? f : k % 256 == 0 ? Format::Q6_K : Format::Q8_0;
                        const int64_t down_block = std::max<int64_t>(32, format_info(down_format).block_elems);
                        const int64_t ff_legal = (ff + down_block - 1) / down_block * down_block;
                        // Gemma 4: gate and up in one tensor, each expert's gate rows then its up rows.
                        const auto gate = random_weights(rng, f, k, ff_legal * n_expert * (gemma ? 2 : 1),
                                                         gemma ? "gate_up_exps" : "gate_exps");
                        const auto own_up = gemma ? nullptr : random_weights(rng, f, k, ff_legal * n_expert, "up_exps");
                        const auto* up = gemma ? gate.get() : own_up.get();
                        const auto down = random_weights(rng, down_format, ff_legal, n * n_expert, "down_exps");
                        plant_tiny_mxfp4_scales(*gate);
                        if (own_up) plant_tiny_mxfp4_scales(*own_up);
                        plant_tiny_mxfp4_scales(*down);
                        // gpt-oss: F32 biases [n_expert][rows] of gate, up and down.
                        const auto gate_bias = float_vector(random_floats(rng, size_t(ff_legal * n_expert), 0.5f), "gate_bias");
                        const auto up_bias = float_vector(random_floats(rng, size_t(ff_legal * n_expert), 0.5f), "up_bias");
                        const auto down_bias = float_vector(random_floats(rng, size_t(n * n_expert), 0.5f), "down_bias");
                        stage.operands = {&gate->ref, &up->ref, &down->ref};
                        if (oai) stage.operands.insert(stage.operands.end(), {&gate_bias->ref, &up_bias->ref, &down_bias->ref});
                        stage.k2 = ff_legal;
                        stage.n = n;
                        stage.params.activation = gemma ? Activation::GeluTanh : oai ? Activation::SwigluOai : Activation::SiLU;
                        stage.features = (gemma ? FeatureMask(kGeluTanh | kExpertGateUpMerged)
                                          : oai ? FeatureMask(kSwigluOai | kBias)
                                                : FeatureMask(kSilu)) |
                                         kGated;
                        const MoeScratch scratch = moe_scratch(stage, m, cuda_rows::kMmaTokens);
                        t.ctx.moe_act = t.arena.nan_floats(scratch.act);
                        t.ctx.moe_up = t.arena.nan_floats(scratch.up);
                        t.ctx.moe_down = t.arena.nan_floats(scratch.down);
                        t.ctx.moe_rows = reinterpret_cast<int*>(t.arena.nan_floats(scratch.rows));
                        t.ctx.moe_slot_rows = reinterpret_cast<int*>(t.arena.nan_floats(scratch.slot_rows));
                        t.ctx.moe_tile_expert = reinterpret_cast<int*>(t.arena.nan_floats(scratch.tiles));
                        t.ctx.moe_q8_capacity = size_t(cuda_rows::q8_rows_bytes(1, int64_t(scratch.act)));
                        t.ctx.moe_q8 = t.arena.nan_floats(t.ctx.moe_q8_capacity / 4);
                        t.ctx.moe_bf16_capacity = cuda_rows::moe_input_values(scratch.down, scratch.act);  // as the backend
                        t.ctx.moe_bf16 = reinterpret_cast<unsigned short*>(t.arena.nan_floats(t.ctx.moe_bf16_capacity / 2 + 1));
                        // The slot starts' counts, zero as the backend sets them (one more than a
                        // call's slots, to see that nothing past them is counted).
                        t.ctx.moe_slot_done_capacity = size_t(m) * size_t(used) + 1;
                        t.ctx.moe_slot_done = t.arena.upload(std::vector<int>(t.ctx.moe_slot_done_capacity, 0));
                        const bool q8 = row.input_encoding == Encoding::Q8_1;
                        stage.input_encoding = row.input_encoding;
                        std::vector<float> ref(size_t(m) * size_t(n));
                        call.in = x.data(), call.in2 = routing.data(), call.out = ref.data();
                        run_cpu(cpu_experts, stage, call, cpu);
                        float* out = t.arena.nan_floats(ref.size());
                        data.operands[0] = t.arena.upload_bytes(gate->ref.data, gate->ref.nbytes);
                        data.operands[1] = t.arena.upload_bytes(up->ref.data, up->ref.nbytes);
                        data.operands[2] = t.arena.upload_bytes(down->ref.data, down->ref.nbytes);
                        if (oai) {
                            data.operands[3] = t.arena.upload_bytes(gate_bias->ref.data, gate_bias->ref.nbytes);
                            data.operands[4] = t.arena.upload_bytes(up_bias->ref.data, up_bias->ref.nbytes);
                            data.operands[5] = t.arena.upload_bytes(down_bias->ref.data, down_bias->ref.nbytes);
                        }
                        call.in = t.arena.upload(x), call.in2 = t.arena.upload(routing), call.out = out;
                        if (!t.run(row, stage, call, data)) continue;
                        char what[256];  // the case, for the messages below
                        std::snprintf(what, sizeof what, "%s down %s K=%lld ff=%lld used %d, %d tokens%s", row.kernel.c_str(),
                                      format_name(down_format), (long long)k, (long long)ff_legal, used, m,
                                      gemma ? " (merged gate_up, gelu_tanh)" : oai ? " (biases, clamped SwiGLU)" : "");
                        // The slot starts leave their counts at 0 for the next stage.
                        const std::vector<int> counts = download(t.ctx.moe_slot_done, t.ctx.moe_slot_done_capacity);
                        KCAP_EXPECT(std::count(counts.begin(), counts.end(), 0) == std::ptrdiff_t(counts.size()),
                                    "%s: slot counts left at %d, %d, ... after the call", what, counts[0],
                                    counts.size() > 1 ? counts[1] : 0);
                        // The grouped rows' sorted row of each slot, within the batch's tiles (a
                        // row outside them clears slot_rows_ok; the lookup clamps).
                        const int64_t slots = int64_t(m) * used;
                        const int rows = int(moe_grouped_tiles(slots, n_expert, cuda_rows::kMmaTokens)) * cuda_rows::kMmaTokens;
                        bool slot_rows_ok = true;
                        std::vector<int32_t> slot_rows;
                        const auto slot_row = [&](size_t slot) {
                            const int r = slot_rows[slot];
                            if (r < 0 || r >= rows) slot_rows_ok = false;
                            return size_t(std::clamp(r, 0, rows - 1));
                        };
                        if (row.input_encoding == Encoding::BF16) {
                            // The bf16 grouped row: its bf16 activations (sorted rows after the
                            // tokens' bf16 x, found through slot_rows) held to bf16(W) . bf16(x) of
                            // gate and up beyond their rounding (bf16_excess_error), the output to
                            // the weighted sum of bf16(W_down) . its own activations, each to the
                            // bf16 GEMM rows' bound for its K.
                            slot_rows = download(t.ctx.moe_slot_rows, size_t(slots));
                            const std::vector<unsigned short> act_bits =
                                download(t.ctx.moe_bf16 + size_t(m) * size_t(k), size_t(rows) * size_t(ff_legal));
                            std::vector<float> act_rows(act_bits.size());
                            for (size_t i = 0; i < act_bits.size(); ++i) {
                                const uint32_t bits = uint32_t(act_bits[i]) << 16;
                                std::memcpy(&act_rows[i], &bits, 4);
                            }
                            std::vector<float> act(size_t(slots) * size_t(ff_legal));
                            const auto row_act = [&](size_t slot) { return act_rows.data() + slot_row(slot) * size_t(ff_legal); };
                            for (size_t slot = 0; slot < size_t(slots); ++slot)
                                std::copy_n(row_act(slot), ff_legal, act.begin() + slot * size_t(ff_legal));
                            const MoeBf16Reference bf16_ref = moe_bf16_reference(stage, x, routing, row_act);
                            const double act_err = bf16_excess_error(act, bf16_ref.act);
                            const double err = relative_error(download(out, ref.size()), bf16_ref.out);
                            KCAP_EXPECT(slot_rows_ok && act_err <= gemm_tolerance(k) && err <= gemm_tolerance(ff_legal),
                                        "%s: slot rows %s, activations error %.3g, output %.3g", what,
                                        slot_rows_ok ? "ok" : "out of range", act_err, err);
                            ++g_cases;
                            continue;
                        }
                        if (q8 && is_tile_row(row)) {
                            // The grouped int8 row rounds its f32 activations straight to q8_1 (in
                            // sorted rows): each slot's codes are held to the CPU's activations
                            // within half a step of their run (and the f32 roundings, and GELU's
                            // absolute error in its tail: MoeQ8Reference::tail), the output to
                            // the CPU's down and sum of the row's own codes (sums of 16 recounted
                            // from the codes).
                            const int64_t ff_q = ff_legal;
                            const cuda::Q8Rows device_q8 = cuda::q8_rows_in(t.ctx.moe_q8, t.ctx.moe_q8_capacity, rows, int(ff_q));
                            slot_rows = download(t.ctx.moe_slot_rows, size_t(slots));
                            const std::vector<uint32_t> words = download(device_q8.codes, size_t(rows) * size_t(ff_q) / 4);
                            const std::vector<float> scales = download(device_q8.d, size_t(rows) * size_t(ff_q / 32));
                            std::vector<int8_t> codes(words.size() * 4);
                            std::memcpy(codes.data(), words.data(), codes.size());
                            std::vector<int32_t> sums(size_t(rows) * size_t(ff_q / 16));
                            for (size_t i = 0; i < sums.size(); ++i)
                                for (int j = 0; j < 16; ++j) sums[i] += codes[16 * i + size_t(j)];
                            const auto view = [&](size_t slot) {
                                const size_t row_index = slot_row(slot);
                                return Q8View{codes.data() + row_index * size_t(ff_q), scales.data() + row_index * size_t(ff_q / 32),
                                              sums.data() + row_index * size_t(ff_q / 16)};
                            };
                            const MoeQ8Reference q8_ref = moe_q8_reference(stage, x, routing, {}, view);
                            double act_excess = 0.0;  // worst |d q - act| beyond half a step (and the tail), in steps
                            for (int64_t slot = 0; slot < slots; ++slot) {
                                const Q8View v = view(size_t(slot));
                                for (int64_t i = 0; i < ff_q; ++i) {
                                    const double step = v.d[i / 32];
                                    const double got = step * v.q[i], want = q8_ref.act[size_t(slot) * size_t(ff_q) + size_t(i)];
                                    const double bound = step * (0.5 + 127.0 * kExactTolerance) +
                                                         q8_ref.tail[size_t(slot) * size_t(ff_q) + size_t(i)];
                                    const double excess = std::abs(got - want) - bound;
                                    if (!(excess <= 0.0)) act_excess = std::max(act_excess, step > 0 ? excess / step : 1e30);
                                }
                            }
                            const double err = relative_error(download(out, ref.size()), q8_ref.out);
                            KCAP_EXPECT(slot_rows_ok && act_excess == 0.0 && err <= kExactTolerance,
                                        "%s: slot rows %s, activations past half a step by %.3g steps, output %.3g", what,
                                        slot_rows_ok ? "ok" : "out of range", act_excess, err);
                            ++g_cases;
                            continue;
                        }
                        if (q8) {
                            // The activations are the row's own f32 sums, which it rounds to q8_1 for
                            // the down matvec: one that lies on a rounding boundary may round a code
                            // apart from the CPU's. So the activations are held to the CPU's, and the
                            // output to the CPU's down and sum of the row's own activations.
                            const std::vector<float> act = download(t.ctx.moe_act, size_t(m) * used * size_t(ff_legal));
                            const MoeQ8Reference q8_ref = moe_q8_reference(stage, x, routing, act);
                            const double act_err = relative_error(act, q8_ref.act);
                            const double err = relative_error(download(out, ref.size()), q8_ref.out);
                            KCAP_EXPECT(act_err <= kExactTolerance && err <= kExactTolerance,
                                        "%s: activations error %.3g, output %.3g", what, act_err, err);
                            ++g_cases;
                            continue;
                        }
                        const double err = relative_error(download(out, ref.size()), ref);
                        // The grouped rows' split-bf16 tiles: within 2^-16 of exact per product, as the
                        // matmul tile rows.
                        const double bound = is_tile_row(row) ? kMmaTolerance : kExactTolerance;
                        KCAP_EXPECT(err <= bound, "%s: error %.3g", what, err);
                        ++g_cases;
                    }
        }
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
    cudaDeviceProp props;
    CHECK(cudaGetDeviceProperties(&props, 0));
    g_device.name = props.name;
    g_device.reference = false;
    g_device.sm_count = props.multiProcessorCount;
    g_device.shared_optin_bytes = kcap::cuda::shared_optin_bytes(0);
    // KCAP_TEST_SEED=N draws other random inputs (the default keeps runs comparable).
    const char* seed = std::getenv("KCAP_TEST_SEED");
    std::mt19937 rng(seed && *seed ? unsigned(std::strtoul(seed, nullptr, 10)) : 20251129u);
    CpuState cpu(16);
    // Every CUDA row must be compiled in.
    for (const Row& row : capability_table())
        if (row.backend == Backend::CUDA) KCAP_EXPECT(row.fn != nullptr, "%s has no kernel", row.kernel.c_str());
    // KCAP_TEST_ROWS=group,group runs only those groups (a short device call); unset, all of them.
    const char* only = std::getenv("KCAP_TEST_ROWS");
    const char* cap = std::getenv("KCAP_TEST_CASES_PER_ROW");
    g_case_cap = cap && *cap ? int(std::strtol(cap, nullptr, 10)) : 0;
    if (g_case_cap > 0) std::printf("at most %d cases per row of matmul, gate_up, qkv, attention, attention_mla, moe\n", g_case_cap);
    const auto wanted = [&](const char* name) {
        if (!only || !*only) return true;
        const std::string list = std::string(",") + only + ",";
        return list.find(std::string(",") + name + ",") != std::string::npos;
    };
    struct Group {
        const char* name;
        std::function<void()> run;
    };
    const Group groups[] = {
        {"matmul", [&] { test_matmul_rows(rng, cpu, Op::MatMul); }},
        {"gate_up", [&] { test_matmul_rows(rng, cpu, Op::GateUp); }},
        {"qkv", [&] { test_qkv(rng, cpu); }},
        {"attention", [&] { test_attention(rng, cpu); }},
        {"attention_mla", [&] { test_attention_mla(rng, cpu); }},
        {"add_norm", [&] { test_add_norm(rng, cpu); }},
        {"norm", [&] { test_norm(rng, cpu); }},
        {"rope", [&] { test_rope(rng, cpu); }},
        {"qk_norm_rope", [&] { test_qk_norm_rope(rng, cpu); }},
        {"embed", [&] { test_embed(rng, cpu); }},
        {"ple", [&] { test_ple(rng, cpu); }},
        {"elementwise", [&] { test_elementwise(rng, cpu); }},
        {"argmax", [&] { test_argmax(rng), test_sample(rng); }},
        {"moe", [&] { test_moe(rng, cpu); }},
    };
    bool all = true;
    for (const Group& group : groups) {
        if (!wanted(group.name)) {
            all = false;
            continue;
        }
        const int cases = g_cases;
        const size_t rows = g_ran.size();
        const auto start = std::chrono::steady_clock::now();
        group.run();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("%s: %d cases, %zu rows, %.1f seconds\n", group.name, g_cases - cases, g_ran.size() - rows, seconds);
    }
    if (all) {  // every CUDA row of the table ran a case
        std::string missing;
        int count = 0;
        for (const Row& row : capability_table())
            if (row.backend == Backend::CUDA && !g_ran.count(&row)) missing += " " + row.kernel, ++count;
        KCAP_EXPECT(count == 0, "%d CUDA rows ran no case:%s", count, missing.c_str());
    } else {
        std::printf("only %s (KCAP_TEST_ROWS): no coverage check\n", only);
    }
    std::printf("%d cases, %zu rows, %d failures\n", g_cases, g_ran.size(), failures());
    return failures() ? 1 : 0;
}

#endif
