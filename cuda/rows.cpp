// The CUDA rows of the capability table (launchers and geometry in cuda/rows.h). Compiled in
// every build: where CUDA is not compiled in (KCAP_WITH_CUDA undefined) each row's fn is null,
// so plans and `kcap explain --backend cuda` still work and an Engine on cuda is refused.
//
// Every row names the token counts it takes and the kernels one call launches. The planner
// routes each stage once per range of tokens per call; the priorities below order the rows that
// take the same token counts:
//   matmul, gate_up, qkv   one token: the decode matvec (1) over the few-token walk (0); from
//                          kMmaMinTokens: the split-bf16 tensor-core tiles (2); where the plan's
//                          activations allow, the q8_1 rows (3, 128-token tiles 4) and the bf16
//                          GEMM rows (5), which take only the token counts they are fast at.
//   attention              one token: the flash-decoding decode; more: the tiled prefill, or the
//                          tensor-core prefill (1) where the cache is f16 and the head dims fit.
#include "cuda/rows.h"

#include <iterator>

#include "dispatch/gpu_rows.h"
#include "dispatch/stage.h"
#include "kernels/params.h"

namespace kcap {

#if defined(KCAP_WITH_CUDA)
#define KCAP_CUDA_ENTRY(...) (&__VA_ARGS__)
#else
#define KCAP_CUDA_ENTRY(...) nullptr
#endif

namespace {

using namespace cuda_rows;

constexpr FeatureMask kActivations = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;
constexpr TokenRange kOneToken = {1, 1};
constexpr TokenRange kAnyTokens = {1, 0};
constexpr TokenRange kFewTokens = {1, kMmaMinTokens - 1};  // the q8_1 matvec takes up to 15
constexpr TokenRange kTileTokens = {kMmaMinTokens, 0};

Row make_row(const std::string& kernel, Op op, KernelFn fn, Geometry geometry, TokenRange tokens,
             std::vector<std::string> launches) {
    Row row = gpu_row(Backend::CUDA, kernel, op, fn, geometry);
    row.tokens = tokens;
    row.launches = std::move(launches);
    return row;
}

const Geometry kMatvecGeometry = {kMatvecSimds * 32, kMatvecSimds * kMatvecRows, kMatvecSharedBytes};
const Geometry kMatvecQ8Geometry = {kMatvecQ8Simds * 32, kMatvecQ8Simds * kMatvecRows, kMatvecQ8SharedBytes};
const Geometry kTokensGeometry = {kTokensSimds * 32, kTokensSimds * kTokensRows, 0};
const Geometry kMmaGeometry = {kMmaThreads, kMmaRows, 0};

std::vector<Format> q8_formats() {
    std::vector<Format> formats;
#define KCAP_Q8_FORMAT(NAME, DECODER) formats.push_back(Format::NAME);
    KCAP_Q8_WEIGHT_FORMATS(KCAP_Q8_FORMAT)
#undef KCAP_Q8_FORMAT
    return formats;
}

std::vector<Format> mma_formats() {
    std::vector<Format> formats;
    for (Format f : gpu_weight_formats())
        if (mma_format(f)) formats.push_back(f);
    return formats;
}

// The row tiles of a matmul-type stage: its matrices' rows in tiles of kMmaRows.
long long stage_row_tiles(const Stage& stage) {
    const long long tiles = (stage.n + kMmaRows - 1) / kMmaRows;
    return stage.op == Op::GateUp ? 2 * tiles : tiles;
}

// 128-token int8 tiles pay off from the batch that fills a wave with them (q8_tile128_min_tokens).
template <Format FORMAT>
int q8_tile128_tokens(const Stage& stage, const DeviceInfo& device) {
    return q8_tile128_min_tokens(stage_row_tiles(stage), FORMAT, device.sm_count);
}

// The q8_1 slot matvecs with slot starts from the tokens whose gate/up launch is surely more than
// one wave (moe_slot_starts_min_tokens).
int moe_slot_starts_tokens(const Stage& stage, const DeviceInfo& device) {
    return moe_slot_starts_min_tokens(stage.k2, stage.k, stage.params.n_expert_used, device.sm_count);
}

// The q8_1 rows of one family in each of their three input sources: Groups for rows of fewer
// than kQ8QuantizeMinK values (the matvec; batches always quantize), Quantize for longer rows and
// batches, Scratch where the stage before wrote the q8_1 input (kQ8Input).
// "cuda.matvec_q8.q4_k" -> "cuda.matvec_q8_in.q4_k"; "cuda.qkv_q8" -> "cuda.qkv_q8_in".
void name_source(Row& row, const char* suffix) {
    const size_t format = row.kernel.find('.', 5);  // after "cuda."
    row.kernel.insert(format == std::string::npos ? row.kernel.size() : format, suffix);
}

void set_q8_source(Row& row, Q8Source source, bool batch) {
    row.input_encoding = Encoding::Q8_1;
    if (source == Q8Source::Scratch) {
        row.features |= kQ8Input;
        row.requires_all = kQ8Input;
        name_source(row, "_in");
    } else if (source == Q8Source::Quantize && !batch) {
        row.dims.k_min = kQ8QuantizeMinK;
        name_source(row, "_quant");
        row.launches.insert(row.launches.begin(), "q8_quantize_rows");
    } else if (source == Q8Source::Quantize) {
        row.launches.insert(row.launches.begin(), "q8_quantize_rows");
    } else {
        row.dims.k_max = kQ8QuantizeMinK - 1;
    }
}

std::string lower(Format f) { return lowercase(format_name(f)); }

}  // namespace

void add_cuda_embed_rows(std::vector<Row>& rows) {
#define KCAP_EMBED_ROW(NAME, DECODER)                                                                  \
    rows.push_back(gpu_family_row(GpuFamily::Embed, Backend::CUDA, Format::NAME,                       \
                                  KCAP_CUDA_ENTRY(kcap_cuda_embed<Format::NAME>), {kEmbedThreads, 1, 0}));
    KCAP_WEIGHT_FORMATS(KCAP_EMBED_ROW)
#undef KCAP_EMBED_ROW
}

void add_cuda_matmul_rows(std::vector<Row>& rows) {
    // Exact rows (f32 activations and sums) of every format: the decode matvec (kernels/matvec.h,
    // x staged in threadgroup memory) for one token, the few-token walk (kernels/matmul.h, each
    // decoded run of weights serving kTokensPerPass tokens) for any count; the fused gate_up
    // (both matrices against one staged x, the activation applied to the sums) and its walk.
    // Tensor-core rows (CUDA only, cuda/matmul_mma.cu) from kMmaMinTokens: tiles of bf16
    // mma.sync on scale-factored weights and split (hi + lo) activations, f32 sums: within 2^-16
    // of exact per product; quantized formats and BF16 (mma_format), whole 32-value runs.
#define KCAP_EXACT_ROWS(NAME, DECODER)                                                                        \
    {                                                                                                         \
        const Format f = Format::NAME;                                                                        \
        rows.push_back(gpu_family_row(GpuFamily::Matvec, Backend::CUDA, f, KCAP_CUDA_ENTRY(kcap_cuda_matvec<f>), \
                                      kMatvecGeometry));                                                      \
        rows.push_back(gpu_family_row(GpuFamily::MatmulTokens, Backend::CUDA, f,                              \
                                      KCAP_CUDA_ENTRY(kcap_cuda_matmul_tokens<f>), kTokensGeometry));         \
        rows.push_back(gpu_family_row(GpuFamily::GateUp, Backend::CUDA, f, KCAP_CUDA_ENTRY(kcap_cuda_gate_up<f>), \
                                      kMatvecGeometry));                                                      \
        rows.push_back(gpu_family_row(GpuFamily::GateUpTokens, Backend::CUDA, f,                              \
                                      KCAP_CUDA_ENTRY(kcap_cuda_gate_up_tokens<f>), kTokensGeometry));        \
        if (mma_format(f)) {                                                                                  \
            Row mma = make_row("cuda.matmul_mma." + lower(f), Op::MatMul,                                     \
                               KCAP_CUDA_ENTRY(kcap_cuda_matmul_mma<f>), kMmaGeometry, kTileTokens,           \
                               {"mma_tiles"});                                                                \
            mma.operand_formats = {{f}, {Format::F32}};                                                       \
            mma.features = kBias;                                                                             \
            mma.dims.k_multiple = run_k_multiple(f);                                                          \
            mma.priority = 2;                                                                                 \
            rows.push_back(mma);                                                                              \
            Row gate_up_mma = make_row("cuda.gate_up_mma." + lower(f), Op::GateUp,                            \
                                       KCAP_CUDA_ENTRY(kcap_cuda_gate_up_mma<f>), kMmaGeometry, kTileTokens,  \
                                       {"mma_tiles", "ffn_activation"});                                      \
            gate_up_mma.operand_formats = {{f}, {f}};                                                         \
            gate_up_mma.features = kActivations;                                                              \
            gate_up_mma.dims.k_multiple = run_k_multiple(f);                                                  \
            gate_up_mma.priority = 2;                                                                         \
            rows.push_back(gate_up_mma);                                                                      \
        }                                                                                                     \
    }
    KCAP_WEIGHT_FORMATS(KCAP_EXACT_ROWS)
#undef KCAP_EXACT_ROWS

    // q8_1 activations (opt-in: allowed only where the plan's activations are q8_1; preferred
    // there): x rounded to int8 per 32-element run, integer products (dp4a for up to 15 tokens,
    // int8 mma.sync tiles from 16: 64 tokens per group, or 128 from the batch that fills a wave),
    // f32 scales. W . q8_1(x) to the exact rows' 1e-5 (test_cuda_rows). Each in three input
    // sources (set_q8_source).
#define KCAP_Q8_ROWS(NAME, DECODER)                                                                           \
    for (const Q8Source source : {Q8Source::Groups, Q8Source::Quantize, Q8Source::Scratch}) {                \
        const Format f = Format::NAME;                                                                        \
        const auto fn = [&](KernelFn groups, KernelFn quantize, KernelFn scratch) {                           \
            return source == Q8Source::Groups ? groups : source == Q8Source::Quantize ? quantize : scratch;   \
        };                                                                                                    \
        Row matvec = make_row("cuda.matvec_q8." + lower(f), Op::MatMul,                                       \
                              fn(KCAP_CUDA_ENTRY(kcap_cuda_matvec_q8<f, Q8Source::Groups>),                   \
                                 KCAP_CUDA_ENTRY(kcap_cuda_matvec_q8<f, Q8Source::Quantize>),                 \
                                 KCAP_CUDA_ENTRY(kcap_cuda_matvec_q8<f, Q8Source::Scratch>)),                 \
                              kMatvecQ8Geometry, kFewTokens, {"matvec_q8"});                                  \
        matvec.operand_formats = {{f}, {Format::F32}};                                                        \
        matvec.features = kBias;                                                                              \
        matvec.dims.k_multiple = exact_k_multiple(f);                                                         \
        matvec.priority = 3;                                                                                  \
        set_q8_source(matvec, source, false);                                                                 \
        rows.push_back(matvec);                                                                               \
        Row gate_up = make_row("cuda.gate_up_q8." + lower(f), Op::GateUp,                                     \
                               fn(KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8<f, Q8Source::Groups>),                 \
                                  KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8<f, Q8Source::Quantize>),               \
                                  KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8<f, Q8Source::Scratch>)),               \
                               kMatvecQ8Geometry, kFewTokens, {"gate_up_q8"});                         \
        gate_up.operand_formats = {{f}, {f}};                                                                 \
        gate_up.features = kActivations;                                                                      \
        gate_up.dims.k_multiple = exact_k_multiple(f);                                                        \
        gate_up.priority = 3;                                                                                 \
        set_q8_source(gate_up, source, false);                                                                \
        rows.push_back(gate_up);                                                                              \
        if (source == Q8Source::Groups) continue; /* a batch's x is always quantized once */                  \
        for (const int tokens : {64, 128}) {                                                                  \
            const std::string size = tokens == 128 ? "128" : "";                                              \
            const bool in = source == Q8Source::Scratch;                                                      \
            Row mma = make_row("cuda.matmul_q8_mma" + size + "." + lower(f), Op::MatMul,                      \
                               tokens == 128 ? (in ? KCAP_CUDA_ENTRY(kcap_cuda_matmul_q8_mma<f, Q8Source::Scratch, 128>) \
                                                   : KCAP_CUDA_ENTRY(kcap_cuda_matmul_q8_mma<f, Q8Source::Quantize, 128>)) \
                                             : (in ? KCAP_CUDA_ENTRY(kcap_cuda_matmul_q8_mma<f, Q8Source::Scratch, 64>) \
                                                   : KCAP_CUDA_ENTRY(kcap_cuda_matmul_q8_mma<f, Q8Source::Quantize, 64>)), \
                               kMmaGeometry, kTileTokens, {"mma_q8_tiles"});                                  \
            mma.operand_formats = {{f}, {Format::F32}};                                                       \
            mma.features = kBias;                                                                             \
            mma.dims.k_multiple = exact_k_multiple(f);                                                        \
            mma.priority = tokens == 128 ? 4 : 3;                                                             \
            if (tokens == 128) mma.tokens_min_of = &q8_tile128_tokens<f>;                                     \
            set_q8_source(mma, source, true);                                                                 \
            rows.push_back(mma);                                                                              \
            Row gate_up_mma =                                                                                 \
                make_row("cuda.gate_up_q8_mma" + size + "." + lower(f), Op::GateUp,                           \
                         tokens == 128 ? (in ? KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8_mma<f, Q8Source::Scratch, 128>) \
                                             : KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8_mma<f, Q8Source::Quantize, 128>)) \
                                       : (in ? KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8_mma<f, Q8Source::Scratch, 64>) \
                                             : KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8_mma<f, Q8Source::Quantize, 64>)), \
                         kMmaGeometry, kTileTokens, {"mma_q8_tiles", "ffn_activation"});                      \
            gate_up_mma.operand_formats = {{f}, {f}};                                                         \
            gate_up_mma.features = kActivations;                                                              \
            gate_up_mma.dims.k_multiple = exact_k_multiple(f);                                                \
            gate_up_mma.priority = tokens == 128 ? 4 : 3;                                                     \
            if (tokens == 128) gate_up_mma.tokens_min_of = &q8_tile128_tokens<f>;                             \
            set_q8_source(gate_up_mma, source, true);                                                         \
            rows.push_back(gate_up_mma);                                                                      \
        }                                                                                                     \
    }
    KCAP_Q8_WEIGHT_FORMATS(KCAP_Q8_ROWS)
