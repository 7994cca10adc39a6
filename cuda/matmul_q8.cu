// CUDA entry points of the q8_1-activation rows (cuda.matvec_q8.*, cuda.matmul_q8_mma*.*,
// cuda.gate_up_q8*.*, cuda.qkv_q8*; opt-in through EngineOptions::activations = "q8_1"). All compute W . q8_1(x): x rounded per
// 32-element run to int8 codes q times d = amax / 127 (kernels/matvec_q8.h), the weights as
// int8 codes (KcapCodes<F>::codes8), integer products summed exactly in int32 per sub-block,
// then the f32 scales: what llama.cpp's mmvq / mmq compute.
//   fewer than kMmaMinTokens tokens (the matvec rows): the dp4a matvec (kernels/matvec_q8.h), one
//   grid row per token;
//   a batch (the _mma rows): int8 tensor-core tiles below, the bf16 rows' row tiles, warp grid and raw weight
//   staging (cuda/mma_tiles.h), 64 or 128 tokens per group, on mma.sync m16n8k32 (sub-blocks of
//   32) or m16n8k16 (of 16) s8 x s8 -> s32.
//
// A batch's activations, and a token's of 2048 values or more, are quantized once (kcap_q8_quantize_rows,
// into the backend's q8_1 scratch, or by the stage before where the planner linked them: the
// rows' Q8Source) for every group, tile and matrix that reads them (qkv's three, gate_up's two);
// the matvec's groups copy runs of it into shared memory, or quantize a shorter x themselves. The tile step: as in
// matmul_mma.cu, each thread decodes one 32-element run of one weight row (codes8: eight words
// of code bytes, straight into shared memory, no conversion); the activations (codes, half
// sums, run scales) are copied into shared memory by cp.async. Both go into the other of two
// step buffers while the tensor cores work on this one (one barrier per step). Then per run of
// the step and per sub-block, T = sum((byte - bias) * q) on the tensor cores (the bias taken
// off the code bytes at decode) and
//   acc += d_x * sum over the run's sub-blocks of (scale * T + offset * sum q)
// per (token, row) in f32. Bound as the matvec's: the integer sums are exact, the f32 epilogue
// adds a few roundings per sub-block (test_cuda_rows holds both to the exact rows' 1e-5 against
// the CPU row on q8_1(x)). A plain launch of short grid takes each tile as two groups over the
// two halves of K, whose sums add into the zeroed outputs (split_k_zero, cuda/mma_tiles.h).
#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "cuda/matmul.h"
#include "cuda/mma_tiles.h"
#include "kernels/matvec_q8.h"
#include "kernels/quant_codes.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;
using namespace mma_tiles;

