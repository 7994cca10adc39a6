// Packing for the int8 GEMM (cpu/matmul_q8_gemm.h, cpu/matmul_q8_pack.h): q8_1 activations of
// every token once per call, weight rows a tile at a time on each thread (their codes from
// cpp/core/formats_blocks.h's CodesOf), then on each tile the AVX-512 VNNI kernel, or the AVX2
// one where the CPU (or kcap.cap_cpu_kernels) allows no AVX-512.
#include "cpu/matmul_q8_pack.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/formats_blocks.h"
#include "core/formats_dot_paths.h"
#include "kcap/errors.h"

namespace kcap {
namespace q8_gemm {

namespace {

using namespace blocks;

// The kernels in use: AVX-512 VNNI, else AVX2, else none (the GEMM does not run).
struct Kernels {
    void (*rows_times_tokens)(const PackedRows&, const PackedTokens&, int64_t, float*, int64_t);
    void (*interleave)(const uint8_t*, int64_t, uint8_t*);
    void (*q4_k_rows)(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*);
    void (*q5_k_rows)(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*);
    void (*q6_k_rows)(const uint8_t*, int64_t, int64_t, uint8_t*, float*);
    void (*legacy_rows)(Format, const uint8_t*, int64_t, uint8_t*, float*);
};

Kernels kernels() {
    if (avx512::compiled() && avx2::compiled() && avx512_kernels_in_use())  // avx2::legacy_rows too
        return {avx512::rows_times_tokens, avx512::interleave, avx512::q4_k_rows,
                avx512::q5_k_rows,         avx512::q6_k_rows,  avx2::legacy_rows};
    if (avx2::compiled() && avx2_kernels_in_use())
        return {avx2::rows_times_tokens, avx2::interleave, avx2::q4_k_rows,
                avx2::q5_k_rows,         avx2::q6_k_rows,  avx2::legacy_rows};
    return {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
}

// Tokens per pass over a tile: their packed codes (64 x K bytes) stay in L2 across the tile.
constexpr int64_t kTokenBlock = 64;

struct RowTile {
    CacheLineVector<uint8_t> codes;
    CacheLineVector<float> scale, offset;
    CacheLineVector<float> out;  // the last tile's rows when they do not fill it
    int64_t n_super = 0;
    int32_t bias = 0, max_code = 0;
    bool has_offset = false;

    void resize(int64_t super_blocks) {
        if (super_blocks == n_super) return;
        n_super = super_blocks;
        codes.assign(size_t(kTileRows * n_super * kSuper), 0);
        scale.assign(size_t(kTileRows * n_super * kGroups), 0.0f);
        offset.assign(size_t(kTileRows * n_super * kGroups), 0.0f);
    }
    PackedRows view() const {
        return {codes.data(), scale.data(), has_offset ? offset.data() : nullptr, kTileRows, bias, max_code};
    }
};

// The formats whose codes the kernels pack straight from the blocks, and the 32-value formats
// whose codes and scales they unpack in order (then interleaved here).
template <class Block>
constexpr bool kDirectCodes =
    std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K> || std::is_same_v<Block, BlockQ6_K>;
template <class Block>
constexpr Format kLegacyVector = std::is_same_v<Block, BlockQ8_0>   ? Format::Q8_0
                                 : std::is_same_v<Block, BlockQ4_0> ? Format::Q4_0
                                 : std::is_same_v<Block, BlockMXFP4> ? Format::MXFP4
                                                                     : Format::F32;  // F32: none

// Packs rows [0, n) of w (row_stride bytes apart, k elements each) into tile rows 0..n-1 and
// zeroes the rest (their products are computed and dropped). Q4_K, Q5_K and Q6_K rows are packed
// by vector code (use.q4_k_rows, q5_k_rows, q6_k_rows: the codes straight from their bit fields into the
// interleaved layout, the scales as vectors; CodesOf's values bit for bit).
template <class Block>
void pack_rows(const uint8_t* w, size_t row_stride, int64_t n, int64_t k, RowTile& tile, const Kernels& use) {
    using Codes = CodesOf<Block>;
    constexpr int kElems = Codes::kElems;
    const int64_t k_bytes = tile.n_super * kSuper, n_groups = tile.n_super * kGroups;
    tile.bias = Codes::kBias;
    tile.max_code = Codes::kMax;
    // The AVX2 kernel multiplies codes of 64 and more only as Q8_0's (signed, plus 128).
    static_assert(Codes::kMax < 64 || Codes::kBias == 128, "codes the AVX2 kernel cannot sum in int16");
    tile.has_offset = Codes::kOffset;
    BlockCodes<kElems> c;
    thread_local CacheLineVector<uint8_t> linear;  // a row's codes in order, zero past k
    if constexpr (!kDirectCodes<Block>) linear.assign(size_t(k_bytes), 0);
    for (int64_t r = 0; r < kTileRows; ++r) {
        uint8_t* codes = tile.codes.data() + r * k_bytes;
        float* scale = tile.scale.data() + r * n_groups;
        float* offset = tile.offset.data() + r * n_groups;
        if (r >= n) {
            std::memset(codes, 0, size_t(k_bytes));
            std::fill(scale, scale + n_groups, 0.0f);
            std::fill(offset, offset + n_groups, 0.0f);
            continue;
        }
        const auto* blocks = reinterpret_cast<const Block*>(w + size_t(r) * row_stride);
        if constexpr (kDirectCodes<Block>) {
            const auto* raw = reinterpret_cast<const uint8_t*>(blocks);
            if constexpr (std::is_same_v<Block, BlockQ4_K>)
                use.q4_k_rows(raw, k / kElems, int64_t(sizeof(Block)), codes, scale, offset);
            else if constexpr (std::is_same_v<Block, BlockQ5_K>)
                use.q5_k_rows(raw, k / kElems, int64_t(sizeof(Block)), codes, scale, offset);
            else
                use.q6_k_rows(raw, k / kElems, int64_t(sizeof(Block)), codes, scale);
            continue;  // k is whole super-blocks: no padding
        }
        if constexpr (kLegacyVector<Block> != Format::F32) {
            use.legacy_rows(kLegacyVector<Block>, reinterpret_cast<const uint8_t*>(blocks), k / kElems, linear.data(),
                            scale);
        } else {
            for (int64_t b = 0; b < k / kElems; ++b) {
                prefetch_ahead(blocks[b]);
                Codes::get(blocks[b], c);
                std::memcpy(linear.data() + b * kElems, c.codes, kElems);
                std::copy(c.scale, c.scale + kElems / 16, scale + b * (kElems / 16));
                std::copy(c.offset, c.offset + kElems / 16, offset + b * (kElems / 16));
            }
        }
        // The padding past k (to whole super-blocks) keeps zero codes and scales.
        use.interleave(linear.data(), tile.n_super, codes);
        std::fill(scale + k / 16, scale + n_groups, 0.0f);
        std::fill(offset + k / 16, offset + n_groups, 0.0f);
    }
}

using PackFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, RowTile&, const Kernels&);

PackFn pack_fn(Format format) {
    switch (format) {
        case Format::Q4_0: return pack_rows<BlockQ4_0>;
        case Format::Q4_1: return pack_rows<BlockQ4_1>;
        case Format::Q5_0: return pack_rows<BlockQ5_0>;
        case Format::Q5_1: return pack_rows<BlockQ5_1>;
        case Format::Q8_0: return pack_rows<BlockQ8_0>;
        case Format::MXFP4: return pack_rows<BlockMXFP4>;
        case Format::Q2_K: return pack_rows<BlockQ2_K>;
        case Format::Q3_K: return pack_rows<BlockQ3_K>;
        case Format::Q4_K: return pack_rows<BlockQ4_K>;
        case Format::Q5_K: return pack_rows<BlockQ5_K>;
        case Format::Q6_K: return pack_rows<BlockQ6_K>;
        default: return nullptr;
    }
}

}  // namespace

bool runs(Format weights) { return pack_fn(weights) && kernels().rows_times_tokens; }

void Tokens::resize(int64_t tokens, int64_t k) {
    k_ = k;
    tokens_ = tokens;
    n_super_ = (k + kSuper - 1) / kSuper;
    codes_.assign(size_t(tokens * n_super_ * kSuper), 0);
    d_.assign(size_t(tokens * n_super_ * kGroups), 0.0f);
    sum_.assign(size_t(tokens * n_super_ * kGroups), 0);
    offset_sum_.assign(size_t(tokens * n_super_ * kGroups), 0.0f);
}

void Tokens::pack_one(const float* x, int64_t t) {
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> d;
    thread_local std::vector<int32_t> sum16;
    q.assign(size_t(n_super_ * kSuper), 0);  // zero past k
    d.resize(size_t(k_ / 32)), sum16.resize(size_t(k_ / 16));
    quantize_q8_1(x, k_, q.data(), d.data(), sum16.data());
    const int64_t n_groups = n_super_ * kGroups;
    kernels().interleave(reinterpret_cast<const uint8_t*>(q.data()), n_super_,
                       reinterpret_cast<uint8_t*>(codes_.data()) + t * n_super_ * kSuper);
    for (int64_t g = 0; g < k_ / 16; ++g) {
        const float dg = d[size_t(g / 2)];
        d_[size_t(t * n_groups + g)] = dg;
        sum_[size_t(t * n_groups + g)] = sum16[size_t(g)];
        offset_sum_[size_t(t * n_groups + g)] = dg * static_cast<float>(sum16[size_t(g)]);
    }
}

void Tokens::pack(const float* x, int64_t tokens, int64_t k, ThreadPool& pool) {
    resize(tokens, k);
    pool.parallel_for(tokens, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) pack_one(x + t * k, t);
    });
}