#undef KCAP_Q8_ROWS

    // bf16 activations (opt-in: allowed only where the plan's activations are bf16; preferred
    // there) from kGemmMinTokens: each weight matrix dequantized to bf16 and multiplied by
    // cuBLAS's bf16 GEMM on bf16(x) with f32 sums (cuda/matmul_gemm.cu); fewer tokens run the
    // exact rows. bf16(W) . bf16(x) to the f32 sums' bound (test_cuda_rows). Whole 32-value
    // runs of every weight format (the dequantize writes runs).
#define KCAP_BF16_ROWS(NAME, DECODER)                                                                         \
    {                                                                                                         \
        const Format f = Format::NAME;                                                                        \
        Row matmul = make_row("cuda.matmul_bf16." + lower(f), Op::MatMul,                                     \
                              KCAP_CUDA_ENTRY(kcap_cuda_matmul_bf16<f>), {kGemmThreads, 0, 0}, {kGemmMinTokens, 0}, \
                              {"bf16_convert", "bf16_dequantize", "cublas_gemm", "(add_bias)"});              \
        matmul.operand_formats = {{f}, {Format::F32}};                                                        \
        matmul.features = kBias;                                                                              \
        matmul.dims.k_multiple = run_k_multiple(f);                                                           \
        matmul.input_encoding = Encoding::BF16;                                                               \
        matmul.priority = 5;                                                                                  \
        rows.push_back(matmul);                                                                               \
        Row gate_up = make_row("cuda.gate_up_bf16." + lower(f), Op::GateUp,                                   \
                               KCAP_CUDA_ENTRY(kcap_cuda_gate_up_bf16<f>), {kGemmThreads, 0, 0},              \
                               {kGemmMinTokens, 0},                                                           \
                               {"bf16_convert", "bf16_dequantize", "cublas_gemm", "bf16_dequantize",          \
                                "cublas_gemm", "ffn_activation"});                                            \
        gate_up.operand_formats = {{f}, {f}};                                                                 \
        gate_up.features = kActivations;                                                                      \
        gate_up.dims.k_multiple = run_k_multiple(f);                                                          \
        gate_up.input_encoding = Encoding::BF16;                                                              \
        gate_up.priority = 5;                                                                                 \
        rows.push_back(gate_up);                                                                              \
    }
    KCAP_WEIGHT_FORMATS(KCAP_BF16_ROWS)