#define KCAP_CHECK_Q8_LIST(NAME, DECODER) \
    static_assert(KcapCodes<DECODER>::has_codes8, #NAME " is in KCAP_Q8_WEIGHT_FORMATS but has no codes8");
KCAP_Q8_WEIGHT_FORMATS(KCAP_CHECK_Q8_LIST)
#undef KCAP_CHECK_Q8_LIST

__global__ void __launch_bounds__(kQ8QuantizeThreads)
    quantize_rows_kernel(const float* x, int m, int k, kcap_u32* codes, float* d, kcap_i32* half_sums) {
    pdl_wait();
    pdl_trigger();
    kcap_q8_quantize_rows(kcap_cuda_thread(), x, m, k, codes, d, half_sums);
}

// x quantized once into the context's q8_rows (one launch).
Q8Rows quantize_rows(const Context& ctx, int m, int k, const float* x) {
    const Q8Rows rows = q8_rows_layout(ctx, m, k);
    launch(ctx, quantize_rows_kernel, dim3(ceil_div(int64_t(m) * (k / 4), kQ8QuantizeThreads)), dim3(kQ8QuantizeThreads),
           0, x, m, k, rows.codes, rows.d, rows.half_sums);
    return rows;
}

// The q8_1 input of a call of k-value rows (SOURCE, cuda/rows.h): none (codes null: the matvec's
// groups round x themselves), x rounded once by a launch of its own, or the rows the stage before
// wrote into the scratch (for a call on the last position only, its last row).
template <Q8Source SOURCE>
Q8Rows q8_input(const Context& ctx, const KernelCall& call, int k) {
    if constexpr (SOURCE == Q8Source::Groups) return {nullptr, nullptr, nullptr};
    else if constexpr (SOURCE == Q8Source::Scratch) return q8_rows_at(ctx, call.buffer_rows, k, call.row_offset);
    else return quantize_rows(ctx, call.n_tokens, k, call.in);
}

// ------------------------------------------------------------------------- dp4a matvec
template <class F, int ROWS, bool GATE_UP>
__global__ void __launch_bounds__(kMatvecQ8Simds * 32)
    matvec_q8_kernel(KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs, const kcap_u8* w0, const kcap_u8* w1,
                     const float* x, Q8Rows rows, const float* bias, int activation, float* y) {
    extern __shared__ kcap_i32 q8_shared[];
    const KcapThread t = kcap_cuda_thread();
    if (t.group_y == 0) {  // weights never change: safe before the wait; one token's groups suffice
        kcap_matvec_split_prefetch<ROWS, false>(t, p, teams, w0);
        if (GATE_UP) kcap_matvec_split_prefetch<ROWS, false>(t, p, teams, w1);
    }
    pdl_wait();
    pdl_trigger();
    kcap_matvec_q8<F, ROWS, GATE_UP ? KCAP_MATVEC_GATE_UP : KCAP_MATVEC_PLAIN, false>(
        t, p, teams, chunk_runs, w0, w1, x, rows.codes, rows.d, rows.half_sums, bias, activation, y, q8_shared);
}

template <class F, int ROWS, bool GATE_UP>
void launch_matvec_q8_rows(const Context& ctx, const KcapMatmulParams& p, const kcap_u8* w0, const kcap_u8* w1,
                           const float* x, const Q8Rows& rows, const float* bias, int activation, float* y) {
    const KcapMatvecTeams teams =
        matvec_teams(ctx, p, ROWS, q8_units_per_row<F>(p.k), kMatvecMinLanes, 0, kMatvecQ8Simds);
    const int chunk_runs = std::min(p.k / 32, kMatvecQ8ChunkRuns);
    const dim3 grid(matvec_groups(p, teams, ROWS, kMatvecQ8Simds), unsigned(p.m)), block(kMatvecQ8Simds * 32);
    const size_t shared = size_t(matvec_q8_shared_words(p.k, ROWS)) * 4;
    launch(ctx, matvec_q8_kernel<F, ROWS, GATE_UP>, grid, block, shared, p, teams, chunk_runs, w0, w1, x, rows, bias,
           activation, y);
}

// kMatvecRows rows per team, 2 for a wide matrix (matvec_rows_for), fixed per stage.
template <class F, bool GATE_UP>
void launch_matvec_q8(const Context& ctx, const KcapMatmulParams& p, const kcap_u8* w0, const kcap_u8* w1,
                      const float* x, const Q8Rows& rows, const float* bias, int activation, float* y) {
    if (matvec_rows_for(p.n) == 2)
        launch_matvec_q8_rows<F, 2, GATE_UP>(ctx, p, w0, w1, x, rows, bias, activation, y);
    else
        launch_matvec_q8_rows<F, kMatvecRows, GATE_UP>(ctx, p, w0, w1, x, rows, bias, activation, y);
}

// ------------------------------------------------------------------------- int8 tiles
constexpr int kStrideQ8 = kStepK / 4 + 4;  // words (int8 quads) per shared row, padded
static_assert(kStrideQ8 % 8 == 4, "the 8 rows of an ldmatrix phase (16 bytes each) fall in distinct bank quads");

// The products T start at kProductBiasBits (the mma's c operand), so their int32 bits read as
// the float kProductBias + T, exactly while |T| < 2^22 (at most 32 * 128 * 128 = 2^19 here):
// scale * T is then fma(scale, float_bits(T), -kProductBias * scale), one rounding like the
// product of scale and float(T) it replaces (the same bits for finite scales; an infinite f16
// scale gives NaN instead of an infinity), without the int-to-float
// conversion per output: 5-10% fewer instructions per K step (Q4_K 666 -> 630, Q8_0 353 ->
// 316 in the sm_90 SASS). -kProductBias * scale is exact: the sub-block scales of the formats
// that take it are an f16 times an integer of at most 8 bits (at most 19 significant bits), and
// kProductBias = 3 * 2^22 adds 2.
constexpr int kProductBiasBits = 0x4b400000;
constexpr float kProductBias = 12582912.0f;  // 1.5 * 2^23

// One K step's tiles for groups of TOKENS tokens. Two of them: a step's products read one while
// the next step's weights are decoded into the other and its activations copied there
// (cp.async), so a step takes one barrier, and warps drift between decoding and products
// instead of waiting at a second one.
template <int TOKENS>
struct alignas(16) SharedQ8Step {
    unsigned w[kMmaRows * kStrideQ8];  // code bytes, [row][k / 4]
    unsigned x[TOKENS * kStrideQ8];    // activation codes q, [token][k / 4]
    // [run of the step][row * halves + half]: the sub-block scales (and offsets) of a run, one
    // per 32-element sub-block, two (halves) per 16-element pair, adjacent for the epilogue's
    // vector loads.
    float scale[kStepK / 32][2 * kMmaRows];
    float offset[kStepK / 32][2 * kMmaRows];
    int qsum[kSubs16][TOKENS];         // [16-element half of the step][token]: sum of q
    float d[kStepK / 32][TOKENS];      // [run of the step][token]: the run's scale
};

// Tokens per group: 64, or 128 (a warp takes 64 tokens x 32 rows, so every decoded weight run
// and scale serves twice the products). The warp grid is 2 (tokens) x 4 (rows) for both. Groups
// per multiprocessor: two (128 registers; at 128 tokens the K step spills a few registers,
// 11-12 spill instructions per step for Q4_K in the sm_90 build), except 128 tokens on 16-element
// sub-blocks: one (up to 255 registers, no spills; two spilled 28 per step). Measured on the
// H200 (ncu, Llama-3-8B Q4_K_M shape, 512 tokens): Q4_K gate+up 911 us (64 tokens) / 862 (128,
// two groups) / 968 (128, one group); Q6_K ffn_down 695-701 (64) / 704 (128, two groups) / 579
// (128, one group).
template <class F, int TOKENS>
constexpr int kQ8GroupsPerSm = TOKENS == 128 && KcapCodes<F>::sub == 16 ? 1 : 2;


// One group's tile: row tile bx of `group` (a grid column), token tile blockIdx.y. GROUPED: the
// grouped experts' tiles (group.tile_expert, x_rows, live_rows set; 64 tokens), a form of its own
// so that the plain matmuls' code stays as it was.
template <class F, bool STAGED, int TOKENS, bool GROUPED = false>
__device__ __forceinline__ void mma_q8_tile(const MmaGroup& group, int bx, const Q8Rows& x) {
    static_assert(TOKENS == 64 || TOKENS == 128, "64 or 128 tokens per group");
    static_assert(!GROUPED || TOKENS == 64, "the grouped experts' tiles are of kMmaTokens rows");
    using Step = SharedQ8Step<TOKENS>;
    constexpr int kWarpTokensQ8 = TOKENS / 2, kMtQ8 = kWarpTokensQ8 / 16;
    constexpr int kTokenPasses = TOKENS / 64;  // activation copies per thread and step: 64 tokens each
    const int which = mma_group_member(group, bx), tile = mma_group_tile(group, which, bx);
    const KcapMatmulParams p = mma_group_pick(group.p, which);
    const kcap_u8* w = mma_group_pick(group.w, which);
    // Grouped experts (cuda/moe.cu): the token tile is one expert's sorted rows; its weights and
    // bias row are that expert's, its x rows the rows' source tokens (x_rows, -1: padding).
    // Their order (tile_expert, x_rows, live_rows) is the sort kernel's output: read after the
    // wait for it.
    kcap_u64 bias_offset = 0;
    if constexpr (GROUPED) {
        pdl_wait();
        const int expert = group.tile_expert[blockIdx.y];
        if (expert < 0) return;  // past the batch's tiles
        w += kcap_u64(expert) * group.expert_bytes;
        bias_offset = kcap_u64(expert) * kcap_u64(p.n);
    }
    using C = KcapCodes<F>;
    using R = RawChunk<F>;
    constexpr int kSub = C::sub;  // elements per sub-block: 16 or 32
    constexpr int kHalves = kSub == 16 ? 2 : 1;  // sub-blocks per 32-element run
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kStepsPerChunk = R::k / kStepK;  // 4 (256-element chunks) or 1
    static_assert(kSub == 16 || kSub == 32, "sub-blocks of 16 or 32 elements");
    // Products started at the conversion bias (kProductBias): 32-element sub-blocks whose scale
    // comes from an f16 (below 2^16 * 2^8, so scale * (kProductBias + T) stays finite); not
    // MXFP4 (a power-of-two scale up to 2^127) nor the 16-element sub-blocks (their second
    // product per run kept another quad live through the loop: spills in the H200 build).
    constexpr bool kBiasedProducts = kSub == 32 && !std::is_same<F, KcapMXFP4>::value;
    // cp.async groups: every step commits two (its activations, then its weight chunk or none).
    // Waiting for a step's activations leaves the newest group (the chunk staged the step
    // before) in flight, except with one-step chunks, where the next step decodes that chunk.
    // Groups complete in order, so a 4-step chunk staged at iteration 4j - 2 is waited for at
    // iteration 4j (two steps of lead; the tiles before this pipeline gave it four).
    constexpr int kPendingGroups = STAGED && kStepsPerChunk == 1 ? 0 : 1;
    // Dynamic shared memory: the two steps' tiles, then (STAGED) the raw chunks, RawChunk<F>:
    // two buffers of buffer_words.
    extern __shared__ __align__(16) unsigned char q8_shared_bytes[];
    Step* sh = reinterpret_cast<Step*>(q8_shared_bytes);
    unsigned* raw_q8 = reinterpret_cast<unsigned*>(q8_shared_bytes + 2 * sizeof(Step));
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;
    const int row_base = tile * kMmaRows, token_base = blockIdx.y * TOKENS;
    const int warp_tokens = kWarpTokensQ8 * (warp / kWarpsRows), warp_rows = kWarpRows * (warp % kWarpsRows);
    // Decoding role: weight row dr, run dhalf of each step. Activation role: 16 codes (piece xp
    // of the step's 64) and half sum xp of tokens xt + 64 i; for the first 2 * TOKENS threads
    // also the scale of run xr of token xdt.
    const int dr = tid >> 1, dhalf = tid & 1;
    const int xt = tid >> 2, xp = tid & 3;
    const int xdt = tid >> 1, xr = tid & 1;
    const int k_words = p.k / 4, k_runs = p.k / 32, k_halves = p.k / 16;
    const bool row_valid = row_base + dr < p.n;
    const kcap_u8* wrow = w + kcap_u64(row_valid ? row_base + dr : 0) * p.row_bytes;
    const kcap_u8* w_end = w + kcap_u64(p.n) * p.row_bytes;
    // Split K (grid z of 2, plain tiles only: split_k_zero in mma_tiles.h): this group's chunks
    // [c_begin, c_end) and their steps [s_begin, steps); its partial sums are added into y.
    const int all_chunks = (p.k + R::k - 1) / R::k;
    const int splits = int(gridDim.z), per_split = (all_chunks + splits - 1) / splits;
    const int c_begin = min(all_chunks, int(blockIdx.z) * per_split), c_end = min(all_chunks, c_begin + per_split);
    const int s_begin = c_begin * kStepsPerChunk;
    const int steps = min((p.k + kStepK - 1) / kStepK, c_end * kStepsPerChunk);  // one past the last step
    const int chunks = c_end;
    // GROUPED: the x row of a tile row is its source token (-1: padding; the down tiles, whose
    // x rows are the sorted rows themselves, have no x_rows), looked up once.
    const auto x_row = [&](int token) { return token < p.m ? (group.x_rows ? group.x_rows[token] : token) : -1; };
    int x_src[kTokenPasses];
#pragma unroll
    for (int i = 0; i < kTokenPasses; ++i) x_src[i] = GROUPED ? x_row(token_base + xt + 64 * i) : -1;
    const int d_src = GROUPED ? x_row(token_base + xdt) : -1;
    const bool d_token = GROUPED ? d_src >= 0 : token_base + xdt < p.m;
    const kcap_u64 d_row = kcap_u64(d_token ? (GROUPED ? d_src : token_base + xdt) : 0);
    // GROUPED: a 16-token mma tile whose first row is padding is all padding (an expert's rows
    // are padded at the end of its tiles), so the warp skips its products.
    bool live[kMtQ8];
#pragma unroll
    for (int mt = 0; mt < kMtQ8; ++mt) {
        const int first = token_base + warp_tokens + 16 * mt;
        live[mt] = !GROUPED || (first < p.m && group.live_rows[first] >= 0);
    }

    // Raw weight chunk c into its buffer (STAGED; nothing past the last chunk).
    const auto stage = [&](int c) {
        if (STAGED && c < chunks) stage_chunk<F>(raw_q8 + (c & 1) * R::buffer_words, w, w_end, p, row_base, c, tid);
    };
    const unsigned sh_address = shared_address(sh);
    const unsigned x_offset = unsigned(offsetof(Step, x) + 4 * (xt * kStrideQ8 + 4 * xp));
    const unsigned qsum_offset = unsigned(offsetof(Step, qsum) + 4 * (xp * TOKENS + xt));
    const unsigned d_offset = unsigned(offsetof(Step, d) + 4 * (xr * TOKENS + xdt));
    // Step s's activations into sh[s & 1]: codes, half sums (formats with offsets), run
    // scales; zeros past M or K (a zero-length copy reads nothing, so the address is any valid one).
    const auto copy_x = [&](int s) {
        if (s >= steps) return;
        const unsigned b = sh_address + unsigned(s & 1) * unsigned(sizeof(Step));
        const int k0 = s * kStepK;
#pragma unroll
        for (int i = 0; i < kTokenPasses; ++i) {
            const int token = token_base + xt + 64 * i;
            const bool in = (GROUPED ? x_src[i] >= 0 : token < p.m) && k0 + 16 * xp < p.k;
            const kcap_u64 row = kcap_u64(in ? (GROUPED ? x_src[i] : token) : 0);
            cp_async16_or_zero(b + x_offset + unsigned(4 * 64 * kStrideQ8 * i),
                               x.codes + (in ? row * k_words + k0 / 4 + 4 * xp : 0), in);
            if (C::has_offset)
                cp_async4_or_zero(b + qsum_offset + unsigned(4 * 64 * i), x.half_sums + (in ? row * k_halves + k0 / 16 + xp : 0), in);
        }
        if (tid < 2 * TOKENS) {
            const bool d_in = d_token && k0 + 32 * xr < p.k;
            cp_async4_or_zero(b + d_offset, x.d + (d_in ? d_row * k_runs + k0 / 32 + xr : 0), d_in);
        }
    };
    // Unstaged MXFP4, Q8_0, Q4_0 and Q5_0 (RunAhead): the words of the thread's run of step s,
    // loaded an iteration before decode(s) (load_ahead(s + 1) follows decode(s)); zeros past N
    // or K. Not the grouped Q8_0 tiles: DeepSeek-V2-Lite's Q8_0 experts' down took 0.8% off its
    // pp512 with it (the MXFP4 ones gained; bench/results/cuda_h200_run_ahead.txt).
    using Ahead = RunAhead<F>;
    constexpr bool kAhead = !STAGED && Ahead::kWords > 0 && !(GROUPED && std::is_same<F, KcapQ8_0>::value);
    static_assert(!kAhead || (!C::has_offset && kRunsPerBlock == 1), "RunAhead: 32-element blocks, no offsets");
    kcap_u32 ahead[kAhead ? Ahead::kWords : 1];
    kcap_u32 ahead_off = 0;
    const auto load_ahead = [&](int s) {
        if constexpr (kAhead) {
            const int run = 2 * s + dhalf;
            const bool in = row_valid && run < k_runs;
            ahead_off = run_ahead_load<F>(wrow + unsigned(in ? run : 0) * unsigned(F::block_bytes), in, ahead);
        }
    };
    // Step s's weights into sh[s & 1]: code bytes, (scale, offset) per sub-block; zeros past N or K.
    const auto decode = [&](int s) {
        Step& b = sh[s & 1];
        const int run = 2 * s + dhalf;
        if (!STAGED && GROUPED && kMoeQ8PrefetchSteps > 0 && row_valid && run + 2 * kMoeQ8PrefetchSteps < k_runs)
            prefetch_run<F>(wrow, run + 2 * kMoeQ8PrefetchSteps);
        kcap_u32 u[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        float sc[2] = {0.0f, 0.0f}, off[2] = {0.0f, 0.0f};
        const bool in = row_valid && run < k_runs;
        if constexpr (kAhead) {
            if (in) Ahead::decode(ahead, ahead_off, u, sc);
            load_ahead(s + 1);
        } else if (in) {
            C::codes8(run_block<F, STAGED>(raw_q8, wrow, dr, run, s / kStepsPerChunk), run % kRunsPerBlock, u, sc, off);
        }
        // Signed codes for the s8 products: byte - bias in two's complement, so the epilogue
        // needs no "- bias * sum q" per output and sub-block. Bytes are 0..127, so byte + 128 -
        // bias stays below 256 (no carry into the next byte), and the xor takes the 128 back
        // off modulo 256. Zeros past N or K stay zeros.
        if (C::bias != 0 && in)
            KCAP_UNROLL for (int i = 0; i < 8; ++i) u[i] = (u[i] + kcap_u32(128 - C::bias) * 0x01010101u) ^ 0x80808080u;
        uint4* dst = reinterpret_cast<uint4*>(b.w + dr * kStrideQ8 + 8 * dhalf);
        dst[0] = make_uint4(u[0], u[1], u[2], u[3]);
        dst[1] = make_uint4(u[4], u[5], u[6], u[7]);
        if constexpr (kHalves == 2) {
            *reinterpret_cast<float2*>(&b.scale[dhalf][2 * dr]) = make_float2(sc[0], sc[1]);
            if (C::has_offset) *reinterpret_cast<float2*>(&b.offset[dhalf][2 * dr]) = make_float2(off[0], off[1]);
        } else {
            b.scale[dhalf][dr] = sc[0];
            if (C::has_offset) b.offset[dhalf][dr] = off[0];
        }
    };
    float acc[kMtQ8][kNt][4] = {};
    const int bias_quad[4] = {kProductBiasBits, kProductBiasBits, kProductBiasBits, kProductBiasBits};
    // Step s's products from sh[s & 1]: per run and sub-block T = sum((byte - bias) * q) on the
    // tensor cores, then acc += d_x * (sum over the run's sub-blocks of scale * T + offset * sum q).
    const auto products = [&](int s) {
        const Step& b = sh[s & 1];
#pragma unroll
        for (int r = 0; r < kStepK / 32; ++r) {
            unsigned bw[kNt / 2][4];
#pragma unroll
            for (int np = 0; np < kNt / 2; ++np) load_b2<kStrideQ8>(bw[np], b.w + (warp_rows + 16 * np) * kStrideQ8 + 8 * r, lane);
            // One m16 tile of tokens at a time: its products, then their epilogue (the products
            // of one tile live at a time: 16 or 32 registers).
#pragma unroll
            for (int mt = 0; mt < kMtQ8; ++mt) {
                if (GROUPED && !live[mt]) continue;  // uniform per warp
                unsigned a[4];
                load_a<kStrideQ8>(a, b.x + (warp_tokens + 16 * mt) * kStrideQ8 + 8 * r, lane);
                // t[h]: the products of sub-block h of the run.
                int t[kHalves][kNt][4];  // kProductBiasBits + T where kBiasedProducts, else T
#pragma unroll
                for (int nt = 0; nt < kNt; ++nt) {
                    const unsigned b0 = bw[nt >> 1][2 * (nt & 1)], b1 = bw[nt >> 1][2 * (nt & 1) + 1];
                    if constexpr (kBiasedProducts) {
                        mma_s8_k32_from(t[0][nt], a, b0, b1, bias_quad);
                    } else {
                        for (int h = 0; h < kHalves; ++h) t[h][nt][0] = t[h][nt][1] = t[h][nt][2] = t[h][nt][3] = 0;
                        if constexpr (kSub == 32) {
                            mma_s8_k32(t[0][nt], a, b0, b1);
                        } else {
                            mma_s8_k16(t[0][nt], a[0], a[1], b0);
                            mma_s8_k16(t[kHalves - 1][nt], a[2], a[3], b1);
                        }
                    }
                }
                // C fragment: [0], [1] at (token g, rows 2tg, 2tg + 1); [2], [3] at token g + 8.
                const int ta = warp_tokens + 16 * mt + g, tb = ta + 8;
                const float da = b.d[r][ta], db = b.d[r][tb];
                // Sum of q per sub-block of the run (formats with offsets).
                float qa[kHalves], qb[kHalves];
#pragma unroll
                for (int h = 0; h < kHalves; ++h) {
                    qa[h] = qb[h] = 0.0f;
                    if (C::has_offset) {
                        qa[h] = float(kHalves == 2 ? b.qsum[2 * r + h][ta] : b.qsum[2 * r][ta] + b.qsum[2 * r + 1][ta]);
                        qb[h] = float(kHalves == 2 ? b.qsum[2 * r + h][tb] : b.qsum[2 * r][tb] + b.qsum[2 * r + 1][tb]);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < kNt; ++nt) {
                    const int row = warp_rows + 8 * nt + 2 * tg;
                    float v0, v1, v2, v3;  // the run's sum of scale * T (+ offset * sum q)
                    if constexpr (kHalves == 2) {
                        // (row h0, row h1, row+1 h0, row+1 h1): the halves summed before the
                        // activation scale, one multiply-add per output and run saved.
                        const float4 s = *reinterpret_cast<const float4*>(&b.scale[r][2 * row]);
                        const int(&t0)[4] = t[0][nt];
                        const int(&t1)[4] = t[1][nt];
                        v0 = fmaf(s.y, float(t1[0]), s.x * float(t0[0])), v1 = fmaf(s.w, float(t1[1]), s.z * float(t0[1]));
                        v2 = fmaf(s.y, float(t1[2]), s.x * float(t0[2])), v3 = fmaf(s.w, float(t1[3]), s.z * float(t0[3]));
                        if (C::has_offset) {
                            const float4 o = *reinterpret_cast<const float4*>(&b.offset[r][2 * row]);
                            v0 = fmaf(o.y, qa[1], fmaf(o.x, qa[0], v0)), v1 = fmaf(o.w, qa[1], fmaf(o.z, qa[0], v1));
                            v2 = fmaf(o.y, qb[1], fmaf(o.x, qb[0], v2)), v3 = fmaf(o.w, qb[1], fmaf(o.z, qb[0], v3));
                        }
                    } else {
                        const float2 s = *reinterpret_cast<const float2*>(&b.scale[r][row]);
                        const int(&tt)[4] = t[0][nt];
                        if constexpr (kBiasedProducts) {
                            const float c0 = -kProductBias * s.x, c1 = -kProductBias * s.y;  // exact
                            v0 = fmaf(s.x, __int_as_float(tt[0]), c0), v1 = fmaf(s.y, __int_as_float(tt[1]), c1);
                            v2 = fmaf(s.x, __int_as_float(tt[2]), c0), v3 = fmaf(s.y, __int_as_float(tt[3]), c1);
                        } else {
                            v0 = s.x * float(tt[0]), v1 = s.y * float(tt[1]);
                            v2 = s.x * float(tt[2]), v3 = s.y * float(tt[3]);
                        }
                        if (C::has_offset) {
                            const float2 o = *reinterpret_cast<const float2*>(&b.offset[r][row]);
                            v0 = fmaf(o.x, qa[0], v0), v1 = fmaf(o.y, qa[0], v1);
                            v2 = fmaf(o.x, qb[0], v2), v3 = fmaf(o.y, qb[0], v3);
                        }
                    }
                    float* out = acc[mt][nt];
                    out[0] = fmaf(da, v0, out[0]);
                    out[1] = fmaf(da, v1, out[1]);
                    out[2] = fmaf(db, v2, out[2]);
                    out[3] = fmaf(db, v3, out[3]);
                }
            }
        }
    };

    if constexpr (!GROUPED) pdl_wait();
    pdl_trigger();
    // The pipeline. Before step s's products: its weights decoded and activations landed in
    // sh[s & 1]; the raw chunks of steps s + 1 (and, with 4-step chunks, the next chunk) staged.
    // Iteration s decodes step s + 1, multiplies step s, waits for step s + 1's activations and
    // (one-step chunks) step s + 2's chunk, then one barrier; then step s + 2's activations go to
    // the tiles step s just freed, and where step s + 2 starts a chunk, the chunk after it to the
    // raw buffer whose last step was just decoded.
    load_ahead(s_begin);
    stage(c_begin);
    cp_async_commit();
    copy_x(s_begin);
    cp_async_commit();
    stage(c_begin + 1);
    cp_async_commit();
    cp_async_wait<2>();  // this thread's copies of chunk c_begin
    __syncthreads();
    for (int s = s_begin - 1; s < steps; ++s) {
        if (s + 1 < steps) decode(s + 1);
        if (s >= s_begin) products(s);
        if (s + 1 == steps) break;  // uniform: no copies left to wait for
        cp_async_wait<kPendingGroups>();
        __syncthreads();  // step s + 1's tiles visible; step s's no longer read
        copy_x(s + 2);
        cp_async_commit();
        if ((s + 2) % kStepsPerChunk == 0) stage((s + 2) / kStepsPerChunk + 1);
        cp_async_commit();
    }
    // Picked here, not at the start: no registers held through the loop.
    const float* bias = mma_group_pick(group.bias, which);
    // The grouped tiles leave their padding rows unwritten: nothing reads them (the gated
    // activation writes zeros for them, the weighted sum reads the slots' rows).
    if (!GROUPED && splits > 1) {
        store_tile<kMtQ8, true>(acc, p, token_base + warp_tokens, row_base + warp_rows, lane,
                                blockIdx.z == 0 ? bias : nullptr, mma_group_pick(group.y, which));
        return;
    }
    store_tile(acc, p, token_base + warp_tokens, row_base + warp_rows, lane, GROUPED && bias ? bias + bias_offset : bias,
               mma_group_pick(group.y, which), GROUPED ? group.live_rows : nullptr);
}

template <class F, bool STAGED, int TOKENS, bool GROUPED>
__global__ void __launch_bounds__(kMmaThreads, kQ8GroupsPerSm<F, TOKENS>) mma_q8_kernel(MmaGroup group, Q8Rows x) {
    mma_q8_tile<F, STAGED, TOKENS, GROUPED>(group, int(blockIdx.x), x);
}

// Two groups of matrices of two formats on the same x in one grid (qkv's Q and K in one format,
// V in another: Llama-3-8B Q4_K_M's Q4_K / Q6_K layers). The first group's row tiles, then the
// second's: V's 64 groups (8 row tiles, 64 tokens each at 512 tokens) share the last wave of
// Q and K's 320 instead of taking a wave of their own. ncu on the H200, 8B layer at 512
// tokens: 285 us in one launch, against 211 us (Q+K) + 137 us (V) in two; a Q4_K layer's
// Q, K and V (384 groups of one format) take 211 us. 64 tokens per group: both formats'
// kernels fit two groups per multiprocessor there.
template <class F0, class F1, bool STAGED>
__global__ void __launch_bounds__(kMmaThreads, 2) mma_q8_pair_kernel(MmaGroup g0, MmaGroup g1, Q8Rows x) {
    // Guards the launch bounds against a change of either format's groups per multiprocessor.
    static_assert(kQ8GroupsPerSm<F0, 64> == 2 && kQ8GroupsPerSm<F1, 64> == 2, "both fit two groups per multiprocessor");
    const int tiles0 = g0.tiles_end[g0.count - 1];
    if (int(blockIdx.x) < tiles0) mma_q8_tile<F0, STAGED, 64>(g0, int(blockIdx.x), x);
    else mma_q8_tile<F1, STAGED, 64>(g1, int(blockIdx.x) - tiles0, x);
}

// Dynamic shared bytes of mma_q8_tile<F, STAGED, TOKENS>: the two steps' tiles, the raw chunks
// (a two-format launch takes the larger of its formats').
template <class F, int TOKENS>
constexpr size_t q8_tile_shared_bytes(bool staged) {
    return 2 * sizeof(SharedQ8Step<TOKENS>) + (staged ? RawChunk<F>::bytes : 0);
}

template <class F, bool STAGED, int TOKENS, bool GROUPED>
void launch_mma_q8(const Context& ctx, const MmaGroup& g, const Q8Rows& x) {
    constexpr size_t bytes = q8_tile_shared_bytes<F, TOKENS>(STAGED);
    allow_dynamic_shared<mma_q8_kernel<F, STAGED, TOKENS, GROUPED>>(ctx, bytes);
    dim3 grid = mma_group_grid(g, TOKENS);
    if (!GROUPED) grid.z = unsigned(split_k_zero(ctx, g, int(grid.x), kQ8GroupsPerSm<F, TOKENS>, TOKENS, RawChunk<F>::k));
    launch(ctx, mma_q8_kernel<F, STAGED, TOKENS, GROUPED>, grid, dim3(kMmaThreads), bytes, g, x);
}

template <class F, int TOKENS, bool GROUPED = false>
void mma_q8_tokens(const Context& ctx, const MmaGroup& g, const Q8Rows& x) {
    if (GROUPED != (g.tile_expert != nullptr)) throw Error("mma_q8_tokens: a grouped launch takes the grouped tiles");
    launch_mma_group<F>(ctx, g, q8_tile_shared_bytes<F, TOKENS>(true), [&](const MmaGroup& group, bool staged) {
        staged ? launch_mma_q8<F, true, TOKENS, GROUPED>(ctx, group, x) : launch_mma_q8<F, false, TOKENS, GROUPED>(ctx, group, x);
    });
}

static_assert(q8_groups_per_sm(Format::Q6_K, 128) == kQ8GroupsPerSm<KcapQ6_K, 128> &&
                  q8_groups_per_sm(Format::Q4_K, 128) == kQ8GroupsPerSm<KcapQ4_K, 128> &&
                  q8_groups_per_sm(Format::Q2_K, 128) == kQ8GroupsPerSm<KcapQ2_K, 128> &&
                  q8_groups_per_sm(Format::Q3_K, 128) == kQ8GroupsPerSm<KcapQ3_K, 128> &&
                  q8_groups_per_sm(Format::Q8_0, 128) == kQ8GroupsPerSm<KcapQ8_0, 128>,
              "cuda_rows::q8_groups_per_sm (which the 128-token rows' ranges follow) states the kernel's occupancy");

// The two-format launch (mma_q8_pair_kernel) of groups g0 (format F0) and g1 (F1), 64 tokens
// per group.
template <class F0, class F1, bool STAGED>
void launch_mma_q8_pair(const Context& ctx, const MmaGroup& g0, const MmaGroup& g1, const Q8Rows& x) {
    constexpr size_t bytes = std::max(q8_tile_shared_bytes<F0, 64>(STAGED), q8_tile_shared_bytes<F1, 64>(STAGED));
    allow_dynamic_shared<mma_q8_pair_kernel<F0, F1, STAGED>>(ctx, bytes);
    dim3 grid(unsigned(g0.tiles_end[g0.count - 1] + g1.tiles_end[g1.count - 1]), unsigned(ceil_div(g0.p[0].m, 64)));
    grid.z = unsigned(split_k_zero(ctx, g0, int(grid.x), 2, 64, std::max(RawChunk<F0>::k, RawChunk<F1>::k)));
    if (grid.z > 1) split_k_zero_outputs(ctx, g1);
    launch(ctx, mma_q8_pair_kernel<F0, F1, STAGED>, grid, dim3(kMmaThreads), bytes, g0, g1, x);
}

// g0 and g1 in one two-format launch of 64-token groups (what qkv's tiles take).
template <class F0, class F1>
bool mma_q8_pair(const Context& ctx, const MmaGroup& g0, const MmaGroup& g1, const Q8Rows& x) {
    constexpr size_t staged_bytes = std::max(q8_tile_shared_bytes<F0, 64>(true), q8_tile_shared_bytes<F1, 64>(true));
    if (use_staged(ctx, g0.p[0], staged_bytes, std::max(staged_min_k<F0>(false), staged_min_k<F1>(false))))
        launch_mma_q8_pair<F0, F1, true>(ctx, g0, g1, x);
    else launch_mma_q8_pair<F0, F1, false>(ctx, g0, g1, x);
    return true;
}

// The format pairs with a two-format launch (each pair is two more tile kernels to compile):
// llama.cpp's K-quant mixes, a Q6_K V next to Q4_K or Q5_K Q and K (Q4_K_M, Q5_K_M).
#define KCAP_Q8_TILE_PAIRS(X) \
    X(Q4_K, KcapQ4_K, Q6_K, KcapQ6_K) \
    X(Q5_K, KcapQ5_K, Q6_K, KcapQ6_K)

// cuda.matvec_q8.<format>[_quant|_in]: up to kMmaMinTokens - 1 tokens, one grid row per token.
template <class F, Q8Source SOURCE>
void run_matvec_q8(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    const Context& ctx = context(call);
    const KcapMatmulParams p = matmul_params(stage, call);
    const auto* w = static_cast<const kcap_u8*>(data.operands[0]);
    launch_matvec_q8<F, false>(ctx, p, w, w, call.in, q8_input<SOURCE>(ctx, call, p.k),
                               static_cast<const float*>(data.operands[1]), 0, call.out);
}

// cuda.matmul_q8_mma[128].<format>[_in]: a batch on the int8 tiles, TOKENS per group.
template <class F, Q8Source SOURCE, int TOKENS>
void run_matmul_q8_mma(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    const Context& ctx = context(call);
    const KcapMatmulParams p = matmul_params(stage, call);
    const Q8Rows rows = q8_input<SOURCE>(ctx, call, p.k);
    mma_q8_tokens<F, TOKENS>(ctx,
                             mma_group(p, static_cast<const kcap_u8*>(data.operands[0]),
                                       static_cast<const float*>(data.operands[1]), call.out),
                             rows);
}

// cuda.gate_up_q8.<format>[_quant|_in]: the fused matvec (both matrices against one staged x,
// the activation applied to the sums), one grid row per token.
template <class F, Q8Source SOURCE>
void run_gate_up_q8(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);  // operand 1 is the up matrix, not a bias
    launch_matvec_q8<F, true>(ctx, p, static_cast<const kcap_u8*>(data.operands[0]),
                              static_cast<const kcap_u8*>(data.operands[1]), call.in, q8_input<SOURCE>(ctx, call, p.k),
                              nullptr, int(stage.params.activation), call.out);
}

// cuda.gate_up_q8_mma[128].<format>[_in]: both matrices' int8 tiles in one launch into the plan's
// gate / up scratch, then the activation.
template <class F, Q8Source SOURCE, int TOKENS>
void run_gate_up_q8_mma(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);
    const Q8Rows x = q8_input<SOURCE>(ctx, call, p.k);
    MmaGroup g = mma_group(p, static_cast<const kcap_u8*>(data.operands[0]), nullptr, call.inout2);
    mma_group_add(g, p, static_cast<const kcap_u8*>(data.operands[1]), nullptr, call.inout3);
    mma_q8_tokens<F, TOKENS>(ctx, g, x);
    gate_up_activation(stage, call);
}

// qkv for one token: the three-segment launch of cuda.qkv (cuda/matmul.h), each segment on the
// q8_1 matvec of its format.
__global__ void __launch_bounds__(kMatvecQ8Simds * 32) qkv_q8_kernel(QkvParams q, const float* x, Q8Rows rows) {
    extern __shared__ kcap_i32 q8_shared[];
    KcapThread t = kcap_cuda_thread();
    const QkvSegment s = qkv_segment(q, t);
    switch (s.format) {
#define KCAP_QKV_Q8_CASE(NAME, DECODER)                                                                                \
    case int(Format::NAME):                                                                                            \
        kcap_matvec_split_prefetch<kMatvecRows, false>(t, s.p, s.teams, s.w);                                          \
        pdl_wait();                                                                                                    \
        pdl_trigger();                                                                                                 \
        kcap_matvec_q8<DECODER, kMatvecRows, KCAP_MATVEC_PLAIN, false>(t, s.p, s.teams, q.chunk_runs, s.w, s.w, x,     \
                                                                       rows.codes, rows.d, rows.half_sums, s.bias, 0,  \
                                                                       s.y, q8_shared);                                \
        break;
        KCAP_Q8_WEIGHT_FORMATS(KCAP_QKV_Q8_CASE)
#undef KCAP_QKV_Q8_CASE
        default: pdl_wait(); pdl_trigger(); break;
    }
}

// The q8_1 matvec of one matrix of any q8_1 format (qkv's few-token calls) on `x` (its q8_1 in
// `rows` where the call has it, else rounded by the groups).
void matvec_q8_any(const Context& ctx, Format format, const KcapMatmulParams& p, const kcap_u8* w, const float* x,
                   const Q8Rows& rows, const float* bias, float* y) {
    switch (format) {
#define KCAP_MATMUL_Q8_CASE(NAME, DECODER)                                                           \
    case Format::NAME:                                                                               \
        return launch_matvec_q8<DECODER, false>(ctx, p, w, w, x, rows, bias, 0, y);
        KCAP_Q8_WEIGHT_FORMATS(KCAP_MATMUL_Q8_CASE)
#undef KCAP_MATMUL_Q8_CASE
        default: throw Error(std::string("cuda.qkv_q8: no q8_1 body for ") + format_name(format));
    }
}

// Groups of two formats (qkv's batches) in one launch where KCAP_Q8_TILE_PAIRS has the pair
// (either order); false: nothing launched.
bool mma_q8_pair_any(const Context& ctx, const MmaFormatGroups& by_format, const Q8Rows& rows) {
    if (by_format.count != 2) return false;
    const Format f0 = by_format.format[0], f1 = by_format.format[1];
#define KCAP_MMA_Q8_PAIR_CASE(NAME0, DECODER0, NAME1, DECODER1)                                      \
    if (f0 == Format::NAME0 && f1 == Format::NAME1)                                                  \
        return mma_q8_pair<DECODER0, DECODER1>(ctx, by_format.group[0], by_format.group[1], rows);  \
    if (f0 == Format::NAME1 && f1 == Format::NAME0)                                                  \
        return mma_q8_pair<DECODER0, DECODER1>(ctx, by_format.group[1], by_format.group[0], rows);
    KCAP_Q8_TILE_PAIRS(KCAP_MMA_Q8_PAIR_CASE)
#undef KCAP_MMA_Q8_PAIR_CASE
    return false;
}

// The int8 tiles of a group of matrices of one format (qkv's batches), 64 tokens per group.
void mma_q8_any(const Context& ctx, Format format, const MmaGroup& g, const Q8Rows& rows) {
    switch (format) {
#define KCAP_MMA_Q8_CASE(NAME, DECODER) \
    case Format::NAME:                  \
        return mma_q8_tokens<DECODER, 64>(ctx, g, rows);
        KCAP_Q8_WEIGHT_FORMATS(KCAP_MMA_Q8_CASE)
#undef KCAP_MMA_Q8_CASE
        default: throw Error(std::string("cuda.qkv_q8: no q8_1 body for ") + format_name(format));
    }
}

}  // namespace

