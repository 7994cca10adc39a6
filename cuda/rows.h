// The CUDA backend's capability rows, declared once.
//
// cuda/rows.cpp (plain C++, compiled in every build) declares the rows from the format lists of
// kernels/formats_list.h, so any machine can plan and explain for CUDA; the .cu entry files
// define the launchers declared at the end of this header, which the rows point at. Each
// launcher runs one fixed sequence of kernels (the row's `launches`) for the token counts its
// row takes: which row runs a call is the plan's choice, made at load time. The tuning
// constants (geometry) sit here too, and both the rows and the launchers read them, so a row's
// declared geometry is the geometry its launcher uses. Geometry that follows from a stage's
// dims or the device (a wide matrix's rows per team, the decode attention's splits, whether a
// tile stages its weights) is a fixed function of them, never of the call.
#pragma once

#include "dispatch/capability.h"
#include "kernels/formats_list.h"
#include "kernels/params.h"

#include <type_traits>

namespace kcap {

struct Stage;
struct KernelCall;

namespace cuda_rows {

// Matmul, exact (f32 activations): decode matvec (kernels/matvec.h) and the few-token walk.
constexpr int kMatvecSimds = 8;       // simd groups (warps) per group
// The q8_1 matvecs' groups (cuda.matvec_q8, cuda.gate_up_q8, cuda.qkv_q8, cuda.moe_experts_q8): 16,
// so each group's staging of x (rounded to q8_1, or copied) serves twice the rows. Measured on
// the H200 (tg128, bench/cuda_sweep.py, bench/results/cuda_h200_matvec_simds.txt), 8 / 16 simd
// groups for every matvec: q8_1 Qwen3-30B-A3B 12-layer slice 1,191 / 1,202, gpt-oss-20b 12L
// 824 / 834, Llama-3-8B 8L 1,221 / 1,235, SmolLM2-135M 1,438 / 1,454; with f32 activations the
// MoE slices and the 8B lost 2-5% at 16 (and at 4), so the exact matvecs keep 8.
constexpr int kMatvecQ8Simds = 16;
// Weight rows per team, and how many simd groups per multiprocessor the split aims at
// (matvec_split). Measured on the H200 (tg128, bench/cuda_sweep.py, KCAP_MATVEC_ROWS /
// KCAP_MATVEC_WARPS; one run): from 2 rows and the old "cover the multiprocessors" split,
// Llama-3-8B Q4_K_M 202 tok/s -> 1 row 214, 2 rows + 32 warps 209, 1 row + 32 warps 232;
// Gemma 3 270M layout 803 -> 840 / 825 / 850. One row needs 40 registers (two: 80), so twice
// the groups fit a multiprocessor, and the extra parts put more loads in flight (ncu: the
// 2-row matvec reached 22% achieved occupancy and 0.8-1.5 TB/s).
// The experts' matvecs (cuda.moe_experts) take the same: on DeepSeek-V2-Lite's layout (Nsight
// Compute, one decode step, 2026-12-02) 2 and 4 rows per team for the experts took 3453 and 3512
// us against 3363 with one, and 2 rows for every dense matvec 3407.
constexpr int kMatvecRows = 1;
constexpr int kMatvecTargetWarps = 32;
// Wide matrices (the LM heads: Gemma 3 270M's 262144 rows of 640 values) take 2 rows per team:
// with one, a group stages its x, reads 8 short rows and ends, and the launch is rounds of such
// groups (ncu: Gemma's Q8_0 LM head at 1.9 TB/s).
constexpr long long kMatvecWideN = 32768;
constexpr int kMatvecWideRows = 2;
// The rows per team of a matrix of n rows.
constexpr int matvec_rows_for(long long n) { return n >= kMatvecWideN ? kMatvecWideRows : kMatvecRows; }
constexpr int kMatvecChunkRuns = 128;  // runs of x staged in threadgroup memory at a time (4096 values)
// The group's simd groups form kMatvecSimds / split teams; a team's `split` parts share its
// rows' runs: the fewest parts that give about target_warps simd groups per multiprocessor,
// as long as each part keeps at least two runs per lane.
constexpr int matvec_split(long long n, int sm_count, int rows = kMatvecRows, long long k = 0,
                           int simds = kMatvecSimds) {
    const long long teams = (n + rows - 1) / rows;
    int split = 1;
    while (split < simds && teams * split < (long long)sm_count * kMatvecTargetWarps && k / 32 >= 64LL * split)
        split *= 2;
    return split;
}
// Lanes per team (kernels/matvec.h, KcapMatvecTeams) of a matvec whose rows have `units` units
// (a lane's work item: a 32-value run, or a unit of kernels/matvec_q8.h): a whole simd group, or
// for short rows the most lanes, down to min_lanes, that leave each lane at least
// kMatvecLaneUnits units, the rest of the simd group taking the next rows. With 32 lanes a row of
// 24 runs (the 768-wide down matrix of Qwen3-30B-A3B's experts) leaves a quarter of them idle
// and each busy lane one load; with 8, every lane has three. The exact experts' slot matvecs take
// teams down to 4 lanes; the dense matvecs and the q8_1 experts' take whole simd groups. Measured
// on the H200, tg128 of 12-layer slices and SmolLM2 135M, with the bodies' lanes a compile-time
// choice (bench/results/cuda_h200_matvec_bodies.txt), the experts' matvecs in teams down to 4
// lanes against whole simd groups: exact Qwen3-30B-A3B 1018 -> 1045 tok/s and DeepSeek-V2-Lite
// 872 -> 893 (their only short rows are the experts' down matrices), q8_1 Qwen3-30B-A3B 1110 ->
// 1100 and DeepSeek-V2-Lite 978 -> 978, gpt-oss-20b unchanged (no short rows). Teams for the
// dense matvecs too had cost SmolLM2 135M 2-4% and Gemma 3 270M up to 3%
// (bench/results/cuda_h200_matvec_teams.txt).
constexpr int kMatvecFewestLanes = 4;     // the fewest lanes per team the bodies take
constexpr int kMatvecMinLanes = 32;       // dense matvecs
constexpr int kMoeMatvecMinLanes = 4;     // the exact experts' slot matvecs (cuda.moe_experts)
constexpr int kMoeQ8MatvecMinLanes = 32;  // the q8_1 experts' slot matvecs (cuda.moe_experts_q8)
constexpr int kMatvecLaneUnits = 2;
static_assert(kMatvecMinLanes >= kMatvecFewestLanes && kMoeMatvecMinLanes >= kMatvecFewestLanes &&
                  kMoeQ8MatvecMinLanes >= kMatvecFewestLanes,
              "teams of at least kMatvecFewestLanes lanes (test_cuda_kernels_host checks those)");
constexpr int matvec_lanes(long long units, int min_lanes = kMatvecMinLanes) {
    int lanes = 32;
    while (lanes > min_lanes && units < (long long)lanes * kMatvecLaneUnits) lanes /= 2;
    return lanes;
}
// The body a matvec launches whose teams have `lanes` lanes, found by matvec_lanes with
// MIN_LANES (kernels/matvec.h, TEAMS): fn(std::false_type) for whole simd groups, the bodies
// whose lanes are a constant, fn(std::true_type) for the short rows' teams. With MIN_LANES 32
// the lanes are always 32 and only the first is instantiated (the dense matvecs' kernels take
// that body alone).
template <int MIN_LANES, class Fn>
void with_matvec_body(int lanes, Fn&& fn) {
    if constexpr (MIN_LANES == 32) {
        fn(std::false_type{});
    } else {
        if (lanes == 32)
            fn(std::false_type{});
        else
            fn(std::true_type{});
    }
}
static_assert(kMatvecMinLanes == 32, "the dense matvecs' kernels instantiate the whole-simd-group bodies only");
// Weight rows per group of `simds` simd groups of a matvec with teams of `split` simd groups of
// `lanes` lanes each (split 1 where lanes < 32), `rows` rows per team.
constexpr int matvec_group_rows(int split, int lanes, int rows, int simds = kMatvecSimds) {
    return simds / split * (32 / lanes) * rows;
}
// Threadgroup memory: the staged runs (36 floats each: KCAP_MATVEC_RUN_STRIDE) and the
// parts' partial sums (two per row for gate_up).
constexpr int matvec_shared_floats(long long k, int rows = kMatvecRows) {
    return int((k / 32 < kMatvecChunkRuns ? k / 32 : kMatvecChunkRuns) * 36 + kMatvecSimds * rows * 2);
}
constexpr int kMatvecMaxRows = kMatvecWideRows;  // the most rows per team of any matvec
constexpr int kMatvecSharedBytes = (kMatvecChunkRuns * 36 + kMatvecSimds * kMatvecMaxRows * 2) * 4;  // the most
constexpr int kTokensSimds = 4;
constexpr int kTokensRows = 2;
constexpr int kTokensPerPass = 8;  // tokens that reuse one decoded run of weights
// Matmul, tensor cores (bf16 mma.sync on scale-factored weights and split activations, CUDA
// only; cuda/matmul_mma.cu): prefill tiles.
constexpr int kMmaTokens = 64;     // tokens per tile (int8 tiles: 64 or 128, cuda/matmul_q8.cu)
constexpr int kMmaRows = 128;      // weight rows per tile
constexpr int kMmaThreads = 256;   // 8 warps (2 x 4), each 32 tokens x 32 rows (int8 tiles: also 64 x 32)
constexpr int kMmaMinTokens = 16;  // the tiles' rows take 16 tokens and more; fewer run the few-token walk
// Formats with an mma row: those whose weights are scale x bf16-exact code + offset per
// sub-block (kernels/quant_codes.h). F32 and F16 take the exact rows.
constexpr bool mma_format(Format f) { return f != Format::F32 && f != Format::F16; }
// Formats with q8_1-activation rows: KCAP_Q8_WEIGHT_FORMATS (kernels/formats_list.h).
constexpr bool q8_format(Format f) {
#define KCAP_IS_Q8(NAME, DECODER) f == Format::NAME ||
    return KCAP_Q8_WEIGHT_FORMATS(KCAP_IS_Q8) false;
#undef KCAP_IS_Q8
}
// Matmul with q8_1 activations (opt-in: EngineOptions::activations = "q8_1"; cuda/matmul_q8.cu):
// up to kMmaMinTokens - 1 tokens the dp4a matvec (kernels/matvec_q8.h, the exact matvec's teams
// and splits, one grid row per token), more the int8 tensor-core tiles (cuda/matmul_q8.cu).
// Threadgroup memory: 13 words per staged run (a 12-word record and its scale) and the partials.
// Runs staged at a time: 512 (16384 values, 26 KB), so the 8B model's 14336-wide down projection
// is one chunk: with 128-run chunks each lane had one unit per chunk between barriers, and its
// Q6_K matvec reached 1.4 TB/s against gate_up's 2.5 (ncu, bench/results/cuda_h200_profile.txt).
constexpr int kMatvecQ8ChunkRuns = 512;
// Rows per team of the experts' slot matvecs with q8_1 activations (cuda.moe_experts_q8: gate/up,
// down); the exact ones keep kMatvecRows. Measured on the H200 (tg128 q8_1, 12-layer slices),
// gate/up / down rows. In groups of 8 simd groups (bench/results/cuda_h200_moe_matvec_rows.txt)
// 1/1, 2/1, 1/2, 2/2, 4/4: Qwen3-30B-A3B's Q4_K_M layout 1,091 / 1,097 / 1,111 / 1,117 / 1,147
// tok/s, gpt-oss-20b's 703 / 724 / 727 / 751 / 739, so 2/2 was kept; in groups of 16
// (kMatvecQ8Simds; bench/results/cuda_h200_matvec_simds.txt) 2/2, 1/1, 4/4, 4/2: Qwen3 1,199 /
// 1,216 / 1,149 / 1,133, gpt-oss 832 / 828 / 755 / 778, DeepSeek-V2-Lite's Q4_K_M layout 1,060 /
// 1,072 / 993 / 1,006: 1/1 (Qwen3 +1.4%, DeepSeek +1.1%, gpt-oss -0.5%). The exact experts with
// 2/2 went the other way (Qwen3 1,013 -> 978, gpt-oss 590 -> 575).
constexpr int kMoeQ8GateUpRows = 1;
constexpr int kMoeQ8DownRows = 1;
// A q8_1 down matrix of short rows, fewer units than a simd group's lanes (Qwen3-30B-A3B's
// 768-wide rows: 24 units in Q4_K, 12 in Q6_K), leaves most lanes one load or none per row, and
// its slots' grid of one row per simd group was 2-2.6 waves of the device (16-warp groups at
// 32-40 registers: 3-4 per multiprocessor, 1,024 groups). Its teams take kMoeQ8ShortDownRows rows
// each instead, and its kernel asks for kMoeQ8ShortDownGroups groups per multiprocessor (at most
// 64 registers): 256 groups, one wave, each simd group's four rows' loads in flight together.
// Measured on the H200 (tg128 q8_1, 12-layer slice of Qwen3-30B-A3B's Q4_K_M layout): 1,221 ->
// 1,259 tok/s; 2 rows with 3 or 4 groups per multiprocessor (spilling) 1,151 and 1,000. The
// longer rows of gpt-oss-20b (MXFP4, 2,880: 90 units) and DeepSeek-V2-Lite (Q8_0, 1,408: 44)
// keep one row (with four rows: 830 -> 808 and 1,130 -> 1,114 tok/s).
// Q6_K's short rows (its 12 units a row of Qwen3's down) take two rows per team: with four, its
// kernel spilled 124 bytes at 64 registers. Measured on an H100 (tg128 q8_1, Qwen3-30B-A3B's
// 12-layer slice, bench/results/cuda_h100_split_k.txt): 4 rows 1,267.5 tok/s, 2 rows 1,294.6, 4
// rows at one group per multiprocessor (no spills) 1,295.0, 2 rows without a minimum 1,288.9.
constexpr int kMoeQ8ShortDownRows = 4;
constexpr int kMoeQ8ShortDownRowsQ6_K = 2;
constexpr int kMoeQ8ShortDownGroups = 2;
constexpr bool moe_q8_short_down(long long units) { return units < 32; }
constexpr int matvec_q8_shared_words(long long k, int rows = kMatvecRows) {
    return int((k / 32 < kMatvecQ8ChunkRuns ? k / 32 : kMatvecQ8ChunkRuns) * 13 + kMatvecQ8Simds * rows * 2);
}
// A matmul's q8_1 input (one token or a batch; the matvec and the int8 tiles read it): m x k
// codes, m x k / 32 scales and m x k / 16 half sums (4 bytes each).
constexpr long long q8_rows_bytes(long long m, long long k) { return m * k + m * (k / 32) * 4 + m * (k / 16) * 4; }
constexpr int kQ8QuantizeThreads = 256;
// The q8_1 matvec's x (one token, or a few): the stage before wrote it into the q8_1 scratch
// where the planner linked them (cuda.add_norm_q8, the attention rows' _q8 forms: the matvec's
// _in rows), else it is quantized once by its own launch for rows of at least kQ8QuantizeMinK
// values (the _quant rows), else by each of the matvec's groups (no launch). Measured on the
// H200 (tg128, q8_1, bench/cuda_sweep.py, with the threshold as a switch): always launching (K =
// 1) / never (0, and no add_norm epilogue) / K = 1024 / 2048: Llama-3-8B Q4_K_M 308 / 248 / - / - (every K >= 4096),
// Gemma 3 270M layout 1170 / 1126 / 1172 / 1181, SmolLM2-135M layout 987 / 1037 / 1003 / 1016.
constexpr int kQ8QuantizeMinK = 2048;
constexpr int kMatvecQ8SharedBytes = (kMatvecQ8ChunkRuns * 13 + kMatvecQ8Simds * kMatvecMaxRows * 2) * 4;
static_assert(kMoeQ8GateUpRows <= kMatvecMaxRows && kMoeQ8DownRows <= kMatvecMaxRows,
              "kMatvecQ8SharedBytes holds the experts' q8_1 matvecs' partial sums");
// Matmul with bf16 activations (opt-in: EngineOptions::activations = "bf16"; cuda/matmul_gemm.cu):
// the bf16 rows take kGemmMinTokens tokens and more, so the plan runs the exact rows (matvec,
// few-token walk) below; from there each weight matrix is dequantized from its GGUF blocks into
// a bf16 scratch and multiplied by cuBLAS (cublasGemmEx, bf16 x bf16, f32 sums and output) with
// the input rounded to bf16. Measured on the H200
// (bench/cuda_sweep.py --pp --pp-tokens N, activations bf16), the GEMM against the exact
// split-bf16 tiles: Llama-3-8B Q4_K_M 16 tokens 985 vs 473 tok/s, 32: 1947 vs 937, 64: 4026 vs
// 1814; Gemma 3 270M layout 5435 vs 4119, 11498 vs 8038, 27679 vs 15829. A prefill of any size
// pays about 15 ms on the 8B model to write and read every weight in bf16, so a few tokens
// (the walk reads the raw blocks once) stay below it; one token (decode, the LM head after a
// prefill) never reaches it.
constexpr int kGemmMinTokens = 16;
// The weight scratch holds at most this many values (256 MB of bf16); a bigger matrix (an LM head
// for every position's logits) is dequantized and multiplied in chunks of rows.
constexpr long long kGemmMaxScratchValues = 128LL << 20;
constexpr int kGemmThreads = 256;  // dequantize: one thread per 32-value run; convert: 8 values per thread
// Norm: one group per row.
constexpr int kNormThreads = 1024;  // the most; a row of `width` takes norm_threads(width)
// About four values per thread, so a wide row (4096) is not a long serial walk per thread.
constexpr int norm_threads(long long width) {
    const long long t = (width / 4 + 31) / 32 * 32;
    return int(t < 64 ? 64 : t > kNormThreads ? kNormThreads : t);
}
// add_norm holds the row in registers (kcap_add_norm_vec) up to this many float4 per thread: rows
// of up to 8192 values at kNormThreads.
constexpr int kAddNormVecMax = 2;
// Attention: decode takes one KV head per group and splits keys over groups.
constexpr int kAttnMaxSimds = 8;  // the most simd groups of an attention launch (the row's threads)
// Prefill (kernels/attention_prefill.h, tiled): a group owns 4 * row_simds consecutive query
// rows of one KV head (token-major, the KV head's query heads adjacent), staged once:
// rows * head_dim <= kAttnPrefillQFloats, so 32 rows at head_dim 128, 16 at 256. Few rows
// (head_dim > 204) get a second set of simd groups that takes the other half of each 64-key
// tile, so a group still has 8 simd groups and the short grid (Gemma 3: one KV head) keeps
// the multiprocessors busier. The constants equal the body's KCAP_ATTN_PREFILL_* (static_assert
// in cuda/attention.cu).
constexpr int kAttnPrefillRowsPerSimd = 4;   // KCAP_ATTN_PREFILL_ROWS
constexpr int kAttnPrefillMaxSimds = 8;      // KCAP_ATTN_PREFILL_MAX_SIMDS
constexpr int kAttnPrefillQFloats = 4096;    // KCAP_ATTN_PREFILL_Q_FLOATS
constexpr int kAttnPrefillSharedBytes = (4096 + 2304 + 8 * 32 * 4) * 4;  // KCAP_ATTN_PREFILL_SHARED_FLOATS: 29 KB
constexpr int attn_prefill_row_simds(int head_dim) {
    return kAttnPrefillQFloats / (kAttnPrefillRowsPerSimd * head_dim) < kAttnPrefillMaxSimds
               ? kAttnPrefillQFloats / (kAttnPrefillRowsPerSimd * head_dim)
               : kAttnPrefillMaxSimds;
}
constexpr int attn_prefill_key_split(int head_dim) {
    return 2 * attn_prefill_row_simds(head_dim) <= kAttnPrefillMaxSimds ? 2 : 1;
}
constexpr int attn_prefill_simds(int head_dim) { return attn_prefill_row_simds(head_dim) * attn_prefill_key_split(head_dim); }
constexpr int attn_prefill_rows(int head_dim) { return kAttnPrefillRowsPerSimd * attn_prefill_row_simds(head_dim); }
static_assert(attn_prefill_simds(256) == 8 && attn_prefill_rows(256) == 16 && attn_prefill_simds(128) == 8 &&
                  attn_prefill_rows(128) == 32 && attn_prefill_simds(64) == 8,
              "prefill geometry at the common head dims");
// Prefill on the tensor cores (cuda/attention_mma.cu, row cuda.attention_mma, f16 KV cache):
// a group of kAttnMmaWarps simd groups owns kAttnMmaRows consecutive query rows of one KV head
// (16 per simd group, the same token-major numbering as the tiled body) and walks the keys in
// tiles staged by cp.async, two tiles in flight. Head dims with a tensor-core body (the row's
// LegalDims::head_dims): 64, 128, 256, with head_dim_v == head_dim.
constexpr int kAttnMmaWarps = 4;
constexpr int kAttnMmaRows = 16 * kAttnMmaWarps;
inline constexpr int kAttnMmaHeadDims[] = {64, 128, 256};  // the row's LegalDims::head_dims
constexpr bool attn_mma_dims(int head_dim, int head_dim_v) {
    if (head_dim != head_dim_v) return false;
    for (int d : kAttnMmaHeadDims)
        if (head_dim == d) return true;
    return false;
}
constexpr int attn_mma_keys(int head_dim) { return head_dim >= 256 ? 32 : 64; }  // keys per staged tile
// Threadgroup memory: queries (hi and lo halves) and two K and two V tiles, rows padded by 8
// halves (16 bytes: the 8 rows one ldmatrix phase reads fall in distinct banks), row scales.
constexpr int attn_mma_shared_bytes(int head_dim) {
    return (2 * kAttnMmaRows + 4 * attn_mma_keys(head_dim)) * (head_dim + 8) * 2 + kAttnMmaRows * 4;
}
static_assert(attn_mma_shared_bytes(256) == 135424 && attn_mma_shared_bytes(128) == 104704,
              "one group per multiprocessor at head_dim 256, two at 128");
// cuda.attention_mla_tiled's attend: threadgroup memory for cache rows of `width` values
// (KCAP_MLA_TILE_SHARED_FLOATS: 165 KB at DeepSeek's 576, so one group per multiprocessor).
constexpr int mla_tiled_shared_bytes(int width) {
    return KCAP_MLA_TILE_SHARED_FLOATS(width) * 4;
}
static_assert(mla_tiled_shared_bytes(576) == 168960, "the tiled attend's threadgroup memory at DeepSeek's width");
// Combine of the decode splits: one thread per output dim (kernels/attention.h).
constexpr int attn_combine_threads(int head_dim_v) { return head_dim_v <= 128 ? 128 : 256; }
constexpr int kAttnDecodeSimds = 4;  // KCAP_ATTN_DECODE_SIMDS: simd groups of a decode group

// Decode groups per KV head: one per pass of KCAP_ATTN_HEADS_PER_PASS query heads, so a KV head
// with 8 query heads (Qwen3-MoE, gpt-oss) is two groups side by side, not one group that takes
// its two passes in turn (Nsight Compute, Qwen3-30B-A3B's layout at 512 keys: 4 groups of 2
// passes per split, 27 us a layer, one warp per scheduler issuing every 6.7 cycles).
constexpr int kAttnHeadsPerPass = 4;  // KCAP_ATTN_HEADS_PER_PASS
// Which decode body a stage's heads take (fixed by its dims, like the body's geometry):
// kcap_attention_decode_tiles (kernels/attention_decode_tiles.h: the split's keys staged in
// threadgroup memory, one query head per simd group, no merge of simd groups' states) for heads
// of 64 or 128 dims (K and V alike) with 4 or 8 query heads per KV head; else
// kcap_attention_decode_dims (several query heads per simd group, keys over the simd groups,
// their states merged in threadgroup memory).
constexpr bool attn_decode_tiles(int n_head, int n_head_kv, int head_dim, int head_dim_v) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && (n_head / n_head_kv == 4 || n_head / n_head_kv == 8) &&
           head_dim == head_dim_v && (head_dim == 64 || head_dim == 128);
}
constexpr int attn_decode_head_blocks(int n_head, int n_head_kv, int head_dim, int head_dim_v) {
    return attn_decode_tiles(n_head, n_head_kv, head_dim, head_dim_v)
               ? 1
               : (n_head / n_head_kv + kAttnHeadsPerPass - 1) / kAttnHeadsPerPass;
}
// Stages with few decode groups per key split (KV heads x head groups: Gemma 3 270M has one,
// Qwen3-MoE and Llama-3-8B eight) give each 8 simd groups, so a split's keys take fewer serial
// steps. Measured on the H200 (bench/results/cuda_h200_attention_decode_simds.txt, tg128 at 0 /
// 4096 keys), 8 simd groups up to 8 decode groups against up to 2: Qwen3-30B-A3B's 2-layer slice
// 3,326 / 2,714 -> 3,427 / 3,024 tok/s, Llama-3-8B's 2,219 / 1,920 -> 2,263 / 2,077, SmolLM2
// 1,218 / 744 -> 1,375 / 928; gpt-oss (16 groups) keeps 4. Four groups per multiprocessor in the
// split cap on top took gpt-oss at 4096 from 1,835 to 2,000 but the others down (Qwen3 2,882,
// SmolLM2 752), so the cap stays at two.
constexpr int kAttnFewGroups = 8;
constexpr int attn_decode_simds(int n_head, int n_head_kv, int head_dim, int head_dim_v) {
    if (attn_decode_tiles(n_head, n_head_kv, head_dim, head_dim_v)) return n_head / n_head_kv;
    return n_head_kv * attn_decode_head_blocks(n_head, n_head_kv, head_dim, head_dim_v) <= kAttnFewGroups
               ? 8
               : kAttnDecodeSimds;
}
// The decode's key streams per simd group (kcap_attention_decode_dims' KS) by the head's dims
// (the larger of K's and V's): 2 at heads of at most 64 dims (gpt-oss, SmolLM2), where a lane's 4
// dims of a row leave half the simd group idle, else 1. Measured on the H200, q8_1 tg128 (bench/
// results/cuda_h200_attention_key_streams.txt): gpt-oss-20b's 12-layer slice after 8,192 tokens
// 488 -> 693 tok/s with the split cap below (decode 79 -> 28 us a layer under Nsight Compute),
// from empty 807 -> 825; SmolLM2 after 4,096 tokens 1,002 -> 1,103, from empty 1,454 -> 1,430.
// Four streams at 64 dims (gpt-oss 645 / 801, SmolLM2 795 / 1,271) and two at 128 dims (Qwen3-30B-
// A3B's slice after 8,192 tokens 774 -> 665, from empty 1,186 -> 1,136) were slower.
constexpr int attn_decode_key_streams(int head_dim, int head_dim_v) {
    return head_dim <= 64 && head_dim_v <= 64 ? 2 : 1;
}
// Its 4-dim groups per lane: 1 for heads of at most 128 dims, else 2 (KCAP_ATTN_MAX_HEAD_DIM).
constexpr int attn_decode_dim_groups(int head_dim, int head_dim_v) {
    return head_dim <= 128 && head_dim_v <= 128 ? 1 : 2;
}
// Calls fn(DG, KS) (std::integral_constant) with the decode body's dim groups and key streams
// for the stage's heads: the CUDA launch and the host tests instantiate the same bodies.
template <class Fn>
void with_attn_decode_body(int head_dim, int head_dim_v, Fn&& fn) {
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    if (attn_decode_dim_groups(head_dim, head_dim_v) == 2)
        fn(Two{}, One{});
    else if (attn_decode_key_streams(head_dim, head_dim_v) == 2)
        fn(One{}, Two{});
    else
        fn(One{}, One{});
}
// Calls fn(D, F16, S) (std::integral_constant) with kcap_attention_decode_tiles' template
// arguments for a stage it takes (attn_decode_tiles): head dims, f16 cache, query heads per KV head.
template <class Fn>
void with_attn_decode_tiles(int head_dim, int kv_f16, int group, Fn&& fn) {
    using D64 = std::integral_constant<int, 64>;
    using D128 = std::integral_constant<int, 128>;
    using F32 = std::integral_constant<int, 0>;
    using F16 = std::integral_constant<int, 1>;
    using S4 = std::integral_constant<int, 4>;
    using S8 = std::integral_constant<int, 8>;
    const auto with_s = [&](auto d, auto f) {
        if (group == 4)
            fn(d, f, S4{});
        else
            fn(d, f, S8{});
    };
    const auto with_f = [&](auto d) {
        if (kv_f16)
            with_s(d, F16{});
        else
            with_s(d, F32{});
    };
    if (head_dim == 64)
        with_f(D64{});
    else
        with_f(D128{});
}
// Decode splits (bench/cuda_sweep.py, tg128 on the H200): 32-key chunks at short spans took
// Gemma 3 270M from 874 to 1038 tok/s and the 8B from 242 to 254 (64-key chunks before); at
// 4096 tokens of context the 8B did best with fewer, longer splits (34 splits: 187 -> 195
// tok/s) and Gemma (one KV head) with more (136 splits: 765 -> 944). At most 2 groups per
// multiprocessor gives both: 33 splits for the 8B's 8 KV heads, 136 for Gemma's one. The cap
// counts simd groups (16 per multiprocessor: two groups of 8), so stages of many groups of 4
// simd groups (gpt-oss: 8 KV heads x 2 head groups) get as many simd groups as the others.
constexpr int kAttnMinChunk = 32;     // fewest keys per decode split (a multiple of 32)
#ifndef KCAP_CUDA_ATTN_SIMDS_PER_SM
#define KCAP_CUDA_ATTN_SIMDS_PER_SM 16
#endif
constexpr int kAttnSimdsPerSm = KCAP_CUDA_ATTN_SIMDS_PER_SM;  // decode grid: at most this many simd groups per multiprocessor
// Multi-head latent attention's decode: fewest cache rows per key split, and at most this many
// attend groups (a token's head groups x splits) per multiprocessor. An attend group of two heads
// (KCAP_MLA_HEADS_PER_GROUP) holds their weighted latents in 128 registers per thread, so two
// groups of 256 threads are resident per multiprocessor; with four heads (170 registers) one was,
// and more splits only added waves, each paying the group's fixed costs (the queries, the merge)
// again (4 groups per multiprocessor, 132 splits at 8192 positions: 77 us per layer under Nsight
// Compute). Measured on the H200, DeepSeek-V2-Lite's Q4_K_M layout, 27 layers, tg128 from empty /
// at 4096 (bench/cuda_sweep.py; bench/results/cuda_h200_mla_groups.txt): four heads, 64 rows,
// one group 368 / 319 tok/s; two heads, 32 rows, two groups 399 / 325; 16 rows 405 / 325
// (kept); three groups 399 / 294; one head per group 408 / 301.
constexpr int kMlaMinChunk = KCAP_MLA_MIN_CHUNK;
#ifndef KCAP_CUDA_MLA_GROUPS_PER_SM
#define KCAP_CUDA_MLA_GROUPS_PER_SM 2
#endif
constexpr int kMlaGroupsPerSm = KCAP_CUDA_MLA_GROUPS_PER_SM;
// qk_norm_rope: one simd group per head row.
constexpr int kQkNormRopeSimds = 4;
// Elementwise, rope, KV append: one thread per value.
constexpr int kElementwiseThreads = 256;
// Argmax: first-pass groups cover this many logits each.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxChunk = 4096;
constexpr int kEmbedThreads = 128;
// Mixture of experts: the router's logits take groups of 2 simd groups (KCAP_MOE_LOGIT_EXPERTS
// experts' rows each, for KCAP_MOE_LOGIT_TOKENS tokens), its top-k one simd group per token; the
// grouped experts' sort one group of 1024 threads per call. A decode's router is a few hundred KB
// read by few groups: its latency. Measured on the H200 (tg128, bench/cuda_sweep.py; one call,
// all four on a tree that also had a latent-attention change since dropped), experts per simd
// group / threads per group 2 / 128 (the old setting), 1 / 128, 1 / 64, 1 / 32:
// DeepSeek-V2-Lite Q4_K_M layout (64 experts) q8_1 457.1 / 468.5 / 479.2 / 479.4 tok/s, exact
// 428.0 / 437.5 / 447.2 / 449.3; 12-layer slices q8_1, Qwen3-30B-A3B (128 experts) 1,176 / 1,198
// / 1,185 / 1,147, gpt-oss-20b (32) 804 / 816 / 806 / 781. On the tree itself, 2 / 128 then 1 /
// 64 (two calls): DeepSeek q8_1 464.6 -> 487.0, exact 428.0 -> 445.6
// (bench/results/cuda_h200_router_logits.txt).
constexpr int kMoeLogitThreads = 64;
constexpr int kMoeRouteThreads = 32;
// cuda.moe_route_cluster (sm_90, up to kMoeRouteTiledMinTokens - 1 tokens): the logits and the
// top-k in one launch, each group of KCAP_MOE_LOGIT_TOKENS tokens a thread-block cluster whose
// groups take the router's rows (one expert per simd group, as kcap_moe_logits' simd groups
// above) and, after the cluster's barrier, group 0 takes the tokens' top-k by rank: no second
// launch, whose wait on the first was most of the router's time in a decode step
// (bench/cuda_trace.py, Qwen3-30B-A3B's layout, q8_1: logits 4.7 us, top-k 5.5 us a layer). Clusters of at most 16 groups
// (sm_90's non-portable size), at least 2 experts per group (64 threads, as kMoeLogitThreads),
// at most 16 simd groups per group (kcap_moe_logits' registers): up to 256 experts.
constexpr int kMoeRouteClusterGroups = 16;
constexpr int kMoeRouteClusterMaxSimds = 16;
constexpr int kMoeRouteClusterMaxExperts = kMoeRouteClusterGroups * kMoeRouteClusterMaxSimds;
// cuda.moe_route_cluster_norm holds a token's whole normed row where the logits stage x: at
// most KCAP_MOE_LOGIT_TOKENS * KCAP_MOE_LOGIT_CHUNK_RUNS runs (DeepSeek V3's 7,168 values).
constexpr int kMoeRouteNormMaxK = 8 * 28 * 32;
// ... and its groups have at least this many simd groups for the norm (gpt-oss's 32 experts take
// two per group for the logits: its 2,880 values were 45 per thread), which with an F32 router
// also share the logits (route_logits_f32) and the rank (four threads a Qwen3-MoE expert).
constexpr int kMoeRouteNormMinSimds = 16;
constexpr int moe_route_cluster_groups(int n_expert) {
    return (n_expert + 1) / 2 < kMoeRouteClusterGroups ? (n_expert + 1) / 2 : kMoeRouteClusterGroups;
}
constexpr int moe_route_cluster_simds(int n_expert) {
    return (n_expert + moe_route_cluster_groups(n_expert) - 1) / moe_route_cluster_groups(n_expert);
}
static_assert(moe_route_cluster_groups(128) == 16 && moe_route_cluster_simds(128) == 8 &&
                  moe_route_cluster_simds(kMoeRouteClusterMaxExperts) == kMoeRouteClusterMaxSimds &&
                  moe_route_cluster_groups(8) == 4 && moe_route_cluster_simds(8) == 2 &&
                  moe_route_cluster_groups(1) == 1,
              "the router's clusters at Qwen3-MoE's 128 experts, the most, and Mixtral's 8");
// The router's logits as a tiled matmul over slices of K (cuda.moe_route_tiled) from this many
// tokens: a tile of 32 tokens reads each of its router rows once, where the simd groups of
// kcap_moe_logits read it once per KCAP_MOE_LOGIT_TOKENS tokens. Measured on the H200
// (bench/cuda_sweep.py --pp --exclude cuda.moe_route_tiled, 12 layers of the Qwen3-30B-A3B
// Q4_K_M layout, exact mode): pp512 30,649 tok/s with it, 30,084 without (gpt-oss-20b's layout:
// the same within the spread); whole-K tiles (64 groups) were 10% slower than without. The
// switch at 64 is not tuned.
constexpr int kMoeRouteTiledMinTokens = 64;
constexpr int kMoeSortThreads = 1024;
// The experts grouped by expert (cuda.moe_experts_mma) from this many tokens. Measured on the
// H200 (bench/cuda_moe_tokens.py, 12 layers of the Qwen3-30B-A3B Q4_K_M layout, the switch at 32,
// before the tiles skipped padding): the slot matvecs took 5.6 ms for 8 tokens, 7.4 for 16 and
// 10.8 for 31, the grouped tiles 7.1 ms for 32 and 7.5 for 64: the slot matvecs read each
// chosen expert's weights once per slot, so their time grows with the tokens from the first.
constexpr int kMoeGroupedMinTokens = kMmaMinTokens;
// The q8_1 slot matvecs' gate/up launch: one grid row of groups per slot (token x chosen expert),
// each group kMatvecQ8Simds teams of kMoeQ8MatvecMinLanes (whole simd groups) split over the
// rows as matvec_split sets for the launch's rows; the groups of all slots.
constexpr long long moe_q8_gate_up_groups(long long ff, long long k, long long slots, int sm_count) {
    const int split = matvec_split(ff * slots, sm_count, kMoeQ8GateUpRows, k, kMatvecQ8Simds);
    const int group_rows = matvec_group_rows(split, kMoeQ8MatvecMinLanes, kMoeQ8GateUpRows, kMatvecQ8Simds);
    return (ff + group_rows - 1) / group_rows * slots;
}
// Slot starts (cuda.moe_experts_q8_slot_starts): each gate/up group counts itself done in its
// slot's counter, and each slot's down groups wait for that count instead of for the whole gate/up
// launch, so the first slots' down rows run in the gate/up launch's last wave. That pays only
// where gate/up takes more than one wave: measured on an H100 (12-layer slices, tg128 q8_1,
// bench/results/cuda_h100_slot_flags_probe.txt), gpt-oss-20b (720 groups of 40 registers, three a
// multiprocessor: 1.8 waves) 940 -> 962 tok/s, Qwen3-30B-A3B (384 groups, under one wave) 1,364
// -> 1,341. So the row takes a call from the tokens whose gate/up groups exceed
// kMoeSlotStartsGroupsPerSm per multiprocessor (no gate/up kernel fits more): surely over a wave.
constexpr int kMoeSlotStartsGroupsPerSm = 4;
constexpr int moe_slot_starts_min_tokens(long long ff, long long k, int n_used, int sm_count) {
    for (int tokens = 1; tokens < kMoeGroupedMinTokens; ++tokens)
        if (moe_q8_gate_up_groups(ff, k, (long long)tokens * n_used, sm_count) >
            (long long)kMoeSlotStartsGroupsPerSm * sm_count)
            return tokens;
    return kMoeGroupedMinTokens;  // past the row's range: the plain slot matvecs take every count
}
static_assert(moe_q8_gate_up_groups(2880, 2880, 4, 132) == 720 && moe_q8_gate_up_groups(768, 2048, 8, 132) == 384 &&
                  moe_slot_starts_min_tokens(2880, 2880, 4, 132) == 1 && moe_slot_starts_min_tokens(768, 2048, 8, 132) == 2,
              "gpt-oss-20b's decode takes the slot starts, Qwen3-30B-A3B's from two tokens");
// The u16 values of rows x k values split for the split-bf16 tiles (mma_tiles::SplitRows: two
// bf16 halves and an f32 sum of each 16 values; a multiple of 4 where k is a multiple of 32, so
// that a second layout after it stays 8-byte aligned).
constexpr int64_t split_rows_values(int64_t rows, int64_t k) { return 2 * rows * k + 2 * (rows * k / 16); }
// The u16 values of the grouped bf16 and split-bf16 experts' inputs (Context::moe_bf16) for a
// stage whose moe_scratch has `down` and `act` values: x of max_batch x k (k = n for the experts:
// at most `down`, whose rows hold every slot) and the activations (`act`), each at most 2 + 1/8
// u16 a value when split (test_cuda_kernels_host checks the bound over the families' shapes).
constexpr size_t moe_input_values(size_t down, size_t act) { return (down + act) / 8 * 17 + 64; }

// The int8 tiles' tokens per group (cuda/matmul_q8.cu): 64, or 128 where the batch has more than
// 64 tokens and the 128-token groups fill at least 90% of one wave (q8_groups_per_sm of them per
// multiprocessor); small grids keep more, smaller groups. On the 8B file at 512 tokens: gate+up
// (896 groups of 128) and the Q6_K ffn_down (128 groups, one per multiprocessor) take 128; q, o,
// K and V keep 64 (o: 137 us vs 189 with 128); pp512 7772 (64 everywhere) / 7964 (gate+up at
// 128) / 6311 (128 everywhere) tok/s. qkv's tiles keep 64 (its two-format launch takes 64).
constexpr bool q8_sub16(Format f) { return f == Format::Q2_K || f == Format::Q3_K || f == Format::Q6_K; }
constexpr int q8_groups_per_sm(Format f, int tokens) { return tokens == 128 && q8_sub16(f) ? 1 : 2; }
// The fewest tokens from which the tiles of `tiles` row tiles (of kMmaRows rows) take 128 tokens.
constexpr int q8_tile128_min_tokens(long long tiles, Format f, int sm_count) {
    const long long slots = (long long)q8_groups_per_sm(f, 128) * sm_count;
    const long long waves = (9 * slots + 10 * tiles - 1) / (10 * tiles);  // 128-token groups per row tile needed
    const long long m = (waves - 1) * 128 + 1;
    return int(m > 65 ? m : 65);
}

}  // namespace cuda_rows