#undef KCAP_BF16_ROWS

    // Fused Q, K and V matmuls of one input, each weight in any format, each with its F32 bias
    // where it has one (operands 3..5, kBias): one token runs one launch whose groups take the
    // three matrices' rows (cuda.qkv), a few tokens the walk for each matrix, a batch the
    // tensor-core tiles of the matrices of one format in one launch (every weight in a tile
    // format). K must suit every weight's format.
    const std::vector<Format> all = gpu_weight_formats();
    const auto takes = [](Row& row, const std::vector<Format>& weights) {  // the weights, their biases
        row.operand_formats = {weights, weights, weights, {Format::F32}, {Format::F32}, {Format::F32}};
        row.features |= kBias;
    };
    {
        Row row = make_row("cuda.qkv", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv), kMatvecGeometry, kOneToken,
                           {"qkv_matvec"});
        takes(row, all);
        row.dims.k_multiple_of = &exact_k_multiple;
        row.priority = 1;
        rows.push_back(row);
        Row walk = make_row("cuda.qkv_tokens", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv_tokens), kTokensGeometry,
                            kAnyTokens, {"matmul_tokens", "matmul_tokens", "matmul_tokens"});
        takes(walk, all);
        walk.dims.k_multiple_of = &exact_k_multiple;
        rows.push_back(walk);
        const std::vector<Format> tiles = mma_formats();
        Row mma = make_row("cuda.qkv_mma", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv_mma), kMmaGeometry, kTileTokens,
                           {"mma_tiles", "(mma_tiles)", "(mma_tiles)"});  // one launch per format
        takes(mma, tiles);
        mma.dims.k_multiple_of = &run_k_multiple;
        mma.priority = 2;
        rows.push_back(mma);
    }
    {  // q8_1 (every weight in a q8_1 format): one token, a few, a batch; each in its input sources
        const std::vector<Format> formats = q8_formats();
        for (const Q8Source source : {Q8Source::Groups, Q8Source::Quantize, Q8Source::Scratch}) {
            const auto pick = [&](KernelFn groups, KernelFn quantize, KernelFn scratch) {
                return source == Q8Source::Groups ? groups : source == Q8Source::Quantize ? quantize : scratch;
            };
            Row one = make_row("cuda.qkv_q8", Op::Qkv,
                               pick(KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8<Q8Source::Groups>),
                                    KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8<Q8Source::Quantize>),
                                    KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8<Q8Source::Scratch>)),
                               kMatvecQ8Geometry, kOneToken, {"qkv_matvec_q8"});
            takes(one, formats);
            one.dims.k_multiple_of = &exact_k_multiple;
            one.priority = 4;
            set_q8_source(one, source, false);
            rows.push_back(one);
            Row few = make_row("cuda.qkv_q8_tokens", Op::Qkv,
                               pick(KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8_tokens<Q8Source::Groups>),
                                    KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8_tokens<Q8Source::Quantize>),
                                    KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8_tokens<Q8Source::Scratch>)),
                               kMatvecQ8Geometry, kFewTokens, {"matvec_q8", "matvec_q8", "matvec_q8"});
            takes(few, formats);
            few.dims.k_multiple_of = &exact_k_multiple;
            few.priority = 3;
            set_q8_source(few, source, false);
            rows.push_back(few);
            if (source == Q8Source::Groups) continue;
            Row batch = make_row("cuda.qkv_q8_mma", Op::Qkv,
                                 source == Q8Source::Quantize ? KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8_mma<Q8Source::Quantize>)
                                                              : KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8_mma<Q8Source::Scratch>),
                                 kMmaGeometry, kTileTokens, {"mma_q8_tiles", "(mma_q8_tiles)", "(mma_q8_tiles)"});
            takes(batch, formats);
            batch.dims.k_multiple_of = &exact_k_multiple;
            batch.priority = 3;
            set_q8_source(batch, source, true);
            rows.push_back(batch);
        }
    }
    {  // bf16 from kGemmMinTokens (the exact qkv rows below)
        Row row = make_row("cuda.qkv_bf16", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv_bf16), {kGemmThreads, 0, 0},
                           {kGemmMinTokens, 0},
                           {"bf16_convert", "bf16_dequantize", "cublas_gemm", "bf16_dequantize", "cublas_gemm",
                            "bf16_dequantize", "cublas_gemm"});
        takes(row, all);
        row.dims.k_multiple_of = &run_k_multiple;
        row.input_encoding = Encoding::BF16;
        row.priority = 5;
        rows.push_back(row);
    }
}