long long q8_row_units(Format format, long long k) {
    switch (format) {
#define KCAP_Q8_UNITS_CASE(NAME, DECODER) \
    case Format::NAME:                    \
        return q8_units_per_row<DECODER>(k);
        KCAP_Q8_WEIGHT_FORMATS(KCAP_Q8_UNITS_CASE)
#undef KCAP_Q8_UNITS_CASE
        default: throw Error(std::string("cuda: no q8_1 matvec for ") + format_name(format));
    }
}

void quantize_into_scratch(const Context& ctx, int m, int k, const float* x) { quantize_rows(ctx, m, k, x); }

void mma_tiles::mma_group_q8(const Context& ctx, Format format, const MmaGroup& g, const Q8Rows& x) {
    switch (format) {
#define KCAP_MMA_Q8_GROUP_CASE(NAME, DECODER) \
    case Format::NAME:                        \
        return g.tile_expert ? mma_q8_tokens<DECODER, 64, true>(ctx, g, x) : mma_q8_tokens<DECODER, 64>(ctx, g, x);
        KCAP_Q8_WEIGHT_FORMATS(KCAP_MMA_Q8_GROUP_CASE)
#undef KCAP_MMA_Q8_GROUP_CASE
        default: throw Error(std::string("mma_group_q8: no int8 tiles for ") + format_name(format));
    }
}

}  // namespace cuda