void Tokens::pack_rows(const float* x, const int32_t* row_of, int64_t tokens, int64_t k, ThreadPool& pool) {
    resize(tokens, k);
    // Each row of x is rounded and packed once, at the first position that takes it; the other
    // positions with that row (a token's other experts) copy it.
    std::vector<int64_t> first_at(tokens > 0 ? size_t(*std::max_element(row_of, row_of + tokens)) + 1 : 0, -1);
    std::vector<int64_t> firsts, source(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
        int64_t& first = first_at[size_t(row_of[t])];
        if (first < 0) first = t, firsts.push_back(t);
        source[size_t(t)] = first;
    }
    pool.parallel_for(int64_t(firsts.size()), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) pack_one(x + int64_t(row_of[firsts[size_t(i)]]) * k, firsts[size_t(i)]);
    });
    const int64_t bytes = n_super_ * kSuper, groups = n_super_ * kGroups;
    pool.parallel_for(tokens, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const int64_t from = source[size_t(t)];
            if (from == t) continue;
            std::copy_n(codes_.data() + from * bytes, bytes, codes_.data() + t * bytes);
            std::copy_n(d_.data() + from * groups, groups, d_.data() + t * groups);
            std::copy_n(sum_.data() + from * groups, groups, sum_.data() + t * groups);
            std::copy_n(offset_sum_.data() + from * groups, groups, offset_sum_.data() + t * groups);
        }
    });
}