void add_cuda_norm_rows(std::vector<Row>& rows) {
    rows.push_back(
        gpu_family_row(GpuFamily::Norm, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_norm), {kNormThreads, 1, 0}));
    // Fused: [post-norm of the branch] + residual add + the next norm, one group per token; the
    // _q8 form also writes the normed row's q8_1 for the q8_1 matmuls after it (kQ8Output),
    // whole 32-value runs.
    Row fused = gpu_family_row(GpuFamily::AddNorm, Backend::CUDA, Format::F32,
                               KCAP_CUDA_ENTRY(kcap_cuda_add_norm<false>), {kNormThreads, 1, 0});
    rows.push_back(fused);
    fused.kernel = "cuda.add_norm_q8";
    fused.fn = KCAP_CUDA_ENTRY(kcap_cuda_add_norm<true>);
    fused.launches = {"add_norm_q8"};
    fused.features |= kQ8Output;
    fused.requires_all = kQ8Output;
    fused.dims.k_multiple = 32;
    rows.push_back(fused);
}

void add_cuda_rope_rows(std::vector<Row>& rows) {
    rows.push_back(gpu_family_row(GpuFamily::Rope, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_rope),
                                  {kElementwiseThreads, 0, 0}));
    // Fused QK-norm + rope: one simd group normalizes a head row and rotates it.
    Row fused = make_row("cuda.qk_norm_rope", Op::QkNormRope, KCAP_CUDA_ENTRY(kcap_cuda_qk_norm_rope),
                         {kQkNormRopeSimds * 32, kQkNormRopeSimds, 0}, kAnyTokens, {"qk_norm_rope"});
    fused.operand_formats = {{Format::F32}, {Format::F32}, {Format::F32}};  // q_norm, k_norm, rope factors
    fused.features = kRmsNorm | kRopeNormal | kRopeNeox | kPartialRotary | kRopeFreqFactors;
    rows.push_back(fused);
}