// cuda.qkv_q8[_quant|_in]: one token, the three-segment q8_1 matvec (x rounded once for the three).
template <Q8Source SOURCE>
void kcap_cuda_qkv_q8(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    const cuda::Context& ctx = cuda::context(call);
    int groups = 0;
    const cuda::QkvParams q = cuda::qkv_segments(stage, call, kMatvecQ8ChunkRuns, &groups, true);
    const cuda::Q8Rows rows = cuda::q8_input<SOURCE>(ctx, call, int(stage.k));
    const size_t shared = size_t(matvec_q8_shared_words(stage.k, kMatvecRows)) * 4;
    cuda::launch(ctx, cuda::qkv_q8_kernel, dim3(unsigned(groups)), dim3(kMatvecQ8Simds * 32), shared, q, call.in, rows);
}

// cuda.qkv_q8_tokens[_quant|_in]: up to kMmaMinTokens - 1 tokens, each matrix's q8_1 matvec.
template <Q8Source SOURCE>
void kcap_cuda_qkv_q8_tokens(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    int groups = 0;
    const cuda::QkvParams q = cuda::qkv_segments(stage, call, cuda_rows::kMatvecQ8ChunkRuns, &groups, true);
    const cuda::Q8Rows rows = cuda::q8_input<SOURCE>(ctx, call, int(stage.k));
    for (int which = 0; which < q.count; ++which) {
        const cuda::QkvSegment& s = q.segment[which];
        cuda::matvec_q8_any(ctx, Format(s.format), s.p, s.w, call.in, rows, s.bias, s.y);
    }
}