PackedTokens Tokens::view(int64_t t0, int64_t n) const {
    const int64_t n_groups = n_super_ * kGroups;
    return {codes_.data() + t0 * n_super_ * kSuper, d_.data() + t0 * n_groups, sum_.data() + t0 * n_groups,
            offset_sum_.data() + t0 * n_groups, n};
}

void check(Format format, int64_t k, const Tokens& x) {
    if (!runs(format) || k % format_info(format).block_elems || x.n_super() != (k + kSuper - 1) / kSuper)
        throw Error(std::string("q8_gemm: ") + format_name(format) + " rows of " + std::to_string(k) +
                    " elements do not match the packed activations (or the format has no integer codes, or this "
                    "CPU has no int8 GEMM)");
}

void multiply_tile(Format format, const uint8_t* w, int64_t n_rows, int64_t k, const Tokens& x, int64_t t0,
                   int64_t n_tokens, const float* bias, float* y, int64_t y_stride) {
    const PackFn pack = pack_fn(format);
    thread_local RowTile tile;
    tile.resize(x.n_super());
    const Kernels use = kernels();
    pack(w, row_bytes(format, k), n_rows, k, tile, use);
    const PackedRows packed = tile.view();
    for (int64_t b0 = 0; b0 < n_tokens; b0 += kTokenBlock) {
        const int64_t m = std::min(kTokenBlock, n_tokens - b0);
        float* out = y + b0 * y_stride;
        if (n_rows == kTileRows) {
            use.rows_times_tokens(packed, x.view(t0 + b0, m), x.n_super(), out, y_stride);
        } else {
            tile.out.resize(size_t(m * kTileRows));
            use.rows_times_tokens(packed, x.view(t0 + b0, m), x.n_super(), tile.out.data(), kTileRows);
            for (int64_t t = 0; t < m; ++t)
                std::copy(tile.out.data() + t * kTileRows, tile.out.data() + t * kTileRows + n_rows, out + t * y_stride);
        }
        if (bias)
            for (int64_t t = 0; t < m; ++t)
                for (int64_t r = 0; r < n_rows; ++r) out[t * y_stride + r] += bias[r];
    }
}

void multiply(Format format, const uint8_t* w, int64_t n_rows, int64_t k, const Tokens& x, int64_t t0,
              int64_t n_tokens, const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
    check(format, k, x);
    const size_t row_stride = row_bytes(format, k);
    pool.parallel_for(tiles(n_rows), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t n0 = i * kTileRows;
            multiply_tile(format, w + size_t(n0) * row_stride, std::min(kTileRows, n_rows - n0), k, x, t0, n_tokens,
                          bias ? bias + n0 : nullptr, y + n0, y_stride);
        }
    });
}

}  // namespace q8_gemm
}  // namespace kcap