namespace {

int attention_mma_shared_bytes(const Stage& stage) { return attn_mma_shared_bytes(stage.params.head_dim); }

// cuda.attention_mla_tiled's legal dims: the latent attention family's, and cache rows of whole
// float4s (the tiled attend stages and reads them 4 values at a time).
std::string mla_tiled_rejection(const Stage& stage) {
    std::string why = mla_rejection(stage);
    if (why.empty() && stage.params.rope_dim % 4)
        why = "the rope part " + std::to_string(stage.params.rope_dim) +
              " is not a multiple of 4 (the tiled attend reads cache rows 4 values at a time)";
    return why;
}
int mla_tiled_stage_shared_bytes(const Stage& stage) {
    return mla_tiled_shared_bytes(stage.params.kv_lora_rank + stage.params.rope_dim);
}

template <AttnKind KIND, AttnRope ROPE, bool Q8>
KernelFn attention_launcher() {
    return KCAP_CUDA_ENTRY(kcap_cuda_attention<KIND, ROPE, Q8>);
}

}  // namespace

void add_cuda_attention_rows(std::vector<Row>& rows) {
    // cuda.attention_decode (one token: flash-decoding over key splits, which also appends the
    // token's K/V, then the combine where the stage's longest span takes more than one split;
    // the body by the stage's head dims and count, cuda_rows::attn_decode_tiles),
    // cuda.attention_prefill (the chunk's K/V appended, then every token attends: tiled SIMT) and
    // cuda.attention_mma (the same on the tensor cores: f16 mma.sync, queries and weights split
    // hi + lo, exact products, the tensor cores' truncating f32 sums bound in test_cuda_rows;
    // preferred where the cache is f16, the head dims have a body and the device has the
    // threadgroup memory). A shared-KV layer reads its source layer's cache and appends nothing.
    //
    // The rope-owning forms take the stages the planner folded a rope (or QK-norm + rope) into:
    // the decode rotates the query heads and the new K itself, a prefill chunk launches the rope
    // (qk_norm_rope) kernel first. Whole rotary dims only; NeoX pairs halves across lanes, so
    // power-of-two head dims; no shared-KV layer (it keeps its rope stage). Operands: q_norm,
    // k_norm, rope frequency factors. The _q8 forms also write the output's q8_1 for the output
    // projection (kQ8Output): the decode from its registers, a prefill chunk by a launch.
    struct Kind {
        AttnKind kind;
        Row base;  // the shared family row (decode, prefill); the tensor-core prefill is CUDA's own
    };
    const Geometry prefill_geometry = {kAttnMaxSimds * 32, 0, kAttnPrefillSharedBytes};  // prefill's, the most
    const Row decode = gpu_family_row(GpuFamily::AttentionDecode, Backend::CUDA, Format::F32, nullptr, prefill_geometry);
    const Row prefill = gpu_family_row(GpuFamily::AttentionPrefill, Backend::CUDA, Format::F32, nullptr, prefill_geometry);
    Row mma = prefill;
    mma.kernel = "cuda.attention_mma";
    mma.launches = {"(kv_append)", "attention_mma"};
    mma.geometry = {kAttnMmaWarps * 32, kAttnMmaRows, attn_mma_shared_bytes(256)};
    mma.kv_formats = {Format::F16};
    mma.dims.head_dims.assign(std::begin(kAttnMmaHeadDims), std::end(kAttnMmaHeadDims));
    mma.dims.shared_bytes_of = &attention_mma_shared_bytes;
    mma.priority = 1;
    const Kind kinds[] = {{AttnKind::Decode, decode}, {AttnKind::Prefill, prefill}, {AttnKind::PrefillMma, mma}};
    const FeatureMask base_features = decode.features;
    for (const Kind& k : kinds)
        for (const AttnRope rope : {AttnRope::None, AttnRope::Rope, AttnRope::QkNormRope})
            for (const bool q8 : {false, true}) {
                // One decode kernel serves both rope forms (its QK-norm is a flag of the stage).
                if (k.kind == AttnKind::Decode && rope == AttnRope::QkNormRope) continue;
                Row row = k.base;
                std::string& name = row.kernel;
                if (rope == AttnRope::Rope) name += "_rope";
                if (rope == AttnRope::QkNormRope) name += "_qk_norm_rope";
                if (q8) name += "_q8";
                std::vector<std::string>& launches = row.launches;
                if (rope != AttnRope::None && k.kind != AttnKind::Decode)
                    launches.insert(launches.begin(), rope == AttnRope::QkNormRope ? "qk_norm_rope" : "rope");
                if (q8 && k.kind != AttnKind::Decode) launches.push_back("q8_quantize_rows");
                KernelFn& fn = row.fn;
#define KCAP_PICK_ATTENTION(KIND, ROPE)                                                                   \
    if (k.kind == AttnKind::KIND && rope == AttnRope::ROPE)                                               \
        fn = q8 ? attention_launcher<AttnKind::KIND, AttnRope::ROPE, true>()                              \
                : attention_launcher<AttnKind::KIND, AttnRope::ROPE, false>();
                KCAP_PICK_ATTENTION(Decode, None)
                KCAP_PICK_ATTENTION(Decode, Rope)
                KCAP_PICK_ATTENTION(Prefill, None)
                KCAP_PICK_ATTENTION(Prefill, Rope)
                KCAP_PICK_ATTENTION(Prefill, QkNormRope)
                KCAP_PICK_ATTENTION(PrefillMma, None)
                KCAP_PICK_ATTENTION(PrefillMma, Rope)
                KCAP_PICK_ATTENTION(PrefillMma, QkNormRope)
#undef KCAP_PICK_ATTENTION
                if (rope != AttnRope::None) {
                    // q_norm, k_norm, rope frequency factors; slot 3 stays the family's sinks.
                    for (int i = 0; i < 3; ++i) row.operand_formats[size_t(i)] = {Format::F32};
                    row.features = (base_features & ~FeatureMask(kKvShared)) | kRopeNormal | kRopeNeox | kRopeFreqFactors;
                    if (rope == AttnRope::QkNormRope || k.kind == AttnKind::Decode) row.features |= kRmsNorm;
                    if (rope == AttnRope::QkNormRope) row.requires_all = kRmsNorm;
                    row.requires_any = kRopeNormal | kRopeNeox;
                    row.dims.neox_head_dims = {8, 16, 32, 64, 128, 256};
                }
                if (q8) {
                    row.features |= kQ8Output;
                    row.requires_all |= kQ8Output;
                    row.dims.head_dim_v_multiple = 32;  // a q8_1 run never straddles two heads
                }
                rows.push_back(row);
            }

    // cuda.attention_mla_decode (one token) and cuda.attention_mla (a prefill chunk): multi-head
    // latent attention (SIMT, kernels/attention_mla.h): the new tokens' latent rows normed, rotated
    // and appended, the queries absorbed through W_k_b (or the combined W_kv_b), each (token, group
    // of KCAP_MLA_HEADS_PER_GROUP heads) attending over its causal span of cache rows (the decode
    // in key splits fixed at load time, a prefill chunk in one), the splits merged, then W_v_b.
    // Operands: the latent's norm weight (F32), W_k_b and W_v_b in any weight format, the rope
    // frequency factors (folded into the rope table).
    // The families (dispatch/gpu_rows.h) declare the operands, features and legal dims.
    const Geometry mla_geometry = {KCAP_MLA_THREADS, 0, KCAP_MLA_ATTEND_SHARED_FLOATS * 4};
    rows.push_back(gpu_family_row(GpuFamily::AttentionMlaDecode, Backend::CUDA, Format::F32,
                                  KCAP_CUDA_ENTRY(kcap_cuda_attention_mla<true>), mla_geometry));
    rows.push_back(gpu_family_row(GpuFamily::AttentionMla, Backend::CUDA, Format::F32,
                                  KCAP_CUDA_ENTRY(kcap_cuda_attention_mla<false>), mla_geometry));
    // cuda.attention_mla_tiled (a prefill chunk; preferred where the device has its threadgroup
    // memory): the absorb and V up in tiles of KCAP_MLA_TOKENS tokens of a head (each decoded
    // weight run used for all of them), and the tiled attend: 32 query rows (tokens x heads) share
    // every staged cache row, the latents come out normalized (no combine). Same f32 arithmetic
    // as the rows above, summed in another order.
    Row tiled = gpu_family_row(GpuFamily::AttentionMla, Backend::CUDA, Format::F32,
                               KCAP_CUDA_ENTRY(kcap_cuda_attention_mla_tiled),
                               {KCAP_MLA_THREADS, KCAP_MLA_TILE_ROWS, mla_tiled_shared_bytes(KCAP_MLA_MAX_WIDTH)});
    tiled.kernel = "cuda.attention_mla_tiled";
    tiled.launches = {"mla_append_absorb_tokens", "mla_attend_tiled", "mla_v_up_tokens"};
    tiled.dims.reject_of = &mla_tiled_rejection;
    tiled.dims.shared_bytes_of = &mla_tiled_stage_shared_bytes;
    tiled.priority = 1;
    rows.push_back(tiled);
}