// cuda.qkv_q8_mma[_in]: a batch on the int8 tiles, one launch per format or per pair of formats.
template <Q8Source SOURCE>
void kcap_cuda_qkv_q8_mma(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    int groups = 0;
    const cuda::QkvParams q = cuda::qkv_segments(stage, call, cuda_rows::kMatvecQ8ChunkRuns, &groups, true);
    const cuda::Q8Rows rows = cuda::q8_input<SOURCE>(ctx, call, int(stage.k));
    const cuda::MmaFormatGroups by_format = cuda::mma_groups_by_format(q);
    if (cuda::mma_q8_pair_any(ctx, by_format, rows)) return;
    for (int i = 0; i < by_format.count; ++i) cuda::mma_q8_any(ctx, by_format.format[i], by_format.group[i], rows);
}

#define KCAP_INSTANTIATE_QKV_Q8(SOURCE)                                                                \
    template void kcap_cuda_qkv_q8<Q8Source::SOURCE>(const Stage&, const KernelCall&);                \
    template void kcap_cuda_qkv_q8_tokens<Q8Source::SOURCE>(const Stage&, const KernelCall&);
KCAP_INSTANTIATE_QKV_Q8(Groups)
KCAP_INSTANTIATE_QKV_Q8(Quantize)
KCAP_INSTANTIATE_QKV_Q8(Scratch)
#undef KCAP_INSTANTIATE_QKV_Q8
template void kcap_cuda_qkv_q8_mma<Q8Source::Quantize>(const Stage&, const KernelCall&);
template void kcap_cuda_qkv_q8_mma<Q8Source::Scratch>(const Stage&, const KernelCall&);