// Launchers, one per row (defined in cuda/*.cu; absent where CUDA is not compiled in). A
// launcher takes the token counts of its row only (the plan routes the others elsewhere).
//
// Where a q8_1 row gets the q8_1 form of its input: Groups, each of its matvec's groups rounds
// the x it stages (rows of fewer than kQ8QuantizeMinK values); Quantize, a launch of its own
// rounds x once into the q8_1 scratch first (longer rows, and every batch); Scratch, the stage
// before it wrote it there (the planner linked them: kQ8Input).
enum class Q8Source { Groups, Quantize, Scratch };
// Attention launchers: the kernels of a decode (one token) or a prefill chunk; Rope: the
// rope, or the QK-norm and rope, the planner folded into the stage (a decode applies it in its
// kernel, a prefill chunk launches the rope kernel first); Q8: also writes the output's q8_1
// form for the output projection (kQ8Output).
enum class AttnKind { Decode, Prefill, PrefillMma };
enum class AttnRope { None, Rope, QkNormRope };

template <Format FORMAT> void kcap_cuda_embed(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_per_layer_embed(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_matvec(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_matmul_tokens(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_matmul_mma(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_gate_up(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_gate_up_tokens(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_gate_up_mma(const Stage& stage, const KernelCall& call);
template <Format FORMAT, Q8Source SOURCE> void kcap_cuda_matvec_q8(const Stage& stage, const KernelCall& call);
template <Format FORMAT, Q8Source SOURCE, int TOKENS>
void kcap_cuda_matmul_q8_mma(const Stage& stage, const KernelCall& call);
template <Format FORMAT, Q8Source SOURCE> void kcap_cuda_gate_up_q8(const Stage& stage, const KernelCall& call);
template <Format FORMAT, Q8Source SOURCE, int TOKENS>
void kcap_cuda_gate_up_q8_mma(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_matmul_bf16(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_gate_up_bf16(const Stage& stage, const KernelCall& call);
template <AttnKind KIND, AttnRope ROPE, bool Q8>
void kcap_cuda_attention(const Stage& stage, const KernelCall& call);
template <Q8Source SOURCE> void kcap_cuda_qkv_q8(const Stage& stage, const KernelCall& call);
template <Q8Source SOURCE> void kcap_cuda_qkv_q8_tokens(const Stage& stage, const KernelCall& call);
template <Q8Source SOURCE> void kcap_cuda_qkv_q8_mma(const Stage& stage, const KernelCall& call);
template <bool Q8> void kcap_cuda_add_norm(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_moe_experts(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_moe_experts_mma(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_moe_experts_bf16_mma(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_moe_experts_q8(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_moe_experts_q8_slot_starts(const Stage& stage, const KernelCall& call);
template <Format FORMAT> void kcap_cuda_moe_experts_q8_mma(const Stage& stage, const KernelCall& call);

void kcap_cuda_qkv(const Stage& stage, const KernelCall& call);
void kcap_cuda_qkv_tokens(const Stage& stage, const KernelCall& call);
void kcap_cuda_qkv_mma(const Stage& stage, const KernelCall& call);
void kcap_cuda_qkv_bf16(const Stage& stage, const KernelCall& call);
void kcap_cuda_norm(const Stage& stage, const KernelCall& call);
void kcap_cuda_rope(const Stage& stage, const KernelCall& call);
void kcap_cuda_qk_norm_rope(const Stage& stage, const KernelCall& call);
void kcap_cuda_ffn_activation(const Stage& stage, const KernelCall& call);
void kcap_cuda_add(const Stage& stage, const KernelCall& call);
void kcap_cuda_softcap(const Stage& stage, const KernelCall& call);
void kcap_cuda_scale(const Stage& stage, const KernelCall& call);
void kcap_cuda_argmax(const Stage& stage, const KernelCall& call);
void kcap_cuda_sample(const Stage& stage, const KernelCall& call);
void kcap_cuda_per_layer_gate(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route_tiled(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route_cluster(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route_add_norm(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route_tiled_add_norm(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route_cluster_add_norm(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_route_cluster_norm(const Stage& stage, const KernelCall& call);
template <bool DECODE> void kcap_cuda_attention_mla(const Stage& stage, const KernelCall& call);
void kcap_cuda_attention_mla_tiled(const Stage& stage, const KernelCall& call);
void kcap_cuda_moe_shared_gate(const Stage& stage, const KernelCall& call);

}  // namespace kcap