void add_cuda_activation_rows(std::vector<Row>& rows) {
    rows.push_back(gpu_family_row(GpuFamily::FfnActivation, Backend::CUDA, Format::F32,
                                  KCAP_CUDA_ENTRY(kcap_cuda_ffn_activation), {kElementwiseThreads, 0, 0}));
}

void add_cuda_elementwise_rows(std::vector<Row>& rows) {
    const Geometry geometry = {kElementwiseThreads, 0, 0};
    rows.push_back(gpu_family_row(GpuFamily::Add, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_add), geometry));
    rows.push_back(
        gpu_family_row(GpuFamily::Softcap, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_softcap), geometry));
    rows.push_back(gpu_family_row(GpuFamily::Scale, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_scale), geometry));
}

void add_cuda_ple_rows(std::vector<Row>& rows) {
    // One row per projection format (its K multiple is the projection's); the table may be any
    // weight format (the combine is instantiated for each), the norm weight F32.
#define KCAP_PLE_ROW(NAME, DECODER)                                                                    \
    rows.push_back(gpu_family_row(GpuFamily::PerLayerEmbed, Backend::CUDA, Format::NAME,               \
                                  KCAP_CUDA_ENTRY(kcap_cuda_per_layer_embed<Format::NAME>), kTokensGeometry));
    KCAP_WEIGHT_FORMATS(KCAP_PLE_ROW)
#undef KCAP_PLE_ROW
    rows.push_back(gpu_family_row(GpuFamily::PerLayerGate, Backend::CUDA, Format::F32,
                                  KCAP_CUDA_ENTRY(kcap_cuda_per_layer_gate), {kElementwiseThreads, 0, 0}));
}

