// The CUDA rows of the capability table (declarations in cuda/rows.h). Compiled in every
// build: where CUDA is not compiled in (KCAP_WITH_CUDA undefined) each row's fn is null, so
// plans and `kcap explain --backend cuda` still work and an Engine on cuda is refused.
#include "cuda/rows.h"

#include <iterator>

#include "dispatch/gpu_rows.h"
#include "kernels/params.h"

namespace kcap {

#if defined(KCAP_WITH_CUDA)
#define KCAP_CUDA_ENTRY(launcher) (&launcher)
#else
#define KCAP_CUDA_ENTRY(launcher) nullptr
#endif

namespace {

Row make_row(const std::string& kernel, Op op, KernelFn fn, Geometry geometry) {
    return gpu_row(Backend::CUDA, kernel, op, fn, geometry);
}

}  // namespace

void add_cuda_embed_rows(std::vector<Row>& rows) {
#define KCAP_EMBED_ROW(NAME, DECODER)                                                                           \
    {                                                                                                           \
        Row row = make_row("cuda.embed." + lowercase(#NAME), Op::Embed, KCAP_CUDA_ENTRY(kcap_cuda_embed_##NAME),     \
                           {cuda_rows::kEmbedThreads, 1, 0});                                                   \
        row.operand_formats = {{Format::NAME}, {Format::F32, Format::F16}}; /* table, positions */               \
        row.features = kEmbedScale | kPositionEmbedding;                                                        \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                         \
        rows.push_back(row);                                                                                    \
    }
    KCAP_WEIGHT_FORMATS(KCAP_EMBED_ROW)
#undef KCAP_EMBED_ROW
}

void add_cuda_matmul_rows(std::vector<Row>& rows) {
    // Exact rows: f32 activations and accumulation for any number of tokens.
#define KCAP_MATMUL_ROW(NAME, DECODER)                                                                          \
    {                                                                                                           \
        Row row = make_row("cuda.matmul." + lowercase(#NAME), Op::MatMul, KCAP_CUDA_ENTRY(kcap_cuda_matmul_##NAME),  \
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,         \
                            cuda_rows::kMatvecSharedBytes});                                              \
        row.operand_formats = {{Format::NAME}, {Format::F32}};                                                  \
        row.features = kBias;                                                                                   \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                         \
        rows.push_back(row);                                                                                    \
    }
    KCAP_WEIGHT_FORMATS(KCAP_MATMUL_ROW)
#undef KCAP_MATMUL_ROW
    // Tensor-core rows (preferred): the same matvec for one token and the few-token walk
    // below kMmaMinTokens; prefill tiles on bf16 mma.sync with scale-factored weights and
    // split (hi + lo) activations, f32 sums: within 2^-16 of exact per product. Quantized
    // formats and BF16 only (cuda_rows::mma_format); F32 and F16 prefill on the exact rows.
#define KCAP_MATMUL_MMA_ROW(NAME, DECODER)                                                                  \
    if (cuda_rows::mma_format(Format::NAME)) {                                                              \
        Row row = make_row("cuda.matmul_mma." + lowercase(#NAME), Op::MatMul,                                   \
                           KCAP_CUDA_ENTRY(kcap_cuda_matmul_mma_##NAME),                                    \
                           {cuda_rows::kMmaThreads, cuda_rows::kMmaRows, 0});                               \
        row.operand_formats = {{Format::NAME}, {Format::F32}};                                              \
        row.features = kBias;                                                                               \
        row.dims.k_multiple = run_k_multiple(Format::NAME);                                                 \
        row.priority = 1;                                                                                   \
        rows.push_back(row);                                                                                \
    }
    KCAP_WEIGHT_FORMATS(KCAP_MATMUL_MMA_ROW)
#undef KCAP_MATMUL_MMA_ROW
    // Fused gated FFN input (gate and up of one format): one token, both matrices against one
    // staged x with the activation applied to the sums; a batch, the format's tensor-core row
    // for each matrix, then the activation.
#define KCAP_GATE_UP_ROW(NAME, DECODER)                                                                     \
    {                                                                                                       \
        Row row = make_row("cuda.gate_up." + lowercase(#NAME), Op::GateUp, KCAP_CUDA_ENTRY(kcap_cuda_gate_up_##NAME), \
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,     \
                            cuda_rows::kMatvecSharedBytes});                                                \
        row.operand_formats = {{Format::NAME}, {Format::NAME}};                                             \
        row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;                                       \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                     \
        rows.push_back(row);                                                                                \
    }
    KCAP_WEIGHT_FORMATS(KCAP_GATE_UP_ROW)
#undef KCAP_GATE_UP_ROW
    // q8_1 activations (opt-in: allowed only where the plan's activations are q8_1; preferred
    // there): x rounded to int8 per 32-element run, integer products (dp4a for few tokens, int8
    // mma.sync tiles for a batch), f32 scales. W . q8_1(x) to the exact rows' 1e-5 (test_cuda_rows).
#define KCAP_MATMUL_Q8_ROW(NAME, DECODER)                                                                     \
    {                                                                                                         \
        Row row = make_row("cuda.matmul_q8." + lowercase(#NAME), Op::MatMul,                                  \
                           KCAP_CUDA_ENTRY(kcap_cuda_matmul_q8_##NAME),                                       \
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,   \
                            cuda_rows::kMatvecQ8SharedBytes});                                                \
        row.operand_formats = {{Format::NAME}, {Format::F32}};                                                \
        row.features = kBias;                                                                                 \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                 \
        row.input_encoding = Encoding::Q8_1;                                                                  \
        row.priority = 2;                                                                                     \
        rows.push_back(row);                                                                                  \
    }                                                                                                         \
    {                                                                                                         \
        Row row = make_row("cuda.gate_up_q8." + lowercase(#NAME), Op::GateUp,                                 \
                           KCAP_CUDA_ENTRY(kcap_cuda_gate_up_q8_##NAME),                                      \
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,   \
                            cuda_rows::kMatvecQ8SharedBytes});                                                \
        row.operand_formats = {{Format::NAME}, {Format::NAME}};                                               \
        row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;                                         \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                 \
        row.input_encoding = Encoding::Q8_1;                                                                  \
        row.priority = 1;                                                                                     \
        rows.push_back(row);                                                                                  \
    }
    KCAP_Q8_WEIGHT_FORMATS(KCAP_MATMUL_Q8_ROW)
#undef KCAP_MATMUL_Q8_ROW
    // bf16 activations (opt-in: allowed only where the plan's activations are bf16; preferred
    // there): a batch of kGemmMinTokens or more dequantizes each weight matrix to bf16 and runs
    // cuBLAS's bf16 GEMM on bf16(x) with f32 sums (cuda/matmul_gemm.cu); fewer tokens run the
    // format's exact kernels (the tensor-core row's launcher, which forwards to the exact matvec,
    // walk or split-bf16 tiles). bf16(W) . bf16(x) to the f32 sums' bound (test_cuda_rows).
    // Whole 32-value runs of every weight format (the dequantize writes runs).
#define KCAP_MATMUL_BF16_ROW(NAME, DECODER)                                                                   \
    {                                                                                                         \
        Row row = make_row("cuda.matmul_bf16." + lowercase(#NAME), Op::MatMul,                                \
                           KCAP_CUDA_ENTRY(kcap_cuda_matmul_bf16_##NAME),                                     \
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,   \
                            cuda_rows::kMatvecSharedBytes});                                                  \
        row.operand_formats = {{Format::NAME}, {Format::F32}};                                                \
        row.features = kBias;                                                                                 \
        row.dims.k_multiple = run_k_multiple(Format::NAME);                                                   \
        row.input_encoding = Encoding::BF16;                                                                  \
        row.priority = 2;                                                                                     \
        rows.push_back(row);                                                                                  \
    }                                                                                                         \
    {                                                                                                         \
        Row row = make_row("cuda.gate_up_bf16." + lowercase(#NAME), Op::GateUp,                               \
                           KCAP_CUDA_ENTRY(kcap_cuda_gate_up_bf16_##NAME),                                    \
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,   \
                            cuda_rows::kMatvecSharedBytes});                                                  \
        row.operand_formats = {{Format::NAME}, {Format::NAME}};                                               \
        row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;                                         \
        row.dims.k_multiple = run_k_multiple(Format::NAME);                                                   \
        row.input_encoding = Encoding::BF16;                                                                  \
        row.priority = 1;                                                                                     \
        rows.push_back(row);                                                                                  \
    }
    KCAP_WEIGHT_FORMATS(KCAP_MATMUL_BF16_ROW)
#undef KCAP_MATMUL_BF16_ROW
    // Fused Q, K and V matmuls of one input (no biases), each weight in any format: one token
    // runs one launch whose groups take the three matrices' rows; a batch, the tensor-core
    // tiles of the matrices of one format in one launch (else each matrix's exact row). K must
    // suit every operand's format.
    {
        Row row = make_row("cuda.qkv", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv),
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,
                            cuda_rows::kMatvecSharedBytes});
        const std::vector<Format> formats = gpu_weight_formats();
        row.operand_formats = {formats, formats, formats};
        row.dims.k_multiple_of = &exact_k_multiple;
        rows.push_back(row);
    }
    {  // the same on q8_1 activations (opt-in, preferred there): every weight in a q8_1 format
        Row row = make_row("cuda.qkv_q8", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv_q8),
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,
                            cuda_rows::kMatvecQ8SharedBytes});
        std::vector<Format> formats;
#define KCAP_Q8_FORMAT(NAME, DECODER) formats.push_back(Format::NAME);
        KCAP_Q8_WEIGHT_FORMATS(KCAP_Q8_FORMAT)
#undef KCAP_Q8_FORMAT
        row.operand_formats = {formats, formats, formats};
        row.dims.k_multiple_of = &exact_k_multiple;
        row.input_encoding = Encoding::Q8_1;
        row.priority = 1;
        rows.push_back(row);
    }
    {  // the same on bf16 activations (opt-in, preferred there): cuda.qkv below kGemmMinTokens
        Row row = make_row("cuda.qkv_bf16", Op::Qkv, KCAP_CUDA_ENTRY(kcap_cuda_qkv_bf16),
                           {cuda_rows::kMatvecSimds * 32, cuda_rows::kMatvecSimds * cuda_rows::kMatvecRows,
                            cuda_rows::kMatvecSharedBytes});
        const std::vector<Format> formats = gpu_weight_formats();
        row.operand_formats = {formats, formats, formats};
        row.dims.k_multiple_of = &run_k_multiple;
        row.input_encoding = Encoding::BF16;
        row.priority = 1;
        rows.push_back(row);
    }
}

void add_cuda_norm_rows(std::vector<Row>& rows) {
    Row row = make_row("cuda.norm", Op::Norm, KCAP_CUDA_ENTRY(kcap_cuda_norm), {cuda_rows::kNormThreads, 1, 0});
    row.operand_formats = {{Format::F32}, {Format::F32}};
    row.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm;
    rows.push_back(row);
    // Fused: [post-norm of the branch] + residual add + the next norm, one group per token.
    Row fused = make_row("cuda.add_norm", Op::AddNorm, KCAP_CUDA_ENTRY(kcap_cuda_add_norm),
                         {cuda_rows::kNormThreads, 1, 0});
    fused.operand_formats = {{Format::F32}, {Format::F32}, {Format::F32}, {Format::F32}};
    fused.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm | kResidualScale | kPostNorm;
    rows.push_back(fused);
}

void add_cuda_rope_rows(std::vector<Row>& rows) {
    Row row = make_row("cuda.rope", Op::Rope, KCAP_CUDA_ENTRY(kcap_cuda_rope), {cuda_rows::kElementwiseThreads, 0, 0});
    row.operand_formats = {{Format::F32}};
    row.features = kRopeNormal | kRopeNeox | kPartialRotary | kRopeFreqFactors;
    rows.push_back(row);
    // Fused QK-norm + rope: one simd group normalizes a head row and rotates it.
    Row fused = make_row("cuda.qk_norm_rope", Op::QkNormRope, KCAP_CUDA_ENTRY(kcap_cuda_qk_norm_rope),
                         {cuda_rows::kQkNormRopeSimds * 32, cuda_rows::kQkNormRopeSimds, 0});
    fused.operand_formats = {{Format::F32}, {Format::F32}, {Format::F32}};  // q_norm, k_norm, rope factors
    fused.features = kRmsNorm | kRopeNormal | kRopeNeox | kPartialRotary | kRopeFreqFactors;
    rows.push_back(fused);
}

void add_cuda_attention_rows(std::vector<Row>& rows) {
    Row row = make_row("cuda.attention", Op::Attention, KCAP_CUDA_ENTRY(kcap_cuda_attention),
                       {cuda_rows::kAttnMaxSimds * 32, 0, cuda_rows::kAttnPrefillSharedBytes});  // prefill's, the most
    row.kv_formats = {Format::F32, Format::F16};
    row.features = kSlidingWindow | kAttnSoftcap | kGqa | kKvShared;
    row.dims.k_multiple = 4;     // head_dim: K rows are read 4 elements at a time
    row.dims.max_head_dim = 256;  // per-lane value registers (KCAP_ATTN_MAX_HEAD_DIM)
    row.dims.max_span = 0;        // split-K decode: any span up to the context
    rows.push_back(row);
    // Preferred where the cache is f16 and the head dims have a tensor-core body: prefill on
    // the tensor cores (f16 mma.sync, queries and weights split hi + lo, exact products: the
    // SIMT rows' results up to the f32 sums, which the tensor cores truncate; bound in
    // test_cuda_rows). One token (decode) runs cuda.attention's decode kernels.
    Row mma = make_row("cuda.attention_mma", Op::Attention, KCAP_CUDA_ENTRY(kcap_cuda_attention_mma),
                       {cuda_rows::kAttnMmaWarps * 32, cuda_rows::kAttnMmaRows, cuda_rows::attn_mma_shared_bytes(256)});
    mma.kv_formats = {Format::F16};
    mma.features = row.features;
    mma.dims = row.dims;
    mma.dims.head_dims.assign(std::begin(cuda_rows::kAttnMmaHeadDims), std::end(cuda_rows::kAttnMmaHeadDims));
    mma.priority = 1;
    rows.push_back(mma);
    // The same two with the rope (or QK-norm + rope) the planner folds into the stage before
    // them: the decode rotates the query heads and the new K itself, one launch fewer per
    // layer; a prefill chunk runs the rope (qk_norm_rope) row's kernel in place first. Whole
    // rotary dims only (no kPartialRotary); NeoX pairs halves across lanes, so power-of-two
    // head dims. Operands: q_norm, k_norm, rope frequency factors. Only stages that own a
    // rope fit them (requires_any); excluding cuda.attention_mma leaves its _rope twin.
    const uint32_t rope = kRopeNormal | kRopeNeox | kRopeFreqFactors | kRmsNorm;
    for (const Row* base : {&row, &mma}) {
        Row owned = *base;
        owned.kernel = base->kernel + "_rope";
        owned.operand_formats = {{Format::F32}, {Format::F32}, {Format::F32}};
        owned.features = (base->features & ~uint32_t(kKvShared)) | rope;  // a shared-KV layer keeps its rope stage
        owned.requires_any = kRopeNormal | kRopeNeox;
        owned.dims.neox_head_dims = {8, 16, 32, 64, 128, 256};
        rows.push_back(owned);
    }
}

void add_cuda_activation_rows(std::vector<Row>& rows) {
    Row row = make_row("cuda.ffn_activation", Op::FfnActivation, KCAP_CUDA_ENTRY(kcap_cuda_ffn_activation),
                       {cuda_rows::kElementwiseThreads, 0, 0});
    row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;
    rows.push_back(row);
}

void add_cuda_elementwise_rows(std::vector<Row>& rows) {
    Row add = make_row("cuda.add", Op::Add, KCAP_CUDA_ENTRY(kcap_cuda_add), {cuda_rows::kElementwiseThreads, 0, 0});
    add.features = kResidualScale;
    rows.push_back(add);
    rows.push_back(
        make_row("cuda.softcap", Op::Softcap, KCAP_CUDA_ENTRY(kcap_cuda_softcap), {cuda_rows::kElementwiseThreads, 0, 0}));
    Row scale = make_row("cuda.scale", Op::Scale, KCAP_CUDA_ENTRY(kcap_cuda_scale), {cuda_rows::kElementwiseThreads, 0, 0});
    scale.features = kLayerOutputScale;  // also scales the residual stream after a block
    rows.push_back(scale);
}

void add_cuda_ple_rows(std::vector<Row>& rows) {
    // One row per projection format (its K multiple is the projection's); the table may be
    // any weight format (the combine is instantiated for each), the norm weight F32.
#define KCAP_PLE_ROW(NAME, DECODER)                                                                           \
    {                                                                                                         \
        Row row = make_row("cuda.per_layer_embed." + lowercase(#NAME), Op::PerLayerEmbed,                         \
                           KCAP_CUDA_ENTRY(kcap_cuda_per_layer_embed_##NAME),                                 \
                           {cuda_rows::kTokensSimds * 32, cuda_rows::kTokensSimds * cuda_rows::kTokensRows, 0}); \
        row.operand_formats = {gpu_weight_formats(), {Format::NAME}, {Format::F32}};                              \
        row.features = kPerLayerEmbedding | kRmsNorm;                                                         \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                       \
        rows.push_back(row);                                                                                  \
    }
    KCAP_WEIGHT_FORMATS(KCAP_PLE_ROW)
#undef KCAP_PLE_ROW
    Row gate = make_row("cuda.per_layer_gate", Op::PerLayerGate, KCAP_CUDA_ENTRY(kcap_cuda_per_layer_gate),
                        {cuda_rows::kElementwiseThreads, 0, 0});
    gate.features = kPerLayerEmbedding | kSilu | kGeluTanh | kGeluErf | kRelu;
    rows.push_back(gate);
}

void add_cuda_argmax_rows(std::vector<Row>& rows) {
    rows.push_back(
        make_row("cuda.argmax", Op::Argmax, KCAP_CUDA_ENTRY(kcap_cuda_argmax), {cuda_rows::kArgmaxThreads, 0, 0}));
    // Top-k sampling (k <= KCAP_SAMPLE_MAX_TOP_K): the second pass holds every first-pass
    // group's candidates at once, which bounds the vocabulary (K = N = the vocabulary).
    Row sample = make_row("cuda.sample", Op::Sample, KCAP_CUDA_ENTRY(kcap_cuda_sample), {KCAP_SAMPLE_THREADS, 0, 0});
    sample.dims.k_max = int64_t(KCAP_SAMPLE_MAX_PARTIALS) * KCAP_SAMPLE_CHUNK;
    rows.push_back(sample);
}

}  // namespace kcap