template <Format FORMAT, Q8Source SOURCE>
void kcap_cuda_matvec_q8(const Stage& stage, const KernelCall& call) {
    cuda::run_matvec_q8<cuda::Decoder<FORMAT>, SOURCE>(stage, call);
}
template <Format FORMAT, Q8Source SOURCE, int TOKENS>
void kcap_cuda_matmul_q8_mma(const Stage& stage, const KernelCall& call) {
    cuda::run_matmul_q8_mma<cuda::Decoder<FORMAT>, SOURCE, TOKENS>(stage, call);
}
template <Format FORMAT, Q8Source SOURCE>
void kcap_cuda_gate_up_q8(const Stage& stage, const KernelCall& call) {
    cuda::run_gate_up_q8<cuda::Decoder<FORMAT>, SOURCE>(stage, call);
}
template <Format FORMAT, Q8Source SOURCE, int TOKENS>
void kcap_cuda_gate_up_q8_mma(const Stage& stage, const KernelCall& call) {
    cuda::run_gate_up_q8_mma<cuda::Decoder<FORMAT>, SOURCE, TOKENS>(stage, call);
}

#define KCAP_INSTANTIATE_Q8_SOURCE(NAME, SOURCE)                                                                  \
    template void kcap_cuda_matvec_q8<Format::NAME, Q8Source::SOURCE>(const Stage&, const KernelCall&);          \
    template void kcap_cuda_gate_up_q8<Format::NAME, Q8Source::SOURCE>(const Stage&, const KernelCall&);