void add_cuda_moe_rows(std::vector<Row>& rows) {
    // The router (its logits over groups of experts and tokens, then one simd group per token);
    // the chosen experts of every (token, expert) slot with the decode matvec's teams, one grid
    // row per slot; from kMoeGroupedMinTokens, grouped by expert on the split-bf16 tiles
    // (cuda/moe.cu) where gate, up and down all have tiles; with q8_1 activations the slot
    // matvecs' and the grouped tiles' int8 forms where gate, up and down all have integer
    // products, with bf16 activations the grouped tiles on bf16(W) . bf16(x); the shared
    // expert's gate.
    // The router's bias (operand 2, F32: gpt-oss) is added to its logits.
    Row route = gpu_family_row(GpuFamily::MoeRoute, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_moe_route),
                               {kMoeRouteThreads, 0, 0});
    // Also the sigmoid router with its choice bias (operand 3) and group-limited routing of up to
    // KCAP_MOE_MAX_GROUPS groups (DeepSeek V2/V3).
    add_moe_route_variants(route);
    rows.push_back(route);
    // From kMoeRouteTiledMinTokens tokens the logits as a tiled matmul (kcap_moe_logits_tiled),
    // then the same top-k.
    Row tiled = route;
    tiled.kernel = "cuda.moe_route_tiled";
    tiled.fn = KCAP_CUDA_ENTRY(kcap_cuda_moe_route_tiled);
    tiled.tokens = {kMoeRouteTiledMinTokens, 0};
    tiled.priority = route.priority + 1;
    tiled.launches = {"moe_logits_tiled", "moe_route"};
    tiled.geometry = {KCAP_MOE_TILE_THREADS, KCAP_MOE_TILE, KCAP_MOE_TILE_SHARED_FLOATS * 4};
    rows.push_back(tiled);
    // Below it on sm_90, the logits and the top-k in one launch of thread-block clusters (the
    // same bodies; the groups' threads follow the expert count: moe_route_cluster_simds).
    Row cluster = route;
    cluster.kernel = "cuda.moe_route_cluster";
    cluster.fn = KCAP_CUDA_ENTRY(kcap_cuda_moe_route_cluster);
    cluster.tokens = {1, kMoeRouteTiledMinTokens - 1};
    cluster.priority = route.priority + 1;
    cluster.launches = {"moe_route_cluster"};
    cluster.geometry = {kMoeLogitThreads, 0, 0};
    cluster.dims.max_experts = kMoeRouteClusterMaxExperts;
    cluster.dims.min_sm_version = 90;
    rows.push_back(cluster);
    // A router with the add_norm before it fused in (kAddNormInput: operand 4 the norm's weight;
    // the planner's fuse_add_norm_route). One token on sm_90: every group of the cluster adds the
    // branch to the residual and norms the row itself, straight into the threadgroup memory its
    // logits read (the whole row: K up to kMoeRouteNormMaxK), and one group writes the residual
    // and the normed row back after the cluster's barrier: the add_norm's launch saved. Every
    // other token count (and one token without it): each router row's twin, the add_norm's
    // kernel and then its launches.
    const auto with_add_norm = [&](Row row, KernelFn fn) {
        row.kernel += "_add_norm";
        row.fn = fn;
        row.launches.insert(row.launches.begin(), "add_norm");
        return row;
    };
    Row fused = cluster;
    fused.kernel = "cuda.moe_route_cluster_norm";
    fused.fn = KCAP_CUDA_ENTRY(kcap_cuda_moe_route_cluster_norm);
    fused.tokens = {1, 1};
    fused.priority = cluster.priority + 1;
    fused.launches = {"moe_route_cluster_norm"};
    fused.dims.k_max = kMoeRouteNormMaxK;
    for (Row row : {with_add_norm(route, KCAP_CUDA_ENTRY(kcap_cuda_moe_route_add_norm)),
                    with_add_norm(tiled, KCAP_CUDA_ENTRY(kcap_cuda_moe_route_tiled_add_norm)),
                    with_add_norm(cluster, KCAP_CUDA_ENTRY(kcap_cuda_moe_route_cluster_add_norm)), fused}) {
        row.operand_formats.push_back({Format::F32});  // 4: the norm's weight
        row.features |= kAddNormInput;
        row.requires_all |= kAddNormInput;
        rows.push_back(row);
    }
    // Both experts' rows also take the experts' biases (operands 3-5, F32) and gpt-oss's clamped
    // SwiGLU.
#define KCAP_MOE_EXPERTS_ROW(NAME, DECODER)                                                              \
    {                                                                                                    \
        const Format f = Format::NAME;                                                                   \
        Row experts = gpu_family_row(GpuFamily::MoeExperts, Backend::CUDA, f,                            \
                                     KCAP_CUDA_ENTRY(kcap_cuda_moe_experts<f>), kMatvecGeometry);        \
        add_moe_expert_biases(experts);                                                                  \
        rows.push_back(experts);                                                                         \
        if (q8_format(f)) {                                                                              \
            Row q8 = experts;                                                                            \
            q8.kernel = "cuda.moe_experts_q8." + lower(f);                                               \
            q8.fn = KCAP_CUDA_ENTRY(kcap_cuda_moe_experts_q8<f>);                                        \
            q8.input_encoding = Encoding::Q8_1;                                                          \
            q8.operand_formats[2] = q8_formats();                                                        \
            q8.priority = 1;                                                                             \
            q8.geometry = {kMatvecQ8Simds * 32, kMatvecQ8Simds * kMoeQ8GateUpRows, kMatvecQ8SharedBytes};\
            rows.push_back(q8);                                                                          \
            /* The same slot matvecs where gate/up takes more than a wave: each slot's down groups */   \
            /* start once that slot's gate/up groups are done (moe_slot_starts_min_tokens). */          \
            Row slot_starts = q8;                                                                        \
            slot_starts.kernel = "cuda.moe_experts_q8_slot_starts." + lower(f);                          \
            slot_starts.fn = KCAP_CUDA_ENTRY(kcap_cuda_moe_experts_q8_slot_starts<f>);                   \
            slot_starts.tokens = {1, kMoeGroupedMinTokens - 1};                                          \
            slot_starts.tokens_min_of = &moe_slot_starts_tokens;                                         \
            slot_starts.priority = 2;                                                                    \
            slot_starts.launches = {"moe_gate_up_count", "moe_down_slot_wait", "moe_combine"};           \
            rows.push_back(slot_starts);                                                                 \
            Row q8_grouped = gpu_family_row(GpuFamily::MoeExperts, Backend::CUDA, f,                     \
                                            KCAP_CUDA_ENTRY(kcap_cuda_moe_experts_q8_mma<f>), kMmaGeometry); \
            q8_grouped.kernel = "cuda.moe_experts_q8_mma." + lower(f);                                   \
            q8_grouped.tokens = {kMoeGroupedMinTokens, 0};                                               \
            q8_grouped.priority = 3;                                                                     \
            q8_grouped.input_encoding = Encoding::Q8_1;                                                  \
            q8_grouped.launches = {"moe_sort", "q8_quantize", "mma_q8_tiles", "moe_activation_q8",       \
                                   "mma_q8_tiles", "moe_combine"};                                       \
            q8_grouped.operand_formats[2] = q8_formats();                                                \
            add_moe_expert_biases(q8_grouped);                                                           \
            q8_grouped.dims.max_experts = KCAP_MOE_MAX_EXPERTS; /* the sort's per-expert counts */       \
            rows.push_back(q8_grouped);                                                                  \
        }                                                                                                \
        if (mma_format(f)) {                                                                             \
            Row grouped = gpu_family_row(GpuFamily::MoeExperts, Backend::CUDA, f,                        \
                                         KCAP_CUDA_ENTRY(kcap_cuda_moe_experts_mma<f>), kMmaGeometry);   \
            grouped.kernel = "cuda.moe_experts_mma." + lower(f);                                         \
            grouped.tokens = {kMoeGroupedMinTokens, 0};                                                  \
            grouped.priority = 2;                                                                        \
            grouped.launches = {"moe_sort",       "split_bf16", "mma_tiles", "moe_activation_split",       \
                                "mma_tiles",      "moe_combine"};                                        \
            grouped.operand_formats[2] = mma_formats();                                                  \
            add_moe_expert_biases(grouped);                                                              \
            grouped.dims.max_experts = KCAP_MOE_MAX_EXPERTS; /* the sort's per-expert counts */          \
            rows.push_back(grouped);                                                                     \
            /* bf16 plans: the same order on tiles of bf16(W) . bf16(x) (cuda/matmul_gemm.cu). */        \
            Row bf16 = grouped;                                                                          \
            bf16.kernel = "cuda.moe_experts_bf16_mma." + lower(f);                                       \
            bf16.fn = KCAP_CUDA_ENTRY(kcap_cuda_moe_experts_bf16_mma<f>);                                \
            bf16.priority = 4;                                                                           \
            bf16.input_encoding = Encoding::BF16;                                                        \
            bf16.launches = {"moe_sort",   "convert_bf16", "bf16_tiles", "moe_activation_bf16",          \
                             "bf16_tiles", "moe_combine"};                                               \
            rows.push_back(bf16);                                                                        \
        }                                                                                                \
    }
    KCAP_WEIGHT_FORMATS(KCAP_MOE_EXPERTS_ROW)
#undef KCAP_MOE_EXPERTS_ROW
    rows.push_back(gpu_family_row(GpuFamily::MoeSharedGate, Backend::CUDA, Format::F32,
                                  KCAP_CUDA_ENTRY(kcap_cuda_moe_shared_gate), {kElementwiseThreads, 0, 0}));
}

void add_cuda_argmax_rows(std::vector<Row>& rows) {
    rows.push_back(
        gpu_family_row(GpuFamily::Argmax, Backend::CUDA, Format::F32, KCAP_CUDA_ENTRY(kcap_cuda_argmax), {kArgmaxThreads, 0, 0}));
    // Top-k sampling (k <= KCAP_SAMPLE_MAX_TOP_K): the second pass holds every first-pass
    // group's candidates at once, which bounds the vocabulary (K = N = the vocabulary).
    Row sample = make_row("cuda.sample", Op::Sample, KCAP_CUDA_ENTRY(kcap_cuda_sample), {KCAP_SAMPLE_THREADS, 0, 0},
                          kOneToken, {"sample_partial", "sample_final"});
    sample.dims.k_max = int64_t(KCAP_SAMPLE_MAX_PARTIALS) * KCAP_SAMPLE_CHUNK;
    rows.push_back(sample);
}

}  // namespace kcap