#define KCAP_INSTANTIATE_Q8_TILES(NAME, SOURCE, TOKENS)                                                          \
    template void kcap_cuda_matmul_q8_mma<Format::NAME, Q8Source::SOURCE, TOKENS>(const Stage&, const KernelCall&); \
    template void kcap_cuda_gate_up_q8_mma<Format::NAME, Q8Source::SOURCE, TOKENS>(const Stage&, const KernelCall&);
#define KCAP_INSTANTIATE_Q8(NAME, DECODER)         \
    KCAP_INSTANTIATE_Q8_SOURCE(NAME, Groups)       \
    KCAP_INSTANTIATE_Q8_SOURCE(NAME, Quantize)     \
    KCAP_INSTANTIATE_Q8_SOURCE(NAME, Scratch)      \
    KCAP_INSTANTIATE_Q8_TILES(NAME, Quantize, 64)  \
    KCAP_INSTANTIATE_Q8_TILES(NAME, Scratch, 64)   \
    KCAP_INSTANTIATE_Q8_TILES(NAME, Quantize, 128) \
    KCAP_INSTANTIATE_Q8_TILES(NAME, Scratch, 128)
KCAP_Q8_WEIGHT_FORMATS(KCAP_INSTANTIATE_Q8)
#undef KCAP_INSTANTIATE_Q8
#undef KCAP_INSTANTIATE_Q8_TILES
#undef KCAP_INSTANTIATE_Q8_SOURCE

}  // namespace kcap
